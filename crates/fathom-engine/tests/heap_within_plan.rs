//! The plan is the allocation: generation on the real SmolLM2 GGUF under a
//! counting global allocator. The heap peak stays within the plan's heap
//! terms, and the token loop does not grow the heap.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use fathom_checkpoint::Checkpoint;
use fathom_engine::{Engine, Sampler, SamplingParams};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(now, Relaxed);
        CALLS.fetch_add(1, Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Relaxed);
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn generation_heap_stays_within_the_plan() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.exists(), "run scripts/fetch-model.sh first");
    let baseline = CURRENT.load(Relaxed);
    PEAK.store(baseline, Relaxed);

    let checkpoint = Checkpoint::open(&model).unwrap();
    let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let tokenizer = fathom_engine::load_tokenizer(&checkpoint).unwrap();
    let text = "The history of the printing press begins in ".repeat(40);
    let prompt = tokenizer.encode(&text, tokenizer.add_bos(), true);
    let n = 64;
    let inputs = PlanInputs {
        context: (prompt.len() + n) as u64,
        batch: 1,
        device: Device::Cpu,
        kv_dtype: KvDtype::F16,
        max_tokens_per_step: 512,
        threads: 2,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: None,
        available: Available {
            bytes: 8 << 30,
            source: "test".into(),
        },
    };
    let plan = MemoryPlan::new(&spec, inputs).unwrap();
    let heap_terms =
        plan.kv_bytes + plan.activation_bytes + plan.converted_bytes + plan.runtime_overhead_bytes;
    let mut engine = Engine::load(&checkpoint, spec, plan, tokenizer).unwrap();
    drop(checkpoint);

    let mut sampler = Sampler::new(SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    });
    let mut out_bytes = 0usize;
    let mut heap_at_first_token = None;
    let stats = engine
        .generate(&prompt, n, &mut sampler, &[], &mut |text| {
            out_bytes += text.len();
            heap_at_first_token.get_or_insert(CURRENT.load(Relaxed));
            true
        })
        .unwrap();
    assert_eq!(
        stats.generated_tokens, n,
        "greedy ran to the requested length"
    );
    assert!(out_bytes > 0);
    let peak = (PEAK.load(Relaxed) - baseline) as u64;
    println!("heap peak {peak} bytes, plan heap terms {heap_terms} bytes");
    assert!(
        peak <= heap_terms,
        "heap peak {peak} over the plan's heap terms {heap_terms}"
    );
    // The token loop frees what it allocates: nothing grows with tokens.
    let after = CURRENT.load(Relaxed);
    let first = heap_at_first_token.unwrap();
    assert!(
        after <= first,
        "heap grew from {first} to {after} bytes while generating"
    );
}
