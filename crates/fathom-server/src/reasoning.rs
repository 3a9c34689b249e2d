//! A thinking model's reasoning kept apart from its answer: the text
//! between the model's thinking markers goes to `reasoning_content`, the
//! rest to `content`, as llama-server (`--reasoning-format deepseek`) and
//! vLLM's reasoning parsers return it.
//!
//! The markers come from the chat template: Qwen3, Qwen3.5 and DeepSeek-R1
//! think between `<think>` and `</think>`, Gemma 4 between `<|channel>`
//! (with the channel's name, `thought`) and `<channel|>`. Both are ordinary
//! text in the output (user-defined tokens, not control tokens), so the
//! split reads the decoded text. A block counts only at the start of the
//! answer (after whitespace); when the prompt itself ends inside one (a
//! template that opens the thinking for the model) the answer starts in
//! it. Streaming holds back only what could still turn out to be a marker,
//! and the whitespace around the markers is dropped.
//!
//! gpt-oss writes OpenAI's harmony format instead: its answer is a series
//! of messages, each a header naming its channel (and, for a tool call,
//! its recipient) and a body, `<|channel|>analysis<|message|>…<|end|>
//! <|start|>assistant<|channel|>final<|message|>…<|return|>`. The
//! `analysis` channel is reasoning; `final` and `commentary` (a preamble to
//! tool calls) are content; a message with a recipient (`to=functions.f`)
//! is a tool call, passed on as written for [`crate::tools`] to read. The
//! markers are control tokens of gpt-oss's vocabulary that the tokenizer
//! decodes as their text (the same text a stand-in model writes), and none
//! of them reaches `reasoning_content` or `content`, apart from the tool
//! calls' own.

use fathom_engine::Tokenizer;

use crate::constraint::{lark_json, lark_literal, Grammar};

/// The markers of one family's thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// One block at the start of the answer, between two markers. `on`:
    /// text the start of the prompt holds when thinking is on (Gemma 4's
    /// system turn opens with `<|think|>`), for a template whose prompt
    /// says so nowhere else (after a tool result Gemma's writes no
    /// generation prompt, so no empty block says thinking is off); `None`
    /// where the prompt's end tells ([`ReasoningFormat::block`]).
    Block {
        open: &'static str,
        close: &'static str,
        on: Option<&'static str>,
    },
    /// gpt-oss's harmony messages.
    Harmony,
}

const THINK: ReasoningFormat = ReasoningFormat::Block {
    open: "<think>",
    close: "</think>",
    on: None,
};

const GEMMA4: ReasoningFormat = ReasoningFormat::Block {
    open: "<|channel>thought",
    close: "<channel|>",
    on: Some("<|think|>"),
};

/// Harmony's markers: a message's start, its header's channel and
/// constraint, the start of its body, and the three ends of a body (the
/// message's, the answer's, a tool call's).
pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const RETURN: &str = "<|return|>";
pub const CALL: &str = "<|call|>";
/// What a harmony body ends at; a new message's start ends one that the
/// model left open.
const BODY_ENDS: [&str; 4] = [END, RETURN, CALL, START];
/// Longest harmony header held back while waiting for its `<|message|>`
/// (`<|start|>assistant<|channel|>commentary to=functions.NAME
/// <|constrain|>json` with a 64-byte name is under 128): past it, the text
/// is not a header.
const MAX_HEADER: usize = 256;

impl ReasoningFormat {
    /// The format the chat template's markers name, if it has one.
    pub fn detect(template: Option<&str>) -> Option<ReasoningFormat> {
        let template = template?;
        if is_harmony(template) {
            Some(ReasoningFormat::Harmony)
        } else if template.contains("<|channel>") {
            Some(GEMMA4)
        } else if template.contains("<think>") {
            Some(THINK)
        } else {
            None
        }
    }

    /// Whether a prompt ending in `tail` leaves the model inside a
    /// thinking block (the template opened it).
    pub fn opened_by(&self, tail: &str) -> bool {
        match *self {
            ReasoningFormat::Block { open, close, .. } => match tail.rfind(open) {
                Some(at) => !tail[at..].contains(close),
                None => false,
            },
            // The generation prompt ends before the first header.
            ReasoningFormat::Harmony => false,
        }
    }

    /// The thinking block of a chat answer whose prompt starts with
    /// `head` and ends with `tail` (a few tokens each, markers included):
    /// one the prompt opened (Qwen3.5's template, thinking on); one the
    /// model opens itself as its first tokens, where thinking is on and
    /// the template opens none (Qwen3's, Gemma 4's with `enable_thinking`);
    /// none where thinking is off (the template wrote an empty closed
    /// block, or Gemma's `<|think|>` is missing) and for harmony, whose
    /// analysis message is a message of its own.
    pub fn block(&self, head: &str, tail: &str) -> Option<ThinkingBlock> {
        let ReasoningFormat::Block { open, close, on } = *self else {
            return None;
        };
        if self.opened_by(tail) {
            Some(ThinkingBlock::Opened { close })
        } else if tail.trim_end().ends_with(close) || on.is_some_and(|on| !head.contains(on)) {
            None
        } else {
            Some(ThinkingBlock::Own { open, close })
        }
    }

    /// [`ReasoningFormat::block`] of a chat prompt's tokens, as the
    /// server reads them: the first and last few, markers included.
    pub fn prompt_block(&self, tokenizer: &Tokenizer, prompt: &[u32]) -> Option<ThinkingBlock> {
        let head = &prompt[..prompt.len().min(HEAD_TOKENS)];
        let tail = &prompt[prompt.len().saturating_sub(TAIL_TOKENS)..];
        self.block(&tokenizer.decode(head, true), &tokenizer.decode(tail, true))
    }
}

/// Prompt tokens read to tell whether the template opened a thinking
/// block for the model, or wrote an empty closed one (its markers and a
/// newline or two).
const TAIL_TOKENS: usize = 8;
/// Prompt tokens read for a template's sign that thinking is on (Gemma
/// 4's `<|think|>`, after `<bos><|turn>system\n`; about 12 tokens in a
/// vocabulary that spells the markers out).
const HEAD_TOKENS: usize = 24;

/// Where a chat answer's thinking block begins, for a constraint that
/// must let it run before the part it constrains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingBlock {
    /// The prompt opened it: the answer starts inside and ends it with
    /// `close`.
    Opened { close: &'static str },
    /// The model may open it with `open` as its first tokens.
    Own {
        open: &'static str,
        close: &'static str,
    },
}

/// Whether a chat template writes harmony messages (gpt-oss's).
pub fn is_harmony(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

/// Tokens of `max_tokens` that the bound on a harmony answer's analysis
/// message ([`reasoning_bound`]) always leaves for what follows it: the
/// next message's header (a few control tokens on gpt-oss, about 40
/// tokens where a vocabulary spells the markers out) and the start of
/// its body.
pub const ANSWER_ROOM: usize = 32;

/// The most tokens a harmony answer of at most `max_tokens` tokens may
/// spend in its analysis message: the request's `thinking_budget_tokens`
/// (`requested`; `usize::MAX` for -1, no bound of its own), or half of
/// `max_tokens` when it gives none, and never more than `max_tokens` less
/// [`ANSWER_ROOM`], so a constrained answer always reaches the message
/// its constraint asks for (the final channel's JSON, a tool call) before
/// the length limit.
pub fn reasoning_bound(requested: Option<usize>, max_tokens: usize) -> usize {
    requested
        .unwrap_or(max_tokens / 2)
        .min(max_tokens.saturating_sub(ANSWER_ROOM))
}

/// The Lark grammar of a harmony answer that may reason first (an
/// analysis message of at most `reasoning` tokens, whose text may hold a
/// `<` but not start a marker) and then follows `last_rules`, Lark rules
/// that define `last`, the message that must follow (a tool call,
/// [`crate::tools`]; the final channel's JSON, [`harmony_final_json`]; any
/// message but another analysis, [`harmony_bounded`]). With `reasoning`
/// 0 there is no analysis message.
pub fn harmony_grammar(last_rules: &str, reasoning: usize) -> Grammar {
    if reasoning == 0 {
        return Grammar::Lark(format!("start: last\n{last_rules}"));
    }
    Grammar::Lark(format!(
        "start: (analysis \"{START}assistant\")? last\n\
         analysis: \"{CHANNEL}analysis{MESSAGE}\" thought \"{END}\"\n\
         {}\
         {last_rules}",
        thought_rule("<|", reasoning)
    ))
}

/// The Lark grammar of a chat answer with a thinking block before its
/// constrained part: `then` (a Lark item: `%json {...}`, `%lark {...}`),
/// or any text when `None` (`thinking_budget_tokens` on an answer
/// otherwise free). The block's text is at most `reasoning` tokens that
/// never hold its close marker, then the marker and up to two newlines.
/// Without this, a constraint would start at the answer's first token and
/// force the call or the JSON inside the thinking (where the reasoning
/// split files it as reasoning), or skip the thinking the model would do.
///
/// A block the prompt opened (Qwen3.5's template ends in `<think>\n`) is
/// the answer's start; with `reasoning` 0 it closes at once. A block the
/// model opens itself (Qwen3, Gemma 4 with thinking on) is optional: its
/// open marker, the text, the close; with `reasoning` 0 there is none.
/// Without the block, a free answer may not open one (the split would
/// read its unbounded text as reasoning): its text, after any
/// whitespace, does not start with the open marker.
pub fn thinking_grammar(block: ThinkingBlock, then: Option<&str>, reasoning: usize) -> String {
    let last = match then {
        Some(item) => format!("last: {item}\n"),
        None => "last: REST\nREST: /(?s:.*)/\n".to_string(),
    };
    let sep = "sep: (\"\\n\" \"\\n\"?)?\n";
    match block {
        ThinkingBlock::Opened { close } => {
            // A nested grammar that llguidance enters at the answer's very
            // first token takes one token more than its `max_tokens`
            // (measured: N + 1; after a forced prefix, as harmony's
            // thought, exactly N), so the rule asks one less. A bound of 1
            // therefore leaves none: `max_tokens=0` is the empty text.
            let (thought, rule) = match reasoning {
                0 => ("", String::new()),
                n => ("thought ", thought_rule(close, n - 1)),
            };
            format!(
                "start: {thought}{} sep last\n{sep}{last}{rule}",
                lark_literal(close)
            )
        }
        ThinkingBlock::Own { open, close } => {
            let plain = match then {
                Some(_) => "last".to_string(),
                None => "PLAIN\nPLAIN: /".to_string() + &text_not_opening(open) + "/",
            };
            if reasoning == 0 {
                return format!("start: {plain}\n{last}");
            }
            format!(
                "start: {} thought {} sep last | {plain}\n{sep}{last}{}",
                lark_literal(open),
                lark_literal(close),
                thought_rule(close, reasoning)
            )
        }
    }
}

/// A regex of the texts that, after any whitespace, do not start with
/// `open`: nothing more, a character other than its first, or a proper
/// prefix of it that ends the text or goes on with another character
/// than the marker's next; anything may follow.
pub(crate) fn text_not_opening(open: &str) -> String {
    let hex = |c: &char| format!("\\x{{{:X}}}", *c as u32);
    let chars: Vec<char> = open.chars().collect();
    let mut alternatives = vec![format!("[^\\s{}](?s:.*)", hex(&chars[0]))];
    for k in 1..chars.len() {
        let prefix: String = chars[..k].iter().map(hex).collect();
        alternatives.push(format!("{prefix}([^{}](?s:.*))?", hex(&chars[k])));
    }
    format!("\\s*({})?", alternatives.join("|"))
}

/// The Lark rule `thought`: text of at most `reasoning` tokens that never
/// holds `stop` (a marker that ends it: `</think>`, or `<|` for harmony,
/// whose bodies end at any of its markers). The text is pieces that each
/// end where `stop` may begin (one greedy lexeme would swallow the
/// marker's first bytes and refuse the rest), in a nested grammar whose
/// `max_tokens` llguidance enforces: once the pieces have taken that many
/// tokens, only what follows the rule may come.
fn thought_rule(stop: &str, reasoning: usize) -> String {
    format!(
        "thought[max_tokens={reasoning}]: %lark {{\n\
         start: THOUGHT*\n\
         THOUGHT: /{}/\n\
         }}\n",
        pieces_without(stop)
    )
}

/// A regex of the pieces of a text that never holds `stop` (two
/// characters or more, its first not repeated in it), each cut where
/// `stop` could begin: a run free of its first character, or a run of
/// that character and a proper prefix of the rest of `stop` closed by a
/// character that neither continues `stop` nor starts it again. Any text
/// without `stop` is such pieces, save one that ends in a prefix of
/// `stop` (the piece would need one more character): a thought cannot end
/// in `</` right before its `</think>`.
pub(crate) fn pieces_without(stop: &str) -> String {
    let hex = |c: char| format!("\\x{{{:X}}}", c as u32);
    let chars: Vec<char> = stop.chars().collect();
    let first = hex(chars[0]);
    let mut alternatives = vec![format!("[^{first}]+")];
    for k in 1..chars.len() {
        let prefix: String = chars[1..k].iter().map(|&c| hex(c)).collect();
        alternatives.push(format!("{first}+{prefix}[^{}{first}]", hex(chars[k])));
    }
    alternatives.join("|")
}

/// A harmony answer whose final message is a JSON value valid against
/// `schema`, after an optional analysis message of at most `reasoning`
/// tokens (as llama.cpp constrains gpt-oss's `response_format`): the model
/// keeps its reasoning and its headers, and the JSON is the final
/// channel's body, so it comes back as `content`. The header may carry
/// harmony's `<|constrain|>json`.
pub fn harmony_final_json(schema: &serde_json::Value, reasoning: usize) -> Grammar {
    harmony_grammar(
        &format!(
            "last: \"{CHANNEL}final\" \" <|constrain|>json\"? \"{MESSAGE}\" {}\n",
            lark_json(schema)
        ),
        reasoning,
    )
}

/// A harmony answer otherwise free whose analysis message (if it opens
/// with one) takes at most `reasoning` tokens: what follows is any text
/// that starts another message than an analysis one (the final channel,
/// a commentary preamble or tool call, or a header that names its
/// recipient first). For `thinking_budget_tokens` on an unconstrained
/// answer.
pub fn harmony_bounded(reasoning: usize) -> Grammar {
    harmony_grammar(
        &format!(
            "last: (\"{CHANNEL}final\" | \"{CHANNEL}commentary\" | \" to=\") REST\n\
             REST: /(?s:.*)/\n"
        ),
        reasoning,
    )
}

/// Where a harmony tool call's body (its JSON arguments) ends: the first
/// end marker outside a JSON string, and which. The markers are text to a
/// grammar, so constrained arguments may hold one inside a string.
pub fn call_end(body: &str) -> Option<(usize, &'static str)> {
    crate::api::outside_strings(body.as_bytes())
        .filter(|&(_, b)| b == b'<')
        .find_map(|(at, _)| {
            let end = BODY_ENDS.iter().find(|m| body[at..].starts_with(**m))?;
            Some((at, *end))
        })
}

/// Where a text body (an answer, reasoning) ends: at its first end
/// marker, as written (no JSON strings to skip).
pub fn text_end(body: &str) -> Option<usize> {
    BODY_ENDS.iter().filter_map(|m| body.find(m)).min()
}

/// Text split into its reasoning and its answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a thinking block may still open.
    Start,
    /// Inside the block; `begun` once its first non-blank text went out.
    Thinking { begun: bool },
    /// After the block, before the answer's first non-blank text.
    Closed,
    /// The answer: everything goes to content.
    Answer,
    /// Harmony: a message's header, up to its `<|message|>`; `first` for
    /// the answer's first, which may turn out not to be a header at all.
    Header { first: bool },
    /// Harmony: a message's body.
    Body(Channel),
    /// Harmony: after a message's `<|end|>`, before the next one.
    Between,
    /// Harmony: after `<|return|>` or `<|call|>`: nothing more is read.
    Done,
}

/// Where a harmony message's body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Reasoning,
    Content,
    /// A tool call: header, body and end as written.
    Call,
}

impl Channel {
    /// The channel of a harmony header (the text before `<|message|>`):
    /// a recipient makes a call, wherever it stands (llama.cpp and
    /// openai-harmony take `to=` before or after `<|channel|>`).
    fn of(header: &str) -> Channel {
        let channel = header
            .rfind(CHANNEL)
            .map(|at| {
                header[at + CHANNEL.len()..]
                    .split(|c: char| c.is_whitespace() || c == '<')
                    .next()
                    .unwrap_or("")
            })
            .unwrap_or("");
        if header.contains("to=") {
            Channel::Call
        } else if channel == "analysis" {
            Channel::Reasoning
        } else {
            Channel::Content
        }
    }
}

/// One answer's split, fed its text as it is generated.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    format: ReasoningFormat,
    state: State,
    /// Text not yet sent: a possible marker, or whitespace that may end
    /// the reasoning.
    held: String,
    /// Harmony: whether reasoning and content have had a message each, so
    /// the next is set apart by a newline.
    written: (bool, bool),
}

impl ReasoningSplit {
    /// `inside`: the prompt left the model in a thinking block.
    pub fn new(format: ReasoningFormat, inside: bool) -> ReasoningSplit {
        ReasoningSplit {
            format,
            state: match format {
                ReasoningFormat::Harmony => State::Header { first: true },
                ReasoningFormat::Block { .. } if inside => State::Thinking { begun: false },
                ReasoningFormat::Block { .. } => State::Start,
            },
            held: String::new(),
            written: (false, false),
        }
    }

    /// Takes the next text; returns what can be sent of each part.
    pub fn push(&mut self, text: &str) -> Parts {
        self.held.push_str(text);
        match self.format {
            ReasoningFormat::Block { open, close, .. } => self.push_block(open, close),
            ReasoningFormat::Harmony => self.push_harmony(),
        }
    }

    fn push_block(&mut self, open: &str, close: &str) -> Parts {
        let mut out = Parts::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if t.is_empty() || (t.len() < open.len() && open.starts_with(t)) {
                        return out;
                    }
                    if t.starts_with(open) {
                        let blank = self.held.len() - t.len();
                        self.held.drain(..blank + open.len());
                        self.state = State::Thinking { begun: false };
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking { begun } => {
                    if let Some(at) = self.held.find(close) {
                        let text = &self.held[..at];
                        let text = if begun { text } else { text.trim_start() };
                        out.reasoning.push_str(text.trim_end());
                        self.held.drain(..at + close.len());
                        self.state = State::Closed;
                        continue;
                    }
                    // Held back: a tail that may begin the closing marker,
                    // and the whitespace before it.
                    let keep = partial_suffix(&self.held, close);
                    let cut = self.held[..self.held.len() - keep].trim_end().len();
                    let text = &self.held[..cut];
                    let text = if begun { text } else { text.trim_start() };
                    if !text.is_empty() {
                        out.reasoning.push_str(text);
                        self.state = State::Thinking { begun: true };
                    }
                    self.held.drain(..cut);
                    return out;
                }
                State::Closed => {
                    let blank = self.held.len() - self.held.trim_start().len();
                    self.held.drain(..blank);
                    if self.held.is_empty() {
                        return out;
                    }
                    self.state = State::Answer;
                }
                _ => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    fn push_harmony(&mut self) -> Parts {
        let mut out = Parts::default();
        loop {
            match self.state {
                State::Header { first } => {
                    if let Some(at) = self.held.find(MESSAGE) {
                        let end = at + MESSAGE.len();
                        let channel = Channel::of(&self.held[..at]);
                        if channel == Channel::Call {
                            out.content.push_str(&self.held[..end]);
                        } else {
                            self.separate(channel, &mut out);
                        }
                        self.held.drain(..end);
                        self.state = State::Body(channel);
                        continue;
                    }
                    // An answer that does not open with a header (a model
                    // that skips the format) is content, as is a header
                    // that never ends.
                    let t = self.held.trim_start();
                    let header_like = [CHANNEL, START, "to="]
                        .iter()
                        .any(|m| t.starts_with(m) || m.starts_with(t));
                    if (first && !header_like) || self.held.len() > MAX_HEADER {
                        self.state = State::Answer;
                        continue;
                    }
                    return out;
                }
                State::Body(channel) => {
                    let end = match channel {
                        Channel::Call => call_end(&self.held),
                        _ => BODY_ENDS
                            .iter()
                            .filter_map(|m| self.held.find(m).map(|at| (at, *m)))
                            .min(),
                    };
                    if let Some((at, marker)) = end {
                        let body_end = match (channel, marker) {
                            // A call's end goes with it; a new message's
                            // start begins the next header.
                            (Channel::Call, m) if m != START => at + m.len(),
                            _ => at,
                        };
                        let text = self.held[..body_end].to_string();
                        self.emit(channel, &text, &mut out);
                        let drained = if marker == START {
                            at
                        } else {
                            at + marker.len()
                        };
                        self.held.drain(..drained);
                        self.state = match marker {
                            END => State::Between,
                            START => State::Header { first: false },
                            _ => State::Done,
                        };
                        continue;
                    }
                    if channel == Channel::Call {
                        // Held whole until its end: a marker may still
                        // turn out to be inside a string of the arguments.
                        return out;
                    }
                    let keep = BODY_ENDS
                        .iter()
                        .map(|m| partial_suffix(&self.held, m))
                        .max()
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    let text = self.held[..cut].to_string();
                    self.emit(channel, &text, &mut out);
                    self.held.drain(..cut);
                    return out;
                }
                State::Between => {
                    let blank = self.held.len() - self.held.trim_start().len();
                    self.held.drain(..blank);
                    if self.held.is_empty() {
                        return out;
                    }
                    self.state = State::Header { first: false };
                }
                State::Done => {
                    self.held.clear();
                    return out;
                }
                _ => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// A newline between two harmony messages of the same part.
    fn separate(&mut self, channel: Channel, out: &mut Parts) {
        match channel {
            Channel::Reasoning if self.written.0 => out.reasoning.push('\n'),
            Channel::Content if self.written.1 => out.content.push('\n'),
            _ => {}
        }
    }

    fn emit(&mut self, channel: Channel, text: &str, out: &mut Parts) {
        if text.is_empty() {
            return;
        }
        match channel {
            Channel::Reasoning => {
                out.reasoning.push_str(text);
                self.written.0 = true;
            }
            Channel::Content => {
                out.content.push_str(text);
                self.written.1 = true;
            }
            Channel::Call => out.content.push_str(text),
        }
    }

    /// The end of the answer: what was held back, in its part (a
    /// thinking block cut off by the length limit stays reasoning).
    pub fn finish(&mut self) -> Parts {
        let held = std::mem::take(&mut self.held);
        let mut out = Parts::default();
        match self.state {
            State::Start | State::Answer => out.content = held,
            State::Thinking { begun } => {
                let text = if begun { &held[..] } else { held.trim_start() };
                out.reasoning = text.trim_end().to_string();
            }
            State::Body(channel) => self.emit(channel, &held, &mut out),
            // A header cut off has nothing to say.
            State::Closed | State::Header { .. } | State::Between | State::Done => {}
        }
        self.state = State::Answer;
        out
    }

    /// A whole answer split at once.
    pub fn split(format: ReasoningFormat, inside: bool, text: &str) -> Parts {
        let mut split = ReasoningSplit::new(format, inside);
        let mut parts = split.push(text);
        let rest = split.finish();
        parts.reasoning.push_str(&rest.reasoning);
        parts.content.push_str(&rest.content);
        parts
    }
}

/// The length of the longest proper prefix of `marker` that `text` ends
/// with (0 when none).
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len().saturating_sub(n)) && text.ends_with(&marker[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(format: ReasoningFormat, inside: bool, pieces: &[&str]) -> Parts {
        let mut split = ReasoningSplit::new(format, inside);
        let mut all = Parts::default();
        let mut parts: Vec<Parts> = pieces.iter().map(|p| split.push(p)).collect();
        parts.push(split.finish());
        for p in parts {
            all.reasoning.push_str(&p.reasoning);
            all.content.push_str(&p.content);
        }
        all
    }

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_thinking_block_at_the_start_is_reasoning_whatever_the_pieces() {
        let text = "<think>\nThe user wants 2+2.\nThat is 4.\n</think>\n\nIt is 4.";
        let want = parts("The user wants 2+2.\nThat is 4.", "It is 4.");
        assert_eq!(ReasoningSplit::split(THINK, false, text), want);
        // Every way of cutting the text in two, and one character a piece.
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            assert_eq!(
                streamed(THINK, false, &[&text[..cut], &text[cut..]]),
                want,
                "{cut}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(THINK, false, &chars), want);
    }

    #[test]
    fn reasoning_goes_out_as_it_comes_holding_back_only_a_possible_marker() {
        let mut split = ReasoningSplit::new(THINK, false);
        assert_eq!(split.push("<thi"), parts("", ""));
        assert_eq!(split.push("nk>Let me see. "), parts("Let me see.", ""));
        assert_eq!(split.push("So</th"), parts(" So", ""));
        assert_eq!(split.push("ink> Yes"), parts("", "Yes"));
        assert_eq!(split.push("."), parts("", "."));
        assert_eq!(split.finish(), parts("", ""));
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_the_answer_inside_it() {
        assert!(THINK.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!THINK.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!THINK.opened_by("<|im_start|>assistant\n"));
        assert_eq!(
            streamed(THINK, true, &["Hmm, 4.", "\n</think>\n\n", "4"]),
            parts("Hmm, 4.", "4")
        );
    }

    #[test]
    fn markers_later_in_the_answer_and_answers_without_a_block_are_content() {
        let text = "Use <think> tags </think> like this.";
        assert_eq!(ReasoningSplit::split(THINK, false, text), parts("", text));
        assert_eq!(
            ReasoningSplit::split(THINK, false, "  plain"),
            parts("", "  plain")
        );
        assert_eq!(
            ReasoningSplit::split(THINK, false, "<thin"),
            parts("", "<thin")
        );
    }

    #[test]
    fn a_block_cut_off_by_the_length_limit_stays_reasoning() {
        assert_eq!(
            streamed(THINK, false, &["<think> step one,", " step two </"]),
            parts("step one, step two </", "")
        );
    }

    #[test]
    fn gemma_4s_thought_channel_is_reasoning() {
        let template = "{{ '<|channel>thought\\n' }}{{ '<channel|>' }}";
        let format = ReasoningFormat::detect(Some(template)).unwrap();
        assert_eq!(format, GEMMA4);
        assert_eq!(
            streamed(
                format,
                false,
                &["<|channel>", "thought\nCount: 3.", "<channel|>", "Three."]
            ),
            parts("Count: 3.", "Three.")
        );
        assert_eq!(
            ReasoningFormat::detect(Some("{% if '<think>' %}")),
            Some(THINK)
        );
        assert_eq!(ReasoningFormat::detect(Some("{{ messages }}")), None);
        assert_eq!(ReasoningFormat::detect(None), None);
    }

    #[test]
    fn the_block_a_constraint_lets_come_first_depends_on_the_prompt() {
        let own = Some(ThinkingBlock::Own {
            open: "<think>",
            close: "</think>",
        });
        assert_eq!(
            THINK.block("", "assistant\n<think>\n"),
            Some(ThinkingBlock::Opened { close: "</think>" })
        );
        assert_eq!(THINK.block("", "<|im_start|>assistant\n"), own);
        assert_eq!(THINK.block("", "assistant\n<think>\n\n</think>\n\n"), None);
        // Gemma 4: on only where the prompt starts with `<|think|>`.
        let head = "<bos><|turn>system\n<|think|>\n";
        assert!(matches!(
            GEMMA4.block(head, "<|turn>model\n"),
            Some(ThinkingBlock::Own { .. })
        ));
        assert_eq!(GEMMA4.block("<bos><|turn>user\n", "<tool_response|>"), None);
        assert_eq!(
            GEMMA4.block(head, "<|turn>model\n<|channel>thought\n<channel|>"),
            None
        );
        assert_eq!(
            ReasoningFormat::Harmony.block("", "<|start|>assistant"),
            None
        );
    }

    #[test]
    fn multibyte_text_next_to_a_partial_marker_is_cut_on_character_boundaries() {
        assert_eq!(
            streamed(THINK, false, &["<think>é</", "ü", "</think>ö"]),
            parts("é</ü", "ö")
        );
    }
}

#[cfg(test)]
mod harmony_tests {
    use super::*;

    const HARMONY: ReasoningFormat = ReasoningFormat::Harmony;

    fn every_cut(text: &str, want: &Parts) {
        assert_eq!(&ReasoningSplit::split(HARMONY, false, text), want);
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut split = ReasoningSplit::new(HARMONY, false);
            let mut all = split.push(&text[..cut]);
            for p in [split.push(&text[cut..]), split.finish()] {
                all.reasoning.push_str(&p.reasoning);
                all.content.push_str(&p.content);
            }
            assert_eq!(&all, want, "cut at {cut}");
        }
    }

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    #[test]
    fn the_analysis_channel_is_reasoning_and_final_is_content() {
        // openai/harmony's docs/format.md example, as gpt-oss writes it.
        let text = "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>";
        every_cut(
            text,
            &parts(
                "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.",
                "2 + 2 = 4.",
            ),
        );
        // The real model's `<|return|>` ends generation undecoded.
        every_cut(
            "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Yes.",
            &parts("Hm.", "Yes."),
        );
        // Two analysis messages, a preamble on commentary.
        every_cut(
            "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|><|start|>assistant<|channel|>commentary<|message|>Plan.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
            &parts("One.\nTwo.", "Plan.\nDone."),
        );
    }

    #[test]
    fn a_tool_call_passes_as_written_in_either_header_order() {
        for call in [
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}",
        ] {
            let text = format!("<|channel|>analysis<|message|>Need weather.<|end|>{call}");
            every_cut(&text, &parts("Need weather.", call));
        }
        // The answer's first message may be the call.
        let call = "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}";
        every_cut(call, &parts("", call));
        // Markers inside the arguments' strings are the arguments'.
        let call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": \"<|end|>\\\"<|start|>\"}";
        every_cut(
            &format!("{call}<|start|>assistant<|channel|>final<|message|>x"),
            &parts("", &format!("{call}x")),
        );
    }

    #[test]
    fn streaming_holds_back_only_headers_and_possible_ends() {
        let mut split = ReasoningSplit::new(HARMONY, false);
        assert_eq!(split.push("<|channel|>analy"), parts("", ""));
        assert_eq!(split.push("sis<|message|>Let"), parts("Let", ""));
        assert_eq!(split.push(" me see<|e"), parts(" me see", ""));
        assert_eq!(split.push("nd|><|start|>assistant"), parts("", ""));
        assert_eq!(split.push("<|channel|>final<|message|>4"), parts("", "4"));
        assert_eq!(split.push("."), parts("", "."));
        assert_eq!(split.finish(), parts("", ""));
    }

    #[test]
    fn text_without_harmony_headers_is_content_and_cut_off_bodies_keep_their_part() {
        every_cut("Just text.", &parts("", "Just text."));
        every_cut(
            "<|channel|>analysis<|message|>Step one, step",
            &parts("Step one, step", ""),
        );
        every_cut("<|channel|>analy", &parts("", ""));
        assert_eq!(
            ReasoningFormat::detect(Some(
                "{{ '<|start|>assistant<|channel|>final<|message|>' }}"
            )),
            Some(HARMONY)
        );
        assert!(!HARMONY.opened_by("<|start|>assistant<|channel|>analysis<|message|>"));
    }
}
