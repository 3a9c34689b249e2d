//! `logprobs` and `echo` through `fathom serve`: the real binary on
//! loopback with the real SmolLM2 GGUF, spoken to over real HTTP. Chat's
//! `logprobs.content`, whole and streamed; completions' legacy object with
//! the echoed prompt scored, as lm-evaluation-harness asks for
//! log-likelihoods; and the logprobs equal to what `fathom perplexity`
//! computes on the same tokens.

mod common;

use common::server::{sse_events, Server};
use common::{fathom, smollm2, stderr, stdout};
use fathom_checkpoint::Checkpoint;
use serde_json::{json, Value};

/// The model's tokenizer, to send prompts as token ids as harnesses do.
fn tokenizer() -> fathom_engine::Tokenizer {
    let checkpoint = Checkpoint::open(&smollm2()).unwrap();
    fathom_engine::load_tokenizer(&checkpoint).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Asserts one chat entry's shape: `token` is its bytes as text, the
/// logprob a log-probability, the alternatives sorted; returns its bytes.
fn chat_entry(e: &Value, top: usize) -> Vec<u8> {
    let bytes: Vec<u8> = e["bytes"]
        .as_array()
        .unwrap_or_else(|| panic!("bytes: {e}"))
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect();
    assert_eq!(e["token"], String::from_utf8_lossy(&bytes).as_ref(), "{e}");
    assert!(f(&e["logprob"]) <= 0.0, "{e}");
    let alternatives = e["top_logprobs"].as_array().unwrap();
    assert_eq!(alternatives.len(), top, "{e}");
    for pair in alternatives.windows(2) {
        assert!(f(&pair[0]["logprob"]) >= f(&pair[1]["logprob"]), "{e}");
    }
    for a in alternatives {
        assert!(a["bytes"].is_array() && a["token"].is_string(), "{a}");
    }
    bytes
}

#[test]
fn chat_logprobs_describe_the_answer_s_tokens_whole_and_streamed() {
    let server = Server::start(&[], &[]);
    let body = |stream: bool| {
        json!({
            "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 12, "temperature": 0, "ignore_eos": true,
            "logprobs": true, "top_logprobs": 3, "stream": stream,
        })
        .to_string()
    };
    let r = server.post("/v1/chat/completions", &body(false), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    let content = choice["message"]["content"].as_str().unwrap();
    let entries = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        choice["logprobs"].get("refusal"),
        Some(&serde_json::Value::Null),
        "OpenAI's chat logprobs carry refusal: null"
    );
    assert_eq!(entries.len(), 12, "one entry per generated token: {v}");
    let mut bytes = Vec::new();
    for e in entries {
        bytes.extend(chat_entry(e, 3));
        // Greedy: every token is its position's most likely.
        assert_eq!(e["top_logprobs"][0]["token"], e["token"], "{e}");
        assert_eq!(e["top_logprobs"][0]["logprob"], e["logprob"], "{e}");
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), content);

    // Streamed: each chunk carries the tokens of its delta; together the
    // same entries as the whole answer.
    let r = server.post("/v1/chat/completions", &body(true), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done);
    let mut streamed = Vec::new();
    for e in &events {
        let choice = &e["choices"][0];
        let delta = choice["delta"]["content"].as_str().unwrap_or("");
        if delta.is_empty() {
            assert!(choice["logprobs"].is_null(), "{e}");
            continue;
        }
        let content = choice["logprobs"]["content"].as_array().unwrap();
        assert!(!content.is_empty(), "a delta comes with its tokens: {e}");
        streamed.extend(content.iter().cloned());
    }
    assert_eq!(&streamed, entries);

    // Without logprobs there are none.
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).to_string(),
        &[],
    );
    assert!(r.json()["choices"][0]["logprobs"].is_null());
}

/// Asserts the legacy object's shape for `n` tokens, the first of them the
/// prompt's first (no logprob); returns it.
fn legacy(v: &Value, n: usize, text: &str) -> Value {
    let lp = v["choices"][0]["logprobs"].clone();
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().map(Vec::len), Some(n), "{key}: {lp}");
    }
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert!(offsets[n - 1] as usize <= text.chars().count());
    lp
}

#[test]
fn an_echoed_prompt_is_scored_as_evaluation_harnesses_ask_and_equals_perplexity() {
    let server = Server::start(&[], &[]);
    let tok = tokenizer();
    // The first perplexity chunk of -c 128 on this text, BOS first when
    // the model adds it, exactly as `fathom perplexity` scores it.
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let mut ids = tok.encode(&text, tok.add_bos(), false);
    ids.truncate(128);
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos()) {
        ids[0] = bos;
    }
    // lm-evaluation-harness's local-completions loglikelihood request.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 0, "echo": true, "logprobs": 1,
                "temperature": 0, "seed": 1234})
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 128);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let echoed = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(echoed, tok.decode(&ids, true));
    let lp = legacy(&v, 128, echoed);
    for (i, &id) in ids.iter().enumerate() {
        let piece = String::from_utf8_lossy(tok.token_bytes(id));
        assert_eq!(lp["tokens"][i], piece.as_ref(), "token {i}");
    }
    // Each position's alternatives: the most likely, and the token itself.
    for i in 1..128 {
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!((1..=2).contains(&top.len()), "{i}: {top:?}");
        let best = top.values().map(f).fold(f64::MIN, f64::max);
        let own = f(&lp["token_logprobs"][i]);
        assert!(own <= best && own <= 0.0, "{i}: {own} {top:?}");
    }

    // `fathom perplexity` on the same chunk scores positions 64..126,
    // each on the token after it: the same numbers.
    let out = fathom(
        &[
            "perplexity",
            smollm2().to_str().unwrap(),
            "-f",
            "/usr/share/common-licenses/GPL-3",
            "-c",
            "128",
            "--chunks",
            "1",
            "--json",
            "-t",
            "2",
            "--device",
            "cpu",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let ppl: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(ppl["scored_tokens"], 63);
    let served: f64 = (65..128).map(|i| -f(&lp["token_logprobs"][i])).sum();
    let mean = served / 63.0;
    let diff = (mean - f(&ppl["mean_nll"])).abs();
    eprintln!(
        "served mean NLL {mean} vs fathom perplexity {}: |difference| {diff:e}",
        ppl["mean_nll"]
    );
    assert!(diff < 1e-12, "{mean} vs {}", ppl["mean_nll"]);

    // With max_tokens 1 (the harness's other form) the generated token
    // follows the prompt's: [ctxlen:-1] slices the prompt's back out.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": &ids[..40], "max_tokens": 1, "echo": true, "logprobs": 1,
                "temperature": 0})
        .to_string(),
        &[],
    );
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    let lp2 = legacy(&v, 41, text);
    assert_eq!(lp2["token_logprobs"][39], lp["token_logprobs"][39]);
    assert_eq!(lp2["top_logprobs"][39], lp["top_logprobs"][39]);
    // The generated token is greedy: its own logprob is the best.
    let top = lp2["top_logprobs"][40].as_object().unwrap();
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(top.values().next(), Some(&lp2["token_logprobs"][40]));
    assert_eq!(
        lp2["text_offset"][40].as_u64().unwrap() as usize,
        tok.decode(&ids[..40], true).chars().count(),
        "the completion's offsets follow the echoed prompt"
    );
}

#[test]
fn streamed_echo_sends_the_prompt_first_and_bad_values_name_the_field() {
    let server = Server::start(&[], &[]);
    let prompt = "The capital of France is";
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 4, "echo": true, "logprobs": 2,
                "temperature": 0, "ignore_eos": true, "stream": true})
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done);
    let first = &events[0]["choices"][0];
    assert_eq!(first["text"], prompt);
    let n = tokenizer().encode(prompt, false, false).len();
    let lp = &first["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{lp}");
    assert!(lp["token_logprobs"][0].is_null());
    assert_eq!(
        lp["top_logprobs"][1].as_object().map(|o| o.len() >= 2),
        Some(true)
    );
    let mut generated = 0;
    for e in &events[1..] {
        let c = &e["choices"][0];
        if c["text"] == "" {
            continue;
        }
        let tokens = c["logprobs"]["tokens"].as_array().unwrap();
        if generated == 0 {
            assert_eq!(c["logprobs"]["text_offset"][0], prompt.chars().count());
        }
        generated += tokens.len();
    }
    assert_eq!(generated, 4);

    // Echo without logprobs: the prompt first, streamed and whole.
    let body = |stream: bool| {
        json!({"prompt": prompt, "max_tokens": 3, "echo": true, "temperature": 0,
               "stream": stream})
        .to_string()
    };
    let (events, _) = sse_events(&server.post("/v1/completions", &body(true), &[]).body);
    assert_eq!(events[0]["choices"][0]["text"], prompt);
    assert!(events[0]["choices"][0]["logprobs"].is_null());
    let v = server.post("/v1/completions", &body(false), &[]).json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(prompt) && text.len() > prompt.len(), "{v}");

    for (path, body, param) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 6}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": -1}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 0}),
            "max_tokens",
        ),
        ("/v1/completions", json!({"prompt": "x", "echo": 1}), "echo"),
    ] {
        let e = server
            .post(path, &body.to_string(), &[])
            .assert_error(400, "invalid_value");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
    }
}
