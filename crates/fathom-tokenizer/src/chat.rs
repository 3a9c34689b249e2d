//! Chat templates: the Jinja source a checkpoint ships, rendered the way
//! Hugging Face `apply_chat_template` renders it.

use std::ops::Range;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, ValueKind};
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
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", strftime_now);
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

/// The `tojson` filter as Hugging Face defines it for chat templates
/// (`json.dumps(x, ensure_ascii=False, indent=indent)`): Python's
/// separators (`", "`, `": "`; `","` and a new line per item with an
/// indent), key order kept, no HTML escaping; the keywords `indent` and
/// `ensure_ascii` as Python's. minijinja's own escapes `<`, `>`, `&` and
/// `'` (as `\u003c` and so on, for HTML), which is not the text models
/// were trained on: a tool description `"zone (<Area>/<City>)"` in Qwen's
/// tool list, a past call's arguments in gpt-oss's.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent.map(|n| n.min(64)), 0, &mut out)?;
    if ensure_ascii == Some(true) {
        // Outside strings JSON is ASCII: every other character is in one.
        let mut units = [0u16; 2];
        out = out
            .chars()
            .map(|c| match c {
                ' '..='~' | '\n' => c.to_string(),
                _ => c
                    .encode_utf16(&mut units)
                    .iter()
                    .map(|u| format!("\\u{u:04x}"))
                    .collect(),
            })
            .collect();
    }
    Ok(Value::from_safe_string(out))
}

/// Nesting `tojson` writes at most: request values nest at most 128 deep
/// (serde_json's limit); a template could build deeper ones.
const MAX_JSON_DEPTH: usize = 256;

/// Appends `value` to `out` as [`tojson`] writes it, `depth` levels in.
fn write_json(
    value: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: the value nests more than {MAX_JSON_DEPTH} deep"),
        ));
    }
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    // What goes before an item of a list or map: its separator from the
    // previous one, then with an indent a new line at the item's depth.
    let item = |out: &mut String, i: usize| {
        if i > 0 {
            out.push(',');
            if indent.is_none() {
                out.push(' ');
            }
        }
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * (depth + 1)));
        }
    };
    let close = |out: &mut String, items: usize, end: char| {
        if let (Some(n), true) = (indent, items > 0) {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
        out.push(end);
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&value.to_string()),
        ValueKind::String => out.push_str(&quote(value.as_str().unwrap_or_default())),
        ValueKind::Map => {
            out.push('{');
            let mut n = 0;
            for key in value.try_iter()? {
                item(out, n);
                out.push_str(&quote(
                    &key.as_str().map_or_else(|| key.to_string(), String::from),
                ));
                out.push_str(": ");
                write_json(&value.get_item(&key)?, indent, depth + 1, out)?;
                n += 1;
            }
            close(out, n, '}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            let mut n = 0;
            for v in value.try_iter()? {
                item(out, n);
                write_json(&v, indent, depth + 1, out)?;
                n += 1;
            }
            close(out, n, ']');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {kind} value has no JSON form"),
            ))
        }
    }
    Ok(())
}

/// `strftime_now(format)`, the clock Hugging Face gives templates (gpt-oss's
/// writes `Current date: ` with `"%Y-%m-%d"`, Llama 3.2's `"%d %b %Y"`):
/// the time now in UTC, through the directives chat templates use. Any
/// other directive is an error that names it.
fn strftime_now(format: String) -> Result<String, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

/// The UTC calendar date (year, month 1–12, day 1–31) of `secs` seconds
/// after the Unix epoch, by Howard Hinnant's civil-from-days algorithm:
/// the clock templates read, and the date reports carry.
pub fn civil_date(secs: u64) -> (u64, u64, u64) {
    let z = secs / 86_400 + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// `format` with its directives filled in for `secs` seconds after the
/// Unix epoch (UTC).
fn strftime(format: &str, secs: u64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs / 86_400;
    let (hour, minute, second) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    let (year, month, day) = civil_date(secs);
    let month_name = MONTHS[(month - 1) as usize];
    let weekday = DAYS[(days % 7) as usize];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // `%-d`: glibc's unpadded form, which templates use too.
        let mut d = chars.next();
        let unpadded = d == Some('-');
        if unpadded {
            d = chars.next();
        }
        let num = |v: u64| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:02}")
            }
        };
        match d {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year % 100)),
            Some('m') => out.push_str(&num(month)),
            Some('d') => out.push_str(&num(day)),
            Some('H') => out.push_str(&num(hour)),
            Some('M') => out.push_str(&num(minute)),
            Some('S') => out.push_str(&num(second)),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: the directive %{} in {format:?} is not supported (known: %Y %y %m %d %H %M %S %B %b %A %a %%, %-d and the like)",
                        other.map_or(String::new(), String::from)
                    ),
                ))
            }
        }
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_fills_the_directives_templates_use() {
        // 1,700,000,000 s: Tuesday 14 November 2023, 22:13:20 UTC.
        let at = 1_700_000_000;
        assert_eq!(strftime("%Y-%m-%d", at).unwrap(), "2023-11-14");
        assert_eq!(strftime("%d %b %Y", at).unwrap(), "14 Nov 2023");
        assert_eq!(
            strftime("%A, %B %-d, %y %H:%M:%S %a 100%%", at).unwrap(),
            "Tuesday, November 14, 23 22:13:20 Tue 100%"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        // 29 February 2024.
        assert_eq!(strftime("%d.%m.%Y", 1_709_164_800).unwrap(), "29.02.2024");
        let e = strftime("%Q", at).unwrap_err().to_string();
        assert!(e.contains("%Q"), "{e}");
    }

    #[test]
    fn tojson_writes_python_separators_unescaped() {
        let t = ChatTemplate::new(
            "{{ messages[0].tool_calls[0].function.arguments | tojson }}|{{ [1, {'a': '<b> & c\u{e9}'}] | tojson(indent=2) }}|{{ ['\u{e9}\u{1f600}'] | tojson(ensure_ascii=true) }}",
            "",
            "",
        )
        .unwrap();
        let mut m = Message::new("assistant", "");
        m.tool_calls.push(ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: r#"{"city": "Oslo", "days": [1, 2], "x": {}}"#.into(),
        });
        let out = t.render(&[m], false).unwrap();
        assert_eq!(
            out,
            "{\"city\": \"Oslo\", \"days\": [1, 2], \"x\": {}}|[\n  1,\n  {\n    \"a\": \"<b> & c\u{e9}\"\n  }\n]|[\"\\u00e9\\ud83d\\ude00\"]"
        );
    }
}
