//! Pre-tokenizers: the regex splits that cut text into words before BPE.
//!
//! A pre-tokenizer is a list of rules applied in turn; each rule cuts every
//! fragment the previous rules left into its matches and the gaps between
//! them (both kept), exactly as llama.cpp's `unicode_regex_split` does. The
//! GPT-2 and Llama-3 expressions run as hand-written splitters that mirror
//! llama.cpp's own, because those are what the token ids are checked against;
//! every other expression runs through fancy-regex.

use std::ops::Range;

use fancy_regex::Regex;

use crate::unicode::{class, LETTER, NUMBER, PRESENT, WHITESPACE};

/// GPT-2's expression, as llama.cpp spells it (without the final `|\s+`,
/// which can never change a split since unmatched text is kept anyway).
pub(crate) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// GPT-2's expression as `tokenizer.json` byte-level pre-tokenizers hold it.
pub(crate) const GPT2_HF: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama-3's expression as its `tokenizer.json` holds it.
const LLAMA3_HF: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama-3's expression with the case-insensitive group spelled out, as
/// llama.cpp holds it.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: Qwen2's, with combining marks kept in a word's letters.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
// Written with escapes where a character is not in NFC (U+1F7D, U+1FBE,
// U+1FD3, U+1FDB, U+2126, U+212A): editors normalize those to other code
// points and the ranges would turn around.
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const CJK_HANGUL: &str = r"[一-龥ࠀ-一가-퟿]+";
/// Gemma 4's only split: runs of newlines apart from the text between them
/// (its BPE merges the rest whole, spaces included as `▁`).
pub(crate) const NEWLINE_RUNS: &str = r"[^\n]+|[\n]+";

/// What a `tokenizer.ggml.pre` name asks of the BPE tokenizer, as llama.cpp
/// maps it.
pub(crate) struct Named {
    pub patterns: &'static [&'static str],
    /// Look the whole word up in the vocabulary before merging (Llama 3).
    pub ignore_merges: bool,
    /// The model's own default for adding BOS, before `add_bos_token`.
    pub add_bos: bool,
}

/// The pre-tokenizer named by `tokenizer.ggml.pre`; `None` is llama.cpp's
/// "default" (also used when the key is absent).
pub(crate) fn named(pre: Option<&str>) -> Option<Named> {
    let plain = |patterns| {
        Some(Named {
            patterns,
            ignore_merges: false,
            add_bos: false,
        })
    };
    let Some(pre) = pre else {
        return named(Some("default"));
    };
    match pre {
        "default" => plain(&[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => Some(Named {
            patterns: &[LLAMA3],
            ignore_merges: true,
            add_bos: true,
        }),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => plain(&[LLAMA3]),
        "deepseek-llm" => plain(&[
            r"[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            CJK_HANGUL,
            r"\p{N}+",
        ]),
        "deepseek-v3" => plain(&[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
        ]),
        "deepseek-coder" => plain(&[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"]),
        "falcon" => plain(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            plain(&[r"\p{N}", GPT2])
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "trillion" => {
            plain(&[GPT2])
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => plain(&[QWEN2]),
        "qwen35" => plain(&[QWEN35]),
        "poro-chat" | "bloom" | "gpt3-finnish" => plain(&[BLOOM]),
        "viking" => plain(&[BLOOM, r"\p{N}"]),
        "tekken" => Some(Named {
            patterns: &[TEKKEN],
            ignore_merges: true,
            add_bos: true,
        }),
        "chameleon" => Some(Named {
            patterns: &[
                "<sentinel:[0-9]+>",
                "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                "([\\t\\n]|    |  )",
                r"\p{N}",
                r"[\p{P}!-/:-@\[-`{-~]",
                GPT2,
            ],
            ignore_merges: false,
            add_bos: true,
        }),
        "gpt-4o" | "llama4" => plain(&[GPT4O]),
        // llama.cpp's std::regex reads `\d` as ASCII digits; fancy-regex
        // would take any Unicode digit.
        "superbpe" => plain(&[r"\p{N}+", "(?=([0-9]{3})+(?![0-9]))"]),
        "bailingmoe" => plain(&[
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        ]),
        "seed-coder" => plain(&[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ]),
        _ => None,
    }
}

/// Every name [`named`] accepts, for error messages.
pub(crate) const NAMES: &str = "default, llama3, llama-v3, llama-bpe, falcon3, pixtral, dbrx, \
    smaug-bpe, deepseek-llm, deepseek-v3, deepseek-coder, falcon, starcoder, refact, command-r, \
    smollm, codeshell, exaone, minerva-7b, gpt-2, phi-2, jina-es, jina-de, gigachat, jina-v2-es, \
    jina-v2-de, jina-v1-en, jina-v2-code, roberta-bpe, mpt, olmo, jais, trillion, qwen2, \
    deepseek-r1-qwen, qwen35, megrez, stablelm2, poro-chat, bloom, gpt3-finnish, chatglm-bpe, glm4, \
    viking, tekken, chameleon, gpt-4o, llama4, superbpe, bailingmoe, seed-coder";

enum Rule {
    Gpt2,
    Llama3,
    Regex(Box<Regex>),
}

/// An ordered list of split rules.
pub(crate) struct PreTokenizer {
    rules: Vec<Rule>,
}

impl PreTokenizer {
    /// Compiles `patterns`; the error is the offending pattern and why.
    pub(crate) fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, String> {
        let mut rules = Vec::with_capacity(patterns.len());
        for pattern in patterns {
            let pattern = pattern.as_ref();
            rules.push(match pattern {
                GPT2 | GPT2_HF => Rule::Gpt2,
                LLAMA3 | LLAMA3_HF => Rule::Llama3,
                _ => Rule::Regex(Box::new(
                    Regex::new(pattern).map_err(|e| format!("regex {pattern:?}: {e}"))?,
                )),
            });
        }
        Ok(PreTokenizer { rules })
    }

    /// Byte ranges of the words of `text`, in order, covering it.
    pub(crate) fn split(&self, text: &str) -> Vec<Range<usize>> {
        let mut fragments = Vec::with_capacity(text.len() / 4 + 1);
        fragments.push(0..text.len());
        let mut next = Vec::new();
        for rule in &self.rules {
            next.clear();
            for fragment in &fragments {
                let piece = &text[fragment.clone()];
                match rule {
                    Rule::Gpt2 => split_gpt2(&Chars::new(piece, fragment.start), &mut next),
                    Rule::Llama3 => split_llama3(&Chars::new(piece, fragment.start), &mut next),
                    Rule::Regex(re) => split_regex(re, piece, fragment.start, &mut next),
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments.retain(|r| !r.is_empty());
        fragments
    }
}

/// Matches and the gaps between them, each its own fragment. A regex that
/// gives up (fancy-regex's backtracking limit) leaves the rest unsplit.
fn split_regex(re: &Regex, piece: &str, base: usize, out: &mut Vec<Range<usize>>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        let Ok(m) = m else { break };
        if m.start() > last {
            out.push(base + last..base + m.start());
        }
        if m.end() > m.start() {
            out.push(base + m.start()..base + m.end());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(base + last..base + piece.len());
    }
}

/// A fragment as code points, addressed by index as llama.cpp's splitters
/// do; positions past the end read as "no character".
struct Chars {
    chars: Vec<(usize, char)>,
    len: usize,
    base: usize,
}

impl Chars {
    fn new(piece: &str, base: usize) -> Self {
        Chars {
            chars: piece.char_indices().collect(),
            len: piece.len(),
            base,
        }
    }
    fn n(&self) -> usize {
        self.chars.len()
    }
    fn cpt(&self, pos: usize) -> Option<char> {
        self.chars.get(pos).map(|&(_, c)| c)
    }
    fn flags(&self, pos: usize) -> u8 {
        self.cpt(pos).map_or(0, |c| class(c) | PRESENT)
    }
    fn byte(&self, pos: usize) -> usize {
        self.chars.get(pos).map_or(self.len, |&(b, _)| b)
    }
}

/// Emits words ending at char positions; empty words are dropped.
struct Emitter<'a> {
    chars: &'a Chars,
    prev: usize,
}

impl Emitter<'_> {
    fn add(&mut self, end: usize, out: &mut Vec<Range<usize>>) {
        if end > self.prev {
            let base = self.chars.base;
            out.push(base + self.chars.byte(self.prev)..base + self.chars.byte(end));
        }
        self.prev = end;
    }
}

const NOT_WORDLIKE: u8 = WHITESPACE | LETTER | NUMBER;

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(c: &Chars, out: &mut Vec<Range<usize>>) {
    let n = c.n();
    let mut e = Emitter { chars: c, prev: 0 };
    let mut pos = 0;
    while pos < n {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        if cpt == Some('\'') && pos + 1 < n {
            if let Some('s' | 't' | 'm' | 'd') = c.cpt(pos + 1) {
                pos += 2;
                e.add(pos, out);
                continue;
            }
            if pos + 2 < n {
                if let (Some(a), Some(b)) = (c.cpt(pos + 1), c.cpt(pos + 2)) {
                    if matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                        pos += 3;
                        e.add(pos, out);
                        continue;
                    }
                }
            }
        }
        let space = usize::from(cpt == Some(' '));
        let mut flags2 = if space == 1 { c.flags(pos + 1) } else { flags };
        for class in [LETTER, NUMBER] {
            if flags2 & class != 0 {
                pos += space;
                while flags2 & class != 0 {
                    pos += 1;
                    flags2 = c.flags(pos);
                }
                break;
            }
        }
        if pos != e.prev {
            e.add(pos, out);
            continue;
        }
        if flags2 & NOT_WORDLIKE == 0 && flags2 != 0 {
            pos += space;
            while flags2 & NOT_WORDLIKE == 0 && flags2 != 0 {
                pos += 1;
                flags2 = c.flags(pos);
            }
            e.add(pos, out);
            continue;
        }
        let mut spaces = 0;
        while c.flags(pos + spaces) & WHITESPACE != 0 {
            spaces += 1;
        }
        if spaces > 1 && pos + spaces < n {
            // `\s+(?!\S)`: leave the last space to the word after it.
            pos += spaces - 1;
        } else if spaces > 0 {
            pos += spaces;
        } else {
            pos += 1;
        }
        e.add(pos, out);
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(c: &Chars, out: &mut Vec<Range<usize>>) {
    let n = c.n();
    let is_newline = |ch: Option<char>| matches!(ch, Some('\r' | '\n'));
    let mut e = Emitter { chars: c, prev: 0 };
    let mut pos = 0;
    while pos < n {
        let cpt = c.cpt(pos);
        let flags = c.flags(pos);
        if cpt == Some('\'') && pos + 1 < n {
            // Only ASCII letters lower-case to the letters tested here.
            let lower = |p| c.cpt(p).map(|ch: char| ch.to_ascii_lowercase());
            if let Some('s' | 't' | 'm' | 'd') = lower(pos + 1) {
                pos += 2;
                e.add(pos, out);
                continue;
            }
            if pos + 2 < n {
                if let (Some(a), Some(b)) = (lower(pos + 1), lower(pos + 2)) {
                    if matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                        pos += 3;
                        e.add(pos, out);
                        continue;
                    }
                }
            }
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !is_newline(cpt)
            && flags & NUMBER == 0
            && (flags & LETTER != 0 || c.flags(pos + 1) & LETTER != 0)
        {
            pos += 1;
            while c.flags(pos) & LETTER != 0 {
                pos += 1;
            }
            e.add(pos, out);
            continue;
        }
        // `\p{N}{1,3}`
        if flags & NUMBER != 0 {
            let mut start = pos;
            while c.flags(pos) & NUMBER != 0 {
                pos += 1;
                if pos - start >= 3 {
                    e.add(pos, out);
                    start = pos;
                }
            }
            e.add(pos, out);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let space = usize::from(cpt == Some(' '));
        let mut flags2 = if space == 1 { c.flags(pos + 1) } else { flags };
        if flags2 & NOT_WORDLIKE == 0 && flags != 0 {
            pos += space;
            while flags2 & NOT_WORDLIKE == 0 && flags2 != 0 {
                pos += 1;
                flags2 = c.flags(pos);
            }
            while is_newline(c.cpt(pos)) {
                pos += 1;
            }
            e.add(pos, out);
            continue;
        }
        let mut spaces = 0;
        let mut last_newline_end = 0;
        while c.flags(pos + spaces) & WHITESPACE != 0 {
            if is_newline(c.cpt(pos + spaces)) {
                last_newline_end = pos + spaces + 1;
            }
            spaces += 1;
        }
        if last_newline_end > 0 {
            // `\s*[\r\n]+`
            pos = last_newline_end;
        } else if spaces > 1 && pos + spaces < n {
            // `\s+(?!\S)`
            pos += spaces - 1;
        } else if spaces > 0 {
            pos += spaces;
        } else {
            pos += 1;
        }
        e.add(pos, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'t>(pre: &PreTokenizer, text: &'t str) -> Vec<&'t str> {
        pre.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        let pre = PreTokenizer::new(&[GPT2]).unwrap();
        assert_eq!(
            words(&pre, "Hello world's  end\t\tx 123!? "),
            ["Hello", " world", "'s", " ", " end", "\t", "\t", "x", " 123", "!?", " "]
        );
        // The hand-written splitter and fancy-regex agree.
        let re = PreTokenizer::new(&[GPT2_HF.replace("|\\s+", "|(?:\\s+)")]).unwrap();
        for text in [
            "a  b",
            "x\n\n y",
            "it's 2024...  ok ",
            "tab\t\t\tend",
            "  lead",
        ] {
            assert_eq!(words(&pre, text), words(&re, text), "{text:?}");
        }
    }

    #[test]
    fn llama3_splits_like_the_regex() {
        let pre = PreTokenizer::new(&[LLAMA3]).unwrap();
        assert_eq!(
            words(&pre, "I'LL pay 12345 now!\n\n  ok"),
            ["I", "'LL", " pay", " ", "123", "45", " now", "!\n\n", " ", " ok"]
        );
        let re = PreTokenizer::new(&[LLAMA3.replace("|\\s+(?!", "|(?:\\s+)(?!")]).unwrap();
        for text in [
            "a  b",
            "x\n\n y",
            "it's 2024...  ok ",
            "tab\t\t\tend",
            " \n \n x",
            "$$$abc",
        ] {
            assert_eq!(words(&pre, text), words(&re, text), "{text:?}");
        }
    }

    /// Qwen3.5 keeps a combining mark with its letters, where Qwen2 splits
    /// it off as punctuation.
    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        let text = "cafe\u{301} ok";
        let qwen35 = PreTokenizer::new(named(Some("qwen35")).unwrap().patterns).unwrap();
        assert_eq!(words(&qwen35, text), ["cafe\u{301}", " ok"]);
        let qwen2 = PreTokenizer::new(named(Some("qwen2")).unwrap().patterns).unwrap();
        assert_eq!(words(&qwen2, text), ["cafe", "\u{301}", " ok"]);
    }

    #[test]
    fn rules_apply_in_turn() {
        let smollm = named(Some("smollm")).unwrap();
        let pre = PreTokenizer::new(smollm.patterns).unwrap();
        assert_eq!(words(&pre, "x 2024"), ["x", " ", "2", "0", "2", "4"]);
        assert!(named(Some("nonsense")).is_none());
        for name in NAMES.split(", ") {
            let named = named(Some(name)).unwrap();
            PreTokenizer::new(named.patterns).unwrap();
        }
    }
}
