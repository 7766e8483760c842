//! The buyer path: RESERVE, deciding in docs/protocol.md's order, bounded stealing, and
//! gathering units spread over several shards.

use super::wheel::Links;
use super::*;

impl Engine {
    /// RESERVE, deciding in the order docs/protocol.md lists. A new hold in a sale with a
    /// waiting room uses the buyer's admission there (after every lock of the hold is
    /// released: see `room`).
    pub fn reserve(&self, req: &ReserveRequest<'_>) -> Result<(ReserveOutcome, Lsn), EngineError> {
        let out = self.reserve_hold(req)?;
        if matches!(out.0, ReserveOutcome::Reserved { .. }) {
            self.room_after_reserve(req.sku, req.user);
        }
        Ok(out)
    }

    #[inline(always)]
    fn reserve_hold(&self, req: &ReserveRequest<'_>) -> Result<(ReserveOutcome, Lsn), EngineError> {
        check_request(req)?;
        let sale = self.sale(req.sku)?;
        if sale.state() == SaleState::Fenced {
            return Err(EngineError::Fenced);
        }
        let admission_expiry = self
            .keys
            .load()
            .verify(req.admission, req.sku, req.user)
            .map_err(EngineError::Denied)?;
        // On the stack: a replay or a refusal never allocates it.
        let key = self
            .reservation_key
            .derive_key(req.sku, req.user, req.request_id);
        // The reply takes this buffer itself: no copy of the token on the heap.
        let token = token::token_buf(req.sku, &key);
        // Checked for UTF-8 once, here (`as_str` checks on every call).
        let token_str = token.as_str();
        let limit = sale.params.limit;
        let mut users = (limit > 0).then(|| self.user_stripe(req.sku, req.user).lock());
        let mut stripe = self.stripes[stripe_of(token_str)].lock();
        // Read the clock under the lock: expiry deadlines then never trail the wheel.
        let now = self.clock.now_ms();
        if let Some((expires_at_ms, shard, lsn)) = earlier_answer(&stripe, req.sku, &key, token_str)
        {
            let replay = ReserveOutcome::Replay {
                token,
                expires_at_ms,
                shard,
            };
            return Ok((replay, lsn));
        }
        check_new_hold(now, admission_expiry, &sale, &stripe)?;
        let mut entry = None;
        if let Some(us) = users.as_mut() {
            match user_entry_within_limit(us, &sale, req, limit) {
                Ok(e) => entry = Some(e),
                Err(refusal) => return Ok((refusal, 0)),
            }
        }
        let Some(shard) = self.take_stock(&sale, req.user, req.qty) else {
            return Ok((ReserveOutcome::SoldOut, 0));
        };
        let (idx, expires_at) = insert_hold(&mut stripe, &sale, req, key, shard, now)?;
        stripe.schedule(idx);
        let lsn = self.sink.record(&EventRef::Reserved {
            token: token_str,
            sku: req.sku,
            user: req.user,
            request_id: req.request_id,
            qty: req.qty,
            shard,
            expires_at_ms: expires_at,
            created_at_ms: now,
        });
        stripe.logged(lsn);
        if let Some(e) = entry {
            e.held += req.qty as u64;
            e.live.push(key);
        }
        let reserved = ReserveOutcome::Reserved {
            token,
            expires_at_ms: expires_at,
            shard,
        };
        Ok((reserved, lsn))
    }

    /// Home shard first, then at most [`STEAL_PROBES`] other shards picked at random (a
    /// retry probes other shards), never a linear scan. When none of them has `qty`
    /// units but the sale as a whole does, the units are gathered ([`Engine::gather`]).
    /// The shard taken is logged, so replay does not depend on the choice.
    pub(super) fn take_stock(&self, sale: &Sale, user: &str, qty: u32) -> Option<u16> {
        let n = sale.shard_count();
        let home = sale.home_shard(user);
        if sale.try_reserve(home, qty) {
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
            if sale.try_reserve(cand, qty) {
                return Some(cand as u16);
            }
            h = h.rotate_left(21) ^ 0x9e37_79b9_7f4a_7c15;
        }
        // A sold-out sale answers here, after a sum of `n` loads and no lock: only a sale
        // that has the units pays for gathering them.
        if sale.available() < i64::from(qty) {
            return None;
        }
        self.gather(sale, qty)
    }

    /// The slow path of [`Engine::take_stock`]: the sale has `qty` units, spread so that
    /// no probed shard has them all. A reservation names one shard (its record, RELEASE
    /// and COMMIT go back to it), so the units are first moved into one shard, the
    /// fullest, by a zero-sum `SaleAdjusted` record, and held there. Replay applies the
    /// move, then the caller's `Reserved` record, and reaches the same counters. `None`
    /// when concurrent buyers took the units meanwhile (nothing logged, nothing moved).
    ///
    /// Lock order: the caller holds its reservation stripe (and in a limited sale its
    /// user stripe) and takes the sale's admin lock last, as `mod.rs` orders them.
    /// Nothing holds an admin lock while it waits for a stripe (ADJUST, PAUSE, RESUME,
    /// thaw and SALE.INFO take no stripe; FENCE, REBUILD, freeze, export and snapshots
    /// stop the world before they take it; import takes it after its stripes are
    /// released), so this cannot deadlock.
    fn gather(&self, sale: &Sale, qty: u32) -> Option<u16> {
        // Serialises the move with ADJUST, REBUILD and other gathers, so a SALE.INFO (read
        // under this lock) never sees units between shards.
        let _admin = sale.admin.lock();
        let want = i64::from(qty);
        // Read once: concurrent buyers change the counters, and a sort whose keys change
        // under it may panic.
        let seen: Vec<i64> = (0..sale.shard_count())
            .map(|i| sale.shard(i).available)
            .collect();
        let mut order: Vec<usize> = (0..seen.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(seen[i]));
        let target = order[0];
        // Taken, not moved: buyers on the fast path never take admin, so a shard may hold
        // less by the time it is reached; take_up_to never lets it go below zero.
        let mut deltas = vec![0i64; order.len()];
        let own = sale.take_up_to(target, want);
        let mut moved = 0;
        for &i in &order[1..] {
            if own + moved == want {
                break;
            }
            let got = sale.take_up_to(i, want - own - moved);
            deltas[i] = -got;
            moved += got;
        }
        if own + moved < want {
            // Not logged: the units go back where they were, as if never taken.
            sale.give_back(target, own);
            for (i, d) in deltas.iter().enumerate().filter(|(_, d)| **d < 0) {
                sale.give_back(i, -d);
            }
            return None;
        }
        deltas[target] = moved;
        debug_assert_eq!(deltas.iter().sum::<i64>(), 0, "a move changes no total");
        debug_assert_eq!(own + moved, want, "gathered exactly qty");
        if moved > 0 {
            // Logged before the caller's `Reserved` (both under its stripe lock): replay
            // makes the units available on `target` before the hold takes them.
            self.sink.record(&EventRef::SaleAdjusted {
                sku: &sale.sku,
                shard_deltas: &deltas,
            });
        }
        sale.hold_taken(target, qty);
        Some(target as u16)
    }
}

// The steps below are forced inline: RESERVE is the hot path, and a call per step (with
// the reservation record moved through it) costs more than the split is worth.

/// The arguments' shape, before any lock or key is touched.
#[inline(always)]
fn check_request(req: &ReserveRequest<'_>) -> Result<(), EngineError> {
    ident::check_sku(req.sku)?;
    ident::check_user(req.user)?;
    ident::check_request_id(req.request_id)?;
    if req.qty == 0 || req.qty > MAX_QTY {
        return Err(EngineError::Argument("qty must be between 1 and 1000000"));
    }
    Ok(())
}

/// The answer this request id already had, as `(expires_at_ms, shard, lsn)`: a live or
/// finished reservation in the table, or its tombstone once retention purged it (LSN 0:
/// nothing to wait for).
#[inline(always)]
fn earlier_answer(
    stripe: &Stripe,
    sku: &str,
    key: &TokenKey,
    token: &str,
) -> Option<(u64, u16, Lsn)> {
    if let Some(i) = stripe.find(sku, key) {
        let r = stripe.get(i);
        return Some((r.expires_at, r.shard, stripe.last_lsn()));
    }
    // The tomb key hashes the token's text twice: only when there are tombs.
    if stripe.tombs.is_empty() {
        return None;
    }
    // Finished and purged by retention: still the same request, never new stock.
    let t = stripe.tombs.get(&table::tomb_key(token))?;
    Some((t.expires_at, t.shard, 0))
}

/// What a new hold needs beyond a valid admission: the admission not expired, the sale
/// open, room in the table.
#[inline(always)]
fn check_new_hold(
    now: u64,
    admission_expiry: u64,
    sale: &Sale,
    stripe: &Stripe,
) -> Result<(), EngineError> {
    if now > admission_expiry {
        return Err(EngineError::Denied(Denied::Expired));
    }
    match sale.state() {
        SaleState::Open => {}
        SaleState::Paused => return Err(EngineError::Paused),
        SaleState::Fenced => return Err(EngineError::Fenced),
        SaleState::Moving { .. } => return Err(EngineError::Moving(sale.sku.to_string())),
    }
    if !stripe.has_room() {
        return Err(EngineError::Argument("reservation table full"));
    }
    Ok(())
}

/// The user's entry in a limited sale, or the LIMIT answer when `qty` more would pass it.
#[inline(always)]
fn user_entry_within_limit<'u>(
    users: &'u mut UserStripe,
    sale: &Sale,
    req: &ReserveRequest<'_>,
    limit: u32,
) -> Result<&'u mut UserEntry, ReserveOutcome> {
    let e = users
        .entry(sale.sku.clone())
        .or_default()
        .entry(req.user.into())
        .or_default();
    if e.held + req.qty as u64 > limit as u64 {
        return Err(ReserveOutcome::Limit {
            live: e
                .live
                .iter()
                .map(|k| token::token_text(req.sku, k))
                .collect(),
            limit,
            held: e.held,
        });
    }
    Ok(e)
}

/// Puts the hold into the table, stock already taken from `shard`; on a refusal the
/// units go back (nothing is logged yet, so that undoes the take entirely). Gives the
/// table index and the hold's deadline.
#[inline(always)]
fn insert_hold(
    stripe: &mut Stripe,
    sale: &Arc<Sale>,
    req: &ReserveRequest<'_>,
    key: TokenKey,
    shard: u16,
    now: u64,
) -> Result<(u32, u64), EngineError> {
    // Interned only now: a refused buyer leaves nothing behind.
    let Some(user) = sale.users.intern(req.user) else {
        sale.release(shard as usize, req.qty);
        return Err(EngineError::Argument("too many users in this sale"));
    };
    let expires_at = now + sale.params.ttl_ms;
    let Some(idx) = stripe.insert(Reservation {
        key,
        sale: sale.clone(),
        request_id: req.request_id.into(),
        user,
        qty: req.qty,
        shard,
        state: ReservationState::Reserved,
        expires_at,
        created_at: now,
        finished_at: 0,
        links: Links::NONE,
    }) else {
        // `has_room` was checked under this lock; kept safe all the same.
        sale.release(shard as usize, req.qty);
        return Err(EngineError::Argument("reservation table full"));
    };
    Ok((idx, expires_at))
}
