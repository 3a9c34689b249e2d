//! KV storage on the host: one byte pool per layer group, read and
//! written through the backend's attention and KV-write ops. Which block a
//! sequence's position lives in is the engine's bookkeeping; it arrives
//! with each step as page tables.

use fathom_kernels::ops;
use fathom_plan::kv::{KvGroup, KV_BLOCK_TOKENS};
use fathom_plan::KvDtype;

use crate::KvLayout;

const BLOCK: usize = KV_BLOCK_TOKENS as usize;

/// One layer group's blocks.
struct GroupStore {
    k_width: usize,
    v_width: usize,
    k_row: usize,
    v_row: usize,
    /// Sliding groups wrap around a ring of this many positions.
    ring: Option<usize>,
    block_bytes: usize,
    data: Vec<u8>,
}

impl GroupStore {
    fn new(g: &KvGroup, dtype: KvDtype) -> Self {
        let k_width = (g.n_kv_heads * g.key_dim) as usize;
        let v_width = (g.n_kv_heads * g.value_dim) as usize;
        GroupStore {
            k_width,
            v_width,
            k_row: dtype.row_bytes(k_width as u64) as usize,
            v_row: dtype.row_bytes(v_width as u64) as usize,
            ring: g.window.map(|_| g.blocks_per_sequence as usize * BLOCK),
            block_bytes: g.block_bytes() as usize,
            data: vec![0u8; (g.n_blocks() * g.block_bytes()) as usize],
        }
    }

    /// Byte offsets of K and V of layer `layer` (in the group) at `pos`,
    /// through the sequence's page `table`.
    fn offsets(&self, table: &[u32], layer: usize, pos: usize) -> (usize, usize) {
        let pos = self.ring.map_or(pos, |ring| pos % ring);
        let block = table[pos / BLOCK] as usize;
        let slot = pos % BLOCK;
        let base = block * self.block_bytes + layer * BLOCK * (self.k_row + self.v_row);
        (
            base + slot * self.k_row,
            base + BLOCK * self.k_row + slot * self.v_row,
        )
    }
}

/// Every group's storage, sized by the plan.
pub struct KvStore {
    dtype: KvDtype,
    groups: Vec<GroupStore>,
    /// Each model layer's (group, index in group).
    layers: Vec<Option<(usize, usize)>>,
}

/// One layer's cached positions of one sequence, for attention.
pub struct LayerKv<'a> {
    group: &'a GroupStore,
    table: &'a [u32],
    layer: usize,
    dtype: KvDtype,
    head_k: usize,
    head_v: usize,
}

impl KvStore {
    pub fn new(layout: &KvLayout) -> Self {
        KvStore {
            dtype: layout.dtype,
            groups: layout
                .groups
                .iter()
                .map(|g| GroupStore::new(g, layout.dtype))
                .collect(),
            layers: layout.layer_slots(),
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes held: the plan's `kv` term.
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(|g| g.data.len()).sum()
    }

    /// Stores K and V of `layer` at `pos` of the sequence with page
    /// `tables` (blocks already reserved).
    pub fn write(&mut self, tables: &[Vec<u32>], layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let Some((group, index)) = self.layers[layer] else {
            return;
        };
        let dtype = self.dtype;
        let g = &mut self.groups[group];
        let (ko, vo) = g.offsets(&tables[group], index, pos);
        let (k_row, v_row, k_width, v_width) = (g.k_row, g.v_row, g.k_width, g.v_width);
        store(dtype, &k[..k_width], &mut g.data[ko..ko + k_row]);
        store(dtype, &v[..v_width], &mut g.data[vo..vo + v_row]);
    }

    /// The cached K and V of `layer` for the sequence with page `tables`;
    /// `head_k`/`head_v` are one head's widths.
    pub fn layer<'a>(
        &'a self,
        tables: &'a [Vec<u32>],
        layer: usize,
        head_k: usize,
        head_v: usize,
    ) -> Option<LayerKv<'a>> {
        let (group, index) = self.layers[layer]?;
        Some(LayerKv {
            group: &self.groups[group],
            table: &tables[group],
            layer: index,
            dtype: self.dtype,
            head_k,
            head_v,
        })
    }
}

/// Rounds `x` to `dtype`'s precision in place, head by head. The step's
/// own K and V are read from the arena, so rounding them keeps attention
/// identical whether a position comes from the arena or the cache;
/// llama.cpp likewise reads even the current chunk from its f16 cache.
pub fn round_to(dtype: KvDtype, x: &mut [f32], head_dim: usize) {
    const MAX_HEAD_BYTES: usize = 4 * 1024;
    let mut bytes = [0u8; MAX_HEAD_BYTES];
    let n = dtype.row_bytes(head_dim as u64) as usize;
    if dtype == KvDtype::F32 || n > MAX_HEAD_BYTES {
        return;
    }
    for head in x.chunks_exact_mut(head_dim) {
        store(dtype, head, &mut bytes[..n]);
        load(dtype, &bytes[..n], head);
    }
}

fn store(dtype: KvDtype, src: &[f32], dst: &mut [u8]) {
    match dtype {
        KvDtype::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        KvDtype::F16 => ops::f32_to_f16_bytes_row(src, dst),
        KvDtype::Bf16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&fathom_ggml::f32_to_bf16(*s).to_le_bytes());
            }
        }
        KvDtype::Q8_0 => ops::quantize_q8_0_row(src, dst),
    }
}

fn load(dtype: KvDtype, src: &[u8], dst: &mut [f32]) {
    match dtype {
        KvDtype::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        KvDtype::F16 => ops::f16_bytes_to_f32_row(src, dst),
        KvDtype::Bf16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = ops::bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        KvDtype::Q8_0 => ops::dequantize_q8_0_row(src, dst),
    }
}

impl LayerKv<'_> {
    /// Loads K and V of KV head `head` at positions `pos .. pos + n` into
    /// rows of `k` and `v` (`head_k` / `head_v` values each). A cache
    /// block's slots are consecutive rows, so each run of positions within
    /// one block is one strided load. Heads are whole q8_0 blocks (head
    /// dims are multiples of 32, checked at load), so each head
    /// dequantizes on its own.
    pub fn load_block(&self, pos: usize, n: usize, head: usize, k: &mut [f32], v: &mut [f32]) {
        let g = self.group;
        let (dk, dv) = (self.head_k, self.head_v);
        let (kb, vb) = (
            self.dtype.row_bytes(dk as u64) as usize,
            self.dtype.row_bytes(dv as u64) as usize,
        );
        let mut i = 0;
        while i < n {
            let p = pos + i;
            let slot = g.ring.map_or(p, |ring| p % ring) % BLOCK;
            let run = (BLOCK - slot).min(n - i);
            let (ko, vo) = g.offsets(self.table, self.layer, p);
            let (ks, vs) = (ko + head * kb, vo + head * vb);
            let (kd, vd) = (
                &mut k[i * dk..(i + run) * dk],
                &mut v[i * dv..(i + run) * dv],
            );
            if self.dtype == KvDtype::F16 {
                ops::f16_bytes_to_f32_rows(&g.data[ks..], g.k_row, dk, kd);
                ops::f16_bytes_to_f32_rows(&g.data[vs..], g.v_row, dv, vd);
            } else {
                for j in 0..run {
                    let (kr, vr) = (ks + j * g.k_row, vs + j * g.v_row);
                    load(
                        self.dtype,
                        &g.data[kr..kr + kb],
                        &mut kd[j * dk..(j + 1) * dk],
                    );
                    load(
                        self.dtype,
                        &g.data[vr..vr + vb],
                        &mut vd[j * dv..(j + 1) * dv],
                    );
                }
            }
            i += run;
        }
    }
}
