//! A fast hasher for the reservation table. Keys are reservation tokens: HMAC outputs
//! chosen by the server, not by clients, so hash flooding is not possible and SipHash's
//! cost (the top item of a RESERVE profile) buys nothing.

use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Default, Clone, Copy)]
/// The hasher: a multiply-mix over 8-byte words, fast on token-sized keys.
pub struct TokenHasher(u64);

#[inline]
fn mix(a: u64, b: u64) -> u64 {
    let m = (a as u128).wrapping_mul(b as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Hasher for TokenHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0 ^ (bytes.len() as u64).wrapping_mul(K);
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = mix(h ^ u64::from_le_bytes(w), K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            h = mix(h ^ u64::from_le_bytes(w), K);
        }
        self.0 = h;
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0 = mix(self.0 ^ i as u64, K);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by reservation token, hashed with [`TokenHasher`].
pub type TokenMap<V> =
    std::collections::HashMap<std::sync::Arc<str>, V, BuildHasherDefault<TokenHasher>>;

/// Stable across runs: picks a token's stripe.
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = TokenHasher::default();
    h.write(b);
    h.finish()
}
