//! A constrained pick found by asking the constraint about the likeliest
//! tokens one at a time, where they alone decide it, instead of computing
//! its mask over the whole vocabulary (a mask costs a JSON schema some
//! 0.1–0.3 ms a token; asking about one token some microseconds).
//!
//! The pick has the distribution of [`Sampler::sample_masked`] with the
//! mask: the masked chain (top-k, top-p, min-p, temperature over the
//! allowed tokens) keeps a set of the likeliest allowed tokens, and once
//! the tokens walked in order of likelihood show which set that is, the
//! draw among them is the masked draw. With no filter at all the set is
//! every allowed token, which no walk shows; there a draw over the whole
//! vocabulary that the constraint allows is kept (rejection sampling: an
//! allowed token x comes out with p(x) directly, or after a refusal with
//! the masked p(x) / A, A the allowed mass: p(x) + (1 − A) p(x) / A =
//! p(x) / A, the masked probability).

use crate::sampler::{set_logits, Sampler};

/// How many of the likeliest tokens a checked pick asks the constraint
/// about before it leaves the pick to the mask.
const CHECKED_TOKENS: usize = 32;

/// The largest top-k whose tokens a checked pick puts in order (beyond it,
/// the mass top-k may keep is bounded over the whole vocabulary).
const SORTED_TOP_K: usize = 256;

impl Sampler {
    /// The pick [`Sampler::sample_masked`] makes under a constraint's
    /// mask, found by `allows` (does the constraint take this token next?)
    /// on the likeliest tokens alone; `None` when those do not decide it
    /// and the caller samples with the mask. Greedy picks the likeliest
    /// allowed token (the lowest id among equals, as the masked pick).
    pub fn sample_checked<E>(
        &mut self,
        logits: &[f32],
        history: &[u32],
        candidates: &mut [(u32, f32)],
        banned: &[u32],
        allows: &mut impl FnMut(u32) -> Result<bool, E>,
    ) -> Result<Option<u32>, E> {
        let p = &self.params;
        let (greedy, top_k, unfiltered) = (
            p.temperature <= 0.0,
            p.top_k,
            (p.top_k == 0 || p.top_k >= logits.len()) && p.top_p >= 1.0 && p.min_p <= 0.0,
        );
        let cands = self.adjusted(logits, history, candidates);
        if unfiltered && !greedy {
            set_logits(cands, banned, f32::NEG_INFINITY);
            let token = self.draw(cands);
            return Ok(allows(token)?.then_some(token));
        }
        // Banned and NaN entries out: the masked pick never holds them.
        set_logits(cands, banned, f32::NAN);
        let mut kept = 0;
        for i in 0..cands.len() {
            let c = cands[i];
            if !c.1.is_nan() {
                cands[kept] = c;
                kept += 1;
            }
        }
        let cands = &mut cands[..kept];
        let walk = CHECKED_TOKENS.min(kept);
        if walk == 0 {
            return Ok(None);
        }
        // In order: the walk, and with a top-k as many tokens again, so the
        // mass top-k may keep beyond a walked token is summed exactly.
        let top_k_within = (top_k > 0 && top_k <= SORTED_TOP_K).then_some(top_k);
        let sorted = (walk + top_k_within.unwrap_or(0)).min(kept);
        let likelier = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if sorted < kept {
            cands.select_nth_unstable_by(sorted - 1, likelier);
        }
        cands[..sorted].sort_unstable_by(likelier);
        let top = cands[0].1;
        if !top.is_finite() {
            return Ok(None);
        }
        // The mass (relative to the likeliest token's) of the tokens the
        // walk never reaches, summed only when top-p needs it.
        let mut never_walked = None;
        let mut found = 0;
        for i in 0..walk {
            let (id, logit) = cands[i];
            if allows(id)? {
                // The allowed tokens gather at the front, likeliest first.
                cands.swap(found, i);
                found += 1;
                if greedy {
                    return Ok(Some(id));
                }
                if found == top_k {
                    // The top-k allowed tokens: the masked chain's set.
                    return Ok(Some(self.draw(&mut cands[..found])));
                }
            }
            if found == 0 {
                continue;
            }
            let (walked, rest) = cands.split_at(i + 1);
            let beyond = || match top_k_within {
                // Top-k keeps at most top_k − found more: the likeliest
                // of the rest, which are in order.
                Some(k) => relative_mass(&rest[..(k - found).min(rest.len())], top),
                None => {
                    let never = *never_walked
                        .get_or_insert_with(|| mass_at_most(&rest[sorted - i - 1..], top));
                    never + mass_at_most(&rest[..sorted - i - 1], top)
                }
            };
            if let Some(len) = self.kept_of(&walked[..found], logit, top, beyond) {
                let first = cands[0].1;
                let set = &mut cands[..len];
                for c in set.iter_mut() {
                    c.1 = (c.1 - first).exp();
                }
                return Ok(Some(self.pick(set)));
            }
        }
        Ok(None)
    }

    /// How many of `found` (the allowed tokens walked so far, likeliest
    /// first, with their logits) the masked chain's top-p and min-p keep,
    /// when no token not yet walked can change it: each of those has a
    /// logit at most `below`, and `beyond()` bounds the mass, relative to
    /// `exp(top)`, of the allowed ones among them that top-k would keep.
    fn kept_of(
        &self,
        found: &[(u32, f32)],
        below: f32,
        top: f32,
        beyond: impl FnOnce() -> f64,
    ) -> Option<usize> {
        let p = &self.params;
        // Min-p keeps the tokens within ln(min_p) of the likeliest allowed
        // one: all found so far, and any still to come above `floor`.
        let floor = found[0].1 + p.min_p.ln();
        let above_floor = found.iter().take_while(|c| c.1 >= floor).count().max(1);
        let min_p = match p.min_p > 0.0 {
            false => None,
            true if below < floor => Some(Ok(above_floor)),
            // Not settled: at least `above_floor` stay.
            true => Some(Err(above_floor)),
        };
        if p.top_p >= 1.0 {
            return match min_p {
                Some(Ok(len)) => Some(len),
                _ => None,
            };
        }
        // Top-p keeps the shortest prefix holding top_p of the kept mass,
        // between the found mass and that plus what may lie beyond.
        let total = relative_mass(found, top);
        let prefix = |of: f64| {
            let mut cum = 0.0;
            found.iter().position(|c| {
                cum += f64::from((c.1 - top).exp());
                cum >= f64::from(p.top_p) * of
            })
        };
        let shortest = prefix(total).map_or(found.len(), |i| i + 1);
        if let Some(Ok(len)) = min_p {
            if shortest >= len {
                return Some(len);
            }
        }
        if prefix(total + beyond()) != Some(shortest - 1) {
            return None;
        }
        match min_p {
            None => Some(shortest),
            Some(Ok(len)) => Some(shortest.min(len)),
            Some(Err(at_least)) => (shortest <= at_least).then_some(shortest),
        }
    }
}

/// Σ exp(logit − top) over `cands`.
fn relative_mass(cands: &[(u32, f32)], top: f32) -> f64 {
    cands.iter().map(|c| f64::from((c.1 - top).exp())).sum()
}

/// An upper bound of [`relative_mass`] that takes exponentials only of the
/// tokens within [`DEEP`] of `top` (a vocabulary's tail is mostly far
/// below): each deeper token counts as exp(−DEEP).
fn mass_at_most(cands: &[(u32, f32)], top: f32) -> f64 {
    let (mut mass, mut deep) = (0.0, 0usize);
    for c in cands {
        let below = c.1 - top;
        if below > -DEEP {
            mass += f64::from(below.exp());
        } else {
            deep += 1;
        }
    }
    mass + deep as f64 * f64::from(-DEEP).exp()
}

/// How far below the likeliest token [`mass_at_most`] stops taking
/// exponentials: 49,152 tokens there weigh at most 0.6% of it.
const DEEP: f32 = 16.0;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::TokenMask;
    use crate::sampler::SamplingParams;
    use std::convert::Infallible;

    /// Logits with a peaked head, as a model's are: a few tokens well
    /// above a long flat tail (a seeded generator, no two equal).
    fn peaked_logits(vocab: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..vocab)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                let head = if i % 37 == 0 { 5.0 + 5.0 * u } else { 0.0 };
                head + 2.0 * u
            })
            .collect()
    }

    /// A mask allowing every `every`th token from `from`.
    fn mask_of(vocab: usize, from: usize, every: usize) -> TokenMask {
        let mut mask = TokenMask::new(vocab);
        for id in (from..vocab).step_by(every) {
            mask.allow(id as u32);
        }
        mask
    }

    fn chains() -> Vec<SamplingParams> {
        let with = |temperature, top_k, top_p, min_p| SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            ..SamplingParams::default()
        };
        vec![
            SamplingParams::default(),
            with(0.8, 5, 1.0, 0.0),
            with(1.0, 0, 0.9, 0.0),
            with(1.0, 0, 1.0, 0.1),
            with(0.7, 0, 0.5, 0.05),
            with(1.2, 10, 0.95, 0.0),
            with(0.0, 40, 0.95, 0.05),
            SamplingParams {
                temperature: 0.0,
                repeat_penalty: 1.3,
                logit_bias: vec![(0, 4.0)],
                ..SamplingParams::default()
            },
        ]
    }

    #[test]
    fn a_checked_pick_is_the_masked_pick_and_mostly_needs_no_mask() {
        let vocab = 500;
        let history = [0u32, 37, 74, 3];
        let mut cands = vec![(0, 0.0); vocab];
        let (mut decided, mut cases) = (0, 0);
        for params in chains() {
            let decided_before = decided;
            for seed in 0..60u64 {
                let logits = peaked_logits(vocab, seed);
                for (from, every) in [(0, 1), (0, 2), (1, 3), (seed as usize % 37, 37), (5, 101)] {
                    let mask = mask_of(vocab, from, every);
                    let banned = [74u32];
                    let mut checked = Sampler::new(SamplingParams {
                        seed,
                        ..params.clone()
                    });
                    let mut masked = checked.params.clone();
                    masked.seed = seed;
                    let mut masked = Sampler::new(masked);
                    let pick = checked
                        .sample_checked(&logits, &history, &mut cands, &banned, &mut |t| {
                            Ok::<_, Infallible>(mask.allows(t))
                        })
                        .unwrap();
                    cases += 1;
                    let Some(pick) = pick else { continue };
                    decided += 1;
                    let expected =
                        masked.sample_masked(&logits, &history, &mut cands, &banned, Some(&mask));
                    assert!(mask.allows(pick) && pick != 74, "{pick} under {params:?}");
                    assert_eq!(
                        pick, expected,
                        "seed {seed}, mask {from}+{every}k, {params:?}"
                    );
                }
            }
            // Every chain is compared with the masked pick.
            assert!(decided - decided_before >= 60, "{params:?}");
        }
        // The walk decides most picks of a peaked distribution (the
        // sparsest masks, far from its head, are left to the mask).
        assert!(decided * 10 >= cases * 6, "{decided} of {cases} decided");
    }

    #[test]
    fn an_unfiltered_checked_draw_has_the_masked_distribution() {
        let logits = [2.0f32, 1.5, 0.0, 1.0, -1.0, 0.5];
        let mut mask = TokenMask::new(6);
        for id in [0, 2, 5] {
            mask.allow(id);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 11,
            ..SamplingParams::default()
        });
        let mut cands = vec![(0, 0.0); 6];
        let draws = 40_000;
        let (mut counts, mut refused) = ([0usize; 6], 0);
        for _ in 0..draws {
            let checked = s
                .sample_checked(&logits, &[], &mut cands, &[], &mut |t| {
                    Ok::<_, Infallible>(mask.allows(t))
                })
                .unwrap();
            let t = checked.unwrap_or_else(|| {
                refused += 1;
                s.sample_masked(&logits, &[], &mut cands, &[], Some(&mask))
            });
            counts[t as usize] += 1;
        }
        let allowed: f64 = [2.0f64, 0.0, 0.5].iter().map(|l| l.exp()).sum();
        for (id, l) in [(0, 2.0f64), (2, 0.0), (5, 0.5)] {
            let expected = l.exp() / allowed * draws as f64;
            let seen = counts[id] as f64;
            // Within 4 standard deviations of the binomial count.
            let sd = (expected * (1.0 - expected / draws as f64)).sqrt();
            assert!(
                (seen - expected).abs() < 4.0 * sd,
                "{id}: {seen} vs {expected:.0}"
            );
        }
        assert_eq!(counts[1] + counts[3] + counts[4], 0);
        // The refused draws are the disallowed mass (about 39%) of them.
        assert!((draws / 3..draws / 2).contains(&refused), "{refused}");
    }

    #[test]
    fn a_refusing_constraint_leaves_the_pick_to_the_mask_and_errors_pass_through() {
        let logits = peaked_logits(100, 3);
        let mut cands = vec![(0, 0.0); 100];
        let mut s = Sampler::new(SamplingParams::default());
        let none = s
            .sample_checked(&logits, &[], &mut cands, &[], &mut |_| {
                Ok::<_, Infallible>(false)
            })
            .unwrap();
        assert_eq!(none, None);
        let mut asked = 0;
        let failed = s.sample_checked(&logits, &[], &mut cands, &[], &mut |_| {
            asked += 1;
            Err("the grammar's budget is spent")
        });
        assert_eq!(failed, Err("the grammar's budget is spent"));
        assert_eq!(asked, 1);
    }
}
