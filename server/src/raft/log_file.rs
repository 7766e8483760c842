//! The Raft log's file, written ahead with zeros.
//!
//! Every append is synced before openraft may count it, so each batch costs one
//! `fdatasync`. When an append grows the file, that sync must also write the inode (its
//! size changed): a second, dependent disk write on every batch. So the file is grown
//! [`GROW`] bytes at a time with zeros, synced once, and records are written over the
//! zeros at the log's end: a batch's sync then writes the data alone. Replay
//! (`log_store::replay`) takes zeros after the last good record for the end of the log.
//!
//! Under the simulation's disk model (a `DiskHook`, which tracks files by length) the
//! file is not grown ahead: it stands for the file exactly as appended.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::wal::segment::DiskHook;

/// How far ahead of the log's end the file is written with zeros.
pub(super) const GROW: u64 = 4 << 20;

/// The open log file: where the log ends, and how far the file is written.
pub(super) struct LogFile {
    file: File,
    /// Bytes of records: where the next append goes.
    end: u64,
    /// The file's length: `end` plus the zeros written ahead.
    len: u64,
    hook: Option<Arc<dyn DiskHook>>,
}

impl LogFile {
    /// `file` (opened for reading and writing) holds records up to `end`, then zeros up
    /// to `len`.
    pub(super) fn new(file: File, end: u64, len: u64, hook: Option<Arc<dyn DiskHook>>) -> Self {
        debug_assert!(end <= len);
        LogFile {
            file,
            end,
            len,
            hook,
        }
    }

    /// Where the records end: the next append goes there.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    /// Writes `bytes` at the log's end, growing the file first when they do not fit.
    pub(super) fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let n = bytes.len() as u64;
        if let Some(h) = &self.hook {
            h.write(path, n)?;
        } else if self.end + n > self.len {
            self.grow(self.end + n + GROW)?;
        }
        self.file.write_all_at(bytes, self.end)?;
        self.end += n;
        self.len = self.len.max(self.end);
        Ok(())
    }

    /// Writes zeros from the file's length up to `to`; the batch's sync makes them
    /// durable with the new length.
    fn grow(&mut self, to: u64) -> io::Result<()> {
        const CHUNK: usize = 256 << 10;
        let zeros = vec![0u8; CHUNK];
        while self.len < to {
            let n = (to - self.len).min(CHUNK as u64) as usize;
            self.file.write_all_at(&zeros[..n], self.len)?;
            self.len += n as u64;
        }
        Ok(())
    }

    /// `fdatasync`, or with the simulation's disk model its stand-in.
    pub(super) fn sync(&self, path: &Path) -> io::Result<()> {
        match &self.hook {
            Some(h) => h.sync(path, self.end),
            None => self.file.sync_data(),
        }
    }

    /// Replaces the file at `path` with `image` (synced, renamed, directory synced) and
    /// appends after it from then on. Under the simulation's disk model the image's sync
    /// is the hook's (a failed one leaves the old file in place, as a failed
    /// `fdatasync` of the temporary file does), and once renamed it is as durable as
    /// that sync made it.
    pub(super) fn rewrite(&mut self, path: &Path, image: &[u8]) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        let hook = self.hook.as_deref();
        if let Some(h) = hook {
            h.write(path, image.len() as u64)?;
        }
        {
            let mut f = File::create(&tmp)?;
            f.write_all(image)?;
            match hook {
                Some(h) => h.sync(&tmp, image.len() as u64)?,
                None => f.sync_data()?,
            }
        }
        std::fs::rename(&tmp, path)?;
        match hook {
            Some(h) => h.renamed(&tmp, path),
            None => {
                if let Some(dir) = path.parent() {
                    File::open(dir)?.sync_all()?;
                }
            }
        }
        self.file = OpenOptions::new().read(true).write(true).open(path)?;
        self.end = image.len() as u64;
        self.len = self.end;
        Ok(())
    }
}

/// Whether every byte of `bytes` from `from` on is zero: space written ahead of the log,
/// never a record (no record has an empty body).
pub(super) fn blank_from(bytes: &[u8], from: usize) -> bool {
    bytes
        .get(from..)
        .is_none_or(|rest| rest.iter().all(|&b| b == 0))
}
