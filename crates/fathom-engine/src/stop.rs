//! Stop strings over streamed text: text is released as soon as it cannot
//! be the start of a stop string, and a stop string is never printed.

use fathom_tokenizer::{StreamDecoder, Tokenizer};

/// A sequence's generated tokens as text to send: whole UTF-8, with stop
/// strings held back and cut.
pub struct OutputText {
    decoder: StreamDecoder,
    stops: StopMatcher,
}

impl OutputText {
    pub fn new(stops: Vec<String>) -> Self {
        OutputText {
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(stops),
        }
    }

    /// Adds a generated token: the text now safe to send, and whether a
    /// stop string ended the output.
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> (&str, bool) {
        let text = self.decoder.push(tokenizer, token);
        self.stops.push(text)
    }

    /// What is still held back when generation ends at its length.
    pub fn finish(&mut self) -> String {
        let rest = self.decoder.finish();
        let (emit, _) = self.stops.push(rest);
        let mut out = emit.to_string();
        out.push_str(&self.stops.flush());
        out
    }
}

pub struct StopMatcher {
    stops: Vec<String>,
    /// Text held back because it may begin a stop string.
    pending: String,
    /// What `push` returned last, kept so the returned slice can borrow it.
    out: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopMatcher {
            stops,
            pending: String::with_capacity(longest * 2 + 64),
            out: String::with_capacity(longest * 2 + 64),
        }
    }

    /// Adds `text`; returns the text safe to emit and whether a stop string
    /// was found (text after it is dropped).
    pub fn push(&mut self, text: &str) -> (&str, bool) {
        self.out.clear();
        if self.stops.is_empty() {
            self.out.push_str(text);
            return (&self.out, false);
        }
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            self.out.push_str(&self.pending[..at]);
            self.pending.clear();
            return (&self.out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let keep = (1..=self.pending.len())
            .rev()
            .filter(|&n| self.pending.is_char_boundary(self.pending.len() - n))
            .find(|&n| {
                let tail = &self.pending[self.pending.len() - n..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        self.out.push_str(&self.pending[..cut]);
        self.pending.drain(..cut);
        (&self.out, false)
    }

    /// The held-back text, at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_split_across_pieces_are_caught() {
        let stops = vec!["\nUser:".to_string()];
        let mut m = StopMatcher::new(stops);
        let mut out = String::new();
        for piece in ["Hello", " there\n", "Us", "er: more"] {
            let (emit, hit) = m.push(piece);
            out.push_str(emit);
            if hit {
                break;
            }
        }
        assert_eq!(out, "Hello there");
    }

    #[test]
    fn text_that_only_looks_like_a_stop_is_released() {
        let stops = vec!["STOP".to_string()];
        let mut m = StopMatcher::new(stops);
        assert_eq!(m.push("ab ST").0, "ab ");
        assert_eq!(m.push("ART").0, "START");
        assert_eq!(m.push("é ST").0, "é ");
        assert_eq!(m.flush(), "ST");
    }
}
