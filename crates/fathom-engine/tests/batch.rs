//! Sequences decoded together give exactly what each gives alone: every
//! row goes through the same kernels whatever else shares the step, and
//! attention does not depend on how a prompt was split into chunks.

mod common;

use fathom_engine::{Sampler, SamplingParams};
use fathom_plan::KvDtype;

fn greedy() -> Sampler {
    Sampler::new(SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    })
}

#[test]
fn a_batch_of_four_equals_four_single_runs_token_for_token() {
    let model = common::smollm2();
    let mut inputs = common::inputs(256, KvDtype::F16);
    inputs.batch = 4;
    // A small step, so prompts are split (differently in the batch than
    // alone) and several prompts share a step.
    inputs.max_tokens_per_step = 24;
    let mut engine = common::engine(&model, inputs, None);
    let texts = [
        "The capital of France is",
        "Water boils at a temperature of one hundred degrees Celsius, which is why",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| engine.tokenizer.encode(t, engine.tokenizer.add_bos(), true))
        .collect();
    let n = 24;
    let mut batched = vec![String::new(); 4];
    let mut samplers: Vec<Sampler> = (0..4).map(|_| greedy()).collect();
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let stats = engine
        .generate_batch(&refs, n, &mut samplers, &[], &mut |i, text| {
            batched[i].push_str(text);
            true
        })
        .unwrap();
    assert_eq!(
        stats.prompt_tokens,
        prompts.iter().map(Vec::len).sum::<usize>()
    );
    for (i, prompt) in prompts.iter().enumerate() {
        let mut alone = String::new();
        engine
            .generate(prompt, n, &mut greedy(), &[], &mut |text| {
                alone.push_str(text);
                true
            })
            .unwrap();
        assert!(!alone.is_empty());
        assert_eq!(batched[i], alone, "prompt {i}: {:?}", texts[i]);
    }
}

#[test]
fn logits_do_not_depend_on_the_prefill_chunk() {
    let model = common::smollm2();
    let text = "The history of the printing press begins in the fifteenth century, when";
    let mut whole = common::engine(&model, common::inputs(128, KvDtype::F16), None);
    let tokens = whole.tokenizer.encode(text, true, true);
    let one_step = whole.logits(&tokens).unwrap().to_vec();
    let mut small = common::inputs(128, KvDtype::F16);
    small.max_tokens_per_step = 5;
    let mut chunked = common::engine(&model, small, None);
    let five_steps = chunked.logits(&tokens).unwrap();
    assert_eq!(one_step, five_steps);
}
