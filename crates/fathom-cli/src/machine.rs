//! Reads what the plan needs from this machine: the memory sources under
//! `/proc` and `/sys`, free GPU memory, the environment. The plan room
//! stays pure; this is where its inputs come from.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use fathom_backend::cuda::nvml::{GpuMemory, Nvml};
use fathom_plan::{available, Available, Device, MemorySources};

/// Files and command output backing [`MemorySources`].
#[derive(Default)]
struct Found {
    cgroup_v2_max: Option<String>,
    cgroup_v1_limit: Option<String>,
    meminfo: Option<String>,
    device_free: Option<u64>,
}

/// The memory fathom may plan for on `device`, and where that figure came from.
/// Memory to plan one device against; for CUDA, the free memory of the
/// tightest of GPUs `0 .. devices` (each of a tensor-parallel group holds
/// the same share).
pub fn available_memory(device: Device, flag: Option<&str>, devices: u64) -> Result<Available> {
    let env = std::env::var(available::MEMORY_LIMIT_VAR).ok();
    resolve(device, flag, env.as_deref(), devices)
}

/// Host memory for a GPU plan's host budget: the cgroup limit, else
/// `MemAvailable` (`--memory` and FATHOM_MEMORY_LIMIT size the device).
pub fn host_memory() -> Result<Available> {
    resolve(Device::Cpu, None, None, 1)
}

fn resolve(
    device: Device,
    flag: Option<&str>,
    env: Option<&str>,
    devices: u64,
) -> Result<Available> {
    let mut found = Found::default();
    if device == Device::Cuda {
        found.device_free = cuda_free_bytes(devices);
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    found.cgroup_v2_max = cgroup_file(&cgroup, CgroupVersion::V2);
    found.cgroup_v1_limit = cgroup_file(&cgroup, CgroupVersion::V1);
    found.meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let sources = MemorySources {
        flag,
        env,
        cgroup_v2_max: found.cgroup_v2_max.as_deref(),
        cgroup_v1_limit: found.cgroup_v1_limit.as_deref(),
        meminfo: found.meminfo.as_deref(),
        device_free: found.device_free.map(|b| (b, "free CUDA memory (NVML)")),
    };
    let found_available = available::resolve(&sources).context("reading available memory")?;
    let user_capped = [Some("--memory"), Some(available::MEMORY_LIMIT_VAR)]
        .contains(&Some(found_available.source.as_str()));
    if device == Device::Cuda && found.device_free.is_none() && !user_capped && devices > 1 {
        bail!(
            "could not read the free memory of CUDA devices 0 to {} for --tensor-parallel {devices} \
             (NVML lists fewer GPUs, or none): pass --memory SIZE (per device) to plan for GPUs of \
             that size",
            devices - 1
        );
    }
    if device == Device::Cuda && found.device_free.is_none() && !user_capped {
        bail!(
            "could not read the free memory of a CUDA device (no NVIDIA driver or no GPU): \
             pass --memory SIZE (or set {}) to plan for a GPU of that size",
            available::MEMORY_LIMIT_VAR
        );
    }
    Ok(found_available)
}

enum CgroupVersion {
    V1,
    V2,
}

/// Contents of this process's cgroup memory limit file, trying the
/// process's own cgroup first and the hierarchy root after.
fn cgroup_file(proc_self_cgroup: &str, version: CgroupVersion) -> Option<String> {
    let (root, file) = match version {
        CgroupVersion::V2 => ("/sys/fs/cgroup", "memory.max"),
        CgroupVersion::V1 => ("/sys/fs/cgroup/memory", "memory.limit_in_bytes"),
    };
    let own = proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = match version {
            CgroupVersion::V2 => controllers.is_empty(),
            CgroupVersion::V1 => controllers.split(',').any(|c| c == "memory"),
        };
        ours.then(|| {
            PathBuf::from(root)
                .join(path.trim_start_matches('/'))
                .join(file)
        })
    });
    own.into_iter()
        .chain([Path::new(root).join(file)])
        .find_map(|p| std::fs::read_to_string(p).ok())
}

/// NVML, opened once a process: `None` without an NVIDIA driver. The
/// device watch and the server's `/metrics` read it live; planning reads
/// [`gpus`].
pub fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(Nvml::open).as_ref()
}

/// The GPUs NVML lists and their memory, read once a process, so that
/// `--device auto` and every plan of a command see the same figures.
pub fn gpus() -> &'static [GpuMemory] {
    static GPUS: OnceLock<Vec<GpuMemory>> = OnceLock::new();
    GPUS.get_or_init(|| {
        nvml().map_or_else(Vec::new, |n| (0..64).map_while(|d| n.memory(d)).collect())
    })
}

/// The least free memory of GPUs `0 .. devices`; `None` when one of them
/// is missing.
fn cuda_free_bytes(devices: u64) -> Option<u64> {
    let wanted = gpus().get(..devices.max(1) as usize)?;
    wanted.iter().map(|g| g.free).min()
}

/// Worker threads when `-t` is not given: one per core.
pub fn default_threads() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// The raw bytes of a variable, so that non-UTF-8 values reach the parsers
/// that have rules for them.
pub fn env_bytes(name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    std::env::var_os(name).map(OsStringExt::into_vec)
}

/// A variable as text; a non-UTF-8 value is an error naming it.
pub fn env_text(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{name} is not valid UTF-8"),
    }
}
