//! The members' disks as a power loss sees them. The WAL and the Raft log are written
//! inline through a [`DiskHook`] (`Wal::open_inline_on`, `LogStore::open_inline_on`):
//! every write and sync of a log file passes here first. A sync the hook accepts makes
//! the file's bytes up to that length durable ([`Disk`] keeps that length per file,
//! across the member's processes); a power loss ([`Disk::power_cut`]) cuts every log
//! file back to it, or leaves a seeded part of the unsynced tail, whole, garbled or
//! zero-filled, as a real disk may. The hook also fails a write or a sync when a
//! storage error is armed for it (`ENOSPC`, `EIO`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use stockgate_server::wal::segment::{parse_segment_name, parse_snapshot_name, DiskHook};

use crate::history::History;

/// One member's data dir: the durable length of each log file, whichever of the
/// member's processes synced it.
pub struct Disk {
    id: NodeId,
    dir: PathBuf,
    synced: Mutex<BTreeMap<PathBuf, u64>>,
}

/// Which log a storage error hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Log {
    /// A WAL segment.
    Wal,
    /// The Raft log.
    Raft,
}

/// Which operation fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The next `write` to that log.
    Write,
    /// The next `fdatasync` of that log.
    Sync,
}

/// A storage error waiting for the next matching operation of one member process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Armed {
    /// The log it hits.
    pub log: Log,
    /// The operation.
    pub op: Op,
    /// `ENOSPC` (28) or `EIO` (5).
    pub errno: i32,
}

impl Disk {
    /// The disk of member `id`, whose data dir is `dir` (nothing durable yet).
    pub fn new(id: NodeId, dir: PathBuf) -> Arc<Disk> {
        Arc::new(Disk {
            id,
            dir,
            synced: Mutex::new(BTreeMap::new()),
        })
    }

    /// After a start: recovery may have cut a torn tail or deleted a segment (and synced
    /// that); a file shorter than its durable length is durable as it now is.
    pub fn settle(&self) {
        self.synced
            .lock()
            .retain(|p, len| match std::fs::metadata(p) {
                Ok(m) => {
                    *len = (*len).min(m.len());
                    true
                }
                Err(_) => false,
            });
    }

    /// The log files of the data dir, sorted: the WAL's segments and the Raft log.
    fn log_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.join("wal")) {
            for e in rd.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("wal-") && name.ends_with(".log") {
                    out.push(e.path());
                }
            }
        }
        let raft = self.dir.join("raft").join("log");
        if raft.exists() {
            out.push(raft);
        }
        out.sort();
        out
    }

    /// The power goes out: each log file (only `only`, when given) keeps its durable
    /// length, plus, by the seed, part of what was written after it: kept whole, its last
    /// bytes garbled, or a zero-filled stretch (the size reached the disk, the data did
    /// not). A file never synced may vanish. Every change goes into the history.
    pub fn power_cut(&self, rng: &mut StdRng, only: Option<&Path>, history: &History) {
        let synced = self.synced.lock().clone();
        for path in self.log_files() {
            if only.is_some_and(|o| o != path) {
                continue;
            }
            let Ok(len) = std::fs::metadata(&path).map(|m| m.len()) else {
                continue;
            };
            let durable = synced.get(&path).copied();
            let keep = durable.unwrap_or(0);
            let name = path
                .strip_prefix(&self.dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            if len <= keep {
                continue;
            }
            if durable.is_none() && rng.gen_bool(0.3) {
                let _ = std::fs::remove_file(&path);
                history.note(format!(
                    "n{} power loss: {name} never synced, gone",
                    self.id
                ));
                continue;
            }
            let what = tear(&path, keep, len, rng);
            history.note(format!(
                "n{} power loss: {name} {len} -> {what} (synced {keep})",
                self.id
            ));
        }
    }
}

/// The draw of one flipped bit (`Settings::bit_flips`), shared by both scenarios: which
/// log, whether in its last record, and where (a start must put it right).
#[derive(Clone, Copy, Debug)]
pub struct Flip {
    /// The Raft log, else a WAL segment.
    pub raft_log: bool,
    /// In the file's last whole record (the one a start may take for a torn write).
    pub in_last: bool,
    /// Where: the segment, the byte and the bit.
    pub pick: u64,
}

impl Flip {
    /// Six flips in ten land in the Raft log, half of them in the file's last record.
    pub fn draw(rng: &mut StdRng) -> Flip {
        let raft_log = rng.gen_bool(0.6);
        let in_last = rng.gen_bool(0.5);
        let pick = rng.gen::<u64>();
        Flip {
            raft_log,
            in_last,
            pick,
        }
    }
}

/// The draw of a record damaged beyond one bit (`Settings::damage`), shared by both
/// scenarios: which log, and where (a start must refuse it).
#[derive(Clone, Copy, Debug)]
pub struct Damage {
    /// The Raft log, else a WAL segment.
    pub raft_log: bool,
    /// Where: the segment, the record, the bytes and the bits.
    pub pick: u64,
}

impl Damage {
    /// Half in the Raft log, half in a WAL segment.
    pub fn draw(rng: &mut StdRng) -> Damage {
        let raft_log = rng.gen_bool(0.5);
        let pick = rng.gen::<u64>();
        Damage { raft_log, pick }
    }
}

/// Where a flip landed, to see whether a start put it right: the file, its inode, the
/// byte's offset and what it held before.
#[derive(Clone, Debug)]
pub struct Flipped {
    /// What was flipped, in words.
    pub what: String,
    /// The file.
    pub path: PathBuf,
    /// The file's inode (a rewrite renames another file into place).
    pub inode: u64,
    /// The flipped byte's offset.
    pub at: u64,
    /// The byte before the flip.
    pub was: u8,
    /// A start reads the file: the Raft log, or a WAL segment a snapshot does not
    /// wholly cover (a covered one is not read, so nothing puts the flip right).
    pub read: bool,
}

impl Flipped {
    /// After a start: `None` when the byte holds what it held before the flip (or the
    /// file was replaced or removed since, which says nothing), else what is wrong.
    pub fn left_wrong(&self) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        if !self.read {
            return None;
        }
        let meta = std::fs::metadata(&self.path).ok()?;
        if meta.ino() != self.inode {
            return None;
        }
        let bytes = std::fs::read(&self.path).ok()?;
        match bytes.get(self.at as usize) {
            None => Some(format!("the file was cut to {} bytes", bytes.len())),
            Some(b) if *b != self.was => Some(format!(
                "byte {} still reads {b:#04x}, not {:#04x}",
                self.at, self.was
            )),
            Some(_) => None,
        }
    }
}

impl Disk {
    /// Flips one bit of the Raft log (`raft_log`) or of a WAL segment, on disk: in the
    /// last whole record (`in_last`; of the newest segment) or anywhere in the records
    /// (of a segment drawn by `pick`), at a place drawn by `pick`. Segment headers are
    /// left alone. Says what it flipped; `None` when the file holds no whole record.
    pub fn flip_bit(&self, raft_log: bool, in_last: bool, pick: u64) -> Option<String> {
        self.flip(Flip {
            raft_log,
            in_last,
            pick,
        })
        .map(|f| f.what)
    }

    /// [`Disk::flip_bit`] of a drawn flip, saying where it landed.
    pub fn flip(&self, f: Flip) -> Option<Flipped> {
        use std::os::unix::fs::MetadataExt;
        let Flip {
            raft_log,
            in_last,
            pick,
        } = f;
        let (path, start, header) = self.log_file(raft_log, in_last, pick)?;
        let bytes = std::fs::read(&path).ok()?;
        let inode = std::fs::metadata(&path).ok()?.ino();
        let (last, end) = whole_records(&bytes, start, header)?;
        let (from, span) = if in_last {
            (last, end - last)
        } else {
            (start, end - start)
        };
        let at = from + (pick % span as u64) as usize;
        let bit = ((pick >> 40) % 8) as u8;
        overwrite(&path, at as u64, &[bytes[at] ^ (1 << bit)]).ok()?;
        let name = path.strip_prefix(&self.dir).unwrap_or(&path).display();
        let place = if in_last { "last record" } else { "records" };
        let what = format!("bit {bit} of byte {at} of {name} flipped ({place} {from}..{end})");
        let read = raft_log || !self.covered(&path);
        Some(Flipped {
            what,
            path: path.clone(),
            inode,
            at: at as u64,
            was: bytes[at],
            read,
        })
    }

    /// Whether the WAL's newest snapshot wholly covers segment `path`, as the WAL's
    /// recovery sees it: a later segment starts at most one LSN past the snapshot.
    fn covered(&self, path: &Path) -> bool {
        let Ok(rd) = std::fs::read_dir(self.dir.join("wal")) else {
            return false;
        };
        let names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let snap = names.iter().filter_map(|n| parse_snapshot_name(n)).max();
        let first = |p: &Path| {
            p.file_name()
                .and_then(|n| parse_segment_name(&n.to_string_lossy()))
        };
        let (Some(snap), Some(mine)) = (snap, first(path)) else {
            return false;
        };
        let next = names
            .iter()
            .filter_map(|n| parse_segment_name(n))
            .filter(|f| *f > mine)
            .min();
        next.is_some_and(|n| n <= snap + 1)
    }
}

impl Disk {
    /// The file a disk fault lands in, where its records start and their header's size:
    /// the Raft log, or a WAL segment (the newest with `newest`, else one drawn by `pick`).
    fn log_file(&self, raft_log: bool, newest: bool, pick: u64) -> Option<(PathBuf, usize, usize)> {
        if raft_log {
            return Some((self.dir.join("raft").join("log"), 0, RAFT_HEADER));
        }
        let segs: Vec<PathBuf> = self
            .log_files()
            .into_iter()
            .filter(|p| !p.ends_with("raft/log"))
            .collect();
        let i = if newest {
            segs.len().checked_sub(1)?
        } else {
            (pick % segs.len().max(1) as u64) as usize
        };
        Some((segs.get(i)?.clone(), WAL_SEGMENT_HEADER, WAL_HEADER))
    }

    /// Damages one record before the last of the Raft log (or of a WAL segment, drawn
    /// by `pick`) beyond what one flipped bit is: two bits in different bytes. A
    /// start must refuse such a log; the last record is left alone, since damage there
    /// is a torn write to a start. `None` when the file has no record before its last.
    pub fn damage(&self, raft_log: bool, pick: u64) -> Option<String> {
        self.damage_record(Damage { raft_log, pick })
            .map(|d| d.what)
    }

    /// [`Disk::damage`] of a drawn damage, saying where it landed.
    pub fn damage_record(&self, d: Damage) -> Option<Damaged> {
        let Damage { raft_log, pick } = d;
        let (path, start, header) = self.log_file(raft_log, false, pick)?;
        let bytes = std::fs::read(&path).ok()?;
        let recs = record_spans(&bytes, start, header);
        // Any record but the last.
        let (from, end) =
            *recs.get((pick % recs.len().saturating_sub(1).max(1) as u64) as usize)?;
        if recs.len() < 2 {
            return None;
        }
        let len = end - from;
        let a = from + (pick % len as u64) as usize;
        // Another byte of the same record.
        let b = from + (a - from + 1 + (pick >> 20) as usize % (len - 1)) % len;
        let (bit_a, bit_b) = (((pick >> 40) % 8) as u8, ((pick >> 48) % 8) as u8);
        overwrite(&path, a as u64, &[bytes[a] ^ (1 << bit_a)]).ok()?;
        overwrite(&path, b as u64, &[bytes[b] ^ (1 << bit_b)]).ok()?;
        let name = path.strip_prefix(&self.dir).unwrap_or(&path).display();
        let what = format!(
            "bits {bit_a} of byte {a} and {bit_b} of byte {b} of {name} flipped (record {from}..{end})"
        );
        Some(Damaged {
            what,
            file: name.to_string(),
            from: from as u64,
        })
    }
}

/// Where a damage landed: what a start that refuses it must name.
#[derive(Clone, Debug)]
pub struct Damaged {
    /// What was damaged, in words.
    pub what: String,
    /// The file, within the data dir (`raft/log`, `wal/wal-….log`).
    pub file: String,
    /// Where the damaged record starts in it.
    pub from: u64,
}

/// The Raft log's record header: length, checksum, kind.
const RAFT_HEADER: usize = 9;
/// A WAL record's header: length, checksum.
const WAL_HEADER: usize = 8;
/// A WAL segment's header: magic, first LSN.
const WAL_SEGMENT_HEADER: usize = 16;

/// Where the last whole record of `bytes` starts and where the whole records end,
/// walking the length fields from `start`; `None` when there is none.
fn whole_records(bytes: &[u8], start: usize, header: usize) -> Option<(usize, usize)> {
    let (mut at, mut last) = (start, None);
    while let Some(h) = bytes.get(at..at + header) {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let end = at + header + len;
        if len == 0 || end > bytes.len() {
            break;
        }
        last = Some(at);
        at = end;
    }
    last.map(|l| (l, at))
}

/// Where each whole record of `bytes` starts and ends, walking the length fields from
/// `start`.
fn record_spans(bytes: &[u8], start: usize, header: usize) -> Vec<(usize, usize)> {
    let (mut at, mut spans) = (start, Vec::new());
    while let Some(h) = bytes.get(at..at + header) {
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let end = at + header + len;
        if len == 0 || end > bytes.len() {
            break;
        }
        spans.push((at, end));
        at = end;
    }
    spans
}

/// Cuts `path` (`len` bytes, `keep` of them durable) as a power loss may, and says how.
fn tear(path: &Path, keep: u64, len: u64, rng: &mut StdRng) -> String {
    let roll = rng.gen_range(0..100);
    let extra = rng.gen_range(1..=len - keep);
    let (new_len, how) = match roll {
        0..=49 => (keep, String::new()),
        50..=74 => (keep + extra, " torn".to_owned()),
        75..=89 => {
            let n = rng.gen_range(1..=extra.min(16));
            let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let _ = overwrite(path, keep + extra - n, &junk);
            (keep + extra, format!(" torn, last {n} bytes garbled"))
        }
        _ => {
            let from = rng.gen_range(0..extra);
            let zeros = vec![0u8; (extra - from) as usize];
            let _ = overwrite(path, keep + from, &zeros);
            (keep + extra, format!(" torn, zeros from {}", keep + from))
        }
    };
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(new_len));
    format!("{new_len}{how}")
}

fn overwrite(path: &Path, at: u64, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all_at(bytes, at)
}

/// Whether `path` is the Raft log, or the image a rewrite of it syncs before renaming it
/// into place.
fn is_raft_log(path: &Path) -> bool {
    path.parent().is_some_and(|d| d.ends_with("raft"))
}

/// One member process's view of its disk: the hook its WAL and Raft log write through.
pub struct Hook {
    disk: Arc<Disk>,
    /// Cleared when the process dies: what its close syncs afterwards was never synced.
    live: AtomicBool,
    armed: Mutex<Option<Armed>>,
    /// The file an injected error hit: the member exits (its supervisor restarts it), and
    /// that file may have lost what was not synced.
    failed: Mutex<Option<PathBuf>>,
    /// Set on an injected error: the member must restart (the first scenario's model of
    /// the server's exit with 75; the `RaftNode` scenario runs the server's own rule and
    /// gives none).
    restart: Option<Arc<AtomicBool>>,
    history: History,
    /// With `Settings::lagging_io`, what the Raft log's lags are drawn from.
    lag: Option<Mutex<StdRng>>,
    /// The process ended (any way): its Raft log, when it lags, writes nothing more.
    ended: AtomicBool,
    /// A slow disk: each lag drawn from this range (µs) instead (`slow_syncs`).
    slow: Mutex<Option<(u64, u64)>>,
    /// How many syncs of the Raft log this process made.
    raft_syncs: AtomicU64,
}

impl Hook {
    /// A process's hook on `disk`; an injected error sets `restart`, if given.
    /// With `lag`, the Raft log writes and syncs each change a drawn while after it.
    pub fn new(
        disk: Arc<Disk>,
        restart: Option<Arc<AtomicBool>>,
        history: History,
        lag: Option<StdRng>,
    ) -> Arc<Hook> {
        Arc::new(Hook {
            disk,
            live: AtomicBool::new(true),
            armed: Mutex::new(None),
            failed: Mutex::new(None),
            restart,
            history,
            lag: lag.map(Mutex::new),
            ended: AtomicBool::new(false),
            slow: Mutex::new(None),
            raft_syncs: AtomicU64::new(0),
        })
    }

    /// The process ended: what its Raft log still had queued is never written (a
    /// killed process, or one that re-executes, leaves its writer thread's queue).
    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// The process is gone: nothing it syncs from now on counts.
    pub fn die(&self) {
        self.live.store(false, Ordering::Release);
    }

    /// From now on the Raft log writes and syncs each change `lo..hi` µs after it (a
    /// disk far slower than the network), if it lags at all. `false` when it does not.
    pub fn slow_syncs(&self, lo: u64, hi: u64) -> bool {
        *self.slow.lock() = Some((lo, hi));
        self.lag.is_some()
    }

    /// How many syncs of the Raft log this process made so far.
    pub fn raft_syncs(&self) -> u64 {
        self.raft_syncs.load(Ordering::Acquire)
    }

    /// The next matching operation fails with `a`.
    pub fn arm(&self, a: Armed) {
        *self.armed.lock() = Some(a);
    }

    /// What was armed and has not hit yet hits nothing.
    pub fn disarm(&self) {
        *self.armed.lock() = None;
    }

    /// The file an injected error hit, if one did.
    pub fn failed(&self) -> Option<PathBuf> {
        self.failed.lock().clone()
    }

    fn inject(&self, path: &Path, op: Op) -> io::Result<()> {
        let log = if is_raft_log(path) {
            Log::Raft
        } else {
            Log::Wal
        };
        let mut armed = self.armed.lock();
        let Some(a) = *armed else { return Ok(()) };
        if a.log != log || a.op != op || !self.live.load(Ordering::Acquire) {
            return Ok(());
        }
        *armed = None;
        *self.failed.lock() = Some(path.to_path_buf());
        if let Some(restart) = &self.restart {
            restart.store(true, Ordering::Release);
        }
        let e = io::Error::from_raw_os_error(a.errno);
        let name = path.strip_prefix(&self.disk.dir).unwrap_or(path);
        self.history.note(format!(
            "n{} disk: {op:?} of {} fails: {e}",
            self.disk.id,
            name.display()
        ));
        Err(e)
    }
}

impl DiskHook for Hook {
    fn created(&self, path: &Path) {
        if self.live.load(Ordering::Acquire) {
            self.disk.synced.lock().insert(path.to_path_buf(), 0);
        }
    }

    fn write(&self, path: &Path, _len: u64) -> io::Result<()> {
        if self.lag.is_some() && self.ended.load(Ordering::Acquire) && is_raft_log(path) {
            return Err(io::Error::other("the process is gone"));
        }
        self.inject(path, Op::Write)
    }

    fn lags(&self) -> bool {
        self.lag.is_some()
    }

    /// Mostly what a fast disk's `fdatasync` takes, one time in ten a slow one's.
    fn sync_lag(&self) -> Duration {
        let Some(rng) = &self.lag else {
            return Duration::ZERO;
        };
        let mut rng = rng.lock();
        if let Some((lo, hi)) = *self.slow.lock() {
            return Duration::from_micros(rng.gen_range(lo..hi));
        }
        let us = if rng.gen_range(0..10) == 0 {
            rng.gen_range(2_000..30_000)
        } else {
            rng.gen_range(200..2_000)
        };
        Duration::from_micros(us)
    }

    fn sync(&self, path: &Path, len: u64) -> io::Result<()> {
        self.inject(path, Op::Sync)?;
        if self.live.load(Ordering::Acquire) {
            self.disk.synced.lock().insert(path.to_path_buf(), len);
            if is_raft_log(path) {
                self.raft_syncs.fetch_add(1, Ordering::AcqRel);
            }
        }
        Ok(())
    }

    fn renamed(&self, from: &Path, to: &Path) {
        let mut synced = self.disk.synced.lock();
        let len = synced.remove(from).unwrap_or(0);
        synced.insert(to.to_path_buf(), len);
    }
}
