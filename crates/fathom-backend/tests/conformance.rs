//! Backend conformance, in the manner of llama.cpp's test-backend-ops:
//! every op of the [`Backend`] trait, on every backend present, against an
//! independent scalar reference written here (f64 accumulation; weights
//! through `fathom_kernels::dequantize_row`, the bit-exact gguf-py port),
//! on random inputs of real models' shapes (SmolLM2-135M, Llama-3.1-8B,
//! Qwen3-30B-A3B experts).
//!
//! Only the trait is used: inputs go in through `embed` of an F32 table
//! (an exact copy), outputs come back through `matmul` by an 8×8 identity
//! into the logits buffer and `logits()` (exact too: one product by 1.0 and
//! seven by 0.0 a value).
//!
//! A backend whose device is absent is skipped with a message naming why;
//! `FATHOM_REQUIRE_GPU=1` turns a skipped GPU into a failure.
//!
//! Tolerances, as normalized mean squared error `Σ(got−ref)² / Σref²`:
//! - matmul 5e-4: a backend may quantize activations to 8 bits (the CPU's
//!   Q8_0 / Q8_K); that alone gives about (amax/127)²/12 relative variance,
//!   ~2e-5 for Gaussian rows, while a wrong block decode or index is ≥1e-2.
//!   Exact-f32 kernels land near 1e-13.
//! - embed, rms/head norm, add, bias, zero, gather, glu, MoE scatter: 1e-10
//!   (f32 arithmetic on exact inputs: ~1e-14).
//! - rope 1e-9: angles in f64 then an f32 sine (~1e-6 absolute each).
//! - attention 1e-8: K/V rounded to the cache dtype on both sides (the
//!   reference rounds the same way), then f32 online softmax against f64.

use std::sync::Arc;

use fathom_backend::cuda::{self, CudaBackend};
use fathom_backend::{
    AttentionIo, AttentionShape, Backend, Buf, Glu, HostBytes, HostMatrix, KvLayout, MatrixId,
    MatrixStorage, RopeParams, RoutedFfn, Step, StepSeq, WeightType,
};
use fathom_fixtures::Rng;
use fathom_kernels::{affine_dequantize_row, dequantize_row, ops, AffineWeights};
use fathom_plan::activations::ArenaBuffer;
use fathom_plan::cuda::{
    DeviceLayout, ALLOCATION_GRANULE, BLAS_HANDLE_BYTES, CONTEXT_BYTES, GRAPH_BYTES,
    GRAPH_MAX_NODES, MODULE_BYTES,
};
use fathom_plan::kv::{KvGroup, KV_BLOCK_TOKENS};
use fathom_plan::KvDtype;

/// Every test buffer holds this many rows of this many f32.
const ROWS: u64 = 256;
const WIDTH: u64 = 14336;
const WEIGHTS: u64 = 1 << 30;
/// Read-back chunk: every tested width is a multiple of 8.
const EYE: usize = 8;

/// The attention op's buffers, as the forward pass passes them.
const IO: AttentionIo = AttentionIo {
    q: Buf::Q,
    k: Buf::K,
    v: Buf::V,
    out: Buf::AttnOut,
};

const TOL_MATMUL: f64 = 5e-4;
const TOL_EXACT: f64 = 1e-10;
const TOL_ROPE: f64 = 1e-9;
const TOL_ATTN: f64 = 1e-8;

// ---------------------------------------------------------------------------
// Inputs.

/// `n` values uniform in [-1, 1).
fn uniform(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(-1.0..1.0)).collect()
}

/// One buffer of every kind, all `ROWS × WIDTH` f32 (host-side ones too:
/// a backend ignores them).
fn arena() -> Vec<ArenaBuffer> {
    let mut at = 0;
    Buf::ALL
        .iter()
        .map(|&id| {
            let (rows, width) = match id {
                Buf::AttnScratch => (8, 16 + 512 + 16 * 1024),
                Buf::ExpertRoutes => (ROWS, 16),
                _ => (ROWS, WIDTH),
            };
            let bytes = rows * width * 4;
            let b = ArenaBuffer {
                id,
                name: id.name(),
                rows,
                width,
                bytes,
                offset: at,
            };
            at += bytes;
            b
        })
        .collect()
}

fn group(
    dtype: KvDtype,
    n_kv_heads: u64,
    key_dim: u64,
    value_dim: u64,
    layers: u64,
    window: Option<u64>,
    blocks: u64,
) -> KvGroup {
    let per_token = dtype.row_bytes(n_kv_heads * key_dim) + dtype.row_bytes(n_kv_heads * value_dim);
    let tokens = window.unwrap_or(128);
    let bps = tokens.div_ceil(KV_BLOCK_TOKENS);
    KvGroup {
        attention: if window.is_some() { "sliding" } else { "full" },
        window,
        layers,
        n_kv_heads,
        key_dim,
        value_dim,
        bytes_per_token_per_layer: per_token,
        tokens,
        blocks_per_sequence: bps,
        bytes: blocks * layers * KV_BLOCK_TOKENS * per_token,
    }
}

fn small_kv() -> KvLayout {
    KvLayout {
        groups: vec![group(KvDtype::F16, 1, 64, 64, 1, None, 2)],
        dtype: KvDtype::F16,
        layer_groups: vec![Some(0)],
    }
}

fn gpu_required() -> bool {
    std::env::var("FATHOM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn skip(why: String) {
    if gpu_required() {
        panic!("FATHOM_REQUIRE_GPU=1 but the CUDA backend is unavailable: {why}");
    }
    eprintln!("conformance: skipping the CUDA backend: {why}");
}

fn cuda_backend(arena: &[ArenaBuffer], kv: &KvLayout) -> Option<CudaBackend> {
    let Some(info) = cuda::probe() else {
        skip("no CUDA driver or device (cuda::probe found none)".into());
        return None;
    };
    let layout = DeviceLayout::new(WEIGHTS, arena, &kv.groups);
    match CudaBackend::new(0, arena, kv.clone(), &layout) {
        Ok(b) => Some(b),
        Err(e) => {
            skip(format!("{} found, but: {e}", info.name));
            None
        }
    }
}

/// Every backend present, for one KV layout.
fn backends(kv: &KvLayout) -> Vec<Box<dyn Backend>> {
    let arena = arena();
    let mut out: Vec<Box<dyn Backend>> = Vec::new();
    out.push(Box::new(
        fathom_backend::cpu::CpuBackend::new(4, &arena, kv.clone()).unwrap(),
    ));
    if let Some(b) = cuda_backend(&arena, kv) {
        out.push(Box::new(b));
    }
    out
}

fn host(bytes: Vec<u8>) -> HostBytes {
    let len = bytes.len();
    HostBytes::new(Arc::new(bytes), 0, len).expect("in range")
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A backend under test with its read-back identity.
struct Harness<B: Backend + ?Sized = dyn Backend> {
    b: Box<B>,
    eye: MatrixId,
    failures: Vec<String>,
}

impl<B: Backend + ?Sized> Harness<B> {
    fn new(mut b: Box<B>) -> Harness<B> {
        let mut eye = vec![0f32; EYE * EYE];
        for i in 0..EYE {
            eye[i * EYE + i] = 1.0;
        }
        let eye = b
            .load_matrix(HostMatrix {
                data: host(f32_bytes(&eye)),
                storage: MatrixStorage::Blocks(WeightType::F32),
                rows: EYE,
                cols: EYE,
            })
            .expect("identity loads");
        Harness {
            b,
            eye,
            failures: Vec::new(),
        }
    }

    /// Writes `data` (rows of `width`) into `buf`.
    fn set(&mut self, buf: Buf, data: &[f32], width: usize) {
        let rows = data.len() / width;
        let table = self
            .b
            .load_matrix(HostMatrix {
                data: host(f32_bytes(data)),
                storage: MatrixStorage::Blocks(WeightType::F32),
                rows,
                cols: width,
            })
            .expect("input table loads");
        let tokens: Vec<u32> = (0..rows as u32).collect();
        self.b.embed(table, &tokens, 1.0, buf);
    }

    /// The first `rows × width` values of `buf`.
    fn get(&mut self, buf: Buf, rows: usize, width: usize) -> Vec<f32> {
        let n = rows * width;
        if buf != Buf::Logits {
            self.b.matmul(self.eye, buf, n / EYE, Buf::Logits);
        }
        let out = self.b.logits(n / EYE, EYE).to_vec();
        if let Some(e) = self.b.take_error() {
            panic!("{}: device error: {e}", self.b.name());
        }
        out
    }

    fn check(&mut self, op: &str, case: &str, got: &[f32], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{op} {case}: lengths");
        let (mut num, mut den, mut max_abs) = (0f64, 0f64, 0f64);
        for (&g, &w) in got.iter().zip(want) {
            let d = g as f64 - w;
            num += d * d;
            den += w * w;
            max_abs = max_abs.max(d.abs());
        }
        let nmse = if den > 0.0 { num / den } else { num };
        let ok = nmse <= tol && nmse.is_finite();
        let line = format!(
            "{:5} {:18} {:34} nmse {:9.2e} max_abs {:9.2e} tol {:7.0e} {}",
            self.b.name(),
            op,
            case,
            nmse,
            max_abs,
            tol,
            if ok { "ok" } else { "FAIL" }
        );
        println!("{line}");
        if !ok {
            self.failures.push(line);
        }
    }

    fn finish(self) -> Vec<String> {
        self.failures
    }
}

// ---------------------------------------------------------------------------
// Weights of every type, with sane scales (random bytes would make f16
// scales of NaN or 1e4).

fn f16_bytes(x: f32) -> [u8; 2] {
    ops::f32_to_f16(x).to_le_bytes()
}

fn bf16_of(x: f32) -> u16 {
    let bits = x.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

fn random_blocks(rng: &mut Rng, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        WeightType::F32 => return f32_bytes(&uniform(rng, n)),
        WeightType::F16 => return uniform(rng, n).iter().flat_map(|&x| f16_bytes(x)).collect(),
        WeightType::BF16 => {
            return uniform(rng, n)
                .iter()
                .flat_map(|&x| bf16_of(x).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let bytes = ty.row_bytes(cols) * rows;
    let mut data: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    // (offset of d, offset of a min or dmin) within each block.
    let (d, m): (usize, Option<usize>) = match ty {
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => (0, None),
        WeightType::Q4_1 | WeightType::Q5_1 | WeightType::Q4_K | WeightType::Q5_K => (0, Some(2)),
        WeightType::Q2_K => (80, Some(82)),
        WeightType::Q3_K => (108, None),
        WeightType::Q6_K => (208, None),
        _ => unreachable!(),
    };
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        let scale = 0.002 + 0.01 * (rng.f32_in(-1.0..1.0) + 1.0);
        b[d..d + 2].copy_from_slice(&f16_bytes(scale));
        if let Some(m) = m {
            b[m..m + 2].copy_from_slice(&f16_bytes(0.01 * rng.f32_in(-1.0..1.0)));
        }
    }
    data
}

/// A random matrix of `kind` (a ggml type, or MLX affine `bits` as
/// `Err(bits)`), with its f32 values for the reference.
fn random_matrix(
    rng: &mut Rng,
    kind: Result<WeightType, u32>,
    rows: usize,
    cols: usize,
) -> (HostMatrix, Vec<f32>) {
    match kind {
        Ok(ty) => {
            let data = random_blocks(rng, ty, rows, cols);
            let mut values = vec![0f32; rows * cols];
            let rb = ty.row_bytes(cols);
            for r in 0..rows {
                dequantize_row(
                    ty,
                    &data[r * rb..(r + 1) * rb],
                    &mut values[r * cols..(r + 1) * cols],
                );
            }
            let m = HostMatrix {
                data: host(data),
                storage: MatrixStorage::Blocks(ty),
                rows,
                cols,
            };
            (m, values)
        }
        Err(bits) => {
            let group = 64;
            let words = rows * cols * bits as usize / 32;
            let packed: Vec<u8> = (0..4 * words).map(|_| rng.next_u64() as u8).collect();
            let halves = rows * cols / group;
            let bf16 = bits == 8;
            let half = |x: f32| {
                if bf16 {
                    bf16_of(x).to_le_bytes()
                } else {
                    f16_bytes(x)
                }
            };
            let scales: Vec<u8> = (0..halves)
                .flat_map(|_| half(0.01 + 0.01 * rng.f32_in(-1.0..1.0)))
                .collect();
            let biases: Vec<u8> = (0..halves)
                .flat_map(|_| half(0.05 * rng.f32_in(-1.0..1.0)))
                .collect();
            let w = AffineWeights {
                bits,
                group,
                rows,
                cols,
                packed: &packed,
                scales: &scales,
                biases: &biases,
                bf16,
            };
            let mut values = vec![0f32; rows * cols];
            for r in 0..rows {
                affine_dequantize_row(&w, r, &mut values[r * cols..(r + 1) * cols]);
            }
            let m = HostMatrix {
                data: host(packed),
                storage: MatrixStorage::Affine {
                    bits,
                    group,
                    scales: host(scales),
                    biases: host(biases),
                    bf16,
                },
                rows,
                cols,
            };
            (m, values)
        }
    }
}

fn kind_name(kind: Result<WeightType, u32>) -> String {
    match kind {
        Ok(t) => t.name().to_string(),
        Err(b) => format!("MLX affine {b}-bit"),
    }
}

fn all_kinds() -> Vec<Result<WeightType, u32>> {
    let mut v: Vec<_> = WeightType::ALL.iter().map(|&t| Ok(t)).collect();
    v.extend([Err(2), Err(4), Err(8)]);
    v
}

// ---------------------------------------------------------------------------
// The ops.

fn test_embed(h: &mut Harness, rng: &mut Rng) {
    let (vocab, d) = (64, 2048);
    for kind in all_kinds() {
        let (m, values) = random_matrix(rng, kind, vocab, d);
        let id = h.b.load_matrix(m).expect("loads");
        let tokens: Vec<u32> = (0..7).map(|_| rng.below(vocab) as u32).collect();
        h.b.embed(id, &tokens, 1.25, Buf::Residual);
        let got = h.get(Buf::Residual, tokens.len(), d);
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| {
                values[t as usize * d..(t as usize + 1) * d]
                    .iter()
                    .map(|&v| v as f64 * 1.25)
            })
            .collect();
        h.check(
            "embed",
            &format!("{} 64x2048 x7", kind_name(kind)),
            &got,
            &want,
            TOL_EXACT,
        );
    }
}

fn reference_matmul(values: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
    let mut out = vec![0f64; n * rows];
    for t in 0..n {
        let xr = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let w = &values[r * cols..(r + 1) * cols];
            out[t * rows + r] = w.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
        }
    }
    out
}

fn test_matmul<B: Backend + ?Sized>(h: &mut Harness<B>, rng: &mut Rng, only_prefill: bool) {
    // (label, out rows, in cols, kinds, token counts)
    let k_quant = |k: &Result<WeightType, u32>| matches!(k, Ok(t) if t.block_elems() == 256);
    let all = all_kinds();
    type Case = (
        &'static str,
        usize,
        usize,
        Vec<Result<WeightType, u32>>,
        Vec<usize>,
    );
    let cases: Vec<Case> = vec![
        (
            "Qwen3-MoE expert 768x2048",
            768,
            2048,
            all.clone(),
            vec![1, 3, 8, 9, 37, 64, 77],
        ),
        // Decode batches on a matrix of rows not a multiple of 16.
        (
            "100x2048",
            100,
            2048,
            vec![
                Ok(WeightType::F16),
                Ok(WeightType::BF16),
                Ok(WeightType::Q8_0),
            ],
            vec![16, 40],
        ),
        (
            "SmolLM2 ffn_up 1536x576",
            1536,
            576,
            all.iter().filter(|k| !k_quant(k)).cloned().collect(),
            vec![1, 67],
        ),
        (
            "Llama-8B ffn_down 4096x14336",
            4096,
            14336,
            vec![
                Ok(WeightType::Q4_K),
                Ok(WeightType::Q6_K),
                Ok(WeightType::F16),
            ],
            vec![1, 20],
        ),
        // One token on more than 2,048 rows (a warp a row): Q5_K's 32-value
        // chunks, and Q8_0's and Q4_0's 2-byte aligned blocks read as
        // aligned words. Then the 32-value kernels on four warps a row (128
        // chunks; 2048-wide rows take two).
        (
            "Llama-8B ffn_down 4096x14336",
            4096,
            14336,
            vec![
                Ok(WeightType::Q5_K),
                Ok(WeightType::Q8_0),
                Ok(WeightType::Q4_0),
            ],
            vec![1],
        ),
        (
            "Llama-8B attn_k 1024x4096",
            1024,
            4096,
            vec![
                Ok(WeightType::Q4_K),
                Ok(WeightType::Q5_K),
                Ok(WeightType::Q6_K),
            ],
            vec![1],
        ),
    ];
    for (label, rows, cols, kinds, tokens) in cases {
        for kind in kinds {
            let (m, values) = random_matrix(rng, kind, rows, cols);
            let id = h.b.load_matrix(m).expect("loads");
            for &n in tokens.iter().filter(|&&n| !only_prefill || n > 8) {
                let x = uniform(rng, n * cols);
                h.set(Buf::FfnGate, &x, cols);
                h.b.matmul(id, Buf::FfnGate, n, Buf::FfnUp);
                let got = h.get(Buf::FfnUp, n, rows);
                let want = reference_matmul(&values, rows, cols, &x, n);
                h.check(
                    "matmul",
                    &format!("{} {label} x{n}", kind_name(kind)),
                    &got,
                    &want,
                    TOL_MATMUL,
                );
            }
        }
    }
}

fn glu_ref(g: f64, u: f64, act: Glu) -> f64 {
    let a = match act {
        Glu::Silu => g / (1.0 + (-g).exp()),
        Glu::GeluTanh => {
            0.5 * g
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
        }
    };
    a * u
}

/// matmul_glu: a gate and an up projection of one type with the activation
/// (fused on the GPU up to 8 rows), against the f64 reference of the three.
fn test_matmul_glu(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols) = (768, 2048);
    for kind in all_kinds() {
        let (gm, gv) = random_matrix(rng, kind, rows, cols);
        let (um, uv) = random_matrix(rng, kind, rows, cols);
        let (g, u) = (
            h.b.load_matrix(gm).expect("loads"),
            h.b.load_matrix(um).expect("loads"),
        );
        for (n, act) in [
            (1, Glu::Silu),
            (3, Glu::GeluTanh),
            (9, Glu::Silu),
            (30, Glu::GeluTanh),
            (64, Glu::Silu),
        ] {
            let x = uniform(rng, n * cols);
            h.set(Buf::Norm, &x, cols);
            h.b.matmul_glu([g, u], Buf::Norm, n, act, [Buf::FfnGate, Buf::FfnUp], rows);
            let got = h.get(Buf::FfnGate, n, rows);
            let want: Vec<f64> = reference_matmul(&gv, rows, cols, &x, n)
                .iter()
                .zip(reference_matmul(&uv, rows, cols, &x, n))
                .map(|(&g, u)| glu_ref(g, u, act))
                .collect();
            h.check(
                "matmul_glu",
                &format!("{} 768x2048 x{n}", kind_name(kind)),
                &got,
                &want,
                TOL_MATMUL,
            );
        }
    }
}

/// matmul_many: q, k and v projections of one input (one launch for one
/// token on the GPU when they share a type, each with its own rows and
/// warps a row), two of them, and a mixed-type set (one matmul each),
/// against the f64 reference of each.
fn test_matmul_many(h: &mut Harness, rng: &mut Rng) {
    let cols = 2048;
    let shapes = [(512, Buf::Q), (128, Buf::K), (128, Buf::V)];
    for kind in all_kinds() {
        let loaded: Vec<_> = shapes
            .iter()
            .map(|&(rows, out)| {
                let (m, values) = random_matrix(rng, kind, rows, cols);
                (h.b.load_matrix(m).expect("loads"), values, rows, out)
            })
            .collect();
        for (count, n) in [(3, 1), (2, 1), (3, 2), (3, 24), (2, 57)] {
            let x = uniform(rng, n * cols);
            h.set(Buf::Norm, &x, cols);
            let ws: Vec<_> = loaded[..count].iter().map(|l| l.0).collect();
            let outs: Vec<_> = loaded[..count].iter().map(|l| l.3).collect();
            h.b.matmul_many(&ws, Buf::Norm, n, &outs);
            for (_, values, rows, out) in &loaded[..count] {
                let got = h.get(*out, n, *rows);
                let want = reference_matmul(values, *rows, cols, &x, n);
                h.check(
                    "matmul_many",
                    &format!("{} {rows}x{cols} of {count} x{n}", kind_name(kind)),
                    &got,
                    &want,
                    TOL_MATMUL,
                );
            }
        }
    }
    // More blocks than one wave holds (q, k and v of thousands of rows):
    // on CUDA the float kinds take one wave of equal warps that share
    // rows (`matvec_balanced`), the last block partly filled. Its own
    // random stream, so the cases after it see the data they always saw.
    let mut wave_rng = Rng::xorshift64_star(0x0ae1_7a3e_5eed_0002);
    let shapes = [(4104, Buf::Q), (1032, Buf::K), (1024, Buf::V)];
    for kind in [WeightType::F16, WeightType::BF16, WeightType::F32] {
        let loaded: Vec<_> = shapes
            .iter()
            .map(|&(rows, out)| {
                let (m, values) = random_matrix(&mut wave_rng, Ok(kind), rows, cols);
                (h.b.load_matrix(m).expect("loads"), values, rows, out)
            })
            .collect();
        let x = uniform(&mut wave_rng, cols);
        h.set(Buf::Norm, &x, cols);
        let ws: Vec<_> = loaded.iter().map(|l| l.0).collect();
        let outs: Vec<_> = loaded.iter().map(|l| l.3).collect();
        h.b.matmul_many(&ws, Buf::Norm, 1, &outs);
        for (_, values, rows, out) in &loaded {
            let got = h.get(*out, 1, *rows);
            let want = reference_matmul(values, *rows, cols, &x, 1);
            h.check(
                "matmul_many",
                &format!("{kind:?} {rows}x{cols} of 3 (one wave)"),
                &got,
                &want,
                TOL_MATMUL,
            );
        }
    }
    let mixed = [Ok(WeightType::Q4_K), Ok(WeightType::Q6_K)];
    let (ma, va) = random_matrix(rng, mixed[0], 256, cols);
    let (mb, vb) = random_matrix(rng, mixed[1], 256, cols);
    let ids = [
        h.b.load_matrix(ma).expect("loads"),
        h.b.load_matrix(mb).expect("loads"),
    ];
    let x = uniform(rng, cols);
    h.set(Buf::Norm, &x, cols);
    h.b.matmul_many(&ids, Buf::Norm, 1, &[Buf::Q, Buf::K]);
    for (out, values) in [(Buf::Q, &va), (Buf::K, &vb)] {
        let got = h.get(out, 1, 256);
        let want = reference_matmul(values, 256, cols, &x, 1);
        h.check("matmul_many", "Q4_K + Q6_K x1", &got, &want, TOL_MATMUL);
    }
}

/// One token through a norm and then matmuls of its output: on the GPU
/// the norm also writes int8 activation blocks that the x8 kernels read
/// instead of quantizing again, reused by consecutive matmuls of one input
/// whatever their type (Q4_K, Q6_K, Q8_0, Q4_0, then F16 on the f32 path),
/// for the plain and the residual-add norm.
fn test_norm_then_matmul(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols) = (256, 4096);
    let kinds = [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::F16,
    ];
    let loaded: Vec<_> = kinds
        .iter()
        .map(|&t| {
            let (m, values) = random_matrix(rng, Ok(t), rows, cols);
            (t, h.b.load_matrix(m).expect("loads"), values)
        })
        .collect();
    let w = uniform(rng, cols);
    let wid = h.b.load_vector(&w).expect("loads");
    for add in [false, true] {
        let (a, b) = (uniform(rng, cols), uniform(rng, cols));
        h.set(Buf::Residual, &a, cols);
        h.set(Buf::BranchOut, &b, cols);
        let normed = if add {
            h.b.add_rms_norm(Buf::Residual, Buf::BranchOut, wid, 1e-5, 1, cols, Buf::Norm);
            let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            rms_ref(&sum, &w, 1e-5)
        } else {
            h.b.rms_norm(Buf::Residual, wid, 1e-5, 1, cols, Buf::Norm);
            rms_ref(&a, &w, 1e-5)
        };
        let x: Vec<f32> = normed.iter().map(|&v| v as f32).collect();
        let outs = [Buf::Q, Buf::K, Buf::V, Buf::FfnGate, Buf::FfnUp];
        for ((_, id, _), &out) in loaded.iter().zip(&outs) {
            h.b.matmul(*id, Buf::Norm, 1, out);
        }
        for ((t, _, values), &out) in loaded.iter().zip(&outs) {
            let got = h.get(out, 1, rows);
            let want = reference_matmul(values, rows, cols, &x, 1);
            let norm = if add { "add_rms_norm" } else { "rms_norm" };
            h.check(
                "norm then matmul",
                &format!("{norm} then {} {rows}x{cols} x1", t.name()),
                &got,
                &want,
                TOL_MATMUL,
            );
        }
    }
}

fn rms_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = 1.0 / (ss / x.len() as f64 + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &w)| v as f64 * inv * w as f64)
        .collect()
}

fn test_elementwise(h: &mut Harness, rng: &mut Rng) {
    // rms_norm: SmolLM2 and Llama widths.
    for (rows, width) in [(5, 576), (3, 4096)] {
        let x = uniform(rng, rows * width);
        let w = uniform(rng, width);
        let wid = h.b.load_vector(&w).expect("loads");
        h.set(Buf::Residual, &x, width);
        h.b.rms_norm(Buf::Residual, wid, 1e-5, rows, width, Buf::Norm);
        let got = h.get(Buf::Norm, rows, width);
        let want: Vec<f64> = x.chunks(width).flat_map(|r| rms_ref(r, &w, 1e-5)).collect();
        h.check(
            "rms_norm",
            &format!("{rows}x{width}"),
            &got,
            &want,
            TOL_EXACT,
        );
    }
    // add_rms_norm: the residual add and the next norm (Norm is also the
    // branch, as after a post-norm).
    for (rows, width, branch) in [(5, 576, Buf::BranchOut), (3, 4096, Buf::Norm)] {
        let (a, b, w) = (
            uniform(rng, rows * width),
            uniform(rng, rows * width),
            uniform(rng, width),
        );
        let wid = h.b.load_vector(&w).expect("loads");
        h.set(Buf::Residual, &a, width);
        h.set(branch, &b, width);
        h.b.add_rms_norm(Buf::Residual, branch, wid, 1e-5, rows, width, Buf::Norm);
        let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let got = h.get(Buf::Norm, rows, width);
        let want: Vec<f64> = sum
            .chunks(width)
            .flat_map(|r| rms_ref(r, &w, 1e-5))
            .collect();
        let case = format!("{rows}x{width} {}", branch.name());
        h.check("add_rms_norm", &case, &got, &want, TOL_EXACT);
        let got = h.get(Buf::Residual, rows, width);
        let want: Vec<f64> = sum.iter().map(|&v| v as f64).collect();
        h.check("add_rms_norm sum", &case, &got, &want, TOL_EXACT);
    }
    // head_norm: Qwen3 q (32 heads x 128).
    {
        let (rows, width, hd) = (4, 4096, 128);
        let x = uniform(rng, rows * width);
        let w = uniform(rng, hd);
        let wid = h.b.load_vector(&w).expect("loads");
        h.set(Buf::Q, &x, width);
        h.b.head_norm(Buf::Q, wid, 1e-6, rows, width, hd);
        let got = h.get(Buf::Q, rows, width);
        let want: Vec<f64> = x.chunks(hd).flat_map(|r| rms_ref(r, &w, 1e-6)).collect();
        h.check("head_norm", "4x(32x128)", &got, &want, TOL_EXACT);
    }
    let (rows, width) = (7, 1536);
    // add_bias
    {
        let x = uniform(rng, rows * width);
        let b = uniform(rng, width);
        let bid = h.b.load_vector(&b).expect("loads");
        h.set(Buf::Q, &x, width);
        h.b.add_bias(Buf::Q, bid, rows, width);
        let got = h.get(Buf::Q, rows, width);
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f64 + b[i % width] as f64)
            .collect();
        h.check("add_bias", "7x1536", &got, &want, TOL_EXACT);
    }
    // add
    {
        let a = uniform(rng, rows * width);
        let b = uniform(rng, rows * width);
        h.set(Buf::Residual, &a, width);
        h.set(Buf::BranchOut, &b, width);
        h.b.add(Buf::Residual, Buf::BranchOut, rows, width);
        let got = h.get(Buf::Residual, rows, width);
        let want: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| x as f64 + y as f64)
            .collect();
        h.check("add", "7x1536", &got, &want, TOL_EXACT);
    }
    // glu, both activations
    for (act, name) in [(Glu::Silu, "silu"), (Glu::GeluTanh, "gelu_tanh")] {
        let g: Vec<f32> = uniform(rng, rows * width).iter().map(|v| v * 6.0).collect();
        let u = uniform(rng, rows * width);
        h.set(Buf::FfnGate, &g, width);
        h.set(Buf::FfnUp, &u, width);
        h.b.glu(Buf::FfnGate, Buf::FfnUp, rows, width, act);
        let got = h.get(Buf::FfnGate, rows, width);
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| glu_ref(g as f64, u as f64, act))
            .collect();
        h.check("glu", &format!("{name} 7x1536"), &got, &want, TOL_EXACT);
    }
    // zero
    {
        let x = uniform(rng, rows * width);
        h.set(Buf::BranchOut, &x, width);
        h.b.zero(Buf::BranchOut, rows, width);
        let got = h.get(Buf::BranchOut, rows, width);
        h.check("zero", "7x1536", &got, &vec![0.0; rows * width], TOL_EXACT);
    }
    // gather_rows
    {
        let w = 576;
        let x = uniform(rng, 10 * w);
        let idx = [3usize, 0, 9, 3, 7];
        h.set(Buf::Residual, &x, w);
        h.b.gather_rows(Buf::Residual, &idx, w, Buf::Norm);
        let got = h.get(Buf::Norm, idx.len(), w);
        let want: Vec<f64> = idx
            .iter()
            .flat_map(|&r| x[r * w..(r + 1) * w].iter().map(|&v| v as f64))
            .collect();
        h.check("gather_rows", "5 of 10x576", &got, &want, TOL_EXACT);
    }
}

fn rope_ref(
    x: &[f32],
    heads: usize,
    hd: usize,
    pos: usize,
    theta: f32,
    neox: bool,
    freqs: Option<&[f32]>,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = hd / 2;
    for i in 0..half {
        let mut freq = (theta as f64).powf(-2.0 * i as f64 / hd as f64);
        if let Some(f) = freqs {
            freq /= f[i] as f64;
        }
        let (s, c) = (pos as f64 * freq).sin_cos();
        for h in 0..heads {
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (x[h * hd + a] as f64, x[h * hd + b] as f64);
            out[h * hd + a] = x0 * c - x1 * s;
            out[h * hd + b] = x0 * s + x1 * c;
        }
    }
    out
}

fn test_rope(h: &mut Harness, rng: &mut Rng) {
    let tables: Vec<Vec<u32>> = Vec::new();
    let seqs = [
        StepSeq {
            start: 0,
            tokens: 3,
            tables: &tables,
        },
        StepSeq {
            start: 40_000,
            tokens: 2,
            tables: &tables,
        },
        StepSeq {
            start: 17,
            tokens: 1,
            tables: &tables,
        },
    ];
    let step = Step {
        seqs: &seqs,
        rows: 6,
    };
    let positions: Vec<usize> = step.positions().collect();
    let factors: Vec<f32> = (0..64).map(|i| 1.0 + (i % 7) as f32).collect();
    let fid = h.b.load_vector(&factors).expect("loads");
    for (label, heads, hd, theta, neox, freqs) in [
        ("SmolLM2 9x64 normal", 9, 64, 100_000.0, false, None),
        ("Qwen 16x128 neox", 16, 128, 1_000_000.0, true, None),
        ("Llama3 32x128 freqs", 32, 128, 500_000.0, false, Some(fid)),
    ] {
        let width = heads * hd;
        let x = uniform(rng, step.rows * width);
        h.set(Buf::Q, &x, width);
        h.b.rope(Buf::Q, &step, heads, hd, &RopeParams { theta, neox, freqs });
        let got = h.get(Buf::Q, step.rows, width);
        let f = freqs.map(|_| &factors[..]);
        let want: Vec<f64> = x
            .chunks(width)
            .zip(&positions)
            .flat_map(|(r, &p)| rope_ref(r, heads, hd, p, theta, neox, f))
            .collect();
        h.check("rope", label, &got, &want, TOL_ROPE);
    }
}

/// `x` rounded to the cache's precision, head by head, as the CPU engine's
/// `round_to` does (q8_0 through fathom_kernels' own quantizer).
fn round_kv(dtype: KvDtype, x: &[f32], hd: usize) -> Vec<f32> {
    match dtype {
        KvDtype::F32 => x.to_vec(),
        KvDtype::F16 => x
            .iter()
            .map(|&v| ops::f16_to_f32(ops::f32_to_f16(v)))
            .collect(),
        KvDtype::Bf16 => x.iter().map(|&v| ops::bf16_to_f32(bf16_of(v))).collect(),
        KvDtype::Q8_0 => {
            let mut out = vec![0f32; x.len()];
            let mut bytes = vec![0u8; hd / 32 * 34];
            for (src, dst) in x.chunks(hd).zip(out.chunks_mut(hd)) {
                ops::quantize_q8_0_row(src, &mut bytes);
                ops::dequantize_q8_0_row(&bytes, dst);
            }
            out
        }
    }
}

/// One sequence's history as the reference keeps it: rounded K and V rows.
#[derive(Default, Clone)]
struct History {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

fn attention_ref(
    s: &AttentionShape,
    starts: &[(usize, usize)],
    hist: &[History],
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Vec<f64> {
    let (nh, nkv, dk, dv) = (s.n_heads, s.n_kv_heads, s.key_dim, s.value_dim);
    let mut out = Vec::new();
    let mut row0 = 0;
    for (si, &(start, tokens)) in starts.iter().enumerate() {
        for t in 0..tokens {
            let p = start + t;
            let first = s.window.map(|w| (p + 1).saturating_sub(w)).unwrap_or(0);
            let row = row0 + t;
            for hh in 0..nh {
                let g = hh / (nh / nkv);
                let qr = &q[(row * nh + hh) * dk..(row * nh + hh + 1) * dk];
                let key = |j: usize| -> (&[f32], &[f32]) {
                    if j < start {
                        (
                            &hist[si].k[j][g * dk..(g + 1) * dk],
                            &hist[si].v[j][g * dv..(g + 1) * dv],
                        )
                    } else {
                        let r = row0 + j - start;
                        (
                            &k[(r * nkv + g) * dk..(r * nkv + g + 1) * dk],
                            &v[(r * nkv + g) * dv..(r * nkv + g + 1) * dv],
                        )
                    }
                };
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        let (kj, _) = key(j);
                        qr.iter()
                            .zip(kj)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * s.scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let mut o = vec![0f64; dv];
                for (j, w) in (first..=p).zip(&e) {
                    let (_, vj) = key(j);
                    for (oi, &vv) in o.iter_mut().zip(vj) {
                        *oi += w / sum * vv as f64;
                    }
                }
                out.extend(o);
            }
        }
        row0 += tokens;
    }
    out
}

/// Three steps (prefill, chunked prefill across blocks, batched decode) of
/// two sequences over two layers of one KV layout.
/// Each sequence's page tables, one per KV group.
type PageTables = [Vec<Vec<u32>>; 2];
/// One step: per sequence, (first position, tokens).
type StepRows = [(usize, usize); 2];

/// The two sequences' page tables and the steps (per sequence: first
/// position, tokens) the attention cases run: sequence 0 in blocks 5, 2, 9
/// (4 for the ring), sequence 1 in 7, 0, 3. With a sliding window, group 0
/// (full) is not used by the layers and group 1 rings.
fn attention_schedule(sliding: bool) -> (PageTables, &'static [StepRows]) {
    if sliding {
        (
            [
                vec![vec![5, 2, 9, 1], vec![4, 1]],
                vec![vec![7, 0, 3, 4], vec![0, 3]],
            ],
            &[
                [(0, 20), (0, 5)],
                [(20, 16), (5, 30)],
                [(36, 1), (35, 1)],
                [(37, 1), (36, 9)],
            ],
        )
    } else {
        (
            [vec![vec![5, 2, 9, 1]], vec![vec![7, 0, 3, 4]]],
            &[[(0, 20), (0, 5)], [(20, 1), (5, 30)], [(21, 1), (35, 1)]],
        )
    }
}

/// `rope`: the steps go through `attend` (rope of q and k, attention, the
/// cache write: on CUDA, decode steps do all of it in the attention
/// kernel), against the reference rope; else `attention` and `kv_write`.
#[allow(clippy::too_many_arguments)]
fn test_attention(
    h: &mut Harness,
    rng: &mut Rng,
    label: &str,
    shape: AttentionShape,
    dtype: KvDtype,
    layers: [usize; 2],
    tables: [Vec<Vec<u32>>; 2],
    steps: &[[(usize, usize); 2]],
    rope: Option<&RopeParams>,
) {
    let (nh, nkv, dk, dv) = (
        shape.n_heads,
        shape.n_kv_heads,
        shape.key_dim,
        shape.value_dim,
    );
    let mut hist = vec![vec![History::default(); 2]; 2];
    for (si, st) in steps.iter().enumerate() {
        let seqs: Vec<StepSeq> = st
            .iter()
            .zip(&tables)
            .map(|(&(start, tokens), t)| StepSeq {
                start,
                tokens,
                tables: t,
            })
            .collect();
        let rows: usize = st.iter().map(|s| s.1).sum();
        let step = Step { seqs: &seqs, rows };
        for (li, &layer) in layers.iter().enumerate() {
            let q = uniform(rng, rows * nh * dk);
            let k = uniform(rng, rows * nkv * dk);
            let v = uniform(rng, rows * nkv * dv);
            h.set(Buf::Q, &q, nh * dk);
            h.set(Buf::K, &k, nkv * dk);
            h.set(Buf::V, &v, nkv * dv);
            let (q, k) = match rope {
                Some(r) => {
                    h.b.attend(layer, &shape, &step, IO, r);
                    let positions: Vec<usize> = step.positions().collect();
                    let roped = |x: &[f32], heads: usize| -> Vec<f32> {
                        x.chunks(heads * dk)
                            .zip(&positions)
                            .flat_map(|(row, &p)| {
                                rope_ref(row, heads, dk, p, r.theta, r.neox, None)
                            })
                            .map(|v| v as f32)
                            .collect()
                    };
                    (roped(&q, nh), roped(&k, nkv))
                }
                None => {
                    h.b.attention(layer, &shape, &step, IO);
                    h.b.kv_write(layer, &step, Buf::K, Buf::V, &shape);
                    (q, k)
                }
            };
            let got = h.get(Buf::AttnOut, rows, nh * dv);
            let qr = if dtype == KvDtype::F16 {
                round_kv(dtype, &q, dk)
            } else {
                q.clone()
            };
            let kr = round_kv(dtype, &k, dk);
            let vr = round_kv(dtype, &v, dv);
            let want = attention_ref(&shape, st, &hist[li], &qr, &kr, &vr);
            let op = if rope.is_some() {
                "attend"
            } else {
                "attention+kv_write"
            };
            h.check(
                op,
                &format!("{label} {} L{layer} step{si}", dtype.name()),
                &got,
                &want,
                TOL_ATTN,
            );
            let mut row = 0;
            for (seq, &(_, tokens)) in st.iter().enumerate() {
                for t in 0..tokens {
                    let r = row + t;
                    hist[li][seq]
                        .k
                        .push(kr[r * nkv * dk..(r + 1) * nkv * dk].to_vec());
                    hist[li][seq]
                        .v
                        .push(vr[r * nkv * dv..(r + 1) * nkv * dv].to_vec());
                }
                row += tokens;
            }
        }
    }
}

/// The rope an attention case runs `attend` with: both pairings.
fn attention_rope(label: &str) -> RopeParams {
    RopeParams {
        theta: 500_000.0,
        neox: label.starts_with("Llama"),
        freqs: None,
    }
}

fn attention_cases() -> Vec<(String, AttentionShape, KvLayout, [usize; 2])> {
    let smol = AttentionShape {
        n_heads: 9,
        n_kv_heads: 3,
        key_dim: 64,
        value_dim: 64,
        window: None,
        scale: 0.125,
    };
    let llama = AttentionShape {
        n_heads: 32,
        n_kv_heads: 8,
        key_dim: 128,
        value_dim: 128,
        window: None,
        scale: 1.0 / 128f32.sqrt(),
    };
    let mut out = Vec::new();
    for dtype in KvDtype::ALL {
        out.push((
            "SmolLM2 9/3x64".to_string(),
            smol,
            KvLayout {
                groups: vec![group(dtype, 3, 64, 64, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
            },
            [0, 1],
        ));
    }
    for dtype in [KvDtype::F16, KvDtype::Q8_0] {
        out.push((
            "Llama-8B 32/8x128".to_string(),
            llama,
            KvLayout {
                groups: vec![group(dtype, 8, 128, 128, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
            },
            [0, 1],
        ));
        // A sliding-window layer (window 32: a ring of two blocks) beside a
        // full one, as Gemma 3 interleaves them.
        let sliding = AttentionShape {
            window: Some(32),
            ..smol
        };
        out.push((
            "sliding w32 9/3x64".to_string(),
            sliding,
            KvLayout {
                groups: vec![
                    group(dtype, 3, 64, 64, 1, None, 12),
                    group(dtype, 3, 64, 64, 2, Some(32), 6),
                ],
                dtype,
                layer_groups: vec![Some(0), Some(1), Some(1)],
            },
            [1, 2],
        ));
    }
    out
}

fn test_moe(h: &mut Harness, rng: &mut Rng) {
    // Qwen3-30B-A3B: 128 experts, 8 active, hidden 2048.
    let (rows, ne, k, d) = (6, 128, 8, 2048);
    for normalize in [true, false] {
        let logits: Vec<f32> = uniform(rng, rows * ne).iter().map(|v| v * 4.0).collect();
        h.set(Buf::RouterLogits, &logits, ne);
        h.b.route_experts(Buf::RouterLogits, rows, ne, k, normalize);
        // Reference routes.
        let mut routes = Vec::new();
        for r in 0..rows {
            let l = &logits[r * ne..(r + 1) * ne];
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let mut idx: Vec<usize> = (0..ne).collect();
            idx.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
            let mut chosen: Vec<(usize, f64)> = idx[..k].iter().map(|&i| (i, e[i] / sum)).collect();
            if normalize {
                let t: f64 = chosen.iter().map(|c| c.1).sum();
                chosen.iter_mut().for_each(|c| c.1 /= t);
            }
            routes.push(chosen);
        }
        let x = uniform(rng, rows * d);
        h.set(Buf::Norm, &x, d);
        h.b.zero(Buf::BranchOut, rows, d);
        let mut want_out = vec![0f64; rows * d];
        let mut count_fail = None;
        for e in 0..ne {
            let want_rows: Vec<usize> = (0..rows)
                .filter(|&r| routes[r].iter().any(|c| c.0 == e))
                .collect();
            let n = h.b.gather_expert_rows(e, rows, k, Buf::Norm, d, Buf::MoeIn);
            if n != want_rows.len() {
                count_fail = Some(format!(
                    "expert {e}: {n} rows gathered, {} expected",
                    want_rows.len()
                ));
                break;
            }
            if n == 0 {
                continue;
            }
            if e % 17 == 0 {
                let got = h.get(Buf::MoeIn, n, d);
                let want: Vec<f64> = want_rows
                    .iter()
                    .flat_map(|&r| x[r * d..(r + 1) * d].iter().map(|&v| v as f64))
                    .collect();
                h.check(
                    "gather_expert_rows",
                    &format!("expert {e} 6x2048 norm={normalize}"),
                    &got,
                    &want,
                    TOL_EXACT,
                );
            }
            // The expert's "output": its own random rows.
            let y = uniform(rng, n * d);
            h.set(Buf::MoeOut, &y, d);
            h.b.scatter_expert_rows(e, rows, k, Buf::MoeOut, d, Buf::BranchOut);
            for (i, &r) in want_rows.iter().enumerate() {
                let w = routes[r]
                    .iter()
                    .find(|c| c.0 == e)
                    .map(|c| c.1)
                    .unwrap_or(0.0);
                for c in 0..d {
                    want_out[r * d + c] += w * y[i * d + c] as f64;
                }
            }
        }
        if let Some(msg) = count_fail {
            let line = format!("{:5} route_experts      {msg} FAIL", h.b.name());
            println!("{line}");
            h.failures.push(line);
            continue;
        }
        let got = h.get(Buf::BranchOut, rows, d);
        h.check(
            "route+scatter",
            &format!("128 experts top-8 norm={normalize}"),
            &got,
            &want_out,
            1e-9,
        );
    }
}

/// A layer's experts for [`test_routed_experts`]: gate and up of one kind,
/// down of another, loaded expert by expert (gate, up, down) as the engine
/// loads them; with their values.
struct Experts {
    ids: Vec<[MatrixId; 3]>,
    values: Vec<[Vec<f32>; 3]>,
    label: String,
}

/// (gate/up kind, down kind) pairs: each kind with routed kernels on the
/// GPU (int8 activations, f32 activations, a Q4_K_M-like mix) and one
/// without (Q4_1: the gather path everywhere).
fn routed_kinds() -> Vec<(WeightType, WeightType)> {
    use WeightType::*;
    vec![
        (Q4_0, Q4_0),
        (Q8_0, Q8_0),
        (Q4_K, Q6_K),
        (F16, F16),
        (Q5_K, Q5_K),
        (Q4_1, Q4_1),
    ]
}

/// Experts the routed tests use: 16 of them, 4 active, hidden 512, FFN 256.
const ROUTED: (usize, usize, usize, usize) = (16, 4, 512, 256);

fn load_experts<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
    (gate_kind, down_kind): (WeightType, WeightType),
) -> Experts {
    let (ne, _, d, f) = ROUTED;
    let (mut ids, mut values) = (Vec::new(), Vec::new());
    for _ in 0..ne {
        let (g, gv) = random_matrix(rng, Ok(gate_kind), f, d);
        let (u, uv) = random_matrix(rng, Ok(gate_kind), f, d);
        let (dn, dv) = random_matrix(rng, Ok(down_kind), d, f);
        let load = |h: &mut Harness<B>, m| h.b.load_matrix(m).expect("loads");
        ids.push([load(h, g), load(h, u), load(h, dn)]);
        values.push([gv, uv, dv]);
    }
    Experts {
        ids,
        values,
        label: format!("{}/{}", gate_kind.name(), down_kind.name()),
    }
}

/// Routes `rows` random rows, then runs the routed experts over them into
/// BranchOut; returns x and the router logits used.
fn route_and_run<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
    experts: &Experts,
    rows: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (ne, k, d, f) = ROUTED;
    let logits: Vec<f32> = uniform(rng, rows * ne).iter().map(|v| v * 4.0).collect();
    h.set(Buf::RouterLogits, &logits, ne);
    let x = uniform(rng, rows * d);
    h.set(Buf::Norm, &x, d);
    h.b.route_experts(Buf::RouterLogits, rows, ne, k, true);
    let out = Buf::BranchOut;
    let ffn = RoutedFfn {
        experts: &experts.ids,
        k,
        act: Glu::Silu,
        width: d,
        ffn_width: f,
    };
    h.b.routed_experts(&ffn, Buf::Norm, rows, out);
    (x, logits)
}

/// routed_experts (after route_experts, normalized top-k) of one row (the
/// GPU's on-device routes) and of three (the gather path), for each kind
/// pair, against the f64 FFN of each row's experts weighted by its f64
/// routes. Two matmuls deep on quantized activations: twice the matmul
/// tolerance.
fn test_routed_experts(h: &mut Harness, rng: &mut Rng) {
    let (ne, k, d, f) = ROUTED;
    for kinds in routed_kinds() {
        let experts = load_experts(h, rng, kinds);
        for rows in [1, 3] {
            let (x, logits) = route_and_run(h, rng, &experts, rows);
            let got = h.get(Buf::BranchOut, rows, d);
            let mut want = vec![0f64; rows * d];
            for r in 0..rows {
                let l = &logits[r * ne..(r + 1) * ne];
                let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                let p: Vec<f64> = l.iter().map(|&v| (v as f64 - m).exp()).collect();
                let mut idx: Vec<usize> = (0..ne).collect();
                idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
                let total: f64 = idx[..k].iter().map(|&e| p[e]).sum();
                let xr = &x[r * d..(r + 1) * d];
                for &e in &idx[..k] {
                    let [gv, uv, dv] = &experts.values[e];
                    let hidden: Vec<f32> = reference_matmul(gv, f, d, xr, 1)
                        .iter()
                        .zip(reference_matmul(uv, f, d, xr, 1))
                        .map(|(&g, u)| glu_ref(g, u, Glu::Silu) as f32)
                        .collect();
                    let y = reference_matmul(dv, d, f, &hidden, 1);
                    for (o, v) in want[r * d..(r + 1) * d].iter_mut().zip(y) {
                        *o += p[e] / total * v;
                    }
                }
            }
            h.check(
                "routed_experts",
                &format!("{} 16 experts top-4 x{rows}", experts.label),
                &got,
                &want,
                2.0 * TOL_MATMUL,
            );
        }
    }
}

/// Tensor-parallel shards of a matrix (`HostMatrix::rows_range`,
/// `cols_range`) on one backend: a column-split (rows range) product is
/// the whole product's rows; row-split (cols range) partial products of
/// the matching slices of x, summed on the host where NCCL's all-reduce
/// would sum them across GPUs, equal the whole product. Two and four
/// shards, every weight kind.
fn test_shards(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols, n) = (512, 2048, 3);
    for kind in all_kinds() {
        let (m, values) = random_matrix(rng, kind, rows, cols);
        let x = uniform(rng, n * cols);
        let want = reference_matmul(&values, rows, cols, &x, n);
        for size in [2, 4] {
            let (r, c) = (rows / size, cols / size);
            let mut summed = vec![0f64; n * rows];
            let mut stacked = vec![0f64; n * rows];
            for rank in 0..size {
                let id =
                    h.b.load_matrix(m.rows_range(rank * r, (rank + 1) * r).expect("rows"))
                        .expect("loads");
                h.set(Buf::FfnGate, &x, cols);
                h.b.matmul(id, Buf::FfnGate, n, Buf::FfnUp);
                for (t, row) in h.get(Buf::FfnUp, n, r).chunks(r).enumerate() {
                    for (i, &v) in row.iter().enumerate() {
                        stacked[t * rows + rank * r + i] = v as f64;
                    }
                }
                let id =
                    h.b.load_matrix(m.cols_range(rank * c, (rank + 1) * c).expect("cols"))
                        .expect("loads");
                let xs: Vec<f32> = x
                    .chunks(cols)
                    .flat_map(|row| row[rank * c..(rank + 1) * c].to_vec())
                    .collect();
                h.set(Buf::FfnGate, &xs, c);
                h.b.matmul(id, Buf::FfnGate, n, Buf::FfnUp);
                for (s, &v) in summed.iter_mut().zip(&h.get(Buf::FfnUp, n, rows)) {
                    *s += v as f64;
                }
            }
            let case = format!("{} 512x2048 x{n} / {size}", kind_name(kind));
            let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            h.check("shard rows", &case, &f32s(&stacked), &want, TOL_MATMUL);
            h.check("shard cols + sum", &case, &f32s(&summed), &want, TOL_MATMUL);
        }
    }
}

/// The greedy sampler's pick, written out: the first largest value, NaN
/// skipped, `banned` ids counted as −∞; 0 when every value is NaN.
fn greedy_reference(row: &[f32], banned: &[u32]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        let v = if banned.contains(&(i as u32)) {
            f32::NEG_INFINITY
        } else {
            v
        };
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i as u32, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// greedy: each logits row's pick without and with banned ids, exactly,
/// on rows built to hit a tie, a banned maximum, NaN, −∞ and all-NaN; rows
/// of 40,008 values, which the CUDA scan cuts into 20 pieces.
fn test_greedy<B: Backend + ?Sized>(h: &mut Harness<B>, rng: &mut Rng) {
    let (rows, width) = (9, 40_008);
    let banned = [7u32, 2, 4000];
    let mut x = uniform(rng, rows * width);
    let row = |r: usize| r * width..(r + 1) * width;
    x[row(1)][3] = 9.0; // a tie: the first wins
    x[row(1)][4095] = 9.0;
    x[row(2)][7] = 9.0; // a banned maximum, then a tie among the rest
    x[row(2)][11] = 8.0;
    x[row(2)][12] = 8.0;
    x[row(3)][..100].fill(f32::NAN); // NaN before the maximum
    x[row(3)][50] = 9.0;
    x[row(3)][200] = 8.5;
    x[row(4)].fill(f32::NAN); // nothing to pick
    x[row(5)].fill(f32::NEG_INFINITY); // −∞ everywhere but a NaN
    x[row(5)][0] = f32::NAN;
    x[row(6)].fill(f32::NAN); // only banned ids hold numbers
    x[row(6)][2] = 1.0;
    x[row(6)][4000] = 2.0;
    x[row(7)][4000] = f32::INFINITY; // +∞, banned
    x[row(8)][width - 1] = 9.0; // the maximum last, in the scan's last piece
    x[row(8)][20_000] = 8.9;
    h.set(Buf::Logits, &x, width);
    let mut got = vec![[u32::MAX; 2]; rows];
    h.b.greedy(rows, width, &banned, &mut got);
    if let Some(e) = h.b.take_error() {
        panic!("{}: device error: {e}", h.b.name());
    }
    for (r, g) in got.iter().enumerate() {
        // The sampler's rule: the argmax, unless it is banned.
        let plain = greedy_reference(&x[row(r)], &[]);
        let want = if banned.contains(&plain) {
            [plain, greedy_reference(&x[row(r)], &banned)]
        } else {
            [plain, plain]
        };
        let ok = *g == want;
        let line = format!(
            "{:5} greedy             row {r}: got {g:?} want {want:?} {}",
            h.b.name(),
            if ok { "ok" } else { "FAIL" }
        );
        println!("{line}");
        if !ok {
            h.failures.push(line);
        }
    }
}

#[test]
fn conformance() {
    let mut failures = Vec::new();
    let mut rng = Rng::xorshift64_star(0x5eed_1234_abcd_0001);
    let mut ran = 0;
    for b in backends(&small_kv()) {
        let mut h = Harness::new(b);
        test_embed(&mut h, &mut rng);
        test_matmul(&mut h, &mut rng, false);
        test_elementwise(&mut h, &mut rng);
        test_matmul_glu(&mut h, &mut rng);
        test_matmul_many(&mut h, &mut rng);
        test_norm_then_matmul(&mut h, &mut rng);
        test_shards(&mut h, &mut rng);
        test_rope(&mut h, &mut rng);
        test_moe(&mut h, &mut rng);
        test_routed_experts(&mut h, &mut rng);
        test_greedy(&mut h, &mut rng);
        failures.extend(h.finish());
        ran += 1;
    }
    for (label, shape, kv, layers) in attention_cases() {
        let dtype = kv.dtype;
        let sliding = shape.window.is_some();
        for rope in [None, Some(attention_rope(&label))] {
            for b in backends(&kv) {
                let mut h = Harness::new(b);
                let (tables, steps) = attention_schedule(sliding);
                test_attention(
                    &mut h,
                    &mut rng,
                    &label,
                    shape,
                    dtype,
                    layers,
                    tables,
                    steps,
                    rope.as_ref(),
                );
                failures.extend(h.finish());
            }
        }
    }
    if ran == 0 {
        println!("conformance: no backend present; nothing compared");
    }
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One-token MoE on the routes the device holds (CUDA) against the same
/// backend's expert-by-expert gather path: bit for bit (the same matvec
/// kernels, the weighted sum in the same expert order), and without the
/// routes' read-back (which the gather path needs) for every kind pair with
/// routed kernels; Q4_1, without, reads them back.
#[test]
fn cuda_routed_experts_equal_the_gather_path() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let mut rng = Rng::xorshift64_star(0x3e7_0001);
    let d = ROUTED.2;
    for kinds in routed_kinds() {
        let experts = load_experts(&mut h, &mut rng, kinds);
        let seed = rng.clone();
        let mut outs = Vec::new();
        let mut read_backs = Vec::new();
        for device in [true, false] {
            h.b.use_device_routing(device);
            rng = seed.clone();
            let before = h.b.routes_read_back();
            route_and_run(&mut h, &mut rng, &experts, 1);
            outs.push(h.get(Buf::BranchOut, 1, d));
            read_backs.push(h.b.routes_read_back() - before);
        }
        let label = &experts.label;
        let routed = kinds.0 != WeightType::Q4_1;
        assert_eq!(
            read_backs,
            [u64::from(!routed), 1],
            "{label}: routes read back (device routing, gather path)"
        );
        let differ = outs[0]
            .iter()
            .zip(&outs[1])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ, 0,
            "{label}: {differ} of {d} values differ from the gather path"
        );
        println!("{label}: device routing = gather path, bit for bit");
    }
    h.b.use_device_routing(true);
}

/// A repeated step of exactly GRAPH_MAX_NODES launches (an embedding and
/// one-row f32 matmuls, a cuBLAS kernel each, then the logits read-back)
/// becomes one graph within GRAPH_BYTES of device memory; one launch more
/// runs launch by launch and takes none. Runs alone in its process
/// (run.sh): the driver reuses graph memory an earlier graph left.
#[test]
fn cuda_graph_memory_within_plan() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let eye = h.eye;
    for nodes in [GRAPH_MAX_NODES, GRAPH_MAX_NODES + 1] {
        let before = (h.b.memory().free, h.b.graph_stats());
        for _ in 0..3 {
            h.b.embed(eye, &[0], 1.0, Buf::Norm);
            for _ in 0..nodes - 1 {
                h.b.matmul(eye, Buf::Norm, 1, Buf::Q);
            }
            h.b.logits(1, EYE);
        }
        let (after, stats) = (h.b.memory().free, h.b.graph_stats());
        let grown = before.0.saturating_sub(after);
        let captured = stats.captures - before.1.captures;
        println!("{nodes} launches a step: {captured} graph(s), {grown} bytes of device memory");
        if nodes <= GRAPH_MAX_NODES {
            assert_eq!(captured, 1, "a step of {nodes} launches is kept as a graph");
            assert!(
                grown <= GRAPH_BYTES,
                "its graph took {grown} bytes, {GRAPH_BYTES} planned"
            );
        } else {
            assert_eq!(
                captured, 0,
                "a step of {nodes} launches runs launch by launch"
            );
            assert_eq!(
                grown, 0,
                "launch by launch, yet {grown} bytes were allocated"
            );
        }
    }
}

/// The CUDA backend's split attention (key ranges cut into pieces, then
/// merged) on the conformance cases, which are too short for the backend to
/// split on its own: forced to 2, 5 and 40 pieces (empty pieces included;
/// more than the plan's `ATTENTION_MAX_SPLITS` where the partials hold them),
/// through the CUDA-core split kernels and through the tensor-core decode
/// kernel (forced where it applies: f16 caches of 64 or 128 dims; the
/// other cases run the split kernels again).
#[test]
fn cuda_attention_splits() {
    let mut failures = Vec::new();
    for (splits, mma) in [
        (2usize, false),
        (5, false),
        (40, false),
        (1, true),
        (2, true),
        (5, true),
        (40, true),
    ] {
        for (label, shape, mut kv, layers) in attention_cases() {
            // Plan partials as for a long context: the conformance groups'
            // 128 tokens would not be split.
            for g in &mut kv.groups {
                g.tokens = 4096;
            }
            let sliding = shape.window.is_some();
            for rope in [None, Some(attention_rope(&label))] {
                let Some(mut b) = cuda_backend(&arena(), &kv) else {
                    return;
                };
                b.force_attention_splits(Some(splits));
                b.force_decode_mma(Some(mma));
                let mut h: Harness = Harness::new(Box::new(b));
                let mut rng = Rng::xorshift64_star(0x5b17 ^ splits as u64);
                let (tables, steps) = attention_schedule(sliding);
                let label = format!("{label} /{splits}{}", if mma { " mma" } else { "" });
                test_attention(
                    &mut h,
                    &mut rng,
                    &label,
                    shape,
                    kv.dtype,
                    layers,
                    tables,
                    steps,
                    rope.as_ref(),
                );
                failures.extend(h.finish());
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Rough speed of attention over a 4,096-position f16 cache (Llama-3.1-8B
/// heads: 32 query, 8 KV, 128 dims), one layer: a decode row, 16 rows and
/// a 256-token prefill chunk at the end of the context; then a serving
/// step's decode rows, one each of 64 sequences of 256 positions. Prints
/// only.
#[test]
fn cuda_attention_speed() {
    let arena = arena();
    let ctx = 4096usize;
    let blocks = (ctx / 16) as u64;
    // Room for the 64 short sequences too (16 blocks each).
    let (batch, batch_ctx) = (64usize, 256usize);
    let pool = blocks.max((batch * batch_ctx / 16) as u64);
    let mut g = group(KvDtype::F16, 8, 128, 128, 1, None, pool);
    g.tokens = ctx as u64;
    g.blocks_per_sequence = blocks;
    let kv = KvLayout {
        groups: vec![g],
        dtype: KvDtype::F16,
        layer_groups: vec![Some(0)],
    };
    let Some(b) = cuda_backend(&arena, &kv) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let shape = AttentionShape {
        n_heads: 32,
        n_kv_heads: 8,
        key_dim: 128,
        value_dim: 128,
        window: None,
        scale: 1.0 / 128f32.sqrt(),
    };
    let tables = vec![(0..blocks as u32).collect::<Vec<u32>>()];
    let mut rng = Rng::xorshift64_star(11);
    // Fill the cache with values (else it holds whatever the allocation had).
    for chunk in 0..ctx / 256 {
        let seqs = [StepSeq {
            start: chunk * 256,
            tokens: 256,
            tables: &tables,
        }];
        let step = Step {
            seqs: &seqs,
            rows: 256,
        };
        h.set(Buf::K, &uniform(&mut rng, 256 * 1024), 1024);
        h.set(Buf::V, &uniform(&mut rng, 256 * 1024), 1024);
        h.b.kv_write(0, &step, Buf::K, Buf::V, &shape);
    }
    h.set(Buf::Q, &uniform(&mut rng, 256 * 4096), 4096);
    for (tokens, reps) in [(1usize, 50), (16, 20), (256, 5)] {
        let seqs = [StepSeq {
            start: ctx - tokens,
            tokens,
            tables: &tables,
        }];
        let step = Step {
            seqs: &seqs,
            rows: tokens,
        };
        h.b.attention(0, &shape, &step, IO);
        let _ = h.get(Buf::Logits, 1, 8);
        let t = std::time::Instant::now();
        for _ in 0..reps {
            h.b.attention(0, &shape, &step, IO);
        }
        let _ = h.get(Buf::Logits, 1, 8);
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "speed attention f16 32/8x128 ctx {ctx} x{tokens:3}: {:9.1} us a layer",
            s * 1e6
        );
    }
    let per_seq = batch_ctx / 16;
    let tables: Vec<Vec<Vec<u32>>> = (0..batch)
        .map(|i| {
            vec![(0..per_seq as u32)
                .map(|b| (i * per_seq) as u32 + b)
                .collect()]
        })
        .collect();
    for t in &tables {
        let seqs = [StepSeq {
            start: 0,
            tokens: batch_ctx,
            tables: t,
        }];
        let step = Step {
            seqs: &seqs,
            rows: batch_ctx,
        };
        h.set(Buf::K, &uniform(&mut rng, batch_ctx * 1024), 1024);
        h.set(Buf::V, &uniform(&mut rng, batch_ctx * 1024), 1024);
        h.b.kv_write(0, &step, Buf::K, Buf::V, &shape);
    }
    let seqs: Vec<StepSeq> = tables
        .iter()
        .map(|t| StepSeq {
            start: batch_ctx - 1,
            tokens: 1,
            tables: t,
        })
        .collect();
    let step = Step {
        seqs: &seqs,
        rows: batch,
    };
    h.b.attention(0, &shape, &step, IO);
    let _ = h.get(Buf::Logits, 1, 8);
    let t = std::time::Instant::now();
    for _ in 0..20 {
        h.b.attention(0, &shape, &step, IO);
    }
    let _ = h.get(Buf::Logits, 1, 8);
    let s = t.elapsed().as_secs_f64() / 20.0;
    let bytes = (batch * batch_ctx * 2 * 1024 * 2) as f64;
    println!(
        "speed attention f16 32/8x128 {batch} seqs x ctx {batch_ctx}: {:9.1} us a layer ({:.0} GB/s of K and V)",
        s * 1e6,
        bytes / s / 1e9
    );
}

/// The CUDA backend's other prefill path (the tiled f32 kernel, which the
/// default cuBLAS-on-f16 path falls back to), on the same cases.
#[test]
fn cuda_tiled_prefill() {
    let arena = arena();
    let Some(mut b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    b.use_tiled_prefill(true);
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let mut rng = Rng::xorshift64_star(0x7135);
    test_matmul(&mut h, &mut rng, true);
    let failures = h.finish();
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Device memory of the CUDA backend's start-up steps and first launches
/// (cuMemGetInfo deltas) against the plan's terms for them: each step
/// within its constant, the allocation exactly its planned 2 MiB pages,
/// first launches nothing. Runs alone in its process (run.sh), on an idle
/// device, since the context term is read as total − free.
#[test]
fn cuda_startup_memory() {
    let arena = arena();
    let Some(mut b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let s = b.startup_memory().clone();
    let mib = |v: u64| v as f64 / (1 << 20) as f64;
    println!("cuda startup memory (cuMemGetInfo deltas, bytes):");
    println!(
        "  context (total - free after creation) {:>12} ({:.1} MiB)",
        s.context,
        mib(s.context)
    );
    println!(
        "  stream                                {:>12} ({:.1} MiB)",
        s.stream,
        mib(s.stream)
    );
    println!(
        "  module load (fatbin)                  {:>12} ({:.1} MiB)",
        s.module,
        mib(s.module)
    );
    println!(
        "  one allocation                        {:>12} ({:.1} MiB; requested {})",
        s.allocation,
        mib(s.allocation),
        s.allocation_requested
    );
    println!(
        "  cuBLAS handle                         {:>12} ({:.1} MiB)",
        s.blas_handle,
        mib(s.blas_handle)
    );
    println!(
        "  cuBLAS workspace (inside the carve)   {:>12} ({:.1} MiB)",
        s.blas_workspace,
        mib(s.blas_workspace)
    );
    println!(
        "  prefill staging (inside the carve)    {:>12} ({:.1} MiB)",
        s.gemm_staging,
        mib(s.gemm_staging)
    );
    println!("  cuBLAS from {}", b.blas_path());
    let before = b.memory().free;
    // First launches: a quantized matvec, a cuBLAS f16 GEMM and the tiled
    // kernel for prefill, SGEMM (the read-back), attention.
    let mut rng = Rng::xorshift64_star(7);
    let (m, _) = random_matrix(&mut rng, Ok(WeightType::Q4_K), 256, 1024);
    let id = b.load_matrix(m).expect("loads");
    b.matmul(id, Buf::Norm, 1, Buf::FfnUp);
    b.matmul(id, Buf::Norm, 100, Buf::FfnUp);
    b.use_tiled_prefill(true);
    b.matmul(id, Buf::Norm, 100, Buf::FfnUp);
    let mut h = Harness::new(Box::new(b));
    let got = h.get(Buf::FfnUp, 1, 8);
    assert_eq!(got.len(), 8);
    let tables = vec![vec![0u32]];
    let seqs = [StepSeq {
        start: 0,
        tokens: 3,
        tables: &tables,
    }];
    let step = Step {
        seqs: &seqs,
        rows: 3,
    };
    let shape = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        key_dim: 64,
        value_dim: 64,
        window: None,
        scale: 0.125,
    };
    h.b.attention(0, &shape, &step, IO);
    h.b.kv_write(0, &step, Buf::K, Buf::V, &shape);
    let _ = h.get(Buf::AttnOut, 1, 64);
    let after = h.b.memory();
    println!(
        "  first kernel launches + SGEMM          {:>12} ({:.1} MiB)",
        before.saturating_sub(after.free),
        mib(before.saturating_sub(after.free))
    );
    println!("  device free {} of {} after all", after.free, after.total);
    let first_launches = before.saturating_sub(after.free);
    let planned = [
        ("context", s.context, CONTEXT_BYTES),
        ("stream", s.stream, 0),
        ("module", s.module, MODULE_BYTES),
        ("cuBLAS handle", s.blas_handle, BLAS_HANDLE_BYTES),
        (
            "allocation",
            s.allocation,
            s.allocation_requested.next_multiple_of(ALLOCATION_GRANULE),
        ),
        ("first launches", first_launches, 0),
    ];
    let over: Vec<String> = planned
        .iter()
        .filter(|(_, got, plan)| got > plan)
        .map(|(what, got, plan)| format!("{what}: {got} B measured, {plan} B planned"))
        .collect();
    assert!(
        over.is_empty(),
        "start-up memory past the plan's terms (fathom_plan::cuda):\n{}",
        over.join("\n")
    );
}

/// The cache's bytes after one step, against the layout the CPU engine
/// uses (block b, layer l, slot s: K at b·block + l·16·(k_row+v_row) +
/// s·k_row, V 16·k_row further), for every KV dtype. Diagnostic detail on
/// a mismatch: which row, which byte.
#[test]
fn cuda_kv_bytes() {
    let arena = arena();
    for dtype in KvDtype::ALL {
        let kv = KvLayout {
            groups: vec![group(dtype, 3, 64, 64, 2, None, 12)],
            dtype,
            layer_groups: vec![Some(0), Some(0)],
        };
        let Some(b) = cuda_backend(&arena, &kv) else {
            return;
        };
        let shape = AttentionShape {
            n_heads: 9,
            n_kv_heads: 3,
            key_dim: 64,
            value_dim: 64,
            window: None,
            scale: 0.125,
        };
        let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
        let mut rng = Rng::xorshift64_star(99);
        let tables = [vec![vec![5u32, 2, 9, 1]], vec![vec![7u32, 0, 3, 4]]];
        let seqs = [
            StepSeq {
                start: 0,
                tokens: 20,
                tables: &tables[0],
            },
            StepSeq {
                start: 0,
                tokens: 5,
                tables: &tables[1],
            },
        ];
        let step = Step {
            seqs: &seqs,
            rows: 25,
        };
        let (q, k, v) = (
            uniform(&mut rng, 25 * 576),
            uniform(&mut rng, 25 * 192),
            uniform(&mut rng, 25 * 192),
        );
        h.set(Buf::Q, &q, 576);
        h.set(Buf::K, &k, 192);
        h.set(Buf::V, &v, 192);
        h.b.attention(1, &shape, &step, IO);
        let kg = h.get(Buf::K, 25, 192);
        let kr = round_kv(dtype, &k, 64);
        let diff = kg.iter().zip(&kr).filter(|(a, b)| a != b).count();
        println!(
            "kv {}: in-place rounded K differs from the reference in {diff} of {}",
            dtype.name(),
            kr.len()
        );
        h.b.kv_write(1, &step, Buf::K, Buf::V, &shape);
        let _ = h.get(Buf::AttnOut, 1, 8);
        // Expected bytes of each written row.
        let row_bytes = dtype.row_bytes(192) as usize;
        let store = |x: &[f32]| -> Vec<u8> {
            match dtype {
                KvDtype::F32 => f32_bytes(x),
                KvDtype::F16 => x.iter().flat_map(|&v| f16_bytes(v)).collect(),
                KvDtype::Bf16 => x.iter().flat_map(|&v| bf16_of(v).to_le_bytes()).collect(),
                KvDtype::Q8_0 => {
                    let mut o = vec![0u8; row_bytes];
                    ops::quantize_q8_0_row(x, &mut o);
                    o
                }
            }
        };
        let g = &kv.groups[0];
        let block = g.block_bytes() as usize;
        let layer_off = 16 * 2 * row_bytes;
        let bytes = h.b.kv_bytes(0).expect("kv bytes");
        let mut bad = 0;
        let mut first = None;
        let mut row = 0;
        for (si, seq) in seqs.iter().enumerate() {
            for t in 0..seq.tokens {
                let p = seq.start + t;
                let blk = tables[si][0][p / 16] as usize;
                let base = blk * block + layer_off;
                let slot = p % 16;
                for (which, src, off) in [
                    ("K", &k, base + slot * row_bytes),
                    ("V", &v, base + 16 * row_bytes + slot * row_bytes),
                ] {
                    let want = store(&src[row * 192..(row + 1) * 192]);
                    let got = &bytes[off..off + row_bytes];
                    if got != &want[..] {
                        bad += 1;
                        if first.is_none() {
                            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                            first = Some(format!(
                                "{which} row {row} (seq {si} pos {p}) byte {i}: want {:?} got {:?}",
                                &want[i..(i + 8).min(row_bytes)],
                                &got[i..(i + 8).min(row_bytes)]
                            ));
                        }
                    }
                }
                row += 1;
            }
        }
        println!(
            "kv {}: {bad} of 50 cache rows differ; first: {:?}",
            dtype.name(),
            first
        );
    }
}

/// Rough speed of the matmul kernels on Llama-3.1-8B's ffn_gate shape
/// (14336×4096): decode (1 and 8 tokens, weight bytes / time against the
/// HBM bandwidth), decode batches of 16 and 64 (cuBLAS), and a 256-token
/// prefill chunk. Prints only; a first look,
/// not a benchmark (host-side timing around queued launches, then a sync).
#[test]
fn cuda_speed() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let mut rng = Rng::xorshift64_star(3);
    let (rows, cols) = (14336, 4096);
    let x = uniform(&mut rng, 256 * cols);
    h.set(Buf::Norm, &x, cols);
    for kind in [
        Ok(WeightType::Q4_K),
        Ok(WeightType::Q6_K),
        Ok(WeightType::Q8_0),
        Ok(WeightType::Q4_0),
        Ok(WeightType::Q4_1),
        Ok(WeightType::Q5_K),
        Ok(WeightType::F16),
        Ok(WeightType::F32),
        Err(4),
    ] {
        let (m, _) = random_matrix(&mut rng, kind, rows, cols);
        let bytes = m.data.len() as f64;
        let id = h.b.load_matrix(m).expect("loads");
        for (tokens, reps, tiled) in [
            (1usize, 200, false),
            (8, 100, false),
            (16, 100, false),
            (64, 50, false),
            (256, 10, true),
            (256, 10, false),
        ] {
            h.b.use_tiled_prefill(tiled);
            h.b.matmul(id, Buf::Norm, tokens, Buf::FfnUp);
            let _ = h.get(Buf::Logits, 1, 8);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                h.b.matmul(id, Buf::Norm, tokens, Buf::FfnUp);
            }
            let _ = h.get(Buf::Logits, 1, 8);
            let s = t.elapsed().as_secs_f64() / reps as f64;
            let path = if tokens <= 8 {
                "matvec"
            } else if tiled {
                "tiled"
            } else {
                "cuBLAS"
            };
            println!(
                "speed {:16} {path:6} {rows}x{cols} x{tokens:3}: {:8.1} us  {:7.0} GB/s weights  {:6.1} TFLOP/s",
                kind_name(kind),
                s * 1e6,
                bytes / s / 1e9,
                2.0 * (rows * cols * tokens) as f64 / s / 1e12
            );
        }
    }
}
