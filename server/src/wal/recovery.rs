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

pub(crate) fn recover(dir: &Path, opts: &WalOptions) -> Result<Resume, WalError> {
    let listing = segment::list_dir(dir)?;
    for t in &listing.temps {
        segment::remove_if_exists(t)?;
    }

    let mut rec = Recovery::default();
    for (lsn, path) in listing.snapshots.iter().rev() {
        match snapshot::read(path, *lsn) {
            Ok(s) => {
                rec.snapshot = Some(s);
                rec.snapshot_lsn = *lsn;
                break;
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
    let snap_lsn = rec.snapshot_lsn;

    let segs = &listing.segments;
    let mut covered: Vec<PathBuf> = Vec::new();
    let mut kept: Vec<Kept> = Vec::new();
    let mut expected: Option<Lsn> = None;
    for (i, (first, path)) in segs.iter().enumerate() {
        let first = *first;
        let is_last = i + 1 == segs.len();
        if !is_last && segs[i + 1].0 <= snap_lsn + 1 {
            covered.push(path.clone());
            continue;
        }
        let gap = match expected {
            _ if first == 0 => Some("segment named LSN 0: LSNs start at 1".to_owned()),
            Some(n) if first != n => Some(format!(
                "segment starts at LSN {first} but the previous one ends before LSN {n}: records are missing"
            )),
            None if first > snap_lsn + 1 => Some(format!(
                "log starts at LSN {first} but the snapshot covers only up to LSN {snap_lsn}: records are missing"
            )),
            _ => None,
        };
        if let Some(reason) = gap {
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
        if let Some(bad) = scan.bad {
            if bad.torn {
                tracing::warn!(
                    "cutting torn WAL tail: {} from offset {} ({} bytes): {}",
                    path.display(),
                    bad.offset,
                    scan.file_len - bad.offset,
                    bad.reason
                );
                segment::cut(dir, path, bad.offset)?;
                rec.truncated_tail = Some(Truncation {
                    file: path.clone(),
                    offset: bad.offset,
                    bytes_dropped: scan.file_len - bad.offset,
                    reason: bad.reason,
                    repaired: false,
                    deleted_segments: Vec::new(),
                });
            } else if opts.repair {
                let dropped_here = scan.file_len - bad.offset;
                rec.truncated_tail = Some(repair_from(
                    dir,
                    segs,
                    i,
                    bad.offset,
                    dropped_here,
                    bad.reason,
                )?);
            } else {
                return Err(WalError::Corrupt {
                    file: path.clone(),
                    offset: bad.offset,
                    reason: bad.reason,
                });
            }
            if bad.offset > 0 {
                kept.push(Kept {
                    first,
                    end,
                    path: path.clone(),
                    size: bad.offset,
                });
            }
            expected = Some(end);
            break;
        }
        kept.push(Kept {
            first,
            end,
            path: path.clone(),
            size: scan.file_len,
        });
        expected = Some(end);
    }

    let log_end = expected.unwrap_or(0);
    rec.last_lsn = snap_lsn.max(log_end.saturating_sub(1));
    // Records between the snapshot and the log's end are all there (checked above); if
    // the log ends before the snapshot (crash after the snapshot, before the records it
    // covers reached the disk), the snapshot alone is the state.
    debug_assert_eq!(rec.last_lsn, snap_lsn + rec.events.len() as u64);
    let next = rec.last_lsn + 1;

    let mut catalog = Catalog::new();
    let mut active = None;
    let n_kept = kept.len();
    for (i, k) in kept.into_iter().enumerate() {
        if i + 1 == n_kept && k.end == next {
            catalog.insert(k.first, None);
            active = Some((k.path, k.first, k.size));
        } else if k.end <= snap_lsn + 1 {
            covered.push(k.path);
        } else {
            catalog.insert(k.first, Some(k.end - 1));
        }
    }
    if !covered.is_empty() {
        for p in &covered {
            segment::remove_if_exists(p)?;
        }
        segment::sync_dir(dir)?;
    }
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
