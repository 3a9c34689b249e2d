//! Tensor names per format: llama.cpp's GGUF names or Hugging Face's.

/// The names of one layer's tensors in one checkpoint format.
pub struct LayerNames {
    pub attn_norm: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub q_bias: String,
    pub k_bias: String,
    pub v_bias: String,
    pub q_norm: String,
    pub k_norm: String,
    /// Gemma 3's norm on the attention output.
    pub post_attn_norm: String,
    pub ffn_norm: String,
    /// Gemma 3's norm on the FFN output.
    pub post_ffn_norm: String,
    /// Gemma 4's scalar on the layer's output.
    pub out_scale: String,
    pub gate: String,
    pub up: String,
    pub down: String,
    pub router: String,
    /// Qwen3.5 MoE's shared expert and its one-row gate (GGUF names).
    pub shared_gate: String,
    pub shared_up: String,
    pub shared_down: String,
    pub shared_router: String,
    /// A linear-attention layer's tensors.
    pub linear: LinearNames,
    /// gpt-oss's sinks and biases (llama.cpp's GGUF names).
    pub gpt_oss: GptOssNames,
}

/// A gpt-oss layer's attention sinks and the biases other families lack.
pub struct GptOssNames {
    pub sinks: String,
    pub o_bias: String,
    pub router_bias: String,
    /// The merged experts' biases, `[n_expert, width]`.
    pub gate_bias: String,
    pub up_bias: String,
    pub down_bias: String,
}

/// A Qwen3.5 linear-attention layer's tensors, and how the format stores
/// them.
pub struct LinearNames {
    /// q, k and v before the convolution.
    pub qkv: String,
    /// The output gate (z).
    pub gate: String,
    pub alpha: String,
    pub beta: String,
    pub conv: String,
    pub dt_bias: String,
    pub decay: String,
    pub norm: String,
    pub out: String,
    /// `decay` holds log(−A) (HF's `A_log`) rather than the rate −exp(A_log)
    /// llama.cpp's converter stores.
    pub decay_is_log: bool,
    /// The value heads are in grouped order (each key head's together, as
    /// HF stores them) rather than the tiled order llama.cpp's converter
    /// moves them to.
    pub grouped_values: bool,
}

/// How a format names the model-wide tensors, and each layer's.
pub enum Naming {
    Gguf,
    /// Hugging Face names under a prefix (`model.` or, for multimodal
    /// checkpoints, `language_model.model.`).
    Hf {
        prefix: String,
    },
}

impl Naming {
    pub fn embed(&self) -> String {
        match self {
            Naming::Gguf => "token_embd.weight".into(),
            Naming::Hf { prefix } => format!("{prefix}embed_tokens.weight"),
        }
    }

    pub fn output_norm(&self) -> String {
        match self {
            Naming::Gguf => "output_norm.weight".into(),
            Naming::Hf { prefix } => format!("{prefix}norm.weight"),
        }
    }

    /// The untied output projection.
    pub fn output(&self) -> String {
        match self {
            Naming::Gguf => "output.weight".into(),
            // Beside the language model in a multimodal checkpoint: Gemma 3's
            // `language_model.lm_head`, Qwen3.5's top-level `lm_head`.
            Naming::Hf { prefix } => match prefix.as_str() {
                "model.language_model." => "lm_head.weight".into(),
                p => format!("{}lm_head.weight", p.trim_end_matches("model.")),
            },
        }
    }

    /// Layer `i`'s names; `post_norms` models (Gemma 3) name their
    /// pre-FFN norm apart from the post-attention one, and Qwen3.5's GGUF
    /// (`gated_attention`) names it `post_attention_norm`.
    pub fn layer(&self, style: &fathom_spec::BlockStyle, i: usize) -> LayerNames {
        let post_norms = style.post_norms;
        let b = |s: &str| format!("blk.{i}.{s}");
        let gguf_linear = LinearNames {
            qkv: b("attn_qkv.weight"),
            gate: b("attn_gate.weight"),
            alpha: b("ssm_alpha.weight"),
            beta: b("ssm_beta.weight"),
            conv: b("ssm_conv1d.weight"),
            dt_bias: b("ssm_dt.bias"),
            decay: b("ssm_a"),
            norm: b("ssm_norm.weight"),
            out: b("ssm_out.weight"),
            decay_is_log: false,
            grouped_values: false,
        };
        let gpt_oss = GptOssNames {
            sinks: b("attn_sinks.weight"),
            o_bias: b("attn_output.bias"),
            router_bias: b("ffn_gate_inp.bias"),
            gate_bias: b("ffn_gate_exps.bias"),
            up_bias: b("ffn_up_exps.bias"),
            down_bias: b("ffn_down_exps.bias"),
        };
        match self {
            Naming::Gguf => LayerNames {
                attn_norm: b("attn_norm.weight"),
                q: b("attn_q.weight"),
                k: b("attn_k.weight"),
                v: b("attn_v.weight"),
                o: b("attn_output.weight"),
                q_bias: b("attn_q.bias"),
                k_bias: b("attn_k.bias"),
                v_bias: b("attn_v.bias"),
                q_norm: b("attn_q_norm.weight"),
                k_norm: b("attn_k_norm.weight"),
                post_attn_norm: b("post_attention_norm.weight"),
                ffn_norm: if style.ffn_norm_post_attention {
                    b("post_attention_norm.weight")
                } else {
                    b("ffn_norm.weight")
                },
                post_ffn_norm: b("post_ffw_norm.weight"),
                out_scale: b("layer_output_scale.weight"),
                gate: b("ffn_gate.weight"),
                up: b("ffn_up.weight"),
                down: b("ffn_down.weight"),
                router: b("ffn_gate_inp.weight"),
                shared_gate: b("ffn_gate_shexp.weight"),
                shared_up: b("ffn_up_shexp.weight"),
                shared_down: b("ffn_down_shexp.weight"),
                shared_router: b("ffn_gate_inp_shexp.weight"),
                linear: gguf_linear,
                gpt_oss,
            },
            Naming::Hf { prefix } => {
                let b = |s: &str| format!("{prefix}layers.{i}.{s}");
                let l = |s: &str| b(&format!("linear_attn.{s}"));
                let linear = LinearNames {
                    qkv: l("in_proj_qkv.weight"),
                    gate: l("in_proj_z.weight"),
                    alpha: l("in_proj_a.weight"),
                    beta: l("in_proj_b.weight"),
                    conv: l("conv1d.weight"),
                    dt_bias: l("dt_bias"),
                    decay: l("A_log"),
                    norm: l("norm.weight"),
                    out: l("out_proj.weight"),
                    decay_is_log: true,
                    grouped_values: true,
                };
                LayerNames {
                    attn_norm: b("input_layernorm.weight"),
                    q: b("self_attn.q_proj.weight"),
                    k: b("self_attn.k_proj.weight"),
                    v: b("self_attn.v_proj.weight"),
                    o: b("self_attn.o_proj.weight"),
                    q_bias: b("self_attn.q_proj.bias"),
                    k_bias: b("self_attn.k_proj.bias"),
                    v_bias: b("self_attn.v_proj.bias"),
                    q_norm: b("self_attn.q_norm.weight"),
                    k_norm: b("self_attn.k_norm.weight"),
                    post_attn_norm: b("post_attention_layernorm.weight"),
                    // Gemma names its pre-FFN norm apart from the
                    // post-attention one; the others use the latter as the
                    // pre-FFN norm.
                    ffn_norm: if post_norms {
                        b("pre_feedforward_layernorm.weight")
                    } else {
                        b("post_attention_layernorm.weight")
                    },
                    post_ffn_norm: b("post_feedforward_layernorm.weight"),
                    out_scale: b("layer_scalar"),
                    gate: b("mlp.gate_proj.weight"),
                    up: b("mlp.up_proj.weight"),
                    down: b("mlp.down_proj.weight"),
                    router: b("mlp.gate.weight"),
                    shared_gate: b("mlp.shared_expert.gate_proj.weight"),
                    shared_up: b("mlp.shared_expert.up_proj.weight"),
                    shared_down: b("mlp.shared_expert.down_proj.weight"),
                    shared_router: b("mlp.shared_expert_gate.weight"),
                    linear,
                    gpt_oss,
                }
            }
        }
    }

    /// Expert `e`'s FFN matrices in a per-expert (HF) checkpoint.
    pub fn hf_expert(&self, i: usize, e: usize) -> [String; 3] {
        let prefix = match self {
            Naming::Hf { prefix } => prefix.as_str(),
            Naming::Gguf => "",
        };
        ["gate_proj", "up_proj", "down_proj"]
            .map(|p| format!("{prefix}layers.{i}.mlp.experts.{e}.{p}.weight"))
    }

    /// A layer's experts stacked in two tensors, `[experts, 2 × width,
    /// hidden]` gate and up, `[experts, hidden, width]` down (Qwen3.5
    /// MoE's HF files; no `.weight`).
    pub fn hf_stacked_experts(&self, i: usize) -> [String; 2] {
        let prefix = match self {
            Naming::Hf { prefix } => prefix.as_str(),
            Naming::Gguf => "",
        };
        ["gate_up_proj", "down_proj"].map(|p| format!("{prefix}layers.{i}.mlp.experts.{p}"))
    }

    /// The merged experts tensors of a GGUF layer.
    pub fn gguf_experts(i: usize) -> [String; 3] {
        ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"].map(|p| format!("blk.{i}.{p}.weight"))
    }
}
