// Matrix-vector kernels for decode (1 to MV_MAX_TOKENS rows of x), per
// weight type: mv1_* (one token through up to three matrices a launch, as
// segments or in one wave of equal warps: matvec_balanced), mvglu1_* (gate
// and up with the activation), their int8-activation forms mv1x8_* and
// mvglu1x8_* (Q8_0, Q4_0, Q4_K, Q6_K; MXFP4 only mv1x8, no f32 forms), and
// mv_* / mvglu_* (several tokens).
// Launched from src/cuda/matvec.rs.

#include "common.cuh"
#include "matvec.cuh"
#include "reduce.cuh"

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

// One token through up to MV_SEGMENTS matrices of one type and width in one
// launch (a layer's q, k and v: one launch keeps the device full where the
// small K and V projections alone would not). Segment i takes blocks
// first[i] .. first[i + 1], each of MV_WARPS / split[i] rows (MV_SEGMENTS:
// fathom_abi.h; the layout is checked against src/cuda/abi.rs's).
struct Segments {
  Weights w[MV_SEGMENTS];
  float* out[MV_SEGMENTS];
  int split[MV_SEGMENTS];
  int first[MV_SEGMENTS + 1];
  int rows_per_block;  // 0: blocks as above; else matvec_balanced (first[] then counts rows)
  int prefetch;        // 0: no L2 prefetch before the wait
};

static_assert(MV_SEGMENTS == 3, "the segment selects below (i == 0 ? .. : i == 1 ? ..) take three");

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

// MV_BALANCED_ROWS (fathom_abi.h): most rows a block of matvec_balanced
// takes (its partial sums in shared memory): at 8 blocks a multiprocessor, 8
// rows a block cover 8,448 rows in one wave on 132 multiprocessors.

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

// The one-token kernels of type T: mv1<SUFFIX>_<NAME> (a launch over up to
// three matrices) and mvglu1<SUFFIX>_<NAME> (gate and up with the
// activation), on f32 activations (X8 false, no suffix) or quantize_x8's
// (X8 true). Both ask L2 for their first rows before the dependency wait.
#define FATHOM_ONE_TOKEN_KERNELS(SUFFIX, NAME, T, X8) \
  FATHOM_MV1_KERNEL(SUFFIX, NAME, T, X8)                \
  FATHOM_MVGLU1_KERNEL(SUFFIX, NAME, T, X8)
#define FATHOM_MV1_KERNEL(SUFFIX, NAME, T, X8)                                                  \
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
  }
#define FATHOM_MVGLU1_KERNEL(SUFFIX, NAME, T, X8)                                               \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8) mvglu1##SUFFIX##_##NAME(      \
      const Weights gate, const Weights up, const float* x, float* out, int ntok, int split,   \
      int act) {                                                                                \
    prefetch_row(gate, blockIdx.x, split, MV_WARPS, 2);                                         \
    prefetch_row(up, blockIdx.x, split, MV_WARPS, 2);                                           \
    FATHOM_PDL();                                                                               \
    matvec<T, 1, true, X8>(gate, up, x, out, ntok, split, act, blockIdx.x);                     \
  }

// The one-token kernels of every weight type on f32 activations,
// mv1_<NAME> and mvglu1_<NAME> (above).
#define FATHOM_MATVEC_KERNELS(NAME, T) FATHOM_ONE_TOKEN_KERNELS(, NAME, T, false)

// mv_<NAME> and mvglu_<NAME> (up to MV_MAX_TOKENS tokens): the float types
// only (f32 has no tensor-core path; f16 and bf16 rows whose width is not
// a multiple of 32 take these).
#define FATHOM_FEW_TOKEN_KERNELS(NAME, T)                                                      \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8)                               \
      mv_##NAME(const Weights w, const float* x, float* out, int ntok, int split) { FATHOM_PDL(); \
    matvec<T, MV_MAX_TOKENS, false>(w, w, x, out, ntok, split, 0, blockIdx.x);                  \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 8) mvglu_##NAME(                 \
      const Weights gate, const Weights up, const float* x, float* out, int ntok, int split,   \
      int act) { FATHOM_PDL();                                                                  \
    matvec<T, MV_MAX_TOKENS, true>(gate, up, x, out, ntok, split, act, blockIdx.x);             \
  }

// The one-token kernels on int8 activations (HasX8 types).
FATHOM_ONE_TOKEN_KERNELS(x8, q8_0, T_Q8_0, true)
FATHOM_ONE_TOKEN_KERNELS(x8, q4_0, T_Q4_0, true)
FATHOM_ONE_TOKEN_KERNELS(x8, q4_k, T_Q4_K, true)
FATHOM_ONE_TOKEN_KERNELS(x8, q6_k, T_Q6_K, true)
// MXFP4 (gpt-oss's experts, whose biases keep gate and up apart): no fused
// gate + up kernel, for the kernel image's planned bytes.
FATHOM_MV1_KERNEL(x8, mxfp4, T_MXFP4, true)

FATHOM_WEIGHT_TYPES(FATHOM_MATVEC_KERNELS)
FATHOM_FEW_TOKEN_KERNELS(f32, T_F32)
FATHOM_FEW_TOKEN_KERNELS(f16, T_F16)
FATHOM_FEW_TOKEN_KERNELS(bf16, T_BF16)
