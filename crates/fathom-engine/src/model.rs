//! The forward pass, written once against the backend for the llama,
//! qwen2, qwen3, qwen3_moe, gemma3, gemma4, qwen35, qwen35_moe and gpt_oss
//! families. They differ only in optional pieces (biases, q/k and value
//! norms, post norms, GeGLU, routed and shared experts, sliding windows,
//! attention sinks, gated attention, linear-attention layers), which the
//! spec's `BlockStyle` and the tensors present decide.
//!
//! Under tensor parallelism (a backend over several devices) the same
//! pass runs on each device's share of the heads and FFN columns: the
//! layer shapes here are one device's, the weights go to the backend with
//! their split, and the outputs of the row-split projections (attention
//! output, FFN down) are summed over the devices before the residual add.

use fathom_backend::{
    AttentionIo, AttentionShape, Backend, Buf, Features, Glu, HostMatrix, LinearIo, LinearShape,
    LinearWeights, MatrixId, RopeParams, RoutedFfn, Split, Step, StepSeq, ValueOrder, VectorId,
};
use fathom_checkpoint::Checkpoint;
use fathom_plan::placement::{Place, Placement};
use fathom_plan::tensor_parallel::{Role, Split as PlanSplit};
use fathom_spec::{Activation, Attention, ModelSpec};

use crate::kv::SeqKv;
use crate::names::{LayerNames, Naming};
use crate::weights::WeightFiles;
use crate::EngineError;

/// Tokens to run at the next positions of one sequence.
pub struct Segment<'a> {
    pub seq: &'a mut SeqKv,
    pub tokens: &'a [u32],
}

/// Largest head dimension the per-head norms handle.
const MAX_HEAD_DIM: usize = 1024;

enum Ffn {
    Dense {
        gate: MatrixId,
        up: MatrixId,
        down: MatrixId,
    },
    Moe {
        router: MatrixId,
        experts: Vec<[MatrixId; 3]>,
        shared: Option<SharedExpert>,
        /// gpt-oss: the router's bias and each expert's gate, up and down
        /// biases.
        biases: Option<MoeBiases>,
    },
}

/// A gpt-oss MoE layer's biases.
struct MoeBiases {
    router: VectorId,
    experts: Vec<[VectorId; 3]>,
}

/// Qwen3.5 MoE's shared expert: a gated FFN every row goes through, its
/// output weighted by sigmoid(gate · x) and added to the routed experts'.
struct SharedExpert {
    ffn: [MatrixId; 3],
    /// One row: the gate's weights.
    gate: MatrixId,
}

/// A layer's attention over the cache.
struct Attend {
    shape: AttentionShape,
    rope: RopeParams,
    wq: MatrixId,
    wk: MatrixId,
    wv: MatrixId,
    wo: MatrixId,
    bias: Option<[VectorId; 3]>,
    qk_norm: Option<[VectorId; 2]>,
    /// The q projection carries a sigmoid output gate per head (Qwen3.5).
    gated: bool,
    /// The output projection's bias (gpt-oss).
    o_bias: Option<VectorId>,
    /// Each value head is RMS-normed without a weight (Gemma 4).
    value_norm: bool,
}

/// A hybrid model's linear-attention layer (Qwen3.5's gated delta rule).
struct Linear {
    /// Which of its side's linear layers (all the model's unless a
    /// placement splits it): its state's place in a slot there.
    index: usize,
    shape: LinearShape,
    weights: LinearWeights,
    /// Projections of the layer input: q/k/v, the output gate, the decay
    /// and update-rate inputs.
    wqkv: MatrixId,
    wgate: MatrixId,
    walpha: MatrixId,
    wbeta: MatrixId,
    /// The per-head norm of the recurrence's output.
    norm: VectorId,
    wout: MatrixId,
}

/// How a layer mixes positions.
enum Mixer {
    Attention(Attend),
    Linear(Linear),
}

struct Layer {
    /// Where the layer runs (its attention, norms and dense FFN) and where
    /// its routed experts do, under a placement between GPU and host.
    place: Place,
    experts_place: Place,
    attn_norm: VectorId,
    mixer: Mixer,
    post_attn_norm: Option<VectorId>,
    ffn_norm: VectorId,
    post_ffn_norm: Option<VectorId>,
    ffn: Ffn,
    /// Multiplies the residual after the layer (Gemma 4's layer scalar).
    out_scale: Option<f32>,
}

/// A loaded model: its spec and the backend's handles of its weights.
pub struct Model {
    pub spec: ModelSpec,
    /// Every matrix in host memory, for faulting them in (`prefault`);
    /// empty when the backend copied them (the mapped files are let go).
    matrices: Vec<HostMatrix>,
    embed: MatrixId,
    output: MatrixId,
    out_norm: VectorId,
    /// Where the embedding lookup and the output head run. Without a
    /// placement every place is `Cuda` and [`Backend::switch_to`] is a
    /// no-op on the one device.
    embed_place: Place,
    output_place: Place,
    layers: Vec<Layer>,
    eps: f32,
    embed_scale: f32,
    glu: Glu,
    /// FFN columns (each expert's in a MoE) one device computes.
    ffn_width: usize,
    /// Logits become `cap × tanh(logits / cap)` (Gemma 4).
    softcap: Option<f32>,
    /// Bytes of 1-D tensors converted to f32 at load.
    pub converted_bytes: usize,
}

/// What loading hands each weight to: the backend, the files, and the
/// running count of converted bytes.
struct Loader<'a> {
    backend: &'a mut dyn Backend,
    files: &'a WeightFiles,
    /// Norms stored as `w` for a model that multiplies by `1 + w`.
    norm_adds_one: bool,
    converted: usize,
    matrices: Vec<HostMatrix>,
    /// Devices the backend spreads the model over.
    devices: usize,
    /// The side the next weights load on.
    place: Place,
    /// Linear-attention layers loaded so far on each side (indexed by
    /// `Place`): a side holds the recurrent states of its own layers only,
    /// numbered among them.
    linear_layers: [usize; 2],
}

/// Where a placement puts the model's weight groups.
struct Places<'p>(Option<&'p Placement>);

impl Places<'_> {
    fn layer(&self, i: usize) -> Place {
        self.0.map_or(Place::Cuda, |p| p.layers[i].place)
    }

    fn experts(&self, i: usize) -> Place {
        self.0.map_or(Place::Cuda, |p| {
            p.layers[i].experts.unwrap_or(p.layers[i].place)
        })
    }

    fn embeddings(&self) -> Place {
        self.0.map_or(Place::Cuda, |p| p.embeddings)
    }

    fn output(&self) -> Place {
        self.0.map_or(Place::Cuda, |p| p.output)
    }
}

impl Loader<'_> {
    /// The next weights load on `place`.
    fn at(&mut self, place: Place) {
        self.place = place;
        self.backend.switch_to(place, &[], 0);
    }

    fn matrix(&mut self, m: HostMatrix, split: Split) -> Result<MatrixId, EngineError> {
        if self.backend.reads_host_weights() {
            self.matrices.push(m.clone());
        }
        Ok(self.backend.load_split_matrix(m, split)?)
    }

    /// The matrix `name` (`rows × cols` in the file), split as `split`.
    fn named_matrix(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        split: Split,
    ) -> Result<MatrixId, EngineError> {
        let m = self.files.matrix(name, rows, cols)?;
        self.matrix(m, split)
    }

    /// The 1-D tensor `name`, converted to f32; norms get `1 + w` when
    /// the file stores `w`.
    fn vector(&mut self, name: &str, len: usize, norm: bool) -> Result<VectorId, EngineError> {
        self.split_vector(name, len, norm, Split::Whole)
    }

    fn split_vector(
        &mut self,
        name: &str,
        len: usize,
        norm: bool,
        split: Split,
    ) -> Result<VectorId, EngineError> {
        let mut v = self.files.vector(name, len)?;
        if norm && self.norm_adds_one {
            v.iter_mut().for_each(|x| *x += 1.0);
        }
        self.converted += len * 4;
        Ok(self.backend.load_split_vector(&v, split)?)
    }

    /// How a tensor of `role` is divided over the devices: the plan's rule
    /// (`kv_heads` matters to k and v only), so what each device loads is
    /// what its plan counted.
    fn split(&self, role: Role, kv_heads: usize) -> Split {
        match role.split() {
            PlanSplit::Replicated => Split::Whole,
            PlanSplit::Row => Split::Inputs,
            PlanSplit::Column => Split::Outputs {
                parts: role.parts(self.devices as u64, kv_heads as u64) as usize,
            },
        }
    }

    /// A one-value tensor (a layer's output scale), read as f32.
    fn scalar(&mut self, name: &str) -> Result<f32, EngineError> {
        let v = self.files.vector(name, 1)?;
        self.converted += 4;
        Ok(v[0])
    }

    fn optional_vector(
        &mut self,
        name: &str,
        len: usize,
        norm: bool,
    ) -> Result<Option<VectorId>, EngineError> {
        if self.files.has(name) {
            self.vector(name, len, norm).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Whether the engine runs `spec`, a family it knows, on a backend of
/// `features` (`backend`: its device's name and how many devices it
/// spreads the model over, for the refusal), split between the GPU and
/// the host as `placement` says when given: the device's refusals that
/// [`Model::load`] makes before it reads a weight, each naming the family
/// and what stands in the way. `inspect` asks the same of the device's
/// [`Features::of`], so that it never plans (and places) a model the load
/// would refuse there.
///
/// A split runs every family both of its sides run: the placement keeps
/// each layer's attention, norms and dense FFN on one side, its routed
/// experts on one side, and a linear-attention layer's recurrent state
/// with the layer. Only an `--override-tensor` that tears such a group
/// apart is refused.
pub fn check_runs(
    spec: &ModelSpec,
    features: Features,
    (backend, devices): (&str, usize),
    placement: Option<&Placement>,
) -> Result<(), EngineError> {
    if let Some(p) = placement.filter(|p| !p.apart.is_empty()) {
        return Err(EngineError::Placement(format!(
            "--override-tensor put {} apart from the rest of its group ({}); a run \
             places a layer's attention, norms and dense FFN together, its routed \
             experts together, and the output head with its norm: widen the pattern",
            p.apart.len(),
            p.apart
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let unsupported = |what: &str| EngineError::UnsupportedOnBackend {
        family: spec.family.name().to_string(),
        backend: match devices {
            1 => backend.to_string(),
            n => format!("{n}-device tensor-parallel {backend}"),
        },
        what: what.to_string(),
    };
    let hybrid = spec.linear.is_some() || spec.rope.as_ref().is_some_and(|r| r.dims.is_some());
    if hybrid && !features.hybrid {
        return Err(unsupported(
            "linear-attention layers, gated attention and partial rope",
        ));
    }
    if spec.family == fathom_spec::Family::GptOss && !features.gpt_oss {
        return Err(unsupported(
            "attention sinks, YaRN rope, MXFP4 experts with biases and the clamped SwiGLU",
        ));
    }
    let scaled_rows = spec.block.value_norm || spec.final_logit_softcap.is_some();
    if scaled_rows && !features.scaled_rows {
        return Err(unsupported(
            "values normed without a weight, layer output scales and a logit softcap",
        ));
    }
    Ok(())
}

/// The refusals of a model the engine runs on no device: an unknown
/// family, and the variants of a known one it does not run yet (`inspect`
/// plans them all the same).
fn check_family(spec: &ModelSpec) -> Result<(), EngineError> {
    if !spec.is_known_family() || spec.layers.is_empty() {
        return Err(EngineError::UnsupportedFamily {
            architecture: spec.architecture.clone(),
        });
    }
    if spec.family == fathom_spec::Family::Gemma4 {
        gemma4_runs(spec)?;
    }
    Ok(())
}

/// Refuses the Gemma 4 variants whose extra pieces the forward pass does not
/// run: per-layer token embeddings and KV shared across layers (E2B, E4B)
/// and the mixture of experts (26B-A4B), each with its own error.
fn gemma4_runs(spec: &ModelSpec) -> Result<(), EngineError> {
    let refuse = |what: &str| EngineError::UnsupportedVariant {
        family: spec.family.name().to_string(),
        what: what.to_string(),
    };
    if spec
        .tensors
        .iter()
        .any(|t| t.name == "per_layer_token_embd.weight")
    {
        return Err(refuse("per-layer token embeddings (E2B/E4B)"));
    }
    if spec.layers.iter().any(|l| l.attention == Attention::None) {
        return Err(refuse(
            "KV shared across layers (shared_kv_layers, E2B/E4B)",
        ));
    }
    if spec.n_experts > 0 {
        return Err(refuse("a mixture of experts (26B-A4B)"));
    }
    Ok(())
}

impl Model {
    /// Reads the weights' headers and hands every weight to `backend`, on
    /// the side `placement` puts it when the plan splits the model between
    /// the GPU and the host.
    pub fn load(
        checkpoint: &Checkpoint,
        spec: ModelSpec,
        backend: &mut dyn Backend,
        placement: Option<&Placement>,
    ) -> Result<Self, EngineError> {
        check_family(&spec)?;
        // mlx-lm writes Qwen3.5 in a layout of its own (experts as
        // `switch_mlp`, its own treatment of the norms and taps), not the
        // Hugging Face one this loader reads: refused rather than guessed.
        if spec.family.is_qwen35()
            && matches!(checkpoint, Checkpoint::Hf(hf) if hf.quantization.is_some())
        {
            return Err(EngineError::UnsupportedVariant {
                family: spec.family.name().to_string(),
                what: "an MLX checkpoint (mlx-lm's own layout)".into(),
            });
        }
        let features = Features {
            hybrid: backend.runs_hybrid(),
            gpt_oss: backend.runs_gpt_oss(),
            scaled_rows: backend.runs_scaled_rows(),
        };
        check_runs(
            &spec,
            features,
            (backend.name(), backend.devices()),
            placement,
        )?;
        let places = Places(placement);
        let files = WeightFiles::open(checkpoint)?;
        let naming = match checkpoint {
            Checkpoint::Gguf(_) => Naming::Gguf,
            Checkpoint::Hf(_) => {
                let prefix = ["model.", "language_model.model.", "model.language_model."]
                    .into_iter()
                    .find(|p| files.has(&format!("{p}embed_tokens.weight")))
                    .unwrap_or("model.");
                Naming::Hf {
                    prefix: prefix.to_string(),
                }
            }
        };
        let style = spec.block;
        let (d, vocab) = (spec.hidden as usize, spec.vocab as usize);
        let devices = backend.devices();
        // One device's shapes: the plan's sharded spec, whose checks name
        // what does not split (heads, KV heads, FFN widths, block rows).
        let local = match devices {
            1 => spec.clone(),
            n => fathom_plan::tensor_parallel::shard(&spec, n as u64)?.spec,
        };
        let mut loader = Loader {
            backend,
            files: &files,
            norm_adds_one: style.norm_adds_one,
            converted: 0,
            matrices: Vec::new(),
            devices,
            place: Place::Cuda,
            linear_layers: [0; 2],
        };
        let embed_split = loader.split(Role::Embedding, 0);
        let (embed_place, output_place) = (places.embeddings(), places.output());
        loader.at(embed_place);
        let embed = loader.named_matrix(&naming.embed(), vocab, d, embed_split)?;
        loader.at(output_place);
        let output = if files.has(&naming.output()) {
            let head_split = loader.split(Role::OutputHead, 0);
            loader.named_matrix(&naming.output(), vocab, d, head_split)?
        } else {
            embed
        };
        let out_norm = loader.vector(&naming.output_norm(), d, true)?;
        let rope = spec.rope.clone().unwrap_or(fathom_spec::Rope {
            theta: 10_000.0,
            local_theta: None,
            factors_global_only: false,
            neox: false,
            dims: None,
            scaling: None,
            scaling_factor: None,
            llama3: None,
            yarn: None,
        });
        let head_dim = spec.head_dim as usize;
        // The rope factors, on each side that runs layers.
        let mut freqs = [None, None];
        for side in [Place::Cuda, Place::Cpu] {
            if !(0..spec.layers.len()).any(|i| places.layer(i) == side) {
                continue;
            }
            loader.at(side);
            freqs[side as usize] = if files.has("rope_freqs.weight") {
                Some(loader.vector("rope_freqs.weight", head_dim / 2, false)?)
            } else {
                match rope.llama3.as_ref() {
                    Some(l3) => {
                        let v = l3.freq_factors(rope.theta, head_dim);
                        Some(loader.backend.load_vector(&v)?)
                    }
                    None => None,
                }
            };
        }
        let globals = LayerGlobals {
            attn_scale: spec
                .attn_scale
                .unwrap_or(1.0 / (spec.head_dim as f64).sqrt()) as f32,
            theta: rope.theta as f32,
            local_theta: rope.local_theta.unwrap_or(rope.theta) as f32,
            neox: style.rope_neox,
            freqs,
            factors_global_only: rope.factors_global_only,
            rotated: rope.dims.map(|d| d as usize),
            yarn: rope.yarn.as_ref().map(|y| {
                let [low, high] = y.corr_dims(spec.head_dim, rope.theta);
                fathom_backend::Yarn {
                    freq_scale: (1.0 / y.factor) as f32,
                    corr: [low as f32, high as f32],
                    mscale: (y.attn_factor * (1.0 + 0.1 * y.factor.ln())) as f32,
                }
            }),
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        for (i, l) in spec.layers.iter().enumerate() {
            let n = naming.layer(&style, i);
            let shapes = (l, &local.layers[i]);
            let at = (places.layer(i), places.experts(i));
            layers.push(load_layer(
                &mut loader,
                &naming,
                &spec,
                &globals,
                (i, at),
                shapes,
                &n,
            )?);
        }
        for l in &layers {
            let Mixer::Attention(a) = &l.mixer else {
                continue;
            };
            let s = &a.shape;
            if s.key_dim > MAX_HEAD_DIM || s.value_dim > MAX_HEAD_DIM || s.n_kv_heads == 0 {
                return Err(EngineError::BadShape {
                    tensor: "attention heads".into(),
                    shape: vec![s.n_kv_heads as u64, s.key_dim as u64],
                    expected: vec![MAX_HEAD_DIM as u64],
                });
            }
        }
        let converted = loader.converted;
        loader.backend.finish_load();
        Ok(Model {
            matrices: loader.matrices,
            embed,
            output,
            out_norm,
            embed_place,
            output_place,
            layers,
            eps: spec.rms_norm_eps as f32,
            embed_scale: if style.embed_scaled {
                (d as f32).sqrt()
            } else {
                1.0
            },
            glu: match style.activation {
                Activation::Silu => Glu::Silu,
                Activation::GeluTanh => Glu::GeluTanh,
                Activation::SwigluOai => Glu::SwigluOai,
            },
            ffn_width: if spec.n_experts > 0 {
                local.expert_ffn
            } else {
                local.ffn
            } as usize,
            softcap: spec.final_logit_softcap.map(|c| c as f32),
            converted_bytes: converted,
            spec,
        })
    }

    /// Brings every weight page into memory, reporting bytes done of total.
    pub fn prefault(&self, progress: &mut dyn FnMut(u64, u64)) {
        WeightFiles::prefault(&self.matrices, progress);
    }

    /// Each layer's KV group, exactly as the plan grouped them.
    pub fn layer_groups(&self) -> Vec<Option<usize>> {
        fathom_plan::kv::layer_groups(&self.spec)
    }

    /// After [`Model::run_layers`]: advances every segment's sequence past
    /// its tokens and leaves segment i's last logits in row i of the
    /// backend's logits. `last_rows` is scratch (capacity: the step's
    /// segments).
    pub fn project_last(
        &self,
        backend: &mut dyn Backend,
        segments: &mut [Segment],
        last_rows: &mut Vec<usize>,
    ) {
        last_rows.clear();
        let mut end = 0;
        for seg in segments.iter_mut() {
            end += seg.tokens.len();
            last_rows.push(end - 1);
            seg.seq.len += seg.tokens.len();
        }
        self.project(backend, last_rows);
    }

    /// Logits of `rows` of the last step into rows `0..rows.len()` of the
    /// backend's logits (at most the plan's logits rows).
    pub fn project(&self, backend: &mut dyn Backend, rows: &[usize]) {
        let d = self.spec.hidden as usize;
        let n = rows.len();
        // A decode step's last rows are all its rows, in order: no gather
        // (on the GPU a one-block launch on the step's critical path).
        let input = if rows.iter().enumerate().all(|(i, &r)| i == r) {
            Buf::Residual
        } else {
            backend.gather_rows(Buf::Residual, rows, d, Buf::BranchOut);
            Buf::BranchOut
        };
        backend.rms_norm(input, self.out_norm, self.eps, n, d, Buf::Norm);
        backend.matmul(self.output, Buf::Norm, n, Buf::Logits);
        if let Some(cap) = self.softcap {
            backend.softcap(Buf::Logits, cap, n, self.spec.vocab as usize);
        }
    }

    /// Runs every segment's tokens at the next positions of its sequence,
    /// all rows through each op together, leaving every row's final hidden
    /// state in the residual; sequence lengths are the caller's to advance.
    /// The caller has reserved KV blocks up to `seq.len + tokens.len()` for
    /// each segment; `tokens` is scratch (capacity: the step's rows).
    pub fn run_layers(
        &self,
        backend: &mut dyn Backend,
        segments: &[Segment],
        tokens: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        let vocab = self.spec.vocab as usize;
        let d = self.spec.hidden as usize;
        tokens.clear();
        for seg in segments {
            assert!(!seg.tokens.is_empty(), "a segment without tokens");
            tokens.extend_from_slice(seg.tokens);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::BadToken { id, vocab });
        }
        let seqs: Vec<StepSeq> = segments
            .iter()
            .map(|s| StepSeq {
                start: s.seq.len,
                tokens: s.tokens.len(),
                tables: s.seq.tables(),
            })
            .collect();
        let step = Step {
            seqs: &seqs,
            rows: tokens.len(),
        };
        // Each sequence's recurrent-state slot (hybrid models).
        let states: Vec<usize> = segments.iter().map(|s| s.seq.state_slot()).collect();
        backend.switch_to(self.embed_place, &[], 0);
        backend.embed(self.embed, tokens, self.embed_scale, Buf::Residual);
        // Under a split the residual crosses where the side changes: only
        // it is live between layers.
        let residual = [(Buf::Residual, d)];
        let mut side = self.embed_place;
        // Every norm of a block input follows the residual add before it
        // (`add_branch`), but the first and the first on a new side.
        let mut normed = false;
        for (li, layer) in self.layers.iter().enumerate() {
            if layer.place != side {
                backend.switch_to(layer.place, &residual, step.rows);
                side = layer.place;
            }
            if !normed {
                backend.rms_norm(
                    Buf::Residual,
                    layer.attn_norm,
                    self.eps,
                    step.rows,
                    d,
                    Buf::Norm,
                );
            }
            match &layer.mixer {
                Mixer::Attention(a) => self.attention_block(backend, &step, li, a),
                Mixer::Linear(l) => self.linear_block(backend, &step, &states, l),
            }
            self.add_branch(
                backend,
                layer.post_attn_norm,
                step.rows,
                Some(layer.ffn_norm),
            );
            match &layer.ffn {
                Ffn::Dense { gate, up, down } => self.ffn(
                    backend,
                    [*gate, *up, *down],
                    Buf::Norm,
                    step.rows,
                    Buf::BranchOut,
                ),
                Ffn::Moe {
                    router,
                    experts,
                    shared,
                    biases,
                } => {
                    self.moe_ffn(backend, layer, *router, experts, biases, step.rows);
                    if let Some(shared) = shared {
                        self.shared_expert(backend, shared, step.rows);
                    }
                }
            }
            backend.all_reduce(Buf::BranchOut, step.rows, d);
            let next = self
                .layers
                .get(li + 1)
                .filter(|l| l.place == side && layer.out_scale.is_none())
                .map(|l| l.attn_norm);
            self.add_branch(backend, layer.post_ffn_norm, step.rows, next);
            if let Some(scale) = layer.out_scale {
                backend.scale(Buf::Residual, scale, step.rows, d);
            }
            normed = next.is_some();
        }
        backend.switch_to(self.output_place, &residual, step.rows);
        Ok(())
    }

    /// One layer's attention for every row of the step (its input already
    /// normed into `Norm`): projections, rope, attention over the cache and
    /// the step's rows, the cache write, and the output projection into
    /// `BranchOut` (summed over the devices). A gated layer's q projection
    /// lands in `FfnGate` and splits into q and its gate (`FfnUp`), which
    /// then takes sigmoid(gate) × the attention's output.
    fn attention_block(&self, backend: &mut dyn Backend, step: &Step, li: usize, layer: &Attend) {
        let t_n = step.rows;
        let s = &layer.shape;
        let (qw, kw, vw) = (
            s.n_heads * s.key_dim,
            s.n_kv_heads * s.key_dim,
            s.n_kv_heads * s.value_dim,
        );
        let q_out = if layer.gated { Buf::FfnGate } else { Buf::Q };
        backend.matmul_many(
            &[layer.wq, layer.wk, layer.wv],
            Buf::Norm,
            t_n,
            &[q_out, Buf::K, Buf::V],
        );
        if layer.gated {
            backend.split_heads(Buf::FfnGate, t_n, s.n_heads, s.key_dim, Buf::Q, Buf::FfnUp);
        }
        if let Some([bq, bk, bv]) = layer.bias {
            backend.add_bias(Buf::Q, bq, t_n, qw);
            backend.add_bias(Buf::K, bk, t_n, kw);
            backend.add_bias(Buf::V, bv, t_n, vw);
        }
        if let Some([qn, kn]) = layer.qk_norm {
            backend.head_norm(Buf::Q, qn, self.eps, t_n, qw, s.key_dim);
            backend.head_norm(Buf::K, kn, self.eps, t_n, kw, s.key_dim);
        }
        if layer.value_norm {
            backend.head_norm_unweighted(Buf::V, self.eps, t_n, vw, s.value_dim);
        }
        let io = AttentionIo {
            q: Buf::Q,
            k: Buf::K,
            v: Buf::V,
            out: Buf::AttnOut,
        };
        backend.attend(li, s, step, io, &layer.rope);
        let attn_out = if layer.gated {
            backend.sigmoid_gate(Buf::FfnUp, Buf::AttnOut, t_n, s.n_heads * s.value_dim);
            Buf::FfnUp
        } else {
            Buf::AttnOut
        };
        backend.matmul(layer.wo, attn_out, t_n, Buf::BranchOut);
        if let Some(b) = layer.o_bias {
            backend.add_bias(Buf::BranchOut, b, t_n, self.spec.hidden as usize);
        }
        backend.all_reduce(Buf::BranchOut, t_n, self.spec.hidden as usize);
    }

    /// A linear-attention layer for every row of the step (input normed
    /// into `Norm`): the projections (q/k/v into `Q`, the output gate z
    /// into `FfnUp`, decay and update inputs into `K` and `V`), the
    /// convolution and delta rule from each sequence's state slot into
    /// `AttnOut`, its per-head norm times silu(z), and the output
    /// projection into `BranchOut`.
    fn linear_block(&self, backend: &mut dyn Backend, step: &Step, states: &[usize], l: &Linear) {
        let t_n = step.rows;
        let s = &l.shape;
        let inner = s.value_heads * s.head_dim;
        backend.matmul_many(
            &[l.wqkv, l.wgate, l.walpha, l.wbeta],
            Buf::Norm,
            t_n,
            &[Buf::Q, Buf::FfnUp, Buf::K, Buf::V],
        );
        let io = LinearIo {
            qkv: Buf::Q,
            alpha: Buf::K,
            beta: Buf::V,
            out: Buf::AttnOut,
        };
        backend.gated_delta_rule(l.index, s, &l.weights, step, states, io);
        backend.head_norm(Buf::AttnOut, l.norm, self.eps, t_n, inner, s.head_dim);
        backend.glu(Buf::FfnUp, Buf::AttnOut, t_n, inner, Glu::Silu);
        backend.matmul(l.wout, Buf::FfnUp, t_n, Buf::BranchOut);
    }

    /// residual += (optionally normed) branch_out; then, when a block
    /// follows, its input norm of the residual into `Norm` (one op, which a
    /// backend may fuse).
    fn add_branch(
        &self,
        backend: &mut dyn Backend,
        post_norm: Option<VectorId>,
        rows: usize,
        next_norm: Option<VectorId>,
    ) {
        let d = self.spec.hidden as usize;
        let branch = match post_norm {
            Some(w) => {
                backend.rms_norm(Buf::BranchOut, w, self.eps, rows, d, Buf::Norm);
                Buf::Norm
            }
            None => Buf::BranchOut,
        };
        match next_norm {
            Some(w) => backend.add_rms_norm(Buf::Residual, branch, w, self.eps, rows, d, Buf::Norm),
            None => backend.add(Buf::Residual, branch, rows, d),
        }
    }

    /// A gated FFN (`[gate, up, down]`) over `rows` rows of `x` into `out`.
    fn ffn(
        &self,
        backend: &mut dyn Backend,
        [gate, up, down]: [MatrixId; 3],
        x: Buf,
        rows: usize,
        out: Buf,
    ) {
        let f = self.ffn_width;
        backend.matmul_glu([gate, up], x, rows, self.glu, [Buf::FfnGate, Buf::FfnUp], f);
        backend.matmul(down, Buf::FfnGate, rows, out);
    }

    /// Routed experts: each row's top-k experts by router softmax, their
    /// outputs weighted into `branch_out` ([`Backend::routed_experts`]).
    /// The shared expert over every row of `Norm`, its output (in
    /// `MoeOut`) weighted by its gate (in `RouterLogits`) and added to
    /// `BranchOut`.
    fn shared_expert(&self, backend: &mut dyn Backend, shared: &SharedExpert, rows: usize) {
        let width = self.spec.shared_expert_ffn as usize;
        let [gate, up, down] = shared.ffn;
        let glu_out = [Buf::FfnGate, Buf::FfnUp];
        backend.matmul_glu([gate, up], Buf::Norm, rows, self.glu, glu_out, width);
        backend.matmul(down, Buf::FfnGate, rows, Buf::MoeOut);
        backend.matmul(shared.gate, Buf::Norm, rows, Buf::RouterLogits);
        let d = self.spec.hidden as usize;
        backend.add_gated_rows(Buf::BranchOut, Buf::MoeOut, Buf::RouterLogits, rows, d);
    }

    /// Where the layer and its experts sit apart (a placement), the
    /// normed rows and router logits cross to the experts and their sum
    /// crosses back.
    fn moe_ffn(
        &self,
        backend: &mut dyn Backend,
        layer: &Layer,
        router: MatrixId,
        experts: &[[MatrixId; 3]],
        biases: &Option<MoeBiases>,
        rows: usize,
    ) {
        let d = self.spec.hidden as usize;
        let k = self.spec.n_experts_active as usize;
        backend.matmul(router, Buf::Norm, rows, Buf::RouterLogits);
        if let Some(b) = biases {
            backend.add_bias(Buf::RouterLogits, b.router, rows, experts.len());
        }
        backend.switch_to(
            layer.experts_place,
            &[(Buf::Norm, d), (Buf::RouterLogits, experts.len())],
            rows,
        );
        backend.route_experts(
            Buf::RouterLogits,
            rows,
            experts.len(),
            k,
            self.spec.norm_topk_prob,
        );
        let ffn = RoutedFfn {
            experts,
            k,
            act: self.glu,
            width: d,
            ffn_width: self.ffn_width,
            biases: biases.as_ref().map(|b| b.experts.as_slice()),
        };
        backend.routed_experts(&ffn, Buf::Norm, rows, Buf::BranchOut);
        backend.switch_to(layer.place, &[(Buf::BranchOut, d)], rows);
    }
}

/// What every layer's attention shares.
struct LayerGlobals {
    attn_scale: f32,
    theta: f32,
    /// Base frequency of sliding-window layers.
    local_theta: f32,
    neox: bool,
    /// The rope factors as each side holds them (indexed by `Place`).
    freqs: [Option<VectorId>; 2],
    /// The factors apply to the global layers only (Gemma 4).
    factors_global_only: bool,
    /// Leading values of a head that rotate, when not all.
    rotated: Option<usize>,
    /// YaRN scaling of every layer's rope (gpt-oss).
    yarn: Option<fathom_backend::Yarn>,
}

/// A linear-attention layer: its projections, convolution taps, decay
/// parameters and output norm, on the loader's side.
fn load_linear(
    loader: &mut Loader,
    spec: &ModelSpec,
    shape: fathom_spec::LinearAttention,
    n: &crate::names::LinearNames,
) -> Result<Linear, EngineError> {
    let d = spec.hidden as usize;
    let shape = LinearShape {
        key_heads: shape.key_heads as usize,
        value_heads: shape.value_heads as usize,
        head_dim: shape.head_dim as usize,
        conv_kernel: shape.conv_kernel as usize,
        eps: spec.rms_norm_eps as f32,
        value_order: if n.grouped_values {
            ValueOrder::Grouped
        } else {
            ValueOrder::Tiled
        },
    };
    let (channels, heads) = (shape.channels(), shape.value_heads);
    let inner = heads * shape.head_dim;
    let taps = loader.files.flat(&n.conv, channels, shape.conv_kernel)?;
    loader.converted += taps.len() * 4;
    let conv = loader.backend.load_vector(&taps)?;
    let mut decay = loader.files.vector(&n.decay, heads)?;
    if n.decay_is_log {
        decay.iter_mut().for_each(|a| *a = -a.exp());
    }
    loader.converted += heads * 4;
    let decay = loader.backend.load_vector(&decay)?;
    let side = loader.place as usize;
    let index = loader.linear_layers[side];
    loader.linear_layers[side] += 1;
    Ok(Linear {
        index,
        weights: LinearWeights {
            conv,
            dt_bias: loader.vector(&n.dt_bias, heads, false)?,
            decay,
        },
        wqkv: loader.named_matrix(&n.qkv, channels, d, Split::Whole)?,
        wgate: loader.named_matrix(&n.gate, inner, d, Split::Whole)?,
        walpha: loader.named_matrix(&n.alpha, heads, d, Split::Whole)?,
        wbeta: loader.named_matrix(&n.beta, heads, d, Split::Whole)?,
        // Stored as the weight itself in every format (HF's other norms
        // store `w` of `1 + w`).
        norm: loader.vector(&n.norm, shape.head_dim, false)?,
        wout: loader.named_matrix(&n.out, d, inner, Split::Whole)?,
        shape,
    })
}

/// A gpt-oss layer's router bias (with the router, on `place`) and
/// per-expert biases (the merged `[n_expert, width]` tensors, a row an
/// expert, with the experts on `experts_place`), converted to f32.
fn load_moe_biases(
    loader: &mut Loader,
    n: &crate::names::GptOssNames,
    (experts, ffn, d): (usize, usize, usize),
    (place, experts_place): (Place, Place),
) -> Result<MoeBiases, EngineError> {
    let router = loader.vector(&n.router_bias, experts, false)?;
    loader.at(experts_place);
    let mut rows = Vec::with_capacity(3);
    for (name, width) in [(&n.gate_bias, ffn), (&n.up_bias, ffn), (&n.down_bias, d)] {
        let all = loader.files.flat(name, experts, width)?;
        loader.converted += all.len() * 4;
        let ids = all
            .chunks_exact(width)
            .map(|row| loader.backend.load_vector(row))
            .collect::<Result<Vec<_>, _>>()?;
        rows.push(ids);
    }
    loader.at(place);
    let experts = (0..experts)
        .map(|e| [rows[0][e], rows[1][e], rows[2][e]])
        .collect();
    Ok(MoeBiases { router, experts })
}

fn load_layer(
    loader: &mut Loader,
    naming: &Naming,
    spec: &ModelSpec,
    globals: &LayerGlobals,
    (i, (place, experts_place)): (usize, (Place, Place)),
    (l, local): (&fathom_spec::Layer, &fathom_spec::Layer),
    n: &LayerNames,
) -> Result<Layer, EngineError> {
    loader.at(place);
    let d = spec.hidden as usize;
    let n_heads = spec.n_heads as usize;
    let (kvh, dk, dv) = (
        l.n_kv_heads as usize,
        l.key_dim as usize,
        l.value_dim as usize,
    );
    let devices = loader.devices;
    let split = |role| loader.split(role, kvh);
    let (q_split, kv_split) = (split(Role::Query), split(Role::KeyValue));
    let (o_split, ffn_in, ffn_down) = (
        split(Role::AttnOutput),
        split(Role::FfnIn),
        split(Role::FfnDown),
    );
    let (experts_in, experts_down, router_split) = (
        split(Role::ExpertsIn),
        split(Role::ExpertsDown),
        split(Role::Router),
    );
    let bias = if loader.files.has(&n.q_bias) {
        Some([
            loader.split_vector(&n.q_bias, n_heads * dk, false, q_split)?,
            loader.split_vector(&n.k_bias, kvh * dk, false, kv_split)?,
            loader.split_vector(&n.v_bias, kvh * dv, false, kv_split)?,
        ])
    } else {
        None
    };
    let qk_norm = match (
        loader.optional_vector(&n.q_norm, dk, true)?,
        loader.optional_vector(&n.k_norm, dk, true)?,
    ) {
        (Some(q), Some(k)) => Some([q, k]),
        _ => None,
    };
    let (post_attn_norm, post_ffn_norm) = if spec.block.post_norms {
        (
            Some(loader.vector(&n.post_attn_norm, d, true)?),
            Some(loader.vector(&n.post_ffn_norm, d, true)?),
        )
    } else {
        (None, None)
    };
    let ffn = if spec.n_experts > 0 {
        let (e_n, f) = (spec.n_experts as usize, spec.expert_ffn as usize);
        loader.at(experts_place);
        let mut experts = Vec::with_capacity(e_n);
        for e in 0..e_n {
            let [g, u, dn] = match naming {
                Naming::Gguf => {
                    let [g, u, dn] = Naming::gguf_experts(i);
                    let files = loader.files;
                    let [g] = files.stacked(&g, e, e_n, f, d)?;
                    let [u] = files.stacked(&u, e, e_n, f, d)?;
                    let [dn] = files.stacked(&dn, e, e_n, d, f)?;
                    [g, u, dn]
                }
                Naming::Hf { .. } => {
                    let files = loader.files;
                    let [gate_up, down] = naming.hf_stacked_experts(i);
                    if files.has(&gate_up) {
                        let [g, u] = files.stacked(&gate_up, e, e_n, f, d)?;
                        let [dn] = files.stacked(&down, e, e_n, d, f)?;
                        [g, u, dn]
                    } else {
                        let [g, u, dn] = naming.hf_expert(i, e);
                        [
                            files.matrix(&g, f, d)?,
                            files.matrix(&u, f, d)?,
                            files.matrix(&dn, d, f)?,
                        ]
                    }
                }
            };
            experts.push([
                loader.matrix(g, experts_in)?,
                loader.matrix(u, experts_in)?,
                loader.matrix(dn, experts_down)?,
            ]);
        }
        loader.at(place);
        let shared = match spec.shared_expert_ffn as usize {
            0 => None,
            f => Some(SharedExpert {
                ffn: [
                    loader.named_matrix(&n.shared_gate, f, d, Split::Whole)?,
                    loader.named_matrix(&n.shared_up, f, d, Split::Whole)?,
                    loader.named_matrix(&n.shared_down, d, f, Split::Whole)?,
                ],
                gate: {
                    let m = loader.files.row_matrix(&n.shared_router, d)?;
                    loader.matrix(m, Split::Whole)?
                },
            }),
        };
        let biases = if loader.files.has(&n.gpt_oss.router_bias) {
            Some(load_moe_biases(
                loader,
                &n.gpt_oss,
                (e_n, f, d),
                (place, experts_place),
            )?)
        } else {
            None
        };
        Ffn::Moe {
            router: loader.named_matrix(&n.router, e_n, d, router_split)?,
            experts,
            shared,
            biases,
        }
    } else {
        let f = spec.ffn as usize;
        Ffn::Dense {
            gate: loader.named_matrix(&n.gate, f, d, ffn_in)?,
            up: loader.named_matrix(&n.up, f, d, ffn_in)?,
            down: loader.named_matrix(&n.down, d, f, ffn_down)?,
        }
    };
    let window = match l.attention {
        Attention::Sliding { window } => Some(window as usize),
        _ => None,
    };
    let mixer = match (l.attention, spec.linear) {
        (Attention::Linear, Some(shape)) => {
            Mixer::Linear(load_linear(loader, spec, shape, &n.linear)?)
        }
        _ => {
            let gated = spec.block.gated_attention;
            let wk = loader.named_matrix(&n.k, kvh * dk, d, kv_split)?;
            // Gemma 4's global layers may have no v projection: the values
            // are the keys' projection, normed apart.
            let wv = if spec.block.value_norm && !loader.files.has(&n.v) {
                if dv != dk {
                    return Err(EngineError::BadShape {
                        tensor: n.k.clone(),
                        shape: vec![d as u64, (kvh * dk) as u64],
                        expected: vec![d as u64, (kvh * dv) as u64],
                    });
                }
                wk
            } else {
                loader.named_matrix(&n.v, kvh * dv, d, kv_split)?
            };
            let q_rows = if gated {
                2 * n_heads * dk
            } else {
                n_heads * dk
            };
            Mixer::Attention(Attend {
                shape: AttentionShape {
                    n_heads: n_heads / devices,
                    n_kv_heads: local.n_kv_heads as usize,
                    key_dim: dk,
                    value_dim: dv,
                    window,
                    scale: globals.attn_scale,
                    sinks: loader.optional_vector(&n.gpt_oss.sinks, n_heads, false)?,
                },
                rope: RopeParams {
                    theta: if window.is_some() {
                        globals.local_theta
                    } else {
                        globals.theta
                    },
                    neox: globals.neox,
                    freqs: globals.freqs[place as usize]
                        .filter(|_| window.is_none() || !globals.factors_global_only),
                    rotated: globals.rotated,
                    yarn: globals.yarn,
                },
                wq: loader.named_matrix(&n.q, q_rows, d, q_split)?,
                wk,
                wv,
                wo: loader.named_matrix(&n.o, d, n_heads * dv, o_split)?,
                bias,
                qk_norm,
                gated,
                o_bias: loader.optional_vector(&n.gpt_oss.o_bias, d, false)?,
                value_norm: spec.block.value_norm,
            })
        }
    };
    Ok(Layer {
        place,
        experts_place,
        attn_norm: loader.vector(&n.attn_norm, d, true)?,
        mixer,
        post_attn_norm,
        ffn_norm: loader.vector(&n.ffn_norm, d, true)?,
        post_ffn_norm,
        ffn,
        out_scale: if loader.files.has(&n.out_scale) {
            Some(loader.scalar(&n.out_scale)?)
        } else {
            None
        },
    })
}
