//! `fathom generate` and `fathom run` as a user runs them: the real binary
//! on the real SmolLM2 GGUF, and on a Gemma 4 fixture carrying the real
//! Gemma 4 vocabulary.

mod common;

use common::{fathom, smollm2, stderr, stdout};

/// `(plan bytes, peak RSS bytes)` from the `memory:` line on stderr.
fn plan_and_peak(err: &str) -> (u64, u64) {
    let line = err
        .lines()
        .find(|l| l.starts_with("memory:"))
        .unwrap_or_else(|| panic!("no memory line in\n{err}"));
    let numbers: Vec<u64> = line
        .split('(')
        .filter_map(|part| part.split(" bytes)").next()?.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{line}");
    (numbers[0], numbers[1])
}

#[test]
fn generation_peak_rss_stays_within_the_plan() {
    let model = smollm2();
    let prompt = "The history of the printing press begins in ".repeat(30);
    let out = fathom(
        &[
            "generate",
            model.to_str().unwrap(),
            "-p",
            &prompt,
            "-n",
            "32",
            "--temp",
            "0",
            "-t",
            "2",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let (plan, peak) = plan_and_peak(&err);
    println!("plan {plan} bytes, peak RSS {peak} bytes");
    assert!(peak <= plan, "peak RSS {peak} over the plan {plan}");
    for line in ["load:", "prompt:", "decode:"] {
        assert!(err.contains(line), "{err}");
    }
    assert!(!stdout(&out).trim().is_empty());
}

/// A large real vocabulary's heap stays resident for the whole run: what
/// the tokenizer frees once its merge table is built (Gemma 4: 514,906
/// merges read as string pairs, and the parsed metadata) is not given back
/// to the system, so the peak RSS holds the vocabulary's heap at its
/// largest, which the runtime term counts from the header
/// (docs/memory-plan.md, the vocabulary tables). A one-layer Gemma 4
/// fixture with llama.cpp's Gemma 4 vocabulary and a prompt past the
/// sliding window: the plan is 1.029 x the peak; with the per-entry
/// allowance alone it was 76 MB less, 0.975 x the peak.
#[test]
fn a_real_gemma4_vocabulary_run_stays_within_the_plan() {
    let dir = common::TempDir::new("gemma4-vocab-run");
    let model = dir.0.join("gemma-4-31b-1l.gguf");
    common::one_layer_fixture("gemma-4-31b", "ggml-vocab-gemma-4.gguf", &model);
    let model = model.to_str().unwrap();
    let out = fathom(
        &[
            "generate",
            model,
            "--random-prompt",
            "1200",
            "-n",
            "16",
            "-c",
            "1216",
            "--temp",
            "0",
            "--ignore-eos",
            "-t",
            "2",
            "--memory",
            "16G",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (plan, peak) = plan_and_peak(&stderr(&out));
    println!("plan {plan} bytes, peak RSS {peak} bytes");
    assert!(peak <= plan, "peak RSS {peak} over the plan {plan}");
    assert!(
        plan as f64 <= 1.10 * peak as f64,
        "plan {plan} looser than 1.10 x the peak RSS {peak}"
    );
}

#[test]
fn greedy_generation_is_deterministic_and_stops_at_stop_strings() {
    let model = smollm2();
    let args = [
        "generate",
        model.to_str().unwrap(),
        "-p",
        "1, 2, 3, 4, 5,",
        "-n",
        "24",
        "--temp",
        "0",
        "-t",
        "2",
    ];
    let a = fathom(&args, &[]);
    let b = fathom(&args, &[]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
    assert!(stdout(&a).starts_with(" 6, 7, 8"), "{}", stdout(&a));
    let mut stopped = args.to_vec();
    stopped.extend(["--stop", "9"]);
    let c = fathom(&stopped, &[]);
    assert_eq!(stdout(&c).trim_end(), " 6, 7, 8,");
}

#[test]
fn parallel_sequences_run_to_length_with_ignore_eos_and_print_the_first() {
    let model = smollm2();
    let base = [
        "generate",
        model.to_str().unwrap(),
        "-p",
        "1, 2, 3, 4, 5,",
        "-n",
        "20",
        "--temp",
        "0",
        "-t",
        "2",
        "--ignore-eos",
    ];
    let single = fathom(&base, &[]);
    let mut four = base.to_vec();
    four.extend(["--parallel", "4"]);
    let batch = fathom(&four, &[]);
    assert!(batch.status.success(), "{}", stderr(&batch));
    assert_eq!(stdout(&single), stdout(&batch), "greedy copies agree");
    assert!(
        stderr(&batch).contains("decode:  80 tokens"),
        "{}",
        stderr(&batch)
    );
    let (plan, peak) = plan_and_peak(&stderr(&batch));
    assert!(peak <= plan, "peak RSS {peak} over the plan {plan}");
}

#[test]
fn preflight_refuses_with_status_2_and_force_loads_anyway() {
    let model = smollm2();
    let base = [
        "generate",
        model.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "8",
        "--temp",
        "0",
        "--memory",
        "50M",
    ];
    let mut refused = base.to_vec();
    refused.push("--estimate-memory");
    let out = fathom(&refused, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for needle in ["DOES NOT FIT", "50.00 MiB", "over", "--force", "q8_0"] {
        assert!(err.contains(needle), "{needle} missing from\n{err}");
    }
    assert!(stdout(&out).is_empty(), "nothing generated");
    let mut forced = refused.clone();
    forced.push("--force");
    let out = fathom(&forced, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("warning:"), "{}", stderr(&out));
    // Without --estimate-memory there is no preflight.
    assert!(fathom(&base, &[]).status.success());
}

/// The preflight reads the device's budget for a GPU plan: a model over
/// the device memory given is refused with exit 2 before anything loads
/// (so this runs without a GPU), naming the total, the free memory and
/// the overflow.
#[test]
fn estimate_memory_refuses_a_model_over_the_device_budget() {
    let model = smollm2();
    let args = [
        "generate",
        model.to_str().unwrap(),
        "-p",
        "hi",
        "-n",
        "4",
        "--device",
        "cuda",
        "--memory",
        "300M",
        "--estimate-memory",
    ];
    let out = fathom(&args, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for needle in [
        "Device memory (cuda)",
        "Host memory",
        "300.00 MiB",
        "(--memory)",
        "over",
        "--force",
    ] {
        assert!(err.contains(needle), "{needle} missing from\n{err}");
    }
    assert!(stdout(&out).is_empty(), "nothing generated");
}

#[test]
fn bad_requests_are_clear_errors() {
    let model = smollm2();
    let long = "word ".repeat(300);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "generate",
                model.to_str().unwrap(),
                "-p",
                &long,
                "-n",
                "8",
                "-c",
                "64",
            ],
            "context",
        ),
        (
            vec!["generate", "missing-model.gguf", "-p", "x"],
            "missing-model.gguf",
        ),
        (
            vec![
                "generate",
                model.to_str().unwrap(),
                "-p",
                "x",
                "--device",
                "cuda",
                "--memory",
                "8G",
            ],
            "cuda",
        ),
    ];
    for (args, needle) in cases {
        let out = fathom(&args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
}

/// `run` answers through the model's chat template: its answer is exactly
/// what `generate` continues the templated conversation with (SmolLM2's
/// template adds its default system message), and no template marker
/// leaks. (What the model answers is its own business: with that system
/// message, llama.cpp's greedy answer starts "L'Étoile, la" too, and the
/// words after are near-ties.)
#[test]
fn run_answers_one_message_with_the_chat_template() {
    let model = smollm2();
    let model = model.to_str().unwrap();
    let common = ["-n", "24", "--temp", "0", "-c", "512"];
    let run = fathom(
        &[
            &["run", model, "-p", "What is the capital of France?"][..],
            &common,
        ]
        .concat(),
        &[],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let templated = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
                     Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of \
                     France?<|im_end|>\n<|im_start|>assistant\n";
    let generate = fathom(
        &[&["generate", model, "-p", templated][..], &common].concat(),
        &[],
    );
    assert!(generate.status.success(), "{}", stderr(&generate));
    let answer = stdout(&run);
    assert!(!answer.trim().is_empty(), "an answer");
    assert_eq!(answer.trim(), stdout(&generate).trim());
    assert!(
        !answer.contains("<|im_end|>") && !answer.contains("<|im_start|>"),
        "{answer}"
    );
}

#[test]
fn unrunnable_checkpoints_are_clear_errors() {
    use fathom_fixtures::{Data, GgufValue, GgufWriter};
    let dir = common::TempDir::new("unrunnable");
    // An architecture fathom plans but does not run.
    let unknown = dir.0.join("rwkv.gguf");
    GgufWriter::new()
        .kv("general.architecture", GgufValue::string("rwkv7"))
        .tensor("token_embd.weight", &[64, 100], 0, 64 * 100 * 4)
        .write(&unknown, Data::Sparse)
        .unwrap();
    let truncated = dir.0.join("truncated.gguf");
    std::fs::write(&truncated, &std::fs::read(smollm2()).unwrap()[..100_000]).unwrap();
    for (path, needle) in [(&unknown, "rwkv7"), (&truncated, "truncated")] {
        let out = fathom(
            &["generate", path.to_str().unwrap(), "-p", "hi", "-n", "4"],
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
}

#[test]
fn a_fifo_or_device_as_model_is_refused_at_once() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = common::TempDir::new("fifo");
    let fifo = dir.0.join("model.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let fifo = fifo.to_str().unwrap();
    for (args, what) in [
        (vec!["inspect", fifo], "FIFO"),
        (vec!["generate", fifo, "-p", "hi", "-n", "2"], "FIFO"),
        (vec!["inspect", "/dev/null"], "character device"),
    ] {
        // Bounded: opening a FIFO with no writer blocks forever, so the
        // child is killed if it has not exited within 20 s.
        let mut child = Command::new(env!("CARGO_BIN_EXE_fathom"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("fathom {args:?} still running after 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(args[1]) && err.contains(what) && err.contains("not a regular file"),
            "{args:?}: {err}"
        );
    }
}
