//! Choosing the next token from the logits, in llama.cpp's order:
//! logit bias, penalties, top-k, top-p, min-p, temperature, then a seeded
//! draw. Greedy (temperature 0) is the argmax after bias and penalties.
//! The logits themselves are never written: bias and penalties act on the
//! candidates, so the model's distribution can still be read after
//! sampling (the server's `logprobs`).

use crate::mask::TokenMask;

/// Sampling settings; the defaults are llama.cpp's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
    /// Never pick an end-of-generation token (llama.cpp's `--ignore-eos`);
    /// the engine, which knows those tokens, masks them before sampling.
    pub ignore_eos: bool,
    /// `(token id, bias)` pairs added to those tokens' logits before
    /// anything else (OpenAI's `logit_bias`: -100 all but bans a token,
    /// 100 all but forces it). Ids outside the logits are skipped; callers
    /// check them against the vocabulary first.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5eed,
            ignore_eos: false,
            logit_bias: Vec::new(),
        }
    }
}

/// A sampler with its random state (SplitMix64: small, seedable, good enough
/// for drawing tokens).
pub struct Sampler {
    pub params: SamplingParams,
    state: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let state = params.seed;
        Sampler { params, state }
    }

    fn next_f32(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Greedy with no bias and no penalties: the pick is the argmax (of
    /// the logits, or with the `banned` ids as −∞), which a GPU finds
    /// without reading the logits back (`Backend::greedy`).
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature <= 0.0 && p.logit_bias.is_empty() && !self.penalizes()
    }

    /// Picks the next token from `logits`, which are left as the model
    /// gave them (so log-probabilities can be read from them afterwards):
    /// bias, penalties and `banned` (tokens never picked) act on
    /// `candidates`, the planned scratch of one entry per vocabulary
    /// token. `history` is the sequence so far.
    pub fn sample(
        &mut self,
        logits: &[f32],
        history: &[u32],
        candidates: &mut [(u32, f32)],
        banned: &[u32],
    ) -> u32 {
        self.sample_masked(logits, history, candidates, banned, None)
    }

    /// [`Sampler::sample`] among the tokens `mask` allows (a constraint's:
    /// a JSON schema, a grammar), when one is given: the others are out
    /// before bias, penalties, top-k, top-p, min-p and temperature, so the
    /// pick always satisfies the constraint. With no mask it is
    /// [`Sampler::sample`], bit for bit. A mask that allows nothing (or
    /// only banned tokens) gives its first allowed token, or 0.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        history: &[u32],
        candidates: &mut [(u32, f32)],
        banned: &[u32],
        mask: Option<&TokenMask>,
    ) -> u32 {
        if let Some(mask) = mask {
            return self.sample_within(logits, history, candidates, banned, mask);
        }
        if self.is_plain_greedy() {
            // Greedy: the argmax, unless it is banned (`ignore_eos`); only
            // then the candidate pass below (128k candidates a row would
            // cost a batch of 64 rows milliseconds a step).
            let best = fathom_kernels::ops::argmax(logits) as u32;
            if !banned.contains(&best) {
                return best;
            }
        }
        let cands = self.adjusted(logits, history, candidates);
        set_logits(cands, banned, f32::NEG_INFINITY);
        let p = &self.params;
        if p.temperature <= 0.0 {
            // The first largest, NaN skipped: what `argmax` picks.
            let mut best: Option<(u32, f32)> = None;
            for &(i, v) in cands.iter() {
                if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            return best.map_or(0, |(i, _)| i);
        }
        self.draw(cands)
    }

    /// Top-k, top-p, min-p and temperature over `cands`, then a seeded draw.
    pub(crate) fn draw(&mut self, cands: &mut [(u32, f32)]) -> u32 {
        let len = self.filter(cands);
        self.pick(&mut cands[..len])
    }

    /// Top-k, top-p and min-p over `cands`: how many of them stay, at the
    /// front in order of likelihood, each holding its probability.
    fn filter(&self, cands: &mut [(u32, f32)]) -> usize {
        let p = &self.params;
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
        let mut len = cands.len();
        if p.top_k > 0 && p.top_k < len {
            cands.select_nth_unstable_by(p.top_k - 1, by_logit);
            len = p.top_k;
        }
        let cands = &mut cands[..len];
        cands.sort_unstable_by(by_logit);
        softmax_in_place(cands, 1.0);
        let mut len = cands.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, c) in cands.iter().enumerate() {
                cum += c.1;
                if cum >= p.top_p {
                    len = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = cands[0].1 * p.min_p;
            len = cands[..len]
                .iter()
                .take_while(|c| c.1 >= floor)
                .count()
                .max(1);
        }
        len
    }

    /// The seeded draw among `cands` under the temperature, each holding
    /// its probability (or any multiple of it).
    pub(crate) fn pick(&mut self, cands: &mut [(u32, f32)]) -> u32 {
        // Back to logits for the temperature: log p is the logit up to a constant.
        for c in cands.iter_mut() {
            c.1 = c.1.max(f32::MIN_POSITIVE).ln();
        }
        softmax_in_place(cands, self.params.temperature);
        let r = self.next_f32();
        let mut cum = 0.0;
        for c in cands.iter() {
            cum += c.1;
            if r < cum {
                return c.0;
            }
        }
        cands[cands.len() - 1].0
    }

    /// The masked pick: the allowed tokens alone become candidates, read
    /// off the mask's words (a zero word skips 32 tokens at once), so the
    /// vocabulary is not walked; bias and penalties then act on those
    /// candidates (found by id: they stay in id order until the draw), and
    /// the usual chain runs over them.
    fn sample_within(
        &mut self,
        logits: &[f32],
        history: &[u32],
        candidates: &mut [(u32, f32)],
        banned: &[u32],
        mask: &TokenMask,
    ) -> u32 {
        let n = logits.len();
        let mut len = 0;
        for (w, &word) in mask.words().iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let id = w as u32 * 32 + bits.trailing_zeros();
                bits &= bits - 1;
                let i = id as usize;
                if i >= n {
                    break;
                }
                candidates[len] = (id, logits[i]);
                len += 1;
            }
        }
        let cands = &mut candidates[..len];
        let position =
            |cands: &[(u32, f32)], id: u32| cands.binary_search_by_key(&id, |c| c.0).ok();
        self.bias_and_penalize(cands, history, position);
        let mut kept = 0;
        for k in 0..len {
            let c = cands[k];
            if !c.1.is_nan() && !banned.contains(&c.0) {
                cands[kept] = c;
                kept += 1;
            }
        }
        let len = kept;
        if len == 0 {
            return mask.iter().next().unwrap_or(0);
        }
        let p = &self.params;
        if p.temperature <= 0.0 {
            let mut best = cands[0];
            for &c in &cands[1..len] {
                if c.1 > best.1 {
                    best = c;
                }
            }
            return best.0;
        }
        self.draw(&mut cands[..len])
    }

    /// The candidates, entry i token i with its logit plus bias and
    /// penalties.
    pub(crate) fn adjusted<'c>(
        &self,
        logits: &[f32],
        history: &[u32],
        candidates: &'c mut [(u32, f32)],
    ) -> &'c mut [(u32, f32)] {
        let cands = &mut candidates[..logits.len()];
        for (i, (c, &l)) in cands.iter_mut().zip(logits.iter()).enumerate() {
            *c = (i as u32, l);
        }
        // Entry i is token i until the candidates are reordered.
        let n = cands.len();
        self.bias_and_penalize(cands, history, |_, id| {
            ((id as usize) < n).then_some(id as usize)
        });
        cands
    }

    /// Adds the logit bias and the penalties to the entries of `cands`
    /// that `position` finds for a token id.
    fn bias_and_penalize(
        &self,
        cands: &mut [(u32, f32)],
        history: &[u32],
        position: impl Fn(&[(u32, f32)], u32) -> Option<usize>,
    ) {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(k) = position(cands, id) {
                cands[k].1 += bias;
            }
        }
        self.apply_penalties(cands, history, position);
    }

    fn penalizes(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// Penalizes the recent tokens' entries of `cands`, found by `position`.
    fn apply_penalties(
        &self,
        cands: &mut [(u32, f32)],
        history: &[u32],
        position: impl Fn(&[(u32, f32)], u32) -> Option<usize>,
    ) {
        if !self.penalizes() {
            return;
        }
        let p = &self.params;
        let recent = &history[history.len().saturating_sub(p.repeat_last_n)..];
        for (i, &tok) in recent.iter().enumerate() {
            // Penalize each distinct token once, at its first occurrence.
            if recent[..i].contains(&tok) {
                continue;
            }
            let Some(k) = position(cands, tok) else {
                continue;
            };
            let l = &mut cands[k].1;
            let count = recent.iter().filter(|&&t| t == tok).count() as f32;
            if p.repeat_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / p.repeat_penalty
                } else {
                    *l * p.repeat_penalty
                };
            }
            *l -= count * p.frequency_penalty + p.presence_penalty;
        }
    }
}

/// Sets the entries of the tokens `ids` (entry i token i) to `value`.
pub(crate) fn set_logits(cands: &mut [(u32, f32)], ids: &[u32], value: f32) {
    for &id in ids {
        if let Some(c) = cands.get_mut(id as usize) {
            c.1 = value;
        }
    }
}

fn softmax_in_place(cands: &mut [(u32, f32)], temperature: f32) {
    let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for c in cands.iter_mut() {
        c.1 = ((c.1 - max) / temperature).exp();
        sum += c.1;
    }
    for c in cands.iter_mut() {
        c.1 /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature,
            seed,
            ..SamplingParams::default()
        })
    }

    #[test]
    fn greedy_is_the_argmax() {
        let logits = vec![0.1, 3.0, -1.0, 2.9];
        let mut c = vec![(0, 0.0); 4];
        assert_eq!(sampler(0.0, 1).sample(&logits, &[], &mut c, &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_draws_follow_the_distribution() {
        let logits = vec![2.0f32, 1.0, 0.0, -5.0];
        let mut c = vec![(0, 0.0); 4];
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..SamplingParams::default()
            });
            let mut counts = [0usize; 4];
            for _ in 0..4000 {
                counts[s.sample(&logits, &[], &mut c.clone(), &[]) as usize] += 1;
            }
            counts
        };
        assert_eq!(draw(7), draw(7));
        let counts = draw(7);
        // softmax(2, 1, 0, -5) = 0.665, 0.245, 0.090, 0.0006
        assert!((2450..2870).contains(&counts[0]), "{counts:?}");
        assert!((820..1140).contains(&counts[1]), "{counts:?}");
        assert!(counts[3] < 20, "{counts:?}");
        let _ = &mut c;
    }

    #[test]
    fn top_k_one_is_greedy_and_min_p_cuts_the_tail() {
        let mut c = vec![(0, 0.0); 4];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..SamplingParams::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 5.0, 4.9, 1.0], &[], &mut c, &[]), 1);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..SamplingParams::default()
        });
        for _ in 0..200 {
            let tok = s.sample(&[3.0, 3.0, 0.0, 0.0], &[], &mut c, &[]);
            assert!(tok < 2, "min-p 0.5 keeps only the two top tokens");
        }
    }

    #[test]
    fn logit_bias_is_added_before_choosing() {
        let mut c = vec![(0, 0.0); 4];
        let biased = |bias: Vec<(u32, f32)>, temperature: f32| {
            Sampler::new(SamplingParams {
                temperature,
                logit_bias: bias,
                ..SamplingParams::default()
            })
        };
        // -100 bans the argmax, +100 forces a tail token; ids past the
        // logits are skipped.
        let mut s = biased(vec![(1, -100.0), (9, 100.0)], 0.0);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[], &mut c, &[]), 3);
        let mut s = biased(vec![(2, 100.0)], 1.0);
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[], &mut c, &[]), 2);
        }
        // The same bias on every token changes nothing.
        let mut s = biased((0..4).map(|i| (i, -100.0)).collect(), 0.0);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[], &mut c, &[]), 1);
    }

    #[test]
    fn repetition_penalty_discourages_recent_tokens() {
        let mut c = vec![(0, 0.0); 3];
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            repeat_penalty: 2.0,
            ..SamplingParams::default()
        });
        let logits = vec![3.0, 2.0, -1.0];
        assert_eq!(s.sample(&logits, &[0, 0], &mut c, &[]), 1);
        assert_eq!(logits, [3.0, 2.0, -1.0], "the logits stay the model's");
    }

    /// The engine gives a plain greedy sampler the backend's pick
    /// (`fathom_backend::greedy_pick`, and the CUDA kernel checked against
    /// the same rule): the two must agree, with and without banned ids.
    #[test]
    fn the_backends_greedy_pick_is_the_samplers() {
        let nan = f32::NAN;
        let rows: [&[f32]; 7] = [
            &[0.1, 3.0, -1.0, 2.9, 3.0],
            &[9.0, 1.0, 9.0, 2.0, 1.0],
            &[nan, 2.0, nan, 2.0, 1.0],
            &[nan; 5],
            &[nan, f32::NEG_INFINITY, f32::NEG_INFINITY, nan, 0.0],
            &[nan, 5.0, nan, 5.0, nan],
            &[1.0, f32::INFINITY, 2.0, f32::INFINITY, 0.0],
        ];
        for row in rows {
            for banned in [&[][..], &[1], &[1, 3], &[0, 2, 4]] {
                let mut c = vec![(0, 0.0); row.len()];
                let want = sampler(0.0, 1).sample(row, &[], &mut c, banned);
                let [plain, with] = fathom_backend::greedy_pick(row, banned);
                let got = if banned.is_empty() { plain } else { with };
                assert_eq!(got, want, "{row:?} banned {banned:?}");
            }
        }
    }

    #[test]
    fn a_mask_confines_every_pick_and_no_mask_changes_nothing() {
        let logits = [1.0, 9.0, 0.5, 8.0, 7.0];
        let mut c = vec![(0, 0.0); 5];
        let mut mask = TokenMask::new(5);
        mask.allow(2);
        mask.allow(4);
        assert_eq!(
            sampler(0.0, 1).sample_masked(&logits, &[], &mut c, &[], Some(&mask)),
            4
        );
        // Banned and masked: only 2 is left.
        assert_eq!(
            sampler(0.0, 1).sample_masked(&logits, &[], &mut c, &[4], Some(&mask)),
            2
        );
        for temperature in [0.5, 1.0, 2.0] {
            let mut s = sampler(temperature, 9);
            for _ in 0..200 {
                let t = s.sample_masked(&logits, &[], &mut c, &[], Some(&mask));
                assert!(mask.allows(t), "{t}");
            }
        }
        // A bias toward a masked-out token does not let it through.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(1, 100.0)],
            ..SamplingParams::default()
        });
        for _ in 0..50 {
            assert!(mask.allows(s.sample_masked(&logits, &[], &mut c, &[], Some(&mask))));
        }
        // Without a mask the draws are the unmasked sampler's, in order.
        let (mut a, mut b) = (sampler(1.0, 5), sampler(1.0, 5));
        for _ in 0..100 {
            assert_eq!(
                a.sample(&logits, &[], &mut c, &[]),
                b.sample_masked(&logits, &[], &mut c, &[], None)
            );
        }
        // Nothing allowed: the first allowed id, or 0.
        let none = TokenMask::new(5);
        assert_eq!(
            sampler(0.0, 1).sample_masked(&logits, &[], &mut c, &[], Some(&none)),
            0
        );
    }

    /// The masked pick reads only the allowed tokens; with bias, penalties
    /// and the whole chain it draws what the unmasked sampler draws from
    /// logits whose disallowed tokens are −∞ (the masks allow more than
    /// top-k tokens, so −∞ never reaches the draw).
    #[test]
    fn masked_sampling_is_sampling_with_the_rest_at_minus_infinity() {
        let n = 300;
        let mut state = 0x1234_5678_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..40 {
            // Continuous logits: no ties, which the two selections could break apart.
            let logits: Vec<f32> = (0..n)
                .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 * 20.0 - 10.0)
                .collect();
            let mut mask = TokenMask::new(n);
            for id in 0..n as u32 {
                if next() % 3 != 0 {
                    mask.allow(id);
                }
            }
            let reference: Vec<f32> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| {
                    if mask.allows(i as u32) {
                        l
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let history: Vec<u32> = (0..24).map(|_| (next() % n as u64) as u32).collect();
            let banned = [(next() % n as u64) as u32];
            let params = SamplingParams {
                temperature: [0.0, 0.7, 1.3][case % 3],
                repeat_penalty: 1.3,
                presence_penalty: 0.4,
                frequency_penalty: 0.2,
                logit_bias: (0..6).map(|_| ((next() % n as u64) as u32, 5.0)).collect(),
                seed: case as u64,
                ..SamplingParams::default()
            };
            let (mut masked, mut plain) = (Sampler::new(params.clone()), Sampler::new(params));
            let mut c = vec![(0, 0.0); n];
            for _ in 0..20 {
                let got = masked.sample_masked(&logits, &history, &mut c, &banned, Some(&mask));
                let want = plain.sample(&reference, &history, &mut c, &banned);
                assert_eq!(got, want, "case {case}");
                assert!(mask.allows(got) && got != banned[0]);
            }
        }
    }

    #[test]
    fn banned_tokens_are_never_picked() {
        let mut c = vec![(0, 0.0); 3];
        let logits = [1.0, 9.0, 0.5];
        assert_eq!(sampler(0.0, 1).sample(&logits, &[], &mut c, &[1]), 0);
        // A banned token that is not the greedy choice leaves it alone,
        // ties to the first as argmax breaks them.
        assert_eq!(sampler(0.0, 1).sample(&logits, &[], &mut c, &[2]), 1);
        let tied = [9.0, 1.0, 9.0];
        assert_eq!(sampler(0.0, 1).sample(&tied, &[], &mut c, &[1]), 0);
        assert_eq!(sampler(0.0, 1).sample(&tied, &[], &mut c, &[0]), 2);
        let mut s = sampler(1.0, 3);
        for _ in 0..50 {
            assert_ne!(s.sample(&logits, &[], &mut c, &[1]), 1);
        }
    }
}
