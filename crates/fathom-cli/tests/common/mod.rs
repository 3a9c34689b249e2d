//! Runs the real `fathom` binary, as a user would.

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod server;

pub fn smollm2() -> PathBuf {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-model.sh (scripts/test.sh does it for you)",
        path.display()
    );
    path
}

/// A one-layer Q4_0 fixture at `out` of the shape `like` (`fathom bench
/// fixture`, random weights) with the tokenizer of llama.cpp's test
/// vocabulary `models/vocab`, which `scripts/fetch-vocab.sh` fetches.
pub fn one_layer_fixture(like: &str, vocab: &str, out: &Path) {
    let vocab = smollm2().parent().unwrap().join(vocab);
    assert!(
        vocab.exists(),
        "{} is missing: run scripts/fetch-vocab.sh",
        vocab.display()
    );
    let written = fathom(
        &[
            "bench",
            "fixture",
            "--like",
            like,
            "--layers",
            "1",
            "--type",
            "Q4_0",
            "--vocab",
            vocab.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(written.status.success(), "{}", stderr(&written));
}

/// Whether an NVIDIA GPU is there (NVML finds one). Without one, `test`
/// says it is skipped and passes, unless `FATHOM_REQUIRE_GPU=1` (then it
/// fails), as the CUDA backend's tests do.
pub fn gpu(test: &str) -> bool {
    let found = fathom_backend::cuda::nvml::Nvml::open().and_then(|n| n.memory(0));
    if found.is_none() {
        assert!(
            std::env::var("FATHOM_REQUIRE_GPU").as_deref() != Ok("1"),
            "FATHOM_REQUIRE_GPU=1 but NVML finds no GPU"
        );
        eprintln!("{test}: skipped: no NVIDIA GPU (NVML found none)");
    }
    found.is_some()
}

/// The `fathom` binary under test: `FATHOM_BIN` when set (a staged binary
/// on the GPU machine, where the build folder does not exist), else the
/// one cargo built beside these tests.
pub fn fathom_exe() -> PathBuf {
    std::env::var_os("FATHOM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fathom")))
}

/// Runs `fathom ARGS` with a clean fathom environment plus `env`.
pub fn fathom(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(fathom_exe());
    cmd.args(args);
    for var in [
        "FATHOM_MEMORY_LIMIT",
        "FATHOM_HEADROOM_FACTOR",
        "FATHOM_ISA",
        "MLX_ROCM_MAX_INFLIGHT_MB",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run fathom")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// `fathom inspect MODEL ARGS --json`, asserting success and one JSON object.
pub fn inspect_json(model: &Path, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let mut all = vec!["inspect", model.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let out = fathom(&all, env);
    assert!(
        out.status.success(),
        "fathom {all:?} failed: {}",
        stderr(&out)
    );
    serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("stdout is not one JSON object: {e}\n{}", stdout(&out)))
}

pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an integer: {}", v[key]))
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("fathom-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
