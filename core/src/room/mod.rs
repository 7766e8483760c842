//! The waiting room of a sale: who joined, in what order, who is let through, and at
//! what pace. It issues what the gate verifies: the buyers it admits get an admission
//! token, minted by the caller with the engine's [`crate::engine::Keyring`].
//!
//! A pure state machine: no I/O, no clock (every call takes `now_ms`), no randomness but
//! the seed of the pre-queue's shuffle. Every change is a [`RoomOp`], applied by
//! [`Room::apply`] and queued for the caller to log ([`Room::take_ops`]); replicas and
//! recovery apply the same ops and reach the same state.
//!
//! Flow: [`Room::join`] gives a signed [`Ticket`]; [`Room::tick`] (called by the server
//! on a timer and when stock changes) opens the sale, expires unused admissions, marks
//! the sale sold out, and admits from the head at the [`pace`]; a buyer polls
//! [`Room::status_ticket`] and, once [`Status::Admitted`], the caller mints the
//! admission token for that user, expiring at `until_ms`. The room stores no user id
//! (only a keyed 64-bit hash, to stay under 64 bytes per waiting buyer), so the token is
//! minted when the buyer asks, with the id the request carries.

pub mod config;
pub mod error;
mod live;
pub mod op;
pub mod pace;
pub mod queue;
pub mod shuffle;
pub mod state;
#[cfg(test)]
mod tests;
pub mod ticket;

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::engine::fasthash::TokenHasher;
pub use config::{ConfigError, RoomConfig};
pub use error::RoomError;
pub use op::RoomOp;
pub use pace::{Pace, StockView};
use queue::Queue;
pub use state::{MemberState, RestoreError, RoomState};
pub use ticket::{TicketError, TicketKeyError, TicketKeys};

/// A queue ticket: the signed text the buyer presents, and which of the user's joins it
/// names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The signed ticket (see [`ticket`]).
    pub text: String,
    /// The user's join number (0 for the first place).
    pub join: u8,
}

/// What a buyer is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Joined before opening: the order is drawn at `opens_at_ms`.
    BeforeOpen {
        /// When the sale opens.
        opens_at_ms: u64,
    },
    /// In line.
    Waiting {
        /// 1-based: buyers ahead, plus one.
        position: u32,
        /// Estimated wait, from the observed admission rate (or the maximum rate).
        eta_ms: u64,
    },
    /// Let through: the caller mints the admission token, expiring at `until_ms`.
    Admitted {
        /// When the admission expires unused.
        until_ms: u64,
    },
    /// Admitted and took a hold.
    Reserved,
    /// Nothing left and nothing held: no point waiting.
    SoldOut,
    /// Admitted, but did not reserve in time.
    Expired,
    /// Left the queue.
    Left,
}

/// The key a room knows one user by in one room (from [`Room::join_keyed`] or
/// [`Room::key_for_ticket`]): a status asked with it skips hashing the user id and
/// checking a ticket again. From a ticket it also names the ticket's place: once the
/// user gave that place up and joined again, the key is stale, as the ticket is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserKey {
    hash: u64,
    join: Option<u8>,
}

/// A buyer let through by [`Room::tick`], for the caller's log and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Keyed hash of the user id ([`Room::user_hash`]).
    pub user: u64,
    /// The user's join number.
    pub join: u8,
    /// The slot the buyer held.
    pub slot: u32,
    /// When the admission expires unused.
    pub until_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pass {
    until_ms: u64,
    join: u8,
}

type HmacSha256 = Hmac<Sha256>;
type FastMap<V> = HashMap<u64, V, BuildHasherDefault<TokenHasher>>;

/// Shortest room secret (the admission keyring's rule).
pub const MIN_ROOM_SECRET: usize = 32;

/// The waiting room of one sale.
pub struct Room {
    sku: String,
    config: RoomConfig,
    tickets: TicketKeys,
    user_key: HmacSha256,
    open_seed: u64,
    queue: Queue,
    pace: Pace,
    /// Admitted, not reserved: the demand already sent to the gate.
    admitted: FastMap<Pass>,
    /// `(until, user, join)` of admissions in admission order (so by expiry).
    expiry: VecDeque<(u64, u64, u8)>,
    sold_out: bool,
    /// Latest time an applied op carried: expiries stay in order if a caller's clock
    /// steps back.
    clock_ms: u64,
    outbox: Vec<RoomOp>,
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("sku", &self.sku)
            .field("waiting", &self.queue.waiting())
            .field("admitted", &self.admitted.len())
            .field("sold_out", &self.sold_out)
            .finish()
    }
}

fn labelled_mac(secret: &[u8], label: &str, sku: &str) -> [u8; 32] {
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(label.as_bytes());
    mac.update(b"|");
    mac.update(sku.as_bytes());
    mac.finalize().into_bytes().into()
}

mod apply;
mod commands;
mod read;
