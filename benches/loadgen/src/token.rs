//! Tokens the harness computes itself: admission tokens for stockgate (PROTOCOL.md,
//! "Admission token") and reservation tokens for the Redis baseline, which has no server
//! side derivation (the application computes them, so the harness does too).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))`,
/// payload = `v1|kid|sku|user|expires_at_ms`.
pub fn mint_admission(
    secret: &[u8],
    kid: &str,
    sku: &str,
    user: &str,
    expires_at_ms: u64,
) -> String {
    let payload = format!("v1|{kid}|{sku}|{user}|{expires_at_ms}");
    let mut mac = hmac(secret);
    mac.update(payload.as_bytes());
    let sig = mac.finalize().into_bytes();
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(payload.as_bytes()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// `"{" sku "}"` + base32 (lowercase, unpadded) of the first 128 bits of
/// HMAC-SHA256(key, sku|user|request-id): the same derivation stockgate uses.
pub fn reservation_token(key: &[u8], sku: &str, user: &str, request_id: &str) -> String {
    let mut mac = hmac(key);
    mac.update(sku.as_bytes());
    mac.update(b"|");
    mac.update(user.as_bytes());
    mac.update(b"|");
    mac.update(request_id.as_bytes());
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(sku.len() + 28);
    out.push('{');
    out.push_str(sku);
    out.push('}');
    base32_lower(&digest[..16], &mut out);
    out
}

fn hmac(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length: new_from_slice cannot fail for it.
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

fn base32_lower(data: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in data {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize] as char);
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stable small hash of a string (FNV-1a), for mapping users to rows.
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
