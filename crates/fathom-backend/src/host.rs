//! Weights as the engine hands them to a backend: byte ranges of host
//! memory (the checkpoint's mmap) in their stored format.

use std::sync::Arc;

use fathom_kernels::{AffineWeights, WeightType, Weights};

use crate::BackendError;

/// Bytes `offset .. offset + len` of a shared host buffer (a mapped
/// checkpoint file). Cloning shares the owner; the bytes live as long as
/// any clone.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBytes({}..+{})", self.offset, self.len)
    }
}

impl HostBytes {
    /// The range of `owner`; an error when it lies outside.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        offset: usize,
        len: usize,
    ) -> Result<Self, BackendError> {
        let size = (*owner).as_ref().len();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(BackendError::OutOfRange { offset, len, size });
        }
        Ok(HostBytes { owner, offset, len })
    }

    pub fn bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.offset..self.offset + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `offset .. offset + len` of this range, sharing the owner.
    pub fn sub(&self, offset: usize, len: usize) -> Result<HostBytes, BackendError> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(BackendError::OutOfRange {
                offset,
                len,
                size: self.len,
            });
        }
        Ok(HostBytes {
            owner: self.owner.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// A new owner holding `bytes`, whole.
    pub fn from_vec(bytes: Vec<u8>) -> HostBytes {
        let len = bytes.len();
        HostBytes {
            owner: Arc::new(bytes),
            offset: 0,
            len,
        }
    }
}

/// How a matrix's values are stored.
#[derive(Debug, Clone)]
pub enum MatrixStorage {
    /// ggml blocks (or plain floats) of one type.
    Blocks(WeightType),
    /// MLX affine groups: packed words in the matrix's bytes, f16 or bf16
    /// scales and biases beside them.
    Affine {
        bits: u32,
        group: usize,
        scales: HostBytes,
        biases: HostBytes,
        bf16: bool,
    },
}

/// A weight matrix of `rows` rows of `cols` values, in host memory.
#[derive(Debug, Clone)]
pub struct HostMatrix {
    pub data: HostBytes,
    pub storage: MatrixStorage,
    pub rows: usize,
    pub cols: usize,
}

/// A matrix's bytes as the CPU kernels read them.
pub enum MatrixView<'a> {
    Blocks(Weights<'a>),
    Affine(AffineWeights<'a>),
}

impl HostMatrix {
    /// Every byte range the matrix reads (data, and scales and biases).
    pub fn ranges(&self) -> impl Iterator<Item = &HostBytes> {
        let aux = match &self.storage {
            MatrixStorage::Affine { scales, biases, .. } => [Some(scales), Some(biases)],
            MatrixStorage::Blocks(_) => [None, None],
        };
        std::iter::once(&self.data).chain(aux.into_iter().flatten())
    }

    /// The view the CPU kernels take.
    pub fn view(&self) -> MatrixView<'_> {
        match &self.storage {
            MatrixStorage::Blocks(ty) => MatrixView::Blocks(Weights {
                ty: *ty,
                rows: self.rows,
                cols: self.cols,
                data: self.data.bytes(),
            }),
            MatrixStorage::Affine {
                bits,
                group,
                scales,
                biases,
                bf16,
            } => MatrixView::Affine(AffineWeights {
                bits: *bits,
                group: *group,
                rows: self.rows,
                cols: self.cols,
                packed: self.data.bytes(),
                scales: scales.bytes(),
                biases: biases.bytes(),
                bf16: *bf16,
            }),
        }
    }
}
