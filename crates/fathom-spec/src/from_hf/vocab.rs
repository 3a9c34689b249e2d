//! The vocabulary of a Hugging Face directory's `tokenizer.json`, counted
//! for the plan's runtime term the way `fathom_tokenizer`'s HF reader will
//! hold it: every token's text at its id (added tokens included, unused ids
//! as `[PAD{id}]` placeholders) and every merge's two parts, while the
//! file's bytes are alive.

use std::borrow::Cow;

use fathom_checkpoint::tokenizer_json::{self, merge_parts, Sink};
use fathom_checkpoint::HfCheckpoint;
use serde_json::Value;

use crate::{string_heap_bytes, VocabHeader};

/// Counts of what the tokenizer keeps of the vocabulary and merges; entries
/// it would refuse count nothing (it then refuses the file).
#[derive(Default)]
struct Count {
    /// Token texts placed, added tokens included; an id given twice counts
    /// twice (its first text, freed when replaced, stands in for the
    /// placeholder its hole would not get).
    texts: u64,
    max_id: Option<u64>,
    text_bytes: u64,
    text_chunks: u64,
    merges: u64,
    merge_bytes: u64,
    merge_part_chunks: u64,
}

impl Count {
    fn text(&mut self, text: &str, id: u64) {
        let len = text.len() as u64;
        self.texts += 1;
        self.max_id = self.max_id.max(Some(id));
        self.text_bytes = self.text_bytes.saturating_add(len);
        self.text_chunks = self.text_chunks.saturating_add(string_heap_bytes(len));
    }
}

impl<'a> Sink<'a> for Count {
    fn token(&mut self, text: Cow<'a, str>, id: Value) {
        if let Some(id) = id.as_u64() {
            self.text(&text, id);
        }
    }

    fn merge(&mut self, merge: Value) {
        if let Some((left, right)) = merge_parts(&merge) {
            let (l, r) = (left.len() as u64, right.len() as u64);
            self.merges += 1;
            self.merge_bytes = self.merge_bytes.saturating_add(l + 1 + r);
            self.merge_part_chunks = self
                .merge_part_chunks
                .saturating_add(string_heap_bytes(l) + string_heap_bytes(r));
        }
    }
}

/// The header of `checkpoint`'s `tokenizer.json`: all zero (the plan's
/// per-entry allowance) when there is none or it has no vocabulary, with a
/// note when it cannot be read.
pub(super) fn header(checkpoint: &HfCheckpoint, notes: &mut Vec<String>) -> VocabHeader {
    let text = match checkpoint.tokenizer_json() {
        Ok(Some(text)) => text,
        Ok(None) => return VocabHeader::default(),
        Err(e) => {
            notes.push(format!(
                "{e}: the runtime term counts the vocabulary by the per-entry allowance"
            ));
            return VocabHeader::default();
        }
    };
    let mut count = Count::default();
    let sections = match tokenizer_json::read(text.as_bytes(), &mut count) {
        Ok(sections) => sections,
        Err(e) => {
            notes.push(format!(
                "{}: not valid JSON ({e}): the runtime term counts the vocabulary by the \
                 per-entry allowance",
                checkpoint.dir.join("tokenizer.json").display()
            ));
            return VocabHeader::default();
        }
    };
    let added = sections.root.get("added_tokens").and_then(Value::as_array);
    for token in added.into_iter().flatten() {
        let id = token.get("id").and_then(Value::as_u64);
        let content = token.get("content").and_then(Value::as_str);
        if let (Some(id), Some(content)) = (id, content) {
            count.text(content, id);
        }
    }
    let Some(max_id) = count.max_id else {
        return VocabHeader::default();
    };
    let tokens = max_id.saturating_add(1);
    // The longest placeholder stands for each.
    let holes = tokens.saturating_sub(count.texts);
    let placeholder = format!("[PAD{max_id}]").len() as u64;
    VocabHeader {
        tokens,
        token_bytes: count
            .text_bytes
            .saturating_add(holes.saturating_mul(placeholder)),
        token_arrays: 0,
        merges: count.merges,
        merge_bytes: count.merge_bytes,
        scores_kept: false,
        token_chunks: count
            .text_chunks
            .saturating_add(holes.saturating_mul(string_heap_bytes(placeholder))),
        merge_chunks: 0,
        merge_part_chunks: count.merge_part_chunks,
        tokenizer_json_bytes: text.len() as u64,
    }
}
