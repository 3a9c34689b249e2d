//! The `logprobs` object of a response, in OpenAI's two shapes: chat's
//! `{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal":
//! null}`, and
//! the legacy completions object of parallel arrays `tokens`,
//! `token_logprobs`, `top_logprobs` and `text_offset`.
//!
//! A token's `token` is its text (bytes that are not whole UTF-8 become
//! U+FFFD) and `bytes` its raw bytes, so a client can rebuild characters
//! split across tokens. A streamed response renders each piece's tokens as
//! they arrive; a whole response [`join`]s the pieces.

use std::sync::Arc;

use fathom_engine::{TokenLogprob, Tokenizer};
use serde_json::{json, Map, Value};

use crate::api::Route;

/// Renders one response's logprobs, piece by piece.
pub struct LogprobsWriter {
    route: Route,
    tokenizer: Arc<Tokenizer>,
    /// Characters of the response's text before the next token: the
    /// legacy `text_offset`, counted over the tokens' texts.
    offset: usize,
}

impl LogprobsWriter {
    pub fn new(route: Route, tokenizer: Arc<Tokenizer>) -> Self {
        LogprobsWriter {
            route,
            tokenizer,
            offset: 0,
        }
    }

    /// The object with no tokens.
    pub fn empty(&self) -> Value {
        match self.route {
            // OpenAI's chat object also carries `refusal` (the logprobs of
            // a refusal message, which a local model never sends).
            Route::Chat => json!({"content": [], "refusal": null}),
            Route::Completion => json!({
                "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [],
            }),
        }
    }

    /// The prompt's tokens, for an echo (completions): the first has no
    /// logprob, as nothing predicts it. The tokens after them are offset
    /// from the end of `echoed`, the prompt as the response's text shows
    /// it.
    pub fn prompt(&mut self, first: u32, rest: &[TokenLogprob], echoed: &str) -> Value {
        let mut v = self.empty();
        self.push_legacy(&mut v, first, None);
        for entry in rest {
            self.push_legacy(&mut v, entry.token, Some(entry));
        }
        self.offset = echoed.chars().count();
        v
    }

    /// Generated tokens.
    pub fn generated(&mut self, entries: &[TokenLogprob]) -> Value {
        let mut v = self.empty();
        for entry in entries {
            match self.route {
                Route::Chat => {
                    let mut e = self.alternative(entry.token, entry.logprob);
                    e["top_logprobs"] = entry
                        .top
                        .iter()
                        .map(|&(t, lp)| self.alternative(t, lp))
                        .collect();
                    push(&mut v, "content", e);
                }
                Route::Completion => self.push_legacy(&mut v, entry.token, Some(entry)),
            }
        }
        v
    }

    fn text(&self, token: u32) -> String {
        String::from_utf8_lossy(self.tokenizer.token_bytes(token)).into_owned()
    }

    /// Chat's `{"token", "logprob", "bytes"}`.
    fn alternative(&self, token: u32, logprob: f64) -> Value {
        json!({
            "token": self.text(token),
            "logprob": logprob,
            "bytes": self.tokenizer.token_bytes(token),
        })
    }

    /// One token of the legacy object: its `top_logprobs` entry maps each
    /// alternative's text to its logprob, with the token itself added
    /// when it is not among them (OpenAI's "up to logprobs + 1"); of
    /// alternatives with the same text, the likelier is kept.
    fn push_legacy(&mut self, v: &mut Value, token: u32, entry: Option<&TokenLogprob>) {
        let text = self.text(token);
        let top = entry.map_or(Value::Null, |e| {
            let mut top = Map::new();
            for &(t, lp) in e.top.iter().chain([(e.token, e.logprob)].iter()) {
                top.entry(self.text(t)).or_insert(json!(lp));
            }
            Value::Object(top)
        });
        push(v, "token_logprobs", json!(entry.map(|e| e.logprob)));
        push(v, "top_logprobs", top);
        push(v, "text_offset", json!(self.offset));
        self.offset += text.chars().count();
        push(v, "tokens", Value::String(text));
    }
}

fn push(v: &mut Value, key: &str, item: Value) {
    if let Some(list) = v.get_mut(key).and_then(Value::as_array_mut) {
        list.push(item);
    }
}

/// Appends `more`'s arrays to `into`'s: the pieces of one response.
pub fn join(into: &mut Value, more: Value) {
    let (Value::Object(into), Value::Object(more)) = (into, more) else {
        return;
    };
    for (key, value) in more {
        if let (Some(Value::Array(list)), Value::Array(items)) = (into.get_mut(&key), value) {
            list.extend(items);
        }
    }
}
