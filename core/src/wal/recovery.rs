//! Startup: newest valid snapshot, then every record after it.
//!
//! What counts as what:
//! - a bad record at the end of the *last* segment with no valid record anywhere after
//!   it is a torn write (the crash happened mid-`write`, or the tail is zero-filled):
//!   it is cut off and startup continues;
//! - any other bad record, a CRC-valid record that does not decode, a missing range of
//!   LSNs, a bad snapshot: corruption. Startup stops with [`WalError::Corrupt`] naming
//!   the file and offset, unless `repair` is set, which cuts the log at that point.
//!
//! Segments wholly covered by the snapshot are not read (their successor's first LSN
//! proves they end before it) and are deleted.

use std::path::{Path, PathBuf};

use super::segment::{self, scan_segment, Catalog};
use super::snapshot;
use super::{Lsn, Recovery, Truncation, WalError, WalOptions};

/// What the writer needs to continue where the log ends.
pub(crate) struct Resume {
    pub recovery: Recovery,
    /// The last segment, if new records go on in it: (path, first LSN, size).
    pub active: Option<(PathBuf, Lsn, u64)>,
    pub catalog: Catalog,
}

struct Kept {
    first: Lsn,
    /// LSN after its last record.
    end: Lsn,
    path: PathBuf,
    size: u64,
}

/// Segments read so far: those still needed (`kept`), those a snapshot makes redundant
/// (`covered`: first, last, path), and the LSN the next segment must start at.
#[derive(Default)]
struct Scanned {
    kept: Vec<Kept>,
    covered: Vec<(Lsn, Lsn, PathBuf)>,
    expected: Option<Lsn>,
}

pub(crate) fn recover(dir: &Path, opts: &WalOptions) -> Result<Resume, WalError> {
    let listing = segment::list_dir(dir)?;
    for t in &listing.temps {
        segment::remove_if_exists(t)?;
    }
    let mut rec = Recovery::default();
    newest_snapshot(&listing.snapshots, opts, &mut rec)?;
    let snap_lsn = rec.snapshot_lsn;
    let scanned = scan_segments(dir, &listing.segments, opts, &mut rec)?;
    let log_end = scanned.expected.unwrap_or(0);
    rec.last_lsn = snap_lsn.max(log_end.saturating_sub(1));
    // Records between the snapshot and the log's end are all there (checked while
    // scanning); if the log ends before the snapshot (crash after the snapshot, before the
    // records it covers reached the disk), the snapshot alone is the state.
    debug_assert_eq!(rec.last_lsn, snap_lsn + rec.events.len() as u64);
    let (mut catalog, active, covered) = catalog_of(scanned, rec.last_lsn + 1, snap_lsn);
    retire(dir, covered, &mut catalog, opts)?;
    for (lsn, p) in &listing.snapshots {
        if *lsn < snap_lsn {
            segment::remove_if_exists(p)?;
        }
    }
    Ok(Resume {
        recovery: rec,
        active,
        catalog,
    })
}

/// Loads the newest snapshot that reads back; under `repair`, damaged newer ones are set
/// aside (`.snap.corrupt`) rather than stopping the start.
fn newest_snapshot(
    snapshots: &[(Lsn, PathBuf)],
    opts: &WalOptions,
    rec: &mut Recovery,
) -> Result<(), WalError> {
    for (lsn, path) in snapshots.iter().rev() {
        match snapshot::read(path, *lsn) {
            Ok(s) => {
                rec.snapshot = Some(s);
                rec.snapshot_lsn = *lsn;
                return Ok(());
            }
            Err(e @ WalError::Corrupt { .. }) if opts.repair => {
                tracing::warn!("repair: setting aside {e}");
                let aside = path.with_extension("snap.corrupt");
                std::fs::rename(path, &aside)
                    .map_err(super::io_err("rename corrupt snapshot", path))?;
                rec.discarded_snapshots.push(aside);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why a segment starting at `first` does not continue the log, if it does not.
fn gap(expected: Option<Lsn>, first: Lsn, snap_lsn: Lsn) -> Option<String> {
    match expected {
        _ if first == 0 => Some("segment named LSN 0: LSNs start at 1".to_owned()),
        Some(n) if first != n => Some(format!(
            "segment starts at LSN {first} but the previous one ends before LSN {n}: records are missing"
        )),
        None if first > snap_lsn + 1 => Some(format!(
            "log starts at LSN {first} but the snapshot covers only up to LSN {snap_lsn}: records are missing"
        )),
        _ => None,
    }
}

/// Reads every segment after the snapshot into `rec.events`, in order, stopping at the
/// first bad record: a torn tail is cut, anything else is corruption (or, under
/// `repair`, the point the log is cut at).
fn scan_segments(
    dir: &Path,
    segs: &[(Lsn, PathBuf)],
    opts: &WalOptions,
    rec: &mut Recovery,
) -> Result<Scanned, WalError> {
    let snap_lsn = rec.snapshot_lsn;
    let mut out = Scanned::default();
    for (i, (first, path)) in segs.iter().enumerate() {
        let first = *first;
        let is_last = i + 1 == segs.len();
        if !is_last && segs[i + 1].0 <= snap_lsn + 1 {
            out.covered.push((first, segs[i + 1].0 - 1, path.clone()));
            continue;
        }
        if let Some(reason) = gap(out.expected, first, snap_lsn) {
            if !opts.repair {
                return Err(WalError::Corrupt {
                    file: path.clone(),
                    offset: 0,
                    reason,
                });
            }
            rec.truncated_tail = Some(repair_from(dir, segs, i, 0, 0, reason)?);
            break;
        }
        let scan = scan_segment(path, first, snap_lsn, is_last)?;
        rec.events.extend(scan.events);
        let end = first + scan.records;
        let mut size = scan.file_len;
        let bad = scan.bad;
        if let Some(bad) = &bad {
            rec.truncated_tail = Some(bad_record(dir, segs, i, bad, scan.file_len, opts)?);
            size = bad.offset;
        }
        if size > 0 || bad.is_none() {
            out.kept.push(Kept {
                first,
                end,
                path: path.clone(),
                size,
            });
        }
        out.expected = Some(end);
        if bad.is_some() {
            break;
        }
    }
    Ok(out)
}

/// What a bad record in `segs[i]` at `bad.offset` does: a torn tail is cut; anything else
/// is corruption, or under `repair` the point the log is cut at.
fn bad_record(
    dir: &Path,
    segs: &[(Lsn, PathBuf)],
    i: usize,
    bad: &segment::BadRecord,
    file_len: u64,
    opts: &WalOptions,
) -> Result<Truncation, WalError> {
    let path = &segs[i].1;
    if bad.torn {
        tracing::warn!(
            "cutting torn WAL tail: {} from offset {} ({} bytes): {}",
            path.display(),
            bad.offset,
            file_len - bad.offset,
            bad.reason
        );
        segment::cut(dir, path, bad.offset)?;
        return Ok(Truncation {
            file: path.clone(),
            offset: bad.offset,
            bytes_dropped: file_len - bad.offset,
            reason: bad.reason.clone(),
            repaired: false,
            deleted_segments: Vec::new(),
        });
    }
    if opts.repair {
        return repair_from(
            dir,
            segs,
            i,
            bad.offset,
            file_len - bad.offset,
            bad.reason.clone(),
        );
    }
    Err(WalError::Corrupt {
        file: path.clone(),
        offset: bad.offset,
        reason: bad.reason.clone(),
    })
}

/// The catalog of the segments kept, the segment new records go on in (the last one, if
/// it ends where the log does) and every segment the snapshot covers.
#[allow(clippy::type_complexity)]
fn catalog_of(
    scanned: Scanned,
    next: Lsn,
    snap_lsn: Lsn,
) -> (
    Catalog,
    Option<(PathBuf, Lsn, u64)>,
    Vec<(Lsn, Lsn, PathBuf)>,
) {
    let Scanned {
        kept, mut covered, ..
    } = scanned;
    let mut catalog = Catalog::new();
    let mut active = None;
    let n_kept = kept.len();
    for (i, k) in kept.into_iter().enumerate() {
        if i + 1 == n_kept && k.end == next {
            catalog.insert(k.first, None);
            active = Some((k.path, k.first, k.size));
        } else if k.end <= snap_lsn + 1 {
            covered.push((k.first, k.end - 1, k.path));
        } else {
            catalog.insert(k.first, Some(k.end - 1));
        }
    }
    (catalog, active, covered)
}

/// Deletes the covered segments past the feed's retention; the feed keeps the newest of
/// them (not replayed, only read by the feed), so the catalog lists those.
fn retire(
    dir: &Path,
    covered: Vec<(Lsn, Lsn, PathBuf)>,
    catalog: &mut Catalog,
    opts: &WalOptions,
) -> Result<(), WalError> {
    if covered.is_empty() {
        return Ok(());
    }
    let n = covered.len();
    let doomed = segment::past_feed_retention(covered.clone(), |c| &c.2, &opts.feed_retention);
    for (first, last, _) in &covered[doomed.len()..n] {
        catalog.insert(*first, Some(*last));
    }
    for (_, _, p) in &doomed {
        segment::remove_if_exists(p)?;
    }
    if !doomed.is_empty() {
        segment::sync_dir(dir)?;
    }
    Ok(())
}

/// Repair: cut segment `segs[i]` at `offset` and delete every later segment.
fn repair_from(
    dir: &Path,
    segs: &[(Lsn, PathBuf)],
    i: usize,
    offset: u64,
    dropped_here: u64,
    reason: String,
) -> Result<Truncation, WalError> {
    let path = &segs[i].1;
    let mut bytes_dropped = if offset == 0 {
        file_len(path)?
    } else {
        dropped_here
    };
    tracing::warn!(
        "repair: cutting {} at offset {offset} and deleting {} later segment(s): {reason}",
        path.display(),
        segs.len() - i - 1
    );
    segment::cut(dir, path, offset)?;
    let mut deleted_segments = Vec::new();
    for (_, later) in &segs[i + 1..] {
        bytes_dropped += file_len(later)?;
        segment::remove_if_exists(later)?;
        deleted_segments.push(later.clone());
    }
    segment::sync_dir(dir)?;
    Ok(Truncation {
        file: path.clone(),
        offset,
        bytes_dropped,
        reason,
        repaired: true,
        deleted_segments,
    })
}

fn file_len(path: &Path) -> Result<u64, WalError> {
    Ok(std::fs::metadata(path)
        .map_err(super::io_err("stat", path))?
        .len())
}
