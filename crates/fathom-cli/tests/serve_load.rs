//! `fathom serve` under load, as issue 4 asks: many clients at once on the
//! real model over real HTTP. Concurrent greedy streams equal the same
//! requests one at a time; a client that leaves frees its KV blocks; a
//! shared prefix is reused and changes nothing; a sustained mixed load
//! stays within the plan the server printed.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::{sse_events, Server};
use serde_json::json;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "1, 2, 3, 4, 5,",
];

/// The text of a greedy streamed completion.
fn stream_text(server: &Server, prompt: &str, max_tokens: u32) -> String {
    let body =
        json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true});
    let r = server.post("/v1/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let (events, done) = sse_events(&r.body);
    assert!(done, "no [DONE]: {}", r.body);
    events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect()
}

#[test]
fn sixteen_concurrent_greedy_streams_equal_the_same_requests_one_at_a_time() {
    let server = Server::start(&["-np", "16", "-c", "256"], &[]);
    let prompts: Vec<String> = (0..16)
        .map(|i| format!("{}{}", ["", "Q: "][i / 8], PROMPTS[i % 8]))
        .collect();
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| stream_text(&server, p, 32))
        .collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || stream_text(server, p, 32))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert!(!a.is_empty(), "prompt {i} generated nothing");
        assert_eq!(a, t, "prompt {i}: {:?}", prompts[i]);
    }
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_blocks() {
    let server = Server::start(&["-np", "2", "-c", "1024"], &[]);
    let body = json!({"prompt": PROMPTS[3].repeat(20), "max_tokens": 600, "temperature": 0,
        "stream": true, "ignore_eos": true})
    .to_string();
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut socket = TcpStream::connect(&addr).unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Wait until the job holds blocks and is generating.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server
        .metric("fathom_generated_tokens_total")
        .unwrap_or(0.0)
        < 5.0
    {
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let used = server.metric("fathom_kv_blocks_used").unwrap();
    assert!(used >= 10.0, "a 240-token prompt holds 15 blocks: {used}");
    drop(socket);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("fathom_kv_blocks_used") != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "blocks still held after the client left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let generated = server.metric("fathom_generated_tokens_total").unwrap();
    assert!(generated < 600.0, "the job ran to its end: {generated}");
    // Its full blocks stay cached for reuse.
    assert!(server.metric("fathom_kv_blocks_cached").unwrap() > 0.0);
}

#[test]
fn a_shared_prefix_is_reused_and_gives_the_same_output() {
    let server = Server::start(&[], &[]);
    let prompt = format!("{} The capital of France is", PROMPTS[3].repeat(8));
    let ask = || {
        let body = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0});
        let r = server.post("/v1/completions", &body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let first = ask();
    let second = ask();
    assert_eq!(first["choices"][0]["text"], second["choices"][0]["text"]);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        (prompt_tokens - 1) / 16 * 16,
        "every whole block but the one holding the last prompt token"
    );
    assert_eq!(server.metric("fathom_prefix_cache_hits_total"), Some(1.0));
}

#[test]
fn requests_can_ignore_end_of_generation_and_run_to_max_tokens() {
    let server = Server::start(&[], &[]);
    let body = json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 40,
        "temperature": 0, "ignore_eos": true});
    let r = server.post("/v1/chat/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let r = server.post(
        "/v1/completions",
        r#"{"prompt": "x", "ignore_eos": "yes"}"#,
        &[],
    );
    let e = r.assert_error(400, "invalid_value");
    assert_eq!(e["error"]["param"], "ignore_eos", "{e}");
}

/// Peak resident memory (`VmHWM`) of a live process.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_sustained_mixed_load_stays_within_the_printed_plan() {
    let server = Server::start(&["-np", "4", "-c", "1024"], &[]);
    let printed = server.stderr.lock().unwrap().clone();
    let total: u64 = printed
        .lines()
        .find(|l| l.trim_start().starts_with("Total"))
        .and_then(|l| l.split('(').nth(1)?.split(" bytes").next()?.parse().ok())
        .unwrap_or_else(|| panic!("no Total line in\n{printed}"));
    // Six clients, each sending four requests of every kind in turn:
    // chat and completions, streamed and whole, short and long prompts.
    std::thread::scope(|s| {
        for client in 0..6 {
            let server = &server;
            s.spawn(move || {
                for round in 0..4 {
                    let long = PROMPTS[(client + round) % 8].repeat(1 + 12 * (round % 2));
                    let stream = (client + round) % 2 == 0;
                    let (path, body) = if client % 2 == 0 {
                        (
                            "/v1/chat/completions",
                            json!({"messages": [{"role": "user", "content": long}],
                                "max_tokens": 48, "stream": stream, "seed": client, "ignore_eos": true}),
                        )
                    } else {
                        (
                            "/v1/completions",
                            json!({"prompt": long, "max_tokens": 48, "stream": stream,
                                "temperature": 0, "ignore_eos": true}),
                        )
                    };
                    let r = server.post(path, &body.to_string(), &[]);
                    assert_eq!(r.status, 200, "{}", r.body);
                }
            });
        }
    });
    assert_eq!(
        server.metric("fathom_generated_tokens_total"),
        Some(24.0 * 48.0)
    );
    let peak = peak_rss(server.pid());
    println!("peak RSS {peak} bytes, printed plan total {total} bytes");
    assert!(peak <= total, "peak RSS {peak} over the plan {total}");
}

/// `fathom bench serve` on the CPU: levels of concurrent streams through
/// its own server child, then the load test (more requests than slots +
/// queue, every fifth client leaving mid-stream).
#[test]
fn bench_serve_measures_each_level_and_the_load_test_holds() {
    let dir = common::TempDir::new("bench-serve");
    let results = dir.0.join("serve.json");
    let model = common::smollm2();
    let out = common::fathom(
        &[
            "bench",
            "serve",
            model.to_str().unwrap(),
            "--streams",
            "1,4",
            "-n",
            "12",
            "-p",
            "16",
            "--queue-size",
            "2",
            "--load",
            "--load-requests",
            "10",
            "--json",
            results.to_str().unwrap(),
            "--",
            "-t",
            "2",
        ],
        &[],
    );
    let text = common::stdout(&out);
    println!("{text}");
    assert!(out.status.success(), "{text}\n{}", common::stderr(&out));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (level, streams) in levels.iter().zip([1u64, 4]) {
        assert_eq!(level["streams"], streams);
        assert_eq!(level["completion_tokens"], streams * 12, "{level}");
        assert!(level["aggregate_tokens_per_second"].as_f64().unwrap() > 0.0);
        for key in ["ttft_ms", "inter_token_ms"] {
            let (median, p99) = (&level[key]["median"], &level[key]["p99"]);
            assert!(median.as_f64().unwrap() <= p99.as_f64().unwrap(), "{level}");
        }
    }
    let load = &v["load"];
    let count = |k: &str| load[k].as_u64().unwrap();
    assert_eq!(
        count("answered") + count("left_mid_stream") + count("refused_503_retry_after"),
        10,
        "{load}"
    );
    // Every fifth client leaves, unless it was among the refused.
    assert!(count("left_mid_stream") <= 2, "{load}");
    assert!(
        count("refused_503_retry_after") >= 4,
        "10 at once against 4 slots + a queue of 2: {load}"
    );
    assert_eq!(load["blocks_returned"], true);
    // On the CPU there is no device reading; the one plan bounds the RSS.
    assert!(v["device_peak_bytes"].is_null());
    assert_eq!(v["host_within_plan"], true, "{v}");
}
