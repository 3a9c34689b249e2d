// The tensor-core product every mma kernel issues (mma.m16n8k16: f16 in,
// f32 accumulate) and the f16 pair packing its operands take; shared by the
// attention kernels (attention_mma.cu, attention_decode_mma.cu) and the
// few-token matrix products (matmul_mma.cu).

#pragma once

#include "common.cuh"

// c (16 x 8, f32) += a (16 x 16) b (16 x 8). Per lane (g = lane / 4,
// t = lane % 4): a[0] rows g, columns 2t, 2t+1; a[1] row g + 8, the same
// columns; a[2] and a[3] the same rows at columns 2t + 8, 2t + 9. b0 holds
// rows (k) 2t, 2t+1 of column (n) g, b1 rows 2t + 8, 2t + 9. c[0], c[1]:
// row g, columns 2t, 2t+1; c[2], c[3]: row g + 8.
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *(const unsigned*)&h;
}

