//! Admission tokens (docs/protocol.md, "Admission token"): minted by the waiting room, verified
//! by the server.

/// Why an admission secret could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The secret is not hexadecimal text (what was read is shown).
    #[error("secret is not valid hex: {0}")]
    BadHex(String),
    /// The secret decodes to fewer than 32 bytes (the length is shown).
    #[error("secret must be at least 32 bytes, got {0}")]
    TooShort(usize),
    /// The secret file could not be read.
    #[error("secret file {path}: {why}")]
    File {
        /// The secret file.
        path: String,
        /// What went wrong reading it.
        why: String,
    },
}

/// `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))` with
/// `payload = "v1|" kid "|" sku "|" user "|" expires_at_ms`: the server crate's own minting,
/// so the client and the server can never disagree on the format.
pub use stockgate_core::engine::token::mint_admission_token;

/// Decode a hex secret (whitespace trimmed), at least 32 bytes.
pub fn parse_secret_hex(hex: &str) -> Result<Vec<u8>, TokenError> {
    let hex = hex.trim();
    if hex.len() & 1 == 1 {
        return Err(TokenError::BadHex("odd number of digits".into()));
    }
    let mut out = Vec::with_capacity(hex.len() / 2);
    for i in (0..hex.len()).step_by(2) {
        let byte = hex
            .get(i..i + 2)
            .and_then(|b| u8::from_str_radix(b, 16).ok())
            .ok_or_else(|| TokenError::BadHex(format!("bad digit near offset {i}")))?;
        out.push(byte);
    }
    if out.len() < 32 {
        return Err(TokenError::TooShort(out.len()));
    }
    Ok(out)
}

/// Read a secret file: one `<kid> <hex secret>` per line; the first line signs.
pub fn load_secret_file(path: &std::path::Path) -> Result<Vec<(String, Vec<u8>)>, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|e| TokenError::File {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    let mut keys = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(kid), Some(hex)) = (parts.next(), parts.next()) else {
            return Err(TokenError::File {
                path: path.display().to_string(),
                why: format!("line `{line}` is not `<kid> <hex>`"),
            });
        };
        keys.push((kid.to_string(), parse_secret_hex(hex)?));
    }
    if keys.is_empty() {
        return Err(TokenError::File {
            path: path.display().to_string(),
            why: "no keys".into(),
        });
    }
    Ok(keys)
}

/// The SKU inside a reservation token's `{sku}` hash tag.
pub fn sku_of_reservation_token(token: &str) -> Option<&str> {
    let rest = token.strip_prefix('{')?;
    let end = rest.find('}')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;

    #[test]
    fn token_shape() {
        let t = mint_admission_token(&[7u8; 32], "k1", "SKU", "u1", 123);
        let (p, s) = t.split_once('.').unwrap();
        assert_eq!(URL_SAFE_NO_PAD.decode(p).unwrap(), b"v1|k1|SKU|u1|123");
        assert_eq!(URL_SAFE_NO_PAD.decode(s).unwrap().len(), 32);
    }

    #[test]
    fn hex_and_tag() {
        assert_eq!(parse_secret_hex(&"ab".repeat(32)).unwrap(), vec![0xab; 32]);
        assert!(parse_secret_hex("abc").is_err());
        assert!(parse_secret_hex("abcd").is_err());
        assert_eq!(sku_of_reservation_token("{A:1}xyz"), Some("A:1"));
        assert_eq!(sku_of_reservation_token("xyz"), None);
    }
}
