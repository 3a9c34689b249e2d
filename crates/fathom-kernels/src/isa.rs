//! Which instruction set the kernels use, detected once per process.

use std::sync::atomic::{AtomicU8, Ordering};

/// A kernel family. Each level implies the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust; the reference the SIMD paths are tested against.
    Portable,
    /// AVX2 + FMA + F16C: integer dots through `vpmaddubsw`.
    Avx2,
    /// The above plus AVX-512 F/BW/VL/VNNI: integer dots through
    /// `vpdpbusd`/`vpdpwssd` on 256-bit registers (Zen 4 runs 512-bit ones
    /// as two halves, so wider vectors would only add shuffles) and 32
    /// vector registers for larger tiles.
    Avx512,
}

const UNKNOWN: u8 = u8::MAX;
static DETECTED: AtomicU8 = AtomicU8::new(UNKNOWN);

impl Isa {
    /// The best level this CPU runs, cached after the first call so a hot
    /// path pays one relaxed load.
    #[inline]
    pub(crate) fn detected() -> Isa {
        match DETECTED.load(Ordering::Relaxed) {
            0 => Isa::Portable,
            1 => Isa::Avx2,
            2 => Isa::Avx512,
            _ => {
                let isa = detect();
                DETECTED.store(isa as u8, Ordering::Relaxed);
                isa
            }
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512-vnni",
        }
    }

    /// Every level this CPU can run, for tests that compare them.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let best = Isa::detected();
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&i| i as u8 <= best as u8)
            .collect()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    match (avx2, avx512) {
        (true, true) => Isa::Avx512,
        (true, false) => Isa::Avx2,
        _ => Isa::Portable,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Portable
}

/// The kernel family in use ("portable", "avx2" or "avx512-vnni"), for
/// benchmark and diagnostic output.
pub fn isa_name() -> &'static str {
    Isa::detected().name()
}
