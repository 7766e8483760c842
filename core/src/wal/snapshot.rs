//! Snapshot files: `snapshot-<lsn, 20 digits>.snap`, the full engine state after the
//! record at `lsn`.
//!
//! Format: `magic[8] | payload length u64 LE | crc32c u32 LE (over payload) | payload`,
//! payload = `version u8 | lsn varint | sales | reservations` with the primitives of
//! [`super::codec`]. The LSN is inside the CRC as well as in the name, so a renamed file
//! is detected. Files are written to a temporary name, fsynced, renamed and the directory
//! fsynced: a reader sees the old snapshot or the complete new one, never a mix.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::codec::{put_str, put_u64, DecodeError, Reader};
use super::fields::{
    get_reservation, get_room, get_sale, get_tomb, put_reservation, put_room, put_sale, put_tomb,
    PREALLOC_CAP,
};
use super::segment::{snapshot_file_name, sync_dir};
use super::{io_err, Lsn, WalError};
use crate::engine::types::Snapshot;

/// The first 8 bytes of every snapshot file: format and version.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"SGSNAP\0\x01";
/// Version 2 added tombstones of purged reservations, version 3 the history id at the
/// end, version 4 the sales' waiting rooms after it; older files still load (without
/// them).
pub const SNAPSHOT_VERSION: u8 = 4;
const HEADER_LEN: usize = 8 + 8 + 4;

/// What [`super::Wal::write_snapshot`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotWritten {
    /// The file written.
    pub path: PathBuf,
    /// The LSN it covers: recovery replays the records after it.
    pub lsn: Lsn,
    /// Its size.
    pub bytes: u64,
    /// Segments and older snapshots deleted because this snapshot covers them.
    pub removed: Vec<PathBuf>,
}

/// Encodes `snap` as the state after LSN `lsn`, header included.
pub fn encode_snapshot(snap: &Snapshot, lsn: Lsn) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64 + snap.reservations.len() * 100);
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&[0u8; 12]);
    out.push(SNAPSHOT_VERSION);
    put_u64(&mut out, lsn);
    put_u64(&mut out, snap.sales.len() as u64);
    for s in &snap.sales {
        put_sale(&mut out, s);
    }
    put_u64(&mut out, snap.reservations.len() as u64);
    for r in &snap.reservations {
        put_reservation(&mut out, r);
    }
    put_u64(&mut out, snap.tombs.len() as u64);
    for t in &snap.tombs {
        put_tomb(&mut out, t);
    }
    put_str(&mut out, &snap.history);
    put_u64(&mut out, snap.rooms.len() as u64);
    for room in &snap.rooms {
        put_room(&mut out, room);
    }
    let len = (out.len() - HEADER_LEN) as u64;
    let crc = crc32c::crc32c(&out[HEADER_LEN..]);
    out[8..16].copy_from_slice(&len.to_le_bytes());
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Why snapshot bytes are invalid; `offset` is a position in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotError {
    /// Where in the file the damage starts.
    pub offset: u64,
    /// What is wrong there.
    pub reason: String,
}

fn bad(offset: usize, reason: impl Into<String>) -> SnapshotError {
    SnapshotError {
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Decodes a whole snapshot file; returns the LSN it covers and the state.
pub fn decode_snapshot(buf: &[u8]) -> Result<(Lsn, Snapshot), SnapshotError> {
    if buf.len() < HEADER_LEN {
        return Err(bad(0, format!("file too short: {} bytes", buf.len())));
    }
    if buf[..8] != SNAPSHOT_MAGIC {
        return Err(bad(0, "not a stockgate snapshot (bad magic)"));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&buf[8..16]);
    let len = u64::from_le_bytes(len8);
    let stored = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]);
    let have = (buf.len() - HEADER_LEN) as u64;
    if len != have {
        return Err(bad(8, format!("payload length {len}, file holds {have}")));
    }
    let payload = &buf[HEADER_LEN..];
    let computed = crc32c::crc32c(payload);
    if computed != stored {
        return Err(bad(
            16,
            format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    let mut r = Reader::new(payload);
    decode_payload(&mut r).map_err(|e| {
        bad(
            HEADER_LEN + r.pos(),
            format!("undecodable snapshot payload: {e}"),
        )
    })
}

fn decode_payload(r: &mut Reader<'_>) -> Result<(Lsn, Snapshot), DecodeError> {
    let version = r.u8("version")?;
    if !(1..=SNAPSHOT_VERSION).contains(&version) {
        return Err(DecodeError::Version(version));
    }
    let lsn = r.u64("lsn")?;
    let n = r.count("sales")?;
    // The count is bounded by the bytes left, but an entry is ~10x larger in memory than
    // its smallest encoding: reserve modestly and let the vector grow with real entries.
    let mut sales = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        sales.push(get_sale(r)?);
    }
    let n = r.count("reservations")?;
    let mut reservations = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        reservations.push(get_reservation(r)?);
    }
    let mut tombs = Vec::new();
    if version >= 2 {
        let n = r.count("tombstones")?;
        tombs.reserve(n.min(PREALLOC_CAP));
        for _ in 0..n {
            tombs.push(get_tomb(r)?);
        }
    }
    let history = if version >= 3 {
        r.string("history id")?
    } else {
        String::new()
    };
    let mut rooms = Vec::new();
    if version >= 4 {
        let n = r.count("rooms")?;
        rooms.reserve(n.min(PREALLOC_CAP));
        for _ in 0..n {
            rooms.push(get_room(r)?);
        }
    }
    r.finish()?;
    Ok((
        lsn,
        Snapshot {
            history,
            sales,
            reservations,
            tombs,
            rooms,
        },
    ))
}

/// Writes `snapshot-<lsn>.snap` in `dir` atomically and durably; returns its path and size.
pub(crate) fn write_atomic(
    dir: &Path,
    snap: &Snapshot,
    lsn: Lsn,
) -> Result<(PathBuf, u64), WalError> {
    let bytes = encode_snapshot(snap, lsn);
    let path = dir.join(snapshot_file_name(lsn));
    let tmp = dir.join(format!("{}.tmp", snapshot_file_name(lsn)));
    let mut f = File::create(&tmp).map_err(io_err("create snapshot", &tmp))?;
    f.write_all(&bytes)
        .map_err(io_err("write snapshot", &tmp))?;
    f.sync_all().map_err(io_err("fsync snapshot", &tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io_err("rename snapshot", &path))?;
    sync_dir(dir)?;
    Ok((path, bytes.len() as u64))
}

/// Reads and validates the snapshot at `path`, whose name says it covers `lsn`.
pub(crate) fn read(path: &Path, lsn: Lsn) -> Result<Snapshot, WalError> {
    let buf = fs::read(path).map_err(io_err("read snapshot", path))?;
    let corrupt = |offset: u64, reason: String| WalError::Corrupt {
        file: path.to_owned(),
        offset,
        reason,
    };
    let (inner, snap) = decode_snapshot(&buf).map_err(|e| corrupt(e.offset, e.reason))?;
    if inner != lsn {
        return Err(corrupt(
            HEADER_LEN as u64,
            format!("snapshot says LSN {inner}, file name says {lsn}"),
        ));
    }
    Ok(snap)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::types::{ReservationState, ReservationView, RoomView, SaleView, TombView};
    use crate::engine::types::{SaleParams, SaleState};
    use proptest::prelude::*;

    pub(crate) fn sample(n: usize) -> Snapshot {
        Snapshot {
            history: "5f0c2d4e6a8b1c3d5f0c2d4e6a8b1c3d".into(),
            sales: vec![
                SaleView {
                    sku: "SKU-0001".into(),
                    params: SaleParams {
                        total: 1000,
                        shards: 4,
                        ttl_ms: 630_000,
                        limit: 2,
                    },
                    total: 1000,
                    available: 1000 - n as i64,
                    reserved: n as u64,
                    committed: 0,
                    state: SaleState::Open,
                    shard_available: vec![250, 250, 250, 250 - n as i64],
                },
                SaleView {
                    sku: "SKU-0002".into(),
                    params: SaleParams {
                        total: 0,
                        shards: 1,
                        ttl_ms: 1,
                        limit: 0,
                    },
                    total: u64::MAX,
                    available: i64::MIN,
                    reserved: 0,
                    committed: u64::MAX,
                    state: SaleState::Fenced,
                    shard_available: vec![],
                },
            ],
            reservations: (0..n)
                .map(|i| ReservationView {
                    token: format!("{{SKU-0001}}tok{i}"),
                    sku: "SKU-0001".into(),
                    user: format!("user{i}"),
                    request_id: format!("req{i}"),
                    qty: 1,
                    shard: 3,
                    state: [
                        ReservationState::Reserved,
                        ReservationState::Committed,
                        ReservationState::Released,
                    ][i % 3],
                    expires_at_ms: 1_764_500_630_000 + i as u64,
                    created_at_ms: 1_764_500_000_000,
                    finished_at_ms: if i % 3 == 0 { 0 } else { 1_764_500_100_000 },
                })
                .collect(),
            tombs: vec![
                TombView {
                    sku: "SKU-0001".into(),
                    key: u128::MAX - 7,
                    state: ReservationState::Committed,
                    qty: 2,
                    shard: 1,
                    expires_at_ms: 1_764_500_630_000,
                    user: "buyer-9".into(),
                },
                TombView {
                    sku: "SKU-0002".into(),
                    key: 1,
                    state: ReservationState::Released,
                    qty: 1,
                    shard: 0,
                    expires_at_ms: 0,
                    user: String::new(),
                },
            ],
            rooms: vec![RoomView {
                sku: "SKU-0001".into(),
                config: crate::room::RoomConfig::default(),
                state: crate::room::RoomState {
                    members: vec![
                        crate::room::MemberState {
                            user: 7,
                            slot: 0,
                            join: 0,
                            place: 2,
                        },
                        crate::room::MemberState {
                            user: 9,
                            slot: 1,
                            join: 1,
                            place: 1,
                        },
                    ],
                    pre: vec![],
                    base: 1,
                    line: vec![9, 0],
                    opened: true,
                    tokens_milli: 99_000,
                    last_fill_ms: 1_764_500_000_000,
                    recent: vec![(1_764_500_000_000, 1)],
                    admitted: vec![(7, 1_764_500_120_000, 0)],
                    expiry: vec![(1_764_500_120_000, 7, 0)],
                    sold_out: false,
                    clock_ms: 1_764_500_000_000,
                },
            }],
        }
    }

    #[test]
    fn wal_snapshot_round_trip() {
        for n in [0, 1, 100] {
            let snap = sample(n);
            let bytes = encode_snapshot(&snap, 77);
            assert_eq!(decode_snapshot(&bytes), Ok((77, snap)));
        }
        assert_eq!(
            decode_snapshot(&encode_snapshot(&Snapshot::default(), 0)),
            Ok((0, Snapshot::default()))
        );
    }

    /// A version 2 file (no history id) still loads, with the id empty: the first start
    /// after an upgrade then begins a history.
    #[test]
    fn wal_snapshot_version_2_loads_without_history() {
        let mut snap = sample(2);
        snap.history.clear();
        snap.rooms.clear();
        let mut bytes = encode_snapshot(&snap, 9);
        // An empty string and an empty list are one byte each: drop them and mark the
        // file version 2.
        bytes.truncate(bytes.len() - 2);
        bytes[HEADER_LEN] = 2;
        let len = (bytes.len() - HEADER_LEN) as u64;
        let crc = crc32c::crc32c(&bytes[HEADER_LEN..]);
        bytes[8..16].copy_from_slice(&len.to_le_bytes());
        bytes[16..20].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_snapshot(&bytes), Ok((9, snap)));
    }

    /// A version 3 file (no rooms) still loads, with no room.
    #[test]
    fn wal_snapshot_version_3_loads_without_rooms() {
        let mut snap = sample(2);
        snap.rooms.clear();
        let mut bytes = encode_snapshot(&snap, 9);
        // An empty list is one count byte: drop it and mark the file version 3.
        bytes.pop();
        bytes[HEADER_LEN] = 3;
        let len = (bytes.len() - HEADER_LEN) as u64;
        let crc = crc32c::crc32c(&bytes[HEADER_LEN..]);
        bytes[8..16].copy_from_slice(&len.to_le_bytes());
        bytes[16..20].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_snapshot(&bytes), Ok((9, snap)));
    }

    #[test]
    fn wal_snapshot_detects_every_flip_and_cut() {
        let bytes = encode_snapshot(&sample(3), 5);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            assert!(decode_snapshot(&b).is_err(), "flip at {i} undetected");
        }
        for cut in 0..bytes.len() {
            assert!(decode_snapshot(&bytes[..cut]).is_err());
        }
    }

    proptest! {
        #[test]
        fn wal_snapshot_prop_garbage_never_panics(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            // Framed with a correct length and CRC so the decoder behind them is exercised.
            let mut b = SNAPSHOT_MAGIC.to_vec();
            b.extend_from_slice(&(body.len() as u64).to_le_bytes());
            b.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
            b.extend_from_slice(&body);
            let _ = decode_snapshot(&b);
            let _ = decode_snapshot(&body);
        }
    }
}
