//! The constraint engine over the real SmolLM2 vocabulary: the grammars
//! the tool formats ask for (harmony's with its markers as text, as this
//! vocabulary spells them) compile, accept the calls they describe token
//! by token (as the model's tokenizer splits them) and refuse others; the
//! cache hands out independent states; GBNF's folded classes keep their
//! language. Over the real Qwen3.5 vocabulary and template (fetched by
//! `scripts/fetch-vocab.sh`), whose prompt leaves the model inside
//! `<think>`: a constrained call or JSON comes after the thinking closes,
//! and the thinking is bounded. Over Qwen3's real template (the model
//! opens its own `<think>`) and Gemma 4's with thinking on (its own
//! thought channel), the call or JSON may follow such a block, bounded
//! alike. Under `tool_choice` `auto`, every native format's answer is free
//! until its call opener, then the call `required` asks for (Llama 3's
//! `<|python_tag|>` walked as the control token Llama 3.1 has). Gemma 4's
//! and Qwen XML's bare string arguments meet their `pattern` and `format`
//! as JSON strings do.

mod common;

use common::{prompt_of, template, vocabulary, vocabulary_at};
use fathom_server::api::{Tool, ToolChoice, ToolRequest};
use fathom_server::constraint::{ConstraintState, Constraints, Grammar};
use fathom_server::reasoning::{ReasoningFormat, ReasoningSplit, ThinkingBlock};
use fathom_server::tools::{self, ToolFormat};
use fathom_tokenizer::{ChatTemplate, Message, ToolCall};
use serde_json::json;
use std::path::Path;

fn tokenizer() -> fathom_engine::Tokenizer {
    vocabulary("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Feeds `text` token by token; returns how many tokens the masks allowed
/// before one was refused (all of them: the text is accepted), and how
/// many there are.
fn walk(state: &mut ConstraintState, tok: &fathom_engine::Tokenizer, text: &str) -> (usize, usize) {
    walk_ids(state, &tok.encode(text, false, false))
}

fn walk_ids(state: &mut ConstraintState, ids: &[u32]) -> (usize, usize) {
    for (i, &id) in ids.iter().enumerate() {
        state.compute_mask().unwrap();
        if !state.mask().allows(id) {
            return (i, ids.len());
        }
        state.commit(id).unwrap();
    }
    (ids.len(), ids.len())
}

/// [`tools::grammar`] of a model whose vocabulary has no
/// `<|python_tag|>` token and whose prompt leaves it no thinking block
/// to open.
fn tool_grammar(format: ToolFormat, req: &ToolRequest, reasoning: usize) -> Grammar {
    tools::grammar(format, req, reasoning, false, None).unwrap()
}

fn request(choice: ToolChoice) -> ToolRequest {
    ToolRequest {
        tools: vec![Tool {
            name: "get_weather".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}),
            strict: true,
        }],
        choice,
        parallel: false,
    }
}

#[test]
fn tool_grammars_accept_valid_calls_and_refuse_others() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let eog: Vec<u32> = tok.end_of_generation_ids().collect();
    for (format, good, bad) in [
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"kelvin\"}}\n</tool_call>",
        ),
        (
            ToolFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nSaint-\u{c9}tienne <Paris>\nnorth\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"fahrenheit\"}}",
            "{\"name\": \"get_time\", \"parameters\": {}}",
        ),
        (
            ToolFormat::Harmony,
            "<|channel|>analysis<|message|>Need the weather; 1 < 2.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}",
            "<|channel|>analysis<|message|>Sunny.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.",
        ),
        (
            ToolFormat::Generic,
            "{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}}",
            "{\"response\": \"It is sunny.\"}",
        ),
    ] {
        let grammar = tool_grammar(format, &request(ToolChoice::Required), 1000);
        let mut state = c.compile(&grammar).unwrap_or_else(|e| panic!("{format:?}: {e:?}"));
        let (ok, n) = walk(&mut state, &tok, good);
        assert_eq!(ok, n, "{format:?}: the valid call was refused at token {ok}");
        state.compute_mask().unwrap();
        assert!(eog.iter().any(|&id| state.mask().allows(id)), "{format:?}: the call may end");
        let mut state = c.compile(&grammar).unwrap();
        assert!(state.cache_hit, "the second compile comes from the cache");
        let (ok, n) = walk(&mut state, &tok, bad);
        assert!(ok < n, "{format:?}: an invalid call went through");
    }
    // Harmony: the reasoning may be left out.
    let grammar = tool_grammar(ToolFormat::Harmony, &request(ToolChoice::Required), 1000);
    let mut state = c.compile(&grammar).unwrap();
    let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\", \"unit\": \"celsius\"}";
    let (ok, n) = walk(&mut state, &tok, call);
    assert_eq!(ok, n);
    // auto in the generic format: a response is fine too.
    let grammar = tool_grammar(ToolFormat::Generic, &request(ToolChoice::Auto), 1000);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, "{\"response\": \"It is sunny.\"}");
    assert_eq!(ok, n);
    assert!(state.is_stopped() || state.is_accepting());
}

#[test]
fn json_schemas_walk_the_compact_layout_and_gbnf_compiles() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "boolean"}}}, "required": ["a", "b"], "additionalProperties": false});
    let mut state = c.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
    let (ok, n) = walk(&mut state, &tok, "{\"a\": 12, \"b\": [true, false]}");
    assert_eq!(ok, n);
    // Free whitespace is not allowed: no runaway newlines.
    let mut state = c.compile(&Grammar::JsonSchema(schema)).unwrap();
    let (ok, n) = walk(&mut state, &tok, "{\n\"a\": 12, \"b\": []}");
    assert!(ok < n);
    let mut state = c
        .compile(&Grammar::Gbnf("root ::= \"yes\" | \"no\"".into()))
        .unwrap();
    let (ok, n) = walk(&mut state, &tok, "yes");
    assert_eq!(ok, n);
    assert!(state.is_stopped() || state.is_accepting());
    // A repeated class folded into one lexeme keeps its language: at most
    // 30 letters between the quotes, nothing else.
    let list = "root ::= \"[\" item (\", \" item)*\nitem ::= \"\\\"\" [a-zA-Z ]{1,30} \"\\\"\"\n";
    let walked = |text: &str| {
        let mut state = c.compile(&Grammar::Gbnf(list.into())).unwrap();
        walk(&mut state, &tok, text)
    };
    let (ok, n) = walked("[\"apples\", \"Sweet pears and plums\", \"x\"");
    assert_eq!(ok, n);
    for bad in [
        "[\"apples1\"",
        "[\"\", \"a\"",
        "[\"abcdefghijklmnopqrstuvwxyzabcde\"",
    ] {
        let (ok, n) = walked(bad);
        assert!(ok < n, "{bad:?} went through");
    }
    let e = c
        .compile(&Grammar::Gbnf("root ::= missing".into()))
        .unwrap_err();
    assert!(e.message.contains("missing"), "{e:?}");
}

/// `format: date` (and the date of `date-time`) admits February's 29th
/// in leap years only and no year 0000, as the validators answers are
/// checked with do (llguidance's own table admits both); a schema's own
/// `pattern` beside the format is left to llguidance.
#[test]
fn json_dates_are_real_calendar_dates() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let walked = |schema: serde_json::Value, text: &str| {
        let mut state = c.compile(&Grammar::JsonSchema(schema)).unwrap();
        let (ok, n) = walk(&mut state, &tok, text);
        ok == n && state.is_accepting()
    };
    let date = json!({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"], "additionalProperties": false});
    for (text, valid) in [
        ("2024-02-29", true),
        ("2000-02-29", true),
        ("2023-02-28", true),
        ("0004-02-29", true),
        ("2023-12-31", true),
        ("2023-02-29", false),
        ("1900-02-29", false),
        ("2023-04-31", false),
        ("0000-01-01", false),
    ] {
        let answer = format!("{{\"d\": \"{text}\"}}");
        assert_eq!(walked(date.clone(), &answer), valid, "{answer}");
    }
    let stamp = json!({"type": "string", "format": "date-time"});
    assert!(walked(stamp.clone(), "\"2024-02-29T10:00:00Z\""));
    assert!(!walked(stamp, "\"2023-02-29T10:00:00Z\""));
}

#[test]
fn qwen_xml_calls_may_leave_out_optional_parameters_and_come_in_parallel() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let req = ToolRequest {
        tools: vec![Tool {
            name: "forecast".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
            strict: true,
        }],
        choice: ToolChoice::Required,
        parallel: true,
    };
    let grammar = tool_grammar(ToolFormat::QwenXml, &req, 1000);
    let two = "<tool_call>\n<function=forecast>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=forecast>\n<parameter=city>\nBergen\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, two);
    assert_eq!(ok, n, "the two calls were refused at token {ok}");
    assert!(state.is_stopped() || state.is_accepting());
    let read = tools::parse(ToolFormat::QwenXml, two, &req, "p");
    assert_eq!(read.calls.len(), 2);
    assert_eq!(read.calls[1].arguments, r#"{"city":"Bergen","days":3}"#);
    // An integer parameter takes JSON only; the required one cannot go.
    for bad in [
        "<tool_call>\n<function=forecast>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\nthree\n</parameter>",
        "<tool_call>\n<function=forecast>\n<parameter=days>\n3\n</parameter>",
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, bad);
        assert!(ok < n, "{bad:?} went through");
    }
}

/// What the Hermes and Qwen XML grammars accept, the parser reads back as
/// the call: a string argument may hold the format's end tags
/// (`</tool_call>`, `</parameter>`) in a line, and the call still ends at
/// the tag that starts a line. Found through the server (issue 35): a
/// stand-in pushed to `</tool_call>` wrote it into a city, and the
/// constrained call came back as content.
#[test]
fn string_arguments_holding_end_tags_are_read_back_whole() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let req = request(ToolChoice::Auto);
    let city = "a</parameter></tool_call>b <tool_call>";
    let cases = [
        (
            ToolFormat::Hermes,
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\", \"unit\": \"celsius\"}}}}\n</tool_call>"),
        ),
        (
            ToolFormat::QwenXml,
            format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"),
        ),
    ];
    for (format, text) in cases {
        let grammar = tool_grammar(format, &req, 100);
        let mut state = c.compile(&grammar).unwrap();
        let eog: Vec<u32> = tok.end_of_generation_ids().collect();
        assert_eq!(
            accepted_whole(&mut state, &tok.encode(&text, false, false), &eog),
            (true, true),
            "{format:?}"
        );
        let read = tools::parse(format, &text, &req, "e");
        assert_eq!(read.content, None, "{format:?}: {read:?}");
        assert_eq!(
            read.calls[0].arguments,
            json!({"city": city, "unit": "celsius"}).to_string(),
            "{format:?}"
        );
    }
}

/// A Qwen XML string is written bare, so its `minLength` and `maxLength`
/// bound the text itself, counted in characters as JSON Schema counts
/// them: a call the model opens under `auto` (as a required one) whose
/// text is too long or too short is refused, so what the server reads
/// back validates. Found through the server (issue 35): a model pushed
/// to repeat a token wrote a city of hundreds of characters past
/// `maxLength: 40`. A bound that is not a count is refused by name.
#[test]
fn qwen_xml_string_lengths_are_enforced() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let mut req = request(ToolChoice::Auto);
    req.tools[0].parameters = json!({"type": "object", "properties": {
        "city": {"type": "string", "minLength": 2, "maxLength": 6}, "note": {"type": "string", "maxLength": 3}},
        "required": ["city"]});
    let call = |city: &str| {
        format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>")
    };
    for choice in [ToolChoice::Auto, ToolChoice::Required] {
        req.choice = choice;
        let grammar = tool_grammar(ToolFormat::QwenXml, &req, 100);
        for (city, fits) in [
            ("Oslo", true),
            ("Zürich", true),
            ("a <b>", true),
            ("Os", true),
            ("O", false),
            ("Zürichs", false),
            ("Bergen by the sea", false),
        ] {
            let text = call(city);
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk(&mut state, &tok, &text);
            assert_eq!(ok == n, fits, "{city:?}: {ok} of {n} tokens");
            if fits {
                let read = tools::parse(ToolFormat::QwenXml, &text, &req, "s");
                assert_eq!(read.calls[0].arguments, json!({"city": city}).to_string());
            }
        }
        // Two bounded strings, each its own bound.
        let two = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=note>\nabc\n</parameter>\n</function>\n</tool_call>";
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, two);
        assert_eq!(ok, n);
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &two.replace("abc", "abcd"));
        assert!(ok < n);
    }
    req.tools[0].parameters["properties"]["city"]["maxLength"] = json!(-1);
    let e = tools::grammar(ToolFormat::QwenXml, &req, 100, false, None).unwrap_err();
    assert!(
        e.contains("get_weather") && e.contains("maxLength -1"),
        "{e}"
    );
}

#[test]
fn tool_call_arguments_are_compact_json_in_every_format() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let args = "{\"city\": \"Paris\", \"unit\": \"celsius\"}";
    for (format, head, tail) in [
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
            "}\n</tool_call>",
        ),
        (
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": ",
            "}",
        ),
        (
            ToolFormat::Harmony,
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
            "",
        ),
        (
            ToolFormat::Generic,
            "{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": ",
            "}}",
        ),
    ] {
        let grammar = tool_grammar(format, &request(ToolChoice::Required), 1000);
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &format!("{head}{args}{tail}"));
        assert_eq!(
            ok, n,
            "{format:?}: the compact call was refused at token {ok}"
        );
        // What a small model was seen writing: newlines inside the
        // arguments (and, as response_format has it, any other free
        // whitespace) are refused.
        for loose in [
            "{\n\n\"city\": \"Paris\", \"unit\": \"celsius\"}",
            "{\"city\":\"Paris\", \"unit\": \"celsius\"}",
            "{\"city\": \"Paris\" , \"unit\": \"celsius\"}",
        ] {
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk(&mut state, &tok, &format!("{head}{loose}{tail}"));
            assert!(ok < n, "{format:?}: {loose:?} went through");
        }
    }
}

#[test]
fn harmony_json_answers_keep_the_reasoning_and_the_final_header() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let grammar = fathom_server::reasoning::harmony_final_json(&schema, 1000);
    let json = "{\"name\": \"Ada\", \"age\": 36}";
    for good in [
        format!("<|channel|>analysis<|message|>A name, 1 < 2.<|end|><|start|>assistant<|channel|>final<|message|>{json}"),
        format!("<|channel|>final<|message|>{json}"),
        format!("<|channel|>final <|constrain|>json<|message|>{json}"),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &good);
        assert_eq!(ok, n, "{good:?} was refused at token {ok}");
        assert!(state.is_stopped() || state.is_accepting(), "{good:?} is complete");
    }
    for bad in [
        // No header: the JSON must be the final channel's body.
        json.to_string(),
        "<|channel|>final<|message|>{\n\"name\": \"Ada\", \"age\": 36}".to_string(),
        "<|channel|>final<|message|>{\"name\": \"Ada\"}".to_string(),
        "<|channel|>commentary<|message|>{\"name\": \"Ada\", \"age\": 36}".to_string(),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &bad);
        let complete = ok == n && state.is_accepting();
        assert!(!complete, "{bad:?} went through");
    }
    // A keyword the engine cannot enforce is still named.
    let e = c
        .compile(&fathom_server::reasoning::harmony_final_json(
            &json!({"type": "array", "uniqueItems": true}),
            1000,
        ))
        .unwrap_err();
    assert!(e.message.contains("uniqueItems"), "{e:?}");
}

/// Takes `limit` tokens the masks allow, each `prefer` where allowed (a
/// stand-in for a model that would write one word forever), else the
/// lowest id allowed, until the constraint ends; returns the text. At each
/// token the check of `prefer` alone (the greedy path's) agrees with the
/// mask.
fn run_on(
    state: &mut ConstraintState,
    tok: &fathom_engine::Tokenizer,
    prefer: u32,
    limit: usize,
) -> String {
    let mut ids = Vec::new();
    for _ in 0..limit {
        let alone = state.allows(prefer).unwrap();
        state.compute_mask().unwrap();
        assert_eq!(alone, state.mask().allows(prefer), "after {ids:?}");
        let id = if state.mask().allows(prefer) {
            prefer
        } else {
            (0..tok.vocab_size() as u32)
                .find(|&id| state.mask().allows(id))
                .unwrap()
        };
        if tok.end_of_generation(id) {
            break;
        }
        state.commit(id).unwrap();
        ids.push(id);
    }
    tok.decode(&ids, true)
}

/// Where `end` (the thought's end marker) starts in `text`, which
/// `run_on` wrote preferring " the": the thought before it is " the" only,
/// `bound` tokens of it or one less.
#[track_caller]
fn bounded_thought(text: &str, end: &str, bound: usize, what: &str) -> usize {
    let at = text
        .find(end)
        .unwrap_or_else(|| panic!("{what} {bound}: no {end} in {text:?}"));
    let thought = text[..at].matches(" the").count();
    assert_eq!(
        text[..at],
        " the".repeat(thought),
        "{what} {bound}: {text:?}"
    );
    assert!(
        thought <= bound && thought + 1 >= bound,
        "{what} {bound}: {thought} tokens of thought in {text:?}"
    );
    at
}

/// Issue 35: a harmony answer's analysis message is bounded. A "model"
/// that would write " the" forever gets `<|end|>` forced once the bound's
/// tokens are spent, then the message the constraint asks for: the final
/// channel's JSON, a tool call, or (a budget on a free answer) any
/// message but another analysis. A bound of 0 leaves no analysis.
#[test]
fn a_harmony_analysis_message_ends_at_its_bound_and_the_constrained_message_follows() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let the = tok.encode(" the", false, false);
    assert_eq!(the.len(), 1);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false});
    for bound in [1, 7, 20] {
        for (what, grammar, want) in [
            (
                "response_format",
                fathom_server::reasoning::harmony_final_json(&schema, bound),
                "<|start|>assistant<|channel|>final",
            ),
            (
                "tools",
                tool_grammar(ToolFormat::Harmony, &request(ToolChoice::Required), bound),
                "<|start|>assistant<|channel|>commentary to=functions.get_weather",
            ),
            (
                "free",
                fathom_server::reasoning::harmony_bounded(bound),
                "<|start|>assistant",
            ),
        ] {
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk(&mut state, &tok, "<|channel|>analysis<|message|>");
            assert_eq!(ok, n, "{what} {bound}");
            let text = run_on(&mut state, &tok, the[0], 120);
            let end = bounded_thought(&text, "<|end|>", bound, what);
            assert!(
                text[end..].starts_with(&format!("<|end|>{want}")),
                "{what} {bound}: {text:?}"
            );
            assert!(
                !text[end..].contains("analysis"),
                "{what} {bound}: {text:?}"
            );
        }
    }
    // A bound of 0: the answer opens with the constrained message.
    let grammar = fathom_server::reasoning::harmony_final_json(&schema, 0);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, "<|channel|>analysis<|message|>x");
    assert!(ok < n, "an analysis message went through with a bound of 0");
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, "<|channel|>final<|message|>{\"n\": 1}");
    assert_eq!(ok, n);
}

/// Issue 35: `parallel_tool_calls` under harmony. True: a required call
/// may be followed by more, each a message of its own; false: one.
#[test]
fn harmony_required_calls_are_one_or_several_as_parallel_tool_calls_says() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\", \"unit\": \"celsius\"}";
    let two = format!("{call}<|start|>assistant{call}");
    let mut parallel = request(ToolChoice::Required);
    parallel.parallel = true;
    let grammar = tool_grammar(ToolFormat::Harmony, &parallel, 100);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, &two);
    assert_eq!(ok, n, "two calls were refused at token {ok}");
    assert!(state.is_accepting());
    // `<|call|>` spelled out ends the calls, as gpt-oss's token does.
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, &format!("{call}<|call|>"));
    assert_eq!(ok, n);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(
        &mut state,
        &tok,
        &format!("{call}<|call|><|start|>assistant{call}"),
    );
    assert!(ok < n, "a call went through after <|call|>");
    let single = tool_grammar(ToolFormat::Harmony, &request(ToolChoice::Required), 100);
    let mut state = c.compile(&single).unwrap();
    let (ok, n) = walk(&mut state, &tok, &two);
    assert!(
        ok < n,
        "a second call went through without parallel_tool_calls"
    );
    let mut state = c.compile(&single).unwrap();
    let (ok, n) = walk(&mut state, &tok, call);
    assert_eq!(ok, n);
    assert!(state.is_accepting());
}

/// The Qwen3.5 vocabulary, and the close of the thinking block that the
/// real template's prompt (with tools, thinking on) leaves open, as the
/// server finds it: the reasoning format told from the template, and its
/// prompt's last tokens.
fn qwen35() -> (fathom_engine::Tokenizer, &'static str) {
    let tok = vocabulary("ggml-vocab-qwen35.gguf");
    let source = template("Qwen3.5-4B.jinja");
    let template = ChatTemplate::new(&source, "", "").unwrap();
    let req = request(ToolChoice::Required);
    let format = ToolFormat::detect(Some(&source));
    assert_eq!(format, ToolFormat::QwenXml);
    let prepared = tools::prepare(format, &[Message::new("user", "Weather in Oslo?")], &req);
    let ids = prompt_of(&tok, &template, &prepared, None);
    let tail = tok.decode(&ids[ids.len() - 8..], true);
    let reasoning = ReasoningFormat::detect(Some(&source)).unwrap();
    assert!(reasoning.opened_by(&tail), "{tail:?}");
    let ReasoningFormat::Block { close, .. } = reasoning else {
        panic!("{reasoning:?}")
    };
    (tok, close)
}

/// `then` after the thinking the prompt opened, bounded to `reasoning`
/// tokens, as the server wraps a constraint there.
fn after_thinking(close: &'static str, reasoning: usize, then: Grammar) -> Grammar {
    thought_then(ThinkingBlock::Opened { close }, reasoning, Some(then))
}

const QWEN_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";

/// Issue 35: Qwen3.5's prompt ends inside `<think>`. A required call is
/// the rest of the thinking (any text without `</think>`: code with
/// closing tags, `<`, even the call's own markup), `</think>`, then the
/// call; the answer cannot end before the block closes, nor put anything
/// but the call after it. Split and read back as the server does, the
/// thinking is the reasoning and the call a tool call.
#[test]
fn a_call_after_an_opened_think_block_comes_after_its_close() {
    let (tok, close) = qwen35();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let eog: Vec<u32> = tok.end_of_generation_ids().collect();
    let req = request(ToolChoice::Required);
    let grammar = after_thinking(close, 1000, tool_grammar(ToolFormat::QwenXml, &req, 1000));
    let thought = "The user wants Oslo's weather; 1 < 2, <b>bold</b>, a <tool_call> tag, </thinking> and </th>.";
    let answer = format!("{thought}\n</think>\n\n{QWEN_CALL}");
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, &answer);
    assert_eq!(ok, n, "refused at token {ok}: {answer:?}");
    state.compute_mask().unwrap();
    assert!(
        eog.iter().any(|&id| state.mask().allows(id)),
        "the call may end"
    );
    let split = ReasoningSplit::split(
        ReasoningFormat::detect(Some("<think>")).unwrap(),
        true,
        &answer,
    );
    assert_eq!(split.reasoning, thought);
    let read = tools::parse(ToolFormat::QwenXml, &split.content, &req, "t");
    assert_eq!(read.content, None);
    assert_eq!(read.calls.len(), 1);
    assert_eq!(
        read.calls[0].arguments,
        r#"{"city":"Oslo","unit":"celsius"}"#
    );

    // The call inside the thinking is thinking: the answer may not end there.
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, QWEN_CALL);
    assert_eq!(ok, n);
    state.compute_mask().unwrap();
    assert!(
        !eog.iter().any(|&id| state.mask().allows(id)),
        "the answer ended inside the thinking"
    );
    // After the close: the call, nothing else.
    for bad in [
        "Sure.\n</think>\n\nIt is sunny.".to_string(),
        format!("Sure.\n</think>\n\n\n\n{QWEN_CALL}"),
        QWEN_CALL
            .replace("celsius", "kelvin")
            .replace("<tool_call>", "x</think><tool_call>"),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &bad);
        assert!(ok < n, "{bad:?} went through");
    }
    // A budget of 0 closes the block at once.
    let grammar = after_thinking(close, 0, tool_grammar(ToolFormat::QwenXml, &req, 0));
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, &format!("</think>\n\n{QWEN_CALL}"));
    assert_eq!(ok, n);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk(&mut state, &tok, &format!("Hm.</think>\n\n{QWEN_CALL}"));
    assert!(ok < n, "thinking went through with a budget of 0");
}

/// Issue 35: `response_format` (a schema, `json_object`) and a GBNF
/// `grammar` after the thinking Qwen3.5's prompt opened: the JSON or the
/// grammar's text follows `</think>`; JSON at once, inside the thinking,
/// never completes the answer.
#[test]
fn json_and_grammars_after_an_opened_think_block_follow_its_close() {
    let (tok, close) = qwen35();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let json = "{\"name\": \"Ada\", \"age\": 36}";
    for (then, good, bad) in [
        (
            Grammar::JsonSchema(schema.clone()),
            format!("A person: Ada.\n</think>\n\n{json}"),
            "A person.\n</think>\n\n{\"name\": \"Ada\"}".to_string(),
        ),
        (
            Grammar::JsonObject,
            format!("An object.</think>{json}"),
            "An object.</think>[1]".to_string(),
        ),
        (
            Grammar::Gbnf("root ::= \"yes\" | \"no\"".into()),
            "Is it? Yes.\n</think>\n\nyes".to_string(),
            "Is it? Yes.\n</think>\n\nmaybe".to_string(),
        ),
    ] {
        let grammar = after_thinking(close, 1000, then);
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &good);
        assert_eq!(ok, n, "{good:?} was refused at token {ok}");
        assert!(state.is_stopped() || state.is_accepting(), "{good:?}");
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &bad);
        assert!(ok < n || !state.is_accepting(), "{bad:?} went through");
        // The JSON alone is thinking text: not a complete answer.
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, json);
        assert_eq!(ok, n);
        assert!(
            !state.is_accepting(),
            "{json} ended the answer inside the thinking"
        );
    }
    // A GBNF grammar that is not valid still says so.
    let e = c
        .compile(&after_thinking(
            close,
            10,
            Grammar::Gbnf("root ::= missing".into()),
        ))
        .unwrap_err();
    assert!(e.message.contains("missing"), "{e:?}");
}

/// What may follow a bounded thought, each with how its answer starts: a
/// required call to `get_weather` in `format`, a JSON schema's object, or
/// (a budget on a free answer) the " the" the test's "model" writes.
fn after_thought(
    format: ToolFormat,
    bound: usize,
) -> [(&'static str, Option<Grammar>, &'static str); 3] {
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false});
    let call = match format {
        ToolFormat::QwenXml => "<tool_call>\n<function=get_weather>",
        ToolFormat::Hermes => "<tool_call>\n{\"name\": \"get_weather\"",
        other => panic!("after_thought: no call written for {other:?}"),
    };
    [
        (
            "tools",
            Some(tool_grammar(format, &request(ToolChoice::Required), bound)),
            call,
        ),
        (
            "response_format",
            Some(Grammar::JsonSchema(schema)),
            "{\"n\": ",
        ),
        ("free", None, " the"),
    ]
}

/// Issue 35: the thinking Qwen3.5's prompt opened is bounded, as
/// harmony's analysis message is. A "model" that would think " the"
/// forever gets `</think>` forced once the bound's tokens are spent, then
/// what the constraint asks for: the call, the JSON, or (a budget on a
/// free answer) anything.
#[test]
fn an_opened_think_block_ends_at_its_bound_and_the_constrained_part_follows() {
    let (tok, close) = qwen35();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let the = tok.encode(" the", false, false);
    assert_eq!(the.len(), 1);
    for bound in [1, 7, 20] {
        for (what, then, want) in after_thought(ToolFormat::QwenXml, bound) {
            let grammar = thought_then(ThinkingBlock::Opened { close }, bound, then);
            let mut state = c.compile(&grammar).unwrap();
            let text = run_on(&mut state, &tok, the[0], 100);
            let end = bounded_thought(&text, close, bound, what);
            let after = text[end + close.len()..].trim_start_matches('\n');
            assert!(after.starts_with(want), "{what} {bound}: {text:?}");
        }
    }
}

/// `walk` over `text` as the model writes it: the vocabulary's marker
/// tokens whole.
fn walk_special(
    state: &mut ConstraintState,
    tok: &fathom_engine::Tokenizer,
    text: &str,
) -> (usize, usize) {
    walk_ids(state, &tok.encode(text, false, true))
}

/// Issue 35: Gemma 4's own call syntax over its real vocabulary, where
/// `<|tool_call>`, `<tool_call|>` and the string quote `<|"|>` are single
/// tokens. A required call is the function's arguments in Gemma's value
/// syntax, keys in the template's order, valid for the parameters: nested
/// objects and arrays, enums, bounded numbers and strings; the call ends
/// where `<|tool_response>` (an end-of-generation token) may follow.
#[test]
fn gemma4_required_calls_follow_the_schema_in_gemmas_syntax() {
    let tok = vocabulary("ggml-vocab-gemma-4.gguf");
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    for marker in ["<|tool_call>", "<tool_call|>", "<|\"|>", "<|tool_response>"] {
        assert_eq!(tok.encode(marker, false, true).len(), 1, "{marker}");
    }
    let response = tok.encode("<|tool_response>", false, true)[0];
    assert!(tok.end_of_generation(response));
    let req = ToolRequest {
        tools: vec![
            Tool {
                name: "plan_trip".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                    "stops": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string", "maxLength": 20}, "nights": {"type": "integer"}},
                        "required": ["name"]}, "maxItems": 3},
                    "Budget": {"type": ["number", "null"]},
                    "notes": {"type": "string"}},
                    "required": ["city", "days", "unit"]}),
                strict: true,
            },
            Tool {
                name: "now".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {}}),
                strict: true,
            },
        ],
        choice: ToolChoice::Required,
        parallel: false,
    };
    let grammar = tool_grammar(ToolFormat::Gemma4, &req, 0);
    let q = "<|\"|>";
    let good = [
        format!("<|tool_call>call:plan_trip{{Budget:1200.5,city:{q}Saint-Étienne, <near> Lyon{q},days:3,stops:[{{name:{q}Lyon{q},nights:2}},{{name:{q}Annecy{q}}}],unit:{q}celsius{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo{q},days:14,notes:{q}a \"b\" {{c}}{q},unit:{q}fahrenheit{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{Budget:null,city:{q}Oslo{q},days:1,stops:[],unit:{q}celsius{q}}}<tool_call|>"),
        "<|tool_call>call:now{}<tool_call|>".to_string(),
    ];
    for text in &good {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, text);
        assert_eq!(ok, n, "{text:?} was refused at token {ok}");
        state.compute_mask().unwrap();
        assert!(state.mask().allows(response), "{text:?} may end");
        // What the grammar takes is what the server reads back.
        let read = tools::parse(ToolFormat::Gemma4, text, &req, "g");
        assert_eq!(read.calls.len(), 1, "{text:?}");
        assert_eq!(read.content, None);
    }
    let read = tools::parse(ToolFormat::Gemma4, &good[0], &req, "g");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&read.calls[0].arguments).unwrap(),
        json!({"Budget": 1200.5, "city": "Saint-Étienne, <near> Lyon", "days": 3,
               "stops": [{"name": "Lyon", "nights": 2}, {"name": "Annecy"}], "unit": "celsius"})
    );
    let bad = [
        // Out of the enum, out of bounds, a required one missing, keys out
        // of the template's order, JSON's syntax, a string holding `<|`,
        // too long a name, too many stops, text before the call.
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo{q},days:3,unit:{q}kelvin{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo{q},days:15,unit:{q}celsius{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo{q},unit:{q}celsius{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{days:3,city:{q}Oslo{q},unit:{q}celsius{q}}}<tool_call|>"),
        "<|tool_call>call:plan_trip{\"city\": \"Oslo\", \"days\": 3, \"unit\": \"celsius\"}<tool_call|>".to_string(),
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo<|turn>{q},days:3,unit:{q}celsius{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo{q},days:3,stops:[{{name:{q}Abcdefghijklmnopqrstu{q}}}],unit:{q}celsius{q}}}<tool_call|>"),
        format!("<|tool_call>call:plan_trip{{city:{q}Oslo{q},days:3,stops:[{{name:{q}a{q}}},{{name:{q}b{q}}},{{name:{q}c{q}}},{{name:{q}d{q}}}],unit:{q}celsius{q}}}<tool_call|>"),
        "Sure.<|tool_call>call:now{}<tool_call|>".to_string(),
        "<|tool_call>call:launch{}<tool_call|>".to_string(),
    ];
    for text in &bad {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, text);
        assert!(ok < n, "{text:?} went through");
    }
    // parallel_tool_calls: calls back to back.
    let two = format!("{}{}", good[3], good[1]);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, &two);
    assert!(
        ok < n,
        "a second call went through without parallel_tool_calls"
    );
    let parallel = ToolRequest {
        parallel: true,
        ..req.clone()
    };
    let grammar = tool_grammar(ToolFormat::Gemma4, &parallel, 0);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, &two);
    assert_eq!(ok, n, "two calls were refused at token {ok}");
    assert_eq!(
        tools::parse(ToolFormat::Gemma4, &two, &parallel, "g")
            .calls
            .len(),
        2
    );
    // A schema keyword the lowering cannot enforce is named.
    let mut odd = req.clone();
    odd.tools[1].parameters =
        json!({"type": "object", "properties": {"at": {"type": "string", "format": "iri"}}});
    let e = tools::grammar(ToolFormat::Gemma4, &odd, 0, false, None).unwrap_err();
    assert!(
        e.contains("function now's parameters.properties.at: format \"iri\""),
        "{e}"
    );
    // Under `auto` too: a call the model opens is constrained like a
    // required one.
    odd.choice = ToolChoice::Auto;
    let e = tools::grammar(ToolFormat::Gemma4, &odd, 0, false, None).unwrap_err();
    assert!(e.contains("format \"iri\""), "{e}");
    // With schemas it can enforce, `auto` leaves the answer free until
    // `<|tool_call>` (one token here), then a call.
    let mut auto = req.clone();
    auto.choice = ToolChoice::Auto;
    let grammar = tool_grammar(ToolFormat::Gemma4, &auto, 0);
    let eog: Vec<u32> = tok.end_of_generation_ids().collect();
    for (answer, valid) in [
        ("It is sunny in Oslo, 1 < 2.".to_string(), true),
        (format!("Checking.{}", good[1]), true),
        (format!("Checking.{}", bad[0]), false),
        ("<|tool_call>call:launch{}<tool_call|>".to_string(), false),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, &answer);
        assert_eq!(ok == n, valid, "{answer:?}: refused at token {ok} of {n}");
        if valid {
            state.compute_mask().unwrap();
            assert!(eog.iter().any(|&id| state.mask().allows(id)), "{answer:?}");
        }
    }
}

/// Qwen3's real template (thinking on unless `enable_thinking` is false)
/// over the Qwen3.5 test vocabulary (llama.cpp's, which spells `<think>`
/// and `</think>` out in pieces): the prompt with a function opens no block, so the model
/// opens its own, as the server finds from the prompt's tokens; with
/// thinking off the template writes an empty closed block and none is
/// left to the model.
fn qwen3() -> (fathom_engine::Tokenizer, ThinkingBlock) {
    let tok = vocabulary("ggml-vocab-qwen35.gguf");
    let source = template("Qwen-Qwen3-0.6B.jinja");
    let template = ChatTemplate::new(&source, "", "").unwrap();
    let req = request(ToolChoice::Required);
    let format = ToolFormat::detect(Some(&source));
    assert_eq!(format, ToolFormat::Hermes);
    let reasoning = ReasoningFormat::detect(Some(&source)).unwrap();
    let prepared = tools::prepare(format, &[Message::new("user", "Weather in Oslo?")], &req);
    let prompt = |kwargs: Option<&fathom_tokenizer::TemplateKwargs>| {
        prompt_of(&tok, &template, &prepared, kwargs)
    };
    let off = json!({"enable_thinking": false})
        .as_object()
        .unwrap()
        .clone();
    assert_eq!(reasoning.prompt_block(&tok, &prompt(Some(&off))), None);
    let block = reasoning.prompt_block(&tok, &prompt(None)).unwrap();
    assert_eq!(
        block,
        ThinkingBlock::Own {
            open: "<think>",
            close: "</think>"
        }
    );
    (tok, block)
}

/// `then` (any text when `None`) after a thinking `block` (the prompt's,
/// or the optional one the model opens itself), bounded to `reasoning`
/// tokens.
fn thought_then(block: ThinkingBlock, reasoning: usize, then: Option<Grammar>) -> Grammar {
    Grammar::Thinking {
        block,
        reasoning,
        then: then.map(Box::new),
    }
}

const HERMES_CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n</tool_call>";

/// Issue 35: Qwen3 with thinking on opens `<think>` itself. A required
/// call may follow the model's own thinking block (any text without
/// `</think>`, then `</think>`), or come at once; the answer cannot end
/// inside the block nor put anything but the call after it, and text
/// that is neither block nor call is refused. Split and read back as the
/// server does (the answer does not start inside a block), the thinking
/// is the reasoning and the call a tool call.
#[test]
fn a_call_may_follow_the_models_own_think_block() {
    let (tok, block) = qwen3();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let eog: Vec<u32> = tok.end_of_generation_ids().collect();
    let req = request(ToolChoice::Required);
    let call = tool_grammar(ToolFormat::Hermes, &req, 1000);
    let grammar = thought_then(block, 1000, Some(call));
    let thought = "Oslo's weather: 1 < 2, <b>x</b>, a <tool_call> tag and </th>.";
    let qwen3_format = ReasoningFormat::detect(Some("<think>")).unwrap();
    for answer in [
        format!("<think>\n{thought}\n</think>\n\n{HERMES_CALL}"),
        format!("<think>\n\n</think>\n\n{HERMES_CALL}"),
        HERMES_CALL.to_string(),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, &answer);
        assert_eq!(ok, n, "refused at token {ok}: {answer:?}");
        state.compute_mask().unwrap();
        assert!(eog.iter().any(|&id| state.mask().allows(id)), "{answer:?}");
        let split = ReasoningSplit::split(qwen3_format, false, &answer);
        let read = tools::parse(ToolFormat::Hermes, &split.content, &req, "t");
        assert_eq!(read.content, None, "{answer:?}");
        assert_eq!(read.calls.len(), 1, "{answer:?}");
        assert_eq!(
            read.calls[0].arguments,
            r#"{"city":"Oslo","unit":"celsius"}"#
        );
    }
    let split = ReasoningSplit::split(
        qwen3_format,
        false,
        &format!("<think>\n{thought}\n</think>\n\n{HERMES_CALL}"),
    );
    assert_eq!(split.reasoning, thought);

    // The call inside the block is thinking: the answer may not end there.
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, &format!("<think>\n{HERMES_CALL}"));
    assert_eq!(ok, n);
    state.compute_mask().unwrap();
    assert!(
        !eog.iter().any(|&id| state.mask().allows(id)),
        "the answer ended inside the thinking"
    );
    for bad in [
        "Sure.".to_string(),
        " <think>Hm.</think>".to_string(),
        "<think>Sure.</think>\n\nIt is sunny.".to_string(),
        format!("<think>Hm.</think>\n\n\n\n{HERMES_CALL}"),
        format!("<think>Hm.</think><think>Hm.</think>{HERMES_CALL}"),
        HERMES_CALL.replace("celsius", "kelvin"),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, &bad);
        assert!(ok < n, "{bad:?} went through");
    }
    // A budget of 0 leaves no block: the call at once.
    let call = tool_grammar(ToolFormat::Hermes, &req, 0);
    let grammar = thought_then(block, 0, Some(call));
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, HERMES_CALL);
    assert_eq!(ok, n);
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, &format!("<think></think>{HERMES_CALL}"));
    assert!(ok < n, "a block went through with a budget of 0");
}

/// Issue 35: `response_format` (a schema, `json_object`) after Qwen3's
/// own thinking block, or at once; the JSON inside the block never
/// completes the answer.
#[test]
fn json_may_follow_the_models_own_think_block() {
    let (tok, block) = qwen3();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let json = "{\"name\": \"Ada\", \"age\": 36}";
    for then in [Grammar::JsonSchema(schema), Grammar::JsonObject] {
        let grammar = thought_then(block, 1000, Some(then));
        for good in [
            format!("<think>\nA person: Ada.\n</think>\n\n{json}"),
            format!("<think>Ada.</think>{json}"),
            json.to_string(),
        ] {
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk_special(&mut state, &tok, &good);
            assert_eq!(ok, n, "{good:?} was refused at token {ok}");
            assert!(state.is_stopped() || state.is_accepting(), "{good:?}");
        }
        for bad in [
            "<think>A person.</think>\n\n[1]".to_string(),
            format!("Ada: {json}"),
        ] {
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk_special(&mut state, &tok, &bad);
            assert!(ok < n || !state.is_accepting(), "{bad:?} went through");
        }
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, &format!("<think>{json}"));
        assert_eq!(ok, n);
        assert!(
            !state.is_accepting(),
            "the answer ended inside the thinking"
        );
    }
}

/// Issue 35: the model's own thinking block is bounded as an opened one
/// is. A "model" that opens `<think>` and would think " the" forever gets
/// `</think>` forced once the bound's tokens are spent, then what the
/// constraint asks for: the call, the JSON, or (a budget on a free
/// answer) anything. On a free answer without the block, the text may
/// not open one (its thinking would be unbounded).
#[test]
fn the_models_own_think_block_ends_at_its_bound_and_the_constrained_part_follows() {
    let (tok, block) = qwen3();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let the = tok.encode(" the", false, false);
    assert_eq!(the.len(), 1);
    for bound in [1, 7, 20] {
        for (what, then, want) in after_thought(ToolFormat::Hermes, bound) {
            let mut state = c.compile(&thought_then(block, bound, then)).unwrap();
            let (ok, n) = walk_special(&mut state, &tok, "<think>");
            assert_eq!(ok, n, "{what} {bound}");
            let text = run_on(&mut state, &tok, the[0], 100);
            let at = text
                .find("</think>")
                .unwrap_or_else(|| panic!("{what} {bound}: {text:?}"));
            assert_eq!(
                text[..at],
                " the".repeat(bound),
                "{what} {bound}: exactly the bound's tokens of thought"
            );
            let after = text[at + "</think>".len()..].trim_start_matches('\n');
            assert!(after.starts_with(want), "{what} {bound}: {text:?}");
        }
    }
    // A free answer without the block: anything but an opening block.
    let free = thought_then(block, 7, None);
    for good in [
        "It is 4.",
        "",
        "\n\n4 <think> is a tag",
        "<thinking",
        "<b>4</b>",
    ] {
        let mut state = c.compile(&free).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, good);
        assert_eq!(ok, n, "{good:?}");
        assert!(state.is_accepting(), "{good:?}");
    }
    for bad in [" <think>", "\n<think>"] {
        let mut state = c.compile(&free).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, bad);
        assert!(ok < n, "{bad:?} went through");
    }
    // A budget of 0 on a free answer: no block at all.
    let none = thought_then(block, 0, None);
    let mut state = c.compile(&none).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, "It is 4.");
    assert_eq!(ok, n);
    let mut state = c.compile(&none).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, "<think>");
    assert!(ok < n, "a block went through with a budget of 0");
}

/// Issue 35: Gemma 4 with `enable_thinking` opens its own thought
/// channel (`<|channel>thought` … `<channel|>`, single tokens of its
/// vocabulary) before a required call in its own syntax; the server finds
/// thinking on from `<|think|>` at the prompt's start. The thought is the
/// reasoning, the call a tool call.
#[test]
fn gemma4_may_think_in_its_own_channel_before_a_required_call() {
    let tok = vocabulary("ggml-vocab-gemma-4.gguf");
    let source = template("google-gemma-4-31B-it.jinja");
    let chat = ChatTemplate::new(&source, "<bos>", "").unwrap();
    let req = request(ToolChoice::Required);
    let reasoning = ReasoningFormat::detect(Some(&source)).unwrap();
    let prepared = tools::prepare(
        ToolFormat::Gemma4,
        &[Message::new("user", "Weather in Oslo?")],
        &req,
    );
    let prompt = |kwargs: Option<&fathom_tokenizer::TemplateKwargs>| {
        prompt_of(&tok, &chat, &prepared, kwargs)
    };
    assert_eq!(reasoning.prompt_block(&tok, &prompt(None)), None);
    let on = json!({"enable_thinking": true})
        .as_object()
        .unwrap()
        .clone();
    let block = reasoning.prompt_block(&tok, &prompt(Some(&on))).unwrap();
    assert_eq!(
        block,
        ThinkingBlock::Own {
            open: "<|channel>thought",
            close: "<channel|>"
        }
    );
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let call = tool_grammar(ToolFormat::Gemma4, &req, 1000);
    let grammar = thought_then(block, 1000, Some(call));
    let q = "<|\"|>";
    let call =
        format!("<|tool_call>call:get_weather{{city:{q}Oslo{q},unit:{q}celsius{q}}}<tool_call|>");
    for (answer, thought) in [
        (
            format!("<|channel>thought\nOslo, in celsius.<channel|>{call}"),
            "Oslo, in celsius.",
        ),
        (call.clone(), ""),
    ] {
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, &answer);
        assert_eq!(ok, n, "refused at token {ok}: {answer:?}");
        let split = ReasoningSplit::split(reasoning, false, &answer);
        assert_eq!(split.reasoning, thought);
        let read = tools::parse(ToolFormat::Gemma4, &split.content, &req, "g");
        assert_eq!(read.calls.len(), 1, "{answer:?}");
        assert_eq!(
            read.calls[0].arguments,
            r#"{"city":"Oslo","unit":"celsius"}"#
        );
    }
    let mut state = c.compile(&grammar).unwrap();
    let (ok, n) = walk_special(&mut state, &tok, "Sure.");
    assert!(ok < n, "text before the call went through");
}

/// Walks `answer` under `state`; returns whether every token was allowed
/// and, after it, an end-of-generation token is (the answer may end).
fn accepted_whole(state: &mut ConstraintState, ids: &[u32], eog: &[u32]) -> (bool, bool) {
    let (ok, n) = walk_ids(state, ids);
    if ok < n {
        return (false, false);
    }
    state.compute_mask().unwrap();
    (true, eog.iter().any(|&id| state.mask().allows(id)))
}

/// Issue 35: `tool_choice: "auto"` in every native format, over the real
/// SmolLM2 vocabulary (the markers as text). The answer is free until the
/// model writes the format's call opener: text (with `<`, tags, the words
/// of a call) is accepted and may end; from the opener on, the call is
/// the one `required` asks for, so a valid call passes and ends the answer
/// (without `parallel_tool_calls` nothing but the end follows), while an
/// argument outside the schema, an unknown function or a broken call are
/// refused. With `parallel_tool_calls`, text and more calls may follow.
#[test]
fn auto_answers_are_free_until_a_call_opens_then_the_call_is_constrained() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let eog: Vec<u32> = tok.end_of_generation_ids().collect();
    let q = "<|\"|>";
    let gemma = |unit: &str| {
        format!("<|tool_call>call:get_weather{{city:{q}Oslo{q},unit:{q}{unit}{q}}}<tool_call|>")
    };
    let harmony = |unit: &str| {
        format!("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{\"city\": \"Oslo\", \"unit\": \"{unit}\"}}")
    };
    // (format, free text, text then a valid call, a call refused, a second call)
    let cases: Vec<(ToolFormat, String, String, Vec<String>, String)> = vec![
        (
            ToolFormat::Hermes,
            "It is <b>sunny</b> in Oslo; 1 < 2 and \"name\": get_weather.".into(),
            format!("Let me check.\n{HERMES_CALL}"),
            vec![
                HERMES_CALL.replace("celsius", "kelvin"),
                HERMES_CALL.replace("get_weather", "launch"),
                "Sure <tool_call> is a tag".into(),
            ],
            HERMES_CALL.replace("Oslo", "Bergen"),
        ),
        (
            ToolFormat::QwenXml,
            "Sunny. <function=get_weather> is how I would call it.".into(),
            "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>".into(),
            vec![
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>".into(),
                "<tool_call>\n{\"name\": \"get_weather\"}".into(),
            ],
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nBergen\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>".into(),
        ),
        (
            ToolFormat::Gemma4,
            "Sunny, call:get_weather{} and <|tool_response> are just words.".into(),
            format!("Checking. {}", gemma("celsius")),
            vec![
                gemma("kelvin"),
                "<|tool_call>call:launch{}<tool_call|>".into(),
            ],
            gemma("fahrenheit"),
        ),
        (
            ToolFormat::Harmony,
            "<|channel|>final<|message|>It is sunny; functions.get_weather is not needed.".into(),
            format!("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant{}", harmony("celsius")),
            vec![
                harmony("kelvin"),
                "<|channel|>commentary to=functions.launch <|constrain|>json<|message|>{}".into(),
                // Another analysis message after the bounded one.
                "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b".into(),
            ],
            format!("<|start|>assistant{}", harmony("fahrenheit")),
        ),
    ];
    for (format, free, call, refused, second) in cases {
        let mut single = request(ToolChoice::Auto);
        let grammar = tool_grammar(format, &single, 100);
        let ids = |text: &str| tok.encode(text, false, false);
        let mut state = c
            .compile(&grammar)
            .unwrap_or_else(|e| panic!("{format:?}: {e:?}"));
        assert_eq!(
            accepted_whole(&mut state, &ids(&free), &eog),
            (true, true),
            "{format:?}: free text"
        );
        let mut state = c.compile(&grammar).unwrap();
        assert_eq!(
            accepted_whole(&mut state, &ids(&call), &eog),
            (true, true),
            "{format:?}: text then a call"
        );
        // The call ends the answer: only the end (or harmony's `<|call|>`).
        let mask = state.mask();
        let more: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|&id| mask.allows(id) && !eog.contains(&id))
            .collect();
        assert!(
            format == ToolFormat::Harmony && more.len() < 4 || more.is_empty(),
            "{format:?}: {} tokens may follow a call",
            more.len()
        );
        for bad in &refused {
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk(&mut state, &tok, bad);
            assert!(ok < n, "{format:?}: {bad:?} went through");
        }
        let two = format!("{call}\n{second}");
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &two);
        assert!(
            ok < n,
            "{format:?}: a second call without parallel_tool_calls"
        );
        if format == ToolFormat::Harmony {
            // A final message is the answer: a call header in it is text,
            // its arguments unchecked (gpt-oss calls from commentary only).
            let mut state = c.compile(&grammar).unwrap();
            let header = harmony("kelvin").replace("commentary", "final");
            assert_eq!(
                accepted_whole(&mut state, &ids(&header), &eog),
                (true, true),
                "a final message is free text"
            );
        }
        single.parallel = true;
        let grammar = tool_grammar(format, &single, 100);
        let mut state = c.compile(&grammar).unwrap();
        assert_eq!(
            accepted_whole(&mut state, &ids(&format!("{two} Done.")), &eog),
            (true, true),
            "{format:?}: two calls with parallel_tool_calls"
        );
        // What is accepted reads back as the calls.
        let read = tools::parse(format, &two, &single, "a");
        assert_eq!(read.calls.len(), 2, "{format:?}: {read:?}");
    }
}

/// llama.cpp's Llama 3 test vocabulary (Llama 3.0's) as Llama 3.1 names
/// its token 128010: `<|python_tag|>` rather than
/// `<|reserved_special_token_5|>`, a control token either way. gguf-py
/// (which scripts/test.sh installs) writes the copy.
fn llama31_vocabulary() -> fathom_engine::Tokenizer {
    let script = r#"
import sys, gguf
from gguf.scripts.gguf_new_metadata import copy_with_new_metadata, MetadataDetails
src, dst = sys.argv[1:3]
r = gguf.GGUFReader(src)
tokens = r.fields["tokenizer.ggml.tokens"].contents()
tokens[tokens.index("<|reserved_special_token_5|>")] = "<|python_tag|>"
w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents(), endianess=r.endianess)
renamed = MetadataDetails(gguf.GGUFValueType.ARRAY, tokens, sub_type=gguf.GGUFValueType.STRING)
copy_with_new_metadata(r, w, {"tokenizer.ggml.tokens": renamed}, [])
"#;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/ggml-vocab-llama-bpe.gguf");
    let dst =
        std::env::temp_dir().join(format!("fathom-llama31-vocab-{}.gguf", std::process::id()));
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&src)
        .arg(&dst)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "renaming the token (pip install gguf; scripts/test.sh does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tok = vocabulary_at(&dst);
    std::fs::remove_file(&dst).unwrap();
    tok
}

/// Issue 35: Llama 3 under `auto` writes no marker before a JSON call: an
/// answer that starts with `{` is a call (to a listed function, valid
/// arguments), any other text is free; over SmolLM2's vocabulary (the tag
/// as text), llama.cpp's Llama 3.0 one (no tag) and that one as Llama 3.1
/// names the tag, a control token the call may follow.
#[test]
fn llama3_auto_answers_starting_with_a_brace_are_calls() {
    let call =
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}";
    for (vocab, tok) in [
        ("smollm2", tokenizer()),
        ("llama 3.0", vocabulary("ggml-vocab-llama-bpe.gguf")),
        ("llama 3.1", llama31_vocabulary()),
    ] {
        let python_tag = tools::python_tag(&tok);
        assert_eq!(python_tag, vocab == "llama 3.1");
        let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
        let mut eog: Vec<u32> = tok.end_of_generation_ids().collect();
        if eog.is_empty() {
            eog.extend(tok.eos());
        }
        let grammar = tools::grammar(
            ToolFormat::Llama3,
            &request(ToolChoice::Auto),
            100,
            python_tag,
            None,
        )
        .unwrap();
        let mut answers = vec![
            ("The weather is fine; {\"name\": x}.".to_string(), true),
            (call.to_string(), true),
            (call.replace("celsius", "kelvin"), false),
            ("{\"response\": \"sunny\"}".into(), false),
        ];
        if python_tag {
            answers.push((format!("<|python_tag|>{call}"), true));
            answers.push(("<|python_tag|>The weather".into(), false));
        }
        for (answer, valid) in answers {
            let mut state = c.compile(&grammar).unwrap();
            let ids = tok.encode(&answer, false, true);
            let (ok, ends) = accepted_whole(&mut state, &ids, &eog);
            assert_eq!((ok, ends), (valid, valid), "{vocab}: {answer:?}");
        }
    }
}

/// Issue 35: `auto` after a thinking block. Qwen3's own block (thinking
/// on) comes first, bounded as with a required call, and the text after
/// it is free until `<tool_call>`, which makes it a valid call; Qwen3.5's
/// template opens the block, which closes before the free part.
#[test]
fn auto_after_a_thinking_block_is_free_until_a_call_opens() {
    let (tok, block) = qwen3();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let eog: Vec<u32> = tok.end_of_generation_ids().collect();
    let auto = |own: Option<&str>| {
        tools::grammar(
            ToolFormat::Hermes,
            &request(ToolChoice::Auto),
            1000,
            false,
            own,
        )
        .unwrap()
    };
    for (grammar, prefix) in [
        (
            thought_then(block, 1000, Some(auto(Some("<think>")))),
            "<think>\n",
        ),
        (after_thinking("</think>", 1000, auto(None)), ""),
    ] {
        for (answer, valid) in [
            (
                format!("{prefix}Oslo, 1 < 2.\n</think>\n\nIt is sunny."),
                true,
            ),
            // The thinking is not the free part: a tag in it opens no call.
            (
                format!("{prefix}A <tool_call> tag.\n</think>\n\nSunny."),
                true,
            ),
            (format!("{prefix}Need it.\n</think>\n\n{HERMES_CALL}"), true),
            (
                format!(
                    "{prefix}Need it.\n</think>\n\n{}",
                    HERMES_CALL.replace("celsius", "kelvin")
                ),
                false,
            ),
        ] {
            let mut state = c.compile(&grammar).unwrap();
            let ids = tok.encode(&answer, false, true);
            assert_eq!(
                accepted_whole(&mut state, &ids, &eog),
                (valid, valid),
                "{answer:?}"
            );
        }
    }
}

/// A `required` call to one function, `f`, of one parameter, `v`, of
/// `schema`.
fn string_of(schema: serde_json::Value) -> ToolRequest {
    ToolRequest {
        tools: vec![Tool {
            name: "f".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"v": schema}, "required": ["v"]}),
            strict: true,
        }],
        choice: ToolChoice::Required,
        parallel: false,
    }
}

/// Gemma 4's call of [`string_of`]'s function with the string `value`.
fn string_call(value: &str) -> String {
    format!("<|tool_call>call:f{{v:<|\"|>{value}<|\"|>}}<tool_call|>")
}

/// A string schema, values that meet it and values that do not: what
/// every format that writes strings bare (Gemma 4's, Qwen XML's) enforces
/// alike, `pattern` with JSON Schema's semantics (found anywhere unless
/// `^`/`$` anchor it), `format`, and the length bounds.
fn bare_string_cases() -> Vec<(
    serde_json::Value,
    &'static [&'static str],
    &'static [&'static str],
)> {
    vec![
        // Anchored both ends, a class, counted repeats, `\d`.
        (
            json!({"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"}),
            &["ABC-12", "XYZ-2024"],
            &["abc-12", "ABC-1", "xABC-12", "ABC-12345", "ABC-12 "],
        ),
        // Unanchored alternation: a match anywhere will do.
        (
            json!({"type": "string", "pattern": "cat|dog"}),
            &["cat", "concatenate", "dog\nday"],
            &["cow", "", "c-a-t"],
        ),
        // Anchored at the start only; at the end only.
        (
            json!({"type": "string", "pattern": "^(foo|ba+r)"}),
            &["foo", "baaar and more"],
            &["xfoo", "br"],
        ),
        (
            json!({"type": "string", "pattern": "[0-9]+$"}),
            &["v12", "7"],
            &["12a", "v"],
        ),
        // Each alternative anchored its own: starts with `ab` or holds
        // `cd`; starts with any character then `a`, or ends with `b`.
        (
            json!({"type": "string", "pattern": "^ab|cd"}),
            &["abX", "XcdY", "ab"],
            &["Xab", "a-b-c-d", ""],
        ),
        (
            json!({"type": "string", "pattern": "(^.a|b$)"}),
            &["\u{e9}a", "xab", "za!"],
            &["xxa", "bx", "a"],
        ),
        // With length bounds.
        (
            json!({"type": "string", "pattern": "^a+", "minLength": 3, "maxLength": 5}),
            &["aaa", "ab cd"],
            &["aa", "abcdef", "baaa"],
        ),
        (
            json!({"type": "string", "format": "date"}),
            &["2024-02-29", "1999-12-31"],
            &["2024-13-01", "2024-02-30", "x2024-01-01", "2024-1-1"],
        ),
        (
            json!({"type": "string", "format": "email", "maxLength": 12}),
            &["a@b.co", "x.y@z.org"],
            &["a@b@c", "a b@c.de", "abcdefgh@b.com"],
        ),
        // Both, with a bound: the string meets them all.
        (
            json!({"type": "string", "format": "date", "pattern": "^2024", "minLength": 10}),
            &["2024-05-01"],
            &["2023-05-01", "2024-05-32"],
        ),
    ]
}

/// String schemas no format that writes strings bare can enforce, and
/// what the 400 names: an unknown format, lookaround, a backreference,
/// `\b`, an anchor inside (and why), a pattern none within the bounds
/// meets, bounds no string meets.
fn unenforceable_strings() -> Vec<(serde_json::Value, &'static str)> {
    vec![
        (json!({"type": "string", "format": "iri"}), "format \"iri\""),
        (
            json!({"type": "string", "pattern": "(?=a)b"}),
            "pattern \"(?=a)b\"",
        ),
        (
            json!({"type": "string", "pattern": "(a)\\1"}),
            "pattern \"(a)\\\\1\"",
        ),
        (
            json!({"type": "string", "pattern": "\\bword"}),
            "pattern \"\\\\bword\"",
        ),
        (
            json!({"type": "string", "pattern": "a^b"}),
            "pattern \"a^b\"",
        ),
        (
            json!({"type": "string", "pattern": "(^a|b)c"}),
            "`^` and `$` may only anchor every match or a top-level alternative",
        ),
        (
            json!({"type": "string", "pattern": "^ab$", "minLength": 3}),
            "pattern \"^ab$\" and minLength 3",
        ),
        (
            json!({"type": "string", "minLength": 4, "maxLength": 2}),
            "minLength 4",
        ),
    ]
}

/// Issue 35: a Gemma 4 call's string arguments meet their `pattern` and
/// `format`, with the length bounds ([`bare_string_cases`]), over Gemma
/// 4's real vocabulary; no value holds a `<` ([`string_of`],
/// [`string_call`]). What cannot be enforced is 400 naming the keyword,
/// its value and place ([`unenforceable_strings`]; a pattern no string
/// without `<` meets too).
#[test]
fn gemma4_strings_meet_their_pattern_and_format() {
    let tok = vocabulary("ggml-vocab-gemma-4.gguf");
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let takes = |grammar: &Grammar, value: &str| {
        let mut state = c.compile(grammar).unwrap();
        let (ok, n) = walk_special(&mut state, &tok, &string_call(value));
        ok == n
    };
    let mut cases = bare_string_cases();
    cases.extend([
        // No `<`, even where the pattern allows one.
        (
            json!({"type": "string", "pattern": "cat|dog"}),
            &["a dog!"][..],
            &["a <cat>"][..],
        ),
        (
            json!({"type": "string", "pattern": "^.+$"}),
            &["a > b"],
            &["a < b", "<|turn>"],
        ),
        // No `type`: written as a string, which keeps the pattern.
        (json!({"pattern": "^x"}), &["xy"], &["y"]),
        (
            json!({"type": ["string", "null"], "format": "uuid"}),
            &["123e4567-e89b-12d3-a456-426614174000"],
            &[
                "123e4567e89b12d3a456426614174000",
                "123e4567-e89b-12d3-a456-42661417400",
            ],
        ),
    ]);
    for (schema, good, bad) in &cases {
        let grammar = tool_grammar(ToolFormat::Gemma4, &string_of(schema.clone()), 0);
        for value in *good {
            assert!(takes(&grammar, value), "{schema}: {value:?} was refused");
        }
        for value in *bad {
            assert!(!takes(&grammar, value), "{schema}: {value:?} went through");
        }
    }
    let mut refused = unenforceable_strings();
    refused.push((json!({"type": "string", "pattern": "<"}), "pattern \"<\""));
    for (schema, named) in refused {
        let e = tools::grammar(
            ToolFormat::Gemma4,
            &string_of(schema.clone()),
            0,
            false,
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("function f's parameters.properties.v") && e.contains(named),
            "{schema}: {e}"
        );
    }
}

/// The call of [`string_of`]'s function with the string `value` as
/// Qwen3.5's real template writes it in the history: the value bare.
fn qwen_string_call(template: &ChatTemplate, value: &str) -> String {
    let mut call = Message::new("assistant", "");
    call.tool_calls = vec![ToolCall {
        id: "c".into(),
        name: "f".into(),
        arguments: json!({ "v": value }).to_string(),
    }];
    let text = template
        .render(&[Message::new("user", "Go."), call], false)
        .unwrap();
    let start = text.find("<tool_call>").unwrap();
    let end = text.rfind("</tool_call>").unwrap() + "</tool_call>".len();
    text[start..end].to_string()
}

/// A string that may be null is bare text under its keywords, or `None`
/// or `null` (what the template writes for a null) whatever they say; both
/// read back as null.
#[test]
fn qwen_xml_nullable_strings_are_bounded_text_or_null() {
    let tok = tokenizer();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let mut req = request(ToolChoice::Required);
    req.tools[0].parameters = json!({"type": "object", "properties": {
        "city": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}},
        "required": ["city"]});
    let grammar = tool_grammar(ToolFormat::QwenXml, &req, 100);
    let null = serde_json::Value::Null;
    for (city, fits, read) in [
        ("Oslo", false, null.clone()),
        ("Osl", true, json!("Osl")),
        ("None", true, null.clone()),
        ("null", true, null.clone()),
        ("Nonesuch", false, null),
    ] {
        let text = format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>");
        let mut state = c.compile(&grammar).unwrap();
        let (ok, n) = walk(&mut state, &tok, &text);
        assert_eq!(ok == n, fits, "{city:?}: {ok} of {n} tokens");
        if fits {
            let got = tools::parse(ToolFormat::QwenXml, &text, &req, "n");
            assert_eq!(got.calls[0].arguments, json!({ "city": read }).to_string());
        }
    }
}

/// Issue 35: a Qwen XML call's string arguments, written bare as
/// Qwen3.5's real template writes them ([`qwen_string_call`]), meet their
/// `pattern` and `format`, with the length bounds ([`bare_string_cases`]),
/// over Qwen3.5's real vocabulary; what the grammar takes the parser reads
/// back as the value. A value may hold `<`, but no line of it after the
/// first starts with `<`, even where the pattern allows one (the
/// `</parameter>` line ends it). What cannot be enforced is 400 under
/// any `tool_choice`, naming the keyword, its value and the parameter
/// ([`unenforceable_strings`]; a pattern only such a line meets too).
#[test]
fn qwen_xml_strings_meet_their_pattern_and_format() {
    let (tok, _) = qwen35();
    let template = ChatTemplate::new(&template("Qwen3.5-4B.jinja"), "", "").unwrap();
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let mut cases = bare_string_cases();
    cases.push((
        json!({"type": "string", "pattern": "cat|dog"}),
        &["a <dog>!", "<cat>", "dog\n\nday"],
        &["cat\n<b>", "cat\n\n<b>"],
    ));
    for (schema, good, bad) in &cases {
        let req = string_of(schema.clone());
        let grammar = tool_grammar(ToolFormat::QwenXml, &req, 0);
        for (value, valid) in good
            .iter()
            .map(|v| (v, true))
            .chain(bad.iter().map(|v| (v, false)))
        {
            let text = qwen_string_call(&template, value);
            assert!(
                text.contains(&format!("<parameter=v>\n{value}\n</parameter>")),
                "{text:?}"
            );
            let mut state = c.compile(&grammar).unwrap();
            let (ok, n) = walk(&mut state, &tok, &text);
            assert_eq!(
                ok == n,
                valid,
                "{schema}: {value:?}, {ok} of {n} tokens taken"
            );
            if valid {
                let read = tools::parse(ToolFormat::QwenXml, &text, &req, "q");
                assert_eq!(read.content, None, "{read:?}");
                assert_eq!(read.calls[0].arguments, json!({ "v": value }).to_string());
            }
        }
    }
    let mut refused = unenforceable_strings();
    refused.push((
        json!({"type": "string", "pattern": "\\n<"}),
        "pattern \"\\\\n<\"",
    ));
    for (schema, named) in refused {
        for choice in [ToolChoice::Required, ToolChoice::Auto] {
            let mut req = string_of(schema.clone());
            req.choice = choice;
            let e = tools::grammar(ToolFormat::QwenXml, &req, 0, false, None).unwrap_err();
            assert!(
                e.contains("function f's parameter v") && e.contains(named),
                "{schema}: {e}"
            );
        }
    }
}

/// Issue 35: a `format` in a Gemma 4 call means what it means in JSON:
/// the table [`gemma4`]'s lowering holds (llguidance's, which it keeps
/// private) gives each value the verdict llguidance's JSON compiler gives
/// the same value as a JSON string, over Gemma 4's real vocabulary.
#[test]
fn gemma4_formats_agree_with_llguidances_json_formats() {
    let tok = vocabulary("ggml-vocab-gemma-4.gguf");
    let c = Constraints::new(&tok, tok.vocab_size()).unwrap();
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "date-time",
            &["2024-02-29T12:30:00Z", "2024-01-01t00:00:00.5+05:30"],
            &["2024-02-29 12:30:00Z", "2024-02-29T24:00:00Z"],
        ),
        (
            "time",
            &["23:59:60+01:00", "08:00:00z"],
            &["23:59", "8:00:00Z"],
        ),
        ("date", &["2024-12-31"], &["2024-11-31", "24-01-01"]),
        (
            "duration",
            &["P1Y2M3DT4H", "PT36H", "P2W"],
            &["P1H", "P", "1Y"],
        ),
        (
            "email",
            &["first.last@example.org", "a@[192.168.0.1]"],
            &["a@@b", "a b@c", "@b.c"],
        ),
        (
            "hostname",
            &["api.example.com", "localhost"],
            &["-bad.com", "a..b"],
        ),
        ("ipv4", &["192.168.0.1", "0.0.0.0"], &["256.1.1.1", "1.2.3"]),
        (
            "ipv6",
            &["fe80::1", "::", "1:2:3:4:5:6:7:8"],
            &["1:2:3", "fe80:::1"],
        ),
        (
            "uuid",
            &["123e4567-e89b-12d3-a456-426614174000"],
            &["123e4567e89b", "g23e4567-e89b-12d3-a456-426614174000"],
        ),
        (
            "uri",
            &["https://example.com/a?b=c#d", "urn:isbn:0451450523"],
            &["no scheme", "http://x y", "1http://x"],
        ),
        ("unknown", &["anything at all"], &[]),
    ];
    for &(format, good, bad) in cases {
        let schema = json!({"type": "string", "format": format});
        let gemma = tool_grammar(ToolFormat::Gemma4, &string_of(schema.clone()), 0);
        let json_grammar = Grammar::JsonSchema(schema.clone());
        for (value, valid) in good
            .iter()
            .map(|v| (v, true))
            .chain(bad.iter().map(|v| (v, false)))
        {
            let mut state = c.compile(&gemma).unwrap();
            let (ok, n) = walk_special(&mut state, &tok, &string_call(value));
            assert_eq!(ok == n, valid, "{format}: {value:?} in a Gemma 4 call");
            let mut state = c.compile(&json_grammar).unwrap();
            let (ok, n) = walk(&mut state, &tok, &format!("\"{value}\""));
            assert_eq!(ok == n, valid, "{format}: {value:?} as JSON");
        }
    }
    // A format llguidance does not know is refused by both.
    let schema = json!({"type": "string", "format": "iri"});
    assert!(c.compile(&Grammar::JsonSchema(schema)).is_err());
}
