//! The GGUF header reader against well-formed, malformed and hostile files.
//!
//! Files are built byte by byte by a small local writer, independent of the
//! parser, so each test states exactly what is on disk. Every rejection
//! checks the error kind and that the message names the file and the field.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use fathom_checkpoint::{CheckpointError, ErrorKind, GgmlType, GgufFile, MetaValue};
use fathom_fixtures::Rng;

const PATH: &str = "/fixtures/hostile.gguf";

// ---------------------------------------------------------------------------
// A tiny GGUF writer.

/// A metadata value as written. Strings are raw bytes so tests can plant
/// invalid UTF-8; `Raw` writes any type id followed by any bytes.
#[derive(Clone)]
enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(u8),
    Str(Vec<u8>),
    Arr(u32, Vec<V>),
    U64(u64),
    I64(i64),
    F64(f64),
    Raw(u32, Vec<u8>),
}

fn s(text: &str) -> V {
    V::Str(text.as_bytes().to_vec())
}

impl V {
    fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) => 8,
            V::Arr(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
            V::Raw(ty, _) => *ty,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.extend(v.to_le_bytes()),
            V::U16(v) => out.extend(v.to_le_bytes()),
            V::I16(v) => out.extend(v.to_le_bytes()),
            V::U32(v) => out.extend(v.to_le_bytes()),
            V::I32(v) => out.extend(v.to_le_bytes()),
            V::F32(v) => out.extend(v.to_le_bytes()),
            V::Bool(v) => out.push(*v),
            V::Str(b) => put_str(out, b),
            V::Arr(ty, items) => {
                out.extend(ty.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.encode(out);
                }
            }
            V::U64(v) => out.extend(v.to_le_bytes()),
            V::I64(v) => out.extend(v.to_le_bytes()),
            V::F64(v) => out.extend(v.to_le_bytes()),
            V::Raw(_, b) => out.extend(b),
        }
    }
}

fn put_str(out: &mut Vec<u8>, b: &[u8]) {
    out.extend((b.len() as u64).to_le_bytes());
    out.extend(b);
}

struct TensorSpec {
    name: Vec<u8>,
    dims: Vec<u64>,
    ty: u32,
    /// `None`: packed after the previous tensor at the file's alignment.
    offset: Option<u64>,
}

/// What the writer laid out, for tests to check the parser against.
struct Built {
    bytes: Vec<u8>,
    header_end: u64,
    data_offset: u64,
}

#[derive(Default)]
struct Gguf {
    version: Option<u32>,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    kvs: Vec<(Vec<u8>, V)>,
    tensors: Vec<TensorSpec>,
    /// Bytes after the data section start; `None`: exactly what the tensors need.
    data_len: Option<u64>,
}

/// Bytes of a tensor by the writer's own table, saturating so that hostile
/// dims cannot panic the writer (those tests set `data_len`).
fn spec_bytes(dims: &[u64], ty: u32) -> u64 {
    let (elems, bytes) = match ty {
        0 => (1, 4),
        1 | 30 => (1, 2),
        2 => (32, 18),
        3 => (32, 20),
        8 => (32, 34),
        12 => (256, 144),
        14 => (256, 210),
        _ => (1, 0),
    };
    let rows: u64 = dims.iter().skip(1).fold(1u64, |a, &d| a.saturating_mul(d));
    (dims.first().copied().unwrap_or(1) / elems)
        .saturating_mul(bytes)
        .saturating_mul(rows)
}

impl Gguf {
    fn new() -> Self {
        Gguf::default()
    }

    fn kv(mut self, key: &str, v: V) -> Self {
        self.kvs.push((key.as_bytes().to_vec(), v));
        self
    }

    fn kv_raw_key(mut self, key: &[u8], v: V) -> Self {
        self.kvs.push((key.to_vec(), v));
        self
    }

    fn tensor(self, name: &str, dims: &[u64], ty: GgmlType) -> Self {
        self.tensor_raw(name.as_bytes(), dims, ty.id(), None)
    }

    fn tensor_at(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        self.tensor_raw(name.as_bytes(), dims, ty, Some(offset))
    }

    fn tensor_raw(mut self, name: &[u8], dims: &[u64], ty: u32, offset: Option<u64>) -> Self {
        self.tensors.push(TensorSpec {
            name: name.to_vec(),
            dims: dims.to_vec(),
            ty,
            offset,
        });
        self
    }

    fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find_map(|(k, v)| match v {
                V::U32(a) if k == b"general.alignment" && a.is_power_of_two() => {
                    Some(u64::from(*a))
                }
                _ => None,
            })
            .unwrap_or(32)
    }

    fn build(&self) -> Built {
        let align = self.alignment();
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.unwrap_or(3).to_le_bytes());
        let tensor_count = self.tensor_count.unwrap_or(self.tensors.len() as u64);
        out.extend(tensor_count.to_le_bytes());
        out.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (key, v) in &self.kvs {
            put_str(&mut out, key);
            out.extend(v.type_id().to_le_bytes());
            v.encode(&mut out);
        }
        let mut next = 0u64;
        let mut data_end = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            let offset = t.offset.unwrap_or(next);
            out.extend(offset.to_le_bytes());
            let end = offset.saturating_add(spec_bytes(&t.dims, t.ty));
            data_end = data_end.max(end);
            next = end.div_ceil(align).saturating_mul(align);
        }
        let header_end = out.len() as u64;
        let data_offset = header_end.div_ceil(align) * align;
        out.resize(data_offset as usize, 0);
        let data_len = self.data_len.unwrap_or(data_end);
        out.resize((data_offset + data_len) as usize, 0xAB);
        Built {
            bytes: out,
            header_end,
            data_offset,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        self.build().bytes
    }
}

/// A small but representative model header: strings, numbers, a vocabulary
/// and three tensors of three types.
fn model() -> Gguf {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .kv("llama.block_count", V::U32(1))
        .kv("llama.rope.freq_base", V::F32(10000.0))
        .kv(
            "tokenizer.ggml.tokens",
            V::Arr(8, vec![s("<s>"), s("</s>"), s("hello"), s("")]),
        )
        .kv("tokenizer.ggml.scores", V::Arr(6, vec![V::F32(0.0); 4]))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(1))
        .tensor("token_embd.weight", &[64, 4], GgmlType::Q8_0)
        .tensor("blk.0.attn_norm.weight", &[64], GgmlType::F32)
        .tensor("output.weight", &[256, 2], GgmlType::Q4_K)
}

// ---------------------------------------------------------------------------
// Helpers.

fn parse(bytes: &[u8]) -> Result<GgufFile, CheckpointError> {
    GgufFile::parse(Path::new(PATH), bytes, bytes.len() as u64)
}

fn parse_ok(bytes: &[u8]) -> GgufFile {
    parse(bytes).unwrap_or_else(|e| panic!("valid file rejected: {e}"))
}

fn parse_err(bytes: &[u8]) -> CheckpointError {
    match parse(bytes) {
        Ok(f) => panic!("hostile file accepted: {f:?}"),
        Err(e) => e,
    }
}

/// The message names the file and every one of `needles`.
fn assert_names(err: &CheckpointError, needles: &[&str]) {
    let msg = err.to_string();
    assert!(msg.contains(PATH), "{msg:?} does not name the file");
    for needle in needles {
        assert!(msg.contains(needle), "{msg:?} does not name {needle:?}");
    }
}

macro_rules! assert_kind {
    ($err:expr, $pat:pat) => {
        assert!(matches!($err.kind, $pat), "unexpected error: {:?}", $err.kind)
    };
    ($err:expr, $pat:pat if $cond:expr) => {
        assert!(
            matches!($err.kind, $pat if $cond),
            "unexpected error: {:?}",
            $err.kind
        )
    };
}

/// Offset of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> u64 {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("marker present") as u64
}

/// A file under the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!(
            "fathom-gguf-hostile-{}-{name}.gguf",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Everything a successful parse promises, whatever the input.
fn check_invariants(f: &GgufFile) {
    assert!(f.alignment.is_power_of_two());
    assert_eq!(f.data_offset % f.alignment, 0);
    let mut names = std::collections::HashSet::new();
    for t in &f.tensors {
        assert!(names.insert(t.name.as_str()), "duplicate {}", t.name);
        assert!(!t.dims.is_empty());
        assert_eq!(t.offset % f.alignment, 0);
        let product = |d: &[u64]| {
            if d.contains(&0) {
                Some(0)
            } else {
                d.iter().try_fold(1u64, |a, &x| a.checked_mul(x))
            }
        };
        let end = f
            .data_offset
            .checked_add(t.offset)
            .and_then(|b| b.checked_add(t.n_bytes))
            .expect("tensor end fits u64");
        assert!(
            end <= f.file_size,
            "{} ends at {end} > {}",
            t.name,
            f.file_size
        );
        assert_eq!(product(&t.dims), Some(t.n_elements));
        let rows = product(&t.dims[1..]).expect("row count fits u64");
        let n_bytes = t
            .ggml_type
            .row_bytes(t.dims[0])
            .and_then(|b| b.checked_mul(rows));
        assert_eq!(n_bytes.or(Some(0).filter(|_| rows == 0)), Some(t.n_bytes));
    }
}

// ---------------------------------------------------------------------------
// Well-formed files.

#[test]
fn every_metadata_value_type_round_trips() {
    let bytes = Gguf::new()
        .kv("u8", V::U8(200))
        .kv("i8", V::I8(-100))
        .kv("u16", V::U16(60000))
        .kv("i16", V::I16(-30000))
        .kv("u32", V::U32(4_000_000_000))
        .kv("i32", V::I32(-2_000_000_000))
        .kv("f32", V::F32(1.5e-5))
        .kv("bool.false", V::Bool(0))
        .kv("bool.true", V::Bool(1))
        .kv("string", s("héllo, wörld"))
        .kv("empty", s(""))
        .kv("array", V::Arr(0, vec![V::U8(1), V::U8(2)]))
        .kv("u64", V::U64(u64::MAX))
        .kv("i64", V::I64(i64::MIN))
        .kv("f64", V::F64(-0.25))
        .bytes();
    let f = parse_ok(&bytes);
    let expected = vec![
        ("u8", MetaValue::U8(200)),
        ("i8", MetaValue::I8(-100)),
        ("u16", MetaValue::U16(60000)),
        ("i16", MetaValue::I16(-30000)),
        ("u32", MetaValue::U32(4_000_000_000)),
        ("i32", MetaValue::I32(-2_000_000_000)),
        ("f32", MetaValue::F32(1.5e-5)),
        ("bool.false", MetaValue::Bool(false)),
        ("bool.true", MetaValue::Bool(true)),
        ("string", MetaValue::Str("héllo, wörld".into())),
        ("empty", MetaValue::Str(String::new())),
        (
            "array",
            MetaValue::Array(0, vec![MetaValue::U8(1), MetaValue::U8(2)]),
        ),
        ("u64", MetaValue::U64(u64::MAX)),
        ("i64", MetaValue::I64(i64::MIN)),
        ("f64", MetaValue::F64(-0.25)),
    ];
    let got: Vec<(&str, MetaValue)> = f
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    assert_eq!(got, expected);
    assert!(f.tensors.is_empty());
    assert_eq!(
        f.get("u32").and_then(MetaValue::as_u64),
        Some(4_000_000_000)
    );
    assert_eq!(f.get("i8").and_then(MetaValue::as_u64), None);
    assert_eq!(f.get("i8").and_then(MetaValue::as_f64), Some(-100.0));
    assert_eq!(
        f.get("string").and_then(MetaValue::as_str),
        Some("héllo, wörld")
    );
    assert_eq!(f.get("bool.true").and_then(MetaValue::as_bool), Some(true));
    assert!(f.get("missing").is_none());
}

#[test]
fn arrays_nest_and_hold_strings() {
    let nested = V::Arr(
        9,
        vec![
            V::Arr(5, vec![V::I32(1), V::I32(-2)]),
            V::Arr(5, vec![]),
            V::Arr(8, vec![s("x")]),
        ],
    );
    let bytes = Gguf::new()
        .kv("tokens", V::Arr(8, vec![s("<s>"), s(""), s("ĠHello")]))
        .kv("nested", nested)
        .kv("empty.strings", V::Arr(8, vec![]))
        .kv("flags", V::Arr(7, vec![V::Bool(1), V::Bool(0)]))
        .bytes();
    let f = parse_ok(&bytes);
    let tokens = f.get("tokens").and_then(MetaValue::as_array).unwrap();
    let tokens: Vec<&str> = tokens.iter().filter_map(MetaValue::as_str).collect();
    assert_eq!(tokens, ["<s>", "", "ĠHello"]);
    assert_eq!(
        f.get("nested"),
        Some(&MetaValue::Array(
            9,
            vec![
                MetaValue::Array(5, vec![MetaValue::I32(1), MetaValue::I32(-2)]),
                MetaValue::Array(5, vec![]),
                MetaValue::Array(8, vec![MetaValue::Str("x".into())]),
            ]
        ))
    );
    assert_eq!(f.get("empty.strings"), Some(&MetaValue::Array(8, vec![])));
    assert_eq!(
        f.get("flags"),
        Some(&MetaValue::Array(
            7,
            vec![MetaValue::Bool(true), MetaValue::Bool(false)]
        ))
    );
}

#[test]
fn arrays_nest_up_to_eight_deep_and_no_deeper() {
    let nest = |levels: usize| {
        let mut v = V::Arr(0, vec![V::U8(7)]);
        for _ in 1..levels {
            v = V::Arr(9, vec![v]);
        }
        v
    };
    parse_ok(&Gguf::new().kv("deep", nest(8)).bytes());
    let err = parse_err(&Gguf::new().kv("deep", nest(9)).bytes());
    assert_kind!(
        err,
        ErrorKind::TooLarge {
            value: 9,
            limit: 8,
            ..
        }
    );
    assert_names(
        &err,
        &["value of deep[0][0][0][0][0][0][0][0] array nesting depth"],
    );
}

#[test]
fn model_header_is_read_with_sizes_and_offsets() {
    let built = model().build();
    let f = parse_ok(&built.bytes);
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, built.data_offset);
    assert_eq!(f.file_size, built.bytes.len() as u64);
    assert_eq!(f.path, Path::new(PATH));
    assert_eq!(
        f.get("general.architecture").and_then(MetaValue::as_str),
        Some("llama")
    );
    // name, type, dims, offset, n_bytes, n_elements
    type Row<'a> = (&'a str, GgmlType, &'a [u64], u64, u64, u64);
    let got: Vec<Row> = f
        .tensors
        .iter()
        .map(|t| {
            let d: &[u64] = &t.dims;
            (
                t.name.as_str(),
                t.ggml_type,
                d,
                t.offset,
                t.n_bytes,
                t.n_elements,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "token_embd.weight",
                GgmlType::Q8_0,
                &[64u64, 4][..],
                0,
                2 * 34 * 4,
                256
            ),
            (
                "blk.0.attn_norm.weight",
                GgmlType::F32,
                &[64][..],
                288,
                256,
                64
            ),
            (
                "output.weight",
                GgmlType::Q4_K,
                &[256, 2][..],
                544,
                288,
                512
            ),
        ]
    );
    check_invariants(&f);
}

#[test]
fn versions_2_and_3_are_accepted() {
    for version in [2, 3] {
        let mut g = model();
        g.version = Some(version);
        assert_eq!(parse_ok(&g.bytes()).version, version);
    }
}

#[test]
fn other_versions_are_rejected() {
    // 1 had u32 counts; 0x0300_0000 is version 3 written big-endian.
    for version in [0, 1, 4, 0x0300_0000, u32::MAX] {
        let mut g = model();
        g.version = Some(version);
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::UnsupportedVersion { version: v } if v == version);
        assert_names(&err, &[&format!("version {version}")]);
    }
}

#[test]
fn bad_magic_is_rejected() {
    let mut bytes = model().bytes();
    bytes[..4].copy_from_slice(b"GGML");
    let err = parse_err(&bytes);
    assert_kind!(err, ErrorKind::BadMagic { found } if &found == b"GGML");
    assert_names(&err, &["GGUF"]);
}

#[test]
fn alignment_defaults_to_32() {
    let built = model().build();
    assert_ne!(built.header_end % 32, 0, "test needs padding to exercise");
    let f = parse_ok(&built.bytes);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, built.header_end.div_ceil(32) * 32);
}

#[test]
fn custom_alignment_places_data_and_tensors() {
    for align in [1u32, 8, 64, 4096] {
        let built = model().kv("general.alignment", V::U32(align)).build();
        let f = parse_ok(&built.bytes);
        assert_eq!(f.alignment, u64::from(align));
        assert_eq!(
            f.data_offset,
            built.header_end.div_ceil(align.into()) * u64::from(align)
        );
        for t in &f.tensors {
            assert_eq!(t.offset % u64::from(align), 0);
        }
        check_invariants(&f);
    }
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    for bad in [V::U32(0), V::U32(48), V::U32(3), V::U64(32), s("32")] {
        let err = parse_err(&model().kv("general.alignment", bad).bytes());
        assert_kind!(err, ErrorKind::InvalidValue { .. });
        assert_names(&err, &["metadata key general.alignment", "power of two"]);
    }
}

#[test]
fn open_matches_parse_and_names_the_file() {
    let tmp = TempFile::new("open");
    let bytes = model().bytes();
    std::fs::write(&tmp.0, &bytes).unwrap();
    let opened = GgufFile::open(&tmp.0).unwrap();
    let parsed = GgufFile::parse(&tmp.0, &bytes, bytes.len() as u64).unwrap();
    assert_eq!(opened.path, tmp.0);
    assert_eq!(opened.metadata, parsed.metadata);
    assert_eq!(opened.tensors, parsed.tensors);
    assert_eq!(
        (
            opened.version,
            opened.alignment,
            opened.data_offset,
            opened.file_size
        ),
        (
            parsed.version,
            parsed.alignment,
            parsed.data_offset,
            parsed.file_size
        )
    );

    // The same parser rejects the same way through `open`.
    for cut in [3, 40, 200, bytes.len() - 1] {
        let bad = &bytes[..cut];
        std::fs::write(&tmp.0, bad).unwrap();
        let opened = GgufFile::open(&tmp.0).unwrap_err();
        let parsed = GgufFile::parse(&tmp.0, bad, cut as u64).unwrap_err();
        assert_eq!(opened.to_string(), parsed.to_string());
        assert!(opened.to_string().contains(&tmp.0.display().to_string()));
    }
}

#[test]
fn open_of_a_missing_file_is_an_io_error_naming_it() {
    let path = Path::new("/nonexistent/fathom/model.gguf");
    let err = GgufFile::open(path).unwrap_err();
    assert_kind!(err, ErrorKind::Io(_));
    assert!(err.to_string().contains("/nonexistent/fathom/model.gguf"));
}

/// A sparse 8 GiB file opens by its header alone: the data is never read.
#[test]
fn open_reads_only_the_header_of_a_multi_gib_file() {
    const DATA: u64 = 8 << 30;
    let tmp = TempFile::new("sparse");
    let mut g = model().tensor("big.weight", &[1 << 30, 2], GgmlType::F32);
    g.data_len = Some(0);
    let built = g.build();
    let file = std::fs::File::create(&tmp.0).unwrap();
    std::io::Write::write_all(&mut &file, &built.bytes).unwrap();
    // The existing tensors end at 832; big.weight starts at 832 and is 8 GiB.
    file.set_len(built.data_offset + 832 + DATA).unwrap();
    drop(file);
    let start = std::time::Instant::now();
    let f = GgufFile::open(&tmp.0).unwrap();
    let big = f.tensors.iter().find(|t| t.name == "big.weight").unwrap();
    assert_eq!((big.offset, big.n_bytes), (832, DATA));
    assert_eq!(f.file_size, built.data_offset + 832 + DATA);
    check_invariants(&f);
    // Reading 8 GiB would take seconds; the header takes microseconds.
    assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
}

// ---------------------------------------------------------------------------
// Truncation and lengths past the file.

#[test]
fn every_truncated_prefix_is_rejected() {
    let built = model().build();
    let bytes = &built.bytes;
    for n in 0..bytes.len() {
        let prefix = &bytes[..n];
        let err = match catch_unwind(|| GgufFile::parse(Path::new(PATH), prefix, n as u64)) {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => panic!("prefix of {n} bytes accepted"),
            Err(_) => panic!("prefix of {n} bytes panicked"),
        };
        if (n as u64) < built.data_offset {
            // A count that the cut-short file could no longer hold is
            // caught before the read that would run off its end.
            assert_kind!(
                err,
                ErrorKind::Truncated { .. } | ErrorKind::TooLarge { .. }
            );
        } else {
            assert_kind!(err, ErrorKind::OutOfBounds { .. });
        }
        assert_names(&err, &[]);
        // Given the full file size, a prefix is enough exactly when it holds
        // the header.
        let with_size = GgufFile::parse(Path::new(PATH), prefix, bytes.len() as u64);
        assert_eq!(
            with_size.is_ok(),
            n as u64 >= built.header_end,
            "prefix {n}"
        );
    }
}

#[test]
fn truncation_names_field_offset_and_size() {
    let bytes = Gguf::new().kv("general.name", s("SmolLM2")).bytes();
    // Cut inside the value string, which starts at 24 + 8 + 12 + 4 + 8.
    let err = parse_err(&bytes[..60]);
    assert_kind!(
        err,
        ErrorKind::Truncated {
            offset: 56,
            needed: 63,
            file_size: 60,
            ..
        }
    );
    assert_names(
        &err,
        &["value of general.name", "offset 56", "needs 63 bytes"],
    );
}

#[test]
fn a_count_the_rest_of_the_file_cannot_hold_explains_why() {
    let bytes = model().bytes();
    let err = parse_err(&bytes[..30]);
    assert_kind!(
        err,
        ErrorKind::TooLarge {
            value: 6,
            limit: 0,
            ..
        }
    );
    assert_names(
        &err,
        &["metadata_kv_count", "13 bytes each", "6 bytes left"],
    );
}

#[test]
fn a_key_running_past_the_file_is_truncated() {
    let mut bytes = model().bytes();
    // The first key's length, right after the 24-byte preamble.
    bytes[24..32].copy_from_slice(&1_000_000u64.to_le_bytes());
    let err = parse_err(&bytes);
    assert_kind!(
        err,
        ErrorKind::Truncated {
            offset: 32,
            needed: 1_000_032,
            ..
        }
    );
    assert_names(&err, &["metadata key #0"]);
}

#[test]
fn a_tensor_name_running_past_the_file_is_truncated() {
    let g = Gguf::new().tensor_raw(b"", &[4], 0, None);
    let mut bytes = g.bytes();
    let len = bytes.len() as u64;
    bytes[24..32].copy_from_slice(&len.to_le_bytes());
    let err = parse_err(&bytes);
    assert_kind!(err, ErrorKind::Truncated { .. });
    assert_names(&err, &["tensor #0 name"]);
}

#[test]
fn counts_beyond_what_the_file_could_hold_are_too_large() {
    for (kv, tensors, field) in [
        (Some(u64::MAX), None, "metadata_kv_count"),
        (Some(1 << 40), None, "metadata_kv_count"),
        (None, Some(u64::MAX), "tensor_count"),
        (None, Some(1000), "tensor_count"),
    ] {
        let mut g = model();
        g.kv_count = kv;
        g.tensor_count = tensors;
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::TooLarge { .. });
        assert_names(&err, &[field]);
    }
}

#[test]
fn string_lengths_over_the_bound_are_too_large() {
    for len in [(1u64 << 30) + 1, 1 << 40, u64::MAX] {
        let g = Gguf::new().kv("general.name", V::Raw(8, len.to_le_bytes().to_vec()));
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::TooLarge { value, limit: 1_073_741_824, .. } if value == len);
        assert_names(&err, &["value of general.name length"]);
    }
    // Within the bound but past the file: truncated, nothing allocated.
    let g = Gguf::new().kv(
        "general.name",
        V::Raw(8, (1u64 << 30).to_le_bytes().to_vec()),
    );
    let err = parse_err(&g.bytes());
    assert_kind!(err, ErrorKind::Truncated { .. });
    assert_names(&err, &["value of general.name"]);
}

#[test]
fn array_counts_beyond_the_file_are_too_large() {
    for (elem_ty, count) in [(10u32, 1u64 << 60), (0, u64::MAX), (8, 1000), (9, 100)] {
        let mut raw = elem_ty.to_le_bytes().to_vec();
        raw.extend(count.to_le_bytes());
        raw.extend([0u8; 64]);
        let err = parse_err(
            &Gguf::new()
                .kv("tokenizer.ggml.tokens", V::Raw(9, raw))
                .bytes(),
        );
        assert_kind!(err, ErrorKind::TooLarge { value, .. } if value == count);
        assert_names(&err, &["value of tokenizer.ggml.tokens count"]);
    }
}

// ---------------------------------------------------------------------------
// Sizes, offsets and names.

#[test]
fn dim_products_that_overflow_are_rejected() {
    for dims in [
        vec![u64::MAX / 2, 4],
        vec![1 << 32, 1 << 32, 1 << 32],
        vec![4, u64::MAX],
        vec![1 << 62, 4],
    ] {
        let mut g = Gguf::new().tensor("big.weight", &dims, GgmlType::F32);
        g.data_len = Some(64);
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::Overflow { .. });
        assert_names(&err, &["tensor big.weight dims"]);
    }
    // Bytes overflow although the element count fits.
    let mut g = Gguf::new().tensor("q.weight", &[u64::MAX / 32 * 32, 1], GgmlType::Q8_0);
    g.data_len = Some(64);
    let err = parse_err(&g.bytes());
    assert_kind!(err, ErrorKind::Overflow { .. });
    assert_names(&err, &["tensor q.weight dims", "byte size"]);
}

#[test]
fn an_empty_tensor_with_huge_dims_is_empty() {
    let mut g = Gguf::new().tensor("empty", &[u64::MAX, u64::MAX, 0], GgmlType::F32);
    g.data_len = Some(0);
    let f = parse_ok(&g.bytes());
    assert_eq!((f.tensors[0].n_elements, f.tensors[0].n_bytes), (0, 0));
}

#[test]
fn offsets_outside_the_file_are_out_of_bounds() {
    // 256 bytes of F32 at 32, with only 256 bytes of data.
    let mut g = Gguf::new().tensor_at("w", &[64], 0, 32);
    g.data_len = Some(256);
    let err = parse_err(&g.bytes());
    assert_kind!(
        err,
        ErrorKind::OutOfBounds {
            begin: 32,
            end: 288,
            available: 256,
            ..
        }
    );
    assert_names(&err, &["tensor w", "[32, 288)"]);

    // Far past the end.
    let mut g = Gguf::new().tensor_at("w", &[64], 0, 1 << 40);
    g.data_len = Some(256);
    let err = parse_err(&g.bytes());
    assert_kind!(err, ErrorKind::OutOfBounds { .. });

    // Ending exactly at the end of the file is fine.
    let mut g = Gguf::new().tensor_at("w", &[64], 0, 0);
    g.data_len = Some(256);
    parse_ok(&g.bytes());
}

/// Found by cargo-fuzz: an empty tensor in a file that ends before the
/// padding would sit at `data_offset > file_size`, past the end of a map.
#[test]
fn tensors_need_the_data_section_inside_the_file() {
    let mut g = Gguf::new().tensor("empty", &[0], GgmlType::F32);
    g.data_len = Some(0);
    let built = g.build();
    assert!(built.data_offset > built.header_end, "test needs padding");
    let err = parse_err(&built.bytes[..built.header_end as usize]);
    assert_kind!(err, ErrorKind::Truncated { needed, .. } if needed == built.data_offset);
    assert_names(&err, &["padding before the data section"]);
    parse_ok(&built.bytes);

    // Without tensors there is nothing to point past the end.
    let built = Gguf::new().kv("general.name", s("vocab only")).build();
    assert!(built.data_offset > built.header_end, "test needs padding");
    let f = parse_ok(&built.bytes[..built.header_end as usize]);
    assert_eq!(f.data_offset, built.data_offset);
}

#[test]
fn offset_plus_size_overflowing_is_rejected() {
    let mut g = Gguf::new().tensor_at("w", &[64], 0, u64::MAX / 32 * 32);
    g.data_len = Some(256);
    let err = parse_err(&g.bytes());
    assert_kind!(err, ErrorKind::Overflow { .. });
    assert_names(&err, &["tensor w offset"]);
}

#[test]
fn duplicate_tensor_names_are_rejected() {
    let g = model().tensor("token_embd.weight", &[64], GgmlType::F32);
    let err = parse_err(&g.bytes());
    assert_kind!(err, ErrorKind::DuplicateTensor { ref name } if name == "token_embd.weight");
    assert_names(&err, &["token_embd.weight"]);
}

#[test]
fn duplicate_metadata_keys_are_rejected() {
    let g = model().kv("llama.block_count", V::U32(2));
    let err = parse_err(&g.bytes());
    assert_kind!(err, ErrorKind::DuplicateKey { ref key } if key == "llama.block_count");
    assert_names(&err, &["llama.block_count"]);
}

#[test]
fn misaligned_offsets_are_rejected() {
    let mut g = Gguf::new().tensor_at("w", &[4], 0, 16);
    g.data_len = Some(64);
    let err = parse_err(&g.bytes());
    assert_kind!(
        err,
        ErrorKind::Misaligned {
            offset: 16,
            alignment: 32,
            ..
        }
    );
    assert_names(&err, &["tensor w", "offset 16", "alignment 32"]);

    // The same offset is aligned under a smaller alignment.
    let mut g = Gguf::new()
        .kv("general.alignment", V::U32(16))
        .tensor_at("w", &[4], 0, 16);
    g.data_len = Some(64);
    parse_ok(&g.bytes());
}

#[test]
fn invalid_utf8_is_rejected_naming_field_and_offset() {
    let bad = b"ok\xffbad";
    let cases: Vec<(Gguf, &str)> = vec![
        (
            Gguf::new().kv("fine", V::U8(1)).kv_raw_key(bad, V::U8(1)),
            "metadata key #1",
        ),
        (
            Gguf::new().kv("general.name", V::Str(bad.to_vec())),
            "value of general.name",
        ),
        (
            Gguf::new().kv(
                "tokenizer.ggml.tokens",
                V::Arr(8, vec![s("a"), s("b"), V::Str(bad.to_vec())]),
            ),
            "value of tokenizer.ggml.tokens[2]",
        ),
        (
            Gguf::new()
                .tensor("fine", &[4], GgmlType::F32)
                .tensor_raw(bad, &[4], 0, None),
            "tensor #1 name",
        ),
    ];
    for (g, field) in cases {
        let bytes = g.bytes();
        let at = find(&bytes, bad) + 2;
        let err = parse_err(&bytes);
        assert_kind!(err, ErrorKind::InvalidUtf8 { offset, .. } if offset == at);
        assert_names(&err, &[field, &format!("offset {at}")]);
    }
}

#[test]
fn unknown_value_types_are_rejected_listing_the_valid_ones() {
    let err = parse_err(&Gguf::new().kv("x", V::Raw(13, vec![0; 16])).bytes());
    assert_kind!(err, ErrorKind::InvalidValue { ref value, .. } if value == "13");
    assert_names(&err, &["metadata key x value type", "12 (f64)"]);

    let mut raw = 99u32.to_le_bytes().to_vec();
    raw.extend(1u64.to_le_bytes());
    let err = parse_err(&Gguf::new().kv("x", V::Raw(9, raw)).bytes());
    assert_kind!(err, ErrorKind::InvalidValue { ref value, .. } if value == "99");
    assert_names(&err, &["value of x element type", "0 (u8)"]);
}

#[test]
fn unknown_ggml_types_are_rejected_listing_the_valid_ones() {
    for id in [4u32, 31, 36, 1000, u32::MAX] {
        let mut g = Gguf::new().tensor_at("w", &[32], id, 0);
        g.data_len = Some(1024);
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::InvalidValue { ref value, .. } if *value == id.to_string());
        assert_names(&err, &["tensor w type", "12 (Q4_K)", "39 (MXFP4)"]);
    }
}

#[test]
fn row_lengths_must_be_whole_blocks() {
    for (dims, ty) in [
        (vec![33, 2], GgmlType::Q4_0),
        (vec![128], GgmlType::Q4_K),
        (vec![16, 16], GgmlType::Q8_0),
    ] {
        let mut g = Gguf::new().tensor("w", &dims, ty);
        g.data_len = Some(4096);
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::InvalidValue { .. });
        assert_names(
            &err,
            &["tensor w dims", &format!("{} block size", ty.name())],
        );
    }
}

#[test]
fn n_dims_must_be_1_to_8() {
    for n in [0usize, 9, 1000] {
        let mut g = Gguf::new().tensor("w", &vec![1; n], GgmlType::F32);
        g.data_len = Some(64);
        let err = parse_err(&g.bytes());
        assert_kind!(err, ErrorKind::InvalidValue { ref value, .. } if *value == n.to_string());
        assert_names(&err, &["tensor w n_dims", "1 to 8"]);
    }
    let mut g = Gguf::new().tensor("w", &[1; 8], GgmlType::F32);
    g.data_len = Some(64);
    parse_ok(&g.bytes());
}

#[test]
fn bools_must_be_0_or_1() {
    let err = parse_err(&Gguf::new().kv("flag", V::Bool(2)).bytes());
    assert_kind!(err, ErrorKind::InvalidValue { ref value, .. } if value == "2");
    assert_names(&err, &["value of flag", "0 or 1"]);
    let err = parse_err(
        &Gguf::new()
            .kv("flags", V::Arr(7, vec![V::Bool(1), V::Bool(255)]))
            .bytes(),
    );
    assert_names(&err, &["value of flags[1]"]);
}

// ---------------------------------------------------------------------------
// Mutation fuzzing, bounded and deterministic.

const EXTREMES: [u64; 10] = [
    0,
    1,
    31,
    32,
    u64::MAX,
    u64::MAX / 2,
    1 << 63,
    1 << 32,
    (1 << 30) + 1,
    0xFFFF_FFFF,
];

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(b.len());
        match rng.below(7) {
            0 => {
                if let Some(x) = b.get_mut(at) {
                    *x ^= 1 << rng.below(8);
                }
            }
            1 => {
                if let Some(x) = b.get_mut(at) {
                    *x = rng.next_u64() as u8;
                }
            }
            2 => {
                let n = 1 + rng.below(16);
                let junk: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                b.splice(at..at, junk);
            }
            3 => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                b.drain(at..end);
            }
            4 => b.truncate(at),
            5 => {
                // An extreme u64 over a length, count, dim or offset.
                let v = EXTREMES[rng.below(EXTREMES.len())].to_le_bytes();
                let end = (at + 8).min(b.len());
                b[at..end].copy_from_slice(&v[..end - at]);
            }
            _ => {
                // An extreme u32 over a type id, version or n_dims.
                let v = (EXTREMES[rng.below(EXTREMES.len())] as u32).to_le_bytes();
                let end = (at + 4).min(b.len());
                b[at..end].copy_from_slice(&v[..end - at]);
            }
        }
    }
    b
}

#[test]
fn seeded_mutations_never_panic() {
    let bases = [
        model().bytes(),
        model().kv("general.alignment", V::U32(64)).bytes(),
        Gguf::new()
            .kv("nested", V::Arr(9, vec![V::Arr(8, vec![s("a"), s("b")])]))
            .tensor("w", &[32, 2], GgmlType::Q4_1)
            .bytes(),
    ];
    let mut rng = Rng::xorshift64(0x9E37_79B9_7F4A_7C15);
    let mut accepted = 0;
    for i in 0..6000 {
        let base = &bases[i % bases.len()];
        let bytes = mutate(&mut rng, base);
        // Sometimes claim a larger file than the prefix holds.
        let file_size = match rng.below(4) {
            0 => bytes.len() as u64 + rng.next_u64() % 4096,
            _ => bytes.len() as u64,
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            GgufFile::parse(Path::new(PATH), &bytes, file_size)
        }));
        match result {
            Err(_) => panic!("mutation {i} panicked on {bytes:?}"),
            Ok(Ok(f)) => {
                accepted += 1;
                assert_eq!(f.file_size, file_size);
                check_invariants(&f);
            }
            Ok(Err(e)) => assert!(e.to_string().contains(PATH)),
        }
    }
    // Some mutations (a flipped data byte, say) leave the file valid; if
    // none did, the mutator would be testing only the first few bytes.
    assert!(accepted > 0);
}

// ---------------------------------------------------------------------------
// The real model.

/// sum(t.n_bytes for t in gguf.GGUFReader(path).tensors) with the Python
/// `gguf` package 0.19.0 (`pip install gguf`), computed independently of
/// this crate. The file is 98,362,432 bytes and its data section starts at
/// 1,785,664, so the tensors fill the data section without a gap.
const SMOLLM2_TENSOR_BYTES: u64 = 96_576_768;

#[test]
fn smollm2_header() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
    ));
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-model.sh to download the test model",
        path.display()
    );
    let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.version, 3);
    assert_eq!(f.file_size, 98_362_432);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, 1_785_664);
    assert_eq!(f.metadata.len(), 33);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(
        f.get("general.architecture").and_then(MetaValue::as_str),
        Some("llama")
    );
    assert_eq!(f.get("llama.block_count"), Some(&MetaValue::U32(30)));
    assert_eq!(
        f.get("tokenizer.ggml.pre").and_then(MetaValue::as_str),
        Some("smollm")
    );
    let tokens = f
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1].as_str(), Some("<|im_start|>"));

    // Figures reported by gguf-py for the same tensors (shape in ggml order,
    // offset relative to the data section).
    for (name, ty, dims, n_bytes, offset) in [
        (
            "token_embd.weight",
            GgmlType::Q8_0,
            &[576u64, 49152][..],
            30_081_024,
            0,
        ),
        (
            "blk.0.attn_k.weight",
            GgmlType::Q4_1,
            &[576, 192][..],
            69_120,
            31_744_512,
        ),
        (
            "blk.29.ffn_up.weight",
            GgmlType::Q4_1,
            &[576, 1536][..],
            552_960,
            79_951_104,
        ),
        (
            "output_norm.weight",
            GgmlType::F32,
            &[576][..],
            2_304,
            96_574_464,
        ),
    ] {
        let t = f.tensors.iter().find(|t| t.name == name).unwrap();
        assert_eq!(
            (t.ggml_type, &t.dims[..], t.n_bytes, t.offset),
            (ty, dims, n_bytes, offset),
            "{name}"
        );
    }

    // The data layout: in offset order, each tensor starts where the
    // previous one ended, rounded up to the alignment, and the last one
    // ends exactly at the end of the file.
    let mut by_offset: Vec<_> = f.tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    let mut end = 0u64;
    for t in &by_offset {
        assert_eq!(
            t.offset,
            end.div_ceil(f.alignment) * f.alignment,
            "{}",
            t.name
        );
        end = t.offset + t.n_bytes;
    }
    assert_eq!(f.data_offset + end, f.file_size);
    let total: u64 = f.tensors.iter().map(|t| t.n_bytes).sum();
    assert_eq!(total, SMOLLM2_TENSOR_BYTES);
    check_invariants(&f);
}
