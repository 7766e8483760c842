//! Which entries of the Raft log keep their records in memory, and where each entry lies
//! in the log's file.
//!
//! An entry is in memory whole from its append until the state machine has applied it
//! and the file holds it durably. Then its records (the bulk of it) are let go: the
//! entry keeps its log id and its batch's LSNs, which is all the log's own questions
//! need (`applied_for`, `log_id_for`), and the records are read back from the file when
//! something asks for them again: a follower that lags more than [`KEEP`] entries behind
//! the applied point, or a rewrite of the file. Without this a member held every record
//! since its last snapshot a second time beside its engine: up to `--snapshot-records`
//! of them, about 150 bytes each, memory the process only ever grew into.
//!
//! Positions are those of the file the queued changes go to. A rewrite starts a new
//! file (a new generation): every entry is in memory whole when its image is built, and
//! none is let go again before the writer reports that generation durable, so a read
//! back never looks for a record in a file it is not in.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use openraft::EntryPayload;

use super::Entry;

/// Applied entries whose records stay in memory behind the applied point: what the
/// leader sends to a follower a little behind without reading the file.
pub(super) const KEEP: u64 = 128;

/// Where one entry's record lies in the current file.
#[derive(Clone, Copy, Debug)]
struct Place {
    at: u64,
    len: u32,
    /// Its records were let go: read them back from `at`.
    released: bool,
}

/// What the writer made durable: the file generation it writes and how far into it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Durable {
    pub gen: u64,
    pub end: u64,
}

/// The places of the entries, and the file the queued changes go to.
#[derive(Default)]
pub(super) struct Held {
    places: BTreeMap<u64, Place>,
    /// The file generation the queued changes go to (one more per rewrite).
    gen: u64,
    /// Where the next queued change lands in that file.
    end: u64,
    /// Entries up to this index have been looked at by [`Held::release`].
    released_upto: u64,
}

impl Held {
    /// The log was replayed from a file whose records end at `end` (generation 0).
    pub fn opened(&mut self, end: u64) {
        self.end = end;
    }

    /// Where `len` bytes queued now land: appended at the end of the current file, or
    /// with `rewrite` as the whole of a new one.
    pub fn queue(&mut self, len: usize, rewrite: bool) -> u64 {
        let len = len as u64;
        if rewrite {
            self.gen += 1;
            self.end = len;
            self.places.clear();
            self.released_upto = 0;
            0
        } else {
            let at = self.end;
            self.end += len;
            at
        }
    }

    /// The generation of the file the queued changes go to.
    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// Entry `index`'s record is `len` bytes at `at` of the current file.
    pub fn placed(&mut self, index: u64, at: u64, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.places.insert(
            index,
            Place {
                at,
                len,
                released: false,
            },
        );
    }

    /// Entries from `from` on are gone (a truncation).
    pub fn cut_from(&mut self, from: u64) {
        self.places.split_off(&from);
        self.released_upto = self.released_upto.min(from.saturating_sub(1));
    }

    /// Entries up to `upto` are gone (a purge).
    pub fn purge_to(&mut self, upto: u64) {
        self.places = self.places.split_off(&upto.saturating_add(1));
    }

    /// Whether entry `index` has let its records go.
    pub fn is_released(&self, index: u64) -> bool {
        self.places.get(&index).is_some_and(|p| p.released)
    }

    /// Lets go of the records of entries applied up to `applied`, but the last [`KEEP`],
    /// as far as the file holds them durably.
    pub fn release(&mut self, entries: &mut BTreeMap<u64, Entry>, applied: u64, d: Durable) {
        if d.gen != self.gen {
            return; // a rewrite is on its way: the positions are not on disk yet
        }
        let upto = applied.saturating_sub(KEEP);
        if upto <= self.released_upto {
            return;
        }
        let from = self.released_upto.saturating_add(1);
        for (index, place) in self.places.range_mut(from..=upto) {
            if place.at + u64::from(place.len) > d.end {
                return; // written, not yet synced: the next call goes on from here
            }
            if let Some(Entry {
                payload: EntryPayload::Normal(b),
                ..
            }) = entries.get_mut(index)
            {
                b.records = bytes::Bytes::new();
                place.released = true;
            }
            self.released_upto = *index;
        }
        self.released_upto = self.released_upto.max(upto);
    }

    /// Entry `index` whole: `e` itself, or with its records read back from the file.
    pub fn whole(&self, e: &Entry, path: &Path, file: &mut Option<File>) -> io::Result<Entry> {
        let Some(place) = self.places.get(&e.log_id.index).filter(|p| p.released) else {
            return Ok(e.clone());
        };
        if file.is_none() {
            *file = Some(File::open(path)?);
        }
        let Some(f) = file.as_ref() else {
            return Err(io::Error::other("raft log file not open"));
        };
        let mut buf = vec![0u8; place.len as usize];
        f.read_exact_at(&mut buf, place.at)?;
        let back = super::log_record::decode_entry(&buf).map_err(|why| {
            io::Error::other(format!(
                "raft log {}: entry {} at byte {} reads back wrong: {why}",
                path.display(),
                e.log_id,
                place.at
            ))
        })?;
        if back.log_id != e.log_id {
            return Err(io::Error::other(format!(
                "raft log {}: byte {} holds entry {}, not {}",
                path.display(),
                place.at,
                back.log_id,
                e.log_id
            )));
        }
        Ok(back)
    }

    /// Reads back the records of every released entry, so that all are whole again (a
    /// rewrite's image is built from them).
    pub fn restore_all(
        &mut self,
        entries: &mut BTreeMap<u64, Entry>,
        path: &Path,
    ) -> io::Result<()> {
        let mut file = None;
        let released: Vec<u64> = self
            .places
            .iter()
            .filter(|(_, p)| p.released)
            .map(|(i, _)| *i)
            .collect();
        for index in released {
            let Some(e) = entries.get(&index) else {
                continue;
            };
            let back = self.whole(e, path, &mut file)?;
            entries.insert(index, back);
            if let Some(p) = self.places.get_mut(&index) {
                p.released = false;
            }
        }
        self.released_upto = 0;
        Ok(())
    }
}
