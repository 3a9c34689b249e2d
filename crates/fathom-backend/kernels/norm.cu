// RMS norm (rms_norm): one block a row, with the residual add before it and
// int8 activation blocks after it when asked. Launched from
// src/cuda/norm.rs.

#include "common.cuh"
#include "quant.cuh"
#include "reduce.cuh"

// ---------------------------------------------------------------------------
// Row-wise RMS norm, one block a row (32 to 1024 threads, as the host picks
// for the width). Each thread holds its first RMS_HELD values in registers
// between the sum and the scaling, so a row is read once and no thread
// waits on a chain of loads; in place is allowed (a thread writes only
// the values it read). With `add`, x += add first (the residual add before
// a norm), written back to x. The norm's weights never change, so they are
// read before the wait for the kernel ahead. A null `w` weighs every value
// 1 (Gemma 4's values, normed per head without a weight). With `x8` (width
// a multiple of 32; one row), the output is also written as int8 activation
// blocks.
#define RMS_HELD 8
extern "C" __global__ void __launch_bounds__(1024)
rms_norm(float* x, const float* add, const float* w, float eps, int width, float* out, uint8_t* x8) {
  const int n = blockDim.x;
  float wv[RMS_HELD];
#pragma unroll
  for (int k = 0; k < RMS_HELD; k++) {
    const int i = threadIdx.x + k * n;
    wv[k] = i < width ? (w ? w[i] : 1.0f) : 0.0f;
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
    const float y = xr[i] * inv * (w ? w[i] : 1.0f);
    o[i] = y;
    if (x8) x8_store(y, x8, i / WARP);
  }
}
