//! How much memory the plan may use, and where that figure came from.
//!
//! Pure: the caller reads the flag, the environment and the files under
//! `/proc` and `/sys` and passes their contents in, so every rule here is
//! tested without touching the machine.

use serde::Serialize;

use crate::{size::parse_size, PlanError};

/// The variable that caps the memory fathom may plan for.
pub const MEMORY_LIMIT_VAR: &str = "FATHOM_MEMORY_LIMIT";

/// Available memory and its source, e.g. `--memory`, `cgroup v2 memory.max`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Available {
    pub bytes: u64,
    pub source: String,
}

/// What the caller found on the machine; `None` where a source is absent.
#[derive(Debug, Clone, Default)]
pub struct MemorySources<'a> {
    /// The `--memory` flag.
    pub flag: Option<&'a str>,
    /// `FATHOM_MEMORY_LIMIT`.
    pub env: Option<&'a str>,
    /// Contents of the process's cgroup v2 `memory.max`.
    pub cgroup_v2_max: Option<&'a str>,
    /// Contents of the process's cgroup v1 `memory.limit_in_bytes`.
    pub cgroup_v1_limit: Option<&'a str>,
    /// Contents of `/proc/meminfo`.
    pub meminfo: Option<&'a str>,
    /// Free device memory for a GPU device (e.g. from the driver).
    pub device_free: Option<(u64, &'a str)>,
}

/// cgroup v1 reports "no limit" as a page-aligned value near 2^63.
const CGROUP_V1_UNLIMITED: u64 = 1 << 62;

/// First that applies: the flag, the variable, the device's free memory
/// (GPU devices), the cgroup limit (v2, then v1), `MemAvailable`.
pub fn resolve(sources: &MemorySources) -> Result<Available, PlanError> {
    let found = |bytes, source: &str| Available {
        bytes,
        source: source.to_string(),
    };
    if let Some(flag) = sources.flag {
        if let Some(bytes) = parse_size(flag, "--memory")? {
            return Ok(found(bytes, "--memory"));
        }
    }
    if let Some(env) = sources.env {
        if let Some(bytes) = parse_size(env, MEMORY_LIMIT_VAR)? {
            return Ok(found(bytes, MEMORY_LIMIT_VAR));
        }
    }
    if let Some((bytes, source)) = sources.device_free {
        return Ok(found(bytes, source));
    }
    if let Some(bytes) = sources
        .cgroup_v2_max
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        return Ok(found(bytes, "cgroup v2 memory.max"));
    }
    if let Some(bytes) = sources
        .cgroup_v1_limit
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&b| b < CGROUP_V1_UNLIMITED)
    {
        return Ok(found(bytes, "cgroup v1 memory.limit_in_bytes"));
    }
    if let Some(kib) = sources.meminfo.and_then(mem_available_kib) {
        return Ok(found(
            kib.saturating_mul(1024),
            "MemAvailable in /proc/meminfo",
        ));
    }
    Err(PlanError::NoAvailableMemory)
}

fn mem_available_kib(meminfo: &str) -> Option<u64> {
    proc_kib(meminfo, "MemAvailable")
}

/// The value of a `Key:   1234 kB` line, as `/proc/meminfo` and
/// `/proc/<pid>/status` (`VmRSS`, `VmHWM`) write them, in KiB.
pub fn proc_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str =
        "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\n";

    fn resolve_ok(sources: MemorySources) -> (u64, String) {
        let a = resolve(&sources).unwrap();
        (a.bytes, a.source)
    }

    #[test]
    fn first_source_that_applies_wins() {
        let all = MemorySources {
            flag: Some("1G"),
            env: Some("2G"),
            cgroup_v2_max: Some("3221225472\n"),
            cgroup_v1_limit: Some("4294967296\n"),
            meminfo: Some(MEMINFO),
            device_free: None,
        };
        assert_eq!(resolve_ok(all.clone()), (1 << 30, "--memory".into()));
        let no_flag = MemorySources {
            flag: None,
            ..all.clone()
        };
        assert_eq!(
            resolve_ok(no_flag.clone()),
            (2 << 30, MEMORY_LIMIT_VAR.into())
        );
        let unset_env = MemorySources {
            env: Some("none"),
            ..no_flag.clone()
        };
        assert_eq!(
            resolve_ok(unset_env.clone()),
            (3 << 30, "cgroup v2 memory.max".into())
        );
        let v2_max = MemorySources {
            cgroup_v2_max: Some("max\n"),
            ..unset_env.clone()
        };
        assert_eq!(
            resolve_ok(v2_max.clone()),
            (4 << 30, "cgroup v1 memory.limit_in_bytes".into())
        );
        let v1_unlimited = MemorySources {
            cgroup_v1_limit: Some("9223372036854771712"),
            ..v2_max
        };
        assert_eq!(
            resolve_ok(v1_unlimited),
            (20_000_000 * 1024, "MemAvailable in /proc/meminfo".into())
        );
    }

    #[test]
    fn zero_and_empty_mean_unset() {
        let sources = MemorySources {
            flag: Some("0"),
            env: Some(""),
            meminfo: Some(MEMINFO),
            ..Default::default()
        };
        assert_eq!(resolve_ok(sources).1, "MemAvailable in /proc/meminfo");
    }

    #[test]
    fn device_free_memory_comes_after_the_user_caps() {
        let sources = MemorySources {
            device_free: Some((80 << 30, "nvidia-smi memory.free")),
            meminfo: Some(MEMINFO),
            ..Default::default()
        };
        assert_eq!(
            resolve_ok(sources.clone()),
            (80 << 30, "nvidia-smi memory.free".into())
        );
        let capped = MemorySources {
            env: Some("8G"),
            ..sources
        };
        assert_eq!(resolve_ok(capped).1, MEMORY_LIMIT_VAR);
    }

    #[test]
    fn bad_values_are_errors_naming_the_source() {
        let err = resolve(&MemorySources {
            env: Some("lots"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains(MEMORY_LIMIT_VAR), "{err}");
        let err = resolve(&MemorySources {
            flag: Some("12Q"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--memory"), "{err}");
        assert!(matches!(
            resolve(&MemorySources::default()),
            Err(PlanError::NoAvailableMemory)
        ));
    }
}
