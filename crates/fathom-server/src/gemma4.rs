//! Gemma 4's function calls, as its chat template writes them:
//! `<|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>`, one block a call,
//! the blocks back to back; then the model writes `<|tool_response>`,
//! which ends generation. A value is written by the template's
//! `format_argument`: a string between `<|"|>` quotes, unescaped; a
//! number, `true` or `false` bare; an array `[V,V]`; an object `{KEY:V}`
//! with bare keys, sorted as Jinja's `dictsort` sorts them. The markers and
//! the quote are tokens of Gemma 4's vocabulary that decode as their text.
//!
//! This module reads that syntax back into JSON arguments and writes the
//! Lark grammar that constrains a call (a required one, or one the model
//! opens under `auto`, [`crate::tools::grammar`]): the arguments follow the
//! function's JSON schema, lowered to Gemma's value syntax (llguidance's
//! JSON compiler writes JSON, not this). Numbers, booleans and null are
//! spelled as in JSON, so their subschemas go to `%json` whole, bounds and
//! all; strings, arrays and objects are lowered here, and a keyword the
//! lowering cannot enforce is refused, named with its place in the schema,
//! under every `tool_choice` (as Qwen XML's strings are): an `auto` call
//! the model opens is constrained like a required one.

use serde_json::{Map, Value};

use crate::bare_string;
use crate::constraint::lark_literal;
use crate::reasoning::pieces_without;

/// A call's opening marker and the text before its function's name.
pub const OPEN: &str = "<|tool_call>call:";
/// The marker that opens a call.
pub const OPENER: &str = "<|tool_call>";
/// A call's end.
pub const CLOSE: &str = "<tool_call|>";
/// The quote around a string value.
pub const QUOTE: &str = "<|\"|>";

/// Keywords that only describe: no constraint to enforce.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
];
/// Keywords of numbers, enforced by `%json`.
const NUMERIC: &[&str] = &[
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];
/// Keywords the lowering enforces (or, `additionalProperties`, holds by
/// writing only the declared properties).
const LOWERED: &[&str] = &[
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "nullable",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
];

/// The Lark expression of one call to one of `functions` (name and
/// parameters' schema) after its opener [`OPENER`]
/// (`call:NAME{...}<tool_call|>`), and the rules it uses; or why a schema
/// cannot be enforced.
pub fn call_rest(functions: &[(&str, &Value)]) -> Result<(String, String), String> {
    let mut lowering = Lowering::default();
    let mut calls = Vec::with_capacity(functions.len());
    for (name, parameters) in functions {
        let place = format!("function {name}'s parameters");
        let arguments =
            object_schema(parameters, &place).and_then(|schema| lowering.value(&schema, &place))?;
        calls.push(format!(
            "{} {arguments} {}",
            lark_literal(&format!("{}{name}", &OPEN[OPENER.len()..])),
            lark_literal(CLOSE)
        ));
    }
    Ok((format!("({})", calls.join(" | ")), lowering.rules.join("")))
}

/// A function's parameters as an object schema (its `type` written
/// out): `{}` and `true` (no parameters declared) are the empty object.
fn object_schema(parameters: &Value, place: &str) -> Result<Value, String> {
    let mut o = match parameters {
        Value::Bool(true) => Map::new(),
        Value::Object(o) => o.clone(),
        other => return Err(format!("{place}: {other} is not an object schema")),
    };
    match o.get("type") {
        None => {
            o.insert("type".into(), Value::String("object".into()));
        }
        Some(t) if t == "object" => {}
        Some(t) => {
            return Err(format!(
                "{place}: Gemma 4 calls take an object of arguments, not type {t}"
            ))
        }
    }
    Ok(Value::Object(o))
}

/// The Lark rules written so far, named `gN`.
#[derive(Default)]
struct Lowering {
    rules: Vec<String>,
    /// The names of the shared rules, once written: any string, any value.
    string: Option<String>,
    any: Option<String>,
}

impl Lowering {
    /// Adds a rule; returns its name.
    fn rule(&mut self, body: &str) -> String {
        let name = format!("g{}", self.rules.len());
        self.rules.push(format!("{name}: {body}\n"));
        name
    }

    /// The Lark expression of a value valid against `schema`, at `place`.
    fn value(&mut self, schema: &Value, place: &str) -> Result<String, String> {
        let o = match schema {
            Value::Bool(true) => return Ok(self.any()),
            Value::Object(o) => o,
            Value::Bool(false) => return Err(format!("{place}: the schema false allows no value")),
            other => return Err(format!("{place}: {other} is not a schema")),
        };
        if let Some(key) = o.keys().find(|k| {
            let k = k.as_str();
            !(ANNOTATIONS.contains(&k)
                || NUMERIC.contains(&k)
                || LOWERED.contains(&k)
                || bare_string::KEYWORDS.contains(&k)
                || k.starts_with("x-"))
        }) {
            return Err(format!(
                "{place}: `{key}` cannot be enforced in Gemma 4's call syntax (the keywords it can: {}, {}, {})",
                LOWERED.join(", "),
                bare_string::KEYWORDS.join(", "),
                NUMERIC.join(", ")
            ));
        }
        if let Some(value) = o.get("const") {
            return Ok(lark_literal(&render(value)));
        }
        if let Some(values) = o.get("enum") {
            let Some(values) = values.as_array().filter(|v| !v.is_empty()) else {
                return Err(format!("{place}: enum is not a non-empty array"));
            };
            let choices: Vec<String> = values.iter().map(|v| lark_literal(&render(v))).collect();
            return Ok(format!("({})", choices.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(branches) = o.get(key) {
                let Some(branches) = branches.as_array().filter(|b| !b.is_empty()) else {
                    return Err(format!("{place}: {key} is not a non-empty array"));
                };
                // Each branch with the keywords beside it.
                let mut rest = o.clone();
                rest.remove(key);
                let choices = branches
                    .iter()
                    .enumerate()
                    .map(|(i, b)| self.value(&merged(&rest, b), &format!("{place}.{key}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(format!("({})", choices.join(" | ")));
            }
        }
        if let Some(all) = o.get("allOf") {
            let mut rest = o.clone();
            rest.remove("allOf");
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.value(&merged(&rest, one), &format!("{place}.allOf[0]")),
                _ => Err(format!(
                    "{place}: allOf of more than one schema cannot be enforced in Gemma 4's call syntax"
                )),
            };
        }
        let types: Vec<&str> = match o.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            Some(other) => return Err(format!("{place}: type {other} is not a type name")),
            None if o.contains_key("properties") => vec!["object"],
            None if o.contains_key("items") => vec!["array"],
            // A string's keywords hold strings only; written as a string,
            // the value keeps them (other types would pass unchecked).
            None if bare_string::KEYWORDS.iter().any(|k| o.contains_key(*k)) => vec!["string"],
            None => return Ok(self.any()),
        };
        let mut choices = Vec::with_capacity(types.len() + 1);
        for t in types {
            choices.push(match t {
                "string" => self.string_value(o, place)?,
                "number" | "integer" => {
                    let mut numeric: Map<String, Value> = o
                        .iter()
                        .filter(|(k, _)| NUMERIC.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    numeric.insert("type".into(), Value::String(t.into()));
                    crate::constraint::lark_json(&Value::Object(numeric))
                }
                "boolean" => "(\"true\" | \"false\")".into(),
                "null" => "\"null\"".into(),
                "object" => self.object(o, place)?,
                "array" => self.array(o, place)?,
                other => return Err(format!("{place}: type {other:?} is not a JSON type")),
            });
        }
        if o.get("nullable") == Some(&Value::Bool(true)) {
            choices.push("\"null\"".into());
        }
        Ok(format!("({})", choices.join(" | ")))
    }

    /// A string: any text without `<|` (Gemma's markers all start so);
    /// with a length bound, a `pattern` or a `format`, text without `<`
    /// that meets them all, one token ([`bare_string::token`]).
    fn string_value(&mut self, o: &Map<String, Value>, place: &str) -> Result<String, String> {
        let syntax = bare_string::Syntax {
            name: "Gemma 4's call syntax",
            text: "[^<]*",
            without: "`<`",
            end: "",
        };
        let Some(body) = bare_string::token(o, &syntax, place)? else {
            return Ok(self.any_string());
        };
        let name = format!("G{}", self.rules.len());
        self.rules.push(format!("{name}: {body}\n"));
        let quote = lark_literal(QUOTE);
        Ok(format!("{quote} {name} {quote}"))
    }

    /// The shared rule of any string.
    fn any_string(&mut self) -> String {
        if let Some(name) = &self.string {
            return name.clone();
        }
        let quote = lark_literal(QUOTE);
        let text = self.rule(&format!("/{}/", pieces_without("<|")));
        let name = self.rule(&format!("{quote} {text}* {quote}"));
        self.string = Some(name.clone());
        name
    }

    /// The shared rule of any value.
    fn any(&mut self) -> String {
        if let Some(name) = &self.any {
            return name.clone();
        }
        let string = self.any_string();
        // Named before it is written: it is recursive.
        let name = format!("g{}", self.rules.len());
        self.any = Some(name.clone());
        let body = format!(
            "{string} | /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/ | \"true\" | \"false\" | \"null\" \
             | \"[\" ({name} (\",\" {name})*)? \"]\" | {}",
            object_of(&name)
        );
        self.rule(&body);
        name
    }

    /// An array of `items`, `minItems` to `maxItems` of them.
    fn array(&mut self, o: &Map<String, Value>, place: &str) -> Result<String, String> {
        let item = match o.get("items") {
            None => self.any(),
            Some(Value::Array(_)) => {
                return Err(format!(
                "{place}: items as a list of schemas cannot be enforced in Gemma 4's call syntax"
            ))
            }
            Some(items) => {
                let value = self.value(items, &format!("{place}.items"))?;
                self.rule(&value)
            }
        };
        let count = |key: &str| o.get(key).and_then(Value::as_u64);
        let (min, max) = (count("minItems").unwrap_or(0), count("maxItems"));
        if max == Some(0) {
            return Ok("\"[\" \"]\"".into());
        }
        let more = match max {
            Some(max) => format!("(\",\" {item}){{{},{}}}", min.max(1) - 1, max - 1),
            None if min > 1 => format!("(\",\" {item}){{{},}}", min - 1),
            None => format!("(\",\" {item})*"),
        };
        let optional = if min == 0 { "?" } else { "" };
        Ok(format!("\"[\" ({item} {more}){optional} \"]\""))
    }

    /// An object: its declared properties in `dictsort`'s order, each
    /// `KEY:VALUE`, the required ones always, separated by commas.
    fn object(&mut self, o: &Map<String, Value>, place: &str) -> Result<String, String> {
        let empty = Map::new();
        let properties = match o.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(other) => return Err(format!("{place}: properties {other} is not an object")),
        };
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            Some(other) => return Err(format!("{place}: required {other} is not an array")),
        };
        if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
            return Err(format!(
                "{place}: required names {missing:?}, which properties does not define"
            ));
        }
        let mut keys: Vec<&String> = properties.keys().collect();
        keys.sort_by_key(|k| (k.to_lowercase(), k.as_str()));
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys {
            let value = self.value(&properties[key], &format!("{place}.properties.{key}"))?;
            let entry = self.rule(&format!("{} {value}", lark_literal(&format!("{key}:"))));
            entries.push((entry, required.contains(&key.as_str())));
        }
        // The first property written opens the list; each one after it is
        // preceded by a comma. The first may be any up to the first
        // required one.
        let tail = |from: usize| -> String {
            entries[from..]
                .iter()
                .map(|(e, req)| {
                    if *req {
                        format!("\",\" {e}")
                    } else {
                        format!("(\",\" {e})?")
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut firsts = Vec::new();
        for (i, (entry, req)) in entries.iter().enumerate() {
            firsts.push(format!("{entry} {}", tail(i + 1)));
            if *req {
                break;
            }
        }
        let all_optional = entries.iter().all(|(_, req)| !req);
        Ok(match (firsts.is_empty(), all_optional) {
            (true, _) => "\"{\" \"}\"".into(),
            (false, true) => format!("\"{{\" ({})? \"}}\"", firsts.join(" | ")),
            (false, false) => format!("\"{{\" ({}) \"}}\"", firsts.join(" | ")),
        })
    }
}

/// The Lark expression of an object with any bare keys, each value
/// `value` (a rule's name).
fn object_of(value: &str) -> String {
    let entry = format!("/[A-Za-z_][A-Za-z0-9_]*/ \":\" {value}");
    format!("\"{{\" ({entry} (\",\" {entry})*)? \"}}\"")
}

/// `branch` with the keywords of `rest` it does not set itself.
fn merged(rest: &Map<String, Value>, branch: &Value) -> Value {
    match branch {
        Value::Object(b) => {
            let mut out = rest.clone();
            for (k, v) in b {
                out.insert(k.clone(), v.clone());
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// `value` as the template's `format_argument` writes it (bare keys).
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(render).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort_by_key(|k| (k.to_lowercase(), k.as_str()));
            let entries: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{k}:{}", render(&o[k])))
                .collect();
            format!("{{{}}}", entries.join(","))
        }
        other => other.to_string(),
    }
}

/// The first call in `text`: its span (from its marker through its end),
/// the function's name and the arguments as JSON; `None` when there is no
/// marker. A call that does not parse is `Some((span, "", None))` with the
/// span of its marker alone, so the text stays content.
#[allow(clippy::type_complexity)]
pub fn next_call(text: &str) -> Option<(std::ops::Range<usize>, &str, Option<Value>)> {
    let start = text.find(OPEN)?;
    let after = &text[start + OPEN.len()..];
    let parsed = (|| {
        let brace = after.find('{')?;
        let name = after[..brace].trim();
        let (args, rest) = value(&after[brace..])?;
        let rest = rest.trim_start().strip_prefix(CLOSE)?;
        Some((name, args, after.len() - rest.len()))
    })();
    Some(match parsed {
        Some((name, args @ Value::Object(_), used)) => {
            (start..start + OPEN.len() + used, name, Some(args))
        }
        _ => (start..start + OPEN.len(), "", None),
    })
}

/// A value at the start of `s` (after blanks), in Gemma's syntax or
/// JSON's, and the text after it.
fn value(s: &str) -> Option<(Value, &str)> {
    let s = s.trim_start();
    if let Some(body) = s.strip_prefix(QUOTE) {
        let end = body.find(QUOTE)?;
        return Some((
            Value::String(body[..end].to_string()),
            &body[end + QUOTE.len()..],
        ));
    }
    if let Some(rest) = s.strip_prefix('{') {
        let (entries, after) = items(rest, '}', |rest| {
            // A key: bare, or quoted as a string value is.
            let (key, after) = match value(rest) {
                Some((Value::String(k), after))
                    if rest.starts_with(QUOTE) || rest.starts_with('"') =>
                {
                    (k, after)
                }
                _ => {
                    let colon = rest.find(':')?;
                    (rest[..colon].trim().to_string(), &rest[colon..])
                }
            };
            let (v, after) = value(after.trim_start().strip_prefix(':')?)?;
            Some(((key, v), after))
        })?;
        return Some((Value::Object(entries.into_iter().collect()), after));
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (values, after) = items(rest, ']', value)?;
        return Some((Value::Array(values), after));
    }
    for (word, v) in [
        ("true", Value::Bool(true)),
        ("false", Value::Bool(false)),
        ("null", Value::Null),
        ("None", Value::Null),
        ("none", Value::Null),
    ] {
        if let Some(rest) = s.strip_prefix(word) {
            return Some((v, rest));
        }
    }
    // A number, or a JSON string.
    let mut stream = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match stream.next()? {
        Ok(v @ (Value::Number(_) | Value::String(_))) => Some((v, &s[stream.byte_offset()..])),
        _ => None,
    }
}

/// Items separated by commas up to `close`, each read by `item`, and the
/// text after `close`.
fn items<'s, T>(
    mut rest: &'s str,
    close: char,
    item: impl Fn(&'s str) -> Option<(T, &'s str)>,
) -> Option<(Vec<T>, &'s str)> {
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(close) {
            return Some((out, after));
        }
        let (v, after) = item(rest)?;
        out.push(v);
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(next) => next,
            None if after.starts_with(close) => after,
            None => return None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_are_read_with_gemmas_values() {
        let text = "<|tool_call>call:plan{days:3,note:<|\"|>a, b: {c}<|\"|>,ok:true,tags:[<|\"|>x<|\"|>,2.5],where:{city:<|\"|>Oslo<|\"|>,zip:null}}<tool_call|>rest";
        let (span, name, args) = next_call(text).unwrap();
        assert_eq!(name, "plan");
        assert_eq!(
            args.unwrap(),
            json!({"days": 3, "note": "a, b: {c}", "ok": true, "tags": ["x", 2.5], "where": {"city": "Oslo", "zip": null}})
        );
        assert_eq!(&text[span.end..], "rest");
        // JSON strings and quoted keys read too; no arguments is {}.
        let (_, _, args) =
            next_call("<|tool_call>call:f{<|\"|>a<|\"|>:\"b\\n\"}<tool_call|>").unwrap();
        assert_eq!(args.unwrap(), json!({"a": "b\n"}));
        let (_, name, args) = next_call("x<|tool_call>call:now{}<tool_call|>").unwrap();
        assert_eq!((name, args.unwrap()), ("now", json!({})));
        // Broken calls: the marker's span only, no arguments.
        for broken in [
            "<|tool_call>call:f{a:<|\"|>x}<tool_call|>",
            "<|tool_call>call:f{a:1",
            "<|tool_call>call:f{a:1 b:2}<tool_call|>",
            "<|tool_call>call:f[1]<tool_call|>",
        ] {
            let (span, _, args) = next_call(broken).unwrap();
            assert_eq!((span, args), (0..OPEN.len(), None), "{broken}");
        }
        assert!(next_call("no call").is_none());
    }

    #[test]
    fn values_render_as_the_template_writes_them() {
        assert_eq!(
            render(&json!({"b": [1, "x"], "A": true, "c": {"z": null}})),
            "{A:true,b:[1,<|\"|>x<|\"|>],c:{z:null}}"
        );
    }

    #[test]
    fn keywords_the_lowering_cannot_enforce_are_named_with_their_place() {
        let schema =
            json!({"type": "object", "properties": {"when": {"type": "string", "format": "iri"}}});
        let e = call_rest(&[("f", &schema)]).unwrap_err();
        assert!(
            e.contains("function f's parameters.properties.when: format \"iri\""),
            "{e}"
        );
        let e = call_rest(&[("f", &json!({"properties": {"a": {"not": {}}}}))]).unwrap_err();
        assert!(
            e.contains("function f's parameters.properties.a: `not`"),
            "{e}"
        );
        let e = call_rest(&[("f", &json!({"type": "array"}))]).unwrap_err();
        assert!(e.contains("object of arguments"), "{e}");
        let refs =
            json!({"$defs": {"d": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/d"}}});
        let e = call_rest(&[("f", &refs)]).unwrap_err();
        assert!(e.contains("function f's parameters: `$defs`"), "{e}");
        let e = call_rest(&[("f", &json!({"properties": {}, "required": ["a"]}))]).unwrap_err();
        assert!(e.contains("\"a\""), "{e}");
        // One function the lowering cannot enforce refuses the request,
        // whatever the others' schemas.
        let city = json!({"properties": {"city": {"enum": ["Oslo"]}}, "required": ["city"]});
        assert!(call_rest(&[("g", &city)]).is_ok());
        let e = call_rest(&[("g", &city), ("f", &schema)]).unwrap_err();
        assert!(e.contains("function f's parameters"), "{e}");
    }
}
