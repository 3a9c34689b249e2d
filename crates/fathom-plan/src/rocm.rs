//! The ROCm backend's in-flight command reserve.
//!
//! The backend reads `MLX_ROCM_MAX_INFLIGHT_MB` with C `strtoull` (base 10)
//! and falls back to its default whenever the result is not a clean,
//! in-range count. fathom reserves exactly what that backend will use, so
//! it reproduces the parse byte for byte rather than parsing "sensibly".

/// The variable the ROCm backend reads.
pub const ROCM_INFLIGHT_VAR: &str = "MLX_ROCM_MAX_INFLIGHT_MB";

/// The backend's default, in MiB.
pub const ROCM_INFLIGHT_DEFAULT_MB: u64 = 1024;

/// Reserve in bytes for the raw value of the variable (`None` when unset).
pub fn rocm_inflight_reserve_bytes(raw: Option<&[u8]>) -> u64 {
    let default = ROCM_INFLIGHT_DEFAULT_MB << 20;
    match raw.and_then(parse_count_mb) {
        Some(mb) if mb <= u64::MAX >> 20 => mb << 20,
        _ => default,
    }
}

/// The count in MiB as the backend reads it, or `None` where it would
/// fall back to its default.
fn parse_count_mb(raw: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(raw).ok()?;
    let bytes = text.as_bytes();
    // The backend rejects a leading '-' itself, before strtoull sees it.
    if bytes.first() == Some(&b'-') {
        return None;
    }
    let is_c_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let mut rest = &bytes[bytes.iter().take_while(|b| is_c_space(b)).count()..];
    let negative = match rest.first() {
        Some(b'+') => {
            rest = &rest[1..];
            false
        }
        Some(b'-') => {
            rest = &rest[1..];
            true
        }
        _ => false,
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // No digits, or anything after them (a unit, a trailing space): the
    // backend checks that strtoull consumed the whole string.
    if digits == 0 || digits != rest.len() {
        return None;
    }
    let mut value: u64 = 0;
    for &d in &rest[..digits] {
        // strtoull reports overflow as ERANGE, which the backend rejects.
        value = value.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    // strtoull negates in unsigned arithmetic: "-5" is 2^64 - 5.
    Some(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: u64 = 1024 << 20;
    const MAX_COUNT: u64 = u64::MAX >> 20;

    #[test]
    fn every_parse_rule() {
        let cases: &[(&str, Option<&[u8]>, u64)] = &[
            ("unset", None, DEFAULT),
            ("empty", Some(b""), DEFAULT),
            ("invalid utf-8", Some(b"12\xff"), DEFAULT),
            ("invalid utf-8 alone", Some(b"\xc3"), DEFAULT),
            ("leading minus", Some(b"-5"), DEFAULT),
            ("leading minus zero", Some(b"-0"), DEFAULT),
            ("plain", Some(b"256"), 256 << 20),
            ("zero adds nothing", Some(b"0"), 0),
            ("leading zeros", Some(b"0007"), 7 << 20),
            ("plus sign", Some(b"+64"), 64 << 20),
            ("space then plus", Some(b" +64"), 64 << 20),
            ("each C space", Some(b" \t\n\x0b\x0c\r64"), 64 << 20),
            ("space then minus zero", Some(b" -0"), 0),
            ("space then minus wraps past limit", Some(b" -5"), DEFAULT),
            ("tab then minus wraps", Some(b"\t-1"), DEFAULT),
            ("only spaces", Some(b"   "), DEFAULT),
            ("sign without digits", Some(b"+"), DEFAULT),
            ("double sign", Some(b"+-5"), DEFAULT),
            ("space between sign and digits", Some(b"+ 5"), DEFAULT),
            ("unit suffix", Some(b"512MB"), DEFAULT),
            ("trailing space", Some(b"512 "), DEFAULT),
            ("trailing newline", Some(b"512\n"), DEFAULT),
            ("hex is not base 10", Some(b"0x10"), DEFAULT),
            ("letters", Some(b"abc"), DEFAULT),
            ("fraction", Some(b"1.5"), DEFAULT),
            (
                "u64 max overflows nothing but is over the count limit",
                Some(b"18446744073709551615"),
                DEFAULT,
            ),
            ("u64 overflow", Some(b"18446744073709551616"), DEFAULT),
            ("far overflow", Some(b"99999999999999999999999"), DEFAULT),
            (
                "one above the count limit",
                Some(b"17592186044416"),
                DEFAULT,
            ),
            (
                "largest accepted count",
                Some(b"17592186044415"),
                MAX_COUNT << 20,
            ),
            (
                "non-breaking space is not C space",
                Some("\u{a0}5".as_bytes()),
                DEFAULT,
            ),
        ];
        for (name, raw, want) in cases {
            assert_eq!(rocm_inflight_reserve_bytes(*raw), *want, "{name}");
        }
        assert_eq!(MAX_COUNT, 17_592_186_044_415);
    }
}
