//! The OpenAI request shapes: parsing `/v1/chat/completions` and
//! `/v1/completions` bodies into what a [`Job`](crate::Job) needs, and the
//! error object every failure is answered with.
//!
//! Parsing is pure (no model, no I/O), so it can be fuzzed: any input gives
//! either a request or an [`ApiError`] with a 4xx status, never a panic.

use fathom_engine::{Message, SamplingParams};
use fathom_tokenizer::ToolCall;
use serde_json::{json, Map, Value};

/// Which generation route a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
}

/// An error in OpenAI's shape:
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// A 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            code: Some("invalid_value"),
            ..ApiError::new(400, "invalid_request_error", message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// What to complete: chat messages (rendered through the model's chat
/// template), raw text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Chat(Vec<Message>),
    Text(String),
    Tokens(Vec<u32>),
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    /// `max_completion_tokens`, else `max_tokens` (0 only with `echo`);
    /// `None` fills the context.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Completions only (`parse_special`, an extension): control-token
    /// texts in the prompt become those tokens. Off by default: a prompt
    /// is text.
    pub parse_special: bool,
    /// Log-probabilities asked for, as the number of most likely
    /// alternatives per token: chat's `top_logprobs` (0 to 20) when
    /// `logprobs` is true, completions' integer `logprobs` (0 to 5).
    /// `None`: no logprobs.
    pub logprobs: Option<usize>,
    /// Completions only: the prompt is sent back in front of the
    /// completion, with its tokens' logprobs when `logprobs` is set.
    pub echo: bool,
    /// What the answer must match, token by token: `response_format`
    /// (`json_object`, `json_schema`), or llama-server's `json_schema` and
    /// `grammar` extensions.
    /// With the field that asked for it.
    pub constraint: Option<(&'static str, OutputConstraint)>,
    /// Chat only: the functions the model may call, and how
    /// (`tools`, `tool_choice`, `parallel_tool_calls`). `None` when there
    /// are none or `tool_choice` is `"none"`.
    pub tools: Option<ToolRequest>,
    /// Chat only: whether a thinking model's reasoning goes to
    /// `reasoning_content` (`reasoning_format` `auto`, the default, or
    /// `deepseek`) or stays in `content` (`none`).
    pub split_reasoning: bool,
    /// Chat only: more variables for the chat template
    /// (`chat_template_kwargs`, e.g. `{"enable_thinking": false}`).
    pub template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Chat only: `thinking_budget_tokens` (llama-server's name), the most
    /// tokens the model's thinking may take: a harmony (gpt-oss) answer's
    /// analysis message, or the rest of a thinking block the prompt opened;
    /// `usize::MAX` for -1 (no bound of its own). `None` when not given.
    pub thinking_budget: Option<usize>,
}

/// What a constrained answer must be.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputConstraint {
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this schema.
    JsonSchema(Value),
    /// Text of this GBNF grammar (llama.cpp's format).
    Gbnf(String),
}

/// One function a chat request offers (`tools[i].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON schema of the arguments (an empty object schema when the
    /// request gives none).
    pub parameters: Value,
    /// `strict`: the arguments are constrained to the schema.
    pub strict: bool,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model answers in text or calls functions, as it likes.
    Auto,
    /// The model must call at least one function.
    Required,
    /// The model must call this function.
    Function(String),
}

/// The functions of a chat request and how they may be called.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): more than one call per answer.
    pub parallel: bool,
}

/// Most functions one request may offer (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Most calls one assistant message of the history may hold.
pub const MAX_TOOL_CALLS: usize = 128;
/// Longest GBNF grammar accepted, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 64 << 10;

/// Defaults when a request leaves a sampling field out: llama-server's
/// (and `fathom generate`'s).
pub const DEFAULT_TEMPERATURE: f32 = 0.8;
pub const DEFAULT_TOP_K: usize = 40;
pub const DEFAULT_TOP_P: f32 = 0.95;
pub const DEFAULT_MIN_P: f32 = 0.05;
/// Most stop strings one request may give.
pub const MAX_STOP: usize = 16;
/// Most messages one chat request may hold.
pub const MAX_MESSAGES: usize = 4096;
/// Most alternatives per token chat's `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_CHAT_TOP_LOGPROBS: u64 = fathom_engine::logprob::MAX_TOP_LOGPROBS as u64;
/// Most alternatives per token completions' `logprobs` may ask for (OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// JSON values (counted from the structure: brackets, braces, commas and
/// colons) a body may hold beyond a prompt's token ids: room for
/// [`MAX_MESSAGES`] messages with a few fields and parts each, the stop
/// strings and a [`MAX_LOGIT_BIAS`] map. The plan's `requests` term counts
/// the same number.
pub const STRUCTURE_VALUES: usize = fathom_plan::serve::STRUCTURE_VALUES as usize;

/// Parses a request body for `route`, with room for prompts of up to
/// 2^20 token ids. `seed` is used when the request gives none (a fresh
/// one per request keeps sampling varied).
pub fn parse(route: Route, body: &[u8], seed: u64) -> Result<GenerationRequest, ApiError> {
    parse_bounded(route, body, seed, STRUCTURE_VALUES + (1 << 20))
}

/// Upper bound on the JSON values in `body` (one per `[`, `{`, `,` and
/// `:` outside strings, plus one), found in one pass with no allocation.
pub fn json_values(body: &[u8]) -> usize {
    1 + outside_strings(body)
        .filter(|(_, b)| matches!(b, b'[' | b'{' | b',' | b':'))
        .count()
}

/// The bytes of JSON text `body` that lie outside its strings, with their
/// offsets (the quotes themselves left out), in one pass.
pub fn outside_strings(body: &[u8]) -> impl Iterator<Item = (usize, u8)> + '_ {
    let (mut in_string, mut escaped) = (false, false);
    body.iter().enumerate().filter_map(move |(at, &b)| {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            None
        } else if b == b'"' {
            in_string = true;
            None
        } else {
            Some((at, b))
        }
    })
}

/// [`parse`] for a body that may hold at most `max_values` JSON values
/// (see [`json_values`]): checked before the body is parsed, so the parsed
/// tree stays proportional to the bytes, not up to 30 times them (a
/// `[0,0,...]` array is 2 bytes per 32-byte value).
pub fn parse_bounded(
    route: Route,
    body: &[u8],
    seed: u64,
    max_values: usize,
) -> Result<GenerationRequest, ApiError> {
    let values = json_values(body);
    if values > max_values {
        return Err(ApiError::new(
            400,
            "invalid_request_error",
            format!(
                "the request body holds about {values} JSON values; this server takes at most {max_values} (a prompt of token ids as long as the context, plus {STRUCTURE_VALUES} for everything else)"
            ),
        )
        .with_code("request_too_large"));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            400,
            "invalid_request_error",
            format!("the request body is not valid JSON: {e}"),
        )
        .with_code("invalid_json")
    })?;
    let Value::Object(obj) = value else {
        return Err(ApiError::new(
            400,
            "invalid_request_error",
            "the request body must be a JSON object",
        )
        .with_code("invalid_json"));
    };
    let prompt = match route {
        Route::Chat => Prompt::Chat(messages(&obj)?),
        Route::Completion => completion_prompt(&obj)?,
    };
    let model = match present(&obj, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(wrong_type("model", "a string", other)),
    };
    if let Some(n) = integer(&obj, "n", 0, u32::MAX as u64)? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("n is {n}, but only n = 1 (one choice per request) is supported"),
            ));
        }
    }
    unsupported(route, &obj)?;
    let echo = match route {
        Route::Completion => boolean(&obj, "echo")?.unwrap_or(false),
        // Not a chat field: ignored as unknown fields are.
        Route::Chat => false,
    };
    let logprobs = logprobs(route, &obj)?;
    let max_tokens = max_tokens(&obj, echo)?;
    let seed = match present(&obj, "seed") {
        None => seed,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => return Err(wrong_type("seed", "an integer", v)),
        },
    };
    let defaults = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: number(&obj, "temperature", 0.0, 2.0)?.unwrap_or(DEFAULT_TEMPERATURE),
        top_k: integer(&obj, "top_k", 0, u32::MAX as u64)?.map_or(DEFAULT_TOP_K, |k| k as usize),
        top_p: number(&obj, "top_p", 0.0, 1.0)?.unwrap_or(DEFAULT_TOP_P),
        min_p: number(&obj, "min_p", 0.0, 1.0)?.unwrap_or(DEFAULT_MIN_P),
        repeat_penalty: number(&obj, "repeat_penalty", 0.0, 10.0)?
            .unwrap_or(defaults.repeat_penalty),
        repeat_last_n: integer(&obj, "repeat_last_n", 0, 1 << 20)?
            .map_or(defaults.repeat_last_n, |n| n as usize),
        presence_penalty: number(&obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: number(&obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        seed,
        ignore_eos: boolean(&obj, "ignore_eos")?.unwrap_or(false),
        logit_bias: logit_bias(&obj)?,
    };
    let stream = boolean(&obj, "stream")?.unwrap_or(false);
    let include_usage = match present(&obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")
            .map_err(|e| ApiError {
                param: Some("stream_options.include_usage".into()),
                ..e
            })?
            .unwrap_or(false),
        Some(other) => return Err(wrong_type("stream_options", "an object", other)),
    };
    let parse_special = boolean(&obj, "parse_special")?.unwrap_or(false);
    if parse_special && route == Route::Chat {
        return Err(ApiError::invalid(
            "parse_special",
            "parse_special is for /v1/completions: chat message content is always text, and only the chat template's own markers are special tokens",
        )
        .with_code("unsupported_parameter"));
    }
    let constraint = constraint(&obj)?;
    let tools = tools(route, &obj)?;
    if let (Some(_), Some(_)) = (&constraint, &tools) {
        return Err(ApiError::invalid(
            "response_format",
            "response_format (or json_schema, grammar) together with tools is not supported: the answer is either constrained to the format or may be a tool call",
        )
        .with_code("unsupported_parameter"));
    }
    Ok(GenerationRequest {
        model,
        prompt,
        max_tokens,
        sampling,
        stop: stop(&obj)?,
        stream,
        include_usage,
        parse_special,
        logprobs,
        echo,
        constraint,
        tools,
        split_reasoning: route == Route::Chat && reasoning_format(&obj)?,
        template_kwargs: template_kwargs(route, &obj)?,
        thinking_budget: thinking_budget(route, &obj)?,
    })
}

/// `thinking_budget_tokens`: an integer from 0 up, or -1 for no bound
/// (llama-server's convention). Whether the model's template can take it
/// is the server's to check, which knows the template.
fn thinking_budget(route: Route, obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    const NAME: &str = "thinking_budget_tokens";
    let Some(v) = present(obj, NAME) else {
        return Ok(None);
    };
    if route == Route::Completion {
        return Err(ApiError::invalid(
            NAME,
            format!("{NAME} is for /v1/chat/completions: it bounds the reasoning of a chat answer"),
        )
        .with_code("unsupported_parameter"));
    }
    if v.as_i64() == Some(-1) {
        return Ok(Some(usize::MAX));
    }
    integer(obj, NAME, 0, u32::MAX as u64)
        .map(|n| n.map(|n| n as usize))
        .map_err(|e| ApiError {
            message: format!("{} (or -1: no bound)", e.message),
            ..e
        })
}

/// `chat_template_kwargs` (vLLM's and llama-server's): an object whose
/// entries the chat template sees as variables.
fn template_kwargs(
    route: Route,
    obj: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    match (route, present(obj, "chat_template_kwargs")) {
        (_, None) => Ok(None),
        (Route::Chat, Some(Value::Object(kwargs))) => Ok(Some(kwargs.clone())),
        (Route::Chat, Some(other)) => Err(wrong_type("chat_template_kwargs", "an object", other)),
        (Route::Completion, Some(_)) => Err(ApiError::invalid(
            "chat_template_kwargs",
            "chat_template_kwargs is for /v1/chat/completions: a completion's prompt is not rendered by the chat template",
        )
        .with_code("unsupported_parameter")),
    }
}

/// llama-server's `reasoning_format`: whether to split the reasoning off.
fn reasoning_format(obj: &Map<String, Value>) -> Result<bool, ApiError> {
    match present(obj, "reasoning_format") {
        None => Ok(true),
        Some(Value::String(s)) => match s.as_str() {
            "auto" | "deepseek" => Ok(true),
            "none" => Ok(false),
            other => Err(ApiError::invalid(
                "reasoning_format",
                format!("reasoning_format {other:?} is not one of auto, deepseek, none"),
            )),
        },
        Some(other) => Err(wrong_type("reasoning_format", "a string", other)),
    }
}

/// `response_format`, or llama-server's `json_schema` or `grammar`: at
/// most one of them.
fn constraint(
    obj: &Map<String, Value>,
) -> Result<Option<(&'static str, OutputConstraint)>, ApiError> {
    let mut found: Vec<(&'static str, OutputConstraint)> = Vec::new();
    if let Some(format) = present(obj, "response_format") {
        let Value::Object(format) = format else {
            return Err(wrong_type("response_format", "an object", format));
        };
        match present(format, "type") {
            Some(Value::String(t)) if t == "text" => {}
            Some(Value::String(t)) if t == "json_object" => {
                found.push(("response_format", OutputConstraint::JsonObject))
            }
            Some(Value::String(t)) if t == "json_schema" => {
                let spec = match present(format, "json_schema") {
                    Some(Value::Object(spec)) => spec,
                    Some(other) => {
                        return Err(wrong_type("response_format.json_schema", "an object", other))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            "response_format.json_schema",
                            "response_format.json_schema is required with type \"json_schema\": {\"name\", \"schema\", \"strict\"}",
                        ))
                    }
                };
                if let Some(name) = present(spec, "name") {
                    if !name.is_string() {
                        return Err(wrong_type("response_format.json_schema.name", "a string", name));
                    }
                }
                if let Some(strict) = present(spec, "strict") {
                    if !strict.is_boolean() {
                        return Err(wrong_type("response_format.json_schema.strict", "a boolean", strict));
                    }
                }
                let c = match present(spec, "schema") {
                    None => OutputConstraint::JsonObject,
                    Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                        OutputConstraint::JsonSchema(schema.clone())
                    }
                    Some(other) => {
                        return Err(wrong_type(
                            "response_format.json_schema.schema",
                            "a JSON schema (an object)",
                            other,
                        ))
                    }
                };
                found.push(("response_format", c));
            }
            Some(Value::String(t)) => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    format!("response_format.type is {t:?}; valid types are \"text\", \"json_object\" and \"json_schema\""),
                ))
            }
            Some(other) => return Err(wrong_type("response_format.type", "a string", other)),
            None => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    "response_format.type is required: \"text\", \"json_object\" or \"json_schema\"",
                ))
            }
        }
    }
    match present(obj, "json_schema") {
        None => {}
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
            found.push(("json_schema", OutputConstraint::JsonSchema(schema.clone())))
        }
        Some(other) => {
            return Err(wrong_type(
                "json_schema",
                "a JSON schema (an object)",
                other,
            ))
        }
    }
    match present(obj, "grammar") {
        None => {}
        Some(Value::String(g)) if g.trim().is_empty() => {}
        Some(Value::String(g)) if g.len() > MAX_GRAMMAR_BYTES => {
            return Err(ApiError::invalid(
                "grammar",
                format!(
                    "grammar has {} bytes; at most {MAX_GRAMMAR_BYTES} are accepted",
                    g.len()
                ),
            ))
        }
        Some(Value::String(g)) => found.push(("grammar", OutputConstraint::Gbnf(g.clone()))),
        Some(other) => return Err(wrong_type("grammar", "a string (a GBNF grammar)", other)),
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].0,
            format!(
                "{} and {} both constrain the answer; give one of response_format, json_schema and grammar",
                found[0].0, found[1].0
            ),
        ));
    }
    Ok(found.pop())
}

/// A field that must be there and be an object; `shape` says what it holds.
fn required_object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    param: &str,
    shape: &str,
) -> Result<&'a Map<String, Value>, ApiError> {
    match present(obj, key) {
        Some(Value::Object(o)) => Ok(o),
        Some(other) => Err(wrong_type(param, "an object", other)),
        None => Err(ApiError::invalid(
            param,
            format!("{param} is required: {shape}"),
        )),
    }
}

/// A field that must be there and be a string.
fn required_string(obj: &Map<String, Value>, key: &str, param: &str) -> Result<String, ApiError> {
    match present(obj, key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(wrong_type(param, "a string", other)),
        None => Err(ApiError::invalid(param, format!("{param} is required"))),
    }
}

/// A function name: OpenAI's rule, 1 to 64 of a-z, A-Z, 0-9, `_` and `-`.
fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn tools(route: Route, obj: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    let list = match present(obj, "tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(other) => return Err(wrong_type("tools", "an array", other)),
    };
    if !list.is_empty() && route == Route::Completion {
        return Err(
            ApiError::invalid("tools", "tools are a /v1/chat/completions field")
                .with_code("unsupported_parameter"),
        );
    }
    if list.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "tools holds {} functions; at most {MAX_TOOLS} are accepted",
                list.len()
            ),
        ));
    }
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| format!("tools[{i}]{f}");
        let Value::Object(t) = t else {
            return Err(wrong_type(&at(""), "an object", t));
        };
        match present(t, "type") {
            Some(Value::String(k)) if k == "function" => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    &at(".type"),
                    format!(
                        "{} is {other}; the only tool type is \"function\"",
                        at(".type")
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &at(".type"),
                    format!("{} is required: \"function\"", at(".type")),
                ))
            }
        }
        let f = required_object(
            t,
            "function",
            &at(".function"),
            "{\"name\", \"description\", \"parameters\"}",
        )?;
        let name = required_string(f, "name", &at(".function.name"))?;
        if !valid_function_name(&name) {
            return Err(ApiError::invalid(
                &at(".function.name"),
                format!(
                    "{} is {name:?}; a function name is 1 to 64 letters, digits, '_', '-' or '.'",
                    at(".function.name")
                ),
            ));
        }
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(ApiError::invalid(
                &at(".function.name"),
                format!("two tools are named {name:?}; names must be distinct"),
            ));
        }
        let description = match present(f, "description") {
            None => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(other) => return Err(wrong_type(&at(".function.description"), "a string", other)),
        };
        let parameters = match present(f, "parameters") {
            None => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(other) => {
                return Err(wrong_type(
                    &at(".function.parameters"),
                    "a JSON schema (an object)",
                    other,
                ))
            }
        };
        let strict = boolean(f, "strict")
            .map_err(|e| ApiError {
                param: Some(at(".function.strict")),
                ..e
            })?
            .unwrap_or(false);
        tools.push(Tool {
            name,
            description,
            parameters,
            strict,
        });
    }
    let choice = match present(obj, "tool_choice") {
        None => (!tools.is_empty()).then_some(ToolChoice::Auto),
        Some(Value::String(c)) => match c.as_str() {
            "none" => None,
            "auto" => (!tools.is_empty()).then_some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice is {other:?}; valid are \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        },
        Some(Value::Object(c)) => {
            let name = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "tool_choice as an object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            Some(ToolChoice::Function(name.to_string()))
        }
        Some(other) => return Err(wrong_type("tool_choice", "a string or an object", other)),
    };
    let parallel = boolean(obj, "parallel_tool_calls")?.unwrap_or(true);
    let Some(choice) = choice else {
        return Ok(None);
    };
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice asks for a function call, but tools lists no functions",
        ));
    }
    if let ToolChoice::Function(name) = &choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names the function {name:?}, which tools does not list"),
            ));
        }
    }
    Ok(Some(ToolRequest {
        tools,
        choice,
        parallel,
    }))
}

/// `max_completion_tokens`, else `max_tokens`: at least 1, or 0 with
/// `echo` (the prompt scored and nothing generated, as evaluation
/// harnesses ask for log-likelihoods).
fn max_tokens(obj: &Map<String, Value>, echo: bool) -> Result<Option<usize>, ApiError> {
    let name = if present(obj, "max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let min = u64::from(!echo);
    let n = integer(obj, name, min, u32::MAX as u64).map_err(|e| {
        if present(obj, name).and_then(Value::as_f64) == Some(0.0) {
            ApiError::invalid(
                name,
                format!("{name} is 0, but must be an integer from 1 to {}; 0 is only for /v1/completions with echo: true (the prompt scored, nothing generated)", u32::MAX),
            )
        } else {
            e
        }
    })?;
    Ok(n.map(|n| n as usize))
}

/// The alternatives per token asked for, if logprobs are: chat's
/// boolean `logprobs` with `top_logprobs`, or completions' integer
/// `logprobs`.
fn logprobs(route: Route, obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    match route {
        Route::Chat => {
            let on = boolean(obj, "logprobs")?.unwrap_or(false);
            let top = integer(obj, "top_logprobs", 0, MAX_CHAT_TOP_LOGPROBS)?;
            match (on, top) {
                (false, Some(_)) => Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                )),
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0) as usize)),
            }
        }
        Route::Completion => {
            if present(obj, "top_logprobs").is_some() {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("top_logprobs is a /v1/chat/completions field; on /v1/completions, logprobs is the number of alternatives per token (an integer from 0 to {MAX_COMPLETION_LOGPROBS})"),
                ));
            }
            match present(obj, "logprobs") {
                Some(Value::Bool(_)) => Err(ApiError::invalid(
                    "logprobs",
                    format!("logprobs on /v1/completions is the number of alternatives per token, an integer from 0 to {MAX_COMPLETION_LOGPROBS}, not a boolean"),
                )),
                _ => Ok(integer(obj, "logprobs", 0, MAX_COMPLETION_LOGPROBS)?.map(|n| n as usize)),
            }
        }
    }
}

/// A field that is there and not `null`.
fn present<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        param,
        format!("{param} must be {expected}, not {}", type_name(got)),
    )
}

fn number(
    obj: &Map<String, Value>,
    name: &str,
    min: f32,
    max: f32,
) -> Result<Option<f32>, ApiError> {
    let Some(v) = present(obj, name) else {
        return Ok(None);
    };
    let x = v.as_f64().ok_or_else(|| wrong_type(name, "a number", v))?;
    if !(min as f64..=max as f64).contains(&x) {
        return Err(ApiError::invalid(
            name,
            format!("{name} is {x}, but must be between {min} and {max}"),
        ));
    }
    Ok(Some(x as f32))
}

fn integer(
    obj: &Map<String, Value>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(v) = present(obj, name) else {
        return Ok(None);
    };
    let out_of_range = || {
        ApiError::invalid(
            name,
            format!("{name} is {v}, but must be an integer from {min} to {max}"),
        )
    };
    if let Some(n) = v.as_u64() {
        return if (min..=max).contains(&n) {
            Ok(Some(n))
        } else {
            Err(out_of_range())
        };
    }
    match v.as_f64() {
        // Whole floats (`16.0`) are integers, as OpenAI's server takes them.
        Some(f) if f.fract() == 0.0 && f >= min as f64 && f <= max as f64 => Ok(Some(f as u64)),
        Some(f) if f.fract() == 0.0 => Err(out_of_range()),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("{name} is {v}, but must be a whole number from {min} to {max}"),
        )),
        None => Err(wrong_type(name, "an integer", v)),
    }
}

/// Most `logit_bias` entries one request may give (OpenAI takes 300).
pub const MAX_LOGIT_BIAS: usize = 1024;

/// OpenAI's `logit_bias`: `{"token id": bias}` with biases from -100 to
/// 100. Ids are checked against the vocabulary by the caller, which knows it.
fn logit_bias(obj: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match present(obj, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(wrong_type(
                "logit_bias",
                "an object of {\"token id\": bias}",
                other,
            ))
        }
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "logit_bias has {} entries; at most {MAX_LOGIT_BIAS} are accepted",
                map.len()
            ),
        ));
    }
    map.iter()
        .map(|(key, value)| {
            let id = key.parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!(
                        "logit_bias has the key {key:?}; keys are token ids, integers from 0 to {}",
                        u32::MAX
                    ),
                )
            })?;
            let bias = value
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!(
                            "logit_bias[{key:?}] is {value}, but a bias must be a number from -100 to 100"
                        ),
                    )
                })?;
            Ok((id, bias as f32))
        })
        .collect()
}

fn boolean(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match present(obj, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(name, "a boolean", other)),
    }
}

/// Options this server does not implement: refused rather than ignored
/// when they would change the answer.
fn unsupported(route: Route, obj: &Map<String, Value>) -> Result<(), ApiError> {
    let refuse = |param: &str, what: &str| {
        Err(
            ApiError::invalid(param, format!("{what} is not supported by this server"))
                .with_code("unsupported_parameter"),
        )
    };
    if route == Route::Completion {
        if matches!(present(obj, "suffix"), Some(v) if v != "") {
            return refuse("suffix", "suffix (fill-in-the-middle)");
        }
        if let Some(b) = integer(obj, "best_of", 0, u32::MAX as u64)? {
            if b > 1 {
                return refuse("best_of", "best_of above 1");
            }
        }
    }
    // The deprecated spelling of tools: refused with the way to say it now.
    if matches!(present(obj, "functions"), Some(v) if v != &Value::Array(Vec::new())) {
        return refuse("functions", "functions (deprecated; send tools)");
    }
    if matches!(present(obj, "function_call"), Some(v) if v != "none") {
        return refuse(
            "function_call",
            "function_call other than \"none\" (deprecated; send tool_choice)",
        );
    }
    Ok(())
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let list = match present(obj, "messages") {
        None => {
            return Err(ApiError::invalid(
                "messages",
                "messages is required: an array of {\"role\", \"content\"} objects",
            )
            .with_code("missing_required_parameter"))
        }
        Some(Value::Array(list)) => list,
        Some(other) => return Err(wrong_type("messages", "an array", other)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must hold at least one message",
        ));
    }
    if list.len() > MAX_MESSAGES {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "messages holds {} messages; at most {MAX_MESSAGES} are accepted",
                list.len()
            ),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect()
}

fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let Value::Object(m) = m else {
        return Err(wrong_type(&format!("messages[{i}]"), "an object", m));
    };
    let role = match present(m, "role") {
        Some(Value::String(r)) => r.as_str(),
        Some(other) => return Err(wrong_type(&at("role"), "a string", other)),
        None => {
            return Err(ApiError::invalid(
                &at("role"),
                format!("{} is required", at("role")),
            ))
        }
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        // OpenAI's newer name for system instructions.
        "developer" => "system",
        other => {
            return Err(ApiError::invalid(
                &at("role"),
                format!(
                    "{} is {other:?}; valid roles are system, developer, user, assistant and tool",
                    at("role")
                ),
            ))
        }
    };
    let content = match present(m, "content") {
        None if role == "assistant" => String::new(),
        None => {
            return Err(ApiError::invalid(
                &at("content"),
                format!("{} is required", at("content")),
            ))
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let here = format!("messages[{i}].content[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(ApiError::invalid(&format!("{here}.text"), format!("{here}.text must be a string")))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{here}.type"),
                            format!("{here} must be a {{\"type\": \"text\", \"text\": ...}} part; other content (images, audio, files) is not supported"),
                        ))
                    }
                }
            }
            text
        }
        Some(other) => {
            return Err(wrong_type(
                &at("content"),
                "a string or an array of text parts",
                other,
            ))
        }
    };
    let tool_calls = match (role, present(m, "tool_calls")) {
        (_, None) => Vec::new(),
        ("assistant", Some(Value::Array(calls))) => tool_calls(i, calls)?,
        ("assistant", Some(other)) => return Err(wrong_type(&at("tool_calls"), "an array", other)),
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                &at("tool_calls"),
                format!("{} is for assistant messages", at("tool_calls")),
            ))
        }
    };
    let string_field = |name: &str| match present(m, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(wrong_type(&at(name), "a string", other)),
    };
    let (tool_call_id, name) = if role == "tool" {
        (string_field("tool_call_id")?, string_field("name")?)
    } else {
        (None, None)
    };
    // The reasoning of a past answer, as this server returns it
    // (`reasoning_content`, llama-server's name; `reasoning`, vLLM's and
    // OpenRouter's), for templates that show it to the model again.
    let reasoning = if role == "assistant" {
        match string_field("reasoning_content")? {
            Some(r) => Some(r),
            None => string_field("reasoning")?,
        }
    } else {
        None
    };
    Ok(Message {
        role: role.to_string(),
        content,
        tool_calls,
        tool_call_id,
        name,
        reasoning,
    })
}

/// An assistant message's `tool_calls`: `{"id", "type": "function",
/// "function": {"name", "arguments"}}` each, arguments a JSON string (an
/// object is taken too, and written as JSON).
fn tool_calls(i: usize, calls: &[Value]) -> Result<Vec<ToolCall>, ApiError> {
    if calls.len() > MAX_TOOL_CALLS {
        return Err(ApiError::invalid(
            &format!("messages[{i}].tool_calls"),
            format!(
                "messages[{i}].tool_calls holds {} calls; at most {MAX_TOOL_CALLS} are accepted",
                calls.len()
            ),
        ));
    }
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let at = |f: &str| format!("messages[{i}].tool_calls[{j}]{f}");
            let Value::Object(c) = c else {
                return Err(wrong_type(&at(""), "an object", c));
            };
            let id = match present(c, "id") {
                None => format!("call_{i}_{j}"),
                Some(Value::String(id)) => id.clone(),
                Some(other) => return Err(wrong_type(&at(".id"), "a string", other)),
            };
            let f = required_object(c, "function", &at(".function"), "{\"name\", \"arguments\"}")?;
            let name = required_string(f, "name", &at(".function.name"))?;
            let arguments = match present(f, "arguments") {
                None => "{}".to_string(),
                Some(Value::String(a)) => a.clone(),
                Some(a @ Value::Object(_)) => a.to_string(),
                Some(other) => {
                    return Err(wrong_type(
                        &at(".function.arguments"),
                        "a JSON string",
                        other,
                    ))
                }
            };
            Ok(ToolCall {
                id,
                name,
                arguments,
            })
        })
        .collect()
}

fn completion_prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let one_prompt = "prompt holds several prompts; only one prompt per request is supported";
    let token = |i: usize, v: &Value| {
        v.as_u64()
            .filter(|&t| t <= u32::MAX as u64)
            .map(|t| t as u32)
            .ok_or_else(|| {
                ApiError::invalid(
                    "prompt",
                    format!(
                        "prompt[{i}] is {v}; token ids are integers from 0 to {}",
                        u32::MAX
                    ),
                )
            })
    };
    match present(obj, "prompt") {
        None => Err(ApiError::invalid(
            "prompt",
            "prompt is required: a string, an array of one string, or an array of token ids",
        )
        .with_code("missing_required_parameter")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.first() {
            None => Err(ApiError::invalid("prompt", "prompt is an empty array")),
            Some(Value::String(s)) if items.len() == 1 => Ok(Prompt::Text(s.clone())),
            Some(Value::String(_)) => Err(ApiError::invalid("prompt", one_prompt)),
            Some(Value::Number(_)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| token(i, v))
                .collect::<Result<Vec<u32>, _>>()
                .map(Prompt::Tokens),
            Some(Value::Array(inner)) if items.len() == 1 => {
                if inner.is_empty() {
                    return Err(ApiError::invalid(
                        "prompt",
                        "prompt[0] is an empty array of token ids",
                    ));
                }
                inner
                    .iter()
                    .enumerate()
                    .map(|(i, v)| token(i, v))
                    .collect::<Result<Vec<u32>, _>>()
                    .map(Prompt::Tokens)
            }
            Some(Value::Array(_)) => Err(ApiError::invalid("prompt", one_prompt)),
            Some(other) => Err(wrong_type(
                "prompt[0]",
                "a string, a token id or an array of token ids",
                other,
            )),
        },
        Some(other) => Err(wrong_type("prompt", "a string or an array", other)),
    }
}

fn stop(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list = match present(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP {
                return Err(ApiError::invalid(
                    "stop",
                    format!(
                        "stop holds {} strings; at most {MAX_STOP} are accepted",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(wrong_type(&format!("stop[{i}]"), "a string", other)),
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => return Err(wrong_type("stop", "a string or an array of strings", other)),
    };
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenerationRequest, ApiError> {
        parse(Route::Chat, body.as_bytes(), 7)
    }

    fn completion(body: &str) -> Result<GenerationRequest, ApiError> {
        parse(Route::Completion, body.as_bytes(), 7)
    }

    #[test]
    fn a_full_chat_request_parses_every_field() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
                "max_tokens":5,"max_completion_tokens":6,"temperature":0,"top_p":0.5,"top_k":3,
                "min_p":0.1,"seed":-1,"stop":["a","b"],"presence_penalty":1.5,"frequency_penalty":-1,
                "n":1,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![
                Message::new("system", "be brief"),
                Message::new("user", "hi there"),
            ])
        );
        assert_eq!(r.max_tokens, Some(6), "max_completion_tokens wins");
        assert_eq!(r.sampling.temperature, 0.0);
        assert_eq!(r.sampling.top_p, 0.5);
        assert_eq!(r.sampling.top_k, 3);
        assert_eq!(r.sampling.min_p, 0.1);
        assert_eq!(r.sampling.seed, u64::MAX);
        assert_eq!(r.sampling.presence_penalty, 1.5);
        assert_eq!(r.sampling.frequency_penalty, -1.0);
        assert_eq!(r.stop, ["a", "b"]);
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn defaults_are_llama_server_s() {
        let r = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!(r.sampling.temperature, DEFAULT_TEMPERATURE);
        assert_eq!(r.sampling.top_k, DEFAULT_TOP_K);
        assert_eq!(r.sampling.top_p, DEFAULT_TOP_P);
        assert_eq!(r.sampling.min_p, DEFAULT_MIN_P);
        assert_eq!(r.sampling.seed, 7);
        assert_eq!(r.max_tokens, None);
        assert!(!r.stream && !r.include_usage && r.stop.is_empty());
    }

    #[test]
    fn completion_prompts_take_every_openai_form() {
        let p = |body: &str| completion(body).map(|r| r.prompt);
        assert_eq!(p(r#"{"prompt":"abc"}"#), Ok(Prompt::Text("abc".into())));
        assert_eq!(p(r#"{"prompt":["abc"]}"#), Ok(Prompt::Text("abc".into())));
        assert_eq!(
            p(r#"{"prompt":[1,2,3]}"#),
            Ok(Prompt::Tokens(vec![1, 2, 3]))
        );
        assert_eq!(p(r#"{"prompt":[[4,5]]}"#), Ok(Prompt::Tokens(vec![4, 5])));
        for bad in [
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":[[1],[2]]}"#,
            r#"{"prompt":[]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":[1.5]}"#,
            r#"{"prompt":[4294967296]}"#,
            r#"{"prompt":{}}"#,
            r#"{}"#,
        ] {
            let e = p(bad).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some("prompt")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn errors_name_the_field_and_what_is_valid() {
        let e = chat(r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("n")));
        assert!(e.message.contains("n = 1"), "{}", e.message);
        let e =
            chat(r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("between 0 and 2"), "{}", e.message);
        let e =
            chat(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-4}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = chat(r#"{"messages":[{"role":"robot","content":"x"}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert!(e.message.contains("\"robot\""), "{}", e.message);
        let e =
            chat(r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let e = chat(r#"{"messages":"hi"}"#).unwrap_err();
        assert!(e.message.contains("not a string"), "{}", e.message);
        let e = chat(
            r#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}}"#,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream_options.include_usage"));
        let e = chat(r#"{"messages":[{"role":"user","content":"x"}],"suffix":"y"}"#);
        assert!(e.is_ok(), "suffix is not a chat field: ignored");
        let e = completion(r#"{"prompt":"x","suffix":"y"}"#).unwrap_err();
        assert_eq!(e.code, Some("unsupported_parameter"));
        let e = chat("{\"messages\": [").unwrap_err();
        assert_eq!((e.status, e.code), (400, Some("invalid_json")));
        let e = chat("[1]").unwrap_err();
        assert_eq!((e.status, e.code), (400, Some("invalid_json")));
    }

    #[test]
    fn logprobs_and_echo_parse_and_bad_values_name_the_field() {
        let msg = r#""messages":[{"role":"user","content":"x"}]"#;
        let c = |extra: &str| chat(&format!("{{{msg},{extra}}}"));
        assert_eq!(c(r#""logprobs":true"#).unwrap().logprobs, Some(0));
        assert_eq!(
            c(r#""logprobs":true,"top_logprobs":20"#).unwrap().logprobs,
            Some(20)
        );
        assert_eq!(c(r#""logprobs":false"#).unwrap().logprobs, None);
        assert!(
            !c(r#""echo":true"#).unwrap().echo,
            "echo is not a chat field"
        );
        for (bad, param) in [
            (r#""logprobs":true,"top_logprobs":21"#, "top_logprobs"),
            (r#""logprobs":true,"top_logprobs":-1"#, "top_logprobs"),
            (r#""top_logprobs":2"#, "top_logprobs"),
            (r#""logprobs":1"#, "logprobs"),
            (r#""max_tokens":0"#, "max_tokens"),
        ] {
            let e = c(bad).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{bad}");
        }
        let r = completion(r#"{"prompt":"x","logprobs":5,"echo":true,"max_tokens":0}"#).unwrap();
        assert_eq!((r.logprobs, r.echo, r.max_tokens), (Some(5), true, Some(0)));
        let r = completion(r#"{"prompt":"x","logprobs":0,"echo":false}"#).unwrap();
        assert_eq!((r.logprobs, r.echo), (Some(0), false));
        for (bad, param) in [
            (r#""logprobs":6"#, "logprobs"),
            (r#""logprobs":true"#, "logprobs"),
            (r#""logprobs":1.5"#, "logprobs"),
            (r#""top_logprobs":1"#, "top_logprobs"),
            (r#""echo":"yes""#, "echo"),
            (r#""max_tokens":0"#, "max_tokens"),
            (
                r#""max_completion_tokens":0,"max_tokens":4"#,
                "max_completion_tokens",
            ),
        ] {
            let e = completion(&format!(r#"{{"prompt":"x",{bad}}}"#)).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{bad}");
            assert!(!e.message.is_empty());
        }
        let e = completion(r#"{"prompt":"x","logprobs":9}"#).unwrap_err();
        assert!(e.message.contains("0 to 5"), "{}", e.message);
    }

    #[test]
    fn logit_bias_parses_and_bad_entries_name_the_field() {
        let r = chat(
            r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"15":-100,"7":2.5}}"#,
        )
        .unwrap();
        let mut bias = r.sampling.logit_bias;
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, [(7, 2.5), (15, -100.0)]);
        for bad in [
            r#""logit_bias":{"x":1}"#,
            r#""logit_bias":{"-1":1}"#,
            r#""logit_bias":{"1.5":1}"#,
            r#""logit_bias":{"1":101}"#,
            r#""logit_bias":{"1":-100.5}"#,
            r#""logit_bias":{"1":"1"}"#,
            r#""logit_bias":[1]"#,
        ] {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{bad}}}"#);
            let e = chat(&body).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some("logit_bias")),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_deprecated_function_fields_are_refused_not_ignored() {
        for field in [
            r#""functions":[{"name":"f","parameters":{}}]"#,
            r#""function_call":"auto""#,
            r#""function_call":{"name":"f"}"#,
        ] {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{field}}}"#);
            let e = chat(&body).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (400, Some("unsupported_parameter")),
                "{field}"
            );
        }
        // Asking for no calls is honoured.
        let r = chat(r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"none","function_call":"none","tools":[],"functions":[]}"#)
            .unwrap();
        assert_eq!(r.tools, None);
    }

    #[test]
    fn tools_and_tool_choice_parse_and_errors_name_the_field() {
        let tools = r#""tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}},{"type":"function","function":{"name":"now"}}]"#;
        let body = |rest: &str| {
            format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{tools}{rest}}}"#)
        };
        let r = chat(&body("")).unwrap();
        let t = r.tools.unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.parallel);
        assert_eq!(t.tools.len(), 2);
        assert!(t.tools[0].strict && !t.tools[1].strict);
        assert_eq!(
            t.tools[1].parameters,
            json!({"type": "object", "properties": {}})
        );
        let r = chat(&body(
            r#","tool_choice":"required","parallel_tool_calls":false"#,
        ))
        .unwrap();
        let t = r.tools.unwrap();
        assert_eq!((t.choice, t.parallel), (ToolChoice::Required, false));
        let r = chat(&body(
            r#","tool_choice":{"type":"function","function":{"name":"now"}}"#,
        ))
        .unwrap();
        assert_eq!(r.tools.unwrap().choice, ToolChoice::Function("now".into()));
        assert_eq!(chat(&body(r#","tool_choice":"none""#)).unwrap().tools, None);
        for (rest, param) in [
            (
                r#","tool_choice":{"type":"function","function":{"name":"nope"}}"#,
                "tool_choice",
            ),
            (r#","tool_choice":"sometimes""#, "tool_choice"),
            (r#","parallel_tool_calls":1"#, "parallel_tool_calls"),
            (
                r#","response_format":{"type":"json_object"}"#,
                "response_format",
            ),
        ] {
            let e = chat(&body(rest)).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{rest}: {e:?}"
            );
        }
        for (tools, param) in [
            (r#"[{"type":"retrieval"}]"#, "tools[0].type"),
            (r#"[{"type":"function"}]"#, "tools[0].function"),
            (
                r#"[{"type":"function","function":{"name":"a b"}}]"#,
                "tools[0].function.name",
            ),
            (
                r#"[{"type":"function","function":{"name":"f","parameters":[]}}]"#,
                "tools[0].function.parameters",
            ),
            (
                r#"[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]"#,
                "tools[1].function.name",
            ),
            (r#"{}"#, "tools"),
        ] {
            let e = chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":{tools}}}"#
            ))
            .unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{tools}: {e:?}"
            );
        }
        let e = chat(r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = completion(&format!(r#"{{"prompt":"x",{tools}}}"#)).unwrap_err();
        assert_eq!(e.code, Some("unsupported_parameter"));
    }

    #[test]
    fn a_history_with_tool_calls_and_results_parses() {
        let r = chat(
            r#"{"messages":[{"role":"user","content":"weather?"},
                {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
                {"role":"tool","tool_call_id":"call_1","content":"22 C"}]}"#,
        )
        .unwrap();
        let Prompt::Chat(m) = r.prompt else { panic!() };
        assert_eq!(m[1].tool_calls.len(), 1);
        assert_eq!(m[1].tool_calls[0].name, "get_weather");
        assert_eq!(m[1].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(m[2].role, "tool");
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1"));
        let e =
            chat(r#"{"messages":[{"role":"user","content":"x","tool_calls":[]}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls"));
        // An assistant message's reasoning, under either name; a string.
        let r = chat(
            r#"{"messages":[{"role":"user","content":"x","reasoning_content":"ignored"},
                {"role":"assistant","content":"a","reasoning_content":"because"},
                {"role":"assistant","content":"b","reasoning":"so"},
                {"role":"assistant","content":"c","reasoning_content":null}]}"#,
        )
        .unwrap();
        let Prompt::Chat(m) = r.prompt else { panic!() };
        let reasoning: Vec<Option<&str>> = m.iter().map(|m| m.reasoning.as_deref()).collect();
        assert_eq!(reasoning, [None, Some("because"), Some("so"), None]);
        for (field, value) in [("reasoning_content", "5"), ("reasoning", "[\"a\"]")] {
            let e = chat(&format!(
                r#"{{"messages":[{{"role":"assistant","content":"a","{field}":{value}}}]}}"#
            ))
            .unwrap_err();
            let param = format!("messages[0].{field}");
            assert_eq!(e.param.as_deref(), Some(param.as_str()));
            assert!(
                e.message.contains(&param) && e.message.contains("a string"),
                "{}",
                e.message
            );
        }
        let e = chat(r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}]}"#).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].tool_calls[0].function.name")
        );
    }

    #[test]
    fn response_format_json_schema_and_grammar_parse() {
        let c = |rest: &str| {
            chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],{rest}}}"#
            ))
            .map(|r| r.constraint)
        };
        assert_eq!(c(r#""response_format":{"type":"text"}"#), Ok(None));
        assert_eq!(
            c(r#""response_format":{"type":"json_object"}"#),
            Ok(Some(("response_format", OutputConstraint::JsonObject)))
        );
        assert_eq!(
            c(
                r#""response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"integer"}}}"#
            ),
            Ok(Some((
                "response_format",
                OutputConstraint::JsonSchema(json!({"type": "integer"}))
            )))
        );
        assert_eq!(
            c(r#""json_schema":{"type":"integer"}"#),
            Ok(Some((
                "json_schema",
                OutputConstraint::JsonSchema(json!({"type": "integer"}))
            )))
        );
        assert_eq!(
            c(r#""grammar":"root ::= \"a\"""#),
            Ok(Some((
                "grammar",
                OutputConstraint::Gbnf(r#"root ::= "a""#.into())
            )))
        );
        let r = completion(r#"{"prompt":"x","json_schema":{"type":"integer"}}"#).unwrap();
        assert!(r.constraint.is_some());
        for (rest, param) in [
            (
                r#""response_format":{"type":"xml"}"#,
                "response_format.type",
            ),
            (r#""response_format":{}"#, "response_format.type"),
            (r#""response_format":"json""#, "response_format"),
            (
                r#""response_format":{"type":"json_schema"}"#,
                "response_format.json_schema",
            ),
            (
                r#""response_format":{"type":"json_schema","json_schema":{"schema":1}}"#,
                "response_format.json_schema.schema",
            ),
            (r#""json_schema":"{}""#, "json_schema"),
            (r#""grammar":5"#, "grammar"),
            (r#""grammar":"root ::= \"a\"","json_schema":{}"#, "grammar"),
        ] {
            let e = c(rest).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{rest}: {e:?}"
            );
        }
    }

    #[test]
    fn the_json_value_count_bounds_the_parsed_tree() {
        assert_eq!(json_values(br#"{"a":[1,2,3],"b":"[,{:\"]"}"#), 8);
        let tokens = format!(r#"{{"prompt":[{}0]}}"#, "0,".repeat(100));
        assert!(parse_bounded(Route::Completion, tokens.as_bytes(), 1, 110).is_ok());
        let e = parse_bounded(Route::Completion, tokens.as_bytes(), 1, 100).unwrap_err();
        assert_eq!((e.status, e.code), (400, Some("request_too_large")));
        let e = chat(r#"{"messages":[{"role":"user","content":"x"}],"parse_special":true}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("parse_special"));
        assert!(
            completion(r#"{"prompt":"x","parse_special":true}"#)
                .unwrap()
                .parse_special
        );
        assert!(!completion(r#"{"prompt":"x"}"#).unwrap().parse_special);
    }

    #[test]
    fn whole_floats_are_integers() {
        let r =
            chat(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":4.0,"top_k":2e1}"#)
                .unwrap();
        assert_eq!((r.max_tokens, r.sampling.top_k), (Some(4), 20));
        let e =
            chat(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":4.5}"#).unwrap_err();
        assert!(e.message.contains("whole number"), "{}", e.message);
        let e =
            chat(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-4.0}"#).unwrap_err();
        assert!(e.message.contains("from 1"), "{}", e.message);
    }

    #[test]
    fn nulls_count_as_absent_and_developer_is_system() {
        let r = chat(
            r#"{"messages":[{"role":"developer","content":"d"},{"role":"assistant","content":null}],
                "temperature":null,"stop":null,"seed":null,"max_tokens":null,"logprobs":false}"#,
        )
        .unwrap();
        assert_eq!(r.sampling.temperature, DEFAULT_TEMPERATURE);
        let Prompt::Chat(m) = r.prompt else { panic!() };
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content, "");
    }

    #[test]
    fn error_json_has_the_openai_shape() {
        let v = ApiError::invalid("n", "bad").to_json();
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "n");
        assert_eq!(v["error"]["code"], "invalid_value");
        let v = ApiError::new(500, "server_error", "x").to_json();
        assert!(v["error"]["param"].is_null() && v["error"]["code"].is_null());
    }

    #[test]
    fn thinking_budget_tokens_is_a_count_or_minus_one_on_chat_only() {
        let budget = |v: &str| {
            chat(&format!(
                r#"{{"messages":[{{"role":"user","content":"x"}}],"thinking_budget_tokens":{v}}}"#
            ))
            .map(|r| r.thinking_budget)
        };
        assert_eq!(budget("null"), Ok(None));
        assert_eq!(budget("0"), Ok(Some(0)));
        assert_eq!(budget("512"), Ok(Some(512)));
        assert_eq!(budget("-1"), Ok(Some(usize::MAX)));
        for bad in ["-2", "1.5", "\"8\"", "true"] {
            let e = budget(bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("thinking_budget_tokens"), "{bad}");
            assert!(e.message.contains("thinking_budget_tokens"), "{bad}: {e:?}");
        }
        let e = completion(r#"{"prompt":"x","thinking_budget_tokens":8}"#).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.code),
            (
                Some("thinking_budget_tokens"),
                Some("unsupported_parameter")
            )
        );
    }
}

/// Seeded mutations of valid bodies: every outcome is a request or a 4xx
/// error in the OpenAI shape, never a panic.
#[cfg(test)]
mod mutation_tests {
    use super::*;
    use fathom_fixtures::Rng;

    const SEEDS: &[(Route, &str)] = &[
        (
            Route::Chat,
            r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":8,"temperature":0.5,"top_p":0.9,"top_k":4,"min_p":0.1,"seed":3,"stop":["x","y"],"n":1,"stream":true,"stream_options":{"include_usage":true},"presence_penalty":0.5,"frequency_penalty":0.2}"#,
        ),
        (
            Route::Chat,
            r#"{"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":null}],"max_completion_tokens":4,"stop":"\n","logprobs":false,"response_format":{"type":"text"}}"#,
        ),
        (
            Route::Completion,
            r#"{"model":"m","prompt":"1, 2, 3","max_tokens":16,"temperature":0,"stream":false,"echo":false,"best_of":1,"suffix":""}"#,
        ),
        (Route::Completion, r#"{"prompt":[[1,2,3]],"seed":-7}"#),
        (
            Route::Completion,
            r#"{"prompt":[1,2,3],"max_tokens":0,"echo":true,"logprobs":1,"temperature":0}"#,
        ),
        (
            Route::Chat,
            r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":3}"#,
        ),
        (
            Route::Completion,
            r#"{"prompt":["text"],"stop":null,"n":null}"#,
        ),
        (
            Route::Chat,
            r#"{"messages":[{"role":"user","content":"w"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"call_1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false}"#,
        ),
        (
            Route::Chat,
            r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"a":{"enum":[1,"b"]}}}}}}"#,
        ),
        (
            Route::Completion,
            r#"{"prompt":"x","grammar":"root ::= [a-z]+ \"!\"","max_tokens":4}"#,
        ),
        (
            Route::Completion,
            r##"{"prompt":"x","json_schema":{"type":"array","items":{"$ref":"#/$defs/a"},"$defs":{"a":{"type":"string"}}}}"##,
        ),
    ];

    const TOKENS: &[&str] = &[
        "null",
        "-1",
        "0",
        "1e309",
        "-0.0",
        "18446744073709551616",
        "\"\"",
        "[]",
        "{}",
        "[",
        "{",
        "\"",
        ",",
        ":",
        "true",
        "\\u0000",
        "\\ud800",
        "\u{7f}",
        "\u{10ffff}",
        "\"n\":2",
        "[[[[",
        "]]]]",
    ];

    fn mutate(rng: &mut Rng, body: &mut Vec<u8>) {
        let at = rng.below(body.len() + 1);
        match rng.below(6) {
            0 if !body.is_empty() => {
                let i = rng.below(body.len());
                body[i] ^= 1 << rng.below(8);
            }
            1 => body.insert(at, rng.next_u64() as u8),
            2 if at < body.len() => {
                let end = (at + 1 + rng.below(8)).min(body.len());
                body.drain(at..end);
            }
            3 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                body.splice(at..at, token.bytes());
            }
            4 if at < body.len() => {
                let end = (at + 1 + rng.below(16)).min(body.len());
                let piece = body[at..end].to_vec();
                body.splice(at..at, piece);
            }
            _ => {
                // Replace a value-looking run with another token.
                let token = TOKENS[rng.below(TOKENS.len())];
                let end = (at + rng.below(6)).min(body.len());
                body.splice(at..end, token.bytes());
            }
        }
    }

    #[test]
    fn mutated_bodies_parse_or_give_a_4xx_error() {
        let mut rng = Rng::new(0x00c0_ffee);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let (route, seed) = SEEDS[rng.below(SEEDS.len())];
            let mut body = seed.as_bytes().to_vec();
            for _ in 0..1 + rng.below(4) {
                mutate(&mut rng, &mut body);
            }
            match parse(route, &body, 1) {
                Ok(request) => {
                    accepted += 1;
                    assert!(request.max_tokens.is_none_or(|n| n >= 1 || request.echo));
                    assert!((0.0..=2.0).contains(&request.sampling.temperature));
                }
                Err(e) => {
                    refused += 1;
                    assert!(
                        (400..500).contains(&e.status),
                        "{e:?} for {:?}",
                        String::from_utf8_lossy(&body)
                    );
                    let v = e.to_json();
                    assert!(v["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()));
                    assert!(v["error"]["type"].is_string());
                }
            }
        }
        // Both sides of the parser were exercised.
        assert!(
            accepted > 1000 && refused > 1000,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn deep_nesting_and_huge_numbers_are_refused_cleanly() {
        let deep = format!(
            "{{\"messages\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(
            parse(Route::Chat, deep.as_bytes(), 1).unwrap_err().status,
            400
        );
        let big = r#"{"prompt":"x","max_tokens":1e400}"#;
        assert_eq!(
            parse(Route::Completion, big.as_bytes(), 1)
                .unwrap_err()
                .status,
            400
        );
        let nan = r#"{"prompt":"x","temperature":NaN}"#;
        assert_eq!(
            parse(Route::Completion, nan.as_bytes(), 1)
                .unwrap_err()
                .status,
            400
        );
    }
}
