//! Matmul throughput on SmolLM2-135M's shapes (hidden 576, kv 192, ffn
//! 1536, vocab 49152).
//!
//! Decode (one token) is a weight stream, reported as GB/s of weight
//! bytes: "cold" rotates through copies larger than the last-level cache,
//! as a real forward pass does; "hot" repeats one L2-resident matrix, the
//! kernel's own ceiling. A whole decode token of matmuls (30 Q4_1 layers
//! and the Q8_0 lm_head) gives a matmul-only tokens/s. Prefill (512
//! tokens) is reported as GFLOP/s (2 * rows * cols * tokens).
//!
//! `cargo bench -p fathom-kernels --bench matmul [-- FILTER]` runs the
//! cases whose label contains FILTER.

use fathom_fixtures::Rng;
use fathom_kernels::{activation_row_bytes, isa_name, matmul, Pool, WeightType, Weights};
use std::hint::black_box;
use std::time::{Duration, Instant};

const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;
const VOCAB: usize = 49152;
const LAYERS: usize = 30;
const PREFILL: usize = 512;

/// Random blocks whose f16 scales are small normal numbers, as real ones.
fn weights(ty: WeightType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data = vec![0u8; rows * ty.row_bytes(cols)];
    for chunk in data.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let unit = ty.block_bytes();
    for block in data.chunks_exact_mut(unit) {
        match ty {
            // 0x2000..0x27ff as f16 is about 0.008..0.03: small, normal.
            WeightType::F16 | WeightType::BF16 => {
                let h = 0x2000 | (u16::from_le_bytes([block[0], block[1]]) & 0x87ff);
                block.copy_from_slice(&h.to_le_bytes());
            }
            WeightType::F32 => block.copy_from_slice(&0.01f32.to_le_bytes()),
            _ => {
                for &at in ty.f16_scales() {
                    block[at] = 0x00;
                    block[at + 1] = 0x20 | (block[at + 1] & 0x83);
                }
            }
        }
    }
    data
}

/// Seconds per call of `f`: the best of 30 batches of at least 5 ms. The
/// minimum, because on a shared machine every disturbance only adds time.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut iters = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() > Duration::from_millis(5) {
            break;
        }
        iters *= 2;
    }
    (0..30)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

struct Bench {
    filter: Option<String>,
    pools: Vec<Pool>,
    rng: Rng,
    streams: Vec<(WeightType, Vec<u8>)>,
}

impl Bench {
    fn wants(&self, label: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| label.contains(f))
    }

    /// Random blocks of `ty`, three times a 32 MiB L3, generated once per
    /// type: any run of whole rows in it is a matrix.
    fn stream(&mut self, ty: WeightType) -> Vec<u8> {
        if let Some(i) = self.streams.iter().position(|(t, _)| *t == ty) {
            return self.streams.swap_remove(i).1;
        }
        let rows = (96 << 20) / ty.row_bytes(2048);
        weights(ty, rows, 2048, &mut self.rng)
    }

    /// Decode matvec of `rows x cols`, cold and hot, 1 and 2 threads.
    fn decode(&mut self, ty: WeightType, rows: usize, cols: usize) {
        let label = format!("decode {:5} {rows:>5}x{cols:<5}", ty.name());
        if !self.wants(&label) {
            return;
        }
        let bytes = rows * ty.row_bytes(cols);
        let stream = self.stream(ty);
        let mats: Vec<&[u8]> = stream.chunks_exact(bytes).collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = vec![0.0f32; rows];
        let mut q = vec![0u8; activation_row_bytes(ty, cols)];
        let mut line = label;
        for pool in &self.pools {
            let mut i = 0;
            let cold = time(|| {
                let w = Weights {
                    ty,
                    rows,
                    cols,
                    data: mats[i % mats.len()],
                };
                i += 1;
                matmul(pool, &w, &x, 1, &mut out, &mut q);
            });
            let w = Weights {
                ty,
                rows,
                cols,
                data: mats[0],
            };
            let hot = time(|| matmul(pool, &w, &x, 1, &mut out, &mut q));
            line += &format!(
                " | {}t cold {:5.1} GB/s {:6.1} us  hot {:5.1} GB/s {:6.1} us",
                pool.n_threads(),
                bytes as f64 / cold / 1e9,
                cold * 1e6,
                bytes as f64 / hot / 1e9,
                hot * 1e6
            );
        }
        black_box(&out);
        println!("{line}");
        self.streams.push((ty, stream));
    }

    /// `n` tokens through `rows x cols` with the weights in cache: prefill
    /// (`PREFILL` tokens) or a decode batch.
    fn tokens(&mut self, ty: WeightType, rows: usize, cols: usize, n: usize) {
        let kind = if n == PREFILL { "prefill" } else { "batch" };
        let label = format!("{kind} {:5} {rows:>5}x{cols:<5} x{n}", ty.name());
        if !self.wants(&label) {
            return;
        }
        let data = weights(ty, rows, cols, &mut self.rng);
        let w = Weights {
            ty,
            rows,
            cols,
            data: &data,
        };
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = vec![0.0f32; n * rows];
        let mut q = vec![0u8; n * activation_row_bytes(ty, cols)];
        let flops = 2.0 * (rows * cols * n) as f64;
        let mut line = label;
        for pool in &self.pools {
            let s = time(|| matmul(pool, &w, &x, n, &mut out, &mut q));
            line += &format!(
                " | {}t {:6.1} GFLOP/s {:8.2} ms",
                pool.n_threads(),
                flops / s / 1e9,
                s * 1e3
            );
        }
        black_box(&out);
        println!("{line}");
    }

    /// Every matmul of one SmolLM2 decode step of `n` sequences: 30
    /// layers of q, k, v, o, gate, up, down in `ty`, then the Q8_0 lm_head
    /// tied to the embeddings; tok/s counts all `n` tokens.
    fn decode_token(&mut self, ty: WeightType, n: usize) {
        let label = format!("token  {:5} SmolLM2-135M matmuls x{n:<2}", ty.name());
        if !self.wants(&label) {
            return;
        }
        let shapes = [
            (HIDDEN, HIDDEN),
            (KV, HIDDEN),
            (KV, HIDDEN),
            (HIDDEN, HIDDEN),
            (FFN, HIDDEN),
            (FFN, HIDDEN),
            (HIDDEN, FFN),
        ];
        let mut mats = Vec::new();
        for _ in 0..LAYERS {
            for &(rows, cols) in &shapes {
                mats.push((ty, rows, cols, weights(ty, rows, cols, &mut self.rng)));
            }
        }
        mats.push((
            WeightType::Q8_0,
            VOCAB,
            HIDDEN,
            weights(WeightType::Q8_0, VOCAB, HIDDEN, &mut self.rng),
        ));
        let bytes: usize = mats.iter().map(|m| m.3.len()).sum();
        let x: Vec<f32> = (0..n * FFN).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = vec![0.0f32; n * VOCAB];
        let mut q = vec![
            0u8;
            n * activation_row_bytes(WeightType::Q4_K, FFN)
                .max(activation_row_bytes(ty, FFN))
        ];
        let mut line = format!("{label} ({:.1} MB)", bytes as f64 / 1e6);
        for pool in &self.pools {
            let s = time(|| {
                for (ty, rows, cols, data) in &mats {
                    let w = Weights {
                        ty: *ty,
                        rows: *rows,
                        cols: *cols,
                        data,
                    };
                    matmul(pool, &w, &x[..n * cols], n, &mut out[..n * rows], &mut q);
                }
            });
            line += &format!(
                " | {}t {:6.2} ms/step {:6.1} tok/s {:5.1} GB/s",
                pool.n_threads(),
                s * 1e3,
                n as f64 / s,
                bytes as f64 / s / 1e9
            );
        }
        black_box(&out);
        println!("{line}");
    }
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut b = Bench {
        filter,
        pools: vec![Pool::new(1), Pool::new(2)],
        rng: Rng::xorshift64_star(0x1234_5678_9abc_def1),
        streams: Vec::new(),
    };
    println!("fathom-kernels matmul benchmark, {} kernels", isa_name());
    for n in [1, 4, 16, 64] {
        b.decode_token(WeightType::Q4_1, n);
    }
    b.decode(WeightType::Q8_0, VOCAB, HIDDEN);
    let decode_types = [
        WeightType::Q4_1,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::F16,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q5_K,
        WeightType::Q3_K,
        WeightType::Q2_K,
        WeightType::BF16,
    ];
    for ty in decode_types {
        for (rows, cols) in shapes(ty, true) {
            b.decode(ty, rows, cols);
        }
    }
    for ty in decode_types {
        for (rows, cols) in shapes(ty, false) {
            for n in [4, 16, 64, PREFILL] {
                b.tokens(ty, rows, cols, n);
            }
        }
    }
}

/// SmolLM2's matrices (rows x cols); k-quant rows hold whole 256-value
/// blocks, which 576 is not (llama.cpp stores those tensors in a 32-value
/// type), so k-quants get SmolLM2's ffn_down and Llama-3.2-1B's shapes, and
/// at decode Gemma-3-1B's ffn_down (a k-quant in its Q6_K and K-quant mix
/// files).
fn shapes(ty: WeightType, decode: bool) -> Vec<(usize, usize)> {
    match (ty.block_elems() == 256, decode) {
        (false, true) => vec![(HIDDEN, HIDDEN), (KV, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)],
        (false, false) => vec![(HIDDEN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)],
        (true, true) => vec![(HIDDEN, FFN), (2048, 2048), (8192, 2048), (1152, 6912)],
        (true, false) => vec![(HIDDEN, FFN), (2048, 2048)],
    }
}
