//! Identifier validation (docs/protocol.md, Identifiers). Checked before anything changes.

use super::error::EngineError;

/// Longest sku, in bytes (the sku is part of every token of the sale).
pub const MAX_SKU: usize = 64;
/// Longest user id, in bytes.
pub const MAX_USER: usize = 128;
/// Longest request id, in bytes.
pub const MAX_REQUEST_ID: usize = 128;

fn sku_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
}

/// Printable ASCII without space, `|` (the separator inside tokens) and braces (they
/// would break the `{sku}` hash tag of reservation tokens).
fn user_byte(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && !matches!(b, b'|' | b'{' | b'}')
}

/// Whether `s` is a sku: 1 to [`MAX_SKU`] bytes of `[A-Za-z0-9_.:-]`.
pub fn valid_sku(s: &[u8]) -> bool {
    !s.is_empty() && s.len() <= MAX_SKU && s.iter().all(|&b| sku_byte(b))
}

/// Whether `s` is a user id: 1 to [`MAX_USER`] printable ASCII bytes without space, `|`
/// or braces.
pub fn valid_user(s: &[u8]) -> bool {
    !s.is_empty() && s.len() <= MAX_USER && s.iter().all(|&b| user_byte(b))
}

/// Whether `s` is a request id: the user id's bytes, 1 to [`MAX_REQUEST_ID`] of them.
pub fn valid_request_id(s: &[u8]) -> bool {
    !s.is_empty() && s.len() <= MAX_REQUEST_ID && s.iter().all(|&b| user_byte(b))
}

/// Base32 characters in a reservation token after the `{sku}` tag (see `token`).
pub const TOKEN_HASH_LEN: usize = 26;

/// A reservation token's shape: `{sku}` + 26 characters of lowercase RFC 4648 base32.
/// Only the shape: whether such a reservation exists is the engine's question.
pub fn valid_token(s: &[u8]) -> bool {
    let Some(rest) = s.strip_prefix(b"{") else {
        return false;
    };
    let Some(close) = rest.iter().position(|&b| b == b'}') else {
        return false;
    };
    let (sku, hash) = (&rest[..close], &rest[close + 1..]);
    valid_sku(sku)
        && hash.len() == TOKEN_HASH_LEN
        && hash
            .iter()
            .all(|&b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
}

/// The rule an identifier breaks, in words, for the reply that refuses it: `invalid sku:
/// ...`. Keeps the `invalid <field>` prefix clients may match on.
pub fn invalid_message(field: &str) -> String {
    const PRINTABLE: &str = "printable ASCII characters, no space, | { or }";
    match field {
        "sku" => format!("invalid sku: must be 1 to {MAX_SKU} characters of A-Z a-z 0-9 _ . : -"),
        "user" => format!("invalid user: must be 1 to {MAX_USER} {PRINTABLE}"),
        "request-id" => format!("invalid request-id: must be 1 to {MAX_REQUEST_ID} {PRINTABLE}"),
        "token" => format!(
            "invalid token: must be {{sku}} followed by {TOKEN_HASH_LEN} characters of a-z and \
             2-7, as RESERVE returned it"
        ),
        _ => format!("invalid {field}"),
    }
}

/// [`valid_sku`] as the engine's error.
pub fn check_sku(s: &str) -> Result<(), EngineError> {
    if valid_sku(s.as_bytes()) {
        Ok(())
    } else {
        Err(EngineError::Invalid("sku"))
    }
}

/// [`valid_user`] as the engine's error.
pub fn check_user(s: &str) -> Result<(), EngineError> {
    if valid_user(s.as_bytes()) {
        Ok(())
    } else {
        Err(EngineError::Invalid("user"))
    }
}

/// [`valid_request_id`] as the engine's error.
pub fn check_request_id(s: &str) -> Result<(), EngineError> {
    if valid_request_id(s.as_bytes()) {
        Ok(())
    } else {
        Err(EngineError::Invalid("request-id"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabets() {
        assert!(valid_sku(b"HOT-SKU_1.a:b"));
        assert!(!valid_sku(b""));
        assert!(!valid_sku(b"a b"));
        assert!(!valid_sku(b"{x}"));
        assert!(!valid_sku(&[b'a'; 65]));
        assert!(valid_user(b"user@example.com"));
        assert!(!valid_user(b"a|b"));
        assert!(!valid_user(b"a{b"));
        assert!(!valid_user(b"a b"));
        assert!(!valid_user(&[0xff]));
        assert!(valid_request_id(&[b'r'; 128]));
        assert!(!valid_request_id(&[b'r'; 129]));
        // What the server derives is well-formed.
        let key = crate::engine::token::ReservationKey::from_bytes(&[7; 32]);
        assert!(valid_token(key.derive("SKU-1", "u", "r").as_bytes()));
        assert!(valid_token(
            format!("{{SKU-1}}{}", "abcdefghijklmnopqrstuvwxyz").as_bytes()
        ));
        assert!(valid_token(
            format!("{{S}}{}", "234567".repeat(4) + "aa").as_bytes()
        ));
        for bad in [
            "",
            "{}aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "SKU-1aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{SKU-1aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{SKU-1}aaaaaaaaaaaaaaaaaaaaaaaaa",
            "{SKU-1}aaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{SKU-1}Aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{SKU-1}1aaaaaaaaaaaaaaaaaaaaaaaaa",
            "{SK U}aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{a{b}aaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert!(!valid_token(bad.as_bytes()), "{bad}");
        }
        let long = format!("{{{}}}{}", "s".repeat(65), "a".repeat(26));
        assert!(!valid_token(long.as_bytes()));
    }
}
