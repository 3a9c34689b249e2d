//! GGUF v2/v3 header reader.
//!
//! Only the header is read: magic, counts, metadata and the tensor-info
//! table. Tensor data is never touched, so opening a multi-GB file costs the
//! same as opening a small one. [`GgufFile::open`] and [`GgufFile::parse`]
//! share one parser over [`std::io::Read`]; every length and count is checked
//! against the bytes left in the file before anything is allocated, so a
//! hostile header cannot make the reader allocate more than the file holds.

use std::collections::HashSet;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::{CheckpointError, ErrorKind, GgmlType};

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    /// Element type id as stored, and the values.
    Array(u32, Vec<MetaValue>),
}

// The plan's runtime term counts 32 bytes a metadata array element.
const _: () = assert!(std::mem::size_of::<MetaValue>() == 32);

impl MetaValue {
    /// Any integer type whose value fits in u64; `None` for negatives, bools
    /// and floats, because a count or id stored as such is a broken file
    /// rather than something to round.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// Any numeric type as f64 (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, values) => Some(values),
            _ => None,
        }
    }
}

/// One tensor's entry in the GGUF tensor-info table.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (ne0).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of tensor data.
    pub n_bytes: u64,
    /// Number of elements (product of dims).
    pub n_elements: u64,
}

/// The header of a GGUF file: metadata and tensor infos.
#[derive(Debug, Clone)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    /// Absolute file offset where tensor data starts.
    pub data_offset: u64,
    pub file_size: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<GgufTensor>,
}

impl GgufFile {
    /// Reads the header of the GGUF file at `path` without touching tensor data.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let file = crate::open_regular(path)?;
        let file_size = file
            .metadata()
            .map_err(|e| CheckpointError::io(path, e))?
            .len();
        // A larger buffer than the 8 KiB default: headers with a big
        // vocabulary run to megabytes, and this keeps the syscalls few.
        let reader = BufReader::with_capacity(1 << 16, file);
        Parser::new(path, reader, file_size).file(file_size)
    }
    /// Parses a GGUF header from bytes (`path` is only used in errors,
    /// `file_size` bounds the tensor data). Used by fuzzing.
    ///
    /// `bytes` is a prefix of the file and must hold the whole header; bytes
    /// past `file_size` are ignored.
    pub fn parse(path: &Path, bytes: &[u8], file_size: u64) -> Result<Self, CheckpointError> {
        let len = usize::try_from(file_size).map_or(bytes.len(), |n| n.min(bytes.len()));
        let header = &bytes[..len];
        Parser::new(path, header, header.len() as u64).file(file_size)
    }
    /// The value of metadata `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }
}

/// Versions 2 and 3 share one layout (3 only added big-endian files, which
/// show up here as an absurd version number). Version 1 used u32 counts.
const SUPPORTED_VERSIONS: [u32; 2] = [2, 3];
/// ggml's default when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest string accepted; real headers stay far below (the longest are
/// chat templates of some KiB), and the bound keeps one bad length from
/// asking for gigabytes even in a file that large.
const MAX_STRING_LEN: u64 = 1 << 30;
/// Arrays nest at most this deep; real files use one level.
const MAX_ARRAY_DEPTH: u32 = 8;
/// At most this many array elements over the whole metadata. Each costs
/// a [`MetaValue`] (32 bytes) however small on disk, so without a bound a
/// multi-GB header of one-byte elements would need 32 times its size in
/// memory. Real vocabularies are a few hundred thousand tokens.
const MAX_ARRAY_ELEMENTS: u64 = 1 << 24;
/// ggml uses at most 4 dimensions; a little room for future growth.
const MAX_DIMS: u32 = 8;
/// Capacity reserved up front for any count read from the file; beyond it
/// vectors grow as elements are actually parsed, so memory follows the
/// bytes read rather than a number the file claims.
const MAX_PREALLOC: u64 = 4096;
/// Smallest metadata pair: empty key (8), value type (4), one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest tensor info: empty name (8), n_dims (4), one dim (8), type (4),
/// offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

const VALUE_TYPES: &str = "one of 0 (u8), 1 (i8), 2 (u16), 3 (i16), 4 (u32), 5 (i32), \
                           6 (f32), 7 (bool), 8 (string), 9 (array), 10 (u64), 11 (i64), 12 (f64)";

/// A metadata value type id, validated once where it is read so the value
/// reader never meets an unknown one.
#[derive(Clone, Copy)]
enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest encoding of a value of this type (an empty string or array
    /// for the variable-length ones), to bound counts by the bytes left.
    fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            Str | U64 | I64 | F64 => 8,
            Array => 4 + 8,
        }
    }
}

fn ggml_types_expected() -> String {
    let ids: Vec<String> = GgmlType::ALL
        .iter()
        .map(|ty| format!("{} ({ty})", ty.id()))
        .collect();
    format!("a ggml type id, one of {}", ids.join(", "))
}

/// Names the field being read; built only when an error needs it, so the
/// hot path (tens of thousands of vocabulary strings) allocates nothing.
type Field<'a> = &'a dyn Fn() -> String;

/// The single GGUF parser, over any byte source positioned at the start of
/// the file, holding `limit` bytes of header at most.
struct Parser<'p, R> {
    path: &'p Path,
    src: R,
    pos: u64,
    limit: u64,
    array_elements: u64,
}

impl<'p, R: Read> Parser<'p, R> {
    fn new(path: &'p Path, src: R, limit: u64) -> Self {
        Parser {
            path,
            src,
            pos: 0,
            limit,
            array_elements: 0,
        }
    }

    fn err(&self, kind: ErrorKind) -> CheckpointError {
        CheckpointError::new(self.path, kind)
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.pos)
    }

    fn truncated(&self, field: Field, n: u64) -> CheckpointError {
        self.err(ErrorKind::Truncated {
            field: field(),
            offset: self.pos,
            needed: self.pos.saturating_add(n),
            file_size: self.limit,
        })
    }

    /// Fails unless `n` more bytes lie within the header's bytes.
    fn ensure(&self, n: u64, field: Field) -> Result<(), CheckpointError> {
        if n > self.remaining() {
            return Err(self.truncated(field, n));
        }
        Ok(())
    }

    fn fill(&mut self, buf: &mut [u8], field: Field) -> Result<(), CheckpointError> {
        let n = buf.len() as u64;
        self.ensure(n, field)?;
        self.src.read_exact(buf).map_err(|e| {
            // The file shrank under us: still a truncation.
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.truncated(field, n)
            } else {
                CheckpointError::io(self.path, e)
            }
        })?;
        self.pos = self.pos.saturating_add(n);
        Ok(())
    }

    fn le_bytes<const N: usize>(&mut self, field: Field) -> Result<[u8; N], CheckpointError> {
        let mut buf = [0u8; N];
        self.fill(&mut buf, field)?;
        Ok(buf)
    }

    fn u8(&mut self, field: Field) -> Result<u8, CheckpointError> {
        Ok(u8::from_le_bytes(self.le_bytes(field)?))
    }

    fn u32(&mut self, field: Field) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(self.le_bytes(field)?))
    }

    fn u64(&mut self, field: Field) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(self.le_bytes(field)?))
    }

    /// A count whose items need at least `min_item_bytes` each: bounded by
    /// what the rest of the header could hold, so it is safe to loop over.
    fn count(&mut self, min_item_bytes: u64, field: Field) -> Result<u64, CheckpointError> {
        let count = self.u64(field)?;
        self.check_count(count, min_item_bytes, field)?;
        Ok(count)
    }

    fn check_count(
        &self,
        count: u64,
        min_item_bytes: u64,
        field: Field,
    ) -> Result<(), CheckpointError> {
        let remaining = self.remaining();
        let limit = remaining / min_item_bytes;
        if count > limit {
            return Err(self.err(ErrorKind::TooLarge {
                field: format!(
                    "{} (at least {min_item_bytes} bytes each, {remaining} bytes left in the file)",
                    field()
                ),
                value: count,
                limit,
            }));
        }
        Ok(())
    }

    /// A GGUF string: u64 length, then UTF-8 bytes.
    fn string(&mut self, field: Field) -> Result<String, CheckpointError> {
        let len = self.u64(&|| format!("{} length", field()))?;
        if len > MAX_STRING_LEN {
            return Err(self.err(ErrorKind::TooLarge {
                field: format!("{} length", field()),
                value: len,
                limit: MAX_STRING_LEN,
            }));
        }
        // Before allocating: a length past the end of the file must not
        // reserve memory the file could never fill.
        self.ensure(len, field)?;
        let start = self.pos;
        // `len` is at most MAX_STRING_LEN, which fits in usize.
        let mut buf = vec![0u8; len as usize];
        self.fill(&mut buf, field)?;
        String::from_utf8(buf).map_err(|e| {
            // Point at the first offending byte, not just the string.
            let bad = e.utf8_error().valid_up_to() as u64;
            self.err(ErrorKind::InvalidUtf8 {
                field: field(),
                offset: start.saturating_add(bad),
            })
        })
    }

    /// A metadata value of type `ty`; `depth` counts enclosing arrays.
    fn value(
        &mut self,
        ty: ValueType,
        depth: u32,
        field: Field,
    ) -> Result<MetaValue, CheckpointError> {
        Ok(match ty {
            ValueType::U8 => MetaValue::U8(self.u8(field)?),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.le_bytes(field)?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.le_bytes(field)?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.le_bytes(field)?)),
            ValueType::U32 => MetaValue::U32(self.u32(field)?),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.le_bytes(field)?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.le_bytes(field)?)),
            ValueType::Bool => match self.u8(field)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(self.err(ErrorKind::InvalidValue {
                        field: field(),
                        value: b.to_string(),
                        expected: "a bool byte, 0 or 1".into(),
                    }))
                }
            },
            ValueType::Str => MetaValue::Str(self.string(field)?),
            ValueType::Array => self.array_value(depth, field)?,
            ValueType::U64 => MetaValue::U64(self.u64(field)?),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.le_bytes(field)?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.le_bytes(field)?)),
        })
    }

    /// A value type id, rejected with the list of valid ones if unknown.
    fn value_type(&mut self, field: Field) -> Result<ValueType, CheckpointError> {
        let id = self.u32(field)?;
        ValueType::from_id(id).ok_or_else(|| {
            self.err(ErrorKind::InvalidValue {
                field: field(),
                value: id.to_string(),
                expected: VALUE_TYPES.into(),
            })
        })
    }

    /// An array body: element type, count, elements.
    fn array_value(&mut self, depth: u32, field: Field) -> Result<MetaValue, CheckpointError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(ErrorKind::TooLarge {
                field: format!("{} array nesting depth", field()),
                value: u64::from(depth).saturating_add(1),
                limit: MAX_ARRAY_DEPTH.into(),
            }));
        }
        let elem_ty = self.value_type(&|| format!("{} element type", field()))?;
        let count_field = || format!("{} count", field());
        let count = self.count(elem_ty.min_bytes(), &count_field)?;
        self.array_elements = self.array_elements.saturating_add(count);
        if self.array_elements > MAX_ARRAY_ELEMENTS {
            return Err(self.err(ErrorKind::TooLarge {
                field: format!("{} (array elements in all metadata)", count_field()),
                value: self.array_elements,
                limit: MAX_ARRAY_ELEMENTS,
            }));
        }
        let mut values = Vec::with_capacity(count.min(MAX_PREALLOC) as usize);
        for i in 0..count {
            let item = || format!("{}[{i}]", field());
            values.push(self.value(elem_ty, depth.saturating_add(1), &item)?);
        }
        // Grown by doubling past MAX_PREALLOC: keep only what was read,
        // 32 bytes an element, as the plan's runtime term counts it.
        values.shrink_to_fit();
        Ok(MetaValue::Array(elem_ty as u32, values))
    }

    /// Parses the whole header; `file_size` bounds the tensor data.
    fn file(mut self, file_size: u64) -> Result<GgufFile, CheckpointError> {
        let magic: [u8; 4] = self.le_bytes(&|| "magic".into())?;
        if &magic != b"GGUF" {
            return Err(self.err(ErrorKind::BadMagic { found: magic }));
        }
        let version = self.u32(&|| "version".into())?;
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(self.err(ErrorKind::UnsupportedVersion { version }));
        }
        let tensor_count = self.u64(&|| "tensor_count".into())?;
        let kv_count = self.count(MIN_KV_BYTES, &|| "metadata_kv_count".into())?;
        // Checked now that both counts are read: the tensor infos follow the
        // metadata, so they must fit in what is left after the counts.
        self.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, &|| {
            "tensor_count".into()
        })?;

        let metadata = self.metadata(kv_count)?;
        let alignment = alignment(&metadata).map_err(|kind| self.err(kind))?;
        let tensors = self.tensor_infos(tensor_count, alignment)?;

        let data_offset = self
            .pos
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| {
                self.err(ErrorKind::Overflow {
                    field: "data section offset".into(),
                    detail: format!("header end {} rounded up to {alignment}", self.pos),
                })
            })?;
        // Files without tensors (vocab-only ones) may end before the
        // padding; with tensors the data section must start inside the file,
        // or even an empty tensor would point past its end.
        if !tensors.is_empty() && data_offset > file_size {
            return Err(self.err(ErrorKind::Truncated {
                field: "padding before the data section".into(),
                offset: self.pos,
                needed: data_offset,
                file_size,
            }));
        }
        let available = file_size.saturating_sub(data_offset);
        for t in &tensors {
            let end = t.offset.checked_add(t.n_bytes).ok_or_else(|| {
                self.err(ErrorKind::Overflow {
                    field: format!("tensor {} offset", t.name),
                    detail: format!("{} + {} bytes", t.offset, t.n_bytes),
                })
            })?;
            if end > available {
                return Err(self.err(ErrorKind::OutOfBounds {
                    tensor: t.name.clone(),
                    begin: t.offset,
                    end,
                    available,
                }));
            }
        }

        Ok(GgufFile {
            path: self.path.to_path_buf(),
            version,
            alignment,
            data_offset,
            file_size,
            metadata,
            tensors,
        })
    }

    fn metadata(&mut self, kv_count: u64) -> Result<Vec<(String, MetaValue)>, CheckpointError> {
        let mut metadata = Vec::with_capacity(kv_count.min(MAX_PREALLOC) as usize);
        let mut seen = HashSet::new();
        for i in 0..kv_count {
            let key = self.string(&|| format!("metadata key #{i}"))?;
            if !seen.insert(key.clone()) {
                return Err(self.err(ErrorKind::DuplicateKey { key }));
            }
            let ty = self.value_type(&|| format!("metadata key {key} value type"))?;
            let value = self.value(ty, 0, &|| format!("value of {key}"))?;
            metadata.push((key, value));
        }
        Ok(metadata)
    }

    /// The tensor-info table, each entry checked on its own; the data
    /// bounds are checked by the caller once the data section is known.
    fn tensor_infos(
        &mut self,
        tensor_count: u64,
        alignment: u64,
    ) -> Result<Vec<GgufTensor>, CheckpointError> {
        let mut tensors = Vec::with_capacity(tensor_count.min(MAX_PREALLOC) as usize);
        let mut seen = HashSet::new();
        for i in 0..tensor_count {
            let name = self.string(&|| format!("tensor #{i} name"))?;
            if !seen.insert(name.clone()) {
                return Err(self.err(ErrorKind::DuplicateTensor { name }));
            }
            let n_dims = self.u32(&|| format!("tensor {name} n_dims"))?;
            if !(1..=MAX_DIMS).contains(&n_dims) {
                return Err(self.err(ErrorKind::InvalidValue {
                    field: format!("tensor {name} n_dims"),
                    value: n_dims.to_string(),
                    expected: format!("1 to {MAX_DIMS}"),
                }));
            }
            let dims_field = || format!("tensor {name} dims");
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(self.u64(&dims_field)?);
            }
            let type_field = || format!("tensor {name} type");
            let type_id = self.u32(&type_field)?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                self.err(ErrorKind::InvalidValue {
                    field: type_field(),
                    value: type_id.to_string(),
                    expected: ggml_types_expected(),
                })
            })?;
            let offset = self.u64(&|| format!("tensor {name} offset"))?;
            let (n_elements, n_bytes) =
                tensor_size(&dims, ggml_type, &dims_field).map_err(|kind| self.err(kind))?;
            if offset % alignment != 0 {
                return Err(self.err(ErrorKind::Misaligned {
                    tensor: name,
                    offset,
                    alignment,
                }));
            }
            tensors.push(GgufTensor {
                name,
                dims,
                ggml_type,
                offset,
                n_bytes,
                n_elements,
            });
        }
        Ok(tensors)
    }
}

/// Elements and bytes of a tensor with `dims` (at least one) of type `ty`;
/// `field` names the dims in errors.
fn tensor_size(dims: &[u64], ty: GgmlType, field: Field) -> Result<(u64, u64), ErrorKind> {
    let row = dims.first().copied().unwrap_or(1);
    let rest = dims.get(1..).unwrap_or_default();
    let block = ty.block_elems();
    if row % block != 0 {
        return Err(ErrorKind::InvalidValue {
            field: field(),
            value: format!("{dims:?}"),
            expected: format!(
                "a row length (dims[0]) that is a multiple of {block}, the {ty} block size"
            ),
        });
    }
    // A zero dim makes the tensor empty whatever the others are; checking
    // it first keeps [huge, huge, 0] from reporting a spurious overflow.
    if dims.contains(&0) {
        return Ok((0, 0));
    }
    let overflow = |what: &str| ErrorKind::Overflow {
        field: field(),
        detail: format!("{what} of {dims:?} as {ty} exceeds u64"),
    };
    let rows = rest
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| overflow("element count"))?;
    let n_elements = row
        .checked_mul(rows)
        .ok_or_else(|| overflow("element count"))?;
    let n_bytes = ty
        .row_bytes(row)
        .and_then(|b| b.checked_mul(rows))
        .ok_or_else(|| overflow("byte size"))?;
    Ok((n_elements, n_bytes))
}

/// `general.alignment`: a u32 power of two (as ggml and gguf-py require),
/// or the default when absent.
fn alignment(metadata: &[(String, MetaValue)]) -> Result<u64, ErrorKind> {
    let Some((_, value)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match *value {
        MetaValue::U32(a) if a.is_power_of_two() => Ok(a.into()),
        ref other => Err(ErrorKind::InvalidValue {
            field: "metadata key general.alignment".into(),
            value: format!("{other:?}"),
            expected: "a u32 power of two (default 32)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_u64_takes_non_negative_integers_only() {
        assert_eq!(MetaValue::U8(7).as_u64(), Some(7));
        assert_eq!(MetaValue::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(MetaValue::I32(30).as_u64(), Some(30));
        assert_eq!(MetaValue::I64(i64::MAX).as_u64(), Some(i64::MAX as u64));
        assert_eq!(MetaValue::I8(-1).as_u64(), None);
        assert_eq!(MetaValue::I64(i64::MIN).as_u64(), None);
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::F32(1.0).as_u64(), None);
        assert_eq!(MetaValue::Str("1".into()).as_u64(), None);
    }

    #[test]
    fn as_f64_takes_every_number() {
        assert_eq!(MetaValue::I16(-3).as_f64(), Some(-3.0));
        assert_eq!(MetaValue::U32(10000).as_f64(), Some(10000.0));
        assert_eq!(MetaValue::F32(1e-5).as_f64(), Some(f64::from(1e-5f32)));
        assert_eq!(MetaValue::F64(0.5).as_f64(), Some(0.5));
        assert_eq!(MetaValue::Bool(false).as_f64(), None);
        assert_eq!(MetaValue::Array(6, vec![]).as_f64(), None);
    }

    #[test]
    fn str_bool_array_accessors_match_their_variant_only() {
        let arr = MetaValue::Array(8, vec![MetaValue::Str("a".into())]);
        assert_eq!(MetaValue::Str("llama".into()).as_str(), Some("llama"));
        assert_eq!(MetaValue::U8(1).as_str(), None);
        assert_eq!(MetaValue::Bool(true).as_bool(), Some(true));
        assert_eq!(MetaValue::U8(1).as_bool(), None);
        assert_eq!(arr.as_array().map(<[_]>::len), Some(1));
        assert_eq!(MetaValue::Str("a".into()).as_array(), None);
    }

    #[test]
    fn value_type_ids_round_trip_and_bound_their_size() {
        for id in 0..=12u32 {
            let ty = ValueType::from_id(id).expect("known id");
            assert_eq!(ty as u32, id);
            assert!(ty.min_bytes() >= 1);
        }
        assert!(ValueType::from_id(13).is_none());
        assert!(ValueType::from_id(u32::MAX).is_none());
    }

    fn dims_field() -> String {
        "tensor t dims".into()
    }

    #[test]
    fn tensor_size_multiplies_with_checks() {
        assert_eq!(
            tensor_size(&[576, 49152], GgmlType::Q8_0, &dims_field).ok(),
            Some((576 * 49152, 18 * 34 * 49152))
        );
        assert_eq!(
            tensor_size(&[u64::MAX, u64::MAX, 0], GgmlType::F32, &dims_field).ok(),
            Some((0, 0))
        );
        assert!(matches!(
            tensor_size(&[33], GgmlType::Q4_0, &dims_field),
            Err(ErrorKind::InvalidValue { .. })
        ));
        assert!(matches!(
            tensor_size(&[u64::MAX / 2, 4], GgmlType::F32, &dims_field),
            Err(ErrorKind::Overflow { .. })
        ));
        // Elements fit, bytes do not.
        assert!(matches!(
            tensor_size(&[1 << 62, 2], GgmlType::I8, &dims_field),
            Ok((_, _))
        ));
        assert!(matches!(
            tensor_size(&[1 << 62, 2], GgmlType::F16, &dims_field),
            Err(ErrorKind::Overflow { .. })
        ));
    }

    #[test]
    fn alignment_is_a_u32_power_of_two_defaulting_to_32() {
        let with = |v: MetaValue| alignment(&[("general.alignment".into(), v)]);
        assert_eq!(alignment(&[]).ok(), Some(32));
        assert_eq!(with(MetaValue::U32(1)).ok(), Some(1));
        assert_eq!(with(MetaValue::U32(4096)).ok(), Some(4096));
        for bad in [
            MetaValue::U32(0),
            MetaValue::U32(48),
            MetaValue::U64(32),
            MetaValue::Str("32".into()),
        ] {
            assert!(matches!(with(bad), Err(ErrorKind::InvalidValue { .. })));
        }
    }
}
