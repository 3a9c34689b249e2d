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

// out = the k rows of src (width values each) weighted by their routes'
// probabilities and summed in expert order from zero: bit for bit what
// zeroing out and scattering each expert's rows adds (scatter_rows). At
// most MOE_MAX_ROUTES routes (fathom_abi.h); one block of 256 threads per
// 256 values.
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
