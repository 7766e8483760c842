//! A reservation after RESERVE: release, commit, extend, queries, expiry and retention.

use super::*;

/// How a hold leaves RESERVED.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Finish {
    Commit,
    Release(ReleaseReason),
}

impl Engine {
    /// RELEASE: `(true, lsn)` if this call returned the units. The feed names the reason
    /// from the hold's deadline: past it, `expired`; before it, `cancel`.
    pub fn release(&self, token: &str) -> (bool, Lsn) {
        self.release_with(token, None)
    }

    /// RELEASE with the reason the caller states (`RELEASE token REASON ...`); `None`
    /// derives it as [`Engine::release`] does.
    pub fn release_with(&self, token: &str, reason: Option<ReleaseReason>) -> (bool, Lsn) {
        self.try_release_with(token, reason).unwrap_or((false, 0))
    }

    /// [`Engine::release_with`] that says why nothing was released when the sale is
    /// frozen for a move ([`EngineError::Moving`]): the caller must retry, not take the
    /// hold as gone.
    pub fn try_release_with(
        &self,
        token: &str,
        reason: Option<ReleaseReason>,
    ) -> Result<(bool, Lsn), EngineError> {
        let now = self.clock.now_ms();
        let mut stripe = self.stripes[stripe_of(token)].lock();
        if let Some(idx) = stripe.lookup(token) {
            stripe.get(idx).sale.check_not_moving()?;
        }
        let out = self.release_locked(&mut stripe, token, now, Some(reason));
        drop(stripe);
        if let Some((sale, user, qty, key)) = out.2 {
            self.user_release(&sale, user, qty, &key, true);
        }
        if out.0 {
            self.room_poke_token(token);
        }
        Ok((out.0, out.1))
    }

    /// `live` is `None` when replaying the log (nothing is logged), else the reason the
    /// caller stated, if any.
    pub(super) fn release_locked(
        &self,
        stripe: &mut Stripe,
        token: &str,
        now: Millis,
        live: Option<Option<ReleaseReason>>,
    ) -> (bool, Lsn, Option<UserUpdate>) {
        let Some(idx) = stripe.lookup(token) else {
            return (false, 0, None);
        };
        let r = stripe.get(idx);
        if r.state != ReservationState::Reserved {
            return (false, stripe.last_lsn(), None);
        }
        let derived = if r.expires_at <= now {
            ReleaseReason::Expired
        } else {
            ReleaseReason::Cancel
        };
        let reason = live.flatten().unwrap_or(derived);
        let how = Finish::Release(reason);
        let (lsn, upd) = self.finish_locked(stripe, idx, now, how, live.is_some());
        (true, lsn, upd)
    }

    /// The one way a reservation leaves RESERVED (release and commit alike): out of the
    /// wheel, counters moved, logged under the stripe lock, queued for retention. The
    /// caller has checked that `idx` is RESERVED.
    pub(super) fn finish_locked(
        &self,
        stripe: &mut Stripe,
        idx: u32,
        now: Millis,
        how: Finish,
        log: bool,
    ) -> (Lsn, Option<UserUpdate>) {
        stripe.unschedule(idx);
        let r = stripe.get_mut(idx);
        debug_assert_eq!(r.state, ReservationState::Reserved);
        r.state = match how {
            Finish::Commit => ReservationState::Committed,
            Finish::Release(_) => ReservationState::Released,
        };
        r.finished_at = now;
        // Logged before the units move: a RELEASE's units become visible to other
        // buyers only once its record has an LSN, so a RESERVE that takes them is logged
        // (and acknowledged) after it and can never survive a crash without it.
        if log {
            let token = r.token();
            let token = token.as_str();
            let user = r.sale.users.name(r.user);
            let (user, request_id, qty) = (user.as_str(), r.request_id.as_str(), r.qty);
            let lsn = self.sink.record(&match how {
                Finish::Commit => EventRef::Committed {
                    token,
                    at_ms: now,
                    user,
                    request_id,
                    qty,
                },
                Finish::Release(reason) => EventRef::Released {
                    token,
                    at_ms: now,
                    user,
                    request_id,
                    qty,
                    reason,
                },
            });
            stripe.logged(lsn);
        }
        let r = stripe.get(idx);
        match how {
            Finish::Release(_) => r.sale.release(r.shard as usize, r.qty),
            Finish::Commit => r.sale.commit(r.shard as usize, r.qty),
        }
        let key = r.key;
        let upd = (r.sale.params.limit > 0).then(|| (r.sale.clone(), r.user, r.qty, key));
        stripe.finished.push_back((now, key));
        (stripe.last_lsn(), upd)
    }

    pub(super) fn user_release(
        &self,
        sale: &Sale,
        user: names::UserId,
        qty: u32,
        key: &TokenKey,
        give_back: bool,
    ) {
        let user = sale.users.name(user);
        let mut us = self.user_stripe(&sale.sku, &user).lock();
        if let Some(e) = us
            .get_mut(&*sale.sku)
            .and_then(|m| m.get_mut(user.as_str()))
        {
            if give_back {
                debug_assert!(e.held >= qty as u64);
                e.held = e.held.saturating_sub(qty as u64);
            }
            e.live.retain(|t| t != key);
        }
    }

    /// COMMIT: `Ok((true, _))` committed now, `Ok((false, _))` already committed. A hold
    /// past its expiry is refused ([`EngineError::LateCommit`]); see [`Engine::commit_with`].
    pub fn commit(&self, token: &str) -> Result<(bool, Lsn), EngineError> {
        self.commit_with(token, PaymentCheck::Unverified)
    }

    /// COMMIT with what the caller vouches for: [`PaymentCheck::LedgerVerified`] commits a
    /// hold past its expiry (the ledger accepted the payment in time).
    pub fn commit_with(
        &self,
        token: &str,
        check: PaymentCheck,
    ) -> Result<(bool, Lsn), EngineError> {
        let now = self.clock.now_ms();
        let mut stripe = self.stripes[stripe_of(token)].lock();
        let (res, upd) = self.commit_locked(&mut stripe, token, now, Some(check));
        drop(stripe);
        if let Some((sale, user, qty, key)) = upd {
            self.user_release(&sale, user, qty, &key, false);
        }
        if matches!(res, Ok((true, _))) {
            self.room_poke_token(token);
        }
        res
    }

    /// `check` is `None` when replaying the log: a logged commit happened, whatever the
    /// clock says now. Live commits are checked and logged.
    pub(super) fn commit_locked(
        &self,
        stripe: &mut Stripe,
        token: &str,
        now: Millis,
        check: Option<PaymentCheck>,
    ) -> (Result<(bool, Lsn), EngineError>, Option<UserUpdate>) {
        let log = check.is_some();
        let Some(idx) = stripe.lookup(token) else {
            // Purged by retention: the tombstone still knows how it ended.
            let out = match stripe.tombs.get(&table::tomb_key(token)).map(|t| t.state) {
                Some(ReservationState::Committed) => Ok((false, 0)),
                Some(ReservationState::Released) => Err(EngineError::Released),
                _ => Err(EngineError::NoReservation),
            };
            return (out, None);
        };
        let r = stripe.get(idx);
        match r.state {
            ReservationState::Committed => return (Ok((false, stripe.last_lsn())), None),
            ReservationState::Released => return (Err(EngineError::Released), None),
            ReservationState::Reserved => {}
        }
        // Late is `now > expires_at`, the complement of the ledger's payment guard
        // (`reservation_expires_at >= now()`). Checked before the fence: retrying after a
        // rebuild would not make it less late.
        if check == Some(PaymentCheck::Unverified) && now > r.expires_at {
            let expires_at_ms = r.expires_at;
            return (Err(EngineError::LateCommit { expires_at_ms }), None);
        }
        // A fenced sale is frozen for commits: the rebuild takes `committed` from the
        // ledger, and a commit landing between the ledger read and the rebuild would be
        // counted nowhere. The caller retries after the rebuild.
        if log && r.sale.state() == SaleState::Fenced {
            return (Err(EngineError::Fenced), None);
        }
        // A frozen sale's state is being copied to another group: a commit now would be
        // lost with the copy.
        if log {
            if let Err(e) = r.sale.check_not_moving() {
                return (Err(e), None);
            }
        }
        let (lsn, upd) = self.finish_locked(stripe, idx, now, Finish::Commit, log);
        (Ok((true, lsn)), upd)
    }

    /// EXTEND: new deadline `now + ms`, only while RESERVED and not yet expired.
    pub fn extend(&self, token: &str, ms: u64) -> Result<(Millis, Lsn), EngineError> {
        if ms == 0 || ms > MAX_TTL_MS {
            return Err(EngineError::Argument("ms must be between 1 and 2592000000"));
        }
        let mut stripe = self.stripes[stripe_of(token)].lock();
        let now = self.clock.now_ms();
        let Some(idx) = stripe.lookup(token) else {
            return Err(EngineError::NoReservation);
        };
        let r = stripe.get(idx);
        if r.state != ReservationState::Reserved {
            return Err(EngineError::NoReservation);
        }
        r.sale.check_not_moving()?;
        if r.expires_at <= now {
            return Err(EngineError::Expired);
        }
        let new = now + ms;
        stripe.reschedule(idx, new);
        let r = stripe.get(idx);
        let user = r.sale.users.name(r.user);
        let lsn = self.sink.record(&EventRef::Extended {
            token,
            expires_at_ms: new,
            user: &user,
            request_id: &r.request_id,
            qty: r.qty,
        });
        stripe.logged(lsn);
        Ok((new, lsn))
    }

    /// RESERVATION: the current record and the log position that made it.
    pub fn reservation(&self, token: &str) -> Option<(ReservationView, Lsn)> {
        let stripe = self.stripes[stripe_of(token)].lock();
        stripe.res(token).map(|r| (r.view(), stripe.last_lsn()))
    }

    /// EXPIRED: RESERVED reservations with `expires_at <= now`, oldest first, at most
    /// `count`. Reading changes nothing a client can see.
    pub fn expired(&self, count: usize, sku: Option<&str>) -> Vec<ReservationView> {
        let now = self.clock.now_ms();
        let mut all: Vec<ReservationView> = Vec::new();
        for s in self.stripes.iter() {
            let mut stripe = s.lock();
            stripe.advance(now);
            let mut taken = 0;
            for &(_, idx) in stripe.expired.iter() {
                if taken >= count {
                    break;
                }
                let r = stripe.get(idx);
                if sku.is_none_or(|k| *r.sale.sku == *k) {
                    all.push(r.view());
                    taken += 1;
                }
            }
        }
        all.sort_by(|a, b| (a.expires_at_ms, &a.token).cmp(&(b.expires_at_ms, &b.token)));
        all.truncate(count);
        all
    }

    /// Housekeeping, called periodically: expiry (and auto-release if configured) and
    /// retention purge. Returns the last log position it wrote.
    pub fn tick(&self) -> Lsn {
        let now = self.clock.now_ms();
        let retention = self.retention_ms();
        let mut last = 0;
        let mut user_updates = Vec::new();
        for s in self.stripes.iter() {
            let mut stripe = s.lock();
            stripe.advance(now);
            if self.cfg.auto_release {
                // A frozen sale's holds expire after the move, on the group that then
                // holds them: freeing units now would free them on a copy being dropped.
                let due: Vec<u32> = stripe
                    .expired
                    .iter()
                    .map(|&(_, i)| i)
                    .filter(|&i| !stripe.get(i).sale.state().is_moving())
                    .collect();
                for idx in due {
                    debug_assert_eq!(stripe.get(idx).state, ReservationState::Reserved);
                    let how = Finish::Release(ReleaseReason::Expired);
                    let (lsn, upd) = self.finish_locked(&mut stripe, idx, now, how, true);
                    last = last.max(lsn);
                    user_updates.extend(upd);
                }
            }
            while let Some((at, key)) = stripe.finished.front() {
                if at.saturating_add(retention) > now || stripe.key_is_moving(key) {
                    // A frozen sale's records stay as exported until it is dropped or
                    // thawed: an export taken twice must give the same bytes.
                    break;
                }
                let Some((_, key)) = stripe.finished.pop_front() else {
                    break;
                };
                if let Some(t) = stripe.purge_key(&key) {
                    let token = t.as_str();
                    let lsn = self.sink.record(&EventRef::Purged { token });
                    last = last.max(stripe.logged(lsn));
                }
            }
        }
        for (sale, user, qty, key) in user_updates {
            self.user_release(&sale, user, qty, &key, true);
        }
        // The rooms move last: expiries above may have given units back.
        last.max(self.tick_rooms())
    }
}
