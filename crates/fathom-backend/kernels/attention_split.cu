// Split attention (flash-decoding): attention_split_<dtype>_<vpl>_<h>, with
// a decode step's rope done in the kernel where its registers allow
// (ATT_ROPE_FITS); attention_merge.cu combines the splits. Launched from
// src/cuda/attention.rs. The kernels compiled are fathom_abi.h's
// ATT_SPLIT_KERNELS (from att_split_compiled in src/cuda/abi.rs), and
// ATT_SPLIT_WARPS and ATT_ROPE_MAX come from there too.

#include "attention_common.cuh"
#include "common.cuh"
#include "reduce.cuh"

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
// Whether a split kernel of VPL value dims a lane and H heads a block does
// a decode step's rope itself (`attention_split_body`).
#define ATT_ROPE_FITS(VPL, H) ((VPL) * (H) <= ATT_ROPE_MAX)

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
    const uint8_t* b = head + (i0 >> 5) * Q8_0_BLOCK_BYTES;
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
  // A constant, not the expression: #pragma unroll expands no macros (KV_*).
  constexpr int UNROLL = H <= 4 && (DT == KV_F16 || DT == KV_BF16) ? 16 : 2;
#pragma unroll(UNROLL)
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

// rope (a decode step: one token a sequence, no ring): q, k and v are as
// the projections wrote them, and the block does rope_kv's work for what
// it reads — its q heads and its row's own K and V head, roped and rounded
// into shared memory — and the KV head's first block stores that K and V
// in the cache (one launch fewer a layer: on the H200 rope_kv cost ~5 us of
// an 8B F16 decode layer's ~140, with memory idle), with the rope angles
// of the row's position. Null: rope_kv ran. Not where VPL x H > ATT_ROPE_MAX (the
// registers spill: the host does not ask it there).
template <int DT, int VPL, int H>
__device__ void attention_split_body(StepDesc st, KvDesc kv, const float* __restrict__ q,
                                     const float* __restrict__ k, const float* __restrict__ v,
                                     float* __restrict__ out, float* __restrict__ part, uint8_t* x8, int n_heads,
                                     int n_kv_heads, int key_dim, int value_dim, int window, float scale,
                                     const RopeAngles* rope, int neox, const float* sinks) {
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
        vp = kv.base + base + (unsigned long long)KV_BLOCK_TOKENS * kv.k_row + (unsigned long long)slot * kv.v_row +
             (unsigned long long)g * vh;
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
    constexpr int V_UNROLL = VPL * H <= 16 && DT != KV_F32 ? 8 : 4;  // (no macros in the pragma)
#pragma unroll(V_UNROLL)
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
                                    value_dim, split, nsplit, out, part, x8, sinks);
}

// attention_split_<dtype>_<vpl>_<h>: value dims up to 32 x vpl, h query heads a
// block, KV dtype DT (a KV_* id), for each (NAME, DT, VPL, H) of
// ATT_SPLIT_KERNELS (at most 2 heads with vpl 16: 4 spill).
#define FATHOM_ATT_SPLIT(NAME, DT, VPL, H)                                                          \
  extern "C" __global__ void __launch_bounds__(ATT_SPLIT_WARPS * 32, 1) attention_split_##NAME##_##VPL##_##H( \
      StepDesc st, KvDesc kv, const float* q, const float* k, const float* v, float* out, float* part,      \
      uint8_t* x8, int n_heads, int n_kv_heads, int key_dim, int value_dim, int window, float scale,        \
      AttRope rope, const float* sinks) {                                                                  \
    const bool fused = ATT_ROPE_FITS(VPL, H) && rope.fused;                                                \
    if (VPL < 16) attention_prefetch<DT>(st, kv, n_heads, n_kv_heads, key_dim, value_dim, window, H,       \
                                         fused ? RopeAngles::threads(key_dim) : 0);                         \
    __shared__ RopeAngles angles;                                                                          \
    if (fused) angles.compute(st.row_pos[blockIdx.x], key_dim, rope.ratio, rope.freqs, rope.yarn);          \
    FATHOM_PDL();                                                                                          \
    if (fused) __syncthreads();                                                                            \
    attention_split_body<DT, VPL, H>(st, kv, q, k, v, out, part, x8, n_heads, n_kv_heads, key_dim, value_dim, \
                                     window, scale, fused ? &angles : nullptr, rope.neox, sinks);          \
  }
// ATT_SPLIT_KERNELS numbers the dtypes by their place in abi.rs's ATT_DTYPES.
static_assert(KV_F16 == 0 && KV_BF16 == 1 && KV_F32 == 2 && KV_Q8_0 == 3,
              "ATT_SPLIT_KERNELS' dtype ids are ATT_DTYPES' positions");
ATT_SPLIT_KERNELS(FATHOM_ATT_SPLIT)
