//! Handing a sale over to another group's engine: freeze, export, import, drop, thaw.
//!
//! A move is: freeze on the source (every write refused), export, import on the
//! destination (logged there), then drop on the source. Tokens stay valid because they
//! are derived from the reservation key, the same on every group (the export carries its
//! fingerprint and the destination checks it). The sale's waiting room moves with it
//! ([`room_move`]): every buyer keeps their place and ticket. The encoding of an export is
//! the WAL's (`wal::handover`); the engine deals only in [`SaleExport`] values.

use std::hash::{Hash, Hasher};

use super::*;

// A file beside this one (not `handover/`), where the engine's other parts live.
#[path = "room_move.rs"]
mod room_move;
use room_move::{check_room, room_bound, split_room};

impl Engine {
    /// Freezes a sale for a move (`SaleState::Moving`, logged like a pause): every write
    /// on it is refused with [`EngineError::Moving`] until it is dropped or thawed. A
    /// fenced sale cannot move (its state is unproven); freezing a frozen sale does
    /// nothing.
    pub fn freeze(&self, sku: &str) -> Result<Lsn, EngineError> {
        // The stopped world orders every write decided before the freeze ahead of its
        // record, as for a fence.
        let _world = self.stop_world();
        let sale = self.sale(sku)?;
        let _admin = sale.admin.lock();
        let state = match sale.state() {
            SaleState::Open => SaleState::Moving { paused: false },
            SaleState::Paused => SaleState::Moving { paused: true },
            SaleState::Moving { .. } => return Ok(self.sink.last_lsn()),
            SaleState::Fenced => return Err(EngineError::Fenced),
        };
        let lsn = self.sink.record(&EventRef::SaleStateSet { sku, state });
        sale.set_state(state);
        Ok(lsn)
    }

    /// Gives up a move: the sale takes back the state it had before [`Engine::freeze`].
    /// A sale that is not frozen is left as it is.
    pub fn thaw(&self, sku: &str) -> Result<Lsn, EngineError> {
        let sale = self.sale(sku)?;
        let _admin = sale.admin.lock();
        let now = sale.state();
        if !now.is_moving() {
            return Ok(self.sink.last_lsn());
        }
        let state = now.before_move();
        let lsn = self.sink.record(&EventRef::SaleStateSet { sku, state });
        sale.set_state(state);
        Ok(lsn)
    }

    /// The whole state of a frozen sale, in the state it opens in on the destination.
    pub fn export_sale(&self, sku: &str) -> Result<SaleExport, EngineError> {
        let world = self.stop_world();
        let sale = self.sale(sku)?;
        if !sale.state().is_moving() {
            return Err(EngineError::NotMoving);
        }
        Ok(self.export_locked(&world, &sale))
    }

    fn export_locked(&self, world: &WorldGuard<'_>, sale: &Arc<Sale>) -> SaleExport {
        let mut view = sale.view();
        view.state = view.state.before_move();
        let mut reservations = Vec::new();
        let mut tombs = Vec::new();
        for stripe in world._stripes.iter() {
            reservations.extend(
                stripe
                    .iter()
                    .filter(|r| Arc::ptr_eq(&r.sale, sale))
                    .map(Reservation::view),
            );
            tombs.extend(
                stripe
                    .tombs
                    .iter()
                    .filter(|(_, t)| Arc::ptr_eq(&t.sale, sale))
                    .map(|(k, t)| t.view(*k)),
            );
        }
        // Sorted, so that exporting the same state twice gives the same value.
        reservations.sort_by(|a, b| a.token.cmp(&b.token));
        tombs.sort_by_key(|t| t.key);
        SaleExport {
            fingerprint: self.reservation_key.fingerprint().to_string(),
            sale: view,
            reservations,
            tombs,
            room: self.export_room(&sale.sku),
        }
    }

    /// Installs a sale exported by another group's engine and logs it: one
    /// `SaleImported` record when the export fits in one, else several, each well under
    /// the log's record limit (see [`split_export`]). The same export again is `Ok` and
    /// logs nothing; an export made with another reservation key, or of a sale this
    /// engine holds in another state, is refused. What an import that never finished
    /// left here (the sale frozen with part of its holds, after a crash between its
    /// records) is dropped and imported again.
    pub fn import_sale(&self, export: &SaleExport) -> Result<Lsn, EngineError> {
        check_export(export, &self.reservation_key)?;
        // One import at a time: a retried handover must not interleave its records with
        // those of the attempt it retries.
        let _serial = IMPORT_SERIAL.lock();
        let existing = self.sales.read().get(export.sale.sku.as_str()).cloned();
        if let Some(sale) = existing {
            if let Some(lsn) = self.settle_existing(&sale, export)? {
                return Ok(lsn);
            }
        }
        let mut lsn = self.sink.last_lsn();
        for batch in split_export(export) {
            let mut world = self.stop_world();
            lsn = self.sink.record(&EventRef::SaleImported { export: &batch });
            let limits = self.apply_batch_locked(&mut world, &batch);
            drop(world);
            self.add_limit_usage(limits);
        }
        self.imports
            .lock()
            .insert(export.sale.sku.as_str().into(), export_hash(export));
        Ok(lsn)
    }

    /// An import of a sale this engine already holds. `Some` when it is the same
    /// handover retried (nothing to do); `None` when it is what an unfinished import of
    /// this export left (dropped here, logged, to be imported again).
    fn settle_existing(
        &self,
        sale: &Arc<Sale>,
        export: &SaleExport,
    ) -> Result<Option<Lsn>, EngineError> {
        let world = self.stop_world();
        let same_import = self.imports.lock().get(&*sale.sku) == Some(&export_hash(export));
        let here = self.export_locked(&world, sale);
        if same_import || here == *export {
            return Ok(Some(self.sink.last_lsn()));
        }
        if sale.state().is_moving() && is_part_of(&here, export) {
            self.sink.record(&EventRef::SaleDropped { sku: &sale.sku });
            self.remove_locked(world, sale);
            return Ok(None);
        }
        Err(EngineError::Import(format!(
            "the sale {} exists here with another state",
            sale.sku
        )))
    }

    /// Applies one logged batch of an import with the world stopped, so that a
    /// snapshot sees all of it or none: the first registers the sale frozen, every batch
    /// adds its reservations and tombstones, the last (its state not `Moving`) opens the
    /// sale. Returns the per-user limit usage to add once the world runs again (a
    /// RESERVE takes a user stripe before a token stripe; the sale is frozen meanwhile,
    /// and a snapshot rebuilds usage from the reservations).
    fn apply_batch_locked(&self, world: &mut WorldGuard<'_>, batch: &SaleExport) -> Vec<Usage> {
        // Bound first: the read guard must be gone before `register_frozen` writes.
        let known = self.sales.read().get(batch.sale.sku.as_str()).cloned();
        let fresh = known.is_none();
        let sale = match known {
            Some(sale) => sale,
            None => self.register_frozen(batch),
        };
        if let Some(piece) = &batch.room {
            self.install_room_piece(piece, fresh);
        }
        let mut usage = Vec::new();
        let mut finished: Vec<&ReservationView> = Vec::new();
        for r in &batch.reservations {
            if let Some(u) = insert_locked(world, &sale, r) {
                usage.push(u);
            }
            if r.state != ReservationState::Reserved {
                finished.push(r);
            }
        }
        for t in &batch.tombs {
            usage.extend(tomb_locked(world, &sale, t));
        }
        // Each batch's finished holds are in order, and the batches follow each other in
        // that order (see `split_export`), so retention purges them oldest first.
        finished.sort_by_key(|r| r.finished_at_ms);
        for r in finished {
            if let Some((_, key)) = token::decode_token(&r.token) {
                world._stripes[stripe_of(&r.token)]
                    .finished
                    .push_back((r.finished_at_ms, key));
            }
        }
        if !batch.sale.state.is_moving() {
            let _admin = sale.admin.lock();
            sale.set_state(batch.sale.state);
        }
        usage
    }

    /// The per-user limit usage of imported holds ([`Engine::apply_batch_locked`]).
    fn add_limit_usage(&self, usage: Vec<Usage>) {
        for u in usage {
            let mut us = self.user_stripe(&u.sku, &u.user).lock();
            let e = us
                .entry(u.sku.clone())
                .or_default()
                .entry(u.user.as_str().into())
                .or_default();
            e.held += u64::from(u.qty);
            e.live.extend(u.live);
        }
    }

    /// Puts the export's sale in the registry, frozen: until its reservations are in
    /// place, a RESERVE must not take a request id the export holds for a new one.
    fn register_frozen(&self, export: &SaleExport) -> Arc<Sale> {
        let s = &export.sale;
        let sku: Arc<str> = s.sku.as_str().into();
        // A batch before the last is `Moving` already; the last, and a whole export,
        // carry the state the sale opens in.
        let frozen = if s.state.is_moving() {
            s.state
        } else {
            SaleState::Moving {
                paused: s.state == SaleState::Paused,
            }
        };
        let sale = Sale::new(sku.clone(), s.params.clone(), frozen);
        // Reserved units are added back per shard by the reservations.
        sale.overwrite(s.total, s.committed, &[], &s.shard_available);
        let sale = Arc::new(sale);
        self.sales.write().insert(sku, sale.clone());
        sale
    }

    /// Removes a frozen sale handed over to another group, with its reservations,
    /// tombstones and per-user usage, and logs it (`SaleDropped`).
    pub fn drop_sale(&self, sku: &str) -> Result<Lsn, EngineError> {
        let world = self.stop_world();
        let sale = self.sale(sku)?;
        if !sale.state().is_moving() {
            return Err(EngineError::NotMoving);
        }
        let lsn = self.sink.record(&EventRef::SaleDropped { sku });
        self.remove_locked(world, &sale);
        Ok(lsn)
    }

    fn remove_locked(&self, mut world: WorldGuard<'_>, sale: &Arc<Sale>) {
        for stripe in world._stripes.iter_mut() {
            stripe.remove_sale(sale);
        }
        self.sales.write().remove(&*sale.sku);
        drop(world);
        self.imports.lock().remove(&*sale.sku);
        self.drop_room(&sale.sku);
        for us in self.users.iter() {
            us.lock().remove(&*sale.sku);
        }
    }

    /// Replays a logged import, or one batch of one (see [`Engine::import_sale`]).
    pub(super) fn apply_import(&self, export: &SaleExport) {
        let mut world = self.stop_world();
        let usage = self.apply_batch_locked(&mut world, export);
        drop(world);
        self.add_limit_usage(usage);
        if !export.sale.state.is_moving() {
            self.imports
                .lock()
                .insert(export.sale.sku.as_str().into(), export_hash(export));
        }
    }

    /// Replays a logged drop.
    pub(super) fn apply_drop(&self, sku: &str) {
        let world = self.stop_world();
        if let Ok(sale) = self.sale(sku) {
            self.remove_locked(world, &sale);
        }
    }
}

/// What an import needs before it touches anything: the same reservation key, a sale
/// whose parameters this engine accepts, and reservations of that sale only, each once,
/// each token the one this engine's key derives for its buyer and request.
fn check_export(export: &SaleExport, key: &ReservationKey) -> Result<(), EngineError> {
    let fingerprint = key.fingerprint();
    if export.fingerprint != fingerprint {
        return Err(EngineError::Import(format!(
            "the export's reservation key fingerprint is {}, this server's is {fingerprint}: \
             its tokens would not be this server's",
            export.fingerprint
        )));
    }
    check_sale(&export.sale)?;
    let sku = export.sale.sku.as_str();
    let mut seen = std::collections::HashSet::new();
    for r in &export.reservations {
        let ours = r.sku == sku
            && token::decode_token(&r.token)
                .is_some_and(|(k, t)| k == sku && t == key.derive_key(sku, &r.user, &r.request_id));
        if !ours || r.qty == 0 || r.qty > MAX_QTY || !seen.insert(r.token.as_str()) {
            return Err(EngineError::Import(format!(
                "the export's reservation {} is not one of the sale {sku}",
                r.token
            )));
        }
    }
    if export.tombs.iter().any(|t| t.sku != sku) {
        return Err(EngineError::Import(
            "the export holds records of another sale".into(),
        ));
    }
    match &export.room {
        Some(room) => check_room(room, sku),
        None => Ok(()),
    }
}

/// The exported sale's parameters and counters, within what `SALE.CREATE` accepts.
fn check_sale(s: &SaleView) -> Result<(), EngineError> {
    ident::check_sku(&s.sku)?;
    let p = &s.params;
    let fits = matches!(s.state, SaleState::Open | SaleState::Paused)
        && (1..=MAX_SHARDS).contains(&p.shards)
        && (1..=MAX_TTL_MS).contains(&p.ttl_ms)
        && p.total <= MAX_TOTAL
        && s.total <= MAX_TOTAL
        && s.committed <= MAX_TOTAL
        && s.shard_available.len() == usize::from(p.shards)
        && s.shard_available
            .iter()
            .all(|a| a.unsigned_abs() <= MAX_TOTAL);
    if !fits {
        return Err(EngineError::Import(format!(
            "the export's sale {} is malformed",
            s.sku
        )));
    }
    Ok(())
}

/// Identifies an export within this process (imports retried by the same handover).
fn export_hash(export: &SaleExport) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    export.hash(&mut h);
    h.finish()
}

/// Serialises imports (see [`Engine::import_sale`]); imports are rare, so one lock for
/// the process costs nothing.
static IMPORT_SERIAL: Mutex<()> = Mutex::new(());

/// What one record of a split import carries at most, by [`encoded_bound`]: a quarter of
/// the log's record limit, so that a batch and its sale (at most 1,024 shard counters)
/// always fit, and a batch's stall of the world stays a few milliseconds.
pub const IMPORT_BATCH_BYTES: usize = crate::wal::record::MAX_PAYLOAD / 4;

/// Per-user limit usage of one imported hold or tombstone.
struct Usage {
    sku: Arc<str>,
    user: String,
    qty: u32,
    /// The token key of a live hold (the user's `live` list).
    live: Option<TokenKey>,
}

/// Inserts one imported reservation into its stripe, the world stopped (as
/// `insert_restored` does with the stripe's own lock).
fn insert_locked(
    world: &mut WorldGuard<'_>,
    sale: &Arc<Sale>,
    r: &ReservationView,
) -> Option<Usage> {
    // `check_export` proved every token decodes to this sale (or the log holds it).
    let (_, key) = token::decode_token(&r.token).filter(|(s, _)| *s == r.sku)?;
    let user = sale.users.intern(&r.user)?;
    let stripe = &mut world._stripes[stripe_of(&r.token)];
    let idx = stripe.insert(Reservation::from_record(
        key,
        sale.clone(),
        user,
        &r.record(),
    ));
    let Some(idx) = idx else {
        debug_assert!(false, "stripe full");
        return None;
    };
    if r.state == ReservationState::Reserved {
        sale.add_reserved(r.shard as usize % sale.shard_count(), r.qty);
        stripe.schedule(idx);
    }
    let counts = sale.params.limit > 0 && r.state != ReservationState::Released;
    counts.then(|| Usage {
        sku: sale.sku.clone(),
        user: r.user.clone(),
        qty: r.qty,
        live: (r.state == ReservationState::Reserved).then_some(key),
    })
}

/// Inserts one imported tombstone, the world stopped (as `insert_tomb` does).
fn tomb_locked(world: &mut WorldGuard<'_>, sale: &Arc<Sale>, t: &TombView) -> Option<Usage> {
    let user: Option<Arc<str>> = (!t.user.is_empty()).then(|| t.user.as_str().into());
    world._stripes[stripe_of_tomb(t.key)].tombs.insert(
        t.key,
        table::Tomb {
            sale: sale.clone(),
            state: t.state,
            qty: t.qty,
            shard: t.shard,
            expires_at: t.expires_at_ms,
            user: user.clone(),
        },
    );
    (sale.params.limit > 0).then_some(())?;
    user.map(|u| Usage {
        sku: sale.sku.clone(),
        user: u.to_string(),
        qty: t.qty,
        live: None,
    })
}

/// An upper bound of a reservation's encoded size (four strings with their length
/// prefixes, six varints, a state byte).
fn reservation_bound(r: &ReservationView) -> usize {
    r.token.len() + r.sku.len() + r.user.len() + r.request_id.len() + 4 * 10 + 6 * 10 + 1
}

/// An upper bound of a tombstone's encoded size.
fn tomb_bound(t: &TombView) -> usize {
    t.sku.len() + t.user.len() + 2 * 10 + 6 * 10 + 1
}

/// The records an import is logged as. An export whose holds and room fit in one batch
/// is one record, as it always was. A larger one is cut into batches of at most
/// [`IMPORT_BATCH_BYTES`] of holds or room, each carrying the sale: all but the last in
/// state `Moving` (the sale stays frozen, and a log that ends before the last leaves it
/// frozen, never open with part of its holds), the last in the state the sale opens in.
/// Live holds come first, then finished ones by when they finished, then tombstones,
/// so retention's queue stays in order across batches; then the room's pieces, in order
/// (see [`room_move`]).
pub(crate) fn split_export(export: &SaleExport) -> Vec<SaleExport> {
    let holds: usize = export
        .reservations
        .iter()
        .map(reservation_bound)
        .sum::<usize>()
        + export.tombs.iter().map(tomb_bound).sum::<usize>();
    let room_size = export.room.as_ref().map_or(0, room_bound);
    if holds + room_size <= IMPORT_BATCH_BYTES {
        return vec![export.clone()];
    }
    let mut reservations: Vec<&ReservationView> = export.reservations.iter().collect();
    reservations.sort_by_key(|r| (r.state != ReservationState::Reserved, r.finished_at_ms));
    let frozen = SaleState::Moving {
        paused: export.sale.state == SaleState::Paused,
    };
    let empty = |state| SaleExport {
        fingerprint: export.fingerprint.clone(),
        sale: SaleView {
            state,
            ..export.sale.clone()
        },
        reservations: Vec::new(),
        tombs: Vec::new(),
        room: None,
    };
    let mut out = vec![empty(frozen)];
    let mut size = 0;
    // `alone`: the entry needs a batch of its own kind (a room piece, one per batch).
    let mut fit = |n: usize, alone: bool, out: &mut Vec<SaleExport>| {
        if (alone || size + n > IMPORT_BATCH_BYTES) && size > 0 {
            out.push(empty(frozen));
            size = 0;
        }
        size += n;
    };
    for r in reservations {
        fit(reservation_bound(r), false, &mut out);
        if let Some(b) = out.last_mut() {
            b.reservations.push(r.clone());
        }
    }
    for t in &export.tombs {
        fit(tomb_bound(t), false, &mut out);
        if let Some(b) = out.last_mut() {
            b.tombs.push(t.clone());
        }
    }
    // One piece per batch: a piece is at most a batch's worth, and a batch a piece joins
    // must not hold one already.
    let pieces = export
        .room
        .as_ref()
        .map_or_else(Vec::new, |r| split_room(r, IMPORT_BATCH_BYTES));
    for piece in pieces {
        let alone = out.last().is_some_and(|b| b.room.is_some());
        fit(room_bound(&piece), alone, &mut out);
        if let Some(b) = out.last_mut() {
            b.room = Some(piece);
        }
    }
    if let Some(last) = out.last_mut() {
        last.sale.state = export.sale.state;
    }
    out
}

/// Whether `here` (a frozen sale's state) is what an unfinished import of `export`
/// left: the same sale, and only holds and tombstones the export has.
fn is_part_of(here: &SaleExport, export: &SaleExport) -> bool {
    let same_sale = SaleView {
        reserved: export.sale.reserved,
        available: export.sale.available,
        ..here.sale.clone()
    } == export.sale;
    let holds: std::collections::HashSet<&ReservationView> = export.reservations.iter().collect();
    let tombs: std::collections::HashSet<&TombView> = export.tombs.iter().collect();
    here.fingerprint == export.fingerprint
        && same_sale
        && here.reservations.iter().all(|r| holds.contains(r))
        && here.tombs.iter().all(|t| tombs.contains(t))
}

#[cfg(test)]
mod big_tests {
    //! Imports too large for one log record: logged in batches, replayed, and what an
    //! import cut between its records leaves.
    use super::super::tests::RecordingSink;
    use super::*;

    fn engine(clock: Arc<ManualClock>) -> (Engine, Arc<RecordingSink>) {
        let sink = Arc::new(RecordingSink::default());
        let keys = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).expect("keyring");
        let cfg = EngineConfig {
            retention_ms: 50_000,
            ..EngineConfig::default()
        };
        let key = ReservationKey::from_bytes(&[9u8; 32]);
        (Engine::new(cfg, clock, sink.clone(), keys, key), sink)
    }

    fn replayed(events: &[Event], clock: Arc<ManualClock>) -> Engine {
        let (e, _) = engine(clock);
        for ev in events {
            e.apply(ev);
        }
        e
    }

    /// A frozen sale of `n` holds (a limit of 3, every third committed, every fifth
    /// released) and its export.
    fn big_sale(n: usize) -> (Engine, Arc<ManualClock>, SaleExport) {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let (a, _) = engine(clock.clone());
        a.create_sale("BIG", 10_000_000, Some(8), Some(600_000), Some(3))
            .expect("create");
        for i in 0..n {
            let user = format!("user-{i}");
            let adm = a.keyring().mint("BIG", &user, a.now_ms() + 60_000);
            let (out, _) = a
                .reserve(&ReserveRequest {
                    sku: "BIG",
                    user: &user,
                    admission: adm.as_bytes(),
                    request_id: &format!("request-{i}"),
                    qty: 1,
                })
                .expect("reserve");
            let ReserveOutcome::Reserved { token, .. } = out else {
                panic!("{out:?}");
            };
            if i % 3 == 0 {
                a.commit(&token).expect("commit");
            } else if i % 5 == 0 {
                a.release(&token);
            }
        }
        a.freeze("BIG").expect("freeze");
        let export = a.export_sale("BIG").expect("export");
        (a, clock, export)
    }

    fn imports(events: &[Event]) -> Vec<&SaleExport> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::SaleImported { export } => Some(&**export),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn handover_big_import_is_logged_in_batches_that_replay() {
        let (a, clock, export) = big_sale(40_000);
        let whole = crate::wal::handover::encode_export(&export).len();
        assert!(whole > crate::wal::record::MAX_PAYLOAD, "{whole} bytes");
        let (b, sink) = engine(clock.clone());
        b.import_sale(&export).expect("import");
        let events = sink.events.lock().clone();
        let batches = imports(&events);
        assert!(batches.len() > 2, "{} records", batches.len());
        for (i, batch) in batches.iter().enumerate() {
            let ev = EventRef::SaleImported { export: batch };
            let mut rec = Vec::new();
            crate::wal::record::encode_record(ev, &mut rec).expect("fits a record");
            assert_eq!(batch.sale.state.is_moving(), i + 1 < batches.len());
        }
        let mut info = a.sale_info("BIG").expect("info");
        info.state = SaleState::Open;
        assert_eq!(b.sale_info("BIG").expect("info"), info);
        assert_eq!(b.export_sale_unfrozen(), export);
        // The same export again: nothing logged.
        b.import_sale(&export).expect("again");
        assert_eq!(sink.events.lock().len(), events.len());
        let r = replayed(&events, clock);
        assert_eq!(r.sale_info("BIG"), b.sale_info("BIG"));
        // The limit (3) counts on the replayed engine: user-1 holds one unit.
        let adm = r.keyring().mint("BIG", "user-1", r.now_ms() + 60_000);
        let again = r.reserve(&ReserveRequest {
            sku: "BIG",
            user: "user-1",
            admission: adm.as_bytes(),
            request_id: "request-1",
            qty: 1,
        });
        assert!(matches!(again, Ok((ReserveOutcome::Replay { .. }, _))));
    }

    #[test]
    fn handover_an_import_cut_between_its_records_stays_frozen_and_is_redone() {
        let (_, clock, export) = big_sale(30_000);
        let (b, sink) = engine(clock.clone());
        b.import_sale(&export).expect("import");
        let events = sink.events.lock().clone();
        // The log ends after the first batch: the sale is frozen, never open.
        let first = events
            .iter()
            .position(|e| matches!(e, Event::SaleImported { .. }))
            .expect("a batch");
        let head = &events[..=first];
        let cut = replayed(head, clock.clone());
        let info = cut.sale_info("BIG").expect("info");
        assert!(info.state.is_moving(), "{:?}", info.state);
        // Imported again there: dropped and imported whole.
        let (c, c_sink) = engine(clock);
        for ev in head {
            c.apply(ev);
        }
        c.import_sale(&export).expect("redo");
        assert_eq!(c.sale_info("BIG"), b.sale_info("BIG"));
        let logged = c_sink.events.lock().clone();
        assert!(
            logged
                .iter()
                .any(|e| matches!(e, Event::SaleDropped { .. })),
            "the unfinished import is dropped first"
        );
    }

    impl Engine {
        /// The imported sale's export, as its source would give it once frozen.
        fn export_sale_unfrozen(&self) -> SaleExport {
            let world = self.stop_world();
            let sale = self.sale("BIG").expect("sale");
            self.export_locked(&world, &sale)
        }
    }
}

#[cfg(test)]
mod room_tests {
    //! A sale's waiting room carried by a move: places, tickets and admissions kept, the
    //! import's records replaying to the same room, a room too large for one record cut
    //! into pieces, and a malformed room refused.
    use super::super::tests::RecordingSink;
    use super::*;
    use crate::room::{RoomConfig, Status};

    fn engine(clock: Arc<ManualClock>) -> (Engine, Arc<RecordingSink>) {
        let sink = Arc::new(RecordingSink::default());
        let keys = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).expect("keyring");
        let key = ReservationKey::from_bytes(&[7u8; 32]);
        let e = Engine::new(EngineConfig::default(), clock, sink.clone(), keys, key);
        (e, sink)
    }

    /// A sale of `stock` units with a room of `n` buyers (the first `stock` admitted, one
    /// of them reserved), frozen; its export and every buyer's ticket.
    fn sale_with_room(
        n: usize,
        stock: u64,
    ) -> (Engine, Arc<ManualClock>, SaleExport, Vec<(String, String)>) {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let (a, _) = engine(clock.clone());
        a.create_sale("S", stock, Some(1), None, None)
            .expect("create");
        let config = RoomConfig {
            max_rate_per_sec: 1_000_000,
            max_waiting: 1_000_000,
            ..RoomConfig::default()
        };
        a.open_room("S", config).expect("room");
        let mut tickets = Vec::new();
        for i in 0..n {
            let u = format!("u{i}");
            let (t, _, _) = a.room_join("S", &u).expect("join");
            tickets.push((u, t.text));
        }
        let adm = a.keyring().mint("S", "u0", a.now_ms() + 60_000);
        let req = ReserveRequest {
            sku: "S",
            user: "u0",
            admission: adm.as_bytes(),
            request_id: "r0",
            qty: 1,
        };
        a.reserve(&req).expect("reserve");
        a.freeze("S").expect("freeze");
        let export = a.export_sale("S").expect("export");
        (a, clock, export, tickets)
    }

    fn statuses(e: &Engine, tickets: &[(String, String)]) -> Vec<Result<Status, EngineError>> {
        tickets
            .iter()
            .map(|(u, t)| e.room_peek("S", u, t))
            .collect()
    }

    #[test]
    fn handover_room_moves_with_its_places_and_tickets() {
        let (a, clock, export, tickets) = sale_with_room(12, 4);
        assert!(export.room.is_some());
        let bytes = crate::wal::handover::encode_export(&export);
        assert_eq!(
            crate::wal::handover::decode_export(&bytes).as_ref(),
            Ok(&export)
        );
        let before = statuses(&a, &tickets);
        assert_eq!(before[0], Ok(Status::Reserved));
        assert!(matches!(before[1], Ok(Status::Admitted { .. })));
        assert!(matches!(
            before[11],
            Ok(Status::Waiting { position: 8, .. })
        ));
        let (b, sink) = engine(clock.clone());
        crate::wal::handover::import_sale(&b, &bytes).expect("import");
        assert_eq!(statuses(&b, &tickets), before);
        assert_eq!(b.room_info("S"), a.room_info("S"));
        a.drop_sale("S").expect("drop");
        assert_eq!(a.room_info("S"), Err(EngineError::NoRoom));
        // The same export again logs nothing; the import's records replay to the room.
        let logged = sink.events.lock().len();
        b.import_sale(&export).expect("again");
        assert_eq!(sink.events.lock().len(), logged);
        let (r, _) = engine(clock);
        for ev in sink.events.lock().iter() {
            r.apply(ev);
        }
        assert_eq!(statuses(&r, &tickets), before);
        // An admitted buyer's admission reserves at the destination, and is used there.
        let adm = b.keyring().mint("S", "u1", b.now_ms() + 60_000);
        let req = ReserveRequest {
            sku: "S",
            user: "u1",
            admission: adm.as_bytes(),
            request_id: "r1",
            qty: 1,
        };
        let (out, _) = b.reserve(&req).expect("reserve");
        assert!(matches!(out, ReserveOutcome::Reserved { .. }), "{out:?}");
        assert_eq!(b.room_peek("S", "u1", &tickets[1].1), Ok(Status::Reserved));
    }

    #[test]
    fn handover_room_too_large_for_a_record_is_logged_in_pieces() {
        let (a, clock, export, tickets) = sale_with_room(30_000, 50);
        let room = export.room.as_ref().expect("room");
        assert!(room_bound(room) > IMPORT_BATCH_BYTES);
        let (b, sink) = engine(clock.clone());
        b.import_sale(&export).expect("import");
        let events = sink.events.lock().clone();
        let pieces = events
            .iter()
            .filter(|e| matches!(e, Event::SaleImported { export } if export.room.is_some()))
            .count();
        assert!(pieces > 2, "{pieces} pieces");
        for ev in &events {
            let mut rec = Vec::new();
            crate::wal::record::encode_record(ev, &mut rec).expect("fits a record");
        }
        assert_eq!(b.export_room("S"), a.export_room("S"));
        let (r, _) = engine(clock);
        for ev in &events {
            r.apply(ev);
        }
        assert_eq!(r.export_room("S"), a.export_room("S"));
        let sample: Vec<_> = tickets.iter().step_by(997).cloned().collect();
        assert_eq!(statuses(&r, &sample), statuses(&a, &sample));
    }

    #[test]
    fn handover_malformed_room_is_refused() {
        let (_, clock, export, _) = sale_with_room(12, 4);
        let (b, _) = engine(clock);
        let mut bad = export.clone();
        let Some(room) = bad.room.as_mut() else {
            panic!("no room");
        };
        room.state.line.swap(0, 3);
        assert!(matches!(b.import_sale(&bad), Err(EngineError::Import(_))));
        let mut bad = export.clone();
        if let Some(room) = bad.room.as_mut() {
            room.state.base = u32::MAX - 1;
        }
        assert!(matches!(b.import_sale(&bad), Err(EngineError::Import(_))));
        let mut bad = export.clone();
        if let Some(room) = bad.room.as_mut() {
            room.state.admitted.clear();
        }
        assert!(matches!(b.import_sale(&bad), Err(EngineError::Import(_))));
        let mut old = export.clone();
        old.room = None;
        assert!(b.import_sale(&old).is_ok(), "an export without a room");
        assert_eq!(b.room_info("S"), Err(EngineError::NoRoom));
    }
}
