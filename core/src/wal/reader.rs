//! Read access to the records on disk, for the order feed (`stockgate_server::feed`): iterate the
//! records of the segments from a given LSN, and wait for new durable records.
//!
//! Self-contained: the writer's only involvement is the catalog it already keeps (which
//! segments exist and where they end) and the notification it already sends when it
//! publishes a durable LSN. The reader never looks past the LSN its caller gives
//! (normally the durable LSN), so it never sees a record the writer is still writing.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use thiserror::Error;

use super::record::{decode_payload, frame, RecordError, HEADER_LEN, MAX_PAYLOAD};
use super::segment::{segment_file_name, SEGMENT_HEADER_LEN, SEGMENT_MAGIC};
use super::{Event, Lsn, Wal, WalError};

/// How much of a segment is read per `pread`.
const CHUNK: usize = 1 << 20;

/// Where a read stopped: reading from `lsn` can start at byte `offset` of segment
/// `segment` instead of scanning it from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPos {
    /// The first LSN of the segment (its name).
    pub segment: Lsn,
    /// The next record's LSN.
    pub lsn: Lsn,
    /// The next record's byte offset in the segment.
    pub offset: u64,
}

#[derive(Debug, Error)]
/// Why a read of the log failed.
pub enum ReadError {
    /// The record was deleted (segments covered by a snapshot and past the feed's
    /// retention): the caller must resynchronise by other means.
    #[error("LSN {requested} is no longer in the log (it starts at LSN {first})")]
    Trimmed {
        /// The LSN asked for.
        requested: Lsn,
        /// The first LSN still on disk.
        first: Lsn,
    },
    #[error(transparent)]
    /// The log itself failed.
    Wal(#[from] WalError),
}

/// What the visitor wants after a record.
pub enum Visit {
    /// Visit the next record.
    More,
    /// Stop after this one.
    Stop,
}

impl Wal {
    /// The oldest LSN still on disk (`durable + 1` when no segment holds a record).
    pub fn first_readable_lsn(&self) -> Lsn {
        match self.catalog_snapshot().first() {
            Some((first, _)) => *first,
            None => self.durable_lsn() + 1,
        }
    }

    /// Calls `visit` for each record with LSN in `from..=upto`, in log order, until it
    /// answers [`Visit::Stop`] or `upto` is passed. `hint` (from an earlier read) lets the
    /// scan start in the middle of a segment; a hint that does not fit is ignored.
    /// Returns where the next read should start (the record after the last visited).
    ///
    /// `upto` must not exceed [`Wal::durable_lsn`]: records after it may be half-written.
    pub fn read_records(
        &self,
        from: Lsn,
        upto: Lsn,
        hint: Option<ReadPos>,
        visit: &mut dyn FnMut(Lsn, Event) -> Visit,
    ) -> Result<Option<ReadPos>, ReadError> {
        let from = from.max(1);
        if from > upto {
            return Ok(None);
        }
        let mut lsn = from;
        let mut hint = hint;
        let mut last_pos = None;
        loop {
            let segs = self.catalog_snapshot();
            let first = segs.first().map_or(self.durable_lsn() + 1, |s| s.0);
            if lsn < first {
                return Err(ReadError::Trimmed {
                    requested: lsn,
                    first,
                });
            }
            // The segment holding `lsn`: the last one starting at or before it.
            let Some(&(seg_first, seg_last)) = segs.iter().rev().find(|(f, _)| *f <= lsn) else {
                return Ok(last_pos);
            };
            if seg_last.is_some_and(|l| l < lsn) {
                // Past the end of a closed segment and no successor yet: nothing more.
                return Ok(last_pos);
            }
            let path = self.dir().join(segment_file_name(seg_first));
            let start = hint
                .take()
                .filter(|h| h.segment == seg_first && h.lsn <= lsn && h.lsn >= seg_first)
                .unwrap_or(ReadPos {
                    segment: seg_first,
                    lsn: seg_first,
                    offset: SEGMENT_HEADER_LEN,
                });
            let seg_end = seg_last.unwrap_or(Lsn::MAX).min(upto);
            let (pos, stopped) = match read_segment(&path, start, lsn, seg_end, visit) {
                Ok(r) => r,
                Err(SegmentGone) => {
                    // Deleted by a snapshot between the catalog read and the open.
                    let first = self.first_readable_lsn();
                    return Err(ReadError::Trimmed {
                        requested: lsn,
                        first,
                    });
                }
            }
            .map_err(ReadError::Wal)?;
            last_pos = Some(pos);
            if stopped || pos.lsn > upto || seg_last.is_none() {
                return Ok(last_pos);
            }
            lsn = pos.lsn;
        }
    }

    /// Resolves once the durable LSN is past `after` (or the log failed or closed, which
    /// the caller sees as no new records). Cancel-safe; callers bound it with a timeout.
    #[cfg(feature = "tokio")]
    pub async fn wait_durable_past(&self, after: Lsn) {
        loop {
            let notified = self.durable_notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.durable_lsn() > after || self.failure().is_some() {
                return;
            }
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }
}

struct SegmentGone;

/// Reads records `[start.lsn ..= end]` of one segment, visiting those `>= want`.
#[allow(clippy::type_complexity)]
fn read_segment(
    path: &Path,
    start: ReadPos,
    want: Lsn,
    end: Lsn,
    visit: &mut dyn FnMut(Lsn, Event) -> Visit,
) -> Result<Result<(ReadPos, bool), WalError>, SegmentGone> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(SegmentGone),
        Err(e) => return Ok(Err(super::io_err("open segment", path)(e))),
    };
    Ok(scan(&file, path, start, want, end, visit))
}

/// Reads records `[start.lsn ..= end]` of an open segment, visiting those `>= want`,
/// a chunk at a time; returns where it stopped and whether the visitor stopped it.
fn scan(
    file: &File,
    path: &Path,
    start: ReadPos,
    want: Lsn,
    end: Lsn,
    visit: &mut dyn FnMut(Lsn, Event) -> Visit,
) -> Result<(ReadPos, bool), WalError> {
    if start.offset == SEGMENT_HEADER_LEN {
        check_segment_header(file, path, start.segment)?;
    }
    let mut win = Window::new(start.offset);
    let mut lsn = start.lsn;
    while lsn <= end {
        if win.needs_more() {
            if !win.refill(file, path)? {
                // The file ends before `end`: the records are not there (yet).
                break;
            }
            continue;
        }
        if lsn >= want {
            let (used, stop) = visit_record(&win, path, lsn, visit)?;
            win.pos += used;
            lsn += 1;
            if stop {
                return Ok((win.read_pos(start.segment, lsn), true));
            }
        } else {
            // Skipping: the length is enough, the CRC is checked when a record is read.
            let used = record_len(win.rest())
                .ok_or_else(|| corrupt(path, win.offset(), "short header".into()))?;
            win.pos += used;
            lsn += 1;
        }
    }
    Ok((win.read_pos(start.segment, lsn), false))
}

fn corrupt(path: &Path, offset: u64, reason: String) -> WalError {
    WalError::Corrupt {
        file: path.to_owned(),
        offset,
        reason,
    }
}

/// A file that is not the segment its name says must not feed consumers: checked when a
/// scan starts at the segment's first record.
fn check_segment_header(file: &File, path: &Path, segment: Lsn) -> Result<(), WalError> {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    file.read_exact_at(&mut h, 0)
        .map_err(super::io_err("read segment header", path))?;
    if h[..8] != SEGMENT_MAGIC || h[8..] != segment.to_le_bytes() {
        return Err(corrupt(
            path,
            0,
            "segment header does not match its name".into(),
        ));
    }
    Ok(())
}

/// Frames and decodes the record at the window's position and hands it to `visit`:
/// `(bytes used, whether the visitor stopped)`.
fn visit_record(
    win: &Window,
    path: &Path,
    lsn: Lsn,
    visit: &mut dyn FnMut(Lsn, Event) -> Visit,
) -> Result<(usize, bool), WalError> {
    let (payload, used) =
        frame(win.rest()).map_err(|e| corrupt(path, win.offset(), e.to_string()))?;
    let ev = decode_payload(payload)
        .map_err(|e| corrupt(path, win.offset(), RecordError::from(e).to_string()))?;
    let stop = matches!(visit(lsn, ev), Visit::Stop);
    Ok((used, stop))
}

/// The bytes of a segment read so far and not yet consumed: `buf[pos..]` starts at the
/// next record, at file offset `buf_off + pos`.
struct Window {
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_off: u64,
    /// Index into `buf` of the next record.
    pos: usize,
}

impl Window {
    fn new(offset: u64) -> Self {
        Window {
            buf: Vec::with_capacity(CHUNK),
            buf_off: offset,
            pos: 0,
        }
    }

    /// The bytes from the next record on.
    fn rest(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// File offset of the next record.
    fn offset(&self) -> u64 {
        self.buf_off + self.pos as u64
    }

    /// The next record is not wholly in the buffer (its header included).
    fn needs_more(&self) -> bool {
        self.buf.len() - self.pos < HEADER_LEN || needs_more(self.rest())
    }

    /// Refills from the next record on, so a record never straddles two reads: at least
    /// [`CHUNK`] bytes, more for a longer record. False at the end of the file.
    fn refill(&mut self, file: &File, path: &Path) -> Result<bool, WalError> {
        self.buf_off += self.pos as u64;
        self.buf.drain(..self.pos);
        self.pos = 0;
        let len = record_len(&self.buf).unwrap_or(HEADER_LEN);
        if len > MAX_PAYLOAD + HEADER_LEN {
            return Err(corrupt(
                path,
                self.buf_off,
                format!("invalid record length {len}"),
            ));
        }
        let need = len.max(CHUNK);
        let have = self.buf.len();
        self.buf.resize(need, 0);
        let n = read_at_most(file, &mut self.buf[have..], self.buf_off + have as u64)
            .map_err(super::io_err("read segment", path))?;
        self.buf.truncate(have + n);
        Ok(n > 0)
    }

    /// Where the next read starts: the next record's LSN and offset in `segment`.
    fn read_pos(&self, segment: Lsn, lsn: Lsn) -> ReadPos {
        ReadPos {
            segment,
            lsn,
            offset: self.offset(),
        }
    }
}

fn record_len(b: &[u8]) -> Option<usize> {
    if b.len() < HEADER_LEN {
        return None;
    }
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize + HEADER_LEN)
}

fn needs_more(b: &[u8]) -> bool {
    record_len(b).is_none_or(|l| l > b.len())
}

fn read_at_most(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::record::tests::reserved;
    use super::super::testutil::TempDir;
    use super::super::{FeedRetention, FsyncPolicy, Snapshot, WalOptions};
    use super::*;

    fn small(retention: FeedRetention) -> WalOptions {
        WalOptions {
            fsync: FsyncPolicy::No,
            segment_bytes: 1024,
            feed_retention: retention,
            ..WalOptions::default()
        }
    }

    fn write(wal: &Wal, n: u64) -> Lsn {
        let mut last = 0;
        for i in 0..n {
            last = wal.record(&reserved(i));
        }
        wal.wait_durable_blocking(last).unwrap();
        last
    }

    fn read_all(wal: &Wal, from: Lsn, hint: Option<ReadPos>) -> (Vec<Lsn>, Option<ReadPos>) {
        let mut got = Vec::new();
        let upto = wal.durable_lsn();
        let pos = wal
            .read_records(from, upto, hint, &mut |lsn, ev| {
                assert_eq!(ev, reserved(lsn - 1));
                got.push(lsn);
                Visit::More
            })
            .unwrap();
        (got, pos)
    }

    #[test]
    fn wal_reader_reads_across_segments_from_any_lsn() {
        let d = TempDir::new("reader");
        let (wal, _) = Wal::open(d.path(), small(FeedRetention::default())).unwrap();
        let last = write(&wal, 100);
        assert!(wal.stats().segments > 3, "small segments roll");
        for from in [1, 2, 17, 50, 99, 100] {
            let (got, pos) = read_all(&wal, from, None);
            assert_eq!(got, (from..=last).collect::<Vec<_>>());
            assert_eq!(pos.map(|p| p.lsn), Some(last + 1));
        }
        assert!(read_all(&wal, last + 1, None).0.is_empty());
        // A stop, then a hinted continuation, gives the same records.
        let mut first_half = Vec::new();
        let pos = wal
            .read_records(1, last, None, &mut |lsn, _| {
                first_half.push(lsn);
                if lsn == 42 {
                    Visit::Stop
                } else {
                    Visit::More
                }
            })
            .unwrap();
        assert_eq!(pos.map(|p| p.lsn), Some(43));
        let (rest, _) = read_all(&wal, 43, pos);
        assert_eq!(rest, (43..=last).collect::<Vec<_>>());
        // A hint for another place is ignored, not trusted.
        let (again, _) = read_all(&wal, 10, pos);
        assert_eq!(again, (10..=last).collect::<Vec<_>>());
    }

    #[test]
    fn wal_reader_never_reads_past_upto() {
        let d = TempDir::new("reader-upto");
        let (wal, _) = Wal::open(d.path(), small(FeedRetention::default())).unwrap();
        write(&wal, 30);
        let mut got = Vec::new();
        wal.read_records(5, 12, None, &mut |lsn, _| {
            got.push(lsn);
            Visit::More
        })
        .unwrap();
        assert_eq!(got, (5..=12).collect::<Vec<_>>());
    }

    #[test]
    fn wal_reader_trimmed_after_snapshot_unless_retained() {
        for (retention, trimmed) in [
            (FeedRetention::default(), true),
            (
                FeedRetention {
                    max_bytes: Some(1 << 30),
                    max_age: None,
                },
                false,
            ),
        ] {
            let d = TempDir::new("reader-trim");
            let (wal, _) = Wal::open(d.path(), small(retention)).unwrap();
            let upto = write(&wal, 60);
            let _ = wal.roll();
            wal.write_snapshot(&Snapshot::default(), upto).unwrap();
            write(&wal, 5);
            let r = wal.read_records(1, wal.durable_lsn(), None, &mut |_, _| Visit::More);
            match r {
                Err(ReadError::Trimmed { requested, first }) => {
                    assert!(trimmed);
                    assert_eq!(requested, 1);
                    assert!(first > 1);
                }
                Ok(_) => assert!(!trimmed, "retained segments stay readable"),
                Err(e) => panic!("{e}"),
            }
            // The retained segments survive a restart too.
            wal.flush_and_close().unwrap();
            drop(wal);
            let (wal, _) = Wal::open(d.path(), small(retention)).unwrap();
            let r = wal.read_records(1, wal.durable_lsn(), None, &mut |_, _| Visit::More);
            assert_eq!(r.is_err(), trimmed);
            let wal: Arc<Wal> = wal;
            assert_eq!(wal.first_readable_lsn() == 1, !trimmed);
        }
    }

    #[test]
    fn wal_reader_retention_by_size_keeps_the_newest() {
        let d = TempDir::new("reader-size");
        let r = FeedRetention {
            max_bytes: Some(2048),
            max_age: None,
        };
        let (wal, _) = Wal::open(d.path(), small(r)).unwrap();
        let upto = write(&wal, 100);
        let _ = wal.roll();
        wal.write_snapshot(&Snapshot::default(), upto).unwrap();
        let first = wal.first_readable_lsn();
        assert!(first > 1 && first <= upto, "some kept, not all: {first}");
        let (got, _) = read_all(&wal, first, None);
        assert_eq!(got, (first..=upto).collect::<Vec<_>>());
    }

    #[cfg(feature = "tokio")]
    #[tokio::test]
    async fn wal_reader_wait_durable_past_wakes() {
        let d = TempDir::new("reader-wait");
        let (wal, _) = Wal::open(d.path(), small(FeedRetention::default())).unwrap();
        let w2 = wal.clone();
        let t = tokio::spawn(async move {
            tokio::time::timeout(std::time::Duration::from_secs(5), w2.wait_durable_past(0))
                .await
                .is_ok()
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        write(&wal, 1);
        assert!(t.await.unwrap());
    }
}
