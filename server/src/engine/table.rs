//! The reservation table: reservations striped by token, each stripe with its own expiry
//! wheel, expired set and retention queue.
//!
//! A reservation's every transition happens under its stripe's lock, and the engine logs
//! the transition before it lets go of that lock: this is what makes "exactly once" and
//! "log order matches transition order" hold for one reservation.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::event::Lsn;
use super::fasthash::TokenMap;
use super::sale::Sale;
use super::types::{Millis, ResState, ReservationView, TombView};
use super::wheel::{Handle, Wheel};

/// Strings are `Arc` so a snapshot can copy a reservation under the stopped world with
/// reference-count bumps instead of allocations, and build the owned view afterwards.
#[derive(Clone)]
pub struct Res {
    pub sale: Arc<Sale>,
    pub user: Arc<str>,
    pub request_id: Arc<str>,
    pub qty: u32,
    pub shard: u16,
    pub state: ResState,
    pub expires_at: Millis,
    pub created_at: Millis,
    pub finished_at: Millis,
    /// Present while the reservation waits in the wheel; `None` once it is in the
    /// expired set or finished.
    pub timer: Option<Handle>,
    /// The last log position that changed this reservation: a reply that reports its
    /// state (REPLAY, `:0`) waits for it, so nobody hears of a state that could vanish.
    pub lsn: Lsn,
}

impl Res {
    pub fn view(&self, token: &str) -> ReservationView {
        ReservationView {
            token: token.to_string(),
            sku: self.sale.sku.to_string(),
            user: self.user.to_string(),
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
    pub sale: Arc<Sale>,
    pub state: ResState,
    pub qty: u32,
    pub shard: u16,
    pub expires_at: Millis,
    pub user: Option<Arc<str>>,
}

impl Tomb {
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

pub struct Stripe {
    pub map: TokenMap<Res>,
    /// Finished reservations purged by retention, kept compactly for as long as the
    /// engine's state lives (snapshots carry them), so a retry never takes stock again.
    pub tombs: HashMap<u128, Tomb, BuildHasherDefault<TombHasher>>,
    pub wheel: Wheel<Arc<str>>,
    /// RESERVED reservations whose deadline passed, oldest first (what EXPIRED lists).
    pub expired: BTreeSet<(Millis, Arc<str>)>,
    /// Finished reservations in (roughly) finishing order, for retention.
    pub finished: VecDeque<(Millis, Arc<str>)>,
}

impl Stripe {
    pub fn new(now: Millis, capacity: usize) -> Self {
        Stripe {
            map: TokenMap::with_capacity_and_hasher(capacity, Default::default()),
            tombs: HashMap::default(),
            wheel: Wheel::new(now),
            expired: BTreeSet::new(),
            finished: VecDeque::new(),
        }
    }

    /// Schedules the expiry of `token` (already in the map or about to be).
    pub fn schedule(&mut self, token: &Arc<str>, expires_at: Millis) -> Option<Handle> {
        match self.wheel.insert(expires_at, token.clone()) {
            Ok(h) => Some(h),
            Err(t) => {
                self.expired.insert((expires_at, t));
                None
            }
        }
    }

    /// Takes a reservation out of the wheel or the expired set.
    pub fn unschedule(&mut self, token: &Arc<str>, timer: Option<Handle>, expires_at: Millis) {
        let in_wheel = timer.and_then(|h| self.wheel.cancel(h)).is_some();
        if !in_wheel {
            self.expired.remove(&(expires_at, token.clone()));
        }
    }

    /// Retention: replaces a finished reservation's record by its tombstone. Returns
    /// false (and changes nothing) unless `token` is a finished reservation.
    pub fn purge(&mut self, token: &str) -> bool {
        if !self
            .map
            .get(token)
            .is_some_and(|r| r.state != ResState::Reserved)
        {
            return false;
        }
        let Some(r) = self.map.remove(token) else {
            return false;
        };
        let keep_user = r.state == ResState::Committed && r.sale.params.limit > 0;
        self.tombs.insert(
            tomb_key(token),
            Tomb {
                user: keep_user.then(|| r.user.clone()),
                sale: r.sale,
                state: r.state,
                qty: r.qty,
                shard: r.shard,
                expires_at: r.expires_at,
            },
        );
        true
    }

    /// Moves everything due by `now` from the wheel into the expired set.
    pub fn advance(&mut self, now: Millis) {
        if now <= self.wheel.elapsed() {
            return;
        }
        let mut fired = Vec::new();
        self.wheel.poll(now, &mut fired);
        for (deadline, token) in fired {
            if let Some(r) = self.map.get_mut(&token) {
                debug_assert_eq!(r.state, ResState::Reserved);
                debug_assert_eq!(r.expires_at, deadline);
                r.timer = None;
                self.expired.insert((deadline, token));
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
