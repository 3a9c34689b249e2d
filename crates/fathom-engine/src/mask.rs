//! Token masks: the set of tokens a constraint (a JSON schema, a grammar)
//! allows next, one bit per vocabulary entry, applied before sampling.

/// A set of token ids: bit `id` of the words is set when `id` is allowed.
/// Ids at or past [`TokenMask::len`] are never allowed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// A mask over `len` ids, none allowed.
    pub fn new(len: usize) -> Self {
        TokenMask {
            words: vec![0; len.div_ceil(32)],
            len,
        }
    }

    /// Bytes a mask over `len` ids holds.
    pub fn bytes_for(len: usize) -> usize {
        len.div_ceil(32) * 4
    }

    /// Ids the mask ranges over.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Disallows every id.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// The words, bit `id % 32` of word `id / 32` for id; bits past
    /// `len` must stay clear.
    pub fn words_mut(&mut self) -> &mut [u32] {
        &mut self.words
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn allow(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.words[id as usize / 32] |= 1 << (id % 32);
        }
    }

    pub fn disallow(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.words[id as usize / 32] &= !(1 << (id % 32));
        }
    }

    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.len && self.words[id as usize / 32] & (1 << (id % 32)) != 0
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 32 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_holds_exactly_the_ids_allowed() {
        let mut m = TokenMask::new(70);
        assert_eq!(m.count(), 0);
        for id in [0, 31, 32, 69, 70, 1000] {
            m.allow(id);
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), [0, 31, 32, 69]);
        assert!(m.allows(69) && !m.allows(70) && !m.allows(5));
        m.disallow(31);
        assert_eq!(m.count(), 3);
        m.clear();
        assert_eq!(m.iter().count(), 0);
        assert_eq!(TokenMask::bytes_for(70), 12);
    }
}
