// The general causal attention kernel `attention` (one block per row and
// query head, any KV dtype, head dims up to ATT_MAX_DIM), for what the
// split and tensor-core kernels do not take. Launched from
// src/cuda/attention.rs.

#include "attention_common.cuh"
#include "common.cuh"
#include "reduce.cuh"

// Causal attention, one block of ATT_WARPS warps per (row, query head).
// Each warp takes every ATT_WARPS-th run of 32 key positions: one position
// a lane (its full dot product with q from shared memory), then an
// online-softmax update of its own output, lanes split by value dims. The
// warps' (max, sum, output) states are merged at the end, with the head's
// sink logit (gpt-oss; `sinks` null for none) in the denominator. ATT_WARPS
// and ATT_MAX_DIM come from fathom_abi.h.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
attention(StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out,
          int n_heads, int n_kv_heads, int key_dim, int value_dim, int window, float scale,
          const float* sinks) { FATHOM_PDL();
  __shared__ float qs[ATT_MAX_DIM];
  __shared__ float part_acc[ATT_WARPS][ATT_MAX_DIM];
  __shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS];
  const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  const int g = h / (n_heads / n_kv_heads);
  const int seq = st.row_seq[row], pos = st.row_pos[row];
  const int start = st.seq_start[seq], row0 = st.seq_row0[seq];
  for (int i = threadIdx.x; i < key_dim; i += blockDim.x) qs[i] = q[((size_t)row * n_heads + h) * key_dim + i];
  __syncthreads();
  const int kh = kv_head_bytes(kv.dtype, key_dim), vh = kv_head_bytes(kv.dtype, value_dim);
  const int first = window > 0 ? max(0, pos + 1 - window) : 0;
  float m = -INFINITY, l = 0.0f;
  float acc[ATT_MAX_DIM / WARP];
#pragma unroll
  for (int j = 0; j < ATT_MAX_DIM / WARP; j++) acc[j] = 0.0f;
  for (int p0 = first + warp * WARP; p0 <= pos; p0 += ATT_WARPS * WARP) {
    const int p = p0 + lane;
    float s = -INFINITY;
    if (p <= pos) {
      float dot = 0.0f;
      if (p < start) {
        int slot;
        const unsigned long long base = kv_block(kv, st, seq, p, &slot);
        const uint8_t* head = kv.base + base + (unsigned long long)slot * kv.k_row + (unsigned long long)g * kh;
        for (int i = 0; i < key_dim; i++) dot += qs[i] * kv_load(head, i, kv.dtype);
      } else {
        const float* kr = k + ((size_t)(row0 + p - start) * n_kv_heads + g) * key_dim;
        for (int i = 0; i < key_dim; i++) dot += qs[i] * kr[i];
      }
      s = dot * scale;
    }
    const float bm = warp_max(s);
    const float mn = fmaxf(m, bm);
    const float rescale = expf(m - mn);  // m = -inf at first: 0
    const float e = (p <= pos) ? expf(s - mn) : 0.0f;
    l = l * rescale + warp_sum(e);
#pragma unroll
    for (int j = 0; j < ATT_MAX_DIM / WARP; j++) acc[j] *= rescale;
    const int n = min(WARP, pos - p0 + 1);
    for (int jj = 0; jj < n; jj++) {
      const float wgt = __shfl_sync(0xffffffffu, e, jj);
      const int pp = p0 + jj;
      if (pp < start) {
        int slot;
        const unsigned long long base = kv_block(kv, st, seq, pp, &slot);
        const uint8_t* head = kv.base + base + (unsigned long long)KV_BLOCK_TOKENS * kv.k_row +
                              (unsigned long long)slot * kv.v_row +
                              (unsigned long long)g * vh;
#pragma unroll
        for (int j = 0; j < ATT_MAX_DIM / WARP; j++) {
          const int i = lane + j * WARP;
          if (i < value_dim) acc[j] += wgt * kv_load(head, i, kv.dtype);
        }
      } else {
        const float* vr = v + ((size_t)(row0 + pp - start) * n_kv_heads + g) * value_dim;
#pragma unroll
        for (int j = 0; j < ATT_MAX_DIM / WARP; j++) {
          const int i = lane + j * WARP;
          if (i < value_dim) acc[j] += wgt * vr[i];
        }
      }
    }
    m = mn;
  }
  // Merge the warps: a warp that saw no position has m = -inf, l = 0.
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < ATT_MAX_DIM / WARP; j++) {
    const int i = lane + j * WARP;
    if (i < value_dim) part_acc[warp][i] = acc[j];
  }
  __syncthreads();
  float mt = -INFINITY;
#pragma unroll
  for (int w = 0; w < ATT_WARPS; w++) mt = fmaxf(mt, part_m[w]);
  float f[ATT_WARPS], lt = 0.0f;
#pragma unroll
  for (int w = 0; w < ATT_WARPS; w++) {
    f[w] = part_l[w] > 0.0f ? expf(part_m[w] - mt) : 0.0f;
    lt += part_l[w] * f[w];
  }
  if (sinks) lt += expf(sinks[h] - mt);
  const float inv = 1.0f / lt;
  float* o = out + ((size_t)row * n_heads + h) * value_dim;
  for (int i = threadIdx.x; i < value_dim; i += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) sum += part_acc[w][i] * f[w];
    o[i] = sum * inv;
  }
}
