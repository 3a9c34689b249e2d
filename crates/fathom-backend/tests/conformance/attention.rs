//! Paged attention over every KV dtype and shape, against an f64 reference.

use super::*;

/// `x` rounded to the cache's precision, head by head, as the CPU engine's
/// `round_to` does (q8_0 through fathom_kernels' own quantizer).
pub(crate) fn round_kv(dtype: KvDtype, x: &[f32], hd: usize) -> Vec<f32> {
    match dtype {
        KvDtype::F32 => x.to_vec(),
        KvDtype::F16 => x
            .iter()
            .map(|&v| ops::f16_to_f32(ops::f32_to_f16(v)))
            .collect(),
        KvDtype::Bf16 => x.iter().map(|&v| ops::bf16_to_f32(bf16_of(v))).collect(),
        KvDtype::Q8_0 => {
            let mut out = vec![0f32; x.len()];
            let mut bytes = vec![0u8; hd / 32 * 34];
            for (src, dst) in x.chunks(hd).zip(out.chunks_mut(hd)) {
                ops::quantize_q8_0_row(src, &mut bytes);
                ops::dequantize_q8_0_row(&bytes, dst);
            }
            out
        }
    }
}

/// One sequence's history as the reference keeps it: rounded K and V rows.
#[derive(Default, Clone)]
pub(crate) struct History {
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
}

/// `sinks`: per query head a logit in each softmax's denominator that
/// weighs no value (gpt-oss), or none.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_ref(
    s: &AttentionShape,
    starts: &[(usize, usize)],
    hist: &[History],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sinks: Option<&[f32]>,
) -> Vec<f64> {
    let (nh, nkv, dk, dv) = (s.n_heads, s.n_kv_heads, s.key_dim, s.value_dim);
    let mut out = Vec::new();
    let mut row0 = 0;
    for (si, &(start, tokens)) in starts.iter().enumerate() {
        for t in 0..tokens {
            let p = start + t;
            let first = s.window.map(|w| (p + 1).saturating_sub(w)).unwrap_or(0);
            let row = row0 + t;
            for hh in 0..nh {
                let g = hh / (nh / nkv);
                let qr = &q[(row * nh + hh) * dk..(row * nh + hh + 1) * dk];
                let key = |j: usize| -> (&[f32], &[f32]) {
                    if j < start {
                        (
                            &hist[si].k[j][g * dk..(g + 1) * dk],
                            &hist[si].v[j][g * dv..(g + 1) * dv],
                        )
                    } else {
                        let r = row0 + j - start;
                        (
                            &k[(r * nkv + g) * dk..(r * nkv + g + 1) * dk],
                            &v[(r * nkv + g) * dv..(r * nkv + g + 1) * dv],
                        )
                    }
                };
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        let (kj, _) = key(j);
                        qr.iter()
                            .zip(kj)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * s.scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let sink = sinks.map_or(0.0, |sk| (sk[hh] as f64 - m).exp());
                let sum: f64 = e.iter().sum::<f64>() + sink;
                let mut o = vec![0f64; dv];
                for (j, w) in (first..=p).zip(&e) {
                    let (_, vj) = key(j);
                    for (oi, &vv) in o.iter_mut().zip(vj) {
                        *oi += w / sum * vv as f64;
                    }
                }
                out.extend(o);
            }
        }
        row0 += tokens;
    }
    out
}

/// Three steps (prefill, chunked prefill across blocks, batched decode) of
/// two sequences over two layers of one KV layout.
/// Each sequence's page tables, one per KV group.
pub(crate) type PageTables = [Vec<Vec<u32>>; 2];
/// One step: per sequence, (first position, tokens).
pub(crate) type StepRows = [(usize, usize); 2];

/// The two sequences' page tables and the steps (per sequence: first
/// position, tokens) the attention cases run: sequence 0 in blocks 5, 2, 9
/// (4 for the ring), sequence 1 in 7, 0, 3. With a sliding window, group 0
/// (full) is not used by the layers and group 1 rings.
pub(crate) fn attention_schedule(sliding: bool) -> (PageTables, &'static [StepRows]) {
    if sliding {
        (
            [
                vec![vec![5, 2, 9, 1], vec![4, 1]],
                vec![vec![7, 0, 3, 4], vec![0, 3]],
            ],
            &[
                [(0, 20), (0, 5)],
                [(20, 16), (5, 30)],
                [(36, 1), (35, 1)],
                [(37, 1), (36, 9)],
            ],
        )
    } else {
        (
            [vec![vec![5, 2, 9, 1]], vec![vec![7, 0, 3, 4]]],
            &[[(0, 20), (0, 5)], [(20, 1), (5, 30)], [(21, 1), (35, 1)]],
        )
    }
}

/// `rope`: the steps go through `attend` (rope of q and k, attention, the
/// cache write: on CUDA, decode steps do all of it in the attention
/// kernel), against the reference rope; else `attention` and `kv_write`.
/// A gpt-oss case (`label`) takes random sinks from -1 to 3, loaded here.
#[allow(clippy::too_many_arguments)]
pub(crate) fn test_attention(
    h: &mut Harness,
    rng: &mut Rng,
    label: &str,
    mut shape: AttentionShape,
    dtype: KvDtype,
    layers: [usize; 2],
    tables: [Vec<Vec<u32>>; 2],
    steps: &[[(usize, usize); 2]],
    rope: Option<&RopeParams>,
) {
    let (nh, nkv, dk, dv) = (
        shape.n_heads,
        shape.n_kv_heads,
        shape.key_dim,
        shape.value_dim,
    );
    let sinks: Option<Vec<f32>> = label
        .starts_with("gpt-oss")
        .then(|| (0..nh).map(|_| rng.f32_in(-1.0..3.0)).collect());
    if let Some(sk) = &sinks {
        shape.sinks = Some(h.b.load_vector(sk).expect("loads"));
    }
    let mut hist = vec![vec![History::default(); 2]; 2];
    for (si, st) in steps.iter().enumerate() {
        let seqs: Vec<StepSeq> = st
            .iter()
            .zip(&tables)
            .map(|(&(start, tokens), t)| StepSeq {
                start,
                tokens,
                tables: t,
            })
            .collect();
        let rows: usize = st.iter().map(|s| s.1).sum();
        let step = Step { seqs: &seqs, rows };
        for (li, &layer) in layers.iter().enumerate() {
            let q = uniform(rng, rows * nh * dk);
            let k = uniform(rng, rows * nkv * dk);
            let v = uniform(rng, rows * nkv * dv);
            h.set(Buf::Q, &q, nh * dk);
            h.set(Buf::K, &k, nkv * dk);
            h.set(Buf::V, &v, nkv * dv);
            let (q, k) = match rope {
                Some(r) => {
                    h.b.attend(layer, &shape, &step, IO, r);
                    let positions: Vec<usize> = step.positions().collect();
                    let rot = r.rotated.unwrap_or(dk);
                    let roped = |x: &[f32], heads: usize| -> Vec<f32> {
                        x.chunks(heads * dk)
                            .zip(&positions)
                            .flat_map(|(row, &p)| match &r.yarn {
                                Some(y) => rope_yarn_ref(row, heads, dk, p, r.theta, y),
                                None => rope_partial_ref(row, dk, rot, p, r.theta, r.neox, None),
                            })
                            .map(|v| v as f32)
                            .collect()
                    };
                    (roped(&q, nh), roped(&k, nkv))
                }
                None => {
                    h.b.attention(layer, &shape, &step, IO);
                    h.b.kv_write(layer, &step, Buf::K, Buf::V, &shape);
                    (q, k)
                }
            };
            let got = h.get(Buf::AttnOut, rows, nh * dv);
            let qr = if dtype == KvDtype::F16 {
                round_kv(dtype, &q, dk)
            } else {
                q.clone()
            };
            let kr = round_kv(dtype, &k, dk);
            let vr = round_kv(dtype, &v, dv);
            let want = attention_ref(&shape, st, &hist[li], &qr, &kr, &vr, sinks.as_deref());
            let op = if rope.is_some() {
                "attend"
            } else {
                "attention+kv_write"
            };
            // Against a q8_0 cache, a backend's rope (f32 angles) and the
            // reference's (f64) may put a key value on either side of an
            // int8 rounding boundary: one step of max/127 in that value.
            // The H100 machine's CPU and GPU both met such flips (nmse
            // 1.4e-8 to 6.1e-8 on Gemma 4's unscaled 256-value heads and
            // gpt-oss's); a wrong key, head or position moves it far more.
            let tol = if rope.is_some() && dtype == KvDtype::Q8_0 {
                TOL_ATTN_Q8_ROPE
            } else {
                TOL_ATTN
            };
            h.check(
                op,
                &format!("{label} {} L{layer} step{si}", dtype.name()),
                &got,
                &want,
                tol,
            );
            let mut row = 0;
            for (seq, &(_, tokens)) in st.iter().enumerate() {
                for t in 0..tokens {
                    let r = row + t;
                    hist[li][seq]
                        .k
                        .push(kr[r * nkv * dk..(r + 1) * nkv * dk].to_vec());
                    hist[li][seq]
                        .v
                        .push(vr[r * nkv * dv..(r + 1) * nkv * dv].to_vec());
                }
                row += tokens;
            }
        }
    }
}

/// The rope an attention case runs `attend` with: both pairings, and
/// gpt-oss's YaRN.
pub(crate) fn attention_rope(label: &str) -> RopeParams {
    let qwen3_5 = label.starts_with("Qwen3.5");
    let gpt_oss = label.starts_with("gpt-oss");
    RopeParams {
        theta: if gpt_oss { 150_000.0 } else { 500_000.0 },
        neox: label.starts_with("Llama") || qwen3_5 || gpt_oss,
        freqs: None,
        // Qwen3.5 rotates a quarter of each 256-value head.
        rotated: qwen3_5.then_some(64),
        yarn: gpt_oss.then_some(GPT_OSS_YARN),
    }
}

pub(crate) fn attention_cases() -> Vec<(String, AttentionShape, KvLayout, [usize; 2])> {
    let smol = AttentionShape {
        n_heads: 9,
        n_kv_heads: 3,
        key_dim: 64,
        value_dim: 64,
        window: None,
        scale: 0.125,
        sinks: None,
    };
    let llama = AttentionShape {
        n_heads: 32,
        n_kv_heads: 8,
        key_dim: 128,
        value_dim: 128,
        window: None,
        scale: 1.0 / 128f32.sqrt(),
        sinks: None,
    };
    // gemma-4-31B's head shapes (its GQA groups of 8 and 2; 16 of its 32
    // query heads a global layer, within the test's buffers), scores
    // unscaled: global heads of 512 (the split kernels' widest values a
    // lane), sliding heads of 256.
    let gemma4_global = AttentionShape {
        n_heads: 16,
        n_kv_heads: 2,
        key_dim: 512,
        value_dim: 512,
        window: None,
        scale: 1.0,
        sinks: None,
    };
    let gemma4_sliding = AttentionShape {
        n_heads: 32,
        n_kv_heads: 16,
        key_dim: 256,
        value_dim: 256,
        window: Some(32),
        scale: 1.0,
        sinks: None,
    };
    let mut out = Vec::new();
    for dtype in KvDtype::ALL {
        out.push((
            "SmolLM2 9/3x64".to_string(),
            smol,
            KvLayout {
                groups: vec![group(dtype, 3, 64, 64, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
                recurrent: None,
            },
            [0, 1],
        ));
    }
    for dtype in [KvDtype::F16, KvDtype::Q8_0] {
        out.push((
            "Llama-8B 32/8x128".to_string(),
            llama,
            KvLayout {
                groups: vec![group(dtype, 8, 128, 128, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
                recurrent: None,
            },
            [0, 1],
        ));
        // Qwen3.5's gated attention layers: 16 heads over 4 KV heads of 256,
        // a partial rope (`attention_rope`).
        out.push((
            "Qwen3.5 16/4x256".to_string(),
            AttentionShape {
                n_heads: 16,
                n_kv_heads: 4,
                key_dim: 256,
                value_dim: 256,
                window: None,
                scale: 1.0 / 16.0,
                sinks: None,
            },
            KvLayout {
                groups: vec![group(dtype, 4, 256, 256, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
                recurrent: None,
            },
            [0, 1],
        ));
        // A sliding-window layer (window 32: a ring of two blocks) beside a
        // full one, as Gemma 3 interleaves them.
        let sliding = AttentionShape {
            window: Some(32),
            ..smol
        };
        out.push((
            "sliding w32 9/3x64".to_string(),
            sliding,
            KvLayout {
                groups: vec![
                    group(dtype, 3, 64, 64, 1, None, 12),
                    group(dtype, 3, 64, 64, 2, Some(32), 6),
                ],
                dtype,
                layer_groups: vec![Some(0), Some(1), Some(1)],
                recurrent: None,
            },
            [1, 2],
        ));
        out.push((
            "Gemma4 global 16/2x512".to_string(),
            gemma4_global,
            KvLayout {
                groups: vec![group(dtype, 2, 512, 512, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
                recurrent: None,
            },
            [0, 1],
        ));
        // Gemma 4 interleaves the two: a global group beside the ring of
        // the sliding heads, as the plan groups them.
        out.push((
            "Gemma4 sliding w32 32/16x256".to_string(),
            gemma4_sliding,
            KvLayout {
                groups: vec![
                    group(dtype, 2, 512, 512, 1, None, 12),
                    group(dtype, 16, 256, 256, 2, Some(32), 6),
                ],
                dtype,
                layer_groups: vec![Some(0), Some(1), Some(1)],
                recurrent: None,
            },
            [1, 2],
        ));
    }
    out
}

/// gpt-oss's attention cases, apart from [`attention_cases`] (which keep
/// their random data): its heads, with sinks (`test_attention`) and YaRN
/// (`attention_rope`), on an f16 and a q8_0 cache.
pub(crate) fn gpt_oss_attention_cases() -> Vec<(String, AttentionShape, KvLayout, [usize; 2])> {
    // 16 of its 64 query heads over 2 of its 8 KV heads (its GQA group of 8).
    let gpt_oss = AttentionShape {
        n_heads: 16,
        n_kv_heads: 2,
        key_dim: 64,
        value_dim: 64,
        window: None,
        scale: 0.125,
        sinks: None,
    };
    let mut out = Vec::new();
    for dtype in [KvDtype::F16, KvDtype::Q8_0] {
        // A full layer; then a sliding one (layer 0 over a ring; layer 1
        // takes the same window over a full cache).
        out.push((
            "gpt-oss 16/2x64".to_string(),
            gpt_oss,
            KvLayout {
                groups: vec![group(dtype, 2, 64, 64, 2, None, 12)],
                dtype,
                layer_groups: vec![Some(0), Some(0)],
                recurrent: None,
            },
            [0, 1],
        ));
        // Window 32 (a ring of two blocks, more than any step's rows of a
        // sequence), then 8 (a ring of one block, which steps of 20 and 30
        // rows wrap: only the last of the rows that share a slot may land).
        for window in [32, 8] {
            out.push((
                format!("gpt-oss sliding w{window} 16/2x64"),
                AttentionShape {
                    window: Some(window),
                    ..gpt_oss
                },
                KvLayout {
                    groups: vec![
                        group(dtype, 2, 64, 64, 1, None, 12),
                        group(dtype, 2, 64, 64, 1, Some(window as u64), 6),
                    ],
                    dtype,
                    layer_groups: vec![Some(1), Some(0)],
                    recurrent: None,
                },
                [0, 1],
            ));
        }
    }
    out
}
