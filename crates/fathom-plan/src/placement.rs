//! Which tensors sit on the GPU and which on the host, for a model larger
//! than the device budget.
//!
//! The rule, from the headers and the budgets alone (deterministic):
//! - A MoE model first moves expert tensors to the host, layer by layer
//!   from the input end, keeping attention, norms, the router and shared
//!   experts on the GPU: experts are most of the bytes and each token reads
//!   only `k` of them, so the host's bandwidth costs least there.
//! - Then (a dense model at once) whole layers go to the host from the
//!   input end, with their KV: the host runs layers `0 .. L − N` and the GPU
//!   the last `N` and the output head, so a step's activations cross once,
//!   host to GPU, and the large output product stays on the GPU.
//! - With any layer on the host the token embeddings go there too (a row
//!   lookup, cheap on the CPU), unless the output head is the same tensor.
//!
//! The first placement along that order whose device plan fits is the
//! `auto` choice; `--gpu-layers N`, `--n-cpu-moe N` / `--cpu-moe` and
//! `--override-tensor REGEX=cpu|cuda` fix it by hand. A device's plan is the
//! ordinary plan of a *device spec* (the model with the host's tensors
//! removed and the host layers' attention holding no device KV), as a
//! tensor-parallel device's is of its sharded spec.

use fathom_spec::ModelSpec;
use regex::Regex;

use crate::activations::ArenaBuffer;
use crate::cuda::WEIGHT_ALIGN;
use serde::Serialize;

use crate::tensor_parallel::{classify, Role};
use crate::PlanError;

/// Where a tensor (or a layer's KV) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    Cuda,
    Cpu,
}

impl Place {
    pub fn name(self) -> &'static str {
        match self {
            Place::Cuda => "cuda",
            Place::Cpu => "cpu",
        }
    }
}

/// `--gpu-layers`: how many whole layers the GPU holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuLayers {
    /// The most that fit (everything when the model fits).
    #[default]
    Auto,
    /// Every layer; the plan does not fit when the model does not.
    All,
    /// The last `N` layers (more than the model has means all).
    Count(u64),
}

impl GpuLayers {
    pub fn parse(text: &str) -> Result<GpuLayers, PlanError> {
        let t = text.trim();
        match t.to_ascii_lowercase().as_str() {
            "auto" => Ok(GpuLayers::Auto),
            "all" => Ok(GpuLayers::All),
            _ => t
                .parse::<u64>()
                .map(GpuLayers::Count)
                .map_err(|_| PlanError::InvalidInput {
                    what: "--gpu-layers".into(),
                    value: text.into(),
                    expected: "expected auto, all, or a layer count such as 20".into(),
                }),
        }
    }
}

/// One `--override-tensor` rule: tensors whose name the pattern finds go to
/// `place`.
#[derive(Debug, Clone)]
pub struct TensorOverride {
    pub pattern: String,
    regex: Regex,
    pub place: Place,
}

impl TensorOverride {
    /// `REGEX=cpu|cuda` (llama.cpp's spelling: `CPU`, `CUDA0` read too);
    /// several rules may be joined by commas.
    pub fn parse(text: &str) -> Result<Vec<TensorOverride>, PlanError> {
        let invalid = |expected: String| PlanError::InvalidInput {
            what: "--override-tensor".into(),
            value: text.into(),
            expected,
        };
        text.split(',')
            .filter(|rule| !rule.trim().is_empty())
            .map(|rule| {
                let (pattern, place) = rule.rsplit_once('=').ok_or_else(|| {
                    invalid(format!(
                        "expected REGEX=cpu or REGEX=cuda (e.g. exps=cpu); {rule:?} has no '='"
                    ))
                })?;
                let place = match place.trim().to_ascii_lowercase().as_str() {
                    "cpu" => Place::Cpu,
                    "cuda" | "cuda0" | "gpu" => Place::Cuda,
                    other => {
                        return Err(invalid(format!(
                            "the place {other:?} is not cpu or cuda (in {rule:?})"
                        )))
                    }
                };
                let regex = Regex::new(pattern).map_err(|e| {
                    invalid(format!("{pattern:?} is not a regular expression: {e}"))
                })?;
                Ok(TensorOverride {
                    pattern: pattern.to_string(),
                    regex,
                    place,
                })
            })
            .collect()
    }
}

/// What the user asked of the placement (the flags).
#[derive(Debug, Clone, Default)]
pub struct PlacementRequest {
    pub gpu_layers: GpuLayers,
    /// Layers, from the input end, whose expert tensors stay on the host
    /// (`--n-cpu-moe N`; `--cpu-moe` is every layer).
    pub cpu_moe_layers: u64,
    pub overrides: Vec<TensorOverride>,
}

impl PlacementRequest {
    /// Whether the flags leave the choice to the plan with nothing forced
    /// onto the host.
    pub fn is_default(&self) -> bool {
        self.gpu_layers == GpuLayers::Auto && self.cpu_moe_layers == 0 && self.overrides.is_empty()
    }
}

/// One layer's place: attention, norms, router, dense FFN and shared
/// experts go together; routed experts may sit apart.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerPlace {
    pub layer: u64,
    /// Where the layer runs (its attention and KV, or a linear-attention
    /// layer's recurrent state).
    pub place: Place,
    /// Where its routed expert tensors sit (MoE only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<Place>,
    pub device_bytes: u64,
    pub host_bytes: u64,
}

/// Which tensors the plan puts on the GPU and which on the host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    /// Whole layers on the GPU (the last ones).
    pub gpu_layers: u64,
    pub n_layers: u64,
    /// Layers whose routed experts are on the host.
    pub cpu_moe_layers: u64,
    /// `auto`, `all`, or the flags that fixed it.
    pub chosen_by: String,
    pub embeddings: Place,
    pub output: Place,
    pub layers: Vec<LayerPlace>,
    pub device_weights_bytes: u64,
    pub host_weights_bytes: u64,
    /// `--override-tensor` patterns and how many tensors each moved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<(String, Place, u64)>,
    /// The same placement with other GPU layer counts (all, this one, ¾,
    /// ½, ¼ of the layers, none), for choosing by hand.
    pub options: Vec<PlacementOption>,
    /// Tensors an `--override-tensor` rule put apart from the rest of their
    /// group (a layer's attention, norms and dense FFN; its routed experts;
    /// the output head with its norm): the plan counts them, but a run
    /// executes each group on one side and refuses such a placement.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub apart: Vec<String>,
    /// The CPU backend's arena for the host's part of a step (its bytes
    /// are the host plan's `host_activations`); empty when nothing runs on
    /// the host.
    #[serde(skip)]
    pub host_arena: Vec<ArenaBuffer>,
}

/// One row of the placement's table of GPU layer counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlacementOption {
    pub gpu_layers: u64,
    pub device_total_bytes: u64,
    pub host_total_bytes: u64,
    /// Whether the device budget holds it.
    pub fits: bool,
    /// Whether the host budget holds it (true when unchecked).
    pub host_fits: bool,
    /// The largest context per sequence the device holds at this
    /// placement (the host's KV grows with it too: see `host_fits`).
    pub max_context_that_fits: u64,
}

/// The GPU layer counts the table lists: all, `chosen`, ¾, ½, ¼, none.
pub(crate) fn option_counts(n_layers: u64, chosen: u64) -> Vec<u64> {
    let mut counts = vec![
        n_layers,
        chosen,
        n_layers * 3 / 4,
        n_layers / 2,
        n_layers / 4,
        0,
    ];
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts.dedup();
    counts
}

impl Placement {
    /// Whether anything runs on the host.
    pub fn is_split(&self) -> bool {
        self.host_weights_bytes > 0 || self.layers.iter().any(|l| l.place == Place::Cpu)
    }

    /// `spec` as one side sees it: the other side's layers hold no KV
    /// here, their groups still numbered as in the whole model (the
    /// tensors stay listed; the side's plan counts its own).
    pub fn side_spec(&self, spec: &ModelSpec, side: Place) -> ModelSpec {
        let mut s = spec.clone();
        for (layer, placed) in s.layers.iter_mut().zip(&self.layers) {
            layer.kv_elsewhere = placed.place != side;
        }
        s
    }
}

/// Whether `t` is the tensor whose place is its layer's (where its
/// attention runs, and with it the layer's KV or recurrent state): the q
/// projection, or a linear-attention layer's q/k/v projection, which has no
/// q of its own (Qwen3.5's `attn_qkv`).
fn places_layer(t: &fathom_spec::TensorEntry, role: Role) -> bool {
    role == Role::Query || t.name.ends_with(".attn_qkv.weight")
}

/// Whether `t` is a routed expert tensor, which may sit apart from its
/// layer: the experts' matrices, and gpt-oss's per-expert biases (loaded
/// with the experts; the down projection's, added after a tensor-parallel
/// all-reduce, is classified with the norms).
fn is_expert(t: &fathom_spec::TensorEntry, role: Role) -> bool {
    matches!(role, Role::ExpertsIn | Role::ExpertsDown) || t.name.ends_with("_exps.bias")
}

/// Whether `spec` runs routed experts, each of its MoE layers (those whose
/// router it holds) with its own experts: a MoE model, or the device side
/// of a placement that moved whole layers but no layer's experts apart.
pub(crate) fn runs_all_its_experts(spec: &ModelSpec) -> bool {
    let layers_with = |role: Role| -> std::collections::BTreeSet<usize> {
        spec.tensors
            .iter()
            .map(classify)
            .filter(|c| c.role == role)
            .filter_map(|c| c.layer)
            .collect()
    };
    let routed = layers_with(Role::ExpertsIn);
    !routed.is_empty() && layers_with(Role::Router).is_subset(&routed)
}

/// One point along the placement order: routed experts of layers
/// `0 .. host_experts` and whole layers `0 .. host_layers` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub host_experts: u64,
    pub host_layers: u64,
}

/// The placement order for `auto`, from nothing on the host to everything:
/// experts first (MoE), then whole layers; `min_experts` is `--n-cpu-moe`.
pub(crate) fn auto_cuts(spec: &ModelSpec, min_experts: u64) -> Vec<Cut> {
    let n = spec.layers.len() as u64;
    let moe = spec.n_experts > 0;
    let start = min_experts.min(n);
    let mut cuts: Vec<Cut> = if moe {
        (start..=n)
            .map(|k| Cut {
                host_experts: k,
                host_layers: 0,
            })
            .collect()
    } else {
        vec![Cut {
            host_experts: 0,
            host_layers: 0,
        }]
    };
    let experts_after = if moe { n } else { 0 };
    cuts.extend((1..=n).map(|l| Cut {
        host_experts: experts_after.max(start),
        host_layers: l,
    }));
    cuts
}

/// The cut the flags fix, when they fix one (`--gpu-layers N` or `all`).
pub(crate) fn fixed_cut(spec: &ModelSpec, request: &PlacementRequest) -> Option<Cut> {
    let n = spec.layers.len() as u64;
    let host_experts = request.cpu_moe_layers.min(n);
    match request.gpu_layers {
        GpuLayers::Auto => None,
        GpuLayers::All => Some(Cut {
            host_experts,
            host_layers: 0,
        }),
        GpuLayers::Count(g) => Some(Cut {
            host_experts,
            host_layers: n.saturating_sub(g),
        }),
    }
}

/// The placement of `cut` with `overrides` applied, and the device and
/// host specs it makes: the device spec holds the GPU's tensors and KV,
/// the host spec the host's KV (its tensors are the rest).
pub(crate) fn place(
    spec: &ModelSpec,
    cut: Cut,
    overrides: &[TensorOverride],
    chosen_by: String,
) -> (Placement, ModelSpec, ModelSpec) {
    let n = spec.layers.len() as u64;
    let layer_place = |i: u64| {
        if i < cut.host_layers {
            Place::Cpu
        } else {
            Place::Cuda
        }
    };
    let expert_place = |i: u64| {
        if i < cut.host_experts.max(cut.host_layers) {
            Place::Cpu
        } else {
            Place::Cuda
        }
    };
    // A tied output head is the embedding table: it stays with the head.
    let tied = !spec
        .tensors
        .iter()
        .any(|t| classify(t).role == Role::OutputHead);
    let mut embeddings = if cut.host_layers > 0 && !tied {
        Place::Cpu
    } else {
        Place::Cuda
    };
    let mut output = Place::Cuda;
    let mut overrides_used: Vec<(String, Place, u64)> = overrides
        .iter()
        .map(|o| (o.pattern.clone(), o.place, 0))
        .collect();
    let mut layers: Vec<LayerPlace> = (0..n)
        .map(|i| LayerPlace {
            layer: i,
            place: layer_place(i),
            experts: (spec.n_experts > 0).then(|| expert_place(i)),
            device_bytes: 0,
            host_bytes: 0,
        })
        .collect();
    let (mut device_tensors, mut host_tensors) = (Vec::new(), Vec::new());
    let mut placed_at = Vec::with_capacity(spec.tensors.len());
    for t in &spec.tensors {
        let c = classify(t);
        let mut at = match (c.role, c.layer) {
            (role, Some(i)) if is_expert(t, role) => expert_place(i as u64),
            (_, Some(i)) => layer_place(i as u64),
            (Role::Embedding, None) => embeddings,
            _ => Place::Cuda,
        };
        // The last rule that matches wins, as later flags override earlier.
        if let Some((k, o)) = overrides
            .iter()
            .enumerate()
            .rev()
            .find(|(_, o)| o.regex.is_match(&t.name))
        {
            at = o.place;
            overrides_used[k].2 += 1;
        }
        match (c.role, c.layer.and_then(|i| layers.get_mut(i))) {
            (_, Some(l)) => {
                // KV (a linear layer's recurrent state) sits where the
                // layer's attention runs: with its q (its q/k/v).
                match c.role {
                    _ if places_layer(t, c.role) => l.place = at,
                    _ if is_expert(t, c.role) => l.experts = Some(at),
                    _ => {}
                }
                match at {
                    Place::Cuda => l.device_bytes = l.device_bytes.saturating_add(t.bytes),
                    Place::Cpu => l.host_bytes = l.host_bytes.saturating_add(t.bytes),
                }
            }
            (Role::Embedding, None) => embeddings = at,
            (Role::OutputHead, None) => output = at,
            _ => {}
        }
        placed_at.push(at);
        match at {
            Place::Cuda => device_tensors.push(t.clone()),
            Place::Cpu => host_tensors.push(t.clone()),
        }
    }
    if tied {
        output = embeddings;
    }
    // What each tensor's group runs on, once every group's place is known.
    let apart = spec
        .tensors
        .iter()
        .zip(&placed_at)
        .filter(|(t, &at)| {
            let c = classify(t);
            let group = match (c.role, c.layer.and_then(|i| layers.get(i))) {
                (role, Some(l)) if is_expert(t, role) => l.experts.unwrap_or(l.place),
                (_, Some(l)) => l.place,
                (Role::Embedding, None) => embeddings,
                (Role::OutputHead | Role::Norm, None) => output,
                // Rope factors: every side that runs layers takes a copy.
                _ => at,
            };
            group != at
        })
        .map(|(t, _)| t.name.clone())
        .collect();
    let bytes =
        |ts: &[fathom_spec::TensorEntry]| ts.iter().fold(0u64, |s, t| s.saturating_add(t.bytes));
    let (device_weights_bytes, host_weights_bytes) = (bytes(&device_tensors), bytes(&host_tensors));
    let placement = Placement {
        gpu_layers: layers.iter().filter(|l| l.place == Place::Cuda).count() as u64,
        n_layers: n,
        cpu_moe_layers: layers
            .iter()
            .filter(|l| l.experts == Some(Place::Cpu))
            .count() as u64,
        chosen_by,
        embeddings,
        output,
        layers,
        device_weights_bytes,
        host_weights_bytes,
        overrides: overrides_used,
        options: Vec::new(),
        apart,
        host_arena: Vec::new(),
    };
    let (mut device_spec, mut host_spec) = (
        placement.side_spec(spec, Place::Cuda),
        placement.side_spec(spec, Place::Cpu),
    );
    device_spec.streamed_weights = streamed_room(&host_tensors, spec.n_experts);
    device_spec.tensors = device_tensors;
    host_spec.tensors = host_tensors;
    (placement, device_spec, host_spec)
}

/// Bytes of the device's room for what a large step copies from the host
/// at once ([`crate::cuda::DeviceLayout::streamed`]): the largest layer
/// matrix among `host_tensors` (an MLX matrix with its scales and biases),
/// or the largest layer's routed experts together (every expert's gate, up
/// and down), each piece at a `WEIGHT_ALIGN` boundary. Experts with biases
/// (gpt-oss) stay on the host, as do 1-D tensors and tensors outside a
/// layer.
fn streamed_room(host_tensors: &[fathom_spec::TensorEntry], n_experts: u64) -> u64 {
    let aligned = |bytes: u64| bytes.div_ceil(WEIGHT_ALIGN).saturating_mul(WEIGHT_ALIGN);
    let mut matrices: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut experts: std::collections::BTreeMap<usize, (u64, bool)> = Default::default();
    for t in host_tensors {
        let c = classify(t);
        let Some(layer) = c.layer else { continue };
        if is_expert(t, c.role) {
            let (bytes, biased) = experts.entry(layer).or_default();
            if t.shape.len() < 3 {
                *biased = true;
            } else {
                let each = aligned(t.bytes / n_experts.max(1));
                *bytes = bytes.saturating_add(each.saturating_mul(n_experts));
            }
            continue;
        }
        if t.shape.len() < 2 {
            continue;
        }
        let stem = [".weight", ".scales", ".biases"]
            .iter()
            .find_map(|s| t.name.strip_suffix(s))
            .unwrap_or(&t.name);
        let sum = matrices.entry(stem).or_default();
        *sum = sum.saturating_add(aligned(t.bytes));
    }
    let largest_experts = experts
        .into_values()
        .filter(|&(_, biased)| !biased)
        .map(|(bytes, _)| bytes);
    matrices
        .into_values()
        .chain(largest_experts)
        .max()
        .unwrap_or(0)
}
