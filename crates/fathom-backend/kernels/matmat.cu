// The tiled matrix-matrix kernels mm_* (a prefill step's rows against a
// weight matrix decoded into shared memory), one per weight type.
// Launched from src/cuda/matvec.rs.

#include "common.cuh"
#include "quant.cuh"

// ---------------------------------------------------------------------------
// Matrix-matrix products for prefill: 64 weight rows x 64 tokens a block,
// 32 values of depth a step, weights decoded into shared memory as f32.
#define MM_TILE 64
#define MM_K 32

template <int T>
__device__ void matmat(const Weights w, const float* __restrict__ x, float* __restrict__ out, int ntok) {
  __shared__ float ws[MM_K][MM_TILE + 1];
  __shared__ float xs[MM_K][MM_TILE + 1];
  const int tid = threadIdx.x;  // 256 threads
  const int r0 = blockIdx.x * MM_TILE, t0 = blockIdx.y * MM_TILE;
  const int tr = (tid % 16) * 4, tt = (tid / 16) * 4;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
  const int chunks = w.cols / 8;
  for (int k0 = 0; k0 < w.cols; k0 += MM_K) {
    {  // weights: 64 rows x 4 chunks, one chunk a thread
      const int rr = tid / 4, cc = tid % 4;
      const int c = k0 / 8 + cc;
      float v[8];
      if (r0 + rr < w.rows && c < chunks) {
        load8<T>(w, r0 + rr, c, v);
      } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 8; k++) ws[cc * 8 + k][rr] = v[k];
    }
    // activations: 64 tokens x 32 values, 8 a thread
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int idx = tid + e * 256;
      const int tk = idx / MM_K, kk = idx % MM_K;
      const int col = k0 + kk;
      xs[kk][tk] = (t0 + tk < ntok && col < w.cols) ? x[(size_t)(t0 + tk) * w.cols + col] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < MM_K; kk++) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = ws[kk][tr + i];
#pragma unroll
      for (int j = 0; j < 4; j++) b[j] = xs[kk][tt + j];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int t = t0 + tt + j;
    if (t >= ntok) continue;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = r0 + tr + i;
      if (r < w.rows) out[(size_t)t * w.rows + r] = acc[i][j];
    }
  }
}

// mm_<NAME> for every weight type and MXFP4.
#define FATHOM_MATMAT_KERNELS(NAME, T)                                                         \
  extern "C" __global__ void __launch_bounds__(256) mm_##NAME(const Weights w, const float* x, \
                                                              float* out, int ntok) { FATHOM_PDL();          \
    matmat<T>(w, x, out, ntok);                                                                \
  }

FATHOM_WEIGHT_TYPES(FATHOM_MATMAT_KERNELS)
FATHOM_MATMAT_KERNELS(mxfp4, T_MXFP4)
