//! `fathom serve` as clients use it: the real binary on loopback with the
//! real SmolLM2 GGUF, spoken to over real HTTP.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::{sse_events, Server};
use common::{fathom, smollm2, stderr, stdout};
use fathom_fixtures::Rng;
use serde_json::{json, Value};

const MODEL_ID: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn assert_usage(usage: &Value) -> (u64, u64) {
    let p = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    let c = usage["completion_tokens"]
        .as_u64()
        .expect("completion_tokens");
    assert_eq!(usage["total_tokens"].as_u64(), Some(p + c), "{usage}");
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"].is_u64(),
        "{usage}"
    );
    (p, c)
}

fn assert_common(v: &Value, object: &str, prefix: &str) {
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with(prefix)),
        "{v}"
    );
    assert_eq!(v["object"], object, "{v}");
    assert!(
        v["created"].as_u64().is_some_and(|t| t > 1_600_000_000),
        "{v}"
    );
    assert_eq!(v["model"], MODEL_ID, "{v}");
}

#[test]
fn chat_completion_has_the_openai_shape() {
    let server = Server::start(&[], &[]);
    let r = server.post(
        "/v1/chat/completions",
        &json!({
            "model": MODEL_ID,
            "messages": [
                {"role": "system", "content": "You are brief."},
                {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
            ],
            "max_tokens": 12,
            "temperature": 0,
        })
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_common(&v, "chat.completion", "chatcmpl-");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 1);
    let c = &choices[0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    let content = c["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{v}");
    assert!(c["logprobs"].is_null());
    assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap()));
    let (prompt, completion) = assert_usage(&v["usage"]);
    assert!(prompt > 10, "the template wraps the messages: {v}");
    assert!((1..=12).contains(&completion), "{v}");

    // The same request streamed gives the same text, chunk by chunk.
    let r = server.post(
        "/v1/chat/completions",
        &json!({
            "messages": [
                {"role": "system", "content": "You are brief."},
                {"role": "user", "content": "Say hello."},
            ],
            "max_tokens": 12,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string(),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let (events, done) = sse_events(&r.body);
    assert!(done, "the stream ends with data: [DONE]");
    assert!(events.len() >= 3, "{events:?}");
    let id = events[0]["id"].as_str().unwrap();
    for e in &events {
        assert_common(e, "chat.completion.chunk", "chatcmpl-");
        assert_eq!(e["id"], id, "one id for the whole stream");
    }
    let (last, chunks) = events.split_last().unwrap();
    // The usage chunk: no choices, the usage; every other chunk has usage null.
    assert_eq!(last["choices"], json!([]));
    let (_, streamed_completion) = assert_usage(&last["usage"]);
    assert_eq!(streamed_completion, completion);
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["delta"]["role"], "assistant");
    assert_eq!(first["delta"]["content"], "");
    let mut text = String::new();
    for (i, chunk) in chunks.iter().enumerate() {
        assert!(chunk["usage"].is_null(), "{chunk}");
        let choices = chunk["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 1, "{chunk}");
        let choice = &choices[0];
        assert_eq!(choice["index"], 0);
        assert!(choice["logprobs"].is_null());
        if i + 1 < chunks.len() {
            assert!(choice["finish_reason"].is_null(), "{chunk}");
            text.push_str(choice["delta"]["content"].as_str().unwrap());
        } else {
            assert_eq!(choice["delta"], json!({}), "{chunk}");
            assert_eq!(
                choice["finish_reason"], v["choices"][0]["finish_reason"],
                "{chunk}"
            );
        }
    }
    assert_eq!(text, content);

    // Without include_usage: no usage key on any chunk, no usage chunk.
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true})
            .to_string(),
        &[],
    );
    let (events, done) = sse_events(&r.body);
    assert!(done);
    for e in &events {
        assert!(e.get("usage").is_none(), "{e}");
        assert_eq!(e["choices"].as_array().unwrap().len(), 1, "{e}");
    }
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn greedy_completion_equals_fathom_generate() {
    let model = smollm2();
    let prompt = "The capital of France is";
    let out = fathom(
        &[
            "generate",
            model.to_str().unwrap(),
            "-p",
            prompt,
            "-n",
            "20",
            "--temp",
            "0",
            "-t",
            "2",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = stdout(&out);
    let expected = expected.strip_suffix('\n').unwrap_or(&expected);

    let server = Server::start(&[], &[]);
    let body = json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": 20, "temperature": 0});
    let r = server.post("/v1/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_common(&v, "text_completion", "cmpl-");
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], expected, "server vs fathom generate");
    assert_eq!(choice["index"], 0);
    assert!(choice["logprobs"].is_null());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(assert_usage(&v["usage"]).1, 20);

    // Streamed: text_completion chunks that add up to the same text.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = server.post("/v1/completions", &streamed.to_string(), &[]);
    let (events, done) = sse_events(&r.body);
    assert!(done);
    let mut text = String::new();
    for (i, e) in events.iter().enumerate() {
        assert_common(e, "text_completion", "cmpl-");
        let c = &e["choices"][0];
        assert_eq!(c["index"], 0);
        assert!(c["logprobs"].is_null());
        text.push_str(c["text"].as_str().unwrap());
        let last = i + 1 == events.len();
        assert_eq!(c["finish_reason"].is_null(), !last, "{e}");
    }
    assert_eq!(text, expected);

    // The same prompt as an array of one string, and as token ids.
    let mut one = body.clone();
    one["prompt"] = json!([prompt]);
    let r = server.post("/v1/completions", &one.to_string(), &[]);
    assert_eq!(r.json()["choices"][0]["text"], expected);

    // A stop string ends the text before it; a fixed seed repeats itself.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 24, "temperature": 0, "stop": ["9"]})
            .to_string(),
        &[],
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], " 6, 7, 8, ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let seeded =
        json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0, "seed": 42});
    let a = server
        .post("/v1/completions", &seeded.to_string(), &[])
        .json();
    let b = server
        .post("/v1/completions", &seeded.to_string(), &[])
        .json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[test]
fn routes_and_errors_answer_in_the_openai_shape() {
    let server = Server::start(&["--alias", "smol"], &[]);
    // /v1/models lists the one model under its alias.
    let r = server.get("/v1/models", &[]);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["id"], "smol");
    assert_eq!(data[0]["object"], "model");
    assert!(data[0]["created"].is_u64());
    assert_eq!(data[0]["owned_by"], "fathom");
    assert_eq!(server.get("/v1/models/smol", &[]).json()["id"], "smol");
    server
        .get("/v1/models/gpt-4o", &[])
        .assert_error(404, "model_not_found");

    let chat = |body: Value| server.post("/v1/chat/completions", &body.to_string(), &[]);
    let hi = json!([{"role": "user", "content": "Hi"}]);
    // The alias and the file name are both accepted; another name is 404.
    assert_eq!(
        chat(json!({"model": "smol", "messages": hi, "max_tokens": 1})).status,
        200
    );
    assert_eq!(
        chat(json!({"model": MODEL_ID, "messages": hi, "max_tokens": 1})).status,
        200
    );
    let e = chat(json!({"model": "gpt-4o", "messages": hi})).assert_error(404, "model_not_found");
    assert_eq!(e["error"]["param"], "model");
    assert_eq!(e["error"]["type"], "invalid_request_error");

    let e = chat(json!({"messages": hi, "n": 2})).assert_error(400, "invalid_value");
    assert_eq!(e["error"]["param"], "n");
    let e = chat(json!({"messages": hi, "temperature": "hot"})).assert_error(400, "invalid_value");
    assert_eq!(e["error"]["param"], "temperature");
    let e = chat(json!({"messages": [{"role": "user"}]})).assert_error(400, "invalid_value");
    assert_eq!(e["error"]["param"], "messages[0].content");
    let e = chat(json!({"messages": hi, "max_tokens": 600}))
        .assert_error(400, "context_length_exceeded");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("512"),
        "{e}"
    );
    assert_eq!(e["error"]["param"], "max_tokens");
    let long = "word ".repeat(600);
    let e = chat(json!({"messages": [{"role": "user", "content": long}]}))
        .assert_error(400, "context_length_exceeded");
    assert_eq!(e["error"]["param"], "messages");
    server
        .post("/v1/completions", r#"{"prompt": [99999999]}"#, &[])
        .assert_error(400, "invalid_value");
    server
        .post("/v1/completions", r#"{"prompt": "x", "suffix": "y"}"#, &[])
        .assert_error(400, "unsupported_parameter");
    server
        .post("/v1/chat/completions", r#"{"messages": [ {"role": "#, &[])
        .assert_error(400, "invalid_json");
    server
        .post("/v1/chat/completions", "not json at all", &[])
        .assert_error(400, "invalid_json");

    // Unknown routes are 404, known routes with another method 405 + Allow.
    server
        .get("/v1/embeddings", &[])
        .assert_error(404, "not_found");
    server
        .post("/nowhere", "{}", &[])
        .assert_error(404, "not_found");
    let r = server.get("/v1/chat/completions", &[]);
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow"), Some("POST"));
    let r = server.request("DELETE", "/health", &[]);
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow"), Some("GET"));

    // Without --allowed-origins, no CORS headers at all.
    let r = server.get("/v1/models", &[("Origin", "https://example.com")]);
    assert_eq!(r.status, 200);
    assert!(r.header("access-control-allow-origin").is_none());
}

#[test]
fn metrics_count_requests_tokens_plan_and_latency() {
    let server = Server::start(&[], &[]);
    let body = json!({"prompt": "Hello there", "max_tokens": 5, "temperature": 0, "stream": true});
    let r = server.post("/v1/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200);
    server.get("/missing", &[]);
    let r = server.get("/metrics", &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.body;
    for line in [
        "fathom_model_loaded 1",
        "fathom_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1",
        "fathom_http_requests_total{route=\"other\",status=\"404\"} 1",
        "# TYPE fathom_time_to_first_token_seconds histogram",
        "# TYPE fathom_inter_token_latency_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    let value = |series: &str| {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert!(value("fathom_prompt_tokens_total") >= 2.0);
    assert_eq!(value("fathom_generated_tokens_total"), 5.0);
    assert_eq!(value("fathom_queue_depth"), 0.0);
    for gauge in [
        "fathom_kv_blocks_total",
        "fathom_kv_blocks_used",
        "fathom_kv_blocks_cached",
        "fathom_prefix_cache_hits_total",
        "fathom_running_sequences",
    ] {
        value(gauge);
    }
    assert_eq!(value("fathom_plan_bytes{term=\"weights\"}"), 96_576_768.0);
    for term in [
        "kv",
        "activations",
        "runtime",
        "total",
        "available",
        "kv_block",
    ] {
        assert!(
            value(&format!("fathom_plan_bytes{{term=\"{term}\"}}")) > 0.0,
            "{term}"
        );
    }
    // The server, HTTP side included, stays within the plan it serves.
    let rss = value("fathom_resident_memory_bytes");
    let total = value("fathom_plan_bytes{term=\"total\"}");
    assert!(rss > 50e6 && rss <= total, "resident {rss} vs plan {total}");
    assert_eq!(value("fathom_time_to_first_token_seconds_count"), 1.0);
    assert!(value("fathom_time_to_first_token_seconds_sum") > 0.0);
    assert!(value("fathom_inter_token_latency_seconds_count") >= 1.0);
    assert_eq!(
        value("fathom_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
        1.0
    );
}

#[test]
fn api_key_guards_every_route_but_health() {
    let server = Server::start(&[], &[("FATHOM_API_KEY", "s3cret")]);
    let hi = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).to_string();
    let r = server.post("/v1/chat/completions", &hi, &[]);
    r.assert_error(401, "invalid_api_key");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    server
        .post(
            "/v1/chat/completions",
            &hi,
            &[("Authorization", "Bearer s3cre")],
        )
        .assert_error(401, "invalid_api_key");
    server
        .post("/v1/chat/completions", &hi, &[("Authorization", "s3cret")])
        .assert_error(401, "invalid_api_key");
    server
        .get("/v1/models", &[("Authorization", "Bearer wrong!")])
        .assert_error(401, "invalid_api_key");
    server
        .get("/metrics", &[])
        .assert_error(401, "invalid_api_key");
    let ok = [("Authorization", "Bearer s3cret")];
    assert_eq!(server.post("/v1/chat/completions", &hi, &ok).status, 200);
    assert_eq!(server.get("/v1/models", &ok).status, 200);
    assert_eq!(server.get("/metrics", &ok).status, 200);
    assert_eq!(server.get("/health", &[]).status, 200);
}

#[test]
fn cors_reflects_only_listed_origins_and_bodies_over_the_limit_are_413() {
    let server = Server::start(
        &[
            "--allowed-origins",
            "https://app.example, http://localhost:3000",
            "--max-body-size",
            "1K",
        ],
        &[],
    );
    let r = server.get("/v1/models", &[("Origin", "https://app.example")]);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = server.get("/v1/models", &[("Origin", "https://evil.example")]);
    assert_eq!(r.status, 200);
    assert!(r.header("access-control-allow-origin").is_none());
    // Errors carry the header too, so browsers can read them.
    let r = server.get("/nope", &[("Origin", "http://localhost:3000")]);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );

    let preflight = [
        ("Origin", "http://localhost:3000"),
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "authorization, content-type",
        ),
    ];
    let r = server.request("OPTIONS", "/v1/chat/completions", &preflight);
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("POST, OPTIONS")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("authorization, content-type")
    );
    assert!(r.header("access-control-max-age").is_some());
    let r = server.request(
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
    );
    assert!(r.header("access-control-allow-origin").is_none());
    assert!(r.header("access-control-allow-methods").is_none());

    let big = json!({"prompt": "x".repeat(2000), "max_tokens": 1}).to_string();
    let e = server
        .post("/v1/completions", &big, &[])
        .assert_error(413, "request_too_large");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024 bytes"),
        "{e}"
    );
    // Without a Content-Length (chunked), the limit holds while reading.
    let addr = server.base.trim_start_matches("http://");
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    for _ in 0..4 {
        let chunk = "x".repeat(400);
        let _ = write!(socket, "{:x}\r\n{chunk}\r\n", chunk.len());
    }
    let _ = write!(socket, "0\r\n\r\n");
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("request_too_large"), "{answer}");
    let small = json!({"prompt": "x", "max_tokens": 1}).to_string();
    assert_eq!(server.post("/v1/completions", &small, &[]).status, 200);
}

/// Sends a streamed request on a raw socket and returns it after the
/// response headers and the first event have arrived.
fn open_stream(server: &Server, body: &str) -> BufReader<TcpStream> {
    let addr = server.base.trim_start_matches("http://");
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(socket);
    let mut seen = String::new();
    while !seen.contains("data: ") {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "closed early: {seen}"
        );
        seen.push_str(&line);
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    reader
}

#[test]
fn a_client_that_disconnects_mid_stream_cancels_its_job() {
    let server = Server::start(&[], &[]);
    let body = json!({"prompt": "Tell me a long story.", "max_tokens": 400, "temperature": 0, "stream": true, "ignore_eos": true})
        .to_string();
    let stream = open_stream(&server, &body);
    drop(stream);
    // The job stops within a few steps: nothing is running and far fewer
    // than 400 tokens were generated.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("fathom_running_sequences") != Some(0.0)
        || server.metric("fathom_generated_tokens_total") == Some(0.0)
    {
        assert!(Instant::now() < deadline, "the job kept running");
        std::thread::sleep(Duration::from_millis(20));
    }
    let generated = server.metric("fathom_generated_tokens_total").unwrap();
    assert!(
        generated < 100.0,
        "{generated} tokens generated after the client left"
    );
    // The server still answers.
    let r = server.post(
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 2}"#,
        &[],
    );
    assert_eq!(r.status, 200);
}

#[test]
fn sigterm_finishes_the_request_in_flight_then_exits_0() {
    let mut server = Server::start(&[], &[]);
    let body =
        json!({"prompt": "Count: 1, 2, 3,", "max_tokens": 40, "temperature": 0, "stream": true})
            .to_string();
    let mut stream = open_stream(&server, &body);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // The stream runs to its end.
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("data: [DONE]"), "{rest}");
    assert!(rest.contains("\"finish_reason\":\"length\""), "{rest}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0), "{}", server.stderr.lock().unwrap());
    // Nothing listens any more.
    let addr = server.base.trim_start_matches("http://").to_string();
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn health_answers_before_the_model_is_loaded() {
    // The address is printed before loading: /health answers at once,
    // "loading" (503) until the weights are in, then "ok".
    let server = Server::spawn(&[], &[]);
    let r = server.get("/health", &[]);
    match r.status {
        503 => {
            assert_eq!(r.json(), json!({"status": "loading"}));
            assert!(r.header("retry-after").is_some());
        }
        200 => assert_eq!(r.json(), json!({"status": "ok"})),
        other => panic!("/health answered {other}: {}", r.body),
    }
    server.wait_ready();
    let log = server.stderr.lock().unwrap().clone();
    let listening = log.find("listening on").unwrap();
    let loaded = log.find("model loaded").unwrap();
    assert!(listening < loaded, "{log}");
    for term in [
        "Weights",
        "Activations",
        "Runtime overhead",
        "Backend in-flight",
        "KV pool",
        "Prompt cache",
        "Total",
        "Available",
    ] {
        assert!(
            log.contains(term),
            "the plan printed at start names {term}:\n{log}"
        );
    }
}

#[test]
fn estimate_memory_refuses_a_serve_plan_that_does_not_fit() {
    let model = smollm2();
    let out = fathom(
        &[
            "serve",
            model.to_str().unwrap(),
            "--estimate-memory",
            "--memory",
            "50M",
            "--kv-cache-budget",
            "none",
            "--port",
            "0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("DOES NOT FIT"), "{}", stderr(&out));
    // With the auto budget, memory too small for one KV block is an error
    // that says what to change.
    let out = fathom(
        &[
            "serve",
            model.to_str().unwrap(),
            "--memory",
            "50M",
            "--port",
            "0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--kv-cache-budget"),
        "{}",
        stderr(&out)
    );
    let out = fathom(
        &[
            "serve",
            model.to_str().unwrap(),
            "--kv-cache-budget",
            "lots",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--kv-cache-budget"),
        "{}",
        stderr(&out)
    );
    let out = fathom(&["serve", model.to_str().unwrap(), "-np", "0"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--parallel"), "{}", stderr(&out));
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let server = Server::start(&["-np", "1", "--queue-size", "1"], &[]);
    let long = json!({"prompt": "Tell me a long story.", "max_tokens": 400, "temperature": 0, "stream": true, "ignore_eos": true})
        .to_string();
    // One request runs (its first text has arrived) ...
    let running = open_stream(&server, &long);
    // ... one waits in the queue ...
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut waiting = TcpStream::connect(&addr).unwrap();
    write!(
        waiting,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{long}",
        long.len()
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("fathom_queue_depth") != Some(1.0) {
        assert!(Instant::now() < deadline, "the second request never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    // ... so the next is refused at once.
    let r = server.post(
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 1}"#,
        &[],
    );
    r.assert_error(503, "server_busy");
    assert_eq!(r.header("retry-after"), Some("1"));
    drop(running);
    drop(waiting);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = server.post(
            "/v1/completions",
            r#"{"prompt": "Hi", "max_tokens": 1}"#,
            &[],
        );
        if r.status == 200 {
            break;
        }
        r.assert_error(503, "server_busy");
        assert!(Instant::now() < deadline, "the queue never drained");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn concurrent_requests_each_get_their_own_answer() {
    let server = Server::start(&[], &[]);
    let prompts = ["1, 2, 3, 4,", "The sky is", "1, 2, 3, 4,", "The sky is"];
    let answers: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, prompt)| {
                let server = &server;
                s.spawn(move || {
                    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": i % 2 == 1});
                    let r = server.post("/v1/completions", &body.to_string(), &[]);
                    assert_eq!(r.status, 200, "{}", r.body);
                    let text = if i % 2 == 1 {
                        let (events, done) = sse_events(&r.body);
                        assert!(done);
                        events
                            .iter()
                            .map(|e| e["choices"][0]["text"].as_str().unwrap().to_string())
                            .collect()
                    } else {
                        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
                    };
                    (prompt.to_string(), text)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Greedy: the same prompt gives the same text, whoever ran first.
    assert_eq!(answers[0].1, answers[2].1);
    assert_eq!(answers[1].1, answers[3].1);
    assert_ne!(answers[0].1, answers[1].1);
    assert!(answers[0].1.starts_with(" 5, 6"), "{answers:?}");
}

#[test]
fn a_repeated_system_prompt_is_served_from_the_prefix_cache() {
    let server = Server::start(&[], &[]);
    let system = "You are a careful assistant. Answer in one short sentence, and never use lists. "
        .repeat(4);
    let ask = |question: &str| {
        let body = json!({
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_tokens": 4,
            "temperature": 0,
        });
        let r = server.post("/v1/chat/completions", &body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"].clone()
    };
    let first = ask("What is rain?");
    assert_eq!(
        first["prompt_tokens_details"]["cached_tokens"], 0,
        "{first}"
    );
    let second = ask("What is snow?");
    let cached = second["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = second["prompt_tokens"].as_u64().unwrap();
    // The shared system prompt is whole blocks of cached KV.
    assert!(cached >= 64 && cached < prompt, "{second}");
    assert!(server.metric("fathom_prefix_cache_hits_total").unwrap() >= 1.0);
    assert!(
        server
            .metric("fathom_prefix_cache_hit_tokens_total")
            .unwrap()
            >= cached as f64
    );
}

#[test]
fn environment_variables_configure_the_server_and_sigint_stops_it() {
    let mut server = Server::start(
        &[],
        &[
            ("FATHOM_CTX_SIZE", "256"),
            ("FATHOM_PARALLEL", "1"),
            ("FATHOM_ALLOWED_ORIGINS", "http://localhost:5173"),
            ("FATHOM_KV_CACHE_BUDGET", "none"),
            ("FATHOM_PROMPT_CACHE", "off"),
        ],
    );
    let log = server.stderr.lock().unwrap().clone();
    assert!(log.contains(": 1 slots x 256 tokens"), "{log}");
    assert!(log.contains("Prompt cache") && log.contains("off"), "{log}");
    let e = server.post(
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 300}"#,
        &[("Origin", "http://localhost:5173")],
    );
    assert_eq!(
        e.header("access-control-allow-origin"),
        Some("http://localhost:5173")
    );
    let e = e.assert_error(400, "context_length_exceeded");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("256 tokens"),
        "{e}"
    );

    let status = std::process::Command::new("kill")
        .args(["-INT", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0));
}

/// Mutated request bodies through the whole HTTP path (parse, template,
/// tokenizer, admission): every answer is a 200 or a 4xx error object,
/// and the server stays up.
#[test]
fn mutated_request_bodies_get_200_or_a_4xx_error_object() {
    let server = Server::start(&["-c", "48"], &[]);
    let seeds = [
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":2,"temperature":0.5,"stop":["x"],"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"{% raise %} <|im_end|>"}],"max_tokens":2,"n":1}"#,
        ),
        (
            "/v1/completions",
            r#"{"prompt":"1, 2, 3","max_tokens":2,"temperature":0,"seed":5}"#,
        ),
        (
            "/v1/completions",
            r#"{"prompt":[[1,2,3]],"max_tokens":2,"stream":true}"#,
        ),
    ];
    let inserts = [
        "null",
        "-1",
        "1e309",
        "[",
        "{",
        "\"",
        "0",
        "99999",
        "\\u0000",
        "\u{10ffff}",
        "true",
        "[]",
    ];
    let mut rng = Rng::new(0x5eed);
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..120 {
        let (route, seed) = seeds[rng.below(seeds.len())];
        let mut body = seed.as_bytes().to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(body.len() + 1);
            match rng.below(3) {
                0 if at < body.len() => {
                    body.remove(at);
                }
                1 => {
                    let i = rng.below(inserts.len());
                    body.splice(at..at, inserts[i].bytes());
                }
                _ if at < body.len() => body[at] ^= 1 << rng.below(7),
                _ => body.push(b'}'),
            }
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        let r = server.post(route, &text, &[]);
        match r.status {
            200 => ok += 1,
            400..=499 => {
                refused += 1;
                let v = r.json();
                assert!(v["error"]["message"].is_string(), "{text:?}: {v}");
                assert!(v["error"]["type"].is_string(), "{text:?}: {v}");
            }
            other => panic!("{other} for {text:?}: {}", r.body),
        }
    }
    assert!(ok > 0 && refused > 0, "{ok} answered, {refused} refused");
    assert_eq!(server.get("/health", &[]).status, 200);
}

#[test]
fn requests_still_running_after_the_shutdown_timeout_are_cut_off() {
    let mut server = Server::start(&["--shutdown-timeout", "1", "-np", "1"], &[]);
    let body = json!({"prompt": "Tell me a long story.", "max_tokens": 480, "temperature": 0, "stream": true, "stop": ["@@@@"], "ignore_eos": true})
        .to_string();
    let mut stream = open_stream(&server, &body);
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = String::new();
    let _ = stream.read_to_string(&mut rest);
    assert!(!rest.contains("[DONE]"), "the stream was cut, not finished");
    let exit = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0));
    let log = server.stderr.lock().unwrap().clone();
    assert!(log.contains("cut off"), "{log}");
}
