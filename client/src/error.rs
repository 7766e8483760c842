//! The client's error: each server error code as a variant, and whether a call may be
//! retried. Shared by both transports (`client`, `sentinel`).

use redis::RedisError;

/// Why a call to the server (or the embedded engine) failed, one variant per server error code;
/// [`ClientError::is_transient`] says whether a retry may help.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `-NOSALE`: the server holds no sale with this key.
    #[error("sale unknown (-NOSALE)")]
    NoSale,
    /// `-FENCED`: the sale's counts are unproven (a loss of state, or an operator's fence) and it
    /// refuses changes until rebuilt from the ledger.
    #[error("sale fenced: state unproven, rebuild from the ledger first (-FENCED)")]
    Fenced,
    /// `-PAUSED`: the sale is paused and takes no reservations.
    #[error("sale paused (-PAUSED)")]
    Paused,
    /// `-DENIED`: the admission token is malformed, signed with an unknown key or a bad
    /// signature, bound to another sale or user, or expired; the text says which.
    #[error("admission denied: {0}")]
    Denied(String),
    /// `-NORES`: the token names no reservation, or one that is no longer RESERVED.
    #[error("no such reservation, or no longer RESERVED (-NORES)")]
    NoReservation,
    /// `-RELEASED`: the reservation was released and its units went back to stock.
    #[error("reservation released: its units went back to stock (-RELEASED)")]
    Released,
    /// `-EXPIRED`: the reservation's deadline passed, so it can no longer be committed (unverified)
    /// or extended.
    #[error("reservation expired (-EXPIRED)")]
    Expired,
    /// `-EXISTS`: `SALE.CREATE` for a sale that exists with other parameters.
    #[error("sale exists with other parameters (-EXISTS)")]
    Exists,
    /// `-QUEUEFULL` (`ROOM.JOIN`): the waiting room holds its `MAX` buyers already; the
    /// text names the limit.
    #[error("waiting room full (-QUEUEFULL): {0}")]
    QueueFull(String),
    /// `-SOLDOUT` (`ROOM.JOIN`): the sale has nothing available and nothing held, so the
    /// room takes no new buyers. (`RESERVE` answers [`crate::types::ReserveOutcome::SoldOut`].)
    #[error("sold out: the waiting room takes no new buyers (-SOLDOUT)")]
    SoldOut,
    /// `-TOOMANYJOINS` (`ROOM.JOIN`): the user took the most places one user may take in
    /// the sale.
    #[error("too many joins: at most 4 places per user per sale (-TOOMANYJOINS)")]
    TooManyJoins,
    /// `-NOROOM`: the sale has no waiting room.
    #[error("no waiting room for this sale (-NOROOM)")]
    NoRoom,
    /// `-BADTICKET` (`ROOM.STATUS`): the ticket is malformed, altered, of another sale or
    /// user, or of a place given up since (`stale ticket: ...`); the text says which.
    #[error("ticket refused (-BADTICKET): {0}")]
    BadTicket(String),
    /// `-NOTQUEUED` (`ROOM.STATUS`): the user holds no place in the room.
    #[error("not in the waiting room (-NOTQUEUED)")]
    NotQueued,
    /// Any other server error, by its code and text.
    #[error("server error -{code} {detail}")]
    Server {
        /// The error code, the reply's first word.
        code: String,
        /// The rest of the error line.
        detail: String,
    },
    /// The server could not be reached or the connection failed mid-call (I/O, timeout, unparsable
    /// reply).
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
    NoPrimary {
        /// The group's name as the Sentinels monitor it.
        master_name: String,
        /// What each Sentinel or node answered.
        detail: String,
    },
    /// A configuration that cannot work (a bad address or option), found before any call.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The embedded engine's log could not make the state this call reports durable: the
    /// outcome must not be acted on (it may not survive a crash).
    #[error("not durable: {0}")]
    NotDurable(String),
    /// A reply of a shape the command never gives: a server of another kind or version.
    #[error("unexpected reply to {command}: {reply}")]
    Protocol {
        /// The command sent.
        command: &'static str,
        /// The reply received, printed.
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
            Some("QUEUEFULL") => ClientError::QueueFull(detail),
            Some("SOLDOUT") => ClientError::SoldOut,
            Some("TOOMANYJOINS") => ClientError::TooManyJoins,
            Some("NOROOM") => ClientError::NoRoom,
            Some("BADTICKET") => ClientError::BadTicket(detail),
            Some("NOTQUEUED") => ClientError::NotQueued,
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
