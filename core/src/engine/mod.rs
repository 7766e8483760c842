//! The reservation engine: sales, shard counters, reservations, expiry. No I/O: time
//! comes from an injected [`Clock`], durability from an injected [`EventSink`].
//!
//! Locks, in the only order they are ever nested:
//! 1. a user stripe (only for sales with a per-user limit),
//! 2. a reservation stripe (all of them, in index order, when the world is stopped),
//! 3. the sales registry (read) and a sale's admin lock (a RESERVE that gathers units from
//!    several shards takes the admin lock while it holds its stripes).
//!
//! A sale's user-name table (`names`) has locks of its own, taken last and briefly: nothing
//! is locked while one is held.
//!
//! The reserve path takes no exclusive lock shared by all buyers: the registry is read
//! locked (shared), the reservation stripe is chosen by token, and stock is taken from a
//! shard counter by compare-and-swap. Only a RESERVE whose units no probed shard has,
//! while the sale has them, takes the sale's admin lock to gather them.

mod admin;
pub mod clock;
pub mod denied;
pub mod error;
pub mod event;
mod expired_summary;
pub mod fasthash;
mod handover;
mod history;
pub mod ident;
mod lifecycle;
pub mod names;
mod rebuild;
mod replay;
mod reserve;
mod room;
pub mod sale;
pub mod table;
pub mod token;
pub mod types;
pub mod wheel;

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam::utils::CachePadded;
use parking_lot::{Mutex, MutexGuard, RwLock};

pub use clock::{Clock, ManualClock, Monotonic, SystemClock, SystemWall, WallSource};
pub use error::EngineError;
pub use event::{Event, EventRef, EventSink, Lsn, NullSink};
pub use history::new_history_id;
pub use room::{RoomCountsView, RoomInfo, RoomMetrics};
use sale::{fnv1a, split, Sale};
use table::{Reservation, Stripe};
pub use token::{Denied, Keyring, ReservationKey, TokenBuf, TokenKey};
pub use types::*;

const STRIPES: usize = 128;
const USER_STRIPES: usize = 64;
/// Upper bound for TTLs and EXTEND: far inside the wheel's span, and far beyond any sale.
pub const MAX_TTL_MS: u64 = 30 * 24 * 3600 * 1000;
/// Most shards a sale may have.
pub const MAX_SHARDS: u16 = 1024;
/// Most units one RESERVE may take.
pub const MAX_QTY: u32 = 1_000_000;
/// Totals (about 1.1e12 units) stay far inside the 42-bit fields of a shard's packed
/// counters (`sale::ShardCounts`).
pub const MAX_TOTAL: u64 = 1 << 40;
/// Bounded stealing: shards probed after the home shard on sold-out, before gathering.
pub const STEAL_PROBES: usize = 2;

#[derive(Clone, Debug)]
/// How an engine runs: defaults for sales that name none, retention, expiry.
pub struct EngineConfig {
    /// Shards of a sale created without `SHARDS`.
    pub default_shards: u16,
    /// Hold time of a sale created without `TTL`.
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

/// A RESERVE as the engine takes it: every field as the client sent it.
pub struct ReserveRequest<'a> {
    /// The sale to reserve from.
    pub sku: &'a str,
    /// The buyer, as the admission token names them.
    pub user: &'a str,
    /// As the client sent it (not checked for UTF-8: see [`Keyring::verify`]).
    pub admission: &'a [u8],
    /// The buyer's id for this request: a retry with the same id replays the hold.
    pub request_id: &'a str,
    /// Units to hold.
    pub qty: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// What a RESERVE did.
pub enum ReserveOutcome {
    /// A new hold: `qty` units taken from `shard` until `expires_at_ms`.
    Reserved {
        /// Names the hold in COMMIT, RELEASE and EXTEND.
        token: TokenBuf,
        /// The hold's deadline.
        expires_at_ms: Millis,
        /// The shard the units came from.
        shard: u16,
    },
    /// A retry of a request that already holds: the same token, no stock taken.
    Replay {
        /// The existing hold's token.
        token: TokenBuf,
        /// The existing hold's deadline.
        expires_at_ms: Millis,
        /// The shard the existing hold took from.
        shard: u16,
    },
    /// The sale had fewer than `qty` units available (or concurrent buyers took them
    /// while they were being gathered from several shards).
    SoldOut,
    /// The per-user limit refused `qty` more units.
    Limit {
        /// The user's reservations in this sale that are still RESERVED.
        live: Vec<Arc<str>>,
        /// The sale's per-user limit, in units.
        limit: u32,
        /// Units the user holds in this sale (RESERVED or COMMITTED).
        held: u64,
    },
}

#[derive(Default)]
struct UserEntry {
    /// Units RESERVED or COMMITTED by this user in this sale.
    held: u64,
    /// Keys of the user's RESERVED reservations (tokens are `{sku}` + key).
    live: Vec<TokenKey>,
}

type UserStripe = HashMap<Arc<str>, HashMap<Box<str>, UserEntry>>;

/// What a finished reservation changes in its user's entry (limited sales only), applied
/// after the stripe lock is dropped: (sale, user, qty, token key).
type UserUpdate = (Arc<Sale>, names::UserId, u32, TokenKey);

/// The reservation engine: sales, their shard counters, the reservations and their expiry.
pub struct Engine {
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    sink: Arc<dyn EventSink>,
    /// Replaced whole by [`Engine::set_keyring`]; each RESERVE verifies with the ring it
    /// loaded.
    keys: arc_swap::ArcSwap<Keyring>,
    reservation_key: ReservationKey,
    /// By sku; a keyed fast hash (see `foldhash` in Cargo.toml), looked up per RESERVE.
    sales: RwLock<HashMap<Arc<str>, Arc<Sale>, foldhash::fast::RandomState>>,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    users: Box<[CachePadded<Mutex<UserStripe>>]>,
    /// See `history`: set once, by the first record or a snapshot.
    history: Mutex<Option<(Arc<str>, Lsn)>>,
    /// See [`Engine::set_concurrent_callers`].
    concurrent: std::sync::atomic::AtomicBool,
    /// `cfg.retention_ms`, changeable while running ([`Engine::set_retention_ms`]).
    retention_ms: std::sync::atomic::AtomicU64,
    /// A hash of the export each imported sale came from, so that the same handover
    /// retried is recognised after its sale changed (see `handover`).
    imports: Mutex<HashMap<Arc<str>, u64>>,
    /// The sales' waiting rooms, by sku (see `room`).
    rooms: RwLock<HashMap<Arc<str>, room::RoomHandle>>,
    /// Whether any sale has a room: RESERVE, RELEASE and the tick skip the rooms'
    /// registry while none does.
    has_rooms: std::sync::atomic::AtomicBool,
    /// What the rooms did on this engine, for metrics (see `room::RoomCounts`).
    room_counts: room::RoomCounts,
    /// Keys the rooms' user hashes and pre-queue draws (derived from the reservation key).
    room_secret: [u8; 32],
    /// Sign and verify queue tickets (derived from the reservation key).
    ticket_keys: crate::room::TicketKeys,
}

fn stripe_of(token: &str) -> usize {
    stripe_of_hash(fasthash::hash_bytes(token.as_bytes()))
}

fn stripe_of_hash(h: u64) -> usize {
    // High bits: the map inside the stripe uses the low ones.
    ((h >> 40) % STRIPES as u64) as usize
}

/// The stripe of the token a tombstone key was made from (its high half is the token's
/// table hash, see [`table::tomb_key`]).
fn stripe_of_tomb(key: u128) -> usize {
    stripe_of_hash((key >> 64) as u64)
}

/// Everything the engine holds while the world is stopped.
pub struct WorldGuard<'a> {
    _stripes: Vec<MutexGuard<'a, Stripe>>,
}

impl Engine {
    /// An engine with no sales, reading time from `clock` and logging to `sink`.
    pub fn new(
        cfg: EngineConfig,
        clock: Arc<dyn Clock>,
        sink: Arc<dyn EventSink>,
        keys: Keyring,
        reservation_key: ReservationKey,
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
        let (room_secret, ticket_keys) = room::room_keys(&reservation_key);
        Engine {
            retention_ms: std::sync::atomic::AtomicU64::new(cfg.retention_ms),
            cfg,
            clock,
            sink,
            keys: arc_swap::ArcSwap::from_pointee(keys),
            reservation_key,
            sales: RwLock::new(HashMap::default()),
            stripes,
            users: (0..USER_STRIPES)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            history: Mutex::new(None),
            concurrent: std::sync::atomic::AtomicBool::new(true),
            imports: Mutex::new(HashMap::new()),
            rooms: RwLock::new(HashMap::new()),
            has_rooms: std::sync::atomic::AtomicBool::new(false),
            room_counts: room::RoomCounts::default(),
            room_secret,
            ticket_keys,
        }
    }

    /// An empty engine with this one's settings, clock and keys, recording nowhere: what
    /// a snapshot built from the log (a Raft member's, `stockgate_server::raft::snapshot`) replays
    /// into, away from the live engine.
    pub fn empty_twin(&self) -> Engine {
        Engine::new(
            EngineConfig {
                retention_ms: self.retention_ms(),
                ..self.cfg.clone()
            },
            self.clock.clone(),
            Arc::new(NullSink),
            Keyring::clone(&self.keys.load()),
            self.reservation_key.clone(),
        )
    }

    /// Replaces the sink (recovery replays with no sink, then the WAL takes over).
    pub fn set_sink(&mut self, sink: Arc<dyn EventSink>) {
        self.sink = sink;
    }

    /// The configuration it was built with (the retention may have changed since:
    /// [`Engine::retention_ms`]).
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// How long finished reservations stay queryable before they are purged.
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes the retention from the next purge on (`CONFIG SET retention-ms`). Purges
    /// are logged records, so replay and replicas follow whatever the purger decided.
    pub fn set_retention_ms(&self, ms: u64) {
        self.retention_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// The time by the engine's clock.
    pub fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    /// The engine's clock, for the parts beside it that keep time the same way (the
    /// feed's consumer groups: delivery and idle times).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// The reservation key's fingerprint, which the ledger binding compares.
    pub fn key_fingerprint(&self) -> &str {
        self.reservation_key.fingerprint()
    }

    /// The keys admission tokens are verified with (the ring in place now).
    pub fn keyring(&self) -> Arc<Keyring> {
        self.keys.load_full()
    }

    /// Verifies admission tokens with `keys` from the next RESERVE on. Only this node's
    /// verification changes: a group's records carry decisions, not tokens, so members
    /// need not swap at the same moment (docs/operations.md, "Key rotation").
    pub fn set_keyring(&self, keys: Keyring) {
        self.keys.store(Arc::new(keys));
    }

    /// The token RESERVE would hand out for this request (derived, not looked up).
    pub fn reservation_token(&self, sku: &str, user: &str, request_id: &str) -> String {
        self.reservation_key.derive(sku, user, request_id)
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

    /// The highest log position handed out so far: what a reply that reports state
    /// without a log position of its own (an error, a no-op, a read) waits for.
    pub fn last_lsn(&self) -> Lsn {
        self.sink.last_lsn()
    }

    /// The log position that covers every counter a reader has seen before this call.
    /// A RESERVE takes its units (what STOCK, SALE.INFO and a SOLDOUT read) before its
    /// record has a position, both under its stripe's lock; with several event loops a
    /// reader on another thread can see the units gone before [`Engine::last_lsn`]
    /// covers them. Passing through every stripe's lock once, after reading, waits for
    /// each such record to be logged: 128 uncontended lock acquisitions, so only those
    /// replies pay it, and only when calls can run at once (see
    /// [`Engine::set_concurrent_callers`]).
    pub fn observed_lsn(&self) -> Lsn {
        if self.concurrent.load(std::sync::atomic::Ordering::Relaxed) {
            for s in self.stripes.iter() {
                drop(s.lock());
            }
        }
        self.sink.last_lsn()
    }

    /// Whether calls may run on several threads at once (the default). A server with one
    /// event loop says no: a reader then never runs while a RESERVE is between taking its
    /// units and logging them, and [`Engine::observed_lsn`] is [`Engine::last_lsn`].
    pub fn set_concurrent_callers(&self, concurrent: bool) {
        self.concurrent
            .store(concurrent, std::sync::atomic::Ordering::Relaxed);
    }

    /// Number of reservations held in memory (all states), for INFO.
    pub fn reservation_count(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests;
