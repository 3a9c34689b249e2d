//! A soak of `fathom serve` (issue 14): a mixed load through real HTTP on
//! loopback — chat and completions, streamed and whole, clients that
//! disconnect mid-stream, bursts past the queue — for `SOAK_SECONDS`
//! (default 40; `scripts/soak.sh` runs it for 30 minutes). It checks that
//! every request gets its answer or a 503, that resident memory after the
//! soak equals resident memory after the first stretch (no growth), and
//! that the peak stays within the plan the server printed.
//!
//! Bounded: one server on 127.0.0.1, a fixed number of client threads, a
//! deadline, and at most 2 hours whatever `SOAK_SECONDS` says.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::server::{sse_events, Server};
use fathom_fixtures::Rng;
use serde_json::{json, Value};

/// Resident set (`VmRSS`) and its peak (`VmHWM`) in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

const TOPICS: [&str; 6] = [
    "the sea",
    "a small robot",
    "mountains in winter",
    "how bread is made",
    "the planets",
    "a city at night",
];

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    busy: AtomicU64,
    cancelled: AtomicU64,
    lost: AtomicU64,
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One request of a random kind; counts how it ended.
fn one_request(
    server: &Server,
    rng: &mut Rng,
    counts: &Counts,
    log: &std::sync::Mutex<Vec<String>>,
) {
    let topic = TOPICS[rng.below(TOPICS.len())];
    // A shared system prompt (prefix cache hits) and a varying tail.
    let system = "You are a helpful assistant who answers in one or two short sentences.";
    let max_tokens = 4 + rng.below(40);
    let stream = rng.below(2) == 0;
    let (path, body) = if rng.below(2) == 0 {
        (
            "/v1/chat/completions",
            json!({
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("Tell me about {topic}. ({})", rng.below(1000))},
                ],
                "max_tokens": max_tokens, "stream": stream,
                "stream_options": {"include_usage": stream},
            }),
        )
    } else {
        (
            "/v1/completions",
            json!({
                "prompt": format!("{system} A note on {topic}, number {}:", rng.below(1000)),
                "max_tokens": max_tokens, "stream": stream, "temperature": 0.7,
            }),
        )
    };
    let r = server.post(path, &body.to_string(), &[]);
    let fine = match r.status {
        200 if stream => {
            let (events, done) = sse_events(&r.body);
            done && !events.is_empty() && events.iter().all(|e| e.get("error").is_none())
        }
        200 => r.json()["usage"]["completion_tokens"].as_u64().is_some(),
        503 => {
            let v: Value = r.json();
            if v["error"]["code"] == "server_busy" {
                count(&counts.busy);
                // As Retry-After asks, roughly.
                std::thread::sleep(Duration::from_millis(200 + rng.below(300) as u64));
                return;
            }
            false
        }
        _ => false,
    };
    if fine {
        count(&counts.ok);
    } else {
        count(&counts.lost);
        let mut log = log.lock().unwrap();
        if log.len() < 10 {
            log.push(format!(
                "{path} {} {}",
                r.status,
                &r.body[..r.body.len().min(300)]
            ));
        }
    }
}

/// A stream whose client reads a little and leaves.
fn disconnect(server: &Server, rng: &mut Rng, counts: &Counts) {
    let body = json!({
        "messages": [{"role": "user", "content": format!("Write a long story about {}.", TOPICS[rng.below(6)])}],
        "max_tokens": 200, "stream": true,
    })
    .to_string();
    let addr = server.base.trim_start_matches("http://");
    let Ok(mut socket) = TcpStream::connect(addr) else {
        count(&counts.lost);
        return;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // Leave once some of the stream has come (or a 503).
    let mut buf = vec![0u8; 256 + rng.below(2048)];
    let mut got = 0;
    while got < buf.len() {
        match socket.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
        if buf[..got].starts_with(b"HTTP/1.1 503") {
            std::thread::sleep(Duration::from_millis(200));
            break;
        }
    }
    count(&counts.cancelled);
}

#[test]
fn mixed_load_keeps_memory_flat_and_answers_every_request() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .clamp(10, 7200);
    let server = Server::start(
        &[
            "-np",
            "2",
            "-c",
            "512",
            "--queue-size",
            "4",
            "--prompt-cache",
            "32M",
        ],
        &[],
    );
    let total = server.metric("fathom_plan_bytes{term=\"total\"}").unwrap() as u64;

    // Warm-up, not measured: distinct long prompts cycle through the whole
    // KV pool, so its pages are resident before the first reading.
    std::thread::scope(|s| {
        for t in 0..2 {
            let server = &server;
            s.spawn(move || {
                for i in 0..6 {
                    let prompt = format!("{t}-{i}: {}", "many words to fill the cache ".repeat(70));
                    let body = json!({"prompt": prompt, "max_tokens": 16, "ignore_eos": true});
                    assert_eq!(
                        server
                            .post("/v1/completions", &body.to_string(), &[])
                            .status,
                        200
                    );
                }
            });
        }
    });

    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    // The "first minute" reading: a quarter of the run, at most 60 s in.
    let first = Duration::from_secs((seconds / 4).clamp(5, 60));
    let counts = Counts::default();
    let log = std::sync::Mutex::new(Vec::new());
    let mut early = None;
    let mut samples = 0u64;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (server, counts, log) = (&server, &counts, &log);
            s.spawn(move || {
                let mut rng = Rng::new(0x50a1_u64 + t);
                while Instant::now() < end {
                    match rng.below(10) {
                        0 => disconnect(server, &mut rng, counts),
                        _ => one_request(server, &mut rng, counts, log),
                    }
                }
            });
        }
        // Bursts past the queue: 2 running + 4 queued, then 503s.
        {
            let (server, counts, log) = (&server, &counts, &log);
            s.spawn(move || {
                let mut rng = Rng::new(0xb0057);
                while Instant::now() < end {
                    std::thread::scope(|b| {
                        for i in 0..12u64 {
                            let mut rng = Rng::new(rng.below(usize::MAX) as u64 ^ i);
                            b.spawn(move || one_request(server, &mut rng, counts, log));
                        }
                    });
                    std::thread::sleep(Duration::from_secs(3 + rng.below(5) as u64));
                }
            });
        }
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(500));
            samples += 1;
            if early.is_none() && started.elapsed() >= first {
                early = Some(memory(server.pid()).0);
            }
        }
    });
    // Quiet: the last requests have ended; cancelled jobs freed their blocks.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.metric("fathom_kv_blocks_used") != Some(0.0)
        || server.metric("fathom_running_sequences") != Some(0.0)
    {
        assert!(
            Instant::now() < deadline,
            "blocks still held after the load"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (after, peak) = memory(server.pid());
    let early = early.expect("an early reading");
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "soak: {seconds} s; {} answered, {} busy (503), {} disconnected, {} lost; \
         RSS after {:.0} s {:.1} MiB, after the soak {:.1} MiB ({:+.1} MiB); \
         peak {:.1} MiB, plan {:.1} MiB; {samples} samples",
        c(&counts.ok),
        c(&counts.busy),
        c(&counts.cancelled),
        c(&counts.lost),
        first.as_secs_f64(),
        mib(early),
        mib(after),
        mib(after) - mib(early),
        mib(peak),
        mib(total),
    );
    assert_eq!(c(&counts.lost), 0, "{:?}", log.lock().unwrap());
    assert!(c(&counts.ok) > 10, "the load ran");
    assert!(c(&counts.busy) > 0, "the bursts went past the queue");
    assert!(
        after.abs_diff(early) <= 8 << 20,
        "resident memory moved from {:.1} to {:.1} MiB",
        mib(early),
        mib(after)
    );
    assert!(peak <= total, "peak {peak} over the plan {total}");
    assert_eq!(server.get("/health", &[]).status, 200);
}
