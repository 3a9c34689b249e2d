//! The paged KV block pool: the only KV store.
//!
//! Each layer group of the plan (layers sharing attention kind and KV
//! shape) has one pool of fixed-size blocks allocated at start-up. A block
//! holds `KV_BLOCK_TOKENS` consecutive positions of K and V for every layer
//! of its group; each sequence has a page table per group. Full-attention
//! groups take a block as a sequence reaches it; sliding-window groups
//! reuse a ring of blocks sized to the window, so they never hold more
//! than the window.

use fathom_kernels::ops;
use fathom_plan::kv::{KvGroup, KV_BLOCK_TOKENS};
use fathom_plan::KvDtype;

use crate::prefix::{PrefixIndex, ROOT};

const BLOCK: usize = KV_BLOCK_TOKENS as usize;

/// One layer group's pool.
struct GroupPool {
    k_width: usize,
    v_width: usize,
    k_row: usize,
    v_row: usize,
    /// Sliding window, or `None` for full attention.
    window: Option<usize>,
    /// Blocks one sequence may hold in this group.
    blocks_per_sequence: usize,
    block_bytes: usize,
    data: Vec<u8>,
    free: Vec<u32>,
    /// Sequences holding each block (more than one when a prefix is shared).
    refs: Vec<u32>,
}

impl GroupPool {
    fn new(g: &KvGroup, dtype: KvDtype) -> Self {
        let k_width = (g.n_kv_heads * g.key_dim) as usize;
        let v_width = (g.n_kv_heads * g.value_dim) as usize;
        let k_row = dtype.row_bytes(k_width as u64) as usize;
        let v_row = dtype.row_bytes(v_width as u64) as usize;
        let layers = g.layers as usize;
        let blocks_per_sequence = g.blocks_per_sequence as usize;
        let block_bytes = layers * BLOCK * (k_row + v_row);
        // The plan sized the group's bytes: sequences x blocks each, or a
        // server's shared pool.
        let n_blocks = g.bytes as usize / block_bytes.max(1);
        GroupPool {
            k_width,
            v_width,
            k_row,
            v_row,
            window: g.window.map(|w| w as usize),
            blocks_per_sequence,
            block_bytes,
            data: vec![0u8; n_blocks * block_bytes],
            // Popped from the end: hand out low block numbers first.
            free: (0..n_blocks as u32).rev().collect(),
            refs: vec![0; n_blocks],
        }
    }

    /// Byte offset of (block, layer-in-group, slot) for K, and for V.
    fn offsets(&self, block: u32, layer: usize, slot: usize) -> (usize, usize) {
        let base = block as usize * self.block_bytes + layer * BLOCK * (self.k_row + self.v_row);
        (
            base + slot * self.k_row,
            base + BLOCK * self.k_row + slot * self.v_row,
        )
    }
}

/// How the pool's blocks are used, for metrics and admission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub total: usize,
    /// Held by at least one sequence.
    pub used: usize,
    /// Cached for prefix reuse, held by none (evictable).
    pub cached: usize,
}

/// Where each model layer's KV lives: its group and index in the group.
#[derive(Clone, Copy)]
struct LayerSlot {
    group: usize,
    index: usize,
}

/// The pool for every group, sized by the plan.
pub struct KvPool {
    dtype: KvDtype,
    groups: Vec<GroupPool>,
    layers: Vec<Option<LayerSlot>>,
    /// The prefix cache, when enabled (one full-attention group only).
    prefix: Option<PrefixIndex>,
}

/// One sequence's page tables and length.
pub struct SeqKv {
    tables: Vec<Vec<u32>>,
    /// Positions written so far.
    pub len: usize,
    /// Leading full blocks named in the prefix index, and the last's name.
    named: usize,
    chain: u64,
}

/// A borrowed view of one layer's cached positions, for attention.
pub struct LayerKv<'a> {
    pool: &'a GroupPool,
    table: &'a [u32],
    layer: usize,
    dtype: KvDtype,
    head_k: usize,
    head_v: usize,
}

impl KvPool {
    /// Allocates the plan's pool. `layer_groups`
    /// gives each model layer's group in the plan's `kv_detail` order (as
    /// `kv::plan` formed them), or `None` for layers without attention.
    pub fn new(plan_groups: &[KvGroup], dtype: KvDtype, layer_groups: &[Option<usize>]) -> Self {
        let groups: Vec<GroupPool> = plan_groups
            .iter()
            .map(|g| GroupPool::new(g, dtype))
            .collect();
        let mut seen = vec![0usize; groups.len()];
        let layers = layer_groups
            .iter()
            .map(|g| {
                g.map(|group| {
                    let index = seen[group];
                    seen[group] += 1;
                    LayerSlot { group, index }
                })
            })
            .collect();
        KvPool {
            dtype,
            groups,
            layers,
            prefix: None,
        }
    }

    /// Keeps finished sequences' full blocks for reuse by later sequences
    /// with the same prefix, up to `capacity` blocks no sequence holds.
    /// Only a pool of one full-attention group can share blocks (a
    /// sliding window's ring overwrites its blocks); returns whether the
    /// cache is on.
    pub fn enable_prefix_cache(&mut self, capacity: usize) -> bool {
        match self.groups.as_slice() {
            [g] if g.window.is_none() && capacity > 0 => {
                self.prefix = Some(PrefixIndex::new(g.refs.len(), capacity));
                true
            }
            _ => false,
        }
    }

    /// Blocks of the first group: all, free (incl. evictable cached ones)
    /// and cached-but-unheld.
    pub fn block_counts(&self) -> BlockCounts {
        let cached = self.prefix.as_ref().map_or(0, PrefixIndex::unheld);
        self.groups
            .first()
            .map_or(BlockCounts::default(), |g| BlockCounts {
                total: g.refs.len(),
                used: g.refs.len() - g.free.len() - cached,
                cached,
            })
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes held by the pool: the plan's `kv` term.
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(|g| g.data.len()).sum()
    }

    /// A new, empty sequence. Its page tables are sized once, here.
    pub fn new_sequence(&self) -> SeqKv {
        SeqKv {
            tables: self
                .groups
                .iter()
                .map(|g| Vec::with_capacity(g.blocks_per_sequence))
                .collect(),
            len: 0,
            named: 0,
            chain: ROOT,
        }
    }

    /// A new sequence for `tokens` that starts after the longest cached
    /// prefix of whole blocks (its `len` is the tokens reused), leaving at
    /// least one token to run so the sequence gets logits.
    pub fn start_sequence(&mut self, tokens: &[u32]) -> SeqKv {
        let mut seq = self.new_sequence();
        let Some(prefix) = self.prefix.as_mut() else {
            return seq;
        };
        let g = &mut self.groups[0];
        let usable = tokens.len().saturating_sub(1) / BLOCK;
        for block_tokens in tokens.chunks_exact(BLOCK).take(usable) {
            let Some((block, name)) = prefix.find(seq.chain, block_tokens) else {
                break;
            };
            if g.refs[block as usize] == 0 {
                prefix.hold(block);
            }
            g.refs[block as usize] += 1;
            seq.tables[0].push(block);
            seq.chain = name;
            seq.named += 1;
        }
        seq.len = seq.named * BLOCK;
        seq
    }

    /// Names the sequence's newly filled blocks in the prefix index;
    /// `tokens` are the sequence's tokens, at least `seq.len` of them.
    pub fn commit(&mut self, seq: &mut SeqKv, tokens: &[u32]) {
        let Some(prefix) = self.prefix.as_mut() else {
            return;
        };
        while (seq.named + 1) * BLOCK <= seq.len {
            let block = seq.tables[0][seq.named];
            let span = seq.named * BLOCK..(seq.named + 1) * BLOCK;
            seq.chain = prefix.insert(block, seq.chain, &tokens[span]);
            seq.named += 1;
        }
    }

    /// Gives a finished sequence's blocks back: to the prefix cache when
    /// they are named there and no other sequence holds them, else free.
    pub fn release(&mut self, seq: &mut SeqKv) {
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            for block in table.drain(..) {
                let refs = &mut g.refs[block as usize];
                *refs -= 1;
                if *refs > 0 {
                    continue;
                }
                match self.prefix.as_mut() {
                    Some(prefix) if prefix.is_indexed(block) => {
                        g.free.extend(prefix.release(block));
                    }
                    _ => g.free.push(block),
                }
            }
        }
        seq.len = 0;
        seq.named = 0;
        seq.chain = ROOT;
    }

    /// Makes sure `seq` has blocks for positions up to `end` (exclusive).
    /// Returns false when the pool has no free block (the caller preempts
    /// or refuses).
    pub fn reserve(&mut self, seq: &mut SeqKv, end: usize) -> bool {
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            let needed = end.div_ceil(BLOCK).min(g.blocks_per_sequence);
            while table.len() < needed {
                // A free block, else the least recently used cached one.
                let block = g
                    .free
                    .pop()
                    .or_else(|| self.prefix.as_mut().and_then(PrefixIndex::evict));
                match block {
                    Some(block) => {
                        g.refs[block as usize] = 1;
                        table.push(block);
                    }
                    None => return false,
                }
            }
        }
        true
    }

    /// Stores K and V of `layer` at `pos` (blocks already reserved).
    pub fn write(&mut self, seq: &SeqKv, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let Some(slot) = self.layers[layer] else {
            return;
        };
        let dtype = self.dtype;
        let g = &mut self.groups[slot.group];
        let table = &seq.tables[slot.group];
        let capacity = g.blocks_per_sequence * BLOCK;
        // Sliding groups wrap around their ring; full groups never wrap.
        let ring_pos = if g.window.is_some() {
            pos % capacity
        } else {
            pos
        };
        let block = table[ring_pos / BLOCK];
        let (ko, vo) = g.offsets(block, slot.index, ring_pos % BLOCK);
        let (k_row, v_row, k_width, v_width) = (g.k_row, g.v_row, g.k_width, g.v_width);
        store(dtype, &k[..k_width], &mut g.data[ko..ko + k_row]);
        store(dtype, &v[..v_width], &mut g.data[vo..vo + v_row]);
    }

    /// The cached K and V of `layer` for `seq`; `head_k`/`head_v` are one
    /// head's widths.
    pub fn layer<'a>(
        &'a self,
        seq: &'a SeqKv,
        layer: usize,
        head_k: usize,
        head_v: usize,
    ) -> Option<LayerKv<'a>> {
        let slot = self.layers[layer]?;
        Some(LayerKv {
            pool: &self.groups[slot.group],
            table: &seq.tables[slot.group],
            layer: slot.index,
            dtype: self.dtype,
            head_k,
            head_v,
        })
    }
}

impl KvPool {
    /// Rounds `x` (rows of heads of `head_dim` values) to what the cache
    /// will store. The chunk's own K and V are read from the arena, so
    /// rounding them keeps attention identical whether a position comes
    /// from the arena or the cache; llama.cpp likewise reads even the
    /// current chunk from its f16 cache.
    pub fn round_to_cache(&self, x: &mut [f32], head_dim: usize) {
        round_to(self.dtype, x, head_dim);
    }
}

/// Rounds `x` to `dtype`'s precision in place, head by head.
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
        KvDtype::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&ops::f32_to_f16(*s).to_le_bytes());
            }
        }
        KvDtype::Bf16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                // Round to nearest even, as converters do.
                let bits = s.to_bits();
                let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
                d.copy_from_slice(&((rounded >> 16) as u16).to_le_bytes());
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
    /// Loads K and V of KV head `head` at `pos` into `k` and `v`. Heads are
    /// whole q8_0 blocks (head dims are multiples of 32, checked at load),
    /// so each head dequantizes on its own.
    pub fn load(&self, pos: usize, head: usize, k: &mut [f32], v: &mut [f32]) {
        let g = self.pool;
        let capacity = g.blocks_per_sequence * BLOCK;
        let ring_pos = if g.window.is_some() {
            pos % capacity
        } else {
            pos
        };
        let block = self.table[ring_pos / BLOCK];
        let (ko, vo) = g.offsets(block, self.layer, ring_pos % BLOCK);
        let (kb, vb) = (
            self.dtype.row_bytes(self.head_k as u64) as usize,
            self.dtype.row_bytes(self.head_v as u64) as usize,
        );
        let ks = ko + head * kb;
        load(self.dtype, &g.data[ks..ks + kb], k);
        let vs = vo + head * vb;
        load(self.dtype, &g.data[vs..vs + vb], v);
    }
}
