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
        let total: usize = world._stripes.iter().map(|st| st.map.len()).sum();
        let mut raw: Vec<(Arc<str>, Res)> = Vec::with_capacity(total);
        let mut tombs_raw: Vec<(u128, table::Tomb)> = Vec::new();
        for st in world._stripes.iter() {
            raw.extend(st.map.iter().map(|(t, r)| (t.clone(), r.clone())));
            tombs_raw.extend(st.tombs.iter().map(|(k, t)| (*k, t.clone())));
        }
        let r = cut();
        drop(guards);
        drop(sales_map);
        drop(world);
        let reservations = raw.iter().map(|(t, r)| r.view(t)).collect();
        let mut tombs: Vec<TombView> = tombs_raw.iter().map(|(k, t)| t.view(*k)).collect();
        tombs.sort_by_key(|t| t.key);
        (
            Snapshot {
                sales,
                reservations,
                tombs,
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
                // Reserved units are added back per shard by the reservations below.
                sale.overwrite(s.total, s.committed, &[], &s.shard_available);
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
        for t in &snap.tombs {
            self.insert_tomb(t);
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
    pub(super) fn insert_restored(&self, r: &ReservationView, take: bool) {
        let Ok(sale) = self.sale(&r.sku) else {
            debug_assert!(false, "reservation for unknown sale {}", r.sku);
            return;
        };
        let token: Arc<str> = r.token.as_str().into();
        let mut st = self.stripes[stripe_of(&token)].lock();
        let shard = r.shard as usize % sale.shard_count();
        if r.state == ResState::Reserved {
            // A logged RESERVE on a fenced sale (SALE.RESTORE) took no stock.
            if take && sale.state() != SaleState::Fenced {
                sale.reserve_unchecked(shard, r.qty);
            } else {
                sale.add_reserved(shard, r.qty);
            }
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

    /// Checks that up to `sample` recovered reservations carry the token this engine's
    /// reservation key derives: a state written under another key must not be served
    /// (every retry would get a new token and take stock again). Returns the first
    /// token that does not match.
    pub fn check_reservation_key(&self, sample: usize) -> Result<(), String> {
        let mut seen = 0;
        for s in self.stripes.iter() {
            let st = s.lock();
            for (token, r) in st.map.iter() {
                if seen >= sample {
                    return Ok(());
                }
                seen += 1;
                if self.rkey.derive(&r.sale.sku, &r.user, &r.request_id) != **token {
                    return Err(token.to_string());
                }
            }
        }
        Ok(())
    }

    /// Puts back a tombstone from a snapshot, with the limit accounting it carries.
    fn insert_tomb(&self, t: &TombView) {
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
                st.purge(token);
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
            // Another module's record (consumer groups): not engine state.
            Event::Opaque { .. } => {}
        }
    }
}
