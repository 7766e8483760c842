//! Building a room and applying its ops: the only code that changes a room's state, the
//! same for a live change and for a replayed one.

use std::collections::VecDeque;

use hmac::Mac;

use super::queue::{Place, Queue};
use super::{
    labelled_mac, Admission, ConfigError, FastMap, HmacSha256, Pace, Pass, Room, RoomConfig,
    RoomOp, TicketKeys, MIN_ROOM_SECRET,
};
use crate::engine::ident;

impl Room {
    /// A room for sale `sku`. `room_secret` keys the user hashes and draws the pre-queue's
    /// seed: secret, so nobody can predict the order or aim hash collisions, and the same
    /// on every replica (it must not change while the sale's log is replayed).
    pub fn new(
        sku: &str,
        config: RoomConfig,
        tickets: TicketKeys,
        room_secret: &[u8],
    ) -> Result<Room, ConfigError> {
        config.validate()?;
        if !ident::valid_sku(sku.as_bytes()) {
            return Err(ConfigError::Sku);
        }
        if room_secret.len() < MIN_ROOM_SECRET {
            return Err(ConfigError::Secret);
        }
        let user_key = labelled_mac(room_secret, "stockgate room user hash v1", sku);
        let seed = labelled_mac(room_secret, "stockgate room shuffle v1", sku);
        let mut seed8 = [0u8; 8];
        seed8.copy_from_slice(&seed[..8]);
        Ok(Room {
            sku: sku.to_owned(),
            pace: Pace::new(config.max_rate_per_sec),
            config,
            tickets,
            user_key: match HmacSha256::new_from_slice(&user_key) {
                Ok(m) => m,
                Err(_) => unreachable!("HMAC takes keys of any length"),
            },
            open_seed: u64::from_le_bytes(seed8),
            queue: Queue::default(),
            admitted: FastMap::default(),
            expiry: VecDeque::new(),
            sold_out: false,
            clock_ms: 0,
            outbox: Vec::new(),
        })
    }

    /// The keyed 64-bit hash the room knows `user` by (never 0). Keyed so that user ids
    /// chosen to collide cannot share a place.
    pub fn user_hash(&self, user: &str) -> u64 {
        let mut mac = self.user_key.clone();
        mac.update(user.as_bytes());
        let out = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&out[..8]);
        u64::from_le_bytes(first).max(1)
    }

    /// Applies one op: what a replica or a recovery does with each logged op, in order.
    pub fn apply(&mut self, op: &RoomOp) {
        let h = match op {
            RoomOp::Join { user } | RoomOp::Leave { user } | RoomOp::Reserved { user } => {
                self.user_hash(user)
            }
            _ => 0,
        };
        self.apply_hashed(op, h);
    }

    /// [`Room::apply`] with the op's user already hashed (`h`, unused by ops without a
    /// user): a live command hashed the user to decide, and the hash is the costliest
    /// step of a join.
    fn apply_hashed(&mut self, op: &RoomOp, h: u64) {
        match op {
            RoomOp::Join { .. } => {
                if self.queue.check_join(h, self.config.max_waiting).is_ok() {
                    self.queue.join(h);
                }
            }
            RoomOp::Leave { .. } => {
                if self.queue.leave(h) == Some(Place::Admitted) {
                    self.drop_pass(h);
                }
            }
            RoomOp::Open { seed } => self.queue.open(*seed),
            RoomOp::Admit { upto_slot, now_ms } => {
                self.apply_admit(*upto_slot, *now_ms);
            }
            RoomOp::Reserved { .. } => {
                if self.queue.set_place(h, Place::Reserved) == Some(Place::Admitted) {
                    self.drop_pass(h);
                }
            }
            RoomOp::Expire { now_ms } => self.apply_expire(*now_ms),
            RoomOp::SoldOut => self.sold_out = true,
            RoomOp::Restocked => self.sold_out = false,
        }
    }

    /// Applies `op` and queues it for the caller's log.
    pub(super) fn emit(&mut self, op: RoomOp) {
        self.apply(&op);
        self.outbox.push(op);
    }

    /// [`Room::emit`] of an op whose user the caller hashed already (`h`).
    pub(super) fn emit_hashed(&mut self, op: RoomOp, h: u64) {
        debug_assert!(match &op {
            RoomOp::Join { user } | RoomOp::Leave { user } | RoomOp::Reserved { user } => {
                self.user_hash(user) == h
            }
            _ => true,
        });
        self.apply_hashed(&op, h);
        self.outbox.push(op);
    }

    /// The ops applied since the last call, in order: the caller logs them (before it
    /// answers the request that caused them) and replicates them.
    pub fn take_ops(&mut self) -> Vec<RoomOp> {
        std::mem::take(&mut self.outbox)
    }

    fn advance_clock(&mut self, now_ms: u64) -> u64 {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.clock_ms
    }

    /// An admitted buyer no longer holds budget (reserved or left). Its expiry entry
    /// stays until it reaches the front; stale ones there are dropped now.
    fn drop_pass(&mut self, user: u64) {
        let removed = self.admitted.remove(&user);
        assert!(removed.is_some(), "an admitted member has a pass");
        while let Some(&(until, u, join)) = self.expiry.front() {
            if self.admitted.get(&u)
                == Some(&Pass {
                    until_ms: until,
                    join,
                })
            {
                break;
            }
            self.expiry.pop_front();
        }
    }

    pub(super) fn apply_admit(&mut self, upto_slot: u32, now_ms: u64) -> Vec<Admission> {
        let now = self.advance_clock(now_ms);
        let until_ms = now.saturating_add(self.config.admit_ttl_ms);
        let mut out = Vec::new();
        self.queue.admit_upto(upto_slot, |m| {
            out.push(Admission {
                user: m.user,
                join: m.join,
                slot: m.slot,
                until_ms,
            })
        });
        for a in &out {
            let pass = Pass {
                until_ms,
                join: a.join,
            };
            let prior = self.admitted.insert(a.user, pass);
            assert!(prior.is_none(), "a buyer is admitted once per place");
            self.expiry.push_back((until_ms, a.user, a.join));
        }
        self.pace
            .spend(now, self.config.max_rate_per_sec, out.len() as u32);
        out
    }

    fn apply_expire(&mut self, now_ms: u64) {
        let now = self.advance_clock(now_ms);
        while let Some(&(until, user, join)) = self.expiry.front() {
            if until > now {
                break;
            }
            self.expiry.pop_front();
            if self.admitted.get(&user)
                == Some(&Pass {
                    until_ms: until,
                    join,
                })
            {
                self.admitted.remove(&user);
                let was = self.queue.set_place(user, Place::Expired);
                assert_eq!(was, Some(Place::Admitted), "only an admission expires");
            }
        }
    }

    /// Whether an admission is due to expire by `now_ms` (so a tick logs an `Expire`
    /// only when it changes something).
    pub(super) fn expiry_due(&self, now_ms: u64) -> bool {
        self.expiry
            .iter()
            .take_while(|e| e.0 <= now_ms)
            .any(|&(until, u, join)| {
                self.admitted.get(&u)
                    == Some(&Pass {
                        until_ms: until,
                        join,
                    })
            })
    }

    /// The queue, for tests that inspect it.
    #[cfg(test)]
    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }
}
