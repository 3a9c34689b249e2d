//! `download` against a local stand-in for the hub: a `file://` endpoint
//! laid out like the hub's API and resolve URLs, which curl reads the same
//! way it would the real hub (the real hub is unreachable from tests).

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{write, Scratch};
use fathom_hub::{download, resolve, HubConfig, HubError};

/// Every `(done, total)` progress report, in order.
type Reports = Vec<(u64, Option<u64>)>;

/// A fake hub under `{scratch}/fakehub` and a config pointing at it.
struct StandIn {
    scratch: Scratch,
    cfg: HubConfig,
}

impl StandIn {
    fn new(label: &str) -> StandIn {
        let scratch = Scratch::new(label);
        let mut cfg = scratch.config();
        cfg.endpoint = format!("file://{}", scratch.path().join("fakehub").display());
        StandIn { scratch, cfg }
    }

    fn hub(&self) -> PathBuf {
        self.scratch.path().join("fakehub")
    }

    /// Publishes `files` at `repo@revision`; `listed_only` names files in
    /// the listing whose bodies are not served.
    fn publish(&self, repo: &str, revision: &str, files: &[(&str, &[u8])], listed_only: &[&str]) {
        let mut siblings: Vec<String> = files
            .iter()
            .map(|(name, body)| format!(r#"{{"rfilename":"{name}","size":{}}}"#, body.len()))
            .collect();
        siblings.extend(
            listed_only
                .iter()
                .map(|name| format!(r#"{{"rfilename":"{name}"}}"#)),
        );
        let listing = format!(
            r#"{{"id":"{repo}","sha":"abc","siblings":[{}]}}"#,
            siblings.join(",")
        );
        let api = self
            .hub()
            .join(format!("api/models/{repo}/revision/{revision}"));
        write(&api, listing.as_bytes());
        for (name, body) in files {
            write(
                &self.hub().join(format!("{repo}/resolve/{revision}/{name}")),
                body,
            );
        }
    }

    fn store(&self, repo: &str) -> PathBuf {
        self.cfg.store.join(repo)
    }

    /// Downloads and returns the path and every progress report.
    fn pull(&self, model: &str) -> (Result<PathBuf, HubError>, Reports) {
        let mut reports = Vec::new();
        let result = download(model, &self.cfg, &mut |done, total| {
            reports.push((done, total))
        });
        (result, reports)
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn download_gguf_from_local_stand_in_endpoint() {
    let hub = StandIn::new("dl-gguf");
    hub.publish(
        "org/name-GGUF",
        "main",
        &[
            ("name-Q4_K_M.gguf", b"four bit weights"),
            ("name-Q8_0.gguf", b"eight bit weights"),
            ("mmproj-name-f16.gguf", b"projector"),
            ("README.md", b"readme"),
        ],
        &[],
    );
    let (path, reports) = hub.pull("org/name-GGUF:q4_k_m");
    let path = path.unwrap();
    let dir = hub.store("org/name-GGUF");
    assert_eq!(path, dir.join("name-Q4_K_M.gguf"));
    assert_eq!(fs::read(&path).unwrap(), b"four bit weights");
    assert_eq!(names_in(&dir), ["name-Q4_K_M.gguf"]);
    assert_eq!(reports.first(), Some(&(0, Some(16))));
    assert_eq!(reports.last(), Some(&(16, Some(16))));
    assert_eq!(resolve("org/name-GGUF", &hub.cfg).unwrap(), path);
}

#[test]
fn download_checkpoint_shards_named_by_the_index_from_local_stand_in_endpoint() {
    let hub = StandIn::new("dl-index");
    let index = br#"{"metadata":{},"weight_map":{
        "a.weight":"model-00001-of-00002.safetensors",
        "b.weight":"model-00002-of-00002.safetensors",
        "c.weight":"model-00002-of-00002.safetensors"}}"#;
    hub.publish(
        "org/ckpt",
        "main",
        &[
            ("config.json", b"{}"),
            ("tokenizer.json", b"{}"),
            ("tokenizer_config.json", b"{}"),
            ("model.safetensors.index.json", index),
            ("model-00001-of-00002.safetensors", b"shard one"),
            ("model-00002-of-00002.safetensors", b"shard two"),
            ("consolidated.safetensors", b"a second copy of every weight"),
            ("README.md", b"readme"),
            ("model-Q4_0.gguf", b"gguf"),
        ],
        &[],
    );
    let (path, reports) = hub.pull("org/ckpt");
    let dir = hub.store("org/ckpt");
    assert_eq!(path.unwrap(), dir);
    assert_eq!(
        names_in(&dir),
        [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    );
    let total = (2 + 2 + 2 + index.len() + 9 + 9) as u64;
    assert_eq!(reports.last(), Some(&(total, Some(total))));
    assert_eq!(resolve("org/ckpt", &hub.cfg).unwrap(), dir);
}

#[test]
fn download_every_safetensors_without_an_index_from_local_stand_in_endpoint() {
    let hub = StandIn::new("dl-noindex");
    hub.publish(
        "org/small",
        "main",
        &[
            ("config.json", b"{}"),
            ("generation_config.json", b"{}"),
            ("model.safetensors", b"weights"),
        ],
        &[],
    );
    let (path, _) = hub.pull("org/small");
    let dir = hub.store("org/small");
    assert_eq!(path.unwrap(), dir);
    assert_eq!(
        names_in(&dir),
        ["config.json", "generation_config.json", "model.safetensors"]
    );
}

#[test]
fn download_at_a_revision_from_local_stand_in_endpoint() {
    let hub = StandIn::new("dl-rev");
    hub.publish("org/n", "v1.0", &[("n.gguf", b"tagged")], &[]);
    let (path, _) = hub.pull("org/n@v1.0");
    assert_eq!(fs::read(path.unwrap()).unwrap(), b"tagged");
    let text = hub.pull("org/n").0.unwrap_err().to_string();
    assert!(text.contains("/api/models/org/n/revision/main"), "{text}");
}

#[test]
fn missing_file_on_local_stand_in_endpoint_names_the_url_and_leaves_no_partial() {
    let hub = StandIn::new("dl-missing");
    hub.publish("org/n", "main", &[], &["n-Q4_0.gguf"]);
    let (result, reports) = hub.pull("org/n");
    let err = result.unwrap_err();
    assert!(matches!(err, HubError::Fetch { .. }), "{err}");
    let url = format!("{}/org/n/resolve/main/n-Q4_0.gguf", hub.cfg.endpoint);
    let text = err.to_string();
    assert!(text.contains(&url), "{text}");
    assert_eq!(reports, [(0, None)]);
    // Nothing is left: no file, no .partial, not even the empty directory.
    assert!(!hub.store("org/n").exists());
}

#[test]
fn failed_shard_on_local_stand_in_endpoint_keeps_finished_files_only() {
    let hub = StandIn::new("dl-shard");
    hub.publish(
        "org/ckpt",
        "main",
        &[("config.json", b"{}"), ("a.safetensors", b"a")],
        &["b.safetensors"],
    );
    let text = hub.pull("org/ckpt").0.unwrap_err().to_string();
    assert!(
        text.contains("/org/ckpt/resolve/main/b.safetensors"),
        "{text}"
    );
    let dir = hub.store("org/ckpt");
    assert_eq!(names_in(&dir), ["a.safetensors", "config.json"]);
}

#[test]
fn missing_repository_on_local_stand_in_endpoint_names_the_listing_url() {
    let hub = StandIn::new("dl-norepo");
    let err = hub.pull("org/absent").0.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "{}/api/models/org/absent/revision/main",
            hub.cfg.endpoint
        )),
        "{text}"
    );
    assert!(!hub.cfg.store.exists());
}

#[test]
fn several_ggufs_on_local_stand_in_endpoint_need_a_quant() {
    let hub = StandIn::new("dl-several");
    hub.publish("org/n", "main", &[("a.gguf", b"a"), ("b.gguf", b"b")], &[]);
    let err = hub.pull("org/n").0.unwrap_err();
    assert!(matches!(err, HubError::SeveralGguf { .. }), "{err}");
    assert!(err.to_string().contains("a.gguf, b.gguf"), "{err}");
    let err = hub.pull("org/n:Q9").0.unwrap_err();
    assert!(matches!(err, HubError::NothingToFetch { .. }), "{err}");
    assert!(!hub.cfg.store.exists());
}

#[test]
fn bad_listing_on_local_stand_in_endpoint_is_an_error() {
    let hub = StandIn::new("dl-badjson");
    write(&hub.hub().join("api/models/org/n/revision/main"), b"<html>");
    let err = hub.pull("org/n").0.unwrap_err();
    assert!(matches!(err, HubError::BadResponse { .. }), "{err}");
}

#[test]
fn token_travels_to_curl_on_local_stand_in_endpoint() {
    let mut hub = StandIn::new("dl-token");
    hub.publish("org/n", "main", &[("n.gguf", b"n")], &[]);
    hub.cfg.token = Some("hf_not\"a real\\token".into());
    assert!(hub.pull("org/n").0.is_ok());
    hub.cfg.token = Some("hf_secret\nurl = file:///etc/passwd".into());
    let err = hub.pull("org/n").0.unwrap_err();
    assert!(matches!(err, HubError::InvalidToken), "{err}");
    assert!(!err.to_string().contains("hf_secret"), "{err}");
}

#[test]
fn offline_refuses_before_any_access() {
    let mut hub = StandIn::new("dl-offline");
    hub.publish("org/n", "main", &[("n.gguf", b"n")], &[]);
    hub.cfg.offline = true;
    let err = hub.pull("org/n").0.unwrap_err();
    assert!(matches!(err, HubError::Offline { .. }), "{err}");
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");
    assert!(!hub.cfg.store.exists());
}

#[test]
fn paths_and_bad_ids_are_not_downloaded() {
    let hub = StandIn::new("dl-path");
    for model in ["./m.gguf", "m.gguf", "a/b/c"] {
        let err = hub.pull(model).0.unwrap_err();
        assert!(matches!(err, HubError::NotAHubId { .. }), "{model}: {err}");
    }
    let err = hub.pull("org/a..b").0.unwrap_err();
    assert!(matches!(err, HubError::InvalidId { .. }), "{err}");
}

#[test]
fn unknown_store_refuses() {
    let hub = StandIn::new("dl-nostore");
    let cfg = HubConfig {
        store: PathBuf::new(),
        ..hub.cfg.clone()
    };
    let err = download("org/n", &cfg, &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, HubError::NoStore { .. }), "{err}");
}
