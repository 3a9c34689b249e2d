// Decode attention on tensor cores: attention_decode_mma_64 and
// attention_decode_mma_128 (f16 cache, GQA groups of up to ATT_DEC_GROUP
// query heads), writing the split kernels' partials or output. Launched
// from src/cuda/attention.rs.

#include "attention_common.cuh"
#include "common.cuh"

// Decode attention on tensor cores (f16 cache, equal key and value dims D
// of 64 or 128, GQA groups of up to ATT_DEC_GROUP query heads): one block of
// ATT_MMA_WARPS warps per (row, KV head, split of the key range), as
// attention_split with the whole group, writing the same partials (or the
// output). Each warp takes every ATT_MMA_WARPS-th tile of 32 keys of the
// split with a softmax of its own; the warps merge at the end. S = Q K^T
// has the group's heads as A's rows (rows from the group on are zero) and
// 8 keys a column tile; O^T = V^T P^T has 16 value dims a row tile and the
// heads as columns, so S's accumulators are P^T's B fragments as they lie.
// K and V go from the cache into fragments directly, 16 bytes a load: a
// lane's K loads are runs of 8 dims (a K step's dims permuted, the same in
// Q: a dot product does not mind), its V loads a run of D / 8 dims of one
// key, paired with the next key's by byte permutes (the value dims
// permuted, undone as the output is written). The split kernels spent ~6
// us a warp on a run of 32 keys at 4,096 keys on the H200 (dots and sums on
// the CUDA cores, a latency chain); a tile here is ~250 instructions.
// P goes in as an f16 head and an f16 remainder, as in attention_mma.
// ATT_DEC_GROUP and ATT_MMA_WARPS come from fathom_abi.h.

// Where key p's K or V head row comes from: the cache (below the
// sequence's start), the step's own row (from there on: `own`, in shared
// memory with a fused rope, else the projection's f32 row), or nowhere
// (zeros: past the block's last key).
struct AttDecRow {
  const uint8_t* cache;
  const float* own;
};
__device__ __forceinline__ AttDecRow att_dec_row(const KvDesc& kv, const StepDesc& st, int seq, int p, int hi,
                                                 int start, bool is_v, int g, int hbytes, const float* own) {
  AttDecRow a = {nullptr, nullptr};
  if (p > hi) return a;
  if (p >= start) {
    a.own = own;
    return a;
  }
  int slot;
  const unsigned long long b = kv_block(kv, st, seq, p, &slot);
  const unsigned long long at =
      is_v ? (unsigned long long)KV_BLOCK_TOKENS * kv.k_row + (unsigned long long)slot * kv.v_row
           : (unsigned long long)slot * kv.k_row;
  a.cache = kv.base + b + at + (unsigned long long)g * hbytes;
  return a;
}

// 8 f16 values of such a row from dim d, as 16 bytes.
__device__ __forceinline__ uint4 att_dec_load(const AttDecRow& a, int d) {
  if (a.cache) return *(const uint4*)(a.cache + 2 * d);
  if (!a.own) return make_uint4(0u, 0u, 0u, 0u);
  const float4 x = *(const float4*)(a.own + d), y = *(const float4*)(a.own + d + 4);
  return make_uint4(half2_bits(x.x, x.y), half2_bits(x.z, x.w), half2_bits(y.x, y.y), half2_bits(y.z, y.w));
}

template <int D>
__device__ void attention_decode_mma_body(StepDesc st, KvDesc kv, const float* __restrict__ q,
                                          const float* __restrict__ k, const float* __restrict__ v,
                                          float* __restrict__ out, float* __restrict__ part, uint8_t* x8, int n_heads,
                                          int n_kv_heads, int window, float scale, const RopeAngles* rope, int neox,
                                          const float* sinks) {
  constexpr int G = ATT_DEC_GROUP;
  constexpr int KW = D / 32;  // 16-byte K loads a lane a key (dims 32j + 8t)
  constexpr int VW = D / 64;  // 16-byte V loads a lane a key (dims (D / 8) r ..)
  constexpr int MT = D / 16;  // row tiles of O^T
  __shared__ __align__(16) float qs[G * D];
  __shared__ __align__(16) float own_k[D], own_v[D];
  __shared__ __align__(16) float wo[ATT_MMA_WARPS][G][D];
  __shared__ float wm[ATT_MMA_WARPS][G], wl[ATT_MMA_WARPS][G];
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, r = lane / 4, t = lane % 4;
  const int row = blockIdx.x, g = blockIdx.y, split = blockIdx.z, nsplit = gridDim.z;
  const int group = n_heads / n_kv_heads, h0 = g * group;
  const AttRange ar = att_range(st, window, row, split, nsplit);
  const int seq = ar.seq, start = ar.start, lo = ar.lo, hi = ar.hi, row0 = st.seq_row0[seq];
  att_ready_row<KV_F16, G>(st, kv, q, k, v, row, g, h0, group, n_heads, n_kv_heads, D, D, rope, neox, hi >= start,
                           split == 0, qs, D, own_k, own_v);
  __syncthreads();
  // Q as A fragments: K step (j, hh) pairs dims 32j + 8t + 4hh + {0, 1}
  // (a[0]) and + {2, 3} (a[2]); a[1] and a[3] (rows 8..15) are zero.
  unsigned aq[2 * KW][2];
#pragma unroll
  for (int j = 0; j < KW; j++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const float* p = qs + r * D + 32 * j + 8 * t + 4 * hh;
      aq[2 * j + hh][0] = half2_bits(p[0], p[1]);
      aq[2 * j + hh][1] = half2_bits(p[2], p[3]);
    }
  float o[MT][4], mx = -INFINITY, l = 0.0f;
#pragma unroll
  for (int m = 0; m < MT; m++) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.0f;
  const float sl2 = scale * 1.4426950408889634f;
  const int hb = kv_head_bytes(KV_F16, D);
  for (int base = lo + warp * ATT_MMA_KEYS; base <= hi; base += ATT_MMA_WARPS * ATT_MMA_KEYS) {
    // Every load of the tile first: K of key base + 8n + r, V of keys
    // base + 16kk + 2t + {0, 1, 8, 9}.
    uint4 kf[4][KW], vf[2][4][VW];
#pragma unroll
    for (int n = 0; n < 4; n++) {
      const int p = base + 8 * n + r;
      const AttDecRow a = att_dec_row(kv, st, seq, p, hi, start, false, g, hb,
                                      rope ? own_k : k + ((size_t)(row0 + p - start) * n_kv_heads + g) * D);
#pragma unroll
      for (int j = 0; j < KW; j++) kf[n][j] = att_dec_load(a, 32 * j + 8 * t);
    }
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int p = base + 16 * kk + 2 * t + (e & 1) + 8 * (e >> 1);
        const AttDecRow a = att_dec_row(kv, st, seq, p, hi, start, true, g, hb,
                                        rope ? own_v : v + ((size_t)(row0 + p - start) * n_kv_heads + g) * D);
#pragma unroll
        for (int i = 0; i < VW; i++) vf[kk][e][i] = att_dec_load(a, (D / 8) * r + 8 * i);
      }
    // S = Q K^T: 4 column tiles of 8 keys.
    float sc[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int j = 0; j < KW; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const unsigned a[4] = {aq[2 * j + hh][0], 0u, aq[2 * j + hh][1], 0u};
          mma_16816(sc[n], a, hh ? kf[n][j].z : kf[n][j].x, hh ? kf[n][j].w : kf[n][j].y);
        }
    }
    // Online softmax of head r (its 32 scores across the lanes of a quad).
    float tmax = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
      for (int jj = 0; jj < 2; jj++) {
        const float x = base + 8 * n + 2 * t + jj <= hi ? sc[n][jj] * sl2 : -INFINITY;
        sc[n][jj] = x;
        tmax = fmaxf(tmax, x);
      }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float mnew = fmaxf(mx, tmax);  // finite: key `base` is in range
    const float alpha = exp2f(mx - mnew);
    mx = mnew;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
      for (int jj = 0; jj < 2; jj++) {
        const float e = exp2f(sc[n][jj] - mnew);
        sc[n][jj] = e;
        sum += e;
      }
    l = l * alpha + sum;
    // O^T's columns are heads 2t and 2t + 1: their factors from lanes 8t
    // and 8t + 4.
    const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * t), a1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
    for (int m = 0; m < MT; m++) {
      o[m][0] *= a0;
      o[m][1] *= a1;
      o[m][2] *= a0;
      o[m][3] *= a1;
    }
    // O^T += V^T P^T, 16 keys a step: row tile m holds value dims
    // (D / 8) r + 2m (rows r) and + 1 (rows r + 8).
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      unsigned bh[2], bl[2];
      bh[0] = half2_split(sc[2 * kk][0], sc[2 * kk][1], &bl[0]);
      bh[1] = half2_split(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &bl[1]);
#pragma unroll
      for (int m = 0; m < MT; m++) {
        const unsigned* w0 = (const unsigned*)&vf[kk][0][m / 4];
        const unsigned* w1 = (const unsigned*)&vf[kk][1][m / 4];
        const unsigned* w2 = (const unsigned*)&vf[kk][2][m / 4];
        const unsigned* w3 = (const unsigned*)&vf[kk][3][m / 4];
        const unsigned a[4] = {__byte_perm(w0[m % 4], w1[m % 4], 0x5410), __byte_perm(w0[m % 4], w1[m % 4], 0x7632),
                               __byte_perm(w2[m % 4], w3[m % 4], 0x5410), __byte_perm(w2[m % 4], w3[m % 4], 0x7632)};
        mma_16816(o[m], a, bh[0], bh[1]);
        mma_16816(o[m], a, bl[0], bl[1]);
      }
    }
  }
  // Merge the warps (one that took no tile has m = -inf, l = 0, o = 0).
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t == 0) {
    wm[warp][r] = mx;
    wl[warp][r] = l;
  }
#pragma unroll
  for (int m = 0; m < MT; m++) {
    const int d = (D / 8) * r + 2 * m;
    wo[warp][2 * t][d] = o[m][0];
    wo[warp][2 * t + 1][d] = o[m][1];
    wo[warp][2 * t][d + 1] = o[m][2];
    wo[warp][2 * t + 1][d + 1] = o[m][3];
  }
  __syncthreads();
  att_write_merged<ATT_MMA_WARPS>(&wm[0][0], &wl[0][0], &wo[0][0][0], G, D, group, h0, row, n_heads, D, split,
                                  nsplit, out, part, x8, sinks);
}

// attention_decode_mma_<D>: the split kernels' arguments (key_dim and
// value_dim are D).
#define FATHOM_ATT_DECODE_MMA(D)                                                                              \
  extern "C" __global__ void __launch_bounds__(ATT_MMA_WARPS * 32) attention_decode_mma_##D(                \
      StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out, float* part,        \
      uint8_t* x8, int n_heads, int n_kv_heads, int key_dim, int value_dim, int window, float scale,          \
      AttRope rope, const float* sinks) {                                                                    \
    attention_prefetch<KV_F16>(st, kv, n_heads, n_kv_heads, D, D, window, ATT_DEC_GROUP,                    \
                               rope.fused ? RopeAngles::threads(D) : 0);                                    \
    __shared__ RopeAngles angles;                                                                            \
    if (rope.fused) angles.compute(st.row_pos[blockIdx.x], D, rope.ratio, rope.freqs, rope.yarn);            \
    FATHOM_PDL();                                                                                            \
    if (rope.fused) __syncthreads();                                                                         \
    attention_decode_mma_body<D>(st, kv, q, k, v, out, part, x8, n_heads, n_kv_heads, window, scale,         \
                                 rope.fused ? &angles : nullptr, rope.neox, sinks);                          \
  }
FATHOM_ATT_DECODE_MMA(64)
FATHOM_ATT_DECODE_MMA(128)
