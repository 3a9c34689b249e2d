//! A device's share of a weight matrix under tensor parallelism: a range of
//! its rows (output features: a column-split projection, or the KV heads a
//! device holds) or a range of its columns (input features: a row-split
//! projection, whose partial products the devices then sum). The plan
//! (`fathom_plan::tensor_parallel`) says which tensor splits which way; this
//! cuts the bytes.
//!
//! A row range is a view of the same host bytes (rows are contiguous); a
//! column range is copied, row by row, in whole blocks (or MLX groups), so
//! each device's matrix is an ordinary matrix of its type.

use crate::{BackendError, HostBytes, HostMatrix, MatrixStorage};

fn bad(message: String) -> BackendError {
    BackendError::Device {
        backend: "tensor parallel",
        message,
    }
}

/// `rows` rows of `row_bytes` each, keeping bytes `from .. from + take` of
/// every row, copied into a new buffer.
fn every_row(bytes: &[u8], rows: usize, row_bytes: usize, from: usize, take: usize) -> HostBytes {
    let mut out = Vec::with_capacity(rows * take);
    for row in bytes.chunks_exact(row_bytes).take(rows) {
        out.extend_from_slice(&row[from..from + take]);
    }
    HostBytes::from_vec(out)
}

impl HostMatrix {
    /// Rows `r0 .. r1` (output features), sharing the bytes.
    pub fn rows_range(&self, r0: usize, r1: usize) -> Result<HostMatrix, BackendError> {
        if r0 >= r1 || r1 > self.rows {
            return Err(bad(format!(
                "rows {r0}..{r1} of a {}x{} matrix",
                self.rows, self.cols
            )));
        }
        let n = r1 - r0;
        let (data, storage) = match &self.storage {
            MatrixStorage::Blocks(ty) => {
                let rb = ty.row_bytes(self.cols);
                (self.data.sub(r0 * rb, n * rb)?, self.storage.clone())
            }
            MatrixStorage::Affine {
                bits,
                group,
                scales,
                biases,
                bf16,
            } => {
                let rb = self.cols * *bits as usize / 8;
                let gb = self.cols / group * 2;
                (
                    self.data.sub(r0 * rb, n * rb)?,
                    MatrixStorage::Affine {
                        bits: *bits,
                        group: *group,
                        scales: scales.sub(r0 * gb, n * gb)?,
                        biases: biases.sub(r0 * gb, n * gb)?,
                        bf16: *bf16,
                    },
                )
            }
        };
        Ok(HostMatrix {
            data,
            storage,
            rows: n,
            cols: self.cols,
        })
    }

    /// Columns `c0 .. c1` (input features) of every row, copied; both ends
    /// must fall on the type's block (or the MLX group) boundaries.
    pub fn cols_range(&self, c0: usize, c1: usize) -> Result<HostMatrix, BackendError> {
        let unit = match &self.storage {
            MatrixStorage::Blocks(ty) => ty.block_elems(),
            MatrixStorage::Affine { group, .. } => *group,
        };
        if c0 >= c1 || c1 > self.cols || !c0.is_multiple_of(unit) || !c1.is_multiple_of(unit) {
            return Err(bad(format!(
                "columns {c0}..{c1} of a {}x{} matrix: the ends must be multiples of {unit} \
                 (its blocks) within 0..{}",
                self.rows, self.cols, self.cols
            )));
        }
        let n = c1 - c0;
        let (data, storage) = match &self.storage {
            MatrixStorage::Blocks(ty) => {
                let bytes = |c: usize| ty.row_bytes(c);
                let data = every_row(
                    self.data.bytes(),
                    self.rows,
                    bytes(self.cols),
                    bytes(c0),
                    bytes(n),
                );
                (data, self.storage.clone())
            }
            MatrixStorage::Affine {
                bits,
                group,
                scales,
                biases,
                bf16,
            } => {
                let bits_of = |c: usize| c * *bits as usize / 8;
                let halves = |c: usize| c / group * 2;
                let data = every_row(
                    self.data.bytes(),
                    self.rows,
                    bits_of(self.cols),
                    bits_of(c0),
                    bits_of(n),
                );
                let aux = |b: &HostBytes| {
                    every_row(
                        b.bytes(),
                        self.rows,
                        halves(self.cols),
                        halves(c0),
                        halves(n),
                    )
                };
                (
                    data,
                    MatrixStorage::Affine {
                        bits: *bits,
                        group: *group,
                        scales: aux(scales),
                        biases: aux(biases),
                        bf16: *bf16,
                    },
                )
            }
        };
        Ok(HostMatrix {
            data,
            storage,
            rows: self.rows,
            cols: n,
        })
    }
}
