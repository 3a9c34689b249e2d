// Conversions: dequant_* (weight rows to f16 for the cuBLAS GEMM of a
// prefill step), embed_* (embedding rows), to_half (f32 values to f16 or
// bf16) and quantize_x8 (f32 activations to the int8 blocks of the x8
// kernels). Launched from src/cuda/matvec.rs (dequant_*, to_half,
// quantize_x8), src/cuda/moe.rs (quantize_x8) and src/cuda/weights.rs
// (embed_*).

#include "common.cuh"
#include "quant.cuh"

// out[r] = scale x table[tokens[r]]
template <int T>
__device__ void embed_rows(const Weights w, const unsigned int* __restrict__ tokens, float scale,
                           float* __restrict__ out) {
  const int r = blockIdx.x;
  const unsigned int tok = tokens[r];
  for (int c = threadIdx.x; c < w.cols / 8; c += blockDim.x) {
    float v[8];
    load8<T>(w, (int)tok, c, v);
#pragma unroll
    for (int k = 0; k < 8; k++) out[(size_t)r * w.cols + 8 * c + k] = scale * v[k];
  }
}

// Rows row0 .. row0 + gridDim.x of w as f16, packed, for a tensor-core GEMM
// (prefill): one block a row.
template <int T>
__device__ void dequant_rows(const Weights w, int row0, __half* __restrict__ out) {
  const int r = row0 + blockIdx.x;
  __half* o = out + (size_t)blockIdx.x * w.cols;
  for (int c = threadIdx.x; c < w.cols / 8; c += blockDim.x) {
    float v[8];
    load8<T>(w, r, c, v);
#pragma unroll
    for (int k = 0; k < 8; k += 2) *(__half2*)(o + 8 * c + k) = __floats2half2_rn(v[k], v[k + 1]);
  }
}

// embed_<NAME> and dequant_<NAME> for every weight type and MXFP4.
#define FATHOM_CONVERT_KERNELS(NAME, T)                                                        \
  extern "C" __global__ void __launch_bounds__(256) embed_##NAME(                              \
      const Weights w, const unsigned int* tokens, float scale, float* out) { FATHOM_PDL();                  \
    embed_rows<T>(w, tokens, scale, out);                                                      \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(128) dequant_##NAME(const Weights w, int row0,  \
                                                                   __half* out) { FATHOM_PDL();              \
    dequant_rows<T>(w, row0, out);                                                             \
  }

FATHOM_WEIGHT_TYPES(FATHOM_CONVERT_KERNELS)
FATHOM_CONVERT_KERNELS(mxfp4, T_MXFP4)

// x (f32) to f16 (bf16 = 0) or bf16 (1), n values, round to nearest even.
extern "C" __global__ void to_half(const float* x, long long n, int bf16, unsigned short* out) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i])) : __half_as_ushort(__float2half_rn(x[i]));
}

// x (n values, a multiple of 32) as X8_BLOCK-byte blocks for the x8
// kernels: a warp a block.
extern "C" __global__ void quantize_x8(const float* x, int n, uint8_t* out) { FATHOM_PDL();
  const int b = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
  if (32 * b >= n) return;  // whole warps
  x8_store(x[32 * b + lane], out, b);
}
