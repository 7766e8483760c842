//! The order feed: the write-ahead log served as Redis-Streams-compatible streams.
//!
//! Depends on the WAL (to read records) and the engine's event types (to describe them);
//! neither knows it exists. Streams (see [`entry`]): `stockgate:events` (every record)
//! and `{<sku>}:events` (one sale's records). Entry ids are `<lsn>-0`, so an id is a log
//! position and ids are strictly increasing in log order.
//!
//! Only acknowledged records are readable: every read stops at [`Feed::readable_lsn`],
//! the durable LSN of the WAL (what the server acknowledges under the fsync policy:
//! written under `everysec`/`no`, written and fdatasync'd under `always`). A reply the
//! server has not sent yet can therefore never be seen on the feed first. A Raft group
//! member's WAL holds committed records only, so nothing a failover can lose is either: a
//! consumer's position never runs ahead of the log of the member that takes over.
//!
//! Reads are bounded: at most [`FeedLimits::max_count`] entries per stream and
//! [`FeedLimits::scan_budget`] records examined per call (a sale's stream is the
//! all-events stream filtered, so a sparse sale costs a scan).

pub mod entry;
pub mod groups;
pub mod id;
pub mod retention;

use std::collections::VecDeque;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use thiserror::Error;

use crate::engine::event::Lsn;
use crate::engine::event::{Event, EventRef};
use crate::engine::ident;
use crate::wal::reader::{ReadError, ReadPos, Visit};
use crate::wal::record::{decode_record, encode_record};
use crate::wal::{io_err, segment, Wal, WalError};
pub use entry::{Entry, ALL_EVENTS, SALE_SUFFIX};

/// Why a feed or consumer-group command failed; each becomes one RESP error (see
/// [`FeedError::code`]).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FeedError {
    /// A stream id that does not parse (Redis's own message, so clients recognise it).
    #[error("Invalid stream ID specified as stream command argument")]
    InvalidId,
    /// A key that is neither the all-events stream nor a sale's stream.
    #[error("unknown stream '{0}': the streams are '{ALL_EVENTS}' and '{{<sku>}}{SALE_SUFFIX}'")]
    UnknownStream(String),
    /// The position was deleted from the log: the consumer must resynchronise from the
    /// ledger (its orders are there), then continue from `first`.
    #[error("feed position {requested}-0 was trimmed from the log (it now starts at {first}-0); resynchronise from the ledger, then read from there")]
    Trimmed {
        /// The position asked for.
        requested: Lsn,
        /// The oldest position the log still holds.
        first: Lsn,
    },
    /// A sale's stream is a filtered scan: this call examined its budget of records
    /// without finding one, so it says how far it got instead of answering "nothing".
    #[error(
        "feed scan limit: no entry of '{stream}' from {from}-0 to {to}-0; continue after {to}-0"
    )]
    ScanLimit {
        /// The stream scanned.
        stream: String,
        /// The first LSN examined.
        from: Lsn,
        /// The last LSN examined; the next read continues after it.
        to: Lsn,
    },
    /// Already [`FeedLimits::max_blocked`] clients wait in a blocking read.
    #[error("too many clients blocked on the feed (max {0})")]
    TooManyBlocked(usize),
    /// This server runs without a WAL, so there is no log to serve.
    #[error("the order feed needs the write-ahead log (this server has no durability)")]
    NoLog,
    /// Reading the log failed (the message says why).
    #[error("feed read failed: {0}")]
    Log(String),
    // Consumer groups. The NOGROUP/BUSYGROUP texts are Redis's, code included (see
    // `code`), so clients that match on them behave as with Redis.
    /// `XREADGROUP` named a group that does not exist.
    #[error("NOGROUP No such key '{stream}' or consumer group '{group}' in XREADGROUP with GROUP option")]
    NoGroupRead {
        /// The stream named.
        stream: String,
        /// The group named.
        group: String,
    },
    /// `XACK`, `XPENDING`, `XCLAIM` or `XAUTOCLAIM` named a group that does not exist.
    #[error("NOGROUP No such key '{stream}' or consumer group '{group}'")]
    NoGroup {
        /// The stream named.
        stream: String,
        /// The group named.
        group: String,
    },
    /// `XGROUP` or `XINFO` named a group that does not exist (Redis words it differently
    /// there).
    #[error("NOGROUP No such consumer group '{group}' for key name '{stream}'")]
    NoGroupForKey {
        /// The stream named.
        stream: String,
        /// The group named.
        group: String,
    },
    /// A blocked `XREADGROUP`'s group was destroyed while it waited.
    #[error("NOGROUP the consumer group this client was blocked on no longer exists")]
    GroupGone,
    /// `XGROUP CREATE` for a group that already exists.
    #[error("BUSYGROUP Consumer Group name already exists")]
    BusyGroup,
    /// A group or consumer name that is empty, too long or not UTF-8.
    #[error("invalid {0}")]
    BadName(String),
    /// Creating the group or consumer would pass [`GroupLimits`](groups::GroupLimits).
    #[error("{0}")]
    GroupLimit(String),
    /// The group holds its bound of pending entries: a `>` read delivers nothing more
    /// until some are acknowledged (or claimed and acknowledged).
    #[error("consumer group '{group}' has {max} pending entries, its limit: XACK (or XAUTOCLAIM and XACK) some before reading new ones")]
    PendingFull {
        /// The group.
        group: String,
        /// Its bound of pending entries
        /// ([`GroupLimits::max_pending`](groups::GroupLimits::max_pending)).
        max: usize,
    },
}

impl FeedError {
    /// The RESP error code: Redis's own for the group errors, `ERR` for the others.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            FeedError::NoGroupRead { .. }
            | FeedError::NoGroup { .. }
            | FeedError::NoGroupForKey { .. }
            | FeedError::GroupGone
            | FeedError::BusyGroup => None,
            _ => Some("ERR"),
        }
    }
}

/// A stream name, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stream {
    /// `stockgate:events`: every order event of every sale.
    All,
    /// `{<sku>}:events`: the events of one sale.
    Sale(String),
}

impl Stream {
    /// Parses a stream key; anything but the two stream forms is [`FeedError::UnknownStream`].
    pub fn parse(key: &[u8]) -> Result<Stream, FeedError> {
        if key == ALL_EVENTS.as_bytes() {
            return Ok(Stream::All);
        }
        let unknown =
            || FeedError::UnknownStream(String::from_utf8_lossy(key).chars().take(128).collect());
        let sku = key
            .strip_prefix(b"{")
            .and_then(|r| r.strip_suffix(SALE_SUFFIX.as_bytes()))
            .and_then(|r| r.strip_suffix(b"}"))
            .ok_or_else(unknown)?;
        if !ident::valid_sku(sku) {
            return Err(unknown());
        }
        // valid_sku admits only ASCII.
        Ok(Stream::Sale(String::from_utf8_lossy(sku).into_owned()))
    }

    /// The stream's key, as clients name it.
    pub fn name(&self) -> String {
        match self {
            Stream::All => ALL_EVENTS.to_owned(),
            Stream::Sale(s) => format!("{{{s}}}{SALE_SUFFIX}"),
        }
    }

    fn matches(&self, ev: &crate::engine::event::Event) -> bool {
        match self {
            Stream::All => entry::is_entry(ev),
            Stream::Sale(s) => entry::sku_of(ev) == Some(s.as_str()),
        }
    }
}

/// Bounds on feed reads, so one call costs a bounded amount of memory and time.
#[derive(Clone, Copy, Debug)]
pub struct FeedLimits {
    /// Entries per stream when XREAD/XRANGE give no COUNT.
    pub default_count: usize,
    /// COUNT is capped here: one reply stays a few MiB at most.
    pub max_count: usize,
    /// Records one call may examine (decode and filter).
    pub scan_budget: u64,
    /// Longest BLOCK; `BLOCK 0` ("forever") waits this long and answers nil, which
    /// consumers loop on anyway.
    pub max_block_ms: u64,
    /// Clients blocked in XREAD at once; more are refused.
    pub max_blocked: usize,
}

impl Default for FeedLimits {
    fn default() -> Self {
        FeedLimits {
            default_count: 1000,
            max_count: 10_000,
            scan_budget: 200_000,
            max_block_ms: 60_000,
            max_blocked: 1024,
        }
    }
}

/// What one scan of a stream found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The entries found, in log order.
    pub entries: Vec<Entry>,
    /// The first LSN not examined: a continuation starts here.
    pub next: Lsn,
    /// Stopped because of the scan budget (more of the range is left).
    pub budget_exhausted: bool,
}

/// Writes the consumer groups' state `records` as `groups-<upto>.state` in the WAL
/// directory `dir` (see [`Feed::write_state_file`]); older state files but the previous
/// one are removed.
pub fn write_state_records(
    dir: &std::path::Path,
    upto: Lsn,
    records: Vec<groups::GroupRecord>,
) -> Result<(), WalError> {
    write_state_file_with(dir, upto, records, Vec::new())
}

/// [`write_state_records`], followed by `extra` opaque records of other modules that
/// keep their state in the log (the slot map's changes, `cluster::slots`).
pub fn write_state_file_with(
    dir: &std::path::Path,
    upto: Lsn,
    records: Vec<groups::GroupRecord>,
    extra: Vec<(u8, Vec<u8>)>,
) -> Result<(), WalError> {
    let dir = dir.to_path_buf();
    let path = dir.join(state_file_name(upto));
    let mut buf = Vec::new();
    for (kind, body) in records.iter().map(|r| r.encode()).chain(extra) {
        // Bounded (see `groups::GroupLimits`), so this cannot fail in practice.
        if let Err(e) = encode_record(EventRef::Opaque { kind, body: &body }, &mut buf) {
            return Err(WalError::Corrupt {
                file: path,
                offset: 0,
                reason: format!("consumer-group state not encodable: {e}"),
            });
        }
    }
    let tmp = dir.join(format!("{}.tmp", state_file_name(upto)));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, &buf)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(io_err("write consumer-group state", &path))?;
    segment::sync_dir(&dir)?;
    let mut older: Vec<(Lsn, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .map_err(io_err("list", &dir))?
        .filter_map(|e| {
            let e = e.ok()?;
            let lsn = parse_state_file_name(e.file_name().to_str()?)?;
            (lsn < upto).then(|| (lsn, e.path()))
        })
        .collect();
    older.sort();
    // The newest older one belongs to the snapshot still on disk until this one is.
    older.pop();
    for (_, p) in older {
        segment::remove_if_exists(&p)?;
    }
    Ok(())
}

/// The consumer groups' state file of the snapshot at `lsn`.
pub fn state_file_name(lsn: Lsn) -> String {
    format!("groups-{lsn:020}.state")
}

fn parse_state_file_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_prefix("groups-")?.strip_suffix(".state")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Scan budgets a snapshot's checkpoint may spend per idle group (see
/// [`Feed::checkpoint_groups`]).
const CHECKPOINT_SCANS: usize = 10;

/// Hints kept of where reads ended, so a consumer reading on from its last id does not
/// rescan the segment from its start.
const HINTS: usize = 256;

/// The order feed: serves the WAL as streams (`XREAD`, `XRANGE`, consumer groups) and bounds how
/// many clients may block on it.
pub struct Feed {
    wal: Arc<Wal>,
    /// Consumer groups over this feed's streams, their state in the same log.
    pub groups: groups::Groups,
    hints: Mutex<VecDeque<ReadPos>>,
    blocked: AtomicUsize,
    /// The bounds reads are held to.
    pub limits: FeedLimits,
}

/// Held while a client is blocked on the feed; counts towards `max_blocked`.
pub struct BlockSlot(Arc<Feed>);

impl Drop for BlockSlot {
    fn drop(&mut self) {
        self.0.blocked.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Feed {
    /// A feed over `wal` whose consumer groups log straight to it and keep time by
    /// `clock` (the engine's).
    pub fn new(wal: Arc<Wal>, limits: FeedLimits, clock: Arc<dyn crate::engine::Clock>) -> Feed {
        Feed::with_group_sink(wal.clone(), wal, limits, clock)
    }

    /// A feed whose consumer groups log their changes to `sink` rather than straight to
    /// the WAL (a Raft group member: they travel in the leader's batches like the
    /// engine's records).
    pub fn with_group_sink(
        wal: Arc<Wal>,
        sink: Arc<dyn crate::engine::EventSink>,
        limits: FeedLimits,
        clock: Arc<dyn crate::engine::Clock>,
    ) -> Feed {
        Feed {
            groups: groups::Groups::new(sink, groups::GroupLimits::default(), clock),
            wal,
            hints: Mutex::new(VecDeque::with_capacity(HINTS)),
            blocked: AtomicUsize::new(0),
            limits,
        }
    }

    /// The WAL's durable LSN (INFO shows it beside the readable one).
    pub fn durable_lsn(&self) -> Lsn {
        self.wal.durable_lsn()
    }

    /// The last readable LSN: everything up to it is durable.
    pub fn readable_lsn(&self) -> Lsn {
        self.wal.durable_lsn()
    }

    /// The last LSN handed out (durable or not): what a reply that reports group state
    /// waits for, as every other reply that reports state does.
    pub fn last_lsn(&self) -> Lsn {
        self.wal.last_lsn()
    }

    /// Where `XGROUP CREATE|SETID … $` puts a group's last-delivered id: after every
    /// record made so far, even those not readable yet (in flight on a Raft leader, not
    /// yet durable on a single node), so the group gets what is made after the command,
    /// as Redis's `$` does. Not the readable end: a Raft follower that has not applied
    /// the creation yet may meanwhile let a snapshot cover the leader's records in flight,
    /// and a group starting before them would be born trimmed there. (A record another
    /// connection logs between this call and the group's own record still may be.)
    pub fn group_end(&self) -> Lsn {
        self.groups.last_lsn()
    }

    /// The oldest LSN still on disk to read (older records were trimmed).
    pub fn first_lsn(&self) -> Lsn {
        self.wal.first_readable_lsn()
    }

    /// How many clients are blocked in a feed read right now.
    pub fn blocked_clients(&self) -> usize {
        self.blocked.load(Ordering::Relaxed)
    }

    /// Entries one read returns: the `COUNT` asked (0 or none: [`FeedLimits::default_count`]),
    /// capped at [`FeedLimits::max_count`].
    pub fn count(&self, requested: Option<u64>) -> usize {
        match requested {
            None | Some(0) => self.limits.default_count,
            Some(n) => (n.min(self.limits.max_count as u64)) as usize,
        }
    }

    /// Takes a blocking-read slot, or [`FeedError::TooManyBlocked`] when all are taken; the slot
    /// frees itself when dropped.
    pub fn try_block(self: &Arc<Self>) -> Result<BlockSlot, FeedError> {
        let n = self.blocked.fetch_add(1, Ordering::AcqRel);
        let slot = BlockSlot(self.clone());
        if n >= self.limits.max_blocked {
            return Err(FeedError::TooManyBlocked(self.limits.max_blocked));
        }
        Ok(slot)
    }

    /// When a `BLOCK ms` read gives up: `BLOCK 0` ("forever") and anything longer wait
    /// [`FeedLimits::max_block_ms`].
    pub fn block_deadline(&self, block_ms: u64) -> tokio::time::Instant {
        let max = self.limits.max_block_ms;
        let ms = if block_ms == 0 {
            max
        } else {
            block_ms.min(max)
        };
        tokio::time::Instant::now() + std::time::Duration::from_millis(ms)
    }

    /// A blocked reader's wait: the new readable LSN once records after `seen` are
    /// readable; `None` when `deadline` passes first or the log stopped (failed or
    /// closed: nothing new will come).
    pub async fn wait_new(&self, seen: Lsn, deadline: tokio::time::Instant) -> Option<Lsn> {
        tokio::time::timeout_at(deadline, self.wait_past(seen))
            .await
            .ok()?;
        let now = self.readable_lsn();
        (now > seen).then_some(now)
    }

    /// Resolves when records after `after` are readable (or the log stopped). Callers
    /// bound it with their BLOCK timeout.
    pub async fn wait_past(&self, after: Lsn) {
        if self.wal.durable_lsn() <= after {
            // Returns when the log stopped as well: there will be no new records.
            self.wal.wait_durable_past(after).await;
        }
    }

    fn hint_for(&self, from: Lsn) -> Option<ReadPos> {
        let h = self.hints.lock();
        h.iter()
            .filter(|p| p.lsn <= from)
            .max_by_key(|p| p.lsn)
            .copied()
    }

    fn remember(&self, pos: ReadPos) {
        let mut h = self.hints.lock();
        if h.iter().any(|p| *p == pos) {
            return;
        }
        if h.len() >= HINTS {
            h.pop_front();
        }
        h.push_back(pos);
    }

    /// Entries of `stream` with LSN in `from..=to` (capped at the durable LSN), oldest
    /// first: the first `count` of them, or with `newest` the last `count`.
    pub fn scan(
        &self,
        stream: &Stream,
        from: Lsn,
        to: Lsn,
        count: usize,
        newest: bool,
    ) -> Result<Scan, FeedError> {
        let durable = self.readable_lsn();
        let to = to.min(durable);
        let mut from = from.max(1);
        let mut scan = Scan {
            next: from,
            ..Scan::default()
        };
        if from > to || count == 0 {
            return Ok(scan);
        }
        let budget = self.limits.scan_budget.max(1);
        let mut skipped = false;
        if newest && to - from >= budget {
            // Newest first: examine the budget's worth of records just below `to`.
            from = to - budget + 1;
            skipped = true;
        }
        let mut examined = 0u64;
        let mut ring: VecDeque<Entry> = VecDeque::new();
        let mut last_seen = from.saturating_sub(1);
        let res = self
            .wal
            .read_records(from, to, self.hint_for(from), &mut |lsn, ev| {
                examined += 1;
                last_seen = lsn;
                if stream.matches(&ev) {
                    ring.push_back(entry::entry(lsn, &ev));
                    if ring.len() > count {
                        if newest {
                            ring.pop_front();
                        } else {
                            ring.pop_back();
                            return Visit::Stop;
                        }
                    }
                    if !newest && ring.len() == count {
                        return Visit::Stop;
                    }
                }
                if examined >= budget {
                    return Visit::Stop;
                }
                Visit::More
            });
        match res {
            Ok(Some(pos)) => self.remember(pos),
            Ok(None) => {}
            Err(ReadError::Trimmed { requested, first }) => {
                return Err(FeedError::Trimmed { requested, first })
            }
            Err(ReadError::Wal(e)) => return Err(FeedError::Log(e.to_string())),
        }
        scan.next = last_seen + 1;
        scan.budget_exhausted =
            ring.len() < count && ((examined >= budget && last_seen < to) || skipped);
        scan.entries = ring.into();
        Ok(scan)
    }

    /// XREAD of one stream: up to `count` entries after `after`. A sale's stream that
    /// finds nothing within the scan budget answers [`FeedError::ScanLimit`].
    pub fn read_after(&self, stream: &Stream, after: Lsn, count: usize) -> Result<Scan, FeedError> {
        let s = self.scan(stream, after.saturating_add(1), Lsn::MAX, count, false)?;
        if s.entries.is_empty() && s.budget_exhausted {
            return Err(FeedError::ScanLimit {
                stream: stream.name(),
                from: after.saturating_add(1),
                to: s.next - 1,
            });
        }
        Ok(s)
    }

    /// Logs a checkpoint of every consumer group (see `groups`), first moving each
    /// group's scan position past records that hold no entry of its stream, so records
    /// about to be deleted that were only the groups' own (or, for a sale's stream, other
    /// sales') do not read as trimmed. A group with an entry ahead stops at it at once;
    /// an idle one scans at most `CHECKPOINT_SCANS` budgets' worth of records.
    pub fn checkpoint_groups(&self) -> Lsn {
        self.groups.checkpoint(|g| {
            let stream = g.stream.clone();
            for _ in 0..CHECKPOINT_SCANS {
                let from = g.next_unread();
                match self.scan(&stream, from, Lsn::MAX, 1, false) {
                    Ok(s) if s.entries.is_empty() && s.next > from => {
                        g.scanned = g.scanned.max(s.next - 1);
                        if !s.budget_exhausted {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        })
    }

    /// A replica's snapshot at `upto`: the groups' state (as of `upto`: a replica's
    /// groups change only by applying its primary's records, which the snapshot's gate
    /// holds back) goes to `groups-<upto>.state` beside the snapshot, written atomically
    /// before the snapshot may delete the records it replaces. Framed and CRC'd as WAL
    /// records. Older state files but the previous one are removed.
    pub fn write_state_file(&self, upto: Lsn) -> Result<(), WalError> {
        write_state_records(self.wal.dir(), upto, self.groups.state_records())
    }

    /// Loads the state file of the snapshot at `lsn`, if there is one (a replica's
    /// snapshot). Returns (groups' records applied, records skipped as undecodable).
    pub fn load_state_file(&self, lsn: Lsn) -> (usize, usize) {
        let (recs, bad) = self.state_file_records(lsn);
        // LSN 0: these records are not in the log (nothing to discount from lag).
        let (n, b) = self
            .groups
            .recover(recs.iter().map(|(k, b)| (0, *k, b.as_slice())));
        (n, b + bad)
    }

    /// The opaque records of the state file of the snapshot at `lsn` (none without
    /// one), and how many were undecodable (the rest of the file is then skipped).
    pub fn state_file_records(&self, lsn: Lsn) -> (Vec<(u8, Vec<u8>)>, usize) {
        let path = self.wal.dir().join(state_file_name(lsn));
        let Ok(buf) = std::fs::read(&path) else {
            return (Vec::new(), 0);
        };
        let mut recs = Vec::new();
        let mut at = 0;
        let mut bad = 0;
        while at < buf.len() {
            match decode_record(&buf[at..]) {
                Ok((Event::Opaque { kind, body }, used)) => {
                    recs.push((kind, body));
                    at += used;
                }
                Ok((_, used)) => at += used,
                Err(e) => {
                    tracing::warn!("{}: {e}; the rest is skipped", path.display());
                    bad += 1;
                    break;
                }
            }
        }
        (recs, bad)
    }

    /// The entry of `stream` at `lsn`, if the log still has it (`None`: trimmed, not an
    /// entry of this stream, or not durable yet). For re-reading pending entries.
    pub fn entry_at(&self, stream: &Stream, lsn: Lsn) -> Result<Option<Entry>, FeedError> {
        if lsn < self.first_lsn() {
            return Ok(None);
        }
        match self.scan(stream, lsn, lsn, 1, false) {
            Ok(mut s) => Ok(s.entries.pop()),
            Err(FeedError::Trimmed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// XLEN: entries in the stream now. A sale's stream is counted by a scan, so past
    /// the scan budget the answer is [`FeedError::ScanLimit`] rather than a guess.
    pub fn len(&self, stream: &Stream) -> Result<u64, FeedError> {
        let (first, durable) = (self.first_lsn(), self.readable_lsn());
        if *stream == Stream::All {
            // Every record is an entry except the consumer groups' own.
            let records = (durable + 1).saturating_sub(first);
            let own = self.groups.own_between(first.saturating_sub(1), durable);
            return Ok(records.saturating_sub(own));
        }
        if durable < first {
            return Ok(0);
        }
        let budget = self.limits.scan_budget.max(1);
        if durable - first >= budget {
            return Err(FeedError::ScanLimit {
                stream: stream.name(),
                from: first,
                to: first + budget - 1,
            });
        }
        let mut n = 0u64;
        let res = self.wal.read_records(first, durable, None, &mut |_, ev| {
            n += u64::from(stream.matches(&ev));
            Visit::More
        });
        match res {
            Ok(_) => Ok(n),
            Err(ReadError::Trimmed { requested, first }) => {
                Err(FeedError::Trimmed { requested, first })
            }
            Err(ReadError::Wal(e)) => Err(FeedError::Log(e.to_string())),
        }
    }
}
