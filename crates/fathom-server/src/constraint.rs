//! Constrained decoding: a request's JSON schema or grammar compiled by
//! `llguidance` against the model's vocabulary, and per generated token
//! the mask of the tokens it allows next.
//!
//! One [`Constraints`] is built per model (the token trie of the
//! vocabulary, the compile options and limits, a cache of compiled
//! grammars); each constrained request gets a [`ConstraintState`] that
//! the scheduler asks for a mask before sampling and tells each sampled
//! token. The limits bound what a hostile schema can cost: grammar size
//! and lexer-building fuel at compile time, lexer fuel and Earley items
//! per mask, lexer states per request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fathom_engine::{TokenMask, Tokenizer};

use crate::reasoning::ThinkingBlock;
use crate::string_format;
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;
use toktrie::{ApproximateTokEnv, InferenceCapabilities, TokRxInfo, TokTrie};

/// Grammars compiled and kept for reuse (by their text).
pub const CACHE_ENTRIES: usize = fathom_plan::serve::CONSTRAINT_CACHE_ENTRIES as usize;
/// Lexer states one request's constraint may build (llguidance's
/// `max_lexer_states`), as the plan's `constraints` term counts them.
pub const MAX_LEXER_STATES: usize = fathom_plan::serve::CONSTRAINT_LEXER_STATES as usize;
/// Earley items one mask may create (llguidance's `step_max_items`, about
/// 20 per microsecond): about a millisecond.
pub const STEP_MAX_ITEMS: usize = 20_000;
/// Lexer fuel one mask may spend (about 14 per microsecond): about 7 ms.
pub const STEP_LEXER_FUEL: u64 = 100_000;
/// Lexer fuel compiling one grammar may spend (about 50 per microsecond).
pub const INITIAL_LEXER_FUEL: u64 = 1_000_000;
/// Symbols a compiled grammar may hold.
pub const MAX_GRAMMAR_SIZE: usize = 200_000;
/// Earley items per row: the branching a grammar may have at one point.
pub const MAX_ITEMS_IN_ROW: usize = 2000;
/// What a request's answer must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object.
    JsonObject,
    /// A JSON value valid against the schema.
    JsonSchema(Value),
    /// A GBNF grammar (llama.cpp's format), converted to Lark.
    Gbnf(String),
    /// A grammar in llguidance's Lark syntax (the server's own, for tool calls).
    Lark(String),
    /// `then` (any text when `None`) after a thinking block: the rest of
    /// one the prompt opened, or an optional one the model opens itself;
    /// at most `reasoning` tokens of text without its close marker, then
    /// the marker ([`crate::reasoning::thinking_grammar`]).
    Thinking {
        block: ThinkingBlock,
        reasoning: usize,
        then: Option<Box<Grammar>>,
    },
}

impl Grammar {
    /// The grammar as an item of a Lark grammar: JSON as `%json {...}`,
    /// a grammar as a nested `%lark {...}`.
    fn lark_item(&self) -> Result<String, CompileError> {
        Ok(match self {
            Grammar::JsonObject => lark_json(&serde_json::json!({"type": "object"})),
            Grammar::JsonSchema(schema) => lark_json(schema),
            Grammar::Gbnf(_) | Grammar::Lark(_) | Grammar::Thinking { .. } => {
                format!("%lark {{\n{}\n}}", self.lark()?)
            }
        })
    }

    /// A GBNF, Lark or thinking grammar's Lark text.
    fn lark(&self) -> Result<String, CompileError> {
        match self {
            Grammar::Gbnf(text) => crate::gbnf::to_lark(text).map_err(|message| CompileError {
                message: format!("the grammar is not valid GBNF: {message}"),
            }),
            Grammar::Lark(text) => Ok(text.clone()),
            Grammar::Thinking {
                block,
                reasoning,
                then,
            } => {
                let then = then.as_ref().map(|g| g.lark_item()).transpose()?;
                Ok(crate::reasoning::thinking_grammar(
                    *block,
                    then.as_deref(),
                    *reasoning,
                ))
            }
            Grammar::JsonObject | Grammar::JsonSchema(_) => {
                Ok(format!("start: {}\n", self.lark_item()?))
            }
        }
    }
}

/// Why a constraint could not be compiled: a 400 naming `param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    pub message: String,
}

/// The compiler for one model's vocabulary.
pub struct Constraints {
    factory: ParserFactory,
    /// End-of-generation ids: all allowed where the grammar allows its end.
    eog: Arc<[u32]>,
    tok_eos: u32,
    /// The tokenizer's tokens: ids past them are never allowed.
    vocab: u32,
    /// Ids a mask ranges over: the model's logits (may exceed the tokenizer's vocabulary).
    mask_len: usize,
    cache: Mutex<VecDeque<(String, Matcher)>>,
}

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraints")
            .field("mask_len", &self.mask_len)
            .finish_non_exhaustive()
    }
}

/// The limits every compiled constraint runs under.
pub fn limits() -> ParserLimits {
    ParserLimits {
        max_items_in_row: MAX_ITEMS_IN_ROW,
        initial_lexer_fuel: INITIAL_LEXER_FUEL,
        step_lexer_fuel: STEP_LEXER_FUEL,
        step_max_items: STEP_MAX_ITEMS,
        max_lexer_states: MAX_LEXER_STATES,
        max_grammar_size: MAX_GRAMMAR_SIZE,
        precompute_large_lexemes: true,
        verbose_errors: false,
    }
}

/// The JSON options: compact separators with one space (`{"a": 1, "b": 2}`)
/// and no free whitespace, so a small model cannot wander into endless
/// newlines; `oneOf` read as `anyOf` (exact when the branches exclude
/// each other, as discriminated unions do).
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        coerce_one_of: true,
        ..JsonCompileOptions::default()
    }
}

impl Constraints {
    /// The token trie of `tokenizer`'s vocabulary: each token's bytes,
    /// control tokens marked special (a grammar's text never matches
    /// them), and masks over `logits_vocab` ids.
    pub fn new(tokenizer: &Tokenizer, logits_vocab: usize) -> Result<Constraints, String> {
        let n = tokenizer.vocab_size();
        let mut words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let plain = tokenizer.piece(id, false);
                let special = tokenizer.piece(id, true);
                if plain.is_empty() && !special.is_empty() {
                    let mut w = Vec::with_capacity(special.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(special);
                    w
                } else {
                    plain.to_vec()
                }
            })
            .collect();
        let eog: Vec<u32> = tokenizer.end_of_generation_ids().collect();
        let tok_eos = match tokenizer.eos().or_else(|| eog.first().copied()) {
            Some(id) => id,
            None => {
                // A vocabulary with no end token (synthetic checkpoints): a
                // virtual one past the vocabulary, which masks never allow;
                // the answer ends when the grammar allows nothing more.
                words.push(b"\xFF<|fathom-end|>".to_vec());
                n as u32
            }
        };
        let info = TokRxInfo {
            vocab_size: words.len() as u32,
            tok_eos,
            tok_bos: tokenizer.bos(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let trie = TokTrie::from(&info, &words);
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::json_slices(),
        )
        .map_err(|e| format!("building the constraint engine: {e}"))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Constraints {
            factory,
            eog: eog.into(),
            tok_eos,
            vocab: n as u32,
            mask_len: logits_vocab,
            cache: Mutex::new(VecDeque::with_capacity(CACHE_ENTRIES)),
        })
    }

    /// Ids a mask ranges over.
    pub fn mask_len(&self) -> usize {
        self.mask_len
    }

    /// Compiles `grammar` (or takes it from the cache) into a fresh state
    /// for one request.
    pub fn compile(&self, grammar: &Grammar) -> Result<ConstraintState, CompileError> {
        let started = Instant::now();
        let (key, top) = match grammar {
            Grammar::JsonObject => {
                let schema = with_json_options(serde_json::json!({"type": "object"}));
                (
                    format!("json:{schema}"),
                    TopLevelGrammar::from_json_schema(schema),
                )
            }
            Grammar::JsonSchema(schema) => {
                let schema = with_json_options(schema.clone());
                (
                    format!("json:{schema}"),
                    TopLevelGrammar::from_json_schema(schema),
                )
            }
            Grammar::Gbnf(_) | Grammar::Lark(_) | Grammar::Thinking { .. } => {
                let lark = grammar.lark()?;
                (format!("lark:{lark}"), TopLevelGrammar::from_lark(lark))
            }
        };
        let cached = {
            let cache = self.cache.lock().expect("constraint cache");
            cache
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, m)| m.deep_clone())
        };
        let (matcher, hit) = match cached {
            Some(m) => (m, true),
            None => {
                let parser = self.factory.create_parser(top).map_err(|e| CompileError {
                    message: describe(&e.to_string()),
                })?;
                let m = Matcher::new(Ok(parser));
                if let Some(e) = m.get_error() {
                    return Err(CompileError {
                        message: describe(&e),
                    });
                }
                let mut cache = self.cache.lock().expect("constraint cache");
                if cache.len() >= CACHE_ENTRIES {
                    cache.pop_front();
                }
                cache.push_back((key, m.deep_clone()));
                (m, false)
            }
        };
        Ok(ConstraintState {
            matcher,
            mask: TokenMask::default(),
            mask_len: self.mask_len,
            eog: self.eog.clone(),
            tok_eos: self.tok_eos,
            vocab: self.vocab,
            compile_time: started.elapsed(),
            cache_hit: hit,
            mask_time: Duration::ZERO,
            masks: 0,
            fresh: None,
        })
    }
}

/// `schema` carrying the server's JSON options (in its `x-guidance`), as
/// every JSON the server constrains is compiled: `response_format` and the
/// tool calls' arguments alike. The request's own `x-guidance` options are
/// removed at every depth ([`prepare_subschemas`]): a tool's `parameters`
/// become a subschema of the call's schema, where a request's options
/// would otherwise travel to the engine.
fn with_json_options(schema: Value) -> Value {
    let mut schema = match schema {
        Value::Object(_) => schema,
        // `true`/`false` schemas: wrap so the options still apply.
        other => serde_json::json!({"allOf": [other]}),
    };
    prepare_subschemas(&mut schema);
    json_options().apply_to(&mut schema);
    schema
}

/// `schema`'s string `format`s that llguidance's own table enforces too
/// loosely (the dates: [`string_format::replaces_llguidance`]) as the
/// patterns of [`string_format::regex`], where the schema gives no
/// pattern of its own; in place, in every subschema.
fn strict_formats(o: &mut serde_json::Map<String, Value>) {
    let format = o.get("format").and_then(Value::as_str);
    if let Some(rx) = format
        .filter(|f| string_format::replaces_llguidance(f) && !o.contains_key("pattern"))
        .and_then(string_format::regex)
    {
        o.shift_remove("format");
        o.insert("pattern".into(), Value::String(format!("^(?:{rx})$")));
    }
}

/// Removes the `x-guidance` keyword from `schema` and from every subschema
/// in it, wherever JSON Schema puts subschemas, and makes their date
/// formats strict ([`strict_formats`]). Keys of `properties` (and
/// the other maps of named subschemas) are names, and values of `const`,
/// `enum`, `default` and `examples` are data: a property called
/// `x-guidance` stays. Parsed request bodies nest at most 128 deep
/// (serde_json's limit), which bounds the recursion.
fn prepare_subschemas(schema: &mut Value) {
    let Value::Object(o) = schema else {
        return;
    };
    o.shift_remove("x-guidance");
    strict_formats(o);
    for (key, value) in o.iter_mut() {
        match (key.as_str(), value) {
            (
                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas",
                Value::Object(named),
            ) => named.values_mut().for_each(prepare_subschemas),
            ("allOf" | "anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(list)) => {
                list.iter_mut().for_each(prepare_subschemas)
            }
            (
                "items"
                | "additionalItems"
                | "additionalProperties"
                | "unevaluatedItems"
                | "unevaluatedProperties"
                | "contains"
                | "propertyNames"
                | "not"
                | "if"
                | "then"
                | "else",
                sub,
            ) => prepare_subschemas(sub),
            _ => {}
        }
    }
}

/// A Lark grammar's item for a JSON value valid against `schema`, written
/// with the server's JSON options ([`with_json_options`]): `%json {...}`.
pub fn lark_json(schema: &Value) -> String {
    format!("%json {}", with_json_options(schema.clone()))
}

/// `text` as a Lark string literal (JSON's escapes are Lark's).
pub fn lark_literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// llguidance's message, without its internal context lines.
fn describe(e: &str) -> String {
    let first = e.lines().next().unwrap_or(e).trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let mut out = first.chars().take(400).collect::<String>();
    if out.len() < first.len() {
        out.push_str("...");
    }
    out
}

/// One request's constraint as it decodes.
pub struct ConstraintState {
    matcher: Matcher,
    /// The mask buffer: a slot's, from the scheduler's pool
    /// ([`ConstraintState::attach_mask`]), or allocated at the first mask
    /// of a state used on its own.
    mask: TokenMask,
    /// Ids a mask ranges over.
    mask_len: usize,
    eog: Arc<[u32]>,
    tok_eos: u32,
    vocab: u32,
    /// Time compiling (or cloning from the cache) took.
    pub compile_time: Duration,
    /// Whether the compiled grammar came from the cache.
    pub cache_hit: bool,
    /// Time spent computing masks so far, and how many.
    pub mask_time: Duration,
    pub masks: u64,
    /// The outcome of a mask computed ahead (see [`ConstraintState::update_mask`]).
    fresh: Option<Result<(), String>>,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState")
            .field("masks", &self.masks)
            .finish_non_exhaustive()
    }
}

impl ConstraintState {
    /// Computes the mask of the tokens allowed next: the grammar's, every
    /// end-of-generation token where it may end (only those once it
    /// cannot go on). An error when the grammar's budget per token
    /// (lexer fuel, Earley items) is spent or it reached a dead end.
    pub fn compute_mask(&mut self) -> Result<(), String> {
        let started = Instant::now();
        if self.mask.len() != self.mask_len {
            self.mask = TokenMask::new(self.mask_len);
        }
        let result = if self.matcher.is_stopped() {
            self.mask.clear();
            Ok(())
        } else {
            match self.matcher.compute_mask() {
                Ok(vob) => {
                    let src = vob.as_slice();
                    let dst = self.mask.words_mut();
                    let n = src.len().min(dst.len());
                    dst[..n].copy_from_slice(&src[..n]);
                    dst[n..].fill(0);
                    // Bits past the mask's ids stay clear.
                    let len = self.mask.len();
                    if !len.is_multiple_of(32) {
                        if let Some(last) = self.mask.words_mut().last_mut() {
                            *last &= (1u32 << (len % 32)) - 1;
                        }
                    }
                    Ok(())
                }
                Err(e) => Err(describe(&e.to_string())),
            }
        };
        if self.matcher.is_stopped() || self.mask.allows(self.tok_eos) {
            for &id in self.eog.iter() {
                self.mask.allow(id);
            }
        }
        self.mask_time += started.elapsed();
        self.masks += 1;
        result.and_then(|()| {
            if self.mask.count() == 0 {
                Err("the constraint allows no token here".to_string())
            } else {
                Ok(())
            }
        })
    }

    /// [`ConstraintState::compute_mask`], keeping its outcome for
    /// [`ConstraintState::mask_ready`] (the scheduler computes masks on
    /// another thread while the step runs).
    pub fn update_mask(&mut self) {
        self.fresh = Some(self.compute_mask());
    }

    /// Records a mask that could not be computed: the next
    /// [`ConstraintState::mask_ready`] fails with `message`.
    pub fn fail_mask(&mut self, message: &str) {
        self.fresh = Some(Err(message.to_string()));
    }

    /// Gives the state a slot's mask buffer, planned and allocated once at
    /// start-up, so decoding allocates none; a buffer of another length
    /// comes back.
    pub fn attach_mask(&mut self, mask: TokenMask) -> Result<(), TokenMask> {
        if mask.len() != self.mask_len || self.mask.len() == self.mask_len {
            return Err(mask);
        }
        self.mask = mask;
        Ok(())
    }

    /// Takes the mask buffer back (for the pool), leaving none.
    pub fn take_mask(&mut self) -> TokenMask {
        std::mem::take(&mut self.mask)
    }

    /// The mask for the next token, computed now unless
    /// [`ConstraintState::update_mask`] did since the last token; or why
    /// there is none.
    pub fn mask_ready(&mut self) -> Result<(), String> {
        match self.fresh.take() {
            Some(result) => result,
            None => self.compute_mask(),
        }
        .map_err(|e| format!("the answer's constraint failed: {e}"))
    }

    /// Whether [`ConstraintState::update_mask`] ran since the last token.
    pub fn has_fresh_mask(&self) -> bool {
        self.fresh.is_some()
    }

    /// The mask [`ConstraintState::compute_mask`] computed.
    pub fn mask(&self) -> &TokenMask {
        &self.mask
    }

    /// Whether the constraint allows `token` next, checked for that token
    /// alone (far cheaper than a mask over the vocabulary): an
    /// end-of-generation token where the grammar may end, another token
    /// where the grammar takes it. The time counts as mask time.
    pub fn allows(&mut self, token: u32) -> Result<bool, String> {
        let started = Instant::now();
        let allowed = if self.eog.contains(&token) {
            // Where the grammar may end (what the mask's end bit says).
            self.matcher.is_stopped() || self.validate(self.tok_eos)?
        } else {
            token < self.vocab && self.validate(token)?
        };
        self.mask_time += started.elapsed();
        Ok(allowed)
    }

    fn validate(&mut self, token: u32) -> Result<bool, String> {
        match self.matcher.validate_tokens(&[token]) {
            Ok(n) => Ok(n == 1),
            Err(e) => Err(format!(
                "the answer's constraint failed: {}",
                describe(&e.to_string())
            )),
        }
    }

    /// Takes a sampled token (not an end-of-generation one).
    pub fn commit(&mut self, token: u32) -> Result<(), String> {
        self.fresh = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| describe(&e.to_string()))
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The text so far is a complete answer.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The request's `x-guidance` options, nested anywhere a subschema
    /// can be: none reach the engine; the server's stand at the top.
    #[test]
    fn a_requests_x_guidance_is_removed_at_every_depth_and_names_stay() {
        let theirs = json!({"whitespace_flexible": true, "item_separator": ",   "});
        let schema = json!({
            "type": "object",
            "x-guidance": theirs,
            "properties": {
                "a": {"type": "object", "x-guidance": theirs,
                      "properties": {"b": {"type": "array", "items": {"x-guidance": theirs}}}},
                "x-guidance": {"type": "string", "const": {"x-guidance": 1}},
            },
            "$defs": {"d": {"anyOf": [{"x-guidance": theirs}, {"not": {"x-guidance": theirs}}]}},
            "additionalProperties": {"x-guidance": theirs},
        });
        let compiled = with_json_options(schema.clone());
        let text = compiled.to_string();
        assert!(!text.contains("item_separator\":\",   "), "{text}");
        assert!(!text.contains("\"whitespace_flexible\":true"), "{text}");
        assert_eq!(
            compiled["x-guidance"],
            serde_json::to_value(json_options()).unwrap()
        );
        // A property named `x-guidance`, and data that holds the word, stay.
        assert_eq!(
            compiled["properties"]["x-guidance"],
            json!({"type": "string", "const": {"x-guidance": 1}})
        );
        // The same through a tool call's Lark item.
        let lark = lark_json(&json!({"properties": {"args": schema}}));
        assert!(!lark.contains("item_separator\":\",   "), "{lark}");
    }
}
