//! Character classes for the pre-tokenizers and the GPT-2 byte-level alphabet.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// `\p{L}`.
pub(crate) const LETTER: u8 = 1;
/// `\p{N}`.
pub(crate) const NUMBER: u8 = 2;
/// `\s`: the Unicode White_Space property, as llama.cpp's table holds it.
pub(crate) const WHITESPACE: u8 = 4;
/// Set for every character inside the fragment being split; llama.cpp's
/// splitters tell "past the end" from "a character of no class" by flags
/// being all zero, and this bit keeps that distinction.
pub(crate) const PRESENT: u8 = 8;

struct Classes {
    ascii: [u8; 128],
    /// Sorted, disjoint `(first, last, class)` ranges above ASCII.
    ranges: Vec<(u32, u32, u8)>,
}

/// Ranges of a one-class pattern, taken from the Unicode tables that
/// fancy-regex already carries, so the splitters and the regex rules agree
/// on what a letter is.
fn ranges_of(pattern: &str) -> Vec<(u32, u32)> {
    match regex_syntax::Parser::new()
        .parse(pattern)
        .map(|h| h.into_kind())
    {
        Ok(HirKind::Class(Class::Unicode(class))) => class
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect(),
        // The patterns are fixed literals below; a test checks each yields ranges.
        _ => Vec::new(),
    }
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let mut ranges = Vec::new();
        for (pattern, class) in [(r"\p{L}", LETTER), (r"\p{N}", NUMBER), (r"\s", WHITESPACE)] {
            ranges.extend(
                ranges_of(pattern)
                    .into_iter()
                    .map(|(first, last)| (first, last, class)),
            );
        }
        ranges.sort_unstable();
        let mut ascii = [0u8; 128];
        for (c, slot) in ascii.iter_mut().enumerate() {
            let c = c as u32;
            *slot = ranges
                .iter()
                .filter(|&&(first, last, _)| first <= c && c <= last)
                .fold(0, |acc, &(_, _, class)| acc | class);
        }
        ranges.retain(|&(_, last, _)| last >= 128);
        Classes { ascii, ranges }
    })
}

/// The class bits of `c` (letters, numbers and white space are disjoint).
pub(crate) fn class(c: char) -> u8 {
    let classes = classes();
    let c = u32::from(c);
    if let Some(&class) = classes.ascii.get(c as usize) {
        return class;
    }
    let idx = classes.ranges.partition_point(|&(first, _, _)| first <= c);
    match idx.checked_sub(1).map(|i| classes.ranges[i]) {
        Some((_, last, class)) if c <= last => class,
        _ => 0,
    }
}

/// GPT-2's reversible byte-to-character map: printable Latin-1 bytes stand
/// for themselves, the rest are shifted to U+0100 onwards so that every byte
/// of the input is a visible character in the vocabulary.
pub(crate) const BYTE_CHARS: [char; 256] = byte_chars();

const fn printable(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

const fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0u32;
    while b < 256 {
        let cp = if printable(b) {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        out[b as usize] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    out
}

/// The byte a byte-level character stands for (the inverse of [`BYTE_CHARS`]).
pub(crate) fn char_byte(c: char) -> Option<u8> {
    CHAR_BYTES.get(u32::from(c) as usize).copied().flatten()
}

/// Every byte-level character lies below U+0100 + 68 (the shifted bytes).
const CHAR_BYTES: [Option<u8>; 256 + 68] = char_bytes();

const fn char_bytes() -> [Option<u8>; 256 + 68] {
    let mut out = [None; 256 + 68];
    let mut b = 0;
    while b < 256 {
        out[BYTE_CHARS[b] as usize] = Some(b as u8);
        b += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_unicode() {
        assert_eq!(class('a'), LETTER);
        assert_eq!(class('é'), LETTER);
        assert_eq!(class('中'), LETTER);
        assert_eq!(class('7'), NUMBER);
        assert_eq!(class('²'), NUMBER);
        assert_eq!(class('٣'), NUMBER);
        for ws in [' ', '\t', '\n', '\u{0B}', '\u{85}', '\u{A0}', '\u{3000}'] {
            assert_eq!(class(ws), WHITESPACE, "{ws:?}");
        }
        for other in ['!', '\'', '\u{301}', '😀', '\u{1F}'] {
            assert_eq!(class(other), 0, "{other:?}");
        }
    }

    #[test]
    fn byte_level_map_round_trips() {
        assert_eq!(BYTE_CHARS[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_CHARS[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_CHARS[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_byte(BYTE_CHARS[b as usize]), Some(b));
        }
        assert_eq!(char_byte('中'), None);
    }
}
