//! `fathom serve --device cuda` (issue 12), through real HTTP on loopback:
//! a greedy answer from the GPU server equals `fathom generate --device
//! cuda --temp 0` for the same prompt; the printed plan and `/metrics` are
//! the device's and the host's budgets, with the GPU's memory; and a pool
//! too small for the slots preempts and still gives the outputs of an
//! unpressured run; a model split between the GPU and the host serves the
//! answers `fathom generate` gives with the same split. The model is a SmolLM2-135M-shaped Q4_1 GGUF with
//! random weights, written here. Runs where a GPU is present; elsewhere it
//! says so and passes, unless `FATHOM_REQUIRE_GPU=1` (then it fails).
//! scripts/test-gpu.sh stages it for the GPU machine.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::server::{sse_events, Server};
use common::{fathom, gpu, stderr, stdout, TempDir};
use fathom_fixtures::{self as fx, Data, GgufTensorType};
use serde_json::json;

/// SmolLM2-135M's shapes, Q4_1 matrices, random weights.
fn fixture(dir: &Path) -> PathBuf {
    let path = dir.join("smollm2-shape-q4_1.gguf");
    fx::write_runnable_gguf(
        &fx::smollm2_135m(),
        GgufTensorType::Q4_1,
        &path,
        Data::Random { seed: 7 },
    )
    .unwrap();
    path
}

fn vocab() -> u64 {
    fx::smollm2_135m().text_config()["vocab_size"]
        .as_u64()
        .unwrap()
}

/// The text of a greedy completion of token ids, whole or streamed.
fn complete(server: &Server, prompt: &[u32], max_tokens: u32, stream: bool) -> String {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": true, "stream": stream});
    let r = server.post("/v1/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    if !stream {
        let v = r.json();
        assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{v}");
        return v["choices"][0]["text"].as_str().unwrap().to_string();
    }
    let (events, done) = sse_events(&r.body);
    assert!(done, "no [DONE]: {}", r.body);
    assert!(
        events.iter().all(|e| e["error"].is_null()),
        "an error event: {}",
        r.body
    );
    events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect()
}

#[test]
fn greedy_answers_from_the_gpu_server_equal_fathom_generate_on_the_gpu() {
    if !gpu("serve_cuda") {
        return;
    }
    let dir = TempDir::new("serve-cuda");
    let model = fixture(&dir.0);
    let expected = generate_on_the_gpu(&model, &[]);

    let server = Server::start_model(&model, &["--device", "cuda", "-np", "4"], &[]);
    let log = server.stderr.lock().unwrap().clone();
    for printed in [
        "device cuda",
        "Device memory (cuda)",
        "Backend",
        "KV pool",
        "Prompt cache",
        "Host memory",
        "Request buffers",
        "HOST FITS",
    ] {
        assert!(log.contains(printed), "{printed} is not in\n{log}");
    }
    let prompt = fx::random_token_ids(40, vocab());
    assert_eq!(complete(&server, &prompt, 32, false), expected, "whole");
    assert_eq!(complete(&server, &prompt, 32, true), expected, "streamed");
    device_and_host_within_their_plans(&server);
}

/// `fathom generate --device cuda` of the 40 token ids
/// `fx::random_token_ids` gives, 32 greedy tokens, with `extra` arguments.
fn generate_on_the_gpu(model: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "generate",
        model.to_str().unwrap(),
        "--device",
        "cuda",
        "--random-prompt",
        "40",
        "-n",
        "32",
        "--temp",
        "0",
        "--ignore-eos",
        "-c",
        "512",
    ];
    args.extend_from_slice(extra);
    let out = fathom(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let text = text.strip_suffix('\n').unwrap_or(&text).to_string();
    assert!(!text.is_empty());
    text
}

/// The server's device memory (NVML) within its device plan, and its
/// resident memory now within its host plan.
fn device_and_host_within_their_plans(server: &Server) {
    // The device's plan, the host's, and the GPU's memory now.
    let plan = server.metric("fathom_plan_bytes{term=\"total\"}").unwrap();
    let host = server
        .metric("fathom_host_plan_bytes{term=\"total\"}")
        .unwrap();
    assert!(host > 0.0);
    let free = server.metric("fathom_device_memory_free_bytes").unwrap();
    let used = server.metric("fathom_device_memory_used_bytes").unwrap();
    let total = server.metric("fathom_device_memory_total_bytes").unwrap();
    assert_eq!(free + used, total);
    let process = server
        .metric("fathom_device_process_memory_bytes")
        .expect("NVML lists the server process");
    println!("device: plan {plan} bytes, the server uses {process} (NVML)");
    assert!(process <= plan, "the server uses {process} > plan {plan}");
    assert!(
        plan <= 1.10 * process,
        "plan {plan} looser than 1.10 x {process}"
    );
    let resident = server.metric("fathom_resident_memory_bytes").unwrap();
    println!("host: plan {host} bytes, the server holds {resident}");
    assert!(
        resident <= host,
        "the server holds {resident} > host plan {host}"
    );
}

#[test]
fn a_model_split_between_the_gpu_and_the_host_serves_what_generate_gives() {
    if !gpu("serve_cuda") {
        return;
    }
    let dir = TempDir::new("serve-cuda-split");
    let model = fixture(&dir.0);
    let expected = generate_on_the_gpu(&model, &["--gpu-layers", "10"]);
    let server = Server::start_model(
        &model,
        &["--device", "cuda", "-np", "4", "--gpu-layers", "10"],
        &[],
    );
    let log = server.stderr.lock().unwrap().clone();
    assert!(
        log.contains("10 of 30 layers on the GPU") && log.contains("HOST FITS"),
        "{log}"
    );
    let prompt = fx::random_token_ids(40, vocab());
    assert_eq!(complete(&server, &prompt, 32, false), expected, "whole");
    assert_eq!(complete(&server, &prompt, 32, true), expected, "streamed");
    device_and_host_within_their_plans(&server);
}

#[test]
fn preemption_on_the_gpu_gives_the_outputs_of_an_unpressured_run() {
    if !gpu("serve_cuda") {
        return;
    }
    let dir = TempDir::new("serve-cuda-preempt");
    let model = fixture(&dir.0);
    let ids = fx::random_token_ids(4 * 24, vocab());
    let prompts: Vec<&[u32]> = ids.chunks(24).collect();
    let common = [
        "--device",
        "cuda",
        "-np",
        "4",
        "-c",
        "256",
        "--prompt-cache",
        "off",
    ];

    // Unpressured: every slot's full context, one request at a time.
    let alone: Vec<String> = {
        let mut args = common.to_vec();
        args.extend(["--kv-cache-budget", "none"]);
        let server = Server::start_model(&model, &args, &[]);
        prompts
            .iter()
            .map(|p| complete(&server, p, 96, true))
            .collect()
    };

    // Four at once with blocks for about two: 15 blocks of 16 positions x
    // 30 layers x K and V x 3 KV heads x 64 dims x f16.
    let block = 30 * 16 * 2 * 3 * 64 * 2;
    let budget = (15 * block).to_string();
    let mut args = common.to_vec();
    args.extend(["--kv-cache-budget", budget.as_str()]);
    let server = Server::start_model(&model, &args, &[]);
    assert_eq!(server.metric("fathom_kv_blocks_total"), Some(15.0));
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let server = &server;
                s.spawn(move || complete(server, p, 96, true))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let preempted = server.metric("fathom_preemptions_total").unwrap();
    println!("{preempted} preemptions");
    assert!(preempted > 0.0, "the pool was large enough not to preempt");
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        let same = a.bytes().zip(t.bytes()).take_while(|(x, y)| x == y).count();
        assert_eq!(a, t, "prompt {i}: the outputs part after {same} bytes");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("fathom_kv_blocks_used") != Some(0.0) {
        assert!(Instant::now() < deadline, "blocks still held");
        std::thread::sleep(Duration::from_millis(10));
    }
}
