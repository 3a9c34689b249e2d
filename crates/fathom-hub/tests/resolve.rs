//! MODEL resolution against fake Hugging Face cache and store trees.

mod common;

use std::fs;
use std::path::PathBuf;

use common::{cache_snapshot, store_files, write, Scratch};
use fathom_hub::{resolve, HubConfig, HubError};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba98";

fn resolve_err(model: &str, cfg: &HubConfig) -> String {
    resolve(model, cfg).unwrap_err().to_string()
}

#[test]
fn an_existing_file_or_directory_is_returned_as_is() {
    let s = Scratch::new("as-is");
    let file = s.path().join("anything.bin");
    write(&file, b"x");
    let file = file.to_str().unwrap();
    assert_eq!(resolve(file, &s.config()).unwrap(), PathBuf::from(file));
    let dir = s.path().to_str().unwrap();
    assert_eq!(resolve(dir, &s.config()).unwrap(), PathBuf::from(dir));
}

#[test]
fn a_missing_path_is_reported_as_a_path_not_a_hub_lookup() {
    let s = Scratch::new("missing-path");
    for model in [
        "model.gguf",
        "org/Model.GGUF",
        "./model",
        "../model",
        "/no/such/model",
        "~/model",
        "a/b/c",
    ] {
        let err = resolve(model, &s.config()).unwrap_err();
        assert!(matches!(err, HubError::PathNotFound(_)), "{model}: {err}");
        assert_eq!(
            err.to_string(),
            format!("model file or directory {model} not found")
        );
    }
}

#[test]
fn malformed_ids_are_rejected_with_the_syntax() {
    let s = Scratch::new("bad-id");
    for model in [
        "",
        "justaname",
        "org/",
        "org/na me",
        "org/a..b",
        "org/name:",
        "org/name@",
        "org/name:Q4@x",
    ] {
        let err = resolve(model, &s.config()).unwrap_err();
        assert!(matches!(err, HubError::InvalidId { .. }), "{model}: {err}");
        let text = err.to_string();
        assert!(text.contains(&format!("{model:?}")), "{text}");
        assert!(text.contains("org/name"), "{text}");
    }
}

#[cfg(unix)]
#[test]
fn cache_ref_names_the_snapshot_and_symlinks_are_followed() {
    let s = Scratch::new("cache-ref");
    let cfg = s.config();
    let snapshot = cache_snapshot(
        &cfg.hf_cache,
        "org/name",
        Some("main"),
        COMMIT,
        &[("model-Q4_K_M.gguf", b"weights"), ("README.md", b"hi")],
    );
    // An older snapshot without a ref must not be picked.
    cache_snapshot(
        &cfg.hf_cache,
        "org/name",
        None,
        OTHER,
        &[("old.gguf", b"old")],
    );
    let found = resolve("org/name", &cfg).unwrap();
    assert_eq!(found, snapshot.join("model-Q4_K_M.gguf"));
    assert_eq!(fs::read(&found).unwrap(), b"weights");
}

#[cfg(unix)]
#[test]
fn cache_checkpoint_directory_is_the_snapshot() {
    let s = Scratch::new("cache-ckpt");
    let cfg = s.config();
    let snapshot = cache_snapshot(
        &cfg.hf_cache,
        "mlx-community/m-4bit",
        Some("main"),
        COMMIT,
        &[
            ("config.json", b"{}"),
            ("model.safetensors", b"st"),
            ("stray.gguf", b"g"),
        ],
    );
    assert_eq!(resolve("mlx-community/m-4bit", &cfg).unwrap(), snapshot);
    // A QUANT asks for a GGUF even beside safetensors.
    assert_eq!(
        resolve("mlx-community/m-4bit:STRAY", &cfg).unwrap(),
        snapshot.join("stray.gguf")
    );
}

#[cfg(unix)]
#[test]
fn cache_without_refs_uses_the_only_snapshot() {
    let s = Scratch::new("cache-one");
    let cfg = s.config();
    let snapshot = cache_snapshot(&cfg.hf_cache, "o/n", None, COMMIT, &[("m.gguf", b"m")]);
    assert_eq!(resolve("o/n", &cfg).unwrap(), snapshot.join("m.gguf"));
}

#[cfg(unix)]
#[test]
fn cache_without_refs_and_several_snapshots_lists_them() {
    let s = Scratch::new("cache-many");
    let cfg = s.config();
    cache_snapshot(&cfg.hf_cache, "o/n", None, COMMIT, &[("m.gguf", b"m")]);
    cache_snapshot(&cfg.hf_cache, "o/n", None, OTHER, &[("m.gguf", b"m")]);
    let err = resolve("o/n", &cfg).unwrap_err();
    assert!(matches!(err, HubError::SeveralSnapshots { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(COMMIT) && text.contains(OTHER), "{text}");
    assert!(text.contains("@REVISION"), "{text}");
}

#[cfg(unix)]
#[test]
fn cache_revision_by_ref_or_by_commit() {
    let s = Scratch::new("cache-rev");
    let cfg = s.config();
    let tagged = cache_snapshot(
        &cfg.hf_cache,
        "o/n",
        Some("v1.0"),
        COMMIT,
        &[("a.gguf", b"a")],
    );
    let main = cache_snapshot(
        &cfg.hf_cache,
        "o/n",
        Some("main"),
        OTHER,
        &[("b.gguf", b"b")],
    );
    assert_eq!(resolve("o/n@v1.0", &cfg).unwrap(), tagged.join("a.gguf"));
    assert_eq!(resolve("o/n", &cfg).unwrap(), main.join("b.gguf"));
    assert_eq!(
        resolve(&format!("o/n@{COMMIT}"), &cfg).unwrap(),
        tagged.join("a.gguf")
    );
    // An unknown revision is not silently served by another snapshot.
    let text = resolve_err("o/n@v2", &cfg);
    assert!(text.contains("no refs/v2 and no snapshots/v2"), "{text}");
}

#[cfg(unix)]
#[test]
fn several_ggufs_need_a_quant_which_matches_case_insensitively() {
    let s = Scratch::new("quant");
    let cfg = s.config();
    let snapshot = cache_snapshot(
        &cfg.hf_cache,
        "o/n-GGUF",
        Some("main"),
        COMMIT,
        &[
            ("n-Q4_K_M.gguf", b"4"),
            ("n-Q8_0.gguf", b"8"),
            ("mmproj-n-f16.gguf", b"p"),
        ],
    );
    let err = resolve("o/n-GGUF", &cfg).unwrap_err();
    assert!(matches!(err, HubError::SeveralGguf { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("n-Q4_K_M.gguf, n-Q8_0.gguf"), "{text}");
    assert!(!text.contains("mmproj"), "{text}");
    assert!(
        text.contains(":QUANT") && text.contains("o/n-GGUF:Q4_K_M"),
        "{text}"
    );
    assert_eq!(
        resolve("o/n-GGUF:q8_0", &cfg).unwrap(),
        snapshot.join("n-Q8_0.gguf")
    );
    let text = resolve_err("o/n-GGUF:Q", &cfg);
    assert!(text.contains("matching :Q"), "{text}");
}

#[cfg(unix)]
#[test]
fn projector_files_are_never_the_model() {
    let s = Scratch::new("mmproj");
    let cfg = s.config();
    let snapshot = cache_snapshot(
        &cfg.hf_cache,
        "o/vl",
        Some("main"),
        COMMIT,
        &[("vl-Q4_0.gguf", b"m"), ("MMPROJ-vl.gguf", b"p")],
    );
    assert_eq!(
        resolve("o/vl", &cfg).unwrap(),
        snapshot.join("vl-Q4_0.gguf")
    );
}

#[cfg(unix)]
#[test]
fn a_dangling_blob_link_does_not_count_and_the_store_is_next() {
    let s = Scratch::new("dangling");
    let cfg = s.config();
    let snapshot = cache_snapshot(
        &cfg.hf_cache,
        "o/n",
        Some("main"),
        COMMIT,
        &[("m.gguf", b"m")],
    );
    let blob = fs::canonicalize(snapshot.join("m.gguf")).unwrap();
    fs::remove_file(blob).unwrap();
    let dir = store_files(&cfg.store, "o/n", &["m.gguf"]);
    assert_eq!(resolve("o/n", &cfg).unwrap(), dir.join("m.gguf"));
}

#[cfg(unix)]
#[test]
fn the_cache_is_looked_at_before_the_store() {
    let s = Scratch::new("order");
    let cfg = s.config();
    let snapshot = cache_snapshot(
        &cfg.hf_cache,
        "o/n",
        Some("main"),
        COMMIT,
        &[("m.gguf", b"m")],
    );
    store_files(&cfg.store, "o/n", &["m.gguf"]);
    assert_eq!(resolve("o/n", &cfg).unwrap(), snapshot.join("m.gguf"));
}

#[cfg(unix)]
#[test]
fn a_quant_missing_from_the_cache_is_found_in_the_store() {
    let s = Scratch::new("quant-store");
    let cfg = s.config();
    cache_snapshot(
        &cfg.hf_cache,
        "o/n",
        Some("main"),
        COMMIT,
        &[("n-Q4_0.gguf", b"4")],
    );
    let dir = store_files(&cfg.store, "o/n", &["n-Q4_0.gguf", "n-Q8_0.gguf"]);
    assert_eq!(resolve("o/n:Q8_0", &cfg).unwrap(), dir.join("n-Q8_0.gguf"));
}

#[cfg(unix)]
#[test]
fn a_ref_to_a_missing_snapshot_falls_through_and_is_reported() {
    let s = Scratch::new("ref-missing");
    let cfg = s.config();
    let root = cfg.hf_cache.join("models--o--n");
    write(&root.join("refs/main"), COMMIT.as_bytes());
    fs::create_dir_all(root.join("snapshots")).unwrap();
    let text = resolve_err("o/n", &cfg);
    assert!(
        text.contains(&format!(
            "refs/main names snapshot {COMMIT}, which is missing"
        )),
        "{text}"
    );
}

#[test]
fn a_ref_that_is_not_a_commit_is_an_error() {
    let s = Scratch::new("bad-ref");
    let cfg = s.config();
    let refs = cfg.hf_cache.join("models--o--n/refs/main");
    write(&refs, b"../../../etc\n");
    let err = resolve("o/n", &cfg).unwrap_err();
    assert!(matches!(err, HubError::BadRef { .. }), "{err}");
    assert!(err.to_string().contains("not a commit hash"), "{err}");
}

#[test]
fn store_checkpoint_directory_and_single_gguf() {
    let s = Scratch::new("store");
    let cfg = s.config();
    let ckpt = store_files(
        &cfg.store,
        "o/ckpt",
        &["config.json", "model-00001-of-00002.safetensors"],
    );
    assert_eq!(resolve("o/ckpt", &cfg).unwrap(), ckpt);
    let gguf = store_files(&cfg.store, "o/g", &["g.Q4_1.gguf", "mmproj.gguf"]);
    assert_eq!(resolve("o/g", &cfg).unwrap(), gguf.join("g.Q4_1.gguf"));
    store_files(&cfg.store, "o/two", &["a.gguf", "b.gguf"]);
    let text = resolve_err("o/two", &cfg);
    assert!(
        text.contains("a.gguf, b.gguf") && text.contains(":QUANT"),
        "{text}"
    );
}

#[test]
fn not_found_names_both_places_and_suggests_pull() {
    let s = Scratch::new("not-found");
    let cfg = s.config();
    store_files(&cfg.store, "o/n", &["README.md"]);
    let err = resolve("o/n:Q8_0", &cfg).unwrap_err();
    assert!(matches!(err, HubError::NotFound { .. }), "{err}");
    let text = err.to_string();
    let cache = cfg.hf_cache.join("models--o--n");
    let store = cfg.store.join("o/n");
    assert!(
        text.contains(&format!("{}: not present", cache.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}: no .gguf file", store.display())),
        "{text}"
    );
    assert!(text.contains("`fathom pull o/n:Q8_0`"), "{text}");
    assert!(!text.contains("HF_HUB_OFFLINE"), "{text}");

    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    assert!(resolve_err("o/n", &offline).contains("unset HF_HUB_OFFLINE"));
}

#[test]
fn unknown_places_are_named_as_unknown() {
    let cfg = HubConfig::from_env(|_| None, None);
    let text = resolve_err("o/n", &cfg);
    assert!(
        text.contains("unknown: HF_HUB_CACHE, HF_HOME and HOME are unset"),
        "{text}"
    );
    assert!(
        text.contains("unknown: FATHOM_MODELS_DIR and HOME are unset"),
        "{text}"
    );
}

#[test]
fn from_env_places_are_where_resolve_looks() {
    let s = Scratch::new("from-env");
    let home = s.path().join("home");
    let cfg = HubConfig::from_env(|_| None, Some(home.clone()));
    let dir = store_files(&home.join(".cache/fathom/models"), "o/n", &["m.gguf"]);
    assert_eq!(resolve("o/n", &cfg).unwrap(), dir.join("m.gguf"));
}
