//! Segment files: `wal-<first lsn, 20 digits>.log`.
//!
//! A segment is a 16-byte header (`magic[8] | first lsn u64 LE`) followed by records. The
//! records carry no LSN: the record at index `i` of a segment has LSN `first + i`, so the
//! name and header are what place a file in the sequence; the header is checked against
//! the name so a renamed or foreign file cannot slip into the replay.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bit_repair;
use super::record::{self, decode_record, RecordError};
use super::{io_err, Event, Lsn, WalError};

/// The first 8 bytes of every segment: format and version.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SGWAL\0\0\x01";
/// Bytes before a segment's first record: the magic and the segment's first LSN.
pub const SEGMENT_HEADER_LEN: u64 = 16;

/// Segments on disk: first LSN -> last LSN, `None` for the one being appended to. Shared
/// by recovery (which builds it) and the writer (which keeps it), so neither needs the
/// other.
pub(crate) type Catalog = std::collections::BTreeMap<Lsn, Option<Lsn>>;

/// The file name of the segment whose first record is `first`.
pub fn segment_file_name(first: Lsn) -> String {
    format!("wal-{first:020}.log")
}

/// The file name of the snapshot covering the log up to `lsn`.
pub fn snapshot_file_name(lsn: Lsn) -> String {
    format!("snapshot-{lsn:020}.snap")
}

fn parse_numbered(name: &str, prefix: &str, suffix: &str) -> Option<Lsn> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The first LSN a segment's file name carries; `None` for any other name.
pub fn parse_segment_name(name: &str) -> Option<Lsn> {
    parse_numbered(name, "wal-", ".log")
}

/// The LSN a snapshot's file name carries; `None` for any other name.
pub fn parse_snapshot_name(name: &str) -> Option<Lsn> {
    parse_numbered(name, "snapshot-", ".snap")
}

fn header(first: Lsn) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..].copy_from_slice(&first.to_le_bytes());
    h
}

/// The files of a WAL directory, each list sorted by LSN.
#[derive(Debug, Default)]
pub struct Listing {
    /// Segments, by first LSN.
    pub segments: Vec<(Lsn, PathBuf)>,
    /// Snapshots, by the LSN they cover.
    pub snapshots: Vec<(Lsn, PathBuf)>,
    /// Leftovers of interrupted snapshot writes.
    pub temps: Vec<PathBuf>,
}

/// The segments, snapshots and leftover temporary files in `dir`.
pub fn list_dir(dir: &Path) -> Result<Listing, WalError> {
    let mut l = Listing::default();
    for entry in fs::read_dir(dir).map_err(io_err("read directory", dir))? {
        let entry = entry.map_err(io_err("read directory", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(lsn) = parse_segment_name(name) {
            l.segments.push((lsn, entry.path()));
        } else if let Some(lsn) = parse_snapshot_name(name) {
            l.snapshots.push((lsn, entry.path()));
        } else if name.starts_with("snapshot-") && name.ends_with(".tmp") {
            l.temps.push(entry.path());
        }
    }
    l.segments.sort();
    l.snapshots.sort();
    Ok(l)
}

/// Makes creations, renames and deletions inside `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// A model of the disk under an inline writer ([`super::Wal::open_inline_on`], the Raft
/// log's `open_inline_on`): the deterministic simulation's, never a server's. It is told
/// of every write before it happens and may fail it (`ENOSPC`, `EIO`), and it stands in
/// for every `fdatasync` (and the directory syncs of a segment's creation): a sync it
/// accepts is what makes those bytes survive the power loss it simulates, so the file
/// itself is not synced (the hook's bookkeeping is the durability the simulation checks).
pub trait DiskHook: Send + Sync {
    /// `path` was created empty: nothing of it is durable yet.
    fn created(&self, path: &Path);
    /// `len` bytes are about to be appended to `path`; an error fails the write (nothing
    /// written).
    fn write(&self, path: &Path, len: u64) -> io::Result<()>;
    /// `path`, now `len` bytes long, is to be synced: `Ok` makes those bytes durable; an
    /// error is a failed `fdatasync` (what was written since the last sync may be lost).
    fn sync(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Whether the Raft log writes and syncs a change a while after it is made (and
    /// readable), as its writer thread does in a server, rather than before the change
    /// returns. The simulation's seam for the window between an entry being sent to
    /// peers and being durable here.
    fn lags(&self) -> bool {
        false
    }
    /// How long after a change the Raft log writes and syncs it, when it [`lags`].
    ///
    /// [`lags`]: DiskHook::lags
    fn sync_lag(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// `from` was renamed over `to` (and the directory synced): `to` is now as durable
    /// as `from` was, a rename never losing a synced file's data. A writer that never
    /// renames needs nothing here.
    fn renamed(&self, _from: &Path, _to: &Path) {}
}

/// The segment the writer appends to.
pub(crate) struct ActiveSegment {
    file: File,
    /// The simulation's disk model; `None` in a server.
    hook: Option<Arc<dyn DiskHook>>,
    pub path: PathBuf,
    pub first: Lsn,
    /// LSN the next appended record will have.
    pub next: Lsn,
    /// Bytes in the file, header included.
    pub size: u64,
}

impl ActiveSegment {
    /// Starts a new segment whose first record will be `first`.
    pub fn create(
        dir: &Path,
        first: Lsn,
        hook: Option<Arc<dyn DiskHook>>,
    ) -> Result<ActiveSegment, WalError> {
        let path = dir.join(segment_file_name(first));
        // create_new: an existing file of that name holds records we must not overwrite;
        // refusing makes the writer fail closed instead.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err("create segment", &path))?;
        if let Some(h) = &hook {
            h.created(&path);
            h.write(&path, SEGMENT_HEADER_LEN)
                .map_err(io_err("write segment header", &path))?;
        }
        file.write_all(&header(first))
            .map_err(io_err("write segment header", &path))?;
        if hook.is_none() {
            sync_dir(dir)?;
        }
        Ok(ActiveSegment {
            file,
            hook,
            path,
            first,
            next: first,
            size: SEGMENT_HEADER_LEN,
        })
    }

    /// Continues a segment left by a previous run (after recovery validated it).
    pub fn reopen(
        path: PathBuf,
        (first, next, size): (Lsn, Lsn, u64),
        hook: Option<Arc<dyn DiskHook>>,
    ) -> Result<Self, WalError> {
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err("open segment", &path))?;
        Ok(ActiveSegment {
            file,
            hook,
            path,
            first,
            next,
            size,
        })
    }

    pub fn records(&self) -> u64 {
        self.next - self.first
    }

    pub fn append(&mut self, bytes: &[u8], records: u64) -> Result<(), WalError> {
        if let Some(h) = &self.hook {
            h.write(&self.path, bytes.len() as u64)
                .map_err(io_err("write segment", &self.path))?;
        }
        self.file
            .write_all(bytes)
            .map_err(io_err("write segment", &self.path))?;
        self.size += bytes.len() as u64;
        self.next += records;
        Ok(())
    }

    pub fn sync(&self) -> Result<(), WalError> {
        match &self.hook {
            Some(h) => h.sync(&self.path, self.size),
            None => self.file.sync_data(),
        }
        .map_err(io_err("fdatasync segment", &self.path))
    }

    /// A second handle on the segment file, so the `everysec` sync can run without the
    /// writer lock (see `writer::periodic_sync`).
    pub fn sync_handle(&self) -> Result<(File, PathBuf), WalError> {
        let f = self
            .file
            .try_clone()
            .map_err(io_err("dup segment", &self.path))?;
        Ok((f, self.path.clone()))
    }
}

/// A record that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BadRecord {
    pub offset: u64,
    pub reason: String,
    /// Torn: the end of the last segment, with nothing valid after it.
    pub torn: bool,
}

/// What a segment holds.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Decoded records with LSN > `skip_upto`.
    pub events: Vec<Event>,
    /// Valid records in the file (all of them, skipped ones included).
    pub records: u64,
    /// Offset just after the last valid record.
    pub valid_end: u64,
    pub file_len: u64,
    pub bad: Option<BadRecord>,
}

/// Whether any complete, CRC-valid record starts at or after `from`.
fn valid_record_from(buf: &[u8], from: usize) -> bool {
    (from..buf.len()).any(|p| record::plausible_record_at(&buf[p..]))
}

/// Reads and validates a whole segment. Records with LSN <= `skip_upto` (covered by a
/// snapshot) are checked but not decoded into events. `is_last` allows a bad record to be
/// classified as a torn tail.
pub(crate) fn scan_segment(
    path: &Path,
    first: Lsn,
    skip_upto: Lsn,
    is_last: bool,
) -> Result<Scan, WalError> {
    let mut buf = fs::read(path).map_err(io_err("read segment", path))?;
    let mut repairs = 0;
    let mut scan = Scan {
        file_len: buf.len() as u64,
        ..Scan::default()
    };
    let hl = SEGMENT_HEADER_LEN as usize;
    let header_problem = if buf.len() < hl {
        Some(format!(
            "incomplete segment header: {} of {hl} bytes",
            buf.len()
        ))
    } else if buf[..8] != SEGMENT_MAGIC {
        Some("not a stockgate WAL segment (bad magic)".to_owned())
    } else {
        let h = u64::from_le_bytes([
            buf[8], buf[9], buf[10], buf[11], buf[12], buf[13], buf[14], buf[15],
        ]);
        (h != first).then(|| format!("header says first LSN {h}, file name says {first}"))
    };
    if let Some(reason) = header_problem {
        scan.bad = Some(BadRecord {
            offset: 0,
            reason,
            torn: is_last && !valid_record_from(&buf, 1),
        });
        return Ok(scan);
    }
    let mut off = hl;
    let mut lsn = first;
    while off < buf.len() {
        let rest = &buf[off..];
        let res = if lsn > skip_upto {
            decode_record(rest).map(|(ev, used)| (Some(ev), used))
        } else {
            record::frame(rest).map(|(_, used)| (None, used))
        };
        match res {
            Ok((ev, used)) => {
                scan.events.extend(ev);
                off += used;
                lsn += 1;
                scan.records += 1;
            }
            Err(e) => {
                // A record whose CRC holds but whose payload does not decode was written
                // whole: it is never a torn write, wherever it is.
                let framing = !matches!(e, RecordError::Payload(_));
                if framing && repairs < MAX_REPAIRS && repair_flip(path, &mut buf, off, lsn)? {
                    repairs += 1;
                    continue;
                }
                scan.bad = Some(BadRecord {
                    offset: off as u64,
                    reason: e.to_string(),
                    torn: is_last && framing && !valid_record_from(&buf, off + 1),
                });
                break;
            }
        }
    }
    scan.valid_end = off as u64;
    Ok(scan)
}

/// Flipped bits put right in one segment at most, per start: more is not a flipped
/// bit here and there but a failing disk, which recovery refuses.
const MAX_REPAIRS: usize = 16;

/// Puts right the record at `off` of `buf` (segment `path`) if one flipped bit is all
/// that is wrong with it and it then decodes, on disk too (written and synced) so that
/// the next start reads it whole: a bad last record must not pass for a torn write and
/// be cut (see `bit_repair`).
fn repair_flip(path: &Path, buf: &mut [u8], off: usize, lsn: Lsn) -> Result<bool, WalError> {
    let rec = &mut buf[off..];
    let Some(r) = bit_repair::single_bit(rec, 0, record::MAX_PAYLOAD) else {
        return Ok(false);
    };
    r.apply(rec);
    if decode_record(rec).is_err() {
        r.apply(rec);
        return Ok(false);
    }
    let at = (off + r.byte) as u64;
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_err("open segment", path))?;
    f.write_all_at(&rec[r.byte..=r.byte], at)
        .and_then(|()| f.sync_data())
        .map_err(io_err("repair segment", path))?;
    tracing::warn!(
        "WAL {}: record at offset {off} (LSN {lsn}) had bit {} of byte {at} flipped; put right",
        path.display(),
        r.bit
    );
    Ok(true)
}

/// Cuts `path` at `offset` (deletes it when `offset` is 0, since a headerless segment is
/// useless) and makes the change durable.
pub(crate) fn cut(dir: &Path, path: &Path, offset: u64) -> Result<(), WalError> {
    if offset == 0 {
        fs::remove_file(path).map_err(io_err("delete segment", path))?;
    } else {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err("open segment", path))?;
        f.set_len(offset)
            .map_err(io_err("truncate segment", path))?;
        f.sync_all().map_err(io_err("fsync segment", path))?;
    }
    sync_dir(dir)
}

/// Of the segments a snapshot makes redundant (`doomed`, oldest first), those the feed's
/// retention does not keep: the newest are kept while they fit every limit, so what is
/// kept is always one contiguous run ending at the live log (a reader never meets a gap).
pub(crate) fn past_feed_retention<T>(
    doomed: Vec<T>,
    path: impl Fn(&T) -> &Path,
    r: &super::FeedRetention,
) -> Vec<T> {
    if r.keeps_nothing() {
        return doomed;
    }
    let now = std::time::SystemTime::now();
    let mut kept_bytes = 0u64;
    let mut keep = 0usize;
    for p in doomed.iter().rev() {
        let Ok(meta) = fs::metadata(path(p)) else {
            break;
        };
        kept_bytes = kept_bytes.saturating_add(meta.len());
        let too_big = r.max_bytes.is_some_and(|m| kept_bytes > m);
        let too_old = r.max_age.is_some_and(|age| {
            meta.modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|d| d > age)
        });
        if too_big || too_old {
            break;
        }
        keep += 1;
    }
    let mut doomed = doomed;
    doomed.truncate(doomed.len() - keep);
    doomed
}

/// Deletes `path`; a file already gone is not an error.
pub fn remove_if_exists(path: &Path) -> Result<(), WalError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("delete", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_segment_names() {
        assert_eq!(segment_file_name(1), "wal-00000000000000000001.log");
        assert_eq!(parse_segment_name("wal-00000000000000000001.log"), Some(1));
        assert_eq!(
            parse_segment_name(&segment_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_name("wal-1.log"), None);
        assert_eq!(parse_segment_name("wal-0000000000000000000x.log"), None);
        assert_eq!(parse_segment_name("wal-99999999999999999999.log"), None);
        assert_eq!(parse_snapshot_name(&snapshot_file_name(42)), Some(42));
        assert_eq!(
            parse_snapshot_name("snapshot-00000000000000000042.snap.tmp"),
            None
        );
    }
}
