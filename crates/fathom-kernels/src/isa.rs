//! Which instruction set the kernels use: the best this CPU runs, or the
//! one `FATHOM_ISA` forces, decided once per process.

use std::fmt;
use std::sync::OnceLock;

/// The variable that forces a kernel family (docs/environment-variables.md).
pub const ISA_VAR: &str = "FATHOM_ISA";

/// The variables the kernels read, with their defaults.
pub const ENV_VARS: &[(&str, &str)] = &[(ISA_VAR, "auto")];

/// A kernel family of this architecture. Each level implies the ones
/// before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust; the reference the SIMD paths are tested against.
    Portable,
    /// AVX2 + FMA + F16C: integer dots through `vpmaddubsw`.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The above plus AVX-512 F/BW/VL/VNNI: integer dots through
    /// `vpdpbusd`/`vpdpwssd` on 256-bit registers (Zen 4 runs 512-bit ones
    /// as two halves, so wider vectors would only add shuffles) and 32
    /// vector registers for larger tiles.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// aarch64's baseline NEON: integer dots through `smull` + `sadalp`.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

/// The values `FATHOM_ISA` accepts on this architecture.
#[cfg(target_arch = "x86_64")]
const EXPECTED: &str = "auto, portable, avx2 or avx512";
#[cfg(target_arch = "aarch64")]
const EXPECTED: &str = "auto, portable or neon";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const EXPECTED: &str = "auto or portable";

/// `FATHOM_ISA` names a kernel family this build or CPU cannot run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IsaError {
    /// Not one of the accepted names.
    Unknown(String),
    /// A family this CPU lacks the instructions for.
    Unsupported {
        requested: &'static str,
        best: &'static str,
    },
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::Unknown(value) => write!(
                f,
                "{ISA_VAR}={value:?}: expected {EXPECTED} (empty or unset means auto)"
            ),
            IsaError::Unsupported { requested, best } => write!(
                f,
                "{ISA_VAR}={requested}: this CPU does not run the {requested} kernels \
                 (the best it runs is {best}; {})",
                match *requested {
                    "avx2" => "they need AVX2, FMA and F16C",
                    "neon" => "they need NEON",
                    _ => "they need AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI",
                }
            ),
        }
    }
}

impl std::error::Error for IsaError {}

static SELECTED: OnceLock<Result<Isa, IsaError>> = OnceLock::new();

impl Isa {
    /// The kernels in use: `FATHOM_ISA`'s family when set and valid, else
    /// the best this CPU runs (an invalid value is reported by
    /// [`selected_isa`], which every CPU backend calls when it starts).
    /// Cached after the first call, so a hot path pays one load.
    #[inline]
    pub(crate) fn detected() -> Isa {
        match SELECTED.get_or_init(from_env) {
            Ok(isa) => *isa,
            Err(_) => best(),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512-vnni",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
        }
    }

    /// Every level this CPU can run (whatever `FATHOM_ISA` says), for
    /// tests that compare them.
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let best = best();
        [
            Isa::Portable,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon,
        ]
        .into_iter()
        .filter(|&i| i as u8 <= best as u8)
        .collect()
    }
}

fn from_env() -> Result<Isa, IsaError> {
    let value = std::env::var(ISA_VAR).unwrap_or_default();
    parse(&value, best())
}

/// `FATHOM_ISA`'s value on a CPU whose best family is `best`: case and
/// surrounding whitespace are ignored; empty and `auto` mean `best`;
/// `avx512-vnni` (what [`isa_name`] prints) is accepted for `avx512`.
/// Another architecture's families are unknown names here.
fn parse(value: &str, best: Isa) -> Result<Isa, IsaError> {
    let wanted = match value.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => return Ok(best),
        "portable" => Isa::Portable,
        #[cfg(target_arch = "x86_64")]
        "avx2" => Isa::Avx2,
        #[cfg(target_arch = "x86_64")]
        "avx512" | "avx512-vnni" => Isa::Avx512,
        #[cfg(target_arch = "aarch64")]
        "neon" => Isa::Neon,
        _ => return Err(IsaError::Unknown(value.to_string())),
    };
    if wanted as u8 > best as u8 {
        return Err(IsaError::Unsupported {
            requested: match wanted {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => "avx2",
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => "avx512",
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => "neon",
                Isa::Portable => unreachable!("every CPU runs the portable kernels"),
            },
            best: best.name(),
        });
    }
    Ok(wanted)
}

/// The best level this CPU runs.
fn best() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(detect)
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

/// NEON is part of the aarch64 baseline.
#[cfg(target_arch = "aarch64")]
fn detect() -> Isa {
    Isa::Neon
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Isa {
    Isa::Portable
}

/// The kernel family in use ("portable", "avx2", "avx512-vnni" or
/// "neon"), for
/// benchmark and diagnostic output.
pub fn isa_name() -> &'static str {
    Isa::detected().name()
}

/// The kernel family in use, or why `FATHOM_ISA` cannot be honoured.
pub fn selected_isa() -> Result<&'static str, IsaError> {
    SELECTED.get_or_init(from_env).clone().map(|isa| isa.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn forced_families_parse_and_are_bounded_by_the_cpu() {
        for (value, want) in [
            ("", Isa::Avx512),
            ("auto", Isa::Avx512),
            (" AVX2 ", Isa::Avx2),
            ("portable", Isa::Portable),
            ("avx512", Isa::Avx512),
            ("avx512-vnni", Isa::Avx512),
        ] {
            assert_eq!(parse(value, Isa::Avx512), Ok(want), "{value:?}");
        }
        assert_eq!(parse("auto", Isa::Avx2), Ok(Isa::Avx2));
        assert_eq!(parse("portable", Isa::Avx2), Ok(Isa::Portable));
        let err = parse("avx512", Isa::Avx2).unwrap_err();
        assert_eq!(
            err,
            IsaError::Unsupported {
                requested: "avx512",
                best: "avx2"
            }
        );
        assert!(err.to_string().contains("best it runs is avx2"), "{err}");
        assert!(parse("avx2", Isa::Portable).is_err());
        let err = parse("neon", Isa::Avx512).unwrap_err();
        assert_eq!(err, IsaError::Unknown("neon".into()));
        assert!(
            err.to_string()
                .contains("expected auto, portable, avx2 or avx512"),
            "{err}"
        );
    }

    #[test]
    #[cfg(target_arch = "aarch64")]
    fn forced_families_parse_and_are_bounded_by_the_cpu() {
        for (value, want) in [
            ("", Isa::Neon),
            ("auto", Isa::Neon),
            (" NEON ", Isa::Neon),
            ("portable", Isa::Portable),
        ] {
            assert_eq!(parse(value, Isa::Neon), Ok(want), "{value:?}");
        }
        assert_eq!(detect(), Isa::Neon);
        let err = parse("neon", Isa::Portable).unwrap_err();
        assert_eq!(
            err,
            IsaError::Unsupported {
                requested: "neon",
                best: "portable"
            }
        );
        let err = parse("avx2", Isa::Neon).unwrap_err();
        assert_eq!(err, IsaError::Unknown("avx2".into()));
        assert!(
            err.to_string().contains("expected auto, portable or neon"),
            "{err}"
        );
    }
}
