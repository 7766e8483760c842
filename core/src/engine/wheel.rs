//! A hierarchical timing wheel: O(1) insert and cancel, expiry work proportional to the
//! number of occupied slots passed, not to the time elapsed.
//!
//! Six levels of 64 slots at 1 ms resolution cover 64^6 ms (about 2.2 years); the engine
//! caps deadlines far below that. An entry lives in the level of the highest 6-bit group
//! in which its deadline differs from the wheel's `elapsed` time; when the wheel reaches
//! that slot the entry cascades to a lower level, until it fires at level 0. Entries are
//! kept in intrusive doubly-linked lists so cancel is O(1). This is the scheme of
//! Varghese & Lauck, as also used by tokio's timer.
//!
//! The wheel owns no entries: they live in the caller's store (the reservation table's
//! slab), named by `u32` index, each carrying its deadline and 12 bytes of [`Links`].
//! A reservation then costs the wheel those 12 bytes, instead of a second copy of its
//! key plus a slab entry and a handle of the wheel's own.

const LEVELS: usize = 6;
const SLOTS: usize = 64;
/// "No entry" in a link.
pub const NIL: u32 = u32::MAX;
/// `Links::level` of an entry that is in no list.
const UNLINKED: u8 = u8::MAX;
/// Largest distance between `elapsed` and a deadline that the levels can represent.
pub const MAX_SPAN_MS: u64 = 1 << (6 * LEVELS as u64);

/// An entry's place in the wheel, stored inside the entry itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Links {
    prev: u32,
    next: u32,
    level: u8,
    slot: u8,
}

impl Links {
    /// Not in the wheel.
    pub const NONE: Links = Links {
        prev: NIL,
        next: NIL,
        level: UNLINKED,
        slot: 0,
    };

    /// Whether the entry waits in a wheel.
    pub fn is_linked(&self) -> bool {
        self.level != UNLINKED
    }
}

impl Default for Links {
    fn default() -> Self {
        Links::NONE
    }
}

/// The store the wheel's entries live in. `idx` is always an index the caller linked
/// (or is about to link) and has not removed from the store while linked: the wheel
/// never invents one.
pub trait Timers {
    /// The entry's deadline; it must not change while the entry is linked.
    fn deadline(&self, idx: u32) -> u64;
    /// The entry's place in the wheel.
    fn links(&self, idx: u32) -> Links;
    /// The entry's place in the wheel, to relink it.
    fn links_mut(&mut self, idx: u32) -> &mut Links;
}

struct Level {
    occupied: u64,
    heads: [u32; SLOTS],
}

/// A hierarchical timer wheel of reservation deadlines: scheduling and cancelling take
/// constant time, and expired entries come out in deadline order.
pub struct Wheel {
    elapsed: u64,
    levels: [Level; LEVELS],
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

impl Wheel {
    /// A wheel whose time starts at `now`.
    pub fn new(now: u64) -> Self {
        Wheel {
            elapsed: now,
            levels: std::array::from_fn(|_| Level {
                occupied: 0,
                heads: [NIL; SLOTS],
            }),
            len: 0,
        }
    }

    /// Entries scheduled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The wheel's time: everything due up to here has been handed out.
    pub fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Schedules entry `idx` at its deadline. A deadline not after the wheel's time is
    /// already due: returns false and links nothing, so the caller treats it as expired.
    pub fn insert<S: Timers + ?Sized>(&mut self, s: &mut S, idx: u32) -> bool {
        debug_assert!(!s.links(idx).is_linked(), "entry linked twice");
        let deadline = s.deadline(idx);
        if deadline <= self.elapsed {
            return false;
        }
        debug_assert!(
            deadline - self.elapsed < MAX_SPAN_MS,
            "deadline beyond wheel span"
        );
        self.link(s, idx, deadline);
        self.len += 1;
        true
    }

    fn link<S: Timers + ?Sized>(&mut self, s: &mut S, idx: u32, deadline: u64) {
        let level = level_for(self.elapsed, deadline);
        let slot = ((deadline >> (6 * level)) & (SLOTS as u64 - 1)) as usize;
        let head = self.levels[level].heads[slot];
        *s.links_mut(idx) = Links {
            prev: NIL,
            next: head,
            level: level as u8,
            slot: slot as u8,
        };
        if head != NIL {
            s.links_mut(head).prev = idx;
        }
        self.levels[level].heads[slot] = idx;
        self.levels[level].occupied |= 1u64 << slot;
    }

    fn unlink<S: Timers + ?Sized>(&mut self, s: &mut S, idx: u32) {
        let Links {
            prev,
            next,
            level,
            slot,
        } = s.links(idx);
        let (level, slot) = (level as usize, slot as usize);
        if prev != NIL {
            s.links_mut(prev).next = next;
        } else {
            debug_assert_eq!(self.levels[level].heads[slot], idx);
            self.levels[level].heads[slot] = next;
            if next == NIL {
                self.levels[level].occupied &= !(1u64 << slot);
            }
        }
        if next != NIL {
            s.links_mut(next).prev = prev;
        }
        *s.links_mut(idx) = Links::NONE;
    }

    /// Takes an entry out of the wheel; false if it was not in it (already fired, never
    /// linked, or cancelled).
    pub fn cancel<S: Timers + ?Sized>(&mut self, s: &mut S, idx: u32) -> bool {
        if !s.links(idx).is_linked() {
            return false;
        }
        self.unlink(s, idx);
        self.len -= 1;
        true
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

    /// Advances the wheel to `now`, unlinking every entry with `deadline <= now` and
    /// appending its index to `out`.
    pub fn poll<S: Timers + ?Sized>(&mut self, s: &mut S, now: u64, out: &mut Vec<u32>) {
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
                let next = s.links(idx).next;
                let deadline = s.deadline(idx);
                if deadline <= now {
                    *s.links_mut(idx) = Links::NONE;
                    self.len -= 1;
                    out.push(idx);
                } else {
                    // Not due yet: cascade to a finer level relative to the new time.
                    debug_assert!(deadline > self.elapsed);
                    self.link(s, idx, deadline);
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

    /// A store for tests: entry `i` is `(deadline, links)`.
    #[derive(Default)]
    struct Store(Vec<(u64, Links)>);

    impl Store {
        fn add(&mut self, deadline: u64) -> u32 {
            self.0.push((deadline, Links::NONE));
            (self.0.len() - 1) as u32
        }
    }

    impl Timers for Store {
        fn deadline(&self, idx: u32) -> u64 {
            self.0[idx as usize].0
        }
        fn links(&self, idx: u32) -> Links {
            self.0[idx as usize].1
        }
        fn links_mut(&mut self, idx: u32) -> &mut Links {
            &mut self.0[idx as usize].1
        }
    }

    #[test]
    fn fires_in_order_across_levels() {
        let base = 1_700_000_000_000u64;
        let mut w = Wheel::new(base);
        let mut s = Store::default();
        let ds = [1u64, 63, 64, 65, 4095, 4096, 630_000, 86_400_000];
        for d in ds {
            let i = s.add(base + d);
            assert!(w.insert(&mut s, i));
        }
        let mut out = Vec::new();
        w.poll(&mut s, base + 64, &mut out);
        let got: Vec<u64> = out.iter().map(|&i| ds[i as usize]).collect();
        assert_eq!(got, vec![1, 63, 64]);
        out.clear();
        w.poll(&mut s, base + 1_000_000, &mut out);
        let mut got: Vec<u64> = out.iter().map(|&i| ds[i as usize]).collect();
        got.sort();
        assert_eq!(got, vec![65, 4095, 4096, 630_000]);
        out.clear();
        w.poll(&mut s, base + 100_000_000, &mut out);
        assert_eq!(out.len(), 1);
        assert!(w.is_empty());
        assert!(s.0.iter().all(|(_, l)| !l.is_linked()));
    }

    #[test]
    fn cancel_and_stale_entries() {
        let mut w = Wheel::new(0);
        let mut s = Store::default();
        let a = s.add(10);
        let b = s.add(10);
        assert!(w.insert(&mut s, a));
        assert!(w.insert(&mut s, b));
        assert!(w.cancel(&mut s, a));
        assert!(!w.cancel(&mut s, a));
        let mut out = Vec::new();
        w.poll(&mut s, 10, &mut out);
        assert_eq!(out, vec![b]);
        assert!(!w.cancel(&mut s, b));
        let c = s.add(10);
        assert!(!w.insert(&mut s, c), "a past deadline is due at once");
        assert!(!s.links(c).is_linked());
    }

    proptest! {
        /// The wheel agrees with a sorted map about what is due at every poll.
        #[test]
        fn matches_model(ops in proptest::collection::vec((0u8..3, 1u64..5_000_000, 0usize..64), 1..300)) {
            let start = 1_000_000u64;
            let mut w = Wheel::new(start);
            let mut s = Store::default();
            let mut now = start;
            let mut model: BTreeMap<u32, u64> = BTreeMap::new(); // id -> deadline
            let mut handles: Vec<u32> = Vec::new();
            for (op, x, pick) in ops {
                match op {
                    0 => {
                        let id = s.add(now + x);
                        prop_assert!(w.insert(&mut s, id));
                        model.insert(id, now + x);
                        handles.push(id);
                    }
                    1 if !handles.is_empty() => {
                        let id = handles.swap_remove(pick % handles.len());
                        let was = model.remove(&id).is_some();
                        prop_assert_eq!(w.cancel(&mut s, id), was);
                    }
                    _ => {
                        now += x % 200_000;
                        let mut out = Vec::new();
                        w.poll(&mut s, now, &mut out);
                        let mut got = out.clone();
                        got.sort();
                        let want: Vec<u32> = model.iter().filter(|(_, d)| **d <= now).map(|(id, _)| *id).collect();
                        for id in &want { model.remove(id); }
                        prop_assert_eq!(got, want);
                        for &i in &out { prop_assert!(s.deadline(i) <= now); }
                    }
                }
                prop_assert_eq!(w.len(), model.len());
            }
        }
    }
}
