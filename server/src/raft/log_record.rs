//! The records of the Raft log's file (`raft/log`): `[u32 body length][u32 crc32c of
//! kind+body][u8 kind][body]`, little endian, bodies in bincode. The log store writes and
//! replays them; an entry let go of its records (`log_held`) is read back through
//! [`decode_entry`].

use super::Entry;

pub(super) const K_ENTRY: u8 = 1;
pub(super) const K_TRUNCATE: u8 = 2;
pub(super) const K_PURGE: u8 = 3;
pub(super) const K_VOTE: u8 = 4;
pub(super) const K_COMMITTED: u8 = 5;
pub(super) const K_SNAPSHOT: u8 = 6;
pub(super) const HEADER: usize = 9;
/// A record body larger than this is corruption, not data (an entry is a batch of WAL
/// records bounded by the proposer).
pub(super) const MAX_BODY: usize = 256 << 20;

/// One record: `[u32 body length][u32 crc32c of kind+body][u8 kind][body]`.
pub(super) fn encode(kind: u8, body: &[u8], out: &mut Vec<u8>) {
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, body);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

/// One record whose body is the bincode of `v`, as [`encode`] writes it, serialised in
/// place: a batch's records are copied once, into `out`, not into a body first.
pub(super) fn encode_ser<T: serde::Serialize>(kind: u8, v: &T, out: &mut Vec<u8>) {
    let start = out.len();
    let size = bincode::serialized_size(v).map_or(0, |n| n as usize);
    out.reserve(HEADER + size);
    out.extend_from_slice(&[0; HEADER - 1]);
    out.push(kind);
    // As in `ser`: cannot fail for these types; an empty body fails the decoder loudly.
    if bincode::serialize_into(&mut *out, v).is_err() {
        out.truncate(start + HEADER);
    }
    let len = (out.len() - start - HEADER) as u32;
    let crc = crc32c::crc32c(&out[start + HEADER - 1..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A record's body: the bincode of `v`.
pub(super) fn ser<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Serialising these in-memory types into a Vec cannot fail (no maps with non-string
    // keys, no I/O); an empty body would fail the decoder loudly at the next start.
    bincode::serialize(v).unwrap_or_default()
}

/// One entry's record as [`encode`] wrote it, read back: its length, checksum and kind
/// checked.
pub(super) fn decode_entry(rec: &[u8]) -> Result<Entry, String> {
    let Some(head) = rec.get(..HEADER) else {
        return Err("shorter than a record header".into());
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let Some(body) = rec.get(HEADER..).filter(|b| b.len() == len) else {
        return Err(format!(
            "record length {len} is not the {} expected",
            rec.len() - HEADER
        ));
    };
    if head[8] != K_ENTRY {
        return Err(format!("record kind {} is not an entry", head[8]));
    }
    if crc32c::crc32c_append(crc32c::crc32c(&[K_ENTRY]), body) != crc {
        return Err("checksum mismatch".into());
    }
    bincode::deserialize(body).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_serialised_in_place_is_the_record_encoded_from_its_body() {
        let values: [(u8, Vec<u64>); 3] = [(1, vec![]), (2, vec![7]), (9, (0..5000).collect())];
        for (kind, v) in values {
            let mut from_body = vec![0xAB];
            encode(kind, &ser(&v), &mut from_body);
            let mut in_place = vec![0xAB];
            encode_ser(kind, &v, &mut in_place);
            assert_eq!(in_place, from_body, "kind {kind}, {} values", v.len());
        }
    }
}
