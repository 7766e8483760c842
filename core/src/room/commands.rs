//! The room's commands, as the server calls them: each decides on the current state,
//! then changes it only through ops ([`Room::emit`]) that the caller logs.

use super::queue::Place;
use super::{Admission, Room, RoomError, RoomOp, StockView, Ticket, UserKey};
use crate::engine::ident;

impl Room {
    /// Opens the sale if its time has come: the first call at or after `opens_at_ms`
    /// (a join or a tick) shuffles the pre-queue.
    fn open_if_due(&mut self, now_ms: u64) {
        if !self.queue.is_open() && now_ms >= self.config.opens_at_ms {
            self.emit(RoomOp::Open {
                seed: self.open_seed,
            });
        }
    }

    /// `user` joins the line. Idempotent: a user who holds a place gets the same ticket
    /// again (a flood of joins from one user costs nothing). After leaving or letting an
    /// admission expire, a join takes a new place at the back, at most
    /// [`queue::MAX_JOINS_PER_USER`](super::queue::MAX_JOINS_PER_USER) times.
    pub fn join(&mut self, user: &str, now_ms: u64) -> Result<Ticket, RoomError> {
        self.join_member(user, now_ms).map(|(t, _)| t)
    }

    /// [`Room::join`], and the key the room knows the user by, for
    /// [`Room::status_keyed`] (hashing the user is the costliest step of a join: done once).
    pub fn join_keyed(&mut self, user: &str, now_ms: u64) -> Result<(Ticket, UserKey), RoomError> {
        let (ticket, h) = self.join_member(user, now_ms)?;
        Ok((
            ticket,
            UserKey {
                hash: h,
                join: None,
            },
        ))
    }

    fn join_member(&mut self, user: &str, now_ms: u64) -> Result<(Ticket, u64), RoomError> {
        if !ident::valid_user(user.as_bytes()) {
            return Err(RoomError::InvalidUser);
        }
        self.open_if_due(now_ms);
        let h = self.user_hash(user);
        let held = self.queue.get(h).filter(|m| m.place.is_held());
        let member = match held {
            Some(m) => m,
            None if self.sold_out => return Err(RoomError::SoldOut),
            None => {
                self.queue.check_join(h, self.config.max_waiting)?;
                self.emit_hashed(
                    RoomOp::Join {
                        user: user.to_owned(),
                    },
                    h,
                );
                self.queue.get(h).ok_or(RoomError::NotInQueue)?
            }
        };
        debug_assert!(member.place.is_held());
        let ticket = Ticket {
            text: self.tickets.sign(&self.sku, user, member.join),
            join: member.join,
        };
        Ok((ticket, h))
    }

    /// `user` gives up the place (waiting or admitted: an unused admission's budget goes
    /// to the next buyer). Returns whether anything changed; a repeat changes nothing
    /// and logs nothing.
    pub fn leave(&mut self, user: &str) -> bool {
        let h = self.user_hash(user);
        let present = self.queue.get(h).is_some_and(|m| m.place != Place::Left);
        if present {
            self.emit_hashed(
                RoomOp::Leave {
                    user: user.to_owned(),
                },
                h,
            );
        }
        present
    }

    /// An admitted `user` took a hold: the admission is used, and the demand it stood
    /// for is now in `held`. Returns whether anything changed.
    pub fn reserved(&mut self, user: &str) -> bool {
        let h = self.user_hash(user);
        let admitted = self
            .queue
            .get(h)
            .is_some_and(|m| matches!(m.place, Place::Admitted | Place::Expired));
        if admitted {
            self.emit_hashed(
                RoomOp::Reserved {
                    user: user.to_owned(),
                },
                h,
            );
        }
        admitted
    }

    /// Moves the room to `now_ms` given the sale's stock: opens it when due, expires
    /// unused admissions, marks it sold out (or not any more), and admits from the head
    /// as many buyers as [`Room::budget`] allows. Returns who was admitted.
    ///
    /// Called on a timer and whenever stock changes (a hold released or expired frees a
    /// unit: the next buyer is admitted on this call).
    pub fn tick(&mut self, now_ms: u64, stock: &StockView) -> Vec<Admission> {
        let now = now_ms.max(self.clock_ms);
        self.open_if_due(now);
        if self.expiry_due(now) {
            self.emit(RoomOp::Expire { now_ms: now });
        }
        if stock.sold_out() != self.sold_out {
            self.emit(if stock.sold_out() {
                RoomOp::SoldOut
            } else {
                RoomOp::Restocked
            });
        }
        if !self.queue.is_open() || self.sold_out {
            return Vec::new();
        }
        let n = self.budget(now, stock).min(u64::from(self.queue.waiting()));
        if n == 0 {
            return Vec::new();
        }
        let upto_slot = self.queue.slot_after(n);
        let op = RoomOp::Admit {
            upto_slot,
            now_ms: now,
        };
        let admitted = self.apply_admit(upto_slot, now);
        self.outbox.push(op);
        assert_eq!(admitted.len() as u64, n, "admits exactly the budget");
        admitted
    }
}
