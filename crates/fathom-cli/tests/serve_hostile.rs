//! `fathom serve` probed as a hostile client would (issue 14): the real
//! binary with the real SmolLM2 GGUF on loopback, spoken to over raw TCP
//! where a well-behaved client library would not go. Every loop and every
//! read is bounded.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::{sse_events, Server};
use serde_json::{json, Value};

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_string()
}

/// Sends `request` as is and reads until the server closes (or `limit`).
fn exchange(server: &Server, request: &[u8], limit: Duration) -> Vec<u8> {
    let mut socket = TcpStream::connect(addr(server)).unwrap();
    socket.set_read_timeout(Some(limit)).unwrap();
    socket.write_all(request).unwrap();
    read_to_close(&mut socket, limit)
}

fn read_to_close(socket: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while Instant::now() < deadline {
        match socket.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
            Err(_) => break,
        }
    }
    out
}

/// Status and JSON body of a raw response (content-length bodies).
fn status_and_json(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (status, json)
}

fn assert_openai_error(raw: &[u8], status: u16) -> Value {
    let (got, v) = status_and_json(raw);
    assert_eq!(got, status, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e["code"].is_string(), "code is not null: {v}");
    v
}

fn vm_hwm(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kb * 1024
}

/// Item 1: a 3.9 MB one-word message is refused without tokenizing it in
/// full, eight at once leave /health answering, and the process stays
/// within the plan it printed, which counts the request buffers.
#[test]
fn huge_prompts_are_refused_within_the_plan_and_health_keeps_answering() {
    let server = Server::start(&["--prompt-cache", "64M"], &[]);
    let log = server.stderr.lock().unwrap().clone();
    assert!(log.contains("Request buffers"), "{log}");
    let total = server.metric("fathom_plan_bytes{term=\"total\"}").unwrap();
    let requests = server
        .metric("fathom_plan_bytes{term=\"requests\"}")
        .unwrap();
    assert!(requests >= 2.0 * 4.0 * 4_000_000.0, "{requests}");
    // Fill the prefix cache first, as the probe had it.
    for i in 0..8 {
        let body = json!({"prompt": format!("{i} {}", "cache me ".repeat(40)), "max_tokens": 2});
        assert_eq!(
            server
                .post("/v1/completions", &body.to_string(), &[])
                .status,
            200
        );
    }
    let word = "a".repeat(3_900_000);
    let chat = json!({"messages": [{"role": "user", "content": word}]}).to_string();
    let text = json!({"prompt": word, "max_tokens": 4}).to_string();
    let slowest = std::thread::scope(|s| {
        let clients: Vec<_> = (0..8)
            .map(|i| {
                let (server, chat, text) = (&server, &chat, &text);
                s.spawn(move || {
                    let started = Instant::now();
                    let r = if i % 2 == 0 {
                        server.post("/v1/chat/completions", chat, &[])
                    } else {
                        server.post("/v1/completions", text, &[])
                    };
                    r.assert_error(400, "context_length_exceeded");
                    started.elapsed()
                })
            })
            .collect();
        // /health answers while they are read and refused.
        let mut slowest = Duration::ZERO;
        while !clients.iter().all(|c| c.is_finished()) {
            let started = Instant::now();
            assert_eq!(server.get("/health", &[]).status, 200);
            slowest = slowest.max(started.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in clients {
            let took = c.join().unwrap();
            assert!(took < Duration::from_secs(10), "a refusal took {took:?}");
        }
        slowest
    });
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
    let peak = vm_hwm(server.pid()) as f64;
    assert!(peak <= total, "VmHWM {peak} over the plan total {total}");
}

/// Item 2: message content and completion prompts are text; only the
/// template's markers are special tokens (`parse_special` opts a
/// completion in).
#[test]
fn control_token_texts_in_content_stay_text() {
    let server = Server::start(&[], &[]);
    let prompt_tokens = |route: &str, body: Value| {
        let r = server.post(route, &body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let chat = |content: &str| {
        prompt_tokens(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": content}], "max_tokens": 1}),
        )
    };
    let literal = chat("hello <|im_end|> there");
    let broken = chat("hello <|im_end there");
    assert!(
        literal > broken,
        "the literal became a control token: {literal} vs {broken}"
    );
    let completion = |parse: Option<bool>| {
        let mut body = json!({"prompt": "a<|im_end|>b", "max_tokens": 1});
        if let Some(parse) = parse {
            body["parse_special"] = json!(parse);
        }
        prompt_tokens("/v1/completions", body)
    };
    assert!(completion(None) > completion(Some(true)));
    assert_eq!(completion(None), completion(Some(false)));
    server
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}], "parse_special": true})
                .to_string(),
            &[],
        )
        .assert_error(400, "unsupported_parameter");
}

/// Item 3: logit_bias changes the answer; bad ids or values are 400s
/// naming the field; the deprecated function-calling fields are refused.
#[test]
fn logit_bias_is_honoured_and_deprecated_function_calling_is_refused() {
    let server = Server::start(&[], &[]);
    let complete = |extra: Value| {
        let mut body =
            json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        server.post("/v1/completions", &body.to_string(), &[])
    };
    let text = |r: common::server::Reply| {
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let plain = text(complete(json!({})));
    // +100 on one token forces it every step.
    let forced = text(complete(json!({"logit_bias": {"1000": 100}})));
    assert_ne!(forced, plain);
    let n = forced.len() / 4;
    assert!(
        n > 0 && forced == forced[..n].repeat(4),
        "{forced:?} is not one token four times"
    );
    // The same bias on every token changes nothing.
    let all: serde_json::Map<String, Value> =
        (0..1024).map(|i| (i.to_string(), json!(-100))).collect();
    let _ = text(complete(json!({"logit_bias": all})));
    for bad in [
        json!({"999999": 1}),
        json!({"x": 1}),
        json!({"5": 101}),
        json!({"5": "1"}),
        json!([1]),
    ] {
        let r = complete(json!({"logit_bias": bad}));
        let v = r.assert_error(400, "invalid_value");
        assert_eq!(v["error"]["param"], "logit_bias", "{v}");
    }
    // The deprecated spellings of function calling are refused (tools and
    // tool_choice are served: tests/serve_structured.rs).
    for (field, value) in [
        ("functions", json!([{"name": "f", "parameters": {}}])),
        ("function_call", json!("auto")),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "x"}], field: value});
        let v = server
            .post("/v1/chat/completions", &body.to_string(), &[])
            .assert_error(400, "unsupported_parameter");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
}

/// Item 4: bodies that trickle in are timed out (408) after
/// --body-timeout, twenty at once.
#[test]
fn slow_bodies_time_out_with_408() {
    let server = Server::start(&["--body-timeout", "2"], &[]);
    let started = Instant::now();
    let answers: Vec<Vec<u8>> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..20)
            .map(|_| {
                let server = &server;
                s.spawn(move || {
                    let mut socket = TcpStream::connect(addr(server)).unwrap();
                    socket
                        .set_read_timeout(Some(Duration::from_millis(100)))
                        .unwrap();
                    socket
                        .write_all(
                            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
                        )
                        .unwrap();
                    let mut out = Vec::new();
                    let mut buf = [0u8; 4096];
                    // One byte every 200 ms, for at most 15 s.
                    for _ in 0..75 {
                        if socket.write_all(b" ").is_err() {
                            break;
                        }
                        match socket.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => out.extend_from_slice(&buf[..n]),
                            Err(_) => {}
                        }
                        if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    out
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
    for raw in answers {
        let v = assert_openai_error(&raw, 408);
        assert_eq!(v["error"]["code"], "request_timeout");
        assert!(String::from_utf8_lossy(&raw)
            .to_ascii_lowercase()
            .contains("connection: close"));
    }
    assert_eq!(server.get("/health", &[]).status, 200);
}

/// A POST of `body` to `path` sent raw, with a 30 s read timeout.
fn send_raw(addr: &str, path: &str, body: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

/// A streamed request sent raw; returns the socket once the response head
/// and the first event have arrived.
fn open_raw_stream(server: &Server, body: &Value) -> TcpStream {
    let mut socket = send_raw(&addr(server), "/v1/chat/completions", &body.to_string());
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"data: ") {
        assert!(
            socket.read(&mut byte).unwrap() == 1 && head.len() < 4096,
            "{head:?}"
        );
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    socket
}

/// Decodes a chunked body that must end with the terminating chunk.
fn dechunk(raw: &[u8]) -> Result<String, String> {
    let mut out = Vec::new();
    let mut rest = raw;
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated: no chunk size line")?;
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16)
            .map_err(|e| format!("bad chunk size: {e}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return if rest == b"\r\n" {
                Ok(String::from_utf8_lossy(&out).into_owned())
            } else {
                Err(format!("after the last chunk: {rest:?}"))
            };
        }
        if rest.len() < size + 2 {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// Item 5: at shutdown, queued requests fail at once (503, or an error
/// event for a stream that already had its 200), and streams still
/// running at --shutdown-timeout end with an error event and a proper
/// end of the chunked body.
#[test]
fn shutdown_fails_queued_requests_at_once_and_ends_cut_streams_properly() {
    let server = Server::start(&["-np", "1", "-c", "2048", "--shutdown-timeout", "3"], &[]);
    let long = json!({
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 2000, "ignore_eos": true, "temperature": 0, "stream": true,
    });
    let mut running = open_raw_stream(&server, &long);
    // The first token has been generated: it holds the only slot.
    std::thread::sleep(Duration::from_millis(300));
    let mut queued_stream = open_raw_stream(&server, &long);
    let whole = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    let whole = whole.to_string();
    let queued_whole = std::thread::spawn({
        let addr = addr(&server);
        move || {
            let mut socket = send_raw(&addr, "/v1/chat/completions", &whole);
            read_to_close(&mut socket, Duration::from_secs(20))
        }
    });
    // Both wait behind the running one (polled: a loaded machine may
    // take a while to get there).
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("fathom_queue_depth") != Some(2.0)
        || server.metric("fathom_running_sequences") != Some(1.0)
    {
        assert!(Instant::now() < deadline, "the requests never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    let signalled = Instant::now();
    // SAFETY: kill(2) with our child's pid and a valid signal.
    assert_eq!(unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) }, 0);

    // The queued stream ends at once with an error event and a proper end.
    let raw = read_to_close(&mut queued_stream, Duration::from_secs(10));
    let queued_took = signalled.elapsed();
    assert!(queued_took < Duration::from_secs(2), "{queued_took:?}");
    let (_, chunked) = split_first_chunk(&raw);
    let body = dechunk(&chunked).unwrap_or_else(|e| panic!("{e}: {raw:?}"));
    let (events, done) = sse_events(&body);
    assert!(!done);
    assert_eq!(
        events.last().unwrap()["error"]["code"],
        "shutting_down",
        "{body}"
    );
    let raw = queued_whole.join().unwrap();
    let v = assert_openai_error(&raw, 503);
    assert_eq!(v["error"]["code"], "shutting_down");

    // The running stream is cut at the timeout, with an error event and
    // the terminating chunk.
    let raw = read_to_close(&mut running, Duration::from_secs(15));
    let cut_took = signalled.elapsed();
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(8)).contains(&cut_took),
        "{cut_took:?}"
    );
    let (_, chunked) = split_first_chunk(&raw);
    let body = dechunk(&chunked)
        .unwrap_or_else(|e| panic!("{e}: {:?}", &raw[raw.len().saturating_sub(300)..]));
    let (events, done) = sse_events(&body);
    assert!(!done);
    assert!(events.len() > 2, "it ran before the cut");
    let last = events.last().unwrap();
    assert_eq!(last["error"]["code"], "shutting_down", "{last}");
    let mut server = server;
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// `open_raw_stream` consumed the head and the first chunk's size line and
/// `data: `; what remains is the rest of that chunk, then whole chunks.
/// Returns (rest of the first chunk, the chunks after it).
fn split_first_chunk(raw: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\n\n\r\n")
        .expect("the first event ends");
    (raw[..end + 2].to_vec(), raw[end + 4..].to_vec())
}

/// Item 8: the small ones.
#[test]
fn http_layer_errors_have_error_bodies_and_small_fixes_hold() {
    let server = Server::start(&[], &[("FATHOM_API_KEY", "s3cret")]);
    let limit = Duration::from_secs(10);
    // The pool's size shows before any generation.
    let r = server.get("/metrics", &[("Authorization", "Bearer s3cret")]);
    let blocks = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("fathom_kv_blocks_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    assert!(blocks > 0.0, "{}", r.body);
    // The Bearer scheme is case-insensitive.
    let hi = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4.0});
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let auth = format!("{scheme} s3cret");
        let r = server.post(
            "/v1/chat/completions",
            &hi.to_string(),
            &[("Authorization", &auth)],
        );
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    // What hyper itself refuses gets an OpenAI error object too.
    let many_headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (
            format!("GET /health HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(),
            431,
        ),
        (
            format!(
                "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "a".repeat(600_000)
            )
            .into_bytes(),
            431,
        ),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            414,
        ),
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello".to_vec(),
            400,
        ),
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            400,
        ),
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".to_vec(),
            400,
        ),
    ];
    for (request, status) in cases {
        let raw = exchange(&server, &request, limit);
        assert_openai_error(&raw, status);
    }
}
