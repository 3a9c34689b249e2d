//! Deterministic pseudo-random tensor data.

use fathom_ggml::{f32_to_bf16, f32_to_f16};
use std::io::{self, Write};
use std::ops::Range;

/// The workspace's one seeded pseudo-random generator, for fixtures, tests
/// and benches: 64 bits of state stepped by one of three published
/// generators. Each is a stream that recorded results depend on — the
/// fixtures' bytes ([`Rng::new`]), the backend conformance cases and the
/// kernels' tests ([`Rng::xorshift64_star`]), `fathom bench`'s prompts
/// ([`random_token_ids`], [`Rng::xorshift64`]) — so none may change; new
/// callers take [`Rng::new`]. Not for anything a user's output depends on
/// (the engine's sampler has its own).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    step: Step,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    SplitMix64,
    Xorshift64Star,
    Xorshift64,
}

impl Rng {
    /// splitmix64 (Steele, Lea and Flood): any seed, 0 included.
    pub const fn new(seed: u64) -> Rng {
        Rng {
            state: seed,
            step: Step::SplitMix64,
        }
    }

    /// xorshift64* (Vigna; shifts 12, 25, 27): the stream of the backend
    /// conformance cases and the kernels' tests and bench. `seed` must not
    /// be 0 (the stream would stay 0).
    pub const fn xorshift64_star(seed: u64) -> Rng {
        Rng {
            state: seed,
            step: Step::Xorshift64Star,
        }
    }

    /// xorshift64 (Marsaglia; shifts 13, 7, 17): the stream of
    /// [`random_token_ids`] and of the checkpoint and KL-divergence file
    /// fuzzers. `seed` must not be 0 (the stream would stay 0).
    pub const fn xorshift64(seed: u64) -> Rng {
        Rng {
            state: seed,
            step: Step::Xorshift64,
        }
    }

    /// Seeded from a tensor's name so its values do not depend on where it
    /// lands in a file.
    pub(crate) fn for_tensor(seed: u64, name: &str) -> Rng {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for byte in name.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        Rng::new(hash ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    pub fn next_u64(&mut self) -> u64 {
        match self.step {
            Step::SplitMix64 => {
                self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = self.state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            }
            Step::Xorshift64Star => {
                self.state ^= self.state >> 12;
                self.state ^= self.state << 25;
                self.state ^= self.state >> 27;
                self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
            }
            Step::Xorshift64 => {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.state
            }
        }
    }

    /// Uniform in [0, 1): the top 24 bits of [`next_u64`](Self::next_u64).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `range`: `start + (end - start) * unit()`.
    pub fn f32_in(&mut self, range: Range<f32>) -> f32 {
        range.start + (range.end - range.start) * self.unit()
    }

    /// Below `n` (`next_u64() % n`; 0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// A positive quantization scale in [max / 10, max).
    fn scale(&mut self, max: f32) -> f32 {
        max * (0.1 + 0.9 * self.unit())
    }
}

/// `n` deterministic pseudo-random token ids below `vocab` (xorshift64
/// from a fixed seed): the prompts `fathom bench` and `fathom generate
/// --random-prompt` measure with (llama-bench also measures on random
/// tokens), and that tests send to a server to compare with them.
pub fn random_token_ids(n: usize, vocab: u64) -> Vec<u32> {
    let mut rng = Rng::xorshift64(0x2545_f491_4f6c_dd1d);
    (0..n)
        .map(|_| (rng.next_u64() % vocab.max(1)) as u32)
        .collect()
}

/// How to fill elements of a tensor.
#[derive(Clone, Copy)]
pub(crate) enum Fill {
    F32,
    F16,
    BF16,
    Bits32,
}

const CHUNK: usize = 1 << 16;

/// Where random float weights fall unless a tensor asks for another range.
pub(crate) const WEIGHTS: Range<f32> = -0.1..0.1;

/// `count` elements uniform in `range` (float fills; `Bits32` ignores it).
pub(crate) fn write_elements(
    out: &mut impl Write,
    fill: Fill,
    count: u64,
    rng: &mut Rng,
    range: Range<f32>,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(CHUNK + 8);
    for _ in 0..count {
        let mut x = || rng.f32_in(range.clone());
        match fill {
            Fill::F32 => buf.extend_from_slice(&x().to_le_bytes()),
            Fill::F16 => buf.extend_from_slice(&f32_to_f16(x()).to_le_bytes()),
            Fill::BF16 => buf.extend_from_slice(&f32_to_bf16(x()).to_le_bytes()),
            Fill::Bits32 => buf.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes()),
        }
        if buf.len() >= CHUNK {
            out.write_all(&buf)?;
            buf.clear();
        }
    }
    out.write_all(&buf)
}

/// The shape of a quantized block, as far as random filling cares.
pub(crate) struct Block {
    pub(crate) bytes: usize,
    /// Where the f16 scale fields sit.
    pub(crate) scale_offsets: &'static [usize],
    pub(crate) scale_max: f32,
}

/// Quantized blocks: random payload bytes, with the f16 scale fields set to
/// small positive values. A trailing partial block (only in a deliberately
/// malformed tensor) gets random bytes.
pub(crate) fn write_blocks(
    out: &mut impl Write,
    len: u64,
    shape: &Block,
    rng: &mut Rng,
) -> io::Result<()> {
    let mut block = vec![0u8; shape.bytes];
    let mut left = len;
    while left > 0 {
        let n = shape.bytes.min(left as usize);
        for chunk in block.chunks_mut(8) {
            let bytes = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        if n == shape.bytes {
            for &at in shape.scale_offsets {
                let scale = f32_to_f16(rng.scale(shape.scale_max));
                block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
            }
        }
        out.write_all(&block[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// MXFP4 blocks (17 bytes: an e8m0 scale, 16 bytes of e2m1 nibbles):
/// random nibbles under a scale of 2^-8 or 2^-7, so values reach 0.047
/// or 0.094 (12 × the scale), about the [-0.1, 0.1) of the other random
/// weights. A trailing partial block gets random bytes.
pub(crate) fn write_mxfp4_blocks(out: &mut impl Write, len: u64, rng: &mut Rng) -> io::Result<()> {
    const BYTES: u64 = 17;
    let mut buf = Vec::with_capacity(CHUNK + BYTES as usize);
    let mut left = len;
    while left > 0 {
        let n = BYTES.min(left);
        let mut block = [0u8; BYTES as usize];
        for chunk in block.chunks_mut(8) {
            let bytes = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        if n == BYTES {
            block[0] = 120 + (block[0] & 1);
        }
        buf.extend_from_slice(&block[..n as usize]);
        if buf.len() >= CHUNK {
            out.write_all(&buf)?;
            buf.clear();
        }
        left -= n;
    }
    out.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_stay_in_range_and_repeat() {
        let mut a = Rng::for_tensor(7, "w");
        let mut b = Rng::for_tensor(7, "w");
        for _ in 0..10_000 {
            let x = a.f32_in(WEIGHTS);
            assert!(WEIGHTS.contains(&x));
            assert_eq!(x, b.f32_in(WEIGHTS));
        }
        assert_ne!(
            Rng::for_tensor(7, "w").next_u64(),
            Rng::for_tensor(8, "w").next_u64()
        );
    }

    /// Recorded results (fixture bytes, the conformance cases, bench
    /// prompts) depend on each stream: its first draws are pinned.
    #[test]
    fn streams_never_change() {
        let draws = |mut rng: Rng| [rng.next_u64(), rng.next_u64(), rng.next_u64()];
        assert_eq!(
            draws(Rng::new(42)),
            [
                0xbdd7_3226_2feb_6e95,
                0x28ef_e333_b266_f103,
                0x4752_6757_130f_9f52
            ]
        );
        assert_eq!(
            draws(Rng::xorshift64_star(42)),
            [
                0x56ce_4ab7_719b_a3a0,
                0xc841_eb53_ebbb_2dda,
                0xca46_6be0_c998_0276
            ]
        );
        assert_eq!(
            draws(Rng::xorshift64(42)),
            [
                0x0000_000a_9551_4aaa,
                0xa00a_aafd_f802_02bf,
                0x8b13_399c_d1d1_497a
            ]
        );
        let mut rng = Rng::new(42);
        let unit = (rng.clone().next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        assert_eq!(rng.clone().unit(), unit);
        assert_eq!(rng.f32_in(-1.0..1.0), unit * 2.0 - 1.0);
    }
}
