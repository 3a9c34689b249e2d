//! Every environment variable fathom reads, with its default: the single
//! list that `docs/environment-variables.md` is checked against.

/// One environment variable.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    pub name: &'static str,
    /// The default as documented (what applies when the variable is unset).
    pub default: &'static str,
}

pub const HEADROOM_FACTOR_VAR: &str = "FATHOM_HEADROOM_FACTOR";
pub const DEFAULT_HEADROOM_FACTOR: f64 = 1.0;

pub const ENV_VARS: &[EnvVar] = &[
    EnvVar {
        name: crate::available::MEMORY_LIMIT_VAR,
        default: "unset",
    },
    EnvVar {
        name: HEADROOM_FACTOR_VAR,
        default: "1.0",
    },
    EnvVar {
        name: crate::rocm::ROCM_INFLIGHT_VAR,
        default: "1024",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_defaults_are_the_code_defaults() {
        let default_of = |name: &str| ENV_VARS.iter().find(|v| v.name == name).unwrap().default;
        assert_eq!(
            default_of(HEADROOM_FACTOR_VAR).parse::<f64>().unwrap(),
            DEFAULT_HEADROOM_FACTOR
        );
        assert_eq!(
            default_of(crate::rocm::ROCM_INFLIGHT_VAR)
                .parse::<u64>()
                .unwrap(),
            crate::rocm::ROCM_INFLIGHT_DEFAULT_MB
        );
        assert_eq!(crate::rocm::rocm_inflight_reserve_bytes(None), 1024 << 20);
    }
}
