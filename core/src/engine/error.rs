//! Engine errors. The protocol layer turns each into one RESP error in one place
//! (`protocol::reply::from_engine_error`).

use thiserror::Error;

use super::denied::Denied;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    #[error("invalid {0}")]
    Invalid(&'static str),
    #[error("no such sale")]
    NoSale,
    #[error("sale is fenced: state unproven, rebuild from the ledger first")]
    Fenced,
    #[error("sale is paused")]
    Paused,
    #[error("admission denied: {0}")]
    Denied(Denied),
    #[error("sale exists with different parameters")]
    Exists,
    #[error("no such reservation")]
    NoReservation,
    #[error("reservation expired")]
    Expired,
    #[error("reservation expired at {expires_at_ms} ms")]
    LateCommit { expires_at_ms: u64 },
    #[error("reservation was released")]
    Released,
    #[error("{0}")]
    Argument(&'static str),
    #[error("not enough available units")]
    NotEnoughAvailable,
    #[error("sale is not fenced")]
    NotFenced,
    #[error("reservation key fingerprint mismatch: server has {server}, ledger has {ledger}")]
    FingerprintMismatch { server: String, ledger: String },
}
