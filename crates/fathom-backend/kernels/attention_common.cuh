// What the attention files and rope_kv.cu share: the step and KV cache
// descriptors (StepDesc, KvDesc), the KV cache's element loads, stores and
// rounding, the rope angles and a head made ready for attention
// (ready_head); the key range, KV prefetch, q rows and merged output of a
// split block (attention_split.cu and attention_decode_mma.cu); and the
// tensor-core helpers of attention_mma.cu and attention_decode_mma.cu.
// Their numbers (ATT_MAX_DIM, KV_BLOCK_TOKENS, ATT_MMA_WARPS, the KV_*
// dtypes, Q8_0's block layout) come from fathom_abi.h.

#pragma once

#include "common.cuh"
#include "mma.cuh"
#include "quant.cuh"
#include "reduce.cuh"

// ATT_MAX_DIM: the longest K, Q or V head (values) the attention kernels
// take: their head rows in shared memory (and RopeAngles' pairs) are this
// long.

// YaRN rope scaling (gpt-oss; `struct RopeYarn` in src/cuda/abi.rs), as
// llama.cpp's rope_yarn with ext_factor 1: pair i's angle blends p x freq
// (weight mix) and p x freq x freq_scale (weight 1 - mix), mix falling
// linearly from 1 at pair `low` to 0 at pair `high`; its cosine and sine
// are scaled by mscale. freq_scale 1 is plain rope, computed as without.
struct RopeYarn {
  float freq_scale, low, high, mscale;
};

// The cosine and sine of pair i's angle at position p for the pair's
// frequency freq (before the model's per-pair factors `freqs`, if any, and
// YaRN), the angle in f64 (at positions in the tens of thousands an f32
// angle is off by hundredths of a radian).
__device__ __forceinline__ void rope_sincos(double p, double freq, int i, const float* freqs,
                                            const RopeYarn& yarn, float* cf, float* sf) {
  if (freqs) freq /= (double)freqs[i];
  const bool scaled = yarn.freq_scale != 1.0f;
  if (scaled) {
    const double y = ((double)i - yarn.low) / fmax((double)yarn.high - yarn.low, 0.001);
    const double mix = 1.0 - fmin(fmax(y, 0.0), 1.0);
    freq *= (double)yarn.freq_scale * (1.0 - mix) + mix;
  }
  // Reduce to [-pi, pi] in f64, then the fast f32 sine (absolute error
  // ~1e-6 there): library sincos keeps a large-argument path in local memory.
  double angle = p * freq;
  angle -= 6.283185307179586 * rint(angle * 0.15915494309189535);
  __sincosf((float)angle, sf, cf);
  if (scaled) {
    *sf *= yarn.mscale;
    *cf *= yarn.mscale;
  }
}

// ---------------------------------------------------------------------------
// KV cache element access. A KV row of one head is `head_bytes` bytes.
// A q8_0 block is one warp's values (kv_round, kv_store), and kv_load
// finds value i's block and place by shifts and masks of 32.
static_assert(Q8_0_BLOCK_VALUES == WARP, "a q8_0 KV block is a warp's 32 values");
__device__ __forceinline__ float kv_load(const uint8_t* head, int i, int dtype) {
  switch (dtype) {
    case KV_F16: return __half2float(((const __half*)head)[i]);
    case KV_BF16: return bf16_bits(((const unsigned short*)head)[i]);
    case KV_F32: return ((const float*)head)[i];
    default: {
      const uint8_t* b = head + (i >> 5) * Q8_0_BLOCK_BYTES;
      return f16_at(b) * (float)(int8_t)b[2 + (i & 31)];
    }
  }
}

__device__ __forceinline__ int kv_head_bytes(int dtype, int dim) {
  return dtype == KV_F32 ? 4 * dim : dtype == KV_Q8_0 ? (dim / Q8_0_BLOCK_VALUES) * Q8_0_BLOCK_BYTES : 2 * dim;
}

// v rounded to a KV dtype's precision. For q8_0 the 32 lanes of the warp
// hold one block's 32 values (all lanes must call; a lane past the data
// passes 0, which leaves the block's max alone).
__device__ __forceinline__ float kv_round(float v, int dtype) {
  if (dtype == KV_Q8_0) {
    float d, id;
    q8_scale(warp_max(fabsf(v)), &d, &id);
    return __half2float(__float2half_rn(d)) * (float)(int8_t)(int)rintf(v * id);
  }
  if (dtype == KV_F16) return __half2float(__float2half_rn(v));
  if (dtype == KV_BF16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

// Step layout the host uploads before attention / kv_write: per row, its
// sequence index and position; per sequence, (start, tokens, first row);
// per sequence, `table_stride` block ids of the layer's group.
struct StepDesc {
  const int* row_seq;
  const int* row_pos;
  const int* seq_start;
  const int* seq_row0;
  const unsigned int* tables;
  int table_stride;
};

struct KvDesc {
  uint8_t* base;                 // the layer group's storage
  unsigned long long block_bytes;
  unsigned long long layer_off;  // l * KV_BLOCK_TOKENS * (k_row + v_row)
  int k_row, v_row;              // bytes of a whole K / V row (all kv heads)
  int ring;                      // positions a sliding window's ring holds, 0 for full
  int dtype;
};

// Byte offset of (block holding position p, this layer) in the group's
// storage; `slot` gets p's row within the block (KV_BLOCK_TOKENS rows a
// block: the K rows of its positions, then their V rows).
__device__ __forceinline__ unsigned long long kv_block(const KvDesc& kv, const StepDesc& st, int seq, int p,
                                                       int* slot) {
  const int rp = kv.ring ? p % kv.ring : p;
  *slot = rp % KV_BLOCK_TOKENS;
  const unsigned int blk = st.tables[(size_t)seq * st.table_stride + rp / KV_BLOCK_TOKENS];
  return (unsigned long long)blk * kv.block_bytes + kv.layer_off;
}

// Stores value i of a K or V cache row whose bytes start at dst, one thread
// a value: lanes past the row pass in_row = false, and for q8_0 every lane
// of the warp calls (a warp holds one 32-value block).
__device__ __forceinline__ void kv_store(uint8_t* dst, int i, float x, bool in_row, int dtype) {
  if (dtype == KV_Q8_0) {
    float d, id;
    q8_scale(warp_max(in_row ? fabsf(x) : 0.0f), &d, &id);
    if (!in_row) return;
    uint8_t* o = dst + (i / Q8_0_BLOCK_VALUES) * Q8_0_BLOCK_BYTES;
    // A 16-bit store (every q8_0 block starts on an even byte: block,
    // layer and row sizes are all even). With two byte stores of the f16
    // bits (`st.global.u8` of the .b16 register, then of it shifted) the
    // low byte read back as 0 on the H200 (nvcc 13.0, sm_90); the 16-bit
    // store was checked byte for byte (tests/conformance/cuda_only.rs, cuda_kv_bytes).
    if (i % Q8_0_BLOCK_VALUES == 0) *(unsigned short*)o = __half_as_ushort(__float2half_rn(d));
    o[2 + i % Q8_0_BLOCK_VALUES] = (uint8_t)(int8_t)(int)rintf(x * id);
  } else if (in_row) {
    if (dtype == KV_F16) ((__half*)dst)[i] = __float2half_rn(x);
    else if (dtype == KV_BF16) ((__nv_bfloat16*)dst)[i] = __float2bfloat16_rn(x);
    else ((float*)dst)[i] = x;
  }
}

// Bytes of (row's block, this layer) where the row's K (or V) row starts.
__device__ __forceinline__ uint8_t* kv_row_at(const KvDesc& kv, const StepDesc& st, int row, bool is_v) {
  int slot;
  const unsigned long long base = kv_block(kv, st, st.row_seq[row], st.row_pos[row], &slot);
  return kv.base + base +
         (is_v ? (unsigned long long)KV_BLOCK_TOKENS * kv.k_row + (unsigned long long)slot * kv.v_row
               : (unsigned long long)slot * kv.k_row);
}

// The rope angles (cosine, sine) of a head's dim / 2 pairs at one
// position, in shared memory: computed by the block before its wait (they
// read only the step's upload, copied before the step's first kernel), so
// they are off the step's latency chain; used by ready_head after it.
// Not inlined: one copy of the f64 angle code for the ~60 kernels using it.
struct RopeAngles {
  float c[ATT_MAX_DIM / 2], s[ATT_MAX_DIM / 2];
  // Pair i's frequency is ratio^i (ratio = theta^(-2 / dim), from the
  // host), by squaring: a few f64 multiplies where pow took ~2 us of a
  // decode step's attention block before its first key load (the block is
  // not resident before the kernel ahead of it ends at long contexts).
  __device__ __noinline__ void compute(int pos, int dim, double ratio, const float* freqs, RopeYarn yarn) {
    for (int i = threadIdx.x; i < dim / 2; i += blockDim.x) {
      double freq = 1.0, r = ratio;
      for (int e = i; e; e >>= 1) {
        if (e & 1) freq *= r;
        r *= r;
      }
      rope_sincos((double)pos, freq, i, freqs, yarn, &c[i], &s[i]);
    }
  }
  // Threads that compute: the ones past them are free to prefetch
  // meanwhile (whole warps; 0 where every thread computes).
  __device__ static int threads(int dim) {
    const int t = (dim / 2 + WARP - 1) / WARP * WARP;
    return t < (int)blockDim.x ? t : 0;
  }
};

// One head of `dim` values at x made ready for attention by a warp: roped
// (rope: the angles, for q and k heads; null for v; only the first `rot`
// values when rot > 0, the rest passing through: partial rope), then each
// value rounded to what the cache will hold (round) and left in hs (the
// warp's shared row), written to xo and stored in the cache at dst (each
// when given). rope_kv's work, and the fused decode attention's.
__device__ __forceinline__ void ready_head(const float* x, float* hs, int dim, const RopeAngles* rope, int neox,
                                           bool round, int dtype, float* xo, uint8_t* dst, int rot = 0) {
  const int lane = threadIdx.x % WARP;
  if (!rope) {
    for (int i = lane; i < dim; i += WARP) hs[i] = x[i];
  } else {
    const int r = rot > 0 ? rot : dim;
    for (int i = lane; i < r / 2; i += WARP) {
      const int a = neox ? i : 2 * i, b = neox ? i + r / 2 : 2 * i + 1;
      const float x0 = x[a], x1 = x[b], c = rope->c[i], sn = rope->s[i];
      hs[a] = x0 * c - x1 * sn;
      hs[b] = x0 * sn + x1 * c;
    }
    for (int i = r + lane; i < dim; i += WARP) hs[i] = x[i];
  }
  __syncwarp();
  for (int i0 = 0; i0 < dim; i0 += WARP) {  // the same trip count for every lane
    const int i = i0 + lane;
    const bool in = i < dim;
    const float val = in ? hs[i] : 0.0f;
    const float r = round ? kv_round(val, dtype) : val;
    if (in) {
      hs[i] = r;
      if (xo) xo[i] = r;
    }
    if (dst) kv_store(dst, i, r, in, dtype);
  }
  __syncwarp();
}

// A split attention block's row and keys: positions lo ..= hi of the row's
// sequence (runs of 32 from the window's first position, cut evenly among
// the splits).
struct AttRange {
  int seq, pos, start, lo, hi;
};
__device__ __forceinline__ AttRange att_range(const StepDesc& st, int window, int row, int split, int nsplit) {
  AttRange a;
  a.seq = st.row_seq[row];
  a.pos = st.row_pos[row];
  a.start = st.seq_start[a.seq];
  const int first = window > 0 ? max(0, a.pos + 1 - window) : 0;
  const int runs = (a.pos - first + 1 + WARP - 1) / WARP;
  const int per = (runs + nsplit - 1) / nsplit;
  a.lo = first + split * per * WARP;
  a.hi = min(a.pos, a.lo + per * WARP - 1);
  return a;
}

// Asks L2 for the lines of a `bytes`-long run at p.
__device__ __forceinline__ void prefetch_run(const uint8_t* p, int bytes) {
  for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)127; a < (uintptr_t)p + bytes; a += 128) prefetch_l2((const void*)a);
}

// Before its wait, a split attention block asks L2 for the cached K and V
// head rows it will read (positions below the sequence's start, written by
// earlier steps): at a short context a lane's loads of one key, one after
// another from DRAM, were most of the kernel's time. Off with the weight
// prefetch (fathom_prefetch_bytes = 0); not for value dims above 256 (VPL
// 16), whose kernels have no registers to spare for it. Threads from t0 on
// ask: those below compute the rope angles meanwhile (RopeAngles::threads),
// which at long contexts, where the block becomes resident only when the
// kernel ahead of it ends, start ~1-3 us sooner than after the page-table
// reads that the prefetch waits on.
template <int DT>
__device__ __forceinline__ void attention_prefetch(const StepDesc& st, const KvDesc& kv, int n_heads,
                                                   int n_kv_heads, int key_dim, int value_dim, int window, int h,
                                                   int t0) {
  if (fathom_prefetch_bytes == 0 || (int)threadIdx.x < t0) return;
  const int chunks = (n_heads / n_kv_heads + h - 1) / h, g = blockIdx.y / chunks;
  const AttRange ar = att_range(st, window, blockIdx.x, blockIdx.z, gridDim.z);
  const int kh = kv_head_bytes(DT, key_dim), vh = kv_head_bytes(DT, value_dim);
  for (int p = ar.lo + threadIdx.x - t0; p <= min(ar.hi, ar.start - 1); p += blockDim.x - t0) {
    int slot;
    const unsigned long long base = kv_block(kv, st, ar.seq, p, &slot);
    prefetch_run(kv.base + base + (unsigned long long)slot * kv.k_row + (unsigned long long)g * kh, kh);
    prefetch_run(kv.base + base + (unsigned long long)KV_BLOCK_TOKENS * kv.k_row + (unsigned long long)slot * kv.v_row +
                     (unsigned long long)g * vh,
                 vh);
  }
}

// The block's query heads h0 .. h0 + nq of the row as H rows of qs (a row
// every qstride floats; zeros from nq on) and, with rope (a decode step),
// what rope_kv would have done for them: q roped and rounded, and the
// row's own K and V head roped and rounded into own_k and own_v where the
// block's keys reach the row's position (`own`), stored in the cache by
// the one block of the KV head that `store`s. Without rope, q as rope_kv
// left it. A warp a head; key_dim a multiple of 8 (q as float4s).
template <int DT, int H>
__device__ __forceinline__ void att_ready_row(const StepDesc& st, const KvDesc& kv, const float* __restrict__ q,
                                              const float* __restrict__ k, const float* __restrict__ v, int row,
                                              int g, int h0, int nq, int n_heads, int n_kv_heads, int key_dim,
                                              int value_dim, const RopeAngles* rope, int neox, bool own, bool store,
                                              float* qs, int qstride, float* own_k, float* own_v) {
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
  if (rope) {
    for (int j = warp; j < H + 2; j += warps) {
      if (j < nq) {
        ready_head(q + ((size_t)row * n_heads + h0 + j) * key_dim, qs + j * qstride, key_dim, rope, neox,
                   DT == KV_F16, DT, nullptr, nullptr);
      } else if (j < H) {
        for (int i = lane; i < key_dim; i += WARP) qs[j * qstride + i] = 0.0f;
      } else if (own || store) {
        const bool is_v = j == H + 1;
        const int dim = is_v ? value_dim : key_dim;
        uint8_t* dst = store ? kv_row_at(kv, st, row, is_v) + g * kv_head_bytes(DT, dim) : nullptr;
        ready_head((is_v ? v : k) + ((size_t)row * n_kv_heads + g) * dim, is_v ? own_v : own_k, dim,
                   is_v ? nullptr : rope, neox, true, DT, nullptr, dst);
      }
    }
  } else {
    const int k4 = key_dim / 4;
    for (int i = threadIdx.x; i < H * k4; i += blockDim.x) {
      const int h = i / k4, d = 4 * (i % k4);
      *(float4*)(qs + h * qstride + d) =
          h < nq ? *(const float4*)(q + ((size_t)row * n_heads + h0 + h) * key_dim + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// The block's warps merged for query heads h0 .. h0 + nq of the row, and
// written: the output (with x8 — value_dim a multiple of 32 — also as int8
// activation blocks) when the row's keys are one piece, else the piece's
// (max, sum, unnormalized output) in the partials. Warp w's head h has its
// max at m[w * heads + h] and sum at l[w * heads + h] (-inf and 0 for a
// warp that saw no key) and its unnormalized output values from
// o + (w * heads + h) * stride, all in shared memory; maxima in log2 units.
// A whole row's output takes each head's sink logit (gpt-oss; `sinks` null
// for none) into its denominator; a piece leaves that to attention_merge.
template <int WARPS>
__device__ __forceinline__ void att_write_merged(const float* m, const float* l, const float* o, int heads,
                                                 int stride, int nq, int h0, int row, int n_heads, int value_dim,
                                                 int split, int nsplit, float* __restrict__ out,
                                                 float* __restrict__ part, uint8_t* x8, const float* sinks) {
  for (int h = 0; h < nq; h++) {
    float mt = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; w++) mt = fmaxf(mt, m[w * heads + h]);
    float f[WARPS], lt = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
      f[w] = l[w * heads + h] > 0.0f ? exp2f(m[w * heads + h] - mt) : 0.0f;
      lt += l[w * heads + h] * f[w];
    }
    const size_t hq = (size_t)row * n_heads + h0 + h;
    float* o_part = part + (hq * nsplit + split) * (value_dim + 2);
    if (nsplit > 1 && threadIdx.x == 0) {
      o_part[0] = mt;
      o_part[1] = lt;
    }
    if (nsplit > 1 && !(lt > 0.0f)) continue;
    if (nsplit == 1 && sinks) lt += exp2f(sinks[h0 + h] * 1.4426950408889634f - mt);
    const float inv = 1.0f / lt;
    for (int i = threadIdx.x; i < value_dim; i += blockDim.x) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; w++) sum += o[(w * heads + h) * stride + i] * f[w];
      if (nsplit > 1) {
        o_part[2 + i] = sum;
      } else {
        // Whole warps when x8 is asked for (value_dim a multiple of 32).
        out[hq * value_dim + i] = sum * inv;
        if (x8) x8_store(sum * inv, x8, (hq * value_dim + i) / WARP);
      }
    }
  }
}

// Rope of a fused decode step's attention (fused = 0: rope_kv ran).
struct AttRope {
  double ratio;  // theta^(-2 / key_dim): RopeAngles::compute
  const float* freqs;
  int neox;
  int fused;
  RopeYarn yarn;
};

// ---------------------------------------------------------------------------
// Tensor cores (attention_mma.cu, attention_decode_mma.cu): warps a block,
// keys a tile and f16 packing (mma.m16n8k16 itself: mma.cuh). The
// warps a block are ATT_MMA_WARPS (fathom_abi.h).

#define ATT_MMA_KEYS 32

// The f16 head of (lo, hi) as bits, and the f16 remainder in *rest.
__device__ __forceinline__ unsigned half2_split(float lo, float hi, unsigned* rest) {
  const __half2 h = __floats2half2_rn(lo, hi);
  const float2 back = __half22float2(h);
  *rest = half2_bits(lo - back.x, hi - back.y);
  return *(const unsigned*)&h;
}
