//! Why an admission token was refused: a leaf type, shared by the token check that
//! decides it, the engine's error that carries it and the metrics that count it.

/// Why an admission token was refused. Its text follows `-DENIED` on the wire; its
/// [`Denied::reason`] names it in the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Denied {
    /// Not a token this server's format describes (fields, lengths, base64).
    Malformed = 0,
    /// Signed with a key id the keyring does not hold (a retired or foreign key).
    UnknownKey,
    /// The signature does not match the token's fields.
    BadSignature,
    /// Issued for another sale.
    WrongSku,
    /// Issued to another buyer.
    WrongUser,
    /// Past its expiry. Judged by RESERVE, never by `Keyring::verify`: a replay of an
    /// existing reservation is answered before expiry is looked at.
    Expired,
}

impl Denied {
    /// Every reason, in the order of their discriminants (`Denied::X as usize` indexes it).
    pub const ALL: [Denied; 6] = [
        Denied::Malformed,
        Denied::UnknownKey,
        Denied::BadSignature,
        Denied::WrongSku,
        Denied::WrongUser,
        Denied::Expired,
    ];

    /// The text that follows `-DENIED` on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Denied::Malformed => "malformed admission token",
            Denied::UnknownKey => "unknown key id",
            Denied::BadSignature => "bad signature",
            Denied::WrongSku => "token bound to another sku",
            Denied::WrongUser => "token bound to another user",
            Denied::Expired => "expired",
        }
    }

    /// The reason's name in INFO (`denied_<reason>`) and Prometheus (`reason="..."`).
    /// `unknown_key` and `bad_signature` mean the waiting room and the server disagree on
    /// the admission keys (an outage); `expired` is a slow client (normal).
    pub fn reason(self) -> &'static str {
        match self {
            Denied::Malformed => "malformed",
            Denied::UnknownKey => "unknown_key",
            Denied::BadSignature => "bad_signature",
            Denied::WrongSku => "wrong_sku",
            Denied::WrongUser => "wrong_user",
            Denied::Expired => "expired",
        }
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
