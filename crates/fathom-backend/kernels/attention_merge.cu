// attention_merge: the split attention kernels' partials (attention_split.cu,
// attention_decode_mma.cu) combined into the output. Launched from
// src/cuda/attention.rs.

#include "common.cuh"
#include "quant.cuh"
#include "reduce.cuh"

// Combines the splits of attention_split: one block per (row, query head);
// with x8 (value_dim a multiple of 32), the output also as int8 activation
// blocks for the one-token x8 matmul after it. The first warp reads every
// split's (max, sum) at once (up to ATT_MAX_SPLITS, ATT_MAX_SPLITS / 32 a
// lane) and leaves each split's weight in shared memory; then a thread a
// value dim sums the splits' outputs, their loads independent of one
// another. (Three loops over the splits, a load at a time, took ~10 us at
// 32 splits on the H200: longer than the split kernel's own work at 4,096
// keys.) The head's sink logit (gpt-oss; `sinks` null for none) joins the
// denominator. ATT_MAX_SPLITS comes from fathom_abi.h.
static_assert(ATT_MAX_SPLITS % WARP == 0, "attention_merge: whole lanes' worth of splits");
extern "C" __global__ void __launch_bounds__(128)
attention_merge(const float* part, int nsplit, int n_heads, int value_dim, float* out, uint8_t* x8,
                const float* sinks) { FATHOM_PDL();
  constexpr int PER_LANE = ATT_MAX_SPLITS / WARP;
  __shared__ float weight[ATT_MAX_SPLITS];
  __shared__ float inv_total;
  const int row = blockIdx.x, h = blockIdx.y, stride = value_dim + 2;
  const float* p = part + ((size_t)row * n_heads + h) * nsplit * stride;
  if (threadIdx.x < WARP) {
    // A split that saw no key wrote its max and sum (l = 0) but no output.
    float ms[PER_LANE], ls[PER_LANE], mt = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
      const int s = threadIdx.x + WARP * i;
      ls[i] = s < nsplit ? p[s * stride + 1] : 0.0f;
      ms[i] = ls[i] > 0.0f ? p[s * stride] : -INFINITY;
      mt = fmaxf(mt, ms[i]);
    }
    mt = warp_max(mt);  // finite: some split saw a key
    float lt = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
      const float f = ls[i] > 0.0f ? exp2f(ms[i] - mt) : 0.0f;
      lt += ls[i] * f;
      weight[threadIdx.x + WARP * i] = f;
    }
    lt = warp_sum(lt);
    if (sinks) lt += exp2f(sinks[h] * 1.4426950408889634f - mt);
    if (threadIdx.x == 0) inv_total = 1.0f / lt;
  }
  __syncthreads();
  const float inv = inv_total;
  float* o = out + ((size_t)row * n_heads + h) * value_dim;
  for (int i = threadIdx.x; i < value_dim; i += blockDim.x) {
    float sum = 0.0f;
#pragma unroll 8
    for (int s = 0; s < nsplit; s++) {
      const float f = weight[s];
      if (f > 0.0f) sum += p[s * stride + 2 + i] * f;
    }
    o[i] = sum * inv;
    if (x8) x8_store(sum * inv, x8, (((size_t)row * n_heads + h) * value_dim + i) / WARP);
  }
}
