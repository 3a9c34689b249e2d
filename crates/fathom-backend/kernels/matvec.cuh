// The matrix-vector body (`matvec`) that the one-token and few-token
// kernels (matvec.cu) and the routed MoE kernels (moe.cu) share.

#pragma once

#include "common.cuh"
#include "quant.cuh"
#include "reduce.cuh"

// ---------------------------------------------------------------------------
// Matrix-vector products for decode (1..MV_MAX_TOKENS rows of x): `split`
// warps (1, 2 or 4) per weight row, every lane a stride of 8-value chunks,
// all tokens at once so each weight byte is read once. A matrix of few rows
// takes more warps a row, so that enough loads are in flight to keep
// memory busy. GLU: the same over a gate and an up matrix of one shape and
// type at once, writing act(gate row) x (up row). MV_MAX_TOKENS and MV_WARPS
// (a block's warps) come from fathom_abi.h.

// step(c) for c = base + lane, + stride, .. below n: U calls at a
// time with no exit test between them, then one at a time. A loop unrolled
// by pragma keeps the exit test before each copy, and the compiler does not
// move a copy's loads above it (the SASS had one chunk's weight loads in
// flight per lane, whatever the unroll); in a group of U all U calls' loads
// go out before any is used. U should divide a lane's usual count (a row
// of 4,096 Q4_K values is 2 calls a lane; with groups of 4 and the calls
// past the row dropped, Q4_K decode took 10% longer).
template <int U, typename F>
__device__ __forceinline__ void strided(int base, int n, int stride, F step) {
  int c = base + threadIdx.x % WARP;
  if constexpr (U > 1) {
    for (; c + (U - 1) * stride < n; c += U * stride) {
#pragma unroll
      for (int u = 0; u < U; u++) step(c + u * stride);
    }
  }
#pragma unroll 1
  for (; c < n; c += stride) step(c);
}

// X8: x is quantize_x8's blocks (one token, HasX8<T> types only). bias and
// bias2 (rows of w and w2; null for none: the routed experts' biases) are
// added to the products before the activation.
template <int T, int NT, bool GLU, bool X8 = false>
__device__ void matvec(const Weights w, const Weights w2, const float* __restrict__ x,
                       float* __restrict__ out, int ntok, int split, int act, int block,
                       const float* bias = nullptr, const float* bias2 = nullptr) {
  __shared__ float parts[MV_WARPS][NT][GLU ? 2 : 1];
  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  const int r = block * (MV_WARPS / split) + warp / split, part = warp % split;
  float acc[NT], acc2[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = acc2[t] = 0.0f;
  // One token (the registers of more would spill): 32 values a chunk.
  if constexpr (X8) {
    static_assert(HasX8<T>::value && NT == 1, "x8: one token of Q8_0, Q4_0, Q4_K or Q6_K");
    constexpr int B = X8Task<T>::blocks;
    const uint8_t* x8 = (const uint8_t*)x;
    const int tasks = r < w.rows ? w.cols / (QK * B) : 0;
    strided<(GLU || T == T_Q4_K) ? 2 : 4>(part * WARP, tasks, WARP * split, [&](int c) {
      X8Block xb[B];
#pragma unroll
      for (int i = 0; i < B; i++) xb[i] = x8_block(x8, X8Task<T>::block(c, i));
      const float v = dot_x8<T>(w, r, c, xb), v2 = GLU ? dot_x8<T>(w2, r, c, xb) : 0.0f;
      acc[0] += v;
      if (GLU) acc2[0] += v2;
    });
  } else if constexpr (Chunk<T>::value && NT == 1) {
    const int chunks = r < w.rows ? w.cols / 32 : 0;
    strided<GLU ? 1 : 2>(part * WARP, chunks, WARP * split, [&](int c) {
      float q[32], d[4], m[4], q2[32], d2[4], m2[4];
      Chunk<T>::decode(w, r, c, q, d, m);
      if (GLU) Chunk<T>::decode(w2, r, c, q2, d2, m2);
      const float* xr = x + chunk_first(c);
      const float v = chunk_dot<T>(q, d, m, xr), v2 = GLU ? chunk_dot<T>(q2, d2, m2, xr) : 0.0f;
      acc[0] += v;
      if (GLU) acc2[0] += v2;
    });
  } else {
  const int chunks = r < w.rows ? w.cols / 8 : 0;
  // One token: four chunks a group, so that their loads are in flight
  // together (batch-1 decode is bound by how many weight bytes are on their
  // way from memory; with more tokens, their activations take the registers).
  strided<NT == 1 ? (GLU || T == T_F32 ? 2 : 4) : 1>(part * WARP, chunks, WARP * split, [&](int c) {
    float q[8], d, m, q2[8], d2 = 0.0f, m2 = 0.0f;
    decode8<T>(w, r, c, q, &d, &m);
    if (GLU) decode8<T>(w2, r, c, q2, &d2, &m2);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (t < ntok) {
        const float4* xp = (const float4*)(x + (size_t)t * w.cols + 8 * c);
        const float4 a = xp[0], b = xp[1];
        const float sum = (a.x + a.y) + (a.z + a.w) + (b.x + b.y) + (b.z + b.w);
        const float v = dot8<T>(q, d, m, a, b, sum), v2 = GLU ? dot8<T>(q2, d2, m2, a, b, sum) : 0.0f;
        acc[t] += v;
        if (GLU) acc2[t] += v2;
      }
    }
  });
  }
  // The biases, where given, of this row.
  const bool biased = bias && r < w.rows, biased2 = GLU && bias2 && r < w.rows;
  const float b = biased ? bias[r] : 0.0f, b2 = biased2 ? bias2[r] : 0.0f;
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const float s = warp_sum(acc[t]), s2 = GLU ? warp_sum(acc2[t]) : 0.0f;
    if (split == 1) {
      if (lane == 0 && t < ntok && r < w.rows) {
        const float v = biased ? s + b : s, v2 = biased2 ? s2 + b2 : s2;
        out[(size_t)t * w.rows + r] = GLU ? glu_value(v, v2, act) : v;
      }
    } else if (lane == 0) {
      parts[warp][t][0] = s;
      if (GLU) parts[warp][t][GLU ? 1 : 0] = s2;
    }
  }
  if (split == 1) return;
  __syncthreads();
  if (part == 0 && lane < ntok && r < w.rows) {
    float s = 0.0f, s2 = 0.0f;
    for (int k = 0; k < split; k++) {
      s += parts[warp + k][lane][0];
      if (GLU) s2 += parts[warp + k][lane][GLU ? 1 : 0];
    }
    if (biased) s += b;
    if (biased2) s2 += b2;
    out[(size_t)lane * w.rows + r] = GLU ? glu_value(s, s2, act) : s;
  }
}
