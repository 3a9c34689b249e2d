//! `tokenizer_json::read`: the vocabulary and merges streamed to a sink
//! (texts borrowed from the file unless escaped), the rest kept as values,
//! and containers of the wrong shape reported as absent.

use std::borrow::Cow;

use fathom_checkpoint::tokenizer_json::{merge_parts, read, split_merge, Sink};
use serde_json::{json, Value};

#[derive(Default)]
struct Seen {
    tokens: Vec<(String, bool, Value)>,
    merges: Vec<Value>,
}

impl<'a> Sink<'a> for Seen {
    fn token(&mut self, text: Cow<'a, str>, id: Value) {
        let borrowed = matches!(text, Cow::Borrowed(_));
        self.tokens.push((text.into_owned(), borrowed, id));
    }

    fn merge(&mut self, merge: Value) {
        self.merges.push(merge);
    }
}

fn read_str(text: &str) -> (Seen, fathom_checkpoint::tokenizer_json::Sections) {
    let mut seen = Seen::default();
    let sections = read(text.as_bytes(), &mut seen).unwrap();
    (seen, sections)
}

#[test]
fn the_vocabulary_and_merges_stream_and_the_rest_is_kept() {
    let (seen, sections) = read_str(
        r#"{"version": "1.0", "added_tokens": [{"id": 3, "content": "<s>"}],
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "a\"b": 2, "x": -1},
                      "merges": ["a b", ["a\"", "b"], 7], "ignore_merges": true},
            "pre_tokenizer": null}"#,
    );
    assert_eq!(
        seen.tokens,
        [
            ("a".to_string(), true, json!(0)),
            ("b".to_string(), true, json!(1)),
            ("a\"b".to_string(), false, json!(2)),
            ("x".to_string(), true, json!(-1)),
        ]
    );
    assert_eq!(seen.merges, [json!("a b"), json!(["a\"", "b"]), json!(7)]);
    let parts: Vec<_> = seen.merges.iter().map(merge_parts).collect();
    assert_eq!(parts, [Some(("a", "b")), Some(("a\"", "b")), None]);
    assert!(sections.vocab && sections.merges);
    assert_eq!(
        sections.model.unwrap(),
        *json!({"type": "BPE", "ignore_merges": true})
            .as_object()
            .unwrap()
    );
    let keys: Vec<_> = sections.root.keys().map(String::as_str).collect();
    assert_eq!(keys, ["version", "added_tokens", "pre_tokenizer"]);
    assert_eq!(sections.root["added_tokens"][0]["content"], "<s>");
}

#[test]
fn wrong_shapes_are_reported_absent_and_only_bad_json_is_an_error() {
    let (seen, sections) = read_str(r#"{"model": {"vocab": [1, 2], "merges": {"a": "b"}}}"#);
    assert!(seen.tokens.is_empty() && seen.merges.is_empty());
    assert!(!sections.vocab && !sections.merges);
    assert_eq!(sections.model, Some(Default::default()));

    let (_, sections) = read_str(r#"{"model": null}"#);
    assert_eq!(sections.model, Some(Default::default()));
    let (_, sections) = read_str("[1, 2]");
    assert!(sections.model.is_none() && sections.root.is_empty());

    for bad in ["{not json", r#"{"model": {}} trailing"#, ""] {
        assert!(
            read(bad.as_bytes(), &mut Seen::default()).is_err(),
            "{bad:?}"
        );
    }
    // Deep nesting never reaches the stack's end: a kept section stops at
    // serde_json's recursion limit, a skipped part is skipped without
    // recursion.
    let deep = |open: &str, close: &str| {
        let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        format!("{open}{nested}{close}")
    };
    let kept = deep(r#"{"normalizer": "#, "}");
    assert!(read(kept.as_bytes(), &mut Seen::default()).is_err());
    let (_, sections) = read_str(&deep(r#"{"model": {"vocab": "#, "}}"));
    assert!(!sections.vocab);
}

#[test]
fn a_merge_line_splits_at_its_first_space_after_the_first_byte() {
    assert_eq!(split_merge("a b"), Some(("a", "b")));
    assert_eq!(split_merge("  b c"), Some((" ", "b c")));
    assert_eq!(split_merge("ab"), None);
    assert_eq!(split_merge(" "), None);
}
