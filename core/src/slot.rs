//! Redis Cluster's hash slot of a key: CRC16-XMODEM of the key (or of its hash tag) mod
//! 16384, exactly as Redis's `keyHashSlot`, so that every cluster client computes the
//! same slot as the server.

/// Slots in a cluster, as Redis.
pub const SLOTS: u16 = 16384;

/// CRC16 CCITT/XMODEM (polynomial 0x1021, initial value 0, no reflection), the checksum
/// Redis's `crc16.c` computes.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of a key that is hashed: the bytes between the first `{` and the first `}`
/// after it, when there are any; otherwise the whole key (`{}` and an unclosed `{` hash
/// the whole key, as in Redis).
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(close) => &rest[..close],
    }
}

/// The slot a key belongs to. A sku and every reservation token of its sale (`{sku}…`)
/// share a slot, as do the sale's stream `{sku}:events`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) & (SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_xmodem_check_value() {
        // The standard check value of CRC-16/XMODEM, and Redis's own test vector.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_match_redis() {
        // Values from Redis's documentation and `redis-cli CLUSTER KEYSLOT` on Redis 7.
        let known: &[(&str, u16)] = &[
            ("foo", 12182),
            ("bar", 5061),
            ("hello", 866),
            ("somekey", 11058),
            ("{user1000}.following", 3443),
            ("{user1000}.followers", 3443),
            ("user1000", 3443),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("foo{bar}{zap}", 5061),
            ("123456789", 12739),
        ];
        for (k, slot) in known {
            assert_eq!(key_slot(k.as_bytes()), *slot, "key {k}");
        }
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(hash_tag(b"{SKU-1}abc"), b"SKU-1");
        assert_eq!(hash_tag(b"{}abc"), b"{}abc");
        assert_eq!(hash_tag(b"abc{"), b"abc{");
        assert_eq!(hash_tag(b"a{b}c{d}"), b"b");
        assert_eq!(hash_tag(b"{{x}}"), b"{x");
        assert_eq!(hash_tag(b""), b"");
    }

    #[test]
    fn a_token_routes_like_its_sku() {
        let sku = b"FLASH-2026";
        let token = b"{FLASH-2026}abcdefghijklmnopqrstuvwxyz";
        assert_eq!(key_slot(sku), key_slot(token));
        assert_eq!(key_slot(sku), key_slot(b"{FLASH-2026}:events"));
    }

    #[test]
    fn every_slot_is_in_range() {
        for i in 0..5000u32 {
            assert!(key_slot(format!("k{i}").as_bytes()) < SLOTS);
        }
    }
}
