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
        let req = RestoreRequest {
            sku,
            user,
            request_id,
            qty,
            expires_at,
            created_at,
            state,
        };
        check_restore_request(&req)?;
        let sale = self.sale(sku)?;
        let key = self.reservation_key.derive_key(sku, user, request_id);
        let token = token::token_text(sku, &key);
        let mut users = (sale.params.limit > 0).then(|| self.user_stripe(sku, user).lock());
        let mut stripe = self.stripes[stripe_of(&token)].lock();
        if sale.state() != SaleState::Fenced {
            return Err(EngineError::NotFenced);
        }
        if let Some(lsn) = already_restored(&stripe, sku, &key, &token) {
            return Ok((false, token, lsn));
        }
        let hold = insert_restored(&mut stripe, &sale, &req, key, self.clock.as_ref())?;
        let lsn = self.log_restored(&mut stripe, &req, &token, &hold);
        if let Some(us) = users.as_mut() {
            restore_user_entry(us, &sale, &req, key);
        }
        Ok((true, token, lsn))
    }

    /// Logs the restored hold as a live reservation would have been logged: RESERVED,
    /// then (for a paid or cancelled order) its finish, both under the caller's stripe
    /// lock. Returns the last record's LSN.
    fn log_restored(
        &self,
        stripe: &mut Stripe,
        req: &RestoreRequest<'_>,
        token: &str,
        hold: &RestoredHold,
    ) -> Lsn {
        let mut lsn = self.sink.record(&EventRef::Reserved {
            token,
            sku: req.sku,
            user: req.user,
            request_id: req.request_id,
            qty: req.qty,
            shard: hold.shard,
            expires_at_ms: hold.expires_at,
            created_at_ms: req.created_at,
        });
        stripe.logged(lsn);
        if req.state != ReservationState::Reserved {
            // The user entry is updated below from the final state, not through
            // `user_release` (which would take the user stripe this call holds).
            let how = match req.state {
                ReservationState::Committed => lifecycle::Finish::Commit,
                _ => lifecycle::Finish::Release(ReleaseReason::Rebuild),
            };
            let (l, _) = self.finish_locked(stripe, hold.idx, hold.now, how, true);
            lsn = l;
        }
        lsn
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

/// SALE.RESTORE's arguments, as the ledger gave them.
struct RestoreRequest<'a> {
    sku: &'a str,
    user: &'a str,
    request_id: &'a str,
    qty: u32,
    expires_at: Millis,
    created_at: Millis,
    state: ReservationState,
}

/// The arguments' shape, before any lock or key is touched.
fn check_restore_request(req: &RestoreRequest<'_>) -> Result<(), EngineError> {
    ident::check_sku(req.sku)?;
    ident::check_user(req.user)?;
    ident::check_request_id(req.request_id)?;
    if req.qty == 0 || req.qty > MAX_QTY {
        return Err(EngineError::Argument("qty must be between 1 and 1000000"));
    }
    Ok(())
}

/// The LSN to wait for when this reservation is already known: still in the table (the
/// stripe's last LSN), or finished and purged, only its tombstone left (0: nothing to
/// wait for). A repeated restore changes nothing.
fn already_restored(stripe: &Stripe, sku: &str, key: &TokenKey, token: &str) -> Option<Lsn> {
    if stripe.find(sku, key).is_some() {
        return Some(stripe.last_lsn());
    }
    if stripe.tombs.contains_key(&table::tomb_key(token)) {
        return Some(0);
    }
    None
}

/// Where [`insert_restored`] put the hold, and the clock reading it was made at.
struct RestoredHold {
    idx: u32,
    shard: u16,
    /// The ledger's deadline, capped at the longest TTL from now.
    expires_at: Millis,
    now: Millis,
}

/// Puts the hold into the table as RESERVED on the user's home shard, counts its units
/// as reserved there and schedules its expiry, its deadline capped at [`MAX_TTL_MS`]
/// (the longest TTL a sale can have) from now. The user is interned only once the
/// table is known to have room.
fn insert_restored(
    stripe: &mut Stripe,
    sale: &Arc<Sale>,
    req: &RestoreRequest<'_>,
    key: TokenKey,
    clock: &dyn Clock,
) -> Result<RestoredHold, EngineError> {
    if !stripe.has_room() {
        return Err(EngineError::Argument("reservation table full"));
    }
    let Some(user_id) = sale.users.intern(req.user) else {
        return Err(EngineError::Argument("too many users in this sale"));
    };
    let now = clock.now_ms();
    let expires_at = req.expires_at.min(now + MAX_TTL_MS);
    let shard = sale.home_shard(req.user) as u16;
    let Some(idx) = stripe.insert(Reservation {
        key,
        sale: sale.clone(),
        request_id: req.request_id.into(),
        user: user_id,
        qty: req.qty,
        shard,
        state: ReservationState::Reserved,
        expires_at,
        created_at: req.created_at,
        finished_at: 0,
        links: wheel::Links::NONE,
    }) else {
        return Err(EngineError::Argument("reservation table full"));
    };
    sale.add_reserved(shard as usize, req.qty);
    stripe.schedule(idx);
    Ok(RestoredHold {
        idx,
        shard,
        expires_at,
        now,
    })
}

/// In a limited sale, the user's entry from the order's final state: a pending order is
/// held and live, a paid one counts towards the limit, a cancelled one not at all.
fn restore_user_entry(
    users: &mut UserStripe,
    sale: &Sale,
    req: &RestoreRequest<'_>,
    key: TokenKey,
) {
    let e = users
        .entry(sale.sku.clone())
        .or_default()
        .entry(req.user.into())
        .or_default();
    match req.state {
        ReservationState::Reserved => {
            e.held += req.qty as u64;
            e.live.push(key);
        }
        ReservationState::Committed => e.held += req.qty as u64,
        ReservationState::Released => {}
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
