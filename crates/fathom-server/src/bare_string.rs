//! A string argument written bare, unquoted and unescaped, in a call
//! syntax that is not JSON: Gemma 4's, between its quote markers
//! ([`crate::gemma4`]), and Qwen XML's, between a `<parameter=KEY>` line
//! and the `</parameter>` that starts a line ([`crate::tools`]).
//! llguidance's JSON compiler enforces a string's keywords on JSON strings
//! only, quotes and escapes included, so these formats lower them here,
//! one way for both: the text is one Lark token, the intersection (`&`)
//! of regexes, which llguidance's lexer matches as one. Each conjunct is
//! a keyword's regex: the syntax's own text (what a bare value may not
//! hold), the length bounds, the `pattern` with JSON Schema's search
//! semantics, the `format`'s regex ([`crate::string_format`]).

use llguidance::derivre::{RegexAst, RegexBuilder};
use llguidance::regex_to_lark;
use regex_syntax::hir::{Hir, HirKind, Look};
use serde_json::{Map, Value};

use crate::string_format;

/// A string's keywords the token enforces.
pub const KEYWORDS: &[&str] = &["minLength", "maxLength", "pattern", "format"];

/// How a call syntax writes a bare string.
pub struct Syntax<'a> {
    /// Its name in errors ("Gemma 4's call syntax").
    pub name: &'a str,
    /// The regex of any text a value may be in it.
    pub text: &'a str,
    /// What that text leaves out, in errors ("`<`").
    pub without: &'a str,
    /// The regex that ends every conjunct: the value's end, where the
    /// syntax's token holds it (so the lexeme's end is unambiguous).
    pub end: &'a str,
}

/// The body of the Lark token of a string with the keywords of `o` (the
/// string's schema, at `place`) in `syntax`; `None` when `o` has none of
/// them. An error names what cannot be enforced: a bound that is not a
/// count, a pattern or format that is not a string, an unknown format,
/// a pattern the regexes cannot read ([`search`]), keywords no string of
/// the syntax meets all of.
pub fn token(
    o: &Map<String, Value>,
    syntax: &Syntax,
    place: &str,
) -> Result<Option<String>, String> {
    let bound = |key: &str| -> Result<Option<u64>, String> {
        match o.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{place}: {key} {v} is not a count")),
        }
    };
    let text = |key: &str| -> Result<Option<&str>, String> {
        match o.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("{place}: {key} {v} is not a string")),
        }
    };
    let (min, max) = (bound("minLength")?, bound("maxLength")?);
    let (pattern, format) = (text("pattern")?, text("format")?);
    if min.is_none() && max.is_none() && pattern.is_none() && format.is_none() {
        return Ok(None);
    }
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return Err(format!(
                "{place}: minLength {lo} is greater than maxLength {hi}"
            ));
        }
    }
    let refused = |keyword: &str, value: &str, why: &str| {
        format!(
            "{place}: {keyword} {value:?} cannot be enforced in {}: {why}",
            syntax.name
        )
    };
    // Each conjunct: regexes, one after the other.
    let mut conjuncts = vec![vec![syntax.text.to_string()]];
    if min.is_some() || max.is_some() {
        conjuncts.push(vec![format!(
            "(?s:.{{{},{}}})",
            min.unwrap_or(0),
            max.map_or(String::new(), |m| m.to_string())
        )]);
    }
    if let Some(p) = pattern {
        conjuncts.push(search(p).map_err(|why| refused("pattern", p, &why))?);
    }
    if let Some(f) = format {
        let rx = string_format::regex(f).ok_or_else(|| {
            refused(
                "format",
                f,
                &format!("the formats it can: {}", string_format::NAMES.join(", ")),
            )
        })?;
        conjuncts.push(vec![regex_to_lark(rx, "")]);
    }
    // llguidance's own check of a JSON string's regexes: that some string
    // meets them all, else the model could write none.
    let ast = RegexAst::And(
        conjuncts
            .iter()
            .map(|c| RegexAst::Concat(c.iter().map(|r| RegexAst::Regex(r.clone())).collect()))
            .collect(),
    );
    let what = [
        pattern.map(|p| format!("pattern {p:?}")),
        format.map(|f| format!("format {f:?}")),
        min.map(|m| format!("minLength {m}")),
        max.map(|m| format!("maxLength {m}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" and ");
    let mut regexes = RegexBuilder::new();
    let expr = regexes
        .mk(&ast)
        .map_err(|e| format!("{place}: {what}: {e}"))?;
    if !regexes.exprset().is_positive(expr) {
        let mut regex = regexes.to_regex_limited(expr, 10_000).map_err(|_| {
            format!("{place}: {what} is too complex to tell whether a string meets it")
        })?;
        if regex.always_empty() {
            return Err(format!(
                "{place}: no string without {} meets {what}",
                syntax.without
            ));
        }
    }
    let end = (!syntax.end.is_empty()).then(|| format!(" /{}/", syntax.end));
    Ok(Some(
        conjuncts
            .iter()
            .map(|c| {
                let regexes: Vec<String> = c.iter().map(|r| format!("/{r}/")).collect();
                format!("{}{}", regexes.join(" "), end.as_deref().unwrap_or(""))
            })
            .collect::<Vec<_>>()
            .join(" & "),
    ))
}

/// JSON Schema's `pattern` (ECMA-262, matching anywhere in the string
/// unless `^`/`$` anchor it) as regexes the whole string matches one after
/// the other, in Lark's `/.../` syntax. Read as llguidance's JSON compiler
/// reads it ([`regex_to_lark`]: `\d` and `\w` ASCII, the rest Rust's
/// regex syntax, which ECMA's common subset is); a Lark regex matches
/// whole, so an end `^`/`$` leaves out does not anchor becomes `(?s:.*)`.
/// `^` and `$` may anchor every match, or each top-level alternative its
/// own (`^a|b`: starts with `a` or holds `b`), as llguidance's JSON
/// compiler reads them; anywhere else, and lookaround, backreferences and
/// `\b`, are refused, as llguidance refuses them.
fn search(pattern: &str) -> Result<Vec<String>, String> {
    let rx = regex_to_lark(pattern, "dw");
    let hir = regex_syntax::Parser::new()
        .parse(&rx)
        .map_err(|e| match e {
            regex_syntax::Error::Parse(e) => e.kind().to_string(),
            regex_syntax::Error::Translate(e) => e.kind().to_string(),
            e => e.to_string(),
        })?;
    let looks = hir.properties().look_set();
    if !looks.remove(Look::Start).remove(Look::End).is_empty() {
        return Err("no assertion but `^` and `$` is supported".into());
    }
    let anywhere = "(?s:.*)";
    let ends = |anchored: bool| if anchored { "" } else { anywhere };
    // Each part `^` and `$` anchor alike: its anchors, its text.
    let parts = if looks.is_empty() {
        vec![(false, rx, false)]
    } else {
        // The whole, else each top-level alternative.
        let parts = if anchors(&hir).is_some() {
            std::slice::from_ref(&hir)
        } else {
            let mut top = &hir;
            while let HirKind::Capture(c) = top.kind() {
                top = &c.sub;
            }
            match top.kind() {
                HirKind::Alternation(parts) => parts.as_slice(),
                _ => return Err(ANCHORS.into()),
            }
        };
        parts
            .iter()
            .map(|part| {
                let (start, end) = anchors(part).ok_or(ANCHORS)?;
                // Printed back without them: a Lark regex matches whole,
                // and llguidance refuses an anchor not at its ends.
                let text = unanchored(part, true, true).ok_or(ANCHORS)?.to_string();
                Ok((start, regex_to_lark(&text, ""), end))
            })
            .collect::<Result<Vec<_>, String>>()?
    };
    Ok(match &parts[..] {
        [(start, text, end)] => [ends(*start), text, ends(*end)]
            .into_iter()
            .filter(|r| !r.is_empty())
            .map(str::to_string)
            .collect(),
        _ => {
            let parts: Vec<String> = parts
                .iter()
                .map(|(start, text, end)| format!("{}(?:{text}){}", ends(*start), ends(*end)))
                .collect();
            vec![format!("(?:{})", parts.join("|"))]
        }
    })
}

/// Why [`search`] refuses an anchor.
const ANCHORS: &str = "`^` and `$` may only anchor every match or a top-level alternative";

/// Whether `^` and `$` anchor every match of `hir` at its start and its
/// end; `None` when one anchors only some.
fn anchors(hir: &Hir) -> Option<(bool, bool)> {
    let props = hir.properties();
    let start = props.look_set_prefix().contains(Look::Start);
    let end = props.look_set_suffix().contains(Look::End);
    let looks = props.look_set();
    ((start || !looks.contains(Look::Start)) && (end || !looks.contains(Look::End)))
        .then_some((start, end))
}

/// `hir` without its `^` and `$`, which may stand only where nothing but
/// other anchors precedes (`start`) or follows (`end`) them; `None` where
/// one stands elsewhere (`a^b`, `^a^b`, `(^a)*`).
fn unanchored(hir: &Hir, start: bool, end: bool) -> Option<Hir> {
    let is = |hir: &Hir, look: Look| matches!(hir.kind(), HirKind::Look(l) if *l == look);
    if hir.properties().look_set().is_empty() {
        return Some(hir.clone());
    }
    Some(match hir.kind() {
        HirKind::Look(Look::Start) if start => Hir::empty(),
        HirKind::Look(Look::End) if end => Hir::empty(),
        HirKind::Capture(c) => unanchored(&c.sub, start, end)?,
        HirKind::Alternation(subs) => Hir::alternation(
            subs.iter()
                .map(|sub| unanchored(sub, start, end))
                .collect::<Option<_>>()?,
        ),
        HirKind::Concat(subs) => Hir::concat(
            subs.iter()
                .enumerate()
                .map(|(i, sub)| {
                    unanchored(
                        sub,
                        start && subs[..i].iter().all(|s| is(s, Look::Start)),
                        end && subs[i + 1..].iter().all(|s| is(s, Look::End)),
                    )
                })
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matcher of the whole string by `regexes` one after the other.
    fn matcher(regexes: &[String]) -> llguidance::derivre::Regex {
        let mut b = RegexBuilder::new();
        let ast = RegexAst::Concat(regexes.iter().map(|r| RegexAst::Regex(r.clone())).collect());
        let e = b.mk(&ast).unwrap();
        b.to_regex_limited(e, 1_000_000).unwrap()
    }

    /// Each pattern's regexes hold no anchor and take what llguidance's
    /// JSON compiler's search of the pattern takes, on every text.
    #[test]
    fn search_takes_what_llguidances_search_takes() {
        let texts = [
            "", "a", "ab", "abX", "XcdY", "Xab", "cd", "b", "ba", "xa", "aXb", "\u{e9}a",
            "\u{e9}ab", "a\nb", "ccd", "abcd", "x\ny",
        ];
        for pattern in [
            "ab",
            "^ab$",
            "^ab|cd",
            "ab$|^cd",
            "^ab|cd$",
            "^ab$|cd",
            "^a|^b|c",
            "(^ab|cd)",
            "^.a|b",
            "^(a|b)c|d$",
            "",
            "^^a|b",
            "^|x",
            "^a|b|",
            "[^a]b|^\\u00e9",
        ] {
            let regexes = search(pattern).unwrap();
            assert!(
                regexes
                    .iter()
                    .all(|r| !r.contains("\\A") && !r.contains("\\z") && !r.contains('$')),
                "{pattern}: {regexes:?}"
            );
            let mut ours = matcher(&regexes);
            let mut b = RegexBuilder::new();
            let e = b
                .mk(&RegexAst::SearchRegex(regex_to_lark(pattern, "dw")))
                .unwrap();
            let mut theirs = b.to_regex_limited(e, 1_000_000).unwrap();
            for text in texts {
                assert_eq!(
                    ours.is_match(text),
                    theirs.is_match(text),
                    "{pattern} on {text:?}: {regexes:?}"
                );
            }
        }
    }

    /// An anchor that is not at a top-level alternative's start or end is
    /// refused, naming why.
    #[test]
    fn search_refuses_anchors_inside() {
        for pattern in [
            "a^b", "^a^b", "(^a|b)c", "^a^b|c", "a$b|^c", "(^a)*|b", "a(^b|c)",
        ] {
            assert_eq!(search(pattern), Err(ANCHORS.into()), "{pattern}");
        }
    }
}
