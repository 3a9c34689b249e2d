//! Streaming detokenization: text out as tokens arrive, never half a
//! character.

use crate::Tokenizer;

/// Turns generated tokens into text as they come. A UTF-8 character whose
/// bytes are split over several tokens (byte-level BPE and `<0xXX>` tokens do
/// this for emoji and CJK) is held back until it is whole. Control tokens
/// print nothing, as llama.cpp prints them by default.
///
/// Both buffers are reused from token to token, so once they have grown to
/// the longest piece the token loop allocates nothing here.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    out: String,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds token `id`; returns the text completed by it, possibly empty.
    /// Bytes that can never become a character come out as U+FFFD.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> &str {
        self.pending.extend_from_slice(tok.piece(id, false));
        let out = &mut self.out;
        out.clear();
        let mut rest = self.pending.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // An incomplete character at the end: wait for more.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        &self.out
    }

    /// Flushes what is left (an unfinished character) lossily.
    pub fn finish(&mut self) -> &str {
        self.out.clear();
        self.out.push_str(&String::from_utf8_lossy(&self.pending));
        self.pending.clear();
        &self.out
    }
}
