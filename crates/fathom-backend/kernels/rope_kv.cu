// Rope and the KV cache writes outside attention: rope (in place),
// round_to_kv (values rounded to the cache's precision), kv_write (K and V
// rows into the cache) and rope_kv (all three for a step's q, k and v in
// one launch). Launched from src/cuda/rope_kv.rs.

#include "attention_common.cuh"
#include "common.cuh"

// Rope of pair i of a head_dim head at position p: the (cos, sin) of its
// angle and the pair's two indices.
__device__ __forceinline__ void rope_pair(double p, int i, int head_dim, double theta, int neox,
                                          const float* freqs, const RopeYarn& yarn, float* cf, float* sf, int* a,
                                          int* b) {
  rope_sincos(p, pow(theta, -2.0 * (double)i / (double)head_dim), i, freqs, yarn, cf, sf);
  const int half = head_dim / 2;
  *a = neox ? i : 2 * i;
  *b = neox ? i + half : 2 * i + 1;
}

// Rope of one head at position p, from src into dst (the same head in
// place, or a copy): pair i is thread `first + k * step`'s.
__device__ __forceinline__ void rope_head(const float* src, float* dst, double p, int head_dim,
                                          double theta, int neox, const float* freqs, const RopeYarn& yarn,
                                          int first, int step) {
  for (int i = first; i < head_dim / 2; i += step) {
    float cf, sf;
    int a, b;
    rope_pair(p, i, head_dim, theta, neox, freqs, yarn, &cf, &sf, &a, &b);
    const float x0 = src[a], x1 = src[b];
    dst[a] = x0 * cf - x1 * sf;
    dst[b] = x0 * sf + x1 * cf;
  }
}

// Rope of head blockIdx.y of row blockIdx.x at position pos[blockIdx.x]:
// its first `rot` values rotate among themselves (frequencies over rot,
// NeoX pairs within them), the rest pass through (partial rope, Qwen3.5;
// rot = head_dim rotates the whole head).
extern "C" __global__ void rope(float* x, const int* pos, int n_heads, int head_dim, double theta,
                                int neox, const float* freqs, int rot, RopeYarn yarn) { FATHOM_PDL();
  float* hd = x + ((size_t)blockIdx.x * n_heads + blockIdx.y) * head_dim;
  rope_head(hd, hd, (double)pos[blockIdx.x], rot, theta, neox, freqs, yarn, threadIdx.x, blockDim.x);
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

// Stores row blockIdx.x's K (blockIdx.y = 0) or V (1) into the cache at its
// position: one block a (row, K or V, 256 values), one thread a value. A
// ring smaller than a sequence's rows in the step (gpt-oss's window of 128
// under a 512-token chunk) gets only the rows no later row of the sequence
// overwrites: rows of a sequence are consecutive positions, so row + ring
// takes the same slot; without this, blocks raced for the slot and an
// older position could win it.
extern "C" __global__ void __launch_bounds__(256) kv_write(StepDesc st, KvDesc kv, const float* k,
                                                          const float* v, int k_width, int v_width) { FATHOM_PDL();
  const int row = blockIdx.x, is_v = blockIdx.y;
  if (kv.ring && row + kv.ring < (int)gridDim.x && st.row_seq[row + kv.ring] == st.row_seq[row]) return;
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
// n_heads, then k's n_kv_heads, then v's. RK_WARPS (the heads a block) and
// ATT_MAX_DIM come from fathom_abi.h. `rot`: the leading values of each q
// and k head that rotate (partial rope, as `rope`; key_dim for all).
extern "C" __global__ void __launch_bounds__(RK_WARPS * 32) rope_kv(
    StepDesc st, KvDesc kv, float* q, float* k, float* v, int n_heads, int n_kv_heads, int key_dim,
    int value_dim, double theta, int neox, const float* freqs, int store, int rot, RopeYarn yarn) {
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
  angles.compute(st.row_pos[row], rot, pow(theta, -2.0 / rot), freqs, yarn);
  const bool live = h < n_heads + 2 * n_kv_heads;
  const bool round = !is_q || kv.dtype == KV_F16;
  uint8_t* dst = live && store && !is_q ? kv_row_at(kv, st, row, is_v) + g * kv_head_bytes(kv.dtype, dim) : nullptr;
  FATHOM_PDL();
  __syncthreads();
  if (!live) return;  // a whole warp: only warp syncs below
  float* x = (is_q ? q : is_v ? v : k) + ((size_t)row * (is_q ? n_heads : n_kv_heads) + g) * dim;
  ready_head(x, heads[warp], dim, is_v ? nullptr : &angles, neox, round, kv.dtype, x, dst, rot);
}
