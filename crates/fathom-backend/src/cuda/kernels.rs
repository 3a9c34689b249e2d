//! The kernel image build.rs embeds and the table of its entry points,
//! looked up by name once at start-up.

use std::ffi::CString;

use cudarc::driver::{result, sys};

use super::abi::{
    att_split_compiled, ATT_DTYPES, ATT_HEADS, ATT_VPL, GLU_GELU_TANH, GLU_SILU, GLU_SWIGLU_OAI,
    LIN_HEAD_DIMS,
};
use super::device_err;
use crate::{BackendError, Glu, WeightType};

/// The kernels, compiled by build.rs, 8-byte aligned as the driver wants
/// a fatbin (so it is read in place, not copied first).
pub(super) static FATBIN: &[u8] =
    &Aligned8(*include_bytes!(concat!(env!("OUT_DIR"), "/fathom.fatbin"))).0;

#[repr(C, align(8))]
pub(super) struct Aligned8<T: ?Sized>(T);

/// Kernel name suffixes by weight kind: the 13 ggml types in
/// `WeightType::ALL` order, MLX affine 2, 4 and 8 bits (these 16 have
/// every per-kind kernel: `FATHOM_WEIGHT_TYPES` in common.cuh), then MXFP4
/// (only the kernels its own lines in the .cu files stamp).
pub(super) const KINDS: [&str; N_KINDS] = [
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k",
    "q6_k", "a2", "a4", "a8", "mxfp4",
];

/// Weight kinds (`KINDS`); the per-kind tables below have one entry each.
pub(super) const N_KINDS: usize = 17;

/// MXFP4's kind: after the 16 of `FATHOM_WEIGHT_TYPES`.
pub(super) const MXFP4_KIND: usize = 16;

/// A gated activation as the kernels number it (`glu_act` in common.cuh).
pub(super) fn act_id(act: Glu) -> i32 {
    match act {
        Glu::Silu => GLU_SILU,
        Glu::GeluTanh => GLU_GELU_TANH,
        Glu::SwigluOai => GLU_SWIGLU_OAI,
    }
}

/// The ggml types whose kind is their place in `WeightType::ALL`: the
/// first 13 (MXFP4, the 14th, is `MXFP4_KIND`).
pub(super) const GGML_KINDS: usize = 13;

pub(super) fn kind_of_type(ty: WeightType) -> usize {
    if ty == WeightType::MXFP4 {
        return MXFP4_KIND;
    }
    let kind = WeightType::ALL
        .iter()
        .position(|t| *t == ty)
        .expect("every weight type is in ALL");
    assert!(kind < GGML_KINDS, "no CUDA kernels for {}", ty.name());
    kind
}

/// The ggml type of a kind, `None` for the MLX affine kinds.
pub(super) fn type_of_kind(kind: usize) -> Option<WeightType> {
    if kind == MXFP4_KIND {
        return Some(WeightType::MXFP4);
    }
    WeightType::ALL[..GGML_KINDS].get(kind).copied()
}

pub(super) struct Kernels {
    /// Matrix-vector products of one token (deeper unrolled) and of up to
    /// MV_MAX_TOKENS (f32, f16 and bf16 only; null for the other kinds).
    pub(super) mv1: [sys::CUfunction; N_KINDS],
    pub(super) mv: [sys::CUfunction; N_KINDS],
    /// The same over a gate and an up matrix, writing act(gate) × up.
    pub(super) mvglu1: [sys::CUfunction; N_KINDS],
    pub(super) mvglu: [sys::CUfunction; N_KINDS],
    /// One token on int8 activations (`quantize_x8`): Q8_0, Q4_0, Q4_K, Q6_K
    /// and MXFP4 only (null for the other kinds; MXFP4 has no f32 `mv1` or
    /// `mvglu1`, and no `mvglu1x8`: its one-token products always take
    /// `mv1x8`, a gate and up pair unfused).
    pub(super) mv1x8: [sys::CUfunction; N_KINDS],
    pub(super) mvglu1x8: [sys::CUfunction; N_KINDS],
    pub(super) quantize_x8: sys::CUfunction,
    /// MoE, one token, routes read on the device: `moe_gate_up`,
    /// `moe_down` (on int8 activations where the kind has them), null
    /// for kinds without (`FATHOM_ROUTED_KERNELS` in moe.cu).
    pub(super) moe_gate_up: [sys::CUfunction; N_KINDS],
    pub(super) moe_down: [sys::CUfunction; N_KINDS],
    pub(super) moe_combine: sys::CUfunction,
    /// MoE, many rows, routes read on the device (moe.cu): the rows
    /// grouped by expert, gathered as f16, act(gate) x up as f16, and the
    /// routes' outputs summed; the products `mqg` (matmul_mma.cu), tiles
    /// of up to 64 routed rows for the K-quants, 16 for the others (null
    /// for kinds without).
    pub(super) moe_group: sys::CUfunction,
    pub(super) mqg: [sys::CUfunction; N_KINDS],
    pub(super) moe_rows_to_half: sys::CUfunction,
    pub(super) moe_glu_half: sys::CUfunction,
    pub(super) moe_combine_rows: sys::CUfunction,
    pub(super) mm: [sys::CUfunction; N_KINDS],
    /// Tensor-core products of 2 to `MQ_MAX_TOKENS` tokens straight from
    /// the stored blocks, by (tokens at most: 16, 64; kind): up to 16 for
    /// every kind but f32, up to 64 for Q4_K, Q5_K and Q6_K; null
    /// elsewhere (matmul_mma.cu).
    pub(super) mq: [[sys::CUfunction; N_KINDS]; 2],
    /// Their activations: rows to f16, each scaled by a power of two into
    /// f16's range.
    pub(super) to_half_rows: sys::CUfunction,
    pub(super) embed: [sys::CUfunction; N_KINDS],
    pub(super) dequant: [sys::CUfunction; N_KINDS],
    pub(super) to_half: sys::CUfunction,
    pub(super) rms_norm: sys::CUfunction,
    pub(super) add_bias: sys::CUfunction,
    pub(super) add: sys::CUfunction,
    pub(super) fill_zero: sys::CUfunction,
    /// In place over n values: `x *= a` and `x = a × tanh(x / a)`.
    pub(super) scale: sys::CUfunction,
    pub(super) softcap: sys::CUfunction,
    pub(super) glu: sys::CUfunction,
    pub(super) gather_rows: sys::CUfunction,
    pub(super) scatter_rows: sys::CUfunction,
    pub(super) rope: sys::CUfunction,
    pub(super) rope_kv: sys::CUfunction,
    pub(super) round_to_kv: sys::CUfunction,
    pub(super) attention: sys::CUfunction,
    /// `attention_split_<dtype>_<vpl>_<heads>`, indexed by
    /// (dtype, ATT_VPL index, ATT_HEADS index); null where not compiled.
    pub(super) attention_split: [[[sys::CUfunction; 4]; 4]; 4],
    pub(super) attention_merge: sys::CUfunction,
    /// `attention_mma_<D>` for head dims 64 and 128 (f16 cache, prefill).
    pub(super) attention_mma: [sys::CUfunction; 2],
    /// `attention_decode_mma_<D>` for head dims 64 and 128 (f16 cache,
    /// decode rows at long contexts).
    pub(super) attention_decode_mma: [sys::CUfunction; 2],
    pub(super) kv_write: sys::CUfunction,
    pub(super) route_experts: sys::CUfunction,
    pub(super) greedy_scan: sys::CUfunction,
    pub(super) greedy_merge: sys::CUfunction,
    /// Hybrid models: `split_heads`, `add_gated_rows`, `sigmoid_gate`,
    /// the convolution and `gated_delta_<D>` by `LIN_HEAD_DIMS` index.
    pub(super) split_heads: sys::CUfunction,
    pub(super) add_gated_rows: sys::CUfunction,
    pub(super) sigmoid_gate: sys::CUfunction,
    pub(super) linear_conv: sys::CUfunction,
    pub(super) gated_delta: [sys::CUfunction; LIN_HEAD_DIMS.len()],
}

impl Kernels {
    pub(super) fn load(module: sys::CUmodule) -> Result<Kernels, BackendError> {
        let get = |name: &str| -> Result<sys::CUfunction, BackendError> {
            let c = CString::new(name).expect("kernel names have no NUL");
            // SAFETY: `module` is loaded and outlives the functions (both
            // are released together on drop).
            unsafe { result::module::get_function(module, c) }
                .map_err(|e| device_err(&format!("kernel {name} missing from the fatbin"), e))
        };
        // The kernels of the 16 kinds of `FATHOM_WEIGHT_TYPES`, and of
        // MXFP4 where `mxfp4` (null there otherwise).
        let table =
            |prefix: &str, mxfp4: bool| -> Result<[sys::CUfunction; N_KINDS], BackendError> {
                let mut out = [std::ptr::null_mut(); N_KINDS];
                for (o, k) in out.iter_mut().zip(&KINDS[..MXFP4_KIND]) {
                    *o = get(&format!("{prefix}_{k}"))?;
                }
                if mxfp4 {
                    out[MXFP4_KIND] = get(&format!("{prefix}_{}", KINDS[MXFP4_KIND]))?;
                }
                Ok(out)
            };
        // The kernels of `types` only.
        let some = |prefix: &str, types: &[WeightType]| -> Result<_, BackendError> {
            let mut out = [std::ptr::null_mut(); N_KINDS];
            for &ty in types {
                let kind = kind_of_type(ty);
                out[kind] = get(&format!("{prefix}_{}", KINDS[kind]))?;
            }
            Ok(out)
        };
        use WeightType::{BF16, F16, F32, MXFP4, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0};
        // Kinds with int8-activation kernels (`HasX8` in quant.cuh).
        let x8_table = |prefix: &str| some(prefix, &[Q8_0, Q4_0, Q4_K, Q6_K, MXFP4]);
        // Kinds with routed-expert kernels: the int8-activation ones, and
        // these on f32 activations.
        let routed_table = |prefix: &str| -> Result<[sys::CUfunction; N_KINDS], BackendError> {
            let mut out = x8_table(&format!("{prefix}x8"))?;
            for ty in [F16, BF16, Q5_K] {
                let kind = kind_of_type(ty);
                out[kind] = get(&format!("{prefix}_{}", KINDS[kind]))?;
            }
            Ok(out)
        };
        Ok(Kernels {
            mv1: table("mv1", false)?,
            mv: some("mv", &[F32, F16, BF16])?,
            mvglu1: table("mvglu1", false)?,
            mvglu: some("mvglu", &[F32, F16, BF16])?,
            mv1x8: x8_table("mv1x8")?,
            mvglu1x8: some("mvglu1x8", &[Q8_0, Q4_0, Q4_K, Q6_K])?,
            quantize_x8: get("quantize_x8")?,
            moe_gate_up: routed_table("moe_gate_up")?,
            moe_down: routed_table("moe_down")?,
            moe_combine: get("moe_combine")?,
            moe_group: get("moe_group")?,
            mqg: some(
                "mqg",
                &[
                    Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, F16, BF16,
                ],
            )?,
            moe_rows_to_half: get("moe_rows_to_half")?,
            moe_glu_half: get("moe_glu_half")?,
            moe_combine_rows: get("moe_combine_rows")?,
            mm: table("mm", true)?,
            to_half_rows: get("to_half_rows")?,
            mq: {
                let mut upto16 = [std::ptr::null_mut(); N_KINDS];
                for (k, name) in KINDS.iter().enumerate() {
                    if k != kind_of_type(F32) {
                        upto16[k] = get(&format!("mq16_{name}"))?;
                    }
                }
                [upto16, some("mq64", &[Q4_K, Q5_K, Q6_K])?]
            },
            embed: table("embed", true)?,
            dequant: table("dequant", true)?,
            to_half: get("to_half")?,
            rms_norm: get("rms_norm")?,
            add_bias: get("add_bias")?,
            add: get("add")?,
            fill_zero: get("fill_zero")?,
            scale: get("scale_values")?,
            softcap: get("softcap_values")?,
            glu: get("glu")?,
            gather_rows: get("gather_rows")?,
            scatter_rows: get("scatter_rows")?,
            rope: get("rope")?,
            rope_kv: get("rope_kv")?,
            round_to_kv: get("round_to_kv")?,
            attention: get("attention")?,
            attention_split: {
                let mut t = [[[std::ptr::null_mut(); 4]; 4]; 4];
                for (d, dt) in ATT_DTYPES.iter().enumerate() {
                    for (v, vpl) in ATT_VPL.iter().enumerate() {
                        for (h, heads) in ATT_HEADS.iter().enumerate() {
                            if att_split_compiled(*vpl, *heads) {
                                t[d][v][h] = get(&format!("attention_split_{dt}_{vpl}_{heads}"))?;
                            }
                        }
                    }
                }
                t
            },
            attention_merge: get("attention_merge")?,
            attention_mma: [get("attention_mma_64")?, get("attention_mma_128")?],
            attention_decode_mma: [
                get("attention_decode_mma_64")?,
                get("attention_decode_mma_128")?,
            ],
            kv_write: get("kv_write")?,
            route_experts: get("route_experts")?,
            greedy_scan: get("greedy_scan")?,
            greedy_merge: get("greedy_merge")?,
            split_heads: get("split_heads")?,
            add_gated_rows: get("add_gated_rows")?,
            sigmoid_gate: get("sigmoid_gate")?,
            linear_conv: get("linear_conv")?,
            gated_delta: {
                let mut t = [std::ptr::null_mut(); LIN_HEAD_DIMS.len()];
                for (f, d) in t.iter_mut().zip(LIN_HEAD_DIMS) {
                    *f = get(&format!("gated_delta_{d}"))?;
                }
                t
            },
        })
    }
}

/// Weight bytes a matrix-vector kernel asks L2 for before it waits for the
/// kernel ahead of it (`fathom_prefetch_bytes` in common.cuh): the first 4 KiB
/// of the rows of its first blocks. The weight stream then starts while a
/// norm or attention still runs. On the H200, 2 to 6 MiB measured alike and
/// best (8B F16 decode 2% faster than with 16 MiB, from empty and at depth
/// 4,096; 8B Q4_0 2.3%): a larger budget asks for more than a kernel's
/// start needs while the kernel ahead of it still loads its own bytes.
pub(super) const PREFETCH_BYTES: u64 = 4 << 20;

/// `FATHOM_CUDA_PREFETCH` (bytes; 0 turns the weight and KV prefetch off),
/// else [`PREFETCH_BYTES`].
pub(super) fn prefetch_bytes() -> Result<u64, BackendError> {
    match std::env::var("FATHOM_CUDA_PREFETCH") {
        Err(_) => Ok(PREFETCH_BYTES),
        Ok(v) => v.trim().parse().map_err(|_| BackendError::Device {
            backend: "cuda",
            message: format!(
                "FATHOM_CUDA_PREFETCH={v:?} is not a byte count (weight bytes a kernel \
                 prefetches, e.g. {PREFETCH_BYTES}; 0 turns the prefetch off)"
            ),
        }),
    }
}

/// Writes the prefetch budget into the loaded module's global.
pub(super) fn set_prefetch(module: sys::CUmodule, bytes: u64) -> Result<(), BackendError> {
    let name = CString::new("fathom_prefetch_bytes").expect("no NUL");
    // SAFETY: the module is loaded; the global is an 8-byte unsigned long
    // long (checked by size below) that no kernel runs against yet.
    unsafe {
        let (ptr, size) = result::module::get_global(module, name)
            .map_err(|e| device_err("finding fathom_prefetch_bytes in the kernels", e))?;
        assert_eq!(size, 8, "fathom_prefetch_bytes is an unsigned long long");
        result::memcpy_htod_sync(ptr, &[bytes])
            .map_err(|e| device_err("setting fathom_prefetch_bytes", e))
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::FATBIN;
    use fathom_plan::cuda::{KERNELS_HOST_BYTES, MODULE_BYTES};

    /// The machine-code (ELF) images in a fatbin, as byte slices: a fatbin
    /// is a 16-byte header (magic 0xBA55ED50, version, header size, size of
    /// the entries) and entries of a header (kind u16: 1 PTX, 2 ELF; its
    /// header size u32 at 4; payload size u64 at 8) and a payload.
    fn elf_images(fatbin: &[u8]) -> Vec<&[u8]> {
        let u16_at = |o: usize| u16::from_le_bytes([fatbin[o], fatbin[o + 1]]) as usize;
        let u32_at = |o: usize| u32::from_le_bytes(fatbin[o..o + 4].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(fatbin[o..o + 8].try_into().unwrap()) as usize;
        assert_eq!(u32_at(0), 0xBA55_ED50, "not a fatbin");
        let end = u16_at(6) + u64_at(8);
        let mut at = u16_at(6);
        let mut out = Vec::new();
        while at < end {
            let (kind, header, size) = (u16_at(at), u32_at(at + 4), u64_at(at + 8));
            if kind == 2 {
                out.push(&fatbin[at + header..at + header + size]);
            }
            at += header + size;
        }
        out
    }

    /// The fatbin stays resident in the process once the driver has read
    /// it: the plan's host term for it must hold it.
    #[test]
    fn fatbin_fits_the_planned_host_term() {
        assert_eq!(
            FATBIN.as_ptr() as usize % 8,
            0,
            "the driver wants 8-byte alignment"
        );
        assert!(
            FATBIN.len() as u64 <= KERNELS_HOST_BYTES,
            "the fatbin is {} bytes, past the plan's KERNELS_HOST_BYTES ({KERNELS_HOST_BYTES})",
            FATBIN.len()
        );
    }

    /// The driver keeps more than a loaded module's machine code, in 2 MiB
    /// steps (measured: a 0.7 MB fatbin took 2 MiB, a 6.7 MB sm_90 image 8
    /// MiB, an 8.1 MB one 10 MiB — 0.25 MB short of 8 MiB; docs/cuda.md),
    /// so the embedded image plus `MODULE_SLACK` bounds the plan's module
    /// term: a kernel change that outgrows `MODULE_BYTES` fails here, not
    /// on a user's GPU.
    #[test]
    fn kernel_image_fits_the_planned_module_term() {
        let images = elf_images(FATBIN);
        assert_eq!(images.len(), 1, "one sm_90 image in the fatbin");
        let image = images[0];
        // Stored whole (nvcc compresses only the PTX here): a compressed
        // image's stored size would understate what the driver keeps.
        assert_eq!(
            &image[..4],
            b"\x7fELF",
            "the sm_90 image is stored uncompressed"
        );
        /// What the driver keeps beyond the image, at most (seen: more
        /// than 0.24 MB).
        const MODULE_SLACK: u64 = 1 << 20;
        let loaded = (image.len() as u64 + MODULE_SLACK).next_multiple_of(2 << 20);
        assert!(
            loaded <= MODULE_BYTES,
            "the kernels' sm_90 image is {} bytes, {loaded} once loaded, past the plan's \
             MODULE_BYTES ({MODULE_BYTES}): raise fathom_plan::cuda::MODULE_BYTES and \
             re-record the CUDA memory grid",
            image.len()
        );
    }
}
