//! Finding a MODEL on this machine, without the network.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::id::{looks_like_path, HubId};
use crate::pick::{pick, Pick};
use crate::{HubConfig, HubError, HF_HUB_OFFLINE_VAR};

/// A ref names a 40-hex commit; anything much longer is not one.
const MAX_REF_LEN: u64 = 256;

/// Where a place looked at stands.
enum Found {
    Path(PathBuf),
    /// Nothing usable there; the reason goes into the not-found message.
    Missing(String),
}

/// Resolves MODEL to a local `.gguf` file or checkpoint directory: an
/// existing path as is, else a hub id looked up in the Hugging Face cache
/// and then in fathom's store. Never touches the network.
pub fn resolve(model: &str, cfg: &HubConfig) -> Result<PathBuf, HubError> {
    if model.is_empty() {
        return Err(HubError::InvalidId {
            model: model.into(),
            reason: "it is empty".into(),
        });
    }
    let path = Path::new(model);
    if fs::metadata(path).is_ok() {
        return Ok(path.to_path_buf());
    }
    if looks_like_path(model) {
        return Err(HubError::PathNotFound(model.into()));
    }
    let id = HubId::parse(model).map_err(|reason| HubError::InvalidId {
        model: model.into(),
        reason,
    })?;
    let (cache_place, cache) = if cfg.hf_cache.as_os_str().is_empty() {
        (
            "unknown: HF_HUB_CACHE, HF_HOME and HOME are unset".to_string(),
            Found::Missing(String::new()),
        )
    } else {
        let repo = cfg
            .hf_cache
            .join(format!("models--{}--{}", id.org, id.name));
        (repo.display().to_string(), in_cache(&repo, &id, model)?)
    };
    let cache_note = match cache {
        Found::Path(found) => return Ok(found),
        Found::Missing(why) => why,
    };
    let (store_place, store) = if cfg.store.as_os_str().is_empty() {
        (
            "unknown: FATHOM_MODELS_DIR and HOME are unset".to_string(),
            Found::Missing(String::new()),
        )
    } else {
        let dir = cfg.store.join(id.org).join(id.name);
        (dir.display().to_string(), in_dir(&dir, &id)?)
    };
    let store_note = match store {
        Found::Path(found) => return Ok(found),
        Found::Missing(why) => why,
    };
    let place = |place: String, why: String| {
        if why.is_empty() {
            place
        } else {
            format!("{place}: {why}")
        }
    };
    Err(HubError::NotFound {
        model: model.into(),
        cache: place(cache_place, cache_note),
        store: place(store_place, store_note),
        offline: if cfg.offline {
            format!(" (unset {HF_HUB_OFFLINE_VAR} first)")
        } else {
            String::new()
        },
    })
}

/// The HF cache keeps each revision as `snapshots/{commit}/`, with
/// `refs/{branch or tag}` naming the commit.
fn in_cache(repo: &Path, id: &HubId, model: &str) -> Result<Found, HubError> {
    if !repo.is_dir() {
        return Ok(Found::Missing("not present".into()));
    }
    let snapshots = repo.join("snapshots");
    let revision = id.revision.unwrap_or("main");
    let snapshot = match read_ref(&repo.join("refs").join(revision))? {
        Some(commit) => {
            let snapshot = snapshots.join(&commit);
            if !snapshot.is_dir() {
                return Ok(Found::Missing(format!(
                    "refs/{revision} names snapshot {commit}, which is missing"
                )));
            }
            snapshot
        }
        // A revision given as a commit hash has a snapshot but no ref.
        None if id.revision.is_some() => {
            let snapshot = snapshots.join(revision);
            if !snapshot.is_dir() {
                return Ok(Found::Missing(format!(
                    "no refs/{revision} and no snapshots/{revision}"
                )));
            }
            snapshot
        }
        None => {
            let mut all = subdirectories(&snapshots)?;
            match all.len() {
                0 => return Ok(Found::Missing("no refs/main and no snapshot".into())),
                1 => snapshots.join(all.remove(0)),
                _ => {
                    return Err(HubError::SeveralSnapshots {
                        place: snapshots,
                        model: model.into(),
                        snapshots: all,
                    })
                }
            }
        }
    };
    in_dir(&snapshot, id)
}

/// The commit a ref names; `None` when the ref does not exist.
fn read_ref(path: &Path) -> Result<Option<String>, HubError> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HubError::io(path)(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_REF_LEN)
        .read_to_end(&mut bytes)
        .map_err(HubError::io(path))?;
    let content = String::from_utf8_lossy(&bytes).trim().to_string();
    if content.is_empty() || !content.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(HubError::BadRef {
            path: path.to_path_buf(),
            content,
        });
    }
    Ok(Some(content))
}

/// Picks the model among a directory's files. Symlinks are followed (the
/// HF cache links snapshot files to blobs), and a dangling one, a blob not
/// fully downloaded, does not count.
fn in_dir(dir: &Path, id: &HubId) -> Result<Found, HubError> {
    if !dir.is_dir() {
        return Ok(Found::Missing("not present".into()));
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(HubError::io(dir))? {
        let path = entry.map_err(HubError::io(dir))?.path();
        if path.is_file() {
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                names.push(name.to_string());
            }
        }
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    match pick(&names, id.quant) {
        Pick::Checkpoint => Ok(Found::Path(dir.to_path_buf())),
        Pick::Gguf(name) => Ok(Found::Path(dir.join(name))),
        Pick::Several(files) => Err(several_gguf(dir.display().to_string(), files, id)),
        Pick::Nothing(why) => Ok(Found::Missing(why)),
    }
}

pub(crate) fn several_gguf(place: String, files: Vec<&str>, id: &HubId) -> HubError {
    let (matching, hint) = match id.quant {
        Some(quant) => (
            format!(" matching :{quant}"),
            "make :QUANT more specific so it matches one file".to_string(),
        ),
        None => (
            String::new(),
            format!(
                "add :QUANT, a part of one file name, to pick it (e.g. {}:Q4_K_M)",
                id.repo()
            ),
        ),
    };
    HubError::SeveralGguf {
        place,
        matching,
        files: files.into_iter().map(String::from).collect(),
        hint,
    }
}

fn subdirectories(dir: &Path) -> Result<Vec<String>, HubError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HubError::io(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let path = entry.map_err(HubError::io(dir))?.path();
        if path.is_dir() {
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                names.push(name.to_string());
            }
        }
    }
    names.sort();
    Ok(names)
}
