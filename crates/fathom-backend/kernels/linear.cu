// A hybrid model's linear-attention layers (Qwen3.5's gated delta rule):
// linear_conv (the short causal convolution, SiLU, q and k scaled to unit
// length) then gated_delta_<D> (the recurrence), each sequence from its
// state slot. Launched from src/cuda/linear.rs, which documents the
// numerics (the CPU backend's, src/cpu/linear.rs) and the state layout.
//
// Both walk a sequence's tokens one after another inside the kernel (each
// token needs the state the one before it left) and spread the rest over
// the GPU: channels for the convolution, (sequence, value head, state
// rows) for the recurrence. A prefill chunk is one launch of each, not one
// per token; a chunked parallel form (as for long prompts in flash-linear-
// attention) would cut the chain, and is not done yet.

#include "attention_common.cuh"
#include "common.cuh"
#include "reduce.cuh"

// Sequence `seq`'s rows of the step: the first and how many (the step's
// `rows` end the last sequence).
__device__ __forceinline__ void lin_rows(const StepDesc& st, int seq, int n_seqs, int rows, int* first, int* n) {
  *first = st.seq_row0[seq];
  *n = (seq + 1 < n_seqs ? st.seq_row0[seq + 1] : rows) - *first;
}

__device__ __forceinline__ float lin_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sum of v over the block, the same in every thread (the partials added in
// warp order, so every thread rounds alike). All threads call.
__device__ __forceinline__ float lin_block_sum(float v, float* partial) {
  v = warp_sum(v);
  __syncthreads();  // the partials' last readers are done
  if (threadIdx.x % WARP == 0) partial[threadIdx.x / WARP] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < (int)blockDim.x / WARP; ++w) s += partial[w];
  return s;
}

// The convolution of head blockIdx.x's channels (q heads, then k heads,
// then v heads; a thread a channel, blockDim.x = the head dim) over
// sequence blockIdx.y's rows of qkv (`channels` a row), token by token from
// the sequence's conv state (zeros at position 0): y = the taps over the
// last taps - 1 inputs and this one, oldest first; silu(y) written in
// place (a thread reads only its own channel, each token before it writes
// it). The first `qk_heads` heads are then scaled to unit length,
// x / sqrt(sum x^2 + eps). The state ends as the last taps - 1 inputs.
// Per slot the layer's conv state lies at `layer_off` values (channel-
// major, oldest first), slot `slots[seq]` at `slot_values` apart.
extern "C" __global__ void __launch_bounds__(1024) linear_conv(StepDesc st, float* qkv, const float* conv_w,
                                                               float* states, const unsigned int* slots,
                                                               long long slot_values, long long layer_off,
                                                               int channels, int taps, int qk_heads, float eps,
                                                               int rows) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, seq = blockIdx.y, past = taps - 1;
  // The taps before the wait for the kernel ahead (weights: not written).
  float w[LIN_MAX_TAPS - 1], win[LIN_MAX_TAPS - 1];
#pragma unroll
  for (int i = 0; i < LIN_MAX_TAPS - 1; ++i) w[i] = i < past ? conv_w[(size_t)c * taps + i] : 0.0f;
  const float w_now = conv_w[(size_t)c * taps + past];
  FATHOM_PDL();
  __shared__ float partial[1024 / WARP];
  int first, n;
  lin_rows(st, seq, gridDim.y, rows, &first, &n);
  float* state = states + (size_t)slots[seq] * slot_values + layer_off + (size_t)c * past;
  const bool fresh = st.seq_start[seq] == 0;
#pragma unroll
  for (int i = 0; i < LIN_MAX_TAPS - 1; ++i) win[i] = i < past && !fresh ? state[i] : 0.0f;
  const bool unit = (int)blockIdx.x < qk_heads;  // the whole block's
  for (int t = first; t < first + n; ++t) {
    float* x = qkv + (size_t)t * channels + c;
    const float in = *x;
    float y = 0.0f;
#pragma unroll
    for (int i = 0; i < LIN_MAX_TAPS - 1; ++i)
      if (i < past) y += win[i] * w[i];
    y += in * w_now;
#pragma unroll
    for (int i = 0; i < LIN_MAX_TAPS - 2; ++i)
      if (i + 1 < past) win[i] = win[i + 1];
#pragma unroll
    for (int i = 0; i < LIN_MAX_TAPS - 1; ++i)
      if (i == past - 1) win[i] = in;
    y = y * lin_sigmoid(y);
    if (unit) y *= 1.0f / sqrtf(lin_block_sum(y * y, partial) + eps);
    *x = y;
  }
#pragma unroll
  for (int i = 0; i < LIN_MAX_TAPS - 1; ++i)
    if (i < past) state[i] = win[i];
}

// ggml's softplus: ln(1 + e^x), x itself past 20.
__device__ __forceinline__ float lin_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The gated delta rule of value head blockIdx.y of sequence blockIdx.z,
// state rows j0 .. j0 + LIN_ROWS of each warp (blockIdx.x cuts the D rows
// into LIN_WARPS x LIN_ROWS a block; row j is value j over the key index,
// lane l holding key indices l + 32 m), token by token over the sequence's
// rows of the convolved qkv:
//   S <- e^g S;  S_j <- S_j + beta (v_j - S_j . k) k;  out_j = S_j . q / sqrt(D)
// with g = decay[h] softplus(alpha + dt_bias[h]) and beta = sigmoid(beta
// input); value head h reads key head (h / key_stride) mod key_heads (stride
// 1: llama.cpp's tiled heads; value_heads / key_heads: HF's grouped heads,
// LinearShape::key_head). The rows start from
// the sequence's slot (zeros at position 0) and are written back there.
template <int D>
__device__ __forceinline__ void gated_delta(StepDesc st, const float* qkv, const float* alpha, const float* beta,
                                            const float* dt_bias, const float* decay, float* states,
                                            const unsigned int* slots, long long slot_values, long long layer_off,
                                            int key_heads, int key_stride, int value_heads, int rows,
                                            float* out) {
  constexpr int EPL = D / WARP;
  const int lane = threadIdx.x % WARP, h = blockIdx.y, seq = blockIdx.z;
  const int j0 = (blockIdx.x * LIN_WARPS + threadIdx.x / WARP) * LIN_ROWS;
  const float bias = dt_bias[h], rate = decay[h];
  FATHOM_PDL();
  if (j0 >= D) return;  // a whole warp
  int first, n;
  lin_rows(st, seq, gridDim.z, rows, &first, &n);
  const int channels = (2 * key_heads + value_heads) * D, src = (h / key_stride) % key_heads;
  float* s = states + (size_t)slots[seq] * slot_values + layer_off + (size_t)h * D * D + (size_t)j0 * D + lane;
  const bool fresh = st.seq_start[seq] == 0;
  float S[LIN_ROWS][EPL];
#pragma unroll
  for (int r = 0; r < LIN_ROWS; ++r)
#pragma unroll
    for (int m = 0; m < EPL; ++m) S[r][m] = fresh ? 0.0f : s[r * D + m * WARP];
  const float scale = 1.0f / sqrtf((float)D);
  for (int t = first; t < first + n; ++t) {
    const float* x = qkv + (size_t)t * channels;
    float q[EPL], k[EPL], v[LIN_ROWS];
#pragma unroll
    for (int m = 0; m < EPL; ++m) {
      q[m] = x[src * D + lane + m * WARP];
      k[m] = x[(key_heads + src) * D + lane + m * WARP];
    }
#pragma unroll
    for (int r = 0; r < LIN_ROWS; ++r) v[r] = x[(2 * key_heads + h) * D + j0 + r];
    const float e = expf(rate * lin_softplus(alpha[(size_t)t * value_heads + h] + bias));
    const float b = lin_sigmoid(beta[(size_t)t * value_heads + h]);
    float* o = out + ((size_t)t * value_heads + h) * D + j0;
#pragma unroll
    for (int r = 0; r < LIN_ROWS; ++r) {
      float sk = 0.0f;
#pragma unroll
      for (int m = 0; m < EPL; ++m) {
        S[r][m] *= e;
        sk += S[r][m] * k[m];
      }
      const float delta = (v[r] - warp_sum(sk)) * b;
      float sq = 0.0f;
#pragma unroll
      for (int m = 0; m < EPL; ++m) {
        S[r][m] += delta * k[m];
        sq += S[r][m] * q[m];
      }
      sq = warp_sum(sq);
      if (lane == r) o[r] = sq * scale;
    }
  }
#pragma unroll
  for (int r = 0; r < LIN_ROWS; ++r)
#pragma unroll
    for (int m = 0; m < EPL; ++m) s[r * D + m * WARP] = S[r][m];
}

#define LIN_DELTA(D)                                                                                                \
  extern "C" __global__ void __launch_bounds__(LIN_WARPS * WARP) gated_delta_##D(                                  \
      StepDesc st, const float* qkv, const float* alpha, const float* beta, const float* dt_bias, const float* decay, \
      float* states, const unsigned int* slots, long long slot_values, long long layer_off, int key_heads,            \
      int key_stride, int value_heads, int rows, float* out) {                                                      \
    gated_delta<D>(st, qkv, alpha, beta, dt_bias, decay, states, slots, slot_values, layer_off, key_heads,           \
                   key_stride, value_heads, rows, out);                                                             \
  }
LIN_DELTA_KERNELS(LIN_DELTA)
#undef LIN_DELTA
