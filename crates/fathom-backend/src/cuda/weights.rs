//! Weights into the allocation's weights region (a bump pointer in load
//! order), and the embedding that reads them first in a step.

use std::ffi::c_void;

use cudarc::driver::result;
use fathom_plan::cuda::WEIGHT_ALIGN;

use super::abi::WeightsArg;
use super::{align, device_err, kind_of_type, CudaBackend};
use crate::{BackendError, Buf, HostMatrix, MatrixId, MatrixStorage, VectorId, WeightType};

/// A matrix the backend holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct DevMatrix {
    pub(super) kind: usize,
    pub(super) arg: WeightsArg,
}

impl CudaBackend {
    /// Bump-allocates room in the weights region and copies `bytes` there.
    pub(super) fn place(&mut self, what: &str, bytes: &[u8]) -> Result<u64, BackendError> {
        let start = align(self.weights_next, WEIGHT_ALIGN);
        let end = start.saturating_add(bytes.len() as u64);
        if end > self.weights_end {
            return Err(BackendError::OverPlan {
                what: format!("cuda weights ({what})"),
                needed: end,
                available: self.weights_end,
            });
        }
        if !self.ready() {
            return Err(self.error.take().unwrap_or(BackendError::Device {
                backend: "cuda",
                message: "backend failed earlier".into(),
            }));
        }
        // On our stream, so the kernels after it see the bytes (a plain
        // synchronous copy runs on the legacy stream, which a non-blocking
        // stream does not wait for). From pageable memory the call returns
        // once `bytes` has been read, so the mmap may go away after.
        // SAFETY: [start, end) lies in the weights region of the allocation.
        unsafe { result::memcpy_htod_async(self.base + start, bytes, self.stream) }
            .map_err(|e| device_err(&format!("copying {what} to the device"), e))?;
        self.weights_next = end;
        Ok(self.base + start)
    }

    /// `m` as the kernels read it, its pieces copied where `place` puts
    /// them (the weights region at load, the streamed room for a step).
    fn describe(
        &mut self,
        m: &HostMatrix,
        place: fn(&mut Self, &str, &[u8]) -> Result<u64, BackendError>,
    ) -> Result<DevMatrix, BackendError> {
        let unsupported = |why: String| BackendError::Device {
            backend: "cuda",
            message: why,
        };
        if !m.cols.is_multiple_of(8) {
            return Err(unsupported(format!(
                "a {}x{} matrix: the CUDA kernels need a multiple of 8 columns",
                m.rows, m.cols
            )));
        }
        let rows = i32::try_from(m.rows).map_err(|_| unsupported(format!("{} rows", m.rows)))?;
        let cols = i32::try_from(m.cols).map_err(|_| unsupported(format!("{} cols", m.cols)))?;
        let dev = match &m.storage {
            // One token through MXFP4 takes the int8-activation kernels
            // only (it has no f32 ones): its rows must fit their staging.
            MatrixStorage::Blocks(WeightType::MXFP4) if m.cols > self.upload.x16_cols => {
                return Err(unsupported(format!(
                    "a {}x{} MXFP4 matrix: wider than the planned activation staging ({} \
                     values), which its one-token kernel quantizes its input into",
                    m.rows, m.cols, self.upload.x16_cols
                )));
            }
            MatrixStorage::Blocks(ty) => {
                let row_bytes = ty.row_bytes(m.cols);
                let need = row_bytes * m.rows;
                if m.data.len() < need || !m.cols.is_multiple_of(ty.block_elems()) {
                    return Err(BackendError::OutOfRange {
                        offset: 0,
                        len: need,
                        size: m.data.len(),
                    });
                }
                let data = place(self, ty.name(), &m.data.bytes()[..need])?;
                DevMatrix {
                    kind: kind_of_type(*ty),
                    arg: WeightsArg {
                        data,
                        scales: 0,
                        biases: 0,
                        row_bytes: row_bytes as u64,
                        rows,
                        cols,
                        group: 0,
                        bf16: 0,
                    },
                }
            }
            MatrixStorage::Affine {
                bits,
                group,
                scales,
                biases,
                bf16,
            } => {
                let kind = match bits {
                    2 => 13,
                    4 => 14,
                    8 => 15,
                    b => {
                        return Err(unsupported(format!(
                            "MLX affine {b}-bit: 2, 4 or 8 are valid"
                        )))
                    }
                };
                if *group == 0 || !group.is_multiple_of(8) || !m.cols.is_multiple_of(*group) {
                    return Err(unsupported(format!(
                        "MLX affine group {group} for {} columns: a multiple of 8 dividing them",
                        m.cols
                    )));
                }
                let row_bytes = m.cols * *bits as usize / 8;
                let halves = m.rows * (m.cols / group) * 2;
                let need = row_bytes * m.rows;
                if m.data.len() < need || scales.len() < halves || biases.len() < halves {
                    return Err(BackendError::OutOfRange {
                        offset: 0,
                        len: need,
                        size: m.data.len(),
                    });
                }
                let data = place(self, "affine weights", &m.data.bytes()[..need])?;
                let s = place(self, "affine scales", &scales.bytes()[..halves])?;
                let b = place(self, "affine biases", &biases.bytes()[..halves])?;
                DevMatrix {
                    kind,
                    arg: WeightsArg {
                        data,
                        scales: s,
                        biases: b,
                        row_bytes: row_bytes as u64,
                        rows,
                        cols,
                        group: *group as i32,
                        bf16: *bf16 as i32,
                    },
                }
            }
        };
        Ok(dev)
    }

    pub(super) fn load_matrix(&mut self, m: HostMatrix) -> Result<MatrixId, BackendError> {
        let dev = self.describe(&m, Self::place)?;
        self.emits_x8 |= !self.k.mv1x8[dev.kind].is_null();
        self.matrices.push(dev);
        Ok(MatrixId(self.matrices.len() as u32 - 1))
    }

    /// [`crate::Backend::stream_matrices`]: what is recorded (which may
    /// read the room's last matrices) is issued first, then the copies
    /// follow it on the stream. The i-th matrix of a call takes the i-th
    /// of a list of ids kept for streamed matrices (room for them made at
    /// load: [`crate::Backend::reserve_streamed`]).
    pub(super) fn stream_matrices(
        &mut self,
        matrices: &mut dyn Iterator<Item = &HostMatrix>,
        ids: &mut [MatrixId],
    ) -> Result<(), BackendError> {
        self.issue(false);
        self.streamed_next = 0;
        for (n, (m, id)) in matrices.zip(ids.iter_mut()).enumerate() {
            let dev = self.describe(m, Self::place_streamed)?;
            if n == self.streamed_ids.len() {
                self.matrices.push(dev);
                self.streamed_ids.push(self.matrices.len() - 1);
            }
            let at = self.streamed_ids[n];
            self.matrices[at] = dev;
            *id = MatrixId(at as u32);
        }
        Ok(())
    }

    /// Like [`Self::place`], into the streamed room (the plan's `streamed`
    /// region), from its start for each matrix.
    fn place_streamed(&mut self, what: &str, bytes: &[u8]) -> Result<u64, BackendError> {
        let (base, room) = self.streamed;
        let start = align(self.streamed_next, WEIGHT_ALIGN);
        let end = start.saturating_add(bytes.len() as u64);
        if end > room {
            return Err(BackendError::OverPlan {
                what: format!("cuda streamed host matrix ({what})"),
                needed: end,
                available: room,
            });
        }
        if !self.ready() {
            return Err(self.error.take().unwrap_or(BackendError::Device {
                backend: "cuda",
                message: "backend failed earlier".into(),
            }));
        }
        // SAFETY: [start, end) lies in the streamed region of the
        // allocation; pageable memory is read before the call returns.
        unsafe { result::memcpy_htod_async(base + start, bytes, self.stream) }
            .map_err(|e| device_err(&format!("copying a host {what} to the device"), e))?;
        self.streamed_next = end;
        Ok(base + start)
    }

    pub(super) fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError> {
        // SAFETY: f32 has no padding; the byte view covers exactly `values`.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
        };
        let at = self.place("vector", bytes)?;
        self.vectors.push((at, values.len()));
        Ok(VectorId(self.vectors.len() as u32 - 1))
    }

    pub(super) fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf) {
        let m = self.matrices[table.0 as usize];
        let cols = m.arg.cols as usize;
        let mut o = self.buf(out, tokens.len() * cols * 4);
        if tokens.is_empty() || !self.ready() {
            return;
        }
        // The embedding is a forward's first op.
        self.begin_step();
        let mut idx = self.stage_rows(tokens, false);
        let (mut w, mut scale) = (m.arg, scale);
        let f = self.k.embed[m.kind];
        self.launch(
            f,
            (tokens.len() as u32, 1, 1),
            128,
            &mut args![w, idx, scale, o],
        );
    }
}
