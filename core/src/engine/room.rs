//! The sales' waiting rooms ([`crate::room`]) inside the engine: one [`Room`] per sale
//! that was given one (`ROOM.OPEN`), changed only by its ops, each logged as a
//! `RoomChanged` event before the reply that caused it (like every other change), so
//! recovery and the group's followers rebuild the same rooms through [`Engine::apply`].
//!
//! The engine moves a room (`Room::tick`) on every room command, after a RESERVE, a
//! RELEASE, a COMMIT or an ADJUST of its sale, and on the housekeeping tick
//! ([`Engine::tick`]): what the tick decides is itself a logged op, so replicas never
//! tick on their own. `now` is the engine's clock.
//!
//! The room's stock view is the sale's counters, `available` and `held` (its reserved
//! units), and `expiring_soon`: the units of its holds still waiting in the stripes'
//! wheels with a deadline within the room's `expiring_window_ms`, so the next buyers are
//! in line when those units come back. A hold past its deadline but not yet released (by
//! the sweeper, or the tick with auto-release) counts nothing: a stalled sweeper would
//! otherwise keep admitting buyers for units that never return.
//!
//! What counting those units costs: each stripe keeps, for the sales a room asked about
//! (only those), their holds' units by deadline, updated where the wheel links and
//! unlinks a hold (a map lookup and an ordered-map update per hold of such a sale; one
//! emptiness check per hold of any other sale, and nothing while no room asks). The
//! first count for a sale builds its entries from the stripes' records, once. A count
//! then takes the 128 stripe locks, one at a time, and walks that sale's deadlines
//! within the window: at most its live holds, never another sale's. It is skipped when
//! it cannot change the decision: no window, nothing held, or a budget that counting
//! every held unit would not raise (the rate, not the stock, is what limits). It runs on
//! the room's own commands, after a change of its sale's stock and on the tick: never
//! on another sale's requests.
//!
//! The keys: the user hashes, the pre-queue's seed and the tickets are derived from the
//! reservation key, which every member of a group shares (its fingerprint is checked), so
//! the same ops give the same room everywhere and a ticket verifies on any member.
//!
//! Locks: a room's mutex is taken with no stripe, admin or registry lock held (the hooks
//! run after RESERVE/RELEASE dropped theirs) and takes none but the registry's read lock
//! to find its sale; snapshots take the rooms after the stripes and sales. So the holds
//! due soon are counted before the room is locked for the decision (its settings and
//! budget are read under a short lock of their own, dropped before the stripes').

use std::sync::atomic::Ordering;

use crate::room::{Room, RoomConfig, Status, StockView, Ticket, TicketKeys, UserKey};

use super::*;

/// A sale's room, shared by the commands that lock it.
pub(super) type RoomHandle = Arc<Mutex<Room>>;

/// What `ROOM.INFO` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomInfo {
    /// The room's settings.
    pub config: RoomConfig,
    /// Buyers waiting (before or after opening).
    pub waiting: u32,
    /// Buyers admitted who have not reserved yet.
    pub admitted: u64,
    /// Whether the line has been drawn and moves.
    pub open: bool,
    /// Whether waiting buyers are told SOLDOUT.
    pub sold_out: bool,
}

/// What a room did, for metrics: counted as this engine applies the room's ops (live, or
/// replayed from the log or a group's leader), from zero when the engine is built, like
/// any Prometheus counter. Not room state: a snapshot or a move does not carry them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoomCountsView {
    /// Buyers admitted.
    pub admitted: u64,
    /// Admissions that expired unused.
    pub expired: u64,
}

/// [`RoomCountsView`] of every room, by sku (one entry per room, dropped with it).
#[derive(Default)]
pub(super) struct RoomCounts(Mutex<HashMap<Arc<str>, RoomCountsView>>);

impl RoomCounts {
    fn add(&self, sku: &str, admitted: u64, expired: u64) {
        if admitted == 0 && expired == 0 {
            return;
        }
        let mut m = self.0.lock();
        let c = match m.get_mut(sku) {
            Some(c) => c,
            None => m.entry(sku.into()).or_default(),
        };
        c.admitted = c.admitted.saturating_add(admitted);
        c.expired = c.expired.saturating_add(expired);
    }

    fn get(&self, sku: &str) -> RoomCountsView {
        self.0.lock().get(sku).copied().unwrap_or_default()
    }

    fn remove(&self, sku: &str) {
        self.0.lock().remove(sku);
    }
}

/// What the metrics and the status page show of a room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomMetrics {
    /// The sale.
    pub sku: String,
    /// Buyers waiting (before or after opening).
    pub waiting: u32,
    /// Buyers admitted who have not reserved yet.
    pub admitted_not_reserved: u64,
    /// Admissions and expired admissions so far (see [`RoomCountsView`]).
    pub counts: RoomCountsView,
    /// The wait the room would tell a buyer joining now: the line ahead over the
    /// admission rate observed recently (or the maximum rate before any admission).
    pub wait_estimate_ms: u64,
    /// Whether the line has been drawn and moves.
    pub open: bool,
    /// Whether waiting buyers are told SOLDOUT.
    pub sold_out: bool,
}

/// The room secret and ticket keys derived from the reservation key.
pub(super) fn room_keys(key: &ReservationKey) -> ([u8; 32], TicketKeys) {
    let secret = key.derive_secret("stockgate waiting room v1");
    let ticket = key.derive_secret("stockgate waiting room tickets v1");
    let keys = match TicketKeys::new(&[(key.fingerprint(), &ticket)]) {
        Ok(k) => k,
        // A fingerprint is 16 hex digits (a valid kid), a derived secret 32 bytes.
        Err(e) => unreachable!("derived ticket key refused: {e}"),
    };
    (secret, keys)
}

/// What the sale can serve now, from its counters (no holds counted as due soon).
fn stock_view(sale: &Sale) -> StockView {
    let (mut available, mut held) = (0i64, 0i64);
    for i in 0..sale.shard_count() {
        let c = sale.shard(i);
        available += c.available;
        held += c.reserved;
    }
    StockView {
        available: available.max(0) as u64,
        held: held.max(0) as u64,
        expiring_soon: 0,
    }
}

impl Engine {
    fn room(&self, sku: &str) -> Result<RoomHandle, EngineError> {
        self.rooms
            .read()
            .get(sku)
            .cloned()
            .ok_or(EngineError::NoRoom)
    }

    fn new_room(&self, sku: &str, config: RoomConfig) -> Result<Room, EngineError> {
        Room::new(sku, config, self.ticket_keys.clone(), &self.room_secret)
            .map_err(EngineError::RoomConfig)
    }

    /// Logs the ops the room queued, in order, with the room still locked: the log's
    /// order is the order they were applied in. The last LSN, 0 for none.
    fn log_room_ops(&self, sku: &str, room: &mut Room) -> Lsn {
        let mut lsn = 0;
        for op in room.take_ops() {
            lsn = self.sink.record(&EventRef::RoomChanged { sku, op: &op });
        }
        lsn
    }

    /// Units of the live holds of `sku` due in `(now, now + window]`, over every stripe
    /// (each locked on its own, with no other lock held).
    fn expiring_units(&self, sku: &str, now: Millis, window: u64) -> u64 {
        let until = now.saturating_add(window);
        self.stripes
            .iter()
            .map(|s| s.lock().due_units(sku, now, until))
            .fold(0u64, u64::saturating_add)
    }

    /// What the room of `sale` may admit against at `now`: the sale's counters, plus the
    /// holds due within the room's window when counting them could change the budget.
    /// Takes the room's lock briefly, then the stripes' with it released.
    fn room_stock(&self, sale: &Sale, handle: &RoomHandle, now: Millis) -> StockView {
        let plain = stock_view(sale);
        let window = {
            let room = handle.lock();
            let window = room.config().expiring_window_ms;
            let every_held = StockView {
                expiring_soon: plain.held,
                ..plain
            };
            if window == 0 || room.budget(now, &every_held) <= room.budget(now, &plain) {
                return plain;
            }
            window
        };
        let due = self.expiring_units(&sale.sku, now, window);
        StockView {
            expiring_soon: due.min(plain.held),
            ..plain
        }
    }

    /// The sale of `sku` and what its room may admit against at `now`, or `None` for a
    /// sale gone or frozen for a move: its room does not move with it.
    fn room_sale_stock(
        &self,
        sku: &str,
        handle: &RoomHandle,
        now: Millis,
    ) -> Option<(Arc<Sale>, StockView)> {
        let sale = self.sale(sku).ok()?;
        if sale.state().is_moving() {
            return None;
        }
        let stock = self.room_stock(&sale, handle, now);
        Some((sale, stock))
    }

    /// Moves a locked room to now with its sale's stock (counted by
    /// [`Engine::room_stock`] before the lock), logging what changed.
    fn tick_locked(&self, sku: &str, room: &mut Room, now: Millis, stock: &StockView) -> Lsn {
        let before = room.admitted_not_reserved() as u64;
        let admitted = room.tick(now, stock).len() as u64;
        // A tick only expires admissions and makes new ones: the rest of the change in
        // the admitted count is what expired.
        let after = room.admitted_not_reserved() as u64;
        let expired = (before + admitted).saturating_sub(after);
        self.room_counts.add(sku, admitted, expired);
        self.log_room_ops(sku, room)
    }

    /// `ROOM.OPEN`: gives the sale a waiting room. The same settings again: Ok
    /// (idempotent); other settings: [`EngineError::RoomExists`].
    pub fn open_room(&self, sku: &str, config: RoomConfig) -> Result<Lsn, EngineError> {
        ident::check_sku(sku)?;
        let sale = self.sale(sku)?;
        sale.check_not_moving()?;
        let room = self.new_room(sku, config)?;
        let mut rooms = self.rooms.write();
        if let Some(r) = rooms.get(sku) {
            return if r.lock().config() == room.config() {
                Ok(self.sink.last_lsn())
            } else {
                Err(EngineError::RoomExists)
            };
        }
        let lsn = self.sink.record(&EventRef::RoomOpened {
            sku,
            config: room.config(),
            at_ms: self.clock.now_ms(),
        });
        rooms.insert(sku.into(), Arc::new(Mutex::new(room)));
        self.has_rooms.store(true, Ordering::Release);
        Ok(lsn)
    }

    /// `ROOM.JOIN`: `user` takes a place (or gets the one it holds again) and is told
    /// where it stands. The LSN covers the join and whatever the room decided with it.
    pub fn room_join(&self, sku: &str, user: &str) -> Result<(Ticket, Status, Lsn), EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        let sale = self.sale(sku)?;
        sale.check_not_moving()?;
        let handle = self.room(sku)?;
        let now = self.clock.now_ms();
        let stock = self.room_stock(&sale, &handle, now);
        let mut room = handle.lock();
        let mut lsn = self.tick_locked(sku, &mut room, now, &stock);
        let joined = room.join_keyed(user, now);
        // Logged even when the join is refused: a join may open the sale first.
        lsn = lsn.max(self.log_room_ops(sku, &mut room));
        let (ticket, key) = joined.map_err(EngineError::Room)?;
        lsn = lsn.max(self.tick_locked(sku, &mut room, now, &stock));
        let status = room
            .status_keyed(key, now, &stock)
            .map_err(EngineError::Room)?;
        Ok((ticket, status, lsn))
    }

    /// `ROOM.STATUS`: where the place `ticket` names stands, after moving the room to
    /// now. Refuses a forged ticket, one of another sale or user, and a stale one.
    pub fn room_status(
        &self,
        sku: &str,
        user: &str,
        ticket: &str,
    ) -> Result<(Status, Lsn), EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        let sale = self.sale(sku)?;
        let handle = self.room(sku)?;
        let now = self.clock.now_ms();
        let stock = self.room_stock(&sale, &handle, now);
        let mut room = handle.lock();
        // A sale frozen for a move answers from the room as it stands.
        let lsn = if sale.state().is_moving() {
            0
        } else {
            self.tick_locked(sku, &mut room, now, &stock)
        };
        let status = room
            .status_ticket(ticket, user, now, &stock)
            .map_err(EngineError::Room)?;
        Ok((status, lsn))
    }

    /// Where the place `ticket` names stands, as the room is now, without moving it: a
    /// read (the buyer page asks it), where `ROOM.STATUS` may admit and log. The next
    /// command or engine tick moves the room on.
    pub fn room_peek(&self, sku: &str, user: &str, ticket: &str) -> Result<Status, EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        let sale = self.sale(sku)?;
        let handle = self.room(sku)?;
        let room = handle.lock();
        room.status_ticket(ticket, user, self.clock.now_ms(), &stock_view(&sale))
            .map_err(EngineError::Room)
    }

    /// The key of the place `ticket` names for `user` (checked as [`Engine::room_peek`]
    /// checks it), for [`Engine::room_peek_keyed`]: a buyer watching the sale's live
    /// counts has its own place read on every change without its ticket checked again.
    pub fn room_key(&self, sku: &str, user: &str, ticket: &str) -> Result<UserKey, EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        let handle = self.room(sku)?;
        let room = handle.lock();
        room.key_for_ticket(ticket, user).map_err(EngineError::Room)
    }

    /// [`Engine::room_peek`] of the place [`Engine::room_key`] gave `key` for.
    pub fn room_peek_keyed(&self, sku: &str, key: UserKey) -> Result<Status, EngineError> {
        let sale = self.sale(sku)?;
        let handle = self.room(sku)?;
        let room = handle.lock();
        room.status_keyed(key, self.clock.now_ms(), &stock_view(&sale))
            .map_err(EngineError::Room)
    }

    /// `ROOM.LEAVE`: `user` gives the place up (an unused admission's budget goes to the
    /// next buyer). `true` if it held one; a repeat changes nothing.
    pub fn room_leave(&self, sku: &str, user: &str) -> Result<(bool, Lsn), EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        let sale = self.sale(sku)?;
        sale.check_not_moving()?;
        let handle = self.room(sku)?;
        let now = self.clock.now_ms();
        let stock = self.room_stock(&sale, &handle, now);
        let mut room = handle.lock();
        let left = room.leave(user);
        let mut lsn = self.log_room_ops(sku, &mut room);
        lsn = lsn.max(self.tick_locked(sku, &mut room, now, &stock));
        Ok((left, lsn))
    }

    /// `ROOM.INFO`: the room's settings and counts.
    pub fn room_info(&self, sku: &str) -> Result<RoomInfo, EngineError> {
        ident::check_sku(sku)?;
        let handle = self.room(sku)?;
        let room = handle.lock();
        Ok(RoomInfo {
            config: room.config().clone(),
            waiting: room.waiting(),
            admitted: room.admitted_not_reserved() as u64,
            open: room.is_open(),
            sold_out: room.is_sold_out(),
        })
    }

    /// After a new hold in `sku` by `user`: the user's admission is used, and the room
    /// moves with the stock. Nothing to do (one atomic load) while no sale has a room.
    pub(super) fn room_after_reserve(&self, sku: &str, user: &str) {
        if !self.has_rooms.load(Ordering::Acquire) {
            return;
        }
        let Ok(handle) = self.room(sku) else {
            return;
        };
        let now = self.clock.now_ms();
        let stock = self.room_sale_stock(sku, &handle, now);
        let mut room = handle.lock();
        room.reserved(user);
        self.log_room_ops(sku, &mut room);
        if let Some((_, stock)) = stock {
            self.tick_locked(sku, &mut room, now, &stock);
        }
    }

    /// [`Engine::room_poke`] for the sale a reservation token names (RELEASE, COMMIT): the
    /// token is read only while some sale has a room.
    pub(super) fn room_poke_token(&self, token: &str) {
        if !self.has_rooms.load(Ordering::Acquire) {
            return;
        }
        if let Some(sku) = super::token::token_sku(token) {
            self.room_poke(sku);
        }
    }

    /// After the stock of `sku` changed (RELEASE, COMMIT, ADJUST): the room moves.
    pub(super) fn room_poke(&self, sku: &str) {
        if !self.has_rooms.load(Ordering::Acquire) {
            return;
        }
        if let Ok(handle) = self.room(sku) {
            self.tick_room(sku, &handle);
        }
    }

    /// Moves one room to now with its sale's stock. The LSN written, 0 if none.
    fn tick_room(&self, sku: &str, handle: &RoomHandle) -> Lsn {
        let now = self.clock.now_ms();
        let Some((_, stock)) = self.room_sale_stock(sku, handle, now) else {
            return 0;
        };
        let mut room = handle.lock();
        self.tick_locked(sku, &mut room, now, &stock)
    }

    /// Moves every room to now (the housekeeping tick). The last LSN written, 0 if none.
    pub(super) fn tick_rooms(&self) -> Lsn {
        if !self.has_rooms.load(Ordering::Acquire) {
            return 0;
        }
        let handles: Vec<(Arc<str>, RoomHandle)> = self
            .rooms
            .read()
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        let mut last = 0;
        for (sku, handle) in handles {
            last = last.max(self.tick_room(&sku, &handle));
        }
        last
    }

    /// Every room's state, sorted by sku (snapshots; the caller has stopped the world).
    pub(super) fn room_views(&self) -> Vec<RoomView> {
        let rooms = self.rooms.read();
        let mut out: Vec<RoomView> = rooms
            .iter()
            .map(|(sku, r)| {
                let room = r.lock();
                RoomView {
                    sku: sku.to_string(),
                    config: room.config().clone(),
                    state: room.export_state(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.sku.cmp(&b.sku));
        out
    }

    /// Puts back the rooms of a snapshot (recovery).
    pub(super) fn load_rooms(&self, views: &[RoomView]) {
        let mut rooms = self.rooms.write();
        for v in views {
            match Room::restore(
                &v.sku,
                v.config.clone(),
                self.ticket_keys.clone(),
                &self.room_secret,
                &v.state,
            ) {
                Ok(room) => {
                    rooms.insert(v.sku.as_str().into(), Arc::new(Mutex::new(room)));
                }
                Err(e) => debug_assert!(false, "room {} of a snapshot refused: {e}", v.sku),
            }
        }
        if !rooms.is_empty() {
            self.has_rooms.store(true, Ordering::Release);
        }
    }

    /// Replays a logged `RoomOpened`.
    pub(super) fn apply_room_opened(&self, sku: &str, config: &RoomConfig) {
        let mut rooms = self.rooms.write();
        if rooms.contains_key(sku) {
            return;
        }
        match self.new_room(sku, config.clone()) {
            Ok(room) => {
                rooms.insert(sku.into(), Arc::new(Mutex::new(room)));
                self.has_rooms.store(true, Ordering::Release);
            }
            Err(e) => debug_assert!(false, "logged room of {sku} refused: {e}"),
        }
    }

    /// Replays a logged `RoomChanged`: the op, as it was applied live (and counted as
    /// live: admissions, and expiries).
    pub(super) fn apply_room_op(&self, sku: &str, op: &crate::room::RoomOp) {
        use crate::room::RoomOp;
        let Ok(handle) = self.room(sku) else {
            debug_assert!(false, "room op for {sku}, which has no room");
            return;
        };
        let mut room = handle.lock();
        let before = room.admitted_not_reserved() as u64;
        room.apply(op);
        let after = room.admitted_not_reserved() as u64;
        match op {
            RoomOp::Admit { .. } => self.room_counts.add(sku, after.saturating_sub(before), 0),
            RoomOp::Expire { .. } => self.room_counts.add(sku, 0, before.saturating_sub(after)),
            _ => {}
        }
    }

    /// The figures of every room, sorted by sku (metrics, the status page): each room
    /// locked in turn, nothing moved.
    pub fn room_metrics(&self) -> Vec<RoomMetrics> {
        let handles: Vec<(Arc<str>, RoomHandle)> = self
            .rooms
            .read()
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        let now = self.clock.now_ms();
        let mut out: Vec<RoomMetrics> = handles
            .into_iter()
            .map(|(sku, handle)| {
                let room = handle.lock();
                let waiting = room.waiting();
                RoomMetrics {
                    counts: self.room_counts.get(&sku),
                    sku: sku.to_string(),
                    waiting,
                    admitted_not_reserved: room.admitted_not_reserved() as u64,
                    wait_estimate_ms: room.eta_ms(waiting.saturating_add(1), now),
                    open: room.is_open(),
                    sold_out: room.is_sold_out(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.sku.cmp(&b.sku));
        out
    }

    /// A sale handed over or dropped takes its room with it (rooms do not move).
    pub(super) fn drop_room(&self, sku: &str) {
        if self.rooms.write().remove(sku).is_some() {
            self.room_counts.remove(sku);
            for s in self.stripes.iter() {
                s.lock().forget_due(sku);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ManualClock, NullSink, ReserveOutcome, ReserveRequest};

    const T0: u64 = 1_700_000_000_000;

    fn engine() -> (Engine, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(T0));
        let keys = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap();
        let e = Engine::new(
            EngineConfig::default(),
            clock.clone(),
            Arc::new(NullSink),
            keys,
            ReservationKey::from_bytes(&[9u8; 32]),
        );
        (e, clock)
    }

    /// A hold of `qty` units by `user`, taken now; its token.
    fn hold(e: &Engine, user: &str, qty: u32) -> String {
        let adm = e.keyring().mint("S", user, e.now_ms() + 60_000);
        let req = ReserveRequest {
            sku: "S",
            user,
            admission: adm.as_bytes(),
            request_id: "r",
            qty,
        };
        match e.reserve(&req).unwrap().0 {
            ReserveOutcome::Reserved { token, .. } => token.as_str().to_string(),
            o => panic!("{o:?}"),
        }
    }

    fn admitted(e: &Engine) -> u64 {
        e.room_info("S").unwrap().admitted
    }

    /// Nothing available, holds of 3 units due at +60 s and of 1 unit at +90 s, a window
    /// of 10 s and 1.5 buyers per unit: nobody is admitted until the first hold is due
    /// within the window, then ceil(3 × 1.5) = 5 are, while the hold still stands; the
    /// later hold counts only once it is due within the window too.
    #[test]
    fn holds_due_within_the_window_admit_before_they_expire() {
        let (e, clock) = engine();
        e.create_sale("S", 4, Some(1), Some(60_000), None).unwrap();
        let first = hold(&e, "a", 3);
        clock.advance(30_000);
        hold(&e, "b", 1);
        let config = RoomConfig {
            max_rate_per_sec: 1000,
            over_admit_permille: 1500,
            admit_ttl_ms: 120_000,
            expiring_window_ms: 10_000,
            ..RoomConfig::default()
        };
        e.open_room("S", config).unwrap();
        for i in 0..8 {
            e.room_join("S", &format!("u{i}")).unwrap();
        }
        assert_eq!(admitted(&e), 0, "no hold due within the window");
        clock.set(T0 + 49_999);
        e.tick();
        assert_eq!(admitted(&e), 0, "due 1 ms after the window");
        clock.set(T0 + 50_000);
        e.tick();
        assert_eq!(admitted(&e), 5, "3 units due in the window, × 1.5");
        let m = &e.room_metrics()[0];
        assert_eq!((m.waiting, m.admitted_not_reserved), (3, 5));
        assert_eq!(
            m.counts,
            RoomCountsView {
                admitted: 5,
                expired: 0
            }
        );
        assert_eq!(e.stock("S").unwrap(), 0, "before the units come back");
        assert!(e
            .reservation(&first)
            .is_some_and(|(r, _)| r.expires_at_ms == T0 + 60_000));
        // The 1-unit hold (due at +90 s) counts once within the window; the 3-unit hold
        // past its deadline (not released: no auto-release) counts no more.
        clock.set(T0 + 60_000);
        e.tick();
        assert_eq!(e.expiring_units("S", e.now_ms(), 10_000), 0);
        clock.set(T0 + 80_000);
        e.tick();
        assert_eq!(e.expiring_units("S", e.now_ms(), 10_000), 1);
        assert_eq!(
            admitted(&e),
            5,
            "ceil(1 × 1.5) = 2, fewer than the 5 admitted"
        );
        assert_eq!(e.room_info("S").unwrap().waiting, 3);
    }

    /// An EXTEND past the window takes a hold out of the count; a room with no window
    /// counts nothing; a room's sale being counted costs the other sales nothing.
    #[test]
    fn extend_and_zero_window() {
        let (e, clock) = engine();
        e.create_sale("S", 2, Some(1), Some(20_000), None).unwrap();
        let t = hold(&e, "a", 2);
        e.extend(&t, 100_000).unwrap();
        let config = RoomConfig {
            max_rate_per_sec: 1000,
            expiring_window_ms: 30_000,
            ..RoomConfig::default()
        };
        e.open_room("S", config).unwrap();
        e.room_join("S", "u0").unwrap();
        e.room_join("S", "u1").unwrap();
        e.room_join("S", "u2").unwrap();
        clock.advance(25_000);
        e.tick();
        assert_eq!(admitted(&e), 0, "extended out of the window");
        clock.advance(50_000);
        e.tick();
        assert_eq!(admitted(&e), 2, "due in 25 s: both units count");
        assert_eq!(e.expiring_units("S", e.now_ms(), 30_000), 2);
        assert_eq!(e.expiring_units("S", e.now_ms(), 0), 0);
        e.release(&t);
        assert_eq!(e.expiring_units("S", e.now_ms(), 30_000), 0, "released");
    }
}
