//! Admission tokens (issued by the waiting room, verified here) and reservation tokens
//! (derived here, never chosen by a client). Formats: docs/protocol.md.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::ident;
use super::types::Millis;

type HmacSha256 = Hmac<Sha256>;

/// Admission tokens longer than this are refused before any decoding work: the payload
/// holds at most a kid, a 64-byte sku, a 128-byte user and a number.
const MAX_ADMISSION_TOKEN: usize = 1024;
/// Decoded payloads up to this long are verified without touching the heap: `v1|kid|` +
/// the longest sku (64) and user (128) + `|` + a 19-digit expiry, with room for the kid.
const STACK_PAYLOAD: usize = 320;
/// Unpadded base64url of an HMAC-SHA256 (32 bytes).
const SIG_B64_LEN: usize = 43;
const MIN_SECRET_BYTES: usize = 32;

#[derive(Debug, Error, PartialEq, Eq)]
/// Why a secret file or a reservation key was refused.
pub enum KeyError {
    #[error("line {0}: expected `<kid> <secret as hex>`")]
    /// A line that is not `<kid> <hex secret>`.
    Syntax(usize),
    #[error("line {0}: secret is not valid hex")]
    /// A secret that is not hex.
    Hex(usize),
    #[error("line {0}: secret must be at least 32 bytes")]
    /// A secret under 32 bytes.
    Short(usize),
    #[error("line {0}: kid must be 1-64 bytes of [A-Za-z0-9_.:-]")]
    /// A key id outside 1-64 bytes of `[A-Za-z0-9_.:-]`.
    Kid(usize),
    #[error("no keys")]
    /// A file with no key.
    Empty,
    #[error("reservation key must be exactly 32 bytes (raw) or 64 hex characters")]
    /// A reservation key that is neither 32 raw bytes nor 64 hex characters.
    ReservationKey,
}

pub use super::denied::Denied;

#[derive(Clone)]
struct AdmissionKey {
    kid: String,
    mac: HmacSha256,
}

/// The admission keys: the first signs (`mint-token`), every one verifies (rotation).
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<AdmissionKey>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        let kids: Vec<&str> = self.keys.iter().map(|k| k.kid.as_str()).collect();
        f.debug_struct("Keyring").field("kids", &kids).finish()
    }
}

/// The bytes a hex string spells (either case); `None` for anything else.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    fn nib(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    b.chunks(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// Lower-case hex of `bytes`.
pub fn hex_encode(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

fn new_mac(secret: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; this cannot fail.
    match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    }
}

impl Keyring {
    /// Parses a secret file: one `<kid> <hex secret>` per line; blank lines and `#`
    /// comments are skipped.
    pub fn parse(text: &str) -> Result<Keyring, KeyError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(kid), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(KeyError::Syntax(n));
            };
            if !ident::valid_sku(kid.as_bytes()) {
                return Err(KeyError::Kid(n));
            }
            let secret = hex_decode(hex).ok_or(KeyError::Hex(n))?;
            if secret.len() < MIN_SECRET_BYTES {
                return Err(KeyError::Short(n));
            }
            keys.push(AdmissionKey {
                kid: kid.to_string(),
                mac: new_mac(&secret),
            });
        }
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Keyring { keys })
    }

    /// A fresh secret file's text with one random 32-byte key named `k1`.
    pub fn generate_file_text() -> String {
        let secret: [u8; 32] = rand::random();
        format!("k1 {}\n", hex_encode(&secret))
    }

    /// The key ids, in the file's order (the first signs).
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.kid.as_str())
    }

    /// The kid of the key that signs (the file's first line).
    pub fn signing_kid(&self) -> &str {
        &self.keys[0].kid
    }

    /// Mints an admission token with the first key (what the waiting room does).
    pub fn mint(&self, sku: &str, user: &str, expires_at_ms: Millis) -> String {
        let key = &self.keys[0];
        mint_with(&key.mac, &key.kid, sku, user, expires_at_ms)
    }

    /// Checks signature and binding; returns the token's expiry. Expiry itself is judged
    /// by the caller, because RESERVE answers a replay before it looks at expiry.
    ///
    /// Takes the token as bytes: the decoder accepts only base64url characters, so
    /// checking them for UTF-8 first (a pass over the longest argument of a RESERVE)
    /// would buy nothing.
    pub fn verify(&self, token: impl AsRef<[u8]>, sku: &str, user: &str) -> Result<Millis, Denied> {
        let token = token.as_ref();
        if token.len() > MAX_ADMISSION_TOKEN {
            return Err(Denied::Malformed);
        }
        // A signature is 43 characters (32 bytes): look for its dot there first instead
        // of scanning the payload byte by byte. Same answer as the first dot: a dot
        // before it would be inside the payload, which then fails to decode.
        let dot = match token.len().checked_sub(SIG_B64_LEN + 1) {
            Some(i) if token[i] == b'.' => i,
            _ => token
                .iter()
                .position(|&b| b == b'.')
                .ok_or(Denied::Malformed)?,
        };
        let (p64, s64) = (&token[..dot], &token[dot + 1..]);
        // Decoded into a stack buffer: verification runs on every RESERVE. Sized for
        // every token a sku and user of the protocol's lengths make (zeroing the longest
        // possible payload's buffer cost more than its decoding); longer ones go to the heap.
        let mut pbuf = [0u8; STACK_PAYLOAD];
        let mut heap = Vec::new();
        let out: &mut [u8] = if p64.len() / 4 * 3 + 3 <= STACK_PAYLOAD {
            &mut pbuf
        } else {
            heap.resize(MAX_ADMISSION_TOKEN, 0);
            &mut heap
        };
        let n = b64url_decode(p64, out).ok_or(Denied::Malformed)?;
        let payload = &out[..n];
        let mut sbuf = [0u8; 64];
        let sn = b64url_decode(s64, &mut sbuf).ok_or(Denied::Malformed)?;
        let sig = &sbuf[..sn];
        let mut f = payload.split(|&b| b == b'|');
        let (Some(b"v1"), Some(kid), Some(tsku), Some(tuser), Some(exp), None) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(Denied::Malformed);
        };
        if exp.is_empty() || exp.len() > 19 || !exp.iter().all(u8::is_ascii_digit) {
            return Err(Denied::Malformed);
        }
        let expires: Millis = exp.iter().fold(0u64, |acc, &d| {
            acc.wrapping_mul(10).wrapping_add((d - b'0') as u64)
        });
        let key = self
            .keys
            .iter()
            .find(|k| k.kid.as_bytes() == kid)
            .ok_or(Denied::UnknownKey)?;
        let mut mac = key.mac.clone();
        mac.update(payload);
        // Constant-time comparison (hmac's verify_slice).
        mac.verify_slice(sig).map_err(|_| Denied::BadSignature)?;
        // Binding is checked after the signature so a forger learns nothing about it.
        if tsku != sku.as_bytes() {
            return Err(Denied::WrongSku);
        }
        if tuser != user.as_bytes() {
            return Err(Denied::WrongUser);
        }
        Ok(expires)
    }
}

/// Sextet of each base64url character; `INVALID` for every other byte.
const B64_INVALID: u8 = 0xff;
static B64URL: [u8; 256] = {
    let mut t = [B64_INVALID; 256];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut i = 0;
    while i < 64 {
        t[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Bit set in [`B64_SHIFTED`] for a byte outside the alphabet (above the 24 data bits).
const B64_BAD: u32 = 1 << 31;

/// [`B64URL`] for each of the four positions of a quantum, already shifted into place:
/// a quantum is then four loads and three ORs, and one test of [`B64_BAD`].
static B64_SHIFTED: [[u32; 256]; 4] = {
    let mut t = [[B64_BAD; 256]; 4];
    let mut c = 0;
    while c < 256 {
        let v = B64URL[c];
        if v != B64_INVALID {
            let v = v as u32;
            t[0][c] = v << 18;
            t[1][c] = v << 12;
            t[2][c] = v << 6;
            t[3][c] = v;
        }
        c += 1;
    }
    t
};

/// Strict unpadded base64url (RFC 4648 §5), as `URL_SAFE_NO_PAD.decode_slice` accepts
/// it: no padding, no other characters, no length ≡ 1 (mod 4), and the unused low bits
/// of the last character zero (so every token has exactly one spelling). Returns the
/// decoded length, or `None` if malformed or `out` is too small.
///
/// Hand-written because it runs twice per RESERVE and the general decoder cost more
/// than the HMAC that follows it (a table lookup per character here).
fn b64url_decode(src: &[u8], out: &mut [u8]) -> Option<usize> {
    let full = src.len() / 4;
    let rest = src.len() % 4;
    if rest == 1 {
        return None;
    }
    let need = full * 3 + rest.saturating_sub(1);
    let out = out.get_mut(..need)?;
    let sextet = |c: u8| -> Option<u32> {
        let v = B64URL[c as usize];
        (v != B64_INVALID).then_some(v as u32)
    };
    for (chunk, dst) in src.chunks_exact(4).zip(out.chunks_exact_mut(3)) {
        // One test per four characters, not one per character.
        let n = B64_SHIFTED[0][chunk[0] as usize]
            | B64_SHIFTED[1][chunk[1] as usize]
            | B64_SHIFTED[2][chunk[2] as usize]
            | B64_SHIFTED[3][chunk[3] as usize];
        if n & B64_BAD != 0 {
            return None;
        }
        dst[0] = (n >> 16) as u8;
        dst[1] = (n >> 8) as u8;
        dst[2] = n as u8;
    }
    let tail = &src[full * 4..];
    let o = full * 3;
    match tail.len() {
        2 => {
            let n = sextet(tail[0])? << 6 | sextet(tail[1])?;
            if n & 0xf != 0 {
                return None;
            }
            out[o] = (n >> 4) as u8;
        }
        3 => {
            let n = sextet(tail[0])? << 12 | sextet(tail[1])? << 6 | sextet(tail[2])?;
            if n & 0x3 != 0 {
                return None;
            }
            out[o] = (n >> 10) as u8;
            out[o + 1] = (n >> 2) as u8;
        }
        _ => {}
    }
    Some(need)
}

fn mint_with(mac: &HmacSha256, kid: &str, sku: &str, user: &str, expires_at_ms: Millis) -> String {
    let payload = format!("v1|{kid}|{sku}|{user}|{expires_at_ms}");
    let mut mac = mac.clone();
    mac.update(payload.as_bytes());
    let sig = mac.finalize().into_bytes();
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(payload.as_bytes()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// Mints an admission token from a raw secret (for tools and clients that hold one key).
pub fn mint_admission_token(
    secret: &[u8],
    kid: &str,
    sku: &str,
    user: &str,
    expires_at_ms: Millis,
) -> String {
    mint_with(&new_mac(secret), kid, sku, user, expires_at_ms)
}

/// The key that derives reservation tokens. It never rotates: a new key would give a
/// retried request a new token, and the retry would take stock twice.
#[derive(Clone)]
pub struct ReservationKey {
    mac: HmacSha256,
    fingerprint: String,
}

impl std::fmt::Debug for ReservationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservationKey")
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

const B32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// Base32 characters of a reservation token (128 bits).
const TOKEN_B32_LEN: usize = 26;
/// `{` + the longest sku + `}` + 26 characters.
const INLINE_TOKEN: usize = ident::MAX_SKU + 2 + TOKEN_B32_LEN;

/// A derived reservation token without a heap allocation (see
/// [`ReservationKey::derive_buf`]).
#[derive(Clone, PartialEq, Eq)]
pub enum TokenBuf {
    /// Short tokens, on the stack: the bytes and their length.
    Inline([u8; INLINE_TOKEN], u8),
    /// Tokens of long skus, on the heap.
    Heap(String),
}

impl std::fmt::Debug for TokenBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::ops::Deref for TokenBuf {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl TokenBuf {
    /// The token's text.
    pub fn as_str(&self) -> &str {
        match self {
            // Built from a `&str` sku and ASCII base32 only, so always UTF-8; the
            // fallback is unreachable but keeps this free of unwrap and unsafe.
            TokenBuf::Inline(b, n) => std::str::from_utf8(&b[..*n as usize]).unwrap_or(""),
            TokenBuf::Heap(s) => s,
        }
    }

    /// The token's bytes, without [`TokenBuf::as_str`]'s UTF-8 check (a pass over the
    /// token each time): for replies and hashing, which want bytes anyway.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            TokenBuf::Inline(b, n) => &b[..*n as usize],
            TokenBuf::Heap(s) => s.as_bytes(),
        }
    }
}

/// Base32 of 16 bytes into a fixed buffer (the token's tail), no allocation.
fn base32_lower_into(bytes: &[u8; 16], out: &mut [u8; TOKEN_B32_LEN]) {
    let mut acc: u32 = 0;
    let mut bits = 0u32;
    let mut i = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out[i] = B32[((acc >> bits) & 31) as usize];
            i += 1;
        }
    }
    // 128 bits = 25 full characters + 3 bits left over.
    out[i] = B32[((acc << (5 - bits)) & 31) as usize];
}

/// RFC 4648 base32, lowercase, no padding.
pub fn base32_lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let mut acc: u32 = 0;
    let mut bits = 0u32;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(B32[((acc >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(B32[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

impl ReservationKey {
    /// The key from its 32 bytes.
    pub fn from_bytes(key: &[u8; 32]) -> Self {
        let digest = Sha256::digest(key);
        ReservationKey {
            mac: new_mac(key),
            fingerprint: hex_encode(&digest[..8]),
        }
    }

    /// Accepts the key file's content: 32 raw bytes, or 64 hex characters (with optional
    /// trailing newline) for keys written by hand.
    pub fn from_file_bytes(content: &[u8]) -> Result<Self, KeyError> {
        if content.len() == 32 {
            let mut k = [0u8; 32];
            k.copy_from_slice(content);
            return Ok(Self::from_bytes(&k));
        }
        let text = std::str::from_utf8(content).map_err(|_| KeyError::ReservationKey)?;
        let raw = hex_decode(text.trim()).ok_or(KeyError::ReservationKey)?;
        let k: [u8; 32] = raw.try_into().map_err(|_| KeyError::ReservationKey)?;
        Ok(Self::from_bytes(&k))
    }

    /// A secret for another use of the same key: HMAC(key, `derived secret|` + label).
    /// The label keeps it apart from every reservation token (whose input has two `|`
    /// after a sku, which cannot start with `derived secret`'s space).
    pub fn derive_secret(&self, label: &str) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(b"derived secret|");
        mac.update(label.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Hex of the first 8 bytes of SHA-256(key): shown by SALE.INFO, stored by the ledger.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// `{sku}` + base32 of the first 128 bits of HMAC(key, sku|user|request-id).
    pub fn derive(&self, sku: &str, user: &str, request_id: &str) -> String {
        self.derive_buf(sku, user, request_id).as_str().to_owned()
    }

    /// [`ReservationKey::derive`] into a stack buffer: RESERVE derives a token on every
    /// call (replays and refusals included), and only its reply needs the text.
    pub fn derive_buf(&self, sku: &str, user: &str, request_id: &str) -> TokenBuf {
        token_buf(sku, &self.derive_key(sku, user, request_id))
    }

    /// The 128 bits a reservation token encodes: the first 16 bytes of
    /// HMAC(key, sku|user|request-id). The table keys reservations by these bytes (the
    /// sku is the sale's), not by the token's text.
    pub fn derive_key(&self, sku: &str, user: &str, request_id: &str) -> TokenKey {
        let mut mac = self.mac.clone();
        mac.update(sku.as_bytes());
        mac.update(b"|");
        mac.update(user.as_bytes());
        mac.update(b"|");
        mac.update(request_id.as_bytes());
        let out = mac.finalize().into_bytes();
        let mut first = [0u8; 16];
        first.copy_from_slice(&out[..16]);
        first
    }
}

/// The binary form of a reservation token (without its `{sku}` tag).
pub type TokenKey = [u8; 16];

/// A token's text from its sku and key, in a stack buffer.
pub fn token_buf(sku: &str, key: &TokenKey) -> TokenBuf {
    let mut tail = [0u8; TOKEN_B32_LEN];
    base32_lower_into(key, &mut tail);
    let len = sku.len() + 2 + TOKEN_B32_LEN;
    if len > INLINE_TOKEN {
        // Only for skus longer than the protocol allows (the engine refuses those
        // before it derives anything); kept correct all the same.
        let mut token = String::with_capacity(len);
        token.push('{');
        token.push_str(sku);
        token.push('}');
        token.extend(tail.iter().map(|&b| b as char));
        return TokenBuf::Heap(token);
    }
    let mut buf = [0u8; INLINE_TOKEN];
    buf[0] = b'{';
    buf[1..1 + sku.len()].copy_from_slice(sku.as_bytes());
    buf[1 + sku.len()] = b'}';
    buf[2 + sku.len()..len].copy_from_slice(&tail);
    TokenBuf::Inline(buf, len as u8)
}

/// A token's text as a shared string (replies and views).
pub fn token_text(sku: &str, key: &TokenKey) -> std::sync::Arc<str> {
    token_buf(sku, key).as_str().into()
}

/// The value of each lowercase base32 character; `B32_INVALID` for every other byte.
const B32_INVALID: u8 = 0xff;
static B32_DECODE: [u8; 256] = {
    let mut t = [B32_INVALID; 256];
    let mut i = 0;
    while i < 32 {
        t[B32[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Splits a reservation token into its sku and key: `{sku}` + exactly the 26 lowercase
/// base32 characters this server writes for 16 bytes, the 2 unused low bits of the last
/// character zero. `None` for anything else, so every key has exactly one spelling and
/// a token this server never wrote can never name a reservation.
pub fn decode_token(token: &str) -> Option<(&str, TokenKey)> {
    let rest = token.strip_prefix('{')?;
    // The tail has a fixed length, so the `}` has a fixed place; a valid sku has no
    // brace, so this splits where searching for the first `}` would.
    let at = rest.len().checked_sub(TOKEN_B32_LEN + 1)?;
    let (sku, tail) = (rest.get(..at)?, rest.get(at..)?.as_bytes());
    let (&[b'}'], tail) = tail.split_at(1) else {
        return None;
    };
    if !ident::valid_sku(sku.as_bytes()) {
        return None;
    }
    // A follower decodes every token it applies, so this runs per replicated record:
    // eight characters (40 bits, five whole bytes) at a time, the validity of every
    // character checked once at the end (a valid value is below 32, `B32_INVALID` is not).
    let mut key = [0u8; 16];
    let mut seen = 0u8;
    for (chars, bytes) in tail[..24]
        .chunks_exact(8)
        .zip(key[..15].chunks_exact_mut(5))
    {
        let mut acc = 0u64;
        for &c in chars {
            let v = B32_DECODE[c as usize];
            seen |= v;
            acc = (acc << 5) | u64::from(v & 31);
        }
        bytes.copy_from_slice(&acc.to_be_bytes()[3..]);
    }
    // 26 × 5 = 130 bits: the last two characters carry the 16th byte and 2 bits that
    // must be zero, so that every key has one spelling.
    let (a, b) = (B32_DECODE[tail[24] as usize], B32_DECODE[tail[25] as usize]);
    seen |= a | b;
    let last = (u32::from(a & 31) << 5) | u32::from(b & 31);
    key[15] = (last >> 2) as u8;
    (seen & !31 == 0 && last & 3 == 0).then_some((sku, key))
}

/// The SKU inside a reservation token's hash tag, if the token is well formed.
pub fn token_sku(token: &str) -> Option<&str> {
    let rest = token.strip_prefix('{')?;
    let (sku, tail) = rest.split_once('}')?;
    if tail.len() == 26 && ident::valid_sku(sku.as_bytes()) {
        Some(sku)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::parse(&format!(
            "new {}\nold {}\n",
            "ab".repeat(32),
            "cd".repeat(32)
        ))
        .unwrap()
    }

    #[test]
    fn base32_vectors() {
        // RFC 4648 test vectors, lowercased, without padding.
        assert_eq!(base32_lower(b""), "");
        assert_eq!(base32_lower(b"f"), "my");
        assert_eq!(base32_lower(b"fo"), "mzxq");
        assert_eq!(base32_lower(b"foo"), "mzxw6");
        assert_eq!(base32_lower(b"foob"), "mzxw6yq");
        assert_eq!(base32_lower(b"fooba"), "mzxw6ytb");
        assert_eq!(base32_lower(b"foobar"), "mzxw6ytboi");
        assert_eq!(base32_lower(&[0u8; 16]).len(), 26);
    }

    #[test]
    fn mint_and_verify() {
        let r = ring();
        let t = r.mint("SKU1", "alice", 1000);
        assert_eq!(r.verify(&t, "SKU1", "alice"), Ok(1000));
        assert_eq!(r.verify(&t, "SKU2", "alice"), Err(Denied::WrongSku));
        assert_eq!(r.verify(&t, "SKU1", "bob"), Err(Denied::WrongUser));
        assert_eq!(r.verify("garbage", "SKU1", "alice"), Err(Denied::Malformed));
        assert_eq!(r.verify("a.b.c", "SKU1", "alice"), Err(Denied::Malformed));
        let mut bad = t.clone();
        bad.push('A');
        assert!(r.verify(&bad, "SKU1", "alice").is_err());
    }

    #[test]
    fn payloads_past_the_stack_buffer_verify_the_same() {
        let r = ring();
        // Around the stack buffer's size and past it (the heap path), to the longest
        // token accepted; the signature's dot searched from both ends alike.
        for len in [STACK_PAYLOAD - 40, STACK_PAYLOAD, STACK_PAYLOAD + 10, 600] {
            let user = "u".repeat(len);
            let t = r.mint("SKU1", &user, 7);
            assert_eq!(r.verify(&t, "SKU1", &user), Ok(7), "user of {len}");
            assert_eq!(r.verify(&t, "SKU1", "u"), Err(Denied::WrongUser));
            let dotless = t.replace('.', "A");
            assert_eq!(r.verify(&dotless, "SKU1", &user), Err(Denied::Malformed));
        }
        let long = r.mint("SKU1", &"u".repeat(MAX_ADMISSION_TOKEN), 7);
        assert_eq!(r.verify(&long, "SKU1", "u"), Err(Denied::Malformed));
        // A dot inside the payload as well as before the signature: malformed either way.
        let t = r.mint("SKU1", "alice", 1000);
        let two_dots = format!("{}.{}", &t[..4], &t[4..]);
        assert_eq!(r.verify(&two_dots, "SKU1", "alice"), Err(Denied::Malformed));
    }

    #[test]
    fn rotation_second_key_verifies() {
        let old_only = Keyring::parse(&format!("old {}\n", "cd".repeat(32))).unwrap();
        let t = old_only.mint("S", "u", 5);
        assert_eq!(ring().verify(&t, "S", "u"), Ok(5));
        let other = Keyring::parse(&format!("old {}\n", "ee".repeat(32))).unwrap();
        assert_eq!(other.verify(&t, "S", "u"), Err(Denied::BadSignature));
    }

    #[test]
    fn standalone_mint_matches_keyring() {
        let secret = hex_decode(&"ab".repeat(32)).unwrap();
        let t = mint_admission_token(&secret, "new", "S", "u", 77);
        assert_eq!(ring().verify(&t, "S", "u"), Ok(77));
    }

    #[test]
    fn key_file_errors() {
        assert_eq!(Keyring::parse("").err(), Some(KeyError::Empty));
        assert_eq!(Keyring::parse("k1 abcd").err(), Some(KeyError::Short(1)));
        assert_eq!(Keyring::parse("k1 zz").err(), Some(KeyError::Hex(1)));
        assert_eq!(Keyring::parse("k1").err(), Some(KeyError::Syntax(1)));
    }

    proptest::proptest! {
        /// The hand-written decoder agrees with the `base64` crate on any input: same
        /// bytes where it accepts, and it accepts exactly what the crate accepts.
        #[test]
        fn b64url_agrees_with_the_base64_crate(
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            junk in "[A-Za-z0-9_=+/.-]{0,40}",
        ) {
            let enc = URL_SAFE_NO_PAD.encode(&raw);
            let mut out = [0u8; 128];
            let n = b64url_decode(enc.as_bytes(), &mut out);
            proptest::prop_assert_eq!(n.map(|n| out[..n].to_vec()), Some(raw));
            let mut theirs = [0u8; 128];
            let want = URL_SAFE_NO_PAD.decode_slice(junk.as_bytes(), &mut theirs).ok();
            let got = b64url_decode(junk.as_bytes(), &mut out);
            proptest::prop_assert_eq!(got.map(|n| out[..n].to_vec()), want.map(|n| theirs[..n].to_vec()));
        }
    }

    #[test]
    fn b64url_refuses_non_canonical_and_short_buffers() {
        let mut out = [0u8; 8];
        assert_eq!(b64url_decode(b"QQ", &mut out), Some(1));
        assert_eq!(
            b64url_decode(b"QR", &mut out),
            None,
            "non-zero trailing bits"
        );
        assert_eq!(b64url_decode(b"QQ==", &mut out), None, "padding");
        assert_eq!(b64url_decode(b"Q", &mut out), None, "length 1 mod 4");
        assert_eq!(
            b64url_decode(b"QUJD+A", &mut out),
            None,
            "standard alphabet"
        );
        assert_eq!(
            b64url_decode(b"QUJDREVGR0hJ", &mut [0u8; 8]),
            None,
            "too small"
        );
    }

    #[test]
    fn stack_token_matches_the_spec() {
        // docs/protocol.md: "{" sku "}" + base32 of the first 128 bits of the HMAC.
        let key = [9u8; 32];
        let k = ReservationKey::from_bytes(&key);
        let long_sku = "S".repeat(80);
        for (sku, user, rid) in [
            ("SKU-1", "u", "r"),
            ("A", "user-7", "req-1"),
            (&long_sku[..], "u", "r"),
        ] {
            let mut mac = new_mac(&key);
            mac.update(format!("{sku}|{user}|{rid}").as_bytes());
            let h = mac.finalize().into_bytes();
            let want = format!("{{{sku}}}{}", base32_lower(&h[..16]));
            assert_eq!(k.derive_buf(sku, user, rid).as_str(), want);
            assert_eq!(k.derive(sku, user, rid), want);
        }
    }

    #[test]
    fn token_keys_round_trip_and_have_one_spelling() {
        let k = ReservationKey::from_bytes(&[3u8; 32]);
        for (sku, user, rid) in [
            ("SKU-1", "u", "r"),
            ("A", "user-7", "req-1"),
            ("x:y.z", "b", "c"),
        ] {
            let text = k.derive(sku, user, rid);
            let key = k.derive_key(sku, user, rid);
            assert_eq!(decode_token(&text), Some((sku, key)));
            assert_eq!(token_buf(sku, &key).as_str(), text);
            assert_eq!(&*token_text(sku, &key), text);
        }
        for key in [[0u8; 16], [0xff; 16]] {
            let text = token_buf("S", &key);
            assert_eq!(decode_token(text.as_str()), Some(("S", key)));
        }
        // The last character carries 3 bits; the 2 below them must be zero, or two
        // spellings would name one reservation.
        let text = token_buf("S", &[0u8; 16]);
        let t = text.as_str();
        let last = |c: char| format!("{}{c}", &t[..t.len() - 1]);
        assert!(decode_token(&last('a')).is_some());
        assert!(decode_token(&last('e')).is_some());
        for c in ['b', 'c', 'd', '7'] {
            assert_eq!(decode_token(&last(c)), None, "{c}");
        }
        for bad in [
            "",
            "{S}",
            "S}aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S}aaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S}aaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S}Aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S}1aaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S S}aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{}aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S}a}aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "{S}}aaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            assert_eq!(decode_token(bad), None, "{bad}");
        }
    }

    /// The decoder spelled out a character at a time: what `decode_token` must agree with.
    fn decode_slowly(token: &str) -> Option<(&str, TokenKey)> {
        let (sku, tail) = token.strip_prefix('{')?.split_once('}')?;
        if tail.len() != TOKEN_B32_LEN || !ident::valid_sku(sku.as_bytes()) {
            return None;
        }
        let (mut key, mut acc, mut bits, mut i) = ([0u8; 16], 0u32, 0u32, 0);
        for &c in tail.as_bytes() {
            let v = B32_DECODE[c as usize];
            if v == B32_INVALID {
                return None;
            }
            acc = (acc << 5) | u32::from(v);
            bits += 5;
            if bits >= 8 {
                bits -= 8;
                key[i] = (acc >> bits) as u8;
                i += 1;
                acc &= (1 << bits) - 1;
            }
        }
        (acc == 0).then_some((sku, key))
    }

    proptest::proptest! {
        /// Any text shaped like a token, valid or not, decodes as the slow decoder says.
        #[test]
        fn token_decoding_agrees_with_the_slow_decoder(
            text in "\\{[A-Za-z0-9}{ é]{0,6}\\}[a-z2-7A}{1é]{24,28}",
            key in proptest::prelude::any::<[u8; 16]>(),
        ) {
            proptest::prop_assert_eq!(decode_token(&text), decode_slowly(&text));
            let made = token_buf("SKU", &key);
            proptest::prop_assert_eq!(decode_token(made.as_str()), decode_slowly(made.as_str()));
        }

        /// Every 16 bytes have exactly one token, and it decodes back to them.
        #[test]
        fn token_key_text_round_trip(key in proptest::prelude::any::<[u8; 16]>()) {
            let text = token_buf("SKU", &key);
            proptest::prop_assert_eq!(decode_token(text.as_str()), Some(("SKU", key)));
            proptest::prop_assert!(ident::valid_token(text.as_str().as_bytes()));
        }
    }

    #[test]
    fn reservation_tokens() {
        let k = ReservationKey::from_bytes(&[7u8; 32]);
        let a = k.derive("SKU", "u", "r1");
        assert_eq!(a, k.derive("SKU", "u", "r1"));
        assert_ne!(a, k.derive("SKU", "u", "r2"));
        // The separator makes (u, "x|y") unambiguous because `|` is not allowed in ids.
        assert_ne!(k.derive("SKU", "ux", "y"), k.derive("SKU", "u", "xy"));
        assert!(a.starts_with("{SKU}"));
        assert_eq!(a.len(), 5 + 26);
        assert_eq!(token_sku(&a), Some("SKU"));
        assert_eq!(token_sku("{SKU}short"), None);
        assert_eq!(k.fingerprint().len(), 16);
        let hexkey = hex_encode(&[7u8; 32]);
        let k2 = ReservationKey::from_file_bytes(hexkey.as_bytes()).unwrap();
        assert_eq!(k2.fingerprint(), k.fingerprint());
    }
}
