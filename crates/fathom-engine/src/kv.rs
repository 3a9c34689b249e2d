//! KV block bookkeeping: which blocks each sequence holds, on the host.
//!
//! Each layer group of the plan (layers sharing attention kind and KV
//! shape) has a fixed number of blocks; the backend stores their K and V
//! and reads them through the page tables kept here. A block holds
//! `KV_BLOCK_TOKENS` consecutive positions of every layer of its group.
//! Full-attention groups take a block as a sequence reaches it;
//! sliding-window groups reuse a ring of blocks sized to the window, so
//! they never hold more than the window. Full blocks can be shared between
//! sequences through the prefix index.

use fathom_plan::kv::{KvGroup, KV_BLOCK_TOKENS};

use crate::prefix::{PrefixIndex, ROOT};

const BLOCK: usize = KV_BLOCK_TOKENS as usize;

/// One layer group's blocks.
struct GroupBlocks {
    sliding: bool,
    /// Blocks one sequence may hold in this group.
    blocks_per_sequence: usize,
    free: Vec<u32>,
    /// Sequences holding each block (more than one when a prefix is shared).
    refs: Vec<u32>,
}

impl GroupBlocks {
    fn new(g: &KvGroup) -> Self {
        let n_blocks = g.n_blocks() as usize;
        GroupBlocks {
            sliding: g.window.is_some(),
            blocks_per_sequence: g.blocks_per_sequence as usize,
            // Popped from the end: hand out low block numbers first.
            free: (0..n_blocks as u32).rev().collect(),
            refs: vec![0; n_blocks],
        }
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

/// The blocks of every group, as the plan counts them.
pub struct KvBlocks {
    groups: Vec<GroupBlocks>,
    /// The prefix cache, when enabled (one full-attention group only).
    prefix: Option<PrefixIndex>,
    /// A hybrid model's free recurrent-state slots (the plan's
    /// `recurrent_state` sequences); `None` for a model without
    /// linear-attention layers.
    free_states: Option<Vec<u32>>,
}

/// One sequence's page tables (one per group, block ids in position
/// order) and length.
pub struct SeqKv {
    tables: Vec<Vec<u32>>,
    /// Positions written so far.
    pub len: usize,
    /// Leading full blocks named in the prefix index, and the last's name.
    named: usize,
    chain: u64,
    /// The recurrent-state slot (hybrid models), taken by the first
    /// [`KvBlocks::reserve`] and given back with the blocks.
    state: Option<u32>,
}

impl SeqKv {
    /// The page tables, one per KV group, for the backend.
    pub fn tables(&self) -> &[Vec<u32>] {
        &self.tables
    }

    /// The recurrent-state slot the backend keeps this sequence's
    /// linear-attention state in (0 for a model without one).
    pub fn state_slot(&self) -> usize {
        self.state.map_or(0, |s| s as usize)
    }
}

impl KvBlocks {
    /// The pool for the plan's KV groups and, for a hybrid model, its
    /// `recurrent_slots` state slots.
    pub fn new(plan_groups: &[KvGroup], recurrent_slots: Option<u64>) -> Self {
        KvBlocks {
            groups: plan_groups.iter().map(GroupBlocks::new).collect(),
            prefix: None,
            free_states: recurrent_slots.map(|n| (0..n as u32).rev().collect()),
        }
    }

    /// Keeps finished sequences' full blocks for reuse by later sequences
    /// with the same prefix, up to `capacity` blocks no sequence holds.
    /// Only a pool of one full-attention group can share blocks (a
    /// sliding window's ring overwrites its blocks), and only a model
    /// whose whole state after a prefix is in those blocks: a hybrid
    /// model's recurrent state is not, and restoring its blocks alone
    /// would run on from a wrong state. Returns whether the cache is on.
    pub fn enable_prefix_cache(&mut self, capacity: usize) -> bool {
        if self.free_states.is_some() {
            return false;
        }
        match self.groups.as_slice() {
            [g] if !g.sliding && capacity > 0 => {
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

    /// A new sequence for `tokens` that starts after the longest cached
    /// prefix of whole blocks (its `len` is the tokens reused; 0 without a
    /// prefix cache), leaving at least one token to run so the sequence
    /// gets logits. Its page tables are sized once, here.
    pub fn open(&mut self, tokens: &[u32]) -> SeqKv {
        let mut seq = SeqKv {
            tables: self
                .groups
                .iter()
                .map(|g| Vec::with_capacity(g.blocks_per_sequence))
                .collect(),
            len: 0,
            named: 0,
            chain: ROOT,
            state: None,
        };
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
        if let (Some(free), Some(state)) = (self.free_states.as_mut(), seq.state.take()) {
            free.push(state);
        }
        seq.len = 0;
        seq.named = 0;
        seq.chain = ROOT;
    }

    /// Makes sure `seq` has blocks for positions up to `end` (exclusive),
    /// and a recurrent-state slot for a hybrid model. Returns false when
    /// the pool has no free block or slot (the caller preempts or
    /// refuses).
    pub fn reserve(&mut self, seq: &mut SeqKv, end: usize) -> bool {
        if let (Some(free), None) = (self.free_states.as_mut(), seq.state) {
            match free.pop() {
                Some(slot) => seq.state = Some(slot),
                None => return false,
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One full-attention group of 8 blocks (2 layers of 64-byte tokens).
    fn group() -> KvGroup {
        KvGroup {
            attention: "full",
            window: None,
            layers: 2,
            n_kv_heads: 1,
            key_dim: 16,
            value_dim: 16,
            bytes_per_token_per_layer: 64,
            tokens: 64,
            blocks_per_sequence: 4,
            bytes: 8 * 2 * KV_BLOCK_TOKENS * 64,
        }
    }

    /// A hybrid model's sequences each take a state slot with their first
    /// blocks, wait when none is free, give it back when released, and
    /// never share a prefix.
    #[test]
    fn state_slots_are_taken_with_blocks_and_prefixes_are_not_cached() {
        let mut kv = KvBlocks::new(&[group()], Some(2));
        assert!(
            !kv.enable_prefix_cache(8),
            "a hybrid model has no prefix cache"
        );
        let (mut a, mut b, mut c) = (kv.open(&[]), kv.open(&[]), kv.open(&[]));
        assert!(kv.reserve(&mut a, 16) && kv.reserve(&mut b, 16));
        assert_ne!(a.state_slot(), b.state_slot());
        assert!(!kv.reserve(&mut c, 16), "both slots are held");
        kv.release(&mut c);
        kv.release(&mut a);
        assert!(kv.reserve(&mut c, 16));
        assert_ne!(c.state_slot(), b.state_slot());
        // A model without linear layers keeps its prefix cache.
        assert!(KvBlocks::new(&[group()], None).enable_prefix_cache(8));
    }
}
