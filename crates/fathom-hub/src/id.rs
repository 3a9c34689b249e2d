//! Telling a hub id from a path, and taking a hub id apart.

/// HF caps repository names at 96 characters; the same bound keeps every
/// part of an id (and the error messages quoting it) short.
const MAX_PART_LEN: usize = 96;

/// `org/name[@REVISION][:QUANT]`, every part checked to be safe as one
/// path component and one URL segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HubId<'a> {
    pub org: &'a str,
    pub name: &'a str,
    /// A case-insensitive part of the wanted GGUF's file name.
    pub quant: Option<&'a str>,
    pub revision: Option<&'a str>,
}

impl<'a> HubId<'a> {
    /// Parses an id, or says what is wrong with it.
    pub fn parse(model: &'a str) -> Result<HubId<'a>, String> {
        let (rest, quant) = match model.split_once(':') {
            Some((rest, quant)) => (rest, Some(quant)),
            None => (model, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision)),
            None => (rest, None),
        };
        let (org, name) = repo
            .split_once('/')
            .ok_or_else(|| format!("{repo:?} has no '/' between organization and name"))?;
        check_part("organization", org)?;
        check_part("name", name)?;
        if let Some(revision) = revision {
            check_part("revision", revision)?;
        }
        if let Some(quant) = quant {
            check_part("QUANT", quant)?;
        }
        Ok(HubId {
            org,
            name,
            quant,
            revision,
        })
    }

    /// `org/name[@REVISION]`, for messages.
    pub fn repo(&self) -> String {
        match self.revision {
            Some(revision) => format!("{}/{}@{revision}", self.org, self.name),
            None => format!("{}/{}", self.org, self.name),
        }
    }
}

/// Whether MODEL was meant as a path, so a missing one is reported as a
/// missing file instead of being looked up on the hub.
pub(crate) fn looks_like_path(model: &str) -> bool {
    ends_with_ignore_case(model, ".gguf")
        || model.starts_with(['.', '/', '~'])
        || model.contains('\\')
        || model.matches('/').count() > 1
}

/// Byte-wise, so a multi-byte character before the suffix cannot split.
pub(crate) fn ends_with_ignore_case(text: &str, suffix: &str) -> bool {
    let (text, suffix) = (text.as_bytes(), suffix.as_bytes());
    text.len() >= suffix.len() && text[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

fn check_part(what: &str, part: &str) -> Result<(), String> {
    if part.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if part.len() > MAX_PART_LEN {
        return Err(format!(
            "the {what} is longer than {MAX_PART_LEN} characters"
        ));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!("the {what} {part:?} contains {c:?}"));
    }
    if part.starts_with('.') {
        return Err(format!("the {what} {part:?} starts with '.'"));
    }
    if part.contains("..") {
        return Err(format!("the {what} {part:?} contains '..'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let plain = HubId::parse("org/name").unwrap();
        assert_eq!((plain.org, plain.name), ("org", "name"));
        assert_eq!((plain.quant, plain.revision), (None, None));
        let quant = HubId::parse("bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M").unwrap();
        assert_eq!(quant.name, "SmolLM2-135M-Instruct-GGUF");
        assert_eq!(quant.quant, Some("Q4_K_M"));
        let both = HubId::parse("o/n@v1.0:q8_0").unwrap();
        assert_eq!((both.revision, both.quant), (Some("v1.0"), Some("q8_0")));
        assert_eq!(both.repo(), "o/n@v1.0");
    }

    #[test]
    fn rejects_bad_ids_with_a_reason() {
        for (model, reason) in [
            ("name", "no '/'"),
            ("org/", "name is empty"),
            ("org/na me", "contains ' '"),
            ("org/a..b", "contains '..'"),
            ("org/.x", "starts with '.'"),
            ("org/name:", "QUANT is empty"),
            ("org/name@", "revision is empty"),
            ("org/name:Q4@main", "contains '@'"),
            ("org/name:a:b", "contains ':'"),
            ("org/n\u{e9}", "contains"),
        ] {
            let err = HubId::parse(model).unwrap_err();
            assert!(err.contains(reason), "{model}: {err}");
        }
        let long = format!("org/{}", "a".repeat(97));
        assert!(HubId::parse(&long).unwrap_err().contains("longer than 96"));
    }

    #[test]
    fn path_looking_arguments() {
        for path in [
            "model.gguf",
            "M.GGUF",
            "./x",
            "../x",
            "/abs",
            "~/m",
            "a/b/c",
            "dir\\m",
        ] {
            assert!(looks_like_path(path), "{path}");
        }
        for id in ["org/name", "org/name:Q4_K_M", "name", "\u{e9}gguf"] {
            assert!(!looks_like_path(id), "{id}");
        }
    }
}
