//! Snapshots and replay: the engine's state dumped and rebuilt from the log.

use super::rebuild::reserved_units;
use super::*;

impl Engine {
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
        let total: usize = world._stripes.iter().map(|stripe| stripe.len()).sum();
        let mut raw: Vec<Reservation> = Vec::with_capacity(total);
        let mut tombs_raw: Vec<(u128, table::Tomb)> = Vec::new();
        for stripe in world._stripes.iter() {
            raw.extend(stripe.iter().cloned());
            tombs_raw.extend(stripe.tombs.iter().map(|(k, t)| (*k, t.clone())));
        }
        let rooms = self.room_views();
        let history = self
            .history()
            .map(|(h, _)| h.to_string())
            .unwrap_or_default();
        let r = cut();
        drop(guards);
        drop(sales_map);
        drop(world);
        // User ids stay valid after the locks are gone: a sale never frees a name.
        let reservations = raw.iter().map(Reservation::view).collect();
        let mut tombs: Vec<TombView> = tombs_raw.iter().map(|(k, t)| t.view(*k)).collect();
        tombs.sort_by_key(|t| t.key);
        (
            Snapshot {
                history,
                sales,
                reservations,
                tombs,
                rooms,
            },
            r,
        )
    }

    /// Loads a snapshot into an empty engine (recovery).
    pub fn load_snapshot(&self, snap: &Snapshot) {
        self.adopt_history(&snap.history);
        {
            let mut sales = self.sales.write();
            for s in &snap.sales {
                let sku: Arc<str> = s.sku.as_str().into();
                let sale = Sale::new(sku.clone(), s.params.clone(), s.state);
                // Reserved units are added back per shard by the reservations below.
                sale.overwrite(s.total, s.committed, &[], &s.shard_available);
                sales.insert(sku, Arc::new(sale));
            }
        }
        // Tokens spread evenly over the stripes: size each for its share (plus a margin
        // for the unevenness) instead of growing it a dozen times.
        let share = snap.reservations.len() / STRIPES;
        for s in self.stripes.iter() {
            s.lock().reserve(share + share / 16);
        }
        let mut finished: Vec<&ReservationView> = Vec::new();
        for r in &snap.reservations {
            self.insert_restored(r, false);
            if r.state != ReservationState::Reserved {
                finished.push(r);
            }
        }
        for t in &snap.tombs {
            self.insert_tomb(t);
        }
        self.load_rooms(&snap.rooms);
        finished.sort_by_key(|r| r.finished_at_ms);
        for r in finished {
            let Some((_, key)) = token::decode_token(&r.token) else {
                continue;
            };
            self.stripes[stripe_of(&r.token)]
                .lock()
                .finished
                .push_back((r.finished_at_ms, key));
        }
    }

    /// Inserts a reservation as recorded (snapshot or replay). With `take`, the units are
    /// taken from the shard as a live RESERVE did.
    pub(super) fn insert_restored(&self, r: &ReservationView, take: bool) {
        // Tokens come from this engine's own log or snapshot, written by `token_buf`; a
        // token that does not decode, or does not belong to its sale, is not ours.
        let Some((_, key)) = token::decode_token(&r.token).filter(|(s, _)| *s == r.sku) else {
            debug_assert!(false, "undecodable token {}", r.token);
            return;
        };
        self.insert_record(key, &r.record(), take);
    }

    /// [`Engine::insert_restored`] of a record whose token's key is decoded.
    fn insert_record(&self, key: token::TokenKey, r: &HoldRecord<'_>, take: bool) {
        let Ok(sale) = self.sale(r.sku) else {
            debug_assert!(false, "reservation for unknown sale {}", r.sku);
            return;
        };
        let Some(user) = sale.users.intern(r.user) else {
            debug_assert!(false, "user table full");
            return;
        };
        let mut stripe = self.stripes[stripe_of(r.token)].lock();
        let Some(idx) = stripe.insert(Reservation::from_record(key, sale.clone(), user, r)) else {
            debug_assert!(false, "stripe full");
            return;
        };
        let shard = r.shard as usize % sale.shard_count();
        if r.state == ReservationState::Reserved {
            // A logged RESERVE on a fenced sale (SALE.RESTORE) took no stock.
            if take && sale.state() != SaleState::Fenced {
                sale.reserve_unchecked(shard, r.qty);
            } else {
                sale.add_reserved(shard, r.qty);
            }
            stripe.schedule(idx);
        }
        drop(stripe);
        if sale.params.limit > 0 && r.state != ReservationState::Released {
            let mut us = self.user_stripe(r.sku, r.user).lock();
            let e = us
                .entry(sale.sku.clone())
                .or_default()
                .entry(r.user.into())
                .or_default();
            e.held += r.qty as u64;
            if r.state == ReservationState::Reserved {
                e.live.push(key);
            }
        }
    }

    /// Replays a `Reserved` record, its token decoded once and its strings borrowed: a
    /// follower does this for every hold the leader makes.
    fn apply_reserved(&self, ev: &Event) {
        if let Some(r) = ev.reserved_record() {
            self.apply_hold(&r);
        }
    }

    /// Applies a `reserved` record read as a hold (`wal::record::decode_reserved`), as
    /// [`Engine::apply`] applies the event: a follower's RESERVE without the event's
    /// owned strings.
    pub fn apply_hold(&self, r: &HoldRecord<'_>) {
        let Some((_, key)) = token::decode_token(r.token).filter(|(s, _)| *s == r.sku) else {
            debug_assert!(false, "undecodable token {}", r.token);
            return;
        };
        let exists = self.stripes[stripe_of(r.token)]
            .lock()
            .find(r.sku, &key)
            .is_some();
        debug_assert!(!exists, "reserved twice in the log");
        if !exists {
            self.insert_record(key, r, true);
        }
    }

    /// Checks that up to `sample` recovered reservations carry the token this engine's
    /// reservation key derives: a state written under another key must not be served
    /// (every retry would get a new token and take stock again). Returns the first
    /// token that does not match.
    pub fn check_reservation_key(&self, sample: usize) -> Result<(), String> {
        let mut seen = 0;
        for s in self.stripes.iter() {
            let stripe = s.lock();
            for r in stripe.iter() {
                if seen >= sample {
                    return Ok(());
                }
                seen += 1;
                let user = r.sale.users.name(r.user);
                if self
                    .reservation_key
                    .derive_key(&r.sale.sku, &user, &r.request_id)
                    != r.key
                {
                    return Err(r.token().as_str().to_string());
                }
            }
        }
        Ok(())
    }

    /// Puts back a tombstone from a snapshot, with the limit accounting it carries.
    pub(super) fn insert_tomb(&self, t: &TombView) {
        let Ok(sale) = self.sale(&t.sku) else {
            debug_assert!(false, "tombstone for unknown sale {}", t.sku);
            return;
        };
        let user: Option<Arc<str>> = (!t.user.is_empty()).then(|| t.user.as_str().into());
        if let (Some(u), true) = (&user, sale.params.limit > 0) {
            let mut us = self.user_stripe(&t.sku, u).lock();
            us.entry(sale.sku.clone())
                .or_default()
                .entry((**u).into())
                .or_default()
                .held += u64::from(t.qty);
        }
        // The stripe a token lives in is a function of its hash, which the key keeps.
        self.stripes[stripe_of_tomb(t.key)].lock().tombs.insert(
            t.key,
            table::Tomb {
                sale,
                state: t.state,
                qty: t.qty,
                shard: t.shard,
                expires_at: t.expires_at_ms,
                user,
            },
        );
    }

    /// Replays one logged event (recovery). Events are trusted to come from this engine's
    /// own log; one that does not fit the state is skipped (and trips a debug assertion).
    pub fn apply(&self, ev: &Event) {
        match ev {
            Event::HistoryBegun { id } => self.adopt_history(id),
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
            Event::Reserved { .. } => self.apply_reserved(ev),
            Event::Released { token, at_ms, .. } => {
                let mut stripe = self.stripes[stripe_of(token)].lock();
                let (_, _, upd) = self.release_locked(&mut stripe, token, *at_ms, None);
                drop(stripe);
                if let Some((sale, user, qty, key)) = upd {
                    self.user_release(&sale, user, qty, &key, true);
                }
            }
            Event::Committed { token, at_ms, .. } => {
                let mut stripe = self.stripes[stripe_of(token)].lock();
                let (_, upd) = self.commit_locked(&mut stripe, token, *at_ms, None);
                drop(stripe);
                if let Some((sale, user, qty, key)) = upd {
                    self.user_release(&sale, user, qty, &key, false);
                }
            }
            Event::Extended {
                token,
                expires_at_ms,
                ..
            } => {
                let mut stripe = self.stripes[stripe_of(token)].lock();
                if let Some(idx) = stripe.lookup(token) {
                    if stripe.get(idx).state == ReservationState::Reserved {
                        stripe.reschedule(idx, *expires_at_ms);
                    } else {
                        debug_assert!(false, "EXTEND of a finished reservation in the log");
                    }
                }
            }
            Event::Purged { token } => {
                let mut stripe = self.stripes[stripe_of(token)].lock();
                stripe.purge(token);
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
                    sale.overwrite(*total, *committed, &reserved, shard_available);
                }
            }
            Event::SaleImported { export } => self.apply_import(export),
            Event::SaleDropped { sku } => self.apply_drop(sku),
            Event::RoomOpened { sku, config, .. } => self.apply_room_opened(sku, config),
            Event::RoomChanged { sku, op } => self.apply_room_op(sku, op),
            // Another module's record (consumer groups): not engine state.
            Event::Opaque { .. } => {}
        }
    }
}
