//! `matmul`: quantize the activations once, then split the weight rows
//! over the pool; each worker walks its rows in tiles of R rows x T tokens
//! so a weight block is unpacked once per T tokens and an activation block
//! loaded once per R rows. Decode (one token) streams the weights; prefill
//! reuses each weight tile across tokens from L1. The 32-value block types,
//! Q4_K and Q5_K take a decode-batch kernel from a few tokens on instead
//! (`x86::batch`): it unpacks each block of eight rows once for all tokens.
//! Tiles and batch pass do the same float operations per row and block, so
//! which one runs, and what else shares the matmul, never changes a row.

use crate::isa::Isa;
use crate::pool::Pool;
use crate::quant::{self, f16_at};
use crate::{WeightType, Weights};
use fathom_ggml::ActFormat;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of one activation row of `cols` values quantized for a matmul
/// against `ty`: 36 per 32 values for the 32-value block types, 292 per
/// 256 for the k-quants, none for float weights (they read `x` directly).
/// Never more than `max(ceil(cols/32)*36, ceil(cols/256)*292)`, the
/// memory plan's `q8_rows` reservation.
pub fn activation_row_bytes(ty: WeightType, cols: usize) -> usize {
    ty.activation().row_bytes(cols as u64) as usize
}

/// Quantizes whole rows of `x` into `dst` in `format`.
fn quantize_rows(isa: Isa, format: ActFormat, x: &[f32], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: a SIMD `Isa` exists only once detection found AVX2, FMA
        // and F16C; both quantizers write whole blocks within `dst`, which
        // the caller sized for `x`.
        unsafe {
            match format {
                ActFormat::Q8S => crate::x86::ops::quantize_q8s(x, dst),
                ActFormat::Q8K => crate::x86::ops::quantize_q8k(x, dst),
                ActFormat::F32 => {}
            }
        }
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        match format {
            ActFormat::Q8S => crate::aarch64::quantize_q8s(x, dst),
            ActFormat::Q8K => crate::aarch64::quantize_q8k(x, dst),
            ActFormat::F32 => {}
        }
        return;
    }
    let _ = isa;
    match format {
        ActFormat::Q8S => quant::quantize_q8s(x, dst),
        ActFormat::Q8K => quant::quantize_q8k(x, dst),
        ActFormat::F32 => {}
    }
}

/// One tile of a weight type's kernel.
pub(crate) trait Tile {
    /// Dots of `R` weight rows (`w`, rows `w_stride` bytes apart) with `T`
    /// activation rows (`a`, `a_stride` bytes apart) of `cols` values, as
    /// `out[t][r]`.
    ///
    /// # Safety
    /// The pointers cover those rows, and the CPU runs the tile's ISA.
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T];
}

/// What one matmul hands its workers: raw views of the caller's slices,
/// checked by [`matmul`] before any kernel runs.
pub(crate) struct Job {
    pub(crate) ty: WeightType,
    pub(crate) w: *const u8,
    pub(crate) w_stride: usize,
    pub(crate) a: *const u8,
    pub(crate) a_stride: usize,
    pub(crate) cols: usize,
    pub(crate) n_tokens: usize,
    /// `out[t * out_stride + r]`.
    pub(crate) out: *mut f32,
    pub(crate) out_stride: usize,
}

// SAFETY: workers only read through `w` and `a`, and write `out` at rows
// of their own chunk, so sharing a `Job` between them races on nothing.
unsafe impl Sync for Job {}

/// A kernel computes `job` for a range of weight rows.
///
/// Safety: `job`'s pointers cover its rows, tokens and outputs as
/// [`matmul`] checks, and the CPU runs the kernel's ISA.
pub(crate) type KernelFn = unsafe fn(&Job, Range<usize>);

/// Tokens per pass over a worker's rows: 64 activation rows of the widest
/// SmolLM2/Llama inputs stay in L2 while each weight tile stays in L1.
pub(crate) const TOKEN_BLOCK: usize = 64;

/// Walks `rows` x all tokens in tiles of `R` x `T`, with 1-row and 1-token
/// tiles for the remainders.
///
/// # Safety
/// As [`Tile::tile`], for every row in `rows` and token of `job`.
#[inline(always)]
pub(crate) unsafe fn drive<K: Tile, const R: usize, const T: usize>(job: &Job, rows: Range<usize>) {
    let mut t0 = 0;
    while t0 < job.n_tokens {
        let t1 = (t0 + TOKEN_BLOCK).min(job.n_tokens);
        let mut r = rows.start;
        while r + R <= rows.end {
            row_tile::<K, R, T>(job, r, t0..t1);
            r += R;
        }
        while r < rows.end {
            row_tile::<K, 1, T>(job, r, t0..t1);
            r += 1;
        }
        t0 = t1;
    }
}

#[inline(always)]
unsafe fn row_tile<K: Tile, const R: usize, const T: usize>(
    job: &Job,
    r: usize,
    tokens: Range<usize>,
) {
    let w = job.w.add(r * job.w_stride);
    let mut t = tokens.start;
    while t + T <= tokens.end {
        let a = job.a.add(t * job.a_stride);
        store(
            job,
            r,
            t,
            K::tile::<R, T>(w, job.w_stride, a, job.a_stride, job.cols),
        );
        t += T;
    }
    while t < tokens.end {
        let a = job.a.add(t * job.a_stride);
        store(
            job,
            r,
            t,
            K::tile::<R, 1>(w, job.w_stride, a, job.a_stride, job.cols),
        );
        t += 1;
    }
}

#[inline(always)]
unsafe fn store<const R: usize, const T: usize>(job: &Job, r: usize, t: usize, v: [[f32; R]; T]) {
    for (i, row) in v.iter().enumerate() {
        std::ptr::copy_nonoverlapping(row.as_ptr(), job.out.add((t + i) * job.out_stride + r), R);
    }
}

/// `out[t * w.rows + r] = dot(row r of w, x[t * w.cols..(t + 1) * w.cols])`
/// for `t` in `0..n_tokens`.
///
/// `qbuf` holds at least `n_tokens * activation_row_bytes(w.ty, w.cols)`
/// bytes for the quantized activations; `x` and `out` may be longer than
/// needed. Panics if a buffer is too short or `w.data` does not hold
/// `rows` rows of whole blocks: those are the caller's bugs, not input.
pub fn matmul(
    pool: &Pool,
    w: &Weights,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    qbuf: &mut [u8],
) {
    matmul_with(Isa::detected(), pool, w, x, n_tokens, out, qbuf)
}

pub(crate) fn matmul_with(
    isa: Isa,
    pool: &Pool,
    w: &Weights,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    qbuf: &mut [u8],
) {
    if let Some(job) = prepare(isa, pool, w, x, n_tokens, out, qbuf, true) {
        run_jobs(pool, &[Some((job, kernel_for(isa, w.ty, n_tokens)))]);
    }
}

/// One product of [`matmul_group`]: `out = x · wᵀ` for `n_tokens` rows of
/// `x`, as [`matmul`] takes them.
pub struct GroupedMatmul<'a> {
    pub w: Weights<'a>,
    pub x: &'a [f32],
    pub n_tokens: usize,
    pub out: &'a mut [f32],
}

/// Most products one [`matmul_group`] call takes.
pub const MAX_GROUP: usize = 64;

/// Several independent [`matmul`]s (a MoE layer's routed experts over a
/// few rows each) in one hand-off to the pool: each alone is too small to
/// pay for waking the workers. Every output equals what [`matmul`] gives
/// for that product, bit for bit (same kernels, same quantized rows). A
/// product whose `x`, `n_tokens`, width and activation format equal the
/// previous one's (an expert's gate and up) reuses its quantized rows;
/// otherwise it takes the next `n_tokens × activation_row_bytes` bytes of
/// `qbuf`. Panics on more than [`MAX_GROUP`] products or on buffers
/// [`matmul`] refuses.
pub fn matmul_group<'a>(
    pool: &Pool,
    products: impl IntoIterator<Item = GroupedMatmul<'a>>,
    qbuf: &mut [u8],
) {
    let isa = Isa::detected();
    let mut jobs: [Option<(Job, KernelFn)>; MAX_GROUP] = [const { None }; MAX_GROUP];
    let (mut used, mut last, mut n) = (0, None, 0);
    for p in products {
        assert!(
            n < MAX_GROUP,
            "matmul_group: more than {MAX_GROUP} products"
        );
        let key = (p.x.as_ptr(), p.n_tokens, p.w.ty.activation(), p.w.cols);
        let fresh = last.is_none_or(|(k, _)| k != key);
        let at = match last {
            Some((_, at)) if !fresh => at,
            _ => used,
        };
        if fresh {
            used += p.n_tokens * activation_row_bytes(p.w.ty, p.w.cols);
        }
        let len = qbuf.len();
        let q = &mut qbuf[at.min(len)..];
        let job = prepare(isa, pool, &p.w, p.x, p.n_tokens, p.out, q, fresh);
        jobs[n] = job.map(|job| (job, kernel_for(isa, p.w.ty, p.n_tokens)));
        last = Some((key, at));
        n += 1;
    }
    // The jobs point into the products' slices, borrowed for 'a, beyond
    // this call.
    run_jobs(pool, &jobs[..n]);
}

/// Checks a product's buffers as [`matmul`] documents, quantizes its
/// activations into `qbuf` (unless `quantize` is false: they are there
/// already) and returns its job; `None` when there is nothing to compute.
#[allow(clippy::too_many_arguments)]
fn prepare(
    isa: Isa,
    pool: &Pool,
    w: &Weights,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    qbuf: &mut [u8],
    quantize: bool,
) -> Option<Job> {
    let (ty, rows, cols) = (w.ty, w.rows, w.cols);
    assert!(
        cols % ty.block_elems() == 0,
        "matmul: {} rows hold whole blocks of {}, not {cols} values",
        ty.name(),
        ty.block_elems()
    );
    let row_bytes = ty.row_bytes(cols);
    assert!(
        w.data.len() >= rows * row_bytes,
        "matmul: {rows} x {cols} {} weights need {} bytes, got {}",
        ty.name(),
        rows * row_bytes,
        w.data.len()
    );
    assert!(
        x.len() >= n_tokens * cols,
        "matmul: x holds {} values, not {n_tokens} x {cols}",
        x.len()
    );
    assert!(
        out.len() >= n_tokens * rows,
        "matmul: out holds {} values, not {n_tokens} x {rows}",
        out.len()
    );
    let format = ty.activation();
    let act_bytes = activation_row_bytes(ty, cols);
    assert!(
        qbuf.len() >= n_tokens * act_bytes,
        "matmul: qbuf holds {} bytes, not {n_tokens} x {act_bytes}",
        qbuf.len()
    );
    if n_tokens == 0 || rows == 0 {
        return None;
    }
    if cols == 0 {
        // Empty dot products; the kernels may assume a block per row.
        for row in out[..n_tokens * rows].chunks_exact_mut(rows) {
            row.fill(0.0);
        }
        return None;
    }

    let (a, a_stride) = if format == ActFormat::F32 {
        (x.as_ptr() as *const u8, cols * 4)
    } else {
        if quantize {
            quantize_parallel(
                isa,
                pool,
                format,
                &x[..n_tokens * cols],
                cols,
                &mut qbuf[..n_tokens * act_bytes],
            );
        }
        (qbuf.as_ptr(), act_bytes)
    };
    Some(Job {
        ty,
        w: w.data.as_ptr(),
        w_stride: row_bytes,
        a,
        a_stride,
        cols,
        n_tokens,
        out: out.as_mut_ptr(),
        out_stride: rows,
    })
}

/// Runs `jobs` on the pool: chunks of whole 8-row groups (the batch
/// kernel's; two 4-row tiles), about eight per worker and job, handed out
/// first come first served over all jobs, so a worker that lost its core
/// to another process does not hold up the rest.
fn run_jobs(pool: &Pool, jobs: &[Option<(Job, KernelFn)>]) {
    let mut ends = [0usize; MAX_GROUP];
    let mut total = 0;
    for (end, job) in ends.iter_mut().zip(jobs) {
        if let Some((job, _)) = job {
            total += job.out_stride.div_ceil(per_chunk(pool, job.out_stride));
        }
        *end = total;
    }
    let next = AtomicUsize::new(0);
    pool.run(&|_, _| loop {
        let c = next.fetch_add(1, Ordering::Relaxed);
        if c >= total {
            break;
        }
        let j = ends[..jobs.len()].partition_point(|&end| end <= c);
        let Some((job, kernel)) = &jobs[j] else {
            continue;
        };
        let first = if j == 0 { 0 } else { ends[j - 1] };
        let (rows, per) = (job.out_stride, per_chunk(pool, job.out_stride));
        let range = (c - first) * per..((c - first + 1) * per).min(rows);
        // SAFETY: `prepare` checked every row, token and output the kernel
        // touches; chunks are disjoint; `kernel_for` returned a kernel for
        // an ISA this CPU runs.
        unsafe { kernel(job, range) };
    });
}

/// Rows per chunk of a product of `rows` rows.
fn per_chunk(pool: &Pool, rows: usize) -> usize {
    rows.div_ceil(pool.n_threads() * 8)
        .next_multiple_of(8)
        .max(16)
}

/// Quantizes `n_tokens` rows, split over the pool when there are enough
/// of them to pay for the extra hand-off.
fn quantize_parallel(
    isa: Isa,
    pool: &Pool,
    format: ActFormat,
    x: &[f32],
    cols: usize,
    dst: &mut [u8],
) {
    let n_tokens = x.len() / cols;
    let row_bytes = dst.len() / n_tokens;
    if n_tokens < 4 || pool.n_threads() == 1 {
        for (xr, qr) in x.chunks_exact(cols).zip(dst.chunks_exact_mut(row_bytes)) {
            quantize_rows(isa, format, xr, qr);
        }
        return;
    }
    let dst_ptr = SendPtr(dst.as_mut_ptr());
    pool.run(&|i, n| {
        let tokens = n_tokens * i / n..n_tokens * (i + 1) / n;
        let len = tokens.len() * row_bytes;
        // SAFETY: workers get disjoint token ranges of `dst`, which
        // outlives `run`.
        let d = unsafe {
            std::slice::from_raw_parts_mut(dst_ptr.get().add(tokens.start * row_bytes), len)
        };
        quantize_rows(isa, format, &x[tokens.start * cols..tokens.end * cols], d);
    });
}

/// A pointer workers may share because each writes a disjoint part.
struct SendPtr(*mut u8);

impl SendPtr {
    /// A method, so closures capture the whole (Sync) wrapper rather than
    /// its raw-pointer field.
    fn get(&self) -> *mut u8 {
        self.0
    }
}

// SAFETY: see the use in `quantize_parallel`: each worker writes its own
// token rows.
unsafe impl Sync for SendPtr {}

fn kernel_for(isa: Isa, ty: WeightType, n_tokens: usize) -> KernelFn {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) =
        crate::x86::batch_kernel(isa, ty, n_tokens).or_else(|| crate::x86::kernel(isa, ty))
    {
        return k;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(k) = crate::aarch64::kernel(isa, ty) {
        return k;
    }
    let _ = (isa, ty, n_tokens);
    portable_kernel
}

/// The portable kernel: for quantized types, each weight block is
/// unpacked once ([`Unpacked`]) and dotted with the block of every token
/// of a [`TOKEN_BLOCK`], each token's sum kept in block order, so every
/// output equals [`dot_portable`]'s bit for bit.
///
/// # Safety
/// As [`KernelFn`].
unsafe fn portable_kernel(job: &Job, rows: Range<usize>) {
    let token = |t: usize| std::slice::from_raw_parts(job.a.add(t * job.a_stride), job.a_stride);
    for r in rows {
        let wr = std::slice::from_raw_parts(job.w.add(r * job.w_stride), job.w_stride);
        let format = job.ty.activation();
        if format == ActFormat::F32 {
            for t in 0..job.n_tokens {
                *job.out.add(t * job.out_stride + r) = dot_portable(job.ty, wr, token(t), job.cols);
            }
            continue;
        }
        let (bb, ab) = (job.ty.block_bytes(), format.block_bytes());
        let mut t0 = 0;
        while t0 < job.n_tokens {
            let t1 = (t0 + TOKEN_BLOCK).min(job.n_tokens);
            let mut sums = [0.0f32; TOKEN_BLOCK];
            for (b, wb) in wr
                .chunks_exact(bb)
                .take(job.cols / job.ty.block_elems())
                .enumerate()
            {
                let u = Unpacked::new(job.ty, wb);
                for (t, sum) in (t0..t1).zip(&mut sums) {
                    *sum += u.dot(&token(t)[b * ab..(b + 1) * ab]);
                }
            }
            for (t, sum) in (t0..t1).zip(sums) {
                *job.out.add(t * job.out_stride + r) = sum;
            }
            t0 = t1;
        }
    }
}

fn i16_at(b: &[u8], at: usize) -> i32 {
    i16::from_le_bytes([b[at], b[at + 1]]) as i32
}

/// One quantized weight block as the dot products read it: the stored
/// quants as small integers (unsigned but for Q8_0, Q3_K and Q6_K) and
/// its scales, unpacked once for any number of activation blocks.
struct Unpacked {
    /// 32 quants for the `Q8S` types, 256 for the k-quants.
    q: [i8; 256],
    d: f32,
    /// `Q8S`: the offset `c` (-8 d, -16 d or the min); `Q8K`: `dmin`.
    c: f32,
    /// `Q8K`: the scale and min of each 16-value group (a 32-value
    /// sub-block's twice), integers as the block stores them.
    sc: [i32; 16],
    m: [i32; 16],
    format: ActFormat,
}

impl Unpacked {
    fn new(ty: WeightType, wb: &[u8]) -> Unpacked {
        let mut u = Unpacked {
            q: [0; 256],
            d: 0.0,
            c: 0.0,
            sc: [0; 16],
            m: [0; 16],
            format: ty.activation(),
        };
        let quants = |q: &mut [i8], f: &dyn Fn(usize) -> i8| {
            q.iter_mut().enumerate().for_each(|(j, v)| *v = f(j));
        };
        match ty {
            WeightType::Q4_0 => {
                quants(&mut u.q[..32], &|j| quant::q4_quant(wb, 2, j) as i8);
                (u.d, u.c) = (f16_at(wb, 0), -8.0 * f16_at(wb, 0));
            }
            WeightType::Q4_1 => {
                quants(&mut u.q[..32], &|j| quant::q4_quant(wb, 4, j) as i8);
                (u.d, u.c) = (f16_at(wb, 0), f16_at(wb, 2));
            }
            WeightType::Q5_0 => {
                quants(&mut u.q[..32], &|j| quant::q5_quant(wb, 6, j) as i8);
                (u.d, u.c) = (f16_at(wb, 0), -16.0 * f16_at(wb, 0));
            }
            WeightType::Q5_1 => {
                quants(&mut u.q[..32], &|j| quant::q5_quant(wb, 8, j) as i8);
                (u.d, u.c) = (f16_at(wb, 0), f16_at(wb, 2));
            }
            WeightType::Q8_0 => {
                quants(&mut u.q[..32], &|j| wb[2 + j] as i8);
                u.d = f16_at(wb, 0);
            }
            WeightType::MXFP4 => {
                quants(&mut u.q[..32], &|j| quant::mxfp4_quant(wb, j));
                u.d = fathom_ggml::blocks::e8m0_half(wb[0]);
            }
            WeightType::Q2_K => {
                quants(&mut u.q, &|i| quant::q2k_quant(wb, i) as i8);
                for (g, &s) in wb[..16].iter().enumerate() {
                    (u.sc[g], u.m[g]) = ((s & 15) as i32, (s >> 4) as i32);
                }
                (u.d, u.c) = (f16_at(wb, 80), f16_at(wb, 82));
            }
            WeightType::Q3_K => {
                quants(&mut u.q, &|i| quant::q3k_quant(wb, i));
                let sc = quant::q3k_scales(&wb[96..108]);
                u.sc.iter_mut().zip(sc).for_each(|(s, v)| *s = v as i32);
                u.d = f16_at(wb, 108);
            }
            WeightType::Q4_K | WeightType::Q5_K => {
                if ty == WeightType::Q4_K {
                    quants(&mut u.q, &|i| quant::q4k_quant(wb, i) as i8);
                } else {
                    quants(&mut u.q, &|i| quant::q5k_quant(wb, i) as i8);
                }
                let (sc, m) = quant::k4_scales(&wb[4..16]);
                for g in 0..16 {
                    (u.sc[g], u.m[g]) = (sc[g / 2] as i32, m[g / 2] as i32);
                }
                (u.d, u.c) = (f16_at(wb, 0), f16_at(wb, 2));
            }
            WeightType::Q6_K => {
                quants(&mut u.q, &|i| quant::q6k_quant(wb, i));
                for (s, &v) in u.sc.iter_mut().zip(&wb[192..208]) {
                    *s = v as i8 as i32;
                }
                u.d = f16_at(wb, 208);
            }
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => {
                unreachable!("float weights are not unpacked")
            }
        }
        u
    }

    /// This block's term of a dot product with activation block `ab`,
    /// with the SIMD kernels' integer sums and their float arithmetic in
    /// the same order.
    fn dot(&self, ab: &[u8]) -> f32 {
        let dot = |r: Range<usize>| -> i32 {
            self.q[r.clone()]
                .iter()
                .zip(&ab[4 + r.start..4 + r.end])
                .map(|(&w, &x)| w as i32 * x as i8 as i32)
                .sum()
        };
        if self.format == ActFormat::Q8S {
            let dx = f16_at(ab, 0);
            return dot(0..32) as f32 * (self.d * dx) + self.c * (dx * i16_at(ab, 2) as f32);
        }
        // Integer sums per 16-value group; a 32-value sub-block's scale
        // and min times its two groups' sums is the same integer.
        let isum: i32 = (0..16)
            .map(|g| self.sc[g] * dot(16 * g..16 * (g + 1)))
            .sum();
        let imin: i32 = (0..16).map(|g| self.m[g] * i16_at(ab, 260 + 2 * g)).sum();
        let dx = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        isum as f32 * (self.d * dx) - imin as f32 * (self.c * dx)
    }
}

/// One weight row (`w`) dotted with one activation row (`a`, in
/// `ty.activation()`), with the SIMD kernels' integer arithmetic per
/// block and float arithmetic per block in the same order.
pub(crate) fn dot_portable(ty: WeightType, w: &[u8], a: &[u8], cols: usize) -> f32 {
    let bb = ty.block_bytes();
    let format = ty.activation();
    if format != ActFormat::F32 {
        let ab = format.block_bytes();
        return w
            .chunks_exact(bb)
            .zip(a.chunks_exact(ab))
            .take(cols / ty.block_elems())
            .map(|(wb, ab)| Unpacked::new(ty, wb).dot(ab))
            .fold(0.0, |sum, term| sum + term);
    }
    let x = a[..4 * cols]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let w = w[..cols * bb].chunks_exact(bb);
    match ty {
        WeightType::F32 => w
            .zip(x)
            .map(|(c, x)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * x)
            .sum(),
        WeightType::F16 => w.zip(x).map(|(c, x)| f16_at(c, 0) * x).sum(),
        _ => w
            .zip(x)
            .map(|(c, x)| crate::ops::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])) * x)
            .sum(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::f32_to_f16;

    use fathom_fixtures::Rng;

    /// The tests' generator for `seed` (xorshift64*, the seed spread over
    /// the state's bits).
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng::xorshift64_star(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// Uniform in [-1, 1).
    fn unit(rng: &mut Rng) -> f32 {
        rng.f32_in(-1.0..1.0)
    }

    /// `rows` rows of random blocks: random quant bytes, scales of either
    /// sign around 1/64, float values in [-1, 1).
    pub(crate) fn random_weights(
        ty: WeightType,
        rows: usize,
        cols: usize,
        rng: &mut Rng,
    ) -> Vec<u8> {
        let n = rows * cols / ty.block_elems();
        let bb = ty.block_bytes();
        let mut data: Vec<u8> = (0..n * bb).map(|_| rng.next_u64() as u8).collect();
        for block in data.chunks_exact_mut(bb) {
            match ty {
                WeightType::F32 => block.copy_from_slice(&unit(rng).to_le_bytes()),
                WeightType::F16 => block.copy_from_slice(&f32_to_f16(unit(rng)).to_le_bytes()),
                WeightType::BF16 => {
                    block.copy_from_slice(&((unit(rng).to_bits() >> 16) as u16).to_le_bytes())
                }
                // Scales 2^-8 .. 2^-5: values up to about 1/3.
                WeightType::MXFP4 => block[0] = 120 + (rng.next_u64() % 4) as u8,
                _ => {
                    for &at in ty.f16_scales() {
                        let s = unit(rng) / 32.0;
                        block[at..at + 2].copy_from_slice(&f32_to_f16(s).to_le_bytes());
                    }
                }
            }
        }
        data
    }

    /// Activations in [-1, 1) with an occasional outlier, as real hidden
    /// states have.
    pub(crate) fn random_activations(n: usize, rng: &mut Rng) -> Vec<f32> {
        (0..n)
            .map(|i| unit(rng) * if i % 97 == 5 { 20.0 } else { 1.0 })
            .collect()
    }

    /// The f32 product and its error bound. Activation quantization moves
    /// each x_i by at most half a quant step, amax/254 of its block (plus,
    /// for `Q8S`, the f16 rounding of the scale: 2^-11 relative), so
    /// |error| <= sum |w_i| * that; float rounding of the sums adds a
    /// relative 1e-5 of sum |w_i x_i|, which is returned too.
    fn reference(
        ty: WeightType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        n_tokens: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut wf = vec![0.0f32; rows * cols];
        quant::dequantize_row(ty, w, &mut wf);
        let qblock = match ty.activation() {
            ActFormat::Q8S => 32,
            ActFormat::Q8K => 256,
            ActFormat::F32 => 0,
        };
        let f16_scale = if ty.activation() == ActFormat::Q8S {
            1.0 / 2048.0
        } else {
            0.0
        };
        let mut want = vec![0.0; n_tokens * rows];
        let mut tol = vec![0.0; n_tokens * rows];
        let mut mags = vec![0.0; n_tokens * rows];
        for t in 0..n_tokens {
            let xr = &x[t * cols..(t + 1) * cols];
            let step: Vec<f32> = (0..cols)
                .map(|i| {
                    if qblock == 0 {
                        return 0.0;
                    }
                    let b = i / qblock * qblock;
                    let amax = xr[b..b + qblock].iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    amax / 254.0 * (1.0 + f16_scale) + xr[i].abs() * f16_scale
                })
                .collect();
            for r in 0..rows {
                let wr = &wf[r * cols..(r + 1) * cols];
                let exact: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f32 = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                let quant: f32 = wr.iter().zip(&step).map(|(a, s)| a.abs() * s).sum();
                want[t * rows + r] = exact as f32;
                tol[t * rows + r] = quant + 1e-5 * mag + 1e-6;
                mags[t * rows + r] = mag;
            }
        }
        (want, tol, mags)
    }

    fn run(isa: Isa, pool: &Pool, w: &Weights, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; n * w.rows];
        let mut q = vec![0u8; n * activation_row_bytes(w.ty, w.cols)];
        matmul_with(isa, pool, w, x, n, &mut out, &mut q);
        out
    }

    /// A group of products (mixed types, two sharing their rows, one with
    /// none) gives each product's [`matmul`] output to the bit, into
    /// outputs nothing else touches.
    #[test]
    fn matmul_group_equals_each_matmul() {
        use WeightType::*;
        let pool = Pool::new(3);
        let mut rng = seeded(11);
        let shapes = [
            (Q4_K, 40, 512, 3),
            (Q6_K, 24, 512, 3),
            (Q8_0, 33, 256, 1),
            (F16, 8, 64, 0),
        ];
        let ws: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(ty, rows, cols, _)| random_weights(ty, rows, cols, &mut rng))
            .collect();
        let weights = |i: usize| Weights {
            ty: shapes[i].0,
            rows: shapes[i].1,
            cols: shapes[i].2,
            data: &ws[i],
        };
        let shared = random_activations(3 * 512, &mut rng);
        let own = random_activations(256, &mut rng);
        let xs = [&shared[..], &shared[..], &own[..], &own[..0]];
        let mut outs: Vec<Vec<f32>> = shapes
            .iter()
            .map(|s| vec![f32::NAN; s.3 * s.1 + 5])
            .collect();
        // Q4_K's rows quantized once for Q6_K too (same format), then Q8_0's.
        let mut q = vec![0u8; 3 * 584 + 36 * 8];
        let (a, rest) = outs.split_at_mut(1);
        let (b, rest) = rest.split_at_mut(1);
        let (c, d) = rest.split_at_mut(1);
        let products = [&mut a[0], &mut b[0], &mut c[0], &mut d[0]]
            .into_iter()
            .enumerate()
            .map(|(i, out)| GroupedMatmul {
                w: weights(i),
                x: xs[i],
                n_tokens: shapes[i].3,
                out: &mut out[..],
            });
        matmul_group(&pool, products, &mut q);
        for (i, out) in outs.iter().enumerate() {
            let n = shapes[i].3;
            let want = run(Isa::detected(), &pool, &weights(i), xs[i], n);
            let got = &out[..n * shapes[i].1];
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "product {i} ({}) differs from its matmul",
                shapes[i].0.name()
            );
            assert!(
                out[got.len()..].iter().all(|v| v.is_nan()),
                "product {i} wrote past its rows"
            );
        }
    }

    /// Every type and SIMD level against the f32 reference and against the
    /// portable kernel, over shapes with ragged row and token tiles.
    #[test]
    fn matmul_matches_reference() {
        let pools = [Pool::new(1), Pool::new(3)];
        let mut rng = seeded(1);
        for ty in WeightType::ALL {
            for (rows, cols, n) in [(13, 512, 1), (9, 256, 6), (6, 768, 70)] {
                let w = random_weights(ty, rows, cols, &mut rng);
                let x = random_activations(n * cols, &mut rng);
                let (want, tol, mag) = reference(ty, &w, rows, cols, &x, n);
                let weights = Weights {
                    ty,
                    rows,
                    cols,
                    data: &w,
                };
                let portable = run(Isa::Portable, &pools[0], &weights, &x, n);
                for i in 0..want.len() {
                    assert!(
                        (portable[i] - want[i]).abs() <= tol[i],
                        "{} portable {rows}x{cols}x{n} [{i}]: {} vs {} (tol {})",
                        ty.name(),
                        portable[i],
                        want[i],
                        tol[i]
                    );
                }
                for isa in Isa::available() {
                    for pool in &pools {
                        let got = run(isa, pool, &weights, &x, n);
                        for i in 0..want.len() {
                            // Same integer sums; only the order of float
                            // additions differs, over terms up to a few
                            // times sum |w_i x_i| (the offsets' products).
                            let close = 4e-6 * mag[i] + 1e-6;
                            assert!(
                                (got[i] - portable[i]).abs() <= close,
                                "{} {isa:?} x{} {rows}x{cols}x{n} [{i}]: {} vs portable {}",
                                ty.name(),
                                pool.n_threads(),
                                got[i],
                                portable[i]
                            );
                        }
                    }
                }
            }
        }
    }

    /// Decode-batch sizes (1..=17, 33, 64 and one past a token block)
    /// on every kernel family, with row counts that leave part groups
    /// and passes, widths of an odd number of blocks, and rows long enough
    /// that the 32-value kernels walk them in several runs of activation
    /// scales (129 blocks: up to three at 33 tokens and more; 4,097
    /// blocks: two for one token): each output
    /// within the quantization bound of the f32 product, each SIMD output
    /// within float reordering of the portable one and equal bit for bit
    /// to its token's output alone (sequences decoded together give what
    /// each gives alone), and the portable kernel equal to the one-row
    /// one-token reference bit for bit.
    #[test]
    fn decode_batches_match_reference_on_every_isa() {
        let pools = [Pool::new(1), Pool::new(3)];
        let mut rng = seeded(3);
        let counts: Vec<usize> = (1..=17).chain([33, 64, 65]).collect();
        for ty in WeightType::ALL {
            let widths = if ty.block_elems() == 256 {
                [768, 256, 4352, 131_328]
            } else {
                [96, 224, 4128, 131_104]
            };
            let shapes = [
                (19, widths[0]),
                (300, widths[1]),
                (11, widths[2]),
                (9, widths[3]),
            ];
            for (rows, cols) in shapes {
                let w = random_weights(ty, rows, cols, &mut rng);
                let weights = Weights {
                    ty,
                    rows,
                    cols,
                    data: &w,
                };
                let row_bytes = ty.row_bytes(cols);
                // The activation rows the kernels read: x itself for
                // float weights.
                let act_bytes = match ty.activation() {
                    ActFormat::F32 => 4 * cols,
                    _ => activation_row_bytes(ty, cols),
                };
                // The longest rows only one and two tokens: enough for
                // several runs, and the reference's time stays short.
                let counts = if cols > 100_000 {
                    &counts[..2]
                } else {
                    &counts
                };
                for &n in counts {
                    let x = random_activations(n * cols, &mut rng);
                    let (want, tol, mag) = reference(ty, &w, rows, cols, &x, n);
                    let portable = run(Isa::Portable, &pools[0], &weights, &x, n);
                    let mut q: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    if ty.activation() != ActFormat::F32 {
                        q = vec![0u8; n * act_bytes];
                        for (xr, qr) in x.chunks_exact(cols).zip(q.chunks_exact_mut(act_bytes)) {
                            quantize_rows(Isa::Portable, ty.activation(), xr, qr);
                        }
                    }
                    for t in 0..n {
                        for r in 0..rows {
                            let i = t * rows + r;
                            let one = dot_portable(
                                ty,
                                &w[r * row_bytes..(r + 1) * row_bytes],
                                &q[t * act_bytes..(t + 1) * act_bytes],
                                cols,
                            );
                            assert_eq!(
                                portable[i].to_bits(),
                                one.to_bits(),
                                "{} portable {rows}x{cols}x{n} [{t}][{r}]: {} vs {one}",
                                ty.name(),
                                portable[i]
                            );
                            assert!(
                                (portable[i] - want[i]).abs() <= tol[i],
                                "{} portable {rows}x{cols}x{n} [{t}][{r}]: {} vs {} (tol {})",
                                ty.name(),
                                portable[i],
                                want[i],
                                tol[i]
                            );
                        }
                    }
                    for isa in Isa::available() {
                        // Each token alone: a row's output must not depend
                        // on what else shares the matmul.
                        let alone: Vec<f32> = x
                            .chunks_exact(cols)
                            .flat_map(|xt| run(isa, &pools[0], &weights, xt, 1))
                            .collect();
                        for pool in &pools {
                            let got = run(isa, pool, &weights, &x, n);
                            for i in 0..want.len() {
                                assert!(
                                    (got[i] - portable[i]).abs() <= 4e-6 * mag[i] + 1e-6,
                                    "{} {isa:?} x{} {rows}x{cols}x{n} [{}][{}]: {} vs portable {}",
                                    ty.name(),
                                    pool.n_threads(),
                                    i / rows,
                                    i % rows,
                                    got[i],
                                    portable[i]
                                );
                                assert_eq!(
                                    got[i].to_bits(),
                                    alone[i].to_bits(),
                                    "{} {isa:?} x{} {rows}x{cols}x{n} [{}][{}]: {} batched, {} alone",
                                    ty.name(),
                                    pool.n_threads(),
                                    i / rows,
                                    i % rows,
                                    got[i],
                                    alone[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn simd_quantizers_match_portable() {
        let mut rng = seeded(2);
        let mut x = random_activations(1024, &mut rng);
        x[256..288].fill(0.0);
        for isa in Isa::available() {
            for format in [ActFormat::Q8S, ActFormat::Q8K] {
                let n = activation_row_bytes(
                    if format == ActFormat::Q8S {
                        WeightType::Q4_0
                    } else {
                        WeightType::Q4_K
                    },
                    1024,
                );
                let mut a = vec![0u8; n];
                let mut b = vec![0u8; n];
                quantize_rows(Isa::Portable, format, &x, &mut a);
                quantize_rows(isa, format, &x, &mut b);
                assert_eq!(a, b, "{isa:?} {format:?}");
            }
        }
    }

    #[test]
    fn activation_bytes_fit_the_plan() {
        for ty in WeightType::ALL {
            for cols in [32usize, 256, 576, 1536, 2880, 4096, 14336] {
                let plan = (cols.div_ceil(32) * 36).max(cols.div_ceil(256) * 292);
                assert!(
                    activation_row_bytes(ty, cols) <= plan,
                    "{} {cols}",
                    ty.name()
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "qbuf holds")]
    fn short_qbuf_is_refused() {
        let w = vec![0u8; 4 * 20];
        let weights = Weights {
            ty: WeightType::Q4_1,
            rows: 2,
            cols: 64,
            data: &w,
        };
        matmul(
            &Pool::new(1),
            &weights,
            &[0.0; 64],
            1,
            &mut [0.0; 2],
            &mut [0u8; 10],
        );
    }
}
