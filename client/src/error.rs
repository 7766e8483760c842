//! The client's error: each server error code as a variant, and whether a call may be
//! retried. Shared by both transports (`client`, `sentinel`).

use redis::RedisError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("sale unknown (-NOSALE)")]
    NoSale,
    #[error("sale fenced: state unproven, rebuild from the ledger first (-FENCED)")]
    Fenced,
    #[error("sale paused (-PAUSED)")]
    Paused,
    #[error("admission denied: {0}")]
    Denied(String),
    #[error("no such reservation, or no longer RESERVED (-NORES)")]
    NoReservation,
    #[error("reservation released: its units went back to stock (-RELEASED)")]
    Released,
    #[error("reservation expired (-EXPIRED)")]
    Expired,
    #[error("sale exists with other parameters (-EXISTS)")]
    Exists,
    #[error("server error -{code} {detail}")]
    Server { code: String, detail: String },
    #[error("connection error: {0}")]
    Connection(#[source] RedisError),
    /// `-READONLY`: the node is a replica, or a former primary fenced by a failover.
    #[error("node is read-only: a replica or a deposed primary (-READONLY)")]
    ReadOnly,
    /// `-NOREPLICAS`: the primary has fewer replicas attached than `--min-replicas-ack`.
    #[error("not enough replicas attached to acknowledge writes (-NOREPLICAS)")]
    NoReplicas,
    /// `-LOADING`: a group member just elected leader is still applying its log; it ran
    /// nothing.
    #[error("node is catching up with its group (-LOADING)")]
    Loading,
    /// No Sentinel named a node that answers `ROLE` as master.
    #[error("no primary for {master_name:?} found through Sentinel: {detail}")]
    NoPrimary { master_name: String, detail: String },
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The embedded engine's log could not make the state this call reports durable: the
    /// outcome must not be acted on (it may not survive a crash).
    #[error("not durable: {0}")]
    NotDurable(String),
    #[error("unexpected reply to {command}: {reply}")]
    Protocol {
        command: &'static str,
        reply: String,
    },
}

impl ClientError {
    /// Whether the call may succeed if retried later (server unreachable or restarting,
    /// a failover in progress).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Connection(_)
                | ClientError::ReadOnly
                | ClientError::NoReplicas
                | ClientError::Loading
                | ClientError::NoPrimary { .. }
        )
    }
}

impl From<RedisError> for ClientError {
    fn from(e: RedisError) -> Self {
        // Server error replies arrive as RedisError with a code; anything else (I/O,
        // timeouts, parse failures) is a connection-level problem.
        let detail = e.detail().unwrap_or("").to_string();
        match e.code() {
            Some("NOSALE") => ClientError::NoSale,
            Some("FENCED") => ClientError::Fenced,
            Some("PAUSED") => ClientError::Paused,
            Some("DENIED") => ClientError::Denied(detail),
            Some("NORES") => ClientError::NoReservation,
            Some("RELEASED") => ClientError::Released,
            Some("EXPIRED") => ClientError::Expired,
            Some("EXISTS") => ClientError::Exists,
            Some("READONLY") => ClientError::ReadOnly,
            Some("NOREPLICAS") => ClientError::NoReplicas,
            Some("LOADING") => ClientError::Loading,
            Some(code) if e.kind() != redis::ErrorKind::IoError => ClientError::Server {
                code: code.to_string(),
                detail,
            },
            _ => ClientError::Connection(e),
        }
    }
}
