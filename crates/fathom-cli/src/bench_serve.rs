//! `fathom bench serve`: a real `fathom serve` child on loopback under
//! concurrent streaming clients, as users would load it.
//!
//! Throughput: for each level of N streams, N greedy streaming
//! `/v1/completions` requests start together (random token-id prompts, a
//! different one per request, `ignore_eos` so each runs to its length);
//! aggregate tok/s is the completion tokens of the burst over its wall
//! time, TTFT is from a request's start to its first text chunk, and
//! inter-token latency is the gap between two text chunks of one stream.
//!
//! Load (`--load`): more requests at once than the slots and the queue
//! hold, every Nth client leaving mid-stream. Every request must be
//! answered (a stream that ends with `[DONE]`, or left by its client) or
//! refused with 503 and `Retry-After`; afterwards the pool's blocks must be
//! free again and the server healthy. Throughout, the server's device
//! memory (NVML, per process, every 10 ms) must stay within the device plan
//! it printed, and its peak RSS within its host plan.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::session::{self, DeviceWatch};

#[derive(Args)]
pub struct ServeBenchArgs {
    /// The model to serve (anything `fathom serve` takes).
    pub model: String,
    /// Concurrent streams of each throughput level, comma-separated; the
    /// server gets the largest as `--parallel`.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub streams: Vec<usize>,
    /// Tokens each request generates.
    #[arg(long, short = 'n', default_value_t = 128)]
    pub tokens: usize,
    /// Prompt tokens of each request (pseudo-random ids, a different slice
    /// per request so the prefix cache shares nothing).
    #[arg(long, short = 'p', default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Bursts per level; the median aggregate rate is reported, latencies
    /// over all of them.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Then the load test: more requests at once than slots + queue, a
    /// share of the clients leaving mid-stream.
    #[arg(long)]
    pub load: bool,
    /// Requests of the load test, all at once [default: slots + queue + a
    /// quarter of the slots]
    #[arg(long)]
    pub load_requests: Option<usize>,
    /// In the load test every Nth client disconnects after a quarter of its
    /// tokens (5: a fifth of them).
    #[arg(long, default_value_t = 5)]
    pub disconnect_every: usize,
    /// The server's `--queue-size`.
    #[arg(long, default_value_t = 16)]
    pub queue_size: usize,
    /// Seconds to wait for the server to load and answer /health.
    #[arg(long, default_value_t = 600)]
    pub ready_timeout: u64,
    /// Write the results as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write what the server printed on stderr here.
    #[arg(long, value_name = "FILE")]
    pub server_log: Option<PathBuf>,
    /// Further `fathom serve` arguments, after `--` (e.g. `-- --device
    /// cuda`); given twice, a flag takes its last value, so these override
    /// the ones the bench sets.
    #[arg(last = true)]
    pub serve_args: Vec<String>,
}

/// A running `fathom serve` child, killed on drop.
struct Server {
    child: Child,
    base: String,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into()
}

impl Server {
    /// Starts the server and waits for the address it listens on (printed
    /// before the weights load).
    fn spawn(args: &[String]) -> Result<Server> {
        let exe = std::env::current_exe().context("locating the fathom binary")?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting fathom serve")?;
        let pipe = child.stderr.take().context("the server's stderr")?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            stderr,
        };
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => server.base = format!("http://{addr}"),
            Err(_) => bail!("fathom serve printed no address:\n{}", server.log()),
        }
        Ok(server)
    }

    /// Waits until `/health` answers 200.
    fn wait_ready(&mut self, ready_timeout: Duration) -> Result<()> {
        let server = self;
        let deadline = Instant::now() + ready_timeout;
        let agent = agent();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("fathom serve exited ({status}):\n{}", server.log());
            }
            if let Ok(r) = agent.get(format!("{}/health", server.base)).call() {
                if r.status() == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "fathom serve was not ready within {} s:\n{}",
                    ready_timeout.as_secs(),
                    server.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn metrics(&self) -> Result<String> {
        let mut r = agent()
            .get(format!("{}/metrics", self.base))
            .call()
            .context("GET /metrics")?;
        Ok(r.body_mut().read_to_string()?)
    }

    fn healthy(&self) -> bool {
        agent()
            .get(format!("{}/health", self.base))
            .call()
            .is_ok_and(|r| r.status() == 200)
    }
}

/// A series' value in Prometheus text (`name` or `name{labels}`).
fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// What one client saw.
#[derive(Debug, Default)]
struct Outcome {
    status: u16,
    retry_after: bool,
    ttft: Option<Duration>,
    /// Gaps between consecutive text chunks.
    gaps: Vec<Duration>,
    /// Completion tokens as the final usage chunk counts them.
    tokens: u64,
    /// The stream ended with `[DONE]`.
    done: bool,
    /// The client left mid-stream on purpose.
    left: bool,
    /// A transport error, an error event in the stream, or a 200 stream
    /// that ended early.
    error: Option<String>,
}

/// One streaming completion; with `leave_after`, the client hangs up after
/// that many text chunks.
fn stream(base: &str, body: &str, leave_after: Option<usize>) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome::default();
    let resp = agent()
        .post(format!("{base}/v1/completions"))
        .header("Content-Type", "application/json")
        .send(body);
    let mut resp = match resp {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("request: {e}"));
            return out;
        }
    };
    out.status = resp.status().as_u16();
    out.retry_after = resp.headers().contains_key("retry-after");
    if out.status != 200 {
        let mut text = String::new();
        let _ = resp.body_mut().as_reader().read_to_string(&mut text);
        if out.status != 503 {
            out.error = Some(format!("status {}: {text}", out.status));
        }
        return out;
    }
    let mut last = None;
    let mut chunks = 0;
    for line in BufReader::new(resp.body_mut().as_reader()).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                out.error = Some(format!("reading the stream: {e}"));
                return out;
            }
        };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            out.done = true;
            break;
        }
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            out.error = Some(format!("an event that is not JSON: {data}"));
            return out;
        };
        if !event["error"].is_null() {
            out.error = Some(format!("error event: {}", event["error"]));
            return out;
        }
        if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
            out.tokens = n;
        }
        if event["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
        {
            let now = Instant::now();
            match last {
                None => out.ttft = Some(now - started),
                Some(prev) => out.gaps.push(now - prev),
            }
            last = Some(now);
            chunks += 1;
            if leave_after.is_some_and(|k| chunks >= k) {
                out.left = true;
                return out;
            }
        }
    }
    if !out.done {
        out.error = Some("the stream ended without [DONE]".into());
    }
    out
}

/// Runs every request at once (released together by a barrier); the
/// outcomes and the wall time from the release to the last answer.
fn burst(base: &str, requests: Vec<(String, Option<usize>)>) -> (Vec<Outcome>, Duration) {
    let barrier = Arc::new(Barrier::new(requests.len() + 1));
    let handles: Vec<_> = requests
        .into_iter()
        .map(|(body, leave)| {
            let (base, barrier) = (base.to_string(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                stream(&base, &body, leave)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let outcomes = handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| Outcome {
                error: Some("the client thread panicked".into()),
                ..Outcome::default()
            })
        })
        .collect();
    (outcomes, started.elapsed())
}

/// The `q` quantile (nearest rank) of `xs` in milliseconds.
fn quantile_ms(xs: &mut [Duration], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort();
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    Some((xs[rank - 1].as_secs_f64() * 1e5).round() / 100.0)
}

/// Request bodies: prompt `i` is slice `first + i` of a long pseudo-random
/// token sequence.
struct Prompts {
    ids: Vec<u32>,
    len: usize,
    tokens: usize,
    next: usize,
}

impl Prompts {
    fn body(&mut self) -> String {
        let count = self.ids.len() / self.len;
        let at = (self.next % count) * self.len;
        self.next += 1;
        json!({
            "prompt": &self.ids[at..at + self.len],
            "max_tokens": self.tokens,
            "temperature": 0,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string()
    }
}

fn level(server: &Server, prompts: &mut Prompts, streams: usize, rounds: usize) -> Value {
    let mut rates = Vec::new();
    let (mut ttfts, mut gaps) = (Vec::new(), Vec::new());
    let (mut tokens, mut failed, mut wall) = (0u64, Vec::new(), 0.0);
    for _ in 0..rounds.max(1) {
        let requests = (0..streams).map(|_| (prompts.body(), None)).collect();
        let (outcomes, took) = burst(&server.base, requests);
        let round_tokens: u64 = outcomes.iter().map(|o| o.tokens).sum();
        rates.push(round_tokens as f64 / took.as_secs_f64().max(1e-9));
        tokens += round_tokens;
        wall += took.as_secs_f64();
        for o in outcomes {
            ttfts.extend(o.ttft);
            gaps.extend(o.gaps);
            if let Some(e) = o
                .error
                .or((o.status != 200).then(|| format!("status {}", o.status)))
            {
                failed.push(e);
            }
        }
    }
    rates.sort_by(f64::total_cmp);
    let rate = rates[rates.len() / 2];
    json!({
        "streams": streams,
        "rounds": rounds.max(1),
        "completion_tokens": tokens,
        "wall_s": (wall * 1000.0).round() / 1000.0,
        "aggregate_tokens_per_second": (rate * 10.0).round() / 10.0,
        "ttft_ms": {"median": quantile_ms(&mut ttfts, 0.5), "p99": quantile_ms(&mut ttfts, 0.99)},
        "inter_token_ms": {"median": quantile_ms(&mut gaps, 0.5), "p99": quantile_ms(&mut gaps, 0.99)},
        "failed": failed,
    })
}

/// The load test; `ok` in the result says whether every check held.
fn load_test(server: &Server, prompts: &mut Prompts, args: &ServeBenchArgs, slots: usize) -> Value {
    let n = args
        .load_requests
        .unwrap_or(slots + args.queue_size + slots.div_ceil(4));
    let every = args.disconnect_every.max(1);
    let leave = (args.tokens / 4).max(1);
    let requests = (0..n)
        .map(|i| (prompts.body(), (i % every == every - 1).then_some(leave)))
        .collect();
    let (outcomes, took) = burst(&server.base, requests);
    let answered = outcomes
        .iter()
        .filter(|o| o.status == 200 && o.done)
        .count();
    let left = outcomes
        .iter()
        .filter(|o| o.status == 200 && o.left && o.error.is_none())
        .count();
    let refused = outcomes
        .iter()
        .filter(|o| o.status == 503 && o.retry_after)
        .count();
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| o.error.is_some() || !(o.done || o.left || (o.status == 503 && o.retry_after)))
        .map(|o| {
            o.error
                .clone()
                .unwrap_or_else(|| format!("status {}", o.status))
        })
        .collect();
    // The pool drains once the last stream ends and the left ones are
    // noticed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut drained = None;
    while Instant::now() < deadline {
        if let Ok(text) = server.metrics() {
            let idle = [
                "fathom_running_sequences",
                "fathom_queue_depth",
                "fathom_kv_blocks_used",
            ]
            .iter()
            .all(|s| metric(&text, s) == Some(0));
            if idle {
                drained = Some(text);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let healthy = server.healthy();
    let ok = failed.is_empty() && drained.is_some() && healthy;
    json!({
        "requests": n,
        "slots": slots,
        "queue_size": args.queue_size,
        "disconnect_every": every,
        "wall_s": (took.as_secs_f64() * 1000.0).round() / 1000.0,
        "answered": answered,
        "left_mid_stream": left,
        "refused_503_retry_after": refused,
        "failed": failed,
        "blocks_returned": drained.is_some(),
        "healthy_after": healthy,
        "ok": ok,
    })
}

fn print_level(v: &Value, single: f64) {
    let rate = v["aggregate_tokens_per_second"].as_f64().unwrap_or(0.0);
    let ms = |x: &Value| x.as_f64().map_or("-".to_string(), |m| format!("{m:.1}"));
    println!(
        "{:>8} {:>16.1} {:>9.2} {:>12} {:>10} {:>12} {:>10}{}",
        v["streams"].as_u64().unwrap_or(0),
        rate,
        rate / single.max(1e-9),
        ms(&v["ttft_ms"]["median"]),
        ms(&v["ttft_ms"]["p99"]),
        ms(&v["inter_token_ms"]["median"]),
        ms(&v["inter_token_ms"]["p99"]),
        match v["failed"].as_array().map_or(0, Vec::len) {
            0 => String::new(),
            n => format!("  {n} FAILED"),
        }
    );
}

pub fn run(args: &ServeBenchArgs) -> Result<ExitCode> {
    let mut streams = args.streams.clone();
    streams.retain(|&s| s > 0);
    if streams.is_empty() {
        bail!("--streams needs at least one level above 0, e.g. 1,16,64");
    }
    if args.tokens == 0 || args.prompt_tokens == 0 {
        bail!("--tokens and --prompt-tokens must be at least 1");
    }
    let slots = *streams.iter().max().unwrap_or(&1);
    let model = crate::pull::resolve(&args.model)?;
    let vocab = session::open(&model)?.spec.vocab;
    let mut prompts = Prompts {
        ids: fathom_fixtures::random_token_ids(args.prompt_tokens * 1024, vocab),
        len: args.prompt_tokens,
        tokens: args.tokens,
        next: 0,
    };
    let context = args.prompt_tokens + args.tokens;
    let mut serve_args: Vec<String> = vec![
        "serve".into(),
        model.to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
        "--parallel".into(),
        slots.to_string(),
        "--ctx-size".into(),
        context.to_string(),
        "--queue-size".into(),
        args.queue_size.to_string(),
    ];
    serve_args.extend(args.serve_args.iter().cloned());
    let command = format!("fathom {}", serve_args.join(" "));
    eprintln!("starting: {command}");
    let mut server = Server::spawn(&serve_args)?;
    // Sampled from before the weights load to the end.
    let watch = DeviceWatch::process(server.child.id());
    server.wait_ready(Duration::from_secs(args.ready_timeout))?;
    let first = server.metrics()?;
    let plan_total = metric(&first, "fathom_plan_bytes{term=\"total\"}");
    let host_total = metric(&first, "fathom_host_plan_bytes{term=\"total\"}");
    let on_gpu = metric(&first, "fathom_device_memory_total_bytes").is_some();
    // One short request first, so the levels measure a warm server.
    let warm = stream(&server.base, &prompts.body(), None);
    if let Some(e) = warm.error {
        bail!("the warm-up request failed: {e}\n{}", server.log());
    }

    println!(
        "{} served with {slots} slots; {} prompt + {} generated tokens per request",
        model.display(),
        args.prompt_tokens,
        args.tokens
    );
    println!(
        "{:>8} {:>16} {:>9} {:>12} {:>10} {:>12} {:>10}",
        "streams",
        "aggregate tok/s",
        "x single",
        "TTFT med ms",
        "TTFT p99",
        "ITL med ms",
        "ITL p99"
    );
    let mut levels = Vec::new();
    let mut single = None;
    for &n in &streams {
        let v = level(&server, &mut prompts, n, args.rounds);
        let rate = v["aggregate_tokens_per_second"].as_f64().unwrap_or(0.0);
        let base = *single.get_or_insert(rate);
        print_level(&v, base);
        levels.push(v);
    }
    let load = args.load.then(|| {
        let v = load_test(&server, &mut prompts, args, slots);
        println!(
            "load: {} requests at once ({} slots, queue {}, every {} leaving): {} answered, {} left mid-stream, {} refused with 503 + Retry-After, {} failed; blocks returned: {}; healthy after: {}",
            v["requests"], slots, args.queue_size, v["disconnect_every"], v["answered"],
            v["left_mid_stream"], v["refused_503_retry_after"],
            v["failed"].as_array().map_or(0, Vec::len), v["blocks_returned"], v["healthy_after"]
        );
        for f in v["failed"].as_array().into_iter().flatten().take(5) {
            println!("  failed: {f}");
        }
        v
    });
    let (device_peak, samples) = watch.map_or((None, 0), DeviceWatch::finish_counted);
    let peak_rss = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .ok()
        .and_then(|s| fathom_plan::available::proc_kib(&s, "VmHWM"))
        .map(|k| k * 1024);
    let alive = matches!(server.child.try_wait(), Ok(None));
    let device_within = match (device_peak, plan_total) {
        (Some(peak), Some(plan)) => Some(peak <= plan),
        _ => None,
    };
    let host_limit = if on_gpu { host_total } else { plan_total };
    let host_within = match (peak_rss, host_limit) {
        (Some(peak), Some(plan)) => Some(peak <= plan),
        _ => None,
    };
    if let (Some(peak), Some(plan)) = (device_peak, plan_total) {
        println!(
            "device: peak {peak} bytes used by the server (NVML, {samples} samples every 10 ms) vs device plan {plan} ({:.3}x)",
            plan as f64 / peak as f64
        );
    } else if on_gpu {
        println!("device: NVML did not list the server process; no device peak");
    }
    if let (Some(peak), Some(plan)) = (peak_rss, host_limit) {
        println!(
            "host: peak RSS {peak} bytes vs {} plan {plan} ({:.3}x)",
            if on_gpu { "host" } else { "the" },
            plan as f64 / peak as f64
        );
    }
    let ok = load.as_ref().is_none_or(|l| l["ok"] == true)
        && device_within != Some(false)
        && host_within != Some(false)
        && alive
        && levels
            .iter()
            .all(|l| l["failed"].as_array().is_some_and(Vec::is_empty));
    let doc = json!({
        "model": model.to_string_lossy(),
        "server_command": command,
        "prompt_tokens": args.prompt_tokens,
        "tokens": args.tokens,
        "slots": slots,
        "device_plan_bytes": plan_total,
        "host_plan_bytes": host_total,
        "levels": levels,
        "load": load,
        "device_peak_bytes": device_peak,
        "device_samples": samples,
        "device_within_plan": device_within,
        "server_peak_rss_bytes": peak_rss,
        "host_within_plan": host_within,
        "server_alive": alive,
        "ok": ok,
        "method": METHOD,
    });
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.server_log {
        std::fs::write(path, server.log())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", if ok { "ok" } else { "FAILED" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

const METHOD: &str = "A fathom serve child on loopback (--port 0) with --parallel = the largest level, --ctx-size = prompt + generated tokens and the given --queue-size; after one warm-up request, each level starts N streaming /v1/completions requests together (prompts of pseudo-random token ids, a different slice each, temperature 0, ignore_eos, include_usage), each client on its own connection and thread. Aggregate tok/s = the burst's completion tokens (usage) / its wall time; TTFT = request start to the first text chunk; inter-token latency = gaps between consecutive text chunks; quantiles by nearest rank. The device peak is the server process's device memory as NVML lists it, sampled every 10 ms by this process from after the server was ready to the end; the host peak is the server's VmHWM at the end.";
