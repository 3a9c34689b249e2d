//! A Hugging Face `tokenizer.json` read in one streaming pass.
//!
//! The file is a few MB, but its vocabulary (`model.vocab`, hundreds of
//! thousands of entries) and merges (`model.merges`, as many again) parsed
//! into a generic JSON tree cost 20 times that: a map entry per token and a
//! value per merge. So they are handed to a [`Sink`] one entry at a time,
//! token texts borrowed from the file's bytes where they need no unescaping,
//! and only the small sections (`added_tokens`, `normalizer`,
//! `pre_tokenizer`, `post_processor`, `model`'s settings) become values.
//! The spec counts the vocabulary this way for the plan's runtime term, the
//! tokenizer reads it this way to build its tables.
//!
//! Nothing about shapes is refused here but what is not JSON: a vocabulary
//! that is not an object, or merges that are not an array, are reported in
//! [`Sections`] for the reader to name in its own message.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Receives the vocabulary and the merges as they are read.
pub trait Sink<'a> {
    /// One entry of `model.vocab`: its text (borrowed from the file unless
    /// it had escapes) and its id as written (a number, if valid).
    fn token(&mut self, text: Cow<'a, str>, id: Value);
    /// One element of `model.merges`: `"left right"` or `["left", "right"]`
    /// if valid (see [`merge_parts`]).
    fn merge(&mut self, merge: Value);
}

/// Everything of `tokenizer.json` besides the vocabulary and merges.
#[derive(Debug, Default)]
pub struct Sections {
    /// The top level's entries but `model`, in file order.
    pub root: Map<String, Value>,
    /// `model`'s entries but `vocab` and `merges`: `None` without a
    /// `model`, empty when it is not an object.
    pub model: Option<Map<String, Value>>,
    /// Whether `model.vocab` is an object (its entries went to the sink).
    pub vocab: bool,
    /// Whether `model.merges` is an array (its elements went to the sink).
    pub merges: bool,
}

/// Reads `bytes` as `tokenizer.json`, streaming the vocabulary and merges
/// to `sink`. Errors only where the bytes are not one JSON document, or
/// nest deeper than serde_json's recursion limit in a section kept as a
/// value (parts of the wrong shape are skipped without recursion).
pub fn read<'a>(bytes: &'a [u8], sink: &mut impl Sink<'a>) -> Result<Sections, serde_json::Error> {
    let mut sections = Sections::default();
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    Part {
        at: At::Root,
        sink,
        sections: &mut sections,
    }
    .deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(sections)
}

/// Splits a merge line `"left right"` (this file's string form, and GGUF's
/// `tokenizer.ggml.merges`) at the first space after its first byte, as
/// llama.cpp does (so a left part may start with a space).
pub fn split_merge(line: &str) -> Option<(&str, &str)> {
    let at = line.as_bytes().iter().skip(1).position(|&b| b == b' ')? + 1;
    Some((&line[..at], &line[at + 1..]))
}

/// A merge's two parts: a line split by [`split_merge`], or a pair of
/// strings (the form newer tokenizers write); `None` for anything else.
pub fn merge_parts(merge: &Value) -> Option<(&str, &str)> {
    match merge {
        Value::String(line) => split_merge(line),
        Value::Array(pair) => match pair.as_slice() {
            [Value::String(left), Value::String(right)] => Some((left, right)),
            _ => None,
        },
        _ => None,
    }
}

/// Which part of the document a [`Part`] reads.
#[derive(Clone, Copy)]
enum At {
    Root,
    Model,
    Vocab,
    Merges,
}

/// Reads one part of the document into `sections` and `sink`; a part of an
/// unexpected shape is skipped (and so reported as absent).
struct Part<'r, S> {
    at: At,
    sink: &'r mut S,
    sections: &'r mut Sections,
}

impl<'r, S> Part<'r, S> {
    fn inner(&mut self, at: At) -> Part<'_, S> {
        Part {
            at,
            sink: &mut *self.sink,
            sections: &mut *self.sections,
        }
    }
}

impl<'de, S: Sink<'de>> DeserializeSeed<'de> for Part<'_, S> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Sink<'de>> Visitor<'de> for Part<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        match self.at {
            At::Root => {
                while let Some(key) = map.next_key::<String>()? {
                    if key == "model" {
                        self.sections.model = Some(Map::new());
                        map.next_value_seed(self.inner(At::Model))?;
                    } else {
                        let value = map.next_value()?;
                        self.sections.root.insert(key, value);
                    }
                }
            }
            At::Model => {
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "vocab" => {
                            self.sections.vocab = false;
                            map.next_value_seed(self.inner(At::Vocab))?;
                        }
                        "merges" => {
                            self.sections.merges = false;
                            map.next_value_seed(self.inner(At::Merges))?;
                        }
                        _ => {
                            let value = map.next_value()?;
                            if let Some(model) = &mut self.sections.model {
                                model.insert(key, value);
                            }
                        }
                    }
                }
            }
            At::Vocab => {
                self.sections.vocab = true;
                while let Some(Text(text)) = map.next_key()? {
                    let id = map.next_value()?;
                    self.sink.token(text, id);
                }
            }
            At::Merges => while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {},
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if let At::Merges = self.at {
            self.sections.merges = true;
            while let Some(merge) = seq.next_element()? {
                self.sink.merge(merge);
            }
        } else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
        }
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// A vocabulary key: borrowed from the file unless it had escapes, so the
/// reader allocates nothing for most tokens and the tokenizer one string of
/// exactly the token's length.
struct Text<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(text)))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}
