//! A tokenizer from a Hugging Face directory: `tokenizer.json` (a byte-level
//! BPE model) and `tokenizer_config.json` (BOS/EOS, `add_bos_token`, chat
//! template), read the way `convert_hf_to_gguf.py` reads them so that the
//! result tokenizes like the GGUF file converted from the same directory.
//! `tokenizer.json`'s vocabulary and merges are walked by
//! [`fathom_checkpoint::tokenizer_json`], never parsed into a JSON tree: the
//! plan's runtime term counts this load from the same walk
//! (docs/memory-plan.md, "A Hugging Face `tokenizer.json`").

use std::borrow::Cow;
use std::path::Path;

use fathom_checkpoint::tokenizer_json::{self, merge_parts, Sink};
use serde_json::Value;

use crate::pretok::{PreTokenizer, GPT2_HF};
use crate::tokenizer::{attr, ModelParts, Parts, SpecialIds};
use crate::{Tokenizer, TokenizerError};

/// More tokens than any real vocabulary.
const MAX_VOCAB: u64 = 1 << 24;
/// Ids the vocabulary may skip (filled with placeholders); bounds the table
/// a hostile id would make us allocate to the entries actually present.
const MAX_HOLES: usize = 1 << 16;

struct Json {
    file: String,
    root: Value,
}

impl Json {
    fn read(path: &Path) -> Result<Option<Json>, TokenizerError> {
        let file = path.display().to_string();
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(TokenizerError::Io { file, source }),
        };
        let root = serde_json::from_slice(&bytes).map_err(|source| TokenizerError::Json {
            file: file.clone(),
            source,
        })?;
        Ok(Some(Json { file, root }))
    }

    fn invalid(&self, field: impl Into<String>, problem: impl Into<String>) -> TokenizerError {
        TokenizerError::Invalid {
            file: self.file.clone(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn missing(&self, field: &str) -> TokenizerError {
        TokenizerError::Missing {
            file: self.file.clone(),
            field: field.into(),
        }
    }

    /// `v[key]` as a bool, `default` when absent or null.
    fn bool(
        &self,
        v: &Value,
        key: &str,
        field: &str,
        default: bool,
    ) -> Result<bool, TokenizerError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => {
                Err(self.invalid(format!("{field}.{key}"), format!("is {other}, not a bool")))
            }
        }
    }

    /// `v["type"]`, or `""` when absent.
    fn kind<'v>(&self, v: &'v Value, field: &str) -> Result<&'v str, TokenizerError> {
        match v.get("type") {
            None => Ok(""),
            Some(Value::String(s)) => Ok(s),
            Some(other) => {
                Err(self.invalid(format!("{field}.type"), format!("is {other}, not a string")))
            }
        }
    }
}

/// The first pass over the vocabulary and merges: how many there are, the
/// largest id, and the first entry of each that is not valid.
#[derive(Default)]
struct Check {
    entries: usize,
    max_id: Option<u64>,
    bad_token: Option<(String, Value)>,
    merges: usize,
    bad_merge: Option<(usize, Value)>,
}

impl<'a> Sink<'a> for Check {
    fn token(&mut self, text: Cow<'a, str>, id: Value) {
        match id.as_u64().filter(|&id| id < MAX_VOCAB) {
            Some(id) => {
                self.entries += 1;
                self.max_id = self.max_id.max(Some(id));
            }
            None => {
                self.bad_token.get_or_insert((text.into_owned(), id));
            }
        }
    }

    fn merge(&mut self, merge: Value) {
        if merge_parts(&merge).is_none() {
            self.bad_merge.get_or_insert((self.merges, merge));
        }
        self.merges += 1;
    }
}

/// The second pass: each token's text at its id (one string of its exact
/// length), the merges' parts in order, in tables sized by [`Check`].
struct Place {
    texts: Vec<String>,
    attrs: Vec<u16>,
    merges: Vec<(String, String)>,
}

impl<'a> Sink<'a> for Place {
    fn token(&mut self, text: Cow<'a, str>, id: Value) {
        if let Some(id) = id.as_u64().filter(|&id| id < self.texts.len() as u64) {
            self.texts[id as usize] = text.into_owned();
            self.attrs[id as usize] = attr::NORMAL;
        }
    }

    fn merge(&mut self, merge: Value) {
        if let Some((left, right)) = merge_parts(&merge) {
            self.merges.push((left.to_string(), right.to_string()));
        }
    }
}

/// Added tokens that `convert_hf_to_gguf.py` makes control tokens although
/// the tokenizer does not mark them special.
fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<｜") && text.ends_with("｜>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}

/// What the `pre_tokenizer` section asks for.
#[derive(Default)]
struct PreSpec {
    patterns: Vec<String>,
    byte_level: bool,
    add_prefix_space: bool,
}

fn read_pre(json: &Json, v: &Value, field: &str, spec: &mut PreSpec) -> Result<(), TokenizerError> {
    match json.kind(v, field)? {
        "Sequence" => {
            let steps = v
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| json.missing(&format!("{field}.pretokenizers")))?;
            for (i, step) in steps.iter().enumerate() {
                read_pre(json, step, &format!("{field}.pretokenizers[{i}]"), spec)?;
            }
        }
        "ByteLevel" => {
            spec.byte_level = true;
            spec.add_prefix_space = json.bool(v, "add_prefix_space", field, true)?;
            if json.bool(v, "use_regex", field, true)? {
                spec.patterns.push(GPT2_HF.to_string());
            }
        }
        "Split" => {
            let behavior = v.get("behavior").and_then(Value::as_str).unwrap_or("");
            if behavior != "Isolated" || json.bool(v, "invert", field, false)? {
                return Err(json.invalid(
                    format!("{field}.behavior"),
                    format!("is {behavior:?} (invert {:?}); fathom reads Split with behavior \"Isolated\" and invert false", v.get("invert")),
                ));
            }
            let pattern = v.get("pattern");
            if let Some(re) = pattern.and_then(|p| p.get("Regex")).and_then(Value::as_str) {
                spec.patterns.push(re.to_string());
            } else if let Some(s) = pattern
                .and_then(|p| p.get("String"))
                .and_then(Value::as_str)
            {
                spec.patterns.push(fancy_regex::escape(s).into_owned());
            } else {
                return Err(json.invalid(
                    format!("{field}.pattern"),
                    "is neither {\"Regex\": ...} nor {\"String\": ...}",
                ));
            }
        }
        "Digits" => {
            let individual = json.bool(v, "individual_digits", field, false)?;
            spec.patterns
                .push(if individual { r"\p{N}" } else { r"\p{N}+" }.to_string());
        }
        other => {
            return Err(json.invalid(
                format!("{field}.type"),
                format!("is {other:?}; fathom reads Sequence, ByteLevel, Split and Digits"),
            ))
        }
    }
    Ok(())
}

/// Whether the post-processor puts `bos` in front of a single sequence
/// (how Llama 3 asks for BOS without `add_bos_token`).
fn template_adds(post: &Value, bos: &str) -> bool {
    match post.get("type").and_then(Value::as_str) {
        Some("TemplateProcessing") => {
            post.pointer("/single/0/SpecialToken/id")
                .and_then(Value::as_str)
                == Some(bos)
        }
        Some("Sequence") => post
            .get("processors")
            .and_then(Value::as_array)
            .is_some_and(|ps| ps.iter().any(|p| template_adds(p, bos))),
        _ => false,
    }
}

/// A token named in `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_content(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

impl Tokenizer {
    /// Reads `tokenizer.json` and `tokenizer_config.json` from a Hugging
    /// Face model directory. Only byte-level BPE models are read; a `NFC`
    /// normalizer is ignored, as llama.cpp ignores it.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let file = tokenizer_path.display().to_string();
        // Read whole: the vocabulary's texts are borrowed from these bytes
        // until placed, and they are dropped before the tables are built.
        let bytes = match std::fs::read(&tokenizer_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TokenizerError::Missing {
                    file: dir.display().to_string(),
                    field: "tokenizer.json".into(),
                })
            }
            Err(source) => return Err(TokenizerError::Io { file, source }),
        };
        let json_error = |source| TokenizerError::Json {
            file: file.clone(),
            source,
        };
        // A first pass checks every entry and counts them, so the second
        // places them in tables of exactly their size.
        let mut check = Check::default();
        let sections = tokenizer_json::read(&bytes, &mut check).map_err(json_error)?;
        let json = Json {
            file: file.clone(),
            root: Value::Object(sections.root),
        };
        let root = &json.root;
        let model = &Value::Object(sections.model.ok_or_else(|| json.missing("model"))?);
        match json.kind(model, "model")? {
            "" | "BPE" => {}
            other => {
                return Err(
                    json.invalid("model.type", format!("is {other:?}; fathom reads \"BPE\""))
                )
            }
        }
        for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if let Some(v) = model
                .get(key)
                .filter(|v| !v.is_null() && v.as_str() != Some(""))
            {
                return Err(json.invalid(
                    format!("model.{key}"),
                    format!("is {v}; fathom reads BPE without one"),
                ));
            }
        }
        match root.get("normalizer") {
            None | Some(Value::Null) => {}
            Some(n) if json.kind(n, "normalizer")? == "NFC" => {}
            Some(n) => {
                return Err(json.invalid(
                    "normalizer.type",
                    format!(
                        "is {:?}; fathom reads none or NFC",
                        json.kind(n, "normalizer")?
                    ),
                ))
            }
        }

        // Vocabulary and added tokens, by id.
        if !sections.vocab {
            return Err(json.missing("model.vocab"));
        }
        if let Some((text, id)) = &check.bad_token {
            return Err(json.invalid(
                format!("model.vocab[{text:?}]"),
                format!("is {id}, not a token id below {MAX_VOCAB}"),
            ));
        }
        let added = match root.get("added_tokens") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(a)) => a.as_slice(),
            Some(_) => return Err(json.invalid("added_tokens", "is not an array")),
        };
        let mut added_tokens: Vec<(u64, &str, u16)> = Vec::with_capacity(added.len());
        for (i, token) in added.iter().enumerate() {
            let field = format!("added_tokens[{i}]");
            let id = token
                .get("id")
                .and_then(Value::as_u64)
                .filter(|&id| id < MAX_VOCAB)
                .ok_or_else(|| {
                    json.invalid(
                        format!("{field}.id"),
                        format!("is not a token id below {MAX_VOCAB}"),
                    )
                })?;
            let content = token
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| json.missing(&format!("{field}.content")))?;
            let mut a = if json.bool(token, "special", &field, false)? || looks_special(content) {
                attr::CONTROL
            } else {
                attr::USER_DEFINED
            };
            if json.bool(token, "lstrip", &field, false)? {
                a |= attr::LSTRIP;
            }
            if json.bool(token, "rstrip", &field, false)? {
                a |= attr::RSTRIP;
            }
            added_tokens.push((id, content, a));
        }
        let present = check.entries + added_tokens.len();
        let n = (check.max_id.into_iter())
            .chain(added_tokens.iter().map(|t| t.0))
            .map(|id| id as usize + 1)
            .max()
            .unwrap_or(0);
        if n > present + MAX_HOLES {
            return Err(json.invalid(
                "model.vocab",
                format!(
                    "with added_tokens has {present} tokens but ids up to {}; at most {MAX_HOLES} ids may be unused",
                    n - 1
                ),
            ));
        }
        if !sections.merges {
            return Err(json.missing("model.merges"));
        }
        if let Some((i, m)) = &check.bad_merge {
            return Err(json.invalid(
                format!("model.merges[{i}]"),
                format!("is {m}, not a pair of tokens"),
            ));
        }

        let mut spec = PreSpec::default();
        match root.get("pre_tokenizer") {
            None | Some(Value::Null) => {}
            Some(pre) => read_pre(&json, pre, "pre_tokenizer", &mut spec)?,
        }
        if !spec.byte_level {
            return Err(json.invalid(
                "pre_tokenizer",
                "has no ByteLevel step; fathom reads byte-level BPE tokenizers",
            ));
        }
        let pre =
            PreTokenizer::new(&spec.patterns).map_err(|e| json.invalid("pre_tokenizer", e))?;

        // The second pass: every token at its id, the merges in order.
        let mut place = Place {
            texts: vec![String::new(); n],
            attrs: vec![attr::UNUSED; n],
            merges: Vec::with_capacity(check.merges),
        };
        tokenizer_json::read(&bytes, &mut place).map_err(json_error)?;
        drop(bytes);
        let Place {
            mut texts,
            mut attrs,
            merges,
        } = place;
        // An added token replaces the vocabulary entry of the same id.
        for (id, content, a) in added_tokens {
            texts[id as usize] = content.to_string();
            attrs[id as usize] = a;
        }
        // Holes in the id space get placeholders, as the GGUF converter writes.
        for (i, (text, a)) in texts.iter_mut().zip(&attrs).enumerate() {
            if *a == attr::UNUSED {
                *text = format!("[PAD{i}]");
            }
        }

        // tokenizer_config.json: BOS/EOS, add_bos_token, the chat template.
        let config = Json::read(&dir.join("tokenizer_config.json"))?;
        let cfg = config.as_ref().map(|c| &c.root);
        let mut ids = SpecialIds::default();
        let mut bos_text = None;
        if let Some(config) = &config {
            for (key, slot) in [("bos_token", &mut ids.bos), ("eos_token", &mut ids.eos)] {
                if let Some(text) = token_content(config.root.get(key)) {
                    let id = texts.iter().position(|t| t == text).ok_or_else(|| {
                        config.invalid(key, format!("is {text:?}, which is not in {}", json.file))
                    })?;
                    *slot = Some(id as u32);
                    if key == "bos_token" {
                        bos_text = Some(text);
                    }
                }
            }
        }
        let add_bos = match cfg.and_then(|c| c.get("add_bos_token")) {
            Some(Value::Bool(b)) => *b,
            _ => match (root.get("post_processor"), bos_text) {
                (Some(post), Some(bos)) => template_adds(post, bos),
                _ => false,
            },
        };
        let chat_template = match cfg.and_then(|c| c.get("chat_template")) {
            Some(Value::String(s)) => Some(s.clone()),
            // Named templates: the default one, else the first.
            Some(Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => {
                let path = dir.join("chat_template.jinja");
                match std::fs::read_to_string(&path) {
                    Ok(s) => Some(s),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(source) => {
                        return Err(TokenizerError::Io {
                            file: path.display().to_string(),
                            source,
                        })
                    }
                }
            }
        };

        Tokenizer::build(Parts {
            file: json.file.clone(),
            tokens_field: "model.vocab",
            texts,
            attrs,
            model: ModelParts::Bpe {
                merges,
                merges_field: "model.merges",
                pre,
                ignore_merges: json.bool(model, "ignore_merges", "model", false)?,
                add_prefix_space: spec.add_prefix_space,
                escaped_spaces: false,
            },
            ids,
            add_bos,
            rstrip_specials: false,
            chat_template,
        })
    }
}
