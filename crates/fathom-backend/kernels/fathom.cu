// fathom's CUDA kernels: one translation unit, compiled by build.rs with
// nvcc for sm_90 (SASS) plus compute_90 (PTX, for later GPUs) into one
// fatbin that the binary embeds. Every entry point is `extern "C"` so the
// Rust side finds it by its plain name.
//
// Activations are f32 rows, packed (`row r` at `r * width`). Weights stay in
// their stored ggml / MLX-affine layout and are decoded on the fly, eight
// consecutive values at a time (`load8`), which every layout allows: a
// ggml block holds 32 or 256 values and an affine group a multiple of 8.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

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

// Weight type ids: ggml's ids for block types, 100 + bits for MLX affine.
enum {
  T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7,
  T_Q8_0 = 8, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13,
  T_Q6_K = 14, T_BF16 = 30, T_A2 = 102, T_A4 = 104, T_A8 = 108
};

// KV dtypes, as the Rust side numbers them.
enum { KV_F16 = 0, KV_BF16 = 1, KV_F32 = 2, KV_Q8_0 = 3 };

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

// PREFETCH_ROW bytes of the row that this warp of one-token matrix-vector block
// `block` reads (`split` warps a row, `mats` matrices read alike), asked of
// L2 (a 128-byte line a lane), when the grid's blocks up to this one stay
// within fathom_prefetch_bytes (affine scales and biases are left to the walk).
__device__ __forceinline__ void prefetch_row(const Weights& w, int block, int split, int per_block, int mats) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned long long n = min(w.row_bytes, PREFETCH_ROW);
  if ((blockIdx.x + 1ull) * (per_block / split) * mats * n > fathom_prefetch_bytes) return;
  const int r = block * (per_block / split) + warp / split;
  if (r >= w.rows) return;
  const uint8_t* p = w.data + (unsigned long long)r * w.row_bytes;
  for (unsigned long long o = 128ull * ((warp % split) * 32 + lane); o < n; o += 128ull * 32 * split)
    prefetch_l2(p + o);
}

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

// The six-bit scale and min `j` (0..8) of a Q4_K/Q5_K block's 12 bytes,
// read as three words (they start 4 bytes into a 16-byte aligned block).
__device__ __forceinline__ void k4_scale(const uint8_t* s, int j, float* sc, float* m) {
  const unsigned int* w = (const unsigned int*)s;
  const int sh = 8 * (j & 3);
  const unsigned int a = (w[0] >> sh) & 0xffu, b = (w[1] >> sh) & 0xffu;
  if (j < 4) {
    *sc = (float)(a & 63);
    *m = (float)(b & 63);
  } else {
    const unsigned int c = (w[2] >> sh) & 0xffu;
    *sc = (float)((c & 0x0f) | ((a >> 6) << 4));
    *m = (float)((c >> 4) | ((b >> 6) << 4));
  }
}

// Integer q (|q| < 2^22) as f32 without the quarter-rate I2F: the bits of
// 1.5 x 2^23 + q read as a float are exactly 1.5 x 2^23 + q.
__device__ __forceinline__ float small_int_to_float(int q) {
  return __int_as_float(0x4B400000 + q) - 12582912.0f;
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

// Bytes 0..3 of u as floats, 2^23 + byte - bias each (bias 2^23 + the
// type's zero point, so that q is exact).
__device__ __forceinline__ void bytes4(unsigned int u, float* o, float bias) {
#pragma unroll
  for (int k = 0; k < 4; k++) o[k] = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | k)) - bias;
}

#define F2_23 8388608.0f

// BYTES bytes at a 2-byte aligned address p (blocks of 18, 22, 34, 110 or
// 210 bytes are no better aligned), read as the aligned words that cover
// them, from p - s (s = p & 2). word(o) is the four bytes at p + o: bytes
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

// Weight types whose values carry an offset besides the scale (d x q + m).
template <int T>
struct HasOffset {
  static constexpr bool value = T == T_Q4_1 || T == T_Q5_1 || T == T_Q2_K || T == T_Q4_K ||
                                T == T_Q5_K || T >= 100;
};
// Weight types stored as plain floats (no scale at all).
template <int T>
struct IsFloat {
  static constexpr bool value = T == T_F32 || T == T_F16 || T == T_BF16;
};

// Values 8c .. 8c+7 of weight row `r` as d x q[k] + m: every layout keeps
// one scale (and offset) over eight consecutive values. Each type reads its
// bytes with the widest loads its block alignment allows (blocks of 18, 34,
// 22, 110 or 210 bytes are only 2-byte aligned).
template <int T>
__device__ __forceinline__ void decode8(const Weights& w, int r, int c, float* q, float* d, float* m) {
  const uint8_t* row = w.data + (unsigned long long)r * w.row_bytes;
  *d = 1.0f;
  *m = 0.0f;
  if (T == T_F32) {
    const uint4* p = (const uint4*)row + 2 * c;
    const float4 a = u4_as_float4(ldw16(p)), b = u4_as_float4(ldw16(p + 1));
    q[0] = a.x; q[1] = a.y; q[2] = a.z; q[3] = a.w;
    q[4] = b.x; q[5] = b.y; q[6] = b.z; q[7] = b.w;
  } else if (T == T_F16) {
    const uint4 v = ldw16((const uint4*)row + c);
    half2_bits(v.x, q);
    half2_bits(v.y, q + 2);
    half2_bits(v.z, q + 4);
    half2_bits(v.w, q + 6);
  } else if (T == T_BF16) {
    const uint4 v = ldw16((const uint4*)row + c);
    bfloat2_bits(v.x, q);
    bfloat2_bits(v.y, q + 2);
    bfloat2_bits(v.z, q + 4);
    bfloat2_bits(v.w, q + 6);
  } else if (T == T_Q8_0) {
    const uint8_t* b = row + (c >> 2) * 34;
    *d = f16_at(b);
    // int8 flipped to unsigned (the xor), as floats less 128.
    const uint2 v = load_bytes8<2>(b + 2 + (c & 3) * 8);
    bytes4(v.x ^ 0x80808080u, q, F2_23 + 128.0f);
    bytes4(v.y ^ 0x80808080u, q + 4, F2_23 + 128.0f);
  } else if (T == T_Q4_0 || T == T_Q4_1) {
    // Value j of a block: the low nibble of byte j for j < 16, else the
    // high nibble of byte j - 16.
    constexpr int bytes = T == T_Q4_0 ? 18 : 20, qs = T == T_Q4_0 ? 2 : 4;
    const uint8_t* b = row + (c >> 2) * bytes;
    const int j0 = (c & 3) * 8, shift = 4 * (j0 >> 4);
    const uint2 v = load_bytes8<T == T_Q4_0 ? 2 : 4>(b + qs + (j0 & 15));
    *d = f16_at(b);
    if (T == T_Q4_1) *m = f16_at(b + 2);
    const float bias = F2_23 + (T == T_Q4_0 ? 8.0f : 0.0f);
    bytes4((v.x >> shift) & 0x0f0f0f0fu, q, bias);
    bytes4((v.y >> shift) & 0x0f0f0f0fu, q + 4, bias);
  } else if (T == T_Q5_0 || T == T_Q5_1) {
    // Q4_0's and Q4_1's nibbles, and bit j of qh as value j's fifth bit.
    constexpr int bytes = T == T_Q5_0 ? 22 : 24, qs = T == T_Q5_0 ? 6 : 8;
    constexpr int align = T == T_Q5_1 ? 8 : 2;
    const uint8_t* b = row + (c >> 2) * bytes;
    const int j0 = (c & 3) * 8;
    const int shift = 4 * (j0 >> 4);
    const uint2 v = load_bytes8<align>(b + qs + (j0 & 15));
    unsigned int qh = 0;
    if (T == T_Q5_0) qh = (unsigned)((const unsigned short*)(b + 2))[0] | ((unsigned)((const unsigned short*)(b + 2))[1] << 16);
    if (T == T_Q5_1) qh = *(const unsigned int*)(b + 4);
    *d = f16_at(b);
    if (T == T_Q5_1) *m = f16_at(b + 2);
    const int zero = T == T_Q5_0 ? 16 : 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const int n = (int)((byte_at(v, k) >> shift) & 0x0fu) | (int)(((qh >> (j0 + k)) & 1u) << 4);
      q[k] = small_int_to_float(n - zero);
    }
  } else if (T == T_Q2_K) {
    const uint8_t* b = row + (c >> 5) * 84;
    const int i0 = (c & 31) * 8;
    const int s = b[i0 >> 4];
    *d = f16_at(b + 80) * (float)(s & 0x0f);
    *m = -f16_at(b + 82) * (float)(s >> 4);
    const int n = i0 >> 7, j = (i0 & 127) >> 5;
    const uint2 v = load_bytes8<4>(b + 16 + 32 * n + (i0 & 31));
#pragma unroll
    for (int k = 0; k < 8; k++) q[k] = small_int_to_float((int)((byte_at(v, k) >> (2 * j)) & 3u));
  } else if (T == T_Q3_K) {
    const uint8_t* b = row + (c >> 5) * 110;
    const int i0 = (c & 31) * 8;
    const uint8_t* s = b + 96;
    const int si = i0 >> 4;
    const int low = (s[si & 7] >> (4 * (si >> 3))) & 0x0f;
    const int high = (s[8 + (si & 3)] >> (2 * (si >> 2))) & 3;
    *d = f16_at(b + 108) * (float)((low | (high << 4)) - 32);
    const int n = i0 >> 7, j = (i0 & 127) >> 5, hb = i0 >> 5;
    const uint2 hm = load_bytes8<2>(b + (i0 & 31));
    const uint2 v = load_bytes8<2>(b + 32 + 32 * n + (i0 & 31));
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const int lo = (int)((byte_at(v, k) >> (2 * j)) & 3u);
      const int sub = ((byte_at(hm, k) >> hb) & 1u) ? 0 : 4;
      q[k] = small_int_to_float(lo - sub);
    }
  } else if (T == T_Q4_K || T == T_Q5_K) {
    constexpr int bytes = T == T_Q4_K ? 144 : 176;
    const uint8_t* b = row + (c >> 5) * bytes;
    const int i0 = (c & 31) * 8;
    float sc, mn;
    k4_scale(b + 4, i0 >> 5, &sc, &mn);
    *d = f16_at(b) * sc;
    *m = -f16_at(b + 2) * mn;
    const int cc = i0 >> 6, h = (i0 & 63) >> 5;
    const int qs = T == T_Q4_K ? 16 : 48;
    const uint2 v = load_bytes8<8>(b + qs + 32 * cc + (i0 & 31));
    uint2 hv = make_uint2(0, 0);
    if (T == T_Q5_K) hv = load_bytes8<8>(b + 16 + (i0 & 31));
#pragma unroll
    for (int k = 0; k < 8; k++) {
      int n = (int)((byte_at(v, k) >> (4 * h)) & 0x0fu);
      if (T == T_Q5_K) n |= (int)(((byte_at(hv, k) >> (i0 >> 5)) & 1u) << 4);
      q[k] = small_int_to_float(n);
    }
  } else if (T == T_Q6_K) {
    const uint8_t* b = row + (c >> 5) * 210;
    const int i0 = (c & 31) * 8;
    *d = f16_at(b + 208) * (float)(int8_t)b[192 + (i0 >> 4)];
    const int n = i0 >> 7, j = (i0 & 127) >> 5;
    const uint2 lo = load_bytes8<2>(b + 64 * n + 32 * (j & 1) + (i0 & 31));
    const uint2 hi = load_bytes8<2>(b + 128 + 32 * n + (i0 & 31));
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const int l = (int)((byte_at(lo, k) >> (4 * (j >> 1))) & 0x0fu);
      const int h = (int)((byte_at(hi, k) >> (2 * j)) & 3u);
      q[k] = small_int_to_float((l | (h << 4)) - 32);
    }
  } else {  // MLX affine, T = 100 + bits: 8 values are `bits` bytes
    constexpr int bits = T >= 100 ? T - 100 : 8;
    const int groups = w.cols / w.group;
    const unsigned long long gi = (unsigned long long)r * groups + (8 * c) / w.group;
    *d = half_at(w.scales + 2 * gi, w.bf16);
    *m = half_at(w.biases + 2 * gi, w.bf16);
    const uint8_t* p = row + c * bits;
    if (bits == 8) {
      const uint2 v = load_bytes8<8>(p);
#pragma unroll
      for (int k = 0; k < 8; k++) q[k] = small_int_to_float((int)byte_at(v, k));
    } else {
      const unsigned int v = bits == 4 ? *(const unsigned int*)p : (unsigned)*(const unsigned short*)p;
#pragma unroll
      for (int k = 0; k < 8; k++) q[k] = small_int_to_float((int)((v >> (k * bits)) & ((1u << bits) - 1)));
    }
  }
}

// Values 8c .. 8c+7 of weight row `r`, as f32.
template <int T>
__device__ __forceinline__ void load8(const Weights& w, int r, int c, float* o) {
  float d, m;
  decode8<T>(w, r, c, o, &d, &m);
  if (!IsFloat<T>::value) {
#pragma unroll
    for (int k = 0; k < 8; k++) o[k] = d * o[k] + m;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// act(g) of a GLU: 0 = silu, 1 = gelu (tanh approximation).
__device__ __forceinline__ float glu_act(float g, int act) {
  if (act == 0) return g / (1.0f + expf(-g));
  const float t = 0.7978845608f * g * (1.0f + 0.044715f * g * g);
  return g / (1.0f + expf(-2.0f * t));
}

// ---------------------------------------------------------------------------
// Matrix-vector products for decode (1..MV_MAX_TOKENS rows of x): `split`
// warps (1, 2 or 4) per weight row, every lane a stride of 8-value chunks,
// all tokens at once so each weight byte is read once. A matrix of few rows
// takes more warps a row, so that enough loads are in flight to keep
// memory busy. GLU: the same over a gate and an up matrix of one shape and
// type at once, writing act(gate row) x (up row).
#define MV_MAX_TOKENS 8
#define MV_WARPS 4

// One chunk's dot product with 8 activations (a, b; `sum` their sum) for
// values d x q[k] + m.
template <int T>
__device__ __forceinline__ float dot8(const float* q, float d, float m, float4 a, float4 b, float sum) {
  const float dot = q[0] * a.x + q[1] * a.y + q[2] * a.z + q[3] * a.w + q[4] * b.x + q[5] * b.y +
                    q[6] * b.z + q[7] * b.w;
  if (IsFloat<T>::value) return dot;
  if (HasOffset<T>::value) return d * dot + m * sum;
  return d * dot;
}

// ---------------------------------------------------------------------------
// One token, 32 values a chunk (Q4_K, Q5_K, Q6_K): a lane decodes 32 values
// of a row per chunk with its block's scales read once (the 8-value path
// decodes a k-quant's scales per 8), each quant turned into a float by
// bytes4. Chunk c is values 8p .. 8p + 8 (p = c % 4) of the four 32-value
// sub-blocks 4h .. 4h + 3 (h = (c / 4) % 2) of 256-value block c / 8, so
// that four lanes side by side read a sub-block's 32 activations: a warp's
// 16-byte activation load touches 8 L1 lines. decode gives group g (values
// chunk_first(c) + 32g ..) as q[8g .. 8g + 8], scale d[g], offset m[g]
// (values d x q + m).
//
// Not Q8_0, Q4_0, Q4_1: with a whole 32-value block a lane, a lane's 128
// bytes of activations sit 128 bytes from its neighbours' and every load of
// the warp touches 32 lines; measured on the H200 (14336x4096), Q8_0 took
// 2.1x and Q4_0 2.3x the time of their 8-value lanes (lanes 32 bytes apart).
__device__ __forceinline__ int chunk_first(int c) {
  return 256 * (c >> 3) + 128 * ((c >> 2) & 1) + 8 * (c & 3);
}

// Types without a 32-value path.
template <int T>
struct Chunk {
  static constexpr bool value = false;
};

// Q4_K and Q5_K (16-byte aligned blocks). Sub-block j (values 32j ..) of
// a block is the low (j even) or high (j odd) nibbles of quant bytes
// 32 (j / 2) .. + 32, with scale and min j; Q5_K's fifth bit of value
// 32j + l is bit j of qh[l]. Chunk c: block c / 8, half h = (c / 4) % 2,
// p = c % 4: values 8p .. 8p + 8 of sub-blocks 4h + g (g < 4), from the 8
// bytes at 64h + 8p and 64h + 32 + 8p of the quants (and qh[8p ..]), so
// that four lanes side by side read a sub-block's 32 activations (one
// 16-byte load for 32 values made lanes 64 bytes apart: twice the L1 lines
// a load, measured 36 us against 28 for Q6_K's chunks on the same shape).
template <int T>
struct ChunkK45 {
  static constexpr bool value = true;
  __device__ static void decode(const Weights& w, int r, int c, float* q, float* d, float* m) {
    constexpr int bytes = T == T_Q4_K ? 144 : 176, qs = T == T_Q4_K ? 16 : 48;
    const uint8_t* b = w.data + (unsigned long long)r * w.row_bytes + (c >> 3) * bytes;
    const int h = (c >> 2) & 1, p = c & 3;
    const uint2 v0 = *(const uint2*)(b + qs + 64 * h + 8 * p);
    const uint2 v1 = *(const uint2*)(b + qs + 64 * h + 32 + 8 * p);
    const unsigned int u[2][2] = {{v0.x, v0.y}, {v1.x, v1.y}};
    uint2 hv = make_uint2(0u, 0u);
    if (T == T_Q5_K) hv = *(const uint2*)(b + 16 + 8 * p);
    const unsigned int hb[2] = {hv.x, hv.y};
#pragma unroll
    for (int e = 0; e < 2; e++) {  // sub-blocks 4h + 2e (low nibbles), 4h + 2e + 1 (high)
#pragma unroll
      for (int k = 0; k < 2; k++) {
        unsigned int lo = u[e][k] & 0x0f0f0f0fu, hi = (u[e][k] >> 4) & 0x0f0f0f0fu;
        if (T == T_Q5_K) {
          lo |= ((hb[k] >> (4 * h + 2 * e)) & 0x01010101u) << 4;
          hi |= ((hb[k] >> (4 * h + 2 * e + 1)) & 0x01010101u) << 4;
        }
        bytes4(lo, q + 16 * e + 4 * k, F2_23);
        bytes4(hi, q + 16 * e + 8 + 4 * k, F2_23);
      }
    }
    const float2 dd = __half22float2(*(const __half2*)b);
    float sc, mn;
#pragma unroll
    for (int g = 0; g < 4; g++) {
      k4_scale(b + 4, 4 * h + g, &sc, &mn);
      d[g] = dd.x * sc;
      m[g] = -dd.y * mn;
    }
  }
};
template <>
struct Chunk<T_Q4_K> : ChunkK45<T_Q4_K> {};
template <>
struct Chunk<T_Q5_K> : ChunkK45<T_Q5_K> {};

// Q6_K (210-byte blocks, 2-byte aligned). In half n (128 values) of a
// block, value l + 32g (l < 32, g < 4) is 4 bits of ql[64n + l + 32 (g & 1)]
// (the high nibble for g >= 2) and bits 2g, 2g + 1 of qh[32n + l], with
// scale sc[8n + l / 16 + 2g]. Chunk c: block c / 8, n = (c / 4) % 2, l from
// l0 = 8 (c % 4) to l0 + 8, all four g: three 8-byte pieces (ql twice, qh),
// whose words are combined four values at a time, and the 8 scales of half n.
template <>
struct Chunk<T_Q6_K> {
  static constexpr bool value = true;
  __device__ static void decode(const Weights& w, int r, int c, float* q, float* d, float* m) {
    const uint8_t* b = w.data + (unsigned long long)r * w.row_bytes + (c >> 3) * 210;
    const int n = (c >> 2) & 1, l0 = 8 * (c & 3);
    const Window<8> ql0(b + 64 * n + l0), ql1(b + 64 * n + 32 + l0), qh(b + 128 + 32 * n + l0);
    const Window<8> sc(b + 192 + 8 * n);
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const unsigned int a = ql0.word(4 * k), e = ql1.word(4 * k), h = qh.word(4 * k);
      bytes4((a & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u), q + 4 * k, F2_23 + 32.0f);
      bytes4((e & 0x0f0f0f0fu) | ((h << 2) & 0x30303030u), q + 8 + 4 * k, F2_23 + 32.0f);
      bytes4(((a >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u), q + 16 + 4 * k, F2_23 + 32.0f);
      bytes4(((e >> 4) & 0x0f0f0f0fu) | ((h >> 2) & 0x30303030u), q + 24 + 4 * k, F2_23 + 32.0f);
    }
    // Scale l0 / 16 + 2g: byte l0 / 16 + 2 (g & 1) of word g / 2, signed.
    const float dd = f16_at(b + 208);
    const int shift = 24 - 8 * (l0 >> 4);
#pragma unroll
    for (int g = 0; g < 4; g++) {
      const int s = (int)(sc.word(4 * (g >> 1)) << (shift - 16 * (g & 1))) >> 24;
      d[g] = dd * (float)s;
      m[g] = 0.0f;
    }
  }
};

// One chunk's dot product with the activations of its values (xr: the
// token's row at value chunk_first(c)).
template <int T>
__device__ __forceinline__ float chunk_dot(const float* q, const float* d, const float* m, const float* xr) {
  float acc = 0.0f;
#pragma unroll
  for (int g = 0; g < 4; g++) {
    float dot = 0.0f, sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const float4 a = ((const float4*)(xr + 32 * g))[k];
      const float* v = q + 8 * g + 4 * k;
      dot += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w;
      if (HasOffset<T>::value) sum += (a.x + a.y) + (a.z + a.w);
    }
    acc += d[g] * dot;
    if (HasOffset<T>::value) acc += m[g] * sum;
  }
  return acc;
}

// One token against Q8_0, Q4_0, Q4_K and Q6_K weights with int8 activations (the
// x8 kernels): x quantized once per 32 values as the CPU quantizes Q8_0's
// and Q4_0's activations (Q8S: scale max|x| / 127 held as f16, quants
// rounded half to even; quantize_x8), X8_BLOCK bytes a block — the scale as
// f32 at byte 0, the quants' sum (int) at byte 4, the 32 quants from byte
// 16. A lane takes a whole Q8_0/Q4_0 block (its bytes as the aligned words
// covering them, scale included) or two 32-value runs of a Q4_K or Q6_K
// block (the low and high nibbles of 32 quant bytes; for Q6_K with their
// high bits from 32 more), the activations as 16-byte loads, and dp4a. The f32 paths' lanes spent five or more loads on 8
// values, which bound these kernels more than their weight bytes did (Q8_0
// read 1.95 TB/s of weights against 3.3 for F16).
#define X8_BLOCK 48

// q8_0 of 32 values: d = amax / 127 stored as f16, q = round-half-even(v * 127 / amax).
__device__ __forceinline__ void q8_scale(float amax, float* d, float* id) {
  *d = amax / 127.0f;
  *id = amax > 0.0f ? 127.0f / amax : 0.0f;
}

// Activation blocks b0 + k * stride (k < count) of out from the warp's 32
// lanes, value v[k] each (lane order). Every lane of the warp calls, with
// the same count. quantize_x8 and the kernels whose output feeds a one-token
// x8 matmul (norms, attention) write their values through it, so the matmul
// needs no quantize_x8 launch of its own. The N blocks' shuffles are
// interleaved (a norm thread holds several values: one reduction chain).
template <int N>
__device__ __forceinline__ void x8_store_n(const float* v, int count, uint8_t* out, size_t b0, size_t stride) {
  const int lane = threadIdx.x % WARP;
  float amax[N], sum[N];
#pragma unroll
  for (int k = 0; k < N; k++) amax[k] = fabsf(v[k]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < N; k++) amax[k] = fmaxf(amax[k], __shfl_xor_sync(0xffffffffu, amax[k], o));
  float d[N];
  int q[N];
#pragma unroll
  for (int k = 0; k < N; k++) {
    float id;
    q8_scale(amax[k], &d[k], &id);
    q[k] = (int)rintf(v[k] * id);
    sum[k] = (float)q[k];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < N; k++) sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], o);
#pragma unroll
  for (int k = 0; k < N; k++) {
    if (k >= count) break;
    uint8_t* o = out + (b0 + k * stride) * X8_BLOCK;
    if (lane == 0) {
      *(float*)o = __half2float(__float2half_rn(d[k]));
      *(int*)(o + 4) = (int)sum[k];
    }
    o[16 + lane] = (uint8_t)(int8_t)q[k];
  }
}
__device__ __forceinline__ void x8_store(float v, uint8_t* out, size_t b) { x8_store_n<1>(&v, 1, out, b, 0); }
template <int T>
struct HasX8 {
  static constexpr bool value = T == T_Q8_0 || T == T_Q4_0 || T == T_Q4_K || T == T_Q6_K;
};
// Activation blocks (32 values) a lane's task covers, and which: task c's
// i-th. Q4_K: its values 64c .. 64c + 64. Q6_K: the two 32-value runs of
// one half block whose low 4 bits share quant bytes (ql), values
// 128h + 32j + 64i of block b for c = 4b + 2h + j.
template <int T>
struct X8Task {
  static constexpr int blocks = T == T_Q4_K || T == T_Q6_K ? 2 : 1;
  __device__ static __forceinline__ int block(int c, int i) {
    return T == T_Q6_K ? 8 * (c >> 2) + 4 * ((c >> 1) & 1) + (c & 1) + 2 * i : blocks * c + i;
  }
};

// One activation block of quantize_x8.
struct X8Block {
  float d;
  int sum;
  int q[8];
};
__device__ __forceinline__ X8Block x8_block(const uint8_t* x8, int i) {
  const uint8_t* xb = x8 + (size_t)i * X8_BLOCK;
  const uint2 h = *(const uint2*)xb;
  const uint4 a = *(const uint4*)(xb + 16), b = *(const uint4*)(xb + 32);
  return {__uint_as_float(h.x), (int)h.y, {(int)a.x, (int)a.y, (int)a.z, (int)a.w, (int)b.x, (int)b.y, (int)b.z, (int)b.w}};
}

// Task c of row r (X8Task<T>::blocks weight blocks or sub-blocks) against
// its activation blocks xb.
template <int T>
__device__ __forceinline__ float dot_x8(const Weights& w, int r, int c, const X8Block* xb) {
  const uint8_t* row = w.data + (unsigned long long)r * w.row_bytes;
  if (T == T_Q4_K) {
    // Sub-blocks 2p (low nibbles) and 2p + 1 (high) of block c / 4: quant
    // bytes 32p .. 32p + 32, scales and mins 2p and 2p + 1.
    const uint8_t* b = row + (unsigned long long)(c >> 2) * 144;
    const int p = c & 3;
    const uint4 q0 = *(const uint4*)(b + 16 + 32 * p), q1 = *(const uint4*)(b + 32 + 32 * p);
    const unsigned int u[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      lo = __dp4a((int)(u[k] & 0x0f0f0f0fu), xb[0].q[k], lo);
      hi = __dp4a((int)((u[k] >> 4) & 0x0f0f0f0fu), xb[X8Task<T>::blocks - 1].q[k], hi);
    }
    float sc0, m0, sc1, m1;
    k4_scale(b + 4, 2 * p, &sc0, &m0);
    k4_scale(b + 4, 2 * p + 1, &sc1, &m1);
    const float2 dd = __half22float2(*(const __half2*)b);
    const X8Block& x1 = xb[X8Task<T>::blocks - 1];
    return xb[0].d * (dd.x * sc0 * (float)lo - dd.y * m0 * (float)xb[0].sum) +
           x1.d * (dd.x * sc1 * (float)hi - dd.y * m1 * (float)x1.sum);
  } else if (T == T_Q6_K) {
    // 210-byte blocks (2-byte aligned): ql (low 4 bits) at 0, qh (high 2
    // bits, four values a byte) at 128, 16 int8 scales (one per 16
    // values) at 192, d at 208. Task (h, j): ql bytes 64h + 32j .. + 32,
    // low nibbles for run 0 and high for run 1; qh bytes 32h .. + 32, bits
    // 2j (run 0) and 4 + 2j (run 1); quants are q - 32.
    const uint8_t* b = row + (unsigned long long)(c >> 2) * 210;
    const int h = (c >> 1) & 1, j = c & 1;
    const Window<32> ql(b + 64 * h + 32 * j), qh(b + 128 + 32 * h);
    int dot[4] = {0, 0, 0, 0};  // run 0 values 0..15, 16..31, run 1 the same
#pragma unroll
    for (int k = 0; k < 8; k++) {
      const unsigned int l = ql.word(4 * k), hb = qh.word(4 * k);
      const unsigned int q0 = (l & 0x0f0f0f0fu) | (((hb >> (2 * j)) & 0x03030303u) << 4);
      const unsigned int q1 = ((l >> 4) & 0x0f0f0f0fu) | (((hb >> (4 + 2 * j)) & 0x03030303u) << 4);
      dot[k / 4] = __dp4a((int)__vsub4(q0, 0x20202020u), xb[0].q[k], dot[k / 4]);
      dot[2 + k / 4] = __dp4a((int)__vsub4(q1, 0x20202020u), xb[1].q[k], dot[2 + k / 4]);
    }
    const Window<8> sc(b + 192 + 8 * h);
    const unsigned int s0 = sc.word(0) >> (16 * j), s1 = sc.word(4) >> (16 * j);
    const float d = __half2float(__ushort_as_half(*(const unsigned short*)(b + 208)));
    const float run0 = (float)(int8_t)(s0 & 0xffu) * (float)dot[0] + (float)(int8_t)((s0 >> 8) & 0xffu) * (float)dot[1];
    const float run1 = (float)(int8_t)(s1 & 0xffu) * (float)dot[2] + (float)(int8_t)((s1 >> 8) & 0xffu) * (float)dot[3];
    return d * (xb[0].d * run0 + xb[1].d * run1);
  } else if (T == T_Q8_0) {
    const int* xq = xb[0].q;
    const Window<34> v(row + (unsigned long long)c * 34);
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) dot = __dp4a((int)v.word(2 + 4 * k), xq[k], dot);
    return xb[0].d * __half2float(__ushort_as_half((unsigned short)(v.word(0) & 0xffffu))) * (float)dot;
  } else {  // Q4_0: quants q - 8, the low nibbles of bytes 0..15 then the high ones
    const int* xq = xb[0].q;
    const Window<18> v(row + (unsigned long long)c * 18);
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const unsigned int u = v.word(2 + 4 * k);
      dot = __dp4a((int)(u & 0x0f0f0f0fu), xq[k], dot);
      dot = __dp4a((int)((u >> 4) & 0x0f0f0f0fu), xq[k + 4], dot);
    }
    return xb[0].d * __half2float(__ushort_as_half((unsigned short)(v.word(0) & 0xffffu))) *
           (float)(dot - 8 * xb[0].sum);
  }
}

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

// X8: x is quantize_x8's blocks (one token, HasX8<T> types only).
template <int T, int NT, bool GLU, bool X8 = false>
__device__ void matvec(const Weights w, const Weights w2, const float* __restrict__ x,
                       float* __restrict__ out, int ntok, int split, int act, int block) {
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
    const int tasks = r < w.rows ? w.cols / (32 * B) : 0;
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
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const float s = warp_sum(acc[t]), s2 = GLU ? warp_sum(acc2[t]) : 0.0f;
    if (split == 1) {
      if (lane == 0 && t < ntok && r < w.rows)
        out[(size_t)t * w.rows + r] = GLU ? glu_act(s, act) * s2 : s;
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
    out[(size_t)lane * w.rows + r] = GLU ? glu_act(s, act) * s2 : s;
  }
}

// One token through up to MV_SEGMENTS matrices of one type and width in one
// launch (a layer's q, k and v: one launch keeps the device full where the
// small K and V projections alone would not). Segment i takes blocks
// first[i] .. first[i + 1], each of MV_WARPS / split[i] rows.
#define MV_SEGMENTS 3
struct Segments {
  Weights w[MV_SEGMENTS];
  float* out[MV_SEGMENTS];
  int split[MV_SEGMENTS];
  int first[MV_SEGMENTS + 1];
  int rows_per_block;  // 0: blocks as above; else matvec_balanced (first[] then counts rows)
  int prefetch;        // 0: no L2 prefetch before the wait
};

template <int T, bool X8 = false>
__device__ __forceinline__ void matvec_segments(const Segments& s, const float* __restrict__ x, int ntok) {
  const int b = blockIdx.x;
  // Selects rather than an indexed parameter (which would go to the stack).
  const int i = (b >= s.first[1]) + (b >= s.first[2]);
  const Weights w = i == 0 ? s.w[0] : i == 1 ? s.w[1] : s.w[2];
  float* out = i == 0 ? s.out[0] : i == 1 ? s.out[1] : s.out[2];
  const int split = i == 0 ? s.split[0] : i == 1 ? s.split[1] : s.split[2];
  const int first = i == 0 ? s.first[0] : i == 1 ? s.first[1] : s.first[2];
  matvec<T, 1, false, X8>(w, w, x, out, ntok, split, 0, b - first);
}

// Most rows a block of matvec_balanced takes (its partial sums in shared
// memory): at 8 blocks a multiprocessor, 8 rows a block cover 8,448 rows in
// one wave on 132 multiprocessors.
#define MV_BALANCED_ROWS 8

// The matrix, its row and the output value of the segments' row g (rows
// laid end to end; first[] counts rows).
struct SegmentRow {
  Weights w;
  int r;
  float* out;
};
__device__ __forceinline__ SegmentRow segment_row(const Segments& s, int g) {
  const int i = (g >= s.first[1]) + (g >= s.first[2]);
  const int first = i == 0 ? s.first[0] : i == 1 ? s.first[1] : s.first[2];
  float* out = i == 0 ? s.out[0] : i == 1 ? s.out[1] : s.out[2];
  return {i == 0 ? s.w[0] : i == 1 ? s.w[1] : s.w[2], g - first, out + (g - first)};
}

// One token through the segments' rows in one wave of equal warps: block b
// takes rows b R .. b R + R - 1 (R = rows_per_block; rows of every segment
// laid end to end, all of one width) and each of its warps an equal run of
// the block's R x chunks chunks, whole groups of 4 x 32 (the host checks).
// The plain layout gave each row its own blocks: a layer's q, k and v
// (6,144 rows of 4,096 values on an 8B shape) took ~3 waves, the K and V
// blocks one group of loads each, and the launch ran at ~3 TB/s. A row that
// two warps share is summed in shared memory.
template <int T>
__device__ __forceinline__ void matvec_balanced(const Segments& s, const float* __restrict__ x) {
  __shared__ float parts[MV_BALANCED_ROWS][2];
  const int R = s.rows_per_block, C = s.w[0].cols / 8, per = R * C / MV_WARPS;
  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  const int row0 = blockIdx.x * R, rows = min(R, s.first[MV_SEGMENTS] - row0);
  const int f0 = warp * per;
  int cur = f0 / C;
  SegmentRow sr = segment_row(s, row0 + cur);
  float acc = 0.0f;
  // A row's sum: slot 0 from the warp whose run holds the row's start,
  // slot 1 from the one whose run starts inside it.
  auto flush = [&](int r) {
    const float v = warp_sum(acc);
    if (lane == 0) parts[r][r * C < f0 ? 1 : 0] = v;
    acc = 0.0f;
  };
  for (int f = f0; f < f0 + per; f += 4 * WARP) {
    const int r = f / C;
    if (r >= rows) break;
    if (r != cur) {
      flush(cur);
      cur = r;
      sr = segment_row(s, row0 + r);
    }
    const int c0 = f - r * C + lane;
    float q[4][8], d[4], m[4];
#pragma unroll
    for (int u = 0; u < 4; u++) decode8<T>(sr.w, sr.r, c0 + u * WARP, q[u], &d[u], &m[u]);
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const float4* xp = (const float4*)(x + 8 * (c0 + u * WARP));
      const float4 a = xp[0], b = xp[1];
      const float sum = (a.x + a.y) + (a.z + a.w) + (b.x + b.y) + (b.z + b.w);
      acc += dot8<T>(q[u], d[u], m[u], a, b, sum);
    }
  }
  if (cur < rows) flush(cur);
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    // The warp whose run starts inside row r, if any.
    const int w2 = (r * C + per - 1) / per;
    const bool two = w2 < MV_WARPS && w2 * per > r * C && w2 * per < (r + 1) * C;
    segment_row(s, row0 + r).out[0] = parts[r][0] + (two ? parts[r][1] : 0.0f);
  }
}

// PREFETCH_ROW bytes from the start of each warp's run of matvec_balanced.
__device__ __forceinline__ void prefetch_balanced(const Segments& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if ((blockIdx.x + 1ull) * MV_WARPS * PREFETCH_ROW > fathom_prefetch_bytes) return;
  const int R = s.rows_per_block, C = s.w[0].cols / 8, per = R * C / MV_WARPS;
  const int f = warp * per, g = blockIdx.x * R + f / C;
  if (g >= s.first[MV_SEGMENTS]) return;
  const SegmentRow sr = segment_row(s, g);
  const unsigned long long chunk = sr.w.row_bytes / C, from = chunk * (f % C);
  const unsigned long long end = min(sr.w.row_bytes, from + PREFETCH_ROW);
  const uint8_t* row = sr.w.data + (unsigned long long)sr.r * sr.w.row_bytes;
  for (unsigned long long o = from + 128ull * lane; o < end; o += 128ull * 32) prefetch_l2(row + o);
}

// prefetch_row for the segment block blockIdx.x belongs to.
__device__ __forceinline__ void prefetch_segments(const Segments& s) {
  if (!s.prefetch) return;
  if (s.rows_per_block) {
    prefetch_balanced(s);
    return;
  }
  const int b = blockIdx.x;
  const int i = (b >= s.first[1]) + (b >= s.first[2]);
  const Weights w = i == 0 ? s.w[0] : i == 1 ? s.w[1] : s.w[2];
  const int split = i == 0 ? s.split[0] : i == 1 ? s.split[1] : s.split[2];
  const int first = i == 0 ? s.first[0] : i == 1 ? s.first[1] : s.first[2];
  prefetch_row(w, b - first, split, MV_WARPS, 1);
}

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

// The one-token kernels of type T: mv1<SUFFIX>_<NAME> (a launch over up to
// three matrices) and mvglu1<SUFFIX>_<NAME> (gate and up with the
// activation), on f32 activations (X8 false, no suffix) or quantize_x8's
// (X8 true). Both ask L2 for their first rows before the dependency wait.
#define FATHOM_ONE_TOKEN_KERNELS(SUFFIX, NAME, T, X8)                                           \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8)                               \
      mv1##SUFFIX##_##NAME(const Segments s, const float* x, int ntok) {                        \
    prefetch_segments(s);                                                                       \
    FATHOM_PDL();                                                                               \
    if constexpr (!X8 && IsFloat<T>::value) {                                                 \
      if (s.rows_per_block) {                                                                   \
        matvec_balanced<T>(s, x);                                                               \
        return;                                                                                 \
      }                                                                                         \
    }                                                                                           \
    matvec_segments<T, X8>(s, x, ntok);                                                         \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8) mvglu1##SUFFIX##_##NAME(      \
      const Weights gate, const Weights up, const float* x, float* out, int ntok, int split,   \
      int act) {                                                                                \
    prefetch_row(gate, blockIdx.x, split, MV_WARPS, 2);                                         \
    prefetch_row(up, blockIdx.x, split, MV_WARPS, 2);                                           \
    FATHOM_PDL();                                                                               \
    matvec<T, 1, true, X8>(gate, up, x, out, ntok, split, act, blockIdx.x);                     \
  }

#define FATHOM_WEIGHT_KERNELS(NAME, T)                                                         \
  FATHOM_ONE_TOKEN_KERNELS(, NAME, T, false)                                                    \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8)                               \
      mv_##NAME(const Weights w, const float* x, float* out, int ntok, int split) { FATHOM_PDL(); \
    matvec<T, MV_MAX_TOKENS, false>(w, w, x, out, ntok, split, 0, blockIdx.x);                  \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8) mvglu_##NAME(                 \
      const Weights gate, const Weights up, const float* x, float* out, int ntok, int split,   \
      int act) { FATHOM_PDL();                                                                  \
    matvec<T, MV_MAX_TOKENS, true>(gate, up, x, out, ntok, split, act, blockIdx.x);             \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) mm_##NAME(const Weights w, const float* x, \
                                                              float* out, int ntok) { FATHOM_PDL();          \
    matmat<T>(w, x, out, ntok);                                                                \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(256) embed_##NAME(                              \
      const Weights w, const unsigned int* tokens, float scale, float* out) { FATHOM_PDL();                  \
    embed_rows<T>(w, tokens, scale, out);                                                      \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(128) dequant_##NAME(const Weights w, int row0,  \
                                                                   __half* out) { FATHOM_PDL();              \
    dequant_rows<T>(w, row0, out);                                                             \
  }

// The one-token kernels on int8 activations (HasX8 types).
FATHOM_ONE_TOKEN_KERNELS(x8, q8_0, T_Q8_0, true)
FATHOM_ONE_TOKEN_KERNELS(x8, q4_0, T_Q4_0, true)
FATHOM_ONE_TOKEN_KERNELS(x8, q4_k, T_Q4_K, true)
FATHOM_ONE_TOKEN_KERNELS(x8, q6_k, T_Q6_K, true)

// MoE, one token, the routes where route_experts left them ((id, weight)
// pairs): launch slot blockIdx.y runs the expert of route y. Experts of a
// layer lie evenly in the allocation (the backend checks), so expert e is
// the first one's matrix moved by e x stride. No prefetch: which rows are
// read is known only after the wait.
__device__ __forceinline__ Weights routed(Weights w, unsigned long long stride, const unsigned int* routes) {
  w.data += routes[2 * blockIdx.y] * stride;
  return w;
}
// moe_gate_up: out row y = act(x . gate_e) x (x . up_e); moe_down: out row y
// = x row y . down_e (x: k rows, f32 or x8 blocks). Four blocks an SM rather
// than eight: the routing's arguments take the registers that would spill.
#define FATHOM_ROUTED_KERNELS(SUFFIX, NAME, T, X8)                                             \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 4) moe_gate_up##SUFFIX##_##NAME( \
      const Weights gate, const Weights up, unsigned long long gate_stride,                    \
      unsigned long long up_stride, const unsigned int* routes, const float* x, float* out,    \
      int split, int act) {                                                                    \
    FATHOM_PDL();                                                                              \
    matvec<T, 1, true, X8>(routed(gate, gate_stride, routes), routed(up, up_stride, routes), x, \
                           out + (size_t)blockIdx.y * gate.rows, 1, split, act, blockIdx.x);   \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 4) moe_down##SUFFIX##_##NAME(    \
      const Weights w, unsigned long long stride, const unsigned int* routes, const float* x,  \
      float* out, int split) {                                                                 \
    FATHOM_PDL();                                                                              \
    const size_t row = X8 ? (size_t)(w.cols / 32) * X8_BLOCK : (size_t)w.cols * sizeof(float); \
    const float* xy = (const float*)((const uint8_t*)x + blockIdx.y * row);                    \
    const Weights e = routed(w, stride, routes);                                               \
    matvec<T, 1, false, X8>(e, e, xy, out + (size_t)blockIdx.y * w.rows, 1, split, 0, blockIdx.x); \
  }
FATHOM_ROUTED_KERNELS(x8, q8_0, T_Q8_0, true)
FATHOM_ROUTED_KERNELS(x8, q4_0, T_Q4_0, true)
FATHOM_ROUTED_KERNELS(x8, q4_k, T_Q4_K, true)
FATHOM_ROUTED_KERNELS(x8, q6_k, T_Q6_K, true)
FATHOM_ROUTED_KERNELS(, f16, T_F16, false)
FATHOM_ROUTED_KERNELS(, bf16, T_BF16, false)
FATHOM_ROUTED_KERNELS(, q5_k, T_Q5_K, false)

// out = the k rows of src (width values each) weighted by their routes'
// probabilities and summed in expert order from zero: bit for bit what
// zeroing out and scattering each expert's rows adds (scatter_rows). At
// most MOE_MAX_ROUTES routes; one block of 256 threads per 256 values.
#define MOE_MAX_ROUTES 16
extern "C" __global__ void moe_combine(const float* src, const unsigned int* routes, int k, int width,
                                       float* out) { FATHOM_PDL();
  __shared__ int order[MOE_MAX_ROUTES];
  if (threadIdx.x < k) {
    const unsigned int id = routes[2 * threadIdx.x];
    int rank = 0;
    for (int j = 0; j < k; j++) rank += routes[2 * j] < id;
    order[rank] = threadIdx.x;
  }
  __syncthreads();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float acc = 0.0f;
  for (int p = 0; p < k; p++) {
    const int y = order[p];
    acc += __uint_as_float(routes[2 * y + 1]) * src[(size_t)y * width + c];
  }
  out[c] = acc;
}

FATHOM_WEIGHT_KERNELS(f32, T_F32)
FATHOM_WEIGHT_KERNELS(f16, T_F16)
FATHOM_WEIGHT_KERNELS(bf16, T_BF16)
FATHOM_WEIGHT_KERNELS(q4_0, T_Q4_0)
FATHOM_WEIGHT_KERNELS(q4_1, T_Q4_1)
FATHOM_WEIGHT_KERNELS(q5_0, T_Q5_0)
FATHOM_WEIGHT_KERNELS(q5_1, T_Q5_1)
FATHOM_WEIGHT_KERNELS(q8_0, T_Q8_0)
FATHOM_WEIGHT_KERNELS(q2_k, T_Q2_K)
FATHOM_WEIGHT_KERNELS(q3_k, T_Q3_K)
FATHOM_WEIGHT_KERNELS(q4_k, T_Q4_K)
FATHOM_WEIGHT_KERNELS(q5_k, T_Q5_K)
FATHOM_WEIGHT_KERNELS(q6_k, T_Q6_K)
FATHOM_WEIGHT_KERNELS(a2, T_A2)
FATHOM_WEIGHT_KERNELS(a4, T_A4)
FATHOM_WEIGHT_KERNELS(a8, T_A8)

// x (f32) to f16 (bf16 = 0) or bf16 (1), n values, round to nearest even.
extern "C" __global__ void to_half(const float* x, long long n, int bf16, unsigned short* out) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i])) : __half_as_ushort(__float2half_rn(x[i]));
}

// ---------------------------------------------------------------------------
// Row-wise RMS norm, one block a row (32 to 1024 threads, as the host picks
// for the width). Each thread holds its first RMS_HELD values in registers
// between the sum and the scaling, so a row is read once and no thread
// waits on a chain of loads; in place is allowed (a thread writes only
// the values it read). With `add`, x += add first (the residual add before
// a norm), written back to x. The norm's weights never change, so they are
// read before the wait for the kernel ahead. With `x8` (width a multiple of
// 32; one row), the output is also written as int8 activation blocks.
#define RMS_HELD 8
extern "C" __global__ void __launch_bounds__(1024)
rms_norm(float* x, const float* add, const float* w, float eps, int width, float* out, uint8_t* x8) {
  const int n = blockDim.x;
  float wv[RMS_HELD];
#pragma unroll
  for (int k = 0; k < RMS_HELD; k++) {
    const int i = threadIdx.x + k * n;
    wv[k] = i < width ? w[i] : 0.0f;
  }
  FATHOM_PDL();
  __shared__ float part[32];
  float* xr = x + (size_t)blockIdx.x * width;
  const float* ar = add ? add + (size_t)blockIdx.x * width : nullptr;
  float* o = out + (size_t)blockIdx.x * width;
  // Every load before any store: x and add may alias as far as the
  // compiler knows, so a store between them kept one load pair in flight
  // at a time (a chain of L2 round trips: ~3.3 us a norm with the residual
  // add on the H200, 65 of them in an 8B decode step).
  float v[RMS_HELD], a[RMS_HELD];
#pragma unroll
  for (int k = 0; k < RMS_HELD; k++) {
    const int i = threadIdx.x + k * n;
    v[k] = i < width ? xr[i] : 0.0f;
    a[k] = ar && i < width ? ar[i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < RMS_HELD; k++) {
    const int i = threadIdx.x + k * n;
    if (ar && i < width) {
      v[k] += a[k];
      xr[i] = v[k];
    }
    ss += v[k] * v[k];
  }
  for (int i = threadIdx.x + RMS_HELD * n; i < width; i += n) {
    float t = xr[i];
    if (ar) {
      t += ar[i];
      xr[i] = t;
    }
    ss += t * t;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = ss;
  __syncthreads();
  // Each warp sums the warps' parts alike (the same value everywhere).
  const int lane = threadIdx.x % WARP;
  const float total = warp_sum(lane < n / WARP ? part[lane] : 0.0f);
  const float inv = 1.0f / sqrtf(total / (float)width + eps);
  float y[RMS_HELD];
#pragma unroll
  for (int k = 0; k < RMS_HELD; k++) {
    const int i = threadIdx.x + k * n;
    y[k] = v[k] * inv * wv[k];
    if (i < width) o[i] = y[k];
  }
  // i < width is the same for a whole warp when x8 is asked for (width a
  // multiple of 32): the warp's values k < held are blocks warp + k n / 32.
  if (x8) {
    const int held = min(RMS_HELD, (width - (int)threadIdx.x + n - 1) / n);
    x8_store_n<RMS_HELD>(y, held, x8, threadIdx.x / WARP, n / WARP);
  }
  for (int i = threadIdx.x + RMS_HELD * n; i < width; i += n) {
    const float y = xr[i] * inv * w[i];
    o[i] = y;
    if (x8) x8_store(y, x8, i / WARP);
  }
}

// x[i] += b[i % width] over n values.
extern "C" __global__ void add_bias(float* x, const float* b, int width, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    x[i] += b[i % width];
}

extern "C" __global__ void add(float* dst, const float* src, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    dst[i] += src[i];
}

extern "C" __global__ void fill_zero(float* x, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    x[i] = 0.0f;
}

// gate = act(gate) * up; act 0 = silu, 1 = gelu (tanh approximation).
extern "C" __global__ void glu(float* gate, const float* up, long long n, int act) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    gate[i] = glu_act(gate[i], act) * up[i];
  }
}

// dst[i] = src[rows[i]], one block a row.
extern "C" __global__ void gather_rows(const float* src, const unsigned int* rows, int width, float* dst) { FATHOM_PDL();
  const size_t from = (size_t)rows[blockIdx.x] * width, to = (size_t)blockIdx.x * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[to + c] = src[from + c];
}

// dst[rows[i]] += weights[i] * src[i], one block a row (rows distinct).
extern "C" __global__ void scatter_rows(const float* src, const unsigned int* rows, const float* weights,
                                        int width, float* dst) { FATHOM_PDL();
  const size_t to = (size_t)rows[blockIdx.x] * width, from = (size_t)blockIdx.x * width;
  const float wgt = weights[blockIdx.x];
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[to + c] += wgt * src[from + c];
}

// The cosine and sine of pair i's angle at position p for the pair's
// frequency freq (before the model's per-pair factors `freqs`, if any),
// the angle in f64 (at positions in the tens of thousands an f32 angle is
// off by hundredths of a radian).
__device__ __forceinline__ void rope_sincos(double p, double freq, int i, const float* freqs, float* cf,
                                            float* sf) {
  if (freqs) freq /= (double)freqs[i];
  // Reduce to [-pi, pi] in f64, then the fast f32 sine (absolute error
  // ~1e-6 there): library sincos keeps a large-argument path in local memory.
  double angle = p * freq;
  angle -= 6.283185307179586 * rint(angle * 0.15915494309189535);
  __sincosf((float)angle, sf, cf);
}

// Rope of pair i of a head_dim head at position p: the (cos, sin) of its
// angle and the pair's two indices.
__device__ __forceinline__ void rope_pair(double p, int i, int head_dim, double theta, int neox,
                                          const float* freqs, float* cf, float* sf, int* a, int* b) {
  rope_sincos(p, pow(theta, -2.0 * (double)i / (double)head_dim), i, freqs, cf, sf);
  const int half = head_dim / 2;
  *a = neox ? i : 2 * i;
  *b = neox ? i + half : 2 * i + 1;
}

// Rope of one head at position p, from src into dst (the same head in
// place, or a copy): pair i is thread `first + k * step`'s.
__device__ __forceinline__ void rope_head(const float* src, float* dst, double p, int head_dim,
                                          double theta, int neox, const float* freqs, int first, int step) {
  for (int i = first; i < head_dim / 2; i += step) {
    float cf, sf;
    int a, b;
    rope_pair(p, i, head_dim, theta, neox, freqs, &cf, &sf, &a, &b);
    const float x0 = src[a], x1 = src[b];
    dst[a] = x0 * cf - x1 * sf;
    dst[b] = x0 * sf + x1 * cf;
  }
}

// Rope of head blockIdx.y of row blockIdx.x at position pos[blockIdx.x].
extern "C" __global__ void rope(float* x, const int* pos, int n_heads, int head_dim, double theta,
                                int neox, const float* freqs) { FATHOM_PDL();
  float* hd = x + ((size_t)blockIdx.x * n_heads + blockIdx.y) * head_dim;
  rope_head(hd, hd, (double)pos[blockIdx.x], head_dim, theta, neox, freqs, threadIdx.x, blockDim.x);
}

// ---------------------------------------------------------------------------
// KV cache element access. A KV row of one head is `head_bytes` bytes.
__device__ __forceinline__ float kv_load(const uint8_t* head, int i, int dtype) {
  switch (dtype) {
    case KV_F16: return __half2float(((const __half*)head)[i]);
    case KV_BF16: return bf16_bits(((const unsigned short*)head)[i]);
    case KV_F32: return ((const float*)head)[i];
    default: {
      const uint8_t* b = head + (i >> 5) * 34;
      return f16_at(b) * (float)(int8_t)b[2 + (i & 31)];
    }
  }
}

__device__ __forceinline__ int kv_head_bytes(int dtype, int dim) {
  return dtype == KV_F32 ? 4 * dim : dtype == KV_Q8_0 ? (dim / 32) * 34 : 2 * dim;
}

// x (n values, a multiple of 32) as X8_BLOCK-byte blocks for the x8
// kernels: a warp a block.
extern "C" __global__ void quantize_x8(const float* x, int n, uint8_t* out) { FATHOM_PDL();
  const int b = (blockIdx.x * blockDim.x + threadIdx.x) / WARP, lane = threadIdx.x % WARP;
  if (32 * b >= n) return;  // whole warps
  x8_store(x[32 * b + lane], out, b);
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

// Rounds three runs of values in place (a: na values, then b, then c; a
// count of 0 skips a run) to a KV dtype's precision, so the step's own rows
// read what the cache will hold: K, V and, against an f16 cache, q in one
// launch. One thread a value; for q8_0 the runs are whole 32-value blocks
// (head dims are multiples of 32 for a q8_0 cache), one warp a block.
extern "C" __global__ void round_to_kv(float* a, long long na, float* b, long long nb, float* c,
                                       long long nc, int dtype) { FATHOM_PDL();
  const long long n = na + nb + nc;
  for (long long i0 = (long long)blockIdx.x * blockDim.x; i0 < n; i0 += (long long)gridDim.x * blockDim.x) {
    const long long i = i0 + threadIdx.x;
    float* x = nullptr;
    if (i < na) x = a + i;
    else if (i < na + nb) x = b + (i - na);
    else if (i < n) x = c + (i - na - nb);
    const float r = kv_round(x ? *x : 0.0f, dtype);
    if (x) *x = r;
  }
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
  unsigned long long layer_off;  // l * 16 * (k_row + v_row)
  int k_row, v_row;              // bytes of a whole K / V row (all kv heads)
  int ring;                      // positions a sliding window's ring holds, 0 for full
  int dtype;
};

// Byte offset of (block holding position p, this layer) in the group's
// storage; `slot` gets p's row within the block.
__device__ __forceinline__ unsigned long long kv_block(const KvDesc& kv, const StepDesc& st, int seq, int p,
                                                       int* slot) {
  const int rp = kv.ring ? p % kv.ring : p;
  *slot = rp % 16;
  const unsigned int blk = st.tables[(size_t)seq * st.table_stride + rp / 16];
  return (unsigned long long)blk * kv.block_bytes + kv.layer_off;
}

// Causal attention, one block of ATT_WARPS warps per (row, query head).
// Each warp takes every ATT_WARPS-th run of 32 key positions: one position
// a lane (its full dot product with q from shared memory), then an
// online-softmax update of its own output, lanes split by value dims. The
// warps' (max, sum, output) states are merged at the end.
#define ATT_MAX_DIM 512
#define ATT_WARPS 4
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
attention(StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out,
          int n_heads, int n_kv_heads, int key_dim, int value_dim, int window, float scale) { FATHOM_PDL();
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
        const uint8_t* head = kv.base + base + 16ull * kv.k_row + (unsigned long long)slot * kv.v_row +
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
  const float inv = 1.0f / lt;
  float* o = out + ((size_t)row * n_heads + h) * value_dim;
  for (int i = threadIdx.x; i < value_dim; i += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) sum += part_acc[w][i] * f[w];
    o[i] = sum * inv;
  }
}

// Stores value i of a K or V cache row whose bytes start at dst, one thread
// a value: lanes past the row pass in_row = false, and for q8_0 every lane
// of the warp calls (a warp holds one 32-value block).
__device__ __forceinline__ void kv_store(uint8_t* dst, int i, float x, bool in_row, int dtype) {
  if (dtype == KV_Q8_0) {
    float d, id;
    q8_scale(warp_max(in_row ? fabsf(x) : 0.0f), &d, &id);
    if (!in_row) return;
    uint8_t* o = dst + (i / 32) * 34;
    // A 16-bit store (every q8_0 block starts on an even byte: block,
    // layer and row sizes are all even). With two byte stores of the f16
    // bits (`st.global.u8` of the .b16 register, then of it shifted) the
    // low byte read back as 0 on the H200 (nvcc 13.0, sm_90); the 16-bit
    // store was checked byte for byte (tests/conformance.rs, cuda_kv_bytes).
    if (i % 32 == 0) *(unsigned short*)o = __half_as_ushort(__float2half_rn(d));
    o[2 + i % 32] = (uint8_t)(int8_t)(int)rintf(x * id);
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
         (is_v ? 16ull * kv.k_row + (unsigned long long)slot * kv.v_row : (unsigned long long)slot * kv.k_row);
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
  __device__ __noinline__ void compute(int pos, int dim, double ratio, const float* freqs) {
    for (int i = threadIdx.x; i < dim / 2; i += blockDim.x) {
      double freq = 1.0, r = ratio;
      for (int e = i; e; e >>= 1) {
        if (e & 1) freq *= r;
        r *= r;
      }
      rope_sincos((double)pos, freq, i, freqs, &c[i], &s[i]);
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
// (rope: the angles, for q and k heads; null for v), then each value
// rounded to what the cache will hold (round) and left in hs (the warp's
// shared row), written to xo and stored in the cache at dst (each when
// given). rope_kv's work, and the fused decode attention's.
__device__ __forceinline__ void ready_head(const float* x, float* hs, int dim, const RopeAngles* rope, int neox,
                                           bool round, int dtype, float* xo, uint8_t* dst) {
  const int lane = threadIdx.x % WARP;
  if (!rope) {
    for (int i = lane; i < dim; i += WARP) hs[i] = x[i];
  } else {
    for (int i = lane; i < dim / 2; i += WARP) {
      const int a = neox ? i : 2 * i, b = neox ? i + dim / 2 : 2 * i + 1;
      const float x0 = x[a], x1 = x[b], c = rope->c[i], sn = rope->s[i];
      hs[a] = x0 * c - x1 * sn;
      hs[b] = x0 * sn + x1 * c;
    }
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

// ---------------------------------------------------------------------------
// Split attention (flash-decoding). One block of ATT_SPLIT_WARPS warps per
// (row, KV head, chunk of up to H query heads of its GQA group, split of
// the key range): every K and V row is read once for all the query heads
// that share it. A split's key range is cut into runs of 32 positions, each
// warp taking every ATT_SPLIT_WARPS-th run: one position a lane for the
// scores (the lane's whole K row against every head's q in shared memory),
// then the value dims split across the lanes, VPL consecutive dims a lane,
// for the weighted sum. Scores are kept in the log2 domain (exp2f).
// With one split the block writes the output; with more, each writes its
// (max, sum, unnormalized output) per head to the planned partials, and
// attention_merge combines them.
#define ATT_SPLIT_WARPS 4
// Whether a split kernel of VPL value dims a lane and H heads a block does
// a decode step's rope itself (`attention_split_body`).
#define ATT_ROPE_FITS(VPL, H) ((VPL) * (H) <= 32)

// n (2, 4, 8 or 16) consecutive values i0 .. i0 + n of a K/V head in the
// cache's dtype DT (KV_F32 also reads the step's own f32 rows). Aligned:
// head dims are multiples of 8 on this path, so a head starts on 16 bytes
// (f16/bf16/f32), and a q8_0 block's values on 2 bytes.
// The raw 16-bit values i0 .. i0 + n (n = 2, 4, 8 or 16) of an f16 or bf16
// K/V head, as n / 2 words (i0 a multiple of n).
template <int N>
__device__ __forceinline__ void kv_words(const uint8_t* head, int i0, unsigned int* w) {
  const uint8_t* p = head + 2 * i0;
  if (N % 8 == 0) {
#pragma unroll
    for (int k = 0; k < N / 8; k++) {
      const uint4 u = ((const uint4*)p)[k];
      w[4 * k] = u.x; w[4 * k + 1] = u.y; w[4 * k + 2] = u.z; w[4 * k + 3] = u.w;
    }
  } else if (N == 4) {
    const uint2 u = *(const uint2*)p;
    w[0] = u.x; w[N / 2 - 1] = u.y;
  } else {
    w[0] = *(const unsigned int*)p;
  }
}

// kv_words' words as n floats.
template <int DT, int N>
__device__ __forceinline__ void kv_words_to_float(const unsigned int* w, float* o) {
#pragma unroll
  for (int k = 0; k < N / 2; k++) {
    if (DT == KV_F16) {
      o[2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
      o[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
    } else {
      o[2 * k] = __uint_as_float(w[k] << 16);
      o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
}

template <int DT, int N>
__device__ __forceinline__ void kv_loadn(const uint8_t* head, int i0, float* o) {
  if (DT == KV_F32) {
    const float* p = (const float*)head + i0;
    if (N % 4 == 0) {
#pragma unroll
      for (int k = 0; k < N / 4; k++) {
        const float4 f = ((const float4*)p)[k];
        o[4 * k] = f.x; o[4 * k + 1] = f.y; o[4 * k + 2] = f.z; o[4 * k + 3] = f.w;
      }
    } else {
      const float2 f = *(const float2*)p;
      o[0] = f.x; o[1] = f.y;
    }
  } else if (DT == KV_F16 || DT == KV_BF16) {
    unsigned int w[N / 2];
    kv_words<N>(head, i0, w);
    kv_words_to_float<DT, N>(w, o);
  } else {  // q8_0: N values inside one 34-byte block (N divides 32)
    const uint8_t* b = head + (i0 >> 5) * 34;
    const float d = __half2float(__ushort_as_half(*(const unsigned short*)b));
    const unsigned short* qs = (const unsigned short*)(b + 2 + (i0 & 31));
#pragma unroll
    for (int k = 0; k < N / 2; k++) {
      const unsigned short u = qs[k];
      o[2 * k] = d * (float)(int8_t)(u & 0xff);
      o[2 * k + 1] = d * (float)(int8_t)(u >> 8);
    }
  }
}

// dot[h] += q_h . k over key_dim values, k in dtype DT. Unrolled 8 deep
// (where the registers allow) so that a lane's loads of its key row (16 for
// 128 f16 dims) go out together: each lane reads another position's row,
// and these loads were the kernel's latency chain.
template <int DT, int H>
__device__ __forceinline__ void att_dots(const uint8_t* kp, const float* qs, int key_dim, float* dot) {
#pragma unroll(H <= 4 && (DT == KV_F16 || DT == KV_BF16) ? 16 : 2)
  for (int i0 = 0; i0 < key_dim; i0 += 8) {
    float kk[8];
    kv_loadn<DT, 8>(kp, i0, kk);
#pragma unroll
    for (int h = 0; h < H; h++) {
      const float4 a = *(const float4*)(qs + h * ATT_MAX_DIM + i0);
      const float4 b = *(const float4*)(qs + h * ATT_MAX_DIM + i0 + 4);
      dot[h] += a.x * kk[0] + a.y * kk[1] + a.z * kk[2] + a.w * kk[3] + b.x * kk[4] + b.y * kk[5] +
                b.z * kk[6] + b.w * kk[7];
    }
  }
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
    prefetch_run(kv.base + base + 16ull * kv.k_row + (unsigned long long)slot * kv.v_row + (unsigned long long)g * vh, vh);
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
// o + (w * heads + h) * stride, all in shared memory.
template <int WARPS>
__device__ __forceinline__ void att_write_merged(const float* m, const float* l, const float* o, int heads,
                                                 int stride, int nq, int h0, int row, int n_heads, int value_dim,
                                                 int split, int nsplit, float* __restrict__ out,
                                                 float* __restrict__ part, uint8_t* x8) {
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

// rope (a decode step: one token a sequence, no ring): q, k and v are as
// the projections wrote them, and the block does rope_kv's work for what
// it reads — its q heads and its row's own K and V head, roped and rounded
// into shared memory — and the KV head's first block stores that K and V
// in the cache (one launch fewer a layer: on the H200 rope_kv cost ~5 us of
// an 8B F16 decode layer's ~140, with memory idle), with the rope angles
// of the row's position. Null: rope_kv ran. Not where VPL x H > 32 (the
// registers spill: the host does not ask it there).
template <int DT, int VPL, int H>
__device__ void attention_split_body(StepDesc st, KvDesc kv, const float* __restrict__ q,
                                     const float* __restrict__ k, const float* __restrict__ v,
                                     float* __restrict__ out, float* __restrict__ part, uint8_t* x8, int n_heads,
                                     int n_kv_heads, int key_dim, int value_dim, int window, float scale,
                                     const RopeAngles* rope, int neox) {
  // q of the block's heads during the walk; the warps' partial outputs after.
  constexpr int QS = H * ATT_MAX_DIM, PS = ATT_SPLIT_WARPS * H * 32 * VPL;
  __shared__ __align__(16) float sm[QS > PS ? QS : PS];
  __shared__ float part_m[ATT_SPLIT_WARPS][H], part_l[ATT_SPLIT_WARPS][H];
  __shared__ __align__(16) float own_k[ATT_MAX_DIM], own_v[ATT_MAX_DIM];  // with rope
  const int row = blockIdx.x, split = blockIdx.z, nsplit = gridDim.z;
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  const int group = n_heads / n_kv_heads, chunks = (group + H - 1) / H;
  const int g = blockIdx.y / chunks, h0 = g * group + (blockIdx.y % chunks) * H;
  const int nq = min(H, g * group + group - h0);
  const AttRange ar = att_range(st, window, row, split, nsplit);
  const int seq = ar.seq, start = ar.start, lo = ar.lo, hi = ar.hi;
  const int row0 = st.seq_row0[seq];
  att_ready_row<DT, H>(st, kv, q, k, v, row, g, h0, nq, n_heads, n_kv_heads, key_dim, value_dim,
                       ATT_ROPE_FITS(VPL, H) ? rope : nullptr, neox, hi >= start,
                       blockIdx.y % chunks == 0 && split == 0, sm, ATT_MAX_DIM, own_k, own_v);
  __syncthreads();
  const int kh = kv_head_bytes(DT, key_dim), vh = kv_head_bytes(DT, value_dim);
  const float sl2 = scale * 1.4426950408889634f;
  float m[H], l[H], acc[H][VPL];
#pragma unroll
  for (int h = 0; h < H; h++) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; j++) acc[h][j] = 0.0f;
  }
  const int d0 = lane * VPL;
  const bool has_dims = d0 < value_dim;
  for (int p0 = lo + warp * WARP; p0 <= hi; p0 += ATT_SPLIT_WARPS * WARP) {
    const int p = p0 + lane;
    const bool valid = p <= hi;
    float dot[H];
#pragma unroll
    for (int h = 0; h < H; h++) dot[h] = 0.0f;
    const uint8_t* vp = nullptr;
    if (valid) {
      if (p < start) {
        int slot;
        const unsigned long long base = kv_block(kv, st, seq, p, &slot);
        const uint8_t* kp = kv.base + base + (unsigned long long)slot * kv.k_row + (unsigned long long)g * kh;
        vp = kv.base + base + 16ull * kv.k_row + (unsigned long long)slot * kv.v_row + (unsigned long long)g * vh;
        att_dots<DT, H>(kp, sm, key_dim, dot);
      } else {
        // The step's own rows (with rope: the row itself, in shared memory).
        const size_t r = (size_t)(row0 + p - start) * n_kv_heads + g;
        const bool own = ATT_ROPE_FITS(VPL, H) && rope;
        vp = (const uint8_t*)(own ? own_v : v + r * value_dim);
        att_dots<KV_F32, H>((const uint8_t*)(own ? own_k : k + r * key_dim), sm, key_dim, dot);
      }
    }
    float e[H];
#pragma unroll
    for (int h = 0; h < H; h++) {
      const float s = valid ? dot[h] * sl2 : -INFINITY;
      const float mn = fmaxf(m[h], warp_max(s));  // finite: position p0 is valid
      const float rescale = exp2f(m[h] - mn);     // m = -inf at first: 0
      e[h] = valid ? exp2f(s - mn) : 0.0f;
      l[h] = l[h] * rescale + warp_sum(e[h]);
      m[h] = mn;
#pragma unroll
      for (int j = 0; j < VPL; j++) acc[h][j] *= rescale;
    }
    const int n = min(WARP, hi - p0 + 1);
    int jj0 = 0;
    if constexpr (DT == KV_F16 || DT == KV_BF16) {
      // Cached positions (all of a decode row's but its own): every V load
      // of a batch (the whole run for value dims up to 128) goes out before
      // any is used, so a run waits on memory once rather than once per
      // unrolled group; the raw values take at most 64 registers.
      constexpr int NB = VPL <= 4 ? WARP : 128 / VPL;
      const int nc = max(0, min(n, start - p0));  // the same for the whole warp
#pragma unroll
      for (int b0 = 0; b0 < WARP; b0 += NB) {
        if (b0 >= nc) break;
        unsigned int raw[NB][VPL / 2];
#pragma unroll
        for (int b = 0; b < NB; b++) {
          const uint8_t* vr = (const uint8_t*)__shfl_sync(0xffffffffu, (unsigned long long)vp, b0 + b);
          if (b0 + b < nc && has_dims) kv_words<VPL>(vr, d0, raw[b]);
        }
#pragma unroll
        for (int b = 0; b < NB; b++) {
          if (b0 + b < nc) {
            float wgt[H];
#pragma unroll
            for (int h = 0; h < H; h++) wgt[h] = __shfl_sync(0xffffffffu, e[h], b0 + b);
            if (has_dims) {
              float vv[VPL];
              kv_words_to_float<DT, VPL>(raw[b], vv);
#pragma unroll
              for (int h = 0; h < H; h++)
#pragma unroll
                for (int j = 0; j < VPL; j++) acc[h][j] += wgt[h] * vv[j];
            }
          }
        }
      }
      jj0 = nc;
    }
    // The rest (the step's own rows; every position of f32 and q8_0
    // caches), unrolled so that several positions' V loads are in flight
    // (4 rows deep where the accumulators fill the registers).
#pragma unroll(VPL * H <= 16 && DT != KV_F32 ? 8 : 4)
    for (int jj = jj0; jj < n; jj++) {
      const uint8_t* vr = (const uint8_t*)__shfl_sync(0xffffffffu, (unsigned long long)vp, jj);
      float wgt[H];
#pragma unroll
      for (int h = 0; h < H; h++) wgt[h] = __shfl_sync(0xffffffffu, e[h], jj);
      if (has_dims) {
        float vv[VPL];
        if (p0 + jj < start) kv_loadn<DT, VPL>(vr, d0, vv);
        else kv_loadn<KV_F32, VPL>(vr, d0, vv);
#pragma unroll
        for (int h = 0; h < H; h++)
#pragma unroll
          for (int j = 0; j < VPL; j++) acc[h][j] += wgt[h] * vv[j];
      }
    }
  }
  // Merge the warps: a warp that saw no position has m = -inf, l = 0.
  __syncthreads();  // q is no longer read: sm takes the partial outputs
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < H; h++) {
      part_m[warp][h] = m[h];
      part_l[warp][h] = l[h];
    }
  }
#pragma unroll
  for (int h = 0; h < H; h++)
#pragma unroll
    for (int j = 0; j < VPL; j++) sm[((warp * H + h) * WARP + lane) * VPL + j] = acc[h][j];
  __syncthreads();
  att_write_merged<ATT_SPLIT_WARPS>(&part_m[0][0], &part_l[0][0], sm, H, WARP * VPL, nq, h0, row, n_heads,
                                    value_dim, split, nsplit, out, part, x8);
}

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
#define ATT_MMA_WARPS 4
#define ATT_MMA_KEYS 32

__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *(const unsigned*)&h;
}

// The f16 head of (lo, hi) as bits, and the f16 remainder in *rest.
__device__ __forceinline__ unsigned half2_split(float lo, float hi, unsigned* rest) {
  const __half2 h = __floats2half2_rn(lo, hi);
  const float2 back = __half22float2(h);
  *rest = half2_bits(lo - back.x, hi - back.y);
  return *(const unsigned*)&h;
}

template <int D>
__device__ void attention_mma_body(StepDesc st, KvDesc kv, const float* __restrict__ q, const float* __restrict__ k,
                                   const float* __restrict__ v, float* __restrict__ out, int n_seqs, int rows,
                                   int n_heads, int n_kv_heads, int gp, int window, float scale) {
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
          vv = *(const uint4*)(kv.base + b + 16ull * kv.k_row + (unsigned long long)slot * kv.v_row +
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
    const float inv = 1.0f / lt;
    float* orow = out + ((size_t)qrow[i] * n_heads + qhead[i]) * D + (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < D / 8; n++) *(float2*)(orow + n * 8) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
  }
}

#define FATHOM_ATT_MMA(D)                                                                                  \
  extern "C" __global__ void __launch_bounds__(ATT_MMA_WARPS * 32) attention_mma_##D(                    \
      StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out, int n_seqs,     \
      int rows, int n_heads, int n_kv_heads, int gp, int window, float scale) {                           \
    FATHOM_PDL();                                                                                          \
    attention_mma_body<D>(st, kv, q, k, v, out, n_seqs, rows, n_heads, n_kv_heads, gp, window, scale);    \
  }
FATHOM_ATT_MMA(64)
FATHOM_ATT_MMA(128)

// Combines the splits of attention_split: one block per (row, query head);
// with x8 (value_dim a multiple of 32), the output also as int8 activation
// blocks for the one-token x8 matmul after it. The first warp reads every
// split's (max, sum) at once (up to ATT_MAX_SPLITS, ATT_MAX_SPLITS / 32 a
// lane) and leaves each split's weight in shared memory; then a thread a
// value dim sums the splits' outputs, their loads independent of one
// another. (Three loops over the splits, a load at a time, took ~10 us at
// 32 splits on the H200: longer than the split kernel's own work at 4,096
// keys.)
#define ATT_MAX_SPLITS 64
extern "C" __global__ void __launch_bounds__(128)
attention_merge(const float* part, int nsplit, int n_heads, int value_dim, float* out, uint8_t* x8) { FATHOM_PDL();
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

// Rope of a fused decode step's attention (fused = 0: rope_kv ran).
struct AttRope {
  double ratio;  // theta^(-2 / key_dim): RopeAngles::compute
  const float* freqs;
  int neox;
  int fused;
};

// attention_split_<dtype>_<vpl>_<h>: value dims up to 32 x vpl, h query heads a
// block (at most 2 with vpl 16: 4 spill).
#define FATHOM_ATT_SPLIT(NAME, DT, VPL, H)                                                          \
  extern "C" __global__ void __launch_bounds__(ATT_SPLIT_WARPS * 32, 1) attention_split_##NAME##_##VPL##_##H( \
      StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out, float* part,      \
      uint8_t* x8, int n_heads, int n_kv_heads, int key_dim, int value_dim, int window, float scale,        \
      AttRope rope) {                                                                                      \
    const bool fused = ATT_ROPE_FITS(VPL, H) && rope.fused;                                                \
    if (VPL < 16) attention_prefetch<DT>(st, kv, n_heads, n_kv_heads, key_dim, value_dim, window, H,       \
                                         fused ? RopeAngles::threads(key_dim) : 0);                         \
    __shared__ RopeAngles angles;                                                                          \
    if (fused) angles.compute(st.row_pos[blockIdx.x], key_dim, rope.ratio, rope.freqs);                     \
    FATHOM_PDL();                                                                                          \
    if (fused) __syncthreads();                                                                            \
    attention_split_body<DT, VPL, H>(st, kv, q, k, v, out, part, x8, n_heads, n_kv_heads, key_dim, value_dim, \
                                     window, scale, fused ? &angles : nullptr, rope.neox);                 \
  }
#define FATHOM_ATT_SPLIT_HEADS(NAME, DT, VPL) \
  FATHOM_ATT_SPLIT(NAME, DT, VPL, 1)          \
  FATHOM_ATT_SPLIT(NAME, DT, VPL, 2)          \
  FATHOM_ATT_SPLIT(NAME, DT, VPL, 4)          \
  FATHOM_ATT_SPLIT(NAME, DT, VPL, 8)
#define FATHOM_ATT_SPLIT_DIMS(NAME, DT)  \
  FATHOM_ATT_SPLIT_HEADS(NAME, DT, 2)    \
  FATHOM_ATT_SPLIT_HEADS(NAME, DT, 4)    \
  FATHOM_ATT_SPLIT_HEADS(NAME, DT, 8)    \
  FATHOM_ATT_SPLIT(NAME, DT, 16, 1)      \
  FATHOM_ATT_SPLIT(NAME, DT, 16, 2)
FATHOM_ATT_SPLIT_DIMS(f16, KV_F16)
FATHOM_ATT_SPLIT_DIMS(bf16, KV_BF16)
FATHOM_ATT_SPLIT_DIMS(f32, KV_F32)
FATHOM_ATT_SPLIT_DIMS(q8_0, KV_Q8_0)

// Decode attention on tensor cores (f16 cache, equal key and value dims D
// of 64 or 128, GQA groups of up to 8 query heads): one block of
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
#define ATT_DEC_GROUP 8

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
      is_v ? 16ull * kv.k_row + (unsigned long long)slot * kv.v_row : (unsigned long long)slot * kv.k_row;
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
                                          int n_kv_heads, int window, float scale, const RopeAngles* rope, int neox) {
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
                                  nsplit, out, part, x8);
}

// attention_decode_mma_<D>: the split kernels' arguments (key_dim and
// value_dim are D).
#define FATHOM_ATT_DECODE_MMA(D)                                                                              \
  extern "C" __global__ void __launch_bounds__(ATT_MMA_WARPS * 32) attention_decode_mma_##D(                \
      StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out, float* part,        \
      uint8_t* x8, int n_heads, int n_kv_heads, int key_dim, int value_dim, int window, float scale,          \
      AttRope rope) {                                                                                        \
    attention_prefetch<KV_F16>(st, kv, n_heads, n_kv_heads, D, D, window, ATT_DEC_GROUP,                    \
                               rope.fused ? RopeAngles::threads(D) : 0);                                    \
    __shared__ RopeAngles angles;                                                                            \
    if (rope.fused) angles.compute(st.row_pos[blockIdx.x], D, rope.ratio, rope.freqs);                       \
    FATHOM_PDL();                                                                                            \
    if (rope.fused) __syncthreads();                                                                         \
    attention_decode_mma_body<D>(st, kv, q, k, v, out, part, x8, n_heads, n_kv_heads, window, scale,         \
                                 rope.fused ? &angles : nullptr, rope.neox);                                 \
  }
FATHOM_ATT_DECODE_MMA(64)
FATHOM_ATT_DECODE_MMA(128)

// Stores row blockIdx.x's K (blockIdx.y = 0) or V (1) into the cache at its
// position: one block a (row, K or V, 256 values), one thread a value.
extern "C" __global__ void __launch_bounds__(256) kv_write(StepDesc st, KvDesc kv, const float* k,
                                                          const float* v, int k_width, int v_width) { FATHOM_PDL();
  const int row = blockIdx.x, is_v = blockIdx.y;
  const int width = is_v ? v_width : k_width;
  const int i = blockIdx.z * blockDim.x + threadIdx.x;
  if (blockIdx.z * blockDim.x >= width) return;
  const float* src = (is_v ? v : k) + (size_t)row * width;
  kv_store(kv_row_at(kv, st, row, is_v), i, i < width ? src[i] : 0.0f, i < width, kv.dtype);
}

// The step's q, k and v made ready for attention in one launch (one token a
// step runs ~12 launches a layer): rope of q and k, every head rounded in
// place to what the cache will hold (q only against an f16 cache, as
// round_to_kv does), and when `store`, K and V written to the cache (before
// attention only without a ring: attention reads the cache below each
// sequence's start, the step's own rows from k and v). A warp a head, four
// heads a block (a block a head made a 512-token step 39 us a layer: tiny
// blocks in a dozen waves); block (row, y) takes heads 4y .. 4y + 3 of q's
// n_heads, then k's n_kv_heads, then v's.
#define RK_WARPS 4
extern "C" __global__ void __launch_bounds__(RK_WARPS * 32) rope_kv(
    StepDesc st, KvDesc kv, float* q, float* k, float* v, int n_heads, int n_kv_heads, int key_dim,
    int value_dim, double theta, int neox, const float* freqs, int store) {
  __shared__ float heads[RK_WARPS][ATT_MAX_DIM];
  const int warp = threadIdx.x / WARP;
  const int row = blockIdx.x, h = blockIdx.y * RK_WARPS + warp;
  const bool is_q = h < n_heads, is_v = h >= n_heads + n_kv_heads;
  const int g = is_q ? h : is_v ? h - n_heads - n_kv_heads : h - n_heads;
  const int dim = is_v ? value_dim : key_dim;
  // Before the wait for the kernel ahead (which writes q, k and v): the
  // angles of the row's pairs (one position, one key_dim for every q and k
  // head) and this head's cache row.
  __shared__ RopeAngles angles;
  angles.compute(st.row_pos[row], key_dim, pow(theta, -2.0 / key_dim), freqs);
  const bool live = h < n_heads + 2 * n_kv_heads;
  const bool round = !is_q || kv.dtype == KV_F16;
  uint8_t* dst = live && store && !is_q ? kv_row_at(kv, st, row, is_v) + g * kv_head_bytes(kv.dtype, dim) : nullptr;
  FATHOM_PDL();
  __syncthreads();
  if (!live) return;  // a whole warp: only warp syncs below
  float* x = (is_q ? q : is_v ? v : k) + ((size_t)row * (is_q ? n_heads : n_kv_heads) + g) * dim;
  ready_head(x, heads[warp], dim, is_v ? nullptr : &angles, neox, round, kv.dtype, x, dst);
}

// MoE routing, one warp a row: softmax of the router logits, then the k
// largest (ties to the higher expert id, as the CPU's max_by does), each
// (id u32, p f32), renormalized when asked.
extern "C" __global__ void route_experts(const float* logits, int n_experts, int k, int normalize,
                                         unsigned int* routes) { FATHOM_PDL();
  const int row = blockIdx.x, lane = threadIdx.x;
  const float* x = logits + (size_t)row * n_experts;
  float mx = -INFINITY;
  for (int e = lane; e < n_experts; e += WARP) mx = fmaxf(mx, x[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < n_experts; e += WARP) sum += expf(x[e] - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  unsigned int taken[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // experts chosen (up to 256)
  float total = 0.0f;
  unsigned int* out = routes + (size_t)row * k * 2;
  for (int s = 0; s < k; s++) {
    float best = -INFINITY;
    int bi = -1;
    for (int e = lane; e < n_experts; e += WARP) {
      if ((taken[e >> 5] >> (e & 31)) & 1) continue;
      const float pr = expf(x[e] - mx) * inv;
      if (pr > best || (pr == best && e > bi)) { best = pr; bi = e; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi > bi)) { best = ob; bi = oi; }
    }
    if (bi >= 0) taken[bi >> 5] |= 1u << (bi & 31);
    total += best;
    if (lane == 0) {
      out[2 * s] = (unsigned int)bi;
      out[2 * s + 1] = __float_as_uint(best);
    }
  }
  if (normalize && lane == 0) {
    for (int s = 0; s < k; s++) out[2 * s + 1] = __float_as_uint(__uint_as_float(out[2 * s + 1]) / total);
  }
}

// ---------------------------------------------------------------------------
// Greedy picks of the logits rows, so that a greedy step reads back 8 bytes
// a row instead of the vocabulary's logits: per row the index of the first
// largest value, NaN skipped (0 when there is none), and with up to
// GREEDY_BANNED ids banned (ignore_eos) that index unless it is banned, else
// the same scan with the banned ids counted as -inf — what the CPU's argmax
// and the sampler's candidate pass give. greedy_scan cuts each row into
// pieces, a block a piece, and greedy_merge keeps the first best of the
// pieces' (on the H200, for a 128,256 vocabulary: 4.3 + 1.5 us; one block a
// row took ~30 us even with its loads batched: its compares were bound by
// one multiprocessor's issue rate).
#define GREEDY_BANNED 8
#define GREEDY_THREADS 256
#define GREEDY_BATCH 8
struct Banned {
  int n;
  unsigned int ids[GREEDY_BANNED];
};

// Two running picks: [0] plain, [1] with the banned ids as -inf. Index
// 0xffffffff is none, which loses to anything; a larger value wins, then
// the lower index.
struct GreedyPicks {
  float v[2];
  unsigned int i[2];
};

__device__ __forceinline__ void greedy_keep(float* v, unsigned int* i, float ov, unsigned int oi) {
  if (oi != 0xffffffffu && (*i == 0xffffffffu || ov > *v || (ov == *v && oi < *i))) {
    *v = ov;
    *i = oi;
  }
}

__device__ __forceinline__ bool greedy_banned(const Banned& banned, unsigned int i) {
  bool ban = false;
#pragma unroll
  for (int b = 0; b < GREEDY_BANNED; b++) ban |= b < banned.n && banned.ids[b] == i;
  return ban;
}

// Value a at index i, seen after every lower index of this thread's (so a
// strict > keeps the first of equal values).
__device__ __forceinline__ void greedy_see(GreedyPicks& p, float a, unsigned int i, const Banned& banned) {
  if (a != a) return;
  if (p.i[0] == 0xffffffffu || a > p.v[0]) {
    p.v[0] = a;
    p.i[0] = i;
  }
  if (p.i[1] == 0xffffffffu || a > p.v[1]) {
    const float a2 = greedy_banned(banned, i) ? -INFINITY : a;
    if (p.i[1] == 0xffffffffu || a2 > p.v[1]) {
      p.v[1] = a2;
      p.i[1] = i;
    }
  }
}

__device__ __forceinline__ void greedy_warp_keep(GreedyPicks& p) {
#pragma unroll
  for (int k = 0; k < 2; k++)
    for (int o = 16; o > 0; o >>= 1)
      greedy_keep(&p.v[k], &p.i[k], __shfl_xor_sync(0xffffffffu, p.v[k], o),
                  __shfl_xor_sync(0xffffffffu, p.i[k], o));
}

// Block (row, piece): the picks of values piece x per .. + per of the row,
// as (v0, i0 bits, v1, i1 bits) at pieces[row x gridDim.y + piece]. A thread
// loads GREEDY_BATCH values before it compares any (NaN pads past the end).
extern "C" __global__ void __launch_bounds__(GREEDY_THREADS)
greedy_scan(const float* logits, int width, Banned banned, float4* pieces) { FATHOM_PDL();
  __shared__ GreedyPicks warps[GREEDY_THREADS / WARP];
  const int per = (width + gridDim.y - 1) / gridDim.y;
  const int lo = blockIdx.y * per, hi = min(width, lo + per);
  const float* x = logits + (size_t)blockIdx.x * width;
  GreedyPicks p = {{0.0f, 0.0f}, {0xffffffffu, 0xffffffffu}};
  const int n = blockDim.x;
  for (int i0 = lo + threadIdx.x; i0 < hi; i0 += GREEDY_BATCH * n) {
    float batch[GREEDY_BATCH];
#pragma unroll
    for (int u = 0; u < GREEDY_BATCH; u++) batch[u] = i0 + u * n < hi ? x[i0 + u * n] : NAN;
#pragma unroll
    for (int u = 0; u < GREEDY_BATCH; u++) greedy_see(p, batch[u], (unsigned int)(i0 + u * n), banned);
  }
  greedy_warp_keep(p);
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  if (lane == 0) warps[warp] = p;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x / WARP); w++)
#pragma unroll
      for (int k = 0; k < 2; k++) greedy_keep(&p.v[k], &p.i[k], warps[w].v[k], warps[w].i[k]);
    pieces[(size_t)blockIdx.x * gridDim.y + blockIdx.y] =
        make_float4(p.v[0], __uint_as_float(p.i[0]), p.v[1], __uint_as_float(p.i[1]));
  }
}

// One warp a row: the best of its `npieces` pieces, and the sampler's rule
// (the plain pick stands unless it is banned) into out[2 row], out[2 row + 1].
extern "C" __global__ void __launch_bounds__(WARP)
greedy_merge(const float4* pieces, int npieces, Banned banned, unsigned int* out) { FATHOM_PDL();
  GreedyPicks p = {{0.0f, 0.0f}, {0xffffffffu, 0xffffffffu}};
  for (int k = threadIdx.x; k < npieces; k += WARP) {
    const float4 q = pieces[(size_t)blockIdx.x * npieces + k];
    greedy_keep(&p.v[0], &p.i[0], q.x, __float_as_uint(q.y));
    greedy_keep(&p.v[1], &p.i[1], q.z, __float_as_uint(q.w));
  }
  greedy_warp_keep(p);
  if (threadIdx.x == 0) {
    const unsigned int plain = p.i[0] == 0xffffffffu ? 0u : p.i[0];
    const unsigned int other = p.i[1] == 0xffffffffu ? 0u : p.i[1];
    out[2 * blockIdx.x] = plain;
    out[2 * blockIdx.x + 1] = greedy_banned(banned, plain) ? other : plain;
  }
}
