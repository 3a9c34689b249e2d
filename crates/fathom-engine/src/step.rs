//! The one batching policy: which tokens of which sequences the next step
//! runs. `Engine::generate_batch` and the server's scheduler both build
//! their steps with it.

/// Sets `chunk[i]` to how many of sequence i's pending tokens (KV not yet
/// computed) the next step runs: one for each decoding sequence (exactly
/// one token pending) first, so long prompts do not stall them, then
/// prompt chunks in sequence order, up to `budget` tokens in all.
pub fn plan_step<I>(pending: I, budget: usize, chunk: &mut Vec<usize>)
where
    I: Iterator<Item = usize> + Clone,
{
    chunk.clear();
    chunk.extend(pending.clone().map(|_| 0));
    let mut budget = budget;
    for decoding in [true, false] {
        for (i, p) in pending.clone().enumerate() {
            if p > 0 && (p == 1) == decoding {
                chunk[i] = p.min(budget);
                budget -= chunk[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::plan_step;

    fn plan(pending: &[usize], budget: usize) -> Vec<usize> {
        let mut chunk = Vec::new();
        plan_step(pending.iter().copied(), budget, &mut chunk);
        chunk
    }

    #[test]
    fn decoding_sequences_go_first_then_prompt_chunks_in_order() {
        assert_eq!(plan(&[300, 1, 400, 1, 0], 512), vec![300, 1, 210, 1, 0]);
        assert_eq!(plan(&[600, 700], 512), vec![512, 0]);
        assert_eq!(plan(&[1, 1, 1], 2), vec![1, 1, 0]);
        assert_eq!(plan(&[], 512), Vec::<usize>::new());
    }
}
