//! Byte sizes as people write them (`8G`, `1.5GiB`, `512MiB`, `123456`)
//! and as fathom prints them (`1.50 GiB (1610612736 bytes)`).

use crate::PlanError;

/// Parses a size. `Ok(None)` means "unset": empty, `0` or `none`.
/// `what` names the flag or variable in errors.
///
/// Units K, M, G, T are powers of 1024, with an optional `B` or `iB`
/// (`512M`, `512MB`, `512MiB` are the same); fractions are allowed
/// (`1.5G`) and rounded down to whole bytes.
pub fn parse_size(text: &str, what: &str) -> Result<Option<u64>, PlanError> {
    let s = text.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let invalid = || PlanError::InvalidSize {
        what: what.to_string(),
        value: text.to_string(),
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let unit = unit.trim_start();
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(invalid()),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(invalid());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| invalid())?
    };
    let whole_bytes = whole.checked_mul(1u64 << shift).ok_or_else(invalid)?;
    // The fraction exactly, rounded down: digits x unit / 10^digits. Digits
    // past the 19th cannot change a u64 result and are ignored.
    let digits = &fraction[..fraction.len().min(19)];
    let fraction_bytes = if digits.is_empty() {
        0
    } else {
        let numerator = digits.parse::<u128>().map_err(|_| invalid())? << shift;
        u64::try_from(numerator / 10u128.pow(digits.len() as u32)).map_err(|_| invalid())?
    };
    let bytes = whole_bytes
        .checked_add(fraction_bytes)
        .ok_or_else(invalid)?;
    Ok((bytes != 0).then_some(bytes))
}

/// `1.50 GiB (1610612736 bytes)`: binary units for people, exact bytes for checking.
pub fn format_bytes(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", format_binary(bytes))
}

/// `1.50 GiB`, `512 B`.
pub fn format_binary(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_fractions() {
        let cases: &[(&str, Option<u64>)] = &[
            ("", None),
            ("  ", None),
            ("0", None),
            ("none", None),
            ("NONE", None),
            ("0G", None),
            ("123456", Some(123_456)),
            ("1K", Some(1024)),
            ("1kb", Some(1024)),
            ("1KiB", Some(1024)),
            ("512M", Some(512 << 20)),
            ("512MB", Some(512 << 20)),
            ("512 MiB", Some(512 << 20)),
            ("8G", Some(8 << 30)),
            ("1.5G", Some(3 << 29)),
            ("1.5GiB", Some(3 << 29)),
            (".5K", Some(512)),
            ("2T", Some(2 << 40)),
            ("0.1K", Some(102)),
            ("1B", Some(1)),
            ("16777215T", Some(16_777_215u64 << 40)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text, "--memory").unwrap(), *want, "{text:?}");
        }
    }

    #[test]
    fn bad_sizes_name_the_variable_and_value() {
        for text in [
            "abc",
            "1X",
            "1.2.3",
            "-1",
            "1e9",
            ".",
            "G",
            "16777216T",
            "99999999999999999999",
            "1 2",
        ] {
            let err = parse_size(text, "FATHOM_MEMORY_LIMIT")
                .unwrap_err()
                .to_string();
            assert!(err.contains("FATHOM_MEMORY_LIMIT"), "{err}");
            assert!(err.contains(text), "{err}");
        }
    }

    #[test]
    fn bytes_format_in_binary_units_with_exact_count() {
        assert_eq!(format_bytes(1_610_612_736), "1.50 GiB (1610612736 bytes)");
        assert_eq!(format_bytes(512), "512 B (512 bytes)");
        assert_eq!(format_binary(u64::MAX), "16.00 EiB");
    }
}
