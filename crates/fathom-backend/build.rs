//! Compiles the CUDA kernels (`kernels/*.cu`) into one fatbin the crate
//! embeds: sm_90 machine code (Hopper) plus compute_90 PTX that later GPUs'
//! drivers compile at load. nvcc comes from `FATHOM_NVCC`, else from the
//! private toolchain `scripts/install-cuda-toolchain.sh` installs (pinned
//! PyPI wheels), so no system CUDA is needed to build, and a machine
//! without a GPU still compiles every kernel.
//!
//! A kernel that spills registers or uses local memory fails the build:
//! ptxas warns on both and the warnings are errors, since either one on a
//! hot path costs more than the kernel's own work.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const KERNELS: &str = "kernels/fathom.cu";

fn toolchain_nvcc() -> Option<PathBuf> {
    let dir = match env::var_os("FATHOM_CUDA_TOOLCHAIN") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env::var_os("HOME")?).join(".cache/fathom/cuda-toolchain-13.0"),
    };
    let nvcc = dir.join("nvidia/cu13/bin/nvcc");
    nvcc.is_file().then_some(nvcc)
}

fn main() {
    println!("cargo:rerun-if-changed={KERNELS}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FATHOM_NVCC");
    println!("cargo:rerun-if-env-changed=FATHOM_CUDA_TOOLCHAIN");
    let nvcc = match env::var_os("FATHOM_NVCC") {
        Some(p) => PathBuf::from(p),
        None => toolchain_nvcc().unwrap_or_else(|| {
            panic!(
                "fathom-backend: nvcc not found. Run scripts/install-cuda-toolchain.sh \
                 (pip-installs nvcc 13.0 into ~/.cache/fathom/cuda-toolchain-13.0), or set \
                 FATHOM_NVCC to an nvcc 13.0 binary (FATHOM_CUDA_TOOLCHAIN moves the folder)"
            )
        }),
    };
    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("fathom.fatbin");
    let output = Command::new(&nvcc)
        .args([
            "-fatbin",
            "-O3",
            "-std=c++17",
            "-gencode",
            "arch=compute_90,code=sm_90",
            "-gencode",
            "arch=compute_90,code=compute_90",
            "-Xptxas",
            "-v,--warn-on-spills,--warn-on-local-memory-usage,--warning-as-error",
            "-Werror",
            "all-warnings",
            KERNELS,
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("fathom-backend: cannot run {}: {e}", nvcc.display()));
    if !output.status.success() {
        panic!(
            "fathom-backend: {} failed on {KERNELS} (a spill or local memory use is an error):\n{}{}",
            nvcc.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
