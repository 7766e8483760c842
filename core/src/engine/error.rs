//! Engine errors. The protocol layer turns each into one RESP error in one place
//! (`protocol::reply::from_engine_error`).

use thiserror::Error;

use super::denied::Denied;
use crate::room::{ConfigError, RoomError};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
/// Why the engine refused an operation; the protocol layer maps each onto its wire error.
pub enum EngineError {
    #[error("invalid {0}")]
    /// An argument out of its range; names the argument.
    Invalid(&'static str),
    #[error("no such sale")]
    /// The sku names no sale.
    NoSale,
    #[error("sale is fenced: state unproven, rebuild from the ledger first")]
    /// The sale's state is unproven: it takes no reservation until rebuilt from the ledger.
    Fenced,
    #[error("sale is paused")]
    /// The sale is paused: no new reservations.
    Paused,
    #[error("admission denied: {0}")]
    /// The admission token was refused.
    Denied(Denied),
    #[error("sale exists with different parameters")]
    /// `SALE.CREATE` of an existing sale with different parameters.
    Exists,
    #[error("no such reservation")]
    /// The token names no reservation this engine holds.
    NoReservation,
    #[error("reservation expired")]
    /// The hold's deadline passed.
    Expired,
    #[error("reservation expired at {expires_at_ms} ms")]
    /// A plain COMMIT after the hold's deadline: only the ledger can say whether the
    /// payment came in time.
    LateCommit {
        /// The deadline that passed.
        expires_at_ms: u64,
    },
    #[error("reservation was released")]
    /// The hold was already released.
    Released,
    #[error("{0}")]
    /// A malformed argument; the text says what is wrong with it.
    Argument(&'static str),
    #[error("not enough available units")]
    /// An adjustment would take back more units than are available.
    NotEnoughAvailable,
    #[error("sale is not fenced")]
    /// A rebuild of a sale that is not fenced.
    NotFenced,
    #[error("the sale {0} is moving to another group; retry")]
    /// The sale is frozen for a move: writes wait until it opens on its new group (or
    /// back here, if the move is given up).
    Moving(String),
    #[error("the sale is not frozen for a move")]
    /// An export or drop of a sale that was not frozen first.
    NotMoving,
    #[error("{0}")]
    /// An import the engine refuses; the text says why.
    Import(String),
    #[error("no waiting room for this sale")]
    /// The sale has no waiting room (`ROOM.OPEN` first).
    NoRoom,
    #[error("room exists with different settings")]
    /// `ROOM.OPEN` of a sale whose room has other settings.
    RoomExists,
    #[error("{0}")]
    /// `ROOM.OPEN` with settings out of their bounds.
    RoomConfig(ConfigError),
    #[error("{0}")]
    /// The waiting room refused the request (queue full, ticket refused, ...).
    Room(RoomError),
    #[error("reservation key fingerprint mismatch: server has {server}, ledger has {ledger}")]
    /// The ledger was bound to a server with another reservation key.
    FingerprintMismatch {
        /// This server's key fingerprint.
        server: String,
        /// The fingerprint the ledger holds.
        ledger: String,
    },
}
