// Greedy picks of logits rows on the device: greedy_scan and greedy_merge.
// Launched from src/cuda/greedy.rs.

#include "common.cuh"

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
// one multiprocessor's issue rate). GREEDY_BANNED, GREEDY_THREADS (a scan
// block's threads) and GREEDY_BATCH (values a thread loads at once) come
// from fathom_abi.h.
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
