//! Deterministic pseudo-random tensor data.

use fathom_ggml::{f32_to_bf16, f32_to_f16};
use std::io::{self, Write};

/// splitmix64: tiny, fast, and good enough for weights nobody trains.
pub(crate) struct Rng(u64);

impl Rng {
    /// Seeded from the tensor's name so its values do not depend on where it
    /// lands in a file.
    pub(crate) fn for_tensor(seed: u64, name: &str) -> Rng {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for byte in name.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(hash ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    pub(crate) fn weight(&mut self) -> f32 {
        self.unit() * 0.2 - 0.1
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
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab.max(1)) as u32
        })
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

pub(crate) fn write_elements(
    out: &mut impl Write,
    fill: Fill,
    count: u64,
    rng: &mut Rng,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(CHUNK + 8);
    for _ in 0..count {
        match fill {
            Fill::F32 => buf.extend_from_slice(&rng.weight().to_le_bytes()),
            Fill::F16 => buf.extend_from_slice(&f32_to_f16(rng.weight()).to_le_bytes()),
            Fill::BF16 => buf.extend_from_slice(&f32_to_bf16(rng.weight()).to_le_bytes()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_stay_in_range_and_repeat() {
        let mut a = Rng::for_tensor(7, "w");
        let mut b = Rng::for_tensor(7, "w");
        for _ in 0..10_000 {
            let x = a.weight();
            assert!((-0.1..0.1).contains(&x));
            assert_eq!(x, b.weight());
        }
        assert_ne!(
            Rng::for_tensor(7, "w").next_u64(),
            Rng::for_tensor(8, "w").next_u64()
        );
    }
}
