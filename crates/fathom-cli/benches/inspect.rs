//! How long `fathom inspect` takes on the 100 MB SmolLM2 GGUF and on a
//! 61 GB sharded Qwen3-30B-A3B checkpoint (13 sparse safetensors shards,
//! header-only): the whole process, as a user runs it, and the in-process
//! header read + plan. Prints medians of repeated runs.
//!
//! `cargo bench -p fathom-cli --bench inspect` (fetch the model first:
//! scripts/fetch-model.sh).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

const RUNS: usize = 21;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(mut f: impl FnMut()) -> Duration {
    f(); // warm the page cache
    median(
        (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect(),
    )
}

fn process(model: &Path) -> Duration {
    let exe = Path::new(env!("CARGO_BIN_EXE_fathom"));
    time(|| {
        let out = Command::new(exe)
            .args([
                "inspect",
                model.to_str().unwrap(),
                "--json",
                "--memory",
                "64G",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
}

fn in_process(model: &Path) -> Duration {
    time(|| {
        let checkpoint = Checkpoint::open(model).unwrap();
        let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
        let inputs = PlanInputs {
            context: 8192,
            batch: 1,
            device: Device::Cpu,
            kv_dtype: KvDtype::F16,
            max_tokens_per_step: 512,
            threads: 2,
            headroom_factor: 1.0,
            rocm_inflight_raw: None,
            host_available: None,
            available: Available {
                bytes: 64 << 30,
                source: "bench".into(),
            },
        };
        std::hint::black_box(MemoryPlan::new(&spec, inputs).unwrap());
    })
}

fn main() {
    let smollm2 =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(smollm2.exists(), "run scripts/fetch-model.sh first");
    let big: PathBuf =
        std::env::temp_dir().join(format!("fathom-bench-qwen3-30b-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&big);
    fx::write_hf_dir(&fx::qwen3_30b_a3b(), &big, 13, Data::Sparse).unwrap();
    let big_bytes: u64 = std::fs::read_dir(&big)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();

    println!("fathom inspect, median of {RUNS} runs (page cache warm)");
    println!(
        "{:<48} {:>10} {:>12} {:>12}",
        "checkpoint", "size", "process", "in-process"
    );
    for (name, path, size) in [
        (
            "SmolLM2-135M-Instruct Q4_1 (GGUF)",
            &smollm2,
            std::fs::metadata(&smollm2).unwrap().len(),
        ),
        ("Qwen3-30B-A3B BF16 (13 sparse shards)", &big, big_bytes),
    ] {
        println!(
            "{name:<48} {:>10} {:>9.2} ms {:>9.2} ms",
            fathom_plan::size::format_binary(size),
            process(path).as_secs_f64() * 1e3,
            in_process(path).as_secs_f64() * 1e3
        );
    }
    let _ = std::fs::remove_dir_all(&big);
}
