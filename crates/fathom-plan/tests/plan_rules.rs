//! The plan's arithmetic on hand-built model specs: every rule of
//! docs/memory-plan.md, saturation, and the largest-context search; and
//! the recurrent-state term of a hybrid model from the headers of a
//! Qwen3.5-4B-shaped GGUF (sparse: no weight is written), checked against
//! a derivation by hand.

use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data, GgufTensorType};
use fathom_plan::serve::{KvBudget, PromptCache, ServePlan};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::{Attention, Family, Layer, ModelSpec, TensorEntry, VocabHeader};

fn spec(layers: Vec<Attention>, context_length: u64) -> ModelSpec {
    ModelSpec {
        block: Default::default(),
        architecture: "test".into(),
        family: Family::Llama,
        n_layers: layers.len() as u64,
        hidden: 256,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        ffn: 512,
        vocab: 1000,
        n_experts: 0,
        n_experts_active: 0,
        expert_ffn: 0,
        context_length,
        layers: layers
            .into_iter()
            .map(|attention| Layer {
                attention,
                n_kv_heads: 2,
                key_dim: 64,
                value_dim: 64,
                kv_elsewhere: false,
            })
            .collect(),
        rope: None,
        rms_norm_eps: 1e-5,
        attn_scale: None,
        final_logit_softcap: None,
        norm_topk_prob: false,
        shared_expert_ffn: 0,
        linear: None,
        mtp_layers: 0,
        tokenizer_merges: 0,
        vocab_header: VocabHeader::default(),
        tied_embeddings: true,
        streamed_weights: 0,
        tensors: vec![TensorEntry {
            name: "w".into(),
            dtype: "F32".into(),
            shape: vec![256, 1000],
            params: 256_000,
            row_len: 256,
            bytes: 1_024_000,
        }],
        source: "hand-built".into(),
        notes: vec![],
    }
}

fn inputs(max_tokens: u64, batch: u64, available: u64) -> PlanInputs {
    PlanInputs {
        context: max_tokens,
        batch,
        device: Device::Cpu,
        kv_dtype: KvDtype::F16,
        max_tokens_per_step: 512,
        threads: 2,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: None,
        available: Available {
            bytes: available,
            source: "test".into(),
        },
    }
}

#[test]
fn kv_counts_full_sliding_and_attention_free_layers() {
    let s = spec(
        vec![
            Attention::Full,
            Attention::Sliding { window: 100 },
            Attention::None,
            Attention::Full,
        ],
        4096,
    );
    let plan = MemoryPlan::new(&s, inputs(1000, 3, 1 << 40)).unwrap();
    let per_layer_token = 2 * (2 * 64) * 2; // K + V, 2 heads x 64, f16
    assert_eq!(plan.kv_bytes_per_token, 3 * per_layer_token);
    // Full layers hold 1000 tokens -> 63 blocks of 16; the sliding layer 100 -> 7 blocks.
    let want = 3 * (2 * 63 * 16 * per_layer_token + 7 * 16 * per_layer_token);
    assert_eq!(plan.kv_bytes, want);
    assert_eq!(plan.kv_detail.len(), 2);
}

/// The runtime's tokenizer tables: 192 bytes a vocabulary entry, and as
/// much for each BPE merge beyond one per entry (Gemma 4 has two merges a
/// token); up to one merge per entry changes nothing, derivation included.
#[test]
fn runtime_counts_merges_beyond_one_per_vocab_entry() {
    let runtime = |merges| {
        let s = ModelSpec {
            tokenizer_merges: merges,
            ..spec(vec![Attention::Full; 2], 4096)
        };
        let plan = MemoryPlan::new(&s, inputs(1024, 1, 1 << 30)).unwrap();
        let term = plan.terms.iter().find(|t| t.name == "runtime").unwrap();
        (plan.runtime_overhead_bytes, term.derivation.clone())
    };
    let (none, derivation) = runtime(0);
    assert_eq!(
        runtime(1000),
        (none, derivation.clone()),
        "one merge per entry"
    );
    let (more, with_merges) = runtime(2500);
    assert_eq!(more - none, 1500 * 192);
    assert!(
        with_merges.contains("1500 merges beyond one per entry x 192 B"),
        "{with_merges}"
    );
}

/// The vocabulary's tables counted from the header: where they and the
/// fixed part outgrow the per-entry allowance (Qwen3.5's 248,320 tokens)
/// they are the term; on SmolLM2's vocabulary, where the allowance was
/// measured, the two agree and the allowance stays, derivation included.
#[test]
fn runtime_counts_a_large_vocabularys_tables_from_the_header() {
    use fathom_plan::device::{self, hash_table_bytes, vocab_heap, CALIBRATION_VOCAB};
    // hashbrown: 8/7 of the items rounded up to a power of two buckets.
    assert_eq!(hash_table_bytes(7, 32), 8 * 32 + 8 + 16);
    assert_eq!(hash_table_bytes(229_376, 32), 262_144 * 33 + 16);
    assert_eq!(hash_table_bytes(229_377, 32), 524_288 * 33 + 16);
    assert_eq!(vocab_heap(&VocabHeader::default()), 0);
    // glibc's chunk of a string: 8 bytes of header, 16-byte steps, 32 at least.
    let chunks: Vec<u64> = [0, 1, 24, 25, 40, 41]
        .map(fathom_spec::string_heap_bytes)
        .to_vec();
    assert_eq!(chunks, [0, 32, 32, 48, 48, 64]);
    let smollm2 = device::runtime(Device::Cpu, 49_152, 48_900, &CALIBRATION_VOCAB, 2);
    let allowance = device::runtime(Device::Cpu, 49_152, 48_900, &VocabHeader::default(), 2);
    assert_eq!(
        smollm2, allowance,
        "the calibration vocabulary keeps the allowance"
    );
    assert_eq!(
        device::runtime_fixed_bytes() + vocab_heap(&CALIBRATION_VOCAB),
        (16 << 20) + 49_152 * 192
    );
    let qwen35 = VocabHeader {
        tokens: 248_320,
        token_bytes: 2_432_932,
        token_arrays: 2,
        merges: 151_387,
        merge_bytes: 1_520_452,
        scores_kept: false,
        token_chunks: 8_014_880,
        merge_chunks: 4_957_552,
        merge_part_chunks: 9_712_960,
        tokenizer_json_bytes: 0,
    };
    let tables = vocab_heap(&qwen35);
    let (bytes, derivation) = device::runtime(Device::Cpu, 248_320, 151_387, &qwen35, 2);
    assert_eq!(
        bytes,
        device::runtime_fixed_bytes() + tables + 2 * (128 << 10)
    );
    assert!(bytes > (16 << 20) + 248_320 * 192, "over the allowance");
    assert!(
        derivation.contains(&format!("{tables} B vocabulary tables (248320 tokens")),
        "{derivation}"
    );
    // A discrete GPU does not count host memory, whatever the vocabulary.
    assert_eq!(
        device::runtime(Device::Cuda, 248_320, 151_387, &qwen35, 2).0,
        0
    );
}

/// A `tokenizer.json`'s bytes are alive while its texts, attributes and
/// merges are read and dropped before the id map, pieces, piece ends and
/// merge table are built: they count only where they outweigh those, and
/// never the GGUF metadata's arrays.
#[test]
fn runtime_counts_a_tokenizer_json_while_read_and_its_tables_after() {
    use fathom_plan::device::{self, vocab_heap};
    let header = |file: u64| VocabHeader {
        tokens: 1_000,
        token_bytes: 8_000,
        token_arrays: 0,
        merges: 900,
        merge_bytes: 7_000,
        scores_kept: false,
        token_chunks: 32_000,
        merge_chunks: 0,
        merge_part_chunks: 57_600,
        tokenizer_json_bytes: file,
    };
    // Read: texts 1,000 x 24 + 32,000, attributes 1,000 x 2, merges
    // 900 x 48 + 57,600.
    let read = 56_000 + 2_000 + 100_800;
    // Built: the id map's 2,048 buckets of 32 B + control bytes + a copy
    // of the texts, pieces 8,000, piece ends 1,000 x 8, the merge table's
    // 2,048 buckets of 16 B + control bytes.
    let built = (2_048 * 33 + 16 + 32_000) + 8_000 + 8_000 + (2_048 * 17 + 16);
    assert_eq!(vocab_heap(&header(100_000)), read + built);
    // A file's buffer: its malloc chunk, 8 B of header in 16 B steps.
    assert_eq!(vocab_heap(&header(1_000_000)), read + 1_000_016);
    let (_, derivation) = device::runtime(Device::Cpu, 1_000, 0, &header(64 << 20), 2);
    assert!(
        derivation.contains(
            "(1000 tokens of 8000 B, 900 merges of 7000 B, from a 67108864 B tokenizer.json: \
             the file while read, texts, id map, pieces, merge table)"
        ),
        "{derivation}"
    );
    // Where the allowance covers it, the allowance stays, byte for byte.
    assert_eq!(
        device::runtime(Device::Cpu, 1_000, 0, &header(100_000), 2),
        device::runtime(Device::Cpu, 1_000, 0, &VocabHeader::default(), 2)
    );
}

#[test]
fn total_is_the_sum_of_the_terms_and_fit_follows() {
    let s = spec(vec![Attention::Full; 4], 4096);
    let plan = MemoryPlan::new(&s, inputs(1024, 1, 1 << 30)).unwrap();
    let sum: u64 = plan.terms.iter().map(|t| t.bytes).sum();
    assert_eq!(plan.total_bytes, sum);
    assert_eq!(
        plan.total_bytes,
        plan.weights_bytes + plan.kv_bytes + plan.activation_bytes + plan.runtime_overhead_bytes
    );
    assert!(plan.fits);
    assert_eq!(plan.slack_bytes, (1 << 30) - plan.total_bytes);
    let tight = MemoryPlan::new(&s, inputs(1024, 1, plan.total_bytes)).unwrap();
    assert!(tight.fits && tight.slack_bytes == 0);
    let over = MemoryPlan::new(&s, inputs(1024, 1, plan.total_bytes - 1)).unwrap();
    assert!(!over.fits);
    assert_eq!(over.overflow_bytes, 1);
}

#[test]
fn largest_context_is_the_boundary_of_fitting() {
    let s = spec(
        vec![Attention::Full, Attention::Sliding { window: 64 }],
        100_000,
    );
    for available in [30 << 20, 31 << 20, 40 << 20, 64 << 20] {
        let plan = MemoryPlan::new(&s, inputs(16, 2, available)).unwrap();
        let ctx = plan.max_context_that_fits;
        assert!(ctx > 0, "{available}");
        if ctx < s.context_length {
            assert!(MemoryPlan::new(&s, inputs(ctx, 2, available)).unwrap().fits);
            assert!(
                !MemoryPlan::new(&s, inputs(ctx + 1, 2, available))
                    .unwrap()
                    .fits
            );
        }
    }
    // Capped at the trained context.
    let roomy = MemoryPlan::new(&s, inputs(16, 1, 1 << 40)).unwrap();
    assert_eq!(roomy.max_context_that_fits, 100_000);
    let none = MemoryPlan::new(&s, inputs(16, 1, 1000)).unwrap();
    assert_eq!(none.max_context_that_fits, 0);
}

#[test]
fn maximal_inputs_saturate() {
    let s = spec(vec![Attention::Full; 4], 0);
    let mut i = inputs(u64::MAX, u64::MAX, u64::MAX - 1);
    i.max_tokens_per_step = u64::MAX;
    i.threads = u64::MAX;
    let plan = MemoryPlan::new(&s, i).unwrap();
    assert_eq!(plan.total_bytes, u64::MAX);
    assert!(!plan.fits);
    assert_eq!(plan.overflow_bytes, 1);
    let mut i = inputs(1, 1, 1 << 30);
    i.headroom_factor = f64::MAX;
    let plan = MemoryPlan::new(&s, i).unwrap();
    assert_eq!(plan.total_bytes, u64::MAX);
}

#[test]
fn headroom_factor_below_one_is_negative_headroom() {
    let s = spec(vec![Attention::Full; 4], 4096);
    let base = MemoryPlan::new(&s, inputs(1024, 1, 1 << 30)).unwrap();
    let mut i = inputs(1024, 1, 1 << 30);
    i.headroom_factor = 0.5;
    let half = MemoryPlan::new(&s, i).unwrap();
    let wkv = base.weights_bytes + base.kv_bytes;
    assert_eq!(half.headroom_bytes, -((wkv / 2) as i64));
    assert_eq!(half.total_bytes, base.total_bytes - wkv / 2);
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let mut i = inputs(1024, 1, 1 << 30);
        i.headroom_factor = bad;
        assert!(MemoryPlan::new(&s, i).is_err(), "{bad}");
    }
    assert!(fathom_plan::parse_headroom_factor(Some("1e400")).is_err());
    assert_eq!(fathom_plan::parse_headroom_factor(Some(" ")).unwrap(), 1.0);
    assert_eq!(
        fathom_plan::parse_headroom_factor(Some("1.25")).unwrap(),
        1.25
    );
}

#[test]
fn activation_step_is_the_chunk_or_the_batch() {
    let s = spec(vec![Attention::Full; 2], 4096);
    let step = |max_tokens, batch, per_step| {
        let mut i = inputs(max_tokens, batch, 1 << 40);
        i.max_tokens_per_step = per_step;
        let plan = MemoryPlan::new(&s, i).unwrap();
        plan.activation_detail
            .iter()
            .find(|b| b.name == "residual")
            .unwrap()
            .rows
    };
    assert_eq!(step(4096, 1, 512), 512);
    assert_eq!(
        step(100, 1, 512),
        100,
        "a short context never fills a chunk"
    );
    assert_eq!(step(100, 8, 512), 512);
    assert_eq!(
        step(4096, 64, 16),
        64,
        "a decode step holds one token per sequence"
    );
    let plan = MemoryPlan::new(&s, inputs(4096, 1, 1 << 40)).unwrap();
    assert!(plan.activation_detail.iter().all(|b| b.bytes % 64 == 0));
}

#[test]
fn rocm_reserve_only_on_rocm() {
    let s = spec(vec![Attention::Full; 2], 4096);
    for device in Device::ALL {
        let mut i = inputs(1024, 1, 1 << 40);
        i.device = device;
        i.rocm_inflight_raw = Some(b"64".to_vec());
        let plan = MemoryPlan::new(&s, i).unwrap();
        let want = if device == Device::Rocm { 64 << 20 } else { 0 };
        assert_eq!(plan.backend_inflight_bytes, want, "{device:?}");
        assert_eq!(
            plan.terms.iter().any(|t| t.name == "backend_inflight"),
            want > 0
        );
    }
}

#[test]
fn zero_inputs_are_rejected_with_the_flag_name() {
    let s = spec(vec![Attention::Full; 2], 4096);
    let err = MemoryPlan::new(&s, inputs(0, 1, 1 << 30))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--max-tokens"), "{err}");
    let err = MemoryPlan::new(&s, inputs(1, 0, 1 << 30))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--batch"), "{err}");
}

mod serve {
    use super::*;
    use fathom_plan::serve::{
        auto_prompt_cache_bytes, parse_kv_budget, parse_prompt_cache, KvBudget, PromptCache,
        ServePlan, DEFAULT_PROMPT_CACHE_BYTES,
    };

    const MIB: u64 = 1 << 20;

    #[test]
    fn prompt_cache_auto_follows_each_rule() {
        // Plenty of slack: six entries.
        assert_eq!(auto_prompt_cache_bytes(100 * MIB, 100_000 * MIB), 600 * MIB);
        // The quarter-of-slack ceiling binds: 2000 / 4 = 500 < 6 x 100.
        assert_eq!(auto_prompt_cache_bytes(100 * MIB, 2000 * MIB), 500 * MIB);
        // One entry is at most half the slack but above the ceiling: one entry.
        assert_eq!(auto_prompt_cache_bytes(400 * MIB, 800 * MIB), 400 * MIB);
        // One entry is more than half the slack: the ceiling alone.
        assert_eq!(auto_prompt_cache_bytes(500 * MIB, 800 * MIB), 200 * MIB);
        // Never below the compiled-in default, even with no slack.
        assert_eq!(
            auto_prompt_cache_bytes(500 * MIB, 0),
            DEFAULT_PROMPT_CACHE_BYTES
        );
    }

    #[test]
    fn budget_and_cache_flags_parse_or_name_the_valid_values() {
        assert_eq!(parse_kv_budget("auto").unwrap(), KvBudget::Auto);
        assert_eq!(parse_kv_budget("none").unwrap(), KvBudget::Workload);
        assert_eq!(parse_kv_budget("2G").unwrap(), KvBudget::Bytes(2 << 30));
        let err = parse_kv_budget("lots").unwrap_err().to_string();
        assert!(
            err.contains("--kv-cache-budget") && err.contains("auto, none"),
            "{err}"
        );
        assert_eq!(parse_prompt_cache("off").unwrap(), PromptCache::Off);
        assert_eq!(
            parse_prompt_cache("512M").unwrap(),
            PromptCache::Bytes(512 * MIB)
        );
        assert!(parse_prompt_cache("-1").is_err());
    }

    /// 2 full layers x (2 heads x 64 dims x K and V) x f16 x 16 tokens.
    const BLOCK: u64 = 2 * 2 * 2 * 64 * 2 * 16;

    #[test]
    fn auto_pool_is_capped_by_the_workload_when_memory_is_plentiful() {
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        let p = ServePlan::new(
            &s,
            inputs(1024, 4, 1 << 40),
            KvBudget::Auto,
            PromptCache::Auto,
        )
        .unwrap();
        assert_eq!(p.kv_block_bytes, BLOCK);
        assert_eq!(p.kv_blocks_per_sequence, 64);
        // Entry = 64 blocks; slack is huge, so 6 entries, but at least the default.
        let cache = (6 * 64 * BLOCK).max(DEFAULT_PROMPT_CACHE_BYTES);
        assert_eq!(p.prompt_cache_bytes, cache);
        assert_eq!(p.kv_blocks, 4 * 64 + cache / BLOCK);
        assert_eq!(p.plan.kv_bytes, p.kv_blocks * BLOCK);
        let kv_term = p.plan.terms.iter().find(|t| t.name == "kv").unwrap();
        assert_eq!(kv_term.bytes, p.plan.kv_bytes);
        let sum: u64 = p.plan.terms.iter().map(|t| t.bytes).sum();
        assert_eq!(p.plan.total_bytes, sum);
    }

    #[test]
    fn auto_pool_fills_exactly_what_memory_leaves() {
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        let roomy = ServePlan::new(
            &s,
            inputs(1024, 4, 1 << 40),
            KvBudget::Auto,
            PromptCache::Off,
        )
        .unwrap();
        let others = roomy.plan.total_bytes - roomy.plan.kv_bytes;
        // Room for 100.5 blocks besides everything else: 100 whole blocks.
        let available = others + 100 * BLOCK + BLOCK / 2;
        let p = ServePlan::new(
            &s,
            inputs(1024, 4, available),
            KvBudget::Auto,
            PromptCache::Off,
        )
        .unwrap();
        assert_eq!(p.kv_blocks, 100);
        assert!(p.plan.fits);
        assert_eq!(p.plan.slack_bytes, BLOCK / 2);
        // The ROCm in-flight reserve comes out of the pool.
        let mut rocm = inputs(1024, 4, available + (64 << 20));
        rocm.device = Device::Rocm;
        rocm.rocm_inflight_raw = Some(b"64".to_vec());
        let r = ServePlan::new(&s, rocm, KvBudget::Auto, PromptCache::Off).unwrap();
        assert_eq!(r.kv_blocks, 100);
        assert_eq!(r.plan.backend_inflight_bytes, 64 << 20);
    }

    #[test]
    fn headroom_factor_shrinks_the_auto_pool() {
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        let base = ServePlan::new(
            &s,
            inputs(1024, 4, 1 << 40),
            KvBudget::Auto,
            PromptCache::Off,
        )
        .unwrap();
        let others = base.plan.total_bytes - base.plan.kv_bytes - base.plan.weights_bytes;
        let weights = base.plan.weights_bytes;
        let mut i = inputs(1024, 4, others + 2 * (weights + 100 * BLOCK));
        i.headroom_factor = 2.0;
        let p = ServePlan::new(&s, i, KvBudget::Auto, PromptCache::Off).unwrap();
        assert_eq!(p.kv_blocks, 100);
        assert!(p.plan.fits, "{:?}", p.plan.terms);
        assert_eq!(p.plan.headroom_bytes as u64, weights + 100 * BLOCK);
    }

    #[test]
    fn fixed_and_workload_budgets() {
        let s = spec(
            vec![Attention::Full, Attention::Sliding { window: 100 }],
            4096,
        );
        let fixed = ServePlan::new(
            &s,
            inputs(1024, 2, 1 << 40),
            KvBudget::Bytes(1 << 20),
            PromptCache::Off,
        )
        .unwrap();
        // One full layer: blocks of 2 x 64 x 2 x 2 x 16 bytes; the sliding
        // rings (7 blocks per slot) come off the budget first.
        let block = 2 * 64 * 2 * 2 * 16;
        assert_eq!(fixed.kv_block_bytes, block);
        assert_eq!(fixed.sliding_bytes, 2 * 7 * block);
        assert_eq!(fixed.kv_blocks, ((1 << 20) - 2 * 7 * block) / block);
        let workload = ServePlan::new(
            &s,
            inputs(1024, 2, 1),
            KvBudget::Workload,
            PromptCache::Bytes(DEFAULT_PROMPT_CACHE_BYTES),
        )
        .unwrap();
        assert_eq!(
            workload.kv_blocks,
            2 * 64 + DEFAULT_PROMPT_CACHE_BYTES / block
        );
        assert!(!workload.plan.fits, "1 byte of memory cannot hold it");
    }

    pub(super) fn cuda(max_tokens: u64, batch: u64, available: u64) -> PlanInputs {
        PlanInputs {
            device: Device::Cuda,
            ..inputs(max_tokens, batch, available)
        }
    }

    /// The backend term of a GPU plan as the backend's carve gives it:
    /// everything the allocation holds besides weights, arena, KV and
    /// recurrent state, plus what the driver and libraries take outside it.
    pub(super) fn carved_backend(plan: &fathom_plan::MemoryPlan) -> u64 {
        use fathom_plan::cuda::DeviceLayout;
        let resident = plan.weights_bytes + plan.converted_bytes;
        let moe = plan
            .device_layout
            .as_ref()
            .map(|l| l.moe)
            .unwrap_or_default();
        let l = DeviceLayout::new(
            resident,
            &plan.activation_detail,
            &plan.kv_detail,
            plan.recurrent_bytes,
            moe,
            0,
        );
        let kv: u64 = l.kv.iter().map(|r| r.bytes).sum();
        DeviceLayout::outside_allocation() + l.size
            - resident
            - l.arena.bytes
            - kv
            - l.recurrent.bytes
    }

    #[test]
    fn a_gpu_pool_is_carved_and_planned_with_its_own_alignment() {
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        // 37 blocks: a pool whose regions round differently from the
        // workload's 4 x 64 blocks.
        for budget in [KvBudget::Bytes(37 * BLOCK), KvBudget::Workload] {
            let p = ServePlan::new(&s, cuda(1024, 4, 1 << 40), budget, PromptCache::Off).unwrap();
            assert_eq!(p.plan.backend_bytes, carved_backend(&p.plan), "{budget:?}");
            let term = p.plan.terms.iter().find(|t| t.name == "backend").unwrap();
            assert_eq!(term.bytes, p.plan.backend_bytes);
            let sum: u64 = p.plan.terms.iter().map(|t| t.bytes).sum();
            assert_eq!(p.plan.total_bytes, sum, "{budget:?}");
        }
    }

    #[test]
    fn a_gpu_auto_pool_takes_whole_blocks_of_what_the_device_leaves() {
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        let roomy =
            ServePlan::new(&s, cuda(1024, 4, 1 << 40), KvBudget::Auto, PromptCache::Off).unwrap();
        let others = roomy.plan.total_bytes - roomy.plan.kv_bytes;
        // Room for about 100 blocks: every offset within a block and the
        // 2 MiB rounding of the allocation lands on a plan that fits, and
        // one more block would not.
        for extra in [0, 1, BLOCK / 2, BLOCK - 1, 1 << 20] {
            let available = others + 100 * BLOCK + extra;
            let p = ServePlan::new(
                &s,
                cuda(1024, 4, available),
                KvBudget::Auto,
                PromptCache::Off,
            )
            .unwrap();
            assert!(p.plan.fits, "{extra}: {} over", p.plan.overflow_bytes);
            assert_eq!(
                p.plan.total_bytes,
                p.plan.terms.iter().map(|t| t.bytes).sum::<u64>()
            );
            let more = ServePlan::new(
                &s,
                cuda(1024, 4, available),
                KvBudget::Bytes((p.kv_blocks + 1) * BLOCK),
                PromptCache::Off,
            )
            .unwrap();
            assert!(
                !more.plan.fits,
                "{extra}: {} blocks, one more fits too",
                p.kv_blocks
            );
        }
    }

    #[test]
    fn request_buffers_are_host_memory_on_a_gpu() {
        use fathom_plan::serve::RequestBuffers;
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        let requests = RequestBuffers {
            slots: 4,
            processors: 2,
            max_body_bytes: 4 << 20,
            max_token_bytes: 16,
        };
        let serve = |i: PlanInputs, r: RequestBuffers| {
            ServePlan::with_requests(&s, i, KvBudget::Workload, PromptCache::Off, r, 1).unwrap()
        };
        let bare = serve(cuda(1024, 4, 1 << 40), RequestBuffers::NONE);
        let with = serve(cuda(1024, 4, 1 << 40), requests);
        assert_eq!(
            with.plan.total_bytes, bare.plan.total_bytes,
            "the device's plan"
        );
        let (h0, h1) = (bare.plan.host.unwrap(), with.plan.host.unwrap());
        let constraints = fathom_plan::serve::constraints_bytes(s.vocab, 1024, 4);
        assert_eq!(
            h1.total_bytes,
            h0.total_bytes + requests.bytes(1024) + constraints
        );
        assert!(h1.terms.iter().any(|t| t.name == "requests"));
        assert!(h1.terms.iter().any(|t| t.name == "constraints"));
        // On the CPU the same term is part of the one budget.
        let cpu = serve(inputs(1024, 4, 1 << 40), requests);
        let cpu_bare = serve(inputs(1024, 4, 1 << 40), RequestBuffers::NONE);
        assert_eq!(
            cpu.plan.total_bytes,
            cpu_bare.plan.total_bytes + requests.bytes(1024) + constraints
        );
    }

    #[test]
    fn an_empty_pool_is_an_error_that_says_what_to_lower() {
        let s = spec(vec![Attention::Full, Attention::Full], 4096);
        let err = ServePlan::new(
            &s,
            inputs(1024, 4, 1 << 20),
            KvBudget::Auto,
            PromptCache::Off,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("0 blocks") && err.contains("--ctx-size"),
            "{err}"
        );
    }
}

fn qwen3_5_4b(tag: &str) -> ModelSpec {
    let dir = std::env::temp_dir().join(format!(
        "fathom-plan-recurrent-{tag}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen3.5-4b.gguf");
    fx::write_gguf(&fx::qwen3_5_4b(), &path, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    spec
}

const GIB: u64 = 1 << 30;

/// Qwen3.5-4B: 32 layers, every 4th full attention. The 24 linear layers
/// each hold, per sequence, a convolution state of (4 − 1) taps × (2 × 16
/// key heads × 128 + 32 value heads × 128) = 3 × 8192 values and 32 delta
/// states of 128 × 128, in f32: (24,576 + 524,288) × 4 = 2,195,456 bytes a
/// layer, 52,690,944 (50.25 MiB) a sequence. Only the 8 full layers hold
/// KV: 4 KV heads × (256 + 256) × 2 bytes = 4096 bytes a token a layer.
#[test]
fn qwen3_5_4b_recurrent_state_by_hand() {
    let spec = qwen3_5_4b("hand");
    let per_layer = (3 * 8192 + 32 * 128 * 128) * 4;
    assert_eq!(per_layer, 2_195_456);
    let per_sequence = 24 * per_layer;
    assert_eq!(per_sequence, 52_690_944);

    let plan = MemoryPlan::new(&spec, inputs(4096, 4, 64 * GIB)).unwrap();
    let r = plan
        .recurrent_detail
        .as_ref()
        .expect("a hybrid model's term");
    assert_eq!((r.layers, r.dtype), (24, "f32"));
    assert_eq!(r.conv_values_per_layer, 3 * 8192);
    assert_eq!(r.delta_values_per_layer, 32 * 128 * 128);
    assert_eq!(r.bytes_per_sequence, per_sequence);
    assert_eq!(plan.recurrent_bytes, 4 * per_sequence);
    let term = plan
        .terms
        .iter()
        .find(|t| t.name == "recurrent_state")
        .unwrap();
    assert_eq!(term.bytes, 4 * per_sequence);
    assert!(
        term.derivation.contains("24 linear-attention layers"),
        "{}",
        term.derivation
    );

    // KV: the 8 full-attention layers only, 4096 tokens, 4 sequences.
    assert_eq!(plan.kv_bytes_per_token, 8 * 4096);
    assert_eq!(plan.kv_bytes, 8 * 4096 * 4096 * 4);
    assert_eq!(plan.kv_detail.len(), 1);
    assert_eq!(plan.kv_detail[0].layers, 8);

    // The total carries the term: the same plan without it is that much less.
    let sum: u64 = plan.terms.iter().map(|t| t.bytes).sum();
    assert_eq!(plan.total_bytes, sum);
}

/// Qwen3.5-4B as its Hugging Face directory (BF16 safetensors): the same
/// recurrent state and KV as its GGUF, by the same hand derivation, the
/// weights as stored, and the small tensors converted to f32 at load. Per linear layer: the convolution's 8192 channels × 4 taps
/// (`[8192, 1, 4]`), `A_log` and `dt_bias` of 32, the gated norm of 128
/// and two layer norms of 2560 = 38,080 values; per full layer: q and k
/// norms of 256 and the two layer norms = 5632; the final norm 2560.
#[test]
fn qwen3_5_4b_hf_directory_plans_its_state_and_converted_tensors_by_hand() {
    let dir = std::env::temp_dir().join(format!("fathom-plan-q35-hf-{}", std::process::id()));
    let model = fx::qwen3_5_4b();
    fx::write_hf_dir(&model, &dir, 2, Data::Sparse).unwrap();
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&dir).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(spec.family, Family::Qwen35);
    let plan = MemoryPlan::new(&spec, inputs(4096, 4, 64 * GIB)).unwrap();
    let gguf = MemoryPlan::new(&qwen3_5_4b("hf-twin"), inputs(4096, 4, 64 * GIB)).unwrap();
    assert_eq!(plan.recurrent_bytes, 4 * 52_690_944);
    assert_eq!(plan.recurrent_detail, gguf.recurrent_detail);
    assert_eq!(plan.kv_bytes, 8 * 4096 * 4096 * 4);
    assert_eq!(plan.kv_detail, gguf.kv_detail);

    let converted_values =
        24 * (8192 * 4 + 32 + 32 + 128 + 2 * 2560) + 8 * (2 * 256 + 2 * 2560) + 2560;
    assert_eq!(converted_values, 961_536);
    assert_eq!(plan.converted_bytes, converted_values * 4);
    assert_eq!(
        plan.weights_bytes,
        model.total_bytes(),
        "stored, read in place"
    );

    // Quantized as llama.cpp would quantize its GGUF: the same bytes for
    // every type (the taps and the shared gates stay f32 in both).
    let advice = |spec: &ModelSpec, plan: &MemoryPlan| {
        fathom_plan::quant::advise(spec, plan.kv_bytes, plan.recurrent_bytes, 64 * GIB).options
    };
    let gguf_spec = qwen3_5_4b("hf-quant");
    assert_eq!(advice(&spec, &plan), advice(&gguf_spec, &gguf));
}

/// On a GPU the state is carved from the one allocation, once: the device
/// layout holds a region of exactly the `recurrent_state` term (after the
/// KV, apart from the backend term, which it does not inflate), and the
/// step area one slot word per sequence of a step; a model without linear
/// layers gets neither.
#[test]
fn a_gpu_carves_the_recurrent_state_once() {
    let spec = qwen3_5_4b("gpu-carve");
    let plan = MemoryPlan::new(&spec, serve::cuda(4096, 4, 64 * GIB)).unwrap();
    let l = plan.device_layout.as_ref().expect("a CUDA plan carves");
    assert_eq!(l.recurrent.bytes, 4 * 52_690_944);
    assert_eq!(l.recurrent.bytes, plan.recurrent_bytes);
    let kv_end = l.kv.iter().map(|r| r.offset + r.bytes).max().unwrap();
    assert!(l.recurrent.offset >= kv_end && l.recurrent.offset + l.recurrent.bytes <= l.size);
    assert_eq!(l.upload.slots, l.upload.seqs);
    assert_eq!(plan.backend_bytes, serve::carved_backend(&plan));
    let sum: u64 = plan.terms.iter().map(|t| t.bytes).sum();
    assert_eq!(plan.total_bytes, sum);

    let stateless = ModelSpec {
        linear: None,
        ..spec.clone()
    };
    let plan = MemoryPlan::new(&stateless, serve::cuda(4096, 4, 64 * GIB)).unwrap();
    let l = plan.device_layout.as_ref().unwrap();
    assert_eq!((l.recurrent.bytes, l.upload.slots), (0, 0));
}

/// The term does not grow with the context, so the largest context that
/// fits with it is the largest that fits without it in a budget smaller by
/// exactly the state (and by the wider arena the linear layers' buffers
/// take); and a budget short of the state fits no context.
#[test]
fn largest_context_and_admission_read_the_state() {
    let spec = qwen3_5_4b("context");
    let stateless = ModelSpec {
        linear: None,
        ..spec.clone()
    };
    let state = 16 * 52_690_944;
    for budget in [4 * GIB, 5 * GIB, 8 * GIB] {
        let with = MemoryPlan::new(&spec, inputs(4096, 16, budget)).unwrap();
        let arena = MemoryPlan::new(&stateless, inputs(4096, 16, budget)).unwrap();
        let wider = with.activation_bytes - arena.activation_bytes;
        let without =
            MemoryPlan::new(&stateless, inputs(4096, 16, budget - state - wider)).unwrap();
        assert_eq!(with.recurrent_bytes, state);
        assert_eq!(without.recurrent_bytes, 0);
        assert_eq!(with.max_context_that_fits, without.max_context_that_fits);
        assert!(with.max_context_that_fits > 0);
    }
    let roomy = MemoryPlan::new(&spec, inputs(1, 16, 64 * GIB)).unwrap();
    let short = roomy.total_bytes - 1;
    let plan = MemoryPlan::new(&spec, inputs(4096, 16, short)).unwrap();
    assert_eq!(plan.max_context_that_fits, 0);
    let stateless_plan = MemoryPlan::new(&stateless, inputs(4096, 16, short)).unwrap();
    assert!(
        stateless_plan.max_context_that_fits > 0,
        "only the state is short"
    );

    // The server's auto KV pool gets what is left after the states too,
    // and a hybrid model has no prompt cache.
    let serve = |available| {
        ServePlan::new(
            &spec,
            inputs(4096, 16, available),
            KvBudget::Auto,
            PromptCache::Auto,
        )
        .unwrap()
    };
    let served = serve(64 * GIB);
    assert_eq!(served.prompt_cache_bytes, 0);
    assert_eq!(served.plan.recurrent_bytes, 16 * 52_690_944);
    let blocks = served.kv_blocks;
    assert_eq!(blocks, 16 * 4096 / 16, "the workload's blocks, no cache");
    let tight = serve(served.plan.total_bytes - 10 * served.kv_block_bytes);
    assert_eq!(tight.kv_blocks, blocks - 10);
}

/// `--recommend-quant` counts the state beside weights and KV.
#[test]
fn quant_advice_counts_the_state() {
    let spec = qwen3_5_4b("quant");
    let plan = MemoryPlan::new(&spec, inputs(4096, 2, 64 * GIB)).unwrap();
    let advice = fathom_plan::quant::advise(&spec, plan.kv_bytes, plan.recurrent_bytes, 64 * GIB);
    for o in &advice.options {
        assert_eq!(o.recurrent_bytes, 2 * 52_690_944);
        assert_eq!(
            o.total_bytes,
            o.weights_bytes + o.kv_bytes + o.recurrent_bytes
        );
    }
}

/// Gemma 4 31B at 8192 tokens of context: the 50 sliding layers hold their
/// window of 1024 tokens of 16 KV heads × (256 + 256) values, the 10
/// global layers every token of 4 KV heads × (512 + 512), in f16. The
/// arena's k and v rows are the widest layer's (16 × 256), not the most KV
/// heads times the widest head (16 × 512); q takes the global layers' 32 ×
/// 512.
#[test]
fn gemma4_31b_kv_by_hand() {
    let dir = std::env::temp_dir().join(format!("fathom-plan-gemma4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gemma-4-31b.gguf");
    fx::write_gguf(
        &fx::gemma_4_31b(),
        &path,
        GgufTensorType::Q4_K,
        Data::Sparse,
    )
    .unwrap();
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    let (sliding, global) = (16 * (256 + 256) * 2, 4 * (512 + 512) * 2);
    assert_eq!((sliding, global), (16_384, 8_192));
    let plan = MemoryPlan::new(&spec, inputs(8192, 1, 64 * GIB)).unwrap();
    assert_eq!(plan.kv_bytes_per_token, 50 * sliding + 10 * global);
    assert_eq!(plan.kv_bytes, 50 * 1024 * sliding + 10 * 8192 * global);
    assert_eq!(plan.kv_bytes, 1_509_949_440);
    let groups: Vec<(u64, u64)> = plan
        .kv_detail
        .iter()
        .map(|g| (g.layers, g.tokens))
        .collect();
    assert_eq!(groups, [(50, 1024), (10, 8192)]);
    let width = |name: &str| {
        plan.activation_detail
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.width)
    };
    assert_eq!(width("q"), Some(32 * 512));
    assert_eq!((width("k"), width("v")), (Some(16 * 256), Some(16 * 256)));
    assert_eq!(width("attn_out"), Some(32 * 512));
}
