//! aarch64 NEON kernels: tiles for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0
//! weights against `Q8S` activations and for Q4_K, Q5_K and Q6_K against
//! `Q8K`, and the two activation quantizers; every other type runs the
//! portable kernel.
//!
//! NEON is part of the aarch64 baseline, so nothing here needs run-time
//! detection; functions are `unsafe` because raw pointers must cover the
//! blocks they read, as [`Tile::tile`] documents.
//!
//! As on x86 (`x86::q32`), a block's contribution is
//! `d_w d_x I + c_w d_x S`: `I` the integer dot of the weight quants
//! (Q4's unsigned nibbles; Q5's, plus 16 where the block's `qh` bit is
//! set; Q8_0's signed bytes) with the activation quants, `S` the
//! activations' quant sum, `c_w` the weight offset (-8 d for Q4_0, -16 d
//! for Q5_0, the min for Q4_1 and Q5_1, none for Q8_0). `I` comes from
//! `smull` (i8 x i8 -> i16, exact: |w x| <= 128 * 127) and `sadalp`
//! (pairwise into i32); `sdot` would need the unstable `dotprod`
//! intrinsics. One vector lane per weight row carries the float
//! arithmetic, so a row's output is the same whatever tile it is in and
//! however many tokens share the matmul.
//!
//! The k-quant tiles take one row at a time: a block's 256 quants are
//! unpacked a 64- or 128-value run at a time and dotted with every token
//! of the tile, scaled per sub-block in i32; the block's float term is
//! the portable kernel's expression, summed in the same order, so those
//! outputs equal the portable ones bit for bit.

// Tiles index several arrays by the same row or token index; iterator
// chains would hide that the indices line up.
#![allow(clippy::needless_range_loop)]

use crate::isa::Isa;
use crate::matmul::{drive, Job, KernelFn, Tile};
use crate::quant::{k4_scales, q8_scale, Q8K_BYTES, Q8S_BYTES};
use crate::WeightType;
use std::arch::aarch64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// A 32-value weight block layout.
trait Block32 {
    const BYTES: usize;
    /// Whether blocks carry an offset `c` (see [`Block32::scales`]).
    const OFFSET: bool;
    /// Quants 0..16 and 16..32 of the block at `p`.
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t);
    /// The f16 scale `d` and offset `c` of the block at `p` (0 where
    /// there is none): the block's first four bytes, as Q4_1 stores
    /// them; `scales` turns the others' into the same form.
    unsafe fn halves(p: *const u8) -> [u16; 2];
    /// `d` and `c` of four rows' blocks, lane per row, from their
    /// [`Block32::halves`].
    unsafe fn scales(h: [[u16; 2]; 4]) -> (float32x4_t, float32x4_t) {
        (f16x4(h.map(|v| v[0])), f16x4(h.map(|v| v[1])))
    }
}

/// Four f16 values as f32, exact, in one `fcvtl` (the intrinsic,
/// `vcvt_f32_f16`, is stable only from Rust 1.94, past the MSRV).
#[inline(always)]
unsafe fn f16x4(h: [u16; 4]) -> float32x4_t {
    let f: float32x4_t;
    std::arch::asm!(
        "fcvtl {f:v}.4s, {h:v}.4h",
        f = lateout(vreg) f,
        h = in(vreg) vld1_u16(h.as_ptr()),
        options(pure, nomem, nostack, preserves_flags),
    );
    f
}

/// The 16 nibble bytes at `p` as quants 0..16 (low nibbles) and 16..32
/// (high nibbles).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (int8x16_t, int8x16_t) {
    let v = vld1q_u8(p);
    (
        vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))),
        vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)),
    )
}

/// Adds the fifth bits of a Q5 block, bit j of the little-endian u32 at
/// `qh` going to quant j as 16, to its [`nibbles`].
#[inline(always)]
unsafe fn fifth_bits(q: (int8x16_t, int8x16_t), qh: *const u8) -> (int8x16_t, int8x16_t) {
    // Each of the four bytes spread over eight lanes, lane k of a byte
    // testing its bit k.
    let h = vreinterpretq_u8_u32(vdupq_n_u32((qh as *const u32).read_unaligned()));
    let byte = |i: u8| vcombine_u8(vdup_n_u8(i), vdup_n_u8(i + 1));
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let add = |q: int8x16_t, first: u8| {
        let set = vtstq_u8(vqtbl1q_u8(h, byte(first)), bit);
        vorrq_s8(q, vreinterpretq_s8_u8(vandq_u8(set, vdupq_n_u8(0x10))))
    };
    (add(q.0, 0), add(q.1, 2))
}

/// `d` of four rows' blocks and the offset `c = k d` of the types whose
/// offset is a fixed multiple of the scale (Q4_0: -8, Q5_0: -16).
#[inline(always)]
unsafe fn scaled_offset(h: [[u16; 2]; 4], k: f32) -> (float32x4_t, float32x4_t) {
    let d = f16x4(h.map(|v| v[0]));
    (d, vmulq_n_f32(d, k))
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        nibbles(p.add(2))
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> [u16; 2] {
        [(p as *const u16).read_unaligned(), 0]
    }
    #[inline(always)]
    unsafe fn scales(h: [[u16; 2]; 4]) -> (float32x4_t, float32x4_t) {
        scaled_offset(h, -8.0)
    }
}

impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        nibbles(p.add(4))
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> [u16; 2] {
        (p as *const [u16; 2]).read_unaligned()
    }
}

impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        fifth_bits(nibbles(p.add(6)), p.add(2))
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> [u16; 2] {
        [(p as *const u16).read_unaligned(), 0]
    }
    #[inline(always)]
    unsafe fn scales(h: [[u16; 2]; 4]) -> (float32x4_t, float32x4_t) {
        scaled_offset(h, -16.0)
    }
}

impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        fifth_bits(nibbles(p.add(8)), p.add(4))
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> [u16; 2] {
        (p as *const [u16; 2]).read_unaligned()
    }
}

impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn quants(p: *const u8) -> (int8x16_t, int8x16_t) {
        (
            vld1q_s8(p.add(2) as *const i8),
            vld1q_s8(p.add(18) as *const i8),
        )
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> [u16; 2] {
        [(p as *const u16).read_unaligned(), 0]
    }
}

/// Four i32 partial sums of the dot of quants `w` with activation quants
/// `x`, 32 values each.
#[inline(always)]
unsafe fn dot32(w: (int8x16_t, int8x16_t), x: (int8x16_t, int8x16_t)) -> int32x4_t {
    let mut s = vpaddlq_s16(vmull_s8(vget_low_s8(w.0), vget_low_s8(x.0)));
    s = vpadalq_s16(s, vmull_high_s8(w.0, x.0));
    s = vpadalq_s16(s, vmull_s8(vget_low_s8(w.1), vget_low_s8(x.1)));
    vpadalq_s16(s, vmull_high_s8(w.1, x.1))
}

/// The activation scale d_x of the `Q8S` block at `p` and d_x times its
/// quant sum, as the portable kernel computes them.
#[inline(always)]
unsafe fn act_scales(p: *const u8) -> (f32, f32) {
    let [d, s] = (p as *const [u16; 2]).read_unaligned();
    let dx = crate::ops::f16_to_f32(d);
    (dx, dx * s as i16 as f32)
}

/// The tile for block layout `B`.
struct Q32<B>(PhantomData<B>);

impl<B: Block32> Tile for Q32<B> {
    /// Row r in lane r (`R <= 4`; lanes past `R` stay zero).
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        debug_assert!(R <= 4);
        let mut acc = [vdupq_n_f32(0.0); T];
        for b in 0..cols / 32 {
            let mut q = [(vdupq_n_s8(0), vdupq_n_s8(0)); 4];
            let mut h = [[0u16; 2]; 4];
            for r in 0..R {
                let p = w.add(r * w_stride + b * B::BYTES);
                q[r] = B::quants(p);
                h[r] = B::halves(p);
            }
            let (d, c) = B::scales(h);
            for t in 0..T {
                let p = a.add(t * a_stride + b * Q8S_BYTES);
                let x = (
                    vld1q_s8(p.add(4) as *const i8),
                    vld1q_s8(p.add(20) as *const i8),
                );
                let mut s = [vdupq_n_s32(0); 4];
                for r in 0..R {
                    s[r] = dot32(q[r], x);
                }
                // Lane r: row r's integer dot.
                let i = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
                let (dx, sx) = act_scales(p);
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(i), vmulq_n_f32(d, dx));
                if B::OFFSET {
                    acc[t] = vfmaq_n_f32(acc[t], c, sx);
                }
            }
        }
        let mut out = [[0.0f32; R]; T];
        for t in 0..T {
            let mut lanes = [0.0f32; 4];
            vst1q_f32(lanes.as_mut_ptr(), acc[t]);
            out[t].copy_from_slice(&lanes[..R]);
        }
        out
    }
}

/// A 256-value k-quant block layout.
trait Block256 {
    const BYTES: usize;
    /// The f16 scale `d` and min scale `dmin` (0 where there is none) of
    /// the block at `w`.
    unsafe fn scales(w: *const u8) -> (f32, f32);
    /// Per `Q8K` activation block `a[t]`, the dot of the block at `w`
    /// with its quants, each sub-block's weighted by its scale, and the
    /// sum of the sub-blocks' mins times their activation sums.
    unsafe fn dots<const T: usize>(w: *const u8, a: [*const u8; T]) -> [(i32, i32); T];
}

/// Four i32 partial sums of the dot of 16 quants `w` with the 16
/// activation quants at `x`.
#[inline(always)]
unsafe fn dot16(w: int8x16_t, x: *const u8) -> int32x4_t {
    let x = vld1q_s8(x as *const i8);
    let s = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    vpadalq_s16(s, vmull_high_s8(w, x))
}

/// Q4_K and Q5_K (`FIVE`): the same scales, mins and nibble order, Q5_K
/// adding a fifth bit per value from its 32 `qh` bytes.
struct K45<const FIVE: bool>;
type Q4K = K45<false>;
type Q5K = K45<true>;
struct Q6K;

impl<const FIVE: bool> Block256 for K45<FIVE> {
    const BYTES: usize = if FIVE { 176 } else { 144 };
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        let [d, dmin] = (w as *const [u16; 2]).read_unaligned();
        (crate::ops::f16_to_f32(d), crate::ops::f16_to_f32(dmin))
    }

    /// 64 values per run of 32 bytes: low nibbles are sub-block 2c, high
    /// nibbles 2c + 1; for Q5_K, bit s of `qh[l]` is the fifth bit of
    /// value l of sub-block s.
    #[inline(always)]
    unsafe fn dots<const T: usize>(w: *const u8, a: [*const u8; T]) -> [(i32, i32); T] {
        let (sc, m) = k4_scales(&*(w.add(4) as *const [u8; 12]));
        let qs = w.add(if FIVE { 48 } else { 16 });
        let qh = if FIVE {
            [vld1q_u8(w.add(16)), vld1q_u8(w.add(32))]
        } else {
            [vdupq_n_u8(0); 2]
        };
        // Nibbles `v` with sub-block s's fifth bits from `qh[k]` as 16.
        let five = |v: uint8x16_t, k: usize, s: usize| {
            if FIVE {
                let high = vshlq_u8(qh[k], vdupq_n_s8(4 - s as i8));
                vorrq_u8(v, vandq_u8(high, vdupq_n_u8(0x10)))
            } else {
                v
            }
        };
        let mut acc = [vdupq_n_s32(0); T];
        for c in 0..4 {
            let q = [vld1q_u8(qs.add(32 * c)), vld1q_u8(qs.add(16 + 32 * c))];
            let lo: [int8x16_t; 2] = std::array::from_fn(|k| {
                let v = vandq_u8(q[k], vdupq_n_u8(0x0f));
                vreinterpretq_s8_u8(five(v, k, 2 * c))
            });
            let hi: [int8x16_t; 2] = std::array::from_fn(|k| {
                vreinterpretq_s8_u8(five(vshrq_n_u8::<4>(q[k]), k, 2 * c + 1))
            });
            for t in 0..T {
                let x = a[t].add(4 + 64 * c);
                let l = vaddq_s32(dot16(lo[0], x), dot16(lo[1], x.add(16)));
                let h = vaddq_s32(dot16(hi[0], x.add(32)), dot16(hi[1], x.add(48)));
                acc[t] = vmlaq_n_s32(acc[t], l, sc[2 * c] as i32);
                acc[t] = vmlaq_n_s32(acc[t], h, sc[2 * c + 1] as i32);
            }
        }
        let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(m.as_ptr())));
        let mut out = [(0, 0); T];
        for t in 0..T {
            let b = a[t].add(260) as *const i16;
            // Sub-block j's activation sum: its two 16-value groups'.
            let sums = vpaddq_s16(vld1q_s16(b), vld1q_s16(b.add(8)));
            let mins = vmlal_high_s16(vmull_s16(vget_low_s16(sums), vget_low_s16(m)), sums, m);
            out[t] = (vaddvq_s32(acc[t]), vaddvq_s32(mins));
        }
        out
    }
}

impl Block256 for Q6K {
    const BYTES: usize = 210;
    #[inline(always)]
    unsafe fn scales(w: *const u8) -> (f32, f32) {
        let d = (w.add(208) as *const u16).read_unaligned();
        (crate::ops::f16_to_f32(d), 0.0)
    }

    /// 128 values per half block: 64 bytes of low nibbles and 32 of
    /// high bit pairs; the 32-value run j takes nibbles from bytes
    /// 32 (j % 2) on (low for j < 2, high after) and bits 2j..2j+2 of the
    /// high bytes. Each 16 values have their own signed scale.
    #[inline(always)]
    unsafe fn dots<const T: usize>(w: *const u8, a: [*const u8; T]) -> [(i32, i32); T] {
        let sc = w.add(192) as *const i8;
        let mut acc = [vdupq_n_s32(0); T];
        for n in 0..2 {
            let ql = w.add(64 * n);
            let qh = [vld1q_u8(w.add(128 + 32 * n)), vld1q_u8(w.add(144 + 32 * n))];
            for j in 0..4 {
                let q: [int8x16_t; 2] = std::array::from_fn(|k| {
                    let l = vld1q_u8(ql.add(32 * (j % 2) + 16 * k));
                    let low = if j < 2 {
                        vandq_u8(l, vdupq_n_u8(0x0f))
                    } else {
                        vshrq_n_u8::<4>(l)
                    };
                    let high = vshlq_u8(qh[k], vdupq_n_s8(4 - 2 * j as i8));
                    let v = vorrq_u8(low, vandq_u8(high, vdupq_n_u8(0x30)));
                    vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(32))
                });
                let g = 8 * n + 2 * j;
                for t in 0..T {
                    let x = a[t].add(4 + 128 * n + 32 * j);
                    acc[t] = vmlaq_n_s32(acc[t], dot16(q[0], x), *sc.add(g) as i32);
                    acc[t] = vmlaq_n_s32(acc[t], dot16(q[1], x.add(16)), *sc.add(g + 1) as i32);
                }
            }
        }
        acc.map(|v| (vaddvq_s32(v), 0))
    }
}

/// The k-quant tile for block layout `B`.
struct K256<B>(PhantomData<B>);

impl<B: Block256> Tile for K256<B> {
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        let mut out = [[0.0f32; R]; T];
        for r in 0..R {
            for b in 0..cols / 256 {
                let p = w.add(r * w_stride + b * B::BYTES);
                let x: [*const u8; T] =
                    std::array::from_fn(|t| a.add(t * a_stride + b * Q8K_BYTES));
                let (d, dmin) = B::scales(p);
                for (t, (isum, imin)) in B::dots::<T>(p, x).into_iter().enumerate() {
                    let dx = (x[t] as *const f32).read_unaligned();
                    out[t][r] += isum as f32 * (d * dx) - imin as f32 * (dmin * dx);
                }
            }
        }
        out
    }
}

// Tiles of 4 rows x 4 tokens: a block's quants of four rows (8
// registers), four accumulators and the integer sums fit NEON's 32
// registers. One token (decode) takes `drive`'s 4 x 1 remainder tiles.
unsafe fn q4_0(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q4_0>, 4, 4>(job, rows)
}

unsafe fn q4_1(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q4_1>, 4, 4>(job, rows)
}

unsafe fn q5_0(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q5_0>, 4, 4>(job, rows)
}

unsafe fn q5_1(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q5_1>, 4, 4>(job, rows)
}

unsafe fn q8_0(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q8_0>, 4, 4>(job, rows)
}

// The k-quants go a row at a time (a row's block is unpacked once for
// four tokens).
unsafe fn q4_k(job: &Job, rows: Range<usize>) {
    drive::<K256<Q4K>, 1, 4>(job, rows)
}

unsafe fn q5_k(job: &Job, rows: Range<usize>) {
    drive::<K256<Q5K>, 1, 4>(job, rows)
}

unsafe fn q6_k(job: &Job, rows: Range<usize>) {
    drive::<K256<Q6K>, 1, 4>(job, rows)
}

/// The largest magnitude in `x` (NaNs ignored, as `f32::max` does).
fn amax(x: &[f32]) -> f32 {
    x.chunks_exact(4).fold(0.0, |m, c| {
        // SAFETY: `c` holds four floats; NEON is baseline on aarch64.
        unsafe { vmaxnmvq_f32(vabsq_f32(vld1q_f32(c.as_ptr()))) }.max(m)
    })
}

/// Quantizes 16 values under inverse scale `id` as the portable
/// quantizers do (round half to even, saturating) and returns their sum.
fn quantize16(x: &[f32], id: f32, out: &mut [u8]) -> i32 {
    assert!(x.len() == 16 && out.len() == 16);
    // SAFETY: both slices hold 16 elements; NEON is baseline on aarch64.
    unsafe {
        let v: [int32x4_t; 4] = std::array::from_fn(|k| {
            vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x.as_ptr().add(4 * k)), id))
        });
        let lo = vqmovn_high_s32(vqmovn_s32(v[0]), v[1]);
        let hi = vqmovn_high_s32(vqmovn_s32(v[2]), v[3]);
        let q = vqmovn_high_s16(vqmovn_s16(lo), hi);
        vst1q_s8(out.as_mut_ptr() as *mut i8, q);
        vaddlvq_s8(q) as i32
    }
}

/// `quant::quantize_q8s`, bit for bit.
pub(crate) fn quantize_q8s(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(32).zip(dst.chunks_exact_mut(Q8S_BYTES)) {
        let (d, id) = q8_scale(amax(x));
        let sum =
            quantize16(&x[..16], id, &mut out[4..20]) + quantize16(&x[16..], id, &mut out[20..]);
        out[0..2].copy_from_slice(&crate::ops::f32_to_f16(d).to_le_bytes());
        out[2..4].copy_from_slice(&(sum as i16).to_le_bytes());
    }
}

/// `quant::quantize_q8k`, bit for bit.
pub(crate) fn quantize_q8k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(256).zip(dst.chunks_exact_mut(Q8K_BYTES)) {
        let (d, id) = q8_scale(amax(x));
        out[0..4].copy_from_slice(&d.to_le_bytes());
        for (g, xs) in x.chunks_exact(16).enumerate() {
            let sum = quantize16(xs, id, &mut out[4 + 16 * g..20 + 16 * g]);
            out[260 + 2 * g..262 + 2 * g].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
}

/// The NEON kernel for `ty` at `isa`; none for the portable level or a
/// type without one.
pub(crate) fn kernel(isa: Isa, ty: WeightType) -> Option<KernelFn> {
    if isa != Isa::Neon {
        return None;
    }
    let k: KernelFn = match ty {
        WeightType::Q4_0 => q4_0,
        WeightType::Q4_1 => q4_1,
        WeightType::Q5_0 => q5_0,
        WeightType::Q5_1 => q5_1,
        WeightType::Q8_0 => q8_0,
        WeightType::Q4_K => q4_k,
        WeightType::Q5_K => q5_k,
        WeightType::Q6_K => q6_k,
        _ => return None,
    };
    Some(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::tests::{random_activations, random_weights, seeded};
    use crate::matmul::{activation_row_bytes, matmul_with};
    use crate::{Pool, Weights};

    /// The module doc's promise for the k-quant tiles, which the
    /// every-ISA tests only hold to float reordering: their outputs equal
    /// the portable kernel's bit for bit, over ragged row and token tiles.
    #[test]
    fn k_quant_tiles_equal_portable_bit_for_bit() {
        let pool = Pool::new(1);
        let mut rng = seeded(4);
        for ty in [WeightType::Q4_K, WeightType::Q5_K, WeightType::Q6_K] {
            assert!(kernel(Isa::Neon, ty).is_some(), "{}", ty.name());
            for (rows, cols, n) in [(5, 256, 1), (7, 768, 6), (3, 512, 9)] {
                let w = random_weights(ty, rows, cols, &mut rng);
                let x = random_activations(n * cols, &mut rng);
                let weights = Weights {
                    ty,
                    rows,
                    cols,
                    data: &w,
                };
                let run = |isa| {
                    let mut out = vec![f32::NAN; n * rows];
                    let mut q = vec![0u8; n * activation_row_bytes(ty, cols)];
                    matmul_with(isa, &pool, &weights, &x, n, &mut out, &mut q);
                    out
                };
                let (neon, portable) = (run(Isa::Neon), run(Isa::Portable));
                for i in 0..neon.len() {
                    assert_eq!(
                        neon[i].to_bits(),
                        portable[i].to_bits(),
                        "{} {rows}x{cols}x{n} [{}][{}]: {} vs portable {}",
                        ty.name(),
                        i / rows,
                        i % rows,
                        neon[i],
                        portable[i]
                    );
                }
            }
        }
    }
}
