//! Weights read in place: each checkpoint file is mapped once, and every
//! matrix is a view into the map in its stored format. Only 1-D tensors
//! (norms, biases) that are not f32 are converted, into small owned
//! vectors the plan lists.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use fathom_backend::{HostBytes, HostMatrix, MatrixStorage};
use fathom_checkpoint::{Checkpoint, GgufFile, HfCheckpoint, MlxQuantization, StDtype};
use fathom_kernels::{WeightType, AFFINE_BITS};
use memmap2::Mmap;

use crate::EngineError;

/// Where one tensor's bytes lie.
#[derive(Debug, Clone, Copy)]
pub struct TensorLoc {
    file: usize,
    offset: usize,
    len: usize,
}

/// A stored tensor as the loader sees it, before it is given a role.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    pub name: String,
    pub ty: Option<WeightType>,
    pub dtype: String,
    /// Outermost first: `[rows, cols]` for a matrix (HF order; GGUF dims are reversed).
    pub shape: Vec<u64>,
    loc: TensorLoc,
}

impl StoredTensor {
    /// The weight type, once the shape is `expected` and the dtype one the
    /// kernels read.
    fn checked(&self, expected: &[u64]) -> Result<WeightType, EngineError> {
        self.check_shape(expected)?;
        self.ty.ok_or_else(|| EngineError::UnsupportedDtype {
            tensor: self.name.clone(),
            dtype: self.dtype.clone(),
        })
    }
}

impl StoredTensor {
    /// [`Self::checked`] up to unit dimensions: Hugging Face stores a
    /// depthwise convolution's taps as `[channels, 1, taps]` and a one-row
    /// Linear as `[1, cols]` where llama.cpp's converter squeezes them.
    fn checked_squeezed(&self, expected: &[u64]) -> Result<WeightType, EngineError> {
        let squeezed = |dims: &[u64]| dims.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if squeezed(&self.shape) == squeezed(expected) {
            return self.checked(&self.shape.clone());
        }
        self.checked(expected)
    }

    fn check_shape(&self, expected: &[u64]) -> Result<(), EngineError> {
        if self.shape != expected {
            return Err(EngineError::BadShape {
                tensor: self.name.clone(),
                shape: self.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }
}

/// The mapped checkpoint files and their tensor table.
pub struct WeightFiles {
    maps: Vec<Arc<Mmap>>,
    tensors: Vec<StoredTensor>,
    mlx: Option<MlxQuantization>,
}

fn map(path: &Path) -> Result<Arc<Mmap>, EngineError> {
    let io = |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and fathom never writes the file; the
    // checkpoint readers have bounded every tensor inside the file's size.
    // Another process truncating the file while it is mapped is outside
    // what any mmap-based runtime can defend against.
    unsafe { Mmap::map(&file) }.map(Arc::new).map_err(io)
}

fn gguf_tensors(file: &GgufFile) -> Vec<StoredTensor> {
    file.tensors
        .iter()
        .map(|t| StoredTensor {
            name: t.name.clone(),
            ty: WeightType::from_ggml_id(t.ggml_type.id()),
            dtype: t.ggml_type.name().to_string(),
            shape: t.dims.iter().rev().copied().collect(),
            loc: TensorLoc {
                file: 0,
                offset: (file.data_offset + t.offset) as usize,
                len: t.n_bytes as usize,
            },
        })
        .collect()
}

fn hf_tensors(hf: &HfCheckpoint) -> Vec<StoredTensor> {
    hf.tensors
        .iter()
        .map(|t| StoredTensor {
            name: t.name.clone(),
            ty: match t.dtype {
                StDtype::F32 => Some(WeightType::F32),
                StDtype::F16 => Some(WeightType::F16),
                StDtype::BF16 => Some(WeightType::BF16),
                _ => None,
            },
            dtype: t.dtype.name().to_string(),
            shape: t.shape.clone(),
            loc: TensorLoc {
                file: t.file,
                offset: t.begin as usize,
                len: t.n_bytes() as usize,
            },
        })
        .collect()
}

impl WeightFiles {
    pub fn open(checkpoint: &Checkpoint) -> Result<Self, EngineError> {
        match checkpoint {
            Checkpoint::Gguf(file) => Ok(WeightFiles {
                maps: vec![map(&file.path)?],
                tensors: gguf_tensors(file),
                mlx: None,
            }),
            Checkpoint::Hf(hf) => Ok(WeightFiles {
                maps: hf
                    .files
                    .iter()
                    .map(|f| map(&f.path))
                    .collect::<Result<_, _>>()?,
                tensors: hf_tensors(hf),
                mlx: hf.quantization,
            }),
        }
    }

    pub fn find(&self, name: &str) -> Option<&StoredTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn tensor(&self, name: &str) -> Result<&StoredTensor, EngineError> {
        self.find(name).ok_or_else(|| EngineError::MissingTensor {
            tensor: name.to_string(),
        })
    }

    fn bytes(&self, loc: TensorLoc) -> &[u8] {
        &self.maps[loc.file][loc.offset..loc.offset + loc.len]
    }

    /// The bytes at `loc`, shared with the map (readers bounded every
    /// tensor inside its file).
    fn host(&self, loc: TensorLoc) -> Result<HostBytes, EngineError> {
        HostBytes::new(self.maps[loc.file].clone(), loc.offset, loc.len).map_err(EngineError::from)
    }

    /// The matrix `name`, checked to be `[rows, cols]` (or, MLX-packed,
    /// `[rows, cols·bits/32]` words with `[rows, cols/group]` scales and biases).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<HostMatrix, EngineError> {
        let t = self.tensor(name)?;
        if let (Some(q), "U32") = (self.mlx, t.dtype.as_str()) {
            return self.affine_matrix(t, q, rows, cols);
        }
        let ty = t.checked(&[rows as u64, cols as u64])?;
        Ok(HostMatrix {
            data: self.host(t.loc)?,
            storage: MatrixStorage::Blocks(ty),
            rows,
            cols,
        })
    }

    fn affine_matrix(
        &self,
        t: &StoredTensor,
        q: MlxQuantization,
        rows: usize,
        cols: usize,
    ) -> Result<HostMatrix, EngineError> {
        let (bits, group) = (q.bits, q.group_size as usize);
        if !AFFINE_BITS.contains(&bits) || !cols.is_multiple_of(group) {
            return Err(EngineError::UnsupportedDtype {
                tensor: t.name.clone(),
                dtype: format!("MLX {bits}-bit (group {group}) over {cols} columns; fathom runs 2-, 4- and 8-bit groups that divide the row"),
            });
        }
        t.check_shape(&[rows as u64, (cols * bits as usize / 32) as u64])?;
        let prefix = t.name.strip_suffix(".weight").unwrap_or(&t.name);
        let aux = |suffix: &str| -> Result<&StoredTensor, EngineError> {
            let a = self.tensor(&format!("{prefix}.{suffix}"))?;
            match a.checked(&[rows as u64, (cols / group) as u64])? {
                WeightType::F16 | WeightType::BF16 => Ok(a),
                _ => Err(EngineError::UnsupportedDtype {
                    tensor: a.name.clone(),
                    dtype: format!("{} (MLX scales and biases are F16 or BF16)", a.dtype),
                }),
            }
        };
        let (scales, biases) = (aux("scales")?, aux("biases")?);
        Ok(HostMatrix {
            data: self.host(t.loc)?,
            storage: MatrixStorage::Affine {
                bits,
                group,
                scales: self.host(scales.loc)?,
                biases: self.host(biases.loc)?,
                bf16: scales.ty == Some(WeightType::BF16),
            },
            rows,
            cols,
        })
    }

    /// The 1-D tensor `name` of `len` values as f32 (converted: these are
    /// the small vectors the plan lists as converted at load).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        let t = self.tensor(name)?;
        if t.shape != [len as u64] {
            return Err(EngineError::BadShape {
                tensor: name.to_string(),
                shape: t.shape.clone(),
                expected: vec![len as u64],
            });
        }
        let ty = t.ty.ok_or_else(|| EngineError::UnsupportedDtype {
            tensor: name.to_string(),
            dtype: t.dtype.clone(),
        })?;
        let mut out = vec![0f32; len];
        fathom_kernels::dequantize_row(ty, self.bytes(t.loc), &mut out);
        Ok(out)
    }

    /// The 1-D tensor `name` of `cols` values (`[1, cols]` in an HF file)
    /// read in place as a matrix of one row (Qwen3.5 MoE's shared-expert
    /// gate, a dot product a row).
    pub fn row_matrix(&self, name: &str, cols: usize) -> Result<HostMatrix, EngineError> {
        let t = self.tensor(name)?;
        let ty = t.checked_squeezed(&[cols as u64])?;
        Ok(HostMatrix {
            data: self.host(t.loc)?,
            storage: MatrixStorage::Blocks(ty),
            rows: 1,
            cols,
        })
    }

    /// The `[rows, cols]` tensor `name` flattened to f32 row by row: a
    /// small 2-D weight the engine converts at load like a 1-D one
    /// (a linear-attention layer's convolution taps, `[rows, 1, cols]` in
    /// an HF file).
    pub fn flat(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, EngineError> {
        let t = self.tensor(name)?;
        let ty = t.checked_squeezed(&[rows as u64, cols as u64])?;
        let bytes = self.bytes(t.loc);
        let row_bytes = ty.row_bytes(cols);
        let mut out = vec![0f32; rows * cols];
        for (r, dst) in out.chunks_exact_mut(cols).enumerate() {
            fathom_kernels::dequantize_row(ty, &bytes[r * row_bytes..(r + 1) * row_bytes], dst);
        }
        Ok(out)
    }

    /// Reads one byte of every page of `matrices`, so the weights the
    /// model uses are resident before the first token instead of faulting
    /// in during it (and nothing else of the files is touched);
    /// `progress(done, total)` follows in bytes.
    pub fn prefault(matrices: &[HostMatrix], progress: &mut dyn FnMut(u64, u64)) {
        const PAGE: usize = 4096;
        let total: u64 = matrices
            .iter()
            .flat_map(HostMatrix::ranges)
            .map(|r| r.len() as u64)
            .sum();
        let mut done = 0u64;
        for range in matrices.iter().flat_map(HostMatrix::ranges) {
            let mut sum = 0u8;
            for page in range.bytes().chunks(PAGE) {
                sum = sum.wrapping_add(page[0]);
            }
            std::hint::black_box(sum);
            done += range.len() as u64;
            progress(done, total);
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.find(name).is_some()
    }
}

impl WeightFiles {
    /// Matrix `index` of a stacked `[count, N × rows, cols]` tensor, as
    /// its `N` consecutive `[rows, cols]` pieces viewing the same bytes:
    /// one for GGUF's merged experts, two for Qwen3.5 MoE's HF
    /// `gate_up_proj` (an expert's gate rows, then its up rows).
    pub fn stacked<const N: usize>(
        &self,
        name: &str,
        index: usize,
        count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<[HostMatrix; N], EngineError> {
        let t = self.tensor(name)?;
        let ty = t.checked(&[count as u64, (N * rows) as u64, cols as u64])?;
        let bytes = rows * ty.row_bytes(cols);
        let mut pieces = Vec::with_capacity(N);
        for piece in index * N..(index + 1) * N {
            pieces.push(HostMatrix {
                data: self.host(TensorLoc {
                    file: t.loc.file,
                    offset: t.loc.offset + piece * bytes,
                    len: bytes,
                })?,
                storage: MatrixStorage::Blocks(ty),
                rows,
                cols,
            });
        }
        Ok(pieces
            .try_into()
            .unwrap_or_else(|_| unreachable!("N pieces pushed")))
    }
}
