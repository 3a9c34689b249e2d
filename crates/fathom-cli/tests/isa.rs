//! `FATHOM_ISA` forces the CPU kernel family: each family this CPU runs
//! gives the portable kernels' token distributions on the real model, and
//! an unknown or unavailable family is refused by name.

mod common;

use common::{fathom, smollm2, stderr, stdout, TempDir};
use serde_json::Value;

const TEXT: &str = "/usr/share/common-licenses/GPL-3";

/// `fathom ARGS` on SmolLM2 (2 threads, CPU) under `FATHOM_ISA=isa`.
fn run(isa: &str, cmd: &str, args: &[&str]) -> std::process::Output {
    let model = smollm2();
    let mut all = vec![cmd, model.to_str().unwrap(), "-t", "2", "--device", "cpu"];
    all.extend_from_slice(args);
    fathom(&all, &[("FATHOM_ISA", isa)])
}

fn json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

#[test]
fn each_forced_family_matches_portable() {
    let dir = TempDir::new("isa");
    let base = dir.0.join("portable.kld");
    let base_s = base.to_str().unwrap();
    // 4 chunks of 64: 124 scored positions, enough for the summary.
    let chunks = ["-f", TEXT, "-c", "64", "--chunks", "4", "--json"];
    json(&run(
        "portable",
        "perplexity",
        &[&chunks[..], &["--kl-divergence-base", base_s]].concat(),
    ));
    let mut ran = Vec::new();
    for (isa, name) in [
        ("portable", "portable"),
        ("avx2", "avx2"),
        ("AVX512", "avx512-vnni"),
    ] {
        let bench = run(isa, "bench", &["-p", "16", "-n", "4", "-r", "1", "--json"]);
        if !bench.status.success() {
            // A family this CPU lacks: refused, naming it.
            let err = stderr(&bench);
            assert_eq!(bench.status.code(), Some(1), "{err}");
            assert!(
                err.contains("this CPU does not run the") && err.contains("FATHOM_ISA="),
                "{err}"
            );
            continue;
        }
        assert_eq!(json(&bench)["kernels"], name, "FATHOM_ISA={isa}");
        let kl = json(&run(
            isa,
            "perplexity",
            &["--kl-divergence-base", base_s, "--kl-divergence", "--json"],
        ));
        let kl = &kl["kl_divergence"];
        // The kernels' own tests hold each SIMD op and matmul to the
        // portable result within float-ordering tolerances. End to end,
        // such a difference can flip the rounding of an activation to
        // int8 (the matmuls' Q8 activations), a jump of up to half a
        // quant step that the layers carry forward: on this text the
        // measured floor is KLD ~0.009 and 95% same top token (about
        // twice fathom's KLD against llama.cpp), so these bounds catch a
        // wrong kernel, not rounding.
        let kld = kl["kld"]["value"].as_f64().unwrap();
        let same_top = kl["same_top"]["value"].as_f64().unwrap();
        assert!(kld.abs() < 0.03 && same_top >= 0.9, "{isa}: {kl}");
        ran.push(name);
    }
    assert!(ran.contains(&"portable"), "portable always runs");
    eprintln!("compared with portable: {ran:?}");
}

#[test]
fn an_unknown_family_is_refused() {
    let out = run("neon", "bench", &["-p", "8", "-n", "0", "-r", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("FATHOM_ISA=\"neon\"")
            && err.contains("expected auto, portable, avx2 or avx512"),
        "{err}"
    );
}
