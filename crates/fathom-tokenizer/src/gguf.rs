//! A tokenizer from GGUF metadata (`tokenizer.ggml.*`), with llama.cpp's
//! defaults for whatever the file leaves out.

use fathom_checkpoint::tokenizer_json::split_merge;
use fathom_checkpoint::{GgufFile, MetaValue};

use crate::pretok::{self, PreTokenizer};
use crate::tokenizer::{attr, ModelParts, Parts, SpecialIds};
use crate::{Tokenizer, TokenizerError};

struct Meta<'a> {
    file: &'a GgufFile,
    name: String,
}

impl<'a> Meta<'a> {
    fn invalid(&self, field: impl Into<String>, problem: impl Into<String>) -> TokenizerError {
        TokenizerError::Invalid {
            file: self.name.clone(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn missing(&self, field: &str) -> TokenizerError {
        TokenizerError::Missing {
            file: self.name.clone(),
            field: field.into(),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "is not a string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "is not a bool")),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a [MetaValue]>, TokenizerError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "is not an array")),
        }
    }

    /// An array of `n` elements (as the token list), if present.
    fn array_of_len(&self, key: &str, n: usize) -> Result<Option<&'a [MetaValue]>, TokenizerError> {
        let values = self.array(key)?;
        if let Some(values) = values {
            if values.len() != n {
                return Err(self.invalid(
                    key,
                    format!(
                        "has {} entries, but tokenizer.ggml.tokens has {n}",
                        values.len()
                    ),
                ));
            }
        }
        Ok(values)
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
        let Some(values) = self.array(key)? else {
            return Ok(None);
        };
        exact(values.iter().enumerate().map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| self.invalid(format!("{key}[{i}]"), "is not a string"))
        }))
        .map(Some)
    }

    /// A token id that must name one of the `n` tokens.
    fn id(&self, key: &str, n: usize) -> Result<Option<u32>, TokenizerError> {
        let Some(v) = self.file.get(key) else {
            return Ok(None);
        };
        let id = v
            .as_u64()
            .ok_or_else(|| self.invalid(key, format!("is {v:?}, not a token id")))?;
        if id >= n as u64 {
            return Err(self.invalid(key, format!("is {id}, but the vocabulary has {n} tokens")));
        }
        Ok(Some(id as u32))
    }
}

/// Collects `items` into a vector of exactly their number: collecting
/// `Result`s directly grows the vector by doubling (the iterator's lower
/// bound is 0), up to twice the bytes the runtime term counts for the
/// token and merge lists.
fn exact<T, E>(items: impl ExactSizeIterator<Item = Result<T, E>>) -> Result<Vec<T>, E> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(item?);
    }
    Ok(out)
}

/// GGUF token types (`llama_token_type`) to attributes.
fn token_attr(ty: u64) -> Option<u16> {
    Some(match ty {
        0 => 0,
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => return None,
    })
}

const TOKENS: &str = "tokenizer.ggml.tokens";
const MERGES: &str = "tokenizer.ggml.merges";

impl Tokenizer {
    /// Reads the tokenizer a GGUF file embeds: `tokenizer.ggml.model` is
    /// `gpt2` (byte-level BPE, pre-tokenizer from `tokenizer.ggml.pre`),
    /// `gemma4` (BPE over UTF-8 with spaces as `▁` and `<0xXX>` byte
    /// fallback) or `llama` (SentencePiece with scores and `<0xXX>` byte
    /// fallback).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let meta = Meta {
            file,
            name: file.path.display().to_string(),
        };
        let model = meta
            .str("tokenizer.ggml.model")?
            .ok_or_else(|| meta.missing("tokenizer.ggml.model"))?;
        let texts = meta.strings(TOKENS)?.ok_or_else(|| meta.missing(TOKENS))?;
        let n = texts.len();
        let attrs = match meta.array_of_len("tokenizer.ggml.token_type", n)? {
            None => vec![attr::NORMAL; n],
            Some(types) => exact(types.iter().enumerate().map(|(i, v)| {
                v.as_u64().and_then(token_attr).ok_or_else(|| {
                    meta.invalid(
                        format!("tokenizer.ggml.token_type[{i}]"),
                        format!("is {v:?}; token types are 0 (undefined) to 6 (byte)"),
                    )
                })
            }))?,
        };

        let merges = || -> Result<Vec<(String, String)>, TokenizerError> {
            let lines = meta.array(MERGES)?.ok_or_else(|| meta.missing(MERGES))?;
            exact(lines.iter().enumerate().map(|(i, v)| {
                let field = || format!("{MERGES}[{i}]");
                let line = v
                    .as_str()
                    .ok_or_else(|| meta.invalid(field(), "is not a string"))?;
                let (left, right) = split_merge(line).ok_or_else(|| {
                    meta.invalid(
                        field(),
                        format!("is {line:?}, not two tokens separated by a space"),
                    )
                })?;
                Ok((left.to_string(), right.to_string()))
            }))
        };
        // llama.cpp adds BOS for Gemma 4 even where the file says not to.
        let mut force_bos = false;
        let (model, add_bos, mut ids) = match model {
            "gpt2" => {
                let merges = merges()?;
                let pre_name = meta.str("tokenizer.ggml.pre")?;
                let named = pretok::named(pre_name).ok_or_else(|| {
                    meta.invalid(
                        "tokenizer.ggml.pre",
                        format!(
                            "is {:?}; known pre-tokenizers: {}",
                            pre_name.unwrap_or(""),
                            pretok::NAMES
                        ),
                    )
                })?;
                let pre = PreTokenizer::new(named.patterns)
                    .map_err(|e| meta.invalid("tokenizer.ggml.pre", e))?;
                let model = ModelParts::Bpe {
                    merges,
                    merges_field: MERGES,
                    pre,
                    ignore_merges: named.ignore_merges,
                    add_prefix_space: false,
                    escaped_spaces: false,
                };
                (model, named.add_bos, SpecialIds::default())
            }
            // Gemma 4: BPE over the text with spaces as `▁`, split only
            // between runs of newlines and the rest, whatever
            // `tokenizer.ggml.pre` says (llama.cpp's `gemma4` pre-type).
            "gemma4" => {
                let pre = PreTokenizer::new(&[pretok::NEWLINE_RUNS])
                    .map_err(|e| meta.invalid("tokenizer.ggml.model", e))?;
                let model = ModelParts::Bpe {
                    merges: merges()?,
                    merges_field: MERGES,
                    pre,
                    ignore_merges: false,
                    add_prefix_space: false,
                    escaped_spaces: true,
                };
                force_bos = true;
                (model, true, SpecialIds::default())
            }
            "llama" => {
                let scores = match meta.array_of_len("tokenizer.ggml.scores", n)? {
                    None => vec![0.0; n],
                    Some(values) => exact(values.iter().enumerate().map(|(i, v)| {
                        v.as_f64().map(|s| s as f32).ok_or_else(|| {
                            meta.invalid(format!("tokenizer.ggml.scores[{i}]"), "is not a number")
                        })
                    }))?,
                };
                let add_space_prefix = meta
                    .bool("tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(true);
                // SentencePiece's fixed layout: <unk>, <s>, </s>.
                let default = |id: u32| (id < n as u32).then_some(id);
                let ids = SpecialIds {
                    unk: default(0),
                    bos: default(1),
                    eos: default(2),
                    ..SpecialIds::default()
                };
                let model = ModelParts::Spm {
                    scores,
                    add_space_prefix,
                };
                (model, true, ids)
            }
            other => {
                return Err(meta.invalid(
                    "tokenizer.ggml.model",
                    format!(
                        "is {other:?}; fathom reads \"gpt2\" (BPE), \"gemma4\" (BPE over \
                         SentencePiece-style text) and \"llama\" (SentencePiece)"
                    ),
                ))
            }
        };

        for (key, slot) in [
            ("tokenizer.ggml.bos_token_id", &mut ids.bos),
            ("tokenizer.ggml.eos_token_id", &mut ids.eos),
            ("tokenizer.ggml.eot_token_id", &mut ids.eot),
            ("tokenizer.ggml.eom_token_id", &mut ids.eom),
            ("tokenizer.ggml.unknown_token_id", &mut ids.unk),
            ("tokenizer.ggml.fim_pre_token_id", &mut ids.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", &mut ids.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", &mut ids.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", &mut ids.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", &mut ids.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", &mut ids.fim_sep),
        ] {
            if let Some(id) = meta.id(key, n)? {
                *slot = Some(id);
            }
        }
        // Older names of the FIM ids, read last (so they win) as llama.cpp does.
        for (key, slot) in [
            ("tokenizer.ggml.prefix_token_id", &mut ids.fim_pre),
            ("tokenizer.ggml.suffix_token_id", &mut ids.fim_suf),
            ("tokenizer.ggml.middle_token_id", &mut ids.fim_mid),
        ] {
            if let Some(id) = meta.id(key, n)? {
                *slot = Some(id);
            }
        }
        let add_bos = force_bos
            || meta
                .bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(add_bos);
        let model_name = meta.str("general.name")?.unwrap_or("").to_lowercase();

        Tokenizer::build(Parts {
            file: meta.name.clone(),
            tokens_field: TOKENS,
            texts,
            attrs,
            model,
            ids,
            add_bos,
            rstrip_specials: model_name.contains("phi-3") || model_name.contains("phi3"),
            chat_template: meta.str("tokenizer.chat_template")?.map(str::to_string),
        })
    }
}
