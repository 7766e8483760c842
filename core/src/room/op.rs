//! Every change of a room's state, as the log will carry it. The room changes only by
//! applying these ([`super::Room::apply`]), live or replayed, so a replica or a recovery
//! that applies the same ops in the same order holds the same queue, the same order and
//! the same budget. Each op is idempotent where a retry could repeat it: a second `Join`
//! of a held place, `Leave`, `Reserved`, `Open`, `Admit` up to the same slot, `Expire`
//! at the same time, `SoldOut` and `Restocked` change nothing.

/// One change of a room's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RoomOp {
    /// `user` takes a place (answered with the same place if it holds one).
    Join {
        /// The user id (the room stores only its keyed hash).
        user: String,
    },
    /// `user` gives up the place.
    Leave {
        /// The user id.
        user: String,
    },
    /// The sale opens: the pre-queue is shuffled with `seed` into line. The seed is in
    /// the op so replicas need no secret to reproduce the order.
    Open {
        /// The shuffle's seed.
        seed: u64,
    },
    /// Every waiting buyer in slots below `upto_slot` is admitted at `now_ms`, until
    /// `now_ms + admit_ttl_ms`.
    Admit {
        /// First slot not admitted.
        upto_slot: u32,
        /// When.
        now_ms: u64,
    },
    /// An admitted `user` took a hold: no longer counted as admitted-not-reserved.
    Reserved {
        /// The user id.
        user: String,
    },
    /// Admissions unused by `now_ms` expire and free their budget.
    Expire {
        /// When.
        now_ms: u64,
    },
    /// The sale has nothing available and nothing held: waiting buyers are SOLDOUT.
    SoldOut,
    /// Stock came back after [`RoomOp::SoldOut`] (units added by an admin):
    /// the line moves again.
    Restocked,
}
