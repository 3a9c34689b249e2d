//! Function calling: how a chat request's `tools` reach the model, which
//! constraint its answer decodes under, and how the answer is read back
//! into OpenAI's `tool_calls`.
//!
//! Six formats, chosen from the model's chat template:
//! - **Hermes** (Qwen2.5, Qwen3, Hermes and others whose template writes
//!   `<tool_call>`): the template renders `tools`; a call is
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
//! - **Qwen XML** (Qwen3.5 and Qwen3-Coder, whose template writes
//!   `<tool_call>` with `<function=`): the template renders `tools`; a call
//!   is `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>
//!   \n...</function>\n</tool_call>`, a value the text of a string and the
//!   JSON of anything else (vLLM's `qwen3_coder` parser reads it so).
//! - **Llama 3** (Llama 3.1/3.2, whose template knows `<|python_tag|>`):
//!   the template renders `tools`; a call is a JSON object
//!   `{"name": ..., "parameters": {...}}`, maybe after `<|python_tag|>`.
//! - **Harmony** (gpt-oss, whose template writes `<|channel|>` headers):
//!   the template renders `tools`; a call is a commentary message to the
//!   function, `<|channel|>commentary to=functions.NAME <|constrain|>json
//!   <|message|>{...}<|call|>` (the recipient may stand before
//!   `<|channel|>` too), after the model's reasoning. gpt-oss ends
//!   generation at a call's `<|call|>`; with `parallel_tool_calls` a
//!   required call may be followed by more, each a message of its own
//!   (`<|start|>assistant...`).
//! - **Gemma 4** (whose template writes `<|tool_call>call:`): the template
//!   renders `tools`; a call is `<|tool_call>call:NAME{KEY:VALUE,...}
//!   <tool_call|>` in Gemma's own value syntax ([`crate::gemma4`]), several
//!   back to back.
//! - **Generic** (templates with no tool support, such as SmolLM2's): the
//!   functions are described in the system message and the answer is
//!   always constrained to one JSON object, `{"tool_call": {"name",
//!   "arguments"}}` or `{"response": "..."}`, so any model can call
//!   functions.
//!
//! With `tool_choice` `required` or a named function, the answer is
//! constrained to calls whose arguments validate against the function's
//! `parameters` in every format; with `auto` the generic format is
//! constrained too (call or response), and a native one is free text until
//! the model opens a call (llama.cpp's "lazy grammar"), which from its
//! opener on is constrained as a required call is.

use fathom_engine::Message;
use fathom_tokenizer::ToolCall;
use serde_json::{json, Map, Value};

use crate::api::{Tool, ToolChoice, ToolRequest};
use crate::bare_string;
use crate::constraint::{lark_json, lark_literal, Grammar};
use crate::gemma4;
use crate::reasoning::{self, CALL, CHANNEL, MESSAGE, START};

/// How a model writes function calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    QwenXml,
    Llama3,
    Harmony,
    Gemma4,
    Generic,
}

impl ToolFormat {
    /// The format a chat template speaks (`None`: no template).
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(t) = template else {
            return ToolFormat::Generic;
        };
        if reasoning::is_harmony(t) {
            ToolFormat::Harmony
        } else if t.contains(gemma4::OPEN) {
            ToolFormat::Gemma4
        } else if t.contains("<tool_call>") && t.contains("<function=") {
            ToolFormat::QwenXml
        } else if t.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if t.contains("<|python_tag|>") || (t.contains("tools") && t.contains("<|eom_id|>"))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::QwenXml => "qwen_xml",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Harmony => "harmony",
            ToolFormat::Gemma4 => "gemma4",
            ToolFormat::Generic => "generic",
        }
    }
}

/// The functions a call may name under `choice`.
fn allowed(req: &ToolRequest) -> Vec<&Tool> {
    match &req.choice {
        ToolChoice::Function(name) => req.tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => req.tools.iter().collect(),
    }
}

/// OpenAI's `tools` list, as templates read it.
pub fn template_tools(req: &ToolRequest) -> Value {
    Value::Array(
        req.tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), json!(t.name));
                if let Some(d) = &t.description {
                    f.insert("description".into(), json!(d));
                }
                f.insert("parameters".into(), t.parameters.clone());
                json!({"type": "function", "function": f})
            })
            .collect(),
    )
}

/// The schema of one call: `{name_key: name, args_key: arguments}`.
fn call_schema(t: &Tool, args_key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": t.name}, args_key: t.parameters},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// The schema of a call to any of `allowed` ([`call_schema`] each).
fn calls_schema(allowed: &[&Tool], args_key: &str) -> Value {
    any_of(allowed.iter().map(|t| call_schema(t, args_key)).collect())
}

fn any_of(schemas: Vec<Value>) -> Value {
    if schemas.len() == 1 {
        schemas.into_iter().next().unwrap_or(Value::Null)
    } else {
        json!({"anyOf": schemas})
    }
}

/// The messages the template renders, and the tools it gets.
pub struct Prepared {
    pub messages: Vec<Message>,
    /// `tools` for the template (native formats).
    pub tools: Option<Value>,
}

/// Readies `messages` for `req` in `format`.
pub fn prepare(format: ToolFormat, messages: &[Message], req: &ToolRequest) -> Prepared {
    match format {
        ToolFormat::Generic => Prepared {
            messages: generic_messages(messages, req),
            tools: None,
        },
        ToolFormat::Hermes
        | ToolFormat::QwenXml
        | ToolFormat::Llama3
        | ToolFormat::Harmony
        | ToolFormat::Gemma4 => Prepared {
            messages: messages.to_vec(),
            tools: Some(template_tools(req)),
        },
    }
}

/// The constraint of the answer to `req` in `format`; `reasoning`: the
/// most tokens a harmony answer's analysis message may take
/// ([`reasoning::harmony_grammar`]), known once the request's
/// `max_tokens` is; `python_tag`: whether the vocabulary has Llama 3's
/// `<|python_tag|>` as a control token (the grammar then names it so);
/// `own_block`: the open marker of a thinking block the model may open
/// itself before the answer (Qwen3's `<think>` with thinking on), which
/// free text under `auto` does not start with, so that the block's own
/// grammar ([`crate::reasoning::thinking_grammar`]) bounds it and a call
/// opener inside it opens no call. An error names a function's schema
/// that the format cannot enforce: Gemma 4's ([`crate::gemma4`]) where a
/// call is required, a Qwen XML string's keywords ([`xml_parameters`])
/// under any choice.
///
/// With `required` or a named function the answer is calls only. With
/// `auto` in a native format it is free text until the model opens a call
/// ([`Opened::opener`]); from there the call is the one `required` asks
/// for, and after it only more calls and text with `parallel_tool_calls`,
/// else the end ([`lazy_calls`]). In the generic format it is one JSON
/// object, a call or (with `auto`) a response.
pub fn grammar(
    format: ToolFormat,
    req: &ToolRequest,
    reasoning: usize,
    python_tag: bool,
    own_block: Option<&str>,
) -> Result<Grammar, String> {
    let must_call = !matches!(req.choice, ToolChoice::Auto);
    let allowed = allowed(req);
    let Opened {
        opener,
        rest,
        rules,
    } = match format {
        ToolFormat::Generic => return Ok(generic_grammar(&allowed, must_call)),
        ToolFormat::Llama3 => return Ok(llama3_grammar(&allowed, req, python_tag)),
        ToolFormat::Hermes => Opened {
            opener: "<tool_call>",
            rest: format!(
                "\"\\n\" {} \"\\n</tool_call>\"",
                lark_json(&calls_schema(&allowed, "arguments"))
            ),
            rules: String::new(),
        },
        ToolFormat::QwenXml => {
            let mut rules = String::new();
            let calls = allowed
                .iter()
                .map(|t| {
                    Ok(format!(
                        "{} {} \"</function>\\n</tool_call>\"",
                        lark_literal(&format!("\n<function={}>\n", t.name)),
                        xml_parameters(t, &mut rules)?
                    ))
                })
                .collect::<Result<Vec<String>, String>>()?;
            Opened {
                opener: "<tool_call>",
                rest: format!("({})", calls.join(" | ")),
                rules,
            }
        }
        // A commentary message to the function, its arguments valid for
        // its parameters.
        ToolFormat::Harmony => {
            let calls: Vec<String> = allowed
                .iter()
                .map(|t| {
                    format!(
                        "\"{} <|constrain|>json{MESSAGE}\" {}",
                        t.name,
                        lark_json(&t.parameters)
                    )
                })
                .collect();
            Opened {
                opener: "to=functions.",
                rest: format!("({})", calls.join(" | ")),
                rules: String::new(),
            }
        }
        ToolFormat::Gemma4 => {
            let functions: Vec<(&str, &Value)> = allowed
                .iter()
                .map(|t| (t.name.as_str(), &t.parameters))
                .collect();
            let (rest, rules) = gemma4::call_rest(&functions)?;
            Opened {
                opener: gemma4::OPENER,
                rest,
                rules,
            }
        }
    };
    let call = format!("{} {rest}", lark_literal(opener));
    Ok(match (format, must_call) {
        // The model may reason first, then calls one of the functions;
        // with `parallel_tool_calls`, maybe more, each a message of its
        // own. gpt-oss's `<|call|>` ends generation (an end-of-generation
        // token where the grammar may end); a vocabulary that spells it
        // out writes it as text, which ends the calls too.
        (ToolFormat::Harmony, true) => {
            let last = if req.parallel {
                format!("call (\"{START}assistant\" call)* \"{CALL}\"?")
            } else {
                format!("call \"{CALL}\"?")
            };
            reasoning::harmony_grammar(
                &format!("last: {last}\ncall: \"{CHANNEL}commentary \" {call}\n"),
                reasoning,
            )
        }
        // Reasoning first as with a required call, then the final answer
        // (any text: gpt-oss addresses functions from commentary only, so
        // no call follows `final`) or commentary (a preamble, or a call's
        // header, the recipient after the channel).
        (ToolFormat::Harmony, false) => reasoning::harmony_grammar(
            &format!(
                "last: \"{CHANNEL}final\" FREE_TEXT | \"{CHANNEL}commentary\" calls\n{}",
                lazy_calls(
                    opener,
                    &format!("{rest} \"{CALL}\"?"),
                    &rules,
                    req.parallel,
                    own_block
                )
            ),
            reasoning,
        ),
        (_, true) => {
            // Hermes and Qwen XML put parallel calls on lines of their
            // own; Gemma 4 writes them back to back.
            let between = if format == ToolFormat::Gemma4 {
                ""
            } else {
                "\"\\n\" "
            };
            let start = if req.parallel {
                format!("call ({between}call)*")
            } else {
                "call".into()
            };
            Grammar::Lark(format!("start: {start}\ncall: {call}\n{rules}"))
        }
        (_, false) => Grammar::Lark(format!(
            "start: calls\n{}",
            lazy_calls(opener, &rest, &rules, req.parallel, own_block)
        )),
    })
}

/// Whether `tokenizer` has Llama 3's `<|python_tag|>` as a control token
/// (Llama 3.1's and 3.2's vocabularies), which a grammar names as a token;
/// a vocabulary that spells it out writes it as text.
pub fn python_tag(tokenizer: &fathom_engine::Tokenizer) -> bool {
    tokenizer
        .token_id("<|python_tag|>")
        .is_some_and(|id| tokenizer.piece(id, false).is_empty())
}

/// A native format's call to an allowed function, split where the model
/// opens it.
struct Opened {
    /// The text that opens a call (under `auto`, what makes the rest of
    /// the answer a call).
    opener: &'static str,
    /// The Lark expression of the rest of one call.
    rest: String,
    /// The Lark rules `rest` uses.
    rules: String,
}

/// The Lark rules of `calls` (with `rules`, which `rest` uses): an answer
/// under `auto` that is free text until it holds `opener`, which makes
/// the text after it `rest` (the rest of a call). With `parallel`, text
/// and calls may follow; without, a call ends the answer. llguidance's
/// lazy lexeme (`[lazy]`: the shortest match) ends the free text at the
/// first `opener`, so free text never holds one. The answer's first text
/// does not start with `own_block` ([`grammar`]).
fn lazy_calls(
    opener: &str,
    rest: &str,
    rules: &str,
    parallel: bool,
    own_block: Option<&str>,
) -> String {
    let calls = if parallel {
        "calls: FIRST_TEXT | first_head call_rest (call_head call_rest)* FREE_TEXT"
    } else {
        "calls: FIRST_TEXT | first_head call_rest"
    };
    let first = match own_block {
        Some(open) => reasoning::text_not_opening(open),
        None => "(?s:.*)".into(),
    };
    let opener = lark_literal(opener);
    format!(
        "{calls}\n\
         first_head[lazy]: FIRST_TEXT {opener}\n\
         call_head[lazy]: FREE_TEXT {opener}\n\
         call_rest: {rest}\n\
         FIRST_TEXT: /{first}/\n\
         FREE_TEXT: /(?s:.*)/\n\
         {rules}"
    )
}

/// The generic format's answer: one JSON object, a call to one of
/// `allowed` or (unless `must_call`) a response.
fn generic_grammar(allowed: &[&Tool], must_call: bool) -> Grammar {
    let mut branches: Vec<Value> = allowed
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"tool_call": call_schema(t, "arguments")},
                "required": ["tool_call"],
                "additionalProperties": false,
            })
        })
        .collect();
    if !must_call {
        branches.push(json!({
            "type": "object",
            "properties": {"response": {"type": "string"}},
            "required": ["response"],
            "additionalProperties": false,
        }));
    }
    Grammar::JsonSchema(any_of(branches))
}

/// A Llama 3 answer: a call is a JSON object that the answer starts with
/// (`{"name": ..., "parameters": ...}`, maybe after `<|python_tag|>`
/// where the vocabulary has it as a control token; with
/// `parallel_tool_calls` several, separated by `; `). With `required` or
/// a named function the answer is one call; with `auto` it is one, or any
/// text that does not start with `{` (Llama 3 writes no marker before a
/// JSON call, so its `{` is the opener).
fn llama3_grammar(allowed: &[&Tool], req: &ToolRequest, python_tag: bool) -> Grammar {
    let call = lark_json(&calls_schema(allowed, "parameters"));
    if !matches!(req.choice, ToolChoice::Auto) {
        return Grammar::Lark(format!("start: {call}\n"));
    }
    let tag = if python_tag { "<|python_tag|>? " } else { "" };
    let calls = if req.parallel {
        "call (\"; \" call)*"
    } else {
        "call"
    };
    Grammar::Lark(format!(
        "start: FREE_TEXT | {tag}{calls}\ncall: {call}\nFREE_TEXT: /([^{{](?s:.*))?/\n"
    ))
}

/// A Qwen XML string value's text (Lark regex syntax): no line after its
/// first starts with `<`, blank lines before it included, so that the
/// first `\n<` is [`XML_END`]'s and the parser ends the value there.
const XML_TEXT: &str = r"(?:[^\n]|\n+[^\n<])*\n*";
/// A Qwen XML value's end, the `</parameter>` line.
const XML_END: &str = r"\n<\/parameter>\n";

/// The Lark expression of a Qwen XML call's parameters under `t`'s
/// `parameters`: each property in the schema's order, the required ones
/// always, the others maybe. A string's value ([`bare_string`]) is its
/// text, any text that does not hold a line starting with `<` after its
/// first (so the lexeme that ends at `\n</parameter>\n` is unambiguous),
/// or `None` or `null` where it may be null; with `minLength`,
/// `maxLength`, `pattern` or `format`, such text that meets them, one
/// terminal added to `rules` ([`bare_string::token`]); a choice of
/// strings (`enum`, `const`) one of them bare; any other value JSON valid
/// for its schema. An error names a string keyword that cannot be
/// enforced, with the function and the parameter.
fn xml_parameters(t: &Tool, rules: &mut String) -> Result<String, String> {
    let schema = &t.parameters;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map_or_else(Vec::new, |r| r.iter().filter_map(Value::as_str).collect());
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(String::new());
    };
    let mut params = Vec::with_capacity(properties.len());
    for (key, sub) in properties {
        let open = lark_literal(&format!("<parameter={key}>\n"));
        let param = if let Some(bare) = bare_string(sub) {
            let syntax = bare_string::Syntax {
                name: "Qwen XML's call syntax",
                text: XML_TEXT,
                without: "a line starting with `<` after its first",
                end: XML_END,
            };
            let place = format!("function {}'s parameter {key}", t.name);
            match bare_string::token(bare.schema, &syntax, &place)? {
                // Any text, `None` and `null` among them.
                None => format!("({open} /{XML_TEXT}{XML_END}/)"),
                Some(body) => {
                    let name = format!("XML_TEXT_{}", rules.lines().count());
                    rules.push_str(&format!("{name}: {body}\n"));
                    if bare.nullable {
                        format!("({open} ({name} | (\"None\" | \"null\") \"\\n</parameter>\\n\"))")
                    } else {
                        format!("({open} {name})")
                    }
                }
            }
        } else {
            // The template writes a string bare (`| string`), so a
            // choice of strings is a choice of bare texts.
            let value = match string_choices(sub) {
                Some(choices) => format!(
                    "({})",
                    choices
                        .iter()
                        .map(|c| lark_literal(c))
                        .collect::<Vec<_>>()
                        .join(" | ")
                ),
                None => lark_json(sub),
            };
            format!("({open} {value} \"\\n</parameter>\\n\")")
        };
        params.push(if required.contains(&key.as_str()) {
            param
        } else {
            format!("{param}?")
        });
    }
    Ok(params.join(" "))
}

/// A parameter the Qwen XML format writes bare, as its template's
/// `| string` does: a string that is not a choice of values (a string with
/// an `enum` or `const` is one of its choices), its keywords in `schema`,
/// enforced on the text ([`xml_parameters`]). `nullable` where null is
/// allowed too (`"type": ["string", "null"]`, or `anyOf`/`oneOf` of such a
/// string and `{"type": "null"}`, as Pydantic writes `Optional[str]`): the
/// template writes a null `None`, and `None` or `null` read back as null.
struct BareString<'a> {
    schema: &'a Map<String, Value>,
    nullable: bool,
}

fn bare_string(schema: &Value) -> Option<BareString<'_>> {
    let o = schema.as_object()?;
    let no_choice = ["enum", "const"].iter().all(|k| !o.contains_key(*k));
    match o.get("type") {
        Some(Value::String(t)) => (t == "string" && no_choice).then_some(BareString {
            schema: o,
            nullable: false,
        }),
        Some(Value::Array(types)) => {
            let mut names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            names.sort_unstable();
            (names == ["null", "string"] && no_choice).then_some(BareString {
                schema: o,
                nullable: true,
            })
        }
        Some(_) => None,
        None => {
            // Only annotations beside the union, which they do not narrow.
            let annotation = |k: &str| ["title", "description", "default"].contains(&k);
            let (key, branches) = o.iter().find(|(k, _)| *k == "anyOf" || *k == "oneOf")?;
            if !o.keys().all(|k| k == key || annotation(k)) {
                return None;
            }
            let [a, b] = branches.as_array()?.as_slice() else {
                return None;
            };
            let is_null = |v: &Value| *v == serde_json::json!({"type": "null"});
            let string = match (is_null(a), is_null(b)) {
                (true, false) => b,
                (false, true) => a,
                _ => return None,
            };
            let inner = bare_string(string)?;
            (!inner.nullable).then_some(BareString {
                nullable: true,
                ..inner
            })
        }
    }
}

/// The strings `schema` allows when it is an `enum` or `const` of strings
/// only.
fn string_choices(schema: &Value) -> Option<Vec<&str>> {
    let values = match (schema.get("enum"), schema.get("const")) {
        (Some(Value::Array(values)), None) => values.iter().collect::<Vec<_>>(),
        (None, Some(value)) => vec![value],
        _ => return None,
    };
    let choices: Vec<&str> = values.iter().filter_map(|v| v.as_str()).collect();
    (!choices.is_empty() && choices.len() == values.len()).then_some(choices)
}

/// A Qwen XML call's body (between `<tool_call>` and `</tool_call>`): the
/// function's name and its arguments, each value typed by the function's
/// schema in `req` (a string, [`bare_string`], is its text, a nullable
/// one's `None` or `null` null; anything else its JSON,
/// or Python's `True`, `False`, `None` as the template writes them, else
/// the text).
fn xml_call(body: &str, req: &ToolRequest) -> Option<(String, Value)> {
    let inner = body.trim().strip_prefix("<function=")?;
    let close = inner.find('>')?;
    let name = inner[..close].trim();
    let mut rest = inner[close + 1..]
        .trim()
        .strip_suffix("</function>")?
        .trim();
    let properties = req
        .tools
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.parameters.get("properties"));
    let mut args = Map::new();
    while let Some(param) = rest.strip_prefix("<parameter=") {
        let close = param.find('>')?;
        let key = param[..close].trim();
        let value = &param[close + 1..];
        // The grammar writes the value after a newline and ends it at the
        // `</parameter>` that starts a line after it: its first line may
        // start with the tag itself, so the search starts past that
        // newline.
        let open = usize::from(value.starts_with('\n'));
        let end = open + closing(&value[open..], "</parameter>")?;
        let raw = &value[open..end];
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let schema = properties.and_then(|p| p.get(key));
        let typed = if let Some(bare) = schema.and_then(bare_string) {
            match raw {
                "None" | "null" if bare.nullable => Value::Null,
                _ => Value::String(raw.to_string()),
            }
        } else {
            match raw.trim() {
                "True" => Value::Bool(true),
                "False" => Value::Bool(false),
                "None" => Value::Null,
                t => serde_json::from_str(t).unwrap_or_else(|_| Value::String(raw.to_string())),
            }
        };
        args.insert(key.to_string(), typed);
        rest = value[end + "</parameter>".len()..].trim_start();
    }
    rest.is_empty()
        .then(|| (name.to_string(), Value::Object(args)))
}

/// The generic format's conversation: the functions and the answer's
/// shape in the system message, past calls as the JSON the model would
/// have written, tool results as user turns.
fn generic_messages(messages: &[Message], req: &ToolRequest) -> Vec<Message> {
    let must_call = !matches!(req.choice, ToolChoice::Auto);
    let allowed = allowed(req);
    let mut system =
        String::from("You can call these functions (each with a JSON schema of its arguments):\n");
    for t in &req.tools {
        system.push_str(&format!("- {}", t.name));
        if let Some(d) = &t.description {
            system.push_str(&format!(": {d}"));
        }
        system.push_str(&format!("\n  arguments: {}\n", t.parameters));
    }
    if must_call {
        let names: Vec<&str> = allowed.iter().map(|t| t.name.as_str()).collect();
        system.push_str(&format!(
            "Call a function now ({}). Answer with one JSON object: {{\"tool_call\": {{\"name\": \"<function name>\", \"arguments\": {{...}}}}}}.",
            names.join(", ")
        ));
    } else {
        system.push_str("Answer with one JSON object: either {\"tool_call\": {\"name\": \"<function name>\", \"arguments\": {...}}} to call a function, or {\"response\": \"<your answer>\"} to answer directly.");
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    match messages.first() {
        Some(first) if first.role == "system" => {
            out.push(Message::new(
                "system",
                format!("{}\n\n{system}", first.content),
            ));
            rest = &messages[1..];
        }
        _ => out.push(Message::new("system", system)),
    }
    for m in rest {
        match m.role.as_str() {
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<String> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let arguments = serde_json::from_str::<Value>(&c.arguments)
                            .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                        json!({"tool_call": {"name": c.name, "arguments": arguments}}).to_string()
                    })
                    .collect();
                out.push(Message::new("assistant", calls.join("\n")));
            }
            "assistant" => out.push(Message::new(
                "assistant",
                json!({"response": m.content}).to_string(),
            )),
            "tool" => {
                let name = m
                    .name
                    .clone()
                    .or_else(|| {
                        // The call this result answers, by id.
                        messages.iter().flat_map(|x| &x.tool_calls).find_map(|c| {
                            (Some(&c.id) == m.tool_call_id.as_ref()).then(|| c.name.clone())
                        })
                    })
                    .unwrap_or_else(|| "the function".into());
                out.push(Message::new(
                    "user",
                    format!("Result of {name}: {}", m.content),
                ));
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// An answer read back: text for `content`, and the calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

/// Reads `text` (the whole answer) in `format`; calls to functions that
/// `req` does not list are left as text. Without `parallel_tool_calls`,
/// calls after the first are dropped (a model's free answer may write
/// several). Ids are `call_` + `id_hex` + index.
pub fn parse(format: ToolFormat, text: &str, req: &ToolRequest, id_hex: &str) -> Answer {
    let known = |name: &str| req.tools.iter().any(|t| t.name == name);
    let mut calls: Vec<(String, Value)> = Vec::new();
    let mut content = String::new();
    match format {
        ToolFormat::Generic => match serde_json::from_str::<Value>(text.trim()) {
            Ok(Value::Object(o)) => {
                if let Some(Value::Object(call)) = o.get("tool_call") {
                    match (
                        call.get("name").and_then(Value::as_str),
                        call.get("arguments"),
                    ) {
                        (Some(name), Some(args)) if known(name) => {
                            calls.push((name.to_string(), args.clone()))
                        }
                        _ => content = text.to_string(),
                    }
                } else if let Some(Value::String(r)) = o.get("response") {
                    content = r.clone();
                } else {
                    content = text.to_string();
                }
            }
            _ => content = text.to_string(),
        },
        ToolFormat::Hermes | ToolFormat::QwenXml => {
            let mut rest = text;
            while let Some(start) = rest.find("<tool_call>") {
                let after = &rest[start + "<tool_call>".len()..];
                let Some(end) = closing(after, "</tool_call>") else {
                    break;
                };
                let body = &after[..end];
                let call = if format == ToolFormat::QwenXml {
                    xml_call(body, req)
                } else {
                    serde_json::from_str::<Value>(body.trim())
                        .ok()
                        .and_then(|v| {
                            let name = v.get("name")?.as_str()?.to_string();
                            let args = v.get("arguments").or_else(|| v.get("parameters"))?;
                            Some((name, args.clone()))
                        })
                };
                match call.filter(|(name, _)| known(name)) {
                    Some(call) => {
                        content.push_str(&rest[..start]);
                        calls.push(call);
                    }
                    None => content.push_str(
                        &rest[..start + "<tool_call>".len() + end + "</tool_call>".len()],
                    ),
                }
                rest = &after[end + "</tool_call>".len()..];
            }
            content.push_str(rest);
        }
        ToolFormat::Gemma4 => read_calls(text, gemma4::next_call, &known, &mut content, &mut calls),
        ToolFormat::Harmony => read_calls(
            text,
            |rest| {
                harmony_call(rest).map(|(span, name, args)| {
                    (span, name, serde_json::from_str::<Value>(args.trim()).ok())
                })
            },
            &known,
            &mut content,
            &mut calls,
        ),
        ToolFormat::Llama3 => {
            let body = text.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            let mut parsed = Vec::new();
            for part in body.split(';') {
                let call = serde_json::from_str::<Value>(part.trim())
                    .ok()
                    .and_then(|v| {
                        let name = v.get("name")?.as_str()?.to_string();
                        let args = v.get("parameters").or_else(|| v.get("arguments"))?.clone();
                        known(&name).then_some((name, args))
                    });
                match call {
                    Some(c) => parsed.push(c),
                    None => {
                        parsed.clear();
                        break;
                    }
                }
            }
            if parsed.is_empty() {
                content = text.to_string();
            } else {
                calls = parsed;
            }
        }
    }
    if !req.parallel {
        calls.truncate(1);
    }
    let content = content.trim();
    Answer {
        content: (!content.is_empty() || calls.is_empty()).then(|| content.to_string()),
        calls: calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, args))| ToolCall {
                id: format!("call_{id_hex}{i}"),
                name,
                arguments: match args {
                    Value::String(s) => s,
                    other => other.to_string(),
                },
            })
            .collect(),
    }
}

/// Where `tag` closes what `text` starts with: at the first `tag` that
/// starts a line, as the Hermes and Qwen XML grammars write a call's and a
/// parameter's end, else (text no grammar wrote) at the first `tag`. What a
/// grammar holds before its end never starts a line with `<` (compact JSON
/// has no raw newline; a Qwen XML string no line starting `<`), but may
/// hold the tag itself: a string argument `a</tool_call>b` is read whole.
fn closing(text: &str, tag: &str) -> Option<usize> {
    text.find(&format!("\n{tag}"))
        .map(|at| at + 1)
        .or_else(|| text.find(tag))
}

/// The calls `next` finds in `text` (each its span, its function's name,
/// and its arguments, `None` when they do not parse) go to `calls`, and
/// the text around them to `content`; a call that does not parse, or to a
/// function `known` does not know, stays text.
fn read_calls<'t>(
    text: &'t str,
    next: impl Fn(&'t str) -> Option<(std::ops::Range<usize>, &'t str, Option<Value>)>,
    known: &dyn Fn(&str) -> bool,
    content: &mut String,
    calls: &mut Vec<(String, Value)>,
) {
    let mut rest = text;
    while let Some((span, name, args)) = next(rest) {
        match args.filter(|_| known(name)) {
            Some(args) => {
                content.push_str(&rest[..span.start]);
                calls.push((name.to_string(), args));
            }
            None => content.push_str(&rest[..span.end]),
        }
        rest = &rest[span.end..];
    }
    content.push_str(rest);
}

/// The first harmony message in `text` addressed to a function: its span
/// (from its header's start through its end marker), the function's name
/// and the body (the arguments). A call the length limit cut off runs to
/// the end of the text.
fn harmony_call(text: &str) -> Option<(std::ops::Range<usize>, &str, &str)> {
    // A header's recipient; the same words inside a message's body (an
    // answer or reasoning that mentions them) are that message's text.
    let mut search = 0;
    let to = loop {
        let to = search + text[search..].find(TO)?;
        if !in_body(text, to) {
            break to;
        }
        search = to + TO.len();
    };
    let head = &text[..to];
    // The header starts at its `<|start|>` or else its `<|channel|>`, if
    // no earlier message's body lies between.
    let start = [START, CHANNEL]
        .iter()
        .filter_map(|m| head.rfind(m))
        .filter(|&at| !head[at..].contains(MESSAGE))
        .min()
        .unwrap_or(to);
    let after = &text[to + TO.len()..];
    let name_len = after
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(after.len());
    let name = &after[..name_len];
    let Some(body) = after
        .find(MESSAGE)
        .map(|at| to + TO.len() + at + MESSAGE.len())
    else {
        // A header with no body: no call, the rest is text.
        return Some((0..text.len(), name, ""));
    };
    let (body_end, end) = match reasoning::call_end(&text[body..]) {
        Some((at, m)) => (body + at, body + at + if m == START { 0 } else { m.len() }),
        None => (text.len(), text.len()),
    };
    Some((start..end, name, &text[body..body_end]))
}

/// A harmony header's recipient when it is a function.
const TO: &str = "to=functions.";

/// Whether `at` lies inside a harmony message's body: after its
/// `<|message|>` and before the end marker that closes it (for a call,
/// the first outside its arguments' JSON strings).
fn in_body(text: &str, at: usize) -> bool {
    let mut from = 0;
    while let Some(m) = text[from..at].find(MESSAGE) {
        let body = from + m + MESSAGE.len();
        let end = if text[from..from + m].contains(TO) {
            reasoning::call_end(&text[body..]).map(|(end, _)| end)
        } else {
            reasoning::text_end(&text[body..])
        };
        match end {
            Some(end) if body + end <= at => from = body + end,
            _ => return true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lark text of [`grammar`] in `format` for `r`.
    fn lark_of(format: ToolFormat, r: &ToolRequest, reasoning: usize, python_tag: bool) -> String {
        match grammar(format, r, reasoning, python_tag, None).unwrap() {
            Grammar::Lark(lark) => lark,
            other => panic!("{other:?}"),
        }
    }

    fn req(choice: ToolChoice) -> ToolRequest {
        ToolRequest {
            tools: vec![
                Tool {
                    name: "get_weather".into(),
                    description: Some("Weather of a city".into()),
                    parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
                    strict: false,
                },
                Tool {
                    name: "now".into(),
                    description: None,
                    parameters: json!({"type": "object", "properties": {}}),
                    strict: false,
                },
            ],
            choice,
            parallel: true,
        }
    }

    #[test]
    fn formats_are_told_from_the_template() {
        assert_eq!(ToolFormat::detect(None), ToolFormat::Generic);
        assert_eq!(
            ToolFormat::detect(Some(
                "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"
            )),
            ToolFormat::Generic
        );
        assert_eq!(
            ToolFormat::detect(Some("{%- if tools %}<tools>{% endif %}<tool_call>")),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect(Some("{%- if tools %}{% endif %}<|python_tag|>")),
            ToolFormat::Llama3
        );
        assert_eq!(
            ToolFormat::detect(Some("{{- '<tool_call>\\n<function=' + tool_call.name }}")),
            ToolFormat::QwenXml
        );
        assert_eq!(
            ToolFormat::detect(Some("{{- '<|tool_call>call:' + function['name'] + '{' -}}")),
            ToolFormat::Gemma4
        );
    }

    #[test]
    fn gemma4_calls_are_read_and_the_rest_is_content() {
        let r = req(ToolChoice::Auto);
        let text = "Checking.<|tool_call>call:get_weather{city:<|\"|>New York<|\"|>}<tool_call|><|tool_call>call:now{}<tool_call|>";
        let a = parse(ToolFormat::Gemma4, text, &r, "g");
        assert_eq!(a.content.as_deref(), Some("Checking."));
        assert_eq!(
            a.calls
                .iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect::<Vec<_>>(),
            [("get_weather", r#"{"city":"New York"}"#), ("now", "{}")]
        );
        // Unknown functions and broken calls stay text.
        for odd in [
            "<|tool_call>call:launch{}<tool_call|>",
            "<|tool_call>call:now{a:}<tool_call|>",
        ] {
            let a = parse(ToolFormat::Gemma4, odd, &r, "g");
            assert!(a.calls.is_empty(), "{odd}");
            assert_eq!(a.content.as_deref(), Some(odd));
        }
        let lark = lark_of(ToolFormat::Gemma4, &r, 0, false);
        assert!(
            lark.contains("first_head[lazy]: FIRST_TEXT \"<|tool_call>\""),
            "{lark}"
        );
        let lark = lark_of(ToolFormat::Gemma4, &req(ToolChoice::Required), 0, false);
        assert!(
            lark.contains("\"<|tool_call>\" (\"call:get_weather\""),
            "{lark}"
        );
        // A keyword the lowering cannot enforce is refused whatever the
        // choice: under `auto` too, a call the model opens is constrained.
        for choice in [ToolChoice::Auto, ToolChoice::Required] {
            let mut r = req(choice);
            r.tools[1].parameters = json!({"properties": {"at": {"not": {"type": "string"}}}});
            let e = grammar(ToolFormat::Gemma4, &r, 0, false, None).unwrap_err();
            assert!(
                e.contains("function now's parameters.properties.at: `not`"),
                "{e}"
            );
        }
    }

    #[test]
    fn qwen_xml_calls_are_read_with_their_schema_types() {
        let mut r = req(ToolChoice::Auto);
        r.tools.push(Tool {
            name: "plan".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {"days": {"type": "integer"}, "note": {"type": "string"}, "tags": {"type": "array"}, "ok": {"type": "boolean"}}}),
            strict: false,
        });
        let text = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=plan>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\n42\nand <b>more</b>\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n</function>\n</tool_call>";
        let a = parse(ToolFormat::QwenXml, text, &r, "q");
        assert_eq!(a.content.as_deref(), Some("Let me check."));
        assert_eq!(a.calls.len(), 2);
        assert_eq!(a.calls[0].name, "get_weather");
        assert_eq!(a.calls[0].arguments, r#"{"city":"New York"}"#);
        assert_eq!(a.calls[1].name, "plan");
        assert_eq!(
            a.calls[1].arguments,
            r#"{"days":3,"note":"42\nand <b>more</b>","tags":["a","b"],"ok":true}"#
        );
        // An unknown function, or a body that is not the XML form, stays text.
        let odd = "<tool_call>\n<function=launch>\n</function>\n</tool_call>";
        let a = parse(ToolFormat::QwenXml, odd, &r, "q");
        assert!(a.calls.is_empty());
        assert_eq!(a.content.as_deref(), Some(odd));
        let broken = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</tool_call>";
        assert!(parse(ToolFormat::QwenXml, broken, &r, "q").calls.is_empty());
    }

    /// A string that may be null (a type list, or Pydantic's `anyOf` of a
    /// string and null) is read as its bare text, but `None` (what the
    /// template writes for a null) and `null` read as null; a union that
    /// is not string-or-null keeps the JSON path.
    #[test]
    fn qwen_xml_nullable_strings_are_bare_text_or_null() {
        let mut r = req(ToolChoice::Auto);
        for note in [
            json!({"type": ["string", "null"]}),
            json!({"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 9}], "default": null}),
            json!({"oneOf": [{"type": "string"}, {"type": "null"}]}),
        ] {
            r.tools[0].parameters = json!({"type": "object", "properties": {"city": note}});
            for (text, want) in [
                ("Oslo", json!("Oslo")),
                ("None", Value::Null),
                ("null", Value::Null),
                ("\"None\"", json!("\"None\"")),
                ("None yet", json!("None yet")),
            ] {
                let call = format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{text}\n</parameter>\n</function>\n</tool_call>");
                let a = parse(ToolFormat::QwenXml, &call, &r, "q");
                assert_eq!(
                    a.calls[0].arguments,
                    json!({ "city": want }).to_string(),
                    "{text}"
                );
            }
        }
        for other in [
            json!({"type": ["string", "integer"]}),
            json!({"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 3}),
            json!({"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}),
        ] {
            assert!(bare_string(&other).is_none(), "{other}");
        }
    }

    /// A string value's first line may start with `</parameter>` (the
    /// grammar's text keeps only later lines from starting with `<`): it
    /// is read whole, up to the close tag that starts a line after it,
    /// and so is an empty value.
    #[test]
    fn qwen_xml_values_may_start_with_the_close_tag() {
        let r = req(ToolChoice::Auto);
        for city in ["</parameter>", "</parameter> x", "</parameter>\nb", ""] {
            let text = format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>");
            let a = parse(ToolFormat::QwenXml, &text, &r, "q");
            assert_eq!(a.calls.len(), 1, "{city:?}");
            assert_eq!(a.calls[0].arguments, json!({ "city": city }).to_string());
        }
    }

    #[test]
    fn answers_are_read_back_per_format() {
        let r = req(ToolChoice::Auto);
        let a = parse(
            ToolFormat::Generic,
            r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}"#,
            &r,
            "ab",
        );
        assert_eq!(a.content, None);
        assert_eq!(
            a.calls,
            [ToolCall {
                id: "call_ab0".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        let a = parse(ToolFormat::Generic, r#"{"response": "Hello"}"#, &r, "x");
        assert_eq!((a.content.as_deref(), a.calls.len()), (Some("Hello"), 0));
        let a = parse(ToolFormat::Generic, r#"{"respo"#, &r, "x");
        assert_eq!(a.content.as_deref(), Some(r#"{"respo"#));

        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let a = parse(ToolFormat::Hermes, text, &r, "h");
        assert_eq!(a.content.as_deref(), Some("Let me check."));
        assert_eq!(a.calls.len(), 2);
        assert_eq!(a.calls[1].name, "now");
        assert_eq!(a.calls[1].id, "call_h1");
        // An unknown function stays text.
        let a = parse(
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
            &r,
            "h",
        );
        assert!(a.calls.is_empty() && a.content.unwrap().contains("rm"));

        let a = parse(
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
            &r,
            "l",
        );
        assert_eq!(a.calls[0].arguments, r#"{"city":"Rome"}"#);
        let a = parse(ToolFormat::Llama3, "The weather is fine.", &r, "l");
        assert_eq!(a.content.as_deref(), Some("The weather is fine."));
    }

    #[test]
    fn the_generic_format_describes_tools_and_rewrites_the_history() {
        let r = req(ToolChoice::Function("get_weather".into()));
        let history = vec![
            Message::new("system", "Be brief."),
            Message::new("user", "Weather in Paris?"),
            Message {
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                }],
                ..Message::new("assistant", "")
            },
            Message {
                tool_call_id: Some("call_1".into()),
                ..Message::new("tool", "22 C")
            },
        ];
        let p = prepare(ToolFormat::Generic, &history, &r);
        assert_eq!(p.messages.len(), 4);
        assert!(p.messages[0]
            .content
            .starts_with("Be brief.\n\nYou can call"));
        assert!(p.messages[0]
            .content
            .contains("Call a function now (get_weather)"));
        assert_eq!(
            p.messages[2].content,
            r#"{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}"#
        );
        assert_eq!(p.messages[3].role, "user");
        assert_eq!(p.messages[3].content, "Result of get_weather: 22 C");
        let Grammar::JsonSchema(schema) = grammar(ToolFormat::Generic, &r, 0, false, None).unwrap()
        else {
            panic!()
        };
        // Named: one branch, the call, no response.
        assert_eq!(
            schema["properties"]["tool_call"]["properties"]["name"]["const"],
            "get_weather"
        );
        let p = prepare(ToolFormat::Generic, &history[1..2], &req(ToolChoice::Auto));
        let Grammar::JsonSchema(schema) =
            grammar(ToolFormat::Generic, &req(ToolChoice::Auto), 0, false, None).unwrap()
        else {
            panic!()
        };
        assert_eq!(schema["anyOf"].as_array().unwrap().len(), 3);
        assert_eq!(p.messages[0].role, "system");
    }

    /// `required`: calls only; `auto`: free text, the call constrained
    /// from its opener on (the token-level walks are in
    /// tests/constraint.rs).
    #[test]
    fn native_formats_constrain_a_required_call_and_an_opened_one() {
        let p = prepare(
            ToolFormat::Hermes,
            &[Message::new("user", "x")],
            &req(ToolChoice::Auto),
        );
        assert!(p.tools.is_some());
        let lark = lark_of(ToolFormat::Hermes, &req(ToolChoice::Auto), 0, false);
        assert!(
            lark.contains("first_head[lazy]: FIRST_TEXT \"<tool_call>\"") && lark.contains("%json"),
            "{lark}"
        );
        let lark = lark_of(ToolFormat::Hermes, &req(ToolChoice::Required), 0, false);
        assert!(
            lark.starts_with("start: call (\"\\n\" call)*\ncall: \"<tool_call>\" \"\\n\" %json"),
            "{lark}"
        );
        let lark = lark_of(ToolFormat::Llama3, &req(ToolChoice::Required), 0, false);
        assert!(lark.contains("\"parameters\""), "{lark}");
        // auto: a Llama 3 answer that starts with `{` is a call, after
        // `<|python_tag|>` where the vocabulary has it as a token.
        for (tag, named) in [(false, false), (true, true)] {
            let lark = lark_of(ToolFormat::Llama3, &req(ToolChoice::Auto), 0, tag);
            assert!(lark.contains("FREE_TEXT: /([^{](?s:.*))?/"), "{lark}");
            assert_eq!(lark.contains("<|python_tag|>?"), named, "{lark}");
        }
    }

    #[test]
    fn harmony_calls_are_read_in_either_header_order_and_the_rest_is_content() {
        let r = req(ToolChoice::Auto);
        let template = "{{ '<|start|>assistant<|channel|>final<|message|>' }}{{ tools }}";
        assert_eq!(ToolFormat::detect(Some(template)), ToolFormat::Harmony);
        for text in [
            // After the reasoning split: the call as written.
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}",
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}",
        ] {
            let a = parse(ToolFormat::Harmony, text, &r, "g");
            assert_eq!(a.content, None, "{text}");
            assert_eq!(
                a.calls,
                [ToolCall {
                    id: "call_g0".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Oslo"}"#.into()
                }],
                "{text}"
            );
        }
        // Unsplit (reasoning_format none): the reasoning stays text.
        let raw = "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>";
        let a = parse(ToolFormat::Harmony, raw, &r, "g");
        assert_eq!(
            a.content.as_deref(),
            Some("<|channel|>analysis<|message|>Need it.<|end|>")
        );
        assert_eq!(a.calls[0].name, "now");
        // A marker inside the arguments is theirs.
        let a = parse(
            ToolFormat::Harmony,
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"<|end|><|start|>\"}<|call|>",
            &r,
            "g",
        );
        assert_eq!(a.calls[0].arguments, r#"{"city":"<|end|><|start|>"}"#);
        // Unknown functions, bad JSON and a header cut off stay text.
        for text in [
            "<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{}",
            "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{\"a\":",
            "<|channel|>commentary to=functions.now <|constrain|>js",
        ] {
            let a = parse(ToolFormat::Harmony, text, &r, "g");
            assert!(a.calls.is_empty(), "{text}");
            assert_eq!(a.content.as_deref(), Some(text));
        }
        assert_eq!(
            parse(ToolFormat::Harmony, "Sunny.", &r, "g")
                .content
                .as_deref(),
            Some("Sunny.")
        );
        // The words of a call inside an answer's or reasoning's body are
        // its text; a call after that reasoning is still read.
        let answer =
            "<|channel|>final<|message|>Write to=functions.now<|message|>{}<|call|> to call it.";
        let a = parse(ToolFormat::Harmony, answer, &r, "g");
        assert!(a.calls.is_empty(), "{:?}", a.calls);
        assert_eq!(a.content.as_deref(), Some(answer));
        let raw = "<|channel|>analysis<|message|>Maybe to=functions.get_weather<|message|>{\"city\": \"Rome\"}<|end|><|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>";
        let a = parse(ToolFormat::Harmony, raw, &r, "g");
        assert_eq!(a.calls.len(), 1, "{:?}", a.calls);
        assert_eq!(a.calls[0].name, "now");
        // Parallel calls, each a message of its own (the grammar's
        // `<|start|>assistant` between them, `<|call|>` after the last).
        let two = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>";
        let a = parse(ToolFormat::Harmony, two, &r, "g");
        assert_eq!(a.content, None, "{a:?}");
        let names: Vec<&str> = a.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "now"]);
        assert_eq!(a.calls[0].arguments, r#"{"city":"Oslo"}"#);
    }

    #[test]
    fn harmony_constrains_a_required_call_to_the_allowed_functions() {
        let p = prepare(
            ToolFormat::Harmony,
            &[Message::new("user", "x")],
            &req(ToolChoice::Auto),
        );
        assert!(p.tools.is_some());
        let lark = lark_of(ToolFormat::Harmony, &req(ToolChoice::Auto), 100, false);
        assert!(
            lark.contains("first_head[lazy]: FIRST_TEXT \"to=functions.\"")
                && lark.contains("max_tokens=100"),
            "{lark}"
        );
        let named = req(ToolChoice::Function("now".into()));
        let lark = lark_of(ToolFormat::Harmony, &named, 100, false);
        assert!(
            lark.contains("\"to=functions.\" (\"now <|constrain|>json<|message|>\" %json")
                && !lark.contains("get_weather")
                && lark.contains("<|channel|>analysis<|message|>")
                && lark.contains("max_tokens=100"),
            "{lark}"
        );
        // No budget: no analysis message.
        let lark = lark_of(ToolFormat::Harmony, &named, 0, false);
        assert!(!lark.contains("analysis"), "{lark}");
    }

    /// `parallel_tool_calls: false`: at most one call, whatever the model
    /// wrote, in every format; true: all of them.
    #[test]
    fn without_parallel_tool_calls_an_answer_has_at_most_one_call() {
        let two = [
            (ToolFormat::Hermes, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
            (ToolFormat::Llama3, "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"),
            (ToolFormat::Harmony, "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}"),
            (ToolFormat::Gemma4, "<|tool_call>call:now{}<tool_call|><|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|>"),
        ];
        for (format, text) in two {
            let mut r = req(ToolChoice::Auto);
            assert_eq!(parse(format, text, &r, "p").calls.len(), 2, "{format:?}");
            r.parallel = false;
            let a = parse(format, text, &r, "p");
            assert_eq!(a.calls.len(), 1, "{format:?}");
            assert_eq!(a.calls[0].name, "now", "{format:?}");
            assert_eq!(a.content, None, "{format:?}");
        }
    }
}
