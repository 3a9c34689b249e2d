//! NCCL, loaded by hand as [`super::blas`] loads cuBLAS: the entry points
//! tensor parallelism needs (a communicator per GPU of one process, a sum
//! all-reduce of f32, destroy), from a library found where we say, so a
//! missing NCCL is a [`BackendError`] naming every place searched.
//!
//! Searched in order: `FATHOM_NCCL_LIB_DIR`; the `nvidia/nccl/lib` folder of
//! the `nvidia-nccl-cu13` / `-cu12` pip wheels in the active virtualenv
//! (`VIRTUAL_ENV`), the user's and the system's Python site-packages; the
//! CUDA toolkit's folders; then the dynamic loader's own search.
//!
//! NVLink multicast (NVLS) stays off: [`Nccl::load`] sets
//! `NCCL_NVLS_ENABLE=0` before NCCL can read its environment, unless the
//! variable is already set.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::Library;

use crate::BackendError;

/// The variable naming a folder searched first for `libnccl.so.2`.
pub const LIB_DIR_VAR: &str = "FATHOM_NCCL_LIB_DIR";
/// NCCL's switch for NVLink multicast, set to 0 before NCCL starts.
pub const NVLS_VAR: &str = "NCCL_NVLS_ENABLE";

const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// An opaque `ncclComm_t`.
type Comm = *mut c_void;
type Status = c_int;
/// `ncclFloat32`, `ncclSum`, `ncclSuccess`.
const FLOAT32: c_int = 7;
const SUM: c_int = 0;
const SUCCESS: Status = 0;

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> Status;
type CommInitAllFn = unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Status;
type CommDestroyFn = unsafe extern "C" fn(Comm) -> Status;
type GroupFn = unsafe extern "C" fn() -> Status;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> Status;
type ErrorStringFn = unsafe extern "C" fn(Status) -> *const c_char;

/// The loaded library and its entry points.
pub struct Nccl {
    get_version: GetVersionFn,
    comm_init_all: CommInitAllFn,
    comm_destroy: CommDestroyFn,
    group_start: GroupFn,
    group_end: GroupFn,
    all_reduce: AllReduceFn,
    error_string: ErrorStringFn,
    /// Where it was found, for messages.
    pub path: String,
    // Kept last so the entry points above never outlive the library.
    _lib: Library,
}

/// `python3.*` folders under `lib`, each with its site- and dist-packages.
fn wheel_dirs(lib: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return;
    };
    let mut pythons: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort();
    for p in pythons {
        for packages in ["site-packages", "dist-packages"] {
            out.push(p.join(packages).join("nvidia/nccl/lib"));
        }
    }
}

/// The folders searched, in order.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os(LIB_DIR_VAR).filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d));
    }
    let mut libs = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        libs.push(PathBuf::from(venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        libs.push(PathBuf::from(home).join(".local/lib"));
    }
    libs.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    for lib in &libs {
        wheel_dirs(lib, &mut dirs);
    }
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// One communicator per device of a process, destroyed on drop.
pub struct Communicators {
    nccl: Arc<Nccl>,
    comms: Vec<Comm>,
}

// SAFETY: a communicator may be used from any thread, one call at a time
// (`&self` calls go through the owner's exclusive use of the group).
unsafe impl Send for Communicators {}

impl Nccl {
    /// Opens libnccl, after turning NVLink multicast off.
    pub fn load() -> Result<Nccl, BackendError> {
        if std::env::var_os(NVLS_VAR).is_none() {
            // NCCL reads its environment when a communicator is first
            // created, so this must come before any of its calls; the
            // process has not loaded NCCL yet.
            std::env::set_var(NVLS_VAR, "0");
        }
        let dirs = search_dirs();
        let mut candidates: Vec<String> = Vec::new();
        for d in &dirs {
            for name in NAMES {
                let path = d.join(name);
                if path.exists() {
                    candidates.push(path.display().to_string());
                }
            }
        }
        candidates.extend(NAMES.map(String::from));
        let mut failures = Vec::new();
        for c in &candidates {
            // SAFETY: loading NCCL runs its initializers, which only set up
            // the library's own state; nothing is called before the
            // symbols are resolved.
            match unsafe { Library::new(c) } {
                Ok(lib) => return Self::resolve(lib, c.clone()),
                Err(e) => failures.push(format!("{c}: {e}")),
            }
        }
        let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        Err(BackendError::Device {
            backend: "cuda",
            message: format!(
                "NCCL (libnccl.so.2) not found: searched {}, then the dynamic loader's search ({}). \
                 Set {LIB_DIR_VAR} to the folder holding libnccl.so.2 (the nvidia-nccl-cu13 pip \
                 wheel puts it in site-packages/nvidia/nccl/lib)",
                searched.join(", "),
                failures.join("; ")
            ),
        })
    }

    fn resolve(lib: Library, path: String) -> Result<Nccl, BackendError> {
        fn sym<T: Copy>(lib: &Library, name: &str, path: &str) -> Result<T, BackendError> {
            // SAFETY: each type above is the C signature nccl.h declares
            // for the symbol of that name (stable since NCCL 2.0).
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| BackendError::Device {
                    backend: "cuda",
                    message: format!("{path} lacks {name}: {e}"),
                })
        }
        Ok(Nccl {
            get_version: sym(&lib, "ncclGetVersion", &path)?,
            comm_init_all: sym(&lib, "ncclCommInitAll", &path)?,
            comm_destroy: sym(&lib, "ncclCommDestroy", &path)?,
            group_start: sym(&lib, "ncclGroupStart", &path)?,
            group_end: sym(&lib, "ncclGroupEnd", &path)?,
            all_reduce: sym(&lib, "ncclAllReduce", &path)?,
            error_string: sym(&lib, "ncclGetErrorString", &path)?,
            path,
            _lib: lib,
        })
    }

    fn check(&self, what: &str, status: Status) -> Result<(), BackendError> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated
        // string for any status (or null, handled).
        let text = unsafe {
            let p = (self.error_string)(status);
            if p.is_null() {
                "unknown".into()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(BackendError::Device {
            backend: "cuda",
            message: format!(
                "{what} failed: NCCL error {status} ({text}), from {}",
                self.path
            ),
        })
    }

    /// The library's version as NCCL encodes it (2.27.7 is 22707).
    pub fn version(&self) -> Result<i32, BackendError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        let status = unsafe { (self.get_version)(&mut v) };
        self.check("ncclGetVersion", status)?;
        Ok(v)
    }

    /// One communicator per listed device, all of this process
    /// (`ncclCommInitAll`, which uses each device's primary context).
    pub fn init_all(self: &Arc<Self>, devices: &[i32]) -> Result<Communicators, BackendError> {
        if devices.is_empty() {
            return Err(BackendError::Device {
                backend: "cuda",
                message: "ncclCommInitAll needs at least one device".into(),
            });
        }
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
        let n = c_int::try_from(devices.len()).map_err(|_| BackendError::Device {
            backend: "cuda",
            message: format!("{} devices are more than NCCL takes", devices.len()),
        })?;
        // SAFETY: `comms` has room for one handle per device in `devices`.
        let status = unsafe { (self.comm_init_all)(comms.as_mut_ptr(), n, devices.as_ptr()) };
        self.check("ncclCommInitAll", status)?;
        Ok(Communicators {
            nccl: Arc::clone(self),
            comms,
        })
    }
}

impl Communicators {
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// Sums `count` f32s over the devices, in place: `buffers[i]` is the
    /// device pointer on device `i` and `streams[i]` a stream of it. One
    /// NCCL group, so one thread can drive every device; the sums are
    /// queued on the streams, not waited for.
    ///
    /// # Safety
    /// Each buffer must hold `count` f32s on its communicator's device,
    /// and each stream must belong to that device's context and outlive
    /// the operation.
    pub unsafe fn all_reduce_sum_f32(
        &self,
        buffers: &[u64],
        count: usize,
        streams: &[*mut c_void],
    ) -> Result<(), BackendError> {
        if buffers.len() != self.comms.len() || streams.len() != self.comms.len() {
            return Err(BackendError::Device {
                backend: "cuda",
                message: format!(
                    "all-reduce over {} communicators given {} buffers and {} streams",
                    self.comms.len(),
                    buffers.len(),
                    streams.len()
                ),
            });
        }
        let nccl = &self.nccl;
        nccl.check("ncclGroupStart", (nccl.group_start)())?;
        let mut first_error = Ok(());
        for ((&comm, &buffer), &stream) in self.comms.iter().zip(buffers).zip(streams) {
            let ptr = buffer as *mut c_void;
            let status = (nccl.all_reduce)(ptr, ptr, count, FLOAT32, SUM, comm, stream);
            if first_error.is_ok() {
                first_error = nccl.check("ncclAllReduce", status);
            }
        }
        // The group is closed whatever happened inside it.
        let end = nccl.check("ncclGroupEnd", (nccl.group_end)());
        first_error.and(end)
    }
}

impl Drop for Communicators {
    fn drop(&mut self) {
        for &comm in &self.comms {
            // SAFETY: each handle came from ncclCommInitAll and is
            // destroyed once.
            let _ = unsafe { (self.nccl.comm_destroy)(comm) };
        }
    }
}

/// The all-reduce of CUDA ranks: one NCCL communicator per device, each
/// sum queued on its rank's stream after the launches the rank recorded
/// before it.
pub struct NcclSum {
    comms: Communicators,
    /// Each rank's buffer address and stream for the call, sized once.
    buffers: Vec<u64>,
    streams: Vec<*mut c_void>,
}

// SAFETY: the stream handles are only passed to NCCL during a call that
// has the ranks exclusively (`&mut`); see `Communicators`.
unsafe impl Send for NcclSum {}

impl NcclSum {
    /// Communicators over devices `0 .. devices`, as the ranks' ordinals.
    pub fn new(devices: usize) -> Result<NcclSum, BackendError> {
        let nccl = Arc::new(Nccl::load()?);
        let ordinals: Vec<i32> = (0..devices as i32).collect();
        Ok(NcclSum {
            comms: nccl.init_all(&ordinals)?,
            buffers: vec![0; devices],
            streams: vec![std::ptr::null_mut(); devices],
        })
    }
}

impl crate::parallel::Reduce<super::CudaBackend> for NcclSum {
    fn all_reduce(
        &mut self,
        ranks: &mut [super::CudaBackend],
        x: crate::Buf,
        rows: usize,
        width: usize,
    ) {
        let count = rows * width;
        for (d, rank) in ranks.iter_mut().enumerate() {
            if !rank.ready() {
                return;
            }
            // The sum goes straight onto the stream: what the rank recorded
            // before it is issued first, and the rest of the step follows
            // eagerly.
            rank.go_eager();
            // The sum rewrites x, which the f16 staging may have come from.
            rank.x16_holds = None;
            self.buffers[d] = rank.buf(x, count * 4);
            self.streams[d] = rank.stream.cast();
        }
        // SAFETY: each address holds `count` f32s in its rank's allocation
        // (checked by `buf`), on the device of communicator `d` (rank d is
        // device d); the streams are the ranks' own, alive as long as they.
        let r = unsafe {
            self.comms
                .all_reduce_sum_f32(&self.buffers, count, &self.streams)
        };
        if let Err(e) = r {
            ranks[0].fail_with(e);
        }
    }
}
