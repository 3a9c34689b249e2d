//! Log-probabilities of tokens under the model's own distribution: the
//! log-softmax of one position's raw logits, at temperature 1, before
//! logit bias, penalties or any step of the sampling chain.
//!
//! One helper for every caller, so `fathom perplexity` and the server's
//! `logprobs` report the same number for the same token at the same
//! position: the maximum is taken out first and the exponentials are
//! summed in f64, as llama-perplexity does.

/// Most alternatives one position reports: OpenAI's `top_logprobs` limit.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The normalizer of one row of logits: its maximum and
/// ln Σ exp(logit − maximum).
#[derive(Debug, Clone, Copy)]
pub struct LogSoftmax {
    max: f32,
    log_sum: f64,
}

impl LogSoftmax {
    /// `logits` must not be empty.
    pub fn new(logits: &[f32]) -> Self {
        let max = logits.iter().copied().fold(logits[0], f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        LogSoftmax {
            max,
            log_sum: sum.ln(),
        }
    }

    /// The log-probability of a token whose logit is `logit`.
    pub fn of(&self, logit: f32) -> f64 {
        f64::from(logit - self.max) - self.log_sum
    }
}

/// ln p(`target`) under the softmax of `logits`.
pub fn log_prob(logits: &[f32], target: usize) -> f64 {
    LogSoftmax::new(logits).of(logits[target])
}

/// One token's log-probability and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f64,
    /// Up to the requested number of `(token, logprob)`, most likely
    /// first; equal logits in token order.
    pub top: Vec<(u32, f64)>,
}

impl TokenLogprob {
    /// `token`'s log-probability under `logits`, with the `top` (at most
    /// [`MAX_TOP_LOGPROBS`]) most likely tokens.
    pub fn new(logits: &[f32], token: u32, top: usize) -> Self {
        let norm = LogSoftmax::new(logits);
        let n = top.min(MAX_TOP_LOGPROBS).min(logits.len());
        // A short list kept sorted: one pass over the row, no vocabulary-
        // sized scratch.
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (i, &l) in logits.iter().enumerate() {
                if l.is_nan() || (best.len() == n && l <= best[n - 1].1) {
                    continue;
                }
                let at = best.partition_point(|&(_, b)| b >= l);
                best.insert(at, (i as u32, l));
                best.truncate(n);
            }
        }
        let logit = logits.get(token as usize).copied().unwrap_or(f32::NAN);
        TokenLogprob {
            token,
            logprob: norm.of(logit),
            top: best.into_iter().map(|(t, l)| (t, norm.of(l))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probs_are_a_normalized_log_softmax() {
        let logits = [2.0f32, 1.0, 0.0, -5.0];
        let total: f64 = (0..4).map(|t| log_prob(&logits, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // softmax(2, 1, 0, -5)[0] = 0.66484...
        assert!((log_prob(&logits, 0).exp() - 0.664_838).abs() < 1e-5);
        // Shifting every logit changes nothing.
        let shifted = logits.map(|l| l + 100.0);
        assert!((log_prob(&shifted, 2) - log_prob(&logits, 2)).abs() < 1e-5);
    }

    #[test]
    fn the_top_list_is_sorted_and_holds_the_token_s_own_value() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        let t = TokenLogprob::new(&logits, 4, 3);
        let ids: Vec<u32> = t.top.iter().map(|e| e.0).collect();
        assert_eq!(ids, [1, 3, 4], "equal logits in token order");
        assert_eq!(t.top[2].1, t.logprob, "the same value for the same token");
        assert_eq!(t.top[0].1, t.top[1].1);
        assert!(TokenLogprob::new(&logits, 0, 0).top.is_empty());
        assert_eq!(TokenLogprob::new(&logits, 0, 99).top.len(), 5);
        let with_nan = [f32::NAN, 1.0, 2.0];
        let ids: Vec<u32> = TokenLogprob::new(&with_nan, 1, 3)
            .top
            .iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(ids, [2, 1], "a NaN logit is never among the top");
    }
}
