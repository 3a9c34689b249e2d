//! Chat templates: the Jinja source a checkpoint ships, rendered the way
//! Hugging Face `apply_chat_template` renders it.

use std::ops::Range;

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error, ErrorKind, Value};

use crate::{Special, Tokenizer, TokenizerError, TooManyTokens};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant message's function calls (OpenAI's `tool_calls`).
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the call it answers (OpenAI's `tool_call_id`).
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function that answered, when known.
    pub name: Option<String>,
    /// An assistant message's reasoning (OpenAI-compatible servers'
    /// `reasoning_content`), which templates read as `reasoning_content`
    /// (Qwen3's, llama.cpp's name) or `thinking` (gpt-oss's).
    pub reasoning: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            ..Message::default()
        }
    }
}

/// One function call of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the JSON text OpenAI's `function.arguments` holds.
    pub arguments: String,
}

/// A JSON value as templates see it: objects as maps (key order kept),
/// arrays as lists.
pub fn json_to_template(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(0.0)),
        },
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => {
            Value::from(a.iter().map(json_to_template).collect::<Vec<_>>())
        }
        serde_json::Value::Object(o) => {
            Value::from_pairs(o.iter().map(|(k, v)| (k.clone(), json_to_template(v))))
        }
    }
}

fn message_value(m: &Message) -> Value {
    let mut fields: Vec<(&str, Value)> = vec![
        ("role", Value::from(m.role.as_str())),
        ("content", Value::from(m.content.as_str())),
    ];
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                // Templates write `arguments | tojson`, so they get the
                // parsed object when the text is JSON (as Hugging Face's
                // and vLLM's chat paths give it), else the text.
                let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                    .map_or_else(
                        |_| Value::from(c.arguments.as_str()),
                        |v| json_to_template(&v),
                    );
                let function = Value::from_pairs([
                    ("name", Value::from(c.name.as_str())),
                    ("arguments", arguments),
                ]);
                Value::from_pairs([
                    ("id", Value::from(c.id.as_str())),
                    ("type", Value::from("function")),
                    ("function", function),
                ])
            })
            .collect::<Vec<_>>();
        fields.push(("tool_calls", Value::from(calls)));
    }
    if let Some(id) = &m.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &m.name {
        fields.push(("name", Value::from(name.as_str())));
    }
    if let Some(reasoning) = &m.reasoning {
        fields.push(("reasoning_content", Value::from(reasoning.as_str())));
        fields.push(("thinking", Value::from(reasoning.as_str())));
    }
    Value::from_pairs(fields)
}

/// Byte ranges of a rendered prompt that hold message contents.
pub type ContentRanges = Vec<Range<usize>>;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

/// Variables a request gives the template besides the conversation
/// (OpenAI-compatible servers' `chat_template_kwargs`).
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

fn template_error(e: Error) -> TokenizerError {
    TokenizerError::Template(e.to_string())
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported here, not at render.
    /// `bos_token` and `eos_token` are the texts templates see under those
    /// names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        // Hugging Face compiles templates with both on; templates are
        // written for it (block tags on their own lines leave no blank lines).
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        // Templates call Python string methods (`.strip()`, `.startswith()`).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // The helper Hugging Face provides for templates to reject input.
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Sets the template's thinking switch (`enable_thinking`, which
    /// Gemma 4's and Qwen3's templates read; unset, each template takes its
    /// own default): on, Gemma 4's marks the system turn with `<|think|>`
    /// and leaves the model's turn open for a `<|channel>thought\n...
    /// <channel|>` block; off, it closes that block empty.
    pub fn set_thinking(&mut self, on: bool) {
        self.env.add_global("enable_thinking", on);
    }

    /// The prompt text for `messages`, as [`ChatTemplate::render`] gives
    /// it, and where in it the messages' contents lie: text a user wrote,
    /// as opposed to the template's own markers. The ranges are found by
    /// rendering once more with a placeholder for each content; `None`
    /// when the template transforms contents beyond a trim, so the places
    /// cannot be known.
    pub fn render_with_contents(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&TemplateKwargs>,
        add_generation_prompt: bool,
    ) -> Result<(String, Option<ContentRanges>), TokenizerError> {
        let text = self.render_with(messages, tools, kwargs, add_generation_prompt)?;
        // A private-use character that neither the contents nor the
        // rendered text hold marks each placeholder: MARK index MARK.
        let Some(mark) = ('\u{E000}'..='\u{F8FF}')
            .take(64)
            .find(|&c| !text.contains(c) && !messages.iter().any(|m| m.content.contains(c)))
        else {
            return Ok((text, None));
        };
        let placeholders: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message {
                content: format!("{mark}{i}{mark}"),
                ..m.clone()
            })
            .collect();
        let Ok(skeleton) = self.render_with(&placeholders, tools, kwargs, add_generation_prompt)
        else {
            return Ok((text, None));
        };
        for trim in [false, true] {
            if let Some((filled, ranges)) = fill(&skeleton, mark, messages, trim) {
                if filled == text {
                    return Ok((text, Some(ranges)));
                }
            }
        }
        Ok((text, None))
    }

    /// The prompt text for `messages`; `add_generation_prompt` appends the
    /// opening of the assistant's turn.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `tools` (OpenAI's list of
    /// `{"type": "function", "function": {...}}`), which templates that
    /// support function calling read as `tools`.
    pub fn render_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(messages, tools, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render_tools`] with more variables for the template
    /// (a request's `chat_template_kwargs`, such as `enable_thinking`);
    /// they never replace the messages, tools or markers.
    pub fn render_with(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        kwargs: Option<&TemplateKwargs>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self.env.get_template(NAME).map_err(template_error)?;
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let tools = tools.map_or(Value::from(()), json_to_template);
        let kwargs = kwargs.map_or(Value::from(()), |k| {
            json_to_template(&serde_json::Value::Object(k.clone()))
        });
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
                ..kwargs
            })
            .map_err(template_error)
    }
}

/// Text a client wrote that lands where the prompt's markers become
/// control tokens and that spells one out: the request field that holds it
/// and the token. Contents are such text only when their places are not
/// known (`contents_placed` false); everything else the messages carry,
/// and the tools' definitions, always are.
fn control_text_among_markers<'t>(
    tokenizer: &'t Tokenizer,
    messages: &[Message],
    tools: Option<&serde_json::Value>,
    contents_placed: bool,
) -> Option<(String, &'t str)> {
    for (i, m) in messages.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let mut fields: Vec<(String, &str)> = Vec::new();
        if !contents_placed {
            fields.push((at("content"), &m.content));
        }
        if let Some(r) = &m.reasoning {
            fields.push((at("reasoning_content"), r));
        }
        for (j, c) in m.tool_calls.iter().enumerate() {
            fields.push((at(&format!("tool_calls[{j}].id")), &c.id));
            fields.push((at(&format!("tool_calls[{j}].function.name")), &c.name));
            fields.push((
                at(&format!("tool_calls[{j}].function.arguments")),
                &c.arguments,
            ));
        }
        if let Some(id) = &m.tool_call_id {
            fields.push((at("tool_call_id"), id));
        }
        if let Some(name) = &m.name {
            fields.push((at("name"), name));
        }
        if let Some(hit) = fields
            .into_iter()
            .find_map(|(param, text)| tokenizer.control_text_in(text).map(|t| (param, t)))
        {
            return Some(hit);
        }
    }
    tools.and_then(|t| json_control_text(tokenizer, "tools", t))
}

/// The first string (key or value) of `value`, a JSON value at `path` of
/// the request, that spells out a control token: its path and the token.
/// Request bodies nest at most 128 deep (serde_json's limit), which bounds
/// the recursion.
fn json_control_text<'t>(
    tokenizer: &'t Tokenizer,
    path: &str,
    value: &serde_json::Value,
) -> Option<(String, &'t str)> {
    match value {
        serde_json::Value::String(s) => tokenizer
            .control_text_in(s)
            .map(|token| (path.to_string(), token)),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| json_control_text(tokenizer, &format!("{path}[{i}]"), v)),
        serde_json::Value::Object(o) => o.iter().find_map(|(k, v)| {
            let here = format!("{path}.{k}");
            match tokenizer.control_text_in(k) {
                Some(token) => Some((here, token)),
                None => json_control_text(tokenizer, &here, v),
            }
        }),
        _ => None,
    }
}

/// `skeleton` with each `MARK index MARK` replaced by that message's
/// content (trimmed when `trim`), and the ranges the contents took.
fn fill(
    skeleton: &str,
    mark: char,
    messages: &[Message],
    trim: bool,
) -> Option<(String, Vec<Range<usize>>)> {
    let mut out = String::with_capacity(skeleton.len());
    let mut ranges = Vec::with_capacity(messages.len());
    let mut rest = skeleton;
    while let Some(at) = rest.find(mark) {
        out.push_str(&rest[..at]);
        let after = &rest[at + mark.len_utf8()..];
        let end = after.find(mark)?;
        let content = &messages.get(after[..end].parse::<usize>().ok()?)?.content;
        let content = if trim { content.trim() } else { content };
        ranges.push(out.len()..out.len() + content.len());
        out.push_str(content);
        rest = &after[end + mark.len_utf8()..];
    }
    out.push_str(rest);
    Some((out, ranges))
}

/// Why [`encode_chat`] gave no tokens.
#[derive(Debug, thiserror::Error)]
pub enum ChatEncodeError {
    /// The template refused the messages.
    #[error("{0}")]
    Template(TokenizerError),
    /// The request's field `param` (`messages[1].tool_calls[0].function.
    /// arguments`, `tools[0].function.description`) holds a control
    /// token's text where the prompt cannot keep it plain: a message's
    /// content, when the template rewrites contents so that where they lie
    /// is unknown; always, anything else a client wrote that the template
    /// writes among its own markers (reasoning, tool calls' ids, names and
    /// arguments, a tool result's name and call id, the tools'
    /// definitions), as only contents are placed as plain text.
    #[error("{param} holds the text of the control token {token:?}, which this model's chat template does not let fathom keep as plain text")]
    ControlText { param: String, token: String },
    #[error("the prompt has more than {} tokens", .0.limit)]
    TooMany(TooManyTokens),
}

/// The tokens of `messages` rendered through `template`, at most `limit`
/// of them. Message contents are text: a control token's text in them
/// stays text, so a user cannot close their turn and write another role's;
/// only the template's own markers become special tokens. When the
/// template transforms contents so that their places are unknown, a
/// content holding a control token's text is refused instead; so is
/// everything else a client wrote that the template writes among its
/// markers (reasoning, past tool calls, tool results' names, the tools'
/// definitions) when it spells one out ([`ChatEncodeError::ControlText`]).
pub fn encode_chat(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    limit: usize,
) -> Result<Vec<u32>, ChatEncodeError> {
    encode_chat_tools(
        tokenizer,
        template,
        messages,
        None,
        None,
        add_generation_prompt,
        limit,
    )
}

/// [`encode_chat`] with `tools` given to the template (see
/// [`ChatTemplate::render_tools`]).
pub fn encode_chat_tools(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
    tools: Option<&serde_json::Value>,
    kwargs: Option<&TemplateKwargs>,
    add_generation_prompt: bool,
    limit: usize,
) -> Result<Vec<u32>, ChatEncodeError> {
    let (text, contents) = template
        .render_with_contents(messages, tools, kwargs, add_generation_prompt)
        .map_err(ChatEncodeError::Template)?;
    if let Some((param, token)) =
        control_text_among_markers(tokenizer, messages, tools, contents.is_some())
    {
        return Err(ChatEncodeError::ControlText {
            param,
            token: token.to_string(),
        });
    }
    let special = match &contents {
        Some(ranges) => Special::PlainIn(ranges),
        None => Special::Parse,
    };
    tokenizer
        .encode_bounded(&text, false, special, limit)
        .map_err(ChatEncodeError::TooMany)
}
