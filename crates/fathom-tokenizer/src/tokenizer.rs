//! The tokenizer proper: vocabulary, special tokens, BPE and SentencePiece
//! encoding, and token pieces.
//!
//! Everything here follows llama.cpp's `llama-vocab.cpp` step for step
//! (special-token partitioning, the merge queue and its tie-breaking, the
//! SentencePiece space prefix, the end-of-generation inference), because the
//! contract is "the same ids as llama.cpp for the same GGUF file".

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::ops::Range;

use crate::pretok::PreTokenizer;
use crate::unicode::{char_byte, BYTE_CHARS};
use crate::TokenizerError;

/// Token attributes, as llama.cpp's `llama_token_attr` bits; a token with
/// none of them is "undefined".
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
    /// fathom's own: a control token whose text decoding keeps (see
    /// [`super::HARMONY_MARKERS`]).
    pub const SHOWN: u16 = 1 << 9;
}

/// Token texts that end a turn in some chat format; llama.cpp infers EOT
/// from them when the metadata names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
];
/// Token texts that end generation whatever the metadata says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    // Gemma 4: the end of the text, of a turn, and a tool call handing over
    // to its response.
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    // gpt-oss (o200k_harmony): the answer is done, or hands over to a tool.
    "<|return|>",
    "<|call|>",
];
/// The message structure of gpt-oss's harmony format (o200k_harmony).
/// The answer is several messages (reasoning, then the reply or a tool
/// call), so the server must see these markers: decoding keeps their text,
/// as llama.cpp's vocabulary does by making them user-defined. They stay
/// control tokens for encoding, so message content that spells them out
/// stays text. `<|end|>` closes each message, not the answer: with
/// `<|return|>` and `<|call|>` present it does not end generation
/// (llama.cpp's rule too).
const HARMONY_MARKERS: &[&str] = &[
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Special token ids as the metadata gives them (already range-checked).
#[derive(Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) enum ModelParts {
    Bpe {
        /// `(left, right)` in rank order.
        merges: Vec<(String, String)>,
        merges_field: &'static str,
        pre: PreTokenizer,
        ignore_merges: bool,
        /// HF `ByteLevel(add_prefix_space=true)`: a space before each text
        /// fragment that does not start with one.
        add_prefix_space: bool,
        /// SentencePiece-style BPE (Gemma 4): the vocabulary spells text
        /// as UTF-8 with spaces as `▁`, merges start from characters, and a
        /// character without a token becomes its `<0xXX>` byte tokens.
        escaped_spaces: bool,
    },
    Spm {
        scores: Vec<f32>,
        add_space_prefix: bool,
    },
}

/// A tokenizer as read from a file, before the tables are built.
pub(crate) struct Parts {
    pub file: String,
    pub tokens_field: &'static str,
    pub texts: Vec<String>,
    pub attrs: Vec<u16>,
    pub model: ModelParts,
    pub ids: SpecialIds,
    pub add_bos: bool,
    /// Phi-3 strips spaces after its special tokens (llama.cpp keys this
    /// on the model name).
    pub rstrip_specials: bool,
    pub chat_template: Option<String>,
}

// The sizes the plan's runtime term counts for the tokenizer's tables
// (fathom_plan::device::vocab_heap): a token text, an id map slot, a merge
// table slot and a merge as read.
const _: () = assert!(std::mem::size_of::<String>() == 24);
const _: () = assert!(std::mem::size_of::<(String, u32)>() == 32);
const _: () = assert!(std::mem::size_of::<((u32, u32), (u32, u32))>() == 16);
const _: () = assert!(std::mem::size_of::<(String, String)>() == 48);

struct Bpe {
    /// `(left, right)` token ids to `(rank, merged id)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// The token of each byte: its byte-level character's, or with
    /// `escaped_spaces` its `<0xXX>` token.
    byte_tokens: [Option<u32>; 256],
    pre: PreTokenizer,
    ignore_merges: bool,
    add_prefix_space: bool,
    escaped_spaces: bool,
}

struct Spm {
    scores: Vec<f32>,
    /// The `<0xXX>` token of each byte (or the byte itself as a token).
    byte_tokens: [Option<u32>; 256],
    add_space_prefix: bool,
}

enum Model {
    Bpe(Bpe),
    Spm(Spm),
}

/// A byte trie over the special tokens' texts, to find which of them occur
/// in a text in one pass instead of one substring search per token (some
/// vocabularies have thousands of user-defined tokens).
#[derive(Default)]
struct Trie {
    edges: HashMap<(u32, u8), u32>,
    /// Node to the index in `Tokenizer::specials` of the token ending there.
    ends: HashMap<u32, usize>,
    nodes: u32,
}

impl Trie {
    fn insert(&mut self, text: &[u8], index: usize) {
        let mut node = 0;
        for &b in text {
            node = match self.edges.get(&(node, b)) {
                Some(&next) => next,
                None => {
                    self.nodes += 1;
                    self.edges.insert((node, b), self.nodes);
                    self.nodes
                }
            };
        }
        self.ends.insert(node, index);
    }

    /// Which specials occur somewhere in `text`.
    fn present(&self, text: &[u8], n_specials: usize) -> Vec<bool> {
        let mut present = vec![false; n_specials];
        for start in 0..text.len() {
            let mut node = 0;
            for &b in &text[start..] {
                match self.edges.get(&(node, b)) {
                    Some(&next) => node = next,
                    None => break,
                }
                if let Some(&index) = self.ends.get(&node) {
                    present[index] = true;
                }
            }
        }
        present
    }
}

/// A text split around special tokens.
enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// A tokenizer: GGUF BPE (`gpt2`) or SentencePiece (`llama`), or a Hugging
/// Face byte-level BPE `tokenizer.json`, producing llama.cpp's token ids.
pub struct Tokenizer {
    texts: Vec<String>,
    attrs: Vec<u16>,
    ids: HashMap<String, u32>,
    model: Model,
    /// Tokens split out of text before the model sees it: control,
    /// user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    trie: Trie,
    /// Every token's piece as llama.cpp prints it with `special = true`,
    /// concatenated; `piece_ends[i]` is where token `i`'s ends.
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// SentencePiece's stand-in for a byte the vocabulary cannot spell.
    unk: Option<u32>,
    add_bos: bool,
    eog: BTreeSet<u32>,
    chat_template: Option<String>,
    /// The most input bytes one token can stand for (its piece for BPE, its
    /// text for SentencePiece): n bytes of text are at least n / this tokens.
    max_token_bytes: usize,
}

/// How [`Tokenizer::encode_bounded`] treats the texts of control tokens
/// (and unknown tokens) found in its input. User-defined tokens are always
/// matched.
#[derive(Debug, Clone, Copy)]
pub enum Special<'a> {
    /// They become their token ids.
    Parse,
    /// They stay text.
    Plain,
    /// They stay text inside these byte ranges of the input (text a user
    /// wrote) and become their ids elsewhere (a chat template's markers).
    PlainIn(&'a [Range<usize>]),
}

/// The input holds more tokens than the limit asked of
/// [`Tokenizer::encode_bounded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyTokens {
    pub limit: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_name())
            .field("vocab_size", &self.texts.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("end_of_generation", &self.eog)
            .finish_non_exhaustive()
    }
}

fn invalid(file: &str, field: String, problem: String) -> TokenizerError {
    TokenizerError::Invalid {
        file: file.to_string(),
        field,
        problem,
    }
}

/// Sets `slot` to the lowest-id token among `candidates` when the metadata
/// left it unset, and makes that token a control token as llama.cpp does.
fn infer(
    slot: &mut Option<u32>,
    candidates: &[&str],
    ids: &HashMap<String, u32>,
    attrs: &mut [u16],
) {
    if slot.is_some() {
        return;
    }
    *slot = candidates.iter().filter_map(|t| ids.get(*t).copied()).min();
    if let Some(id) = *slot {
        make_control(attrs, id);
    }
}

fn make_control(attrs: &mut [u16], id: u32) {
    if let Some(a) = attrs.get_mut(id as usize) {
        if *a & attr::CONTROL == 0 {
            *a = attr::CONTROL;
        }
    }
}

impl Tokenizer {
    pub(crate) fn build(parts: Parts) -> Result<Tokenizer, TokenizerError> {
        let Parts {
            file,
            tokens_field,
            mut texts,
            mut attrs,
            model,
            ids: mut special,
            add_bos,
            rstrip_specials,
            chat_template,
        } = parts;
        if texts.is_empty() {
            return Err(invalid(&file, tokens_field.into(), "is empty".into()));
        }
        if texts.len() > i32::MAX as usize {
            return Err(invalid(
                &file,
                tokens_field.into(),
                format!("has {} tokens, more than ids can address", texts.len()),
            ));
        }
        let mut ids = HashMap::with_capacity(texts.len());
        for (i, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{i}]");
            }
            if let Some(first) = ids.insert(text.clone(), i as u32) {
                return Err(invalid(
                    &file,
                    format!("{tokens_field}[{i}]"),
                    format!("{text:?} repeats token {first}"),
                ));
            }
        }

        infer(&mut special.eot, EOT_TEXTS, &ids, &mut attrs);
        infer(&mut special.eom, EOM_TEXTS, &ids, &mut attrs);
        infer(&mut special.fim_pre, FIM_PRE_TEXTS, &ids, &mut attrs);
        infer(&mut special.fim_suf, FIM_SUF_TEXTS, &ids, &mut attrs);
        infer(&mut special.fim_mid, FIM_MID_TEXTS, &ids, &mut attrs);
        infer(&mut special.fim_pad, FIM_PAD_TEXTS, &ids, &mut attrs);
        infer(&mut special.fim_rep, FIM_REP_TEXTS, &ids, &mut attrs);
        infer(&mut special.fim_sep, FIM_SEP_TEXTS, &ids, &mut attrs);
        let mut eog = BTreeSet::new();
        eog.extend(
            [special.fim_pad, special.fim_rep, special.fim_sep]
                .into_iter()
                .flatten(),
        );
        for text in EOG_TEXTS {
            if let Some(&id) = ids.get(*text) {
                eog.insert(id);
                make_control(&mut attrs, id);
            }
        }
        eog.extend(
            [special.eos, special.eot, special.eom]
                .into_iter()
                .flatten(),
        );
        if ids.contains_key("<|return|>") && ids.contains_key("<|call|>") {
            for text in HARMONY_MARKERS {
                if let Some(&id) = ids.get(*text) {
                    eog.remove(&id);
                    make_control(&mut attrs, id);
                    attrs[id as usize] |= attr::SHOWN;
                }
            }
        }

        let special_attrs = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut specials: Vec<u32> = (0..texts.len() as u32)
            .filter(|&id| attrs[id as usize] & special_attrs != 0)
            .collect();
        specials.sort_by_key(|&id| (Reverse(texts[id as usize].len()), id));
        if rstrip_specials {
            for &id in &specials {
                attrs[id as usize] |= attr::RSTRIP;
            }
            for (text, on) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(&id) = ids.get(text) {
                    let a = &mut attrs[id as usize];
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            }
        }
        let mut trie = Trie::default();
        for (index, &id) in specials.iter().enumerate() {
            trie.insert(texts[id as usize].as_bytes(), index);
        }

        // Byte-level BPE pieces undo the byte-level characters; the others
        // (SentencePiece, and BPE over `▁`-escaped text) turn `▁` back into
        // spaces and `<0xXX>` into bytes.
        let is_bpe = matches!(
            model,
            ModelParts::Bpe {
                escaped_spaces: false,
                ..
            }
        );
        // A piece is never longer than its token's text (byte-level
        // characters and `▁` become one byte, `<0xXX>` one byte), so the
        // texts' length is room enough: no doubling past what the plan's
        // runtime term counts.
        let mut pieces = Vec::with_capacity(texts.iter().map(String::len).sum());
        let mut piece_ends = Vec::with_capacity(texts.len());
        for (text, &a) in texts.iter().zip(&attrs) {
            piece_into(text, a, is_bpe, &mut pieces);
            piece_ends.push(pieces.len());
        }

        let model = match model {
            ModelParts::Bpe {
                merges,
                merges_field,
                pre,
                ignore_merges,
                add_prefix_space,
                escaped_spaces,
            } => {
                let mut table = HashMap::with_capacity(merges.len());
                for (rank, (left, right)) in merges.iter().enumerate() {
                    let lookup = |text: &str, what: &str| {
                        ids.get(text).copied().ok_or_else(|| {
                            invalid(
                                &file,
                                format!("{merges_field}[{rank}]"),
                                format!("has {what} {text:?}, which is not in the vocabulary"),
                            )
                        })
                    };
                    let l = lookup(left, "left part")?;
                    let r = lookup(right, "right part")?;
                    let merged = lookup(&format!("{left}{right}"), "merged token")?;
                    // A repeated pair keeps its first (best) rank.
                    table.entry((l, r)).or_insert((rank as u32, merged));
                }
                let byte_tokens = std::array::from_fn(|b| {
                    if escaped_spaces {
                        ids.get(&format!("<0x{b:02X}>")).copied()
                    } else {
                        ids.get(BYTE_CHARS[b].encode_utf8(&mut [0; 4]) as &str)
                            .copied()
                    }
                });
                Model::Bpe(Bpe {
                    merges: table,
                    byte_tokens,
                    pre,
                    ignore_merges,
                    add_prefix_space,
                    escaped_spaces,
                })
            }
            ModelParts::Spm {
                scores,
                add_space_prefix,
            } => {
                let byte_tokens = std::array::from_fn(|b| {
                    let hex = format!("<0x{b:02X}>");
                    ids.get(&hex).copied().or_else(|| {
                        let b = b as u8;
                        b.is_ascii()
                            .then(|| ids.get(&(b as char).to_string()).copied())
                            .flatten()
                    })
                });
                Model::Spm(Spm {
                    scores,
                    byte_tokens,
                    add_space_prefix,
                })
            }
        };
        // BPE reads the input's bytes (a token stands for its piece);
        // SentencePiece reads it with spaces as `▁` (a token stands for
        // its text).
        let max_token_bytes = match &model {
            Model::Bpe(_) => piece_ends
                .iter()
                .scan(0, |start, &end| {
                    let len = end - *start;
                    *start = end;
                    Some(len)
                })
                .max(),
            Model::Spm(_) => texts.iter().map(String::len).max(),
        }
        .unwrap_or(1)
        .max(1);
        Ok(Tokenizer {
            texts,
            attrs,
            ids,
            model,
            specials,
            trie,
            pieces,
            piece_ends,
            bos: special.bos,
            eos: special.eos,
            unk: special.unk,
            add_bos,
            eog,
            chat_template,
            max_token_bytes,
        })
    }

    fn model_name(&self) -> &'static str {
        match self.model {
            Model::Bpe(_) => "bpe",
            Model::Spm(_) => "spm",
        }
    }

    /// Token ids of `text`. `add_bos` prepends BOS when the model has one
    /// (pass [`Tokenizer::add_bos`] to follow the model, as llama.cpp's
    /// `add_special` does); `parse_special` turns control-token texts in
    /// `text` into their ids. User-defined tokens are always matched, as in
    /// llama.cpp and Hugging Face.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let special = if parse_special {
            Special::Parse
        } else {
            Special::Plain
        };
        self.encode_bounded(text, add_bos, special, usize::MAX)
            .unwrap_or_default()
    }

    /// The text of a control (or unknown) token that occurs in `text`,
    /// if any: what [`Special::Parse`] would turn into a token.
    pub fn control_text_in(&self, text: &str) -> Option<&str> {
        let present = self.trie.present(text.as_bytes(), self.specials.len());
        self.specials
            .iter()
            .zip(present)
            .find(|(&id, present)| {
                *present && self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0
            })
            .map(|(&id, _)| self.texts[id as usize].as_str())
    }

    /// The most input bytes one token can stand for.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Token ids of `text`, as [`Tokenizer::encode`] gives them, unless
    /// there are more than `limit`: then the work stops as soon as that is
    /// certain. A piece of text longer than `limit` x
    /// [`Tokenizer::max_token_bytes`] is refused before it is split, so the
    /// work (and memory) is bounded by the limit, not by the input.
    pub fn encode_bounded(
        &self,
        text: &str,
        add_bos: bool,
        special: Special<'_>,
        limit: usize,
    ) -> Result<Vec<u32>, TooManyTokens> {
        let too_many = TooManyTokens { limit };
        let cap = limit.saturating_add(1).min(text.len() / 3 + 2);
        let mut out = Vec::with_capacity(cap);
        if add_bos {
            out.extend(self.bos);
        }
        // Bytes the tokens still allowed can cover.
        let room = |out: &Vec<u32>| {
            limit
                .saturating_sub(out.len())
                .saturating_mul(self.max_token_bytes)
        };
        let fragments = self.partition(text, special);
        match &self.model {
            Model::Bpe(bpe) => {
                let mut work = BpeWork::default();
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(range) => {
                            let text = &text[range];
                            if text.len() > room(&out) {
                                return Err(too_many);
                            }
                            let done = if bpe.escaped_spaces {
                                bpe.encode_fragment(
                                    &text.replace(' ', "▁"),
                                    &self.ids,
                                    &mut work,
                                    &mut out,
                                    limit,
                                )
                            } else if bpe.add_prefix_space && !text.starts_with(' ') {
                                bpe.encode_fragment(
                                    &format!(" {text}"),
                                    &self.ids,
                                    &mut work,
                                    &mut out,
                                    limit,
                                )
                            } else {
                                bpe.encode_fragment(text, &self.ids, &mut work, &mut out, limit)
                            };
                            if !done {
                                return Err(too_many);
                            }
                        }
                    }
                    if out.len() > limit {
                        return Err(too_many);
                    }
                }
            }
            Model::Spm(spm) => {
                // The first fragment and every one after a special token get
                // the leading space SentencePiece models were trained with.
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(range) => {
                            // Each space becomes a 3-byte `▁`.
                            let spaces = text[range.clone()].bytes().filter(|&b| b == b' ').count();
                            if range.len() + 2 * spaces + 3 > room(&out) {
                                return Err(too_many);
                            }
                            let mut escaped = String::with_capacity(range.len() + 4);
                            if spm.add_space_prefix && after_special {
                                escaped.push('▁');
                            }
                            escaped.push_str(&text[range].replace(' ', "▁"));
                            spm.encode(&escaped, self, &mut out);
                            after_special = false;
                        }
                    }
                    if out.len() > limit {
                        return Err(too_many);
                    }
                }
            }
        }
        if out.len() > limit {
            return Err(too_many);
        }
        Ok(out)
    }

    /// llama.cpp's `tokenizer_st_partition`: for each special token, longest
    /// first, every occurrence in the remaining text becomes that token.
    fn partition(&self, text: &str, special: Special<'_>) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(0..text.len())];
        let present = self.trie.present(text.as_bytes(), self.specials.len());
        let mut next = Vec::new();
        for (index, &id) in self.specials.iter().enumerate() {
            let a = self.attrs[id as usize];
            let control = a & (attr::CONTROL | attr::UNKNOWN) != 0;
            if !present[index] || (control && matches!(special, Special::Plain)) {
                continue;
            }
            // Occurrences of a control token inside these ranges stay text.
            let plain: &[Range<usize>] = match special {
                Special::PlainIn(ranges) if control => ranges,
                _ => &[],
            };
            let needle = self.texts[id as usize].as_str();
            next.clear();
            for fragment in fragments.drain(..) {
                let Fragment::Text(range) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let (mut start, end) = (range.start, range.end);
                let mut from = start;
                while let Some(at) = text[from..end].find(needle) {
                    let at = from + at;
                    if plain
                        .iter()
                        .any(|r| at < r.end && r.start < at + needle.len())
                    {
                        // Skip past this occurrence's first character.
                        from = at + text[at..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    let mut left_end = at;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && c_isspace(text.as_bytes()[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start..left_end));
                    }
                    next.push(Fragment::Token(id));
                    start = at + needle.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && c_isspace(text.as_bytes()[start]) {
                            start += 1;
                        }
                    }
                    from = start;
                }
                if start < end {
                    next.push(Fragment::Text(start..end));
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }

    /// The bytes of token `id` as llama.cpp's `llama_token_to_piece` gives
    /// them: byte-level characters, `▁` and `<0xXX>` undone; control and
    /// unknown tokens as their text when `special`, else empty (but for
    /// gpt-oss's harmony markers, always their text). Unused and
    /// out-of-range ids give nothing.
    pub fn piece(&self, id: u32, special: bool) -> &[u8] {
        let id = id as usize;
        let Some(&a) = self.attrs.get(id) else {
            return &[];
        };
        if !special && a & (attr::CONTROL | attr::UNKNOWN) != 0 && a & attr::SHOWN == 0 {
            return &[];
        }
        let start = id.checked_sub(1).map_or(0, |prev| self.piece_ends[prev]);
        &self.pieces[start..self.piece_ends[id]]
    }

    /// The bytes of token `id`, control tokens included as their text
    /// (llama.cpp's `common_token_to_piece` default); see [`Tokenizer::piece`].
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.piece(id, true)
    }

    /// The text of a sequence of tokens, as llama.cpp's `llama_detokenize`
    /// without its optional clean-ups: pieces joined, and for SentencePiece
    /// the space the encoder put in front taken off again.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.piece(id, special);
            let strip = i == 0 && matches!(&self.model, Model::Spm(spm) if spm.add_space_prefix);
            bytes.extend_from_slice(if strip {
                piece.strip_prefix(b" ").unwrap_or(piece)
            } else {
                piece
            });
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The vocabulary text of token `id` (byte-level or `▁` form, as stored).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether the model wants BOS in front of a prompt.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generating `id` ends the turn: EOS, EOT, EOM, the FIM
    /// pad/repo/separator tokens and the end-of-turn texts llama.cpp knows
    /// (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, `<|endoftext|>`, ...).
    pub fn end_of_generation(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Every end-of-generation token id.
    pub fn end_of_generation_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// The Jinja chat template the checkpoint ships, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp's strip uses.
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Appends the piece of a token with text `text` and attributes `a`.
fn piece_into(text: &str, a: u16, is_bpe: bool, out: &mut Vec<u8>) {
    if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        if is_bpe {
            for c in text.chars() {
                match char_byte(c) {
                    Some(b) => out.push(b),
                    // Not a byte-level character (a hand-made vocabulary):
                    // keep it as it is rather than invent bytes.
                    None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        } else {
            out.extend_from_slice(text.replace('▁', " ").as_bytes());
        }
    } else if a & attr::BYTE != 0 && !is_bpe {
        let hex = text
            .strip_prefix("<0x")
            .and_then(|t| t.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        out.extend(hex);
    }
}

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Sym {
    /// Token id, or `u32::MAX` for a byte with no token of its own.
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

/// `(rank, left, right, left id, right id, merged id)`; the heap pops the
/// lowest rank, then the leftmost pair, as llama.cpp's queue does.
type Pair = Reverse<(u32, usize, usize, u32, u32, u32)>;

#[derive(Default)]
struct BpeWork {
    syms: Vec<Sym>,
    heap: BinaryHeap<Pair>,
    encoded: String,
}

impl Bpe {
    /// Encodes `text` into `out`; false as soon as `out` holds more than
    /// `limit` tokens.
    fn encode_fragment(
        &self,
        text: &str,
        ids: &HashMap<String, u32>,
        work: &mut BpeWork,
        out: &mut Vec<u32>,
        limit: usize,
    ) -> bool {
        for word in self.pre.split(text) {
            if self.escaped_spaces {
                self.encode_chars(&text[word], ids, work, out);
            } else {
                self.encode_word(&text.as_bytes()[word], ids, work, out);
            }
            if out.len() > limit {
                return false;
            }
        }
        true
    }

    /// A word of `▁`-escaped text, merged from its characters as llama.cpp
    /// does for Gemma 4: a run of newlines that is a token is that token; a
    /// character without a token, left unmerged, becomes its bytes'
    /// `<0xXX>` tokens (or nothing, as llama.cpp drops a byte without one).
    fn encode_chars(
        &self,
        word: &str,
        ids: &HashMap<String, u32>,
        work: &mut BpeWork,
        out: &mut Vec<u32>,
    ) {
        if word.bytes().all(|b| b == b'\n') {
            if let Some(&id) = ids.get(word) {
                out.push(id);
                return;
            }
        }
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        let n = chars.len();
        work.syms.clear();
        work.syms
            .extend(chars.iter().enumerate().map(|(i, &(_, c))| {
                Sym {
                    id: ids
                        .get(c.encode_utf8(&mut [0; 4]) as &str)
                        .copied()
                        .unwrap_or(u32::MAX),
                    prev: i.checked_sub(1).unwrap_or(NONE),
                    next: if i + 1 < n { i + 1 } else { NONE },
                    alive: true,
                }
            }));
        self.merge(work);
        let mut i = if n > 0 { 0 } else { NONE };
        while i != NONE {
            match work.syms[i].id {
                u32::MAX => {
                    let (start, c) = chars[i];
                    let bytes = &word.as_bytes()[start..start + c.len_utf8()];
                    out.extend(bytes.iter().filter_map(|&b| self.byte_tokens[b as usize]));
                }
                id => out.push(id),
            }
            i = work.syms[i].next;
        }
    }

    fn push_pair(&self, syms: &[Sym], left: usize, right: usize, heap: &mut BinaryHeap<Pair>) {
        let (l, r) = (syms[left].id, syms[right].id);
        if let Some(&(rank, merged)) = self.merges.get(&(l, r)) {
            heap.push(Reverse((rank, left, right, l, r, merged)));
        }
    }

    fn encode_word(
        &self,
        word: &[u8],
        ids: &HashMap<String, u32>,
        work: &mut BpeWork,
        out: &mut Vec<u32>,
    ) {
        if self.ignore_merges {
            work.encoded.clear();
            work.encoded
                .extend(word.iter().map(|&b| BYTE_CHARS[b as usize]));
            if let Some(&id) = ids.get(&work.encoded) {
                out.push(id);
                return;
            }
        }
        let syms = &mut work.syms;
        syms.clear();
        let n = word.len();
        syms.extend(word.iter().enumerate().map(|(i, &b)| Sym {
            id: self.byte_tokens[b as usize].unwrap_or(u32::MAX),
            prev: i.checked_sub(1).unwrap_or(NONE),
            next: if i + 1 < n { i + 1 } else { NONE },
            alive: true,
        }));
        self.merge(work);
        let syms = &work.syms;
        let mut i = if n > 0 { 0 } else { NONE };
        while i != NONE {
            // A byte with no token has no single-byte text to fall back to
            // in a byte-level vocabulary, so llama.cpp drops it; so do we.
            if syms[i].id != u32::MAX {
                out.push(syms[i].id);
            }
            i = syms[i].next;
        }
    }

    /// Applies the merges to the symbols of `work`, best rank first, then
    /// leftmost, as llama.cpp's queue does.
    fn merge(&self, work: &mut BpeWork) {
        let (syms, heap) = (&mut work.syms, &mut work.heap);
        heap.clear();
        for i in 1..syms.len() {
            self.push_pair(syms, i - 1, i, heap);
        }
        while let Some(Reverse((_, left, right, l, r, merged))) = heap.pop() {
            let (ls, rs) = (syms[left], syms[right]);
            // Stale: one side was merged away or grew since this was queued.
            if !ls.alive || !rs.alive || ls.id != l || rs.id != r {
                continue;
            }
            syms[left].id = merged;
            syms[left].next = rs.next;
            syms[right].alive = false;
            if rs.next != NONE {
                syms[rs.next].prev = left;
            }
            if ls.prev != NONE {
                self.push_pair(syms, ls.prev, left, heap);
            }
            if rs.next != NONE {
                self.push_pair(syms, left, rs.next, heap);
            }
        }
    }
}

struct SpmSym {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    /// Highest score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl Spm {
    fn try_bigram(
        &self,
        text: &str,
        syms: &[SpmSym],
        left: usize,
        right: usize,
        ids: &HashMap<String, u32>,
        heap: &mut BinaryHeap<Bigram>,
    ) {
        if left == NONE || right == NONE {
            return;
        }
        let start = syms[left].start;
        let size = syms[left].len + syms[right].len;
        let Some(&id) = ids.get(&text[start..start + size]) else {
            return;
        };
        heap.push(Bigram {
            score: self.scores.get(id as usize).copied().unwrap_or(0.0),
            left,
            right,
            size,
        });
    }

    /// llama.cpp's SentencePiece merge: repeatedly join the adjacent pair
    /// whose joined text is the best-scoring token; leftovers become byte
    /// tokens (`<0xXX>`), or UNK when the vocabulary has no byte tokens.
    fn encode(&self, text: &str, tok: &Tokenizer, out: &mut Vec<u32>) {
        let mut syms: Vec<SpmSym> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let i = syms.len();
            syms.push(SpmSym {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1).unwrap_or(NONE),
                next: if start + c.len_utf8() < text.len() {
                    i + 1
                } else {
                    NONE
                },
            });
        }
        let mut heap = BinaryHeap::new();
        for i in 1..syms.len() {
            self.try_bigram(text, &syms, i - 1, i, &tok.ids, &mut heap);
        }
        while let Some(bigram) = heap.pop() {
            let (left, right) = (bigram.left, bigram.right);
            if syms[left].len == 0
                || syms[right].len == 0
                || syms[left].len + syms[right].len != bigram.size
            {
                continue;
            }
            syms[left].len += syms[right].len;
            syms[right].len = 0;
            let next = syms[right].next;
            syms[left].next = next;
            if next != NONE {
                syms[next].prev = left;
            }
            let prev = syms[left].prev;
            self.try_bigram(text, &syms, prev, left, &tok.ids, &mut heap);
            self.try_bigram(text, &syms, left, next, &tok.ids, &mut heap);
        }
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let sym = &syms[i];
            let piece = &text[sym.start..sym.start + sym.len];
            match tok.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.extend(self.byte_tokens[b as usize].or(tok.unk));
                    }
                }
            }
            i = sym.next;
        }
    }
}
