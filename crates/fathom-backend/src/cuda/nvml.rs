//! NVML, loaded by hand: a GPU's name and memory without creating a CUDA
//! context (milliseconds, where a context costs a third of a second and
//! half a GiB), and the device memory one process uses — how fathom
//! checks its own device peak against the plan.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use libloading::Library;

type Device = *mut c_void;
type Return = c_int;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlProcessInfo_t` (v2 layout, what the `_v3` query fills).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used: c_ulonglong,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

const _: () = assert!(std::mem::size_of::<ProcessInfo>() == 24);

/// A GPU's name and memory as NVML reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMemory {
    pub name: String,
    pub free: u64,
    pub total: u64,
}

/// An initialized NVML (shut down on drop).
pub struct Nvml {
    lib: Library,
}

const NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];
/// Processes one query reports at most.
const MAX_PROCESSES: usize = 64;

impl Nvml {
    /// NVML from the driver, or `None` where there is no NVIDIA driver.
    pub fn open() -> Option<Nvml> {
        // SAFETY: loading libnvidia-ml runs only its own initializers.
        let lib = NAMES
            .iter()
            .find_map(|n| unsafe { Library::new(*n) }.ok())?;
        let nvml = Nvml { lib };
        // SAFETY: nvmlInit_v2 takes no arguments.
        let ok = unsafe {
            nvml.symbol::<unsafe extern "C" fn() -> Return>(b"nvmlInit_v2\0")
                .is_some_and(|init| init() == 0)
        };
        ok.then_some(nvml)
    }

    /// # Safety
    /// `T` is the symbol's C signature.
    unsafe fn symbol<T: Copy>(&self, name: &[u8]) -> Option<T> {
        // SAFETY: the caller names the symbol's true type.
        unsafe { self.lib.get::<T>(name).ok().map(|s| *s) }
    }

    fn device(&self, ordinal: u32) -> Option<Device> {
        // SAFETY: the signature of nvmlDeviceGetHandleByIndex_v2; `dev` is
        // written by the call.
        unsafe {
            let get = self.symbol::<unsafe extern "C" fn(c_uint, *mut Device) -> Return>(
                b"nvmlDeviceGetHandleByIndex_v2\0",
            )?;
            let mut dev: Device = std::ptr::null_mut();
            (get(ordinal, &mut dev) == 0).then_some(dev)
        }
    }

    /// Name, free and total memory of GPU `ordinal`.
    pub fn memory(&self, ordinal: u32) -> Option<GpuMemory> {
        let dev = self.device(ordinal)?;
        // SAFETY: the signatures of nvmlDeviceGetMemoryInfo and
        // nvmlDeviceGetName; the out-parameters are sized as NVML expects
        // (a name of at most 96 bytes, NUL-terminated).
        unsafe {
            let info = self.symbol::<unsafe extern "C" fn(Device, *mut Memory) -> Return>(
                b"nvmlDeviceGetMemoryInfo\0",
            )?;
            let name_of = self
                .symbol::<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Return>(
                    b"nvmlDeviceGetName\0",
                )?;
            let mut mem = Memory::default();
            if info(dev, &mut mem) != 0 {
                return None;
            }
            let mut name = [0 as c_char; 96];
            let name = if name_of(dev, name.as_mut_ptr(), name.len() as c_uint) == 0 {
                std::ffi::CStr::from_ptr(name.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            } else {
                "NVIDIA GPU".to_string()
            };
            Some(GpuMemory {
                name,
                free: mem.free,
                total: mem.total,
            })
        }
    }

    /// Device memory process `pid` uses on GPU `ordinal` (its context
    /// included), or `None` when NVML does not list it.
    pub fn process_used(&self, ordinal: u32, pid: u32) -> Option<u64> {
        let dev = self.device(ordinal)?;
        // SAFETY: the signature of nvmlDeviceGetComputeRunningProcesses_v3;
        // `count` holds the capacity of `infos` going in.
        unsafe {
            let query = self.symbol::<unsafe extern "C" fn(
                Device,
                *mut c_uint,
                *mut ProcessInfo,
            ) -> Return>(
                b"nvmlDeviceGetComputeRunningProcesses_v3\0"
            )?;
            let mut infos = [ProcessInfo::default(); MAX_PROCESSES];
            let mut count = MAX_PROCESSES as c_uint;
            if query(dev, &mut count, infos.as_mut_ptr()) != 0 {
                return None;
            }
            infos[..(count as usize).min(MAX_PROCESSES)]
                .iter()
                .find(|p| p.pid == pid)
                .map(|p| p.used)
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: nvmlShutdown pairs the successful nvmlInit_v2 of `open`.
        unsafe {
            if let Some(shutdown) =
                self.symbol::<unsafe extern "C" fn() -> Return>(b"nvmlShutdown\0")
            {
                shutdown();
            }
        }
    }
}
