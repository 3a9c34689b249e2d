// Prefill attention on tensor cores: attention_mma_64 and attention_mma_128
// (f16 cache). Launched from src/cuda/attention.rs.

#include "attention_common.cuh"
#include "common.cuh"

// ---------------------------------------------------------------------------
// Prefill attention on tensor cores (f16 cache): a warp takes 16 queries —
// RT = 16 / GP rows of one sequence times GP query heads of one GQA group
// (the group padded to a power of two) — so that each K and V row staged in
// shared memory serves all of them, and both products run as
// mma.m16n8k16 (f16 in, f32 accumulate). Q, K and V hold f16 values already
// (rounded to the cache's precision), so Q·K is exact up to the order of the
// f32 sums; the softmax weights P are split into an f16 head and an f16
// remainder (two products with V) to keep about 22 bits, as the f32 paths do.
// A block is 4 warps over 4 × RT consecutive rows of one sequence; the grid
// walks each sequence's rows in such tiles (x) and the KV heads (y). Keys
// come in tiles of 32: below the sequence's start from the cache, from there
// on from the step's own k and v rows.

template <int D>
__device__ void attention_mma_body(StepDesc st, KvDesc kv, const float* __restrict__ q, const float* __restrict__ k,
                                   const float* __restrict__ v, float* __restrict__ out, int n_seqs, int rows,
                                   int n_heads, int n_kv_heads, int gp, int window, float scale,
                                   const float* sinks) {
  constexpr int STRIDE = D + 8;  // halves a staged row: 16 bytes of padding spread the banks
  __shared__ __align__(16) __half ks[ATT_MMA_KEYS * STRIDE];
  __shared__ __align__(16) __half vs[ATT_MMA_KEYS * STRIDE];
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  const int group = n_heads / n_kv_heads, g = blockIdx.y, rt = 16 / gp, br = ATT_MMA_WARPS * rt;
  // This block's sequence and tile.
  int seq = 0, tile = blockIdx.x, tokens = 0;
  for (; seq < n_seqs; seq++) {
    tokens = (seq + 1 < n_seqs ? st.seq_row0[seq + 1] : rows) - st.seq_row0[seq];
    const int tiles = (tokens + br - 1) / br;
    if (tile < tiles) break;
    tile -= tiles;
  }
  if (seq >= n_seqs) return;
  const int start = st.seq_start[seq], row0 = st.seq_row0[seq];
  const int t0 = tile * br;  // the block's first row within the sequence
  const int block_last = start + min(t0 + br, tokens) - 1;
  const int block_first = window > 0 ? max(0, start + t0 + 1 - window) : 0;
  // The two queries (fragment rows lane / 4 and lane / 4 + 8) this lane holds.
  int qpos[2], qrow[2], qhead[2];
  bool qok[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int m = lane / 4 + 8 * i, r = t0 + warp * rt + m / gp, gh = m % gp;
    qok[i] = r < tokens && gh < group;
    qpos[i] = start + r;
    qrow[i] = row0 + r;
    qhead[i] = g * group + gh;
  }
  const int warp_last = start + min(t0 + warp * rt + rt, tokens) - 1;
  const int warp_first = window > 0 ? max(0, start + t0 + warp * rt + 1 - window) : 0;
  // Q fragments (row-major A): D / 16 steps of depth.
  unsigned aq[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int i = j & 1, d = ks * 16 + (lane % 4) * 2 + (j >> 1) * 8;
      float2 x = make_float2(0.0f, 0.0f);
      if (qok[i]) x = *(const float2*)(q + ((size_t)qrow[i] * n_heads + qhead[i]) * D + d);
      aq[ks][j] = half2_bits(x.x, x.y);
    }
  }
  float o[D / 8][4], mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  const float sl2 = scale * 1.4426950408889634f;
  const int kh = kv_head_bytes(KV_F16, D);
  for (int base = block_first; base <= block_last; base += ATT_MMA_KEYS) {
    // Stage 32 keys' K and V rows as f16 (zeros past the range: a masked
    // weight of 0 must not meet a NaN).
    for (int c = threadIdx.x; c < ATT_MMA_KEYS * D / 8; c += blockDim.x) {
      const int key = c / (D / 8), part = c % (D / 8), p = base + key;
      uint4 kk = make_uint4(0u, 0u, 0u, 0u), vv = kk;
      if (p <= block_last) {
        if (p < start) {
          int slot;
          const unsigned long long b = kv_block(kv, st, seq, p, &slot);
          kk = *(const uint4*)(kv.base + b + (unsigned long long)slot * kv.k_row + (unsigned long long)g * kh + 16 * part);
          vv = *(const uint4*)(kv.base + b + (unsigned long long)KV_BLOCK_TOKENS * kv.k_row +
                               (unsigned long long)slot * kv.v_row +
                               (unsigned long long)g * kh + 16 * part);
        } else {
          const size_t r = ((size_t)(row0 + p - start) * n_kv_heads + g) * D + 8 * part;
          const float4 k0 = *(const float4*)(k + r), k1 = *(const float4*)(k + r + 4);
          const float4 v0 = *(const float4*)(v + r), v1 = *(const float4*)(v + r + 4);
          kk = make_uint4(half2_bits(k0.x, k0.y), half2_bits(k0.z, k0.w), half2_bits(k1.x, k1.y), half2_bits(k1.z, k1.w));
          vv = make_uint4(half2_bits(v0.x, v0.y), half2_bits(v0.z, v0.w), half2_bits(v1.x, v1.y), half2_bits(v1.z, v1.w));
        }
      }
      *(uint4*)(ks + key * STRIDE + 8 * part) = kk;
      *(uint4*)(vs + key * STRIDE + 8 * part) = vv;
    }
    __syncthreads();
    if (base <= warp_last && base + ATT_MMA_KEYS - 1 >= warp_first) {
      // S = Q K^T: 4 tiles of 8 keys.
      float sc[4][4];
#pragma unroll
      for (int n = 0; n < 4; n++) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        const __half* kr = ks + (n * 8 + lane / 4) * STRIDE + (lane % 4) * 2;
#pragma unroll
        for (int s2 = 0; s2 < D / 16; s2++)
          mma_16816(sc[n], aq[s2], *(const unsigned*)(kr + s2 * 16), *(const unsigned*)(kr + s2 * 16 + 8));
      }
      // Mask, scale to log2 units, online softmax per query (a query's 32
      // scores lie across the 4 lanes of a quad).
      float alpha[2];
#pragma unroll
      for (int i = 0; i < 2; i++) {
        float tmax = -INFINITY;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
          for (int j = 0; j < 2; j++) {
            const int p = base + n * 8 + (lane % 4) * 2 + j;
            const bool ok = qok[i] && p <= qpos[i] && (window <= 0 || p > qpos[i] - window);
            const float x = ok ? sc[n][2 * i + j] * sl2 : -INFINITY;
            sc[n][2 * i + j] = x;
            tmax = fmaxf(tmax, x);
          }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float mnew = fmaxf(mx[i], tmax);
        const float muse = mnew == -INFINITY ? 0.0f : mnew;
        alpha[i] = exp2f(mx[i] - muse);
        mx[i] = mnew;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
          for (int j = 0; j < 2; j++) {
            const float e = exp2f(sc[n][2 * i + j] - muse);
            sc[n][2 * i + j] = e;
            sum += e;
          }
        l[i] = l[i] * alpha[i] + sum;
      }
#pragma unroll
      for (int n = 0; n < D / 8; n++) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
      // O += P V, P as f16 head + remainder; V fragments by ldmatrix.trans.
#pragma unroll
      for (int kk2 = 0; kk2 < 2; kk2++) {
        unsigned ph[4], pl[4];
        ph[0] = half2_split(sc[2 * kk2][0], sc[2 * kk2][1], &pl[0]);
        ph[1] = half2_split(sc[2 * kk2][2], sc[2 * kk2][3], &pl[1]);
        ph[2] = half2_split(sc[2 * kk2 + 1][0], sc[2 * kk2 + 1][1], &pl[2]);
        ph[3] = half2_split(sc[2 * kk2 + 1][2], sc[2 * kk2 + 1][3], &pl[3]);
        const int mi = lane / 8, key = kk2 * 16 + (mi & 1) * 8 + lane % 8;
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          const __half* addr = vs + key * STRIDE + (n + (mi >> 1)) * 8;
          unsigned b[4];
          const unsigned sa = (unsigned)__cvta_generic_to_shared(addr);
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                       : "r"(sa));
          mma_16816(o[n], ph, b[0], b[1]);
          mma_16816(o[n], pl, b[0], b[1]);
          mma_16816(o[n + 1], ph, b[2], b[3]);
          mma_16816(o[n + 1], pl, b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float lt = l[i];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (!qok[i]) continue;
    // The head's sink logit (gpt-oss; null for none) joins the denominator.
    if (sinks) lt += exp2f(sinks[qhead[i]] * 1.4426950408889634f - mx[i]);
    const float inv = 1.0f / lt;
    float* orow = out + ((size_t)qrow[i] * n_heads + qhead[i]) * D + (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < D / 8; n++) *(float2*)(orow + n * 8) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
  }
}

#define FATHOM_ATT_MMA(D)                                                                                  \
  extern "C" __global__ void __launch_bounds__(ATT_MMA_WARPS * 32) attention_mma_##D(                    \
      StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out, int n_seqs,     \
      int rows, int n_heads, int n_kv_heads, int gp, int window, float scale, const float* sinks) {       \
    FATHOM_PDL();                                                                                          \
    attention_mma_body<D>(st, kv, q, k, v, out, n_seqs, rows, n_heads, n_kv_heads, gp, window, scale, sinks); \
  }
FATHOM_ATT_MMA(64)
FATHOM_ATT_MMA(128)
