#!/usr/bin/env bash
# Builds the GPU-relevant test binaries and a release `fathom` here (the
# device machine has no Rust toolchain) and stages them, with a runner, in a
# carry folder.
#
#   scripts/test-gpu.sh [CARRY_DIR]     (default: $FATHOM_GPU_CARRY, else .gpu-carry)
#
# Then, on a machine with a GPU, from the folder holding CARRY_DIR:
#   bash CARRY_DIR/run.sh                 (logs to stdout; FATHOM_REQUIRE_GPU=1 is set)
# With the session's device tool: make CARRY_DIR `.gpu-carry` inside the
# checkout the tool sends (listed in its .git/info/exclude), pass
# carry: [".gpu-carry"] and run `bash .gpu-carry/run.sh 2>&1 | tee $OUT/gpu-tests.log`.
# FATHOM_SANITIZE=1 there runs the conformance test under compute-sanitizer too.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-cuda-toolchain.sh
CARRY="${1:-${FATHOM_GPU_CARRY:-.gpu-carry}}"
mkdir -p "$CARRY"
rm -f "$CARRY"/*
# Release: the CPU side of the CUDA-vs-CPU checks runs the CPU kernels too.
# The fathom binary itself goes too: the GPU server tests run it (FATHOM_BIN),
# and scripts/cuda-serve-evidence.sh measures with it.
{
  cargo test --release -p fathom-backend -p fathom-engine --test conformance --test cuda_vs_cpu \
    --test nccl --test tensor_parallel --lib --no-run --message-format=json 2>/dev/null
  cargo test --release -p fathom-cli --test serve_cuda --no-run --message-format=json 2>/dev/null
  cargo build --release --locked -p fathom-cli --bin fathom --message-format=json 2>/dev/null
} | python3 -c '
import json, sys
seen = set()
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        name = m["target"]["name"] + ("-unit" if kind == "lib" else "")
        print(m["executable"], name)
    elif m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "fathom":
        if "fathom" not in seen:
            seen.add("fathom")
            print(m["executable"], "fathom")
' | while read -r exe name; do
  objcopy --strip-debug "$exe" "$CARRY/$name"
  echo "staged $CARRY/$name ($(du -h "$CARRY/$name" | cut -f1))" >&2
done
git rev-parse HEAD >"$CARRY/commit.txt" 2>/dev/null || true
echo "staged $(du -sh "$CARRY" | cut -f1) in all (a carry travels up to 64 MiB)" >&2
cat >"$CARRY/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs fathom's GPU tests on the device; every test must find the GPU.
set -uo pipefail
cd "$(dirname "$0")"
export FATHOM_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv || true
rc=0
# Start-up memory first, alone in its process, so no other context skews it.
./conformance cuda_only::cuda_startup_memory --exact --nocapture --test-threads=1 || rc=1
# Graph memory likewise: a process that made graphs before reuses their memory.
./conformance cuda_only::cuda_graph_memory_within_plan --exact --nocapture --test-threads=1 || rc=1
./conformance --skip cuda_startup_memory --skip cuda_graph_memory_within_plan --skip speed \
  --nocapture --test-threads=1 || rc=1
./conformance speed --nocapture --test-threads=1 || rc=1
./fathom_backend-unit --test-threads=1 || rc=1
./cuda_vs_cpu --nocapture --test-threads=1 || rc=1
# NCCL on every GPU; tensor parallelism's CUDA cases (a group of one
# through NCCL; two GPUs where the machine has them). The CPU-rank cases
# need the real model (models/), which stays here: run where it is.
./nccl --nocapture --test-threads=1 || rc=1
./tensor_parallel cuda --nocapture --test-threads=1 || rc=1
# fathom serve --device cuda over real HTTP, with the staged fathom.
FATHOM_BIN="$PWD/fathom" ./serve_cuda --nocapture --test-threads=1 || rc=1
if [[ "${FATHOM_SANITIZE:-0}" == 1 ]] && command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer memcheck (at most ${FATHOM_SANITIZE_S:-240} s):"
  timeout "${FATHOM_SANITIZE_S:-240}" compute-sanitizer --tool memcheck --print-limit 20 \
    ./conformance conformance --exact --test-threads=1 2>&1 | grep -v " ok$" | tail -40
  [[ "${PIPESTATUS[0]}" == 0 ]] || rc=1
fi
echo "gpu tests: rc=$rc"
exit $rc
RUN
chmod +x "$CARRY/run.sh"
echo "run there: bash $CARRY/run.sh" >&2
