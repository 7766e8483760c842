//! One flipped bit in a logged record, found and undone.
//!
//! Both logs (the WAL and the Raft log) frame a record as `len u32 LE | crc32c u32 LE |
//! covered`, where the checksum covers `covered` (the WAL's payload; the Raft log's kind
//! byte and body) and `len` counts all but `extra` of its bytes. A record whose checksum
//! fails is either a torn write (only ever the last write, never acknowledged) or damage
//! to bytes that were written whole. Told apart by position alone, a damaged *last*
//! record would pass for a torn one and be cut, and with it an acknowledged write or a
//! cast vote. CRC-32C's Hamming distance is at least 4 up to 2³¹ − 33 bits (about
//! 256 MiB, more than any record these logs write), so one flipped bit anywhere in
//! `covered` or in the checksum has its own syndrome and can be put right, and two
//! flipped bits are never mistaken for one; a flipped length is found by trying its 32
//! neighbours. Random damage (a torn tail's garbage) matches one of those syndromes
//! with a chance of about `8 × len / 2³²`, and the caller still has to decode what the
//! repair gives.

/// CRC-32C's polynomial, reflected (the crate computes the same checksum).
const POLY: u32 = 0x82F6_3B78;

/// The header both logs put before the covered bytes: length, then checksum.
pub const FRAME_HEADER: usize = 8;

/// The bit of a record that was flipped: flip it back to get the record as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repair {
    /// Offset of the byte in the record (the length field is bytes 0 to 3).
    pub byte: usize,
    /// The bit of that byte (0 is the least significant).
    pub bit: u8,
    /// The record's whole length once repaired (header included).
    pub len: usize,
}

impl Repair {
    /// Undoes the flip in `rec` (the record's bytes from its start).
    pub fn apply(&self, rec: &mut [u8]) {
        if let Some(b) = rec.get_mut(self.byte) {
            *b ^= 1 << self.bit;
        }
    }
}

/// The one bit of the record at the start of `rec` whose flip makes its checksum hold,
/// if there is exactly such a bit: in the covered bytes, the checksum or the length.
/// `extra` is how many covered bytes the length does not count; a length over `max_len`
/// is never a candidate. `None` for a record that holds as it is, or that no single
/// flip repairs (a torn write, or worse damage).
pub fn single_bit(rec: &[u8], extra: usize, max_len: usize) -> Option<Repair> {
    let head = rec.get(..FRAME_HEADER)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let whole = |len: u32| {
        let n = len as usize;
        (n > 0 && n <= max_len)
            .then(|| rec.get(FRAME_HEADER..FRAME_HEADER + n + extra))
            .flatten()
    };
    if let Some(covered) = whole(len) {
        let syndrome = crc32c::crc32c(covered) ^ stored;
        if syndrome == 0 {
            return None;
        }
        let total = FRAME_HEADER + covered.len();
        if syndrome.is_power_of_two() {
            let b = syndrome.trailing_zeros() as usize;
            return Some(at(4 * 8 + b, total));
        }
        if let Some(i) = data_bit(covered.len(), syndrome) {
            return Some(at(FRAME_HEADER * 8 + i, total));
        }
    }
    (0..32).find_map(|b| {
        let covered = whole(len ^ (1 << b))?;
        (crc32c::crc32c(covered) == stored).then(|| at(b, FRAME_HEADER + covered.len()))
    })
}

/// The repair of bit `i` of the record (byte `i / 8`, bit `i % 8`).
fn at(i: usize, len: usize) -> Repair {
    Repair {
        byte: i / 8,
        bit: (i % 8) as u8,
        len,
    }
}

/// Which bit of `n` checksummed bytes a flip of gives `syndrome` (the stored checksum
/// XOR the computed one), as `8 × byte + bit`.
///
/// The checksum is linear: a flipped bit changes it by the raw CRC (no initial value,
/// no final XOR) of a message that is zero but for that bit, and that raw CRC is the
/// register `1 << bit` shifted through `8 × (n − byte)` zero bits. A register
/// `1 << bit` is `1` after `bit` shifts, so every candidate is `g(m)`, the register `1`
/// after `m = 8 × (n − byte) − bit` shifts: one pass over `m` tries them all.
fn data_bit(n: usize, syndrome: u32) -> Option<usize> {
    let mut g = 1u32;
    for m in 1..=8 * n {
        g = if g & 1 == 1 { (g >> 1) ^ POLY } else { g >> 1 };
        if g == syndrome {
            let q = m.div_ceil(8);
            let bit = 8 * q - m;
            return Some(8 * (n - q) + bit);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn record(covered: &[u8], extra: usize) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&((covered.len() - extra) as u32).to_le_bytes());
        r.extend_from_slice(&crc32c::crc32c(covered).to_le_bytes());
        r.extend_from_slice(covered);
        r
    }

    #[test]
    fn bit_repair_undoes_every_single_flip_of_a_record() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (n, extra) in [(1usize, 0usize), (2, 1), (13, 0), (200, 1), (1500, 0)] {
            let covered: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let good = record(&covered, extra);
            assert_eq!(single_bit(&good, extra, 1 << 20), None);
            for i in 0..good.len() * 8 {
                let mut bad = good.clone();
                bad[i / 8] ^= 1 << (i % 8);
                let r = single_bit(&bad, extra, 1 << 20)
                    .unwrap_or_else(|| panic!("n {n}: the flip of bit {i} is not found"));
                assert_eq!((r.byte, r.bit), (i / 8, (i % 8) as u8), "n {n} bit {i}");
                assert_eq!(r.len, good.len());
                r.apply(&mut bad);
                assert_eq!(bad, good);
            }
        }
    }

    #[test]
    fn bit_repair_finds_a_flipped_length_when_the_bytes_after_are_there() {
        let covered = vec![5u8; 40];
        let mut rec = record(&covered, 0);
        rec.extend_from_slice(&[0u8; 64]);
        for b in 0..6 {
            let mut bad = rec.clone();
            bad[0] ^= 1 << b;
            let r = single_bit(&bad, 0, 1 << 20).expect("repairable");
            assert_eq!((r.byte, r.bit, r.len), (0, b, FRAME_HEADER + 40));
        }
    }

    #[test]
    fn bit_repair_leaves_torn_and_twice_flipped_records_alone() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let covered: Vec<u8> = (0..300).map(|_| rng.gen()).collect();
        let good = record(&covered, 0);
        let mut zeroed = good.clone();
        zeroed[200..].fill(0);
        assert_eq!(single_bit(&zeroed, 0, 1 << 20), None);
        assert_eq!(single_bit(&good[..100], 0, 1 << 20), None);
        // Two flips in the covered bytes: CRC-32C's distance over a record this short
        // (6) leaves no single flip that would make it hold.
        for _ in 0..500 {
            let mut bad = good.clone();
            let bits = FRAME_HEADER * 8..good.len() * 8;
            let (i, j) = (rng.gen_range(bits.clone()), rng.gen_range(bits));
            if i == j {
                continue;
            }
            bad[i / 8] ^= 1 << (i % 8);
            bad[j / 8] ^= 1 << (j % 8);
            assert_eq!(single_bit(&bad, 0, 1 << 20), None, "bits {i} and {j}");
        }
    }
}
