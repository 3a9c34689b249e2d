//! Structured output through `fathom serve`: the real binary on loopback
//! with the real SmolLM2 GGUF, over real HTTP. A corpus of over 200 JSON
//! schemas (`tests/data/json_schemas/`: GitHub-, Stripe- and
//! Kubernetes-like objects, OpenAPI fragments, other services' payloads and
//! one file per JSON Schema keyword family) asked for with
//! `response_format` at several temperatures, every finished answer checked
//! by an independent validator (Python's `jsonschema`); GBNF grammars,
//! `json_object`, the completions route, streaming; schemas the engine
//! cannot enforce (`tests/data/refused_schemas.json`, real-API-style ones
//! among them) get a 400 naming the keyword, and hostile ones are refused
//! or bounded. A grammar also makes the model think in a thinking
//! template's `<think>` block, whose text must come back as
//! `reasoning_content`, and write gpt-oss's harmony messages (reasoning,
//! answer, tool calls) under a harmony template, where a `response_format`
//! answer may reason first and its JSON is the final channel's body; and
//! under Qwen3.5's real template, whose prompt opens the thinking, a
//! constrained call or JSON comes after the thinking closes; under Qwen3's
//! and Gemma 4's (thinking on), whose model opens its own block, it may
//! come after that block. Under `tool_choice: "auto"`, in every native
//! format (Hermes, Qwen XML, Llama 3, harmony, Gemma 4 under their real or
//! stand-in templates), `logit_bias` pushes the model to open a call, and
//! the call is always a listed function with valid arguments.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{sse_events, Server};
use serde_json::{json, Value};

/// The entries of a JSON array file under `tests/data/`.
fn data_entries(file: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(file).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    v.as_array()
        .unwrap_or_else(|| panic!("{} holds no array", file.display()))
        .clone()
}

/// The corpus: `{name, prompt, schema}` entries of every file.
fn corpus() -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/json_schemas");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| data_entries(f)).collect()
}

/// Validates each `(schema, text)` with Python's `jsonschema` (Draft
/// 2020-12, formats checked where it has checkers); returns the failures.
fn validate(cases: &[(Value, String)]) -> Vec<String> {
    let script = r#"
import json, sys
import jsonschema
cases = json.load(sys.stdin)
bad = []
for i, (schema, text) in enumerate(cases):
    try:
        value = json.loads(text)
    except Exception as e:
        bad.append(f"{i}: not JSON ({e}): {text!r}")
        continue
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    errors = [e.message for e in v.iter_errors(value)]
    if errors:
        bad.append(f"{i}: {errors[:3]}: {text!r}")
print(json.dumps(bad))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test.sh installs jsonschema)");
    let input = serde_json::to_vec(cases).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the validator failed (pip install jsonschema; scripts/test.sh does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `body` with `extra`'s fields added (replacing its own of those names;
/// `null` takes one away, as the server reads `null` as absent).
fn with_fields(mut body: Value, extra: Value) -> Value {
    let fields = extra
        .as_object()
        .expect("extra fields are an object")
        .clone();
    body.as_object_mut()
        .expect("a body is an object")
        .extend(fields);
    body
}

fn chat(server: &Server, body: Value) -> Value {
    let r = server.post("/v1/chat/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// `body` (with `stream` on) streamed whole: its events, and its
/// `reasoning_content` and `content` deltas, each joined.
fn streamed_parts(server: &Server, body: Value) -> (Vec<Value>, String, String) {
    let r = server.post("/v1/chat/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done, "{}", r.body);
    let delta = |key: &str| -> String {
        events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"][key].as_str())
            .collect()
    };
    let (reasoning, content) = (delta("reasoning_content"), delta("content"));
    (events, reasoning, content)
}

/// `body` answered whole and streamed: the streamed parts, joined, are the
/// whole message's (an absent one empty).
fn streams_as_whole(server: &Server, body: Value) {
    let whole = chat(server, body.clone());
    let (_, reasoning, content) =
        streamed_parts(server, with_fields(body, json!({"stream": true})));
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        (
            message["reasoning_content"].as_str().unwrap_or(""),
            message["content"].as_str().unwrap_or("")
        ),
        "{whole}"
    );
}

/// Answers cut at `max_tokens` cannot be whole; at most this share may be.
const MAX_CUT: f64 = 0.10;

/// Temperatures the corpus is answered at: greedy, a usual one, a hot one.
const TEMPERATURES: [f64; 3] = [0.0, 0.7, 1.3];

/// Every schema of the corpus once, the temperatures taking turns (schema
/// k at `TEMPERATURES[k % 3]`), so each temperature meets about a third of
/// the corpus, every keyword family among them (about 22,000 tokens: 4 to
/// 5 minutes measured on two cores that other builds shared); all
/// three on every schema would take three times as long. At most a tenth
/// may be cut at `max_tokens` (a small model may run on in a number's
/// digits); every finished answer must validate.
#[test]
fn every_answer_to_the_schema_corpus_validates_at_any_temperature() {
    let server = Server::start(&["-np", "8", "-c", "1024"], &[]);
    let corpus = corpus();
    assert!(corpus.len() >= 200, "{} schemas", corpus.len());
    let mut names: Vec<&str> = corpus.iter().map(|e| e["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "schema names are unique");
    let jobs: Vec<(String, Value, Value)> = corpus
        .iter()
        .enumerate()
        .map(|(k, entry)| {
            let body = json!({
                "messages": [
                    {"role": "system", "content": "Answer with JSON only."},
                    {"role": "user", "content": entry["prompt"]},
                ],
                "max_tokens": 256,
                "temperature": TEMPERATURES[k % TEMPERATURES.len()],
                "seed": k,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": entry["name"], "strict": true, "schema": entry["schema"],
                }},
            });
            let name = entry["name"].as_str().unwrap().to_string();
            (name, entry["schema"].clone(), body)
        })
        .collect();
    let started = Instant::now();
    let results: Vec<(String, Value, String, String)> = std::thread::scope(|s| {
        let chunks: Vec<_> = jobs.chunks(jobs.len().div_ceil(8)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let server = &server;
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(name, schema, body)| {
                            let v = chat(server, body.clone());
                            let choice = &v["choices"][0];
                            (
                                name.clone(),
                                schema.clone(),
                                choice["message"]["content"].as_str().unwrap().to_string(),
                                choice["finish_reason"].as_str().unwrap().to_string(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let finished: Vec<(Value, String)> = results
        .iter()
        .filter(|r| r.3 == "stop")
        .map(|r| (r.1.clone(), r.2.clone()))
        .collect();
    let cut: Vec<&str> = results
        .iter()
        .filter(|r| r.3 != "stop")
        .map(|r| r.0.as_str())
        .collect();
    let bad = validate(&finished);
    eprintln!(
        "{} answers in {:.1} s: {} finished, all checked; {} cut at max_tokens {cut:?}",
        results.len(),
        started.elapsed().as_secs_f64(),
        finished.len(),
        cut.len()
    );
    assert!(
        bad.is_empty(),
        "answers that do not validate:\n{}",
        bad.join("\n")
    );
    assert!(
        (cut.len() as f64) <= MAX_CUT * results.len() as f64,
        "{} of {} answers were cut at max_tokens: {cut:?}",
        cut.len(),
        results.len()
    );
}

#[test]
fn grammars_json_objects_completions_and_streams_are_constrained() {
    let server = Server::start(&[], &[]);
    // GBNF, at a high temperature.
    let grammar = r#"root ::= "The answer is " ("yes" | "no") "." [ ]? [0-9]{1,3}"#;
    for seed in 0..4 {
        let v = chat(
            &server,
            json!({"messages": [{"role": "user", "content": "Is water wet?"}], "grammar": grammar,
                   "temperature": 1.5, "seed": seed, "max_tokens": 30}),
        );
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let rest = text.strip_prefix("The answer is ").expect(text);
        let rest = rest
            .strip_prefix("yes.")
            .or_else(|| rest.strip_prefix("no."))
            .expect(text);
        let digits = rest.strip_prefix(' ').unwrap_or(rest);
        assert!(
            (1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
    }
    // json_object: an object.
    let v = chat(
        &server,
        json!({"messages": [{"role": "user", "content": "Describe a cat."}],
               "response_format": {"type": "json_object"}, "max_tokens": 200}),
    );
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    }
    // /v1/completions with llama-server's json_schema.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "A number:", "json_schema": schema, "max_tokens": 20}).to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    let n = serde_json::from_str::<Value>(&text).unwrap()["n"]
        .as_i64()
        .unwrap();
    assert!((1..=9).contains(&n), "{text}");
    // Streamed: the deltas join into a valid answer.
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}}, "required": ["city", "sunny"], "additionalProperties": false});
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Weather in Rome?"}], "stream": true, "max_tokens": 60,
                "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}})
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    let last = events
        .iter()
        .rev()
        .find(|e| !e["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{text}");
    assert!(validate(&[(schema.clone(), text)]).is_empty());
    // /metrics counts the constrained requests and their masks.
    assert!(server.metric("fathom_constrained_requests_total").unwrap() >= 7.0);
    let masks = server.metric("fathom_constraint_masks_total").unwrap();
    let seconds = server
        .metric("fathom_constraint_mask_seconds_total")
        .unwrap();
    assert!(masks > 7.0 && seconds > 0.0, "{masks} masks in {seconds} s");
    assert!(server.metric("fathom_constraint_cache_hits_total").unwrap() >= 3.0);
    // A pick is found by asking the constraint about the likeliest tokens
    // (greedy: the step's pick alone; with a logit bias or a temperature:
    // the sampler walks them), so most tokens take no mask; the unit tests
    // of `fathom_engine::checked_pick` show the pick is the masked one.
    let answer = |extra: Value| {
        let before = server.metric("fathom_constraint_masks_total").unwrap();
        let mut body = json!({"messages": [{"role": "user", "content": "Weather in Oslo?"}],
               "max_tokens": 60, "seed": 3,
               "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let v = chat(&server, body);
        let masks = server.metric("fathom_constraint_masks_total").unwrap() - before;
        let choice = &v["choices"][0];
        (
            choice["message"]["content"].as_str().unwrap().to_string(),
            masks,
            v["usage"]["completion_tokens"].as_f64().unwrap(),
        )
    };
    let greedy = answer(json!({"temperature": 0}));
    let biased = answer(json!({"temperature": 0, "logit_bias": {"0": 0}}));
    let sampled = answer(json!({"temperature": 0.8}));
    assert_eq!(greedy.0, biased.0);
    // This prompt asks for prose, so the schema refuses SmolLM2's
    // likeliest tokens at many places: those take masks. A sampled row's
    // walk still settles some picks, a greedy row's most.
    for (how, (text, masks, tokens), most) in [
        ("greedy", greedy, 0.5),
        ("biased", biased, 0.5),
        ("sampled", sampled, 0.9),
    ] {
        assert!(
            validate(&[(schema.clone(), text.clone())]).is_empty(),
            "{how}: {text}"
        );
        assert!(
            masks <= tokens * most,
            "{how}: {masks} masks for {tokens} tokens"
        );
    }
}

#[test]
fn schemas_that_cannot_be_enforced_get_400_naming_the_keyword() {
    let server = Server::start(&[], &[]);
    let ask = |field: &str, value: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4});
        body[field] = value;
        server.post("/v1/chat/completions", &body.to_string(), &[])
    };
    for (schema, keyword) in [
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
        (
            json!({"if": {"type": "string"}, "then": {"minLength": 2}}),
            "if",
        ),
        (json!({"not": {"type": "string"}}), "not"),
        (
            json!({"type": "object", "dependentRequired": {"a": ["b"]}}),
            "dependentRequired",
        ),
    ] {
        let r = ask(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}),
        );
        let v = r.assert_error(400, "invalid_schema");
        assert_eq!(v["error"]["param"], "response_format", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(keyword), "{keyword}: {message}");
    }
    // Real-API-style schemas with such keywords: refused, the keyword named.
    let refused = data_entries(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/refused_schemas.json"),
    );
    assert!(refused.len() >= 10, "{} refused schemas", refused.len());
    for entry in &refused {
        let r = ask(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": entry["name"], "schema": entry["schema"]}}),
        );
        let v = r.assert_error(400, "invalid_schema");
        let message = v["error"]["message"].as_str().unwrap();
        let keyword = entry["keyword"].as_str().unwrap();
        assert!(
            message.contains(keyword),
            "{}: {keyword}: {message}",
            entry["name"]
        );
    }
    let r = ask("json_schema", json!({"$ref": "#/$defs/missing"}));
    r.assert_error(400, "invalid_schema");
    let r = ask("grammar", json!("root ::= undefined-rule"));
    let v = r.assert_error(400, "invalid_grammar");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("undefined-rule"),
        "{v}"
    );
}

/// Hostile schemas and grammars are refused or bounded, quickly, and the
/// server goes on serving.
#[test]
fn hostile_schemas_are_refused_or_bounded_quickly() {
    let server = Server::start(&[], &[]);
    // Each within the body's JSON limits (nesting, value count), so the
    // constraint engine is what meets them.
    let mut deep = json!({"type": "integer"});
    for _ in 0..60 {
        deep = json!({"type": "array", "items": deep});
    }
    let huge_enum: Vec<String> = (0..12_000)
        .map(|i| format!("value-{i:05}-{}", "x".repeat(i % 17)))
        .collect();
    let many_props: serde_json::Map<String, Value> = (0..2000)
        .map(|i| {
            (
                format!("p{i}"),
                json!({"type": "string", "pattern": "^(a|b|c)*[0-9]{3,7}(x|y)+$"}),
            )
        })
        .collect();
    let cases = [
        ("deep nesting", json!({"json_schema": deep})),
        ("huge enum", json!({"json_schema": {"enum": huge_enum}})),
        (
            "many patterned properties",
            json!({"json_schema": {"type": "object", "properties": many_props, "required": many_props.keys().collect::<Vec<_>>()}}),
        ),
        (
            "exponential regex",
            json!({"json_schema": {"type": "string", "pattern": "^(a|aa)*(a|aa)*(a|aa)*(a|aa)*b{1,500}[a-z]{200,400}$"}}),
        ),
        (
            "counted repetition",
            json!({"json_schema": {"type": "string", "pattern": "^(x{1,1000}){1,1000}$"}}),
        ),
        (
            "grammar blow-up",
            json!({"grammar": format!("root ::= {}", "(\"a\" | \"b\" | \"ab\")* ".repeat(400))}),
        ),
    ];
    for (what, extra) in cases {
        let mut body = json!({"messages": [{"role": "user", "content": "go"}], "max_tokens": 16});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let started = Instant::now();
        let r = server.post("/v1/chat/completions", &body.to_string(), &[]);
        let took = started.elapsed();
        assert!(
            [200, 400, 413, 500].contains(&r.status),
            "{what}: {} {}",
            r.status,
            r.body.chars().take(300).collect::<String>()
        );
        assert!(took < Duration::from_secs(20), "{what} took {took:?}");
        eprintln!(
            "{what}: {} in {:.2} s: {}",
            r.status,
            took.as_secs_f64(),
            r.body.chars().take(160).collect::<String>()
        );
    }
    // Still serving.
    let v = chat(
        &server,
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    assert!(v["choices"][0]["message"]["content"].is_string());
}

/// Streams `body` to `/v1/chat/completions` over a raw socket; returns the
/// longest wait between two reads that brought events, and the whole
/// response.
fn stream_with_gaps(server: &Server, body: &Value) -> (Duration, String) {
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = body.to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).unwrap();
    socket.write_all(body.as_bytes()).unwrap();
    let (mut out, mut buf) = (Vec::new(), [0u8; 16384]);
    let (mut last, mut longest) = (None::<Instant>, Duration::ZERO);
    loop {
        let n = std::io::Read::read(&mut socket, &mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if buf[..n].windows(6).any(|w| w == b"data: ") {
            let now = Instant::now();
            if let Some(last) = last {
                longest = longest.max(now - last);
            }
            last = Some(now);
        }
    }
    (longest, String::from_utf8_lossy(&out).into_owned())
}

/// Slow constraints (masks near their per-token budget, or past it) slow
/// the steps they share by at most that budget: a plain stream beside
/// them keeps getting tokens, and each of them ends, answered or failed.
#[test]
fn slow_constraints_never_stall_the_other_streams() {
    let server = Server::start(&["-np", "4", "-c", "1024"], &[]);
    let slow = [
        json!({"grammar": format!("root ::= {}", "(\"a\" | \"b\" | \"ab\")* ".repeat(40))}),
        json!({"json_schema": {"type": "string", "pattern": "^(a|aa)*(a|aa)*(a|aa)*b{1,50}[a-z]{20,40}$"}}),
        json!({"grammar": "root ::= ([a-z] | [a-z] [a-z] | [a-z] [a-z] [a-z])+ \".\""}),
    ];
    let plain = json!({"messages": [{"role": "user", "content": "Tell me about the sea."}],
                       "max_tokens": 48, "ignore_eos": true, "stream": true, "temperature": 0});
    let started = Instant::now();
    let (gap, response) = std::thread::scope(|s| {
        let others: Vec<_> = slow
            .iter()
            .map(|extra| {
                let server = &server;
                s.spawn(move || {
                    let mut body = json!({"messages": [{"role": "user", "content": "go"}],
                                          "max_tokens": 48, "temperature": 1.0});
                    for (k, v) in extra.as_object().unwrap() {
                        body[k] = v.clone();
                    }
                    let r = server.post("/v1/chat/completions", &body.to_string(), &[]);
                    assert!(
                        [200, 400, 500].contains(&r.status),
                        "{} {}",
                        r.status,
                        r.body
                    );
                })
            })
            .collect();
        // The slow ones are in the batch by now.
        std::thread::sleep(Duration::from_millis(300));
        let plain = stream_with_gaps(&server, &plain);
        for h in others {
            h.join().unwrap();
        }
        plain
    });
    let text = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let events = text.matches("\"delta\":{\"content\":").count();
    eprintln!(
        "plain stream beside slow constraints: {events} content events, longest gap {:.0} ms, all done in {:.1} s",
        gap.as_secs_f64() * 1000.0,
        started.elapsed().as_secs_f64()
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(text.contains("[DONE]"), "the plain stream ended: {text}");
    assert!(events >= 8, "the plain stream got its tokens: {text}");
    assert!(
        gap < Duration::from_secs(3),
        "the plain stream waited {gap:?} between tokens"
    );
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather of a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false},
            "strict": true}},
        {"type": "function", "function": {
            "name": "search", "description": "Search the web",
            "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60}},
                "required": ["query"], "additionalProperties": false}}},
    ])
}

/// Asserts OpenAI's shape of a call and that its arguments validate
/// against the named function's parameters; returns (name, arguments).
fn check_call(call: &Value, tools: &Value) -> (String, Value) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let args_text = call["function"]["arguments"]
        .as_str()
        .expect("arguments are a JSON string");
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("a call to an unknown function: {call}"));
    let schema = tool["function"]["parameters"].clone();
    let bad = validate(&[(schema, args_text.to_string())]);
    assert!(bad.is_empty(), "{bad:?}");
    (name, serde_json::from_str(args_text).unwrap())
}

/// Asserts that the answer `v` is one call and nothing else, in OpenAI's
/// shape, its arguments valid ([`check_call`]); returns (name, arguments).
fn one_call(v: &Value, tools: &Value) -> (String, Value) {
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    check_call(&calls[0], tools)
}

/// Asserts that the answer `v` to an `auto` request is the model's own:
/// text, or calls (`finish_reason` `tool_calls`) each valid
/// ([`check_call`]).
fn text_or_valid_calls(v: &Value, tools: &Value) {
    let choice = &v["choices"][0];
    match choice["message"]["tool_calls"].as_array() {
        Some(calls) => {
            assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
            assert!(!calls.is_empty(), "{v}");
            for call in calls {
                check_call(call, tools);
            }
        }
        None => assert!(choice["message"]["content"].is_string(), "{v}"),
    }
}

#[test]
fn tool_calls_round_trip_required_named_auto_and_none() {
    let server = Server::start(&["-c", "2048"], &[]);
    let tools = weather_tools();
    let ask = |choice: Value, temperature: f64, seed: u64| {
        chat(
            &server,
            json!({"messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
                   "tools": tools, "tool_choice": choice, "temperature": temperature, "seed": seed,
                   "max_tokens": 120}),
        )
    };
    // required: always a valid call, at any temperature.
    for (seed, temperature) in [(1, 0.0), (2, 0.8), (3, 1.4), (4, 1.4)] {
        one_call(&ask(json!("required"), temperature, seed), &tools);
    }
    // A named function: that one.
    let v = ask(
        json!({"type": "function", "function": {"name": "search"}}),
        1.0,
        5,
    );
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    let (name, args) = check_call(&calls[0], &tools);
    assert_eq!(name, "search");
    assert!(args["query"].is_string());
    // auto: a call or an answer, either well formed.
    for seed in 0..3 {
        text_or_valid_calls(&ask(json!("auto"), 0.8, seed), &tools);
    }
    // none: plain text, no calls.
    let v = ask(json!("none"), 0.0, 0);
    assert!(
        v["choices"][0]["message"].get("tool_calls").is_none(),
        "{v}"
    );
    assert!(v["choices"][0]["message"]["content"].is_string());
}

#[test]
fn a_history_with_tool_results_is_answered_and_streamed_calls_reassemble() {
    let server = Server::start(&["-c", "2048"], &[]);
    let tools = weather_tools();
    let mut messages =
        vec![json!({"role": "user", "content": "What is the weather like in Paris today?"})];
    let v = chat(
        &server,
        json!({"messages": messages, "tools": tools, "tool_choice": "required", "max_tokens": 120}),
    );
    let message = v["choices"][0]["message"].clone();
    let call = message["tool_calls"][0].clone();
    check_call(&call, &tools);
    // The call and its result go back; the model answers (or calls again).
    messages.push(message);
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}));
    let v = chat(
        &server,
        json!({"messages": messages, "tools": tools, "max_tokens": 120, "temperature": 0}),
    );
    let choice = &v["choices"][0];
    assert!(
        choice["message"]["content"].is_string() || choice["message"]["tool_calls"].is_array(),
        "{v}"
    );
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() > 100,
        "the history was rendered: {v}"
    );

    // Streamed: id, type and name first, then the arguments, which join
    // into the same kind of call.
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Search the web for Rust tutorials."}], "tools": tools,
                "tool_choice": "required", "stream": true, "max_tokens": 120})
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done);
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    for e in &events {
        let choice = &e["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_string());
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                assert!(
                    d["id"].is_string() && d["function"]["name"].is_string(),
                    "the head first: {d}"
                );
                calls.push(json!({"id": d["id"], "type": d["type"],
                    "function": {"name": d["function"]["name"], "arguments": ""}}));
            }
            let fragment = d["function"]["arguments"].as_str().unwrap_or("");
            let joined = format!(
                "{}{fragment}",
                calls[i]["function"]["arguments"].as_str().unwrap()
            );
            calls[i]["function"]["arguments"] = json!(joined);
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_eq!(calls.len(), 1, "{events:?}");
    check_call(&calls[0], &tools);
}

/// Runs `program args` and asserts it succeeded, showing its output.
fn run_client(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (scripts/test.sh installs the clients)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{what}:\n{text}");
    assert!(out.status.success(), "{what} failed:\n{text}");
}

/// The official clients, as agents use them: the `openai` Python package
/// (`tools=`, streamed calls, a round trip, `chat.completions.parse` with
/// pydantic models) and the `openai` npm package (installed by
/// scripts/test.sh under `~/.cache/fathom/node`, or `FATHOM_NODE_MODULES`).
#[test]
fn the_official_openai_clients_call_tools_and_parse_structured_answers() {
    let server = Server::start(&["-c", "2048"], &[]);
    let base = server.url("/v1");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    run_client(
        "openai (Python)",
        Command::new("python3")
            .arg(data.join("openai_client.py"))
            .arg(&base),
    );
    let modules = std::env::var_os("FATHOM_NODE_MODULES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/fathom/node")
        });
    assert!(
        modules.join("node_modules/openai").exists(),
        "{} has no node_modules/openai: run scripts/test.sh (it installs the npm package openai there)",
        modules.display()
    );
    // ES modules resolve packages from the script's folder: run a copy there.
    let script = modules.join("fathom_openai_client.mjs");
    std::fs::copy(data.join("openai_client.mjs"), &script).unwrap();
    run_client("openai (JS)", Command::new("node").arg(&script).arg(&base));
}

/// A copy of SmolLM2 named `name` in `dir` with `template` as its chat
/// template.
fn smollm2_with_template(dir: &common::TempDir, name: &str, template: &str) -> PathBuf {
    smollm2_with_tokens(dir, name, template, &[])
}

/// A server of SmolLM2 with the real chat template `name` (which
/// `scripts/fetch-vocab.sh` puts in `models/templates/`), in a folder
/// `tag` that lives as long as the server is used.
fn real_template_server(tag: &str, name: &str) -> (common::TempDir, Server) {
    template_server(tag, &real_template(name))
}

/// The real chat template `name`, which `scripts/fetch-vocab.sh` puts in
/// `models/templates/`.
fn real_template(name: &str) -> String {
    let path = common::smollm2()
        .parent()
        .unwrap()
        .join("templates")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/fetch-vocab.sh, which fetches the real chat templates",
            path.display()
        )
    })
}

/// A server of SmolLM2 with `template` as its chat template, in a folder
/// `tag` that lives as long as the server is used.
fn template_server(tag: &str, template: &str) -> (common::TempDir, Server) {
    let dir = common::TempDir::new(tag);
    let model = smollm2_with_template(&dir, &format!("smollm2-{tag}.gguf"), template);
    let server = Server::start_model(&model, &["-c", "2048"], &[]);
    (dir, server)
}

/// What the thinking and the harmony stand-ins both answer: `body(extra)`
/// asks (with `extra`'s fields) for an answer that a grammar makes two
/// lowercase words of reasoning and then "Done.". Whole, the words come
/// back as `reasoning_content` and "Done." as `content`; streamed, the
/// reasoning's deltas come first, then the content's, and joined they are
/// the same, no marker in either. Returns the reasoning.
fn two_words_of_reasoning_then_done(server: &Server, body: &dyn Fn(Value) -> Value) -> String {
    let v = chat(server, body(json!({})));
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["content"], "Done.", "{v}");
    assert_eq!(choice["finish_reason"], "stop", "{v}");
    let reasoning = choice["message"]["reasoning_content"]
        .as_str()
        .expect("reasoning_content")
        .to_string();
    let words: Vec<&str> = reasoning.split(' ').collect();
    assert!(
        words.len() == 2
            && words
                .iter()
                .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase())),
        "{reasoning:?}"
    );
    let (events, streamed, content) = streamed_parts(server, body(json!({"stream": true})));
    assert_eq!(streamed, reasoning);
    assert_eq!(content, "Done.");
    let first_content = events
        .iter()
        .position(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .unwrap();
    assert!(events[first_content..]
        .iter()
        .all(|e| e["choices"][0]["delta"]["reasoning_content"].is_null()));
    reasoning
}

/// A Qwen3-style thinking template on the SmolLM2 weights.
const THINKING_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}";

#[test]
fn a_thinking_models_reasoning_comes_apart_from_its_answer_whole_and_streamed() {
    let dir = common::TempDir::new("serve-thinking");
    let model = smollm2_with_template(&dir, "smollm2-thinking.gguf", THINKING_TEMPLATE);
    let server = Server::start_model(&model, &[], &[]);
    // The grammar makes the model think, then answer.
    let grammar = r#"root ::= "<think>" [a-z]{2,8} " " [a-z]{2,8} "</think>" "\n\nDone.""#;
    let body = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think, then say done."}],
                  "grammar": grammar, "temperature": 0, "max_tokens": 40}),
            extra,
        )
    };
    let reasoning = two_words_of_reasoning_then_done(&server, &body);
    // reasoning_format none: the text as written.
    let v = chat(&server, body(json!({"reasoning_format": "none"})));
    let message = &v["choices"][0]["message"];
    assert_eq!(
        message["content"],
        format!("<think>{reasoning}</think>\n\nDone."),
        "{v}"
    );
    assert!(message.get("reasoning_content").is_none(), "{v}");
    let r = server.post(
        "/v1/chat/completions",
        &body(json!({"reasoning_format": "hidden"})).to_string(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("reasoning_format"), "{}", r.body);
    // The model opens its own block here, and the grammar writes the
    // whole answer, thinking included: a budget is refused rather than
    // ignored (bound the thinking in the grammar).
    let r = server.post(
        "/v1/chat/completions",
        &body(json!({"thinking_budget_tokens": 16})).to_string(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["param"], "thinking_budget_tokens", "{e}");
    assert_eq!(e["error"]["code"], "unsupported_parameter", "{e}");
    // chat_template_kwargs reach the template: thinking off closes an
    // empty block in the prompt.
    let prompt_tokens = |extra: Value| {
        chat(&server, body(extra))["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap()
    };
    let (on, off) = (
        prompt_tokens(json!({})),
        prompt_tokens(json!({"chat_template_kwargs": {"enable_thinking": false}})),
    );
    assert!(off > on, "thinking off: {off} prompt tokens, on: {on}");
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "x", "chat_template_kwargs": {"enable_thinking": false}}).to_string(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("chat_template_kwargs"), "{}", r.body);
}

/// A minimal harmony chat template (gpt-oss's format, after openai/harmony's
/// docs/format.md): the functions in a developer message, past calls as
/// commentary messages to `functions.NAME` after their reasoning (read as
/// `thinking`, as gpt-oss's own template reads it), results as messages
/// from them, and the generation prompt `<|start|>assistant`.
const HARMONY_TEMPLATE: &str = r#"<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Reasoning: low

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{%- if tools %}
Calls to these tools must go to the commentary channel: 'functions'.{% endif %}<|end|>
{%- if tools %}<|start|>developer<|message|># Tools

## functions

namespace functions {
{% for t in tools %}
// {{ t.function.description }}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{% endfor %}
} // namespace functions<|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}{% if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif %}{% for c in m.tool_calls %}<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }} <|constrain|>json<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|start|>functions.{{ m.name or 'tool' }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'system' %}<|start|>developer<|message|># Instructions

{{ m.content }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"#;

/// gpt-oss's harmony format on a stand-in: the SmolLM2 weights and
/// tokenizer with a harmony chat template (real server, HTTP, grammar
/// engine). SmolLM2's vocabulary has no harmony tokens, so here the
/// markers are text the model spells out; gpt-oss's own control tokens
/// are decoded to the same text (the tokenizer's
/// `harmony_markers_are_decoded_and_only_return_and_call_end_generation`),
/// and the split reads only the text. A grammar makes the model reason on
/// the analysis channel and answer on the final one; `tool_choice`
/// `required` makes it call a function through the server's own harmony
/// grammar.
#[test]
fn harmony_channels_and_tool_calls_come_apart_on_a_stand_in_with_the_markers_as_text() {
    let dir = common::TempDir::new("serve-harmony");
    let model = smollm2_with_template(&dir, "smollm2-harmony.gguf", HARMONY_TEMPLATE);
    let server = Server::start_model(&model, &["-c", "2048"], &[]);
    let grammar = r#"root ::= "<|channel|>analysis<|message|>" [a-z]{2,8} " " [a-z]{2,8} "<|end|><|start|>assistant<|channel|>final<|message|>Done.""#;
    let body = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think, then say done."}],
                  "grammar": grammar, "temperature": 0, "max_tokens": 60}),
            extra,
        )
    };
    let reasoning = two_words_of_reasoning_then_done(&server, &body);
    // reasoning_format none: the text as written, markers and all.
    let v = chat(&server, body(json!({"reasoning_format": "none"})));
    let message = &v["choices"][0]["message"];
    assert_eq!(
        message["content"],
        format!("<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final<|message|>Done."),
        "{v}"
    );
    assert!(message.get("reasoning_content").is_none(), "{v}");

    // Tools: the template renders them; a required call comes back as
    // tool_calls, its arguments valid for the function, whole and streamed
    // (one call: the stand-in, unlike gpt-oss, has no `<|call|>` token to
    // end its answer with, and would go on calling).
    let tools = weather_tools();
    let ask = |choice: Value, extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
                  "tools": tools, "tool_choice": choice, "temperature": 0, "max_tokens": 120,
                  "parallel_tool_calls": false}),
            extra,
        )
    };
    let v = chat(&server, ask(json!("required"), json!({})));
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    check_call(&calls[0], &tools);
    for marker in ["<|", "|>"] {
        assert!(
            !choice["message"]["reasoning_content"]
                .as_str()
                .unwrap_or("")
                .contains(marker),
            "{v}"
        );
    }
    // parallel_tool_calls: a call may be followed by more, each valid.
    // Whether the stand-in goes on after its first call (`<|start|>`) or
    // ends (`<|call|>`) is a near-tie that rounding moves (it went on
    // until the CPU attention's sums were regrouped), so the count is not
    // held here; reading several calls is `tools::tests`'.
    let v = chat(
        &server,
        ask(
            json!("required"),
            json!({"parallel_tool_calls": true, "max_tokens": 240}),
        ),
    );
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{v}");
    for call in calls {
        check_call(call, &tools);
    }
    let with_tools = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let v = chat(&server, ask(json!("none"), json!({})));
    let without = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        with_tools > without + 50,
        "the template rendered the tools: {with_tools} prompt tokens with them, {without} without"
    );
    // A named function: that one.
    let v = chat(
        &server,
        ask(
            json!({"type": "function", "function": {"name": "search"}}),
            json!({}),
        ),
    );
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(check_call(&calls[0], &tools).0, "search", "{v}");
    // Streamed: the call's head, then its arguments, then tool_calls.
    let r = server.post(
        "/v1/chat/completions",
        &ask(json!("required"), json!({"stream": true})).to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done);
    let heads: Vec<&Value> = events
        .iter()
        .filter_map(|e| {
            e["choices"][0]["delta"]["tool_calls"][0]
                .as_object()
                .map(|_| e)
        })
        .collect();
    assert_eq!(heads.len(), 2, "{events:?}");
    let head = &heads[0]["choices"][0]["delta"]["tool_calls"][0];
    let args = heads[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].clone();
    let call = json!({"id": head["id"], "type": head["type"],
                      "function": {"name": head["function"]["name"], "arguments": args}});
    check_call(&call, &tools);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert!(
        events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .all(|c| !c.contains("<|")),
        "{events:?}"
    );
    // The call and its result go back through the template; it answers.
    let v = chat(
        &server,
        json!({"messages": [
                {"role": "user", "content": "What is the weather like in Paris today?"},
                {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                 "content": "{\"temperature\": 21}"}],
               "tools": tools, "grammar": null, "temperature": 0, "max_tokens": 8}),
    );
    let with_result = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(with_result > with_tools, "{v}");
    // The call's reasoning sent back (as harmony's docs ask of clients)
    // reaches the template, which writes it as the analysis message.
    let v = chat(
        &server,
        json!({"messages": [
                {"role": "user", "content": "What is the weather like in Paris today?"},
                {"role": "assistant", "content": null, "tool_calls": [call],
                 "reasoning_content": "The user wants the weather in Paris, so I call the function."},
                {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                 "content": "{\"temperature\": 21}"}],
               "tools": tools, "temperature": 0, "max_tokens": 8}),
    );
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() > with_result + 10,
        "{v}"
    );
}

/// Copies a GGUF (argv: source, copy, chat template) with the chat
/// template and its tokens from id 3 on (SmolLM2's unused control tokens,
/// `<repo_name>` ...) renamed, one for each further argument `TYPE:TEXT`
/// (a llama.cpp token type: 1 normal, 3 control, 4 user-defined, which
/// decodes as its text), in order.
const RENAME_TOKENS_PY: &str = r#"
import sys
import gguf
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
src, dst, template, *renamed = sys.argv[1:]
reader = gguf.GGUFReader(src)
tokens = list(reader.get_field("tokenizer.ggml.tokens").contents())
types = list(reader.get_field("tokenizer.ggml.token_type").contents())
for i, entry in enumerate(renamed):
    kind, text = entry.split(":", 1)
    tokens[3 + i] = text
    types[3 + i] = int(kind)
writer = gguf.GGUFWriter(dst, arch=reader.get_field("general.architecture").contents(), endianess=reader.endianess)
T = gguf.GGUFValueType
copy_with_new_metadata(reader, writer, {
    "tokenizer.ggml.tokens": MetadataDetails(T.ARRAY, tokens, sub_type=T.STRING),
    "tokenizer.ggml.token_type": MetadataDetails(T.ARRAY, types, sub_type=T.INT32),
    gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(T.STRING, template),
}, [])
"#;

/// A copy of SmolLM2 named `name` in `dir` with `template` as its chat
/// template and its tokens 3, 4, ... renamed to `tokens` (llama.cpp token
/// type, text as the vocabulary spells it), [`RENAME_TOKENS_PY`].
fn smollm2_with_tokens(
    dir: &common::TempDir,
    name: &str,
    template: &str,
    tokens: &[(u8, &str)],
) -> PathBuf {
    gguf_with_tokens(&common::smollm2(), dir, name, template, tokens)
}

/// [`smollm2_with_tokens`] of the GGUF at `src`.
fn gguf_with_tokens(
    src: &Path,
    dir: &common::TempDir,
    name: &str,
    template: &str,
    tokens: &[(u8, &str)],
) -> PathBuf {
    let model = dir.0.join(name);
    let out = Command::new("python3")
        .args(["-c", RENAME_TOKENS_PY])
        .arg(src)
        .arg(&model)
        .arg(template)
        .args(tokens.iter().map(|(kind, text)| format!("{kind}:{text}")))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "renaming the tokens (pip install gguf; scripts/test.sh does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

/// o200k_harmony's markers, control tokens as in gpt-oss's GGUFs; renamed
/// into SmolLM2 ([`smollm2_with_tokens`]) they are ids 3 to 9.
const HARMONY_MARKERS: [(u8, &str); 7] = [
    (3, "<|start|>"),
    (3, "<|channel|>"),
    (3, "<|message|>"),
    (3, "<|end|>"),
    (3, "<|return|>"),
    (3, "<|call|>"),
    (3, "<|constrain|>"),
];

/// gpt-oss's markers as the control tokens they are in its vocabulary, on
/// SmolLM2's weights (its vocabulary with seven unused control tokens
/// renamed, [`HARMONY_MARKERS`]): the real tokenizer, decoder, grammar
/// engine and server read them. The weights know nothing of them, so
/// `logit_bias` makes the model take the marker tokens wherever the grammar
/// allows them. The answer's messages come apart, `<|end|>` does not end
/// generation and `<|return|>` does.
#[test]
fn harmony_markers_as_control_tokens_are_decoded_split_and_end_generation_as_gpt_oss_needs() {
    let dir = common::TempDir::new("serve-harmony-tokens");
    let model = smollm2_with_tokens(
        &dir,
        "smollm2-harmony-vocab.gguf",
        HARMONY_TEMPLATE,
        &HARMONY_MARKERS,
    );
    let server = Server::start_model(&model, &["-c", "2048"], &[]);
    let (start, channel, message, end, ret, constrain) = (3, 4, 5, 6, 7, 9);
    let markers = json!({start.to_string(): 100, channel.to_string(): 100, message.to_string(): 100,
                         end.to_string(): 100, constrain.to_string(): 100});
    let grammar = r#"root ::= "<|channel|>analysis<|message|>" [a-z]{2,8} " " [a-z]{2,8} "<|end|><|start|>assistant<|channel|>final<|message|>Done.""#;
    let ask = |extra: Value| {
        chat(
            &server,
            with_fields(
                json!({"messages": [{"role": "user", "content": "Think, then say done."}],
                      "temperature": 0, "max_tokens": 60, "logit_bias": markers}),
                extra,
            ),
        )
    };
    let v = ask(json!({"grammar": grammar, "logprobs": true}));
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["content"], "Done.", "{v}");
    let reasoning = choice["message"]["reasoning_content"].as_str().unwrap();
    assert_eq!(reasoning.split(' ').count(), 2, "{v}");
    assert_eq!(choice["finish_reason"], "stop", "{v}");
    // Each marker was one token: the control tokens, decoded.
    let tokens: Vec<&str> = choice["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    for marker in ["<|channel|>", "<|message|>", "<|end|>", "<|start|>"] {
        assert!(tokens.contains(&marker), "{marker} in {tokens:?}");
    }
    // Streamed, the same parts.
    let (_, streamed, content) = streamed_parts(
        &server,
        json!({"messages": [{"role": "user", "content": "Think, then say done."}], "grammar": grammar,
               "temperature": 0, "max_tokens": 60, "logit_bias": markers, "stream": true}),
    );
    assert_eq!((streamed.as_str(), content.as_str()), (reasoning, "Done."));
    // `<|end|>` ends a message, not the answer; `<|return|>` ends it.
    let v = ask(
        json!({"logit_bias": {end.to_string(): 100}, "max_tokens": 3, "reasoning_format": "none"}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"], "<|end|><|end|><|end|>",
        "{v}"
    );
    let v = ask(json!({"logit_bias": {ret.to_string(): 100}, "max_tokens": 3}));
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 1, "{v}");
    // A required call, its header in marker tokens. The bias puts marker
    // tokens inside the arguments' strings too (they are text to the
    // grammar): they stay the arguments', and the call is read whole. One
    // call: biased to `<|start|>`, the stand-in would go on calling.
    let tools = weather_tools();
    let v = ask(
        json!({"tools": tools, "tool_choice": "required", "max_tokens": 120, "parallel_tool_calls": false}),
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    check_call(&calls[0], &tools);
}

/// `response_format` under a harmony template (gpt-oss's format, on the
/// SmolLM2 stand-in with the markers as text): as llama.cpp does, the
/// answer is constrained to an optional analysis message and then the
/// final channel, whose body is the schema's JSON. The reasoning comes back
/// as `reasoning_content`, the JSON as `content`, and every finished answer
/// validates (Python's `jsonschema`), whole and streamed. `/v1/completions`
/// renders no template: there the answer is the JSON alone.
#[test]
fn harmony_json_answers_may_reason_first_and_the_json_is_the_content() {
    let dir = common::TempDir::new("serve-harmony-json");
    let model = smollm2_with_template(&dir, "smollm2-harmony.gguf", HARMONY_TEMPLATE);
    let server = Server::start_model(&model, &["-np", "4", "-c", "2048"], &[]);
    let schema = json!({"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                       "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
        "required": ["name", "age", "languages"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}});
    let ask = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think about it on the analysis channel first. Then describe Ada Lovelace as JSON: name, age, languages."}],
                  "response_format": format, "max_tokens": 240}),
            extra,
        )
    };
    let mut cases = Vec::new();
    let mut reasoned = 0;
    for (temperature, seed) in [(0.0, 0), (0.8, 1), (0.8, 2), (1.0, 3), (1.0, 4), (1.2, 5)] {
        let v = chat(
            &server,
            ask(json!({"temperature": temperature, "seed": seed})),
        );
        let choice = &v["choices"][0];
        let message = &choice["message"];
        let reasoning = message["reasoning_content"].as_str().unwrap_or("");
        assert!(!reasoning.contains("<|"), "a marker in the reasoning: {v}");
        if choice["finish_reason"] == "length" {
            continue;
        }
        assert_eq!(choice["finish_reason"], "stop", "{v}");
        if !reasoning.is_empty() {
            reasoned += 1;
        }
        let content = message["content"].as_str().expect("content");
        assert!(content.starts_with('{') && !content.contains("<|"), "{v}");
        cases.push((schema.clone(), content.to_string()));
    }
    eprintln!(
        "harmony json: {} finished, {reasoned} with reasoning",
        cases.len()
    );
    // A small model may reason past max_tokens (all reasoning, no JSON).
    assert!(cases.len() >= 3, "{} of 6 answers finished", cases.len());
    assert!(reasoned >= 1, "no answer reasoned first");
    let bad = validate(&cases);
    assert!(bad.is_empty(), "{bad:#?}");

    // Streamed: reasoning deltas, then content ones, the same answer.
    streams_as_whole(&server, ask(json!({"temperature": 0.8, "seed": 1})));

    // json_object: the final channel holds an object.
    let v = chat(
        &server,
        ask(json!({"response_format": {"type": "json_object"}, "temperature": 0})),
    );
    if v["choices"][0]["finish_reason"] == "stop" {
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            serde_json::from_str::<Value>(content).unwrap().is_object(),
            "{v}"
        );
    }

    // Completions: no template, so no headers: the JSON from the start.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "Ada Lovelace as JSON:", "response_format": format,
                "temperature": 0, "max_tokens": 120})
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with('{'), "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            validate(&[(schema.clone(), text.to_string())]).is_empty(),
            "{v}"
        );
    }

    // A keyword the engine cannot enforce is still 400 invalid_schema.
    let r = server.post(
        "/v1/chat/completions",
        &ask(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"type": "array", "uniqueItems": true}}}}),
        )
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["code"], "invalid_schema", "{e}");
    assert_eq!(e["error"]["param"], "response_format", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uniqueItems"),
        "{e}"
    );
}

/// A template that shows past reasoning (ChatML with a line for each name
/// templates read it by), and on request shows what it got through
/// `raise_exception`, whose message the 400 carries.
const REASONING_HISTORY_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}(reasoning_content: {{ m.reasoning_content }})\n{% endif %}{% if m.thinking %}(thinking: {{ m.thinking }})\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if messages[-1].content == 'Show the history.' %}{{ raise_exception('reasoning_content=[' ~ messages[1].reasoning_content ~ '] thinking=[' ~ messages[1].thinking ~ ']') }}{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// An assistant message's `reasoning_content` (or `reasoning`) reaches the
/// chat template as `reasoning_content` and `thinking`, through the real
/// server; a value that is not a string, or one that spells out a control
/// token, is a 400 naming the field.
#[test]
fn past_reasoning_reaches_the_template_under_the_names_templates_read() {
    let dir = common::TempDir::new("serve-reasoning-history");
    let model = smollm2_with_template(&dir, "smollm2-history.gguf", REASONING_HISTORY_TEMPLATE);
    let server = Server::start_model(&model, &[], &[]);
    let history = |assistant: Value, last: &str| {
        json!({"messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            assistant,
            {"role": "user", "content": last}],
            "temperature": 0, "max_tokens": 4})
    };
    let ask = |body: Value| server.post("/v1/chat/completions", &body.to_string(), &[]);
    let reasoning = "Two plus two is four; say it plainly.";
    for field in ["reasoning_content", "reasoning"] {
        let r = ask(history(
            json!({"role": "assistant", "content": "4", field: reasoning}),
            "Show the history.",
        ));
        assert_eq!(r.status, 400, "{}", r.body);
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains(&format!(
                "reasoning_content=[{reasoning}] thinking=[{reasoning}]"
            )),
            "{field}: {message}"
        );
    }
    // Rendered into the prompt: each name's line is there.
    let tokens = |assistant: Value| {
        let r = ask(history(assistant, "And 3 + 3?"));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let without = tokens(json!({"role": "assistant", "content": "4"}));
    let with = tokens(json!({"role": "assistant", "content": "4", "reasoning_content": reasoning}));
    assert!(
        with > without + 2 * 8,
        "{without} prompt tokens without, {with} with"
    );
    // Bad values are 400 naming the field.
    for (assistant, param) in [
        (
            json!({"role": "assistant", "content": "4", "reasoning_content": 7}),
            "messages[1].reasoning_content",
        ),
        (
            json!({"role": "assistant", "content": "4", "reasoning": {"text": "x"}}),
            "messages[1].reasoning",
        ),
        (
            json!({"role": "assistant", "content": "4", "reasoning_content": "done<|im_end|>"}),
            "messages[1].reasoning_content",
        ),
    ] {
        let r = ask(history(assistant, "And 3 + 3?"));
        assert_eq!(r.status, 400, "{}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(param),
            "{e}"
        );
    }
}

/// How many words the answer `v`'s `reasoning_content` has (none when it
/// has none), each one of `words`.
fn reasoning_words(v: &Value, words: &[&str]) -> usize {
    let r = v["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap_or("");
    let found: Vec<&str> = r.split_whitespace().collect();
    assert!(found.iter().all(|w| words.contains(w)), "{v}");
    found.len()
}

/// How many of `pieces` (the biased tokens, written with or without a
/// space) a response's reasoning is made of; it holds nothing else.
fn reasoning_pieces(v: &Value, pieces: &[&str]) -> usize {
    let r = v["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap_or("");
    let rest = pieces.iter().fold(r.to_string(), |r, p| r.replace(p, ""));
    assert!(rest.trim().is_empty(), "{v}");
    pieces.iter().map(|p| r.matches(p).count()).sum()
}

/// SmolLM2's token " the", and "analysis" (as harmony's channel name
/// follows `<|channel|>`).
const THE: u32 = 260;
const ANALYSIS: u32 = 14975;

/// Issue 35: a harmony answer's analysis message is bounded, so the
/// message a constraint asks for always comes. `logit_bias` makes the
/// stand-in open the analysis channel and then write " the" forever: the
/// reasoning ends at `thinking_budget_tokens` (default half of
/// `max_tokens`) and the final channel's JSON, or the tool call, follows;
/// a budget of 0 leaves no reasoning, and on a free answer a budget is a
/// constraint of its own. Bad values are 400s naming the field.
#[test]
fn a_harmony_answers_reasoning_is_bounded_so_the_constrained_message_comes() {
    let dir = common::TempDir::new("serve-harmony-budget");
    let model = smollm2_with_template(&dir, "smollm2-harmony.gguf", HARMONY_TEMPLATE);
    let server = Server::start_model(&model, &["-c", "2048"], &[]);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["n"], "additionalProperties": false});
    let ask = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think on the analysis channel, then answer."}],
                  "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
                  "temperature": 0, "max_tokens": 100,
                  "logit_bias": {THE.to_string(): 20, ANALYSIS.to_string(): 20}}),
            extra,
        )
    };
    // The reasoning's words ("the", and "analysis" where the bias finds
    // it first), one token each.
    let thought = |v: &Value| reasoning_words(v, &["the", "analysis"]);
    for (budget, most) in [(None, 50), (Some(8), 8), (Some(0), 0)] {
        let extra = match budget {
            Some(b) => json!({"thinking_budget_tokens": b}),
            None => json!({}),
        };
        let v = chat(&server, ask(extra));
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{budget:?}: {v}");
        let n = thought(&v);
        assert!(
            n <= most && n + 1 >= most,
            "{budget:?}: {n} words of reasoning, bound {most}: {v}"
        );
        if most == 0 {
            assert!(choice["message"].get("reasoning_content").is_none(), "{v}");
        }
        let content = choice["message"]["content"].as_str().unwrap();
        assert!(
            validate(&[(schema.clone(), content.to_string())]).is_empty(),
            "{v}"
        );
    }
    // A required call: the reasoning ends, the call comes.
    let tools = weather_tools();
    let v = chat(
        &server,
        ask(
            json!({"response_format": null, "tools": tools, "tool_choice": "required",
                   "thinking_budget_tokens": 8, "max_tokens": 160}),
        ),
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!((7..=8).contains(&thought(&v)), "{v}");
    check_call(&choice["message"]["tool_calls"][0], &tools);
    // A free answer with a budget: the reasoning ends and the answer goes
    // on after it, to max_tokens (" the" again, wherever it may).
    let v = chat(
        &server,
        ask(json!({"response_format": null, "thinking_budget_tokens": 8, "max_tokens": 40})),
    );
    assert!((7..=8).contains(&thought(&v)), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    // Streamed: the same parts.
    streams_as_whole(&server, ask(json!({"thinking_budget_tokens": 8})));
    // Bad values, a grammar that writes the whole answer, completions.
    for (extra, code) in [
        (json!({"thinking_budget_tokens": -2}), "invalid_value"),
        (json!({"thinking_budget_tokens": "8"}), "invalid_value"),
        (
            json!({"response_format": null, "grammar": "root ::= \"x\"", "thinking_budget_tokens": 8}),
            "unsupported_parameter",
        ),
    ] {
        let r = server.post("/v1/chat/completions", &ask(extra).to_string(), &[]);
        assert_eq!(r.status, 400, "{}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], "thinking_budget_tokens", "{e}");
        assert_eq!(e["error"]["code"], code, "{e}");
    }
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "x", "thinking_budget_tokens": 8}).to_string(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "thinking_budget_tokens");
}

/// A template of Qwen3-Coder's shape for past calls: each argument's value
/// written as it is inside `<parameter=...>`, the function's name, a
/// result's name and call id, and the tools' descriptions among the
/// template's markers; contents as they are.
const TOOL_HISTORY_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n<function={{ c.function.name }} id={{ c.id }}>\n{% for k, v in c.function.arguments | items %}<parameter={{ k }}>{{ v }}</parameter>\n{% endfor %}</function>\n</tool_call>\n{% endfor %}{% elif m.role == 'tool' %}<tool_response name={{ m.name }} id={{ m.tool_call_id }}>\n{{ m.content }}\n</tool_response>\n{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}\n{% endfor %}<|im_end|>\n{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Issue 35: a control token's text in what a client wrote that the
/// template writes among its own markers — a past call's id, name or
/// arguments, a tool result's name or call id, a tool's description — is
/// a 400 naming the field, as reasoning is (it would become the control
/// token, `<|im_end|>` closing the turn); in a tool result's content it
/// stays text, as in any content.
#[test]
fn control_token_texts_in_past_tool_calls_and_tool_definitions_are_refused_naming_the_field() {
    let dir = common::TempDir::new("serve-tool-history");
    let model = smollm2_with_template(&dir, "smollm2-tool-history.gguf", TOOL_HISTORY_TEMPLATE);
    let server = Server::start_model(&model, &["-c", "2048"], &[]);
    let tools = weather_tools();
    let call = json!({"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}});
    let result =
        json!({"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 C"});
    let history = |call: &Value, result: &Value, tools: &Value| {
        json!({"messages": [
                {"role": "user", "content": "What is the weather like in Paris today?"},
                {"role": "assistant", "content": null, "tool_calls": [call]},
                result],
               "tools": tools, "temperature": 0, "max_tokens": 2})
    };
    let ask = |body: Value| server.post("/v1/chat/completions", &body.to_string(), &[]);
    let prompt_tokens = |result: &Value| {
        let r = ask(history(&call, result, &tools));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    prompt_tokens(&result);
    // A result's content is text: the literal is spelled out.
    let content = |text: &str| {
        let mut r = result.clone();
        r["content"] = json!(text);
        prompt_tokens(&r)
    };
    assert!(content("21 C <|im_end|> x") > content("21 C <|im_end x"));
    let with = |mut v: Value, pointer: &str, text: &str| {
        *v.pointer_mut(pointer).unwrap() = json!(text);
        v
    };
    for (body, param) in [
        (
            history(
                &with(
                    call.clone(),
                    "/function/arguments",
                    "{\"city\": \"Paris<|im_end|>\", \"unit\": \"celsius\"}",
                ),
                &result,
                &tools,
            ),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            history(
                &with(call.clone(), "/function/name", "get_weather<|im_end|>"),
                &result,
                &tools,
            ),
            "messages[1].tool_calls[0].function.name",
        ),
        (
            history(
                &with(call.clone(), "/id", "call_1<|im_end|>"),
                &result,
                &tools,
            ),
            "messages[1].tool_calls[0].id",
        ),
        (
            history(
                &call,
                &with(result.clone(), "/name", "get_weather<|im_end|>"),
                &tools,
            ),
            "messages[2].name",
        ),
        (
            history(
                &call,
                &with(result.clone(), "/tool_call_id", "call_1<|im_end|>"),
                &tools,
            ),
            "messages[2].tool_call_id",
        ),
        (
            history(
                &call,
                &result,
                &with(
                    tools.clone(),
                    "/0/function/description",
                    "Weather<|im_end|>",
                ),
            ),
            "tools[0].function.description",
        ),
    ] {
        let r = ask(body);
        assert_eq!(r.status, 400, "{param}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(param) && message.contains("<|im_end|>"),
            "{e}"
        );
    }
}

/// With `enable_thinking` false a required call comes at once, with no
/// reasoning, and a thinking budget is refused by name.
fn thinking_off_calls_at_once_and_refuses_a_budget(
    server: &Server,
    ask: &dyn Fn(Value) -> Value,
    tools: &Value,
) {
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let v = chat(
        server,
        ask(with_fields(
            off.clone(),
            json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": false}),
        )),
    );
    let message = &v["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{v}");
    check_call(&message["tool_calls"][0], tools);
    let r = server.post(
        "/v1/chat/completions",
        &ask(with_fields(off, json!({"thinking_budget_tokens": 8}))).to_string(),
        &[],
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["param"], "thinking_budget_tokens", "{e}");
    assert_eq!(e["error"]["code"], "unsupported_parameter", "{e}");
}

/// `body` streamed gives the reasoning `whole` (the same request answered
/// whole) gave, as reasoning deltas, no content, then a call of `name`.
fn streams_thinking_then_the_call(server: &Server, body: Value, whole: &Value, name: &str) {
    let (events, reasoning, content) =
        streamed_parts(server, with_fields(body, json!({"stream": true})));
    assert_eq!(
        reasoning, whole["choices"][0]["message"]["reasoning_content"],
        "{events:?}"
    );
    assert_eq!(content, "", "{events:?}");
    let call = events
        .iter()
        .find_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].as_str())
        .expect("a streamed call");
    assert_eq!(call, name);
}

/// One function whose parameters are all bounded, so a stand-in biased
/// to write " the" cannot run on inside the call.
fn forecast_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "forecast", "description": "The weather of the coming days",
        "parameters": {"type": "object", "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["days", "unit"], "additionalProperties": false}}}])
}

/// Issue 35: Qwen3.5's real template (fetched by `scripts/fetch-vocab.sh`)
/// on the SmolLM2 weights ends its prompt inside `<think>`. `logit_bias`
/// makes the stand-in think " the" forever: a required call, a named one
/// and a `response_format` answer still come, after the thinking closes at
/// `thinking_budget_tokens` (default half of `max_tokens`); the thinking
/// comes back as `reasoning_content`, the call as `tool_calls`, the JSON
/// as `content`, whole and streamed. With thinking off the prompt closes
/// the block itself: the call comes at once, and a budget is refused.
#[test]
fn an_opened_thinking_block_closes_before_the_constrained_call_or_json() {
    let (_dir, server) = real_template_server("serve-opened-thinking", "Qwen3.5-4B.jinja");
    let tools = forecast_tools();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["n"], "additionalProperties": false});
    let ask = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think, then answer."}],
                  "temperature": 0, "max_tokens": 100,
                  "logit_bias": {THE.to_string(): 20}}),
            extra,
        )
    };
    let thought = |v: &Value| reasoning_words(v, &["the"]);
    // One call: after it, the stand-in would rather start another than end.
    let required = json!({"tools": tools, "tool_choice": "required", "thinking_budget_tokens": 8,
                          "parallel_tool_calls": false});
    // Without a budget, half of max_tokens: the rest holds the call, which
    // takes this vocabulary some 60 tokens.
    let named = json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "forecast"}},
                       "parallel_tool_calls": false, "max_tokens": 200});
    for (extra, most) in [(required.clone(), 8), (named, 100)] {
        let v = chat(&server, ask(extra));
        let n = thought(&v);
        assert!(
            n <= most && n + 1 >= most,
            "{n} words of thought, bound {most}: {v}"
        );
        one_call(&v, &tools);
    }
    // Streamed: the thinking as reasoning deltas, then the call.
    let whole = chat(&server, ask(required.clone()));
    streams_thinking_then_the_call(&server, ask(required), &whole, "forecast");

    // response_format: the thinking, then the JSON as content.
    let format = json!({"response_format": {"type": "json_schema",
                        "json_schema": {"name": "n", "schema": schema}}});
    for (budget, most) in [(json!(8), 8), (json!(0), 0), (json!(null), 50)] {
        let body = ask(with_fields(
            format.clone(),
            json!({"thinking_budget_tokens": budget}),
        ));
        let v = json_after_thought(&server, body, &schema);
        let n = thought(&v);
        assert!(
            n <= most && n + 1 >= most,
            "{n} words of thought, bound {most}: {v}"
        );
    }
    // A budget alone bounds a free answer, which goes on after it.
    let v = chat(
        &server,
        ask(json!({"thinking_budget_tokens": 8, "max_tokens": 40})),
    );
    assert!((7..=8).contains(&thought(&v)), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");

    // Thinking off: the template closes the block; the call comes at once.
    thinking_off_calls_at_once_and_refuses_a_budget(&server, &ask, &tools);
}

/// A `response_format` answer after a thought: it finishes, its content
/// validates against `schema`, and streamed it is the same answer.
fn json_after_thought(server: &Server, body: Value, schema: &Value) -> Value {
    let v = chat(server, body.clone());
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        validate(&[(schema.clone(), content.to_string())]).is_empty(),
        "{v}"
    );
    streams_as_whole(server, body);
    v
}

/// SmolLM2's tokens "<" and "think" (`<think>` is `<`, `think`, `>`
/// here, as `<tool_call>` is `<`, `tool`, `_`, `call`, `>`).
const LT: u32 = 44;
const THINK: u32 = 17400;

/// Issue 35: Qwen3's real template (fetched by `scripts/fetch-vocab.sh`)
/// on the SmolLM2 weights opens no thinking block: with thinking on the
/// model opens its own. `logit_bias` makes the stand-in open `<think>`
/// (rather than start the call or the JSON at once) and think " the"
/// forever: a required call and a `response_format` answer still come,
/// after the block closes at `thinking_budget_tokens`; the thinking comes
/// back as `reasoning_content`, the call as `tool_calls`, the JSON as
/// `content`, whole and streamed. With thinking off the template closes
/// an empty block: no thinking, and a budget is refused.
#[test]
fn the_models_own_thinking_block_comes_before_the_constrained_call_or_json() {
    let (_dir, server) = real_template_server("serve-own-thinking", "Qwen-Qwen3-0.6B.jinja");
    let tools = forecast_tools();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["n"], "additionalProperties": false});
    let ask = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think, then answer."}],
                  "temperature": 0, "max_tokens": 100,
                  "logit_bias": {THE.to_string(): 20, THINK.to_string(): 30, LT.to_string(): 8}}),
            extra,
        )
    };
    let thought = |v: &Value| reasoning_pieces(v, &["the", "think"]);
    let required = json!({"tools": tools, "tool_choice": "required", "thinking_budget_tokens": 8,
                          "parallel_tool_calls": false});
    let v = chat(&server, ask(required.clone()));
    assert_eq!(thought(&v), 8, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    one_call(&v, &tools);
    // Streamed: the thinking as reasoning deltas, then the call.
    streams_thinking_then_the_call(&server, ask(required), &v, "forecast");

    // response_format: the thinking, then the JSON as content; a budget of
    // 0 leaves no block.
    let format = json!({"response_format": {"type": "json_schema",
                        "json_schema": {"name": "n", "schema": schema}}});
    for (budget, want) in [(json!(8), 8), (json!(0), 0), (json!(null), 50)] {
        let body = ask(with_fields(
            format.clone(),
            json!({"thinking_budget_tokens": budget}),
        ));
        let v = json_after_thought(&server, body, &schema);
        assert_eq!(thought(&v), want, "{v}");
    }
    // A budget alone makes a free answer's block optional and bounded (the
    // grammar-level tests walk the block): this stand-in, free to write
    // "think" at once, does not open one, and its answer runs on free.
    let v = chat(
        &server,
        ask(json!({"thinking_budget_tokens": 8, "max_tokens": 40})),
    );
    assert_eq!(thought(&v), 0, "{v}");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("think")));
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");

    // Thinking off: the template closes an empty block; no thinking.
    thinking_off_calls_at_once_and_refuses_a_budget(&server, &ask, &tools);
}

/// Issue 35: Gemma 4's real template (fetched by `scripts/fetch-vocab.sh`)
/// on the SmolLM2 weights: the template declares the functions, a required
/// or named call is constrained to Gemma 4's own syntax
/// (`<|tool_call>call:NAME{...}<tool_call|>`) and comes back as OpenAI's
/// `tool_calls`, whole and streamed, its arguments valid for the schema
/// (string `pattern` and `format` included); the call and its result go
/// back through the template. With
/// `enable_thinking` the model's own thought channel may come first.
#[test]
fn gemma4s_own_call_syntax_round_trips_through_the_server() {
    let (_dir, server) = real_template_server("serve-gemma4-tools", "google-gemma-4-31B-it.jinja");
    let tools = weather_tools();
    let ask = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
                   "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
                   "max_tokens": 120}),
            extra,
        )
    };
    one_call_at_any_temperature(&server, &ask, &tools);
    let v = chat(
        &server,
        ask(json!({"tool_choice": {"type": "function", "function": {"name": "search"}}})),
    );
    let call = v["choices"][0]["message"]["tool_calls"][0].clone();
    let (name, _) = check_call(&call, &tools);
    assert_eq!(name, "search");
    streams_one_call(&server, ask(json!({})), &tools);
    strings_meet_their_pattern_and_format(&server, json!({}));
    // The call and its result go back; the history is rendered in
    // Gemma 4's syntax (longer than the question alone) and answered.
    let history = json!([
        {"role": "user", "content": "What is the weather like in Paris today?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21}"},
    ]);
    let v = chat(
        &server,
        json!({"messages": history, "tools": tools, "max_tokens": 16, "temperature": 0}),
    );
    let asked = chat(&server, ask(json!({"max_tokens": 1})));
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap()
            > asked["usage"]["prompt_tokens"].as_u64().unwrap() + 10,
        "{v}"
    );

    // With enable_thinking the model may think in its own thought channel
    // first (`logit_bias` makes the stand-in open it and think "channel"
    // and " the"):
    // bounded by thinking_budget_tokens, it comes back as
    // reasoning_content, then the call. Thinking off (the default), the
    // template closes an empty thought and a budget is refused.
    let forecast = forecast_tools();
    let think = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "Think, then answer."}],
                   "tools": forecast, "tool_choice": "required", "parallel_tool_calls": false,
                   "thinking_budget_tokens": 8, "temperature": 0, "max_tokens": 100,
                   "logit_bias": {THE.to_string(): 20, CHANNEL.to_string(): 30}}),
            extra,
        )
    };
    let v = chat(
        &server,
        think(json!({"chat_template_kwargs": {"enable_thinking": true}})),
    );
    assert_eq!(reasoning_pieces(&v, &["the", "channel"]), 8, "{v}");
    one_call(&v, &forecast);
    let r = server.post("/v1/chat/completions", &think(json!({})).to_string(), &[]);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "thinking_budget_tokens");
}

/// SmolLM2's token "channel" (Gemma 4's `<|channel>` is `<`, `|`,
/// `channel`, `>` here, as `<|tool_call>` is `<`, `|`, `tool`, ...).
const CHANNEL: u32 = 12078;

/// Issue 35: a string's `pattern` (anchored or found anywhere) and
/// `format` hold in a required call, greedy and sampled
/// ([`one_call_at_any_temperature`]): its arguments validate
/// (`jsonschema` checks `date`). `fields` go into each request.
fn strings_meet_their_pattern_and_format(server: &Server, fields: Value) {
    let booking = json!([{"type": "function", "function": {
        "name": "book", "description": "Book a flight",
        "parameters": {"type": "object", "properties": {
            "flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3,4}$"},
            "day": {"type": "string", "format": "date"},
            "note": {"type": "string", "pattern": "ok|fine", "maxLength": 30}},
            "required": ["day", "flight", "note"], "additionalProperties": false}}}]);
    let book = |extra: Value| {
        with_fields(
            with_fields(
                json!({"messages": [{"role": "user", "content": "Book me a flight to Oslo."}],
                       "tools": booking, "tool_choice": "required", "parallel_tool_calls": false,
                       "max_tokens": 160}),
                fields.clone(),
            ),
            extra,
        )
    };
    one_call_at_any_temperature(server, &book, &booking);
}

/// `ask(extra)` is one valid call ([`one_call`]) greedy and at
/// temperatures 0.8 and 1.3.
fn one_call_at_any_temperature(server: &Server, ask: &dyn Fn(Value) -> Value, tools: &Value) {
    for (seed, temperature) in [(1, 0.0), (2, 0.8), (3, 1.3)] {
        let v = chat(
            server,
            ask(json!({"seed": seed, "temperature": temperature})),
        );
        one_call(&v, tools);
    }
}

/// `body` streamed is one call and no content: a chunk with the call's
/// head, then one with its arguments, valid for `tools`
/// ([`check_call`]).
fn streams_one_call(server: &Server, body: Value, tools: &Value) {
    let (events, _, content) = streamed_parts(server, with_fields(body, json!({"stream": true})));
    assert_eq!(content, "", "{events:?}");
    let deltas: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(deltas.len(), 2, "{events:?}");
    let calls = streamed_calls(&events);
    assert_eq!(calls.len(), 1, "{events:?}");
    check_call(&calls[0], tools);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

/// The calls a stream's `delta.tool_calls` chunks carry, put together as
/// OpenAI's clients do: by `index`, the head's id, type and name, the
/// arguments' fragments joined.
fn streamed_calls(events: &[Value]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for delta in events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
    {
        let index = delta["index"]
            .as_u64()
            .expect("a tool_calls delta has an index") as usize;
        if index == calls.len() {
            calls.push(json!({"id": delta["id"], "type": delta["type"],
                              "function": {"name": delta["function"]["name"], "arguments": ""}}));
        }
        let call = calls.get_mut(index).expect("calls are streamed in order");
        let fragment = delta["function"]["arguments"].as_str().unwrap_or("");
        let joined = call["function"]["arguments"].as_str().unwrap().to_string() + fragment;
        call["function"]["arguments"] = json!(joined);
    }
    calls
}

/// A Llama 3-style tool template on the SmolLM2 weights (its ChatML
/// turns; `<|python_tag|>` named, as Llama 3.1's template does, so the
/// server reads the Llama 3 format): the functions in a system turn.
const LLAMA3_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
Respond with a JSON object {"name": function name, "parameters": its arguments} to call one of these functions, or answer in words. Never use <|python_tag|>.
{{ tools | tojson }}<|im_end|>
{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// SmolLM2's tokens `{` and `{"`.
const BRACE: u32 = 107;
const BRACE_QUOTE: u32 = 39428;

/// Issue 35: `tool_choice: "auto"` in a native format constrains the call
/// the model opens. On a Llama 3 stand-in, `logit_bias` makes the model
/// start with `{` (a Llama 3 call's opener) at any temperature: the call
/// that follows is always a listed function with valid arguments, whole
/// and streamed; pushed to " the" instead, the answer is free text, no
/// call. Under Qwen3's real template (Hermes, thinking on, so the
/// grammar holds the model's own block too), a free answer stays free.
#[test]
fn auto_constrains_the_call_the_model_opens_and_leaves_text_free() {
    let (_dir, server) = template_server("serve-auto-llama3", LLAMA3_TEMPLATE);
    let tools = forecast_tools();
    let ask = |extra: Value| {
        with_fields(
            json!({"messages": [{"role": "user", "content": "What will the weather be?"}],
                   "tools": tools, "tool_choice": "auto", "parallel_tool_calls": false,
                   "max_tokens": 80,
                   "logit_bias": {BRACE.to_string(): 30, BRACE_QUOTE.to_string(): 30}}),
            extra,
        )
    };
    auto_calls_the_model_opens_are_valid(&server, &ask, &tools);
    // Free text when the model does not open a call.
    let free =
        ask(json!({"temperature": 0, "max_tokens": 12, "logit_bias": {THE.to_string(): 20}}));
    let v = chat(&server, free.clone());
    let choice = &v["choices"][0];
    assert!(choice["message"].get("tool_calls").is_none(), "{v}");
    assert_eq!(choice["finish_reason"], "length", "{v}");
    assert!(choice["message"]["content"]
        .as_str()
        .is_some_and(|c| c.contains("the")));
    streams_as_whole(&server, free);

    // Hermes under Qwen3's template, thinking on: free text stays free,
    // and the model's own block is bounded as with a required call.
    let (_dir, server) = real_template_server("serve-auto-qwen3", "Qwen-Qwen3-0.6B.jinja");
    let ask = |bias: Value| {
        json!({"messages": [{"role": "user", "content": "Think, then answer."}],
               "tools": tools, "tool_choice": "auto", "temperature": 0, "max_tokens": 40,
               "thinking_budget_tokens": 8, "logit_bias": bias})
    };
    // The stand-in, free to write "think" without `<`, opens no block
    // (the grammar-level tests walk a block under auto).
    for bias in [json!({THE.to_string(): 20}), json!({THINK.to_string(): 30})] {
        let v = chat(&server, ask(bias));
        let message = &v["choices"][0]["message"];
        assert!(message.get("tool_calls").is_none(), "{v}");
        assert!(message.get("reasoning_content").is_none(), "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    }
}

/// Issue 35's check of a native format under `tool_choice: "auto"`:
/// `ask(extra)` (with `extra`'s fields) asks with a `logit_bias` that
/// makes the model open a call. Greedy and at temperatures 0.8 and 1.3 the
/// answer is one call to a listed function, its arguments valid for the
/// function's parameters ([`one_call`]), and streamed it is one call too
/// ([`streams_one_call`]). Without the bias the answer is the model's own,
/// text or calls, each call valid, whole and streamed (48 tokens of it:
/// a call cut there is text).
fn auto_calls_the_model_opens_are_valid(
    server: &Server,
    ask: &dyn Fn(Value) -> Value,
    tools: &Value,
) {
    one_call_at_any_temperature(server, ask, tools);
    streams_one_call(server, ask(json!({"seed": 4})), tools);
    for (seed, temperature) in [(5, 0.0), (6, 1.0)] {
        let unbiased = json!({"logit_bias": {}, "seed": seed, "temperature": temperature,
                              "max_tokens": 48});
        text_or_valid_calls(&chat(server, ask(unbiased.clone())), tools);
        let (events, _, _) =
            streamed_parts(server, ask(with_fields(unbiased, json!({"stream": true}))));
        for call in streamed_calls(&events) {
            check_call(&call, tools);
        }
    }
}

/// Issue 35's check ([`auto_calls_the_model_opens_are_valid`]) on
/// `model` served, asked [`auto_request`]s with `fields` about
/// [`weather_tools`]. Returns the server for more checks.
fn auto_calls_on(model: &Path, fields: Value) -> Server {
    let server = Server::start_model(model, &["-c", "2048"], &[]);
    let tools = weather_tools();
    let ask = |extra: Value| auto_request(&tools, with_fields(fields.clone(), extra));
    auto_calls_the_model_opens_are_valid(&server, &ask, &tools);
    server
}

/// A stand-in in a folder `tag` (which must live as long as the model is
/// used): SmolLM2 with the real chat template `template` (from
/// `models/templates/`) and its tokens 3, 4, ... renamed to `tokens`
/// ([`smollm2_with_tokens`]).
fn stand_in(tag: &str, template: &str, tokens: &[(u8, &str)]) -> (common::TempDir, PathBuf) {
    let dir = common::TempDir::new(tag);
    let model = smollm2_with_tokens(
        &dir,
        &format!("smollm2-{tag}.gguf"),
        &real_template(template),
        tokens,
    );
    (dir, model)
}

/// Qwen's `<tool_call>` and `</tool_call>`: single tokens that decode as
/// their text (user-defined, as Qwen2.5's, Qwen3's and Qwen3.5's GGUFs
/// have them; llama.cpp's Qwen3.5 test vocabulary pads their ids).
/// Renamed into SmolLM2 they are ids 3 and 4.
const QWEN_CALL_TOKENS: [(u8, &str); 2] = [(4, "<tool_call>"), (4, "</tool_call>")];
/// The id of the opener the Qwen stand-ins' `logit_bias` pushes: a
/// call's first token ([`QWEN_CALL_TOKENS`]).
const OPENER: u32 = 3;

/// A question with `tools` under `tool_choice: "auto"` (one call at most),
/// `logit_bias` pushing [`OPENER`], with `extra`'s fields.
fn auto_request(tools: &Value, extra: Value) -> Value {
    with_fields(
        json!({"messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
               "tools": tools, "tool_choice": "auto", "parallel_tool_calls": false,
               "max_tokens": 120, "logit_bias": {OPENER.to_string(): 30}}),
        extra,
    )
}

/// Issue 35: the Hermes format under Qwen3's real template, through the
/// server: pushed to write `<tool_call>` (one token, as in Qwen's
/// vocabulary), the model's call is a listed function with valid
/// arguments, whole and streamed; left alone, it answers as it likes.
#[test]
fn auto_constrains_a_hermes_call_the_model_opens() {
    let (_dir, model) = stand_in(
        "serve-auto-hermes",
        "Qwen-Qwen3-0.6B.jinja",
        &QWEN_CALL_TOKENS,
    );
    let server = auto_calls_on(&model, json!({}));
    a_close_tag_in_an_argument_stays_in_it(&server, json!({}));
}

/// Pushed to `</tool_call>` (id 4) too, a little less than to the opener,
/// the greedy stand-in writes the close tag into a string argument, where
/// the grammar allows it: the answer is still one valid call, its
/// argument holding the tag (`fields`: more of the request).
fn a_close_tag_in_an_argument_stays_in_it(server: &Server, fields: Value) {
    let tools = weather_tools();
    let bias = json!({"temperature": 0, "logit_bias": {OPENER.to_string(): 30, (OPENER + 1).to_string(): 29}});
    let v = chat(server, auto_request(&tools, with_fields(fields, bias)));
    let (_, args) = one_call(&v, &tools);
    assert!(args.to_string().contains("</tool_call>"), "{v}");
}

/// Issue 35: the Qwen XML format under Qwen3.5's real template, through
/// the server, as [`auto_constrains_a_hermes_call_the_model_opens`]: with
/// thinking off, and with the thinking block the prompt opens (bounded by
/// `thinking_budget_tokens`, the call after it). A required call's bare
/// strings meet their `pattern` and `format`.
#[test]
fn auto_constrains_a_qwen_xml_call_the_model_opens() {
    let (_dir, model) = stand_in("serve-auto-qwen-xml", "Qwen3.5-4B.jinja", &QWEN_CALL_TOKENS);
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let server = auto_calls_on(&model, off.clone());
    a_close_tag_in_an_argument_stays_in_it(&server, off.clone());
    strings_meet_their_pattern_and_format(&server, off);
    let tools = weather_tools();
    let thinking = auto_request(
        &tools,
        json!({"thinking_budget_tokens": 8, "temperature": 0}),
    );
    let v = chat(&server, thinking.clone());
    let (name, _) = one_call(&v, &tools);
    assert!(
        v["choices"][0]["message"]["reasoning_content"].is_string(),
        "{v}"
    );
    streams_thinking_then_the_call(&server, thinking, &v, &name);
}

/// Issue 35: Gemma 4's own call syntax under its real template and its
/// real vocabulary (llama.cpp's test vocabulary, which
/// `scripts/fetch-vocab.sh` fetches), where `<|tool_call>` is one token
/// (id 48), on a one-layer fixture of Gemma 3 1B's shape (the same
/// 262,144-token vocabulary size) with random weights (`fathom bench
/// fixture --vocab`); checked as
/// [`auto_constrains_a_hermes_call_the_model_opens`].
#[test]
fn auto_constrains_a_gemma4_call_the_model_opens() {
    let dir = common::TempDir::new("serve-auto-gemma4");
    let fixture = dir.0.join("gemma3-1b-gemma4-vocab.gguf");
    common::one_layer_fixture("gemma3-1b", "ggml-vocab-gemma-4.gguf", &fixture);
    let template = real_template("google-gemma-4-31B-it.jinja");
    let model = gguf_with_tokens(&fixture, &dir, "gemma4-template.gguf", &template, &[]);
    let tool_call = 48;
    auto_calls_on(&model, json!({"logit_bias": {tool_call.to_string(): 30}}));
}

/// Issue 35: harmony under gpt-oss's real template, through the server:
/// the markers are control tokens ([`HARMONY_MARKERS`], ids 3 to 9) and
/// ` to=functions.`, which gpt-oss writes in a few tokens, is one here
/// (id 10), so that `logit_bias` can push the model to address a function
/// wherever a message's text may start, and `commentary` is one too (id
/// 11), pushed so that the answer's message is one that may call (a
/// `final` one may not); the call that follows is a listed function with
/// valid arguments, whole and streamed. The stand-in may
/// reason first (pushed, its reasoning is ` to=functions.` over and over,
/// which stays reasoning) and may spell markers out as text, so
/// `thinking_budget_tokens` keeps the reasoning short enough for the call
/// to fit `max_tokens`.
#[test]
fn auto_constrains_a_harmony_call_the_model_opens() {
    let mut tokens = HARMONY_MARKERS.to_vec();
    tokens.push((1, "Ġto=functions."));
    tokens.push((1, "commentary"));
    let (_dir, model) = stand_in("serve-auto-harmony", "openai-gpt-oss-120b.jinja", &tokens);
    let (to_functions, commentary) = (10, 11);
    auto_calls_on(
        &model,
        json!({"logit_bias": {to_functions.to_string(): 30, commentary.to_string(): 30},
               "thinking_budget_tokens": 8}),
    );
}
