//! What `generate` and `run` share: sampling flags, the memory preflight,
//! loading the engine from the plan, and the stats line on stderr.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use fathom_checkpoint::Checkpoint;
use fathom_engine::{Engine, GenerateStats, SamplingParams, Tokenizer};
use fathom_plan::size::format_bytes;
use fathom_plan::{Device, MemoryPlan};
use fathom_spec::ModelSpec;

use crate::render;

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 disables).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1.0 disables).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p times the most likely (0 disables).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize repeated tokens (1.0 disables).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Recent tokens the penalties look at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed [default: from the clock]
    #[arg(long, short = 's')]
    pub seed: Option<u64>,
    /// Stop when the output contains this text (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            ..SamplingParams::default()
        }
    }
}

#[derive(Args, Clone)]
pub struct PreflightArgs {
    /// Compute the memory plan before loading and refuse (exit 2) if it does not fit.
    #[arg(long)]
    pub estimate_memory: bool,
    /// With --estimate-memory: load even if the plan does not fit.
    #[arg(long, visible_alias = "no-memory-check")]
    pub force: bool,
}

/// The checkpoint's headers, spec and tokenizer: everything before the plan.
pub struct Opened {
    pub checkpoint: Checkpoint,
    pub spec: ModelSpec,
    pub tokenizer: Tokenizer,
    pub started: Instant,
}

pub fn open(model: &Path) -> Result<Opened> {
    let started = Instant::now();
    let checkpoint = Checkpoint::open(model)?;
    let spec = ModelSpec::from_checkpoint(&checkpoint)?;
    // Say that the family cannot run before anything else can fail on it.
    if !spec.is_known_family() {
        return Err(fathom_engine::EngineError::UnsupportedFamily {
            architecture: spec.architecture.clone(),
        }
        .into());
    }
    let tokenizer = fathom_engine::load_tokenizer(&checkpoint)?;
    Ok(Opened {
        checkpoint,
        spec,
        tokenizer,
        started,
    })
}

/// The preflight: `Some(exit code)` when the load must not go ahead.
pub fn preflight(
    model: &Path,
    opened: &Opened,
    plan: &MemoryPlan,
    args: &PreflightArgs,
) -> Option<ExitCode> {
    // A GPU plan has a second budget, host memory, which must fit too.
    let host_short = plan.host.as_ref().filter(|h| !h.fits);
    if !args.estimate_memory || (plan.fits && host_short.is_none()) {
        return None;
    }
    eprint!(
        "{}",
        render::plan_text(model, opened.checkpoint.format_name(), &opened.spec, plan)
    );
    let advice = match host_short {
        Some(h) if plan.fits => format!(
            "the plan needs {} of host memory but {} is available ({}): {} over. Free host memory or use a smaller model",
            format_bytes(h.total_bytes),
            format_bytes(h.available_bytes),
            h.available_source,
            format_bytes(h.total_bytes.saturating_sub(h.available_bytes))
        ),
        _ => format!(
            "the plan needs {} but {} is available ({}): {} over{}. Lower -n or --ctx-size, use --kv-dtype q8_0, or a smaller or more quantized model",
            format_bytes(plan.total_bytes),
            format_bytes(plan.available_bytes),
            plan.available_source,
            format_bytes(plan.overflow_bytes),
            placed_budgets(plan)
        ),
    };
    if args.force {
        eprintln!("warning: {advice}; loading anyway (--force)");
        return None;
    }
    eprintln!("error: {advice}; --force loads anyway");
    Some(ExitCode::from(2))
}

/// For a plan placed between GPU and host: what the placement left on the
/// GPU and what the host's budget says, so both budgets are named.
fn placed_budgets(plan: &MemoryPlan) -> String {
    match (&plan.placement, &plan.host) {
        (Some(p), Some(h)) => format!(
            " on the device with {} of {} layers on the GPU ({}), and the host needs {} of {} ({})",
            p.gpu_layers,
            p.n_layers,
            p.chosen_by,
            format_bytes(h.total_bytes),
            format_bytes(h.available_bytes),
            if h.fits { "fits" } else { "does not fit" }
        ),
        _ => String::new(),
    }
}

pub fn load(opened: Opened, plan: MemoryPlan) -> Result<(Engine, Duration)> {
    let engine = Engine::load(&opened.checkpoint, opened.spec, plan, opened.tokenizer)?;
    // Fault the weights in now, with a progress bar on a terminal once
    // loading has taken over a second (a large model on a cold disk).
    let started = opened.started;
    let terminal = std::io::stderr().is_terminal();
    let mut shown = false;
    engine.model.prefault(&mut |done, total| {
        if terminal && started.elapsed() > Duration::from_secs(1) {
            eprint!("\r{}", progress_bar(done, total));
            shown = true;
        }
    });
    if shown {
        eprintln!();
    }
    Ok((engine, opened.started.elapsed()))
}

/// `loading [##########          ]  50% 1.00 GiB / 2.00 GiB`.
fn progress_bar(done: u64, total: u64) -> String {
    const WIDTH: u64 = 30;
    let filled = (done.saturating_mul(WIDTH) / total.max(1)).min(WIDTH) as usize;
    format!(
        "loading [{}{}] {:>3}% {} / {}",
        "#".repeat(filled),
        " ".repeat(WIDTH as usize - filled),
        done.saturating_mul(100) / total.max(1),
        fathom_plan::size::format_binary(done),
        fathom_plan::size::format_binary(total)
    )
}

/// Peak resident memory of this process so far (`VmHWM`), in bytes.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    fathom_plan::available::proc_kib(&status, "VmHWM")?.checked_mul(1024)
}

/// A process's device memory as NVML reports it, sampled every 10 ms: for
/// `generate`, its own from before the engine loads to the end; for `bench
/// serve`, the server's throughout. The peak is what a report sets against
/// the device plan. Every GPU NVML lists is sampled, each for its own peak:
/// under tensor parallelism each device's is set against its plan.
pub struct DeviceWatch {
    stop: Arc<AtomicBool>,
    peaks: Arc<Vec<AtomicU64>>,
    samples: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl DeviceWatch {
    /// Starts sampling this process when the plan is for a GPU and NVML is
    /// there.
    pub fn start(plan: &MemoryPlan) -> Option<DeviceWatch> {
        if plan.inputs.device != Device::Cuda {
            return None;
        }
        DeviceWatch::process(std::process::id())
    }

    /// Starts sampling process `pid` on every GPU, when NVML is there.
    pub fn process(pid: u32) -> Option<DeviceWatch> {
        let nvml = crate::machine::nvml()?;
        let gpus = crate::machine::gpus().len();
        let (stop, peaks, samples) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new((0..gpus).map(|_| AtomicU64::new(0)).collect::<Vec<_>>()),
            Arc::new(AtomicU64::new(0)),
        );
        let thread = {
            let (stop, peaks, samples) = (stop.clone(), peaks.clone(), samples.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut listed = false;
                    for (d, peak) in peaks.iter().enumerate() {
                        if let Some(used) = nvml.process_used(d as u32, pid) {
                            peak.fetch_max(used, Ordering::Relaxed);
                            listed = true;
                        }
                    }
                    if listed {
                        samples.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Some(DeviceWatch {
            stop,
            peaks,
            samples,
            thread,
        })
    }

    /// Stops sampling; each GPU's peak (`None` where NVML never listed the
    /// process).
    pub fn finish(self) -> Vec<Option<u64>> {
        self.finish_each().0
    }

    /// Stops sampling; the largest peak of any GPU (when NVML listed the
    /// process at all) and how many samples listed it.
    pub fn finish_counted(self) -> (Option<u64>, u64) {
        let (peaks, samples) = self.finish_each();
        (peaks.into_iter().flatten().max(), samples)
    }

    fn finish_each(self) -> (Vec<Option<u64>>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let peaks = self
            .peaks
            .iter()
            .map(|p| Some(p.load(Ordering::Relaxed)).filter(|&p| p > 0))
            .collect();
        (peaks, self.samples.load(Ordering::Relaxed))
    }
}

/// Reads GPU 0's free and total memory and this process's use of it
/// (NVML) on each call: what a GPU server's `/metrics` shows. `None`
/// where NVML is not there.
pub fn device_probe() -> Option<fathom_server::metrics::DeviceProbe> {
    let nvml = crate::machine::nvml()?;
    let pid = std::process::id();
    Some(Box::new(move || {
        let memory = nvml.memory(0)?;
        Some(fathom_server::metrics::DeviceReading {
            free: memory.free,
            total: memory.total,
            process: nvml.process_used(0, pid),
        })
    }))
}

/// The stats block `generate` prints on stderr.
pub fn report(load: Duration, stats: &GenerateStats, plan: &MemoryPlan) {
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!();
    eprintln!("load:    {:.1} ms", load.as_secs_f64() * 1e3);
    eprintln!(
        "prompt:  {} tokens in {:.1} ms, {:.1} tok/s",
        stats.prompt_tokens,
        stats.prefill.as_secs_f64() * 1e3,
        rate(stats.prompt_tokens, stats.prefill)
    );
    eprintln!(
        "decode:  {} tokens in {:.1} ms, {:.1} tok/s",
        stats.generated_tokens,
        stats.decode.as_secs_f64() * 1e3,
        rate(stats.generated_tokens, stats.decode)
    );
    if let Some(p) = plan.placement.as_ref().filter(|p| p.is_split()) {
        eprintln!(
            "placement: {} of {} layers on the GPU, routed experts of {} on the host ({}); host weights {}",
            p.gpu_layers,
            p.n_layers,
            p.cpu_moe_layers,
            p.chosen_by,
            format_bytes(p.host_weights_bytes)
        );
    }
    // On a GPU the host budget is the host plan's; on the CPU, the plan's.
    let host_plan = plan
        .host
        .as_ref()
        .map_or(plan.total_bytes, |h| h.total_bytes);
    match peak_rss() {
        Some(peak) => eprintln!(
            "memory:  plan {} vs peak RSS {} ({:.3}x)",
            format_bytes(host_plan),
            format_bytes(peak),
            host_plan as f64 / peak as f64
        ),
        None => eprintln!("memory:  plan {}", format_bytes(host_plan)),
    }
}

/// The device lines of the report: the device plan against this process's
/// peak device memory (NVML) on each device the plan covers (GPU 0, or
/// GPUs 0 .. N under tensor parallelism, each planned alike), and free
/// device memory after loading and at the end (equal when nothing was
/// allocated while generating; the tightest device's).
pub fn report_device(
    plan: &MemoryPlan,
    peaks: &[Option<u64>],
    free_after_load: u64,
    free_at_end: u64,
) {
    let devices = plan.tensor_parallel.as_ref().map_or(1, |tp| tp.size) as usize;
    for d in 0..devices {
        let label = if devices > 1 {
            format!("device {d}:")
        } else {
            "device:".to_string()
        };
        match peaks.get(d).copied().flatten() {
            Some(peak) => eprintln!(
                "{label}  plan {} vs peak {} used by this process (NVML) ({:.3}x)",
                format_bytes(plan.total_bytes),
                format_bytes(peak),
                plan.total_bytes as f64 / peak as f64
            ),
            None => eprintln!(
                "{label}  plan {} (NVML did not list this process)",
                format_bytes(plan.total_bytes)
            ),
        }
    }
    eprintln!(
        "device:  free {} after loading, {} at the end ({} allocated while generating)",
        format_bytes(free_after_load),
        format_bytes(free_at_end),
        format_bytes(free_after_load.saturating_sub(free_at_end))
    );
}

#[cfg(test)]
mod tests {
    use super::progress_bar;

    #[test]
    fn progress_bar_fills_with_the_bytes_done() {
        assert_eq!(
            progress_bar(0, 100),
            format!("loading [{}]   0% 0 B / 100 B", " ".repeat(30))
        );
        assert_eq!(
            progress_bar(50 << 20, 100 << 20),
            format!(
                "loading [{}{}]  50% 50.00 MiB / 100.00 MiB",
                "#".repeat(15),
                " ".repeat(15)
            )
        );
        assert!(progress_bar(7, 7).contains("100%"));
        assert!(
            progress_bar(1, 0).contains("loading"),
            "no panic on an empty file"
        );
    }
}
