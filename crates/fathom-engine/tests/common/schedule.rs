//! One fixed schedule of steps for comparing two engines' logits row by
//! row: chunked prefills beside each other, then batched decode.

use fathom_engine::{Engine, ScoreRows, Segment};

/// Every logits row of a fixed schedule of steps (the tokens fed, not
/// sampled, so both devices run the same inputs): three prompts of 13, 20
/// and 6 tokens prefilled in chunks of up to 8 tokens, two of them sharing
/// steps, then 4 steps decoding all three together (one-token steps: the
/// decode kernels, replayed as graphs). Token ids are taken modulo
/// `vocab`, which changes none of them from 763 up (they are at most 762).
/// Rows in step order; every sequence is released at the end, so a second
/// run reuses their KV blocks and state slots.
pub fn schedule_logits(engine: &mut Engine, vocab: u32) -> Vec<Vec<f32>> {
    let prompts: Vec<Vec<u32>> = [(13u32, 5u32), (20, 19), (6, 33)]
        .iter()
        .map(|&(n, seed)| (0..n).map(|j| (j * seed + 3) % vocab).collect())
        .collect();
    let decode = 4;
    let mut seqs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut seq = engine.open_sequence(&[]);
            assert!(engine.reserve(&mut seq, p.len() + decode));
            seq
        })
        .collect();
    // Per step, per segment: (sequence, token range).
    let mut steps: Vec<Vec<(usize, std::ops::Range<usize>)>> = vec![
        vec![(0, 0..8)],
        vec![(0, 8..13), (1, 0..3)],
        vec![(1, 3..11)],
        vec![(1, 11..18)],
        vec![(1, 18..20), (2, 0..6)],
    ];
    let extended: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let more = (0..decode as u32).map(|j| (j * 71 + 17 * i as u32 + 1) % vocab);
            p.iter().copied().chain(more).collect()
        })
        .collect();
    for d in 0..decode {
        steps.push(
            (0..3)
                .map(|i| (i, prompts[i].len() + d..prompts[i].len() + d + 1))
                .collect(),
        );
    }
    let mut rows = Vec::new();
    for step in &steps {
        // Segments in sequence order (each step lists its sequences so).
        let mut segments: Vec<Segment> = seqs
            .iter_mut()
            .enumerate()
            .filter_map(|(i, seq)| {
                let (_, r) = step.iter().find(|(j, _)| *j == i)?;
                Some(Segment {
                    seq,
                    tokens: &extended[i][r.clone()],
                })
            })
            .collect();
        let wanted: Vec<ScoreRows> = step
            .iter()
            .enumerate()
            .map(|(k, (_, r))| ScoreRows {
                segment: k,
                rows: 0..r.len(),
            })
            .collect();
        engine
            .step_scoring(&mut segments, &wanted, &mut |_, _, l| rows.push(l.to_vec()))
            .unwrap();
    }
    for seq in &mut seqs {
        engine.release(seq);
    }
    rows
}
