//! GBNF (llama.cpp's grammar format, which llama-server's `grammar` field
//! takes) converted to the Lark syntax llguidance compiles.
//!
//! GBNF: `name ::= alternatives`, one rule per line (newlines only inside
//! parentheses), `"literals"`, `[character classes]` and `[^negated]`,
//! `.` (any character), rule names, `( groups )`, and `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`, `{,n}` after an element; `#` comments; escapes
//! `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`. The start is `root`.
//! Token references (`<[id]>`, `<token>`) are refused.
//!
//! Each literal and character class is a lexeme, and GBNF's repetition a
//! grammar rule over them, so `[a-z]{1,30}` is thirty one-character
//! lexemes and costs the Earley parser a step per byte of every token it
//! checks. Where it cannot change the language, a repeated class becomes
//! one regex lexeme (`/[a-z]{1,30}/`, one step): when it repeats at least
//! once and the next element of its sequence is a literal whose first
//! character the class does not hold. llguidance's lexemes are greedy,
//! and then the class's run ends exactly where that literal begins, as the
//! grammar-level repetition does; a class followed by anything else stays
//! per character.

use std::collections::HashMap;

/// Most rules and nesting depth a grammar may have.
const MAX_RULES: usize = 4096;
const MAX_DEPTH: usize = 64;
/// Largest repetition count.
const MAX_REPEAT: u64 = 10_000;

/// The Lark text of GBNF `src`, or what is wrong with it (with its line).
pub fn to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser {
        s: src.chars().collect(),
        i: 0,
        names: HashMap::new(),
        used: Vec::new(),
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    loop {
        p.skip(true);
        if p.i >= p.s.len() {
            break;
        }
        let name = p.name().ok_or_else(|| p.error("a rule name"))?;
        p.skip(false);
        if !p.eat_str("::=") {
            return Err(p.error("::= after the rule name"));
        }
        let body = p.alternatives(0)?;
        p.skip(false);
        if p.i < p.s.len() && p.s[p.i] != '\n' && p.s[p.i] != '\r' {
            return Err(p.error("the end of the line"));
        }
        let lname = p.lark_name(&name);
        if rules.iter().any(|(n, _)| *n == lname) {
            return Err(format!("the rule {name:?} is defined twice"));
        }
        if rules.len() >= MAX_RULES {
            return Err(format!("more than {MAX_RULES} rules"));
        }
        rules.push((lname, body));
    }
    let root = p.lark_name("root");
    if !rules.iter().any(|(n, _)| *n == root) {
        return Err("the grammar has no root rule (root ::= ...)".into());
    }
    for (name, lname) in &p.used {
        if !rules.iter().any(|(n, _)| n == lname) {
            return Err(format!("the rule {name:?} is used but not defined"));
        }
    }
    let mut out = format!("start: {root}\n");
    for (name, body) in rules {
        out.push_str(&name);
        out.push_str(": ");
        out.push_str(&body);
        out.push('\n');
    }
    Ok(out)
}

/// A character class as written: its Lark regex and its ranges.
struct Class {
    regex: String,
    ranges: Vec<(char, char)>,
    negated: bool,
}

impl Class {
    fn holds(&self, c: char) -> bool {
        self.ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c)) != self.negated
    }
}

/// One element of a sequence, with what folding needs to know of it.
struct Element {
    lark: String,
    /// A class repeated at least once, and its repetition (`+`, `{m,n}`):
    /// one regex lexeme when the next element allows it.
    run: Option<(Class, String)>,
    /// The first character of a literal that is always there (no
    /// repetition after it).
    first: Option<char>,
}

struct Parser {
    s: Vec<char>,
    i: usize,
    /// GBNF name to Lark name.
    names: HashMap<String, String>,
    /// Names referenced, to check they are defined.
    used: Vec<(String, String)>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser {
    fn error(&self, expected: &str) -> String {
        let line = self.s[..self.i.min(self.s.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count()
            + 1;
        let found = match self.s.get(self.i) {
            None => "the end".to_string(),
            Some(c) => format!("{c:?}"),
        };
        format!("line {line}: expected {expected}, found {found}")
    }

    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn eat_str(&mut self, t: &str) -> bool {
        let n = t.chars().count();
        if self.s.len() >= self.i + n && self.s[self.i..self.i + n].iter().copied().eq(t.chars()) {
            self.i += n;
            true
        } else {
            false
        }
    }

    /// Skips spaces and comments; newlines too when `newlines`.
    fn skip(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.i += 1,
                '\r' | '\n' if newlines => self.i += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.i;
        while self.peek().is_some_and(is_name_char) {
            self.i += 1;
        }
        (self.i > start).then(|| self.s[start..self.i].iter().collect())
    }

    /// A Lark rule name for GBNF `name`: lower case, distinct per name.
    fn lark_name(&mut self, name: &str) -> String {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let base: String = name
            .chars()
            .map(|c| match c {
                'A'..='Z' => c.to_ascii_lowercase(),
                'a'..='z' | '0'..='9' => c,
                _ => '_',
            })
            .collect();
        let mut lname = format!("g_{base}");
        let mut k = 1;
        while self.names.values().any(|v| *v == lname) {
            k += 1;
            lname = format!("g_{base}_{k}");
        }
        self.names.insert(name.to_string(), lname.clone());
        lname
    }

    /// `seq | seq | ...` up to a `)` (nested) or the end of the line.
    fn alternatives(&mut self, depth: usize) -> Result<String, String> {
        if depth > MAX_DEPTH {
            return Err(format!("groups nested more than {MAX_DEPTH} deep"));
        }
        let mut alts = vec![self.sequence(depth)?];
        loop {
            self.skip(depth > 0);
            if self.eat('|') {
                alts.push(self.sequence(depth)?);
            } else {
                break;
            }
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, depth: usize) -> Result<String, String> {
        let mut items: Vec<Element> = Vec::new();
        loop {
            self.skip(depth > 0);
            let Some(c) = self.peek() else { break };
            let mut class = None;
            let mut first = None;
            let item = match c {
                '"' => {
                    self.i += 1;
                    let mut text = String::new();
                    loop {
                        match self.peek() {
                            None | Some('\n') => return Err(self.error("a closing \"")),
                            Some('"') => {
                                self.i += 1;
                                break;
                            }
                            Some('\\') => text.push(self.escape()?),
                            Some(c) => {
                                self.i += 1;
                                text.push(c);
                            }
                        }
                    }
                    first = text.chars().next();
                    lark_string(&text)
                }
                '[' => {
                    self.i += 1;
                    let negated = self.eat('^');
                    let mut regex = String::from("[");
                    if negated {
                        regex.push('^');
                    }
                    let mut ranges = Vec::new();
                    let mut any = false;
                    loop {
                        let lo = match self.peek() {
                            None | Some('\n') => return Err(self.error("a closing ]")),
                            Some(']') if any => {
                                self.i += 1;
                                break;
                            }
                            Some('\\') => self.escape()?,
                            Some(c) => {
                                self.i += 1;
                                c
                            }
                        };
                        any = true;
                        regex.push_str(&regex_char(lo));
                        let mut range = (lo, lo);
                        if self.peek() == Some('-')
                            && self.s.get(self.i + 1).is_some_and(|&c| c != ']')
                        {
                            self.i += 1;
                            let hi = match self.peek() {
                                Some('\\') => self.escape()?,
                                Some(c) => {
                                    self.i += 1;
                                    c
                                }
                                None => return Err(self.error("the end of a range")),
                            };
                            if hi < lo {
                                return Err(format!("the range {lo:?}-{hi:?} is empty"));
                            }
                            regex.push('-');
                            regex.push_str(&regex_char(hi));
                            range.1 = hi;
                        }
                        ranges.push(range);
                    }
                    regex.push(']');
                    let lark = format!("/{regex}/");
                    class = Some(Class {
                        regex,
                        ranges,
                        negated,
                    });
                    lark
                }
                '.' => {
                    self.i += 1;
                    "/(?s:.)/".to_string()
                }
                '(' => {
                    self.i += 1;
                    let inner = self.alternatives(depth + 1)?;
                    self.skip(true);
                    if !self.eat(')') {
                        return Err(self.error(")"));
                    }
                    format!("({inner})")
                }
                '<' => return Err("token references (<...>) are not supported in grammar".into()),
                c if is_name_char(c) => {
                    // A name followed by ::= starts the next rule.
                    let save = self.i;
                    let name = self.name().unwrap_or_default();
                    let after = self.i;
                    self.skip(true);
                    if self.eat_str("::=") {
                        self.i = save;
                        break;
                    }
                    self.i = after;
                    let lname = self.lark_name(&name);
                    self.used.push((name, lname.clone()));
                    lname
                }
                _ => break,
            };
            let (lark, repeat) = self.postfix(item)?;
            let first = first.filter(|_| repeat.is_none());
            let run = match (class, repeat) {
                (Some(class), Some((lo, rep))) if lo >= 1 => Some((class, rep)),
                _ => None,
            };
            items.push(Element { lark, run, first });
        }
        if items.is_empty() {
            return Ok("\"\"".to_string());
        }
        let lexemes: Vec<String> = items
            .iter()
            .enumerate()
            .map(
                |(k, e)| match (&e.run, items.get(k + 1).and_then(|n| n.first)) {
                    (Some((class, rep)), Some(next)) if !class.holds(next) => {
                        format!("/{}{rep}/", class.regex)
                    }
                    _ => e.lark.clone(),
                },
            )
            .collect();
        Ok(lexemes.join(" "))
    }

    /// The postfix operators after an element, applied to its Lark text;
    /// with the last one's minimum and regex text (`+`, `{m,n}`) when
    /// there was exactly one repetition and it may repeat.
    fn postfix(&mut self, mut item: String) -> Result<(String, Option<(u64, String)>), String> {
        let mut ops = 0;
        let mut repeat = None;
        loop {
            match self.peek() {
                Some(op @ ('*' | '+' | '?')) => {
                    self.i += 1;
                    item = format!("({item}){op}");
                    ops += 1;
                    repeat = (op == '+').then(|| (1, "+".to_string()));
                }
                Some('{') => {
                    self.i += 1;
                    let number = |p: &mut Parser| -> Result<Option<u64>, String> {
                        p.skip(false);
                        let start = p.i;
                        while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                            p.i += 1;
                        }
                        if p.i == start {
                            return Ok(None);
                        }
                        let text: String = p.s[start..p.i].iter().collect();
                        let n = text.parse::<u64>().unwrap_or(u64::MAX);
                        if n > MAX_REPEAT {
                            return Err(format!("a repetition count of {n}; at most {MAX_REPEAT}"));
                        }
                        Ok(Some(n))
                    };
                    let lo = number(self)?;
                    self.skip(false);
                    let (lo, hi) = if self.eat(',') {
                        let hi = number(self)?;
                        (lo.unwrap_or(0), hi)
                    } else {
                        let n = lo.ok_or_else(|| self.error("a repetition count"))?;
                        (n, Some(n))
                    };
                    self.skip(false);
                    if !self.eat('}') {
                        return Err(self.error("}"));
                    }
                    if hi.is_some_and(|h| h < lo) {
                        return Err(format!(
                            "the repetition {{{lo},{}}} is empty",
                            hi.unwrap_or(0)
                        ));
                    }
                    let rep = match hi {
                        Some(h) => format!("{{{lo},{h}}}"),
                        None => format!("{{{lo},}}"),
                    };
                    item = format!("({item}){rep}");
                    ops += 1;
                    repeat = Some((lo, rep));
                }
                _ => return Ok((item, repeat.filter(|_| ops == 1))),
            }
        }
    }

    /// An escape at a backslash: the character it stands for.
    fn escape(&mut self) -> Result<char, String> {
        self.i += 1; // the backslash
        let Some(c) = self.peek() else {
            return Err(self.error("an escaped character"));
        };
        self.i += 1;
        let hex = |p: &mut Parser, n: usize| -> Result<char, String> {
            let digits: String = p.s.get(p.i..p.i + n).unwrap_or(&[]).iter().collect();
            if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(p.error(&format!("{n} hex digits")));
            }
            p.i += n;
            u32::from_str_radix(&digits, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| format!("\\{c}{digits} is not a character"))
        };
        Ok(match c {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            other => other,
        })
    }
}

/// `text` as a Lark (JSON-syntax) string literal.
fn lark_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `c` inside a regex character class, escaped whatever it is.
fn regex_char(c: char) -> String {
    format!("\\x{{{:X}}}", c as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_rules_become_lark_rules() {
        let lark = to_lark(
            "root ::= answer # a comment\nanswer ::= (\"yes\" | \"no\") [.!]? ws\nws ::= [ \\t\\n]*\n",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: g_root\ng_root: g_answer\ng_answer: (\"yes\" | \"no\") (/[\\x{2E}\\x{21}]/)? g_ws\ng_ws: (/[\\x{20}\\x{9}\\x{A}]/)*\n"
        );
    }

    #[test]
    fn multi_line_groups_repetitions_and_escapes() {
        let lark = to_lark(
            "root ::= (\n  item\n  | \"\\x41\\u00e9\\\"\"\n){2,5} [^\"\\\\] .\nitem ::= [a-z0-9]{3} x{,2}\nx ::= \"x\"\n",
        )
        .unwrap();
        assert!(lark.contains("((g_item | \"Aé\\\"\")){2,5}"), "{lark}");
        assert!(lark.contains("/[^\\x{22}\\x{5C}]/ /(?s:.)/"), "{lark}");
        assert!(
            lark.contains("(/[\\x{61}-\\x{7A}\\x{30}-\\x{39}]/){3,3} (g_x){0,2}"),
            "{lark}"
        );
    }

    /// A repeated class becomes one lexeme only where the literal after it
    /// starts with a character it does not hold.
    #[test]
    fn repeated_classes_before_a_distinct_literal_become_one_lexeme() {
        let lark = to_lark(
            "root ::= \"\\\"\" [a-zA-Z ]{1,30} \"\\\"\" [0-9]+ \"9\" [^x]* \"x\" [a-c]? \"d\" [a-c]+ [d]",
        )
        .unwrap();
        let a = "\\x{61}-\\x{7A}\\x{41}-\\x{5A}\\x{20}";
        // Folded: the class does not hold `"`.
        assert!(
            lark.contains(&format!("\"\\\"\" /[{a}]{{1,30}}/ \"\\\"\"")),
            "{lark}"
        );
        // Kept: [0-9] holds 9, [^x]* may be empty, [a-c]? too, and [a-c]+
        // is followed by a class.
        assert!(lark.contains("(/[\\x{30}-\\x{39}]/)+ \"9\""), "{lark}");
        assert!(lark.contains("(/[^\\x{78}]/)* \"x\""), "{lark}");
        assert!(lark.contains("(/[\\x{61}-\\x{63}]/)? \"d\""), "{lark}");
        assert!(
            lark.contains("(/[\\x{61}-\\x{63}]/)+ /[\\x{64}]/"),
            "{lark}"
        );
    }

    #[test]
    fn bad_grammars_say_where() {
        for (bad, says) in [
            ("root ::= \"a", "closing"),
            ("root ::= [a", "closing ]"),
            ("root ::= other", "not defined"),
            ("item ::= \"a\"", "no root"),
            ("root ::= (\"a\"", "expected )"),
            ("root ::= \"a\"{3,1}", "empty"),
            ("root ::= \"a\"{99999}", "at most"),
            ("root ::= <[12]>", "token references"),
            ("root = \"a\"", "::="),
            ("root ::= \"a\"\nroot ::= \"b\"", "twice"),
        ] {
            let e = to_lark(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(100), ")".repeat(100));
        assert!(to_lark(&deep).unwrap_err().contains("nested"));
    }

    /// Mutated grammars convert or give an error, never a panic.
    #[test]
    fn mutated_grammars_convert_or_fail_cleanly() {
        let seed =
            "root ::= (\"a\" | [^x-z\\n] | .)* item{2,3}\nitem ::= \"\\x41\\u00e9\" [0-9]+ # c\n";
        let pieces = [
            "(", ")", "[", "]", "\"", "\\", "{", "}", ",", "::=", "|", "*", "\n", "\\u", "\\x4",
            "-", "^", "é",
        ];
        let mut rng = fathom_fixtures::Rng::new(7);
        let (mut ok, mut bad) = (0, 0);
        for _ in 0..5000 {
            let mut g: Vec<char> = seed.chars().collect();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(g.len() + 1);
                match rng.below(3) {
                    0 if at < g.len() => {
                        g.remove(at);
                    }
                    _ => {
                        let p = pieces[rng.below(pieces.len())];
                        for (k, c) in p.chars().enumerate() {
                            g.insert(at + k, c);
                        }
                    }
                }
            }
            let text: String = g.into_iter().collect();
            match to_lark(&text) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(!e.is_empty());
                    bad += 1;
                }
            }
        }
        assert!(ok > 100 && bad > 100, "{ok} converted, {bad} refused");
    }
}
