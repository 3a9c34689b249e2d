//! aarch64 NEON kernels: tiles for Q4_0, Q4_1 and Q8_0 weights against
//! `Q8S` activations; every other type runs the portable kernel.
//!
//! NEON is part of the aarch64 baseline, so nothing here needs run-time
//! detection; functions are `unsafe` because raw pointers must cover the
//! blocks they read, as [`Tile::tile`] documents.
//!
//! As on x86 (`x86::q32`), a block's contribution is
//! `d_w d_x I + c_w d_x S`: `I` the integer dot of the weight quants
//! (Q4's unsigned nibbles, Q8_0's signed bytes) with the activation
//! quants, `S` the activations' quant sum, `c_w` the weight offset
//! (-8 d for Q4_0, the min for Q4_1, none for Q8_0). `I` comes from
//! `smull` (i8 x i8 -> i16, exact: |w x| <= 128 * 127) and `sadalp`
//! (pairwise into i32); `sdot` would need the unstable `dotprod`
//! intrinsics. One vector lane per weight row carries the float
//! arithmetic, so a row's output is the same whatever tile it is in and
//! however many tokens share the matmul.

// Tiles index several arrays by the same row or token index; iterator
// chains would hide that the indices line up.
#![allow(clippy::needless_range_loop)]

use crate::isa::Isa;
use crate::matmul::{drive, Job, KernelFn, Tile};
use crate::quant::Q8S_BYTES;
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

struct Q4_0;
struct Q4_1;
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
    /// `c = -8 d`.
    #[inline(always)]
    unsafe fn scales(h: [[u16; 2]; 4]) -> (float32x4_t, float32x4_t) {
        let d = f16x4(h.map(|v| v[0]));
        (d, vmulq_n_f32(d, -8.0))
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

// Tiles of 4 rows x 4 tokens: a block's quants of four rows (8
// registers), four accumulators and the integer sums fit NEON's 32
// registers. One token (decode) takes `drive`'s 4 x 1 remainder tiles.
unsafe fn q4_0(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q4_0>, 4, 4>(job, rows)
}

unsafe fn q4_1(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q4_1>, 4, 4>(job, rows)
}

unsafe fn q8_0(job: &Job, rows: Range<usize>) {
    drive::<Q32<Q8_0>, 4, 4>(job, rows)
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
        WeightType::Q8_0 => q8_0,
        _ => return None,
    };
    Some(k)
}
