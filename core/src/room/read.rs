//! What the room answers without changing: statuses, the budget, sizes.

use super::queue::{Member, Place};
use super::{Pace, Room, RoomConfig, RoomError, Status, StockView, UserKey};

impl Room {
    /// The status of `user`'s place (the caller authenticated the user; buyers present
    /// a ticket: [`Room::status_ticket`]).
    pub fn status(&self, user: &str, now_ms: u64, stock: &StockView) -> Result<Status, RoomError> {
        let m = self
            .queue
            .get(self.user_hash(user))
            .ok_or(RoomError::NotInQueue)?;
        Ok(self.status_of(m, now_ms, stock))
    }

    /// The status of the user [`Room::join_keyed`] gave `key` for.
    pub fn status_keyed(
        &self,
        key: UserKey,
        now_ms: u64,
        stock: &StockView,
    ) -> Result<Status, RoomError> {
        let m = self.queue.get(key.hash).ok_or(RoomError::NotInQueue)?;
        if key.join.is_some_and(|j| j != m.join) {
            return Err(RoomError::StaleTicket);
        }
        Ok(self.status_of(m, now_ms, stock))
    }

    /// The key of the place `ticket` names, presented for `user`, for later
    /// [`Room::status_keyed`] reads (a watcher checks its ticket once). The same refusals
    /// as [`Room::status_ticket`].
    pub fn key_for_ticket(&self, ticket: &str, user: &str) -> Result<UserKey, RoomError> {
        let join = self.tickets.verify(ticket, &self.sku, user)?;
        let h = self.user_hash(user);
        let m = self.queue.get(h).ok_or(RoomError::NotInQueue)?;
        if m.join != join {
            return Err(RoomError::StaleTicket);
        }
        Ok(UserKey {
            hash: h,
            join: Some(join),
        })
    }

    /// The status of the place `ticket` names, presented for `user`. Refuses a forged
    /// ticket, one of another sale or user ([`RoomError::Ticket`]), and a genuine one of
    /// a place the user has since given up ([`RoomError::StaleTicket`]).
    pub fn status_ticket(
        &self,
        ticket: &str,
        user: &str,
        now_ms: u64,
        stock: &StockView,
    ) -> Result<Status, RoomError> {
        let join = self.tickets.verify(ticket, &self.sku, user)?;
        let m = self
            .queue
            .get(self.user_hash(user))
            .ok_or(RoomError::NotInQueue)?;
        if m.join != join {
            return Err(RoomError::StaleTicket);
        }
        Ok(self.status_of(m, now_ms, stock))
    }

    fn status_of(&self, m: Member, now_ms: u64, stock: &StockView) -> Status {
        let sold_out = self.sold_out || stock.sold_out();
        match m.place {
            Place::PreQueued | Place::Waiting if sold_out => Status::SoldOut,
            Place::PreQueued => Status::BeforeOpen {
                opens_at_ms: self.config.opens_at_ms,
            },
            Place::Waiting => {
                let position = self.queue.position(m.slot);
                Status::Waiting {
                    position,
                    eta_ms: self.eta_ms(position, now_ms),
                }
            }
            // Expired as soon as the token would be, even before a tick logs it.
            Place::Admitted => match self.admitted.get(&m.user) {
                Some(p) if p.until_ms > now_ms => Status::Admitted {
                    until_ms: p.until_ms,
                },
                _ => Status::Expired,
            },
            Place::Reserved => Status::Reserved,
            Place::Expired => Status::Expired,
            Place::Left => Status::Left,
        }
    }

    /// Estimated wait of the buyer at `position`: the observed admission rate of the
    /// recent window, or the maximum rate before any admission.
    pub fn eta_ms(&self, position: u32, now_ms: u64) -> u64 {
        let ahead = u64::from(position);
        match self.pace.observed(now_ms) {
            Some((count, span_ms)) => ahead.saturating_mul(span_ms) / count,
            None => (ahead * 1000).div_ceil(u64::from(self.config.max_rate_per_sec)),
        }
    }

    /// Buyers the room may admit at `now_ms`: the lesser of the rate's allowance and
    /// what the stock can serve ([`Pace::stock_cap`]).
    pub fn budget(&self, now_ms: u64, stock: &StockView) -> u64 {
        let rate = self
            .pace
            .allowance(now_ms.max(self.clock_ms), self.config.max_rate_per_sec);
        let stock_cap = Pace::stock_cap(
            stock,
            self.config.over_admit_permille,
            self.admitted.len() as u64,
        );
        rate.min(stock_cap)
    }

    /// The sale this room queues for.
    pub fn sku(&self) -> &str {
        &self.sku
    }

    /// The room's settings (`expiring_window_ms` tells the caller what to count into
    /// [`StockView::expiring_soon`]).
    pub fn config(&self) -> &RoomConfig {
        &self.config
    }

    /// Buyers waiting, before or after opening.
    pub fn waiting(&self) -> u32 {
        self.queue.waiting()
    }

    /// Buyers admitted who have not reserved yet (and whose admission has not expired).
    pub fn admitted_not_reserved(&self) -> usize {
        self.admitted.len()
    }

    /// Whether the pre-queue has been drawn and the line moves.
    pub fn is_open(&self) -> bool {
        self.queue.is_open()
    }

    /// Whether waiting buyers are told SOLDOUT.
    pub fn is_sold_out(&self) -> bool {
        self.sold_out
    }

    /// Heap bytes the room holds, from capacities: the queue (members, line, positions)
    /// and the admissions in flight.
    pub fn heap_bytes(&self) -> usize {
        let passes = self.admitted.capacity() * (8 + std::mem::size_of::<super::Pass>() + 1);
        self.queue.heap_bytes() + passes + self.expiry.capacity() * 24
    }
}
