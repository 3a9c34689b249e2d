// What every op file uses: the contract's numbers (fathom_abi.h, generated
// by build.rs from src/cuda/abi.rs and fathom-ggml: the kernels' sizes and
// limits, the weight type ids T_*, the block layouts <TYPE>_BLOCK_VALUES /
// <TYPE>_BLOCK_BYTES with QK and QK_K, the KV dtypes KV_* and the GLU
// activations GLU_*), the warp width, the programmatic-dependent-launch
// wait (FATHOM_PDL), the weight-prefetch budget the host sets and the L2
// prefetch, the list of weight types with kernels of their own,
// `struct Weights`, the byte loaders that read weight bytes, the f16 / bf16
// conversions, and the GLU activation.
//
// A header of the single translation unit (fathom.cu): it defines the
// `__device__` global fathom_prefetch_bytes, which must exist once.

#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "fathom_abi.h"

#define WARP 32

// Programmatic dependent launch (sm_90): the host lets each kernel start
// while the one before it on the stream is still running, so its blocks are
// resident when that one ends (hiding the gap between kernels, about a
// microsecond each, ~600 of them in an 8B decode step). Every kernel's
// first statement waits, before touching memory, until the kernel before
// has finished and its writes are visible, then lets the next kernel be
// launched. Without the launch attribute both are no-ops.
#define FATHOM_PDL() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")

// Weight bytes a matrix-vector kernel asks L2 for before its wait, at most
// (0: none). Weights never change, so a kernel whose blocks are resident
// early (above) starts streaming its rows while the kernel before it (a
// norm, rope, attention: little memory traffic) still runs. Only the first
// blocks of the grid (scheduled first) prefetch, PREFETCH_ROW bytes of each
// of their rows: a kernel asking for more than L2 holds would have its
// early lines evicted before use (measured: 8B F16 2.5% slower with 4 KiB
// of every row). Set by the host at start-up (FATHOM_CUDA_PREFETCH).
__device__ unsigned long long fathom_prefetch_bytes = 0;
#define PREFETCH_ROW 4096ull

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Weight type ids (fathom_abi.h): ggml's ids for block types (T_Q4_K),
// T_AFFINE + bits for MLX affine (T_A4).

// The weight types with kernels of their own, as X(name, id): each op file
// stamps its per-type kernels (`mv_<name>`, `mm_<name>`, `dequant_<name>`,
// ...) over this list, in the order of the Rust side's KINDS.
#define FATHOM_WEIGHT_TYPES(X) \
  X(f32, T_F32)                \
  X(f16, T_F16)                \
  X(bf16, T_BF16)              \
  X(q4_0, T_Q4_0)              \
  X(q4_1, T_Q4_1)              \
  X(q5_0, T_Q5_0)              \
  X(q5_1, T_Q5_1)              \
  X(q8_0, T_Q8_0)              \
  X(q2_k, T_Q2_K)              \
  X(q3_k, T_Q3_K)              \
  X(q4_k, T_Q4_K)              \
  X(q5_k, T_Q5_K)              \
  X(q6_k, T_Q6_K)              \
  X(a2, T_A2)                  \
  X(a4, T_A4)                  \
  X(a8, T_A8)

// KV dtypes: KV_F16, KV_BF16, KV_F32, KV_Q8_0 (fathom_abi.h).

// One weight matrix as a kernel reads it.
struct Weights {
  const uint8_t* data;     // rows of `row_bytes` each
  const uint8_t* scales;   // affine: rows x groups halves
  const uint8_t* biases;   // affine: rows x groups halves
  unsigned long long row_bytes;
  int rows;
  int cols;
  int group;               // affine group size
  int bf16;                // affine scales/biases are bf16 (else f16)
};

// 16 weight bytes that a lane alone reads (F32, F16, BF16 rows: a warp's
// loads cover whole lines): read-only for the kernel's life (.nc) and read
// once, so not kept in L1 (L1::no_allocate), where the activations every
// warp re-reads stay. (Block types share lines between lanes, and their
// loads read lines again: through L2 without L1, Q4_0 decode took 1.6x.)
// Not volatile: the compiler may move it like an ordinary load.
__device__ __forceinline__ uint4 ldw16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float4 u4_as_float4(uint4 v) {
  return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
}

// An f16 at a 2-byte aligned address (every scale of every block type is).
__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(*(const __half*)p);
}

__device__ __forceinline__ float bf16_bits(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}

__device__ __forceinline__ float half_at(const uint8_t* p, int bf16) {
  unsigned short h = (unsigned short)p[0] | ((unsigned short)p[1] << 8);
  return bf16 ? bf16_bits(h) : __half2float(__ushort_as_half(h));
}

// Two f16 (bf16) values packed in a word, low half first, as f32.
__device__ __forceinline__ void half2_bits(unsigned int u, float* o) {
  const float2 f = __half22float2(__halves2half2(__ushort_as_half((unsigned short)(u & 0xffffu)),
                                                 __ushort_as_half((unsigned short)(u >> 16))));
  o[0] = f.x;
  o[1] = f.y;
}
__device__ __forceinline__ void bfloat2_bits(unsigned int u, float* o) {
  o[0] = __uint_as_float(u << 16);
  o[1] = __uint_as_float(u & 0xffff0000u);
}

// BYTES bytes at a 2-byte aligned address p (Q4_0, Q5_0, Q8_0, Q3_K and
// Q6_K blocks, of 18, 22, 34, 110 and 210 bytes, are no better aligned),
// read as the aligned words that cover them, from p - s (s = p & 2). word(o) is the four bytes at p + o: bytes
// (o & 3) + s onwards of words o / 4 and o / 4 + 1, one byte permute
// (selector 0x3210, 0x5432 or 0x7654). The last word is loaded only when
// s = 2 needs it, so every word read holds a byte of the range (8 bytes:
// 2 words, or 3 from p - 2).
template <int BYTES>
struct Window {
  static constexpr int W = (BYTES + 5) / 4;
  unsigned int wd[W];
  unsigned int s;
  __device__ __forceinline__ explicit Window(const uint8_t* p) {
    s = (unsigned int)(uintptr_t)p & 2u;
    const unsigned int* a = (const unsigned int*)(p - s);  // (not via an integer: stays a global load)
#pragma unroll
    for (int k = 0; k < W; k++) wd[k] = (k < (BYTES + 3) / 4 || s) ? a[k] : 0u;
  }
  // o: even, known at compile time, o + 4 <= BYTES.
  __device__ __forceinline__ unsigned int word(int o) const {
    return __byte_perm(wd[o >> 2], wd[(o >> 2) + 1], 0x3210u + 0x1111u * ((o & 3) + s));
  }
};

// Eight bytes at p, read with the widest loads alignment `A` (2, 4 or 8)
// allows (2: two or three aligned words and two byte permutes).
template <int A>
__device__ __forceinline__ uint2 load_bytes8(const uint8_t* p) {
  if (A >= 8) return *(const uint2*)p;
  if (A == 4) return make_uint2(((const unsigned int*)p)[0], ((const unsigned int*)p)[1]);
  const Window<8> v(p);
  return make_uint2(v.word(0), v.word(4));
}

// Byte k (0..7, known at compile time) of eight loaded bytes.
__device__ __forceinline__ unsigned int byte_at(uint2 v, int k) {
  return ((k < 4 ? v.x : v.y) >> (8 * (k & 3))) & 0xffu;
}

// act(g) x u of a GLU: GLU_SILU = silu(g) x u, GLU_GELU_TANH = gelu(g) x u (tanh
// approximation), GLU_SWIGLU_OAI = gpt-oss's clamped SwiGLU, min(g, 7) x
// sigmoid(1.702 min(g, 7)) x (clamp(u, -7, 7) + 1).
__device__ __forceinline__ float glu_value(float g, float u, int act) {
  if (act == GLU_SILU) return g / (1.0f + expf(-g)) * u;
  if (act == GLU_SWIGLU_OAI) {
    const float x = fminf(g, 7.0f);
    return x / (1.0f + expf(-1.702f * x)) * (fminf(fmaxf(u, -7.0f), 7.0f) + 1.0f);
  }
  const float t = 0.7978845608f * g * (1.0f + 0.044715f * g * g);
  return g / (1.0f + expf(-2.0f * t)) * u;
}
