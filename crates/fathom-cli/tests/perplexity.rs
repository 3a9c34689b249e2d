//! `fathom perplexity` on the real model and a text every Debian machine
//! has, against figures and a base-logits file llama-perplexity recorded
//! (tests/data/record_llama_perplexity.sh).

mod common;

use std::path::{Path, PathBuf};

use common::{fathom, smollm2, stderr, stdout, TempDir};
use serde_json::Value;

const TEXT: &str = "/usr/share/common-licenses/GPL-3";

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn recorded() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data("smollm2_gpl3_llama_ppl.json")).unwrap())
        .unwrap()
}

/// `fathom perplexity MODEL ARGS --json -t 2`, asserting success.
fn perplexity_json(args: &[&str]) -> Value {
    let model = smollm2();
    let mut all = vec!["perplexity", model.to_str().unwrap(), "--json", "-t", "2"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--device", "cpu"]);
    let out = fathom(&all, &[]);
    assert!(
        out.status.success(),
        "fathom {all:?} failed: {}",
        stderr(&out)
    );
    serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("not one JSON object: {e}\n{}", stdout(&out)))
}

/// Runs and expects failure; returns stderr.
fn perplexity_error(args: &[&str]) -> String {
    let model = smollm2();
    let mut all = vec!["perplexity", model.to_str().unwrap(), "--device", "cpu"];
    all.extend_from_slice(args);
    let out = fathom(&all, &[]);
    assert_eq!(out.status.code(), Some(1), "fathom {all:?} should fail");
    stderr(&out)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn perplexity_is_within_half_a_percent_of_llama_perplexity() {
    // llama.cpp's default -c 512, all 14 chunks the text holds.
    let want = &recorded()["runs"]["c512"];
    let got = perplexity_json(&["-f", TEXT]);
    assert_eq!(got["n_ctx"], 512);
    assert_eq!(got["n_chunk"], 14);
    assert_eq!(got["scored_tokens"], 14 * 255);
    assert_eq!(got["add_bos"], false, "SmolLM2 does not add BOS");
    let (ppl, theirs) = (f(&got["ppl"]), f(&want["ppl"]));
    assert!(
        (ppl / theirs - 1.0).abs() <= 0.005,
        "fathom PPL {ppl} vs llama-perplexity {theirs} ({})",
        want["command"]
    );
    assert_eq!(got["chunks"].as_array().unwrap().len(), 14);
}

#[test]
fn text_output_is_llama_perplexity_format() {
    let model = smollm2();
    let out = fathom(
        &[
            "perplexity",
            model.to_str().unwrap(),
            "-f",
            TEXT,
            "-c",
            "64",
            "--chunks",
            "3",
            "-b",
            "16",
            "-t",
            "2",
            "--device",
            "cpu",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let running: Vec<&str> = lines[0].trim_end_matches(',').split(',').collect();
    assert_eq!(running.len(), 3, "{text}");
    for (i, r) in running.iter().enumerate() {
        let value = r
            .strip_prefix(&format!("[{}]", i + 1))
            .unwrap_or_else(|| panic!("{r}"));
        assert_eq!(value.split('.').nth(1).map(str::len), Some(4), "{r}");
    }
    let last = running[2].split(']').nth(1).unwrap();
    let rest = lines[1]
        .strip_prefix(&format!("Final estimate: PPL = {last} +/- "))
        .unwrap_or_else(|| panic!("{}", lines[1]));
    assert_eq!(
        rest.split('.').nth(1).map(str::len),
        Some(5),
        "{}",
        lines[1]
    );
    assert!(
        stderr(&out).contains("16 tokens per step"),
        "-b 16 is the step: {}",
        stderr(&out)
    );
}

#[test]
fn a_base_fathom_writes_reads_back_with_no_divergence() {
    let dir = TempDir::new("ppl-base");
    let base = dir.0.join("base.kld");
    let base_s = base.to_str().unwrap();
    let wrote = perplexity_json(&[
        "-f",
        TEXT,
        "-c",
        "64",
        "--chunks",
        "4",
        "--kl-divergence-base",
        base_s,
    ]);
    // llama.cpp's layout: header, 4 x 64 tokens, 4 x 31 rows of (49152 + 4) u16.
    let len = std::fs::metadata(&base).unwrap().len();
    assert_eq!(len, 20 + 4 * 64 * 4 + 4 * 31 * (49152 + 4) * 2);
    let bytes = std::fs::read(&base).unwrap();
    assert_eq!(&bytes[..8], b"_logits_");
    assert_eq!(bytes[8..20], [64, 0, 0, 0, 0, 0xc0, 0, 0, 4, 0, 0, 0]);

    let read = perplexity_json(&["--kl-divergence-base", base_s, "--kl-divergence"]);
    assert_eq!(read["n_ctx"], 64);
    assert_eq!(read["scored_tokens"], 124);
    let kl = &read["kl_divergence"];
    assert!(f(&kl["kld"]["value"]).abs() < 1e-4, "{kl}");
    assert_eq!(f(&kl["same_top"]["value"]), 1.0, "{kl}");
    // The base's own PPL, from its quantized rows, is the writing run's.
    let ppl = f(&wrote["ppl"]);
    assert!(
        (f(&kl["ppl_base"]["value"]) / ppl - 1.0).abs() < 1e-3,
        "{kl}"
    );
    assert!((f(&kl["ppl"]["value"]) / ppl - 1.0).abs() < 1e-9, "{kl}");
}

#[test]
fn a_base_llama_perplexity_wrote_is_close_to_fathom() {
    let base = data("smollm2_gpl3_c16.kld");
    let got = perplexity_json(&[
        "--kl-divergence-base",
        base.to_str().unwrap(),
        "--kl-divergence",
    ]);
    assert_eq!(got["n_ctx"], 16);
    assert_eq!(got["scored_tokens"], 7);
    let last = got["chunks"].as_array().unwrap().last().unwrap().clone();
    assert!(f(&last["kld"]["value"]) <= 0.01, "{last}");
    assert!(f(&last["same_top"]["value"]) >= 0.97, "{last}");
}

#[test]
fn bad_inputs_are_refused_naming_the_file_or_value() {
    let dir = TempDir::new("ppl-errors");
    let short = dir.0.join("short.txt");
    std::fs::write(&short, "Only a few words of text.").unwrap();
    let err = perplexity_error(&["-f", short.to_str().unwrap()]);
    assert!(
        err.contains(short.to_str().unwrap()) && err.contains("two chunks"),
        "{err}"
    );

    let err = perplexity_error(&["-f", TEXT, "-c", "9000"]);
    assert!(err.contains("-c 9000") && err.contains("8192"), "{err}");

    let good = std::fs::read(data("smollm2_gpl3_c16.kld")).unwrap();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "truncated.kld",
            good[..good.len() - 100].to_vec(),
            "truncated",
        ),
        ("magic.kld", [b"_LOGITS_", &good[8..]].concat(), "_logits_"),
        ("empty.kld", Vec::new(), "shorter than"),
    ];
    for (name, bytes, says) in cases {
        let path = dir.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = perplexity_error(&[
            "--kl-divergence-base",
            path.to_str().unwrap(),
            "--kl-divergence",
        ]);
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains(says),
            "{name}: {err}"
        );
    }

    // A well-formed base of another vocabulary (1000 tokens).
    let (n_ctx, vocab) = (16usize, 1000usize);
    let mut other = b"_logits_".to_vec();
    for v in [n_ctx, vocab, 1] {
        other.extend((v as i32).to_le_bytes());
    }
    other.extend((0..n_ctx as u32).flat_map(|t| t.to_le_bytes()));
    other.resize(other.len() + 7 * (vocab + 4) * 2, 0);
    let path = dir.0.join("other-vocab.kld");
    std::fs::write(&path, other).unwrap();
    let err = perplexity_error(&[
        "--kl-divergence-base",
        path.to_str().unwrap(),
        "--kl-divergence",
    ]);
    assert!(
        err.contains(path.to_str().unwrap()) && err.contains("vocabulary of 1000"),
        "{err}"
    );
}
