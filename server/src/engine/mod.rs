//! The reservation engine: sales, shard counters, reservations, expiry. No I/O: time
//! comes from an injected [`Clock`], durability from an injected [`EventSink`].
//!
//! Locks, in the only order they are ever nested:
//! 1. a user stripe (only for sales with a per-user limit),
//! 2. a reservation stripe (all of them, in index order, when the world is stopped),
//! 3. the sales registry (read) and a sale's admin lock.
//!
//! The reserve path takes no exclusive lock shared by all buyers: the registry is read
//! locked (shared), the reservation stripe is chosen by token, and stock is taken from a
//! shard counter by compare-and-swap.

pub mod clock;
pub mod error;
pub mod event;
mod expired_summary;
pub mod fasthash;
pub mod ident;
pub mod sale;
pub mod table;
pub mod token;
pub mod types;
pub mod wheel;

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam::utils::CachePadded;
use parking_lot::{Mutex, MutexGuard, RwLock};

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::EngineError;
pub use event::{Event, EventRef, EventSink, Lsn, NullSink};
use sale::{fnv1a, split, Sale};
use table::{Res, Stripe};
pub use token::{Keyring, ReservationKey};
pub use types::*;

const STRIPES: usize = 128;
const USER_STRIPES: usize = 64;
/// Upper bound for TTLs and EXTEND: far inside the wheel's span, and far beyond any sale.
pub const MAX_TTL_MS: u64 = 30 * 24 * 3600 * 1000;
pub const MAX_SHARDS: u16 = 1024;
pub const MAX_QTY: u32 = 1_000_000;
/// Totals stay far from i64 overflow in the shard counters.
pub const MAX_TOTAL: u64 = 1 << 48;
/// Bounded stealing: shards probed after the home shard on sold-out.
pub const STEAL_PROBES: usize = 2;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub default_shards: u16,
    pub default_ttl_ms: u64,
    /// How long finished reservations stay queryable (idempotent retries) before purge.
    pub retention_ms: u64,
    /// Release expired reservations without a sweeper (deployments with no ledger).
    pub auto_release: bool,
    /// Reservations to size the table for up front (0: grow on demand). Growing a large
    /// table rehashes it, a visible cost under sustained unlimited-stock load.
    pub expected_reservations: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            default_shards: 16,
            default_ttl_ms: 630_000,
            retention_ms: 24 * 3600 * 1000,
            auto_release: false,
            expected_reservations: 0,
        }
    }
}

pub struct ReserveRequest<'a> {
    pub sku: &'a str,
    pub user: &'a str,
    pub admission: &'a str,
    pub request_id: &'a str,
    pub qty: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    Reserved {
        token: Arc<str>,
        expires_at_ms: Millis,
        shard: u16,
    },
    Replay {
        token: Arc<str>,
        expires_at_ms: Millis,
        shard: u16,
    },
    SoldOut,
    /// The user's reservations in this sale that are still RESERVED.
    Limit {
        live: Vec<Arc<str>>,
    },
}

#[derive(Default)]
struct UserEntry {
    /// Units RESERVED or COMMITTED by this user in this sale.
    held: u64,
    live: Vec<Arc<str>>,
}

type UserStripe = HashMap<Arc<str>, HashMap<Box<str>, UserEntry>>;

/// What a finished reservation changes in its user's entry (limited sales only), applied
/// after the stripe lock is dropped: (sale, user, qty, token).
type UserUpdate = (Arc<Sale>, Arc<str>, u32, Arc<str>);

pub struct Engine {
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    sink: Arc<dyn EventSink>,
    keys: Keyring,
    rkey: ReservationKey,
    sales: RwLock<HashMap<Arc<str>, Arc<Sale>>>,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    users: Box<[CachePadded<Mutex<UserStripe>>]>,
}

fn stripe_of(token: &str) -> usize {
    // High bits: the map inside the stripe uses the low ones.
    ((fasthash::hash_bytes(token.as_bytes()) >> 40) % STRIPES as u64) as usize
}

/// Everything the engine holds while the world is stopped.
pub struct WorldGuard<'a> {
    _stripes: Vec<MutexGuard<'a, Stripe>>,
}

impl Engine {
    pub fn new(
        cfg: EngineConfig,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn EventSink>,
        keys: Keyring,
        rkey: ReservationKey,
    ) -> Engine {
        let now = clock.now_ms();
        let stripes = (0..STRIPES)
            .map(|_| {
                CachePadded::new(Mutex::new(Stripe::new(
                    now,
                    cfg.expected_reservations / STRIPES,
                )))
            })
            .collect();
        Engine {
            cfg,
            clock,
            sink,
            keys,
            rkey,
            sales: RwLock::new(HashMap::new()),
            stripes,
            users: (0..USER_STRIPES)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
        }
    }

    /// Replaces the sink (recovery replays with no sink, then the WAL takes over).
    pub fn set_sink(&mut self, sink: Arc<dyn EventSink>) {
        self.sink = sink;
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    pub fn key_fingerprint(&self) -> &str {
        self.rkey.fingerprint()
    }

    pub fn keyring(&self) -> &Keyring {
        &self.keys
    }

    pub fn reservation_token(&self, sku: &str, user: &str, request_id: &str) -> String {
        self.rkey.derive(sku, user, request_id)
    }

    fn sale(&self, sku: &str) -> Result<Arc<Sale>, EngineError> {
        self.sales
            .read()
            .get(sku)
            .cloned()
            .ok_or(EngineError::NoSale)
    }

    fn user_stripe(&self, sku: &str, user: &str) -> &Mutex<UserStripe> {
        let h = fnv1a(sku.as_bytes()) ^ fnv1a(user.as_bytes()).rotate_left(17);
        &self.users[(h % USER_STRIPES as u64) as usize]
    }

    fn stop_world(&self) -> WorldGuard<'_> {
        WorldGuard {
            _stripes: self.stripes.iter().map(|s| s.lock()).collect(),
        }
    }

    // ----- sale administration -------------------------------------------------------

    /// SALE.CREATE. Same parameters again: Ok (idempotent). Different: `Exists`.
    pub fn create_sale(
        &self,
        sku: &str,
        total: u64,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<Lsn, EngineError> {
        let params = self.params(sku, total, shards, ttl_ms, limit)?;
        let mut sales = self.sales.write();
        if let Some(s) = sales.get(sku) {
            return if s.params == params {
                Ok(0)
            } else {
                Err(EngineError::Exists)
            };
        }
        let sku: Arc<str> = sku.into();
        let lsn = self.sink.record(&EventRef::SaleCreated {
            sku: &sku,
            params: &params,
            at_ms: self.clock.now_ms(),
        });
        sales.insert(
            sku.clone(),
            Arc::new(Sale::new(sku, params, SaleState::Open)),
        );
        Ok(lsn)
    }

    fn params(
        &self,
        sku: &str,
        total: u64,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<SaleParams, EngineError> {
        ident::check_sku(sku)?;
        if total > MAX_TOTAL {
            return Err(EngineError::Argument("total out of range"));
        }
        let shards = shards.unwrap_or(self.cfg.default_shards);
        if shards == 0 || shards > MAX_SHARDS {
            return Err(EngineError::Argument("shards must be 1..=1024"));
        }
        let ttl_ms = ttl_ms.unwrap_or(self.cfg.default_ttl_ms);
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(EngineError::Argument("ttl must be 1..=2592000000 ms"));
        }
        Ok(SaleParams {
            total,
            shards,
            ttl_ms,
            limit: limit.unwrap_or(0),
        })
    }

    pub fn sale_info(&self, sku: &str) -> Result<SaleView, EngineError> {
        Ok(self.sale(sku)?.view())
    }

    pub fn list_sales(&self) -> Vec<String> {
        let mut v: Vec<String> = self.sales.read().keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    }

    pub fn stock(&self, sku: &str) -> Result<i64, EngineError> {
        Ok(self.sale(sku)?.available())
    }

    /// SALE.PAUSE / SALE.RESUME. A fenced sale stays fenced until rebuilt.
    pub fn set_paused(&self, sku: &str, paused: bool) -> Result<Lsn, EngineError> {
        let sale = self.sale(sku)?;
        let _admin = sale.admin.lock();
        if sale.state() == SaleState::Fenced {
            return Err(EngineError::Fenced);
        }
        let state = if paused {
            SaleState::Paused
        } else {
            SaleState::Open
        };
        if sale.state() == state {
            return Ok(0);
        }
        sale.set_state(state);
        Ok(self.sink.record(&EventRef::SaleStateSet { sku, state }))
    }

    /// SALE.ADJUST: restock (spread over shards) or withdraw (at most what is available).
    pub fn adjust(&self, sku: &str, delta: i64) -> Result<(u64, Lsn), EngineError> {
        let sale = self.sale(sku)?;
        let _admin = sale.admin.lock();
        if sale.state() == SaleState::Fenced {
            return Err(EngineError::Fenced);
        }
        let n = sale.shard_count();
        if delta == 0 {
            return Ok((sale.total(), 0));
        }
        let mut deltas = vec![0i64; n];
        if delta > 0 {
            if sale.total().saturating_add(delta as u64) > MAX_TOTAL {
                return Err(EngineError::Argument("total out of range"));
            }
            for (i, d) in split(delta as u64, n as u16).into_iter().enumerate() {
                sale.give_back(i, d);
                deltas[i] = d;
            }
        } else {
            let mut want = delta.unsigned_abs() as i64;
            // Start at the fullest shards so a withdrawal leaves the counters even.
            let view = sale.view();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(view.shard_available[i]));
            for i in order {
                if want == 0 {
                    break;
                }
                let got = sale.take_up_to(i, want);
                deltas[i] = -got;
                want -= got;
            }
            if want > 0 {
                for (i, d) in deltas.iter().enumerate() {
                    if *d < 0 {
                        sale.give_back(i, -d);
                    }
                }
                return Err(EngineError::NotEnoughAvailable);
            }
        }
        let total = sale.add_total(delta);
        let lsn = self.sink.record(&EventRef::SaleAdjusted {
            sku,
            shard_deltas: &deltas,
        });
        Ok((total, lsn))
    }

    // ----- buyer path ------------------------------------------------------------------

    /// RESERVE, deciding in the order PROTOCOL.md lists.
    pub fn reserve(&self, req: &ReserveRequest<'_>) -> Result<(ReserveOutcome, Lsn), EngineError> {
        ident::check_sku(req.sku)?;
        ident::check_user(req.user)?;
        ident::check_request_id(req.request_id)?;
        if req.qty == 0 || req.qty > MAX_QTY {
            return Err(EngineError::Argument("qty must be 1..=1000000"));
        }
        let sale = self.sale(req.sku)?;
        if sale.state() == SaleState::Fenced {
            return Err(EngineError::Fenced);
        }
        let admission_expiry = self
            .keys
            .verify(req.admission, req.sku, req.user)
            .map_err(|d| EngineError::Denied(d.as_str()))?;
        let token = self.rkey.derive(req.sku, req.user, req.request_id);
        let limit = sale.params.limit;
        let mut users = if limit > 0 {
            Some(self.user_stripe(req.sku, req.user).lock())
        } else {
            None
        };
        let mut st = self.stripes[stripe_of(&token)].lock();
        // Read the clock under the lock: expiry deadlines then never trail the wheel.
        let now = self.clock.now_ms();
        if let Some((k, r)) = st.map.get_key_value(token.as_str()) {
            return Ok((
                ReserveOutcome::Replay {
                    token: k.clone(),
                    expires_at_ms: r.expires_at,
                    shard: r.shard,
                },
                r.lsn,
            ));
        }
        if now > admission_expiry {
            return Err(EngineError::Denied("expired"));
        }
        match sale.state() {
            SaleState::Open => {}
            SaleState::Paused => return Err(EngineError::Paused),
            SaleState::Fenced => return Err(EngineError::Fenced),
        }
        let mut entry = None;
        if let Some(us) = users.as_mut() {
            let e = us
                .entry(sale.sku.clone())
                .or_default()
                .entry(req.user.into())
                .or_default();
            if e.held + req.qty as u64 > limit as u64 {
                return Ok((
                    ReserveOutcome::Limit {
                        live: e.live.clone(),
                    },
                    0,
                ));
            }
            entry = Some(e);
        }
        let Some(shard) = self.take_stock(&sale, req.user, req.qty) else {
            return Ok((ReserveOutcome::SoldOut, 0));
        };
        sale.add_reserved(req.qty);
        let expires_at = now + sale.params.ttl_ms;
        let token: Arc<str> = token.into();
        let timer = st.schedule(&token, expires_at);
        let lsn = self.sink.record(&EventRef::Reserved {
            token: &token,
            sku: req.sku,
            user: req.user,
            request_id: req.request_id,
            qty: req.qty,
            shard,
            expires_at_ms: expires_at,
            created_at_ms: now,
        });
        st.map.insert(
            token.clone(),
            Res {
                sale: sale.clone(),
                user: req.user.into(),
                request_id: req.request_id.into(),
                qty: req.qty,
                shard,
                state: ResState::Reserved,
                expires_at,
                created_at: now,
                finished_at: 0,
                timer,
                lsn,
            },
        );
        if let Some(e) = entry {
            e.held += req.qty as u64;
            e.live.push(token.clone());
        }
        Ok((
            ReserveOutcome::Reserved {
                token,
                expires_at_ms: expires_at,
                shard,
            },
            lsn,
        ))
    }

    /// Home shard first, then at most [`STEAL_PROBES`] other shards picked at random (a
    /// retry probes other shards), never a linear scan. The shard taken is logged, so
    /// replay does not depend on the choice.
    fn take_stock(&self, sale: &Sale, user: &str, qty: u32) -> Option<u16> {
        let n = sale.shard_count();
        let home = sale.home_shard(user);
        if sale.try_take(home, qty) {
            return Some(home as u16);
        }
        if n == 1 {
            return None;
        }
        let mut h: u64 = rand::random();
        let mut tried = [home; STEAL_PROBES + 1];
        for probe in 1..=STEAL_PROBES.min(n - 1) {
            let mut cand = (home + 1 + (h % (n as u64 - 1)) as usize) % n;
            while tried[..probe].contains(&cand) {
                cand = (cand + 1) % n;
            }
            tried[probe] = cand;
            if sale.try_take(cand, qty) {
                return Some(cand as u16);
            }
            h = h.rotate_left(21) ^ 0x9e37_79b9_7f4a_7c15;
        }
        None
    }

    /// RELEASE: `(true, lsn)` if this call returned the units.
    pub fn release(&self, token: &str) -> (bool, Lsn) {
        let now = self.clock.now_ms();
        let mut st = self.stripes[stripe_of(token)].lock();
        let out = self.release_locked(&mut st, token, now, true);
        drop(st);
        if let Some((sale, user, qty, tok)) = out.2 {
            self.user_release(&sale, &user, qty, &tok, true);
        }
        (out.0, out.1)
    }

    fn release_locked(
        &self,
        st: &mut Stripe,
        token: &str,
        now: Millis,
        log: bool,
    ) -> (bool, Lsn, Option<UserUpdate>) {
        let Some((key, r)) = st.map.get_key_value(token) else {
            return (false, 0, None);
        };
        if r.state != ResState::Reserved {
            return (false, r.lsn, None);
        }
        let key = key.clone();
        let (lsn, upd) = self.finish_locked(st, key, now, ResState::Released, log);
        (true, lsn, upd)
    }

    /// The one way a reservation leaves RESERVED (release and commit alike): out of the
    /// wheel, counters moved, logged under the stripe lock, queued for retention. The
    /// caller has checked that `key` is RESERVED.
    fn finish_locked(
        &self,
        st: &mut Stripe,
        key: Arc<str>,
        now: Millis,
        to: ResState,
        log: bool,
    ) -> (Lsn, Option<UserUpdate>) {
        let (timer, expires_at) = match st.map.get(&key) {
            Some(r) => (r.timer, r.expires_at),
            None => return (0, None),
        };
        st.unschedule(&key, timer, expires_at);
        let Some(r) = st.map.get_mut(&key) else {
            return (0, None);
        };
        debug_assert_eq!(r.state, ResState::Reserved);
        r.state = to;
        r.finished_at = now;
        r.timer = None;
        r.sale.sub_reserved(r.qty);
        match to {
            ResState::Released => r.sale.give_back(r.shard as usize, r.qty as i64),
            ResState::Committed => r.sale.add_committed(r.qty),
            ResState::Reserved => debug_assert!(false, "finish to RESERVED"),
        }
        if log {
            let token = &*key;
            r.lsn = self.sink.record(&match to {
                ResState::Committed => EventRef::Committed { token, at_ms: now },
                _ => EventRef::Released { token, at_ms: now },
            });
        }
        let lsn = r.lsn;
        let upd =
            (r.sale.params.limit > 0).then(|| (r.sale.clone(), r.user.clone(), r.qty, key.clone()));
        st.finished.push_back((now, key));
        (lsn, upd)
    }

    fn user_release(&self, sale: &Sale, user: &str, qty: u32, token: &Arc<str>, give_back: bool) {
        let mut us = self.user_stripe(&sale.sku, user).lock();
        if let Some(e) = us.get_mut(&*sale.sku).and_then(|m| m.get_mut(user)) {
            if give_back {
                debug_assert!(e.held >= qty as u64);
                e.held = e.held.saturating_sub(qty as u64);
            }
            e.live.retain(|t| t != token);
        }
    }

    /// COMMIT: `Ok((true, _))` committed now, `Ok((false, _))` already committed.
    pub fn commit(&self, token: &str) -> Result<(bool, Lsn), EngineError> {
        let now = self.clock.now_ms();
        let mut st = self.stripes[stripe_of(token)].lock();
        let (res, upd) = self.commit_locked(&mut st, token, now, true);
        drop(st);
        if let Some((sale, user, qty, tok)) = upd {
            self.user_release(&sale, &user, qty, &tok, false);
        }
        res
    }

    fn commit_locked(
        &self,
        st: &mut Stripe,
        token: &str,
        now: Millis,
        log: bool,
    ) -> (Result<(bool, Lsn), EngineError>, Option<UserUpdate>) {
        let Some((key, r)) = st.map.get_key_value(token) else {
            return (Err(EngineError::NoReservation), None);
        };
        match r.state {
            ResState::Committed => return (Ok((false, r.lsn)), None),
            ResState::Released => return (Err(EngineError::Released), None),
            ResState::Reserved => {}
        }
        // A fenced sale is frozen for commits: the rebuild takes `committed` from the
        // ledger, and a commit landing between the ledger read and the rebuild would be
        // counted nowhere. The caller retries after the rebuild.
        if log && r.sale.state() == SaleState::Fenced {
            return (Err(EngineError::Fenced), None);
        }
        let key = key.clone();
        let (lsn, upd) = self.finish_locked(st, key, now, ResState::Committed, log);
        (Ok((true, lsn)), upd)
    }

    /// EXTEND: new deadline `now + ms`, only while RESERVED and not yet expired.
    pub fn extend(&self, token: &str, ms: u64) -> Result<(Millis, Lsn), EngineError> {
        if ms == 0 || ms > MAX_TTL_MS {
            return Err(EngineError::Argument("ms must be 1..=2592000000"));
        }
        let mut st = self.stripes[stripe_of(token)].lock();
        let now = self.clock.now_ms();
        let Some((key, r)) = st.map.get_key_value(token) else {
            return Err(EngineError::NoReservation);
        };
        if r.state != ResState::Reserved {
            return Err(EngineError::NoReservation);
        }
        if r.expires_at <= now {
            return Err(EngineError::Expired);
        }
        let key = key.clone();
        let (timer, old) = (r.timer, r.expires_at);
        let new = now + ms;
        st.unschedule(&key, timer, old);
        let timer = st.schedule(&key, new);
        let lsn = self.sink.record(&EventRef::Extended {
            token,
            expires_at_ms: new,
        });
        if let Some(r) = st.map.get_mut(token) {
            r.expires_at = new;
            r.timer = timer;
            r.lsn = lsn;
        }
        Ok((new, lsn))
    }

    /// RESERVATION: the current record and the log position that made it.
    pub fn reservation(&self, token: &str) -> Option<(ReservationView, Lsn)> {
        let st = self.stripes[stripe_of(token)].lock();
        st.map.get(token).map(|r| (r.view(token), r.lsn))
    }

    /// EXPIRED: RESERVED reservations with `expires_at <= now`, oldest first, at most
    /// `count`. Reading changes nothing a client can see.
    pub fn expired(&self, count: usize, sku: Option<&str>) -> Vec<ReservationView> {
        let now = self.clock.now_ms();
        let mut all: Vec<ReservationView> = Vec::new();
        for s in self.stripes.iter() {
            let mut st = s.lock();
            st.advance(now);
            let mut taken = 0;
            for (_, token) in st.expired.iter() {
                if taken >= count {
                    break;
                }
                if let Some(r) = st.map.get(token) {
                    if sku.is_none_or(|k| *r.sale.sku == *k) {
                        all.push(r.view(token));
                        taken += 1;
                    }
                }
            }
        }
        all.sort_by(|a, b| (a.expires_at_ms, &a.token).cmp(&(b.expires_at_ms, &b.token)));
        all.truncate(count);
        all
    }

    /// Housekeeping, called periodically: expiry (and auto-release if configured) and
    /// retention purge. Returns the last log position it wrote.
    pub fn tick(&self) -> Lsn {
        let now = self.clock.now_ms();
        let mut last = 0;
        let mut user_updates = Vec::new();
        for s in self.stripes.iter() {
            let mut st = s.lock();
            st.advance(now);
            if self.cfg.auto_release {
                let due: Vec<Arc<str>> = st.expired.iter().map(|(_, t)| t.clone()).collect();
                for t in due {
                    let (released, lsn, upd) = self.release_locked(&mut st, &t, now, true);
                    debug_assert!(released);
                    last = last.max(lsn);
                    user_updates.extend(upd);
                }
            }
            while let Some((at, _)) = st.finished.front() {
                if at.saturating_add(self.cfg.retention_ms) > now {
                    break;
                }
                let Some((_, t)) = st.finished.pop_front() else {
                    break;
                };
                let purge = st
                    .map
                    .get(&t)
                    .is_some_and(|r| r.state != ResState::Reserved);
                if purge {
                    st.map.remove(&t);
                    last = last.max(self.sink.record(&EventRef::Purged { token: &t }));
                }
            }
        }
        for (sale, user, qty, tok) in user_updates {
            self.user_release(&sale, &user, qty, &tok, true);
        }
        last
    }

    // ----- fencing and rebuild ---------------------------------------------------------

    /// SALE.FENCE: refuse reservations until rebuilt. Creates the sale (fenced, nothing
    /// available) when this server does not know it: its state was lost.
    pub fn fence(
        &self,
        sku: &str,
        total: Option<u64>,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<Lsn, EngineError> {
        ident::check_sku(sku)?;
        // Stop the world so no reservation decided as "open" is logged after the fence.
        let _world = self.stop_world();
        let existing = self.sales.read().get(sku).cloned();
        let sale = match existing {
            Some(s) => s,
            None => {
                let params = self.params(sku, total.unwrap_or(0), shards, ttl_ms, limit)?;
                let sku_arc: Arc<str> = sku.into();
                self.sink.record(&EventRef::SaleCreated {
                    sku,
                    params: &params,
                    at_ms: self.clock.now_ms(),
                });
                let sale = Arc::new(Sale::new(sku_arc.clone(), params, SaleState::Fenced));
                let zeros = vec![0i64; sale.shard_count()];
                sale.overwrite(sale.params.total, 0, 0, &zeros);
                self.sink.record(&EventRef::SaleRebuilt {
                    sku,
                    total: sale.params.total,
                    committed: 0,
                    shard_available: &zeros,
                });
                self.sales.write().insert(sku_arc, sale.clone());
                sale
            }
        };
        let _admin = sale.admin.lock();
        sale.set_state(SaleState::Fenced);
        Ok(self.sink.record(&EventRef::SaleStateSet {
            sku,
            state: SaleState::Fenced,
        }))
    }

    /// SALE.RESTORE: put back a pending reservation the ledger verified, on a fenced sale.
    /// Counters are left alone: the rebuild that follows recomputes them.
    pub fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at: Millis,
        created_at: Millis,
    ) -> Result<(bool, Arc<str>, Lsn), EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        ident::check_request_id(request_id)?;
        if qty == 0 || qty > MAX_QTY {
            return Err(EngineError::Argument("qty must be 1..=1000000"));
        }
        let sale = self.sale(sku)?;
        let token: Arc<str> = self.rkey.derive(sku, user, request_id).into();
        let mut users = (sale.params.limit > 0).then(|| self.user_stripe(sku, user).lock());
        let mut st = self.stripes[stripe_of(&token)].lock();
        if sale.state() != SaleState::Fenced {
            return Err(EngineError::NotFenced);
        }
        if let Some(r) = st.map.get(&token) {
            return Ok((false, token, r.lsn));
        }
        let now = self.clock.now_ms();
        let expires_at = expires_at.min(now + MAX_TTL_MS);
        let shard = sale.home_shard(user) as u16;
        sale.add_reserved(qty);
        let timer = st.schedule(&token, expires_at);
        let lsn = self.sink.record(&EventRef::Reserved {
            token: &token,
            sku,
            user,
            request_id,
            qty,
            shard,
            expires_at_ms: expires_at,
            created_at_ms: created_at,
        });
        st.map.insert(
            token.clone(),
            Res {
                sale: sale.clone(),
                user: user.into(),
                request_id: request_id.into(),
                qty,
                shard,
                state: ResState::Reserved,
                expires_at,
                created_at,
                finished_at: 0,
                timer,
                lsn,
            },
        );
        if let Some(us) = users.as_mut() {
            let e = us
                .entry(sale.sku.clone())
                .or_default()
                .entry(user.into())
                .or_default();
            e.held += qty as u64;
            e.live.push(token.clone());
        }
        Ok((true, token, lsn))
    }

    /// SALE.REBUILD: counters from the ledger; `available = total − committed − units of
    /// the RESERVED reservations now in the table`, spread over the shards; the sale opens.
    pub fn rebuild(
        &self,
        sku: &str,
        total: u64,
        committed: u64,
        fingerprint: &str,
    ) -> Result<(i64, Lsn), EngineError> {
        if fingerprint != self.rkey.fingerprint() {
            return Err(EngineError::FingerprintMismatch {
                server: self.rkey.fingerprint().to_string(),
                ledger: fingerprint.to_string(),
            });
        }
        if total > MAX_TOTAL {
            return Err(EngineError::Argument("total out of range"));
        }
        let world = self.stop_world();
        let sale = self.sale(sku)?;
        if sale.state() != SaleState::Fenced {
            return Err(EngineError::NotFenced);
        }
        let reserved = reserved_units(&world, &sale);
        let available = total as i128 - committed as i128 - reserved as i128;
        if available < 0 {
            return Err(EngineError::Argument(
                "ledger inconsistent: committed + pending exceed total",
            ));
        }
        let shard_available = split(available as u64, sale.shard_count() as u16);
        let _admin = sale.admin.lock();
        sale.overwrite(total, committed, reserved, &shard_available);
        self.sink.record(&EventRef::SaleRebuilt {
            sku,
            total,
            committed,
            shard_available: &shard_available,
        });
        sale.set_state(SaleState::Open);
        let lsn = self.sink.record(&EventRef::SaleStateSet {
            sku,
            state: SaleState::Open,
        });
        Ok((available as i64, lsn))
    }

    // ----- snapshots and replay -------------------------------------------------------

    /// Dumps the whole state while the world is stopped, and runs `cut` before the world
    /// resumes, so the WAL can mark the exact log position the snapshot covers.
    pub fn snapshot_with<R>(&self, cut: impl FnOnce() -> R) -> (Snapshot, R) {
        let world = self.stop_world();
        let sales_map = self.sales.read();
        let guards: Vec<_> = sales_map.values().map(|s| s.admin.lock()).collect();
        let mut sales: Vec<SaleView> = sales_map.values().map(|s| s.view()).collect();
        sales.sort_by(|a, b| a.sku.cmp(&b.sku));
        // Under the stopped world only reference counts are bumped; the owned views are
        // built after the world resumes, so the pause stays short for large tables.
        let total: usize = world._stripes.iter().map(|st| st.map.len()).sum();
        let mut raw: Vec<(Arc<str>, Res)> = Vec::with_capacity(total);
        for st in world._stripes.iter() {
            raw.extend(st.map.iter().map(|(t, r)| (t.clone(), r.clone())));
        }
        let r = cut();
        drop(guards);
        drop(sales_map);
        drop(world);
        let reservations = raw.iter().map(|(t, r)| r.view(t)).collect();
        (
            Snapshot {
                sales,
                reservations,
            },
            r,
        )
    }

    /// Loads a snapshot into an empty engine (recovery).
    pub fn load_snapshot(&self, snap: &Snapshot) {
        {
            let mut sales = self.sales.write();
            for s in &snap.sales {
                let sku: Arc<str> = s.sku.as_str().into();
                let sale = Sale::new(sku.clone(), s.params.clone(), s.state);
                sale.overwrite(s.total, s.committed, s.reserved, &s.shard_available);
                sales.insert(sku, Arc::new(sale));
            }
        }
        let mut finished: Vec<&ReservationView> = Vec::new();
        for r in &snap.reservations {
            self.insert_restored(r, false);
            if r.state != ResState::Reserved {
                finished.push(r);
            }
        }
        finished.sort_by_key(|r| r.finished_at_ms);
        for r in finished {
            let token: Arc<str> = r.token.as_str().into();
            self.stripes[stripe_of(&token)]
                .lock()
                .finished
                .push_back((r.finished_at_ms, token));
        }
    }

    /// Inserts a reservation as recorded (snapshot or replay). With `take`, the units are
    /// taken from the shard as a live RESERVE did.
    fn insert_restored(&self, r: &ReservationView, take: bool) {
        let Ok(sale) = self.sale(&r.sku) else {
            debug_assert!(false, "reservation for unknown sale {}", r.sku);
            return;
        };
        let token: Arc<str> = r.token.as_str().into();
        let mut st = self.stripes[stripe_of(&token)].lock();
        if take {
            if sale.state() != SaleState::Fenced {
                sale.give_back(r.shard as usize % sale.shard_count(), -(r.qty as i64));
            }
            sale.add_reserved(r.qty);
        }
        let timer = if r.state == ResState::Reserved {
            st.schedule(&token, r.expires_at_ms)
        } else {
            None
        };
        st.map.insert(
            token.clone(),
            Res {
                sale: sale.clone(),
                user: r.user.as_str().into(),
                request_id: r.request_id.as_str().into(),
                qty: r.qty,
                shard: r.shard,
                state: r.state,
                expires_at: r.expires_at_ms,
                created_at: r.created_at_ms,
                finished_at: r.finished_at_ms,
                timer,
                lsn: 0,
            },
        );
        drop(st);
        if sale.params.limit > 0 && r.state != ResState::Released {
            let mut us = self.user_stripe(&r.sku, &r.user).lock();
            let e = us
                .entry(sale.sku.clone())
                .or_default()
                .entry(r.user.as_str().into())
                .or_default();
            e.held += r.qty as u64;
            if r.state == ResState::Reserved {
                e.live.push(token);
            }
        }
    }

    /// Replays one logged event (recovery). Events are trusted to come from this engine's
    /// own log; one that does not fit the state is skipped (and trips a debug assertion).
    pub fn apply(&self, ev: &Event) {
        match ev {
            Event::SaleCreated { sku, params, .. } => {
                let sku: Arc<str> = sku.as_str().into();
                self.sales
                    .write()
                    .entry(sku.clone())
                    .or_insert_with(|| Arc::new(Sale::new(sku, params.clone(), SaleState::Open)));
            }
            Event::SaleAdjusted { sku, shard_deltas } => {
                if let Ok(sale) = self.sale(sku) {
                    for (i, d) in shard_deltas.iter().enumerate().take(sale.shard_count()) {
                        sale.give_back(i, *d);
                    }
                    sale.add_total(shard_deltas.iter().sum());
                }
            }
            Event::SaleStateSet { sku, state } => {
                if let Ok(sale) = self.sale(sku) {
                    sale.set_state(*state);
                }
            }
            Event::Reserved { token, .. } => {
                let exists = self.stripes[stripe_of(token)]
                    .lock()
                    .map
                    .contains_key(token.as_str());
                debug_assert!(!exists, "reserved twice in the log");
                if let (false, Some(view)) = (exists, ev.reserved_view()) {
                    self.insert_restored(&view, true);
                }
            }
            Event::Released { token, at_ms } => {
                let mut st = self.stripes[stripe_of(token)].lock();
                let (_, _, upd) = self.release_locked(&mut st, token, *at_ms, false);
                drop(st);
                if let Some((sale, user, qty, tok)) = upd {
                    self.user_release(&sale, &user, qty, &tok, true);
                }
            }
            Event::Committed { token, at_ms } => {
                let mut st = self.stripes[stripe_of(token)].lock();
                let (_, upd) = self.commit_locked(&mut st, token, *at_ms, false);
                drop(st);
                if let Some((sale, user, qty, tok)) = upd {
                    self.user_release(&sale, &user, qty, &tok, false);
                }
            }
            Event::Extended {
                token,
                expires_at_ms,
            } => {
                let mut st = self.stripes[stripe_of(token)].lock();
                if let Some((key, r)) = st.map.get_key_value(token.as_str()) {
                    let key = key.clone();
                    let (timer, old) = (r.timer, r.expires_at);
                    st.unschedule(&key, timer, old);
                    let timer = st.schedule(&key, *expires_at_ms);
                    if let Some(r) = st.map.get_mut(token.as_str()) {
                        r.expires_at = *expires_at_ms;
                        r.timer = timer;
                    }
                }
            }
            Event::Purged { token } => {
                let mut st = self.stripes[stripe_of(token)].lock();
                st.map.remove(token.as_str());
            }
            Event::SaleRebuilt {
                sku,
                total,
                committed,
                shard_available,
            } => {
                let world = self.stop_world();
                if let Ok(sale) = self.sale(sku) {
                    let reserved = reserved_units(&world, &sale);
                    sale.overwrite(*total, *committed, reserved, shard_available);
                }
            }
        }
    }

    /// Number of reservations held in memory (all states), for INFO.
    pub fn reservation_count(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().map.len()).sum()
    }
}

fn reserved_units(world: &WorldGuard<'_>, sale: &Arc<Sale>) -> u64 {
    world
        ._stripes
        .iter()
        .flat_map(|st| st.map.values())
        .filter(|r| Arc::ptr_eq(&r.sale, sale) && r.state == ResState::Reserved)
        .map(|r| r.qty as u64)
        .sum()
}

#[cfg(test)]
mod tests;
