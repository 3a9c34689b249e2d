//! `/metrics` in the Prometheus text format: what the HTTP side counts
//! (requests, latencies), what the scheduler counts (tokens, queue, KV
//! blocks, prefix cache) and what the plan reserved.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::stats::SchedulerStats;

/// Bucket bounds in seconds for time to first token.
const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Bucket bounds in seconds between two pieces of streamed text.
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A cumulative histogram of durations.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, then one for +Inf; not cumulative here.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(b) => b.to_string(),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// What the HTTP side measures.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            time_to_first_token: Histogram::new(TTFT_BOUNDS),
            inter_token_latency: Histogram::new(ITL_BOUNDS),
        }
    }
}

/// A GPU's memory at one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceReading {
    pub free: u64,
    pub total: u64,
    /// What this process uses on it (its context included), when the
    /// driver lists the process.
    pub process: Option<u64>,
}

/// Reads the serving GPU's memory (NVML), for each `/metrics` request.
pub type DeviceProbe = Box<dyn Fn() -> Option<DeviceReading> + Send + Sync>;

/// What `/metrics` shows besides the HTTP side's own figures.
pub struct Snapshot<'a> {
    pub loaded: bool,
    pub stats: Option<&'a SchedulerStats>,
    /// `(term, bytes)` of the plan being served: on a GPU, the device's.
    pub plan: &'a [(String, u64)],
    /// `(term, bytes)` of a GPU plan's host budget; empty on the CPU.
    pub host_plan: &'a [(String, u64)],
    /// Resident memory of this process (`VmRSS`), if readable.
    pub resident_bytes: Option<u64>,
    /// The GPU's memory now, when serving on one.
    pub device: Option<DeviceReading>,
}

impl Metrics {
    /// Counts one answered request; `route` is one of the known routes or
    /// `"other"`, so labels stay bounded.
    pub fn request(&self, route: &'static str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry((route, status)).or_insert(0) += 1;
    }

    pub fn render(&self, snap: &Snapshot) -> String {
        let mut out = String::new();
        gauge(
            &mut out,
            "fathom_model_loaded",
            "1 once the model is loaded and requests are served",
            u64::from(snap.loaded),
        );
        let _ = writeln!(
            out,
            "# HELP fathom_http_requests_total HTTP requests answered, by route and status"
        );
        let _ = writeln!(out, "# TYPE fathom_http_requests_total counter");
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "fathom_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        if let Some(s) = snap.stats {
            let get = SchedulerStats::get;
            counter(
                &mut out,
                "fathom_prompt_tokens_total",
                "Prompt tokens of every job started",
                get(&s.prompt_tokens),
            );
            counter(
                &mut out,
                "fathom_generated_tokens_total",
                "Tokens generated",
                get(&s.generated_tokens),
            );
            gauge(
                &mut out,
                "fathom_queue_depth",
                "Jobs waiting for a slot or for KV blocks",
                get(&s.queue_depth),
            );
            gauge(
                &mut out,
                "fathom_running_sequences",
                "Sequences being prefilled or decoded",
                get(&s.running),
            );
            gauge(
                &mut out,
                "fathom_kv_blocks_total",
                "Blocks in the KV pool",
                get(&s.kv_blocks_total),
            );
            gauge(
                &mut out,
                "fathom_kv_blocks_used",
                "KV blocks held by running sequences",
                get(&s.kv_blocks_used),
            );
            gauge(
                &mut out,
                "fathom_kv_blocks_cached",
                "KV blocks held only by the prefix cache",
                get(&s.kv_blocks_cached),
            );
            gauge(
                &mut out,
                "fathom_prefix_cache_enabled",
                "1 when prompts' KV blocks are kept for reuse; 0 when off or impossible (hybrid models: a linear-attention layer's state is not in the blocks)",
                get(&s.prefix_cache_enabled),
            );
            counter(
                &mut out,
                "fathom_prefix_cache_hits_total",
                "Jobs that reused at least one cached prefix block",
                get(&s.prefix_cache_hits),
            );
            counter(
                &mut out,
                "fathom_prefix_cache_hit_tokens_total",
                "Prompt tokens whose KV came from the prefix cache",
                get(&s.prefix_cache_hit_tokens),
            );
            counter(
                &mut out,
                "fathom_preemptions_total",
                "Sequences preempted and recomputed",
                get(&s.preemptions),
            );
            counter(
                &mut out,
                "fathom_constrained_requests_total",
                "Requests decoded under a constraint (response_format, json_schema, grammar, tools), counted when they end",
                get(&s.constrained_jobs),
            );
            counter(
                &mut out,
                "fathom_constraint_cache_hits_total",
                "Constrained requests whose compiled constraint came from the cache",
                get(&s.constraint_cache_hits),
            );
            counter(
                &mut out,
                "fathom_constraint_masks_total",
                "Token masks computed for constrained requests",
                get(&s.constraint_masks),
            );
            seconds(
                &mut out,
                "fathom_constraint_mask_seconds_total",
                "Time spent computing token masks and checking picks against the constraint",
                get(&s.constraint_mask_micros),
            );
            seconds(
                &mut out,
                "fathom_constraint_compile_seconds_total",
                "Time spent compiling constraints (or taking them from the cache)",
                get(&s.constraint_compile_micros),
            );
        }
        if !snap.plan.is_empty() {
            let _ = writeln!(
                out,
                "# HELP fathom_plan_bytes Bytes of each term of the memory plan being served"
            );
            let _ = writeln!(out, "# TYPE fathom_plan_bytes gauge");
            for (term, bytes) in snap.plan {
                let _ = writeln!(out, "fathom_plan_bytes{{term=\"{term}\"}} {bytes}");
            }
        }
        if !snap.host_plan.is_empty() {
            let _ = writeln!(
                out,
                "# HELP fathom_host_plan_bytes Bytes of each term of a GPU plan's host budget"
            );
            let _ = writeln!(out, "# TYPE fathom_host_plan_bytes gauge");
            for (term, bytes) in snap.host_plan {
                let _ = writeln!(out, "fathom_host_plan_bytes{{term=\"{term}\"}} {bytes}");
            }
        }
        if let Some(d) = snap.device {
            gauge(
                &mut out,
                "fathom_device_memory_free_bytes",
                "Free memory of the serving GPU (NVML)",
                d.free,
            );
            gauge(
                &mut out,
                "fathom_device_memory_used_bytes",
                "Used memory of the serving GPU, every process (NVML: total - free)",
                d.total.saturating_sub(d.free),
            );
            gauge(
                &mut out,
                "fathom_device_memory_total_bytes",
                "Memory of the serving GPU (NVML)",
                d.total,
            );
            if let Some(p) = d.process {
                gauge(
                    &mut out,
                    "fathom_device_process_memory_bytes",
                    "GPU memory this process uses, its context included (NVML per process)",
                    p,
                );
            }
        }
        if let Some(rss) = snap.resident_bytes {
            gauge(
                &mut out,
                "fathom_resident_memory_bytes",
                "Resident memory of the server process (VmRSS)",
                rss,
            );
        }
        self.time_to_first_token.render(
            &mut out,
            "fathom_time_to_first_token_seconds",
            "From a generation request's arrival to its first generated text",
        );
        self.inter_token_latency.render(
            &mut out,
            "fathom_inter_token_latency_seconds",
            "Between two pieces of generated text of one request",
        );
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// A counter of seconds kept in microseconds.
fn seconds(out: &mut String, name: &str, help: &str, micros: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        micros as f64 / 1e6
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// `VmRSS` of this process from `/proc/self/status`, in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    fathom_plan::available::proc_kib(status, "VmRSS")?.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let m = Metrics::default();
        m.time_to_first_token.observe(Duration::from_millis(3));
        m.time_to_first_token.observe(Duration::from_millis(200));
        m.time_to_first_token.observe(Duration::from_secs(100));
        let text = m.render(&Snapshot {
            loaded: true,
            stats: None,
            plan: &[],
            host_plan: &[],
            resident_bytes: None,
            device: None,
        });
        assert!(!text.contains("fathom_device_"), "no GPU, no device gauges");
        assert!(
            text.contains("fathom_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("fathom_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("fathom_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("fathom_time_to_first_token_seconds_count 3\n"),
            "{text}"
        );
        assert!(
            text.contains("fathom_time_to_first_token_seconds_sum 100.203\n"),
            "{text}"
        );
        assert!(
            text.contains("fathom_inter_token_latency_seconds_count 0\n"),
            "{text}"
        );
    }

    #[test]
    fn requests_are_counted_by_route_and_status() {
        let m = Metrics::default();
        m.request("/health", 200);
        m.request("/health", 200);
        m.request("other", 404);
        let stats = SchedulerStats::default();
        let plan = [("weights".to_string(), 10)];
        let text = m.render(&Snapshot {
            loaded: false,
            stats: Some(&stats),
            plan: &plan,
            host_plan: &[],
            resident_bytes: Some(4096),
            device: None,
        });
        assert!(text.contains("fathom_http_requests_total{route=\"/health\",status=\"200\"} 2\n"));
        assert!(text.contains("fathom_http_requests_total{route=\"other\",status=\"404\"} 1\n"));
        assert!(text.contains("fathom_model_loaded 0\n"));
        assert!(text.contains("fathom_plan_bytes{term=\"weights\"} 10\n"));
        assert!(text.contains("fathom_resident_memory_bytes 4096\n"));
        assert!(text.contains("fathom_kv_blocks_total 0\n"));
    }

    #[test]
    fn a_gpu_server_shows_its_host_budget_and_the_device_memory() {
        let m = Metrics::default();
        let plan = [("total".to_string(), 1000)];
        let host = [("total".to_string(), 300), ("available".to_string(), 900)];
        let mut snap = Snapshot {
            loaded: true,
            stats: None,
            plan: &plan,
            host_plan: &host,
            resident_bytes: None,
            device: Some(DeviceReading {
                free: 700,
                total: 2000,
                process: Some(990),
            }),
        };
        let text = m.render(&snap);
        for line in [
            "fathom_plan_bytes{term=\"total\"} 1000\n",
            "fathom_host_plan_bytes{term=\"total\"} 300\n",
            "fathom_host_plan_bytes{term=\"available\"} 900\n",
            "fathom_device_memory_free_bytes 700\n",
            "fathom_device_memory_used_bytes 1300\n",
            "fathom_device_memory_total_bytes 2000\n",
            "fathom_device_process_memory_bytes 990\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        snap.device = Some(DeviceReading {
            free: 700,
            total: 2000,
            process: None,
        });
        let text = m.render(&snap);
        assert!(
            !text.contains("fathom_device_process_memory_bytes"),
            "{text}"
        );
    }

    #[test]
    fn vm_rss_is_read_in_bytes() {
        assert_eq!(
            parse_vm_rss("Name:\tx\nVmRSS:\t  1234 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(parse_vm_rss("VmHWM: 1 kB\n"), None);
        assert!(resident_bytes().is_some_and(|b| b > 0));
    }
}
