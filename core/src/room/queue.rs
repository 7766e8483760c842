//! The per-sale queue: who holds a place, in what order, and how many wait ahead of a
//! slot.
//!
//! Built to cost at most 64 bytes per waiting buyer: a buyer is a 16-byte [`Member`]
//! keyed by a 64-bit keyed hash of the user id (the id itself, up to 128 bytes, is never
//! stored: the caller has it on every request), one 8-byte slot in the order, and about
//! 1.5 bits in the `LiveSet` that makes positions exact after leaves.
//!
//! Before the sale opens joins go to the pre-queue in join order; [`Queue::open`]
//! shuffles it with a seed into the first slots. After that a join takes the next slot:
//! first come, first served. Slot numbers are absolute and only grow; slots already
//! admitted are dropped from the front.

use std::collections::VecDeque;

use hashbrown::HashTable;

use super::error::RoomError;
use super::live::LiveSet;
use super::shuffle::shuffle;

/// Places one user may take in one sale (the first join and re-joins after leaving or
/// letting an admission expire): bounds what a single user's flood can cost.
pub const MAX_JOINS_PER_USER: u8 = 4;

/// Where a member stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    /// Joined before opening; not ordered yet.
    PreQueued,
    /// In line, after opening.
    Waiting,
    /// Let through; may reserve until the admission expires.
    Admitted,
    /// Admitted and took a hold.
    Reserved,
    /// Admitted and did not reserve in time.
    Expired,
    /// Gave the place up.
    Left,
}

impl Place {
    /// Whether a join answers this place's ticket again (idempotent join) rather than
    /// taking a new place.
    pub fn is_held(self) -> bool {
        matches!(
            self,
            Place::PreQueued | Place::Waiting | Place::Admitted | Place::Reserved
        )
    }

    /// Whether waiting (before or after opening): what `max_waiting` counts.
    pub fn is_waiting(self) -> bool {
        matches!(self, Place::PreQueued | Place::Waiting)
    }

    /// The transitions the room makes; anything else is a bug.
    fn may_become(self, next: Place) -> bool {
        use Place::*;
        matches!(
            (self, next),
            (PreQueued, Waiting | Left)
                | (Waiting, Admitted | Left)
                | (Admitted, Reserved | Expired | Left)
                // The gate accepted the token at the edge of its expiry.
                | (Expired, Reserved | Left)
                | (Reserved, Left)
                // A re-join after giving the place up.
                | (Left | Expired, PreQueued | Waiting)
        )
    }
}

/// One user's record. 16 bytes: the memory budget depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// Keyed hash of the user id (never 0: 0 marks an empty slot).
    pub user: u64,
    /// Absolute slot after opening, index in the pre-queue before it.
    pub slot: u32,
    /// Which of the user's joins this place is (0 for the first); signed into tickets so
    /// an old ticket is known as stale.
    pub join: u8,
    /// Where the member stands.
    pub place: Place,
}

/// The queue of one sale.
#[derive(Debug, Default)]
pub struct Queue {
    members: HashTable<Member>,
    /// Pre-open joins in join order; 0 where the member left.
    pre: Vec<u64>,
    /// User of each slot from `base` on; 0 where no one waits any more.
    slots: VecDeque<u64>,
    /// Absolute number of `slots[0]`.
    base: u32,
    live: LiveSet,
    waiting: u32,
    opened: bool,
}

/// The hash is already a keyed hash: use it as the table's hash.
fn by_user(m: &Member) -> u64 {
    m.user
}

impl Queue {
    /// The member of `user`, if any.
    pub fn get(&self, user: u64) -> Option<Member> {
        self.members.find(user, |m| m.user == user).copied()
    }

    /// Buyers waiting, before or after opening.
    pub fn waiting(&self) -> u32 {
        self.waiting
    }

    /// Whether the pre-queue has been shuffled into line.
    pub fn is_open(&self) -> bool {
        self.opened
    }

    /// Members of every kind (finished ones are kept so joins stay idempotent).
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Decides a join before it is logged: `Ok(Some(m))` when the user already holds a
    /// place (answer its ticket again), `Ok(None)` when a new place would be taken.
    pub fn check_join(&self, user: u64, max_waiting: u32) -> Result<Option<Member>, RoomError> {
        let prior = self.get(user);
        if let Some(m) = prior.filter(|m| m.place.is_held()) {
            return Ok(Some(m));
        }
        if prior.is_some_and(|m| m.join + 1 >= MAX_JOINS_PER_USER) {
            return Err(RoomError::TooManyJoins {
                max: MAX_JOINS_PER_USER,
            });
        }
        let next_slot = u64::from(self.base) + self.slots.len() as u64 + self.pre.len() as u64;
        if self.waiting >= max_waiting || next_slot >= u64::from(u32::MAX) {
            return Err(RoomError::QueueFull { max: max_waiting });
        }
        Ok(None)
    }

    /// Applies a join: the held place if any, else a new one at the back (of the
    /// pre-queue before opening). Deterministic: replicas get the same slot.
    pub fn join(&mut self, user: u64) -> Member {
        debug_assert_ne!(user, 0);
        let prior = self.get(user);
        if let Some(m) = prior.filter(|m| m.place.is_held()) {
            return m;
        }
        let join = prior.map_or(0, |m| m.join.saturating_add(1));
        let (slot, place) = if self.opened {
            let slot = self.base + self.slots.len() as u32;
            self.slots.push_back(user);
            self.live.insert(slot);
            (slot, Place::Waiting)
        } else {
            self.pre.push(user);
            (self.pre.len() as u32 - 1, Place::PreQueued)
        };
        self.waiting += 1;
        let m = Member {
            user,
            slot,
            join,
            place,
        };
        match self.members.find_mut(user, |x| x.user == user) {
            Some(old) => {
                assert!(old.place.may_become(place), "{:?} -> {place:?}", old.place);
                *old = m;
            }
            None => {
                self.members.insert_unique(user, m, by_user);
            }
        }
        m
    }

    /// Moves a member that is not waiting (admitted, reserved, expired) to `place`.
    /// Returns the place it left, or `None` if the move does not apply (unknown member,
    /// or a transition the room does not make: ops stay idempotent when replayed twice).
    pub fn set_place(&mut self, user: u64, place: Place) -> Option<Place> {
        let m = self.members.find_mut(user, |x| x.user == user)?;
        if !m.place.may_become(place) || m.place.is_waiting() {
            return None;
        }
        let was = m.place;
        m.place = place;
        Some(was)
    }

    /// The member gives its place up. Returns the place it left (`None`: nothing held).
    pub fn leave(&mut self, user: u64) -> Option<Place> {
        let m = self.members.find_mut(user, |x| x.user == user)?;
        if !m.place.may_become(Place::Left) {
            return None;
        }
        let was = m.place;
        let slot = m.slot;
        m.place = Place::Left;
        match was {
            Place::PreQueued => self.pre[slot as usize] = 0,
            Place::Waiting => {
                self.slots[(slot - self.base) as usize] = 0;
                let was_live = self.live.remove(slot);
                assert!(was_live, "a waiting member's slot is live");
                self.trim_front();
            }
            _ => return Some(was),
        }
        self.waiting -= 1;
        Some(was)
    }

    fn trim_front(&mut self) {
        while self.slots.front() == Some(&0) {
            self.slots.pop_front();
            self.base += 1;
        }
    }

    /// Opens the line: the pre-queue, shuffled by `seed`, takes the first slots.
    /// Opening twice does nothing (idempotent when replayed).
    pub fn open(&mut self, seed: u64) {
        if self.opened {
            return;
        }
        self.opened = true;
        let mut users: Vec<u64> = std::mem::take(&mut self.pre)
            .into_iter()
            .filter(|&u| u != 0)
            .collect();
        shuffle(&mut users, seed);
        self.slots.reserve_exact(users.len());
        for user in users {
            let slot = self.base + self.slots.len() as u32;
            self.slots.push_back(user);
            self.live.insert(slot);
            if let Some(m) = self.members.find_mut(user, |x| x.user == user) {
                assert_eq!(m.place, Place::PreQueued, "only the pre-queue is shuffled");
                m.slot = slot;
                m.place = Place::Waiting;
            }
        }
    }

    /// The slot just past the `n`-th waiting buyer from the head (or past the last one):
    /// what an `Admit { upto }` names. Walks at most `n` waiting slots plus the vacated
    /// slots between them.
    pub fn slot_after(&self, n: u64) -> u32 {
        let mut seen = 0u64;
        for (i, &u) in self.slots.iter().enumerate() {
            if u != 0 {
                seen += 1;
                if seen == n {
                    return self.base + i as u32 + 1;
                }
            }
        }
        self.base + self.slots.len() as u32
    }

    /// Admits every waiting buyer in slots below `upto`, in order, calling `admitted`
    /// for each; returns how many. Idempotent: a second call finds none.
    pub fn admit_upto(&mut self, upto: u32, mut admitted: impl FnMut(Member)) -> u32 {
        let mut n = 0;
        while self.base < upto {
            let Some(user) = self.slots.pop_front() else {
                break;
            };
            let slot = self.base;
            self.base += 1;
            if user == 0 {
                continue;
            }
            let was_live = self.live.remove(slot);
            assert!(was_live, "an occupied slot is live");
            self.waiting -= 1;
            n += 1;
            if let Some(m) = self.members.find_mut(user, |x| x.user == user) {
                assert_eq!(m.place, Place::Waiting, "only a waiting buyer is admitted");
                m.place = Place::Admitted;
                admitted(*m);
            }
        }
        self.trim_front();
        n
    }

    /// 1-based position of a waiting buyer in `slot`: waiting buyers ahead, plus one.
    pub fn position(&self, slot: u32) -> u32 {
        self.live.count_before(slot) + 1
    }

    /// Heap bytes held, from capacities (what the allocator gave, not what is used).
    pub fn heap_bytes(&self) -> usize {
        let cap = self.members.capacity();
        // hashbrown: `cap` items fit in `buckets` (7/8 of them, or all but one under 8),
        // each with a control byte, plus one group of trailing control bytes.
        let buckets = match cap {
            0 => 0,
            c if c < 8 => c + 1,
            c => c / 7 * 8,
        };
        let table = buckets * (std::mem::size_of::<Member>() + 1) + if cap > 0 { 16 } else { 0 };
        table + self.pre.capacity() * 8 + self.slots.capacity() * 8 + self.live.heap_bytes()
    }

    /// Every member, sorted: a canonical view for comparing replicas.
    pub fn sorted_members(&self) -> Vec<Member> {
        let mut v: Vec<Member> = self.members.iter().copied().collect();
        v.sort_unstable_by_key(|m| m.user);
        v
    }

    /// The line itself (users by slot, 0 where vacated) and its first slot.
    pub fn line(&self) -> (u32, Vec<u64>, Vec<u64>) {
        (
            self.base,
            self.pre.clone(),
            self.slots.iter().copied().collect(),
        )
    }
}

impl Place {
    /// The place as one byte (snapshots).
    pub fn to_u8(self) -> u8 {
        match self {
            Place::PreQueued => 0,
            Place::Waiting => 1,
            Place::Admitted => 2,
            Place::Reserved => 3,
            Place::Expired => 4,
            Place::Left => 5,
        }
    }

    /// The place [`Place::to_u8`] gave `b`.
    pub fn from_u8(b: u8) -> Option<Place> {
        Some(match b {
            0 => Place::PreQueued,
            1 => Place::Waiting,
            2 => Place::Admitted,
            3 => Place::Reserved,
            4 => Place::Expired,
            5 => Place::Left,
            _ => return None,
        })
    }
}

impl Queue {
    /// The queue's whole state as plain values (snapshots): every member sorted by user,
    /// the pre-queue, the line from `base` and whether it is open.
    pub fn export(&self) -> (Vec<Member>, Vec<u64>, u32, Vec<u64>, bool) {
        let (base, pre, slots) = self.line();
        (self.sorted_members(), pre, base, slots, self.opened)
    }

    /// The queue [`Queue::export`] described; the counts and the positions' bitmap are
    /// rebuilt from the line.
    pub fn restore(
        members: &[Member],
        pre: Vec<u64>,
        base: u32,
        slots: Vec<u64>,
        opened: bool,
    ) -> Queue {
        let mut q = Queue {
            base,
            opened,
            ..Queue::default()
        };
        for m in members {
            q.members.insert_unique(m.user, *m, by_user);
        }
        q.waiting = pre.iter().filter(|&&u| u != 0).count() as u32;
        for (i, &u) in slots.iter().enumerate() {
            if u != 0 {
                q.live.insert(base + i as u32);
                q.waiting += 1;
            }
        }
        q.pre = pre;
        q.slots = slots.into();
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Member>(), 16);
    }

    #[test]
    fn positions_stay_exact_through_leaves() {
        let mut q = Queue::default();
        q.open(1);
        for u in 1..=10u64 {
            q.join(u);
        }
        assert_eq!(q.position(q.get(10).unwrap().slot), 10);
        q.leave(3);
        q.leave(7);
        assert_eq!(q.position(q.get(10).unwrap().slot), 8);
        assert_eq!(q.admit_upto(q.slot_after(3), |_| {}), 3);
        assert_eq!(q.get(4).unwrap().place, Place::Admitted);
        assert_eq!(q.position(q.get(5).unwrap().slot), 1);
        assert_eq!(q.position(q.get(10).unwrap().slot), 5);
        assert_eq!(q.waiting(), 5);
        // Replayed: nothing more to admit below the same slot.
        assert_eq!(q.admit_upto(q.get(4).unwrap().slot + 1, |_| {}), 0);
    }

    #[test]
    fn rejoins_are_bounded() {
        let mut q = Queue::default();
        q.open(1);
        for _ in 0..MAX_JOINS_PER_USER {
            assert_eq!(q.check_join(9, 100), Ok(None));
            q.join(9);
            assert!(q.check_join(9, 100).unwrap().is_some(), "held: same place");
            q.leave(9);
        }
        assert_eq!(
            q.check_join(9, 100),
            Err(RoomError::TooManyJoins {
                max: MAX_JOINS_PER_USER
            })
        );
    }
}
