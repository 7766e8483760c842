//! Why the room refused a request: typed, so the server maps each to a reply a checkout
//! service can act on (retry later, show "sold out", re-join).

use thiserror::Error;

use super::ticket::TicketError;

/// A refused room request.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum RoomError {
    /// The user id breaks the protocol's identifier rules (`engine::ident::valid_user`).
    #[error("invalid user")]
    InvalidUser,
    /// `max_waiting` buyers are already waiting for this sale (or its slot numbers ran
    /// out): the join is refused, nothing is queued.
    #[error("queue full: {max} buyers are already waiting for this sale")]
    QueueFull {
        /// The configured limit.
        max: u32,
    },
    /// The user has left or let an admission expire too often: each re-join goes to the
    /// back of the line and costs a slot, so they are bounded.
    #[error("too many joins: at most {max} places per user per sale")]
    TooManyJoins {
        /// Places one user may take in one sale.
        max: u8,
    },
    /// The sale is sold out with nothing held: no new buyer is queued.
    #[error("sold out")]
    SoldOut,
    /// The user holds no place in this room.
    #[error("not in the queue")]
    NotInQueue,
    /// The ticket was refused (forged, of another sale or user, malformed).
    #[error("ticket refused: {0}")]
    Ticket(#[from] TicketError),
    /// A genuine ticket of a place the user has since given up (left, or re-joined):
    /// a replay of an old ticket.
    #[error("stale ticket: replaced by a later join")]
    StaleTicket,
}
