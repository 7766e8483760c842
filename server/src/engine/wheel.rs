//! A hierarchical timing wheel: O(1) insert and cancel, expiry work proportional to the
//! number of occupied slots passed, not to the time elapsed.
//!
//! Six levels of 64 slots at 1 ms resolution cover 64^6 ms (about 2.2 years); the engine
//! caps deadlines far below that. An entry lives in the level of the highest 6-bit group
//! in which its deadline differs from the wheel's `elapsed` time; when the wheel reaches
//! that slot the entry cascades to a lower level, until it fires at level 0. Entries are
//! kept in intrusive doubly-linked lists inside a slab so cancel is O(1). This is the
//! scheme of Varghese & Lauck, as also used by tokio's timer.

const LEVELS: usize = 6;
const SLOTS: usize = 64;
const NIL: u32 = u32::MAX;
/// Largest distance between `elapsed` and a deadline that the levels can represent.
pub const MAX_SPAN_MS: u64 = 1 << (6 * LEVELS as u64);

/// Names one entry; stale handles (after cancel or fire) are detected by generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    idx: u32,
    gen: u32,
}

struct Entry<T> {
    deadline: u64,
    value: Option<T>,
    level: u8,
    slot: u8,
    prev: u32,
    next: u32,
    gen: u32,
}

struct Level {
    occupied: u64,
    heads: [u32; SLOTS],
}

pub struct Wheel<T> {
    elapsed: u64,
    levels: [Level; LEVELS],
    slab: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
}

fn slot_range(level: usize) -> u64 {
    1u64 << (6 * level)
}

fn level_range(level: usize) -> u64 {
    1u64 << (6 * (level + 1))
}

fn level_for(elapsed: u64, when: u64) -> usize {
    let masked = (elapsed ^ when) | (SLOTS as u64 - 1);
    let significant = 63 - masked.leading_zeros() as usize;
    (significant / 6).min(LEVELS - 1)
}

impl<T> Wheel<T> {
    /// A wheel whose time starts at `now`.
    pub fn new(now: u64) -> Self {
        Wheel {
            elapsed: now,
            levels: std::array::from_fn(|_| Level {
                occupied: 0,
                heads: [NIL; SLOTS],
            }),
            slab: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Schedules `value` at `deadline`. A deadline not after the wheel's time is already
    /// due: the value is handed back so the caller treats it as expired at once.
    pub fn insert(&mut self, deadline: u64, value: T) -> Result<Handle, T> {
        if deadline <= self.elapsed {
            return Err(value);
        }
        debug_assert!(
            deadline - self.elapsed < MAX_SPAN_MS,
            "deadline beyond wheel span"
        );
        let idx = match self.free.pop() {
            Some(i) => {
                let e = &mut self.slab[i as usize];
                e.deadline = deadline;
                e.value = Some(value);
                i
            }
            None => {
                self.slab.push(Entry {
                    deadline,
                    value: Some(value),
                    level: 0,
                    slot: 0,
                    prev: NIL,
                    next: NIL,
                    gen: 0,
                });
                (self.slab.len() - 1) as u32
            }
        };
        self.link(idx);
        self.len += 1;
        Ok(Handle {
            idx,
            gen: self.slab[idx as usize].gen,
        })
    }

    fn link(&mut self, idx: u32) {
        let deadline = self.slab[idx as usize].deadline;
        let level = level_for(self.elapsed, deadline);
        let slot = ((deadline >> (6 * level)) & (SLOTS as u64 - 1)) as usize;
        let head = self.levels[level].heads[slot];
        {
            let e = &mut self.slab[idx as usize];
            e.level = level as u8;
            e.slot = slot as u8;
            e.prev = NIL;
            e.next = head;
        }
        if head != NIL {
            self.slab[head as usize].prev = idx;
        }
        self.levels[level].heads[slot] = idx;
        self.levels[level].occupied |= 1u64 << slot;
    }

    fn unlink(&mut self, idx: u32) {
        let (level, slot, prev, next) = {
            let e = &self.slab[idx as usize];
            (e.level as usize, e.slot as usize, e.prev, e.next)
        };
        if prev != NIL {
            self.slab[prev as usize].next = next;
        } else {
            debug_assert_eq!(self.levels[level].heads[slot], idx);
            self.levels[level].heads[slot] = next;
            if next == NIL {
                self.levels[level].occupied &= !(1u64 << slot);
            }
        }
        if next != NIL {
            self.slab[next as usize].prev = prev;
        }
    }

    fn release_entry(&mut self, idx: u32) -> Option<T> {
        let e = &mut self.slab[idx as usize];
        e.gen = e.gen.wrapping_add(1);
        let v = e.value.take();
        self.free.push(idx);
        self.len -= 1;
        v
    }

    /// Removes an entry; `None` if the handle is stale (already fired or cancelled).
    pub fn cancel(&mut self, h: Handle) -> Option<T> {
        let e = self.slab.get(h.idx as usize)?;
        if e.gen != h.gen || e.value.is_none() {
            return None;
        }
        self.unlink(h.idx);
        self.release_entry(h.idx)
    }

    /// The start time of the next occupied slot (the earliest moment something in the
    /// wheel may be due), with its level and slot.
    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        let mut best: Option<(usize, usize, u64)> = None;
        for level in 0..LEVELS {
            let occ = self.levels[level].occupied;
            if occ == 0 {
                continue;
            }
            let now_slot = (self.elapsed / slot_range(level)) as u32;
            let rotated = occ.rotate_right(now_slot % SLOTS as u32);
            let slot = (rotated.trailing_zeros() as usize + now_slot as usize) % SLOTS;
            let level_start = self.elapsed & !(level_range(level) - 1);
            let mut deadline = level_start + slot as u64 * slot_range(level);
            if deadline < self.elapsed - self.elapsed % slot_range(level) {
                // The slot lies "behind" the current position: it is on the next turn of
                // this level.
                deadline += level_range(level);
            }
            if best.is_none_or(|(_, _, d)| deadline < d) {
                best = Some((level, slot, deadline));
            }
        }
        best
    }

    /// Advances the wheel to `now`, appending every entry with `deadline <= now` to `out`
    /// as `(deadline, value)`.
    pub fn poll(&mut self, now: u64, out: &mut Vec<(u64, T)>) {
        while let Some((level, slot, start)) = self.next_expiration() {
            if start > now {
                break;
            }
            if start > self.elapsed {
                self.elapsed = start;
            }
            let mut idx = self.levels[level].heads[slot];
            self.levels[level].heads[slot] = NIL;
            self.levels[level].occupied &= !(1u64 << slot);
            while idx != NIL {
                let next = self.slab[idx as usize].next;
                let deadline = self.slab[idx as usize].deadline;
                if deadline <= now {
                    if let Some(v) = self.release_entry(idx) {
                        out.push((deadline, v));
                    }
                } else {
                    // Not due yet: cascade to a finer level relative to the new time.
                    debug_assert!(deadline > self.elapsed);
                    self.link(idx);
                }
                idx = next;
            }
        }
        if now > self.elapsed {
            self.elapsed = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn fires_in_order_across_levels() {
        let base = 1_700_000_000_000u64;
        let mut w = Wheel::new(base);
        for d in [1u64, 63, 64, 65, 4095, 4096, 630_000, 86_400_000] {
            w.insert(base + d, d).unwrap();
        }
        let mut out = Vec::new();
        w.poll(base + 64, &mut out);
        let got: Vec<u64> = out.iter().map(|x| x.1).collect();
        assert_eq!(got, vec![1, 63, 64]);
        out.clear();
        w.poll(base + 1_000_000, &mut out);
        let mut got: Vec<u64> = out.iter().map(|x| x.1).collect();
        got.sort();
        assert_eq!(got, vec![65, 4095, 4096, 630_000]);
        out.clear();
        w.poll(base + 100_000_000, &mut out);
        assert_eq!(out.len(), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn cancel_and_stale_handles() {
        let mut w = Wheel::new(0);
        let a = w.insert(10, 'a').unwrap();
        let b = w.insert(10, 'b').unwrap();
        assert_eq!(w.cancel(a), Some('a'));
        assert_eq!(w.cancel(a), None);
        let mut out = Vec::new();
        w.poll(10, &mut out);
        assert_eq!(out, vec![(10, 'b')]);
        assert_eq!(w.cancel(b), None);
        assert!(w.insert(10, 'c').is_err(), "a past deadline is due at once");
    }

    proptest! {
        /// The wheel agrees with a sorted map about what is due at every poll.
        #[test]
        fn matches_model(ops in proptest::collection::vec((0u8..3, 1u64..5_000_000, 0usize..64), 1..300)) {
            let start = 1_000_000u64;
            let mut w = Wheel::new(start);
            let mut now = start;
            let mut model: BTreeMap<u64, u64> = BTreeMap::new(); // id -> deadline
            let mut handles: Vec<(u64, Handle)> = Vec::new();
            let mut next_id = 0u64;
            for (op, x, pick) in ops {
                match op {
                    0 => {
                        let deadline = now + x;
                        let id = next_id; next_id += 1;
                        let h = w.insert(deadline, id).unwrap();
                        model.insert(id, deadline);
                        handles.push((id, h));
                    }
                    1 if !handles.is_empty() => {
                        let (id, h) = handles.swap_remove(pick % handles.len());
                        let was = model.remove(&id).is_some();
                        prop_assert_eq!(w.cancel(h).is_some(), was);
                    }
                    _ => {
                        now += x % 200_000;
                        let mut out = Vec::new();
                        w.poll(now, &mut out);
                        let mut got: Vec<u64> = out.iter().map(|(_, id)| *id).collect();
                        got.sort();
                        let mut want: Vec<u64> = model.iter().filter(|(_, d)| **d <= now).map(|(id, _)| *id).collect();
                        want.sort();
                        for id in &want { model.remove(id); }
                        prop_assert_eq!(got, want);
                        for (d, _) in &out { prop_assert!(*d <= now); }
                    }
                }
                prop_assert_eq!(w.len(), model.len());
            }
        }
    }
}
