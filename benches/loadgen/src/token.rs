//! Tokens the harness computes itself: admission tokens for stockgate (docs/protocol.md,
//! "Admission token") and reservation tokens for the Redis baseline, which has no server
//! side derivation (the application computes them, so the harness does too).

//! The formats are the server crate's own functions, so the harness can never disagree
//! with the server about them.

pub use stockgate_core::engine::sale::fnv1a as fnv1a_bytes;
pub use stockgate_core::engine::token::hex_encode as hex;
pub use stockgate_core::engine::token::mint_admission_token as mint_admission;
pub use stockgate_core::engine::{Keyring, ReservationKey};

/// A stable small hash of a string (FNV-1a), for mapping users to rows.
pub fn fnv1a(s: &str) -> u64 {
    fnv1a_bytes(s.as_bytes())
}
