//! The real chat templates of gpt-oss, Qwen3, Qwen3.5 and Gemma 4 (llama.cpp's
//! copies, which `scripts/fetch-vocab.sh` puts in `models/templates/`),
//! rendered through fathom's template engine as the server renders a chat
//! request: the tool format and reasoning markers told from the template's
//! text, the conversation readied for that format (`tools::prepare`), then
//! `encode_chat_tools`'s rendering with the generation prompt. Three
//! conversations each: a system and a user message; the same with two
//! functions; a history where the assistant reasoned and called a
//! function, the function answered and the user asked again.

mod common;

use common::{prompt_of, template, vocabulary};
use fathom_server::api::{Tool, ToolChoice, ToolRequest};
use fathom_server::reasoning::{ReasoningFormat, ThinkingBlock};
use fathom_server::tools::{self, ToolFormat};
use fathom_tokenizer::{encode_chat_tools, ChatTemplate, Message, TemplateKwargs, ToolCall};
use serde_json::json;

/// Two functions with JSON-schema parameters.
fn functions() -> ToolRequest {
    ToolRequest {
        tools: vec![
            Tool {
                name: "get_weather".into(),
                description: Some("Current weather of a city".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}),
                strict: false,
            },
            Tool {
                name: "get_time".into(),
                description: Some("Local time in a time zone (<Area>/<City>) & its offset".into()),
                parameters: json!({"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}),
                strict: false,
            },
        ],
        choice: ToolChoice::Auto,
        parallel: false,
    }
}

fn greeting() -> Vec<Message> {
    vec![
        Message::new("system", "You are terse."),
        Message::new("user", "What is the capital of Norway?"),
    ]
}

const REASONING: &str = "The user wants the weather in Oslo; call get_weather.";
const ARGUMENTS: &str = r#"{"city": "Oslo", "unit": "celsius"}"#;
const RESULT: &str = r#"{"temperature": 7, "sky": "cloudy"}"#;

/// A history: the assistant reasoned and called get_weather, the function
/// answered, the user asks again.
fn history() -> Vec<Message> {
    let mut call = Message::new("assistant", "");
    call.reasoning = Some(REASONING.into());
    call.tool_calls.push(ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: ARGUMENTS.into(),
    });
    let mut result = Message::new("tool", RESULT);
    result.tool_call_id = Some("call_1".into());
    vec![
        Message::new("system", "You are terse."),
        Message::new("user", "Weather in Oslo?"),
        call,
        result,
        Message::new("user", "And in Bergen?"),
    ]
}

/// A real template with what the server renders it with: the text of the
/// BOS token, and the vocabulary that tokenizes the prompt (where the test
/// has it).
struct Real<'v> {
    source: String,
    bos: &'static str,
    vocab: Option<&'v fathom_engine::Tokenizer>,
}

impl Real<'_> {
    /// The prompt the server renders for `messages` (with `tools` when
    /// given), as `encode_chat_tools` renders it; with a vocabulary it also
    /// tokenizes it as the server does and checks the tokens spell the text.
    fn render(
        &self,
        messages: &[Message],
        tools: Option<&ToolRequest>,
        kwargs: Option<&TemplateKwargs>,
    ) -> String {
        let format = ToolFormat::detect(Some(&self.source));
        let prepared = tools.map(|req| tools::prepare(format, messages, req));
        let (messages, tools) = match &prepared {
            Some(p) => (&p.messages[..], p.tools.as_ref()),
            None => (messages, None),
        };
        let template =
            ChatTemplate::new(&self.source, self.bos, "").expect("the template compiles");
        let (text, _) = template
            .render_with_contents(messages, tools, kwargs, true)
            .unwrap_or_else(|e| panic!("the template refused the messages: {e}"));
        if let Some(tok) = self.vocab {
            let ids = encode_chat_tools(tok, &template, messages, tools, kwargs, true, 1 << 20)
                .unwrap_or_else(|e| panic!("encode_chat_tools: {e}"));
            assert_eq!(tok.decode(&ids, true), text, "the tokens spell the prompt");
        }
        text
    }
}

/// Asserts that `parts` appear in `text` in this order, without overlap.
#[track_caller]
fn in_order(text: &str, parts: &[&str]) {
    let mut at = 0;
    for part in parts {
        match text[at..].find(part) {
            Some(i) => at += i + part.len(),
            None => panic!("{part:?} is not in the prompt after byte {at}:\n{text}"),
        }
    }
}

fn kwargs(v: serde_json::Value) -> TemplateKwargs {
    v.as_object().unwrap().clone()
}

#[test]
fn gpt_oss_renders_harmony_with_the_functions_namespace() {
    let source = template("openai-gpt-oss-120b.jinja");
    assert_eq!(ToolFormat::detect(Some(&source)), ToolFormat::Harmony);
    assert_eq!(
        ReasoningFormat::detect(Some(&source)),
        Some(ReasoningFormat::Harmony)
    );
    let t = Real {
        source: source.clone(),
        bos: "<|startoftext|>",
        vocab: None,
    };

    let text = t.render(&greeting(), None, None);
    in_order(
        &text,
        &[
            "<|start|>system<|message|>",
            // strftime_now, which the template calls for the date.
            "Current date: 2",
            "Reasoning: medium",
            "<|end|><|start|>developer<|message|># Instructions\n\nYou are terse.",
            "<|end|><|start|>user<|message|>What is the capital of Norway?<|end|>",
        ],
    );
    assert!(text.ends_with("<|end|><|start|>assistant"), "{text}");
    let date = text.split("Current date: ").nth(1).unwrap();
    let date = &date[..10];
    assert!(
        date.len() == 10 && date.chars().filter(|c| *c == '-').count() == 2,
        "{date}"
    );
    // reasoning_effort from chat_template_kwargs.
    let low = t.render(
        &greeting(),
        None,
        Some(&kwargs(json!({"reasoning_effort": "low"}))),
    );
    assert!(low.contains("Reasoning: low\n"), "{low}");

    let text = t.render(&greeting(), Some(&functions()), None);
    in_order(
        &text,
        &[
            "Calls to these tools must go to the commentary channel: 'functions'.<|end|>",
            "<|start|>developer<|message|># Instructions\n\nYou are terse.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n",
            "// Current weather of a city\ntype get_weather = (_: {\n// City name\ncity: string,\nunit?: \"celsius\" | \"fahrenheit\",\n}) => any;\n\n",
            "// Local time in a time zone (<Area>/<City>) & its offset\ntype get_time = (_: {\ntimezone: string,\n}) => any;\n\n",
            "} // namespace functions<|end|>",
            "<|start|>user<|message|>What is the capital of Norway?<|end|>",
        ],
    );
    assert!(text.ends_with("<|start|>assistant"), "{text}");

    let text = t.render(&history(), Some(&functions()), None);
    in_order(
        &text,
        &[
            "} // namespace functions<|end|>",
            "<|start|>user<|message|>Weather in Oslo?<|end|>",
            &format!("<|start|>assistant<|channel|>analysis<|message|>{REASONING}<|end|>"),
            // The call's arguments as JSON, with Python's separators.
            &format!("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{ARGUMENTS}<|call|>"),
            // The result as a JSON string.
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temperature\\\": 7, \\\"sky\\\": \\\"cloudy\\\"}\"<|end|>",
            "<|start|>user<|message|>And in Bergen?<|end|>",
        ],
    );
    assert!(text.ends_with("<|end|><|start|>assistant"), "{text}");
    assert!(!ReasoningFormat::Harmony.opened_by(&text));
}

#[test]
fn qwen35_renders_its_xml_calls_and_opens_the_thinking() {
    let source = template("Qwen3.5-4B.jinja");
    assert_eq!(ToolFormat::detect(Some(&source)), ToolFormat::QwenXml);
    let reasoning = ReasoningFormat::detect(Some(&source)).expect("Qwen3.5 thinks");
    assert_eq!(
        reasoning,
        ReasoningFormat::Block {
            open: "<think>",
            close: "</think>",
            on: None,
        }
    );
    let vocab = vocabulary("ggml-vocab-qwen35.gguf");
    let t = Real {
        source: source.clone(),
        bos: "",
        vocab: Some(&vocab),
    };

    let text = t.render(&greeting(), None, None);
    assert_eq!(
        text,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is the capital of Norway?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    );
    // The prompt leaves the model inside its thinking, unless turned off.
    assert!(reasoning.opened_by(&text));
    let off = kwargs(json!({"enable_thinking": false}));
    let text = t.render(&greeting(), None, Some(&off));
    assert!(
        text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{text}"
    );
    assert!(!reasoning.opened_by(&text));

    let text = t.render(&greeting(), Some(&functions()), None);
    in_order(
        &text,
        &[
            "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n",
            // Each tool as Hugging Face's tojson writes it.
            r#"{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}"#,
            "\n",
            // Unescaped, as Python's json.dumps leaves `<`, `>` and `&`.
            r#"{"type": "function", "function": {"name": "get_time", "description": "Local time in a time zone (<Area>/<City>) & its offset", "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}"#,
            "\n</tools>",
            "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>",
            "</IMPORTANT>\n\nYou are terse.<|im_end|>\n",
            "<|im_start|>user\nWhat is the capital of Norway?<|im_end|>\n",
        ],
    );
    assert!(text.ends_with("<|im_start|>assistant\n<think>\n"), "{text}");

    let text = t.render(&history(), Some(&functions()), None);
    in_order(
        &text,
        &[
            "</tools>",
            "<|im_start|>user\nWeather in Oslo?<|im_end|>\n",
            // Reasoning before the last user turn is dropped; the call's
            // arguments are written one parameter each.
            "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call><|im_end|>\n",
            &format!("<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"),
            "<|im_start|>user\nAnd in Bergen?<|im_end|>\n<|im_start|>assistant\n<think>\n",
        ],
    );
    assert!(!text.contains(REASONING), "{text}");
    assert!(text.ends_with("<think>\n"), "{text}");
    // What the model writes in that format is read back as the call.
    let answer = "<tool_call>\n<function=get_weather>\n<parameter=city>\nBergen\n</parameter>\n</function>\n</tool_call>";
    let read = tools::parse(ToolFormat::QwenXml, answer, &functions(), "x");
    assert_eq!(read.calls.len(), 1);
    assert_eq!(read.calls[0].name, "get_weather");
    assert_eq!(read.calls[0].arguments, r#"{"city":"Bergen"}"#);

    // A reasoning turn after the last user message keeps its thinking.
    let mut ongoing = history();
    ongoing.truncate(4);
    let text = t.render(&ongoing, Some(&functions()), None);
    in_order(
        &text,
        &[
            &format!("<|im_start|>assistant\n<think>\n{REASONING}\n</think>\n\n<tool_call>\n<function=get_weather>\n"),
            "<tool_response>\n",
            "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n",
        ],
    );
}

#[test]
fn gemma4_renders_turns_thinking_and_its_own_function_calls() {
    let vocab = vocabulary("ggml-vocab-gemma-4.gguf");
    // Each template with how it writes a function's result given natively:
    // the current one as a response block in the model's turn, the
    // interleaved one as a `tool` turn.
    let results = [
        format!(
            "<|tool_response>response:get_weather{{value:<|\"|>{RESULT}<|\"|>}}<tool_response|>"
        ),
        format!("<turn|>\n<|turn>tool\n{RESULT}<turn|>\n"),
    ];
    for (name, result) in [
        "google-gemma-4-31B-it.jinja",
        "google-gemma-4-31B-it-interleaved.jinja",
    ]
    .into_iter()
    .zip(&results)
    {
        let source = template(name);
        let t = Real {
            source: source.clone(),
            bos: "<bos>",
            vocab: Some(&vocab),
        };
        // Gemma 4 writes calls as `<|tool_call>call:NAME{...}<tool_call|>`.
        assert_eq!(
            ToolFormat::detect(Some(&source)),
            ToolFormat::Gemma4,
            "{name}"
        );
        let reasoning = ReasoningFormat::detect(Some(&source)).expect("Gemma 4 thinks");
        assert_eq!(
            reasoning,
            ReasoningFormat::Block {
                open: "<|channel>thought",
                close: "<channel|>",
                on: Some("<|think|>"),
            },
            "{name}"
        );

        // Unset, thinking is off: the model's turn opens an empty thought.
        let text = t.render(&greeting(), None, None);
        assert_eq!(
            text,
            "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nWhat is the capital of Norway?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
            "{name}"
        );
        assert!(!reasoning.opened_by(&text), "{name}");
        let on = kwargs(json!({"enable_thinking": true}));
        let text = t.render(&greeting(), None, Some(&on));
        assert!(
            text.starts_with("<bos><|turn>system\n<|think|>\nYou are terse.<turn|>\n"),
            "{name}: {text}"
        );
        assert!(text.ends_with("<|turn>model\n"), "{name}: {text}");

        // The template declares the functions and writes the history's
        // call and result in Gemma 4's own syntax.
        let text = t.render(&history(), Some(&functions()), None);
        in_order(
            &text,
            &[
                "<bos><|turn>system\nYou are terse.<|tool>declaration:get_weather{description:<|\"|>Current weather of a city<|\"|>",
                "city:{description:<|\"|>City name<|\"|>,type:<|\"|>STRING<|\"|>}",
                "<tool|><|tool>declaration:get_time{description:<|\"|>Local time in a time zone (<Area>/<City>) & its offset<|\"|>",
                "<tool|><turn|>\n",
                "<|turn>user\nWeather in Oslo?<turn|>\n",
                "<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>",
                result,
                "<|turn>user\nAnd in Bergen?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
            ],
        );
        assert!(!text.contains("You can call these functions"), "{name}");
        assert!(
            text.ends_with("<|turn>model\n<|channel>thought\n<channel|>"),
            "{name}"
        );
        // What the model writes in that syntax is read back as the call.
        let answer = "<|tool_call>call:get_weather{city:<|\"|>Bergen<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>";
        let read = tools::parse(ToolFormat::Gemma4, answer, &functions(), "x");
        assert_eq!(read.content, None, "{name}");
        assert_eq!(read.calls.len(), 1, "{name}");
        assert_eq!(read.calls[0].name, "get_weather");
        assert_eq!(
            read.calls[0].arguments,
            r#"{"city":"Bergen","unit":"celsius"}"#
        );
    }
}

/// Issue 35: which thinking block a constraint must let come first, as
/// the server reads it from the prompt's tokens (its first and last few):
/// Qwen3.5's template opens one (thinking on); Qwen3's and Gemma 4's
/// (with `enable_thinking`) leave the model to open its own; with
/// thinking off none, where the template writes an empty closed block
/// and also where Gemma's writes no generation prompt (after a tool
/// result in its turn) and only the missing `<|think|>` tells.
#[test]
fn the_thinking_block_comes_from_the_prompt_or_the_model_only_with_thinking_on() {
    let qwen = vocabulary("ggml-vocab-qwen35.gguf");
    let gemma = vocabulary("ggml-vocab-gemma-4.gguf");
    let on = kwargs(json!({"enable_thinking": true}));
    let off = kwargs(json!({"enable_thinking": false}));
    let think = |open| ThinkingBlock::Own {
        open,
        close: if open == "<think>" {
            "</think>"
        } else {
            "<channel|>"
        },
    };
    // A history whose last message is the function's result.
    let mut after_result = history();
    after_result.truncate(4);
    let cases: [(&str, &str, &fathom_engine::Tokenizer, &[Message], _, _); 10] = [
        (
            "Qwen3.5-4B.jinja",
            "",
            &qwen,
            &greeting(),
            None,
            Some(ThinkingBlock::Opened { close: "</think>" }),
        ),
        ("Qwen3.5-4B.jinja", "", &qwen, &greeting(), Some(&off), None),
        (
            "Qwen-Qwen3-0.6B.jinja",
            "",
            &qwen,
            &greeting(),
            None,
            Some(think("<think>")),
        ),
        (
            "Qwen-Qwen3-0.6B.jinja",
            "",
            &qwen,
            &after_result,
            None,
            Some(think("<think>")),
        ),
        (
            "Qwen-Qwen3-0.6B.jinja",
            "",
            &qwen,
            &greeting(),
            Some(&off),
            None,
        ),
        (
            "google-gemma-4-31B-it.jinja",
            "<bos>",
            &gemma,
            &greeting(),
            None,
            None,
        ),
        (
            "google-gemma-4-31B-it.jinja",
            "<bos>",
            &gemma,
            &greeting(),
            Some(&on),
            Some(think("<|channel>thought")),
        ),
        (
            "google-gemma-4-31B-it.jinja",
            "<bos>",
            &gemma,
            &after_result,
            None,
            None,
        ),
        (
            "google-gemma-4-31B-it.jinja",
            "<bos>",
            &gemma,
            &after_result,
            Some(&on),
            Some(think("<|channel>thought")),
        ),
        (
            "google-gemma-4-31B-it-interleaved.jinja",
            "<bos>",
            &gemma,
            &greeting(),
            Some(&on),
            Some(think("<|channel>thought")),
        ),
    ];
    for (i, (name, bos, tok, messages, kwargs, want)) in cases.into_iter().enumerate() {
        let source = template(name);
        let format = ToolFormat::detect(Some(&source));
        let prepared = tools::prepare(format, messages, &functions());
        let chat = ChatTemplate::new(&source, bos, "").unwrap();
        let ids = prompt_of(tok, &chat, &prepared, kwargs);
        let reasoning = ReasoningFormat::detect(Some(&source)).unwrap();
        assert_eq!(
            reasoning.prompt_block(tok, &ids),
            want,
            "case {i}, {name}: {:?}",
            tok.decode(&ids, true)
        );
    }
}
