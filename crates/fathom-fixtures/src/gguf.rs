//! A GGUF v3 writer that does what it is told, so tests can also build
//! malformed files (mismatched array types, overlapping or out-of-file
//! offsets, any version) and edit [`GgufWriter::header`] bytes further.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use std::ops::Range;

use crate::random::{write_blocks, write_elements, Block, Fill, Rng, WEIGHTS};
use crate::Data;

/// A metadata value; the variants are GGUF's value types.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type id, then the elements, which are written without their
    /// own type ids: an id that does not match them makes a malformed file.
    Array(u32, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn string(s: impl Into<String>) -> GgufValue {
        GgufValue::String(s.into())
    }

    pub fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> GgufValue {
        GgufValue::Array(8, items.into_iter().map(GgufValue::string).collect())
    }

    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(..) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            GgufValue::U8(v) => out.push(*v),
            GgufValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::Bool(v) => out.push(u8::from(*v)),
            GgufValue::String(s) => write_string(out, s),
            GgufValue::Array(elem_type, items) => {
                out.extend_from_slice(&elem_type.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    item.write_payload(out);
                }
            }
            GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// ggml tensor types this crate can size and fill: the ones the kernels
/// run, with their layouts from `fathom-ggml`'s table.
pub use fathom_ggml::WeightType as GgufTensorType;

/// The largest multiple of a scale a block of `ty` can hold (quant ×
/// sub-block scale), which lets random blocks dequantize to about real
/// weights' magnitude.
fn scale_span(ty: GgufTensorType) -> f32 {
    match ty {
        GgufTensorType::F32 | GgufTensorType::F16 | GgufTensorType::BF16 => 1.0,
        GgufTensorType::Q4_0 => 8.0,
        GgufTensorType::Q4_1 => 15.0,
        GgufTensorType::Q5_0 => 16.0,
        GgufTensorType::Q5_1 => 31.0,
        GgufTensorType::Q8_0 => 127.0,
        GgufTensorType::Q2_K => 45.0,
        GgufTensorType::Q3_K => 128.0,
        GgufTensorType::Q4_K => 945.0,
        GgufTensorType::Q5_K => 1953.0,
        GgufTensorType::Q6_K => 4064.0,
        GgufTensorType::MXFP4 => 12.0,
    }
}

/// One entry of the tensor-info table. `dims` are in ggml order (`ne0`, the
/// row length, first); `offset` is relative to the start of the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub offset: u64,
    /// Data bytes the tensor occupies in the file (not written to the header).
    pub len: u64,
}

#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    kvs: Vec<(String, GgufValue)>,
    /// Each with whether [`GgufWriter::tensor_at`] fixed its offset; the
    /// others are placed at layout time, once the alignment is known.
    tensors: Vec<(GgufTensorInfo, bool)>,
    /// Float tensors whose random values fall in a range of their own.
    ranges: Vec<(String, Range<f32>)>,
    /// Tensors whose random values are this many times the default's
    /// magnitude (a float range, or a quantized block's scale).
    scales: Vec<(String, f32)>,
    /// F32 tensors whose values are given rather than drawn.
    values: Vec<(String, Vec<f32>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            ranges: Vec::new(),
            scales: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// A `general.alignment` U32 also sets the padding this writer uses.
    pub fn kv(mut self, key: impl Into<String>, value: GgufValue) -> Self {
        self.kvs.push((key.into(), value));
        self
    }

    /// Drops the metadata keys `keep` refuses (to replace a group of them,
    /// e.g. the tokenizer's).
    pub fn retain_kvs(mut self, keep: impl Fn(&str) -> bool) -> Self {
        self.kvs.retain(|(key, _)| keep(key));
        self
    }

    /// Random data gives the float tensor `name` values uniform in
    /// `range` instead of [-0.1, 0.1) (a decay that must stay negative, a
    /// norm near one).
    pub fn value_range(mut self, name: impl Into<String>, range: Range<f32>) -> Self {
        self.ranges.push((name.into(), range));
        self
    }

    /// Random data gives the tensor `name` values `factor` times as large
    /// as it would otherwise draw: a float tensor's range (its own or
    /// [-0.1, 0.1)) times `factor`, a quantized block's scale times
    /// `factor` (an embedding that should outweigh the layers' outputs).
    /// MXFP4's power-of-two scales take no factor: writing fails.
    pub fn scaled(mut self, name: impl Into<String>, factor: f32) -> Self {
        self.scales.push((name.into(), factor));
        self
    }

    /// Random data writes `values` as the F32 tensor `name` instead of
    /// drawing them (rope factors, which a converter computes).
    pub fn f32_values(mut self, name: impl Into<String>, values: Vec<f32>) -> Self {
        self.values.push((name.into(), values));
        self
    }

    /// A tensor placed after the previous one, at the next aligned offset.
    pub fn tensor(
        self,
        name: impl Into<String>,
        ggml_dims: &[u64],
        type_id: u32,
        len: u64,
    ) -> Self {
        self.push_tensor(name.into(), ggml_dims, type_id, 0, len, false)
    }

    /// A tensor at exactly `offset`, aligned or not, inside the file or not.
    pub fn tensor_at(
        self,
        name: impl Into<String>,
        ggml_dims: &[u64],
        type_id: u32,
        offset: u64,
        len: u64,
    ) -> Self {
        self.push_tensor(name.into(), ggml_dims, type_id, offset, len, true)
    }

    fn push_tensor(
        mut self,
        name: String,
        dims: &[u64],
        type_id: u32,
        offset: u64,
        len: u64,
        fixed: bool,
    ) -> Self {
        let info = GgufTensorInfo {
            name,
            dims: dims.to_vec(),
            type_id,
            offset,
            len,
        };
        self.tensors.push((info, fixed));
        self
    }

    /// `general.alignment` when it is a nonzero U32, else GGUF's default 32.
    pub fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find_map(|(key, value)| match (key.as_str(), value) {
                ("general.alignment", GgufValue::U32(a)) if *a > 0 => Some(u64::from(*a)),
                _ => None,
            })
            .unwrap_or(32)
    }

    /// The tensor table with every offset resolved.
    pub fn tensors(&self) -> Vec<GgufTensorInfo> {
        let align = self.alignment();
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|(info, fixed)| {
                let mut info = info.clone();
                if !fixed {
                    info.offset = align_up(next, align);
                }
                next = info.offset.saturating_add(info.len);
                info
            })
            .collect()
    }

    /// Everything before the data section, including the padding to it.
    pub fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            write_string(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            value.write_payload(&mut out);
        }
        for info in self.tensors() {
            write_string(&mut out, &info.name);
            out.extend_from_slice(&(info.dims.len() as u32).to_le_bytes());
            for dim in &info.dims {
                out.extend_from_slice(&dim.to_le_bytes());
            }
            out.extend_from_slice(&info.type_id.to_le_bytes());
            out.extend_from_slice(&info.offset.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(self.alignment() as usize), 0);
        out
    }

    /// Writes the file and returns its size: the header, then each tensor's
    /// bytes padded to the alignment, as llama.cpp's writer does.
    pub fn write(&self, path: &Path, data: Data) -> io::Result<u64> {
        let header = self.header();
        let tensors = self.tensors();
        let data_end = tensors
            .iter()
            .map(|t| t.offset.saturating_add(t.len))
            .max()
            .unwrap_or(0);
        let total = (header.len() as u64).saturating_add(align_up(data_end, self.alignment()));
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(&header)?;
        if let Data::Random { seed } = data {
            for info in &tensors {
                out.seek(SeekFrom::Start(
                    (header.len() as u64).saturating_add(info.offset),
                ))?;
                if let Some((_, values)) = self.values.iter().find(|(name, _)| *name == info.name) {
                    for v in values {
                        out.write_all(&v.to_le_bytes())?;
                    }
                    continue;
                }
                let mut rng = Rng::for_tensor(seed, &info.name);
                let range = self
                    .ranges
                    .iter()
                    .find(|(name, _)| *name == info.name)
                    .map_or(WEIGHTS, |(_, r)| r.clone());
                let factor = self
                    .scales
                    .iter()
                    .find(|(name, _)| *name == info.name)
                    .map(|(_, f)| *f);
                fill_tensor(&mut out, info, &mut rng, range, factor)?;
            }
        }
        let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        // For sparse data this leaves the tensor bytes as a hole.
        file.set_len(total)?;
        Ok(total)
    }
}

/// Saturating, because hostile offsets may sit at the top of the range.
fn align_up(offset: u64, align: u64) -> u64 {
    offset.checked_next_multiple_of(align).unwrap_or(u64::MAX)
}

fn fill_tensor(
    out: &mut impl Write,
    info: &GgufTensorInfo,
    rng: &mut Rng,
    range: Range<f32>,
    factor: Option<f32>,
) -> io::Result<()> {
    let f = factor.unwrap_or(1.0);
    let (fill, size) = match GgufTensorType::from_ggml_id(info.type_id) {
        Some(GgufTensorType::F32) => (Fill::F32, 4),
        Some(GgufTensorType::F16) => (Fill::F16, 2),
        Some(GgufTensorType::BF16) => (Fill::BF16, 2),
        Some(GgufTensorType::MXFP4) if factor.is_some() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: MXFP4 blocks cannot be scaled", info.name),
            ))
        }
        Some(GgufTensorType::MXFP4) => {
            return crate::random::write_mxfp4_blocks(out, info.len, rng)
        }
        Some(t) => {
            let block = Block {
                bytes: t.block_bytes(),
                scale_offsets: t.f16_scales(),
                scale_max: f * 0.1 / scale_span(t),
            };
            return write_blocks(out, info.len, &block, rng);
        }
        // An unknown type id: bytes with no structure to respect.
        None => {
            let bytes = Block {
                bytes: 8,
                scale_offsets: &[],
                scale_max: 0.0,
            };
            return write_blocks(out, info.len, &bytes, rng);
        }
    };
    let range = range.start * f..range.end * f;
    write_elements(out, fill, info.len / size, rng, range)
}
