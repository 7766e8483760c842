//! Which queue slots still hold a waiting buyer, and how many of them lie before a slot:
//! the exact position of a buyer even after others ahead have left.
//!
//! A bitmap (one bit per slot) with a Fenwick tree over its 64-bit words: a position is a
//! prefix sum of whole words plus a popcount inside one word, O(log n), and the whole
//! structure costs about 1.5 bits per slot instead of the 4 bytes a per-slot Fenwick tree
//! would (the room's budget is 64 bytes per waiting buyer).

/// A growable set of slot numbers that counts its members below any slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveSet {
    words: Vec<u64>,
    /// Fenwick tree over `words`' popcounts; `tree[k - 1]` is node `k` (1-based).
    tree: Vec<u32>,
}

impl LiveSet {
    /// Sum of the popcounts of `words[..k]`.
    fn prefix(&self, k: usize) -> u32 {
        let (mut sum, mut i) = (0u32, k);
        while i > 0 {
            sum = sum.wrapping_add(self.tree[i - 1]);
            i &= i - 1;
        }
        sum
    }

    fn add(&mut self, word: usize, delta: u32) {
        let mut i = word + 1;
        while i <= self.tree.len() {
            self.tree[i - 1] = self.tree[i - 1].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Appends an empty word: its node covers the words `(k - lowbit(k), k]`, whose sum
    /// is known from the prefixes already in the tree (slots only ever grow at the end).
    fn push_word(&mut self) {
        let k = self.words.len() + 1;
        let low = k & k.wrapping_neg();
        let node = self.prefix(k - 1).wrapping_sub(self.prefix(k - low));
        self.words.push(0);
        self.tree.push(node);
    }

    /// Adds `slot`. Adding a member twice is a bug of the caller.
    pub fn insert(&mut self, slot: u32) {
        let w = (slot / 64) as usize;
        while self.words.len() <= w {
            self.push_word();
        }
        let bit = 1u64 << (slot % 64);
        debug_assert_eq!(self.words[w] & bit, 0, "slot {slot} inserted twice");
        if self.words[w] & bit == 0 {
            self.words[w] |= bit;
            self.add(w, 1);
        }
    }

    /// Removes `slot` if present; returns whether it was.
    pub fn remove(&mut self, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        let bit = 1u64 << (slot % 64);
        match self.words.get_mut(w) {
            Some(word) if *word & bit != 0 => {
                *word &= !bit;
                self.add(w, 1u32.wrapping_neg());
                true
            }
            _ => false,
        }
    }

    /// Whether `slot` is a member.
    #[cfg(test)]
    pub fn contains(&self, slot: u32) -> bool {
        let w = (slot / 64) as usize;
        self.words
            .get(w)
            .is_some_and(|word| word & (1u64 << (slot % 64)) != 0)
    }

    /// Members below `slot`.
    pub fn count_before(&self, slot: u32) -> u32 {
        let w = (slot / 64) as usize;
        if w >= self.words.len() {
            return self.prefix(self.words.len());
        }
        let below = self.words[w] & ((1u64 << (slot % 64)) - 1);
        self.prefix(w) + below.count_ones()
    }

    /// Heap bytes held (capacity, not length: what the allocator really gave).
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8 + self.tree.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Agrees with a plain `Vec<bool>` on every count, through inserts and removals.
        #[test]
        fn counts_agree_with_a_naive_set(
            ops in proptest::collection::vec((any::<bool>(), 0u32..700), 0..300)
        ) {
            let mut set = LiveSet::default();
            let mut naive = vec![false; 700];
            for (add, slot) in ops {
                if add && !naive[slot as usize] {
                    set.insert(slot);
                    naive[slot as usize] = true;
                } else if !add {
                    prop_assert_eq!(set.remove(slot), naive[slot as usize]);
                    naive[slot as usize] = false;
                }
            }
            for s in 0..720u32 {
                let want = naive.iter().take(s as usize).filter(|&&b| b).count() as u32;
                prop_assert_eq!(set.count_before(s), want);
                prop_assert_eq!(set.contains(s), naive.get(s as usize) == Some(&true));
            }
        }
    }
}
