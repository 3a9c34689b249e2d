//! The safetensors header reader against valid files and hostile ones: every
//! check has a case asserting the error kind and that the message names the
//! file and the field, and a bounded deterministic mutation fuzz asserts that
//! no input panics.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use fathom_checkpoint::safetensors::MAX_HEADER_LEN;
use fathom_checkpoint::{CheckpointError, ErrorKind, SafetensorsFile, StDtype};
use fathom_fixtures::Rng;

const PATH: &str = "hostile.safetensors";

/// A file with the given header text followed by `data_len` zero bytes.
fn file_with_header(header: &str, data_len: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_len, 0);
    bytes
}

/// A valid file: tensors laid out back to back in the given order.
fn build(tensors: &[(&str, StDtype, &[u64])], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut entries = Vec::new();
    if !metadata.is_empty() {
        let pairs: Vec<String> = metadata
            .iter()
            .map(|(k, v)| format!("{k:?}:{v:?}"))
            .collect();
        entries.push(format!("\"__metadata__\":{{{}}}", pairs.join(",")));
    }
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let n_bytes = shape.iter().product::<u64>() * dtype.size_bytes();
        entries.push(format!(
            "{name:?}:{{\"dtype\":\"{}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}",
            dtype.name(),
            offset + n_bytes
        ));
        offset += n_bytes;
    }
    file_with_header(&format!("{{{}}}", entries.join(",")), offset as usize)
}

/// One tensor entry, for hand-written hostile headers.
fn entry(name: &str, dtype: &str, shape: &str, offsets: &str) -> String {
    format!("{name:?}:{{\"dtype\":{dtype},\"shape\":{shape},\"data_offsets\":{offsets}}}")
}

fn parse(bytes: &[u8]) -> Result<SafetensorsFile, CheckpointError> {
    SafetensorsFile::parse(Path::new(PATH), bytes, bytes.len() as u64)
}

/// Parses `bytes`, expects an error whose kind satisfies `kind` and whose
/// message names the file and each of `needles`.
fn expect_err(bytes: &[u8], kind: fn(&ErrorKind) -> bool, needles: &[&str]) -> String {
    let err = match parse(bytes) {
        Ok(file) => panic!("expected an error, parsed {:?}", file.tensors),
        Err(err) => err,
    };
    assert!(kind(&err.kind), "unexpected kind: {:?}", err.kind);
    let text = err.to_string();
    assert!(text.contains(PATH), "{text:?} does not name the file");
    for needle in needles {
        assert!(
            text.contains(needle),
            "{text:?} does not contain {needle:?}"
        );
    }
    text
}

fn is_truncated(k: &ErrorKind) -> bool {
    matches!(k, ErrorKind::Truncated { .. })
}
fn is_invalid(k: &ErrorKind) -> bool {
    matches!(k, ErrorKind::InvalidValue { .. })
}
fn is_overflow(k: &ErrorKind) -> bool {
    matches!(k, ErrorKind::Overflow { .. })
}
fn is_json(k: &ErrorKind) -> bool {
    matches!(k, ErrorKind::Json { .. })
}

#[test]
fn dtype_names_round_trip_with_sizes() {
    let sizes = [1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8];
    for (dtype, size) in StDtype::ALL.into_iter().zip(sizes) {
        assert_eq!(StDtype::parse(dtype.name()), Some(dtype));
        assert_eq!(dtype.size_bytes(), size, "{}", dtype.name());
    }
    let spellings = [
        "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
        "F64", "I64", "U64",
    ];
    for name in spellings {
        assert_eq!(StDtype::parse(name).map(StDtype::name), Some(name));
    }
    assert_eq!(StDtype::parse("f16"), None);
    assert_eq!(StDtype::parse("F8_E4M3FN"), None);
}

#[test]
fn valid_file_with_every_dtype_and_metadata() {
    let shapes: [&[u64]; 3] = [&[2, 3], &[], &[0, 4]];
    let names: Vec<String> = StDtype::ALL
        .iter()
        .flat_map(|d| (0..shapes.len()).map(move |i| format!("t.{}.{i}", d.name())))
        .collect();
    let mut tensors = Vec::new();
    for (k, dtype) in StDtype::ALL.into_iter().enumerate() {
        for (i, shape) in shapes.iter().enumerate() {
            tensors.push((names[k * shapes.len() + i].as_str(), dtype, *shape));
        }
    }
    let bytes = build(&tensors, &[("format", "pt"), ("note", "ünïcode")]);
    let file = parse(&bytes).unwrap();

    assert_eq!(file.path, Path::new(PATH));
    assert_eq!(file.file_size, bytes.len() as u64);
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(file.header_len, header_len);
    assert_eq!(file.metadata.len(), 2);
    assert_eq!(file.metadata["format"], "pt");
    assert_eq!(file.metadata["note"], "ünïcode");
    assert_eq!(file.tensors.len(), tensors.len());

    let data_start = 8 + header_len;
    let mut offset = data_start;
    for ((name, dtype, shape), got) in tensors.iter().zip(&file.tensors) {
        let n_bytes = shape.iter().product::<u64>() * dtype.size_bytes();
        assert_eq!(got.name, *name);
        assert_eq!(got.dtype, *dtype);
        assert_eq!(got.shape, *shape);
        assert_eq!((got.begin, got.end), (offset, offset + n_bytes), "{name}");
        assert_eq!(got.n_bytes(), n_bytes);
        assert_eq!(got.file, 0);
        offset += n_bytes;
    }
    assert_eq!(offset, file.file_size);
}

#[test]
fn tensors_come_back_sorted_by_offset_and_gaps_are_allowed() {
    let header = format!(
        "{{{},{},{}}}",
        entry("c", "\"F32\"", "[2]", "[24,32]"),
        entry("a", "\"F16\"", "[4]", "[0,8]"),
        entry("b", "\"U8\"", "[4]", "[12,16]"),
    );
    let file = parse(&file_with_header(&header, 32)).unwrap();
    let order: Vec<&str> = file.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(order, ["a", "b", "c"]);
    assert!(file.metadata.is_empty());
}

#[test]
fn empty_header_object_and_space_padding_are_valid() {
    let file = parse(&file_with_header("{}", 0)).unwrap();
    assert!(file.tensors.is_empty());
    // Writers pad the header with spaces to align the data section.
    let file = parse(&file_with_header(
        &format!("{{{}}}      ", entry("w", "\"F16\"", "[2]", "[0,4]")),
        4,
    ))
    .unwrap();
    assert_eq!(file.tensors[0].begin, 8 + file.header_len);
}

#[test]
fn open_reads_the_same_header_as_parse() {
    let bytes = build(
        &[("w", StDtype::BF16, &[3, 5]), ("b", StDtype::F32, &[5])],
        &[("k", "v")],
    );
    let path =
        std::env::temp_dir().join(format!("fathom-st-open-{}.safetensors", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let opened = SafetensorsFile::open(&path);
    std::fs::remove_file(&path).unwrap();
    let opened = opened.unwrap();
    let parsed = SafetensorsFile::parse(&path, &bytes, bytes.len() as u64).unwrap();
    assert_eq!(opened.tensors, parsed.tensors);
    assert_eq!(opened.metadata, parsed.metadata);
    assert_eq!(opened.header_len, parsed.header_len);
    assert_eq!(opened.file_size, parsed.file_size);

    let err = SafetensorsFile::open(&path).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::Io(_)));
    assert!(err.to_string().contains("fathom-st-open-"));
}

#[test]
fn file_shorter_than_the_length_field() {
    for len in 0..8 {
        expect_err(
            &vec![0u8; len],
            is_truncated,
            &["header length", "needs 8 bytes"],
        );
    }
}

#[test]
fn header_length_beyond_the_file_or_the_limit() {
    let mut bytes = file_with_header("{}", 0);
    bytes[..8].copy_from_slice(&3u64.to_le_bytes());
    expect_err(
        &bytes,
        is_truncated,
        &["header", "needs 11 bytes", "file has 10"],
    );

    for len in [MAX_HEADER_LEN + 1, u64::MAX] {
        bytes[..8].copy_from_slice(&len.to_le_bytes());
        let text = expect_err(
            &bytes,
            |k| matches!(k, ErrorKind::TooLarge { .. }),
            &["header length", &len.to_string()],
        );
        assert!(text.contains(&MAX_HEADER_LEN.to_string()));
    }

    // A prefix shorter than the header it announces, even if the file is
    // larger, cannot be parsed.
    let full = build(&[("w", StDtype::F16, &[2])], &[]);
    let err = SafetensorsFile::parse(Path::new(PATH), &full[..20], full.len() as u64).unwrap_err();
    assert!(is_truncated(&err.kind), "{err}");
}

#[test]
fn header_that_is_not_utf8() {
    let mut bytes = file_with_header("{\"ab\": 1}", 0);
    bytes[8 + 3] = 0xff;
    let text = expect_err(
        &bytes,
        |k| matches!(k, ErrorKind::InvalidUtf8 { offset: 11, .. }),
        &["header"],
    );
    assert!(text.contains("offset 11"), "{text}");
}

#[test]
fn header_that_is_not_json() {
    for header in ["", "{", "{\"a\":}", "{} trailing", "{\"a\": [1,]}", "\u{0}"] {
        expect_err(
            &file_with_header(header, 0),
            is_json,
            &["header", "line", "column"],
        );
    }
    // Numbers beyond f64 are a JSON error in serde_json.
    expect_err(
        &file_with_header(
            &format!("{{{}}}", entry("w", "\"F16\"", "[1e400]", "[0,2]")),
            2,
        ),
        is_json,
        &["line 1"],
    );
}

#[test]
fn header_that_is_not_an_object() {
    for (header, kind) in [
        ("[]", "an array"),
        ("[{\"dtype\":1}]", "an array"),
        ("\"x\"", "a string"),
        ("1", "a number"),
        ("-1.5", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
    ] {
        expect_err(
            &file_with_header(header, 0),
            is_invalid,
            &["header", kind, "JSON object"],
        );
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let deep = |open: &str, close: &str, depth: usize| {
        format!("{}1{}", open.repeat(depth), close.repeat(depth))
    };
    let arrays = deep("[", "]", 100_000);
    let objects = deep("{\"a\":", "}", 100_000);
    // Values parsed into JSON trees hit serde_json's recursion limit.
    let parsed = [
        objects.clone(),
        format!("{{\"w\":{objects}}}"),
        format!("{{\"w\":{{\"dtype\":{arrays}}}}}"),
        format!("{{\"__metadata__\":{{\"k\":{objects}}}}}"),
    ];
    for header in &parsed {
        expect_err(&file_with_header(header, 0), is_json, &["recursion limit"]);
    }
    // Arrays where an object is required are skipped without recursion and
    // reported by type.
    expect_err(
        &file_with_header(&arrays, 0),
        is_invalid,
        &["header", "an array"],
    );
    expect_err(
        &file_with_header(&format!("{{\"w\":{arrays}}}"), 0),
        is_invalid,
        &["tensor w", "an array"],
    );
    // Within the limit, nesting is just a wrongly typed value.
    let shallow = deep("[", "]", 100);
    expect_err(
        &file_with_header(&format!("{{\"w\":{{\"dtype\":{shallow}}}}}"), 0),
        is_invalid,
        &["tensor w dtype"],
    );
}

#[test]
fn entry_missing_a_field() {
    let cases = [
        (
            "{\"w\":{\"shape\":[1],\"data_offsets\":[0,2]}}",
            "tensor w dtype",
        ),
        (
            "{\"w\":{\"dtype\":\"F16\",\"data_offsets\":[0,2]}}",
            "tensor w shape",
        ),
        (
            "{\"w\":{\"dtype\":\"F16\",\"shape\":[1]}}",
            "tensor w data_offsets",
        ),
    ];
    for (header, field) in cases {
        expect_err(
            &file_with_header(header, 2),
            is_invalid,
            &[field, "missing"],
        );
    }
}

#[test]
fn entry_fields_of_the_wrong_type() {
    let cases = [
        (entry("w", "5", "[1]", "[0,2]"), "tensor w dtype"),
        (entry("w", "null", "[1]", "[0,2]"), "tensor w dtype"),
        (entry("w", "\"F16\"", "\"1\"", "[0,2]"), "tensor w shape"),
        (entry("w", "\"F16\"", "{}", "[0,2]"), "tensor w shape"),
        (entry("w", "\"F16\"", "[-1]", "[0,2]"), "tensor w shape[0]"),
        (
            entry("w", "\"F16\"", "[1, 1.5]", "[0,2]"),
            "tensor w shape[1]",
        ),
        (
            entry("w", "\"F16\"", "[18446744073709551616]", "[0,2]"),
            "tensor w shape[0]",
        ),
        (entry("w", "\"F16\"", "[1]", "[0]"), "tensor w data_offsets"),
        (
            entry("w", "\"F16\"", "[1]", "[0,2,4]"),
            "tensor w data_offsets",
        ),
        (
            entry("w", "\"F16\"", "[1]", "[-1,2]"),
            "tensor w data_offsets",
        ),
        (
            entry("w", "\"F16\"", "[1]", "\"0,2\""),
            "tensor w data_offsets",
        ),
        (
            entry("w", "\"F16\"", "[1]", "[0,18446744073709551616]"),
            "tensor w data_offsets",
        ),
    ];
    for (body, field) in cases {
        expect_err(
            &file_with_header(&format!("{{{body}}}"), 2),
            is_invalid,
            &[field],
        );
    }
    for value in ["1", "\"F16\"", "[]", "null", "true"] {
        expect_err(
            &file_with_header(&format!("{{\"w\":{value}}}"), 0),
            is_invalid,
            &["tensor w", "an object with dtype, shape and data_offsets"],
        );
    }
    expect_err(
        &file_with_header(
            "{\"w\":{\"dtype\":\"F16\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,2]}}",
            2,
        ),
        is_invalid,
        &["tensor w dtype", "given twice"],
    );
}

#[test]
fn unknown_dtype_lists_the_valid_ones() {
    let header = format!("{{{}}}", entry("w", "\"F17\"", "[1]", "[0,2]"));
    let text = expect_err(
        &file_with_header(&header, 2),
        is_invalid,
        &["tensor w dtype", "\"F17\""],
    );
    for dtype in StDtype::ALL {
        assert!(text.contains(dtype.name()), "{text} lacks {}", dtype.name());
    }
}

#[test]
fn shape_whose_size_overflows() {
    let header = format!(
        "{{{}}}",
        entry("w", "\"F16\"", "[4294967296, 4294967296]", "[0,2]")
    );
    expect_err(
        &file_with_header(&header, 2),
        is_overflow,
        &["tensor w shape", "exceeds u64"],
    );
    let header = format!(
        "{{{}}}",
        entry("w", "\"F32\"", "[9223372036854775807]", "[0,2]")
    );
    expect_err(
        &file_with_header(&header, 2),
        is_overflow,
        &["tensor w shape", "F32"],
    );

    // A zero dimension makes the tensor empty whatever the others are.
    let header = format!(
        "{{{}}}",
        entry("w", "\"F64\"", "[4294967296, 4294967296, 0]", "[0,0]")
    );
    let file = parse(&file_with_header(&header, 0)).unwrap();
    assert_eq!(file.tensors[0].n_bytes(), 0);
}

#[test]
fn offsets_that_end_before_they_begin() {
    let header = format!("{{{}}}", entry("w", "\"F16\"", "[1]", "[4,2]"));
    expect_err(
        &file_with_header(&header, 4),
        is_invalid,
        &["tensor w data_offsets", "[4, 2]"],
    );
}

#[test]
fn offsets_that_disagree_with_the_shape() {
    let header = format!("{{{}}}", entry("w", "\"F32\"", "[2, 3]", "[0,20]"));
    expect_err(
        &file_with_header(&header, 24),
        is_invalid,
        &["tensor w data_offsets", "20 bytes", "24 bytes", "F32"],
    );
}

#[test]
fn offsets_beyond_the_file() {
    let header = format!("{{{}}}", entry("w", "\"F16\"", "[4]", "[0,8]"));
    let text = expect_err(
        &file_with_header(&header, 7),
        |k| {
            matches!(
                k,
                ErrorKind::OutOfBounds {
                    end: 8,
                    available: 7,
                    ..
                }
            )
        },
        &["tensor w"],
    );
    assert!(text.contains("[0, 8)"), "{text}");
    // The same header is fine when the caller says the file is larger.
    let bytes = file_with_header(&header, 7);
    assert!(SafetensorsFile::parse(Path::new(PATH), &bytes, bytes.len() as u64 + 1).is_ok());
    let huge = format!(
        "{{{}}}",
        entry(
            "w",
            "\"U8\"",
            "[2]",
            "[18446744073709551613,18446744073709551615]"
        )
    );
    expect_err(
        &file_with_header(&huge, 0),
        |k| matches!(k, ErrorKind::OutOfBounds { .. }),
        &["tensor w"],
    );
}

#[test]
fn duplicate_tensor_names() {
    let header = format!(
        "{{{},{}}}",
        entry("w", "\"F16\"", "[1]", "[0,2]"),
        entry("w", "\"F16\"", "[1]", "[2,4]")
    );
    expect_err(
        &file_with_header(&header, 4),
        |k| matches!(k, ErrorKind::DuplicateTensor { name } if name == "w"),
        &["duplicate tensor name \"w\""],
    );
    // Names are compared after JSON unescaping.
    let header = format!(
        "{{{},\"\\u0077\":{{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[2,4]}}}}",
        entry("w", "\"F16\"", "[1]", "[0,2]")
    );
    expect_err(
        &file_with_header(&header, 4),
        |k| matches!(k, ErrorKind::DuplicateTensor { .. }),
        &["\"w\""],
    );
}

#[test]
fn metadata_that_is_not_string_to_string() {
    let cases = [
        ("{\"__metadata__\":{\"format\":1}}", "__metadata__ format"),
        (
            "{\"__metadata__\":{\"format\":null}}",
            "__metadata__ format",
        ),
        (
            "{\"__metadata__\":{\"format\":{\"a\":\"b\"}}}",
            "__metadata__ format",
        ),
        ("{\"__metadata__\":[\"format\"]}", "__metadata__"),
        ("{\"__metadata__\":\"pt\"}", "__metadata__"),
    ];
    for (header, field) in cases {
        expect_err(&file_with_header(header, 0), is_invalid, &[field]);
    }
    expect_err(
        &file_with_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0),
        |k| matches!(k, ErrorKind::DuplicateKey { key } if key == "__metadata__"),
        &["__metadata__"],
    );
    expect_err(
        &file_with_header("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0),
        |k| matches!(k, ErrorKind::DuplicateKey { key } if key == "a"),
        &["\"a\""],
    );
}

#[test]
fn overlapping_data_ranges() {
    let header = format!(
        "{{{},{}}}",
        entry("a", "\"F32\"", "[4]", "[0,16]"),
        entry("b", "\"F16\"", "[4]", "[8,16]")
    );
    expect_err(
        &file_with_header(&header, 16),
        is_invalid,
        &["tensor b data_offsets", "[8, 16)", "tensor a [0, 16)"],
    );
    // A range lying wholly inside an earlier one overlaps it.
    let header = format!(
        "{{{},{},{}}}",
        entry("long", "\"U8\"", "[16]", "[0,16]"),
        entry("short", "\"U8\"", "[2]", "[2,4]"),
        entry("inner", "\"U8\"", "[2]", "[8,10]")
    );
    expect_err(
        &file_with_header(&header, 16),
        is_invalid,
        &["overlapping tensor long"],
    );
    // Empty tensors own no bytes and overlap nothing.
    let header = format!(
        "{{{},{}}}",
        entry("a", "\"F32\"", "[4]", "[0,16]"),
        entry("e", "\"F16\"", "[0]", "[8,8]")
    );
    assert_eq!(
        parse(&file_with_header(&header, 16)).unwrap().tensors.len(),
        2
    );
}

#[test]
fn hostile_names_are_clipped_in_messages() {
    let name = "n".repeat(1_000_000);
    let header = format!("{{{}}}", entry(&name, "\"F17\"", "[1]", "[0,2]"));
    let text = expect_err(&file_with_header(&header, 2), is_invalid, &["tensor nnnn"]);
    assert!(text.len() < 2_000, "message of {} bytes", text.len());
}

#[test]
fn every_prefix_of_a_valid_file_is_an_error() {
    let bytes = build(
        &[("a", StDtype::F16, &[3]), ("b", StDtype::U8, &[1])],
        &[("format", "pt")],
    );
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for len in 0..bytes.len() {
        let prefix = &bytes[..len];
        let result = catch_unwind(|| parse(prefix));
        assert!(matches!(result, Ok(Err(_))), "prefix of {len} bytes");
        // Given the real file size, a prefix holding the header suffices.
        let result = SafetensorsFile::parse(Path::new(PATH), prefix, bytes.len() as u64);
        assert_eq!(result.is_ok(), len >= header_end, "prefix of {len} bytes");
    }
    assert!(parse(&bytes).is_ok());
}

/// A random one of `items`.
fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len())]
}

/// A byte range `[start, end)` of a JSON text.
type Span = (usize, usize);

/// Byte spans of the number and string tokens of a JSON text.
fn tokens(json: &[u8]) -> (Vec<Span>, Vec<Span>) {
    let (mut numbers, mut strings) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(json.len());
                strings.push((start, i));
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < json.len()
                    && matches!(json[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                numbers.push((start, i));
            }
            _ => i += 1,
        }
    }
    (numbers, strings)
}

fn splice(bytes: &mut Vec<u8>, span: Span, with: &[u8]) {
    bytes.splice(span.0..span.1, with.iter().copied());
}

/// Mutates a header text (and its data length), mostly keeping the length
/// field consistent so mutations reach the JSON validation.
fn mutate_header(rng: &mut Rng, header: &mut Vec<u8>, data_len: &mut usize) {
    const NUMBERS: &[&str] = &[
        "1e400",
        "-1",
        "18446744073709551616",
        "18446744073709551615",
        "9223372036854775808",
        "0",
        "-0",
        "1.5",
        "1e2",
        "4294967296",
        "null",
        "\"7\"",
        "[]",
        "{}",
        "[1,2,3]",
    ];
    const STRINGS: &[&str] = &[
        "\"__metadata__\"",
        "\"F16\"",
        "\"BOOL\"",
        "\"\"",
        "\"a\"",
        "\"\\u0000\"",
        "\"\\ud800\"",
        "\"\\\"\"",
        "1",
        "[]",
        "{}",
        "null",
        "\"dtype\"",
        "\"shape\"",
        "\"data_offsets\"",
    ];
    let (numbers, strings) = tokens(header);
    match rng.below(9) {
        0 if !numbers.is_empty() => {
            let span = *pick(rng, &numbers);
            splice(header, span, pick(rng, NUMBERS).as_bytes());
        }
        1 if !strings.is_empty() => {
            let span = *pick(rng, &strings);
            splice(header, span, pick(rng, STRINGS).as_bytes());
        }
        2 => {
            let depth = *pick(rng, &[1, 10, 127, 128, 129, 1_000, 50_000]);
            let (open, close) = *pick(rng, &[("[", "]"), ("{\"a\":", "}")]);
            let nest = format!("{}0{}", open.repeat(depth), close.repeat(depth));
            let spans = if numbers.is_empty() {
                &strings
            } else {
                &numbers
            };
            if let Some(&span) = spans.get(rng.below(spans.len())) {
                splice(header, span, nest.as_bytes());
            }
        }
        3 if !header.is_empty() => {
            let at = rng.below(header.len());
            header[at] = *pick(rng, b"{}[]\":,-0123456789e. \\\xff\x00");
        }
        4 if !header.is_empty() => {
            let at = rng.below(header.len());
            let len = rng.below(16).min(header.len() - at);
            header.drain(at..at + len);
        }
        5 if !header.is_empty() => {
            // Duplicate a span: often repeats an entry or a key.
            let start = rng.below(header.len());
            let end = start + rng.below(header.len() - start + 1);
            let copy = header[start..end].to_vec();
            let at = rng.below(header.len() + 1);
            header.splice(at..at, copy);
        }
        6 if !strings.is_empty() => {
            // Copy one token over another: duplicate names and keys.
            let from = *pick(rng, &strings);
            let to = *pick(rng, &strings);
            let copy = header[from.0..from.1].to_vec();
            splice(header, to, &copy);
        }
        7 => *data_len = rng.below(*data_len + 64),
        _ => {
            let at = rng.below(header.len() + 1);
            header.insert(at, rng.next_u64() as u8);
        }
    }
}

/// Invariants every successful parse must hold.
fn check_invariants(file: &SafetensorsFile) {
    let data_start = 8 + file.header_len;
    let mut furthest = data_start;
    for t in &file.tensors {
        assert!(
            data_start <= t.begin && t.begin <= t.end && t.end <= file.file_size,
            "{t:?}"
        );
        let numel: u64 = t.shape.iter().product();
        assert_eq!(t.n_bytes(), numel * t.dtype.size_bytes(), "{t:?}");
        if t.begin < t.end {
            assert!(t.begin >= furthest, "{t:?} overlaps");
            furthest = t.end;
        }
    }
}

#[test]
fn mutation_fuzz_never_panics() {
    let base = build(
        &[
            ("model.embed_tokens.weight", StDtype::BF16, &[16, 8]),
            (
                "model.layers.0.self_attn.q_proj.weight",
                StDtype::U32,
                &[8, 2],
            ),
            (
                "model.layers.0.self_attn.q_proj.scales",
                StDtype::F16,
                &[8, 1],
            ),
            ("model.norm.weight", StDtype::F32, &[8]),
            ("mask", StDtype::Bool, &[3]),
            ("empty", StDtype::F8E4M3, &[0]),
        ],
        &[("format", "mlx"), ("note", "x")],
    );
    let header_len = u64::from_le_bytes(base[..8].try_into().unwrap()) as usize;
    let base_header = base[8..8 + header_len].to_vec();
    let base_data = base.len() - 8 - header_len;

    let rng = &mut Rng::xorshift64_star(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut errors) = (0, std::collections::BTreeMap::new());
    for _ in 0..4_000 {
        let mut header = base_header.clone();
        let mut data_len = base_data;
        for _ in 0..1 + rng.below(3) {
            mutate_header(rng, &mut header, &mut data_len);
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&header);
        bytes.resize(bytes.len() + data_len, 0);
        let mut file_size = bytes.len() as u64;
        match rng.below(8) {
            0 => {
                let random = rng.next_u64();
                let field = *pick(
                    rng,
                    &[
                        0,
                        1,
                        7,
                        MAX_HEADER_LEN,
                        MAX_HEADER_LEN + 1,
                        u64::MAX,
                        random,
                    ],
                );
                let len = header.len() as u64;
                let field = *pick(rng, &[field, len.wrapping_sub(1), len + 1]);
                bytes[..8].copy_from_slice(&field.to_le_bytes());
            }
            1 => {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
            2 => bytes.truncate(rng.below(bytes.len() + 1)),
            3 => {
                let random = rng.next_u64();
                file_size = *pick(rng, &[0, random, u64::MAX, file_size / 2]);
            }
            _ => {}
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            SafetensorsFile::parse(Path::new(PATH), &bytes, file_size)
        }));
        match result {
            Err(_) => panic!(
                "parse panicked on header {:?} (file_size {file_size})",
                String::from_utf8_lossy(&header)
            ),
            Ok(Ok(file)) => {
                check_invariants(&file);
                ok += 1;
            }
            Ok(Err(err)) => {
                assert!(err.to_string().contains(PATH), "{err}");
                let kind = format!("{:?}", err.kind);
                let kind = kind.split([' ', '(']).next().unwrap_or_default().to_owned();
                *errors.entry(kind).or_insert(0) += 1;
            }
        }
    }
    // The fuzz must reach both success and the deeper validation errors.
    assert!(ok > 50, "only {ok} successful parses; errors {errors:?}");
    for kind in [
        "Json",
        "InvalidValue",
        "Truncated",
        "DuplicateTensor",
        "OutOfBounds",
    ] {
        assert!(
            errors.contains_key(kind),
            "fuzz never produced {kind}: {errors:?}"
        );
    }
}
