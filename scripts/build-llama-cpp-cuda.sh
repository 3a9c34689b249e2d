#!/usr/bin/env bash
# Builds llama.cpp's CUDA tools (sm_90) HERE, on a machine without a GPU, and packs them for a
# device call, so that a GPU session does not spend ~250 s of device time compiling its peer.
#
#   scripts/build-llama-cpp-cuda.sh SRC_DIR [OUT.tar.xz]
#
#   SRC_DIR   llama.cpp's source, e.g. from ../shared/gpu/fetch-llamacpp-src.sh (0.3.36)
#   OUT       the packed tools (default .gpu-carry/llb.tar.xz): unpack with `tar xJf OUT -C /tmp`
#             there, giving /tmp/llb/bin (the build's own rpath); run with
#             LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib for cuBLAS and cudart.
# Env: BUILD (default /tmp/llb: keep it /tmp/llb, its binaries find their libraries there), JOBS (nproc).
#
# What it takes: nvcc 13.0 from scripts/install-cuda-toolchain.sh, cuBLAS 13.0 headers and
# libraries from the `nvidia-cublas` wheel (linked against here; the device's own are loaded
# there), and a stub libcuda.so.1 for the driver calls ggml-cuda links to (the device's driver
# provides the real one). Shared libraries, so the tools share one ggml-cuda (~67 MB,
# ~42 MB packed). GGML_NATIVE is off with the ISA named, AMX off: a native build of this
# source crashes in its AMX matmul on the device's Xeon hosts (../shared/gpu/README.md).
# On a 2-core VM the build takes about 40 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(cd "${1:?usage: build-llama-cpp-cuda.sh SRC_DIR [OUT.tar.xz]}" && pwd)
out=$(realpath -m "${2:-.gpu-carry/llb.tar.xz}")
build=${BUILD:-/tmp/llb}
scripts/install-cuda-toolchain.sh
toolchain=${FATHOM_CUDA_TOOLCHAIN:-$HOME/.cache/fathom/cuda-toolchain-13.0}/nvidia/cu13
# A toolkit folder of the toolchain, cuBLAS and the stub (CMake's FindCUDAToolkit layout).
kit=$build-toolkit
if [[ ! -f $kit/lib/libcublas.so || ! -f $kit/lib/stubs/libcuda.so ]]; then
    rm -rf "$kit" "$kit.wheel"
    cp -a "$toolchain" "$kit"
    python3 -m pip download --quiet --no-deps --dest "$kit.wheel" "nvidia-cublas==13.0.0.19"
    python3 - "$kit.wheel" "$kit" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/nvidia_cublas-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("nvidia/cu13/") and not name.endswith("/"):
            dest = os.path.join(sys.argv[2], name[len("nvidia/cu13/"):])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                dst.write(src.read())
PY
    rm -rf "$kit.wheel"
    (cd "$kit/lib" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so &&
        ln -sf libcudart.so.13 libcudart.so)
    ln -sfn lib "$kit/lib64"
    # The driver calls of ggml-cuda's virtual-memory pool, as symbols only.
    mkdir -p "$kit/lib/stubs"
    for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve \
        cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
        echo "int $f(void) { return 0; }"
    done >"$kit/lib/stubs/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$kit/lib/stubs/libcuda.so" "$kit/lib/stubs/stub.c"
fi
if ! command -v cmake >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1; then
    python3 -m pip install --quiet cmake ninja
    hash -r
fi
link="-Wl,-rpath-link,$kit/lib"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_CUDA_COMPILER="$kit/bin/nvcc" -DCUDAToolkit_ROOT="$kit" \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
    -DGGML_AVX512_VNNI=ON -DGGML_BMI2=ON -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_EXE_LINKER_FLAGS="$link" -DCMAKE_SHARED_LINKER_FLAGS="$link" >/dev/null
ninja -C "$build" -j "${JOBS:-$(nproc)}" llama-bench llama-completion llama-fit-params llama-batched-bench
strip --strip-unneeded "$build"/bin/*.so.* "$build"/bin/llama-{bench,completion,fit-params,batched-bench}
mkdir -p "$(dirname "$out")"
tar cf - -C "$(dirname "$build")" "$(basename "$build")/bin" | xz -T0 -6 >"$out"
echo "packed $(du -h "$out" | cut -f1) into $out (unpack in /tmp there)"
