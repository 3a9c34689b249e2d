//! llama.cpp's KL-divergence base-logits file (`llama-perplexity
//! --kl-divergence-base`), read and written byte-compatibly, and the
//! statistics `--kl-divergence` prints.
//!
//! The file, all little-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 8 | the magic `_logits_` |
//! | 4 | `n_ctx` (i32): tokens per chunk |
//! | 4 | `n_vocab` (i32) |
//! | 4 | `n_chunk` (i32) |
//! | 4 × n_ctx × n_chunk | the evaluated tokens (i32), as tokenized (before any per-chunk BOS) |
//! | per chunk, per scored position | one row of `nv = 2·⌈n_vocab/2⌉ + 4` u16 |
//!
//! A chunk scores its positions `n_ctx/2 .. n_ctx-2` (each predicts the next
//! token), so it has `n_ctx - 1 - n_ctx/2` rows. A row is the f32 `scale`
//! and the f32 `min_log_prob` (two u16 each), then one u16 `q` per token:
//! `log p = scale·q + min_log_prob`, where the range spans at most 16 nats
//! below the most likely token (tokens below it are stored as 0), then a
//! zero u16 of padding when `n_vocab` is odd.

use std::io::{self, Read, Write};

/// The file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"_logits_";
/// Bytes before the token list.
pub const HEADER_BYTES: u64 = 20;
/// Bounds a hostile header must stay within.
const MAX_CTX: u32 = 1 << 20;
const MAX_VOCAB: u32 = 1 << 22;

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("{file}: {what}")]
    Invalid { file: String, what: String },
    #[error("{file}: {source}")]
    Io { file: String, source: io::Error },
}

fn invalid(file: &str, what: impl Into<String>) -> BaseError {
    BaseError::Invalid {
        file: file.to_string(),
        what: what.into(),
    }
}

/// u16 values per stored row.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Scored positions per chunk of `n_ctx` tokens: `n_ctx/2 ..= n_ctx-2`.
pub fn scored_per_chunk(n_ctx: usize) -> usize {
    n_ctx.saturating_sub(1 + n_ctx / 2)
}

/// The header and tokens of a base file.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    /// The exact size of a file with this header.
    pub fn file_bytes(&self) -> Option<u64> {
        let tokens = (self.n_ctx as u64).checked_mul(self.n_chunk as u64)?;
        let rows = (scored_per_chunk(self.n_ctx) as u64).checked_mul(self.n_chunk as u64)?;
        let row_bytes = 2 * row_len(self.n_vocab) as u64;
        HEADER_BYTES
            .checked_add(tokens.checked_mul(4)?)?
            .checked_add(rows.checked_mul(row_bytes)?)
    }
}

/// Writes a base file: the header and tokens up front, then rows as
/// [`quantize_row`] makes them.
pub struct BaseWriter<W: Write> {
    out: W,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl<W: Write> BaseWriter<W> {
    pub fn new(mut out: W, header: &BaseHeader) -> io::Result<Self> {
        let as_i32 = |v: usize| {
            i32::try_from(v)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "value above i32"))
        };
        out.write_all(MAGIC)?;
        for v in [header.n_ctx, header.n_vocab, header.n_chunk] {
            out.write_all(&as_i32(v)?.to_le_bytes())?;
        }
        let mut bytes = Vec::with_capacity(header.tokens.len() * 4);
        for &t in &header.tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        out.write_all(&bytes)?;
        Ok(BaseWriter {
            out,
            row: vec![0; row_len(header.n_vocab)],
            bytes: Vec::new(),
        })
    }

    /// Quantizes one position's logits and appends the row; returns the
    /// negative log-likelihood of `target` as llama.cpp computes it on this
    /// path.
    pub fn push(&mut self, logits: &[f32], target: usize) -> io::Result<f64> {
        let nll = quantize_row(logits, target, &mut self.row);
        self.bytes.clear();
        for &v in &self.row {
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.out.write_all(&self.bytes)?;
        Ok(nll)
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// llama.cpp's `nearest_int`: round to nearest, ties to even, through the
/// f32 mantissa.
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

fn max_and_log_sum_exp(logits: &[f32]) -> (f32, usize, f32) {
    let (mut max, mut imax) = (logits[0], 0);
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max {
            max = l;
            imax = i;
        }
    }
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    (max, imax, sum.ln() as f32)
}

/// One stored row (`row_len(logits.len())` u16) from a position's logits,
/// in llama.cpp's f32 arithmetic so equal logits give equal bytes. Returns
/// the negative log-likelihood of `target`.
pub fn quantize_row(logits: &[f32], target: usize, row: &mut [u16]) -> f64 {
    let (max, _, log_sum_exp) = max_and_log_sum_exp(logits);
    let min = logits
        .iter()
        .copied()
        .fold(logits[0], f32::min)
        .max(max - 16.0);
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0f32;
    let (s, m) = (scale.to_le_bytes(), min_log_prob.to_le_bytes());
    row[0] = u16::from_le_bytes([s[0], s[1]]);
    row[1] = u16::from_le_bytes([s[2], s[3]]);
    row[2] = u16::from_le_bytes([m[0], m[1]]);
    row[3] = u16::from_le_bytes([m[2], m[3]]);
    let (q, pad) = row[4..].split_at_mut(logits.len());
    pad.fill(0);
    if scale != 0.0 {
        let inv = 1.0f32 / scale;
        for (q, &l) in q.iter_mut().zip(logits) {
            *q = if l > min {
                nearest_int(inv * (l - min)) as u16
            } else {
                0
            };
        }
    } else {
        q.fill(0);
    }
    f64::from(max + log_sum_exp - logits[target])
}

/// Reads a base file: the header (checked against the file's length), then
/// one chunk of rows at a time.
pub struct BaseReader<R: Read> {
    input: R,
    file: String,
    pub header: BaseHeader,
    chunks_read: usize,
    bytes: Vec<u8>,
}

impl<R: Read> BaseReader<R> {
    /// `len` is the file's size; `file` names it in errors.
    pub fn new(mut input: R, len: u64, file: &str) -> Result<Self, BaseError> {
        let io_err = |source| BaseError::Io {
            file: file.to_string(),
            source,
        };
        if len < HEADER_BYTES {
            return Err(invalid(
                file,
                format!("{len} bytes is shorter than the {HEADER_BYTES}-byte header of a KL-divergence base file"),
            ));
        }
        let mut head = [0u8; HEADER_BYTES as usize];
        input.read_exact(&mut head).map_err(io_err)?;
        if &head[..8] != MAGIC {
            return Err(invalid(
                file,
                "not a KL-divergence base file (llama-perplexity --kl-divergence-base): it does not start with \"_logits_\"",
            ));
        }
        let field = |at: usize| i32::from_le_bytes(head[at..at + 4].try_into().unwrap());
        let (n_ctx, n_vocab, n_chunk) = (field(8), field(12), field(16));
        if !(4..=MAX_CTX as i32).contains(&n_ctx) {
            return Err(invalid(
                file,
                format!("n_ctx {n_ctx} is out of range (4 ..= {MAX_CTX})"),
            ));
        }
        if !(1..=MAX_VOCAB as i32).contains(&n_vocab) {
            return Err(invalid(
                file,
                format!("n_vocab {n_vocab} is out of range (1 ..= {MAX_VOCAB})"),
            ));
        }
        if n_chunk < 1 {
            return Err(invalid(
                file,
                format!("n_chunk {n_chunk} is out of range (at least 1)"),
            ));
        }
        let mut header = BaseHeader {
            n_ctx: n_ctx as usize,
            n_vocab: n_vocab as usize,
            n_chunk: n_chunk as usize,
            tokens: Vec::new(),
        };
        let expected = header.file_bytes().unwrap_or(u64::MAX);
        if expected != len {
            return Err(invalid(
                file,
                format!(
                    "{len} bytes, but n_ctx {n_ctx}, n_vocab {n_vocab} and n_chunk {n_chunk} make a file of {expected} bytes: truncated or corrupt"
                ),
            ));
        }
        let count = header.n_ctx * header.n_chunk;
        let mut raw = vec![0u8; count * 4];
        input.read_exact(&mut raw).map_err(io_err)?;
        header.tokens = raw
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        if let Some((at, &t)) = header
            .tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= header.n_vocab)
        {
            return Err(invalid(
                file,
                format!(
                    "token {} at position {at} is outside its vocabulary of {n_vocab}",
                    t as i32
                ),
            ));
        }
        Ok(BaseReader {
            input,
            file: file.to_string(),
            header,
            chunks_read: 0,
            bytes: Vec::new(),
        })
    }

    /// The next chunk's rows into `rows` (resized to rows × row_len);
    /// `Ok(false)` after the last chunk.
    pub fn next_chunk(&mut self, rows: &mut Vec<u16>) -> Result<bool, BaseError> {
        if self.chunks_read == self.header.n_chunk {
            return Ok(false);
        }
        let nv = row_len(self.header.n_vocab);
        let n = scored_per_chunk(self.header.n_ctx) * nv;
        self.bytes.resize(n * 2, 0);
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|source| BaseError::Io {
                file: self.file.clone(),
                source,
            })?;
        rows.clear();
        rows.extend(
            self.bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        for (i, row) in rows.chunks_exact(nv).enumerate() {
            let (scale, min) = row_params(row);
            if !scale.is_finite() || scale < 0.0 || !min.is_finite() {
                return Err(invalid(
                    &self.file,
                    format!(
                        "chunk {} row {i}: scale {scale} and min log-probability {min} are not a valid range",
                        self.chunks_read + 1
                    ),
                ));
            }
        }
        self.chunks_read += 1;
        Ok(true)
    }
}

fn row_params(row: &[u16]) -> (f32, f32) {
    let f = |a: u16, b: u16| {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        f32::from_le_bytes([a[0], a[1], b[0], b[1]])
    };
    (f(row[0], row[1]), f(row[2], row[3]))
}

/// The sums `--kl-divergence` keeps, as llama.cpp keeps them.
#[derive(Debug, Default, Clone)]
pub struct KlStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    same_top: usize,
    count: usize,
    /// Each position's KL divergence and Δp, for the percentiles.
    klds: Vec<f32>,
    p_diffs: Vec<f32>,
}

/// A mean and its standard error.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Estimate {
    pub value: f64,
    pub uncertainty: f64,
}

fn est(value: f64, uncertainty: f64) -> Estimate {
    Estimate { value, uncertainty }
}

impl KlStats {
    /// Compares one position's logits with its stored base row; `target`
    /// is the token that followed.
    pub fn add(&mut self, logits: &[f32], base_row: &[u16], target: usize) {
        let (max, imax, log_sum_exp) = max_and_log_sum_exp(logits);
        let (scale, min_log_prob) = row_params(base_row);
        let q = &base_row[4..4 + logits.len()];
        let nll = max + log_sum_exp - logits[target];
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        let nll_base = -(scale * f32::from(q[target]) + min_log_prob);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);
        let norm = max + log_sum_exp;
        let mut kld = 0.0f64;
        let (mut imax_base, mut base_max) = (0usize, 0.0f32);
        for (i, (&qi, &l)) in q.iter().zip(logits).enumerate() {
            let log_p_base = scale * f32::from(qi) + min_log_prob;
            if i == 0 || log_p_base > base_max {
                base_max = log_p_base;
                imax_base = i;
            }
            if log_p_base > -16.0 {
                kld += f64::from(log_p_base.exp() * (log_p_base - l + norm));
            }
        }
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.count += 1;
        self.same_top += usize::from(imax == imax_base);
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += f64::from(p_diff);
        let p_diff2 = f64::from(p_diff * p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.klds.push(kld as f32);
        self.p_diffs.push(p_diff);
    }

    pub fn count(&self) -> usize {
        self.count
    }

    fn mean(sum: f64, sum2: f64, count: usize) -> Estimate {
        if count < 1 {
            return est(0.0, 0.0);
        }
        let f = sum / count as f64;
        let var = sum2 / count as f64 - f * f;
        let df = if var > 0.0 && count > 10 {
            (var / (count - 1) as f64).sqrt()
        } else {
            0.0
        };
        est(f, df)
    }

    fn covariance(&self) -> f64 {
        if self.count < 10 {
            return 0.0;
        }
        let n = self.count as f64;
        (self.sum_nll_nll_base / n - (self.sum_nll / n) * (self.sum_nll_base / n)) / (n - 1.0)
    }

    /// The running values llama.cpp prints per chunk.
    pub fn running(&self) -> Running {
        let log_ppl = Self::mean(self.sum_nll, self.sum_nll2, self.count);
        let log_base = Self::mean(self.sum_nll_base, self.sum_nll_base2, self.count);
        let ppl = log_ppl.value.exp();
        let ratio_unc = (log_ppl.uncertainty.powi(2) + log_base.uncertainty.powi(2)
            - 2.0 * self.covariance())
        .sqrt();
        let kld = Self::mean(self.sum_kld, self.sum_kld2, self.count);
        let mse = Self::mean(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.value.sqrt();
        let top = self.same_top as f64 / self.count.max(1) as f64;
        Running {
            ppl: est(ppl, ppl * log_ppl.uncertainty),
            ln_ppl_ratio: est(log_ppl.value - log_base.value, ratio_unc),
            kld,
            rms_p_diff: est(rms, 0.5 / rms * mse.uncertainty),
            same_top: est(
                top,
                (top * (1.0 - top) / (self.count.saturating_sub(1)).max(1) as f64).sqrt(),
            ),
        }
    }

    /// The closing statistics.
    pub fn summary(&self) -> Summary {
        let run = self.running();
        let log_ppl = Self::mean(self.sum_nll, self.sum_nll2, self.count);
        let log_base = Self::mean(self.sum_nll_base, self.sum_nll_base2, self.count);
        let cov = self.covariance();
        let ppl_base = log_base.value.exp();
        let ppl_base_unc = ppl_base * log_base.uncertainty;
        let ratio = run.ln_ppl_ratio.value.exp();
        let ppl_cov = run.ppl.value * ppl_base * cov;
        let mut klds = self.klds.clone();
        let mut p_diffs = self.p_diffs.clone();
        klds.sort_by(f32::total_cmp);
        p_diffs.sort_by(f32::total_cmp);
        let kld_pct = |f: f32| f64::from(percentile(&klds, f));
        let pd_pct = |f: f32| f64::from(percentile(&p_diffs, f));
        Summary {
            count: self.count,
            ppl: run.ppl,
            ppl_base: est(ppl_base, ppl_base_unc),
            ln_ppl_correlation: cov / (log_ppl.uncertainty * log_base.uncertainty),
            ln_ppl_ratio: run.ln_ppl_ratio,
            ppl_ratio: est(ratio, ratio * run.ln_ppl_ratio.uncertainty),
            ppl_diff: est(
                run.ppl.value - ppl_base,
                (run.ppl.uncertainty.powi(2) + ppl_base_unc.powi(2) - 2.0 * ppl_cov).sqrt(),
            ),
            kld: run.kld,
            kld_percentiles: vec![
                ("max", kld_pct(1.0)),
                ("99.9", kld_pct(0.999)),
                ("99.0", kld_pct(0.99)),
                ("95.0", kld_pct(0.95)),
                ("median", f64::from(median(&klds))),
                ("10.0", kld_pct(0.1)),
                ("5.0", kld_pct(0.05)),
                ("1.0", kld_pct(0.01)),
                ("min", kld_pct(0.0)),
            ],
            p_diff: Self::mean(self.sum_p_diff, self.sum_p_diff2, self.count),
            p_diff_percentiles: vec![
                ("max", pd_pct(1.0)),
                ("99.9", pd_pct(0.999)),
                ("99.0", pd_pct(0.99)),
                ("95.0", pd_pct(0.95)),
                ("90.0", pd_pct(0.9)),
                ("75.0", pd_pct(0.75)),
                ("median", f64::from(median(&p_diffs))),
                ("25.0", pd_pct(0.25)),
                ("10.0", pd_pct(0.1)),
                ("5.0", pd_pct(0.05)),
                ("1.0", pd_pct(0.01)),
                ("0.1", pd_pct(0.001)),
                ("min", pd_pct(0.0)),
            ],
            max_abs_p_diff: f64::from(self.max_p_diff),
            rms_p_diff: run.rms_p_diff,
            same_top: run.same_top,
        }
    }
}

/// llama.cpp's interpolated percentile (in f32) of sorted values.
fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return 0.0;
    };
    if fraction <= 0.0 {
        return first;
    }
    if fraction >= 1.0 {
        return last;
    }
    let mut p = fraction * (sorted.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * sorted[ip] + p * sorted[(ip + 1).min(sorted.len() - 1)]
}

fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n.is_multiple_of(2) => 0.5 * (sorted[n / 2] + sorted[n / 2 - 1]),
        _ => sorted[n / 2],
    }
}

/// One line of the per-chunk table.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Running {
    pub ppl: Estimate,
    pub ln_ppl_ratio: Estimate,
    pub kld: Estimate,
    pub rms_p_diff: Estimate,
    pub same_top: Estimate,
}

#[derive(Debug, Clone)]
pub struct Summary {
    pub count: usize,
    pub ppl: Estimate,
    pub ppl_base: Estimate,
    pub ln_ppl_correlation: f64,
    pub ln_ppl_ratio: Estimate,
    pub ppl_ratio: Estimate,
    pub ppl_diff: Estimate,
    pub kld: Estimate,
    pub kld_percentiles: Vec<(&'static str, f64)>,
    pub p_diff: Estimate,
    pub p_diff_percentiles: Vec<(&'static str, f64)>,
    pub max_abs_p_diff: f64,
    pub rms_p_diff: Estimate,
    pub same_top: Estimate,
}

pub const TABLE_HEADER: &str = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p";

impl Running {
    /// `   1       9.8765 ±    0.1234 ...`, as llama.cpp prints a chunk.
    pub fn line(&self, chunk: usize) -> String {
        format!(
            "{chunk:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
            self.ppl.value,
            self.ppl.uncertainty,
            self.ln_ppl_ratio.value,
            self.ln_ppl_ratio.uncertainty,
            self.kld.value,
            self.kld.uncertainty,
            100.0 * self.rms_p_diff.value,
            100.0 * self.rms_p_diff.uncertainty,
            100.0 * self.same_top.value,
            100.0 * self.same_top.uncertainty,
        )
    }
}

fn label(name: &str) -> String {
    match name {
        "max" => "Maximum".to_string(),
        "min" => "Minimum".to_string(),
        "median" => "Median ".to_string(),
        p => format!("{:>4}%  ", p),
    }
}

impl Summary {
    /// The closing blocks, in llama.cpp's layout.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let e = |x: &Estimate| format!("{:10.6} ± {:10.6}", x.value, x.uncertainty);
        s += "====== Perplexity statistics ======\n";
        s += &format!("Mean PPL(Q)                   : {}\n", e(&self.ppl));
        s += &format!("Mean PPL(base)                : {}\n", e(&self.ppl_base));
        s += &format!(
            "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%\n",
            100.0 * self.ln_ppl_correlation
        );
        s += &format!(
            "Mean ln(PPL(Q)/PPL(base))     : {}\n",
            e(&self.ln_ppl_ratio)
        );
        s += &format!("Mean PPL(Q)/PPL(base)         : {}\n", e(&self.ppl_ratio));
        s += &format!("Mean PPL(Q)-PPL(base)         : {}\n", e(&self.ppl_diff));
        s += "\n====== KL divergence statistics ======\n";
        s += &format!("Mean    KLD: {}\n", e(&self.kld));
        for (name, v) in &self.kld_percentiles {
            s += &format!("{} KLD: {v:10.6}\n", label(name));
        }
        s += "\n====== Token probability statistics ======\n";
        s += &format!(
            "Mean    Δp: {:6.3} ± {:5.3} %\n",
            100.0 * self.p_diff.value,
            100.0 * self.p_diff.uncertainty
        );
        for (name, v) in &self.p_diff_percentiles {
            s += &format!("{} Δp: {:6.3}%\n", label(name), 100.0 * v);
        }
        s += &format!(
            "RMS Δp    : {:6.3} ± {:5.3} %\n",
            100.0 * self.rms_p_diff.value,
            100.0 * self.rms_p_diff.uncertainty
        );
        s += &format!(
            "Same top p: {:6.3} ± {:5.3} %\n",
            100.0 * self.same_top.value,
            100.0 * self.same_top.uncertainty
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_fixtures::Rng;

    fn logits(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = Rng::xorshift64(seed | 1);
        (0..n)
            .map(|_| (rng.next_u64() % 12_000) as f32 / 1000.0 - 6.0)
            .collect()
    }

    fn file(n_ctx: usize, n_vocab: usize, n_chunk: usize) -> Vec<u8> {
        let header = BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens: (0..n_ctx * n_chunk).map(|i| (i % n_vocab) as u32).collect(),
        };
        let mut w = BaseWriter::new(Vec::new(), &header).unwrap();
        for c in 0..n_chunk {
            for p in 0..scored_per_chunk(n_ctx) {
                w.push(&logits((c * 1000 + p) as u64, n_vocab), p % n_vocab)
                    .unwrap();
            }
        }
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len() as u64, header.file_bytes().unwrap());
        bytes
    }

    #[test]
    fn rows_hold_the_log_probabilities_within_a_quantum() {
        let l = logits(3, 101);
        let mut row = vec![0; row_len(101)];
        assert_eq!(row.len(), 106, "odd vocabularies pad to even");
        let nll = quantize_row(&l, 7, &mut row);
        assert_eq!(row[105], 0);
        let (scale, min) = row_params(&row);
        let max = l.iter().copied().fold(f32::MIN, f32::max);
        let lse = max + l.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
        for (i, &x) in l.iter().enumerate() {
            let exact = x - lse;
            if exact > max - lse - 16.0 + scale {
                let stored = scale * f32::from(row[4 + i]) + min;
                assert!((stored - exact).abs() <= scale, "token {i}");
            }
        }
        assert!((nll - f64::from(lse - l[7])).abs() < 1e-4);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
    }

    #[test]
    fn a_base_compared_with_its_own_logits_has_no_divergence() {
        let bytes = file(8, 33, 2);
        let mut r = BaseReader::new(&bytes[..], bytes.len() as u64, "b").unwrap();
        assert_eq!(
            (r.header.n_ctx, r.header.n_vocab, r.header.n_chunk),
            (8, 33, 2)
        );
        let mut rows = Vec::new();
        let mut stats = KlStats::default();
        let mut c = 0;
        while r.next_chunk(&mut rows).unwrap() {
            for (p, row) in rows.chunks_exact(row_len(33)).enumerate() {
                stats.add(&logits((c * 1000 + p) as u64, 33), row, p % 33);
            }
            c += 1;
        }
        assert_eq!(stats.count(), 6);
        let run = stats.running();
        assert!(run.kld.value.abs() < 1e-4, "{run:?}");
        assert_eq!(run.same_top.value, 1.0);
        assert!(run.ln_ppl_ratio.value.abs() < 1e-3, "{run:?}");
    }

    #[test]
    fn percentiles_interpolate_as_llama_cpp() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert_eq!(percentile(&v, 0.1), 0.4);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(median(&[1.0, 3.0]), 2.0);
    }

    /// Seeded mutations of a valid file: every one parses or is refused
    /// with an error naming the file, and none panics.
    #[test]
    fn hostile_files_are_refused_without_panicking() {
        let good = file(8, 33, 2);
        let mut rng = Rng::xorshift64(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next_u64();
        let (mut refused, mut accepted) = (0, 0);
        for _ in 0..3000 {
            let mut bytes = good.clone();
            match next() % 4 {
                0 => bytes.truncate((next() % bytes.len() as u64) as usize),
                1 => {
                    for _ in 0..1 + next() % 4 {
                        let at = (next() % bytes.len() as u64) as usize;
                        bytes[at] = next() as u8;
                    }
                }
                2 => {
                    // A header field set to an extreme.
                    let at = [8, 12, 16][(next() % 3) as usize];
                    let v = [0i32, -1, i32::MAX, i32::MIN, 1, 3, 1 << 20][(next() % 7) as usize];
                    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                _ => bytes.extend((0..1 + next() % 9).map(|_| next() as u8)),
            }
            let outcome = std::panic::catch_unwind(|| {
                let mut r = BaseReader::new(&bytes[..], bytes.len() as u64, "hostile.kld")?;
                let mut rows = Vec::new();
                while r.next_chunk(&mut rows)? {}
                Ok::<_, BaseError>(())
            });
            match outcome.expect("the reader panicked") {
                Ok(()) => accepted += 1,
                Err(e) => {
                    assert!(e.to_string().starts_with("hostile.kld: "), "{e}");
                    refused += 1;
                }
            }
        }
        assert!(
            refused > 1000 && accepted > 100,
            "{refused} refused, {accepted} accepted"
        );
        // A lying length: the reader trusts `len` for the layout but still
        // fails cleanly when the bytes run out.
        let short = &good[..good.len() - 10];
        let mut r = BaseReader::new(short, good.len() as u64, "x").unwrap();
        let mut rows = Vec::new();
        assert!(r.next_chunk(&mut rows).unwrap());
        assert!(matches!(r.next_chunk(&mut rows), Err(BaseError::Io { .. })));
    }
}
