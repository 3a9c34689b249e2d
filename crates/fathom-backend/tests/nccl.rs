//! NCCL through fathom's own loader: one communicator per visible GPU (at
//! most 8) of this process, a sum all-reduce of f32 buffers in place, and
//! the device memory NCCL takes, by `cuMemGetInfo` deltas on device 0
//! around communicator creation and the first all-reduce (the plan's
//! `nccl` term, `fathom_plan::tensor_parallel::nccl`, is an estimate until
//! these are recorded).
//!
//! Without libnccl the loader's error must name the folders searched.
//! Without a GPU or without libnccl the test says why and passes;
//! `FATHOM_REQUIRE_GPU=1` makes that a failure.

use cudarc::driver::{CudaContext, DevicePtr};
use fathom_backend::cuda::{self, nccl, nccl::Nccl};

fn skip(why: String) {
    if std::env::var("FATHOM_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("FATHOM_REQUIRE_GPU=1 but NCCL cannot be tested: {why}");
    }
    eprintln!("nccl: skipping: {why}");
}

/// Values on device `rank`: `rank + 1 + i / 1000`, so the sum over `n`
/// devices is `n (n + 1) / 2 + n i / 1000`, exact in f32 for these sizes.
fn values(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (rank + 1) as f32 + (i % 1000) as f32 / 1024.0)
        .collect()
}

#[test]
fn all_reduce_sums_over_every_gpu() {
    // A folder that does not exist is searched first and named when NCCL
    // is nowhere; the real library, when installed, is still found.
    let missing = std::env::temp_dir().join(format!("fathom-no-nccl-{}", std::process::id()));
    std::env::set_var(nccl::LIB_DIR_VAR, &missing);
    let loaded = Nccl::load();
    assert_eq!(
        std::env::var(nccl::NVLS_VAR).as_deref(),
        Ok("0"),
        "the loader turns NVLink multicast off before NCCL starts"
    );
    let nccl = match loaded {
        Ok(n) => std::sync::Arc::new(n),
        Err(e) => {
            let message = e.to_string();
            for expected in [
                missing.display().to_string(),
                "FATHOM_NCCL_LIB_DIR".into(),
                "libnccl.so.2".into(),
            ] {
                assert!(message.contains(&expected), "no {expected:?} in {message}");
            }
            skip(format!("no libnccl: {message}"));
            return;
        }
    };
    let Some(info) = cuda::probe() else {
        skip(format!(
            "{} loaded, but no CUDA driver or device (cuda::probe found none)",
            nccl.path
        ));
        return;
    };
    eprintln!("nccl: GPU 0 is {}", info.name);
    let version = nccl.version().expect("ncclGetVersion");
    let n = CudaContext::device_count()
        .expect("device count")
        .clamp(1, 8) as usize;
    eprintln!("nccl: {} (version {version}), {n} GPU(s)", nccl.path);

    let contexts: Vec<_> = (0..n)
        .map(|d| CudaContext::new(d).expect("context"))
        .collect();
    let free = |ctx: &std::sync::Arc<CudaContext>| ctx.mem_get_info().expect("mem info").0 as i64;
    let before = free(&contexts[0]);
    let devices: Vec<i32> = (0..n as i32).collect();
    let comms = nccl.init_all(&devices).expect("ncclCommInitAll");
    assert_eq!(comms.len(), n);
    let after_init = free(&contexts[0]);

    // One decode step's all-reduce of a 70B-wide hidden row, and a
    // prefill chunk's (512 x 8192).
    for count in [8192usize, 512 * 8192] {
        let streams: Vec<_> = contexts
            .iter()
            .map(|c| c.new_stream().expect("stream"))
            .collect();
        let buffers: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(rank, s)| s.clone_htod(&values(rank, count)).expect("upload"))
            .collect();
        {
            let ptrs: Vec<_> = buffers
                .iter()
                .zip(&streams)
                .map(|(b, s)| b.device_ptr(s))
                .collect();
            let raw: Vec<u64> = ptrs.iter().map(|(p, _)| *p).collect();
            let raw_streams: Vec<_> = streams.iter().map(|s| s.cu_stream().cast()).collect();
            // SAFETY: each buffer holds `count` f32s on its device, and the
            // streams outlive the sums (synchronized below).
            unsafe { comms.all_reduce_sum_f32(&raw, count, &raw_streams) }.expect("all-reduce");
        }
        for (s, b) in streams.iter().zip(&buffers) {
            s.synchronize().expect("synchronize");
            let got = s.clone_dtoh(b).expect("download");
            for (i, &g) in got.iter().enumerate() {
                let want = (n * (n + 1) / 2) as f32 + n as f32 * (i % 1000) as f32 / 1024.0;
                assert_eq!(g, want, "element {i} of {count} over {n} GPU(s)");
            }
        }
    }
    let after_reduce = free(&contexts[0]);
    eprintln!(
        "nccl device memory on GPU 0 (NCCL_NVLS_ENABLE=0, {n} GPU(s)): communicator creation {} bytes, first all-reduces {} bytes, total {} bytes",
        before - after_init,
        after_init - after_reduce,
        before - after_reduce
    );
}
