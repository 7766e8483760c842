//! Fencing and rebuild from the ledger: SALE.FENCE, SALE.RESTORE, SALE.REBUILD.

use super::*;

impl Engine {
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
            // A frozen sale's state is being handed over whole; fencing it would open it
            // here to a rebuild while the destination serves it.
            Some(s) if s.state().is_moving() => return Err(EngineError::Moving(sku.to_string())),
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
                sale.overwrite(sale.params.total, 0, &[], &zeros);
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
        let lsn = self.sink.record(&EventRef::SaleStateSet {
            sku,
            state: SaleState::Fenced,
        });
        sale.set_state(SaleState::Fenced);
        Ok(lsn)
    }

    /// SALE.RESTORE: put back a reservation the ledger verified, on a fenced sale, in the
    /// state the ledger holds it: `Reserved` (a pending order: it can still commit or
    /// expire), `Committed` (a paid order: a retry REPLAYs, and its units count towards
    /// the user's limit) or `Released` (a cancelled order: a retry REPLAYs instead of
    /// taking stock again). Counters are left to the rebuild that follows; the log gets
    /// the same records a live reservation would have made (RESERVED, then its finish),
    /// so replay needs no special case.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at: Millis,
        created_at: Millis,
        state: ReservationState,
    ) -> Result<(bool, Arc<str>, Lsn), EngineError> {
        ident::check_sku(sku)?;
        ident::check_user(user)?;
        ident::check_request_id(request_id)?;
        if qty == 0 || qty > MAX_QTY {
            return Err(EngineError::Argument("qty must be between 1 and 1000000"));
        }
        let sale = self.sale(sku)?;
        let key = self.reservation_key.derive_key(sku, user, request_id);
        let token = token::token_text(sku, &key);
        let mut users = (sale.params.limit > 0).then(|| self.user_stripe(sku, user).lock());
        let mut stripe = self.stripes[stripe_of(&token)].lock();
        if sale.state() != SaleState::Fenced {
            return Err(EngineError::NotFenced);
        }
        if stripe.find(sku, &key).is_some() {
            return Ok((false, token, stripe.last_lsn()));
        }
        if stripe.tombs.contains_key(&table::tomb_key(&token)) {
            return Ok((false, token, 0));
        }
        if !stripe.has_room() {
            return Err(EngineError::Argument("reservation table full"));
        }
        let Some(user_id) = sale.users.intern(user) else {
            return Err(EngineError::Argument("too many users in this sale"));
        };
        let now = self.clock.now_ms();
        let expires_at = expires_at.min(now + MAX_TTL_MS);
        let shard = sale.home_shard(user) as u16;
        let Some(idx) = stripe.insert(Reservation {
            key,
            sale: sale.clone(),
            request_id: request_id.into(),
            user: user_id,
            qty,
            shard,
            state: ReservationState::Reserved,
            expires_at,
            created_at,
            finished_at: 0,
            links: wheel::Links::NONE,
        }) else {
            return Err(EngineError::Argument("reservation table full"));
        };
        sale.add_reserved(shard as usize, qty);
        stripe.schedule(idx);
        let mut lsn = self.sink.record(&EventRef::Reserved {
            token: &token,
            sku,
            user,
            request_id,
            qty,
            shard,
            expires_at_ms: expires_at,
            created_at_ms: created_at,
        });
        stripe.logged(lsn);
        if state != ReservationState::Reserved {
            // The user entry is updated below from the final state, not through
            // `user_release` (which would take the user stripe this call holds).
            let how = match state {
                ReservationState::Committed => lifecycle::Finish::Commit,
                _ => lifecycle::Finish::Release(ReleaseReason::Rebuild),
            };
            let (l, _) = self.finish_locked(&mut stripe, idx, now, how, true);
            lsn = l;
        }
        if let Some(us) = users.as_mut() {
            let e = us
                .entry(sale.sku.clone())
                .or_default()
                .entry(user.into())
                .or_default();
            match state {
                ReservationState::Reserved => {
                    e.held += qty as u64;
                    e.live.push(key);
                }
                ReservationState::Committed => e.held += qty as u64,
                ReservationState::Released => {}
            }
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
        if fingerprint != self.reservation_key.fingerprint() {
            return Err(EngineError::FingerprintMismatch {
                server: self.reservation_key.fingerprint().to_string(),
                ledger: fingerprint.to_string(),
            });
        }
        if total > MAX_TOTAL {
            return Err(EngineError::Argument(
                "total must be between 0 and 1099511627776",
            ));
        }
        let world = self.stop_world();
        let sale = self.sale(sku)?;
        if sale.state() != SaleState::Fenced {
            return Err(EngineError::NotFenced);
        }
        let reserved = reserved_units(&world, &sale);
        let available = total as i128 - committed as i128 - reserved.iter().sum::<u64>() as i128;
        if available < 0 {
            return Err(EngineError::Argument(
                "ledger inconsistent: committed + pending exceed total",
            ));
        }
        let shard_available = split(available as u64, sale.shard_count() as u16);
        let _admin = sale.admin.lock();
        self.sink.record(&EventRef::SaleRebuilt {
            sku,
            total,
            committed,
            shard_available: &shard_available,
        });
        sale.overwrite(total, committed, &reserved, &shard_available);
        let lsn = self.sink.record(&EventRef::SaleStateSet {
            sku,
            state: SaleState::Open,
        });
        sale.set_state(SaleState::Open);
        Ok((available as i64, lsn))
    }
}

/// Units of the sale's RESERVED reservations, per shard, while the world is stopped.
pub(super) fn reserved_units(world: &WorldGuard<'_>, sale: &Arc<Sale>) -> Vec<u64> {
    let n = sale.shard_count();
    let mut per_shard = vec![0u64; n];
    let held = world
        ._stripes
        .iter()
        .flat_map(|stripe| stripe.iter())
        .filter(|r| Arc::ptr_eq(&r.sale, sale) && r.state == ReservationState::Reserved);
    for r in held {
        per_shard[r.shard as usize % n] += u64::from(r.qty);
    }
    per_shard
}
