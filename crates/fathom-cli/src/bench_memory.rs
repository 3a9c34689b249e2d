//! `fathom bench memory`: the plan against the measured peak, cell by cell.
//!
//! Each cell is one model, context, batch and KV type. For each, the plan
//! is what `fathom inspect --json` prints for those inputs (kept byte for
//! byte), and the peak is the largest `ru_maxrss` — the kernel's `VmHWM`
//! at exit — that this process reads with `wait4` for a fresh `fathom
//! generate` child that fills the context: a prompt of `context − 64`
//! random token ids, then 64 greedy tokens (`--ignore-eos`), once per
//! sequence of the batch (`--parallel`). Machine-dependent plan inputs
//! (threads, available memory) are pinned so that the plans re-derive
//! anywhere. The synthetic checkpoints come from `fathom-fixtures`,
//! deterministically.
//!
//! With `--device cuda` the grid is the CUDA one (random-weight checkpoints
//! of real shapes, written where it runs) and each cell has two budgets:
//! the device plan against the child's device memory as NVML lists it,
//! sampled every 10 ms by this process from the child's start to its end,
//! and the host plan against its peak RSS. The child's own report adds its
//! in-process NVML peak and the free device memory (`cuMemGetInfo`) after
//! loading and at the end.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use fathom_fixtures::{self as fx, Data, GridModel};
use serde_json::{json, Value};

use crate::session::DeviceWatch;

/// The real model of the grid, linked into the work directory.
const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Worker threads of every cell, pinned so plans re-derive on any machine.
const THREADS: u64 = 2;
/// `--memory` of every cell: only `fits` and the largest context depend on it.
const MEMORY: &str = "16G";
/// `--memory` of every CUDA cell (the device's; an H200 has 131 GiB free).
const CUDA_MEMORY: &str = "128G";
/// A CUDA cell's prompt fills its context up to this many tokens: the
/// device allocation is made whole at start-up, so a longer fill only adds
/// prefill time (recorded per cell as `prompt_tokens`).
const CUDA_FILL: u64 = 8192;
/// A split cell's prompt: two 64-token steps' worth past the chunk size
/// would only add host prefill time; the arena, KV and placement are all
/// allocated at start-up.
const SPLIT_FILL: u64 = 192;
/// Tokens generated after the prompt.
const GENERATE: u64 = 64;
/// A plan looser than this times the peak is reported as not tight.
pub const TIGHTNESS: f64 = 1.10;

#[derive(Args)]
pub struct MemoryArgs {
    /// Which grid: `full` (the recorded one: 30 cells, about 50 minutes on a
    /// busy 2-core VM; on cuda 21 cells), `ci` (3 SmolLM2 cells, for the
    /// test suite; on cuda 2) or `split` (cuda: 11 cells under device caps
    /// that split the model between the GPU and the host).
    #[arg(long, default_value = "full")]
    pub grid: String,
    /// cpu (peak RSS against the plan) or cuda (the device plan against the
    /// child's NVML device peak, and the host plan against its peak RSS).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Runs of each cell; the largest peak is recorded.
    #[arg(long, default_value_t = 2)]
    pub runs: u32,
    /// Only the cells whose id contains this text (e.g. `gemma`, `/c640/`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Where the synthetic checkpoints are written (once) and the cells run.
    #[arg(long, default_value = "target/memory-grid")]
    pub work_dir: PathBuf,
    /// The SmolLM2-135M-Instruct Q4_1 GGUF (scripts/fetch-model.sh).
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub smollm2: PathBuf,
    /// llama.cpp's `build/bin` (a CUDA build with --device cuda): also
    /// measure `llama-bench` on each batch-1 cell.
    #[arg(long, value_name = "DIR")]
    pub llama_cpp: Option<PathBuf>,
    /// Write the results (machine, commit, every cell with its plan JSON) here,
    /// after every cell; a rerun with the same file keeps the cells it holds
    /// (resuming an interrupted grid) and only adds missing llama.cpp figures.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One cell of the grid.
#[derive(Clone, Debug)]
struct Cell {
    /// File name of the checkpoint inside the work directory.
    file: &'static str,
    /// Short model key for the cell id.
    key: &'static str,
    context: u64,
    batch: u64,
    kv: &'static str,
    cuda: bool,
    /// A device cap under which the plan places the model between the GPU
    /// and the host (`--memory`, the split grid); `None`: [`CUDA_MEMORY`].
    cap: Option<&'static str>,
}

impl Cell {
    fn id(&self) -> String {
        let device = if self.cuda { "cuda/" } else { "" };
        let cap = self.cap.map(|c| format!("/cap{c}")).unwrap_or_default();
        format!(
            "{device}{}/c{}/b{}/{}{cap}",
            self.key, self.context, self.batch, self.kv
        )
    }

    /// The device's `--memory`.
    fn memory(&self) -> &'static str {
        match (self.cap, self.cuda) {
            (Some(cap), _) => cap,
            (None, true) => CUDA_MEMORY,
            (None, false) => MEMORY,
        }
    }

    fn prompt_tokens(&self) -> u64 {
        if self.cap.is_some() {
            self.context.min(SPLIT_FILL) - GENERATE
        } else if self.cuda {
            self.context.min(CUDA_FILL) - GENERATE
        } else {
            self.context - GENERATE
        }
    }

    fn inspect_args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["inspect", self.file, "-c"].map(String::from).to_vec();
        args.push(self.context.to_string());
        args.extend(["-b".into(), self.batch.to_string()]);
        args.extend(self.shared_args());
        args.push("--json".into());
        args
    }

    fn generate_args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["generate", self.file, "--random-prompt"]
            .map(String::from)
            .to_vec();
        args.push(self.prompt_tokens().to_string());
        args.extend(["-n".into(), GENERATE.to_string()]);
        args.extend(["-c".into(), self.context.to_string()]);
        if self.batch > 1 {
            args.extend(["--parallel".into(), self.batch.to_string()]);
        }
        args.extend(self.shared_args());
        args.extend(["--temp".into(), "0".into(), "--ignore-eos".into()]);
        args
    }

    fn shared_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--kv-dtype".into(),
            self.kv.into(),
            "-t".into(),
            THREADS.to_string(),
            "--memory".into(),
            self.memory().into(),
        ];
        if self.cuda {
            args.extend(["--device".into(), "cuda".into()]);
        }
        args
    }

    fn llama_bench_args(&self) -> Vec<String> {
        // The peer's context is its prompt + 64: the cell's context.
        let mut args: Vec<String> = vec![
            "-m".into(),
            self.file.into(),
            "-p".into(),
            (self.context - GENERATE).to_string(),
            "-n".into(),
            GENERATE.to_string(),
            "-r".into(),
            "1".into(),
            "-t".into(),
            THREADS.to_string(),
            "-ctk".into(),
            self.kv.into(),
            "-ctv".into(),
            self.kv.into(),
        ];
        if self.cuda {
            // Every layer on the GPU, flash attention as the speed figures use.
            args.extend(["-ngl".into(), "99".into(), "-fa".into(), "1".into()]);
        } else if self.kv != "f16" {
            // llama.cpp quantizes the V cache only with flash attention.
            args.extend(["-fa".into(), "1".into()]);
        }
        args.extend(["-o".into(), "json".into()]);
        args
    }
}

/// Contexts of each synthetic checkpoint: two each, the larger past every
/// sliding window, chosen so the whole grid runs in under 30 minutes on
/// two cores.
fn synthetic_contexts(model: &GridModel) -> [u64; 2] {
    match model.file {
        f if f.starts_with("gemma") || f.starts_with("qwen2") => [1024, 2048],
        _ => [512, 1024],
    }
}

fn model_key(model: &GridModel) -> &'static str {
    model.file.trim_end_matches(".gguf")
}

fn cells(grid: &str, models: &[GridModel]) -> Result<Vec<Cell>> {
    let smollm2 = |context, batch, kv| Cell {
        file: SMOLLM2_FILE,
        key: "smollm2-135m-q4_1",
        context,
        batch,
        kv,
        cuda: false,
        cap: None,
    };
    let mut cells = Vec::new();
    match grid {
        "full" => {
            for context in [640, 4096, 8192] {
                for kv in ["f16", "q8_0"] {
                    cells.push(smollm2(context, 1, kv));
                }
            }
            // Both contexts with an f16 KV, the larger also with q8_0.
            for model in models {
                let [small, large] = synthetic_contexts(model);
                for (context, kv) in [(small, "f16"), (large, "f16"), (large, "q8_0")] {
                    cells.push(Cell {
                        file: model.file,
                        key: model_key(model),
                        context,
                        batch: 1,
                        kv,
                        cuda: false,
                        cap: None,
                    });
                }
            }
            // Four sequences decoded together (`generate --parallel 4`).
            for context in [640, 4096, 8192] {
                for kv in ["f16", "q8_0"] {
                    cells.push(smollm2(context, 4, kv));
                }
            }
        }
        "ci" => {
            cells.push(smollm2(640, 1, "f16"));
            cells.push(smollm2(640, 1, "q8_0"));
            cells.push(smollm2(1024, 1, "f16"));
        }
        other => bail!("unknown grid {other:?}: expected full or ci"),
    }
    Ok(cells)
}

/// A cell's `(context, batch, kv)`.
type CellInputs = (u64, u64, &'static str);

/// The CUDA grid: per checkpoint of [`fx::cuda_memory_grid_models`] (by
/// index), `(context, batch, kv)` — short and long contexts (up to 32768
/// where the model's trained context allows), one and 16 sequences, f16
/// and q8_0 KV.
const CUDA_GRID: [(usize, &[CellInputs]); 5] = [
    // SmolLM2-135M Q4_1 (trained context 8192).
    (
        0,
        &[
            (1024, 1, "f16"),
            (8192, 1, "f16"),
            (8192, 1, "q8_0"),
            (1024, 16, "f16"),
            (8192, 16, "q8_0"),
        ],
    ),
    // Llama-3.1-8B F16.
    (
        1,
        &[
            (1024, 1, "f16"),
            (32768, 1, "f16"),
            (32768, 1, "q8_0"),
            (4096, 16, "f16"),
            (4096, 16, "q8_0"),
        ],
    ),
    // Llama-3.1-8B Q4_K.
    (
        2,
        &[
            (1024, 1, "f16"),
            (32768, 1, "f16"),
            (4096, 16, "f16"),
            (4096, 16, "q8_0"),
        ],
    ),
    // Qwen3-30B-A3B's MoE layers Q4_0.
    (3, &[(1024, 1, "f16"), (32768, 1, "f16"), (4096, 16, "f16")]),
    // gemma-3-1b Q8_0: sliding windows of 512, trained context 32768.
    (
        4,
        &[
            (1024, 1, "f16"),
            (32768, 1, "f16"),
            (32768, 1, "q8_0"),
            (4096, 16, "f16"),
        ],
    ),
];

fn cuda_cells(grid: &str, models: &[GridModel]) -> Result<Vec<Cell>> {
    let cell = |model: &GridModel, (context, batch, kv): CellInputs| Cell {
        file: model.file,
        key: model_key(model),
        context,
        batch,
        kv,
        cuda: true,
        cap: None,
    };
    match grid {
        "split" => Ok(SPLIT_GRID
            .iter()
            .flat_map(|(i, list)| {
                list.iter().map(|&(inputs, cap)| Cell {
                    cap: Some(cap),
                    ..cell(&models[*i], inputs)
                })
            })
            .collect()),
        "full" => Ok(CUDA_GRID
            .iter()
            .flat_map(|(i, list)| list.iter().map(|&c| cell(&models[*i], c)))
            .collect()),
        "ci" => Ok(vec![
            cell(&models[0], (1024, 1, "f16")),
            cell(&models[0], (1024, 16, "q8_0")),
        ]),
        other => bail!("unknown grid {other:?}: expected full, ci or split (cuda)"),
    }
}

/// The split grid (cuda): per checkpoint of [`fx::cuda_memory_grid_models`],
/// cells under a device cap the model does not fit, so the plan's `auto`
/// placement puts part of it on the host: the largest fit, at the edge.
/// 8B Q4_K is 4.58 GiB of weights (f16 KV: 128 KiB a token); the MoE's 16
/// layers 5.6 GiB, mostly experts; gemma-3-1b (sliding and full layers,
/// split so that each side holds both kinds or one) 1.0 GiB.
const SPLIT_GRID: [(usize, &[(CellInputs, &str)]); 3] = [
    (
        2,
        &[
            ((4096, 1, "f16"), "4G"),
            ((4096, 1, "f16"), "5G"),
            ((32768, 1, "f16"), "6G"),
            ((32768, 1, "q8_0"), "6G"),
            ((4096, 16, "q8_0"), "8G"),
        ],
    ),
    (
        3,
        &[
            ((4096, 1, "f16"), "2G"),
            ((4096, 1, "f16"), "4G"),
            ((32768, 1, "f16"), "3G"),
            ((4096, 16, "f16"), "4G"),
        ],
    ),
    (
        4,
        &[((32768, 1, "f16"), "1536M"), ((4096, 16, "f16"), "1536M")],
    ),
];

/// What one child process did.
struct Measured {
    peak_bytes: u64,
    wall: Duration,
    stderr: String,
    /// The child's device memory as NVML listed it, sampled by this
    /// process (with `device`), and how many samples listed it.
    device_peak: Option<u64>,
    device_samples: u64,
}

/// Runs `program args` in `dir` with a clean fathom environment and returns
/// its peak RSS as the kernel reports it to the parent (`wait4`); with
/// `device`, also its NVML device peak, sampled from its start to its end.
fn measure(program: &Path, args: &[String], dir: &Path, device: bool) -> Result<Measured> {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for var in [
        fathom_plan::available::MEMORY_LIMIT_VAR,
        fathom_plan::env::HEADROOM_FACTOR_VAR,
        fathom_plan::rocm::ROCM_INFLIGHT_VAR,
    ] {
        command.env_remove(var);
    }
    let started = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let mut stderr_pipe = child.stderr.take().context("child stderr")?;
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let watch = device.then(|| DeviceWatch::process(child.id())).flatten();
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data that wait4 fills in; status and
    // rusage outlive the call.
    let (waited, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let waited = libc::wait4(pid, &mut status, 0, &mut usage);
        (waited, usage)
    };
    let wall = started.elapsed();
    let (device_peak, device_samples) = watch.map_or((None, 0), DeviceWatch::finish_counted);
    let stderr = reader.join().unwrap_or_default();
    if waited != pid {
        bail!(
            "waiting for {}: {}",
            program.display(),
            std::io::Error::last_os_error()
        );
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let tail: String = stderr
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        bail!(
            "{} {} failed (status {status}):\n{tail}",
            program.display(),
            args.join(" ")
        );
    }
    // ru_maxrss is in KiB on Linux.
    let peak_bytes = u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024;
    Ok(Measured {
        peak_bytes,
        wall,
        stderr,
        device_peak,
        device_samples,
    })
}

/// The exact byte counts of a report line, e.g. the child's `device:`
/// lines (`plan X (N bytes) vs peak Y (M bytes) ...`), in order.
fn line_bytes(stderr: &str, starts: &str, contains: &str) -> Vec<u64> {
    let Some(line) = stderr
        .lines()
        .find(|l| l.starts_with(starts) && l.contains(contains))
    else {
        return Vec::new();
    };
    line.split('(')
        .filter_map(|part| part.split(" bytes)").next()?.parse().ok())
        .collect()
}

/// `N` from a stats line such as `decode:  64 tokens in ...`.
fn stat_tokens(stderr: &str, label: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.starts_with(label))?;
    line[label.len()..].split_whitespace().next()?.parse().ok()
}

/// Writes the synthetic checkpoints the cells need (once: a `.done` stamp
/// marks a finished file) and links the SmolLM2 GGUF into `dir`.
fn prepare(dir: &Path, smollm2: &Path, cells: &[Cell], models: &[GridModel]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if cells.iter().any(|c| c.file == SMOLLM2_FILE) {
        let target = std::fs::canonicalize(smollm2).with_context(|| {
            format!(
                "{} is missing: run scripts/fetch-model.sh",
                smollm2.display()
            )
        })?;
        let link = dir.join(SMOLLM2_FILE);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    for model in models {
        if !cells.iter().any(|c| c.file == model.file) {
            continue;
        }
        let stamp = dir.join(format!("{}.done", model.file));
        if stamp.exists() && dir.join(model.file).exists() {
            continue;
        }
        eprintln!("writing {} ({} shapes)", model.file, model.shapes_of);
        fx::write_grid_model(
            model,
            dir,
            Data::Random {
                seed: fx::GRID_SEED,
            },
        )
        .with_context(|| format!("writing {}", model.file))?;
        std::fs::write(&stamp, b"")?;
    }
    Ok(())
}

fn u(plan: &Value, key: &str) -> u64 {
    plan[key].as_u64().unwrap_or(0)
}

/// llama.cpp's peak on the same GGUF and tokens: `llama-bench` with a
/// context of prompt + 64, once.
fn llama_peer(bin: &Path, dir: &Path, cell: &Cell) -> Value {
    let args = cell.llama_bench_args();
    let program = bin.join("llama-bench");
    let command = format!("{} {}", program.display(), args.join(" "));
    match measure(&program, &args, dir, cell.cuda) {
        Ok(m) if cell.cuda => json!({
            "command": command,
            "device_peak_bytes": m.device_peak,
            "device_samples": m.device_samples,
            "peak_bytes": m.peak_bytes,
            "wall_s": (m.wall.as_secs_f64() * 10.0).round() / 10.0,
        }),
        Ok(m) => json!({
            "command": command,
            "peak_bytes": m.peak_bytes,
            "wall_s": (m.wall.as_secs_f64() * 10.0).round() / 10.0,
        }),
        Err(e) => json!({
            "command": command,
            "peak_bytes": null,
            "error": format!("{e:#}").lines().last().unwrap_or("").to_string(),
        }),
    }
}

fn run_cell(fathom: &Path, dir: &Path, cell: &Cell, runs: u32) -> Result<Value> {
    let inspect = Command::new(fathom)
        .args(cell.inspect_args())
        .current_dir(dir)
        .env_remove(fathom_plan::available::MEMORY_LIMIT_VAR)
        .env_remove(fathom_plan::env::HEADROOM_FACTOR_VAR)
        .env_remove(fathom_plan::rocm::ROCM_INFLIGHT_VAR)
        .output()
        .context("running fathom inspect")?;
    if !inspect.status.success() {
        bail!(
            "fathom {} failed: {}",
            cell.inspect_args().join(" "),
            String::from_utf8_lossy(&inspect.stderr)
        );
    }
    let plan_json = String::from_utf8(inspect.stdout).context("inspect output is not UTF-8")?;
    let plan: Value = serde_json::from_str(&plan_json).context("inspect output is not JSON")?;
    let plan_bytes = u(&plan, "total_bytes");

    let args = cell.generate_args();
    let mut peaks = Vec::new();
    let mut walls = Vec::new();
    let mut generated = None;
    let mut prompt = None;
    let mut device = Vec::new();
    for _ in 0..runs.max(1) {
        let m = measure(fathom, &args, dir, cell.cuda)?;
        peaks.push(m.peak_bytes);
        walls.push((m.wall.as_secs_f64() * 10.0).round() / 10.0);
        prompt = stat_tokens(&m.stderr, "prompt:");
        generated = stat_tokens(&m.stderr, "decode:");
        if cell.cuda {
            device.push(m);
        }
    }
    if cell.cuda {
        return Ok(cuda_cell_result(
            cell, &args, plan_json, &plan, &device, prompt, generated,
        ));
    }
    let peak = peaks.iter().copied().max().unwrap_or(0);
    let margin = plan_bytes as i128 - peak as i128;
    let ratio = plan_bytes as f64 / peak.max(1) as f64;
    Ok(json!({
        "id": cell.id(),
        "model": cell.file,
        "context": cell.context,
        "batch": cell.batch,
        "kv_dtype": cell.kv,
        "threads": THREADS,
        "memory": MEMORY,
        "prompt_tokens": prompt,
        "generated_tokens": generated,
        "command": format!("fathom {}", args.join(" ")),
        "inspect_args": cell.inspect_args(),
        "plan_json": plan_json,
        "plan_bytes": plan_bytes,
        "terms": {
            "weights": u(&plan, "weights_bytes"),
            "converted": u(&plan, "converted_bytes"),
            "kv": u(&plan, "kv_bytes"),
            "activations": u(&plan, "activation_bytes"),
            "runtime": u(&plan, "runtime_overhead_bytes"),
            "backend": u(&plan, "backend_bytes"),
        },
        "peaks_bytes": peaks,
        "peak_bytes": peak,
        "margin_bytes": margin as i64,
        "ratio": (ratio * 10000.0).round() / 10000.0,
        "covered": plan_bytes >= peak,
        "tight": (plan_bytes as f64) <= TIGHTNESS * peak as f64,
        "wall_s": walls,
        "llama_cpp": null,
    }))
}

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

/// A CUDA cell's record: the device plan against the largest NVML device
/// peak of its runs, the host plan against the largest peak RSS.
fn cuda_cell_result(
    cell: &Cell,
    args: &[String],
    plan_json: String,
    plan: &Value,
    runs: &[Measured],
    prompt: Option<u64>,
    generated: Option<u64>,
) -> Value {
    let device_plan = u(plan, "total_bytes");
    let host_plan = u(&plan["host"], "total_bytes");
    let device_peaks: Vec<Option<u64>> = runs.iter().map(|m| m.device_peak).collect();
    let device_peak = device_peaks.iter().flatten().copied().max();
    let rss_peaks: Vec<u64> = runs.iter().map(|m| m.peak_bytes).collect();
    let rss_peak = rss_peaks.iter().copied().max().unwrap_or(0);
    // The child's own report: its in-process NVML peak, and free device
    // memory (cuMemGetInfo) after loading and at the end.
    let reports: Vec<Value> = runs
        .iter()
        .map(|m| {
            let peak = line_bytes(&m.stderr, "device:", "vs peak");
            let free = line_bytes(&m.stderr, "device:", "after loading");
            json!({
                "nvml_peak_bytes": peak.get(1),
                "free_after_load_bytes": free.first(),
                "free_at_end_bytes": free.get(1),
                "allocated_while_generating_bytes": free.get(2),
            })
        })
        .collect();
    let covered = device_peak.is_some_and(|p| device_plan >= p);
    let tight = device_peak.is_some_and(|p| device_plan as f64 <= TIGHTNESS * p as f64);
    json!({
        "id": cell.id(),
        "model": cell.file,
        "device": "cuda",
        "context": cell.context,
        "batch": cell.batch,
        "kv_dtype": cell.kv,
        "threads": THREADS,
        "memory": cell.memory(),
        "prompt_tokens": prompt,
        "generated_tokens": generated,
        "command": format!("fathom {}", args.join(" ")),
        "inspect_args": cell.inspect_args(),
        "plan_json": plan_json,
        "plan_bytes": device_plan,
        "terms": {
            "weights": u(plan, "weights_bytes"),
            "converted": u(plan, "converted_bytes"),
            "kv": u(plan, "kv_bytes"),
            "activations": u(plan, "activation_bytes"),
            "backend": u(plan, "backend_bytes"),
        },
        "device_peaks_bytes": device_peaks,
        "device_samples": runs.iter().map(|m| m.device_samples).collect::<Vec<_>>(),
        "peak_bytes": device_peak,
        "margin_bytes": device_peak.map(|p| (device_plan as i128 - p as i128) as i64),
        "ratio": device_peak.map(|p| round4(device_plan as f64 / p.max(1) as f64)),
        "covered": covered,
        "tight": tight,
        "child_reports": reports,
        "host_plan_bytes": host_plan,
        "host_peaks_bytes": rss_peaks,
        "host_peak_bytes": rss_peak,
        "host_ratio": round4(host_plan as f64 / rss_peak.max(1) as f64),
        "host_covered": host_plan >= rss_peak,
        "wall_s": runs.iter().map(|m| (m.wall.as_secs_f64() * 10.0).round() / 10.0).collect::<Vec<_>>(),
        "placement": plan.get("placement").map(|p| json!({
            "gpu_layers": p["gpu_layers"],
            "n_layers": p["n_layers"],
            "cpu_moe_layers": p["cpu_moe_layers"],
            "host_weights_bytes": p["host_weights_bytes"],
        })),
        "llama_cpp": null,
    })
}

/// `2026-11-30` for a Unix time.
fn utc_date(unix: u64) -> String {
    let (year, month, day) = fathom_tokenizer::civil_date(unix);
    format!("{year:04}-{month:02}-{day:02}")
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown".to_string(), |s| s.trim().to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total_kib: Option<u64> = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok());
    json!({
        "cpu": cpu,
        "cores": crate::machine::default_threads(),
        "memory_bytes": mem_total_kib.map(|k| k * 1024),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn run(args: &MemoryArgs) -> Result<ExitCode> {
    let cuda = match args.device.trim().to_ascii_lowercase().as_str() {
        "cpu" => false,
        "cuda" => true,
        other => bail!("--device {other:?}: the memory grid runs on cpu or cuda"),
    };
    let (models, mut cells) = if cuda {
        let models = fx::cuda_memory_grid_models();
        let cells = cuda_cells(&args.grid, &models)?;
        (models, cells)
    } else {
        let models = fx::memory_grid_models();
        let cells = cells(&args.grid, &models)?;
        (models, cells)
    };
    if let Some(filter) = &args.filter {
        cells.retain(|c| c.id().contains(filter.as_str()));
    }
    if cells.is_empty() {
        bail!("no cell of the {} grid matches the filter", args.grid);
    }
    let fathom = std::env::current_exe().context("locating the fathom binary")?;
    let dir = &args.work_dir;
    prepare(dir, &args.smollm2, &cells, &models)?;
    let llama_cpp = match &args.llama_cpp {
        Some(bin) => Some(
            std::fs::canonicalize(bin)
                .with_context(|| format!("llama.cpp at {}", bin.display()))?,
        ),
        None => None,
    };
    // The commit measured, read before the cells run. A rerun with the same
    // --json resumes: recorded cells are kept, and only get a llama.cpp
    // figure if they lack one and --llama-cpp is given.
    let head = git(&["rev-parse", "HEAD"]);
    let previous: Option<Value> = args
        .json
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str(&t).ok());
    // A resumed file keeps the commit and state its first cells ran at;
    // `commits` lists every commit that added to it.
    let commit = previous
        .as_ref()
        .and_then(|d| d["commit"].as_str().map(String::from))
        .or_else(|| head.clone());
    let clean = match previous.as_ref().map(|d| &d["worktree_clean"]) {
        Some(Value::Bool(b)) => Some(*b),
        _ => git(&["status", "--porcelain"]).map(|s| s.is_empty()),
    };
    let mut results: Vec<Value> = previous
        .as_ref()
        .and_then(|d| d["cells"].as_array().cloned())
        .unwrap_or_default();
    let mut commits: Vec<Value> = previous
        .as_ref()
        .and_then(|d| d["commits"].as_array().cloned())
        .unwrap_or_default();
    if let Some(c) = &head {
        if !commits.contains(&json!(c)) {
            commits.push(json!(c));
        }
    }
    let earlier_s = previous
        .as_ref()
        .and_then(|d| d["elapsed_s"].as_u64())
        .unwrap_or(0);
    let started = Instant::now();
    println!(
        "{:<52} {:>14} {:>14} {:>12} {:>7}",
        "cell", "plan", "peak", "margin", "ratio"
    );
    for cell in &cells {
        let at = results.iter().position(|r| r["id"] == json!(cell.id()));
        let mut r = match at {
            Some(i) => results[i].clone(),
            None => run_cell(&fathom, dir, cell, args.runs)?,
        };
        if let Some(bin) = &llama_cpp {
            let peer_key = if cell.cuda {
                "device_peak_bytes"
            } else {
                "peak_bytes"
            };
            if cell.batch == 1 && r["llama_cpp"][peer_key].is_null() {
                r["llama_cpp"] = llama_peer(bin, dir, cell);
            }
        }
        println!(
            "{:<52} {:>14} {:>14} {:>12} {:>7.4}{}{}",
            cell.id(),
            r["plan_bytes"],
            r["peak_bytes"],
            r["margin_bytes"],
            r["ratio"].as_f64().unwrap_or(0.0),
            match (r["covered"] == true, r["tight"] == true) {
                (false, _) => "  NOT COVERED",
                (true, false) => "  NOT TIGHT",
                _ => "",
            },
            if r["host_covered"] == false {
                format!(
                    "  HOST PLAN {} BELOW PEAK RSS {}",
                    r["host_plan_bytes"], r["host_peak_bytes"]
                )
            } else {
                String::new()
            }
        );
        match at {
            Some(i) => results[i] = r,
            None => results.push(r),
        }
        // After every cell, so an interrupted grid keeps what it measured.
        let doc = document(
            args,
            &commit,
            clean,
            &commits,
            earlier_s + started.elapsed().as_secs(),
            &results,
        );
        write_results(args.json.as_deref(), &doc, false)?;
    }
    let doc = document(
        args,
        &commit,
        clean,
        &commits,
        earlier_s + started.elapsed().as_secs(),
        &results,
    );
    write_results(args.json.as_deref(), &doc, true)?;
    let measured: Vec<&Value> = results
        .iter()
        .filter(|r| cells.iter().any(|c| r["id"] == json!(c.id())))
        .collect();
    let failed = measured
        .iter()
        .filter(|r| !(r["covered"] == true && r["tight"] == true && r["host_covered"] != false))
        .count();
    println!(
        "{} cells in {} s: {} covered within {TIGHTNESS}x, {failed} not",
        measured.len(),
        started.elapsed().as_secs(),
        measured.len() - failed
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn document(
    args: &MemoryArgs,
    commit: &Option<String>,
    clean: Option<bool>,
    commits: &[Value],
    elapsed_s: u64,
    results: &[Value],
) -> Value {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "date": utc_date(unix),
        "fathom_version": env!("CARGO_PKG_VERSION"),
        "commit": commit,
        "commits": commits,
        "worktree_clean": clean,
        "machine": machine(),
        "grid": args.grid,
        "runs_per_cell": args.runs.max(1),
        "tightness": TIGHTNESS,
        "device": args.device.trim().to_ascii_lowercase(),
        "method": if args.device.trim().eq_ignore_ascii_case("cuda") { CUDA_METHOD } else { METHOD },
        "elapsed_s": elapsed_s,
        "cells": results,
    })
}

/// To `path`, or at the end only, to stdout.
fn write_results(path: Option<&Path>, doc: &Value, last: bool) -> Result<()> {
    let text = serde_json::to_string_pretty(doc)? + "\n";
    match path {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None if last => {
            print!("{text}");
            Ok(())
        }
        None => Ok(()),
    }
}

const METHOD: &str = "Per cell: `fathom inspect --json` with the cell's inputs gives the plan (kept byte for byte as plan_json); then `fathom generate` runs in a fresh child process `runs_per_cell` times, with a prompt of context - 64 pseudo-random token ids and 64 greedy tokens per sequence (--ignore-eos; --parallel B for batch B), threads and --memory pinned; the peak is the largest ru_maxrss (VmHWM at exit) that the parent reads with wait4. llama_cpp: llama-bench on the same GGUF, prompt and generated tokens (n_ctx = prompt + 64), once, its peak measured the same way.";

const CUDA_METHOD: &str = "Per cell: `fathom inspect --json --device cuda --memory 128G` with the cell's inputs gives the device plan (total_bytes) and the host plan (host.total_bytes), kept byte for byte as plan_json; then `fathom generate --device cuda` runs in a fresh child process `runs_per_cell` times, with a prompt of min(context, 8192) - 64 pseudo-random token ids and 64 greedy tokens per sequence (--ignore-eos; --parallel B for batch B), threads pinned. Device peak: the child's device memory as NVML lists it per process (context included), sampled every 10 ms by the parent from the child's start to its end; the largest over the runs. Host peak: ru_maxrss (VmHWM at exit) read with wait4. child_reports: the child's own in-process NVML peak and its free device memory (cuMemGetInfo) after loading and at the end. llama_cpp: llama-bench -ngl 99 -fa 1 on the same GGUF and KV type with a prompt of context - 64 and 64 generated tokens (n_ctx = the cell's context), once, its device and host peaks measured the same way.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_follow_the_civil_calendar() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_798_675_200), "2026-12-31");
    }

    #[test]
    fn the_full_grid_has_at_least_30_cells_and_ci_3() {
        let models = fx::memory_grid_models();
        assert!(cells("full", &models).unwrap().len() >= 30);
        assert_eq!(cells("ci", &models).unwrap().len(), 3);
        assert!(cells("huge", &models).is_err());
    }

    #[test]
    fn report_lines_give_their_exact_byte_counts() {
        use fathom_plan::size::format_bytes;
        let stderr = format!(
            "decode:  64 tokens\ndevice:  plan {} vs peak {} used by this process (NVML) (1.001x)\ndevice:  free {} after loading, {} at the end ({} allocated while generating)\n",
            format_bytes(17_021_337_600),
            format_bytes(17_014_194_176),
            format_bytes(5 << 30),
            format_bytes(5 << 30),
            format_bytes(0)
        );
        assert_eq!(
            line_bytes(&stderr, "device:", "vs peak"),
            [17_021_337_600, 17_014_194_176]
        );
        assert_eq!(
            line_bytes(&stderr, "device:", "after loading"),
            [5 << 30, 5 << 30, 0]
        );
        assert!(line_bytes(&stderr, "device:", "absent").is_empty());
    }

    #[test]
    fn the_cuda_grid_covers_every_shape_context_batch_and_kv_type_asked_for() {
        let models = fx::cuda_memory_grid_models();
        let grid = cuda_cells("full", &models).unwrap();
        assert!(grid.len() >= 20);
        for model in &models {
            let of: Vec<&Cell> = grid.iter().filter(|c| c.file == model.file).collect();
            assert!(of.iter().any(|c| c.batch == 1) && of.iter().any(|c| c.batch == 16));
            let trained = model.model.text_config()["max_position_embeddings"]
                .as_u64()
                .unwrap();
            let longest = of.iter().map(|c| c.context).max().unwrap();
            assert_eq!(longest, trained.min(32768), "{}", model.file);
            assert!(of.iter().all(|c| c.prompt_tokens() + GENERATE <= c.context));
        }
        assert!(grid.iter().any(|c| c.kv == "q8_0"));
        let ids: std::collections::BTreeSet<String> = grid.iter().map(Cell::id).collect();
        assert_eq!(ids.len(), grid.len(), "cell ids are unique");
        assert_eq!(cuda_cells("ci", &models).unwrap().len(), 2);
    }
}
