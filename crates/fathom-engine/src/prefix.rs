//! The prefix cache's index over the KV pool: full blocks named by the
//! hash chain of their tokens, and the least-recently-used list of blocks
//! no sequence holds any more.
//!
//! A block's name is `hash(parent's name, its 16 tokens)`, so equal names
//! mean equal prefixes up to and including the block. Everything here is
//! sized for the pool's block count once, at start-up.

use std::collections::HashMap;

use fathom_plan::kv::KV_BLOCK_TOKENS;

const BLOCK: usize = KV_BLOCK_TOKENS as usize;
const NONE: u32 = u32::MAX;
/// The name of the empty prefix.
pub const ROOT: u64 = 0x6a09_e667_f3bc_c908;

/// The name of a block holding `tokens` after the prefix named `parent`.
pub fn block_name(parent: u64, tokens: &[u32]) -> u64 {
    // FNV-1a over the parent and the token ids, then a SplitMix64 finish:
    // deterministic across runs, and the index compares tokens anyway.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for word in std::iter::once(parent).chain(tokens.iter().map(|&t| u64::from(t))) {
        for byte in word.to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

pub struct PrefixIndex {
    /// Unheld cached blocks kept at most; more are freed, oldest first.
    capacity: usize,
    by_name: HashMap<u64, u32>,
    /// Per block: its name and its parent's, when indexed.
    names: Vec<Option<(u64, u64)>>,
    /// Per block: the tokens it holds, to confirm a name match.
    tokens: Vec<u32>,
    /// Unheld indexed blocks, oldest at `head`.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    unheld: usize,
}

impl PrefixIndex {
    pub fn new(blocks: usize, capacity: usize) -> Self {
        PrefixIndex {
            capacity,
            by_name: HashMap::with_capacity(blocks),
            names: vec![None; blocks],
            tokens: vec![0; blocks * BLOCK],
            prev: vec![NONE; blocks],
            next: vec![NONE; blocks],
            head: NONE,
            tail: NONE,
            unheld: 0,
        }
    }

    /// Blocks cached but held by no sequence (free to evict).
    pub fn unheld(&self) -> usize {
        self.unheld
    }

    /// The cached block that continues prefix `parent` with `tokens`.
    pub fn find(&self, parent: u64, tokens: &[u32]) -> Option<(u32, u64)> {
        let name = block_name(parent, tokens);
        let &block = self.by_name.get(&name)?;
        let b = block as usize;
        let same = self.names[b] == Some((name, parent))
            && self.tokens[b * BLOCK..(b + 1) * BLOCK] == *tokens;
        same.then_some((block, name))
    }

    pub fn is_indexed(&self, block: u32) -> bool {
        self.names[block as usize].is_some()
    }

    /// Names `block` (now full with `tokens` after `parent`); returns the
    /// name. A prefix already cached in another block keeps that block.
    pub fn insert(&mut self, block: u32, parent: u64, tokens: &[u32]) -> u64 {
        let name = block_name(parent, tokens);
        if let std::collections::hash_map::Entry::Vacant(entry) = self.by_name.entry(name) {
            entry.insert(block);
            let b = block as usize;
            self.names[b] = Some((name, parent));
            self.tokens[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(tokens);
        }
        name
    }

    /// Forgets `block` (it is about to hold other tokens).
    pub fn remove(&mut self, block: u32) {
        if let Some((name, _)) = self.names[block as usize].take() {
            self.by_name.remove(&name);
        }
    }

    /// A cached block no sequence holds any more: newest in the LRU list.
    /// Returns the block evicted to keep within capacity, if any.
    pub fn release(&mut self, block: u32) -> Option<u32> {
        let b = block as usize;
        self.prev[b] = self.tail;
        self.next[b] = NONE;
        if self.tail != NONE {
            self.next[self.tail as usize] = block;
        } else {
            self.head = block;
        }
        self.tail = block;
        self.unheld += 1;
        (self.unheld > self.capacity).then(|| self.evict().expect("the list is not empty"))
    }

    /// A sequence holds `block` again: out of the LRU list.
    pub fn hold(&mut self, block: u32) {
        let b = block as usize;
        let (p, n) = (self.prev[b], self.next[b]);
        if p != NONE {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.prev[b] = NONE;
        self.next[b] = NONE;
        self.unheld -= 1;
    }

    /// Takes the least recently used unheld block out of the cache.
    pub fn evict(&mut self) -> Option<u32> {
        let block = self.head;
        if block == NONE {
            return None;
        }
        self.hold(block);
        self.remove(block);
        Some(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(start: u32) -> Vec<u32> {
        (start..start + BLOCK as u32).collect()
    }

    #[test]
    fn names_chain_and_matches_need_equal_tokens_and_parent() {
        let mut index = PrefixIndex::new(8, 8);
        let a = index.insert(3, ROOT, &toks(0));
        let b = index.insert(5, a, &toks(16));
        assert_eq!(index.find(ROOT, &toks(0)), Some((3, a)));
        assert_eq!(index.find(a, &toks(16)), Some((5, b)));
        assert_eq!(
            index.find(ROOT, &toks(16)),
            None,
            "same tokens, other prefix"
        );
        assert_eq!(index.find(a, &toks(17)), None);
        // A second block with an already cached prefix is not indexed.
        assert_eq!(index.insert(6, ROOT, &toks(0)), a);
        assert!(!index.is_indexed(6));
    }

    #[test]
    fn unheld_blocks_leave_least_recently_used_first_within_capacity() {
        let mut index = PrefixIndex::new(8, 2);
        let mut parent = ROOT;
        for b in 0..3u32 {
            parent = index.insert(b, parent, &toks(b * 16));
        }
        assert_eq!(index.release(0), None);
        assert_eq!(index.release(1), None);
        index.hold(0);
        assert_eq!(index.release(0), None, "0 is now the newest");
        assert_eq!(index.release(2), Some(1), "over capacity: the oldest goes");
        assert!(!index.is_indexed(1));
        assert_eq!(index.unheld(), 2);
        assert_eq!(index.evict(), Some(0));
        assert_eq!(index.evict(), Some(2));
        assert_eq!(index.evict(), None);
    }
}
