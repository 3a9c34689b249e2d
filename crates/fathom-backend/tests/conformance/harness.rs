//! The harness: a backend under test, its inputs and read-back, and which backends are present.

use super::*;

/// `n` values uniform in [-1, 1).
pub(crate) fn uniform(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(-1.0..1.0)).collect()
}

/// One buffer of every kind, all `ROWS × WIDTH` f32 (host-side ones too:
/// a backend ignores them).
pub(crate) fn arena() -> Vec<ArenaBuffer> {
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

pub(crate) fn group(
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

pub(crate) fn small_kv() -> KvLayout {
    KvLayout {
        groups: vec![group(KvDtype::F16, 1, 64, 64, 1, None, 2)],
        dtype: KvDtype::F16,
        layer_groups: vec![Some(0)],
        recurrent: None,
    }
}

pub(crate) fn gpu_required() -> bool {
    std::env::var("FATHOM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

pub(crate) fn skip(why: String) {
    if gpu_required() {
        panic!("FATHOM_REQUIRE_GPU=1 but the CUDA backend is unavailable: {why}");
    }
    eprintln!("conformance: skipping the CUDA backend: {why}");
}

pub(crate) fn cuda_backend(arena: &[ArenaBuffer], kv: &KvLayout) -> Option<CudaBackend> {
    let Some(info) = cuda::probe() else {
        skip("no CUDA driver or device (cuda::probe found none)".into());
        return None;
    };
    let states = kv.recurrent.as_ref().map_or(0, |r| r.bytes);
    // The grouped expert products of every step the MoE tests run: all
    // rows, up to 16 routes, 256 experts, rows and FFNs of 2,048 values.
    let moe = MoeGrouping::new(ROWS, 16, 256, 2048, 2048);
    let layout = DeviceLayout::new(WEIGHTS, arena, &kv.groups, states, moe, 0);
    match CudaBackend::new(0, arena, kv.clone(), &layout) {
        Ok(b) => Some(b),
        Err(e) => {
            skip(format!("{} found, but: {e}", info.name));
            None
        }
    }
}

/// Every backend present, for one KV layout.
pub(crate) fn backends(kv: &KvLayout) -> Vec<Box<dyn Backend>> {
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

pub(crate) fn host(bytes: Vec<u8>) -> HostBytes {
    let len = bytes.len();
    HostBytes::new(Arc::new(bytes), 0, len).expect("in range")
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A backend under test with its read-back identity.
pub(crate) struct Harness<B: Backend + ?Sized = dyn Backend> {
    pub(crate) b: Box<B>,
    pub(crate) eye: MatrixId,
    pub(crate) failures: Vec<String>,
}

impl<B: Backend + ?Sized> Harness<B> {
    pub(crate) fn new(mut b: Box<B>) -> Harness<B> {
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
    pub(crate) fn set(&mut self, buf: Buf, data: &[f32], width: usize) {
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
    pub(crate) fn get(&mut self, buf: Buf, rows: usize, width: usize) -> Vec<f32> {
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

    pub(crate) fn check(&mut self, op: &str, case: &str, got: &[f32], want: &[f64], tol: f64) {
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

    pub(crate) fn finish(self) -> Vec<String> {
        self.failures
    }
}
