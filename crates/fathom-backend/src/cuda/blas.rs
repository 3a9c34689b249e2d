//! cuBLAS, loaded by hand: the few entry points the backend calls, from a
//! library found where we say (`FATHOM_CUDA_LIB_DIR`, the CUDA toolkit's
//! usual folders, then the loader's own search), so a missing library is a
//! [`BackendError`] naming every place searched rather than a panic.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;

use libloading::Library;

use crate::BackendError;

pub type Handle = *mut c_void;
type Status = c_int;

/// `CUBLAS_OP_N`, `CUBLAS_OP_T`.
pub const OP_N: c_int = 0;
pub const OP_T: c_int = 1;

type CreateFn = unsafe extern "C" fn(*mut Handle) -> Status;
type DestroyFn = unsafe extern "C" fn(Handle) -> Status;
type SetStreamFn = unsafe extern "C" fn(Handle, *mut c_void) -> Status;
type SetWorkspaceFn = unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status;
#[allow(clippy::type_complexity)]
type GemmExFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> Status;

/// `cudaDataType` values.
pub const R_32F: c_int = 0;
pub const R_16F: c_int = 2;
pub const R_16BF: c_int = 14;
/// `CUBLAS_COMPUTE_32F`, `CUBLAS_GEMM_DEFAULT`.
const COMPUTE_32F: c_int = 68;
const GEMM_DEFAULT: c_int = -1;

/// The loaded library and its entry points.
pub struct Blas {
    create: CreateFn,
    destroy: DestroyFn,
    set_stream: SetStreamFn,
    set_workspace: SetWorkspaceFn,
    gemm_ex: GemmExFn,
    /// Where it was found, for messages.
    pub path: String,
    // Kept last so the entry points above never outlive the libraries.
    _libs: Vec<Library>,
}

/// The folders searched, in order.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("FATHOM_CUDA_LIB_DIR") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

const NAMES: [&str; 2] = ["libcublas.so.13", "libcublas.so"];
const LT_NAMES: [&str; 2] = ["libcublasLt.so.13", "libcublasLt.so"];

fn open(candidates: &[String]) -> Option<(Library, String)> {
    candidates.iter().find_map(|c| {
        // SAFETY: loading cuBLAS runs its initializers, which only set up
        // the library's own state; we call nothing before resolving symbols.
        unsafe { Library::new(c) }.ok().map(|l| (l, c.clone()))
    })
}

impl Blas {
    pub fn load() -> Result<Blas, BackendError> {
        let mut tried = Vec::new();
        let mut candidates = Vec::new();
        for d in search_dirs() {
            for (lt, name) in LT_NAMES.iter().zip(NAMES) {
                candidates.push((
                    d.join(lt).display().to_string(),
                    d.join(name).display().to_string(),
                ));
            }
        }
        // Last, the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache).
        for (lt, name) in LT_NAMES.iter().zip(NAMES) {
            candidates.push((lt.to_string(), name.to_string()));
        }
        for (lt, name) in candidates {
            tried.push(name.clone());
            // cuBLAS needs cuBLASLt: open it first from the same place so the
            // dependency resolves to it by its soname.
            let lt_lib = open(std::slice::from_ref(&lt));
            let Some((lib, path)) = open(std::slice::from_ref(&name)) else {
                continue;
            };
            return Self::resolve(lib, lt_lib.map(|l| l.0), path);
        }
        Err(BackendError::Device {
            backend: "cuda",
            message: format!(
                "cuBLAS (libcublas.so.13) not found; searched {}. Set FATHOM_CUDA_LIB_DIR to the \
                 folder holding libcublas.so.13 and libcublasLt.so.13",
                tried.join(", ")
            ),
        })
    }

    fn resolve(lib: Library, lt: Option<Library>, path: String) -> Result<Blas, BackendError> {
        fn sym<T: Copy>(lib: &Library, name: &str, path: &str) -> Result<T, BackendError> {
            // SAFETY: each type above is the C signature cuBLAS 13 documents
            // for the symbol of that name.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| BackendError::Device {
                    backend: "cuda",
                    message: format!(
                        "{path}: symbol {name} missing ({e}); cuBLAS 12 or 13 is needed"
                    ),
                })
        }
        Ok(Blas {
            create: sym(&lib, "cublasCreate_v2", &path)?,
            destroy: sym(&lib, "cublasDestroy_v2", &path)?,
            set_stream: sym(&lib, "cublasSetStream_v2", &path)?,
            set_workspace: sym(&lib, "cublasSetWorkspace_v2", &path)?,
            gemm_ex: sym(&lib, "cublasGemmEx", &path)?,
            path,
            _libs: [Some(lib), lt].into_iter().flatten().collect(),
        })
    }

    fn check(&self, what: &str, status: Status) -> Result<(), BackendError> {
        if status == 0 {
            Ok(())
        } else {
            Err(BackendError::Device {
                backend: "cuda",
                message: format!("{what} failed with cuBLAS status {status}"),
            })
        }
    }

    /// A handle on `stream` using `workspace` (device bytes the caller owns
    /// for as long as the handle lives) instead of allocating its own.
    pub fn create(
        &self,
        stream: *mut c_void,
        workspace: u64,
        workspace_bytes: usize,
    ) -> Result<Handle, BackendError> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer; the context is current on
        // this thread (the caller bound it).
        self.check("cublasCreate", unsafe { (self.create)(&mut h) })?;
        // SAFETY: `h` was just created; the stream belongs to the same context.
        self.check("cublasSetStream", unsafe { (self.set_stream)(h, stream) })?;
        // SAFETY: the workspace is device memory of `workspace_bytes` that
        // outlives the handle (both are dropped together by the backend).
        self.check("cublasSetWorkspace", unsafe {
            (self.set_workspace)(h, workspace as *mut c_void, workspace_bytes)
        })?;
        Ok(h)
    }

    pub fn destroy(&self, h: Handle) {
        // SAFETY: `h` came from `create` and is destroyed once (on drop).
        unsafe { (self.destroy)(h) };
    }

    /// Runs `g` on the handle's stream.
    pub fn gemm(&self, h: Handle, g: &Gemm) -> Result<(), BackendError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let dim = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
        let (m, n, k) = g.mnk;
        // SAFETY: a, b and c are device pointers into the backend's one
        // allocation holding at least the op's extents (the caller checked
        // them against the plan); α and β are f32 because the compute type
        // is 32F, and live across the call.
        let status = unsafe {
            (self.gemm_ex)(
                h,
                g.ops.0,
                g.ops.1,
                dim(m),
                dim(n),
                dim(k),
                &alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                g.ab_type,
                dim(g.lda),
                g.b as *const c_void,
                g.ab_type,
                dim(g.ldb),
                &beta as *const f32 as *const c_void,
                g.c as *mut c_void,
                R_32F,
                dim(g.ldc),
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        };
        self.check("cublasGemmEx", status)
    }
}

/// One column-major `C (f32) = op(A)·op(B)` (α = 1, β = 0), A and B of
/// `ab_type` (f32, f16 or bf16), accumulated in f32: the one cuBLAS call
/// the backend makes, recorded in its launch queue in order with the
/// kernels so that a step holding it can still be captured as a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub ops: (c_int, c_int),
    pub mnk: (usize, usize, usize),
    pub ab_type: c_int,
    pub a: u64,
    pub lda: usize,
    pub b: u64,
    pub ldb: usize,
    pub c: u64,
    pub ldc: usize,
}

impl Gemm {
    /// Every field, for the queue's signature.
    pub fn words(&self) -> [u64; 12] {
        [
            self.ops.0 as u64,
            self.ops.1 as u64,
            self.mnk.0 as u64,
            self.mnk.1 as u64,
            self.mnk.2 as u64,
            self.ab_type as u64,
            self.a,
            self.lda as u64,
            self.b,
            self.ldb as u64,
            self.c,
            self.ldc as u64,
        ]
    }
}
