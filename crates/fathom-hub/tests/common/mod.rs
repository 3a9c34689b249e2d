//! Scratch directories and fake model trees for the hub tests.

#![allow(dead_code)] // each test binary uses a different part

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use fathom_hub::HubConfig;

/// A directory removed when dropped; unique per process and call.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(label: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("fathom-hub-{label}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A config whose cache and store live here, online, no token.
    pub fn config(&self) -> HubConfig {
        HubConfig {
            hf_cache: self.0.join("hf-cache"),
            store: self.0.join("store"),
            endpoint: "file:///nonexistent-hub".into(),
            token: None,
            offline: false,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

/// Lays out `models--{org}--{name}` the way huggingface_hub does: file
/// bodies in `blobs/`, `snapshots/{commit}/{file}` symlinks to them, and
/// `refs/{ref}` naming the commit when `reference` is given.
#[cfg(unix)]
pub fn cache_snapshot(
    cache: &Path,
    repo: &str,
    reference: Option<&str>,
    commit: &str,
    files: &[(&str, &[u8])],
) -> PathBuf {
    let (org, name) = repo.split_once('/').unwrap();
    let root = cache.join(format!("models--{org}--{name}"));
    let snapshot = root.join("snapshots").join(commit);
    fs::create_dir_all(&snapshot).unwrap();
    for (i, (file, body)) in files.iter().enumerate() {
        let blob = root.join("blobs").join(format!("{commit}-blob{i}"));
        write(&blob, body);
        std::os::unix::fs::symlink(format!("../../blobs/{commit}-blob{i}"), snapshot.join(file))
            .unwrap();
    }
    if let Some(reference) = reference {
        write(&root.join("refs").join(reference), commit.as_bytes());
    }
    snapshot
}

/// `{store}/{org}/{name}/{file}` for each file.
pub fn store_files(store: &Path, repo: &str, files: &[&str]) -> PathBuf {
    let dir = store.join(repo);
    for file in files {
        write(&dir.join(file), b"store");
    }
    dir
}
