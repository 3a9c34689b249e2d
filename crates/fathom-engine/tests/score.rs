//! `Engine::score` hands out the logits of every position, equal bit for
//! bit to running the prefix up to that position on its own.

mod common;

use common::{engine, inputs, smollm2};
use fathom_plan::KvDtype;

#[test]
fn every_scored_position_equals_the_last_logits_of_its_prefix() {
    let mut inp = inputs(700, KvDtype::F16);
    inp.max_tokens_per_step = 256;
    let mut e = engine(&smollm2(), inp, None);
    let tokens: Vec<u32> = (0..600).map(|i| (i * 7919 + 13) % 49152).collect();
    let vocab = e.model.spec.vocab as usize;
    let mut scored = Vec::new();
    let mut kept = std::collections::BTreeMap::new();
    e.score(&tokens, 250, &mut |pos, logits| {
        assert_eq!(logits.len(), vocab);
        scored.push(pos);
        if [250, 255, 256, 511, 599].contains(&pos) {
            kept.insert(pos, logits.to_vec());
        }
    })
    .unwrap();
    assert_eq!(scored, (250..600).collect::<Vec<_>>());
    for (pos, logits) in kept {
        let alone = e.logits(&tokens[..=pos]).unwrap();
        assert!(
            alone
                .iter()
                .zip(&logits)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "position {pos}"
        );
    }
}
