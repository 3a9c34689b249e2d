//! Tensor parallelism: one [`Backend`] over the devices of one host, each
//! device a backend of its own (a rank) holding its share of every weight,
//! its share of the KV heads and its own arena, as its plan lists.
//!
//! The engine writes the forward pass once, on a rank's shapes (a
//! `1 / devices()` share of the heads and FFN columns); every op goes to
//! every rank with the same arguments, and [`Backend::all_reduce`] sums the
//! partial outputs of the row-split projections through the ranks'
//! collective (NCCL on CUDA). Every rank ends each layer with the same
//! residual, so routing, norms and sampling read the same values
//! everywhere; the host reads rank 0's logits.

use crate::{
    AttentionIo, AttentionShape, Backend, BackendError, Buf, DeviceMemory, Glu, HostMatrix,
    MatrixId, RopeParams, Split, Step, VectorId,
};

/// Sums a buffer over the ranks of a group, leaving the sum on each.
pub trait Reduce<B>: Send {
    fn all_reduce(&mut self, ranks: &mut [B], x: Buf, rows: usize, width: usize);
}

/// N rank backends driven as one.
pub struct TensorParallel<B, R> {
    ranks: Vec<B>,
    reduce: R,
}

fn bad(message: String) -> BackendError {
    BackendError::Device {
        backend: "tensor parallel",
        message,
    }
}

/// Which of `parts` equal ranges device `device` of `devices` holds.
fn part_of(parts: usize, device: usize, devices: usize) -> Result<usize, BackendError> {
    if parts == 0 || parts > devices || !devices.is_multiple_of(parts) {
        return Err(bad(format!(
            "a weight split {parts} ways cannot be shared by {devices} devices; expected a \
             number of parts dividing {devices}"
        )));
    }
    Ok(device * parts / devices)
}

/// Equal range `part` of `parts` over `len` values.
fn range_of(
    len: usize,
    part: usize,
    parts: usize,
    what: &str,
) -> Result<(usize, usize), BackendError> {
    if !len.is_multiple_of(parts) {
        return Err(bad(format!(
            "{len} {what} do not split into {parts} equal parts"
        )));
    }
    let each = len / parts;
    Ok((part * each, (part + 1) * each))
}

/// What device `device` of `devices` holds of `m`.
pub fn matrix_share(
    m: &HostMatrix,
    split: Split,
    device: usize,
    devices: usize,
) -> Result<HostMatrix, BackendError> {
    match split {
        Split::Whole => Ok(m.clone()),
        Split::Outputs { parts } => {
            let part = part_of(parts, device, devices)?;
            let (r0, r1) = range_of(m.rows, part, parts, "rows")?;
            m.rows_range(r0, r1)
        }
        Split::Inputs => {
            let (c0, c1) = range_of(m.cols, device, devices, "columns")?;
            m.cols_range(c0, c1)
        }
    }
}

/// What device `device` of `devices` holds of a 1-D weight.
pub fn vector_share(
    values: &[f32],
    split: Split,
    device: usize,
    devices: usize,
) -> Result<&[f32], BackendError> {
    match split {
        Split::Whole => Ok(values),
        Split::Outputs { parts } => {
            let part = part_of(parts, device, devices)?;
            let (a, b) = range_of(values.len(), part, parts, "values")?;
            Ok(&values[a..b])
        }
        Split::Inputs => Err(bad(
            "a 1-D weight has no input features to split (a row-split projection's bias stays \
             whole)"
                .into(),
        )),
    }
}

impl<B: Backend, R: Reduce<B>> TensorParallel<B, R> {
    /// `ranks[d]` runs on device `d`; `reduce` sums over all of them.
    pub fn new(ranks: Vec<B>, reduce: R) -> Result<Self, BackendError> {
        if ranks.is_empty() {
            return Err(bad(
                "a tensor-parallel group needs at least one device".into()
            ));
        }
        Ok(TensorParallel { ranks, reduce })
    }

    /// The rank backends, in device order.
    pub fn ranks(&self) -> &[B] {
        &self.ranks
    }

    /// Runs `load` on every rank; the ranks hand out the same id, as they
    /// take the same weights in the same order.
    fn load_each<T: PartialEq + Copy + std::fmt::Debug>(
        &mut self,
        mut load: impl FnMut(&mut B, usize) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut first = None;
        for (d, rank) in self.ranks.iter_mut().enumerate() {
            let id = load(rank, d)?;
            match first {
                None => first = Some(id),
                Some(f) if f != id => {
                    return Err(bad(format!(
                        "device {d} gave weight id {id:?} where device 0 gave {f:?}"
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(first.expect("at least one rank"))
    }
}

impl<B: Backend, R: Reduce<B>> Backend for TensorParallel<B, R> {
    fn name(&self) -> &'static str {
        self.ranks[0].name()
    }

    /// The tightest device: the least free memory of any rank.
    fn memory(&self) -> DeviceMemory {
        let mut m = self.ranks[0].memory();
        for r in &self.ranks[1..] {
            m.free = m.free.min(r.memory().free);
        }
        m
    }

    fn reads_host_weights(&self) -> bool {
        self.ranks[0].reads_host_weights()
    }

    fn devices(&self) -> usize {
        self.ranks.len()
    }

    fn load_matrix(&mut self, matrix: HostMatrix) -> Result<MatrixId, BackendError> {
        self.load_split_matrix(matrix, Split::Whole)
    }

    fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError> {
        self.load_split_vector(values, Split::Whole)
    }

    fn load_split_matrix(
        &mut self,
        matrix: HostMatrix,
        split: Split,
    ) -> Result<MatrixId, BackendError> {
        let n = self.ranks.len();
        self.load_each(|rank, d| rank.load_matrix(matrix_share(&matrix, split, d, n)?))
    }

    fn load_split_vector(
        &mut self,
        values: &[f32],
        split: Split,
    ) -> Result<VectorId, BackendError> {
        let n = self.ranks.len();
        self.load_each(|rank, d| rank.load_vector(vector_share(values, split, d, n)?))
    }

    fn all_reduce(&mut self, x: Buf, rows: usize, width: usize) {
        self.reduce.all_reduce(&mut self.ranks, x, rows, width);
    }

    fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.embed(table, tokens, scale, out));
    }

    fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.matmul(w, x, rows, out));
    }

    fn matmul_many(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf]) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.matmul_many(ws, x, rows, outs));
    }

    fn rms_norm(&mut self, x: Buf, w: VectorId, eps: f32, rows: usize, width: usize, out: Buf) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.rms_norm(x, w, eps, rows, width, out));
    }

    fn head_norm(
        &mut self,
        x: Buf,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    ) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.head_norm(x, w, eps, rows, width, head_dim));
    }

    fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.add_bias(x, b, rows, width));
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.add(dst, src, rows, width));
    }

    fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.gather_rows(src, src_rows, width, dst));
    }

    fn rope(&mut self, x: Buf, step: &Step, n_heads: usize, head_dim: usize, rope: &RopeParams) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.rope(x, step, n_heads, head_dim, rope));
    }

    fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.glu(gate, up, rows, width, act));
    }

    fn matmul_glu(
        &mut self,
        w: [MatrixId; 2],
        x: Buf,
        rows: usize,
        act: Glu,
        out: [Buf; 2],
        width: usize,
    ) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.matmul_glu(w, x, rows, act, out, width));
    }

    fn add_rms_norm(
        &mut self,
        dst: Buf,
        src: Buf,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        out: Buf,
    ) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.add_rms_norm(dst, src, w, eps, rows, width, out));
    }

    fn attention(&mut self, layer: usize, shape: &AttentionShape, step: &Step, io: AttentionIo) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.attention(layer, shape, step, io));
    }

    fn kv_write(&mut self, layer: usize, step: &Step, k: Buf, v: Buf, shape: &AttentionShape) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.kv_write(layer, step, k, v, shape));
    }

    fn attend(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        rope: &RopeParams,
    ) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.attend(layer, shape, step, io, rope));
    }

    fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    ) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.route_experts(logits, rows, n_experts, k, normalize));
    }

    /// Every rank routes the same rows (their router inputs are equal), so
    /// rank 0's count is every rank's.
    fn gather_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) -> usize {
        let counts = self
            .ranks
            .iter_mut()
            .map(|r| r.gather_expert_rows(expert, rows, k, src, width, dst));
        let mut first = None;
        for (d, n) in counts.enumerate() {
            match first {
                None => first = Some(n),
                Some(f) => assert_eq!(
                    f, n,
                    "device {d} routed {n} rows to expert {expert}, device 0 {f}"
                ),
            }
        }
        first.unwrap_or(0)
    }

    fn scatter_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.scatter_expert_rows(expert, rows, k, src, width, dst));
    }

    fn zero(&mut self, x: Buf, rows: usize, width: usize) {
        self.ranks.iter_mut().for_each(|r| r.zero(x, rows, width));
    }

    /// Rank 0's: every rank holds the same rows where a crossing reads.
    fn read_rows(&mut self, x: Buf, rows: usize, width: usize, out: &mut [f32]) {
        self.ranks[0].read_rows(x, rows, width, out)
    }

    fn write_rows(&mut self, x: Buf, rows: usize, width: usize, values: &[f32], start: bool) {
        self.ranks
            .iter_mut()
            .for_each(|r| r.write_rows(x, rows, width, values, start));
    }

    /// Rank 0's: every rank computed the same logits.
    fn logits(&mut self, rows: usize, width: usize) -> &mut [f32] {
        self.ranks[0].logits(rows, width)
    }

    fn greedy(&mut self, rows: usize, width: usize, banned: &[u32], out: &mut [[u32; 2]]) {
        self.ranks[0].greedy(rows, width, banned, out)
    }

    fn take_error(&mut self) -> Option<BackendError> {
        let mut first = None;
        for (d, r) in self.ranks.iter_mut().enumerate() {
            if let Some(e) = r.take_error() {
                first.get_or_insert(if d == 0 {
                    e
                } else {
                    bad(format!("device {d}: {e}"))
                });
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_heads_fewer_than_devices_are_held_by_neighbours() {
        // 2 KV heads over 4 devices: devices 0 and 1 hold head 0, 2 and 3
        // head 1 (their query heads are 0..H/2 and H/2..H).
        let parts: Vec<usize> = (0..4).map(|d| part_of(2, d, 4).unwrap()).collect();
        assert_eq!(parts, [0, 0, 1, 1]);
        assert_eq!(part_of(4, 3, 4).unwrap(), 3);
        let e = part_of(3, 0, 4).unwrap_err().to_string();
        assert!(e.contains("split 3 ways") && e.contains("4 devices"), "{e}");
    }

    #[test]
    fn vectors_split_by_output_and_refuse_input_splits() {
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let split = Split::Outputs { parts: 2 };
        assert_eq!(vector_share(&v, split, 1, 2).unwrap(), &v[4..]);
        assert_eq!(vector_share(&v, Split::Whole, 1, 2).unwrap(), &v[..]);
        assert!(vector_share(&v, Split::Inputs, 0, 2).is_err());
        let e = vector_share(&v[..7], split, 0, 2).unwrap_err().to_string();
        assert!(e.contains("7 values do not split into 2"), "{e}");
    }
}
