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
//! The room's stock view is the sale's counters: `available`, `held` (its reserved
//! units), and `expiring_soon` always 0 (the holds due soon are spread over the stripes'
//! timer wheels, not counted per sale; a unit coming back admits the next buyer when it
//! is released instead of just before).
//!
//! The keys: the user hashes, the pre-queue's seed and the tickets are derived from the
//! reservation key, which every member of a group shares (its fingerprint is checked), so
//! the same ops give the same room everywhere and a ticket verifies on any member.
//!
//! Locks: a room's mutex is taken with no stripe, admin or registry lock held (the hooks
//! run after RESERVE/RELEASE dropped theirs) and takes none but the registry's read lock
//! to find its sale; snapshots take the rooms after the stripes and sales.

use std::sync::atomic::Ordering;

use crate::room::{Room, RoomConfig, Status, StockView, Ticket, TicketKeys};

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

/// What the sale can serve now, from its counters.
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

    /// Moves a locked room to now with its sale's stock, logging what changed. A sale
    /// frozen for a move (or gone) is left alone: its room does not move with it.
    fn tick_locked(&self, sku: &str, room: &mut Room, now: Millis) -> Lsn {
        let Ok(sale) = self.sale(sku) else {
            return 0;
        };
        if sale.state().is_moving() {
            return 0;
        }
        room.tick(now, &stock_view(&sale));
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
        let mut room = handle.lock();
        let now = self.clock.now_ms();
        let mut lsn = self.tick_locked(sku, &mut room, now);
        let joined = room.join(user, now);
        // Logged even when the join is refused: a join may open the sale first.
        lsn = lsn.max(self.log_room_ops(sku, &mut room));
        let ticket = joined.map_err(EngineError::Room)?;
        lsn = lsn.max(self.tick_locked(sku, &mut room, now));
        let status = room
            .status(user, now, &stock_view(&sale))
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
        let mut room = handle.lock();
        let now = self.clock.now_ms();
        let lsn = self.tick_locked(sku, &mut room, now);
        let status = room
            .status_ticket(ticket, user, now, &stock_view(&sale))
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

    /// `ROOM.LEAVE`: `user` gives the place up (an unused admission's budget goes to the
    /// next buyer). `true` if it held one; a repeat changes nothing.
    pub fn room_leave(&self, sku: &str, user: &str) -> Result<(bool, Lsn), EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        let sale = self.sale(sku)?;
        sale.check_not_moving()?;
        let handle = self.room(sku)?;
        let mut room = handle.lock();
        let now = self.clock.now_ms();
        let left = room.leave(user);
        let mut lsn = self.log_room_ops(sku, &mut room);
        lsn = lsn.max(self.tick_locked(sku, &mut room, now));
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
        let mut room = handle.lock();
        room.reserved(user);
        self.log_room_ops(sku, &mut room);
        self.tick_locked(sku, &mut room, self.clock.now_ms());
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
            let mut room = handle.lock();
            self.tick_locked(sku, &mut room, self.clock.now_ms());
        }
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
            let mut room = handle.lock();
            last = last.max(self.tick_locked(&sku, &mut room, self.clock.now_ms()));
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

    /// Replays a logged `RoomChanged`: the op, as it was applied live.
    pub(super) fn apply_room_op(&self, sku: &str, op: &crate::room::RoomOp) {
        match self.room(sku) {
            Ok(handle) => handle.lock().apply(op),
            Err(_) => debug_assert!(false, "room op for {sku}, which has no room"),
        }
    }

    /// A sale handed over or dropped takes its room with it (rooms do not move).
    pub(super) fn drop_room(&self, sku: &str) {
        self.rooms.write().remove(sku);
    }
}
