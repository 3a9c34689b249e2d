//! The launch queue: kernel launches and cuBLAS calls are recorded, not
//! issued, until the host needs a result (the logits, MoE routes), and a
//! decode step that repeats launch for launch is replayed as CUDA graphs,
//! one for its head and one for the rest, which the backend issues apart
//! (cuBLAS's kernels captured with ours: its workspace is the planned one,
//! set on the handle, so a capture allocates nothing).
//!
//! Why: a decode step of an 8B model is ~230 small launches. Issued one by
//! one, each costs the host a few microseconds and leaves the GPU a gap
//! between kernels; at batch 1 that was a fifth of the step. A graph issues
//! them at once. A part's launches are compared with the cached graphs'
//! argument for argument (every buffer address is fixed by the plan, and
//! per-step inputs such as positions and page tables live in the upload
//! area, whose contents the host copies before the replay), so a replay is
//! exactly the launches it stands for. A new sequence of launches is
//! captured the second time in a row it is seen as the same part of a step
//! (a one-off shape is not worth a capture), at most [`MAX_GRAPHS`] kept,
//! each of at most [`GRAPH_MAX_NODES`] nodes: the plan's graph memory is
//! their product.

use std::ffi::c_void;

use cudarc::driver::{result, sys};
use fathom_plan::cuda::{GRAPH_MAX_NODES, MAX_GRAPHS};

use super::blas::Gemm;
use super::device_err;
use crate::BackendError;

/// One recorded kernel launch (its kernel and geometry, and where its
/// argument values sit in the queue's signature) or cuBLAS call.
enum Entry {
    Launch {
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        /// (word offset in `sig`, bytes) of each argument.
        args: std::ops::Range<usize>,
    },
    Gemm(Gemm),
}

/// Signatures found too large to capture that are remembered (the oldest
/// forgotten first): a fixed set, so a long run does not grow it.
const TOO_LARGE_KEPT: usize = 64;

/// Parts a step is issued in, each its own graph (its head, the rest).
const STEP_PARTS: usize = 2;

/// Starts a cuBLAS call's words in a signature: never a kernel's address.
const GEMM_TAG: u64 = u64::MAX;

/// A captured step: the signature it was captured from.
struct Graph {
    exec: sys::CUgraphExec,
    sig: Vec<u64>,
    last_used: u64,
}

/// Counts for tests and reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GraphStats {
    pub captures: u64,
    pub replays: u64,
    /// Repeated steps not kept: more than GRAPH_MAX_NODES nodes.
    pub too_large: u64,
    /// Launches issued one by one.
    pub direct: u64,
}

pub(super) struct LaunchQueue {
    entries: Vec<Entry>,
    /// (word offset, bytes) of every argument of every launch.
    spans: Vec<(usize, usize)>,
    /// Every launch's kernel, geometry and argument values, 8-byte words:
    /// two queues with equal signatures issue the same launches.
    sig: Vec<u64>,
    /// Per part of a step (its head, the rest: the backend issues them
    /// apart), the signature of the last one issued directly (a second
    /// sighting captures it).
    previous: [Vec<u64>; STEP_PARTS],
    graphs: Vec<Graph>,
    /// Hashes of signatures whose capture had too many nodes (cuBLAS
    /// calls are several nodes each), so they are not captured again.
    too_large: Vec<u64>,
    clock: u64,
    enabled: bool,
    /// Room for one launch's argument pointers, kept between launches.
    ptrs: Vec<*mut c_void>,
    /// Launch with programmatic stream serialization (every kernel of
    /// ours waits for its predecessor itself: `FATHOM_PDL` in common.cuh).
    pdl: bool,
    pub stats: GraphStats,
}

/// Whether `var` is on: anything but `0` (and unset) is.
pub(super) fn switch(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| v != "0")
}

impl LaunchQueue {
    pub(super) fn new() -> Self {
        LaunchQueue {
            entries: Vec::new(),
            spans: Vec::new(),
            sig: Vec::new(),
            previous: Default::default(),
            graphs: Vec::new(),
            too_large: Vec::with_capacity(TOO_LARGE_KEPT),
            clock: 0,
            ptrs: Vec::with_capacity(32),
            enabled: switch("FATHOM_CUDA_GRAPHS"),
            pdl: switch("FATHOM_CUDA_PDL"),
            stats: GraphStats::default(),
        }
    }

    /// Drops what is recorded (the backend failed: nothing more runs).
    pub(super) fn discard(&mut self) {
        self.entries.clear();
        self.spans.clear();
        self.sig.clear();
    }

    /// Records a launch; `args` are (pointer, size) of each argument value,
    /// copied now.
    pub(super) fn push(
        &mut self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &[(*mut c_void, usize)],
    ) {
        self.sig.extend([
            f as u64,
            grid.0 as u64 | (grid.1 as u64) << 32,
            grid.2 as u64 | (block as u64) << 32,
            args.len() as u64,
        ]);
        let first = self.spans.len();
        for &(p, size) in args {
            let at = self.sig.len();
            let words = size.div_ceil(8);
            self.sig.resize(at + words, 0);
            // SAFETY: `p` points at a live argument value of `size` bytes
            // (the `args!` macro takes them from locals); `sig` has room for
            // `words` 8-byte words from `at`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p as *const u8,
                    self.sig.as_mut_ptr().add(at) as *mut u8,
                    size,
                );
            }
            self.spans.push((at, size));
        }
        self.entries.push(Entry::Launch {
            f,
            grid,
            block,
            args: first..self.spans.len(),
        });
    }

    /// Records a cuBLAS call.
    pub(super) fn push_gemm(&mut self, g: Gemm) {
        self.sig.push(GEMM_TAG);
        self.sig.extend(g.words());
        self.entries.push(Entry::Gemm(g));
    }

    /// Issues what is recorded on `stream` (cuBLAS calls through `gemm`,
    /// whose handle is bound to `stream`): when it is part `part` of a
    /// whole step, as a cached graph if the signature matches one, as a new
    /// graph if it matches that part's previous one; else launch by launch.
    pub(super) fn issue(
        &mut self,
        stream: sys::CUstream,
        part: Option<usize>,
        gemm: &mut dyn FnMut(&Gemm) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let r = self.issue_inner(stream, part.filter(|_| self.enabled), gemm);
        self.discard();
        r
    }

    fn issue_inner(
        &mut self,
        stream: sys::CUstream,
        part: Option<usize>,
        gemm: &mut dyn FnMut(&Gemm) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.clock += 1;
        if let Some(part) = part {
            if let Some(g) = self.graphs.iter_mut().find(|g| g.sig == self.sig) {
                g.last_used = self.clock;
                self.stats.replays += 1;
                // SAFETY: an instantiated graph of this context; its kernels'
                // arguments equal the recorded ones (same signature).
                return unsafe { result::graph::launch(g.exec, stream) }
                    .map_err(|e| device_err("graph launch", e));
            }
            if self.previous[part] == self.sig && self.may_capture() {
                return self.capture(stream, gemm);
            }
            std::mem::swap(&mut self.previous[part], &mut self.sig);
            // `sig` now holds the older signature; the launches' spans
            // point into `previous[part]`.
            self.stats.direct += self.entries.len() as u64;
            return self.launch_each(stream, Some(part), gemm);
        }
        self.stats.direct += self.entries.len() as u64;
        self.launch_each(stream, None, gemm)
    }

    /// Issues every recorded entry on `stream` in order, the kernels'
    /// argument values read from `previous[part]` (after a swap) or `sig`.
    fn launch_each(
        &mut self,
        stream: sys::CUstream,
        from_previous: Option<usize>,
        gemm: &mut dyn FnMut(&Gemm) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let words = match from_previous {
            Some(part) => &mut self.previous[part],
            None => &mut self.sig,
        };
        let ptrs = &mut self.ptrs;
        for entry in &self.entries {
            let (f, grid, block, args) = match entry {
                Entry::Gemm(g) => {
                    gemm(g)?;
                    continue;
                }
                Entry::Launch {
                    f,
                    grid,
                    block,
                    args,
                } => (*f, *grid, *block, args.clone()),
            };
            ptrs.clear();
            for &(at, _) in &self.spans[args] {
                ptrs.push(words[at..].as_mut_ptr() as *mut c_void);
            }
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                // SAFETY: a plain-old-data union, all zeroes a valid value.
                value: unsafe { std::mem::zeroed() },
            };
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: stream,
                attrs: &mut attr,
                numAttrs: self.pdl as u32,
            };
            // SAFETY: the kernel, geometry and argument values were recorded
            // from a launch the backend checked (see `CudaBackend::launch`);
            // the values live in `words` and the attribute in `attr` until
            // the call returns. Every kernel of ours waits for its
            // predecessor before touching memory (FATHOM_PDL), which makes
            // the early launch safe.
            unsafe {
                sys::cuLaunchKernelEx(&config, f, ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
            }
            .map_err(|e| device_err("kernel launch", e))?;
        }
        Ok(())
    }

    /// Whether the recorded step may become a graph: not more launches
    /// than a graph may have nodes, and not found too large before.
    fn may_capture(&mut self) -> bool {
        if self.entries.len() > GRAPH_MAX_NODES || self.too_large.contains(&sig_hash(&self.sig)) {
            self.stats.too_large += 1;
            return false;
        }
        true
    }

    /// Captures the recorded launches into a graph and launches it: kept
    /// (the least recently used dropped first, so at most MAX_GRAPHS live
    /// at once) when it has at most GRAPH_MAX_NODES nodes, else dropped
    /// uninstantiated and its signature remembered.
    fn capture(
        &mut self,
        stream: sys::CUstream,
        gemm: &mut dyn FnMut(&Gemm) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: our stream, idle of other capture; only kernel launches
        // and cuBLAS calls on it happen between begin and end.
        unsafe { result::stream::begin_capture(stream, mode) }
            .map_err(|e| device_err("beginning a graph capture", e))?;
        let launched = self.launch_each(stream, None, gemm);
        // SAFETY: ends the capture begun above, whatever the launches did.
        let graph = unsafe { result::stream::end_capture(stream) };
        launched?;
        let graph = graph.map_err(|e| device_err("ending a graph capture", e))?;
        let mut nodes = 0usize;
        // SAFETY: a graph just captured; a null node array asks for the count.
        let counted =
            unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes).result() };
        if counted.is_err() || nodes > GRAPH_MAX_NODES {
            // SAFETY: the captured graph, never instantiated.
            let _ = unsafe { result::graph::destroy(graph) };
            self.stats.too_large += 1;
            if self.too_large.len() == TOO_LARGE_KEPT {
                self.too_large.remove(0);
            }
            self.too_large.push(sig_hash(&self.sig));
            self.stats.direct += self.entries.len() as u64;
            return self.launch_each(stream, None, gemm);
        }
        if self.graphs.len() >= MAX_GRAPHS {
            let oldest = (0..self.graphs.len())
                .min_by_key(|&i| self.graphs[i].last_used)
                .expect("MAX_GRAPHS > 0");
            let g = self.graphs.swap_remove(oldest);
            // SAFETY: not in use by the host; the stream orders its last
            // launch before anything after.
            let _ = unsafe { result::graph::exec_destroy(g.exec) };
        }
        // SAFETY: a graph just captured; destroyed once instantiated (the
        // executable graph keeps what it needs).
        let exec = unsafe {
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            exec.map_err(|e| device_err("instantiating a graph", e))?
        };
        self.stats.captures += 1;
        self.graphs.push(Graph {
            exec,
            // A copy: the queue's own signature keeps its capacity, so the
            // steps after a capture record without growing it.
            sig: self.sig.clone(),
            last_used: self.clock,
        });
        // SAFETY: just instantiated in this context.
        unsafe { result::graph::launch(exec, stream) }.map_err(|e| device_err("graph launch", e))
    }

    /// Destroys the cached graphs (the context must be bound).
    pub(super) fn release(&mut self) {
        for g in self.graphs.drain(..) {
            // SAFETY: each exec was instantiated once and is destroyed once.
            let _ = unsafe { result::graph::exec_destroy(g.exec) };
        }
    }
}

/// A signature's hash (FNV-1a over its words), to remember the ones not to
/// capture without keeping them whole; a collision only skips a capture.
fn sig_hash(sig: &[u64]) -> u64 {
    sig.iter().fold(0xcbf2_9ce4_8422_2325, |h, &w| {
        (h ^ w).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
