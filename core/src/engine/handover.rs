//! Handing a sale over to another group's engine: freeze, export, import, drop, thaw.
//!
//! A move is: freeze on the source (every write refused), export, import on the
//! destination (logged there), then drop on the source. Tokens stay valid because they
//! are derived from the reservation key, the same on every group (the export carries its
//! fingerprint and the destination checks it). The encoding of an export is the WAL's
//! (`wal::handover`); the engine deals only in [`SaleExport`] values.

use std::hash::{Hash, Hasher};

use super::*;

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
        }
    }

    /// Installs a sale exported by another group's engine and logs it (`SaleImported`).
    /// The same export again is `Ok` and logs nothing; an export made with another
    /// reservation key, or of a sale this engine holds in another state, is refused.
    pub fn import_sale(&self, export: &SaleExport) -> Result<Lsn, EngineError> {
        check_export(export, &self.reservation_key)?;
        let world = self.stop_world();
        let existing = self.sales.read().get(export.sale.sku.as_str()).cloned();
        if let Some(sale) = existing {
            return self.import_again(&world, &sale, export);
        }
        let lsn = self.sink.record(&EventRef::SaleImported { export });
        let sale = self.register_frozen(export);
        drop(world);
        self.fill(&sale, export);
        Ok(lsn)
    }

    /// An import of a sale this engine already holds: the same handover retried.
    fn import_again(
        &self,
        world: &WorldGuard<'_>,
        sale: &Arc<Sale>,
        export: &SaleExport,
    ) -> Result<Lsn, EngineError> {
        let same_import = self.imports.lock().get(&*sale.sku) == Some(&export_hash(export));
        if same_import || self.export_locked(world, sale) == *export {
            return Ok(self.sink.last_lsn());
        }
        Err(EngineError::Import(format!(
            "the sale {} exists here with another state",
            sale.sku
        )))
    }

    /// Puts the export's sale in the registry, frozen: until its reservations are in
    /// place, a RESERVE must not take a request id the export holds for a new one.
    fn register_frozen(&self, export: &SaleExport) -> Arc<Sale> {
        let s = &export.sale;
        let sku: Arc<str> = s.sku.as_str().into();
        let frozen = SaleState::Moving {
            paused: s.state == SaleState::Paused,
        };
        let sale = Sale::new(sku.clone(), s.params.clone(), frozen);
        // Reserved units are added back per shard by the reservations.
        sale.overwrite(s.total, s.committed, &[], &s.shard_available);
        let sale = Arc::new(sale);
        self.sales.write().insert(sku, sale.clone());
        sale
    }

    /// The export's reservations and tombstones, then the sale opens (import and replay).
    fn fill(&self, sale: &Arc<Sale>, export: &SaleExport) {
        let mut finished: Vec<&ReservationView> = Vec::new();
        for r in &export.reservations {
            self.insert_restored(r, false);
            if r.state != ReservationState::Reserved {
                finished.push(r);
            }
        }
        for t in &export.tombs {
            self.insert_tomb(t);
        }
        finished.sort_by_key(|r| r.finished_at_ms);
        for r in finished {
            if let Some((_, key)) = token::decode_token(&r.token) {
                let mut stripe = self.stripes[stripe_of(&r.token)].lock();
                stripe.finished.push_back((r.finished_at_ms, key));
            }
        }
        self.imports
            .lock()
            .insert(sale.sku.clone(), export_hash(export));
        let _admin = sale.admin.lock();
        sale.set_state(export.sale.state);
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
        for us in self.users.iter() {
            us.lock().remove(&*sale.sku);
        }
    }

    /// Replays a logged import.
    pub(super) fn apply_import(&self, export: &SaleExport) {
        if self.sales.read().contains_key(export.sale.sku.as_str()) {
            debug_assert!(false, "imported twice in the log");
            return;
        }
        let sale = self.register_frozen(export);
        self.fill(&sale, export);
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
    Ok(())
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
