//! A real `fathom serve` on loopback, and a real HTTP client for it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::smollm2;

/// A running `fathom serve` child, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    /// Everything the server printed on stderr so far.
    pub stderr: Arc<Mutex<String>>,
    agent: ureq::Agent,
}

/// A response: status, headers (lower-case names) and body.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// Asserts an OpenAI error object with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) -> serde_json::Value {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(
            e.get("param").is_some(),
            "param is present (maybe null): {v}"
        );
        assert_eq!(e["code"], code, "{v}");
        v
    }
}

impl Server {
    /// `fathom serve SmolLM2 --port 0 -c 512 -np 2 -t 2 ARGS` with `env`
    /// (`-c` and `-np` left out when `env` sets their variables), waiting
    /// until `/health` says ok.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let server = Server::spawn(args, env);
        server.wait_ready();
        server
    }

    /// Starts the server and waits only for its address.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Server {
        Server::spawn_model(&smollm2(), args, env)
    }

    /// [`Server::start`] on another model.
    pub fn start_model(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let server = Server::spawn_model(model, args, env);
        server.wait_ready();
        server
    }

    /// [`Server::spawn`] on another model.
    pub fn spawn_model(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(super::fathom_exe());
        cmd.args(["serve", model.to_str().unwrap(), "--port", "0"]);
        // Test defaults, unless the environment under test sets them.
        let set = |name: &str| env.iter().any(|(k, _)| *k == name);
        if !set("FATHOM_CTX_SIZE") {
            cmd.args(["-c", "512"]);
        }
        if !set("FATHOM_PARALLEL") {
            cmd.args(["-np", "2"]);
        }
        cmd.args(["-t", "2"]);
        cmd.args(args);
        for (name, _) in fathom_server::ENV_VARS {
            cmd.env_remove(name);
        }
        cmd.env_remove("FATHOM_MEMORY_LIMIT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn fathom serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "fathom serve printed no address:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        Server {
            child,
            base: format!("http://{addr}"),
            stderr,
            agent,
        }
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.get("/health", &[]);
            if r.status == 200 {
                assert_eq!(r.json(), serde_json::json!({"status": "ok"}));
                return;
            }
            assert_eq!(r.status, 503, "{}", r.body);
            assert_eq!(r.json(), serde_json::json!({"status": "loading"}));
            assert!(Instant::now() < deadline, "the model never loaded");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn reply(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
        let mut resp = resp.expect("HTTP exchange");
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        Reply {
            status: resp.status().as_u16(),
            headers,
            body: resp
                .body_mut()
                .read_to_string()
                .expect("read the response body"),
        }
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.agent.get(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Server::reply(req.call())
    }

    pub fn post(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self
            .agent
            .post(self.url(path))
            .header("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Server::reply(req.send(body))
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Server::reply(self.agent.run(req.body(()).unwrap()))
    }

    /// A metric's value from `/metrics` (the first line that starts with `series`).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = self.get("/metrics", &[]).body;
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON objects of an SSE body, and whether it ended with `[DONE]`.
pub fn sse_events(body: &str) -> (Vec<serde_json::Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    for block in body.split("\n\n").filter(|b| !b.is_empty()) {
        let data = block
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("an SSE event that is not `data: `: {block:?}"));
        assert!(!done, "an event after [DONE]: {block:?}");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data:?}")));
        }
    }
    (events, done)
}
