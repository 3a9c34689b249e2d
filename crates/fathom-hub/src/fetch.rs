//! Fetching a hub repository into fathom's store through the system
//! `curl`, which keeps TLS, proxies and redirects out of the binary.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::id::{looks_like_path, HubId};
use crate::local::several_gguf;
use crate::pick::{pick, Pick, CONFIG};
use crate::{HubConfig, HubError};

/// Checkpoint files fetched besides the weights, when the repo has them.
const CHECKPOINT_EXTRAS: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];
const INDEX: &str = "model.safetensors.index.json";
/// Bounds what is read into memory: the API listing and the shard index.
const MAX_JSON_BYTES: u64 = 64 << 20;
/// How often a running download's size is reported.
const POLL: Duration = Duration::from_millis(50);

/// Fetches the model `model` names into `{store}/{org}/{name}/` and returns
/// its path there, as [`crate::resolve`] will find it: the chosen `.gguf`
/// file, or the checkpoint directory. `progress` gets the bytes fetched so
/// far and, when the hub reported every file's size, the total.
///
/// Each file is written to `NAME.partial` and renamed when complete, so an
/// interrupted download never leaves a truncated file under its real name.
pub fn download(
    model: &str,
    cfg: &HubConfig,
    progress: &mut dyn FnMut(u64, Option<u64>),
) -> Result<PathBuf, HubError> {
    if looks_like_path(model) || fs::metadata(model).is_ok() {
        return Err(HubError::NotAHubId {
            model: model.into(),
        });
    }
    let id = HubId::parse(model).map_err(|reason| HubError::InvalidId {
        model: model.into(),
        reason,
    })?;
    if cfg.offline {
        return Err(HubError::Offline {
            model: model.into(),
        });
    }
    if cfg.store.as_os_str().is_empty() {
        return Err(HubError::NoStore {
            model: model.into(),
        });
    }
    let curl = Curl::new(cfg.token.as_deref())?;
    let revision = id.revision.unwrap_or("main");
    let listing_url = format!(
        "{}/api/models/{}/{}/revision/{revision}",
        cfg.endpoint, id.org, id.name
    );
    // `blobs=true` adds each file's size, for the progress total.
    let listing = curl.get(&format!("{listing_url}?blobs=true"), &listing_url)?;
    let siblings = parse_siblings(&listing, &listing_url)?;
    let names: Vec<&str> = siblings.iter().map(|(n, _)| n.as_str()).collect();

    let gguf = match pick(&names, id.quant) {
        Pick::Gguf(name) => Some(name),
        Pick::Checkpoint => None,
        Pick::Several(files) => return Err(several_gguf(listing_url, files, &id)),
        Pick::Nothing(reason) => {
            return Err(HubError::NothingToFetch {
                model: model.into(),
                url: listing_url,
                reason,
            })
        }
    };
    let dir = cfg.store.join(id.org).join(id.name);
    fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
    let repo = Repo {
        curl: &curl,
        base_url: &format!("{}/{}/{}/resolve/{revision}", cfg.endpoint, id.org, id.name),
        dir: &dir,
        siblings: &siblings,
    };
    let fetched = match gguf {
        Some(name) => repo
            .fetch(&[name.to_string()], 0, progress)
            .map(|()| dir.join(name)),
        None => repo.fetch_checkpoint(progress).map(|()| dir.clone()),
    };
    if fetched.is_err() {
        // Removes the directory only if it is empty, i.e. this pull made it.
        let _ = fs::remove_dir(&dir);
    }
    fetched
}

/// One repository revision being fetched into its store directory.
struct Repo<'a> {
    curl: &'a Curl,
    /// `{endpoint}/{org}/{name}/resolve/{revision}`.
    base_url: &'a str,
    dir: &'a Path,
    siblings: &'a [(String, Option<u64>)],
}

impl Repo<'_> {
    fn listed(&self, name: &str) -> bool {
        self.siblings.iter().any(|(n, _)| n == name)
    }

    fn fetch_checkpoint(&self, progress: &mut dyn FnMut(u64, Option<u64>)) -> Result<(), HubError> {
        let mut files: Vec<String> = [CONFIG]
            .into_iter()
            .chain(CHECKPOINT_EXTRAS)
            .filter(|f| self.listed(f))
            .map(String::from)
            .collect();
        let mut done = 0;
        if self.listed(INDEX) {
            // The index says which shards make the model; repos that also
            // ship a consolidated copy would otherwise cost twice the bytes.
            done = self.fetch_file(INDEX, &mut |_| {})?;
            files.extend(shards_in_index(&self.dir.join(INDEX), self.siblings)?);
        } else {
            files.extend(
                self.siblings
                    .iter()
                    .filter(|(n, _)| n.ends_with(".safetensors"))
                    .map(|(n, _)| n.clone()),
            );
        }
        self.fetch(&files, done, progress)
    }

    /// Fetches `files` in order; `done` bytes were fetched before them.
    fn fetch(
        &self,
        files: &[String],
        done: u64,
        progress: &mut dyn FnMut(u64, Option<u64>),
    ) -> Result<(), HubError> {
        let size_of = |name: &str| {
            self.siblings
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, s)| *s)
        };
        let total = files
            .iter()
            .try_fold(done, |sum, f| size_of(f).map(|s| sum.saturating_add(s)));
        let mut done = done;
        progress(done, total);
        for name in files {
            let before = done;
            let fetched = self.fetch_file(name, &mut |bytes| {
                progress(before.saturating_add(bytes), total)
            })?;
            done = before.saturating_add(fetched);
            progress(done, total);
        }
        Ok(())
    }

    /// Downloads one file through `NAME.partial`; returns its size.
    fn fetch_file(&self, name: &str, on_bytes: &mut dyn FnMut(u64)) -> Result<u64, HubError> {
        let url = format!("{}/{}", self.base_url, encode_segment(name));
        let dest = self.dir.join(name);
        let partial = self.dir.join(format!("{name}.partial"));
        let fetched = self
            .curl
            .to_file(&url, &partial, on_bytes)
            .and_then(|()| fs::rename(&partial, &dest).map_err(HubError::io(&dest)))
            .and_then(|()| fs::metadata(&dest).map_err(HubError::io(&dest)));
        match fetched {
            Ok(meta) => Ok(meta.len()),
            Err(e) => {
                // Best effort: the error being reported matters more than a
                // leftover the next pull overwrites anyway.
                let _ = fs::remove_file(&partial);
                Err(e)
            }
        }
    }
}

/// Top-level file names (and sizes when listed) from the hub's model info.
/// Files in subfolders and names unsafe as one path component are left out:
/// the store keeps a repository's files side by side.
fn parse_siblings(body: &[u8], url: &str) -> Result<Vec<(String, Option<u64>)>, HubError> {
    let bad = |reason: String| HubError::BadResponse {
        url: url.into(),
        reason,
    };
    let info: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let siblings = info
        .get("siblings")
        .and_then(|s| s.as_array())
        .ok_or_else(|| bad("no \"siblings\" array listing the files".into()))?;
    let mut files = Vec::new();
    for sibling in siblings {
        let name = sibling
            .get("rfilename")
            .and_then(|n| n.as_str())
            .ok_or_else(|| bad("a sibling has no \"rfilename\" string".into()))?;
        if is_plain_file_name(name) {
            let size = sibling.get("size").and_then(|s| s.as_u64());
            files.push((name.to_string(), size));
        }
    }
    Ok(files)
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
}

/// The shard files an index's `weight_map` points at, each checked to be
/// one the repository lists.
fn shards_in_index(path: &Path, listed: &[(String, Option<u64>)]) -> Result<Vec<String>, HubError> {
    let bad = |reason: String| HubError::BadResponse {
        url: path.display().to_string(),
        reason,
    };
    let text = read_bounded(path)?;
    let index: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut shards = BTreeSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{tensor:?}] is not a file name")))?;
        if !listed.iter().any(|(n, _)| n == file) {
            return Err(bad(format!(
                "weight_map[{tensor:?}] names {file:?}, which the repository does not list at its top level"
            )));
        }
        shards.insert(file.to_string());
    }
    Ok(shards.into_iter().collect())
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, HubError> {
    let file = fs::File::open(path).map_err(HubError::io(path))?;
    let mut bytes = Vec::new();
    file.take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(HubError::io(path))?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(HubError::BadResponse {
            url: path.display().to_string(),
            reason: format!("larger than {MAX_JSON_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

/// Percent-encodes a file name for one URL path segment.
fn encode_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// How curl is run. The token travels as a config file on stdin rather
/// than as an argument, where other users could read it in `ps`.
struct Curl {
    config: Option<String>,
}

impl Curl {
    fn new(token: Option<&str>) -> Result<Curl, HubError> {
        let config = match token {
            None => None,
            Some(token) if token.chars().any(char::is_control) => {
                return Err(HubError::InvalidToken)
            }
            Some(token) => {
                let quoted = token.replace('\\', "\\\\").replace('"', "\\\"");
                Some(format!("header = \"Authorization: Bearer {quoted}\"\n"))
            }
        };
        Ok(Curl { config })
    }

    /// `-q` first so a user's `.curlrc` cannot change what is fetched;
    /// `-f` so HTTP errors fail instead of saving an error page. curl does
    /// not forward the Authorization header when a redirect leaves the
    /// host, so the token stays with the hub and off its CDN.
    fn command(&self, url: &str) -> Command {
        let mut cmd = Command::new("curl");
        cmd.args(["-q", "-sS", "-fL", "--retry", "3"]);
        if self.config.is_some() {
            cmd.args(["-K", "-"]);
        }
        cmd.arg(url).stdin(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }

    fn spawn(&self, mut cmd: Command) -> Result<Child, HubError> {
        let mut child = cmd.spawn().map_err(HubError::CurlUnavailable)?;
        let stdin = child.stdin.take();
        if let (Some(mut stdin), Some(config)) = (stdin, &self.config) {
            // A failed write surfaces as curl's own error when it exits.
            let _ = stdin.write_all(config.as_bytes());
        }
        Ok(child)
    }

    /// The body at `url`; `shown` is the URL as errors name it.
    fn get(&self, url: &str, shown: &str) -> Result<Vec<u8>, HubError> {
        let mut cmd = self.command(url);
        cmd.args(["--max-filesize", &MAX_JSON_BYTES.to_string()])
            .stdout(Stdio::piped());
        let output = self
            .spawn(cmd)?
            .wait_with_output()
            .map_err(HubError::CurlUnavailable)?;
        if !output.status.success() {
            return Err(fetch_error(shown, output.status, &output.stderr));
        }
        Ok(output.stdout)
    }

    /// Writes `url` to `path`, reporting the bytes written so far while
    /// curl runs.
    fn to_file(
        &self,
        url: &str,
        path: &Path,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<(), HubError> {
        let mut cmd = self.command(url);
        cmd.arg("-o").arg(path).stdout(Stdio::null());
        let mut child = self.spawn(cmd)?;
        let mut reported = 0;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {}
                Err(e) => return Err(HubError::CurlUnavailable(e)),
            }
            let written = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            if written != reported {
                reported = written;
                on_bytes(written);
            }
            thread::sleep(POLL);
        };
        // With -sS curl writes only a line or two, which the pipe holds
        // until the process has exited.
        let mut stderr = Vec::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_end(&mut stderr);
        }
        if !status.success() {
            return Err(fetch_error(url, status, &stderr));
        }
        Ok(())
    }
}

fn fetch_error(url: &str, status: std::process::ExitStatus, stderr: &[u8]) -> HubError {
    // curl's exit code 22: the server answered with an HTTP error.
    let hint = if status.code() == Some(22) {
        "; check the id and revision, and set HF_TOKEN for gated or private repositories"
    } else {
        ""
    };
    // After retries curl has printed one line per attempt; the last says
    // why it gave up.
    let stderr = String::from_utf8_lossy(stderr);
    let detail = match stderr.lines().map(str::trim).rfind(|l| !l.is_empty()) {
        Some(line) => line.to_string(),
        None => format!("curl {status}"),
    };
    HubError::Fetch {
        url: url.into(),
        detail,
        hint: hint.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_keep_unreserved_bytes_only() {
        assert_eq!(encode_segment("m-Q4_K.M~1.gguf"), "m-Q4_K.M~1.gguf");
        assert_eq!(encode_segment("a b%é"), "a%20b%25%C3%A9");
    }

    #[test]
    fn only_plain_top_level_names_are_kept() {
        let body = br#"{"siblings":[
            {"rfilename":"a.gguf","size":5},
            {"rfilename":"sub/b.gguf"},
            {"rfilename":".."},
            {"rfilename":"c\\d.gguf"},
            {"rfilename":"e\nf.gguf"},
            {"rfilename":"config.json"}]}"#;
        let files = parse_siblings(body, "u").unwrap();
        assert_eq!(
            files,
            [
                ("a.gguf".to_string(), Some(5)),
                ("config.json".to_string(), None)
            ]
        );
    }

    #[test]
    fn a_listing_without_file_names_is_an_error_naming_the_url() {
        for body in [&b"[1]"[..], b"{\"siblings\":[{}]}", b"not json"] {
            let err = parse_siblings(body, "http://x/api")
                .unwrap_err()
                .to_string();
            assert!(err.contains("http://x/api"), "{err}");
        }
    }

    #[test]
    fn a_token_with_a_newline_is_refused_without_echoing_it() {
        let err = Curl::new(Some("hf_abc\nurl = evil"))
            .err()
            .unwrap()
            .to_string();
        assert!(!err.contains("hf_abc"), "{err}");
        let quoted = Curl::new(Some(r#"a"b\c"#)).unwrap().config.unwrap();
        assert_eq!(quoted, "header = \"Authorization: Bearer a\\\"b\\\\c\"\n");
    }
}
