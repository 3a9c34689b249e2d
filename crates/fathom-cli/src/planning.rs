//! Plan inputs shared by every command that plans: inspect, generate, run.

use anyhow::{bail, Context, Result};
use clap::Args;
use fathom_backend::Features;
use fathom_plan::placement::{GpuLayers, PlacementRequest, TensorOverride};
use fathom_plan::{env, rocm, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

use crate::machine;

#[derive(Args, Clone)]
pub struct PlanArgs {
    /// Device: auto (cuda when an NVIDIA GPU is present, else cpu), cpu, cuda, or the planning targets rocm and metal.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Memory to plan against, e.g. 8G or 1.5GiB [default: FATHOM_MEMORY_LIMIT, else the cgroup limit, else MemAvailable; free GPU memory for cuda]
    #[arg(long)]
    pub memory: Option<String>,
    /// KV cache dtype: f16, bf16, f32 or q8_0.
    #[arg(long, default_value = "f16", visible_alias = "cache-type-k")]
    pub kv_dtype: String,
    /// Tokens processed in one forward step (the prefill chunk).
    #[arg(long, default_value_t = fathom_plan::DEFAULT_MAX_TOKENS_PER_STEP, visible_alias = "ubatch-size")]
    pub max_tokens_per_step: u64,
    /// Worker threads [default: one per core]
    #[arg(long, short = 't')]
    pub threads: Option<u64>,
    /// Split the model over N CUDA devices (GPUs 0 .. N-1: attention heads and FFN columns split, embeddings, output head and norms whole; NCCL sums between them); the plan and --memory are per device; -tp N (vLLM's spelling) is read as this flag.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        visible_alias = "tensor-parallel-size"
    )]
    pub tensor_parallel: u64,
}

/// Where tensors sit between the GPU and the host (`--device cuda`).
#[derive(Args, Clone, Default)]
pub struct PlacementArgs {
    /// Layers whose attention and KV sit on the GPU (cuda): auto (all when the model fits, else the most that fit, the rest on the host from the input end), all, or N (the last N); -ngl N and --n-gpu-layers N are read as this flag.
    #[arg(long, value_name = "auto|all|N", visible_alias = "n-gpu-layers")]
    pub gpu_layers: Option<String>,
    /// Keep every layer's routed expert tensors on the host (MoE models), as llama.cpp's --cpu-moe.
    #[arg(long)]
    pub cpu_moe: bool,
    /// Keep the routed expert tensors of the first N layers on the host, as llama.cpp's --n-cpu-moe.
    #[arg(long, value_name = "N")]
    pub n_cpu_moe: Option<u64>,
    /// Place tensors whose name matches REGEX: REGEX=cpu or REGEX=cuda, repeatable or comma-joined, later rules winning (llama.cpp's -ot, e.g. -ot 'exps=cpu'); -ot is read as this flag.
    #[arg(long, value_name = "REGEX=cpu|cuda")]
    pub override_tensor: Vec<String>,
}

impl PlacementArgs {
    /// The request the flags make.
    pub fn request(&self) -> Result<PlacementRequest> {
        let gpu_layers = match &self.gpu_layers {
            Some(text) => GpuLayers::parse(text)?,
            None => GpuLayers::Auto,
        };
        let mut overrides = Vec::new();
        for rule in &self.override_tensor {
            overrides.extend(TensorOverride::parse(rule)?);
        }
        Ok(PlacementRequest {
            gpu_layers,
            cpu_moe_layers: if self.cpu_moe {
                u64::MAX
            } else {
                self.n_cpu_moe.unwrap_or(0)
            },
            overrides,
        })
    }

    /// The plan with these placement flags: placed on cuda with one
    /// device; elsewhere the flags are refused unless left at their
    /// defaults.
    pub fn plan(
        &self,
        plan: &PlanArgs,
        spec: &ModelSpec,
        inputs: PlanInputs,
    ) -> Result<MemoryPlan> {
        let planned = match self.request_for(plan, &inputs)? {
            Some(request) => MemoryPlan::with_placement(spec, inputs, &request)
                .context("computing the memory plan")?,
            None => plan.plan(spec, inputs)?,
        };
        check_runs(spec, &planned.inputs, plan.tensor_parallel)?;
        Ok(planned)
    }

    /// The placement request when the plan may place the model between
    /// the GPU and the host (cuda, one device); `None` where it may not,
    /// and there the flags are refused unless left at their defaults.
    pub fn request_for(
        &self,
        plan: &PlanArgs,
        inputs: &PlanInputs,
    ) -> Result<Option<PlacementRequest>> {
        let request = self.request()?;
        if inputs.device != Device::Cuda || plan.tensor_parallel != 1 {
            if !request.is_default() {
                bail!(
                    "--gpu-layers, --cpu-moe, --n-cpu-moe and --override-tensor place tensors between one GPU and the host: they need --device cuda without --tensor-parallel (this plan is for {}{})",
                    inputs.device.name(),
                    if plan.tensor_parallel != 1 {
                        format!(" over {} devices", plan.tensor_parallel)
                    } else {
                        String::new()
                    }
                );
            }
            return Ok(None);
        }
        Ok(Some(request))
    }
}

impl PlanArgs {
    /// The plan of each device: one device's unless `--tensor-parallel`
    /// splits the model.
    pub fn plan(&self, spec: &ModelSpec, inputs: PlanInputs) -> Result<MemoryPlan> {
        MemoryPlan::with_tensor_parallel(spec, inputs, self.tensor_parallel)
            .context("computing the memory plan")
    }

    pub fn inputs(&self, max_tokens: u64, batch: u64) -> Result<PlanInputs> {
        let device = resolve_device(&self.device)?;
        let headroom_factor = fathom_plan::parse_headroom_factor(
            machine::env_text(env::HEADROOM_FACTOR_VAR)?.as_deref(),
        )?;
        Ok(PlanInputs {
            context: max_tokens,
            batch,
            device,
            kv_dtype: KvDtype::parse(&self.kv_dtype)?,
            max_tokens_per_step: self.max_tokens_per_step,
            threads: self.threads.unwrap_or_else(machine::default_threads),
            headroom_factor,
            rocm_inflight_raw: machine::env_bytes(rocm::ROCM_INFLIGHT_VAR),
            available: machine::available_memory(
                device,
                self.memory.as_deref(),
                self.tensor_parallel,
            )?,
            // A GPU's plan has a host budget too: host memory as for cpu
            // (the cgroup limit, else MemAvailable; --memory is the
            // device's).
            host_available: match device {
                Device::Cuda => Some(machine::host_memory()?),
                _ => None,
            },
        })
    }
}

/// Refuses a model the device's backend does not run (a hybrid model,
/// Gemma 4 or gpt-oss over several GPUs), by the rule the load
/// applies (`fathom_engine::check_runs` with the device's `Features`),
/// after the plan's own refusals and before any plan or placement is
/// printed as if it ran. rocm and metal are planning targets: their plans
/// are the answer.
pub fn check_runs(spec: &ModelSpec, inputs: &PlanInputs, tensor_parallel: u64) -> Result<()> {
    let device = inputs.device;
    if matches!(device, Device::Cpu | Device::Cuda) {
        let devices = tensor_parallel as usize;
        let features = Features::of(device, devices);
        fathom_engine::check_runs(spec, features, (device.name(), devices), None)?;
    }
    Ok(())
}

/// `--device`: `auto` picks cuda when NVML finds a GPU (and the binary has
/// the CUDA kernels), else cpu, and says which on stderr.
pub fn resolve_device(text: &str) -> Result<Device> {
    if !text.trim().eq_ignore_ascii_case("auto") {
        return Ok(Device::parse(text)?);
    }
    let cuda_runs = fathom_backend::devices()
        .iter()
        .any(|k| k.device == Device::Cuda && k.runs);
    if !cuda_runs {
        eprintln!("device: cpu (this fathom was built without CUDA), chosen by --device auto");
        return Ok(Device::Cpu);
    }
    Ok(match machine::gpus().first() {
        Some(g) => {
            eprintln!(
                "device: cuda ({}, {} free), chosen by --device auto",
                g.name,
                fathom_plan::size::format_binary(g.free)
            );
            Device::Cuda
        }
        None => {
            eprintln!("device: cpu (no NVIDIA GPU found), chosen by --device auto");
            Device::Cpu
        }
    })
}

/// `--max-tokens` when not given: the trained context, at most 8192.
pub fn default_context(spec: &ModelSpec) -> u64 {
    match spec.context_length {
        0 => fathom_plan::DEFAULT_MAX_TOKENS_CAP,
        n => n.min(fathom_plan::DEFAULT_MAX_TOKENS_CAP),
    }
}
