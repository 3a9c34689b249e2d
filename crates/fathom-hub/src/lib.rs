//! Turns a MODEL argument into a local path: a `.gguf` file or checkpoint
//! directory as given, or a hub id (`org/name[@REVISION][:QUANT]`) found in
//! the Hugging Face cache or in fathom's own model store, and fetches hub
//! repositories into that store.
//!
//! Lookups never touch the network, so `generate`, `run` and `serve` start
//! the same way offline; only [`download`] (behind `fathom pull`) does, and
//! it shells out to the system `curl` instead of linking an HTTP stack into
//! the binary. Configuration comes in as a [`HubConfig`] built from values
//! the caller passes, so every rule is testable without touching the
//! process environment. `docs/models.md` describes the rules for users.

mod fetch;
mod id;
mod local;
mod pick;

use std::fmt;
use std::path::{Path, PathBuf};

pub use fetch::download;
pub use local::resolve;

/// Overrides the Hugging Face cache directory.
pub const HF_HUB_CACHE_VAR: &str = "HF_HUB_CACHE";
/// The Hugging Face home; the cache is its `hub/` subdirectory.
pub const HF_HOME_VAR: &str = "HF_HOME";
/// The hub's base URL, for mirrors and for tests.
pub const HF_ENDPOINT_VAR: &str = "HF_ENDPOINT";
/// Access token for gated and private repositories.
pub const HF_TOKEN_VAR: &str = "HF_TOKEN";
/// Turns downloads off.
pub const HF_HUB_OFFLINE_VAR: &str = "HF_HUB_OFFLINE";
/// Overrides fathom's model store.
pub const MODELS_DIR_VAR: &str = "FATHOM_MODELS_DIR";

/// The hub used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Every environment variable this crate reads, with its default as
/// documented, so a project test can hold the docs to the code.
pub const ENV_VARS: &[(&str, &str)] = &[
    (HF_HUB_CACHE_VAR, "$HF_HOME/hub"),
    (HF_HOME_VAR, "~/.cache/huggingface"),
    (HF_ENDPOINT_VAR, DEFAULT_ENDPOINT),
    (HF_TOKEN_VAR, "unset"),
    (HF_HUB_OFFLINE_VAR, "unset"),
    (MODELS_DIR_VAR, "~/.cache/fathom/models"),
];

/// Where models are looked up and fetched from.
///
/// An empty `hf_cache` or `store` means the location is unknown (neither
/// its variable nor a home directory was available): lookups skip it and
/// downloads refuse, rather than reading or writing relative to the
/// working directory.
#[derive(Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// The Hugging Face hub cache (`models--{org}--{name}/` layout).
    pub hf_cache: PathBuf,
    /// fathom's store (`{org}/{name}/` layout), where downloads land.
    pub store: PathBuf,
    /// Base URL of the hub, without a trailing `/`.
    pub endpoint: String,
    pub token: Option<String>,
    /// When set, [`download`] fails before any network access.
    pub offline: bool,
}

impl HubConfig {
    /// Builds the configuration from an environment lookup and the home
    /// directory, both passed in so the rules are testable. Empty values
    /// count as unset; a leading `~` in a path variable is expanded as the
    /// Hugging Face tools do.
    pub fn from_env(env: impl Fn(&str) -> Option<String>, home: Option<PathBuf>) -> HubConfig {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let path_var = |name: &str| var(name).map(|v| expand_tilde(&v, home.as_deref()));
        let under_home = |rest: &str| home.as_ref().map(|h| h.join(rest)).unwrap_or_default();

        let hf_cache = path_var(HF_HUB_CACHE_VAR)
            .or_else(|| path_var(HF_HOME_VAR).map(|h| h.join("hub")))
            .unwrap_or_else(|| under_home(".cache/huggingface/hub"));
        let store = path_var(MODELS_DIR_VAR).unwrap_or_else(|| under_home(".cache/fathom/models"));
        let endpoint = var(HF_ENDPOINT_VAR)
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = var(HF_TOKEN_VAR).map(|t| t.trim().to_string());
        let offline = var(HF_HUB_OFFLINE_VAR).is_some_and(|v| parse_flag(&v));
        HubConfig {
            hf_cache,
            store,
            endpoint,
            token,
            offline,
        }
    }
}

/// Keeps the token out of logs and error reports that print the config.
impl fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubConfig")
            .field("hf_cache", &self.hf_cache)
            .field("store", &self.store)
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("offline", &self.offline)
            .finish()
    }
}

/// `HF_HUB_OFFLINE`'s truthy spellings, as huggingface_hub accepts them.
fn parse_flag(value: &str) -> bool {
    ["1", "true", "yes", "on"]
        .iter()
        .any(|t| value.trim().eq_ignore_ascii_case(t))
}

fn expand_tilde(value: &str, home: Option<&Path>) -> PathBuf {
    let value = value.trim();
    match (home, value.strip_prefix('~')) {
        (Some(home), Some("")) => home.to_path_buf(),
        (Some(home), Some(rest)) if rest.starts_with('/') => home.join(&rest[1..]),
        _ => PathBuf::from(value),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("model file or directory {0} not found")]
    PathNotFound(String),
    #[error("{model:?} is neither an existing file or directory nor a hub id: {reason}; a hub id is org/name, optionally with @REVISION and/or :QUANT (e.g. org/name:Q4_K_M), made of letters, digits, '-', '_' and '.'")]
    InvalidId { model: String, reason: String },
    #[error(
        "{model:?} is a local path; only hub ids (org/name[@REVISION][:QUANT]) can be downloaded"
    )]
    NotAHubId { model: String },
    #[error("model {model} not found: looked in the Hugging Face cache ({cache}) and in fathom's store ({store}); run `fathom pull {model}` to download it{offline}")]
    NotFound {
        model: String,
        /// The cache place looked at and what was there.
        cache: String,
        /// The store place looked at and what was there.
        store: String,
        /// A note when `HF_HUB_OFFLINE` would stop that download.
        offline: String,
    },
    #[error("{place} holds several GGUF files{matching}: {}; {hint}", files.join(", "))]
    SeveralGguf {
        place: String,
        /// ` matching :QUANT` when a QUANT was given, else empty.
        matching: String,
        files: Vec<String>,
        hint: String,
    },
    #[error("{place} holds several snapshots ({}) and no refs/main: add @REVISION to {model} naming one of them", snapshots.join(", "))]
    SeveralSnapshots {
        place: PathBuf,
        model: String,
        snapshots: Vec<String>,
    },
    #[error("{path} holds {content:?}, not a commit hash (letters and digits)")]
    BadRef { path: PathBuf, content: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot download {model}: {HF_HUB_OFFLINE_VAR} is set; unset it (or set it to 0) to allow downloads")]
    Offline { model: String },
    #[error(
        "cannot download {model}: fathom's model store is unknown; set {MODELS_DIR_VAR} or HOME"
    )]
    NoStore { model: String },
    #[error("{HF_TOKEN_VAR} holds a control character (e.g. a newline); a token is one line of printable text such as hf_...")]
    InvalidToken,
    #[error("downloads need the curl program on PATH: {0}")]
    CurlUnavailable(std::io::Error),
    #[error("could not fetch {url}: {detail}{hint}")]
    Fetch {
        url: String,
        /// curl's last error line, or its exit status when it printed none.
        detail: String,
        hint: String,
    },
    #[error("unexpected response from {url}: {reason}")]
    BadResponse { url: String, reason: String },
    #[error("nothing to download for {model} from {url}: {reason} (only files at the repository's top level count)")]
    NothingToFetch {
        model: String,
        url: String,
        reason: String,
    },
}

impl HubError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
        move |source| HubError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)], home: Option<&str>) -> HubConfig {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubConfig::from_env(|name| map.get(name).cloned(), home.map(PathBuf::from))
    }

    #[test]
    fn from_env_reads_exactly_the_listed_variables() {
        let asked = RefCell::new(Vec::new());
        HubConfig::from_env(
            |name| {
                asked.borrow_mut().push(name.to_string());
                None
            },
            Some(PathBuf::from("/h")),
        );
        let mut asked = asked.into_inner();
        asked.sort();
        asked.dedup();
        let mut listed: Vec<String> = ENV_VARS.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(asked, listed);
    }

    #[test]
    fn defaults_follow_home() {
        let cfg = config(&[], Some("/h"));
        assert_eq!(cfg.hf_cache, PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(cfg.store, PathBuf::from("/h/.cache/fathom/models"));
        assert_eq!(cfg.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(cfg.token, None);
        assert!(!cfg.offline);
    }

    #[test]
    fn without_home_or_variables_the_places_are_unknown() {
        let cfg = config(&[], None);
        assert_eq!(cfg.hf_cache, PathBuf::new());
        assert_eq!(cfg.store, PathBuf::new());
    }

    #[test]
    fn hub_cache_beats_hf_home_which_beats_home() {
        let both = config(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/hf")], Some("/h"));
        assert_eq!(both.hf_cache, PathBuf::from("/c"));
        let home_only = config(&[("HF_HOME", "/hf")], Some("/h"));
        assert_eq!(home_only.hf_cache, PathBuf::from("/hf/hub"));
        let empty = config(&[("HF_HUB_CACHE", " "), ("HF_HOME", "")], Some("/h"));
        assert_eq!(empty.hf_cache, PathBuf::from("/h/.cache/huggingface/hub"));
    }

    #[test]
    fn path_variables_expand_a_leading_tilde() {
        let cfg = config(
            &[("HF_HOME", "~/hf"), ("FATHOM_MODELS_DIR", "~")],
            Some("/h"),
        );
        assert_eq!(cfg.hf_cache, PathBuf::from("/h/hf/hub"));
        assert_eq!(cfg.store, PathBuf::from("/h"));
        let other_user = config(&[("FATHOM_MODELS_DIR", "~bob/m")], Some("/h"));
        assert_eq!(other_user.store, PathBuf::from("~bob/m"));
    }

    #[test]
    fn endpoint_loses_trailing_slashes_and_token_its_whitespace() {
        let cfg = config(
            &[
                ("HF_ENDPOINT", "https://mirror.example/ "),
                ("HF_TOKEN", " hf_x\n"),
            ],
            Some("/h"),
        );
        assert_eq!(cfg.endpoint, "https://mirror.example");
        assert_eq!(cfg.token.as_deref(), Some("hf_x"));
        assert_eq!(config(&[("HF_TOKEN", "")], None).token, None);
        assert_eq!(
            config(&[("HF_ENDPOINT", "/")], None).endpoint,
            DEFAULT_ENDPOINT
        );
    }

    #[test]
    fn offline_accepts_the_truthy_spellings_only() {
        for on in ["1", "true", "TRUE", "Yes", "on", " On "] {
            assert!(config(&[("HF_HUB_OFFLINE", on)], None).offline, "{on:?}");
        }
        for off in ["0", "false", "no", "off", "", "2", "enabled"] {
            assert!(!config(&[("HF_HUB_OFFLINE", off)], None).offline, "{off:?}");
        }
    }

    #[test]
    fn debug_does_not_print_the_token() {
        let cfg = config(&[("HF_TOKEN", "hf_secret")], None);
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("hf_secret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
