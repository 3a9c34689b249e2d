// Matrix products of 2 to MQ_MAX_TOKENS tokens straight from the stored
// weight blocks on tensor cores: mq16_<NAME> (up to 16 tokens) for every
// type but f32, and mq64_<NAME> (up to 64) for Q4_K, Q5_K and Q6_K.
// Launched from src/cuda/matvec.rs, which sends f16 and bf16 only up to 8
// tokens (beyond, cuBLAS reads them as stored) and the other types beyond
// 16 tokens to cuBLAS on dequantized f16, which measured faster there
// (H100, 14336x4096 at 32 and 64 tokens: Q8_0 110 against 166 us, Q4_0 101
// against 122) than this kernel's 8-value path.
//
// Why: a decode step of a few sequences, or a short prefill, reads every
// weight once whatever its token count, so it should cost about what one
// token costs. The f32 few-token kernel re-read each token's activations
// per weight row (a Q4_K step of 8 tokens took 15x one token's), and
// dequantizing to f16 for cuBLAS writes and reads back an f16 copy of the
// whole matrix (a 16-token Q4_K step cost 2.3x the F16 one although it
// reads a quarter of the bytes). Here each lane decodes its weights into
// registers as the A operand of mma.m16n8k16, against the tokens'
// activations in f16 (the cuBLAS path's precision), with f32 sums.
//
// A warp takes 16 weight rows. The product is a sum over the depth, so any
// order of it serves if A and B agree, and the order here gives each lane
// whole runs of 8 values: in a step lane (g, t) (g = lane / 4, t = lane %
// 4) decodes a run of 8 of rows g and g + 8 whose values 4j + {0, 1, 2, 3}
// are the lane's depth positions {2t, 2t + 1, 2t + 8, 2t + 9} of mma j
// (j = 0, 1), and a token's 8 activations at the same place are one
// 16-byte load of B. Most types step 32 values, lane t taking values 8t ..
// 8t + 7 (load8); the K-quants step 128, lane t taking a 32-value chunk
// (Chunk<T>: four runs of 8, 32 apart) with its block's scales read once.
//
// A block is MQ_WARPS warps: 16 x MQ_WARPS / kgroups rows, each row's
// depth split between kgroups warps (interleaved steps, summed in shared
// memory in a fixed order: the result does not depend on timing). Four
// warps a row (16 rows a block) measured fastest at every token count and
// type tried: more blocks, more loads in flight.

#include "common.cuh"
#include "mma.cuh"
#include "quant.cuh"
#include "reduce.cuh"

// Rows of weights one warp takes.
#define MQ_ROWS 16

// The eight values a lane holds of rows g and g + 8 at one step (f32, as
// d x q + m) against the tokens' 8 activations from `xl` (this lane's
// first value of token 0's row; `cols` apart): two mma of 16 depth positions.
template <int NT8>
__device__ __forceinline__ void mma_step8(float (&c)[NT8][4], const float* qa, const float* qb,
                                          const __half* xl, int cols, int ntok, int g) {
  unsigned a0[4], a1[4];
  a0[0] = half2_bits(qa[0], qa[1]);
  a0[1] = half2_bits(qb[0], qb[1]);
  a0[2] = half2_bits(qa[2], qa[3]);
  a0[3] = half2_bits(qb[2], qb[3]);
  a1[0] = half2_bits(qa[4], qa[5]);
  a1[1] = half2_bits(qb[4], qb[5]);
  a1[2] = half2_bits(qa[6], qa[7]);
  a1[3] = half2_bits(qb[6], qb[7]);
#pragma unroll
  for (int nt = 0; nt < NT8; nt++) {
    const int n = 8 * nt + g;
    const uint4 b = n < ntok ? __ldg((const uint4*)(xl + (size_t)n * cols)) : make_uint4(0, 0, 0, 0);
    mma_16816(c[nt], a0, b.x, b.y);
    mma_16816(c[nt], a1, b.z, b.w);
  }
}

template <int T, int NT8>
__device__ void matmul_mma(const Weights w, const __half* __restrict__ x16, const float* __restrict__ unscale,
                           float* __restrict__ out, int ntok, int kgroups) {
  __shared__ float parts[MQ_WARPS][NT8 * 4][WARP];
  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  const int g = lane >> 2, t = lane & 3;
  const int kg = warp % kgroups;
  const int r0 = (blockIdx.x * (MQ_WARPS / kgroups) + warp / kgroups) * MQ_ROWS;
  // Rows past the matrix read its last row (their sums are not written).
  const int ra = min(r0 + g, w.rows - 1), rb = min(r0 + g + 8, w.rows - 1);
  float c[NT8][4];
#pragma unroll
  for (int n = 0; n < NT8; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
  if constexpr (Chunk<T>::value) {
    // K-quants: steps of 128 values, lane t decoding 32-value chunk
    // 4s + t (Chunk<T>: its four groups of 8 sit 32 apart, from
    // chunk_first = 128 s + 8 t), its scales read once for all 32; the
    // four lanes of a row read side by side, as do their activations.
    const int steps = w.cols / 128;
    for (int s = kg; s < steps; s += kgroups) {
      float qa[32], qb[32], da[4], ma[4], db[4], mb[4];
      Chunk<T>::decode(w, ra, 4 * s + t, qa, da, ma);
      Chunk<T>::decode(w, rb, 4 * s + t, qb, db, mb);
#pragma unroll
      for (int q = 0; q < 4; q++) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
          qa[8 * q + e] = da[q] * qa[8 * q + e] + ma[q];
          qb[8 * q + e] = db[q] * qb[8 * q + e] + mb[q];
        }
        mma_step8<NT8>(c, qa + 8 * q, qb + 8 * q, x16 + 128 * s + 32 * q + 8 * t, w.cols, ntok, g);
      }
    }
  } else {
    // Steps of 32 values, lane t decoding chunk 4s + t (values 8t ..
    // 8t + 7 of the step). U steps decoded before their products, so that
    // their loads are in flight together.
    constexpr int U = NT8 <= 2 ? 4 : 2;
    const int steps = w.cols / 32;
    int s = kg;
    for (; s + (U - 1) * kgroups < steps; s += U * kgroups) {
      float qa[U][8], qb[U][8];
#pragma unroll
      for (int u = 0; u < U; u++) {
        load8<T>(w, ra, 4 * (s + u * kgroups) + t, qa[u]);
        load8<T>(w, rb, 4 * (s + u * kgroups) + t, qb[u]);
      }
#pragma unroll
      for (int u = 0; u < U; u++)
        mma_step8<NT8>(c, qa[u], qb[u], x16 + 32 * (s + u * kgroups) + 8 * t, w.cols, ntok, g);
    }
#pragma unroll 1
    for (; s < steps; s += kgroups) {
      float qa[8], qb[8];
      load8<T>(w, ra, 4 * s + t, qa);
      load8<T>(w, rb, 4 * s + t, qb);
      mma_step8<NT8>(c, qa, qb, x16 + 32 * s + 8 * t, w.cols, ntok, g);
    }
  }
  if (kgroups > 1) {
    if (kg != 0) {
#pragma unroll
      for (int nt = 0; nt < NT8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) parts[warp][4 * nt + e][lane] = c[nt][e];
    }
    __syncthreads();
    if (kg != 0) return;
    for (int k = 1; k < kgroups; k++)
#pragma unroll
      for (int nt = 0; nt < NT8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) c[nt][e] += parts[warp + k][4 * nt + e][lane];
  }
#pragma unroll
  for (int nt = 0; nt < NT8; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int tok = 8 * nt + 2 * t + (e & 1), r = r0 + g + 8 * (e >> 1);
      if (tok < ntok && r < w.rows) out[(size_t)tok * w.rows + r] = c[nt][e] * unscale[tok];
    }
}

// One row of activations for the tensor-core products: `cols` values from
// xr as f16 into o, times a power of two that brings the row's largest
// |value| to at most 2^15 (1 for every row already there: then exactly
// to_half's), and the power's inverse into *unscale, which the product's
// outputs are multiplied by. f16 ends at 65,504: a row past it (a large FFN
// activation) would otherwise turn into infinities, which cuBLAS's f16 path
// still risks. A block of 256 threads a row; each thread reads the values
// it would write, so a caller may have just written them.
__device__ __forceinline__ void half_row(const float* xr, int cols, __half* o, float* unscale) {
  __shared__ float maxes[8];
  float m = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
  m = warp_max(m);
  if (threadIdx.x % WARP == 0) maxes[threadIdx.x / WARP] = m;
  __syncthreads();
  m = maxes[0];
#pragma unroll
  for (int k = 1; k < 8; k++) m = fmaxf(m, maxes[k]);
  // 2^-e with e the smallest that brings m to 2^15 or below (frexp: m =
  // f 2^x, f in [0.5, 1)); non-finite rows stay unscaled (they are
  // non-finite either way).
  int x2 = 0;
  frexpf(m, &x2);
  const int e = isfinite(m) ? max(x2 - 15, 0) : 0;
  const float scale = ldexpf(1.0f, -e);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = __float2half_rn(xr[i] * scale);
  if (threadIdx.x == 0) *unscale = ldexpf(1.0f, e);
}

// The tokens' activations for mq<N>_*: row r of x (cols values) through
// half_row into row r of out and unscale[r]. A block a row.
extern "C" __global__ void __launch_bounds__(256) to_half_rows(const float* x, int cols, __half* out,
                                                                float* unscale) {
  FATHOM_PDL();
  half_row(x + (size_t)blockIdx.x * cols, cols, out + (size_t)blockIdx.x * cols, unscale + blockIdx.x);
}

// mq<N>_<NAME>: up to N tokens (16 or 64), MQ_WARPS warps a block. Two
// sizes, not one a token count: each kernel adds ~25 KB of machine code to
// the module the plan counts (MODULE_BYTES), and a tile of tokens beyond
// the step's costs only tensor-core work (its loads are skipped).
#define FATHOM_MQ_KERNEL(NAME, T, N)                                                              \
  extern "C" __global__ void __launch_bounds__(MQ_WARPS * 32) mq##N##_##NAME(                    \
      const Weights w, const __half* x16, const float* unscale, float* out, int ntok, int kgroups) { \
    FATHOM_PDL();                                                                                 \
    matmul_mma<T, N / 8>(w, x16, unscale, out, ntok, kgroups);                                    \
  }
#define FATHOM_MQ_KERNELS(NAME, T) FATHOM_MQ_KERNEL(NAME, T, 16) FATHOM_MQ_KERNEL(NAME, T, 64)

FATHOM_MQ_KERNEL(f16, T_F16, 16)
FATHOM_MQ_KERNEL(bf16, T_BF16, 16)
FATHOM_MQ_KERNEL(q4_0, T_Q4_0, 16)
FATHOM_MQ_KERNEL(q4_1, T_Q4_1, 16)
FATHOM_MQ_KERNEL(q5_0, T_Q5_0, 16)
FATHOM_MQ_KERNEL(q5_1, T_Q5_1, 16)
FATHOM_MQ_KERNEL(q8_0, T_Q8_0, 16)
FATHOM_MQ_KERNEL(q2_k, T_Q2_K, 16)
FATHOM_MQ_KERNEL(q3_k, T_Q3_K, 16)
FATHOM_MQ_KERNELS(q4_k, T_Q4_K)
FATHOM_MQ_KERNELS(q5_k, T_Q5_K)
FATHOM_MQ_KERNELS(q6_k, T_Q6_K)
FATHOM_MQ_KERNEL(a2, T_A2, 16)
FATHOM_MQ_KERNEL(a4, T_A4, 16)
FATHOM_MQ_KERNEL(a8, T_A8, 16)
FATHOM_MQ_KERNEL(mxfp4, T_MXFP4, 16)

// mqg_<NAME>: a MoE layer's experts over their routed rows, grouped by
// expert (moe.cu's moe_group), in one launch: tiles[0] tiles, then per tile
// its expert, first routed row and rows (at most N: 64 for the K-quants, 16
// for the others); launch row blockIdx.y takes tile blockIdx.y (rows past
// the count return), on the expert's matrix, `stride` bytes past the
// previous expert's (the loader places a layer's experts evenly; the
// backend checks). Kernels of their own, not mq<N> with a tile argument:
// the pointers a tile moves live in registers, which pushed mq16_q6_k into
// spilling. For the kinds MoE checkpoints store experts in.
#define FATHOM_MQG_KERNEL(NAME, T, N)                                                              \
  extern "C" __global__ void __launch_bounds__(MQ_WARPS * 32) mqg_##NAME(                          \
      Weights w, const __half* x16, const float* unscale, float* out, int kgroups,                 \
      const unsigned int* tiles, unsigned long long stride) {                                      \
    FATHOM_PDL();                                                                                  \
    if (blockIdx.y >= tiles[0]) return;                                                            \
    const unsigned int* tile = tiles + 1 + 3 * blockIdx.y;                                         \
    w.data += tile[0] * stride;                                                                    \
    matmul_mma<T, N / 8>(w, x16 + (size_t)tile[1] * w.cols, unscale + tile[1],                     \
                         out + (size_t)tile[1] * w.rows, tile[2], kgroups);                        \
  }

FATHOM_MQG_KERNEL(q4_k, T_Q4_K, 64)
FATHOM_MQG_KERNEL(q5_k, T_Q5_K, 64)
FATHOM_MQG_KERNEL(q6_k, T_Q6_K, 64)
FATHOM_MQG_KERNEL(q8_0, T_Q8_0, 16)
FATHOM_MQG_KERNEL(q4_0, T_Q4_0, 16)
FATHOM_MQG_KERNEL(q4_1, T_Q4_1, 16)
FATHOM_MQG_KERNEL(q5_0, T_Q5_0, 16)
FATHOM_MQG_KERNEL(q5_1, T_Q5_1, 16)
FATHOM_MQG_KERNEL(mxfp4, T_MXFP4, 16)
FATHOM_MQG_KERNEL(f16, T_F16, 16)
FATHOM_MQG_KERNEL(bf16, T_BF16, 16)
