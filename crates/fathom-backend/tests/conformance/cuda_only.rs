//! The CUDA backend's own checks (skipped without a GPU): routed experts, graphs, attention splits,
//! tiled prefill, start-up memory, KV bytes and speed.

use super::*;

/// One-token MoE on the routes the device holds (CUDA) against the same
/// backend's expert-by-expert gather path: bit for bit (the same matvec
/// kernels, the weighted sum in the same expert order), and without the
/// routes' read-back (which the gather path needs) for every kind pair with
/// routed kernels, and for gpt-oss's biased MXFP4 experts; Q4_1, without,
/// reads them back.
#[test]
pub(crate) fn cuda_routed_experts_equal_the_gather_path() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let mut rng = Rng::xorshift64_star(0x3e7_0001);
    for kinds in routed_kinds() {
        let experts = load_experts(&mut h, &mut rng, kinds);
        let routed = kinds.0 != WeightType::Q4_1;
        device_routing_equals_gather(&mut h, &mut rng, &experts.label, routed, |h, rng| {
            route_and_run(h, rng, &experts, Glu::Silu, None, 1);
        });
    }
    let moe = load_gpt_oss_moe(&mut h, &mut rng);
    device_routing_equals_gather(&mut h, &mut rng, "gpt-oss MXFP4", true, |h, rng| {
        route_and_run(h, rng, &moe.experts, Glu::SwigluOai, Some(&moe.biases()), 1);
    });
    h.b.use_device_routing(true);
}

/// MoE steps of several rows grouped by expert on the device, for every
/// kind pair and gpt-oss's biased MXFP4 experts, at 2, 37 and 256 rows (16
/// experts, 4 a row: up to 64 rows an expert and more): the routes are
/// never read back (so such a step can stay a graph), where the gather
/// path of the same backend reads them back once; the outputs match the
/// f64 FFNs within the routed tolerance. Not against the gather path's
/// outputs: its steps past 64 rows take cuBLAS on weights dequantized to
/// f16, which overflow on the random Q5_K experts (the H100 gave
/// non-finite outputs there at 256 rows; the grouped path's tensor-core
/// kernels sum the decoded f32 values).
#[test]
pub(crate) fn cuda_grouped_experts_match_the_gather_path() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let mut rng = Rng::xorshift64_star(0x3e7_0002);
    let d = ROUTED.2;
    let plain: Vec<Experts> = routed_kinds()
        .into_iter()
        .map(|kinds| load_experts(&mut h, &mut rng, kinds))
        .collect();
    let moe = load_gpt_oss_moe(&mut h, &mut rng);
    let mut cases: Vec<(&Experts, Glu, Option<MoeBiases>)> =
        plain.iter().map(|e| (e, Glu::Silu, None)).collect();
    cases.push((&moe.experts, Glu::SwigluOai, Some(moe.biases())));
    for (experts, act, biases) in &cases {
        let label = &experts.label;
        for rows in [2, 37, 256] {
            let seed = rng.clone();
            let mut read_backs = Vec::new();
            let mut grouped = None;
            for device in [true, false] {
                h.b.use_device_routing(device);
                rng = seed.clone();
                let before = h.b.routes_read_back();
                let run = route_and_run(&mut h, &mut rng, experts, *act, biases.as_ref(), rows);
                read_backs.push(h.b.routes_read_back() - before);
                if device {
                    grouped = Some((run, h.get(Buf::BranchOut, rows, d)));
                }
            }
            assert_eq!(
                read_backs,
                [0, 1],
                "{label} x{rows}: routes read back (grouped on the device, gather path)"
            );
            let ((x, logits), got) = grouped.expect("the device run");
            let exact = biases.as_ref().map(|b| b.experts);
            let want = routed_ref(experts, exact, *act, &x, &logits, rows);
            h.check(
                "grouped_experts",
                &format!("{label} x{rows}"),
                &got,
                &want,
                2.0 * TOL_MATMUL,
            );
        }
    }
    h.b.use_device_routing(true);
    let failures = h.finish();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `run` (one row of a MoE layer into BranchOut) with the device's routes
/// and through the gather path, from the same random state: the outputs
/// equal bit for bit, and the routes read back only on the gather path
/// where the kinds have `routed` kernels (else on both).
fn device_routing_equals_gather(
    h: &mut Harness<CudaBackend>,
    rng: &mut Rng,
    label: &str,
    routed: bool,
    mut run: impl FnMut(&mut Harness<CudaBackend>, &mut Rng),
) {
    let d = ROUTED.2;
    let seed = rng.clone();
    let mut outs = Vec::new();
    let mut read_backs = Vec::new();
    for device in [true, false] {
        h.b.use_device_routing(device);
        *rng = seed.clone();
        let before = h.b.routes_read_back();
        run(h, rng);
        outs.push(h.get(Buf::BranchOut, 1, d));
        read_backs.push(h.b.routes_read_back() - before);
    }
    assert_eq!(
        read_backs,
        [u64::from(!routed), 1],
        "{label}: routes read back (device routing, gather path)"
    );
    let differ = outs[0]
        .iter()
        .zip(&outs[1])
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differ, 0,
        "{label}: {differ} of {d} values differ from the gather path"
    );
    println!("{label}: device routing = gather path, bit for bit");
}

/// A repeated step of exactly GRAPH_MAX_NODES launches (an embedding and
/// one-row f32 matmuls, a cuBLAS kernel each, then the logits read-back)
/// becomes one graph within GRAPH_BYTES of device memory; one launch more
/// runs launch by launch and takes none. Runs alone in its process
/// (run.sh): the driver reuses graph memory an earlier graph left.
#[test]
pub(crate) fn cuda_graph_memory_within_plan() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let eye = h.eye;
    for nodes in [GRAPH_MAX_NODES, GRAPH_MAX_NODES + 1] {
        let before = (h.b.memory().free, h.b.graph_stats());
        for _ in 0..3 {
            h.b.embed(eye, &[0], 1.0, Buf::Norm);
            for _ in 0..nodes - 1 {
                h.b.matmul(eye, Buf::Norm, 1, Buf::Q);
            }
            h.b.logits(1, EYE);
        }
        let (after, stats) = (h.b.memory().free, h.b.graph_stats());
        let grown = before.0.saturating_sub(after);
        let captured = stats.captures - before.1.captures;
        println!("{nodes} launches a step: {captured} graph(s), {grown} bytes of device memory");
        if nodes <= GRAPH_MAX_NODES {
            assert_eq!(captured, 1, "a step of {nodes} launches is kept as a graph");
            assert!(
                grown <= GRAPH_BYTES,
                "its graph took {grown} bytes, {GRAPH_BYTES} planned"
            );
        } else {
            assert_eq!(
                captured, 0,
                "a step of {nodes} launches runs launch by launch"
            );
            assert_eq!(
                grown, 0,
                "launch by launch, yet {grown} bytes were allocated"
            );
        }
    }
}

/// The CUDA backend's split attention (key ranges cut into pieces, then
/// merged) on the conformance cases, which are too short for the backend to
/// split on its own: forced to 2, 5 and 40 pieces (empty pieces included;
/// more than the plan's `ATTENTION_MAX_SPLITS` where the partials hold them),
/// through the CUDA-core split kernels and through the tensor-core decode
/// kernel (forced where it applies: f16 caches of 64 or 128 dims; the
/// other cases run the split kernels again).
#[test]
pub(crate) fn cuda_attention_splits() {
    let mut failures = Vec::new();
    for (splits, mma) in [
        (2usize, false),
        (5, false),
        (40, false),
        (1, true),
        (2, true),
        (5, true),
        (40, true),
    ] {
        for (label, shape, mut kv, layers) in attention_cases()
            .into_iter()
            .chain(gpt_oss_attention_cases())
        {
            // Plan partials as for a long context: the conformance groups'
            // 128 tokens would not be split.
            for g in &mut kv.groups {
                g.tokens = 4096;
            }
            let sliding = shape.window.is_some();
            for rope in [None, Some(attention_rope(&label))] {
                let Some(mut b) = cuda_backend(&arena(), &kv) else {
                    return;
                };
                b.force_attention_splits(Some(splits));
                b.force_decode_mma(Some(mma));
                let mut h: Harness = Harness::new(Box::new(b));
                let mut rng = Rng::xorshift64_star(0x5b17 ^ splits as u64);
                let (tables, steps) = attention_schedule(sliding);
                let label = format!("{label} /{splits}{}", if mma { " mma" } else { "" });
                test_attention(
                    &mut h,
                    &mut rng,
                    &label,
                    shape,
                    kv.dtype,
                    layers,
                    tables,
                    steps,
                    rope.as_ref(),
                );
                failures.extend(h.finish());
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Rough speed of attention over a 4,096-position f16 cache (Llama-3.1-8B
/// heads: 32 query, 8 KV, 128 dims), one layer: a decode row, 16 rows and
/// a 256-token prefill chunk at the end of the context; then a serving
/// step's decode rows, one each of 64 sequences of 256 positions. Prints
/// only.
#[test]
pub(crate) fn cuda_attention_speed() {
    let arena = arena();
    let ctx = 4096usize;
    let blocks = (ctx / 16) as u64;
    // Room for the 64 short sequences too (16 blocks each).
    let (batch, batch_ctx) = (64usize, 256usize);
    let pool = blocks.max((batch * batch_ctx / 16) as u64);
    let mut g = group(KvDtype::F16, 8, 128, 128, 1, None, pool);
    g.tokens = ctx as u64;
    g.blocks_per_sequence = blocks;
    let kv = KvLayout {
        groups: vec![g],
        dtype: KvDtype::F16,
        layer_groups: vec![Some(0)],
        recurrent: None,
    };
    let Some(b) = cuda_backend(&arena, &kv) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let shape = AttentionShape {
        n_heads: 32,
        n_kv_heads: 8,
        key_dim: 128,
        value_dim: 128,
        window: None,
        scale: 1.0 / 128f32.sqrt(),
        sinks: None,
    };
    let tables = vec![(0..blocks as u32).collect::<Vec<u32>>()];
    let mut rng = Rng::xorshift64_star(11);
    // Fill the cache with values (else it holds whatever the allocation had).
    for chunk in 0..ctx / 256 {
        let seqs = [StepSeq {
            start: chunk * 256,
            tokens: 256,
            tables: &tables,
        }];
        let step = Step {
            seqs: &seqs,
            rows: 256,
        };
        h.set(Buf::K, &uniform(&mut rng, 256 * 1024), 1024);
        h.set(Buf::V, &uniform(&mut rng, 256 * 1024), 1024);
        h.b.kv_write(0, &step, Buf::K, Buf::V, &shape);
    }
    h.set(Buf::Q, &uniform(&mut rng, 256 * 4096), 4096);
    for (tokens, reps) in [(1usize, 50), (16, 20), (256, 5)] {
        let seqs = [StepSeq {
            start: ctx - tokens,
            tokens,
            tables: &tables,
        }];
        let step = Step {
            seqs: &seqs,
            rows: tokens,
        };
        h.b.attention(0, &shape, &step, IO);
        let _ = h.get(Buf::Logits, 1, 8);
        let t = std::time::Instant::now();
        for _ in 0..reps {
            h.b.attention(0, &shape, &step, IO);
        }
        let _ = h.get(Buf::Logits, 1, 8);
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "speed attention f16 32/8x128 ctx {ctx} x{tokens:3}: {:9.1} us a layer",
            s * 1e6
        );
    }
    let per_seq = batch_ctx / 16;
    let tables: Vec<Vec<Vec<u32>>> = (0..batch)
        .map(|i| {
            vec![(0..per_seq as u32)
                .map(|b| (i * per_seq) as u32 + b)
                .collect()]
        })
        .collect();
    for t in &tables {
        let seqs = [StepSeq {
            start: 0,
            tokens: batch_ctx,
            tables: t,
        }];
        let step = Step {
            seqs: &seqs,
            rows: batch_ctx,
        };
        h.set(Buf::K, &uniform(&mut rng, batch_ctx * 1024), 1024);
        h.set(Buf::V, &uniform(&mut rng, batch_ctx * 1024), 1024);
        h.b.kv_write(0, &step, Buf::K, Buf::V, &shape);
    }
    let seqs: Vec<StepSeq> = tables
        .iter()
        .map(|t| StepSeq {
            start: batch_ctx - 1,
            tokens: 1,
            tables: t,
        })
        .collect();
    let step = Step {
        seqs: &seqs,
        rows: batch,
    };
    h.b.attention(0, &shape, &step, IO);
    let _ = h.get(Buf::Logits, 1, 8);
    let t = std::time::Instant::now();
    for _ in 0..20 {
        h.b.attention(0, &shape, &step, IO);
    }
    let _ = h.get(Buf::Logits, 1, 8);
    let s = t.elapsed().as_secs_f64() / 20.0;
    let bytes = (batch * batch_ctx * 2 * 1024 * 2) as f64;
    println!(
        "speed attention f16 32/8x128 {batch} seqs x ctx {batch_ctx}: {:9.1} us a layer ({:.0} GB/s of K and V)",
        s * 1e6,
        bytes / s / 1e9
    );
}

/// The CUDA backend's matmul paths besides the tensor-core few-token
/// kernels, on the same cases: the f32 few-token kernel (up to 8 rows) and
/// cuBLAS on f16 beyond, then the tiled f32 kernel that cuBLAS falls back
/// to (prefill rows only).
#[test]
pub(crate) fn cuda_matmul_other_paths() {
    let arena = arena();
    let mut failures = Vec::new();
    for tiled in [false, true] {
        let Some(mut b) = cuda_backend(&arena, &small_kv()) else {
            return;
        };
        b.use_mma_few(false, None);
        b.use_tiled_prefill(tiled);
        let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
        let mut rng = Rng::xorshift64_star(0x7135);
        test_matmul(&mut h, &mut rng, tiled);
        failures.extend(h.finish());
    }
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Device memory of the CUDA backend's start-up steps and first launches
/// (cuMemGetInfo deltas) against the plan's terms for them: each step
/// within its constant, the allocation exactly its planned 2 MiB pages,
/// first launches nothing. Runs alone in its process (run.sh), on an idle
/// device, since the context term is read as total − free.
#[test]
pub(crate) fn cuda_startup_memory() {
    let arena = arena();
    let Some(mut b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let s = b.startup_memory().clone();
    let mib = |v: u64| v as f64 / (1 << 20) as f64;
    println!("cuda startup memory (cuMemGetInfo deltas, bytes):");
    println!(
        "  context (total - free after creation) {:>12} ({:.1} MiB)",
        s.context,
        mib(s.context)
    );
    println!(
        "  stream                                {:>12} ({:.1} MiB)",
        s.stream,
        mib(s.stream)
    );
    println!(
        "  module load (fatbin)                  {:>12} ({:.1} MiB)",
        s.module,
        mib(s.module)
    );
    println!(
        "  one allocation                        {:>12} ({:.1} MiB; requested {})",
        s.allocation,
        mib(s.allocation),
        s.allocation_requested
    );
    println!(
        "  cuBLAS handle                         {:>12} ({:.1} MiB)",
        s.blas_handle,
        mib(s.blas_handle)
    );
    println!(
        "  cuBLAS workspace (inside the carve)   {:>12} ({:.1} MiB)",
        s.blas_workspace,
        mib(s.blas_workspace)
    );
    println!(
        "  prefill staging (inside the carve)    {:>12} ({:.1} MiB)",
        s.gemm_staging,
        mib(s.gemm_staging)
    );
    println!("  cuBLAS from {}", b.blas_path());
    let before = b.memory().free;
    // First launches: a quantized matvec, a cuBLAS f16 GEMM and the tiled
    // kernel for prefill, SGEMM (the read-back), attention.
    let mut rng = Rng::xorshift64_star(7);
    let (m, _) = random_matrix(&mut rng, Ok(WeightType::Q4_K), 256, 1024);
    let id = b.load_matrix(m).expect("loads");
    b.matmul(id, Buf::Norm, 1, Buf::FfnUp);
    b.matmul(id, Buf::Norm, 100, Buf::FfnUp);
    b.use_tiled_prefill(true);
    b.matmul(id, Buf::Norm, 100, Buf::FfnUp);
    let mut h = Harness::new(Box::new(b));
    let got = h.get(Buf::FfnUp, 1, 8);
    assert_eq!(got.len(), 8);
    let tables = vec![vec![0u32]];
    let seqs = [StepSeq {
        start: 0,
        tokens: 3,
        tables: &tables,
    }];
    let step = Step {
        seqs: &seqs,
        rows: 3,
    };
    let shape = AttentionShape {
        n_heads: 1,
        n_kv_heads: 1,
        key_dim: 64,
        value_dim: 64,
        window: None,
        scale: 0.125,
        sinks: None,
    };
    h.b.attention(0, &shape, &step, IO);
    h.b.kv_write(0, &step, Buf::K, Buf::V, &shape);
    let _ = h.get(Buf::AttnOut, 1, 64);
    let after = h.b.memory();
    println!(
        "  first kernel launches + SGEMM          {:>12} ({:.1} MiB)",
        before.saturating_sub(after.free),
        mib(before.saturating_sub(after.free))
    );
    println!("  device free {} of {} after all", after.free, after.total);
    let first_launches = before.saturating_sub(after.free);
    let planned = [
        ("context", s.context, CONTEXT_BYTES),
        ("stream", s.stream, 0),
        ("module", s.module, MODULE_BYTES),
        ("cuBLAS handle", s.blas_handle, BLAS_HANDLE_BYTES),
        (
            "allocation",
            s.allocation,
            s.allocation_requested.next_multiple_of(ALLOCATION_GRANULE),
        ),
        ("first launches", first_launches, 0),
    ];
    let over: Vec<String> = planned
        .iter()
        .filter(|(_, got, plan)| got > plan)
        .map(|(what, got, plan)| format!("{what}: {got} B measured, {plan} B planned"))
        .collect();
    assert!(
        over.is_empty(),
        "start-up memory past the plan's terms (fathom_plan::cuda):\n{}",
        over.join("\n")
    );
}

/// The cache's bytes after one step, against the layout the CPU engine
/// uses (block b, layer l, slot s: K at b·block + l·16·(k_row+v_row) +
/// s·k_row, V 16·k_row further), for every KV dtype. Diagnostic detail on
/// a mismatch: which row, which byte.
#[test]
pub(crate) fn cuda_kv_bytes() {
    let arena = arena();
    for dtype in KvDtype::ALL {
        let kv = KvLayout {
            groups: vec![group(dtype, 3, 64, 64, 2, None, 12)],
            dtype,
            layer_groups: vec![Some(0), Some(0)],
            recurrent: None,
        };
        let Some(b) = cuda_backend(&arena, &kv) else {
            return;
        };
        let shape = AttentionShape {
            n_heads: 9,
            n_kv_heads: 3,
            key_dim: 64,
            value_dim: 64,
            window: None,
            scale: 0.125,
            sinks: None,
        };
        let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
        let mut rng = Rng::xorshift64_star(99);
        let tables = [vec![vec![5u32, 2, 9, 1]], vec![vec![7u32, 0, 3, 4]]];
        let seqs = [
            StepSeq {
                start: 0,
                tokens: 20,
                tables: &tables[0],
            },
            StepSeq {
                start: 0,
                tokens: 5,
                tables: &tables[1],
            },
        ];
        let step = Step {
            seqs: &seqs,
            rows: 25,
        };
        let (q, k, v) = (
            uniform(&mut rng, 25 * 576),
            uniform(&mut rng, 25 * 192),
            uniform(&mut rng, 25 * 192),
        );
        h.set(Buf::Q, &q, 576);
        h.set(Buf::K, &k, 192);
        h.set(Buf::V, &v, 192);
        h.b.attention(1, &shape, &step, IO);
        let kg = h.get(Buf::K, 25, 192);
        let kr = round_kv(dtype, &k, 64);
        let diff = kg.iter().zip(&kr).filter(|(a, b)| a != b).count();
        println!(
            "kv {}: in-place rounded K differs from the reference in {diff} of {}",
            dtype.name(),
            kr.len()
        );
        h.b.kv_write(1, &step, Buf::K, Buf::V, &shape);
        let _ = h.get(Buf::AttnOut, 1, 8);
        // Expected bytes of each written row.
        let row_bytes = dtype.row_bytes(192) as usize;
        let store = |x: &[f32]| -> Vec<u8> {
            match dtype {
                KvDtype::F32 => f32_bytes(x),
                KvDtype::F16 => x.iter().flat_map(|&v| f16_bytes(v)).collect(),
                KvDtype::Bf16 => x.iter().flat_map(|&v| bf16_of(v).to_le_bytes()).collect(),
                KvDtype::Q8_0 => {
                    let mut o = vec![0u8; row_bytes];
                    ops::quantize_q8_0_row(x, &mut o);
                    o
                }
            }
        };
        let g = &kv.groups[0];
        let block = g.block_bytes() as usize;
        let layer_off = 16 * 2 * row_bytes;
        let bytes = h.b.kv_bytes(0).expect("kv bytes");
        let mut bad = 0;
        let mut first = None;
        let mut row = 0;
        for (si, seq) in seqs.iter().enumerate() {
            for t in 0..seq.tokens {
                let p = seq.start + t;
                let blk = tables[si][0][p / 16] as usize;
                let base = blk * block + layer_off;
                let slot = p % 16;
                for (which, src, off) in [
                    ("K", &k, base + slot * row_bytes),
                    ("V", &v, base + 16 * row_bytes + slot * row_bytes),
                ] {
                    let want = store(&src[row * 192..(row + 1) * 192]);
                    let got = &bytes[off..off + row_bytes];
                    if got != &want[..] {
                        bad += 1;
                        if first.is_none() {
                            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                            first = Some(format!(
                                "{which} row {row} (seq {si} pos {p}) byte {i}: want {:?} got {:?}",
                                &want[i..(i + 8).min(row_bytes)],
                                &got[i..(i + 8).min(row_bytes)]
                            ));
                        }
                    }
                }
                row += 1;
            }
        }
        println!(
            "kv {}: {bad} of 50 cache rows differ; first: {:?}",
            dtype.name(),
            first
        );
    }
}

/// Rough speed of the matmul kernels on Llama-3.1-8B's ffn_gate shape
/// (14336×4096) in every listed type, and its attention output shape
/// (4096×4096) in two: one token (weight bytes / time against the HBM
/// bandwidth), 2 to 64 tokens on the tensor-core kernels (each depth split)
/// and on the paths before them, and a 256-token prefill chunk. Prints
/// only; a first look, not a benchmark (host-side timing around queued
/// launches, then a sync).
#[test]
pub(crate) fn cuda_speed() {
    let arena = arena();
    let Some(b) = cuda_backend(&arena, &small_kv()) else {
        return;
    };
    let mut h: Harness<CudaBackend> = Harness::new(Box::new(b));
    let mut rng = Rng::xorshift64_star(3);
    let cols = 4096;
    let x = uniform(&mut rng, 256 * cols);
    h.set(Buf::Norm, &x, cols);
    let ffn = [
        Ok(WeightType::Q4_K),
        Ok(WeightType::Q6_K),
        Ok(WeightType::Q8_0),
        Ok(WeightType::Q4_0),
        Ok(WeightType::Q4_1),
        Ok(WeightType::Q5_K),
        Ok(WeightType::F16),
        Ok(WeightType::F32),
        Err(4),
    ];
    let cases = ffn
        .into_iter()
        .map(|k| (14336, k))
        .chain([(4096, Ok(WeightType::Q4_K)), (4096, Ok(WeightType::Q8_0))]);
    for (rows, kind) in cases {
        let (m, _) = random_matrix(&mut rng, kind, rows, cols);
        let bytes = m.data.len() as f64;
        let id = h.b.load_matrix(m).expect("loads");
        // (tokens, repeats, path): "mma" the tensor-core few-token kernels
        // (with the depth split forced into 1, 2 or 4 warps where given),
        // "before" the paths they replace, "tiled" the fallback prefill.
        let mut runs = vec![(1usize, 200, "matvec", None)];
        for tokens in [2usize, 4, 8, 16, 32, 64] {
            runs.push((tokens, 100, "mma", None));
            if kind != Ok(WeightType::F32) {
                for kg in [1, 2, 4] {
                    runs.push((tokens, 100, "mma", Some(kg)));
                }
            }
            runs.push((tokens, 100, "before", None));
        }
        runs.extend([(256, 10, "tiled", None), (256, 10, "cuBLAS", None)]);
        for (tokens, reps, path, kgroups) in runs {
            h.b.use_tiled_prefill(path == "tiled");
            h.b.use_mma_few(path == "mma", kgroups);
            h.b.matmul(id, Buf::Norm, tokens, Buf::FfnUp);
            let _ = h.get(Buf::Logits, 1, 8);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                h.b.matmul(id, Buf::Norm, tokens, Buf::FfnUp);
            }
            let _ = h.get(Buf::Logits, 1, 8);
            let s = t.elapsed().as_secs_f64() / reps as f64;
            let split = kgroups.map_or(String::new(), |k| format!(" k{k}"));
            println!(
                "speed {:16} {path:6}{split:3} {rows}x{cols} x{tokens:3}: {:8.1} us  {:7.0} GB/s weights  {:6.1} TFLOP/s",
                kind_name(kind),
                s * 1e6,
                bytes / s / 1e9,
                2.0 * (rows * cols * tokens) as f64 / s / 1e12
            );
        }
    }
}
