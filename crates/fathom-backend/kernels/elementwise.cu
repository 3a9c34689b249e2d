// Element-wise and row kernels: add_bias, add, fill_zero, scale_values,
// softcap_values, glu, gather_rows, scatter_rows, and the gates of hybrid
// models (split_heads, add_gated_rows, sigmoid_gate). Launched from
// src/cuda/elementwise.rs (gather_rows and scatter_rows also from
// src/cuda/moe.rs).

#include "common.cuh"

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

// x[i] *= a over n values (Gemma 4's layer output scale).
extern "C" __global__ void scale_values(float* x, float a, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    x[i] *= a;
}

// x[i] = a * tanh(x[i] / a) over n values (Gemma 4's logit softcap).
extern "C" __global__ void softcap_values(float* x, float a, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    x[i] = a * tanhf(x[i] / a);
}

// gate = act(gate) x up for any GLU_* activation (glu_value).
extern "C" __global__ void glu(float* gate, const float* up, long long n, int act) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    gate[i] = glu_value(gate[i], up[i], act);
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

// Each of the n / head_dim pieces of 2 * head_dim values of x (a query,
// then its output gate) split into a and b, head_dim values each.
extern "C" __global__ void split_heads(const float* x, float* a, float* b, int head_dim, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long piece = i / head_dim;
    const float* p = x + piece * 2 * head_dim + (i - piece * head_dim);
    a[i] = p[0];
    b[i] = p[head_dim];
  }
}

// dst[i] += sigmoid(gate[i / width]) * src[i]: one gate a row.
extern "C" __global__ void add_gated_rows(float* dst, const float* src, const float* gate, int width, long long n) {
  FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    dst[i] += 1.0f / (1.0f + expf(-gate[i / width])) * src[i];
}

// gate[i] = sigmoid(gate[i]) * x[i], as x / (1 + e^-gate).
extern "C" __global__ void sigmoid_gate(float* gate, const float* x, long long n) { FATHOM_PDL();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    gate[i] = x[i] / (1.0f + expf(-gate[i]));
}
