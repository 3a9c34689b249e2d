// Mixture-of-experts kernels: route_experts (softmax and top k of the
// router logits, on the device), moe_gate_up_* and moe_down_* (one token
// through its routed experts: matvec.cuh's body on an expert's matrices),
// and moe_combine (the experts' rows weighted and summed).
// Launched from src/cuda/moe.rs.

#include "common.cuh"
#include "matvec.cuh"
#include "reduce.cuh"

// MoE, one token, the routes where route_experts left them ((id, weight)
// pairs): launch slot blockIdx.y runs the expert of route y. Experts of a
// layer lie evenly in the allocation (the backend checks), so expert e is
// the first one's matrix moved by e x stride. No prefetch: which rows are
// read is known only after the wait.
__device__ __forceinline__ Weights routed(Weights w, unsigned long long stride, const unsigned int* routes) {
  w.data += routes[2 * blockIdx.y] * stride;
  return w;
}
// The routed expert's bias (gpt-oss): the first expert's moved by id x
// stride bytes, as its matrices; null (no biases) stays null.
__device__ __forceinline__ const float* routed_bias(const float* b, unsigned long long stride,
                                                    const unsigned int* routes) {
  return b ? (const float*)((const uint8_t*)b + routes[2 * blockIdx.y] * stride) : nullptr;
}
// moe_gate_up: out row y = act(x . gate_e + bg_e) x (x . up_e + bu_e); moe_down:
// out row y = x row y . down_e + bd_e (x: k rows, f32 or x8 blocks; the
// biases, gpt-oss's, null for none). Four blocks an SM rather than eight:
// the routing's arguments take the registers that would spill.
#define FATHOM_ROUTED_KERNELS(SUFFIX, NAME, T, X8)                                             \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 4) moe_gate_up##SUFFIX##_##NAME( \
      const Weights gate, const Weights up, unsigned long long gate_stride,                    \
      unsigned long long up_stride, const unsigned int* routes, const float* x, float* out,    \
      int split, int act, const float* gate_bias, const float* up_bias,                        \
      unsigned long long bias_stride) {                                                        \
    FATHOM_PDL();                                                                              \
    matvec<T, 1, true, X8>(routed(gate, gate_stride, routes), routed(up, up_stride, routes), x, \
                           out + (size_t)blockIdx.y * gate.rows, 1, split, act, blockIdx.x,    \
                           routed_bias(gate_bias, bias_stride, routes),                        \
                           routed_bias(up_bias, bias_stride, routes));                         \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, 4) moe_down##SUFFIX##_##NAME(    \
      const Weights w, unsigned long long stride, const unsigned int* routes, const float* x,  \
      float* out, int split, const float* bias, unsigned long long bias_stride) {              \
    FATHOM_PDL();                                                                              \
    const size_t row = X8 ? (size_t)(w.cols / QK) * X8_BLOCK : (size_t)w.cols * sizeof(float); \
    const float* xy = (const float*)((const uint8_t*)x + blockIdx.y * row);                    \
    const Weights e = routed(w, stride, routes);                                               \
    matvec<T, 1, false, X8>(e, e, xy, out + (size_t)blockIdx.y * w.rows, 1, split, 0, blockIdx.x, \
                            routed_bias(bias, bias_stride, routes));                           \
  }
FATHOM_ROUTED_KERNELS(x8, q8_0, T_Q8_0, true)
FATHOM_ROUTED_KERNELS(x8, q4_0, T_Q4_0, true)
FATHOM_ROUTED_KERNELS(x8, q4_k, T_Q4_K, true)
FATHOM_ROUTED_KERNELS(x8, q6_k, T_Q6_K, true)
FATHOM_ROUTED_KERNELS(x8, mxfp4, T_MXFP4, true)
FATHOM_ROUTED_KERNELS(, f16, T_F16, false)
FATHOM_ROUTED_KERNELS(, bf16, T_BF16, false)
FATHOM_ROUTED_KERNELS(, q5_k, T_Q5_K, false)

// order[p] = the route (of one row's k, (id, weight) pairs) with the p-th
// smallest expert id: the order the experts' outputs are summed in. The
// block's first k threads write it; all threads wait for it.
__device__ __forceinline__ void routes_in_expert_order(const unsigned int* routes, int k, int* order) {
  if (threadIdx.x < k) {
    const unsigned int id = routes[2 * threadIdx.x];
    int rank = 0;
    for (int j = 0; j < k; j++) rank += routes[2 * j] < id;
    order[rank] = threadIdx.x;
  }
  __syncthreads();
}

// out = the k rows of src (width values each) weighted by their routes'
// probabilities and summed in expert order from zero: bit for bit what
// zeroing out and scattering each expert's rows adds (scatter_rows). At
// most MOE_MAX_ROUTES routes (fathom_abi.h); one block of 256 threads per
// 256 values.
extern "C" __global__ void moe_combine(const float* src, const unsigned int* routes, int k, int width,
                                       float* out) { FATHOM_PDL();
  __shared__ int order[MOE_MAX_ROUTES];
  routes_in_expert_order(routes, k, order);
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float acc = 0.0f;
  for (int p = 0; p < k; p++) {
    const int y = order[p];
    acc += __uint_as_float(routes[2 * y + 1]) * src[(size_t)y * width + c];
  }
  out[c] = acc;
}

// MoE routing, one warp a row: softmax of the router logits, then the k
// largest (ties to the higher expert id, as the CPU's max_by does), each
// (id u32, p f32), renormalized when asked. At most MAX_EXPERTS experts.
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
  unsigned int taken[MAX_EXPERTS / 32] = {};  // experts chosen, a bit each
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

// A MoE step of many rows without reading its routes back (issue 36): the
// (row, route) pairs grouped by expert (moe_group), the rows gathered in
// that order as f16 (moe_rows_to_half), every expert's gate and up over its
// rows in one launch each (matmul_mma.cu's mq kernels with tiles), act(gate)
// x up as f16 (moe_glu_half), the down products likewise, and each row's
// routes weighted and summed in expert order (moe_combine_rows). Each
// routed row's products depend on that row alone, so the order of rows
// within an expert (atomics below) does not change a value.

// One block of 1,024 threads: per expert its routed rows counted, their
// starts in expert order, and per routed row (in that order) its row and
// expert; per (row, route) where it went (position); and the tiles of at
// most `tile` rows each expert's rows are cut into: tiles[0] their count,
// then per tile (expert, first routed row, rows). At most MAX_EXPERTS
// experts.
extern "C" __global__ void __launch_bounds__(1024) moe_group(const unsigned int* routes, int rows, int k,
                                                             int n_experts, int tile, unsigned int* token_of,
                                                             unsigned int* expert_of, unsigned int* position,
                                                             unsigned int* tiles) {
  FATHOM_PDL();
  __shared__ unsigned int count[MAX_EXPERTS], cursor[MAX_EXPERTS];
  const int n = rows * k;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&count[routes[2 * i]], 1u);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int start = 0, nt = 0;
    for (int e = 0; e < n_experts; e++) {
      cursor[e] = start;
      for (unsigned int p = 0; p < count[e]; p += tile) {
        tiles[1 + 3 * nt] = e;
        tiles[2 + 3 * nt] = start + p;
        tiles[3 + 3 * nt] = min((unsigned int)tile, count[e] - p);
        nt++;
      }
      start += count[e];
    }
    tiles[0] = nt;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const unsigned int e = routes[2 * i];
    const unsigned int p = atomicAdd(&cursor[e], 1u);
    token_of[p] = i / k;
    expert_of[p] = e;
    position[i] = p;
  }
}

// Routed row p (a block each): row token_of[p] of x (cols values) as f16,
// scaled as to_half_rows scales.
extern "C" __global__ void __launch_bounds__(256) moe_rows_to_half(const float* x, const unsigned int* token_of,
                                                                    int cols, __half* out, float* unscale) {
  FATHOM_PDL();
  half_row(x + (size_t)token_of[blockIdx.x] * cols, cols, out + (size_t)blockIdx.x * cols,
           unscale + blockIdx.x);
}

// Routed row p (a block each): gate row p = act(gate + bg_e) x (up + bu_e)
// with e its expert (the biases gpt-oss's: the first expert's moved by e x
// bias_stride bytes; null for none), then that row as f16, scaled as
// to_half_rows scales, for the down product.
extern "C" __global__ void __launch_bounds__(256) moe_glu_half(float* gate, const float* up,
                                                                const unsigned int* expert_of, int cols, int act,
                                                                const float* gate_bias, const float* up_bias,
                                                                unsigned long long bias_stride, __half* out,
                                                                float* unscale) {
  FATHOM_PDL();
  const size_t row = (size_t)blockIdx.x * cols;
  const size_t moved = (size_t)expert_of[blockIdx.x] * bias_stride;
  const float* bg = gate_bias ? (const float*)((const uint8_t*)gate_bias + moved) : nullptr;
  const float* bu = up_bias ? (const float*)((const uint8_t*)up_bias + moved) : nullptr;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float g = bg ? gate[row + i] + bg[i] : gate[row + i];
    const float u = bu ? up[row + i] + bu[i] : up[row + i];
    gate[row + i] = glu_value(g, u, act);
  }
  half_row(gate + row, cols, out + row, unscale + blockIdx.x);
}

// out row t = its k routes' down rows (+ the expert's down bias, gpt-oss's;
// null for none), weighted by their probabilities and summed in expert
// order from zero, as moe_combine sums one row's. Blocks of 256 values,
// blockIdx.y the row.
extern "C" __global__ void moe_combine_rows(const float* down, const unsigned int* position,
                                            const unsigned int* routes, int k, int width,
                                            const float* bias, unsigned long long bias_stride, float* out) {
  FATHOM_PDL();
  __shared__ int order[MOE_MAX_ROUTES];
  const unsigned int* r = routes + (size_t)blockIdx.y * k * 2;
  routes_in_expert_order(r, k, order);
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float acc = 0.0f;
  for (int p = 0; p < k; p++) {
    const int y = order[p];
    float v = down[(size_t)position[(size_t)blockIdx.y * k + y] * width + c];
    if (bias) v += ((const float*)((const uint8_t*)bias + (size_t)r[2 * y] * bias_stride))[c];
    acc += __uint_as_float(r[2 * y + 1]) * v;
  }
  out[(size_t)blockIdx.y * width + c] = acc;
}
