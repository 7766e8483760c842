//! Queue tickets: a buyer's proof of a place, bound to the sale, the user and the user's
//! join number, signed with HMAC-SHA256 like admission tokens (one key signs, every key
//! of the ring verifies, so keys rotate without voiding tickets in flight).
//!
//! Text: `t1|<kid>|<sku>|<user>|<join>|<base64url signature>`. The user and sku are in
//! the clear so a refusal can say "another sale" or "another user" (checked after the
//! signature, so a forger learns nothing); `|` cannot occur in any of them
//! (`engine::ident`). Keys are derived from the given secrets with a label, so the same
//! secret file can serve admission tokens and tickets without one ever passing for the
//! other.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Tickets longer than this are refused before any work: `t1|` + a 64-byte kid and sku,
/// a 128-byte user, 3 digits and a 43-character signature fit in 310.
pub const MAX_TICKET: usize = 320;
/// Unpadded base64url of 32 bytes.
const SIG_B64_LEN: usize = 43;
/// Label mixed into every ticket key: a ticket key is never an admission key.
const KEY_LABEL: &[u8] = b"stockgate waiting-room ticket key v1";

/// Why a ticket was refused.
#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum TicketError {
    /// Not a ticket's shape: fields, lengths, digits, base64.
    #[error("malformed ticket")]
    Malformed,
    /// Signed with a key id the ring does not hold.
    #[error("unknown key id")]
    UnknownKey,
    /// The signature does not match the ticket's fields: forged or altered.
    #[error("bad signature")]
    BadSignature,
    /// A genuine ticket of another sale.
    #[error("ticket of another sale")]
    WrongSale,
    /// A genuine ticket of another buyer (traded).
    #[error("ticket of another user")]
    WrongUser,
}

#[derive(Clone)]
struct TicketKey {
    kid: String,
    mac: HmacSha256,
}

/// The ticket keys: the first signs, every one verifies.
#[derive(Clone)]
pub struct TicketKeys {
    keys: Vec<TicketKey>,
}

impl std::fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        let kids: Vec<&str> = self.keys.iter().map(|k| k.kid.as_str()).collect();
        f.debug_struct("TicketKeys").field("kids", &kids).finish()
    }
}

fn mac_from(key: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

/// Why a key list was refused.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum TicketKeyError {
    /// No key at all.
    #[error("no ticket keys")]
    Empty,
    /// A kid outside the sku alphabet (1-64 bytes of `[A-Za-z0-9_.:-]`).
    #[error("kid must be 1-64 bytes of [A-Za-z0-9_.:-]")]
    Kid,
    /// A secret under 32 bytes.
    #[error("ticket secret must be at least 32 bytes")]
    Short,
}

impl TicketKeys {
    /// Keys from `(kid, secret)` pairs, the first signing; each secret is at least 32
    /// bytes (the admission keyring's rule).
    pub fn new(keys: &[(&str, &[u8])]) -> Result<Self, TicketKeyError> {
        if keys.is_empty() {
            return Err(TicketKeyError::Empty);
        }
        let mut out = Vec::with_capacity(keys.len());
        for (kid, secret) in keys {
            if !valid_kid(kid.as_bytes()) {
                return Err(TicketKeyError::Kid);
            }
            if secret.len() < 32 {
                return Err(TicketKeyError::Short);
            }
            let mut derive = mac_from(secret);
            derive.update(KEY_LABEL);
            out.push(TicketKey {
                kid: (*kid).to_string(),
                mac: mac_from(&derive.finalize().into_bytes()),
            });
        }
        Ok(TicketKeys { keys: out })
    }

    /// The ticket of `user`'s `join`-th place in sale `sku`, signed with the first key.
    pub fn sign(&self, sku: &str, user: &str, join: u8) -> String {
        let key = &self.keys[0];
        // Built by pushes into one allocation: a join signs a ticket every time, and
        // `format!` cost more than the rest of the room's work on it.
        let mut t = String::with_capacity(8 + key.kid.len() + sku.len() + user.len() + SIG_B64_LEN);
        for part in ["t1|", key.kid.as_str(), "|", sku, "|", user, "|"] {
            t.push_str(part);
        }
        let mut digits = [0u8; 3];
        let n = join_digits(join, &mut digits);
        t.extend(digits[..n].iter().map(|&d| char::from(d)));
        let mut mac = key.mac.clone();
        mac.update(t.as_bytes());
        t.push('|');
        URL_SAFE_NO_PAD.encode_string(mac.finalize().into_bytes(), &mut t);
        t
    }

    /// Checks a ticket presented for `user` in sale `sku`; returns its join number.
    pub fn verify(&self, ticket: &str, sku: &str, user: &str) -> Result<u8, TicketError> {
        if ticket.len() > MAX_TICKET || ticket.len() <= SIG_B64_LEN {
            return Err(TicketError::Malformed);
        }
        let (payload, sig64) = ticket.split_at(ticket.len() - SIG_B64_LEN);
        let payload = payload.strip_suffix('|').ok_or(TicketError::Malformed)?;
        let mut f = payload.split('|');
        let (Some("t1"), Some(kid), Some(tsku), Some(tuser), Some(join), None) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(TicketError::Malformed);
        };
        let join: u8 = match join.as_bytes() {
            [b'0'] => 0,
            [b'1'..=b'9', ..] if join.bytes().all(|b| b.is_ascii_digit()) => {
                join.parse().map_err(|_| TicketError::Malformed)?
            }
            _ => return Err(TicketError::Malformed),
        };
        let mut sig = [0u8; 33];
        let n = URL_SAFE_NO_PAD
            .decode_slice(sig64, &mut sig)
            .map_err(|_| TicketError::Malformed)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == kid)
            .ok_or(TicketError::UnknownKey)?;
        let mut mac = key.mac.clone();
        mac.update(payload.as_bytes());
        // Constant time; binding is judged only after the signature holds.
        mac.verify_slice(&sig[..n])
            .map_err(|_| TicketError::BadSignature)?;
        if tsku != sku {
            return Err(TicketError::WrongSale);
        }
        if tuser != user {
            return Err(TicketError::WrongUser);
        }
        Ok(join)
    }
}

/// Whether `s` may name a ticket key: 1 to 64 bytes of `[A-Za-z0-9_.:-]`, the admission
/// keyring's rule for key ids (written here so the room stays below the engine).
fn valid_kid(s: &[u8]) -> bool {
    (1..=64).contains(&s.len())
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// `join` in decimal, into `out`; the digits used.
fn join_digits(join: u8, out: &mut [u8; 3]) -> usize {
    let (h, t, o) = (join / 100, join / 10 % 10, join % 10);
    let digits = [b'0' + h, b'0' + t, b'0' + o];
    let skip = if h > 0 {
        0
    } else if t > 0 {
        1
    } else {
        2
    };
    out[..3 - skip].copy_from_slice(&digits[skip..]);
    3 - skip
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> TicketKeys {
        TicketKeys::new(&[("new", &[1u8; 32]), ("old", &[2u8; 32])]).unwrap()
    }

    #[test]
    fn sign_and_verify_with_typed_refusals() {
        let k = keys();
        let t = k.sign("SKU-1", "alice", 2);
        assert!(t.starts_with("t1|new|SKU-1|alice|2|"));
        assert_eq!(k.verify(&t, "SKU-1", "alice"), Ok(2));
        assert_eq!(k.verify(&t, "SKU-2", "alice"), Err(TicketError::WrongSale));
        assert_eq!(k.verify(&t, "SKU-1", "bob"), Err(TicketError::WrongUser));
        // Rewriting a bound field breaks the signature.
        let traded = t.replace("|alice|", "|bob|");
        assert_eq!(
            k.verify(&traded, "SKU-1", "bob"),
            Err(TicketError::BadSignature)
        );
        let later = t.replace("|alice|2|", "|alice|0|");
        assert_eq!(
            k.verify(&later, "SKU-1", "alice"),
            Err(TicketError::BadSignature)
        );
        let unknown = t.replace("t1|new|", "t1|zzz|");
        assert_eq!(
            k.verify(&unknown, "SKU-1", "alice"),
            Err(TicketError::UnknownKey)
        );
    }

    #[test]
    fn tickets_are_the_payload_and_its_signature_for_every_join() {
        let k = keys();
        for join in 0..=u8::MAX {
            let t = k.sign("SKU-1", "alice", join);
            let (payload, sig) = t.rsplit_once('|').unwrap();
            assert_eq!(payload, format!("t1|new|SKU-1|alice|{join}"));
            assert_eq!(sig.len(), SIG_B64_LEN);
            assert_eq!(k.verify(&t, "SKU-1", "alice"), Ok(join));
        }
    }

    #[test]
    fn malformed_and_oversized_tickets() {
        let k = keys();
        let t = k.sign("S", "u", 0);
        let long = format!("t1|new|S|{}|0|{}", "u".repeat(400), &t[t.len() - 43..]);
        for bad in [
            "",
            "garbage",
            "t2|new|S|u|0|AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "t1|new|S|u|x|AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "t1|new|S|u|00|AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "t1|new|S|u|999|AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "t1|new|S|u|0|!AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "t1|new|S|u|v|0|AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            &long,
        ] {
            assert_eq!(
                k.verify(bad, "S", "u"),
                Err(TicketError::Malformed),
                "{bad}"
            );
        }
        let mut flipped = t.clone();
        let last = flipped.pop().unwrap();
        flipped.push(if last == 'A' { 'Q' } else { 'A' });
        assert!(k.verify(&flipped, "S", "u").is_err());
    }

    #[test]
    fn rotation_and_foreign_keys() {
        let old_only = TicketKeys::new(&[("old", &[2u8; 32])]).unwrap();
        let t = old_only.sign("S", "u", 1);
        assert_eq!(keys().verify(&t, "S", "u"), Ok(1));
        let other = TicketKeys::new(&[("old", &[3u8; 32])]).unwrap();
        assert_eq!(other.verify(&t, "S", "u"), Err(TicketError::BadSignature));
        assert_eq!(TicketKeys::new(&[]).err(), Some(TicketKeyError::Empty));
        assert_eq!(
            TicketKeys::new(&[("k", &[0u8; 8])]).err(),
            Some(TicketKeyError::Short)
        );
        assert_eq!(
            TicketKeys::new(&[("a b", &[0u8; 32])]).err(),
            Some(TicketKeyError::Kid)
        );
    }
}
