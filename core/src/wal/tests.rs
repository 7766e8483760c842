//! Whole-log tests: group commit, recovery, snapshots, repair.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record::tests::{every_variant, reserved};
use super::record::{encode_record, HEADER_LEN};
use super::segment::{self, SEGMENT_HEADER_LEN};
use super::testutil::TempDir;
use super::*;
use crate::engine::types::{ReleaseReason, ReservationState};

fn opts(fsync: FsyncPolicy) -> WalOptions {
    WalOptions {
        fsync,
        ..WalOptions::default()
    }
}

fn small_segments(bytes: u64) -> WalOptions {
    WalOptions {
        fsync: FsyncPolicy::No,
        segment_bytes: bytes,
        ..WalOptions::default()
    }
}

fn wal_dir(data: &Path) -> PathBuf {
    data.join("wal")
}

fn segments(data: &Path) -> Vec<(Lsn, PathBuf)> {
    segment::list_dir(&wal_dir(data)).unwrap().segments
}

fn snapshots(data: &Path) -> Vec<(Lsn, PathBuf)> {
    segment::list_dir(&wal_dir(data)).unwrap().snapshots
}

fn open(data: &Path, o: WalOptions) -> (Arc<Wal>, Recovery) {
    Wal::open(data, o).unwrap()
}

fn record_all(wal: &Wal, events: &[Event]) -> Lsn {
    let mut last = 0;
    for e in events {
        let lsn = wal.record(e);
        assert!(last == 0 || lsn == last + 1);
        last = lsn;
    }
    wal.wait_durable_blocking(last).unwrap();
    last
}

fn encoded_len(e: &Event) -> u64 {
    let mut b = Vec::new();
    encode_record(e, &mut b).unwrap();
    b.len() as u64
}

/// A toy replay (enough to compare "snapshot + tail" with "everything from the start").
fn fold(mut s: Snapshot, e: &Event) -> Snapshot {
    match e {
        Event::Reserved { .. } => s
            .reservations
            .extend(e.reserved_record().map(|r| r.to_view())),
        Event::Released { token, at_ms, .. } | Event::Committed { token, at_ms, .. } => {
            let state = if matches!(e, Event::Released { .. }) {
                ReservationState::Released
            } else {
                ReservationState::Committed
            };
            for r in s.reservations.iter_mut().filter(|r| &r.token == token) {
                r.state = state;
                r.finished_at_ms = *at_ms;
            }
        }
        _ => {}
    }
    s
}

fn replay(rec: &Recovery) -> Snapshot {
    rec.events
        .iter()
        .fold(rec.snapshot.clone().unwrap_or_default(), fold)
}

/// Event number `i` of a deterministic mixed workload.
fn workload(i: u64) -> Event {
    match i % 5 {
        0..=2 => reserved(i),
        3 => Event::Released {
            token: match reserved(i - 1) {
                Event::Reserved { token, .. } => token,
                _ => unreachable!(),
            },
            at_ms: i,
            user: format!("user{:06}", i - 1),
            request_id: format!("req-{:08}", i - 1),
            qty: 1,
            reason: ReleaseReason::Cancel,
        },
        _ => Event::Committed {
            token: match reserved(i - 2) {
                Event::Reserved { token, .. } => token,
                _ => unreachable!(),
            },
            at_ms: i,
            user: format!("user{:06}", i - 2),
            request_id: format!("req-{:08}", i - 2),
            qty: 1,
        },
    }
}

#[test]
fn wal_round_trip_through_disk_every_variant() {
    let t = TempDir::new("variants");
    let events = every_variant();
    {
        let (wal, rec) = open(t.path(), opts(FsyncPolicy::Always));
        assert_eq!(rec, Recovery::default());
        assert_eq!(record_all(&wal, &events), events.len() as u64);
        assert_eq!(wal.flush_and_close().unwrap(), events.len() as u64);
    }
    let (wal, rec) = open(t.path(), opts(FsyncPolicy::Always));
    assert_eq!(rec.events, events);
    assert_eq!(rec.last_lsn, events.len() as u64);
    assert_eq!(rec.truncated_tail, None);
    assert_eq!(wal.record(&reserved(0)), events.len() as u64 + 1);
    let segs = segments(t.path());
    assert_eq!(segs.len(), 1);
    assert_eq!(
        segs[0].1.file_name().unwrap().to_str().unwrap(),
        "wal-00000000000000000001.log"
    );
}

/// Without the writer thread every record is written before `record` returns: the
/// segment holds it at once (durable under `always`), and a reopen recovers it.
#[test]
fn wal_open_inline_writes_before_record_returns() {
    let t = TempDir::new("inline");
    let events = every_variant();
    {
        let (wal, _) = Wal::open_inline(t.path(), opts(FsyncPolicy::Always)).unwrap();
        let mut written = 0;
        for e in &events {
            let lsn = wal.record(e);
            written += encoded_len(e);
            assert_eq!(wal.durable_lsn(), lsn);
            let seg = &segments(t.path())[0].1;
            assert_eq!(
                fs::metadata(seg).unwrap().len(),
                SEGMENT_HEADER_LEN + written
            );
        }
        assert_eq!(wal.roll(), events.len() as u64);
    }
    let (_wal, rec) = Wal::open_inline(t.path(), opts(FsyncPolicy::No)).unwrap();
    assert_eq!(rec.events, events);
}

#[test]
fn wal_lsn_zero_unassigned_and_closed() {
    let t = TempDir::new("lsn0");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::EverySec));
    wal.wait_durable_blocking(0).unwrap();
    assert!(matches!(
        wal.wait_durable_blocking(3),
        Err(WalError::NotAssigned { lsn: 3, last: 0 })
    ));
    let a = wal.record(&reserved(1));
    wal.wait_durable_blocking(a).unwrap();
    assert_eq!(wal.flush_and_close().unwrap(), 1);
    let b = wal.record(&reserved(2));
    assert_eq!(b, 2);
    wal.wait_durable_blocking(a).unwrap();
    assert!(matches!(
        wal.wait_durable_blocking(b),
        Err(WalError::Closed)
    ));
    drop(wal);
    let (_, rec) = open(t.path(), opts(FsyncPolicy::EverySec));
    assert_eq!(rec.events, vec![reserved(1)]);
}

fn group_commit(policy: FsyncPolicy) {
    const THREADS: u64 = 8;
    const PER: u64 = 400;
    let t = TempDir::new("group");
    let (wal, _) = open(t.path(), opts(policy));
    let handles: Vec<_> = (0..THREADS)
        .map(|th| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for i in 0..PER {
                    let ev = reserved(th * 100_000 + i);
                    let lsn = wal.record(&ev);
                    if i % 7 == 0 || i + 1 == PER {
                        wal.wait_durable_blocking(lsn).unwrap();
                        assert!(wal.durable_lsn() >= lsn);
                    }
                    got.push((lsn, ev));
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        let got = h.join().unwrap();
        assert!(
            got.windows(2).all(|w| w[0].0 < w[1].0),
            "per-thread LSN order"
        );
        all.extend(got);
    }
    all.sort_by_key(|(lsn, _)| *lsn);
    let lsns: Vec<Lsn> = all.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=THREADS * PER).collect::<Vec<_>>());
    assert_eq!(wal.durable_lsn(), THREADS * PER);
    let stats = wal.stats();
    assert_eq!(stats.last_lsn, THREADS * PER);
    // Group commit: concurrent records share batches (and, under `always`, syncs).
    assert!(stats.batches < THREADS * PER, "{stats:?}");
    if policy == FsyncPolicy::Always {
        assert!(stats.syncs <= stats.batches, "{stats:?}");
        assert!(stats.syncs > 0, "{stats:?}");
    }
    wal.flush_and_close().unwrap();
    drop(wal);
    let (_, rec) = open(t.path(), opts(policy));
    assert_eq!(rec.last_lsn, THREADS * PER);
    // The log holds each record at the position of the LSN it was given.
    let expected: Vec<Event> = all.into_iter().map(|(_, e)| e).collect();
    assert_eq!(rec.events, expected);
}

#[test]
fn wal_group_commit_always() {
    group_commit(FsyncPolicy::Always);
}

#[test]
fn wal_group_commit_everysec() {
    group_commit(FsyncPolicy::EverySec);
}

#[test]
fn wal_group_commit_no() {
    group_commit(FsyncPolicy::No);
}

#[cfg(feature = "tokio")]
#[test]
fn wal_async_wait_durable() {
    let t = TempDir::new("async");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::Always));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..16u64)
            .map(|k| {
                let wal = wal.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        // A pipelined batch: several records, one wait for the last.
                        let mut last = 0;
                        for j in 0..3 {
                            last = wal.record(&reserved(k * 10_000 + i * 10 + j));
                        }
                        wal.wait_durable(last).await.unwrap();
                        assert!(wal.durable_lsn() >= last);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        wal.wait_durable(0).await.unwrap();
    });
    assert_eq!(wal.durable_lsn(), 16 * 50 * 3);
}

/// Under `everysec` an acknowledgement needs the `write`, not the periodic fdatasync: on
/// a slow disk (each sync takes 1.2 s here) no wait may take as long as a sync. Before
/// the sync ran outside the writer lock, every wait that began during a sync took until
/// its end.
#[cfg(feature = "tokio")]
#[test]
fn wal_everysec_waits_never_wait_for_the_periodic_sync() {
    let t = TempDir::new("slowsync");
    let o = WalOptions {
        fault_sync_delay_ms: 1200,
        ..opts(FsyncPolicy::EverySec)
    };
    let (wal, _) = open(t.path(), o);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let mut worst = std::time::Duration::ZERO;
    let mut i = 0u64;
    rt.block_on(async {
        // Long enough for at least two periodic syncs to begin (one per second).
        while started.elapsed() < std::time::Duration::from_millis(3800) {
            let lsn = wal.record(&reserved(i));
            i += 1;
            let t0 = std::time::Instant::now();
            wal.wait_durable(lsn).await.unwrap();
            worst = worst.max(t0.elapsed());
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    });
    assert!(wal.stats().syncs >= 2, "syncs ran: {:?}", wal.stats());
    assert!(
        worst < std::time::Duration::from_millis(600),
        "a wait took {worst:?} while a 1.2 s sync ran"
    );
}

#[test]
fn wal_backpressure_with_tiny_buffer() {
    let t = TempDir::new("backpressure");
    let o = WalOptions {
        fsync: FsyncPolicy::Always,
        max_buffer_bytes: 200,
        segment_bytes: 16 << 10,
        ..WalOptions::default()
    };
    let (wal, _) = open(t.path(), o.clone());
    let hs: Vec<_> = (0..4u64)
        .map(|th| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                let mut last = 0;
                for i in 0..300 {
                    last = wal.record(&reserved(th * 1000 + i));
                }
                wal.wait_durable_blocking(last).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    wal.flush_and_close().unwrap();
    drop(wal);
    let (_, rec) = open(t.path(), o);
    assert_eq!(rec.events.len(), 1200);
    assert!(segments(t.path()).len() > 1);
}

/// Writes `n` workload records into a fresh log and returns the segment's path, the
/// offset of every record and the file's bytes.
fn one_segment_log(data: &Path, n: u64) -> (PathBuf, Vec<u64>, Vec<u8>) {
    let (wal, _) = open(data, opts(FsyncPolicy::No));
    let events: Vec<Event> = (1..=n).map(workload).collect();
    record_all(&wal, &events);
    wal.flush_and_close().unwrap();
    drop(wal);
    let segs = segments(data);
    assert_eq!(segs.len(), 1);
    let path = segs[0].1.clone();
    let mut offsets = vec![SEGMENT_HEADER_LEN];
    for e in &events {
        let last = *offsets.last().unwrap();
        offsets.push(last + encoded_len(e));
    }
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, *offsets.last().unwrap());
    (path, offsets, bytes)
}

#[test]
fn wal_torn_tail_at_every_offset_of_the_final_record() {
    const N: u64 = 6;
    let t = TempDir::new("torn");
    let (path, offsets, bytes) = one_segment_log(t.path(), N);
    let start = offsets[N as usize - 1];
    let end = offsets[N as usize];
    let prefix: Vec<Event> = (1..N).map(workload).collect();
    for cut in start + 1..end {
        fs::write(&path, &bytes[..cut as usize]).unwrap();
        let (wal, rec) = open(t.path(), opts(FsyncPolicy::Always));
        assert_eq!(rec.events, prefix, "cut at {cut}");
        assert_eq!(rec.last_lsn, N - 1);
        let tr = rec.truncated_tail.clone().unwrap();
        assert_eq!(
            (tr.file.clone(), tr.offset, tr.bytes_dropped, tr.repaired),
            (path.clone(), start, cut - start, false)
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), start);
        // The log goes on from there: the next record takes the torn one's LSN.
        assert_eq!(wal.record(&workload(N)), N);
        wal.flush_and_close().unwrap();
        drop(wal);
        let (_, rec) = open(t.path(), opts(FsyncPolicy::Always));
        assert_eq!(rec.events.len() as u64, N);
        assert_eq!(rec.truncated_tail, None);
        assert_eq!(fs::read(&path).unwrap(), bytes, "cut at {cut}");
    }
}

#[test]
fn wal_damaged_final_record_and_garbage_tails_are_torn() {
    const N: u64 = 5;
    let t = TempDir::new("tails");
    let (path, offsets, bytes) = one_segment_log(t.path(), N);
    let last = offsets[N as usize - 1] as usize;
    let mut tails: Vec<(Vec<u8>, u64)> = Vec::new();
    // Final record complete but its last bytes never reached the disk (zeros).
    let mut b = bytes.clone();
    let n = b.len();
    b[n - 3..].fill(0);
    tails.push((b, last as u64));
    // Final record with a bad CRC (two bits: one flipped bit is put right).
    let mut b = bytes.clone();
    b[last + 4] ^= 0x11;
    tails.push((b, last as u64));
    // Zero-filled space after the log (preallocation), and random garbage.
    let mut b = bytes.clone();
    b.extend_from_slice(&[0u8; 4096]);
    tails.push((b, bytes.len() as u64));
    let mut b = bytes.clone();
    let mut x: u32 = 12345;
    b.extend((0..5000).map(|_| {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        (x >> 16) as u8
    }));
    tails.push((b, bytes.len() as u64));
    for (i, (content, cut)) in tails.into_iter().enumerate() {
        fs::write(&path, &content).unwrap();
        let (wal, rec) = open(t.path(), opts(FsyncPolicy::No));
        let kept = if cut == bytes.len() as u64 { N } else { N - 1 };
        assert_eq!(rec.events.len() as u64, kept, "case {i}");
        let tr = rec.truncated_tail.unwrap();
        assert_eq!((tr.offset, tr.repaired), (cut, false), "case {i}");
        assert_eq!(tr.bytes_dropped, content.len() as u64 - cut);
        wal.flush_and_close().unwrap();
        drop(wal);
        fs::write(&path, &bytes).unwrap();
    }
}

#[test]
fn wal_corrupt_middle_record_is_refused_then_repaired() {
    const N: u64 = 10;
    let t = TempDir::new("corrupt");
    let (path, offsets, bytes) = one_segment_log(t.path(), N);
    // Damage record 5: once in the payload, once in its length field (which hides where
    // the next record starts, so only the forward scan can see the valid data after it).
    for flip in [offsets[4] + HEADER_LEN as u64 + 3, offsets[4] + 1] {
        let mut b = bytes.clone();
        b[flip as usize] ^= 0x5a;
        fs::write(&path, &b).unwrap();
        let err = Wal::open(t.path(), opts(FsyncPolicy::No)).unwrap_err();
        match &err {
            WalError::Corrupt { file, offset, .. } => {
                assert_eq!((file, *offset), (&path, offsets[4]));
            }
            e => panic!("expected Corrupt, got {e}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("offset {}", offsets[4])), "{msg}");
        // Refusing to start changed nothing.
        assert_eq!(fs::read(&path).unwrap(), b);
    }
    let repair = WalOptions {
        repair: true,
        ..opts(FsyncPolicy::No)
    };
    let (wal, rec) = open(t.path(), repair);
    assert_eq!(rec.events, (1..5).map(workload).collect::<Vec<_>>());
    let tr = rec.truncated_tail.unwrap();
    assert!(tr.repaired);
    assert_eq!(
        (tr.file, tr.offset, tr.bytes_dropped),
        (path.clone(), offsets[4], bytes.len() as u64 - offsets[4])
    );
    assert_eq!(wal.record(&workload(99)), 5);
    wal.flush_and_close().unwrap();
    drop(wal);
    let (_, rec) = open(t.path(), opts(FsyncPolicy::No));
    assert_eq!(rec.events.len(), 5);
    assert_eq!(rec.events[4], workload(99));
}

#[test]
fn wal_corruption_in_an_earlier_segment() {
    let t = TempDir::new("earlier");
    let o = small_segments(400);
    let (wal, _) = open(t.path(), o.clone());
    let events: Vec<Event> = (1..=30).map(workload).collect();
    record_all(&wal, &events);
    wal.flush_and_close().unwrap();
    drop(wal);
    let segs = segments(t.path());
    assert!(segs.len() >= 4, "{segs:?}");
    // Damage the LAST record of the first segment: at the end of its file, but not the
    // end of the log, so it is corruption, not a torn tail.
    let first2 = segs[1].0;
    let seg0 = &segs[0].1;
    let mut b = fs::read(seg0).unwrap();
    let last_rec = &events[first2 as usize - 2];
    let off = b.len() as u64 - encoded_len(last_rec);
    let n = b.len();
    b[n - 1] ^= 0xff;
    fs::write(seg0, &b).unwrap();
    match Wal::open(t.path(), o.clone()).unwrap_err() {
        WalError::Corrupt { file, offset, .. } => assert_eq!((&file, offset), (seg0, off)),
        e => panic!("expected Corrupt, got {e}"),
    }
    let (wal, rec) = open(
        t.path(),
        WalOptions {
            repair: true,
            ..o.clone()
        },
    );
    assert_eq!(rec.events, events[..first2 as usize - 2].to_vec());
    let tr = rec.truncated_tail.unwrap();
    assert_eq!(tr.deleted_segments.len(), segs.len() - 1);
    assert_eq!(segments(t.path()).len(), 1);
    assert_eq!(wal.record(&workload(1)), first2 - 1);
}

#[test]
fn wal_missing_segment_is_corrupt() {
    let t = TempDir::new("gap");
    let o = small_segments(400);
    let (wal, _) = open(t.path(), o.clone());
    record_all(&wal, &(1..=30).map(workload).collect::<Vec<_>>());
    wal.flush_and_close().unwrap();
    drop(wal);
    let segs = segments(t.path());
    fs::remove_file(&segs[1].1).unwrap();
    match Wal::open(t.path(), o.clone()).unwrap_err() {
        WalError::Corrupt {
            file,
            offset,
            reason,
        } => {
            assert_eq!((&file, offset), (&segs[2].1, 0));
            assert!(reason.contains("missing"), "{reason}");
        }
        e => panic!("expected Corrupt, got {e}"),
    }
    // Losing the first segment (no snapshot) is just as unprovable.
    let t2 = TempDir::new("gap2");
    let (wal, _) = open(t2.path(), o.clone());
    record_all(&wal, &(1..=30).map(workload).collect::<Vec<_>>());
    wal.flush_and_close().unwrap();
    drop(wal);
    fs::remove_file(&segments(t2.path())[0].1).unwrap();
    assert!(matches!(
        Wal::open(t2.path(), o),
        Err(WalError::Corrupt { .. })
    ));
}

#[test]
fn wal_torn_segment_header_is_dropped() {
    let t = TempDir::new("header");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::No));
    record_all(&wal, &(1..=3).map(workload).collect::<Vec<_>>());
    wal.flush_and_close().unwrap();
    drop(wal);
    // Crash while a new segment was being created: a few bytes of header.
    let new_seg = wal_dir(t.path()).join(segment::segment_file_name(4));
    fs::write(&new_seg, b"SGW").unwrap();
    let (wal, rec) = open(t.path(), opts(FsyncPolicy::No));
    assert_eq!(rec.events.len(), 3);
    let tr = rec.truncated_tail.unwrap();
    assert_eq!(
        (tr.file, tr.offset, tr.bytes_dropped),
        (new_seg.clone(), 0, 3)
    );
    assert!(!new_seg.exists());
    assert_eq!(wal.record(&workload(4)), 4);
    wal.flush_and_close().unwrap();
    drop(wal);
    let (_, rec) = open(t.path(), opts(FsyncPolicy::No));
    assert_eq!(rec.events, (1..=4).map(workload).collect::<Vec<_>>());
}

#[test]
fn wal_snapshot_plus_tail_equals_full_replay() {
    let t = TempDir::new("snap");
    let all: Vec<Event> = (1..=40).map(workload).collect();
    let full = all.iter().fold(Snapshot::default(), fold);
    {
        let (wal, _) = open(t.path(), opts(FsyncPolicy::EverySec));
        record_all(&wal, &all[..25]);
        let upto = wal.roll();
        assert_eq!(upto, 25);
        let state = all[..25].iter().fold(Snapshot::default(), fold);
        let w = wal.write_snapshot(&state, upto).unwrap();
        assert_eq!(w.lsn, 25);
        assert_eq!(
            w.path.file_name().unwrap().to_str().unwrap(),
            "snapshot-00000000000000000025.snap"
        );
        // The only segment held records 1..=25: the snapshot makes it redundant.
        assert_eq!(w.removed.len(), 1);
        record_all(&wal, &all[25..]);
        wal.flush_and_close().unwrap();
    }
    let (wal, rec) = open(t.path(), opts(FsyncPolicy::EverySec));
    assert_eq!(rec.snapshot_lsn, 25);
    assert_eq!(rec.events, all[25..].to_vec());
    assert_eq!(rec.last_lsn, 40);
    assert_eq!(replay(&rec), full);
    assert_eq!(segments(t.path())[0].0, 26);
    assert_eq!(wal.record(&workload(41)), 41);
}

#[test]
fn wal_segment_roll_and_gc() {
    let t = TempDir::new("gc");
    let o = small_segments(1024);
    let all: Vec<Event> = (1..=300).map(workload).collect();
    let (wal, _) = open(t.path(), o.clone());
    record_all(&wal, &all[..120]);
    let segs = segments(t.path());
    assert!(segs.len() >= 8, "{}", segs.len());
    // Names are first LSNs and chain without gaps; sizes respect the limit.
    for w in segs.windows(2) {
        let len = fs::metadata(&w[0].1).unwrap().len();
        assert!(len <= 1024, "{len}");
        let recs: u64 = (w[0].0..w[1].0)
            .map(|l| encoded_len(&all[l as usize - 1]))
            .sum();
        assert_eq!(len, SEGMENT_HEADER_LEN + recs);
    }
    let upto = wal.roll();
    let s1 = wal
        .write_snapshot(&all[..120].iter().fold(Snapshot::default(), fold), upto)
        .unwrap();
    assert_eq!(s1.removed.len(), segs.len());
    assert!(segments(t.path()).is_empty());
    record_all(&wal, &all[120..200]);
    let upto2 = wal.roll();
    assert_eq!(upto2, 200);
    record_all(&wal, &all[200..210]);
    let s2 = wal
        .write_snapshot(&all[..200].iter().fold(Snapshot::default(), fold), upto2)
        .unwrap();
    // The older snapshot and the segments of 121..=200 are gone; 201.. stays.
    assert!(s2.removed.contains(&s1.path));
    assert_eq!(snapshots(t.path()).len(), 1);
    let left = segments(t.path());
    assert_eq!(left[0].0, 201);
    record_all(&wal, &all[210..]);
    wal.flush_and_close().unwrap();
    drop(wal);
    let (_, rec) = open(t.path(), o);
    assert_eq!(rec.snapshot_lsn, 200);
    assert_eq!(rec.events, all[200..].to_vec());
    assert_eq!(replay(&rec), all.iter().fold(Snapshot::default(), fold));
}

#[test]
fn wal_snapshot_newer_than_log_continues_after_it() {
    // Crash after the snapshot was durable but before the records it covers were
    // written (possible under everysec/no): the snapshot alone is the state.
    let t = TempDir::new("ahead");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::No));
    record_all(&wal, &(1..=10).map(workload).collect::<Vec<_>>());
    wal.flush_and_close().unwrap();
    drop(wal);
    let state = (1..=15)
        .map(workload)
        .fold(Snapshot::default(), |s, e| fold(s, &e));
    snapshot::write_atomic(&wal_dir(t.path()), &state, 15).unwrap();
    let (wal, rec) = open(t.path(), opts(FsyncPolicy::No));
    assert_eq!((rec.snapshot_lsn, rec.last_lsn), (15, 15));
    assert!(rec.events.is_empty());
    assert!(segments(t.path()).is_empty(), "covered segment deleted");
    assert_eq!(wal.record(&workload(16)), 16);
    wal.flush_and_close().unwrap();
    drop(wal);
    let (_, rec) = open(t.path(), opts(FsyncPolicy::No));
    assert_eq!(rec.events, vec![workload(16)]);
    assert_eq!(segments(t.path())[0].0, 16);
}

#[test]
fn wal_corrupt_snapshot() {
    let t = TempDir::new("badsnap");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::No));
    record_all(&wal, &(1..=10).map(workload).collect::<Vec<_>>());
    let upto = wal.roll();
    let w = wal
        .write_snapshot(&snapshot::tests::sample(5), upto)
        .unwrap();
    record_all(&wal, &(11..=15).map(workload).collect::<Vec<_>>());
    wal.flush_and_close().unwrap();
    drop(wal);
    let mut b = fs::read(&w.path).unwrap();
    let n = b.len();
    b[n - 2] ^= 1;
    fs::write(&w.path, &b).unwrap();
    match Wal::open(t.path(), opts(FsyncPolicy::No)).unwrap_err() {
        WalError::Corrupt { file, .. } => assert_eq!(file, w.path),
        e => panic!("expected Corrupt, got {e}"),
    }
    // Repair cannot invent what the snapshot held: without it the remaining log is
    // unprovable too, so everything goes and the server starts empty (to be rebuilt
    // from the ledger).
    let (_, rec) = open(
        t.path(),
        WalOptions {
            repair: true,
            ..opts(FsyncPolicy::No)
        },
    );
    assert_eq!(rec.discarded_snapshots.len(), 1);
    assert!(rec.snapshot.is_none());
    assert!(rec.events.is_empty());
    assert!(rec.truncated_tail.unwrap().repaired);
}

#[test]
fn wal_reopen_loop_keeps_everything() {
    let t = TempDir::new("loop");
    let o = WalOptions {
        fsync: FsyncPolicy::EverySec,
        segment_bytes: 2048,
        ..WalOptions::default()
    };
    let mut all: Vec<Event> = Vec::new();
    for round in 0..20u64 {
        let (wal, rec) = open(t.path(), o.clone());
        assert_eq!(rec.last_lsn, all.len() as u64, "round {round}");
        assert_eq!(replay(&rec), all.iter().fold(Snapshot::default(), fold));
        assert_eq!(rec.truncated_tail, None);
        let n = 1 + (round * 7) % 40;
        let mut last = 0;
        for _ in 0..n {
            let e = workload(all.len() as u64 + 1);
            let lsn = wal.record(&e);
            assert_eq!(lsn, all.len() as u64 + 1, "LSNs continue across restarts");
            all.push(e);
            last = lsn;
        }
        if round % 2 == 0 {
            wal.wait_durable_blocking(last).unwrap();
        }
        if round % 5 == 4 {
            let upto = wal.roll();
            let state = all[..upto as usize].iter().fold(Snapshot::default(), fold);
            wal.write_snapshot(&state, upto).unwrap();
        }
        // Closing without waiting must still write everything recorded.
        assert_eq!(wal.flush_and_close().unwrap(), all.len() as u64);
    }
    let (_, rec) = open(t.path(), o);
    assert_eq!(replay(&rec), all.iter().fold(Snapshot::default(), fold));
    assert_eq!(rec.snapshot_lsn + rec.events.len() as u64, all.len() as u64);
}

#[test]
fn wal_write_error_fails_closed() {
    let t = TempDir::new("fail");
    let (wal, _) = open(t.path(), small_segments(1024));
    let a = wal.record(&workload(1));
    wal.wait_durable_blocking(a).unwrap();
    // The next segment cannot be created: the writer must fail, not acknowledge.
    fs::remove_dir_all(wal_dir(t.path())).unwrap();
    wal.roll();
    let b = wal.record(&workload(2));
    match wal.wait_durable_blocking(b) {
        Err(WalError::Failed { durable, .. }) => assert_eq!(durable, a),
        r => panic!("expected Failed, got {r:?}"),
    }
    assert!(wal.failure().is_some());
    // Sticky: later records are never acknowledged, and recording does not block.
    let mut c = 0;
    for i in 0..1000 {
        c = wal.record(&workload(3 + i));
    }
    assert!(wal.wait_durable_blocking(c).is_err());
    wal.wait_durable_blocking(a).unwrap();
    assert!(wal.flush_and_close().is_err());
    #[cfg(feature = "tokio")]
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(rt.block_on(wal.wait_durable(c)).is_err());
    }
}

#[test]
fn wal_directory_is_locked_while_open() {
    let t = TempDir::new("lock");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::No));
    assert!(matches!(
        Wal::open(t.path(), opts(FsyncPolicy::No)),
        Err(WalError::Locked(_))
    ));
    wal.flush_and_close().unwrap();
    // Released on close even while the Arc is still alive.
    let (_w2, _) = open(t.path(), opts(FsyncPolicy::No));
}

/// Throughput of record + wait with concurrent writers under each policy:
/// `cargo test --release -p stockgate-core wal_measure -- --ignored --nocapture`
#[test]
#[ignore]
fn wal_measure_group_commit() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::EverySec, FsyncPolicy::No] {
        let t = TempDir::new("measure");
        let (wal, _) = open(t.path(), opts(policy));
        let threads = 16u64;
        let per = if policy == FsyncPolicy::Always {
            2_000
        } else {
            50_000
        };
        let start = std::time::Instant::now();
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                let wal = wal.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        let lsn = wal.record(&reserved(th * 1_000_000 + i));
                        wal.wait_durable_blocking(lsn).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let took = start.elapsed();
        let stats = wal.stats();
        println!(
            "wal {policy}: {threads} threads x {per} record+wait: {:.0} records/s, {} batches ({:.1} records/batch), {} fdatasync",
            (threads * per) as f64 / took.as_secs_f64(),
            stats.batches,
            (threads * per) as f64 / stats.batches as f64,
            stats.syncs
        );
    }
}

#[test]
fn wal_unloggable_event_fails_closed() {
    let t = TempDir::new("toolarge");
    let (wal, _) = open(t.path(), opts(FsyncPolicy::No));
    let a = wal.record(&workload(1));
    wal.wait_durable_blocking(a).unwrap();
    let huge = Event::SaleAdjusted {
        sku: "x".into(),
        shard_deltas: vec![i64::MIN; record::MAX_PAYLOAD / 8],
    };
    let b = wal.record(&huge);
    assert!(matches!(
        wal.wait_durable_blocking(b),
        Err(WalError::Failed { .. })
    ));
    let c = wal.record(&workload(3));
    assert!(wal.wait_durable_blocking(c).is_err());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    /// A multi-segment log of `n` workload records; returns the events and the segments.
    fn build(data: &Path, n: u64) -> (Vec<Event>, Vec<(Lsn, PathBuf)>) {
        let (wal, _) = open(data, small_segments(512));
        let all: Vec<Event> = (1..=n).map(workload).collect();
        record_all(&wal, &all);
        wal.flush_and_close().unwrap();
        drop(wal);
        (all, segments(data))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Cutting the last segment anywhere loses exactly the records not wholly before
        /// the cut, and nothing else.
        #[test]
        fn wal_prop_cut_anywhere_in_last_segment(n in 1u64..60, at in any::<proptest::sample::Index>()) {
            let t = TempDir::new("propcut");
            let (all, segs) = build(t.path(), n);
            let (first, path) = segs.last().unwrap().clone();
            let len = fs::metadata(&path).unwrap().len();
            let cut = SEGMENT_HEADER_LEN + at.index((len - SEGMENT_HEADER_LEN + 1) as usize) as u64;
            let b = fs::read(&path).unwrap();
            fs::write(&path, &b[..cut as usize]).unwrap();
            let mut kept = first - 1;
            let mut off = SEGMENT_HEADER_LEN;
            while kept < n && off + encoded_len(&all[kept as usize]) <= cut {
                off += encoded_len(&all[kept as usize]);
                kept += 1;
            }
            let (wal, rec) = open(t.path(), small_segments(512));
            prop_assert_eq!(&rec.events[..], &all[..kept as usize]);
            prop_assert_eq!(rec.truncated_tail.is_some(), off != cut);
            prop_assert_eq!(wal.record(&workload(999)), kept + 1);
        }

        /// Whatever single byte is damaged, recovery never panics and never returns
        /// anything but a prefix of what was written; everything, when one bit of a
        /// record was flipped.
        #[test]
        fn wal_prop_damage_anywhere_yields_prefix_or_error(
            n in 1u64..60,
            which in any::<proptest::sample::Index>(),
            at in any::<proptest::sample::Index>(),
            x in 1u8..=255,
            repair in any::<bool>(),
        ) {
            let t = TempDir::new("propflip");
            let (all, segs) = build(t.path(), n);
            let path = &segs[which.index(segs.len())].1;
            let mut b = fs::read(path).unwrap();
            let i = at.index(b.len());
            b[i] ^= x;
            fs::write(path, &b).unwrap();
            let o = WalOptions { repair, ..small_segments(512) };
            // One flipped bit of a record (past the segment's header) is put right.
            let one_bit = x.count_ones() == 1 && i >= segment::SEGMENT_HEADER_LEN as usize;
            match Wal::open(t.path(), o) {
                Ok((_, rec)) if one_bit => {
                    prop_assert_eq!(&rec.events, &all);
                    prop_assert!(rec.truncated_tail.is_none());
                }
                Err(e) if one_bit => prop_assert!(false, "one flipped bit refused: {}", e),
                Ok((wal, rec)) => {
                    prop_assert!(rec.events.len() < all.len());
                    prop_assert_eq!(&rec.events[..], &all[..rec.events.len()]);
                    prop_assert!(rec.truncated_tail.is_some());
                    prop_assert_eq!(wal.record(&workload(999)), rec.last_lsn + 1);
                }
                Err(WalError::Corrupt { file, .. }) => {
                    prop_assert!(!repair);
                    prop_assert!(segs.iter().any(|(_, p)| *p == file));
                }
                Err(e) => prop_assert!(false, "unexpected error {}", e),
            }
        }
    }
}

/// Under `no` a segment left behind is synced when the next one starts: a power loss
/// then cuts the log's end, never a hole before a newer segment.
#[test]
fn wal_fsync_no_syncs_a_segment_when_it_is_left() {
    let t = TempDir::new("no-roll-sync");
    let (wal, _) = Wal::open_inline(t.path(), small_segments(2048)).unwrap();
    let mut last = 0;
    while segments(t.path()).len() < 3 {
        last = wal.record(&reserved(last + 1));
    }
    assert!(wal.stats().syncs >= 2, "{:?}", wal.stats().syncs);
    assert_eq!(wal.flush_and_close().unwrap(), last);
}
