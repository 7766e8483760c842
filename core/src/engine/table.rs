//! The reservation table: reservations striped by token, each stripe with its own expiry
//! wheel, expired set and retention queue.
//!
//! A reservation's every transition happens under its stripe's lock, and the engine logs
//! the transition before it lets go of that lock: this is what makes "exactly once" and
//! "log order matches transition order" hold for one reservation.
//!
//! Memory (the table is most of the server's): a reservation is one [`Reservation`] of at most
//! 96 bytes (`record_stays_small`) in the stripe's slab, named everywhere inside the stripe by its `u32` slab
//! index, plus about 10 bytes of index. It is keyed by the 16 bytes its token encodes,
//! not by the token's text (the `{sku}` tag is the sale's); its user is a 4-byte id
//! interned in the sale; its request id is inline up to 24 bytes; the expiry wheel links
//! through the record itself. Texts are rebuilt when a reply or a view needs them.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use compact_str::CompactString;
use hashbrown::HashTable;
use slab::Slab;

use super::event::Lsn;
use super::names::UserId;
use super::sale::Sale;
use super::token::{decode_token, token_buf, TokenBuf, TokenKey};
use super::types::{HoldRecord, Millis, ReservationState, ReservationView, TombView};
use super::wheel::{Links, Timers, Wheel};

/// One reservation. `Clone` is cheap (a reference count and a copy; an allocation only
/// for request ids over 24 bytes) so a snapshot copies records under the stopped world
/// and builds the owned views afterwards.
#[derive(Clone)]
pub struct Reservation {
    /// The token's 128 bits (with the sale's sku it spells the token).
    pub key: TokenKey,
    /// The sale the units were taken from.
    pub sale: Arc<Sale>,
    /// The buyer's request id.
    pub request_id: CompactString,
    /// The buyer, interned in the sale's names.
    pub user: UserId,
    /// Units held.
    pub qty: u32,
    /// The shard the units came from.
    pub shard: u16,
    /// Reserved, committed or released.
    pub state: ReservationState,
    /// The hold's deadline.
    pub expires_at: Millis,
    /// When the hold was taken.
    pub created_at: Millis,
    /// When it left `Reserved` (0 while reserved); drives retention.
    pub finished_at: Millis,
    /// Its place in the stripe's wheel: linked while it waits there, unlinked once it is
    /// in the expired set or finished. `expires_at` changes only while unlinked.
    pub links: Links,
    // No log position of its own: the stripe's `last_lsn` stands in for it (8 bytes per
    // reservation; see there).
}

impl Reservation {
    /// The token's text, on the stack.
    pub fn token(&self) -> TokenBuf {
        token_buf(&self.sale.sku, &self.key)
    }

    /// The token's text, shared.
    pub fn token_arc(&self) -> Arc<str> {
        self.token().as_str().into()
    }

    /// The reservation a record describes, with its token's key and its buyer already
    /// interned in `sale` (a snapshot loaded, a sale imported); not yet in any wheel.
    pub fn from_record(key: TokenKey, sale: Arc<Sale>, user: UserId, r: &HoldRecord<'_>) -> Self {
        Reservation {
            key,
            sale,
            request_id: r.request_id.into(),
            user,
            qty: r.qty,
            shard: r.shard,
            state: r.state,
            expires_at: r.expires_at_ms,
            created_at: r.created_at_ms,
            finished_at: r.finished_at_ms,
            links: Links::NONE,
        }
    }

    /// The reservation as seen from outside.
    pub fn view(&self) -> ReservationView {
        ReservationView {
            token: self.token().as_str().to_string(),
            sku: self.sale.sku.to_string(),
            user: self.sale.users.name(self.user),
            request_id: self.request_id.to_string(),
            qty: self.qty,
            shard: self.shard,
            state: self.state,
            expires_at_ms: self.expires_at,
            created_at_ms: self.created_at,
            finished_at_ms: self.finished_at,
        }
    }
}

/// A purged finished reservation (see [`super::types::TombView`]).
#[derive(Clone)]
pub struct Tomb {
    /// The sale the reservation belonged to.
    pub sale: Arc<Sale>,
    /// How it finished.
    pub state: ReservationState,
    /// Units it held.
    pub qty: u32,
    /// The shard they came from.
    pub shard: u16,
    /// Its deadline.
    pub expires_at: Millis,
    /// The buyer, where a per-user limit still counts the units.
    pub user: Option<Arc<str>>,
}

impl Tomb {
    /// The tombstone as seen from outside, under its key.
    pub fn view(&self, key: u128) -> TombView {
        TombView {
            sku: self.sale.sku.to_string(),
            key,
            state: self.state,
            qty: self.qty,
            shard: self.shard,
            expires_at_ms: self.expires_at,
            user: self.user.as_deref().unwrap_or("").to_string(),
        }
    }
}

/// The tombstone key of a token: two independent 64-bit hashes. A collision (odds about
/// n²/2^129) could only make a new request REPLAY, i.e. refuse to take stock: the safe
/// direction.
pub fn tomb_key(token: &str) -> u128 {
    let a = super::fasthash::hash_bytes(token.as_bytes());
    let b = super::sale::fnv1a(token.as_bytes());
    (u128::from(a) << 64) | u128::from(b)
}

/// The index's hash of a token key: its first 8 bytes, already uniform (an HMAC output
/// chosen by the server, never by a client).
fn key_hash(key: &TokenKey) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&key[..8]);
    u64::from_le_bytes(w)
}

/// The wheel's entries are the slab's records. Indices come only from the stripe's own
/// bookkeeping (index, wheel lists, expired set), all kept in step with the slab, so an
/// index that is not in the slab is a bug: indexing panics rather than guess.
impl Timers for Slab<Reservation> {
    fn deadline(&self, idx: u32) -> u64 {
        self[idx as usize].expires_at
    }
    fn links(&self, idx: u32) -> Links {
        self[idx as usize].links
    }
    fn links_mut(&mut self, idx: u32) -> &mut Links {
        &mut self[idx as usize].links
    }
}

/// One lock's share of the reservations: records, index, wheel, expired set, tombstones.
pub struct Stripe {
    slab: Slab<Reservation>,
    /// Slab indices by token key.
    index: HashTable<u32>,
    /// Finished reservations purged by retention, kept compactly for as long as the
    /// engine's state lives (snapshots carry them), so a retry never takes stock again.
    pub tombs: HashMap<u128, Tomb, BuildHasherDefault<TombHasher>>,
    wheel: Wheel,
    /// RESERVED reservations whose deadline passed, oldest first (what EXPIRED lists).
    pub expired: BTreeSet<(Millis, u32)>,
    /// Finished reservations in (roughly) finishing order, for retention. By key, not by
    /// slab index: a replayed PURGE frees a record whose entry here stays behind.
    pub finished: VecDeque<(Millis, TokenKey)>,
    /// The highest log position of a record logged under this stripe's lock. Every record
    /// that changes a reservation is logged under its stripe's lock, so this is at least
    /// the last position that changed any reservation here: a reply that reports a
    /// reservation's state (REPLAY, RESERVATION, `:0`) waits for it, so nobody hears of a
    /// state that could vanish. It may wait for a later record of another reservation of
    /// the stripe too (one more group commit at most), the price of not keeping 8 bytes
    /// of log position in every reservation.
    last_lsn: Lsn,
    /// Units of the wheel's holds by deadline, for the sales a waiting room asked about.
    due: DueIndex,
}

impl Stripe {
    /// An empty stripe whose wheel starts at `now`, sized for `capacity` reservations.
    pub fn new(now: Millis, capacity: usize) -> Self {
        Stripe {
            slab: Slab::with_capacity(capacity),
            index: HashTable::with_capacity(capacity),
            tombs: HashMap::default(),
            wheel: Wheel::new(now),
            expired: BTreeSet::new(),
            finished: VecDeque::new(),
            last_lsn: 0,
            due: DueIndex::default(),
        }
    }

    /// See the field: what a reply about any reservation of this stripe waits for.
    pub fn last_lsn(&self) -> Lsn {
        self.last_lsn
    }

    /// Notes a record logged under this stripe's lock; returns its position.
    pub fn logged(&mut self, lsn: Lsn) -> Lsn {
        debug_assert!(lsn >= self.last_lsn || lsn == 0, "log positions go back");
        self.last_lsn = self.last_lsn.max(lsn);
        lsn
    }

    /// Room for `additional` more reservations without growing (recovery knows how many
    /// are coming; growing rehashes the index and copies the slab).
    pub fn reserve(&mut self, additional: usize) {
        self.slab.reserve(additional);
        let slab = &self.slab;
        self.index
            .reserve(additional, |&i| key_hash(&slab[i as usize].key));
    }

    /// Reservations held (all states).
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Whether the stripe holds no reservation.
    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// Every reservation held, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Reservation> {
        self.slab.iter().map(|(_, r)| r)
    }

    /// Whether one more reservation fits (indices are `u32`, the wheel's `NIL` excluded).
    pub fn has_room(&self) -> bool {
        self.slab.vacant_key() < super::wheel::NIL as usize
    }

    fn find_key(&self, key: &TokenKey) -> Option<u32> {
        self.index
            .find(key_hash(key), |&i| self.slab[i as usize].key == *key)
            .copied()
    }

    /// Whether the reservation with this key belongs to a sale frozen for a move.
    pub fn key_is_moving(&self, key: &TokenKey) -> bool {
        self.find_key(key)
            .is_some_and(|i| self.slab[i as usize].sale.state().is_moving())
    }

    /// Removes every reservation and tombstone of `sale` (a sale handed over to another
    /// group). Entries of the retention queue stay behind: purging a key no longer here
    /// does nothing.
    pub fn remove_sale(&mut self, sale: &Arc<Sale>) {
        let ours: Vec<u32> = self
            .slab
            .iter()
            .filter(|(_, r)| Arc::ptr_eq(&r.sale, sale))
            .map(|(i, _)| i as u32)
            .collect();
        for idx in ours {
            if self.slab[idx as usize].state == ReservationState::Reserved {
                self.unschedule(idx);
            }
            let hash = key_hash(&self.slab[idx as usize].key);
            if let Ok(e) = self.index.find_entry(hash, |&i| i == idx) {
                e.remove();
            }
            self.slab.remove(idx as usize);
        }
        self.tombs.retain(|_, t| !Arc::ptr_eq(&t.sale, sale));
    }

    /// The reservation of sale `sku` whose token encodes `key`.
    pub fn find(&self, sku: &str, key: &TokenKey) -> Option<u32> {
        self.find_key(key)
            .filter(|&i| *self.slab[i as usize].sale.sku == *sku)
    }

    /// The reservation named by a token's text; `None` for text this server never
    /// writes (see [`decode_token`]).
    pub fn lookup(&self, token: &str) -> Option<u32> {
        let (sku, key) = decode_token(token)?;
        self.find(sku, &key)
    }

    /// `idx` must come from this stripe (`find`, `lookup`, `insert`, the expired set).
    pub fn get(&self, idx: u32) -> &Reservation {
        &self.slab[idx as usize]
    }

    /// [`Stripe::get`], to change the reservation.
    pub fn get_mut(&mut self, idx: u32) -> &mut Reservation {
        &mut self.slab[idx as usize]
    }

    /// The reservation a token names, if this stripe holds it.
    pub fn res(&self, token: &str) -> Option<&Reservation> {
        self.lookup(token).map(|i| self.get(i))
    }

    /// Adds a reservation whose key is not in the stripe yet, unscheduled; `None` if the
    /// stripe is full (see [`Stripe::has_room`]).
    pub fn insert(&mut self, res: Reservation) -> Option<u32> {
        if !self.has_room() {
            return None;
        }
        debug_assert!(self.find_key(&res.key).is_none(), "token key twice");
        debug_assert!(!res.links.is_linked());
        if self.index.len() == self.index.capacity() {
            self.grow_index();
        }
        let hash = key_hash(&res.key);
        let idx = self.slab.insert(res) as u32;
        let slab = &self.slab;
        self.index
            .insert_unique(hash, idx, |&i| key_hash(&slab[i as usize].key));
        Some(idx)
    }

    /// Doubles the index by rebuilding it from the slab, front to back. hashbrown's own
    /// resize re-hashes the entries in bucket order, reading a random record for each
    /// (the index holds only slab indices): at a million reservations a cache miss per
    /// entry, a tenth of the table's share of a pipelined RESERVE. The slab read in
    /// order is a stream the prefetcher keeps ahead of.
    fn grow_index(&mut self) {
        let slab = &self.slab;
        let mut grown = HashTable::with_capacity((self.index.capacity() * 2).max(16));
        for (i, r) in slab.iter() {
            grown.insert_unique(key_hash(&r.key), i as u32, |&j| {
                key_hash(&slab[j as usize].key)
            });
        }
        // The index names exactly the slab's records (every insert and remove does both).
        assert_eq!(grown.len(), self.index.len(), "index and slab diverged");
        self.index = grown;
    }

    /// Schedules the expiry of `idx` at its `expires_at`: into the wheel, or straight
    /// into the expired set if already due.
    pub fn schedule(&mut self, idx: u32) {
        if self.wheel.insert(&mut self.slab, idx) {
            self.due.note(&self.slab[idx as usize], true);
        } else {
            let at = self.slab[idx as usize].expires_at;
            self.expired.insert((at, idx));
        }
    }

    /// Takes a reservation out of the wheel or the expired set.
    pub fn unschedule(&mut self, idx: u32) {
        if self.wheel.cancel(&mut self.slab, idx) {
            self.due.note(&self.slab[idx as usize], false);
        } else {
            let at = self.slab[idx as usize].expires_at;
            self.expired.remove(&(at, idx));
        }
    }

    /// Moves the deadline of a RESERVED reservation (EXTEND).
    pub fn reschedule(&mut self, idx: u32, expires_at: Millis) {
        self.unschedule(idx);
        self.slab[idx as usize].expires_at = expires_at;
        self.schedule(idx);
    }

    /// Retention: replaces the finished reservation with this key by its tombstone and
    /// returns its token (for the log). `None` (and nothing changes) unless `key` is a
    /// finished reservation.
    pub fn purge_key(&mut self, key: &TokenKey) -> Option<TokenBuf> {
        let idx = self.find_key(key)?;
        self.purge_at(idx)
    }

    /// [`Stripe::purge_key`] by the token's text (log replay).
    pub fn purge(&mut self, token: &str) -> bool {
        self.lookup(token)
            .and_then(|idx| self.purge_at(idx))
            .is_some()
    }

    fn purge_at(&mut self, idx: u32) -> Option<TokenBuf> {
        let r = self.slab.get(idx as usize)?;
        if r.state == ReservationState::Reserved {
            return None;
        }
        // Finished: out of the wheel and the expired set since it left RESERVED.
        debug_assert!(!r.links.is_linked());
        let hash = key_hash(&r.key);
        if let Ok(e) = self.index.find_entry(hash, |&i| i == idx) {
            e.remove();
        } else {
            debug_assert!(false, "slab entry {idx} not indexed");
        }
        let r = self.slab.remove(idx as usize);
        let token = r.token();
        let keep_user = r.state == ReservationState::Committed && r.sale.params.limit > 0;
        self.tombs.insert(
            tomb_key(token.as_str()),
            Tomb {
                user: keep_user.then(|| r.sale.users.name(r.user).into()),
                sale: r.sale,
                state: r.state,
                qty: r.qty,
                shard: r.shard,
                expires_at: r.expires_at,
            },
        );
        Some(token)
    }

    /// Moves everything due by `now` from the wheel into the expired set.
    pub fn advance(&mut self, now: Millis) {
        if now <= self.wheel.elapsed() {
            return;
        }
        let mut fired = Vec::new();
        self.wheel.poll(&mut self.slab, now, &mut fired);
        for idx in fired {
            let r = &self.slab[idx as usize];
            debug_assert_eq!(r.state, ReservationState::Reserved);
            debug_assert!(r.expires_at <= now);
            self.due.note(r, false);
            self.expired.insert((r.expires_at, idx));
        }
    }

    /// Units of this stripe's holds of sale `sku` still in the wheel with a deadline in
    /// `(after, until]`. The first call for a sale builds its index from the slab (once:
    /// from then on every wheel insert, cancel and expiry keeps it), so later calls cost
    /// a map lookup and a walk over that sale's deadlines within the range only.
    pub fn due_units(&mut self, sku: &str, after: Millis, until: Millis) -> u64 {
        if !self.due.by_sale.contains_key(sku) {
            let mut by_deadline: BTreeMap<Millis, u64> = BTreeMap::new();
            let live = self
                .slab
                .iter()
                .map(|(_, r)| r)
                .filter(|r| r.links.is_linked() && *r.sale.sku == *sku);
            for r in live {
                *by_deadline.entry(r.expires_at).or_default() += u64::from(r.qty);
            }
            self.due.by_sale.insert(sku.into(), by_deadline);
        }
        if until <= after {
            return 0;
        }
        self.due
            .by_sale
            .get(sku)
            .map_or(0, |m| m.range(after + 1..=until).map(|(_, u)| u).sum())
    }

    /// Stops keeping the index of sale `sku` (its room is gone).
    pub fn forget_due(&mut self, sku: &str) {
        self.due.by_sale.remove(sku);
    }
}

/// Units of held reservations by deadline, kept only for the sales named (those with a
/// waiting room that counts holds due soon): the other sales' holds pay one emptiness
/// check, or a map lookup while some sale is kept. Mirrors "linked in the wheel": added
/// when a hold enters the wheel, taken off when it leaves it (cancelled or fired).
#[derive(Default)]
struct DueIndex {
    by_sale: HashMap<Arc<str>, BTreeMap<Millis, u64>>,
}

impl DueIndex {
    fn note(&mut self, r: &Reservation, linked: bool) {
        if self.by_sale.is_empty() {
            return;
        }
        let Some(m) = self.by_sale.get_mut(&*r.sale.sku) else {
            return;
        };
        let qty = u64::from(r.qty);
        if linked {
            *m.entry(r.expires_at).or_default() += qty;
        } else if let Some(u) = m.get_mut(&r.expires_at) {
            *u = u.saturating_sub(qty);
            if *u == 0 {
                m.remove(&r.expires_at);
            }
        }
    }
}

/// The tomb key is already a uniform hash: use its low bits as the map's hash.
#[derive(Default)]
pub struct TombHasher(u64);

impl Hasher for TombHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record's size is the memory budget of a live reservation (docs/benchmarks.md, "Memory per
    /// live reservation"): a field added here costs a million times its size at a million held.
    #[test]
    fn record_stays_small() {
        assert!(
            std::mem::size_of::<Reservation>() <= 96,
            "{}",
            std::mem::size_of::<Reservation>()
        );
        // A vacant slab entry costs nothing extra: the enum uses the record's niche.
        assert_eq!(
            std::mem::size_of::<Option<Reservation>>(),
            std::mem::size_of::<Reservation>()
        );
    }
}
