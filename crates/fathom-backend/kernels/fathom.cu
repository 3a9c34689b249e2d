// fathom's CUDA kernels: one translation unit, compiled by build.rs with
// nvcc for sm_90 (SASS) plus compute_90 (PTX, for later GPUs) into one
// fatbin that the binary embeds. Every entry point is `extern "C"` so the
// Rust side finds it by its plain name.
//
// This file is that translation unit: it includes the op files below, in
// order, and holds nothing else. One unit, not one per file, because the
// host loads the fatbin as one CUDA module (one load at start-up), the
// memory plan counts that one module's device memory (MODULE_BYTES in
// fathom-plan's cuda.rs), and the `__device__` global fathom_prefetch_bytes
// (common.cuh), which the host sets once after the load, exists once for
// every kernel that reads it. The headers are #pragma once, so each piece
// is defined once here whichever op file includes it first.
//
// Activations are f32 rows, packed (`row r` at `r * width`). Weights stay in
// their stored ggml / MLX-affine layout and are decoded on the fly, eight
// consecutive values at a time (`load8`), which every layout allows: a
// ggml block holds 32 or 256 values and an affine group a multiple of 8.
//
// Shared headers: common.cuh (warp, PDL, prefetch budget, type ids,
// struct Weights, byte loaders, f16/bf16), reduce.cuh (warp reductions),
// quant.cuh (weight decode, x8 activation blocks, dot products),
// matvec.cuh (the matrix-vector body of matvec.cu and moe.cu) and
// attention_common.cuh (step and KV descriptors, KV access, rope, split
// block pieces, tensor-core helpers).

#include "matvec.cu"
#include "matmat.cu"
#include "convert.cu"
#include "moe.cu"
#include "norm.cu"
#include "elementwise.cu"
#include "rope_kv.cu"
#include "attention.cu"
#include "attention_split.cu"
#include "attention_mma.cu"
#include "attention_decode_mma.cu"
#include "attention_merge.cu"
#include "greedy.cu"
