//! The memory plan: named byte terms computed from a [`ModelSpec`] before
//! any weight is loaded.
//!
//! The plan is the allocation: the engine allocates the buffers listed here
//! (weights, KV block pool, activation arena) once at start-up. Every memory
//! decision — `inspect`, the preflight, the KV pool budget, admission —
//! reads this one computation. It is pure: environment values and files
//! from `/proc` come in as arguments.

pub mod activations;
pub mod available;
pub mod cuda;
pub mod device;
pub mod env;
pub mod kv;
pub mod placement;
pub mod quant;
pub mod recurrent;
pub mod rocm;
pub mod serve;
pub mod size;
pub mod tensor_parallel;

use fathom_spec::ModelSpec;
use serde::Serialize;

pub use activations::ActivationPlan;
pub use available::{Available, MemorySources};
pub use device::Device;
pub use kv::{KvDtype, KvPlan};
pub use quant::QuantAdvice;

/// Default prefill chunk: tokens processed in one forward step.
pub const DEFAULT_MAX_TOKENS_PER_STEP: u64 = 512;
/// `--max-tokens` defaults to the model's context, capped here.
pub const DEFAULT_MAX_TOKENS_CAP: u64 = 8192;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{what}: invalid size {value:?}: expected bytes or a number with K, M, G or T (powers of 1024, optional B or iB), e.g. 8G or 1.5GiB; empty, 0 or none mean unset")]
    InvalidSize { what: String, value: String },
    #[error("invalid {what} {value:?}: expected one of {valid}")]
    InvalidChoice {
        what: String,
        value: String,
        valid: String,
    },
    #[error("{what} is {value}: {expected}")]
    InvalidInput {
        what: String,
        value: String,
        expected: String,
    },
    #[error("could not determine available memory: pass --memory SIZE or set FATHOM_MEMORY_LIMIT")]
    NoAvailableMemory,
}

/// Parses `FATHOM_HEADROOM_FACTOR`: a finite number above zero.
pub fn parse_headroom_factor(text: Option<&str>) -> Result<f64, PlanError> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(env::DEFAULT_HEADROOM_FACTOR);
    };
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err(PlanError::InvalidInput {
            what: env::HEADROOM_FACTOR_VAR.into(),
            value: format!("{text:?}"),
            expected: "expected a finite number above 0, e.g. 1.1 for 10% extra on weights + KV"
                .into(),
        }),
    }
}

/// Everything a plan depends on besides the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanInputs {
    /// Tokens of context per sequence (prompt + generated); not the
    /// OpenAI request field of that name. The JSON keeps the key of the
    /// `--max-tokens` flag that sets it.
    #[serde(rename = "max_tokens")]
    pub context: u64,
    /// Sequences held at once.
    pub batch: u64,
    pub device: Device,
    pub kv_dtype: KvDtype,
    pub max_tokens_per_step: u64,
    /// Worker threads (each has attention scratch).
    pub threads: u64,
    /// Multiplies weights + KV (`FATHOM_HEADROOM_FACTOR`).
    #[serde(skip)]
    pub headroom_factor: f64,
    /// Raw `MLX_ROCM_MAX_INFLIGHT_MB`, read only for the rocm device.
    #[serde(skip)]
    pub rocm_inflight_raw: Option<Vec<u8>>,
    /// Host memory for a discrete GPU's host budget (`available` is then
    /// the device's); `None` leaves the host budget unchecked.
    #[serde(skip)]
    pub host_available: Option<Available>,
    #[serde(skip)]
    pub available: Available,
}

impl PlanInputs {
    fn validate(&self) -> Result<(), PlanError> {
        for (what, value) in [
            ("--max-tokens", self.context),
            ("--batch", self.batch),
            ("--max-tokens-per-step", self.max_tokens_per_step),
            ("--threads", self.threads),
        ] {
            if value == 0 {
                return Err(PlanError::InvalidInput {
                    what: what.into(),
                    value: "0".into(),
                    expected: "expected at least 1".into(),
                });
            }
        }
        Ok(())
    }
}

/// One named line of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Term {
    pub name: &'static str,
    pub bytes: u64,
    pub derivation: String,
}

/// The memory plan for one model and one set of inputs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryPlan {
    pub inputs: PlanInputs,
    pub weights_bytes: u64,
    pub weights_source: String,
    pub kv_bytes_per_token: u64,
    pub kv_bytes: u64,
    pub kv_block_tokens: u64,
    pub kv_detail: Vec<kv::KvGroup>,
    /// Linear-attention layers' per-sequence state (hybrid models; 0 and
    /// no detail otherwise). Absent from the JSON when 0, so the plans of
    /// other models (and the recorded grids that re-derive them) read as
    /// before.
    #[serde(skip_serializing_if = "is_zero")]
    pub recurrent_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recurrent_detail: Option<recurrent::RecurrentPlan>,
    pub activation_bytes: u64,
    pub activation_detail: Vec<activations::ArenaBuffer>,
    pub runtime_overhead_bytes: u64,
    /// 1-D tensors (norms, biases) the engine copies to f32 at load.
    pub converted_bytes: u64,
    /// Device context and library workspaces (CUDA); 0 on cpu, metal, rocm.
    pub backend_bytes: u64,
    /// The ROCm in-flight command reserve; 0 on every other device.
    pub backend_inflight_bytes: u64,
    /// Extra bytes from the headroom factor on weights + KV (negative for a
    /// factor below 1).
    pub headroom_bytes: i64,
    pub headroom_factor: f64,
    pub available_bytes: u64,
    pub available_source: String,
    pub total_bytes: u64,
    pub fits: bool,
    pub slack_bytes: u64,
    pub overflow_bytes: u64,
    /// Largest context per sequence that fits at this batch (capped at the
    /// model's trained context); 0 when not even one token fits.
    pub max_context_that_fits: u64,
    pub terms: Vec<Term>,
    /// A discrete GPU's second budget: what stays in host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostPlan>,
    /// Under tensor parallelism (more than one device) the fields above are
    /// each device's; this says how the model is split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<tensor_parallel::TensorParallel>,
    /// The CUDA backend's one allocation as the plan carved it (the
    /// backend allocates this, computed nowhere else); `None` off CUDA.
    /// Not in the JSON: its size less the weights, the KV and the
    /// recurrent state is the backend term.
    #[serde(skip)]
    pub device_layout: Option<cuda::DeviceLayout>,
    /// Which tensors sit on the GPU and which on the host (`cuda` plans
    /// made by [`MemoryPlan::with_placement`]); the fields above are then
    /// the device's, `host` holds the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<placement::Placement>,
}

/// What a discrete GPU's run keeps in host memory, against host memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostPlan {
    pub terms: Vec<Term>,
    pub total_bytes: u64,
    /// 0 with source `unchecked` when no host figure was given.
    pub available_bytes: u64,
    pub available_source: String,
    pub fits: bool,
}

/// The byte terms at one context length, before the search for the largest context.
struct Sized {
    converted: u64,
    kv: KvPlan,
    recurrent: Option<recurrent::RecurrentPlan>,
    activations: ActivationPlan,
    /// The activations on the plan's device.
    activation_bytes: u64,
    runtime: (u64, String),
    backend: device::Backend,
    layout: Option<cuda::DeviceLayout>,
    headroom_bytes: i64,
    total: u64,
}

/// `nccl` is the NCCL term of a tensor-parallel device (0 otherwise), whose
/// `spec` is then the sharded one.
fn size_terms(spec: &ModelSpec, inputs: &PlanInputs, max_tokens: u64, nccl: u64) -> Sized {
    let kv = kv::plan(spec, max_tokens, inputs.batch, inputs.kv_dtype);
    let recurrent = recurrent::plan(spec, inputs.batch);
    let activations = activations::plan(
        spec,
        max_tokens,
        inputs.batch,
        inputs.max_tokens_per_step,
        inputs.threads,
    );
    let runtime = device::runtime(
        inputs.device,
        spec.vocab,
        spec.tokenizer_merges,
        &spec.vocab_header,
        inputs.threads,
    );
    let converted = converted_vector_bytes(spec);
    let resident_weights = spec.weights_bytes().saturating_add(converted);
    let layout = (inputs.device == Device::Cuda).then(|| {
        let states = recurrent.as_ref().map_or(0, |r| r.bytes);
        // Grouping where the device runs every MoE layer it holds with its
        // experts, or runs the host's experts streamed for large steps
        // (with room for them). With experts on the host and none
        // streamed, the host's experts bound the speed, and a device cap
        // is better spent on more experts.
        let moe = if placement::runs_all_its_experts(spec)
            || (spec.n_experts > 0 && spec.streamed_weights > 0)
        {
            cuda::MoeGrouping::of_arena(&activations.buffers, spec.expert_ffn)
        } else {
            cuda::MoeGrouping::default()
        };
        cuda::DeviceLayout::new(
            resident_weights,
            &activations.buffers,
            &kv.groups,
            states,
            moe,
            spec.streamed_weights,
        )
    });
    let backend = device::backend(
        inputs.device,
        inputs.rocm_inflight_raw.as_deref(),
        layout.as_ref().map(|l| (l, resident_weights)),
    );
    // A discrete GPU holds the device side of the arena; the host side
    // goes to the host budget.
    let activation_bytes = if layout.is_some() {
        activations.arena_bytes(false)
    } else {
        activations.bytes
    };
    let weights_and_kv = spec.weights_bytes().saturating_add(kv.bytes);
    let scaled = if inputs.headroom_factor == 1.0 {
        weights_and_kv
    } else {
        // f64 -> u64 casts saturate, so a huge product cannot wrap.
        (weights_and_kv as f64 * inputs.headroom_factor).ceil() as u64
    };
    let headroom_bytes = (i128::from(scaled) - i128::from(weights_and_kv))
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    let total = [
        scaled,
        recurrent.as_ref().map_or(0, |r| r.bytes),
        converted,
        activation_bytes,
        runtime.0,
        backend.fixed_bytes,
        backend.inflight_bytes,
        nccl,
    ]
    .into_iter()
    .fold(0u64, u64::saturating_add);
    Sized {
        converted,
        kv,
        recurrent,
        activations,
        activation_bytes,
        runtime,
        backend,
        layout,
        headroom_bytes,
        total,
    }
}

impl MemoryPlan {
    pub fn new(spec: &ModelSpec, inputs: PlanInputs) -> Result<Self, PlanError> {
        Self::build(spec, inputs, None)
    }

    /// The plan of each of `size` CUDA devices sharing the model
    /// ([`tensor_parallel`]), with the table of sizes 1, 2, 4 and 8; size 1
    /// is exactly [`MemoryPlan::new`].
    pub fn with_tensor_parallel(
        spec: &ModelSpec,
        inputs: PlanInputs,
        size: u64,
    ) -> Result<Self, PlanError> {
        if size == 1 {
            return Self::new(spec, inputs);
        }
        if inputs.device != Device::Cuda {
            return Err(PlanError::InvalidInput {
                what: "--tensor-parallel".into(),
                value: size.to_string(),
                expected: format!(
                    "tensor parallelism runs on cuda devices only, not {}: pass --device cuda, or drop the flag (or give 1)",
                    inputs.device.name()
                ),
            });
        }
        let shard = tensor_parallel::shard(spec, size)?;
        let mut plan = Self::build(spec, inputs.clone(), Some(&shard))?;
        let sizes = tensor_parallel::TABLE_SIZES
            .into_iter()
            .filter(|n| spec.n_heads.is_multiple_of(*n))
            .map(|n| {
                let option = if n == size {
                    Ok(plan.clone())
                } else if n == 1 {
                    Self::new(spec, inputs.clone())
                } else {
                    tensor_parallel::shard(spec, n)
                        .and_then(|s| Self::build(spec, inputs.clone(), Some(&s)))
                };
                tensor_parallel::SizeOption::of(n, option)
            })
            .collect();
        if let Some(tp) = plan.tensor_parallel.as_mut() {
            tp.sizes = sizes;
        }
        Ok(plan)
    }

    /// The plan with a placement between GPU and host (`cuda`; other
    /// devices plan as [`MemoryPlan::new`]): `request`'s cut when the flags
    /// fix one, else the first along [`placement`]'s order whose device
    /// plan fits (everything on the host, not fitting, when none does).
    pub fn with_placement(
        spec: &ModelSpec,
        inputs: PlanInputs,
        request: &placement::PlacementRequest,
    ) -> Result<Self, PlanError> {
        if inputs.device != Device::Cuda {
            return Self::new(spec, inputs);
        }
        let mut by = match request.gpu_layers {
            placement::GpuLayers::Auto => "auto".to_string(),
            placement::GpuLayers::All => "--gpu-layers all".to_string(),
            placement::GpuLayers::Count(n) => format!("--gpu-layers {n}"),
        };
        if request.cpu_moe_layers > 0 {
            by.push_str(&format!(" --n-cpu-moe {}", request.cpu_moe_layers));
        }
        for o in &request.overrides {
            by.push_str(&format!(" -ot {}={}", o.pattern, o.place.name()));
        }
        let plan_of = |cut| -> Result<Self, PlanError> {
            let (mut placed, device_spec, host_spec) =
                placement::place(spec, cut, &request.overrides, by.clone());
            let mut plan = Self::new(&device_spec, inputs.clone())?;
            plan.add_host_side(spec, &host_spec, &mut placed);
            plan.placement = Some(placed);
            Ok(plan)
        };
        let chosen = match placement::fixed_cut(spec, request) {
            Some(cut) => plan_of(cut)?,
            None => {
                let cuts = placement::auto_cuts(spec, request.cpu_moe_layers);
                // Each cut moves more to the host, so fitting is monotone:
                // the first that fits, by bisection; the last (all on the
                // host) if none does.
                let (mut lo, mut hi) = (0, cuts.len() - 1);
                let mut best = plan_of(cuts[hi])?;
                while best.fits && lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    let p = plan_of(cuts[mid])?;
                    if p.fits {
                        hi = mid;
                        best = p;
                    } else {
                        lo = mid + 1;
                    }
                }
                best
            }
        };
        let mut chosen = chosen;
        if let Some(placed) = chosen.placement.as_ref() {
            let (n, host_experts) = (placed.n_layers, placed.cpu_moe_layers);
            let options = placement::option_counts(n, placed.gpu_layers)
                .into_iter()
                .map(|gpu_layers| {
                    let p = plan_of(placement::Cut {
                        host_experts,
                        host_layers: n - gpu_layers,
                    })?;
                    let host = p.host.as_ref();
                    Ok(placement::PlacementOption {
                        gpu_layers,
                        device_total_bytes: p.total_bytes,
                        host_total_bytes: host.map_or(0, |h| h.total_bytes),
                        fits: p.fits,
                        host_fits: host.is_none_or(|h| h.fits),
                        max_context_that_fits: p.max_context_that_fits,
                    })
                })
                .collect::<Result<Vec<_>, PlanError>>()?;
            if let Some(placed) = chosen.placement.as_mut() {
                placed.options = options;
            }
        }
        Ok(chosen)
    }

    /// A placed device plan's host side: the host-placed tensors stay
    /// mapped, their 1-D tensors converted, the host layers' KV and the
    /// CPU's arena for them (kept in `placed` for the run).
    fn add_host_side(
        &mut self,
        whole: &ModelSpec,
        host_spec: &ModelSpec,
        placed: &mut placement::Placement,
    ) {
        let Some(host) = self.host.take() else {
            return;
        };
        let inputs = &self.inputs;
        let mut host = host;
        if placed.host_weights_bytes > 0 {
            if let Some(t) = host.terms.iter_mut().find(|t| t.name == "weights_staging") {
                t.bytes = whole.weights_bytes();
                t.derivation = format!(
                    "the checkpoint's pages: the host's tensors ({}) stay mapped and are read in place, the device's ({}) are mapped while copied and released after loading",
                    size::format_binary(placed.host_weights_bytes),
                    size::format_binary(placed.device_weights_bytes)
                );
            }
        }
        let mut extra = Vec::new();
        let host_layers = placed
            .layers
            .iter()
            .filter(|l| l.place == placement::Place::Cpu)
            .count();
        let host_kv = kv::plan(host_spec, inputs.context, inputs.batch, inputs.kv_dtype);
        if host_kv.bytes > 0 {
            extra.push(Term {
                name: "host_kv",
                bytes: host_kv.bytes,
                derivation: format!(
                    "the {host_layers} host layers' KV: {}",
                    host_kv.derivation(inputs.kv_dtype, inputs.batch)
                ),
            });
        }
        // The host's linear-attention layers keep their state beside their
        // KV; the device plan's `recurrent_state` counts the device's.
        if let Some(r) = recurrent::plan(host_spec, inputs.batch) {
            extra.push(Term {
                name: "host_recurrent_state",
                bytes: r.bytes,
                derivation: format!("the host layers' state: {}", r.derivation(host_spec)),
            });
        }
        let host_layers_rope = if host_layers > 0 {
            whole
                .tensors
                .iter()
                .find(|t| t.name.starts_with("rope_freqs"))
                .map_or(0, |t| t.params.saturating_mul(4))
        } else {
            0
        };
        let converted = converted_vector_bytes(host_spec).saturating_add(host_layers_rope);
        if converted > 0 {
            extra.push(Term {
                name: "host_converted",
                bytes: converted,
                derivation: format!(
                    "the host's 1-D tensors (norms, biases) as f32{}",
                    if host_layers_rope > 0 {
                        ", and a copy of the rope factors for the host layers"
                    } else {
                        ""
                    }
                ),
            });
        }
        if placed.host_weights_bytes > 0 {
            let cpu = activations::plan(
                whole,
                inputs.context,
                inputs.batch,
                inputs.max_tokens_per_step,
                inputs.threads,
            );
            extra.push(Term {
                name: "host_activations",
                bytes: cpu.bytes,
                derivation: format!(
                    "the CPU backend's arena for the host's tensors (a whole step's buffers, the crossing included): {}",
                    cpu.derivation(inputs.batch, whole.vocab, inputs.threads)
                ),
            });
            placed.host_arena = cpu.buffers;
            extra.push(Term {
                name: "cuda_split_run",
                bytes: cuda::SPLIT_RUN_HOST_BYTES,
                derivation: format!(
                    "the CUDA libraries' growth as the device runs its first steps, beside the host's pages that stay mapped ({}, measured on an H100 host)",
                    size::format_binary(cuda::SPLIT_RUN_HOST_BYTES)
                ),
            });
        }
        self.host = Some(host.with_terms(extra, inputs));
    }

    /// The plan of one device; under tensor parallelism `shard` is what
    /// each device holds of `spec`.
    fn build(
        spec: &ModelSpec,
        inputs: PlanInputs,
        shard: Option<&tensor_parallel::Shard>,
    ) -> Result<Self, PlanError> {
        inputs.validate()?;
        if !(inputs.headroom_factor.is_finite() && inputs.headroom_factor > 0.0) {
            return Err(PlanError::InvalidInput {
                what: env::HEADROOM_FACTOR_VAR.into(),
                value: inputs.headroom_factor.to_string(),
                expected: "expected a finite number above 0".into(),
            });
        }
        let whole = spec;
        let (spec, (nccl, nccl_derivation)) = match shard {
            Some(shard) => (&shard.spec, tensor_parallel::nccl(shard.size)),
            None => (whole, (0, String::new())),
        };
        let s = size_terms(spec, &inputs, inputs.context, nccl);
        let available = inputs.available.bytes;
        let weights_bytes = spec.weights_bytes();
        let fits = s.total <= available;

        let mut terms = vec![
            Term {
                name: "weights",
                bytes: weights_bytes,
                derivation: match shard {
                    Some(shard) => shard.derivation(&weights_derivation(whole)),
                    None => weights_derivation(spec),
                },
            },
            Term {
                name: "kv",
                bytes: s.kv.bytes,
                derivation: s.kv.derivation(inputs.kv_dtype, inputs.batch),
            },
            Term {
                name: "activations",
                bytes: s.activation_bytes,
                derivation: s
                    .activations
                    .derivation(inputs.batch, spec.vocab, inputs.threads),
            },
            Term {
                name: "runtime",
                bytes: s.runtime.0,
                derivation: s.runtime.1.clone(),
            },
            Term {
                name: "backend",
                bytes: s.backend.fixed_bytes,
                derivation: s.backend.fixed_derivation.clone(),
            },
        ];
        if let Some(r) = &s.recurrent {
            terms.insert(
                2,
                Term {
                    name: "recurrent_state",
                    bytes: r.bytes,
                    derivation: r.derivation(spec),
                },
            );
        }
        if s.converted > 0 {
            terms.insert(
                1,
                Term {
                    name: "converted",
                    bytes: s.converted,
                    derivation: if spec.linear.is_some() {
                        "1-D tensors (norms, biases, decay parameters) and convolution taps copied to f32 at load".into()
                    } else {
                        "1-D tensors (norms, biases) copied to f32 at load".into()
                    },
                },
            );
        }
        if nccl > 0 {
            terms.push(Term {
                name: "nccl",
                bytes: nccl,
                derivation: nccl_derivation,
            });
        }
        if s.backend.inflight_bytes > 0 {
            terms.push(Term {
                name: "backend_inflight",
                bytes: s.backend.inflight_bytes,
                derivation: s.backend.inflight_derivation.clone(),
            });
        }
        if s.headroom_bytes != 0 {
            terms.push(Term {
                name: "headroom",
                bytes: s.headroom_bytes.unsigned_abs(),
                derivation: format!(
                    "{}(weights + kv) x ({} - 1)",
                    if s.headroom_bytes < 0 { "minus " } else { "" },
                    inputs.headroom_factor
                ),
            });
        }
        let max_context_that_fits = max_context_that_fits(spec, &inputs, nccl);
        let host = (inputs.device == Device::Cuda).then(|| {
            let host = device::host_plan(whole, &inputs, &s.activations);
            match shard {
                Some(shard) => host.with_terms(tensor_parallel::host_terms(shard), &inputs),
                None => host,
            }
        });
        let tensor_parallel = shard.map(|shard| tensor_parallel::TensorParallel {
            size: shard.size,
            heads_per_device: spec.n_heads,
            kv_heads_per_device: spec.n_kv_heads,
            kv_replicas: shard.kv_replicas,
            ffn_per_device: spec.ffn,
            expert_ffn_per_device: spec.expert_ffn,
            nccl_bytes: nccl,
            weights: shard.weights.clone(),
            sizes: Vec::new(),
        });
        Ok(MemoryPlan {
            host,
            tensor_parallel,
            weights_bytes,
            weights_source: spec.source.clone(),
            kv_bytes_per_token: s.kv.bytes_per_token,
            kv_bytes: s.kv.bytes,
            kv_block_tokens: s.kv.block_tokens,
            kv_detail: s.kv.groups,
            recurrent_bytes: s.recurrent.as_ref().map_or(0, |r| r.bytes),
            recurrent_detail: s.recurrent,
            activation_bytes: s.activation_bytes,
            activation_detail: s.activations.buffers,
            runtime_overhead_bytes: s.runtime.0,
            converted_bytes: s.converted,
            backend_bytes: s.backend.fixed_bytes,
            backend_inflight_bytes: s.backend.inflight_bytes,
            headroom_bytes: s.headroom_bytes,
            headroom_factor: inputs.headroom_factor,
            available_bytes: available,
            available_source: inputs.available.source.clone(),
            total_bytes: s.total,
            fits,
            slack_bytes: available.saturating_sub(s.total),
            overflow_bytes: s.total.saturating_sub(available),
            max_context_that_fits,
            terms,
            inputs,
            device_layout: s.layout,
            placement: None,
        })
    }
}

fn is_zero(bytes: &u64) -> bool {
    *bytes == 0
}

/// The engine reads matrices in place but copies every 1-D tensor, a
/// linear-attention layer's convolution taps (GGUF `ssm_conv1d`, HF
/// `linear_attn.conv1d`: a few values per channel) and gpt-oss's merged
/// expert biases (`ffn_*_exps.bias`, a row an expert) to f32; a shared
/// expert's gate is 1-D in a GGUF (`[1, hidden]` in an HF file) but read
/// in place as a matrix of one row.
fn converted_vector_bytes(spec: &ModelSpec) -> u64 {
    spec.tensors
        .iter()
        .filter(|t| {
            (t.shape.len() == 1 && !t.name.ends_with("ffn_gate_inp_shexp.weight"))
                || t.name.ends_with("ssm_conv1d.weight")
                || t.name.ends_with("linear_attn.conv1d.weight")
                || t.name.ends_with("_exps.bias")
        })
        .fold(0u64, |sum, t| {
            sum.saturating_add(t.params.saturating_mul(4))
        })
}

/// `Q4_1 x 211, F32 x 61` from the GGUF v3 header.
fn weights_derivation(spec: &ModelSpec) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for t in &spec.tensors {
        match counts.iter_mut().find(|(d, _)| *d == t.dtype) {
            Some((_, n)) => *n += 1,
            None => counts.push((&t.dtype, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let listed: Vec<String> = counts.iter().map(|(d, n)| format!("{d} x {n}")).collect();
    format!(
        "{}: {} (as stored, read in place)",
        spec.source,
        listed.join(", ")
    )
}

/// The largest context per sequence whose plan fits, by bisection: every
/// term grows with the context, so fitting is monotone.
fn max_context_that_fits(spec: &ModelSpec, inputs: &PlanInputs, nccl: u64) -> u64 {
    let fits = |ctx: u64| size_terms(spec, inputs, ctx, nccl).total <= inputs.available.bytes;
    let cap = if spec.context_length > 0 {
        spec.context_length
    } else {
        u64::from(u32::MAX)
    };
    if !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}
