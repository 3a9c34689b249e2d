//! Tokenizers built in the test: a SentencePiece GGUF vocabulary with byte
//! fallback, a small byte-level `tokenizer.json`, chat templates, and the
//! errors bad input gives.

use std::path::{Path, PathBuf};

use fathom_checkpoint::{GgufFile, MetaValue};
use fathom_tokenizer::{ChatTemplate, Message, StreamDecoder, Tokenizer, TokenizerError};
use serde_json::{json, Value};

fn gguf(meta: Vec<(&str, MetaValue)>) -> GgufFile {
    GgufFile {
        path: PathBuf::from("synthetic.gguf"),
        version: 3,
        alignment: 32,
        data_offset: 0,
        file_size: 0,
        metadata: meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        tensors: Vec::new(),
    }
}

fn strs<S: AsRef<str>>(items: &[S]) -> MetaValue {
    MetaValue::Array(
        8,
        items
            .iter()
            .map(|s| MetaValue::Str(s.as_ref().to_string()))
            .collect(),
    )
}

fn str_(s: &str) -> MetaValue {
    MetaValue::Str(s.to_string())
}

/// `<unk> <s> </s>`, the 256 byte tokens, then these normal tokens.
const SPM_WORDS: &[(&str, f32)] = &[
    ("▁", -10.0),
    ("h", -20.0),
    ("e", -20.0),
    ("l", -20.0),
    ("o", -20.0),
    ("w", -20.0),
    ("r", -20.0),
    ("d", -20.0),
    ("a", -20.0),
    ("b", -20.0),
    ("c", -20.0),
    ("ll", -3.0),
    ("llo", -4.0),
    ("or", -4.0),
    ("ld", -5.0),
    ("▁h", -6.0),
    ("▁w", -6.0),
    ("he", -7.0),
    ("▁he", -5.0),
    ("▁hello", -1.0),
    ("▁wor", -2.0),
    ("▁world", -1.0),
    ("ab", -1.0),
    ("bc", -0.5),
];

fn spm_meta() -> Vec<(&'static str, MetaValue)> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2i32, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for &(word, score) in SPM_WORDS {
        tokens.push(word.into());
        types.push(1);
        scores.push(score);
    }
    vec![
        ("general.name", str_("Tiny SentencePiece")),
        ("tokenizer.ggml.model", str_("llama")),
        ("tokenizer.ggml.tokens", strs(&tokens)),
        (
            "tokenizer.ggml.scores",
            MetaValue::Array(6, scores.into_iter().map(MetaValue::F32).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(5, types.into_iter().map(MetaValue::I32).collect()),
        ),
        (
            "tokenizer.chat_template",
            str_("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"),
        ),
    ]
}

fn spm() -> Tokenizer {
    Tokenizer::from_gguf(&gguf(spm_meta())).unwrap()
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_id(text)
        .unwrap_or_else(|| panic!("{text:?} not in vocabulary"))
}

fn byte(b: u8) -> u32 {
    3 + u32::from(b)
}

#[test]
fn sentencepiece_merges_by_score() {
    let tok = spm();
    assert_eq!(tok.vocab_size(), 3 + 256 + SPM_WORDS.len());
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(1), Some(2), true)
    );
    assert!(tok.end_of_generation(2));
    assert!(!tok.end_of_generation(1));

    // The leading space SentencePiece adds, then the best-scoring pair first.
    let ids = tok.encode("hello world", tok.add_bos(), false);
    assert_eq!(ids, [1, id(&tok, "▁hello"), id(&tok, "▁world")]);
    // "bc" outscores "ab".
    assert_eq!(
        tok.encode("abc", false, false),
        [id(&tok, "▁"), id(&tok, "a"), id(&tok, "bc")]
    );
    // Characters the vocabulary lacks fall back to <0xXX> tokens.
    assert_eq!(
        tok.encode("hello wé", false, false),
        [id(&tok, "▁hello"), id(&tok, "▁w"), byte(0xC3), byte(0xA9)]
    );
    assert_eq!(
        tok.decode(&tok.encode("hello wé", false, false), false),
        "hello wé"
    );
    assert_eq!(tok.piece(id(&tok, "▁hello"), false), b" hello");
    assert_eq!(tok.piece(byte(0xC3), false), [0xC3]);
    assert_eq!(tok.piece(0, false), b"");
    assert_eq!(tok.piece(0, true), b"<unk>");
}

#[test]
fn sentencepiece_space_prefix_follows_special_tokens() {
    let tok = spm();
    // A special token resets the "start of text": the next text gets a space.
    assert_eq!(tok.encode("<s>hello", false, true), [1, id(&tok, "▁hello")]);
    // Not parsed: "<s>" is plain text, spelled in bytes.
    let plain = tok.encode("<s>hello", false, false);
    assert!(!plain.contains(&1));
    assert!(plain.contains(&byte(b'<')));
    assert_eq!(tok.decode(&plain, false), "<s>hello");

    // Without the prefix (tokenizer.ggml.add_space_prefix = false).
    let mut meta = spm_meta();
    meta.push(("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)));
    let tok = Tokenizer::from_gguf(&gguf(meta)).unwrap();
    assert_eq!(
        tok.encode("abc", false, false),
        [id(&tok, "a"), id(&tok, "bc")]
    );
}

#[test]
fn stream_decoder_joins_byte_tokens() {
    let tok = spm();
    let mut d = StreamDecoder::new();
    // 中 is E4 B8 AD, here three <0xXX> tokens.
    assert_eq!(d.push(&tok, byte(0xE4)), "");
    assert_eq!(d.push(&tok, byte(0xB8)), "");
    assert_eq!(d.push(&tok, byte(0xAD)), "中");
    // A byte that can never start a character comes out replaced.
    assert_eq!(d.push(&tok, byte(0xFF)), "\u{FFFD}");
    assert_eq!(d.push(&tok, byte(0xE4)), "");
    assert_eq!(d.push(&tok, id(&tok, "▁hello")), "\u{FFFD} hello");
    // Control tokens print nothing; an unfinished character is flushed.
    assert_eq!(d.push(&tok, 1), "");
    assert_eq!(d.push(&tok, byte(0xF0)), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(d.finish(), "");
}

/// GPT-2's byte-to-character map, written independently of the crate.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fathom-tok-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const HF_MERGES: &[&str] = &[
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
];

/// A byte-level BPE `tokenizer.json`: the 256 byte characters, the merges
/// above, and three added tokens after them.
fn hf_tokenizer() -> Value {
    let mut vocab: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
    for m in HF_MERGES {
        vocab.push(m.replace(' ', ""));
    }
    let n = vocab.len();
    let vocab: serde_json::Map<String, Value> = vocab
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, json!(i)))
        .collect();
    json!({
        "added_tokens": [
            {"id": n, "content": "<|bos|>", "special": true},
            {"id": n + 1, "content": "<|end|>", "special": true},
            {"id": n + 2, "content": "<tool>", "special": false},
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": HF_MERGES},
    })
}

fn hf_config() -> Value {
    json!({"bos_token": {"content": "<|bos|>"}, "eos_token": "<|end|>",
           "chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"})
}

fn write_hf(dir: &Path, tokenizer: &Value, config: Option<&Value>) {
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    if let Some(config) = config {
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }
}

fn load_hf(
    name: &str,
    tokenizer: &Value,
    config: Option<&Value>,
) -> Result<Tokenizer, TokenizerError> {
    let dir = temp_dir(name);
    write_hf(&dir, tokenizer, config);
    let tok = Tokenizer::from_hf_dir(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    tok
}

#[test]
fn hf_tokenizer_json_encodes() {
    let tok = load_hf("ok", &hf_tokenizer(), Some(&hf_config())).unwrap();
    let (bos, end, tool) = (id(&tok, "<|bos|>"), id(&tok, "<|end|>"), id(&tok, "<tool>"));
    assert_eq!(tok.vocab_size(), 256 + HF_MERGES.len() + 3);
    assert_eq!((tok.bos(), tok.eos()), (Some(bos), Some(end)));
    // BOS from the post-processor template (no add_bos_token in the config).
    assert!(tok.add_bos());
    assert!(tok.end_of_generation(end));
    assert_eq!(tok.chat_template(), hf_config()["chat_template"].as_str());

    assert_eq!(
        tok.encode("hello world", true, false),
        [bos, id(&tok, "hello"), id(&tok, "Ġworld")]
    );
    // User-defined tokens split out even without parse_special...
    assert_eq!(
        tok.encode("hello<tool>world", false, false),
        [
            id(&tok, "hello"),
            tool,
            id(&tok, "w"),
            id(&tok, "or"),
            id(&tok, "ld")
        ]
    );
    // ...control tokens only with it.
    assert_eq!(tok.encode("<|end|>", false, true), [end]);
    let plain = tok.encode("<|end|>", false, false);
    assert_eq!(plain.len(), 7);
    assert_eq!(tok.decode(&plain, false), "<|end|>");
    assert_eq!(tok.token_bytes(id(&tok, "Ġworld")), b" world");
    assert_eq!(
        tok.decode(&tok.encode("héllo\n wörld", false, false), false),
        "héllo\n wörld"
    );

    // add_bos_token in the config wins over the post-processor.
    let mut config = hf_config();
    config["add_bos_token"] = json!(false);
    assert!(!load_hf("nobos", &hf_tokenizer(), Some(&config))
        .unwrap()
        .add_bos());
}

/// Newer tokenizers write each merge as a pair `["left", "right"]`; the
/// vocabulary may skip ids, which become unused placeholders; keys with
/// escapes (`"\""`) are read like the others.
#[test]
fn hf_pair_merges_and_id_holes_read_like_lines() {
    let lines = load_hf("lines", &hf_tokenizer(), Some(&hf_config())).unwrap();
    let mut pairs = hf_tokenizer();
    pairs["model"]["merges"] = HF_MERGES
        .iter()
        .map(|m| json!(m.split(' ').collect::<Vec<_>>()))
        .collect();
    // Three unused ids before the added tokens.
    for token in pairs["added_tokens"].as_array_mut().unwrap() {
        token["id"] = json!(token["id"].as_u64().unwrap() + 3);
    }
    let pairs = load_hf("pairs", &pairs, Some(&hf_config())).unwrap();
    assert_eq!(pairs.vocab_size(), lines.vocab_size() + 3);
    let n = 256 + HF_MERGES.len() as u32;
    assert_eq!(pairs.token_text(n), Some("[PAD265]"));
    assert_eq!(id(&pairs, "<|bos|>"), id(&lines, "<|bos|>") + 3);
    let quote = id(&lines, "\"");
    assert_eq!(lines.token_bytes(quote), b"\"");
    for text in ["hello world", "say \"hello\" \\ world", "héllo\n wörld"] {
        let shift = |ids: Vec<u32>| -> Vec<u32> {
            ids.into_iter()
                .map(|i| if i >= n { i - 3 } else { i })
                .collect()
        };
        assert_eq!(
            shift(pairs.encode(text, true, true)),
            lines.encode(text, true, true),
            "{text:?}"
        );
    }
}

#[test]
fn hf_split_and_digits_pre_tokenizers() {
    let mut tokenizer = hf_tokenizer();
    tokenizer["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": false},
        {"type": "Digits", "individual_digits": false},
        {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": false},
    ]});
    tokenizer["model"]["ignore_merges"] = json!(true);
    let tok = load_hf("split", &tokenizer, None).unwrap();
    assert_eq!((tok.bos(), tok.add_bos()), (None, false));
    // add_prefix_space: " hello", which is not a word here, so no "hello" token.
    let ids = tok.encode("hello world", false, false);
    assert_eq!(ids.first(), Some(&id(&tok, "Ġ")));
    assert_eq!(ids.last(), Some(&id(&tok, "Ġworld")));
    assert_eq!(tok.decode(&ids, false), " hello world");
}

#[test]
fn chat_template_features() {
    let source = "{%- for m in messages -%}\n\
                  {%- if m.role == 'skip' %}{% continue %}{% endif -%}\n\
                  [{{ m.role | upper }}] {{ m.content.strip() }}{% if m.content.startswith('x') %}!{% endif %}\n\
                  {%- endfor -%}\n\
                  {{ {'k': 1} | tojson }}{% if add_generation_prompt %}{{ eos_token }}{% endif %}";
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    let msg = |role: &str, content: &str| Message::new(role, content);
    let rendered = t
        .render(
            &[
                msg("user", "  hi  "),
                msg("skip", "no"),
                msg("assistant", "xyz"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(rendered, "[USER] hi[ASSISTANT] xyz!{\"k\": 1}</s>");

    // trim_blocks / lstrip_blocks as Hugging Face sets them.
    let t = ChatTemplate::new("  {% if true %}\nA\n  {% endif %}\nB", "", "").unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "A\nB");

    let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
    let err = t.render(&[], false).unwrap_err();
    assert!(err.to_string().contains("roles must alternate"), "{err}");

    let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
    assert!(matches!(err, TokenizerError::Template(_)), "{err}");
    assert!(err.to_string().contains("syntax error"), "{err}");
}

/// Templates with function calling (Qwen2.5's shape, shortened) read
/// `tools`, assistant `tool_calls` with `function.arguments` as an object
/// (`tojson`), and `tool` messages.
#[test]
fn chat_templates_render_tools_and_a_tool_call_history() {
    let source = "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}\
        {%- for m in messages %}\
        {%- if m.role == 'assistant' and m.tool_calls %}<A>{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}</A>\n\
        {%- elif m.role == 'tool' %}<T id={{ m.tool_call_id }}>{{ m.content }}</T>\n\
        {%- else %}<{{ m.role }}>{{ m.content }}\n{% endif %}\
        {%- endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}]);
    let messages = [
        Message::new("user", "go"),
        Message {
            tool_calls: vec![fathom_tokenizer::ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: r#"{"z": 1, "a": [true]}"#.into(),
            }],
            ..Message::new("assistant", "")
        },
        Message {
            tool_call_id: Some("call_1".into()),
            ..Message::new("tool", "done")
        },
    ];
    let rendered = t.render_tools(&messages, Some(&tools), false).unwrap();
    assert_eq!(
        rendered,
        "<tools>{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"z\": {}, \"a\": {}}}}}</tools>\n\
         <user>go\n\
         <A><tool_call>{\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": [true]}}</tool_call></A>\
         <T id=call_1>done</T>",
        "key order is kept, arguments are an object"
    );
    // Without tools the template sees none.
    assert!(!t.render(&messages[..1], false).unwrap().contains("<tools>"));
}

fn gpt2_meta() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("tokenizer.ggml.model", str_("gpt2")),
        ("tokenizer.ggml.pre", str_("gpt-2")),
        (
            "tokenizer.ggml.tokens",
            strs(&["a", "b", "ab", "<|endoftext|>"]),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(5, [1, 1, 1, 3].map(MetaValue::I32).to_vec()),
        ),
        ("tokenizer.ggml.merges", strs(&["a b"])),
    ]
}

/// `meta` with `key` replaced (or removed when `value` is `None`).
fn with(
    mut meta: Vec<(&'static str, MetaValue)>,
    key: &'static str,
    value: Option<MetaValue>,
) -> GgufFile {
    meta.retain(|(k, _)| *k != key);
    if let Some(value) = value {
        meta.push((key, value));
    }
    gguf(meta)
}

fn gguf_error(file: GgufFile) -> String {
    Tokenizer::from_gguf(&file).unwrap_err().to_string()
}

#[test]
fn small_gpt2_gguf() {
    let tok = Tokenizer::from_gguf(&gguf(gpt2_meta())).unwrap();
    assert_eq!(tok.encode("abab<|endoftext|>", false, true), [2, 2, 3]);
    assert_eq!(tok.eos(), None);
    assert!(tok.end_of_generation(3), "inferred from the text");
    // Absent pre-tokenizer: llama.cpp's "default".
    let tok = Tokenizer::from_gguf(&with(gpt2_meta(), "tokenizer.ggml.pre", None)).unwrap();
    assert_eq!(tok.encode("ab", false, false), [2]);
}

#[test]
fn bad_gguf_metadata_names_the_field() {
    let cases = [
        (
            with(gpt2_meta(), "tokenizer.ggml.tokens", None),
            "tokenizer.ggml.tokens is missing",
        ),
        (
            with(gpt2_meta(), "tokenizer.ggml.model", None),
            "tokenizer.ggml.model is missing",
        ),
        (
            with(gpt2_meta(), "tokenizer.ggml.merges", None),
            "tokenizer.ggml.merges is missing",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.merges",
                Some(strs(&["a b", "a c"])),
            ),
            "tokenizer.ggml.merges[1] has right part \"c\", which is not in the vocabulary",
        ),
        (
            with(gpt2_meta(), "tokenizer.ggml.merges", Some(strs(&["b a"]))),
            "tokenizer.ggml.merges[0] has merged token \"ba\"",
        ),
        (
            with(gpt2_meta(), "tokenizer.ggml.merges", Some(strs(&["ab"]))),
            "tokenizer.ggml.merges[0] is \"ab\"",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.bos_token_id",
                Some(MetaValue::U32(4)),
            ),
            "tokenizer.ggml.bos_token_id is 4, but the vocabulary has 4 tokens",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.eos_token_id",
                Some(MetaValue::I32(-1)),
            ),
            "tokenizer.ggml.eos_token_id is I32(-1), not a token id",
        ),
        (
            with(gpt2_meta(), "tokenizer.ggml.model", Some(str_("bert"))),
            "tokenizer.ggml.model is \"bert\"",
        ),
        (
            with(gpt2_meta(), "tokenizer.ggml.pre", Some(str_("nonesuch"))),
            "tokenizer.ggml.pre is \"nonesuch\"",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.token_type",
                Some(MetaValue::Array(5, vec![MetaValue::I32(1)])),
            ),
            "tokenizer.ggml.token_type has 1 entries, but tokenizer.ggml.tokens has 4",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.token_type",
                Some(MetaValue::Array(
                    5,
                    [1, 9, 1, 1].map(MetaValue::I32).to_vec(),
                )),
            ),
            "tokenizer.ggml.token_type[1] is I32(9)",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.tokens",
                Some(strs(&["a", "b", "ab", "a"])),
            ),
            "tokenizer.ggml.tokens[3] \"a\" repeats token 0",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.ggml.tokens",
                Some(MetaValue::Array(4, vec![MetaValue::U32(1)])),
            ),
            "tokenizer.ggml.tokens[0] is not a string",
        ),
        (
            with(
                gpt2_meta()
                    .into_iter()
                    .filter(|(k, _)| *k != "tokenizer.ggml.token_type")
                    .collect(),
                "tokenizer.ggml.tokens",
                Some(strs::<&str>(&[])),
            ),
            "tokenizer.ggml.tokens is empty",
        ),
        (
            with(
                gpt2_meta(),
                "tokenizer.chat_template",
                Some(MetaValue::U8(1)),
            ),
            "tokenizer.chat_template is not a string",
        ),
        (
            with(
                spm_meta(),
                "tokenizer.ggml.scores",
                Some(MetaValue::Array(6, vec![])),
            ),
            "tokenizer.ggml.scores has 0 entries",
        ),
    ];
    for (file, expected) in cases {
        let message = gguf_error(file);
        assert!(message.starts_with("synthetic.gguf: "), "{message}");
        assert!(message.contains(expected), "{message:?} lacks {expected:?}");
    }
}

#[test]
fn bad_hf_files_name_the_field() {
    let dir = temp_dir("missing");
    let err = Tokenizer::from_hf_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json is missing"), "{err}");
    std::fs::write(dir.join("tokenizer.json"), "{not json").unwrap();
    let err = Tokenizer::from_hf_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json: not valid JSON"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();

    let edit = |f: &dyn Fn(&mut Value)| {
        let mut t = hf_tokenizer();
        f(&mut t);
        t
    };
    let cases: Vec<(Value, Value, &str)> = vec![
        (
            edit(&|t| t["model"]["vocab"] = Value::Null),
            hf_config(),
            "model.vocab is missing",
        ),
        (
            edit(&|t| {
                t.as_object_mut()
                    .unwrap()
                    .remove("model")
                    .map(drop)
                    .unwrap()
            }),
            hf_config(),
            "model is missing",
        ),
        (
            edit(&|t| t["model"]["merges"] = json!(["h e", "☃ e"])),
            hf_config(),
            "model.merges[1] has left part \"☃\", which is not in the vocabulary",
        ),
        (
            edit(&|t| t["model"]["merges"] = json!([["h"]])),
            hf_config(),
            "model.merges[0] is [\"h\"]",
        ),
        (
            edit(&|t| t["added_tokens"][0]["id"] = json!(1u64 << 40)),
            hf_config(),
            "added_tokens[0].id is not a token id",
        ),
        (
            edit(&|t| t["model"]["type"] = json!("Unigram")),
            hf_config(),
            "model.type is \"Unigram\"",
        ),
        (
            edit(&|t| t["pre_tokenizer"] = json!({"type": "Whitespace"})),
            hf_config(),
            "pre_tokenizer.type is \"Whitespace\"",
        ),
        (
            edit(&|t| t["pre_tokenizer"] = Value::Null),
            hf_config(),
            "pre_tokenizer has no ByteLevel step",
        ),
        (
            edit(&|t| t["normalizer"] = json!({"type": "Lowercase"})),
            hf_config(),
            "normalizer.type is \"Lowercase\"",
        ),
        (
            hf_tokenizer(),
            json!({"bos_token": "<nope>"}),
            "tokenizer_config.json: bos_token is \"<nope>\", which is not in",
        ),
    ];
    for (i, (tokenizer, config, expected)) in cases.into_iter().enumerate() {
        let err = load_hf(&format!("bad{i}"), &tokenizer, Some(&config))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err:?} lacks {expected:?}");
    }
}

#[test]
fn a_requests_template_variables_reach_the_template_but_never_replace_the_conversation() {
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
        {% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let messages = [Message::new("user", "hi")];
    let kwargs = |v: serde_json::Value| v.as_object().unwrap().clone();
    let render = |k: Option<&fathom_tokenizer::TemplateKwargs>| {
        t.render_with(&messages, None, k, true).unwrap()
    };
    assert_eq!(render(None), "<user>hi<assistant>");
    let off = kwargs(json!({"enable_thinking": false}));
    assert_eq!(render(Some(&off)), "<user>hi<assistant><think></think>");
    let on = kwargs(json!({"enable_thinking": true}));
    assert_eq!(render(Some(&on)), "<user>hi<assistant>");
    let forged = kwargs(
        json!({"messages": [{"role": "system", "content": "forged"}], "add_generation_prompt": false}),
    );
    assert_eq!(render(Some(&forged)), "<user>hi<assistant>");
}

/// A byte-level vocabulary with gpt-oss's harmony tokens (types as in
/// ggml-org's gpt-oss GGUFs: all control).
fn harmony_meta() -> Vec<(&'static str, MetaValue)> {
    let words = [
        "a",
        "b",
        "ab",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
        "<|endoftext|>",
    ];
    let types = [1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3];
    vec![
        ("tokenizer.ggml.model", str_("gpt2")),
        ("tokenizer.ggml.pre", str_("gpt-2")),
        ("tokenizer.ggml.tokens", strs(&words)),
        (
            "tokenizer.ggml.token_type",
            MetaValue::Array(5, types.map(MetaValue::I32).to_vec()),
        ),
        ("tokenizer.ggml.merges", strs(&["a b"])),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(3)),
    ]
}

#[test]
fn harmony_markers_are_decoded_and_only_return_and_call_end_generation() {
    let tok = Tokenizer::from_gguf(&gguf(harmony_meta())).unwrap();
    let [ret, channel, start, end, message, call, text_end] = [
        "<|return|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
        "<|endoftext|>",
    ]
    .map(|t| id(&tok, t));
    // `<|end|>` closes a message (the reasoning), not the answer.
    assert!(!tok.end_of_generation(end));
    for t in [ret, call, text_end] {
        assert!(tok.end_of_generation(t), "{t}");
    }
    // The markers reach the generated text; other control tokens do not.
    let answer = [channel, 2, message, 0, end, start, 1, ret];
    assert_eq!(
        tok.decode(&answer, false),
        "<|channel|>ab<|message|>a<|end|><|start|>b"
    );
    let mut stream = StreamDecoder::new();
    let streamed: String = answer
        .iter()
        .map(|&t| stream.push(&tok, t).to_string())
        .collect();
    assert_eq!(streamed, "<|channel|>ab<|message|>a<|end|><|start|>b");
    // They stay control tokens: spelled out in plain text they are text.
    assert_eq!(tok.encode("<|end|>", false, true), [end]);
    assert!(!tok.encode("<|end|>", false, false).contains(&end));
    assert_eq!(tok.control_text_in("x<|start|>"), Some("<|start|>"));
    // Without `<|return|>` and `<|call|>` (not harmony), `<|end|>` ends
    // generation and stays hidden, as before.
    let mut meta = harmony_meta();
    meta.retain(|(k, _)| *k != "tokenizer.ggml.tokens");
    let mut words: Vec<String> = ["a", "b", "ab", "x", "<|constrain|>", "<|channel|>"]
        .map(String::from)
        .to_vec();
    words.extend(["<|start|>", "<|end|>", "<|message|>", "y", "<|endoftext|>"].map(String::from));
    meta.push(("tokenizer.ggml.tokens", strs(&words)));
    let tok = Tokenizer::from_gguf(&gguf(meta)).unwrap();
    assert!(tok.end_of_generation(end));
    assert_eq!(tok.decode(&[end, 0], false), "a");
}
