//! safetensors header reader.
//!
//! The header is JSON written by arbitrary tools, so it is first parsed into
//! raw entry lists that keep every key in file order (`serde_json::Map`
//! would silently keep only the last of two equal keys, hiding a duplicate
//! tensor), and only then validated field by field into typed errors.
//!
//! Headers hold up to tens of thousands of tensors, and a generic JSON tree
//! per tensor made parsing allocation-bound, so a fast path first reads the
//! usual shape of a tensor entry straight into typed fields. A header it
//! does not accept is parsed again the generic way, which alone reports
//! JSON and field-type errors; both feed the same checks in the same order,
//! so either way the result, or the first error, is the same.

use std::collections::{btree_map, BTreeMap, HashSet};
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{
    self, Deserialize, DeserializeOwned, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::Value;

use crate::{CheckpointError, ErrorKind};

/// Bound on the JSON header length. Real headers are at most a few MB (tens
/// of thousands of tensors); the bound keeps a hostile length field from
/// becoming a huge allocation or read.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The little-endian u64 header length that precedes the JSON.
const LEN_FIELD_BYTES: u64 = 8;

/// Longest excerpt of a hostile name or value quoted in an error message,
/// so a multi-megabyte string cannot turn into a multi-megabyte message.
const MAX_QUOTED_CHARS: usize = 120;

/// A safetensors dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StDtype {
    Bool,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl StDtype {
    /// Every dtype, so parsing and the "expected one of" list in error
    /// messages cannot drift apart.
    pub const ALL: [StDtype; 15] = [
        StDtype::Bool,
        StDtype::U8,
        StDtype::I8,
        StDtype::F8E5M2,
        StDtype::F8E4M3,
        StDtype::I16,
        StDtype::U16,
        StDtype::F16,
        StDtype::BF16,
        StDtype::I32,
        StDtype::U32,
        StDtype::F32,
        StDtype::F64,
        StDtype::I64,
        StDtype::U64,
    ];

    /// Parses the header spelling ("F16", "BF16", ...).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == s)
    }

    /// The header spelling.
    pub fn name(self) -> &'static str {
        match self {
            StDtype::Bool => "BOOL",
            StDtype::U8 => "U8",
            StDtype::I8 => "I8",
            StDtype::F8E5M2 => "F8_E5M2",
            StDtype::F8E4M3 => "F8_E4M3",
            StDtype::I16 => "I16",
            StDtype::U16 => "U16",
            StDtype::F16 => "F16",
            StDtype::BF16 => "BF16",
            StDtype::I32 => "I32",
            StDtype::U32 => "U32",
            StDtype::F32 => "F32",
            StDtype::F64 => "F64",
            StDtype::I64 => "I64",
            StDtype::U64 => "U64",
        }
    }

    pub fn size_bytes(self) -> u64 {
        match self {
            StDtype::Bool | StDtype::U8 | StDtype::I8 | StDtype::F8E5M2 | StDtype::F8E4M3 => 1,
            StDtype::I16 | StDtype::U16 | StDtype::F16 | StDtype::BF16 => 2,
            StDtype::I32 | StDtype::U32 | StDtype::F32 => 4,
            StDtype::F64 | StDtype::I64 | StDtype::U64 => 8,
        }
    }
}

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct StTensor {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<u64>,
    /// Absolute byte offsets of the data in its file, `[begin, end)`.
    pub begin: u64,
    pub end: u64,
    /// Index of the file in [`crate::HfCheckpoint::files`] (0 for a single file).
    pub file: usize,
}

impl StTensor {
    /// Saturating because the fields are public: a hand-built value with
    /// `end < begin` reads as empty rather than panicking.
    pub fn n_bytes(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }
}

/// The header of one safetensors file.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    pub file_size: u64,
    pub header_len: u64,
    pub metadata: BTreeMap<String, String>,
    /// Sorted by data offset: the format allows any order in the JSON, and
    /// offset order is what overlap checks and sequential reads want.
    pub tensors: Vec<StTensor>,
}

impl SafetensorsFile {
    /// Reads the header of the safetensors file at `path` (only the first
    /// 8 + N bytes are read).
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let io = |e| CheckpointError::io(path, e);
        let mut file = crate::open_regular(path)?;
        let file_size = file.metadata().map_err(io)?.len();
        let mut prefix = Vec::new();
        (&mut file)
            .take(LEN_FIELD_BYTES)
            .read_to_end(&mut prefix)
            .map_err(io)?;
        // Validated here so the allocation below is bounded by the limit and
        // by the file's real size; `parse` repeats the same check.
        let header_len = header_len(path, &prefix, file_size)?;
        prefix
            .try_reserve_exact(usize::try_from(header_len).unwrap_or(usize::MAX))
            .map_err(|e| CheckpointError::io(path, std::io::Error::other(e)))?;
        file.take(header_len).read_to_end(&mut prefix).map_err(io)?;
        // A file that shrank since `metadata` shows up in `parse` as a
        // truncated header.
        Self::parse(path, &prefix, file_size)
    }

    /// Parses from the bytes of a file prefix holding at least the header;
    /// `file_size` bounds the data offsets. Used by fuzzing.
    pub fn parse(path: &Path, bytes: &[u8], file_size: u64) -> Result<Self, CheckpointError> {
        let available = file_size.min(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        let header_len = header_len(path, bytes, available)?;
        let data_start = LEN_FIELD_BYTES.saturating_add(header_len);
        let header = usize::try_from(data_start)
            .ok()
            .and_then(|end| bytes.get(LEN_FIELD_BYTES as usize..end))
            .ok_or_else(|| truncated(path, "header", LEN_FIELD_BYTES, data_start, available))?;
        let text = std::str::from_utf8(header).map_err(|e| {
            let offset = u64::try_from(e.valid_up_to())
                .unwrap_or(u64::MAX)
                .saturating_add(LEN_FIELD_BYTES);
            CheckpointError::new(
                path,
                ErrorKind::InvalidUtf8 {
                    field: "header".into(),
                    offset,
                },
            )
        })?;
        let entries = match typed_entries(text) {
            Some(entries) => entries,
            None => raw_entries(path, text)?,
        };

        // Found before the loop so the loop can move each name into its
        // tensor; the loop still reports the repeat at its position, after
        // any error of an earlier entry.
        let mut names = HashSet::with_capacity(entries.len());
        let repeat = entries.iter().position(|(name, entry)| {
            !matches!(entry, Entry::Metadata(_)) && !names.insert(name.as_str())
        });

        let data_len = file_size.saturating_sub(data_start);
        let mut metadata = None;
        let mut tensors = Vec::with_capacity(entries.len());
        for (i, (name, entry)) in entries.into_iter().enumerate() {
            let fields = match entry {
                Entry::Metadata(value) => {
                    if metadata.is_some() {
                        return Err(CheckpointError::new(
                            path,
                            ErrorKind::DuplicateKey { key: name },
                        ));
                    }
                    metadata = Some(parse_metadata(path, value)?);
                    continue;
                }
                _ if repeat == Some(i) => {
                    return Err(CheckpointError::new(
                        path,
                        ErrorKind::DuplicateTensor { name },
                    ))
                }
                Entry::Typed(fields) => fields,
                Entry::Raw(value) => tensor_fields(path, &name, value)?,
            };
            tensors.push(check_tensor(path, name, fields, data_start, data_len)?);
        }

        tensors.sort_by_key(|t| (t.begin, t.end));
        check_overlaps(path, &tensors, data_start)?;

        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            file_size,
            header_len,
            metadata: metadata.unwrap_or_default(),
            tensors,
        })
    }
}

/// Decodes and bounds the header length; `bytes` starts at the beginning of
/// the file and `available` is how many bytes of the file exist.
fn header_len(path: &Path, bytes: &[u8], available: u64) -> Result<u64, CheckpointError> {
    let Some(field) = bytes
        .first_chunk::<8>()
        .filter(|_| available >= LEN_FIELD_BYTES)
    else {
        return Err(truncated(
            path,
            "header length",
            0,
            LEN_FIELD_BYTES,
            available,
        ));
    };
    let len = u64::from_le_bytes(*field);
    if len > MAX_HEADER_LEN {
        return Err(too_large(path, "header length", len, MAX_HEADER_LEN));
    }
    let needed = LEN_FIELD_BYTES.saturating_add(len);
    if needed > available {
        return Err(truncated(
            path,
            "header",
            LEN_FIELD_BYTES,
            needed,
            available,
        ));
    }
    Ok(len)
}

fn parse_metadata(
    path: &Path,
    value: RawJson<Value>,
) -> Result<BTreeMap<String, String>, CheckpointError> {
    let entries = match value {
        RawJson::Object(entries) => entries,
        RawJson::Other(kind) => {
            return Err(invalid(
                path,
                "__metadata__",
                kind,
                "an object of string values",
            ))
        }
    };
    let mut metadata = BTreeMap::new();
    for (key, value) in entries {
        let Value::String(text) = value else {
            return Err(invalid(
                path,
                format!("__metadata__ {}", clip(&key)),
                show(&value),
                "a string",
            ));
        };
        match metadata.entry(key) {
            btree_map::Entry::Vacant(slot) => {
                slot.insert(text);
            }
            btree_map::Entry::Occupied(slot) => {
                return Err(CheckpointError::new(
                    path,
                    ErrorKind::DuplicateKey {
                        key: slot.key().clone(),
                    },
                ))
            }
        }
    }
    Ok(metadata)
}

/// The three fields of a tensor entry, typed but not yet checked against
/// each other or the file.
struct Fields {
    dtype: StDtype,
    shape: Vec<u64>,
    offsets: [u64; 2],
}

/// Extracts the fields of a tensor entry parsed as generic JSON, naming the
/// first field that is missing, repeated or of the wrong type.
fn tensor_fields(
    path: &Path,
    name: &str,
    value: RawJson<Value>,
) -> Result<Fields, CheckpointError> {
    let label = format!("tensor {}", clip(name));
    let fields = match value {
        RawJson::Object(fields) => fields,
        RawJson::Other(kind) => {
            return Err(invalid(
                path,
                label,
                kind,
                "an object with dtype, shape and data_offsets",
            ))
        }
    };
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    for (key, value) in fields {
        let slot = match key.as_str() {
            "dtype" => &mut dtype,
            "shape" => &mut shape,
            "data_offsets" => &mut offsets,
            // Unknown keys are tolerated as the reference reader does.
            _ => continue,
        };
        if slot.replace(value).is_some() {
            return Err(invalid(
                path,
                format!("{label} {key}"),
                "given twice",
                "exactly one value",
            ));
        }
    }

    let field = |key: &str| format!("{label} {key}");
    let dtype = match dtype {
        Some(Value::String(text)) => StDtype::parse(&text).ok_or_else(|| {
            invalid(
                path,
                field("dtype"),
                show(&Value::String(text)),
                dtype_list(),
            )
        })?,
        Some(other) => return Err(invalid(path, field("dtype"), show(&other), dtype_list())),
        None => return Err(invalid(path, field("dtype"), "missing", dtype_list())),
    };

    const SHAPE: &str = "an array of non-negative integers";
    let shape = match shape {
        Some(Value::Array(dims)) => dims
            .iter()
            .enumerate()
            .map(|(i, dim)| {
                dim.as_u64().ok_or_else(|| {
                    invalid(
                        path,
                        field(&format!("shape[{i}]")),
                        show(dim),
                        "a non-negative integer",
                    )
                })
            })
            .collect::<Result<Vec<u64>, _>>()?,
        Some(other) => return Err(invalid(path, field("shape"), show(&other), SHAPE)),
        None => return Err(invalid(path, field("shape"), "missing", SHAPE)),
    };

    const OFFSETS: &str = "[begin, end] with two non-negative integers";
    let (begin, end) = match offsets {
        Some(Value::Array(pair)) => match pair.as_slice() {
            [b, e] => match (b.as_u64(), e.as_u64()) {
                (Some(b), Some(e)) => (b, e),
                _ => {
                    return Err(invalid(
                        path,
                        field("data_offsets"),
                        show(&Value::Array(pair)),
                        OFFSETS,
                    ))
                }
            },
            _ => {
                return Err(invalid(
                    path,
                    field("data_offsets"),
                    show(&Value::Array(pair)),
                    OFFSETS,
                ))
            }
        },
        Some(other) => return Err(invalid(path, field("data_offsets"), show(&other), OFFSETS)),
        None => return Err(invalid(path, field("data_offsets"), "missing", OFFSETS)),
    };
    Ok(Fields {
        dtype,
        shape,
        offsets: [begin, end],
    })
}

/// Checks a tensor's fields against each other and the data section
/// (`data_start` is its absolute offset, `data_len` its size) and builds
/// the tensor.
fn check_tensor(
    path: &Path,
    name: String,
    fields: Fields,
    data_start: u64,
    data_len: u64,
) -> Result<StTensor, CheckpointError> {
    let Fields {
        dtype,
        shape,
        offsets: [begin, end],
    } = fields;
    // Only called on error, so a valid tensor allocates no label.
    let field = |key: &str| format!("tensor {} {key}", clip(&name));

    // A zero dimension makes the tensor empty even when the other
    // dimensions alone would overflow.
    let numel = if shape.contains(&0) {
        Some(0)
    } else {
        shape
            .iter()
            .try_fold(1u64, |acc, &dim| acc.checked_mul(dim))
    };
    let Some(numel) = numel else {
        return Err(overflow(
            path,
            field("shape"),
            format!(
                "the element count of shape {} exceeds u64",
                clip(&format!("{shape:?}"))
            ),
        ));
    };
    let Some(expected_bytes) = numel.checked_mul(dtype.size_bytes()) else {
        return Err(overflow(
            path,
            field("shape"),
            format!(
                "{numel} elements of {} ({} bytes each) exceed u64 bytes",
                dtype.name(),
                dtype.size_bytes()
            ),
        ));
    };

    if end < begin {
        return Err(invalid(
            path,
            field("data_offsets"),
            format!("[{begin}, {end}]"),
            "begin <= end",
        ));
    }
    let n_bytes = end - begin;
    if n_bytes != expected_bytes {
        return Err(invalid(
            path,
            field("data_offsets"),
            format!("[{begin}, {end}] ({n_bytes} bytes)"),
            format!(
                "{expected_bytes} bytes for {} shape {}",
                dtype.name(),
                clip(&format!("{shape:?}"))
            ),
        ));
    }
    if end > data_len {
        return Err(CheckpointError::new(
            path,
            ErrorKind::OutOfBounds {
                tensor: clip(&name),
                begin,
                end,
                available: data_len,
            },
        ));
    }

    Ok(StTensor {
        name,
        dtype,
        shape,
        // Cannot saturate: end <= data_len = file_size - data_start.
        begin: data_start.saturating_add(begin),
        end: data_start.saturating_add(end),
        file: 0,
    })
}

/// Rejects tensors sharing bytes; `tensors` is sorted by `(begin, end)`.
/// Empty tensors own no bytes, so they overlap nothing.
fn check_overlaps(
    path: &Path,
    tensors: &[StTensor],
    data_start: u64,
) -> Result<(), CheckpointError> {
    let mut furthest: Option<&StTensor> = None;
    for tensor in tensors.iter().filter(|t| t.begin < t.end) {
        if let Some(prev) = furthest {
            if tensor.begin < prev.end {
                let rel = |t: &StTensor| {
                    format!(
                        "[{}, {})",
                        t.begin.saturating_sub(data_start),
                        t.end.saturating_sub(data_start)
                    )
                };
                return Err(invalid(
                    path,
                    format!("tensor {} data_offsets", clip(&tensor.name)),
                    rel(tensor),
                    format!(
                        "a range not overlapping tensor {} {}",
                        clip(&prev.name),
                        rel(prev)
                    ),
                ));
            }
        }
        match furthest {
            Some(prev) if prev.end >= tensor.end => {}
            _ => furthest = Some(tensor),
        }
    }
    Ok(())
}

/// The key of the optional string-to-string metadata entry.
const METADATA: &str = "__metadata__";

/// One top-level entry of the header, in file order.
enum Entry {
    /// The `__metadata__` entry, validated by [`parse_metadata`].
    Metadata(RawJson<Value>),
    /// A tensor entry typed while parsing, by [`typed_entries`].
    Typed(Fields),
    /// A tensor entry from [`raw_entries`], typed by [`tensor_fields`].
    Raw(RawJson<Value>),
}

/// The fast path: parses the header straight into typed tensor entries,
/// with no `serde_json::Value` tree per tensor (a header holds up to tens of
/// thousands). It accepts only tensor entries as writers produce them: an
/// object with exactly the keys `dtype` (a known dtype), `shape`
/// (non-negative integers) and `data_offsets` (two non-negative integers),
/// each once and unescaped. Anything else, JSON syntax errors included,
/// gives `None`, and [`raw_entries`] parses the header again so the checks
/// report exactly what is wrong; on headers this accepts, both give the
/// same fields.
fn typed_entries(text: &str) -> Option<Vec<(String, Entry)>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let TypedHeader(entries) = TypedHeader::deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    Some(entries)
}

/// The fallback: every entry as generic JSON, checked field by field later.
fn raw_entries(path: &Path, text: &str) -> Result<Vec<(String, Entry)>, CheckpointError> {
    match parse_raw::<RawJson<Value>>(path, "header", text)? {
        RawJson::Object(entries) => Ok(entries
            .into_iter()
            .map(|(name, value)| {
                let entry = if name == METADATA {
                    Entry::Metadata(value)
                } else {
                    Entry::Raw(value)
                };
                (name, entry)
            })
            .collect()),
        RawJson::Other(kind) => Err(invalid(
            path,
            "header",
            kind,
            "a JSON object mapping tensor names to {dtype, shape, data_offsets}",
        )),
    }
}

/// The header as [`typed_entries`] reads it.
struct TypedHeader(Vec<(String, Entry)>);

impl<'de> Deserialize<'de> for TypedHeader {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = TypedHeader;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a safetensors header object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    let entry = if name == METADATA {
                        Entry::Metadata(map.next_value()?)
                    } else {
                        Entry::Typed(map.next_value()?)
                    };
                    entries.push((name, entry));
                }
                Ok(TypedHeader(entries))
            }
        }
        deserializer.deserialize_map(HeaderVisitor)
    }
}

/// Only a JSON object: serde's derived structs would also take an array.
impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object with exactly dtype, shape and data_offsets")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut dtype, mut shape, mut offsets) = (None, None, None);
                // `&str` keys and dtype refuse escaped strings: rare
                // enough to leave to the fallback.
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "dtype" if dtype.is_none() => {
                            let name = map.next_value::<&str>()?;
                            let parsed = StDtype::parse(name)
                                .ok_or_else(|| de::Error::custom("unknown dtype"))?;
                            dtype = Some(parsed);
                        }
                        "shape" if shape.is_none() => shape = Some(map.next_value()?),
                        "data_offsets" if offsets.is_none() => offsets = Some(map.next_value()?),
                        _ => return Err(de::Error::custom("unknown or repeated key")),
                    }
                }
                match (dtype, shape, offsets) {
                    (Some(dtype), Some(shape), Some(offsets)) => Ok(Fields {
                        dtype,
                        shape,
                        offsets,
                    }),
                    _ => Err(de::Error::custom("missing key")),
                }
            }
        }
        deserializer.deserialize_map(FieldsVisitor)
    }
}

/// A JSON value whose object entries are kept as a list in file order,
/// duplicates included, so validators can reject repeated keys.
pub(crate) enum RawJson<V> {
    Object(Vec<(String, V)>),
    /// Any non-object value, by the name of its JSON type, for messages.
    Other(&'static str),
}

struct RawVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for RawVisitor<V> {
    type Value = RawJson<V>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // No pre-allocation from a size hint: the input is untrusted.
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<String, V>()? {
            entries.push(entry);
        }
        Ok(RawJson::Object(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(RawJson::Other("an array"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(RawJson::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(RawJson::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(RawJson::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(RawJson::Other("a number"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(RawJson::Other("a string"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(RawJson::Other("null"))
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for RawJson<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor(PhantomData))
    }
}

/// Parses a whole JSON document whose top level keeps duplicate keys;
/// `field` names the document in errors. serde_json's default recursion
/// limit (128) stays on, so deep nesting is an error, not a stack overflow.
pub(crate) fn parse_raw<V: DeserializeOwned>(
    path: &Path,
    field: &str,
    text: &str,
) -> Result<RawJson<V>, CheckpointError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    RawJson::<V>::deserialize(&mut deserializer)
        .and_then(|raw| deserializer.end().map(|()| raw))
        .map_err(|e| json_error(path, field, &e))
}

/// serde_json's message already ends in "at line L column C".
pub(crate) fn json_error(path: &Path, field: &str, error: &serde_json::Error) -> CheckpointError {
    CheckpointError::new(
        path,
        ErrorKind::Json {
            field: field.into(),
            message: error.to_string(),
        },
    )
}

pub(crate) fn invalid(
    path: &Path,
    field: impl Into<String>,
    value: impl Into<String>,
    expected: impl Into<String>,
) -> CheckpointError {
    CheckpointError::new(
        path,
        ErrorKind::InvalidValue {
            field: field.into(),
            value: value.into(),
            expected: expected.into(),
        },
    )
}

pub(crate) fn too_large(path: &Path, field: &str, value: u64, limit: u64) -> CheckpointError {
    CheckpointError::new(
        path,
        ErrorKind::TooLarge {
            field: field.into(),
            value,
            limit,
        },
    )
}

fn truncated(
    path: &Path,
    field: &str,
    offset: u64,
    needed: u64,
    file_size: u64,
) -> CheckpointError {
    CheckpointError::new(
        path,
        ErrorKind::Truncated {
            field: field.into(),
            offset,
            needed,
            file_size,
        },
    )
}

fn overflow(path: &Path, field: String, detail: String) -> CheckpointError {
    CheckpointError::new(path, ErrorKind::Overflow { field, detail })
}

fn dtype_list() -> String {
    let names: Vec<&str> = StDtype::ALL.iter().map(|d| d.name()).collect();
    format!("one of {}", names.join(", "))
}

/// A JSON value as compact text, clipped for error messages.
pub(crate) fn show(value: &Value) -> String {
    clip(&value.to_string())
}

/// Clips untrusted text quoted in an error message.
pub(crate) fn clip(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
