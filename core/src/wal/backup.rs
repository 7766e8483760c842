//! A consistent copy of a running log: the state after one LSN, as a data dir another
//! server can start on.
//!
//! The copy is the newest snapshot at or before that LSN plus every segment still on disk,
//! the one holding the LSN cut right after its record. Closed segments and snapshot files
//! never change once written, and the active segment only grows, so copying them while the
//! writer appends is safe; the only thing that could break the copy is a snapshot deleting
//! a segment under it, which the caller excludes (`WalDurability` holds its save lock).
//! Records of other modules (consumer groups) travel in the segments, so the copy holds
//! everything a restart of the source at that LSN would rebuild.
//!
//! The copy is written under a temporary name beside the target, fsynced, then renamed to
//! the target: a failed backup leaves at most that temporary directory (named
//! `.<target>.backup-tmp-<pid>`), never a directory under the target's name.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::reader::{ReadError, Visit};
use super::segment::{self, segment_file_name};
use super::{io_err, Lsn, Wal, WalError};

/// Why a backup was not written; nothing under the target's name exists afterwards.
#[derive(Debug, Error)]
pub enum BackupError {
    /// The target must be an absolute path: a relative one would depend on the server's
    /// working directory, which the client does not know.
    #[error("the backup target '{}' is not an absolute path", .0.display())]
    NotAbsolute(PathBuf),
    /// The target already holds files (or is not a directory): a backup never mixes with
    /// or overwrites other files.
    #[error("the backup target '{}' exists and is not an empty directory", .0.display())]
    NotEmpty(PathBuf),
    /// This server cannot take a backup (the message says why and what to do instead).
    #[error("{0}")]
    Unsupported(&'static str),
    /// Writing the copy or reading the log failed.
    #[error(transparent)]
    Wal(#[from] WalError),
}

/// What a backup wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupWritten {
    /// The data dir written.
    pub dir: PathBuf,
    /// The copy holds the state after the record at this LSN, exactly.
    pub lsn: Lsn,
    /// The LSN the copied snapshot covers (0: none, the copy is all log).
    pub snapshot_lsn: Lsn,
    /// Segment files copied.
    pub segments: usize,
    /// Bytes copied in all.
    pub bytes: u64,
}

impl Wal {
    /// Writes a data dir holding the state after the last record handed out when it is
    /// called into `target` (absent or an empty directory), with `extra` files of the data
    /// dir (the key fingerprint) copied beside `wal/` when they exist. Blocking file I/O.
    /// The caller must keep snapshots from being written meanwhile (see the module doc).
    pub fn backup_into(
        &self,
        target: &Path,
        extra: &[PathBuf],
    ) -> Result<BackupWritten, BackupError> {
        if !target.is_absolute() {
            return Err(BackupError::NotAbsolute(target.to_path_buf()));
        }
        let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
            return Err(BackupError::NotAbsolute(target.to_path_buf()));
        };
        match fs::read_dir(target) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(BackupError::NotEmpty(target.to_path_buf()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                return Err(BackupError::NotEmpty(target.to_path_buf()))
            }
            Err(e) => return Err(io_err("read backup target", target)(e).into()),
        }
        let upto = self.last_lsn();
        if upto > 0 {
            // Every record up to `upto` must be in its file before it is copied.
            self.wait_durable_blocking(upto)?;
        }
        let tmp = parent.join(format!(
            ".{}.backup-tmp-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&tmp);
        let written = self.copy_into(&tmp, upto, extra).and_then(|mut w| {
            fs::rename(&tmp, target).map_err(io_err("rename backup into place", target))?;
            segment::sync_dir(parent)?;
            w.dir = target.to_path_buf();
            Ok(w)
        });
        if written.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        Ok(written?)
    }

    /// The copy itself, into `dir` (created here).
    fn copy_into(
        &self,
        dir: &Path,
        upto: Lsn,
        extra: &[PathBuf],
    ) -> Result<BackupWritten, WalError> {
        let wal_dir = dir.join("wal");
        fs::create_dir_all(&wal_dir).map_err(io_err("create backup directory", &wal_dir))?;
        let mut bytes = 0;
        let snapshot = segment::list_dir(self.dir())?
            .snapshots
            .into_iter()
            .rfind(|(lsn, _)| *lsn <= upto);
        let snapshot_lsn = snapshot.as_ref().map_or(0, |s| s.0);
        if let Some((lsn, path)) = &snapshot {
            bytes += copy_file(path, &wal_dir.join(segment::snapshot_file_name(*lsn)), None)?;
        }
        // Where the record after `upto` starts: the cut of the segment holding `upto`.
        let mut cut = None;
        if upto > 0 && upto > snapshot_lsn {
            match self.read_records(upto, upto, None, &mut |_, _| Visit::Stop) {
                Ok(pos) => cut = pos,
                Err(ReadError::Wal(e)) => return Err(e),
                Err(ReadError::Trimmed { requested, first }) => {
                    return Err(WalError::Corrupt {
                        file: self.dir().to_path_buf(),
                        offset: 0,
                        reason: format!(
                            "LSN {requested} left the log during a backup (it starts at {first})"
                        ),
                    })
                }
            }
        }
        let mut segments = 0;
        for (first, last) in self.catalog_snapshot() {
            if first > upto {
                continue;
            }
            let name = segment_file_name(first);
            let src = self.dir().join(&name);
            let limit = match cut {
                Some(pos) if pos.segment == first => Some(pos.offset),
                _ if last.is_some_and(|l| l <= upto) => None,
                // A segment after the snapshot with nothing up to `upto` in it (only an
                // empty segment opened by a roll can be here): nothing to copy.
                _ => continue,
            };
            bytes += copy_file(&src, &wal_dir.join(&name), limit)?;
            segments += 1;
        }
        for path in extra {
            let Some(file_name) = path.file_name() else {
                continue;
            };
            if path.exists() {
                bytes += copy_file(path, &dir.join(file_name), None)?;
            }
        }
        segment::sync_dir(&wal_dir)?;
        segment::sync_dir(dir)?;
        Ok(BackupWritten {
            dir: dir.to_path_buf(),
            lsn: upto,
            snapshot_lsn,
            segments,
            bytes,
        })
    }
}

/// Copies `src` (its first `limit` bytes, or all) to the new file `dst` and fsyncs it.
fn copy_file(src: &Path, dst: &Path, limit: Option<u64>) -> Result<u64, WalError> {
    let input = File::open(src).map_err(io_err("open for backup", src))?;
    let mut out = File::create(dst).map_err(io_err("create backup file", dst))?;
    let n = match limit {
        Some(l) => io::copy(&mut input.take(l), &mut out),
        None => io::copy(&mut &input, &mut out),
    }
    .map_err(io_err("copy into backup file", dst))?;
    if limit.is_some_and(|l| l != n) {
        return Err(WalError::Corrupt {
            file: src.to_path_buf(),
            offset: n,
            reason: format!("segment shorter than the records it holds ({n} bytes copied)"),
        });
    }
    out.sync_all().map_err(io_err("fsync backup file", dst))?;
    Ok(n)
}
