// How each weight type's bytes become values: decode8 / load8 (eight values
// at a time, every type), the 32-value chunks of Q4_K, Q5_K and Q6_K, and
// the int8 activation blocks (x8: their layout, quantization, and dp4a
// products against Q8_0, Q4_0, Q4_K, Q6_K and MXFP4); with the dot products of a
// decoded chunk that the matrix-vector paths share.

#pragma once

#include "common.cuh"

// The shifts and masks below count 8-value chunks of a block: four of a
// QK-value block (c >> 2, c & 3), 32 of a QK_K-value one (c >> 5, c & 31).
static_assert(QK == 32 && QK_K == 256,
              "decode8 and the chunks' shifts and masks assume 32- and 256-value blocks");

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

// Bytes 0..3 of u as floats, 2^23 + byte - bias each (bias 2^23 + the
// type's zero point, so that q is exact).
__device__ __forceinline__ void bytes4(unsigned int u, float* o, float bias) {
#pragma unroll
  for (int k = 0; k < 4; k++) o[k] = __int_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | k)) - bias;
}

#define F2_23 8388608.0f

// MXFP4 (17-byte blocks: an e8m0 scale byte, then 16 bytes of e2m1 codes,
// value j the low nibble of byte j for j < 16, else the high nibble of byte
// j - 16; blocks only byte aligned). A code is looked up as ggml's
// kvalues_mxfp4 (twice its e2m1 value: 0, 1, 2, 3, 4, 6, 8, 12 and their
// negatives) and the block's values are that times 2^(e - 128).
__device__ __forceinline__ float mxfp4_scale(unsigned int e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}
// Four codes (bytes of `codes`, each 0..15) as their four int8 values: a
// byte permute picks each from the table's positive half and one from its
// negative half by the code's low 3 bits, and a third by its sign bit.
__device__ __forceinline__ unsigned int mxfp4_values4(unsigned int codes) {
  const unsigned int t = codes | (codes >> 4);
  const unsigned int sel = (t & 0xffu) | ((t >> 8) & 0xff00u);  // nibble k: code k
  const unsigned int pos = __byte_perm(0x03020100u, 0x0C080604u, sel & 0x7777u);
  const unsigned int neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel & 0x7777u);
  return __byte_perm(pos, neg, 0x3210u | ((sel & 0x8888u) >> 1));
}
// The 4-byte words covering bytes p .. p + 16 of a byte-aligned block, from
// the aligned word at or below p: word k of the result is bytes
// p + 1 + 4k .. p + 4 + 4k (an MXFP4 block's codes), *e the byte at p.
// Five aligned words, each holding a byte of the block.
__device__ __forceinline__ void mxfp4_block_words(const uint8_t* p, unsigned int* e, unsigned int* qs) {
  const unsigned int s = (unsigned int)(uintptr_t)p & 3u;
  const unsigned int* a = (const unsigned int*)(p - s);  // (not via an integer: stays a global load)
  unsigned int w[5];
#pragma unroll
  for (int k = 0; k < 5; k++) w[k] = a[k];
  *e = (w[0] >> (8 * s)) & 0xffu;
#pragma unroll
  for (int k = 0; k < 4; k++) qs[k] = __funnelshift_rc(w[k], w[k + 1], 8 * (s + 1));
}

// Weight types whose values carry an offset besides the scale (d x q + m).
template <int T>
struct HasOffset {
  static constexpr bool value = T == T_Q4_1 || T == T_Q5_1 || T == T_Q2_K || T == T_Q4_K ||
                                T == T_Q5_K || T >= T_AFFINE;
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
    const uint8_t* b = row + (c >> 2) * Q8_0_BLOCK_BYTES;
    *d = f16_at(b);
    // int8 flipped to unsigned (the xor), as floats less 128.
    const uint2 v = load_bytes8<2>(b + 2 + (c & 3) * 8);
    bytes4(v.x ^ 0x80808080u, q, F2_23 + 128.0f);
    bytes4(v.y ^ 0x80808080u, q + 4, F2_23 + 128.0f);
  } else if (T == T_Q4_0 || T == T_Q4_1) {
    // Value j of a block: the low nibble of byte j for j < 16, else the
    // high nibble of byte j - 16.
    constexpr int bytes = T == T_Q4_0 ? Q4_0_BLOCK_BYTES : Q4_1_BLOCK_BYTES, qs = T == T_Q4_0 ? 2 : 4;
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
    constexpr int bytes = T == T_Q5_0 ? Q5_0_BLOCK_BYTES : Q5_1_BLOCK_BYTES, qs = T == T_Q5_0 ? 6 : 8;
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
    const uint8_t* b = row + (c >> 5) * Q2_K_BLOCK_BYTES;
    const int i0 = (c & 31) * 8;
    const int s = b[i0 >> 4];
    *d = f16_at(b + 80) * (float)(s & 0x0f);
    *m = -f16_at(b + 82) * (float)(s >> 4);
    const int n = i0 >> 7, j = (i0 & 127) >> 5;
    const uint2 v = load_bytes8<4>(b + 16 + 32 * n + (i0 & 31));
#pragma unroll
    for (int k = 0; k < 8; k++) q[k] = small_int_to_float((int)((byte_at(v, k) >> (2 * j)) & 3u));
  } else if (T == T_Q3_K) {
    const uint8_t* b = row + (c >> 5) * Q3_K_BLOCK_BYTES;
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
    constexpr int bytes = T == T_Q4_K ? Q4_K_BLOCK_BYTES : Q5_K_BLOCK_BYTES;
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
    const uint8_t* b = row + (c >> 5) * Q6_K_BLOCK_BYTES;
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
  } else if (T == T_MXFP4) {
    // Values 8c .. 8c + 7: codes j0 .. j0 + 7 of block c / 4 (j0 = 8 (c % 4)),
    // from the two words of codes bytes j0 % 16 .. + 8.
    const uint8_t* b = row + (c >> 2) * MXFP4_BLOCK_BYTES;
    unsigned int e, qs[4];
    mxfp4_block_words(b, &e, qs);
    const int j0 = (c & 3) * 8, shift = 4 * (j0 >> 4), k0 = (j0 & 15) >> 2;
    *d = mxfp4_scale(e);
    // int8 values flipped to unsigned (the xor), as floats less 128.
    bytes4(mxfp4_values4((qs[k0] >> shift) & 0x0f0f0f0fu) ^ 0x80808080u, q, F2_23 + 128.0f);
    bytes4(mxfp4_values4((qs[k0 + 1] >> shift) & 0x0f0f0f0fu) ^ 0x80808080u, q + 4, F2_23 + 128.0f);
  } else {  // MLX affine, T = T_AFFINE + bits: 8 values are `bits` bytes
    constexpr int bits = T >= T_AFFINE ? T - T_AFFINE : 8;
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
  return QK_K * (c >> 3) + 128 * ((c >> 2) & 1) + 8 * (c & 3);
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
    constexpr int bytes = T == T_Q4_K ? Q4_K_BLOCK_BYTES : Q5_K_BLOCK_BYTES, qs = T == T_Q4_K ? 16 : 48;
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
    const uint8_t* b = w.data + (unsigned long long)r * w.row_bytes + (c >> 3) * Q6_K_BLOCK_BYTES;
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
// read 1.95 TB/s of weights against 3.3 for F16). X8_BLOCK comes from
// fathom_abi.h (the launchers size the blocks' buffers by it).
static_assert(X8_BLOCK % 16 == 0 && X8_BLOCK >= 16 + QK, "x8 block: 16-byte loads, QK quants from byte 16");

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
  static constexpr bool value = T == T_Q8_0 || T == T_Q4_0 || T == T_Q4_K || T == T_Q6_K || T == T_MXFP4;
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
    const uint8_t* b = row + (unsigned long long)(c >> 2) * Q4_K_BLOCK_BYTES;
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
    const uint8_t* b = row + (unsigned long long)(c >> 2) * Q6_K_BLOCK_BYTES;
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
    const Window<Q8_0_BLOCK_BYTES> v(row + (unsigned long long)c * Q8_0_BLOCK_BYTES);
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) dot = __dp4a((int)v.word(2 + 4 * k), xq[k], dot);
    return xb[0].d * __half2float(__ushort_as_half((unsigned short)(v.word(0) & 0xffffu))) * (float)dot;
  } else if (T == T_MXFP4) {  // Q4_0's nibble order, each code looked up
    const int* xq = xb[0].q;
    unsigned int e, qs[4];
    mxfp4_block_words(row + (unsigned long long)c * MXFP4_BLOCK_BYTES, &e, qs);
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      dot = __dp4a((int)mxfp4_values4(qs[k] & 0x0f0f0f0fu), xq[k], dot);
      dot = __dp4a((int)mxfp4_values4((qs[k] >> 4) & 0x0f0f0f0fu), xq[k + 4], dot);
    }
    return xb[0].d * mxfp4_scale(e) * (float)dot;
  } else {  // Q4_0: quants q - 8, the low nibbles of bytes 0..15 then the high ones
    const int* xq = xb[0].q;
    const Window<Q4_0_BLOCK_BYTES> v(row + (unsigned long long)c * Q4_0_BLOCK_BYTES);
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
