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

/// The markers of one family's thinking block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningFormat {
    open: &'static str,
    close: &'static str,
}

const THINK: ReasoningFormat = ReasoningFormat {
    open: "<think>",
    close: "</think>",
};

const GEMMA4: ReasoningFormat = ReasoningFormat {
    open: "<|channel>thought",
    close: "<channel|>",
};

impl ReasoningFormat {
    /// The format the chat template's markers name, if it has one.
    pub fn detect(template: Option<&str>) -> Option<ReasoningFormat> {
        let template = template?;
        if template.contains("<|channel>") {
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
        match tail.rfind(self.open) {
            Some(at) => !tail[at..].contains(self.close),
            None => false,
        }
    }
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
}

/// One answer's split, fed its text as it is generated.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    format: ReasoningFormat,
    state: State,
    /// Text not yet sent: a possible marker, or whitespace that may end
    /// the reasoning.
    held: String,
}

impl ReasoningSplit {
    /// `inside`: the prompt left the model in a thinking block.
    pub fn new(format: ReasoningFormat, inside: bool) -> ReasoningSplit {
        ReasoningSplit {
            format,
            state: if inside {
                State::Thinking { begun: false }
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    /// Takes the next text; returns what can be sent of each part.
    pub fn push(&mut self, text: &str) -> Parts {
        self.held.push_str(text);
        let mut out = Parts::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if t.is_empty()
                        || (t.len() < self.format.open.len() && self.format.open.starts_with(t))
                    {
                        return out;
                    }
                    if t.starts_with(self.format.open) {
                        let blank = self.held.len() - t.len();
                        self.held.drain(..blank + self.format.open.len());
                        self.state = State::Thinking { begun: false };
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking { begun } => {
                    if let Some(at) = self.held.find(self.format.close) {
                        let text = &self.held[..at];
                        let text = if begun { text } else { text.trim_start() };
                        out.reasoning.push_str(text.trim_end());
                        self.held.drain(..at + self.format.close.len());
                        self.state = State::Closed;
                        continue;
                    }
                    // Held back: a tail that may begin the closing marker,
                    // and the whitespace before it.
                    let keep = partial_suffix(&self.held, self.format.close);
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
                State::Answer => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
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
            State::Closed => {}
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
    fn multibyte_text_next_to_a_partial_marker_is_cut_on_character_boundaries() {
        assert_eq!(
            streamed(THINK, false, &["<think>é</", "ü", "</think>ö"]),
            parts("é</ü", "ö")
        );
    }
}
