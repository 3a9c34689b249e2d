#!/usr/bin/env python3
"""Independent numpy reference forward pass for llama-family GGUF checkpoints.

This is the *reference* implementation that fathom's logits are checked
against, so it deliberately shares no code with the Rust engine: weights are
read and dequantized with the Python `gguf` package (the one maintained next to
llama.cpp) and the transformer is written out plainly in numpy.

Supported architectures (general.architecture):
  llama   RMSNorm, rope "normal" layout (adjacent pairs), GQA, SwiGLU,
          tied output (token_embd) when output.weight is absent,
          optional rope_freqs (llama3 frequency factors) and linear rope scaling
  qwen2   as llama + q/k/v biases, rope NeoX layout (halves)
  qwen3   as llama + per-head RMSNorm on q and k (before rope), NeoX rope
  qwen3moe  qwen3 attention + mixture-of-experts FFN (softmax router, top-k,
          optional renormalisation of the top-k weights)
  gemma3  embeddings scaled by sqrt(hidden), RMSNorm (the GGUF already stores
          1+w), pre/post attention and FFN norms, GeGLU (tanh gelu), per-head
          q/k norms, NeoX rope, sliding-window local layers (rope base 10000)
          every layer except each 6th, queries scaled by
          query_pre_attn_scalar^-0.5 (= head_dim^-0.5, except 27B: (hidden/heads)^-0.5),
          linear rope scaling on the global layers only
  qwen35  Qwen3.5 hybrid: every full_attention_interval-th layer gated full
          attention (the q projection holds a query and an output gate per
          head; out = attn * sigmoid(gate)), per-head q/k norms, NeoX rope on
          the first rope.dimension_count values of a head; the other layers
          a gated delta rule: a causal conv of ssm.conv_kernel taps over
          q|k|v then SiLU, q and k scaled to unit length, per value head
          S <- exp(g) S; S <- S + beta (v - S k) k^T; o = S q / sqrt(d) with
          g = ssm_a * softplus(alpha + ssm_dt.bias) and beta = sigmoid(b),
          then RMSNorm(o) * silu(z) per head; the pre-FFN norm is stored as
          post_attention_norm; multi-token-prediction layers are skipped
  qwen35moe  qwen35 layers + qwen3moe's routed experts (top-k renormalised)
          plus a shared expert whose output is scaled by
          sigmoid(ffn_gate_inp_shexp . x)
  gpt-oss  OpenAI's gpt-oss (llama.cpp's openai-moe.cpp): q/k/v/o biases, NeoX
          rope with YaRN (freq_scale 1/factor, the blend between the pairs
          that make beta_fast = 32 and beta_slow = 1 turns over the original
          context, floored/ceiled as ggml does, cos/sin times
          1 + 0.1 ln factor), a learned sink logit per head in each softmax's
          denominator, a window of attention.sliding_window on even layers
          (sliding_window_pattern 2), the pre-FFN norm stored as
          post_attention_norm; experts: router logits + bias, the top k by
          logit weighted by a softmax over those k, each expert's gate and up
          (+ biases) through the clamped SwiGLU
          min(g,7) * sigmoid(1.702 min(g,7)) * (clamp(u,-7,7) + 1), down + bias
  gemma4  gemma3's block with the layer pattern from
          attention.sliding_window_pattern, per-kind head widths
          (key_length / key_length_swa) and KV heads (a head_count_kv list),
          scores unscaled (scale 1), values RMS-normed per head without a
          weight and, where attn_v is absent, taken from the k projection
          (before its norm), rope over the whole head with rope_freqs on the
          global layers only (base rope.freq_base_swa on sliding ones), the
          residual multiplied by layer_output_scale after each layer, and
          logits = cap * tanh(logits / cap) (final_logit_softcapping)
Validation: validate_forward.py (SmolLM2 Q4_1 vs llama.cpp greedy) and
synth_arch_check.py (every architecture on tiny random F32 GGUFs vs llama.cpp).

Usage:
  forward.py MODEL.gguf --tokens '[1, 2, 3]'              # last-position logits
  forward.py MODEL.gguf --tokens '[...]' --all-positions  # logits of every position
  forward.py MODEL.gguf --tokens '[...]' --generate 16    # + greedy continuation
Output (JSON on stdout or --out FILE):
  {"model", "arch", "tokens", "argmax", "logits", ["generated"]}
  with --all-positions, "argmax" and "logits" are per position lists.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("needs the gguf package: pip install gguf numpy")


# --------------------------------------------------------------------------
# GGUF loading
# --------------------------------------------------------------------------

def field_value(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


@dataclass
class Config:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    rope_scale: float  # positions are multiplied by 1/rope_scale (linear scaling)
    rope_neox: bool
    norm_eps: float
    vocab_size: int
    # gemma3
    sliding_window: int = 0
    rope_base_local: float = 10000.0
    # moe
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    norm_topk_prob: bool = True
    # qwen35 (gated delta rule)
    full_attention_interval: int = 0
    ssm_conv_kernel: int = 0
    ssm_state: int = 0
    ssm_groups: int = 0
    ssm_value_heads: int = 0
    # gpt-oss: YaRN (factor 0 = none) and the sliding layers' period
    yarn_factor: float = 0.0
    yarn_orig_ctx: int = 0
    swa_period: int = 0
    # gemma4: per-layer sliding flags, KV heads and head widths
    sliding: list | None = None
    n_head_kv_layers: list | None = None
    head_dim_swa: int = 0
    softcap: float = 0.0


NEOX_ARCHS = {"qwen2", "qwen3", "qwen3moe", "gemma3", "gemma4", "qwen35", "qwen35moe", "gpt-oss"}
HYBRID_ARCHS = {"qwen35", "qwen35moe"}
MOE_ARCHS = {"qwen3moe", "qwen35moe", "gpt-oss"}


def read_config(reader: gguf.GGUFReader) -> Config:
    arch = field_value(reader, "general.architecture")
    a = lambda key, default=None: field_value(reader, f"{arch}.{key}", default)  # noqa: E731
    n_embd = int(a("embedding_length"))
    n_head = int(a("attention.head_count"))
    n_head_kv = a("attention.head_count_kv", n_head)
    n_head_kv_layers = [int(h) for h in n_head_kv] if isinstance(n_head_kv, list) else None
    n_head_kv = max(n_head_kv_layers) if n_head_kv_layers else int(n_head_kv)
    head_dim = int(a("attention.key_length", n_embd // n_head))
    n_rot = int(a("rope.dimension_count", head_dim))
    scaling_type = a("rope.scaling.type", "none")
    rope_scale = 1.0
    if scaling_type == "linear":
        rope_scale = float(a("rope.scaling.factor", 1.0))
    elif scaling_type == "yarn" and arch == "gpt-oss":
        pass  # read below
    elif scaling_type not in ("none", None):
        # yarn etc. are not implemented; refuse instead of silently diverging.
        sys.exit(f"rope scaling type {scaling_type!r} not supported by the reference")
    vocab = field_value(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    n_ff = a("feed_forward_length", 0)
    if isinstance(n_ff, list):  # per-layer lists are not used by these models
        n_ff = n_ff[0]
    cfg = Config(
        arch=arch,
        n_layer=int(a("block_count")),
        n_embd=n_embd,
        n_ff=int(n_ff),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        rope_base=float(a("rope.freq_base", 10000.0)),
        rope_scale=rope_scale,
        rope_neox=arch in NEOX_ARCHS,
        norm_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        vocab_size=int(vocab),
    )
    if arch == "gemma3":
        cfg.sliding_window = int(a("attention.sliding_window", 0))
    if arch == "gemma4":
        cfg.sliding_window = int(a("attention.sliding_window"))
        cfg.sliding = [bool(f) for f in a("attention.sliding_window_pattern")][: cfg.n_layer]
        cfg.n_head_kv_layers = n_head_kv_layers or [n_head_kv] * cfg.n_layer
        cfg.head_dim_swa = int(a("attention.key_length_swa"))
        cfg.rope_base_local = float(a("rope.freq_base_swa", 10000.0))
        cfg.softcap = float(a("final_logit_softcapping", 0.0))
    if arch in MOE_ARCHS:
        cfg.n_expert = int(a("expert_count"))
        cfg.n_expert_used = int(a("expert_used_count"))
        cfg.n_ff_expert = int(a("expert_feed_forward_length", 0))
        # llama.cpp's qwen3moe graph always renormalises the top-k weights
        # (HF norm_topk_prob=True for the released models).
        cfg.norm_topk_prob = True
    if arch in HYBRID_ARCHS:
        cfg.n_layer -= int(a("nextn_predict_layers", 0))
        cfg.full_attention_interval = int(a("full_attention_interval"))
        cfg.ssm_conv_kernel = int(a("ssm.conv_kernel"))
        cfg.ssm_state = int(a("ssm.state_size"))
        cfg.ssm_groups = int(a("ssm.group_count"))
        cfg.ssm_value_heads = int(a("ssm.time_step_rank"))
    if arch == "gpt-oss":
        cfg.sliding_window = int(a("attention.sliding_window"))
        cfg.rope_base_local = cfg.rope_base
        cfg.swa_period = int(a("attention.sliding_window_pattern", 2))
        if scaling_type == "yarn":
            cfg.yarn_factor = float(a("rope.scaling.factor"))
            cfg.yarn_orig_ctx = int(a("rope.scaling.original_context_length", a("context_length")))
    if arch not in ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "gemma4", "qwen35", "qwen35moe", "gpt-oss"):
        sys.exit(f"architecture {arch!r} not supported by the reference")
    return cfg


class Weights:
    """Dequantizes tensors lazily to float32 arrays shaped (out, in) = numpy (rows, cols)."""

    def __init__(self, reader: gguf.GGUFReader):
        self.tensors = {t.name: t for t in reader.tensors}
        self.cache: dict[str, np.ndarray] = {}

    def qtype(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def block_mins(self, name: str) -> np.ndarray:
        """The per-block f16 minimum m of Q4_1 / Q5_1 rows, shaped (rows, blocks)."""
        t = self.tensors[name]
        block_bytes = {"Q4_1": 20, "Q5_1": 24}[t.tensor_type.name]
        raw = np.asarray(t.data, dtype=np.uint8)
        rows = raw.shape[0]
        blocks = raw.reshape(rows, -1, block_bytes)
        return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str) -> np.ndarray:
        if name not in self.cache:
            t = self.tensors[name]
            arr = dequantize(t.data, t.tensor_type)
            # GGUF lists dims fastest-first; numpy wants them reversed.
            shape = tuple(int(d) for d in reversed(t.shape))
            self.cache[name] = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
        return self.cache[name]

    def opt(self, name: str):
        return self.get(name) if self.has(name) else None


# --------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * scale).astype(np.float32) * weight


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x @ w.T
    if b is not None:
        y = y + b
    return y


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


# --- optional emulation of ggml's CPU rounding (--emulate-ggml) ----------------
# ggml's CPU matmul does not multiply quantized weights by float32 activations:
# it first rounds the activations to the weight type's "vec_dot_type" (Q8_0/Q8_1
# blocks of 32 for the legacy quants, Q8_K blocks of 256 for k-quants, float16
# for F16 weights), and llama.cpp keeps the KV cache in float16. On a 135M model
# with large outlier activations this shifts logits by ~0.1-0.3, enough to flip
# near-ties in greedy decoding. The flag reproduces only these roundings; the
# default path is exact float32 math.

LEGACY_Q8_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "IQ4_NL", "MXFP4"}
K_Q8_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
              "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_XS"}


def quantize_q8_blocks(x: np.ndarray):
    """ggml's quantize_row_q8_0/q8_1 (x86 path): blocks of 32, q = round(x * 127/amax),
    scale d = amax/127 stored as f16. Returns (q, d_f32, d_f16) shaped (..., nblocks, 32|1)."""
    b = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    amax = np.max(np.abs(b), axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax != 0)
    q = np.rint(b * inv)
    return q, d, d.astype(np.float16).astype(np.float32)


def round_q8_blocks(x: np.ndarray) -> np.ndarray:
    """Q8_0 / Q8_1 activation rounding as seen by the weight: q * f16(d)."""
    q, _, d16 = quantize_q8_blocks(x)
    return (q * d16).reshape(x.shape)


def round_q8k_blocks(x: np.ndarray) -> np.ndarray:
    """Q8_K activation rounding: blocks of 256, scale from the signed max, f32 scale."""
    shape = x.shape
    b = x.reshape(-1, 256).astype(np.float32)
    idx = np.argmax(np.abs(b), axis=1)
    mx = b[np.arange(b.shape[0]), idx][:, None]
    iscale = np.divide(np.float32(-127.0), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.rint(b * iscale), 127.0)
    d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(shape)


def round_activations(x: np.ndarray, weight_type: str) -> np.ndarray:
    if weight_type in LEGACY_Q8_TYPES and x.shape[-1] % 32 == 0:
        return round_q8_blocks(x)
    if weight_type in K_Q8_TYPES and x.shape[-1] % 256 == 0:
        return round_q8k_blocks(x)
    if weight_type == "F16":
        return x.astype(np.float16).astype(np.float32)
    if weight_type == "BF16":
        u = x.astype(np.float32).view(np.uint32)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return u.view(np.float32)
    return x


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def gelu_tanh_f16_table(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU (GGML_GELU_FP16): f16(gelu_tanh(f16(x))) via a table, clamped outside +-10."""
    y = f16(gelu_tanh(f16(x)))
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y)).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float,
         neox: bool, pos_scale: float = 1.0, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotary embedding on x of shape (seq, heads, head_dim).

    "normal" (llama.cpp LLAMA_ROPE_TYPE_NORM): rotates adjacent pairs (x[2i], x[2i+1]).
    NeoX (LLAMA_ROPE_TYPE_NEOX, HF layout): rotates (x[i], x[i + n_rot/2]).
    Pair i uses angle pos * base^(-2i/n_rot) (divided by freq_factors[i] if given).
    Dimensions past n_rot are left untouched.
    """
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    angles = (positions.astype(np.float64) * pos_scale)[:, None] * inv_freq[None, :]  # (seq, half)
    cos = np.cos(angles)[:, None, :].astype(np.float32)  # (seq, 1, half)
    sin = np.sin(angles)[:, None, :].astype(np.float32)
    out = x.copy()
    if neox:
        a = x[..., :half]
        b = x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a = x[..., 0:n_rot:2]
        b = x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def rope_yarn(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float, factor: float,
              orig_ctx: int, beta_fast: float = 32.0, beta_slow: float = 1.0) -> np.ndarray:
    """NeoX rope with YaRN as llama.cpp applies it (ext_factor 1, attn_factor 1):
    pair i's angle blends pos*f_i (extrapolated) and pos*f_i/factor
    (interpolated) by a ramp that is 1 (all extrapolated) below the pair
    `low` and 0 past `high`, where the pair that turns `beta` times over
    the original context is n_rot*ln(orig/(2 pi beta))/(2 ln base); cos
    and sin are scaled by 1 + 0.1 ln(factor)."""
    half = n_rot // 2

    def corr(beta: float) -> float:
        return n_rot * math.log(orig_ctx / (beta * 2.0 * math.pi)) / (2.0 * math.log(base))

    low = max(0.0, math.floor(corr(beta_fast)))
    high = min(n_rot - 1.0, math.ceil(corr(beta_slow)))
    i = np.arange(half, dtype=np.float64)
    ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
    inv_freq = base ** (-i * 2.0 / n_rot)
    extrap = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    angles = extrap / factor * (1.0 - ramp) + extrap * ramp
    mscale = 1.0 + 0.1 * math.log(factor)
    cos = (np.cos(angles) * mscale)[:, None, :].astype(np.float32)
    sin = (np.sin(angles) * mscale)[:, None, :].astype(np.float32)
    out = x.copy()
    a, b = x[..., :half], x[..., half:n_rot]
    out[..., :half] = a * cos - b * sin
    out[..., half:n_rot] = a * sin + b * cos
    return out


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    g = np.minimum(g, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (np.clip(u, -limit, limit) + 1.0)


# --------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------

class Model:
    def __init__(self, path: str, emulate_ggml: bool = False):
        # --emulate-ggml switches on all three; synth_arch_check.py uses them separately
        self.emulate_ggml = emulate_ggml        # q8/f16 activation rounding before matmuls
        self.emulate_kv_f16 = emulate_ggml      # f16 KV cache (and f16 q / softmax probs)
        self.emulate_gelu_f16 = emulate_ggml    # ggml's f16 GELU lookup table
        self.reader = gguf.GGUFReader(path)
        self.cfg = read_config(self.reader)
        self.w = Weights(self.reader)
        self.freq_factors = self.w.opt("rope_freqs.weight")
        # KV cache: per layer, (positions, heads_kv, head_dim) arrays
        self.k_cache: list[np.ndarray | None] = [None] * self.cfg.n_layer
        self.v_cache: list[np.ndarray | None] = [None] * self.cfg.n_layer
        # qwen35 linear layers: per layer (conv state, delta-rule states)
        self.recurrent: list[tuple[np.ndarray, np.ndarray] | None] = [None] * self.cfg.n_layer
        self.n_past = 0

    def reset(self):
        self.k_cache = [None] * self.cfg.n_layer
        self.v_cache = [None] * self.cfg.n_layer
        self.recurrent = [None] * self.cfg.n_layer
        self.n_past = 0

    def linear(self, x: np.ndarray, name: str, bias_name: str | None = None) -> np.ndarray:
        b = self.w.opt(bias_name) if bias_name else None
        if not self.emulate_ggml:
            return linear(x, self.w.get(name), b)
        qtype = self.w.qtype(name)
        if qtype in ("Q4_1", "Q5_1") and x.shape[-1] % 32 == 0:
            # vec_dot_q4_1_q8_1: sum_b d_w*d_x*dot(q_w, q_x) + m_w * s_x, where the
            # block sum s_x = f16(d_x * sum(q_x)) is rounded separately.
            q, d, d16 = quantize_q8_blocks(x)
            qsum = q.sum(axis=-1)
            y = linear((q * d16).reshape(x.shape), self.w.get(name), b)
            s_err = (d[..., 0] * qsum).astype(np.float16).astype(np.float32) - d16[..., 0] * qsum
            return y + s_err @ self.w.block_mins(name).T
        return linear(round_activations(x, qtype), self.w.get(name), b)

    # ---- per layer properties ------------------------------------------
    def is_linear_layer(self, il: int) -> bool:
        c = self.cfg
        return c.arch in HYBRID_ARCHS and (il + 1) % c.full_attention_interval != 0

    def is_local_layer(self, il: int) -> bool:
        c = self.cfg
        if c.arch == "gpt-oss":  # llama.cpp's swa pattern: il % n < n - 1
            return c.swa_period == 0 or il % c.swa_period < c.swa_period - 1
        # gemma3: 5 sliding-window layers, then 1 global layer; gemma4: as the file says
        if c.arch == "gemma4":
            return c.sliding[il]
        return c.arch == "gemma3" and (il + 1) % 6 != 0

    def head_shape(self, il: int) -> tuple[int, int]:
        """(head_dim, kv heads) of layer il: gemma4's two kinds differ."""
        c = self.cfg
        if c.arch != "gemma4":
            return c.head_dim, c.n_head_kv
        hd = c.head_dim_swa if self.is_local_layer(il) else c.head_dim
        return hd, c.n_head_kv_layers[il]

    # ---- attention ------------------------------------------------------
    def attention(self, il: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        p = f"blk.{il}."
        seq = x.shape[0]
        hd, n_kv_heads = self.head_shape(il)
        q = self.linear(x, p + "attn_q.weight", p + "attn_q.bias")
        k = self.linear(x, p + "attn_k.weight", p + "attn_k.bias")
        if w.has(p + "attn_v.weight"):
            v = self.linear(x, p + "attn_v.weight", p + "attn_v.bias")
        else:  # gemma4's global layers: the values are the k projection
            v = k.copy()
        gate = None
        if c.arch in HYBRID_ARCHS:  # per head: the query, then its output gate
            qg = q.reshape(seq, c.n_head, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(seq, -1)
        q = q.reshape(seq, c.n_head, hd)
        k = k.reshape(seq, n_kv_heads, hd)
        v = v.reshape(seq, n_kv_heads, hd)

        if w.has(p + "attn_q_norm.weight"):  # qwen3 / gemma3: per-head RMSNorm
            q = rms_norm(q, w.get(p + "attn_q_norm.weight"), c.norm_eps)
            k = rms_norm(k, w.get(p + "attn_k_norm.weight"), c.norm_eps)
        if c.arch == "gemma4":  # values normed per head, without a weight
            v = rms_norm(v, np.float32(1.0), c.norm_eps)

        base = c.rope_base
        if self.is_local_layer(il):
            base = c.rope_base_local
        pos_scale = 1.0 / c.rope_scale
        if c.arch == "gemma3" and self.is_local_layer(il):
            pos_scale = 1.0  # linear scaling only applies to the global layers
        n_rot, factors = c.n_rot, self.freq_factors
        if c.arch == "gemma4":  # whole heads; the factors belong to the global layers
            n_rot = hd
            factors = None if self.is_local_layer(il) else self.freq_factors
        if c.yarn_factor > 0:
            q = rope_yarn(q, positions, n_rot, base, c.yarn_factor, c.yarn_orig_ctx)
            k = rope_yarn(k, positions, n_rot, base, c.yarn_factor, c.yarn_orig_ctx)
        else:
            q = rope(q, positions, n_rot, base, c.rope_neox, pos_scale, factors)
            k = rope(k, positions, n_rot, base, c.rope_neox, pos_scale, factors)

        if self.emulate_kv_f16:  # llama.cpp's default KV cache type is f16; q meets K as f16
            k, v, q = f16(k), f16(v), f16(q)
        # append to cache
        if self.k_cache[il] is None:
            self.k_cache[il], self.v_cache[il] = k, v
        else:
            self.k_cache[il] = np.concatenate([self.k_cache[il], k], axis=0)
            self.v_cache[il] = np.concatenate([self.v_cache[il], v], axis=0)
        K, V = self.k_cache[il], self.v_cache[il]
        n_kv = K.shape[0]
        kv_pos = np.arange(n_kv)

        # mask: causal (+ sliding window for gemma3 local layers)
        allowed = kv_pos[None, :] <= positions[:, None]
        if self.is_local_layer(il) and c.sliding_window > 0:
            allowed &= kv_pos[None, :] > positions[:, None] - c.sliding_window
        mask = np.where(allowed, 0.0, -np.inf).astype(np.float32)  # (seq, n_kv)

        scale = 1.0 / math.sqrt(c.head_dim)
        if c.arch == "gemma4":
            scale = 1.0  # q and k are normed; Gemma 4 does not scale the scores
        if c.arch == "gemma3" and c.n_layer == 62:
            # Gemma 3 27B: query_pre_attn_scalar = hidden / heads (168), not head_dim (128);
            # llama.cpp keys this on the layer count too
            scale = 1.0 / math.sqrt(c.n_embd / c.n_head)
        group = c.n_head // n_kv_heads
        sinks = w.opt(p + "attn_sinks.weight")
        out = np.empty((seq, c.n_head, hd), dtype=np.float32)
        for h in range(c.n_head):
            hk = h // group  # GQA: query head h reads kv head h // group
            scores = (q[:, h, :] @ K[:, hk, :].T) * scale + mask  # (seq, n_kv)
            if sinks is not None:  # one more logit in the denominator, weighting no value
                with_sink = np.concatenate([scores, np.full((seq, 1), sinks[h], np.float32)], axis=1)
                probs = softmax(with_sink)[:, :-1]
            else:
                probs = softmax(scores)
            if self.emulate_kv_f16:
                probs = f16(probs)  # kq meets the f16 V cache as f16
            out[:, h, :] = probs @ V[:, hk, :]
        out = out.reshape(seq, c.n_head * hd)
        if gate is not None:
            out = out * sigmoid(gate)
        return self.linear(out, p + "attn_output.weight", p + "attn_output.bias")

    # ---- qwen35 linear attention (gated delta rule) ----------------------------
    def linear_attention(self, il: int, x: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        p = f"blk.{il}."
        seq = x.shape[0]
        d, kh, vh, taps = c.ssm_state, c.ssm_groups, c.ssm_value_heads, c.ssm_conv_kernel
        qkv = self.linear(x, p + "attn_qkv.weight")          # (seq, channels)
        z = self.linear(x, p + "attn_gate.weight")           # (seq, vh * d)
        beta = sigmoid(self.linear(x, p + "ssm_beta.weight"))  # (seq, vh)
        alpha = self.linear(x, p + "ssm_alpha.weight")
        g = w.get(p + "ssm_a") * softplus(alpha + w.get(p + "ssm_dt.bias"))
        conv_w = w.get(p + "ssm_conv1d.weight")              # (channels, taps)
        if self.recurrent[il] is None:
            self.recurrent[il] = (np.zeros((taps - 1, qkv.shape[1]), np.float32),
                                  np.zeros((vh, d, d), np.float64))
        conv_state, S = self.recurrent[il]
        window = np.concatenate([conv_state, qkv], axis=0)   # (taps - 1 + seq, channels)
        conv = np.stack([(window[t:t + taps] * conv_w.T).sum(axis=0) for t in range(seq)])
        conv = silu(conv)
        conv_state = window[window.shape[0] - (taps - 1):]
        q = conv[:, : kh * d].reshape(seq, kh, d).astype(np.float64)
        k = conv[:, kh * d: 2 * kh * d].reshape(seq, kh, d).astype(np.float64)
        v = conv[:, 2 * kh * d:].reshape(seq, vh, d).astype(np.float64)
        q = q / np.sqrt((q * q).sum(axis=-1, keepdims=True) + c.norm_eps)
        k = k / np.sqrt((k * k).sum(axis=-1, keepdims=True) + c.norm_eps)
        out = np.empty((seq, vh, d), np.float64)
        for t in range(seq):
            for h in range(vh):
                src = h % kh  # llama.cpp repeats the key heads over the value heads
                S[h] *= math.exp(g[t, h])
                delta = (v[t, h] - S[h] @ k[t, src]) * beta[t, h]
                S[h] += np.outer(delta, k[t, src])
                out[t, h] = S[h] @ q[t, src] / math.sqrt(d)
        self.recurrent[il] = (conv_state, S)
        o = rms_norm(out.astype(np.float32), w.get(p + "ssm_norm.weight"), c.norm_eps)
        o = (o * silu(z.reshape(seq, vh, d))).reshape(seq, vh * d)
        return self.linear(o, p + "ssm_out.weight")

    # ---- feed forward -----------------------------------------------------
    def ffn(self, il: int, x: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        p = f"blk.{il}."
        if c.arch in MOE_ARCHS:
            return self.moe(il, x)
        gate = self.linear(x, p + "ffn_gate.weight")
        up = self.linear(x, p + "ffn_up.weight")
        if c.arch in ("gemma3", "gemma4"):
            act = gelu_tanh_f16_table(gate) if self.emulate_gelu_f16 else gelu_tanh(gate)
        else:
            act = silu(gate)
        return self.linear(act * up, p + "ffn_down.weight")

    def moe(self, il: int, x: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        p = f"blk.{il}."
        router_logits = self.linear(x, p + "ffn_gate_inp.weight", p + "ffn_gate_inp.bias")
        if c.arch == "gpt-oss":
            return self.moe_gpt_oss(il, x, router_logits)
        probs = softmax(router_logits)
        # expert tensors are stacked: (n_expert, out, in)
        gate_e = w.get(p + "ffn_gate_exps.weight")
        up_e = w.get(p + "ffn_up_exps.weight")
        down_e = w.get(p + "ffn_down_exps.weight")
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            top = np.argsort(-probs[t], kind="stable")[: c.n_expert_used]
            weights = probs[t, top]
            if c.norm_topk_prob:
                weights = weights / weights.sum()
            for e, g in zip(top, weights):
                h = silu(gate_e[e] @ x[t]) * (up_e[e] @ x[t])
                out[t] += g * (down_e[e] @ h)
        if w.has(p + "ffn_gate_inp_shexp.weight"):  # qwen35moe's shared expert
            shared = self.linear(silu(self.linear(x, p + "ffn_gate_shexp.weight"))
                                 * self.linear(x, p + "ffn_up_shexp.weight"), p + "ffn_down_shexp.weight")
            gate = sigmoid(x @ w.get(p + "ffn_gate_inp_shexp.weight"))  # (seq,)
            out = out + gate[:, None] * shared
        return out

    def moe_gpt_oss(self, il: int, x: np.ndarray, logits: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        p = f"blk.{il}."
        gate_e, up_e, down_e = (w.get(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        gate_b, up_b, down_b = (w.get(p + f"ffn_{n}_exps.bias") for n in ("gate", "up", "down"))
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            top = np.argsort(-logits[t], kind="stable")[: c.n_expert_used]
            weights = softmax(logits[t, top].astype(np.float64))
            # --emulate-ggml: the experts' inputs rounded as their weight type pairs
            xt = round_activations(x[t], w.qtype(p + "ffn_up_exps.weight")) if self.emulate_ggml else x[t]
            for e, g in zip(top, weights):
                h = swiglu_oai(gate_e[e] @ xt + gate_b[e], up_e[e] @ xt + up_b[e])
                if self.emulate_ggml:
                    h = round_activations(h, w.qtype(p + "ffn_down_exps.weight"))
                out[t] += np.float32(g) * (down_e[e] @ h + down_b[e])
        return out

    # ---- full step ------------------------------------------------------------
    def forward(self, tokens: list[int], all_positions: bool = False) -> np.ndarray:
        """Runs `tokens` after the cached prefix; returns logits (last or all positions)."""
        c, w = self.cfg, self.w
        positions = np.arange(self.n_past, self.n_past + len(tokens))
        x = w.get("token_embd.weight")[np.asarray(tokens)]
        if c.arch in ("gemma3", "gemma4"):
            x = x * np.float32(math.sqrt(c.n_embd))
        for il in range(c.n_layer):
            p = f"blk.{il}."
            h = rms_norm(x, w.get(p + "attn_norm.weight"), c.norm_eps)
            if c.arch == "gpt-oss":  # the pre-FFN norm is stored as post_attention_norm
                x = x + self.attention(il, h, positions)
                h = rms_norm(x, w.get(p + "post_attention_norm.weight"), c.norm_eps)
                x = x + self.ffn(il, h)
                continue
            if c.arch in HYBRID_ARCHS:
                h = self.linear_attention(il, h) if self.is_linear_layer(il) else self.attention(il, h, positions)
                x = x + h
                h = rms_norm(x, w.get(p + "post_attention_norm.weight"), c.norm_eps)
                x = x + self.ffn(il, h)
                continue
            h = self.attention(il, h, positions)
            if w.has(p + "post_attention_norm.weight"):
                h = rms_norm(h, w.get(p + "post_attention_norm.weight"), c.norm_eps)
            x = x + h
            h = rms_norm(x, w.get(p + "ffn_norm.weight"), c.norm_eps)
            h = self.ffn(il, h)
            if w.has(p + "post_ffw_norm.weight"):
                h = rms_norm(h, w.get(p + "post_ffw_norm.weight"), c.norm_eps)
            x = x + h
            if w.has(p + "layer_output_scale.weight"):  # gemma4
                x = x * w.get(p + "layer_output_scale.weight")
        self.n_past += len(tokens)
        if not all_positions:
            x = x[-1:]
        x = rms_norm(x, w.get("output_norm.weight"), c.norm_eps)
        out_name = "output.weight" if w.has("output.weight") else "token_embd.weight"
        logits = self.linear(x, out_name)
        if c.softcap:
            logits = c.softcap * np.tanh(logits / c.softcap)
        return logits.astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="GGUF file")
    ap.add_argument("--tokens", required=True, help="JSON list of token ids (or @file)")
    ap.add_argument("--all-positions", action="store_true", help="emit logits of every position")
    ap.add_argument("--generate", type=int, default=0, help="also greedily generate N tokens")
    ap.add_argument("--no-logits", action="store_true", help="omit the logits arrays (argmax only)")
    ap.add_argument("--top", type=int, default=0, help="also report the top-N (id, logit) pairs")
    ap.add_argument("--emulate-ggml", action="store_true",
                    help="round activations like ggml's CPU matmuls (q8 / f16) and keep an f16 KV cache")
    ap.add_argument("--out", help="write JSON here instead of stdout")
    args = ap.parse_args()

    text = open(args.tokens[1:]).read() if args.tokens.startswith("@") else args.tokens
    tokens = [int(t) for t in json.loads(text)]
    if not tokens:
        sys.exit("need at least one token")

    model = Model(args.model, emulate_ggml=args.emulate_ggml)
    logits = model.forward(tokens, all_positions=args.all_positions)
    result: dict = {"model": args.model, "arch": model.cfg.arch, "emulate_ggml": args.emulate_ggml,
                    "tokens": tokens}
    if args.all_positions:
        result["argmax"] = [int(i) for i in np.argmax(logits, axis=-1)]
        if not args.no_logits:
            result["logits"] = [[float(v) for v in row] for row in logits]
    else:
        result["argmax"] = int(np.argmax(logits[-1]))
        if not args.no_logits:
            result["logits"] = [float(v) for v in logits[-1]]
    if args.top:
        last = logits[-1]
        top = np.argsort(-last, kind="stable")[: args.top]
        result["top"] = [[int(i), float(last[i])] for i in top]

    if args.generate:
        generated = []
        nxt = int(np.argmax(logits[-1]))
        for _ in range(args.generate):
            generated.append(nxt)
            nxt = int(np.argmax(model.forward([nxt])[-1]))
        result["generated"] = generated

    data = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(data + "\n")
    else:
        print(data)


if __name__ == "__main__":
    main()
