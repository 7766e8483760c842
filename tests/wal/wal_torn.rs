//! Torn tail: a log written by the real binary (RESERVE n times, then SIGKILL), its last
//! segment cut at every byte offset inside its final record. Each cut log must start, hold
//! exactly the reservations before the final one (the final one absent, the counters
//! matching), have the torn bytes cut off the file, and keep appending correctly: the lost
//! request reserved again gets the same token and survives the next kill.
//!
//! Also: the final record in a segment of its own after a SAVE (cuts inside the segment
//! header too, recovery from the snapshot), and zero-filled tails (what preallocated or
//! never-written blocks look like after a crash).

use std::path::Path;

use crate::common::*;
use redis::aio::MultiplexedConnection;
use redis::Value;

const SKU: &str = "TORN";
const TOTAL: i64 = 1000;
const ARGS: &[&str] = &["--fsync", "always"];

#[derive(Clone, Debug)]
struct Reserved {
    token: String,
    user: String,
    rid: String,
}

/// Starts a server in `dir`, creates the sale, reserves `n` times (SAVE just before the
/// last one if `save_before_last`), then SIGKILLs it.
async fn produce(dir: &Path, n: usize, save_before_last: bool) -> Vec<Reserved> {
    let mut srv = Server::start_in(dir, ARGS);
    let keys = srv.keyring();
    let mut c = srv.conn().await;
    let r = cmd(
        &mut c,
        &["SALE.CREATE", SKU, &TOTAL.to_string(), "SHARDS", "4"],
    )
    .await
    .unwrap();
    assert_eq!(r, Value::Okay);
    let mut out = Vec::new();
    for i in 0..n {
        if save_before_last && i == n - 1 {
            assert_eq!(cmd(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);
        }
        let user = format!("user{}", i % 5);
        let rid = format!("req-{i}");
        let adm = keys.mint(SKU, &user, now_ms() + 3_600_000);
        let v = cmd(&mut c, &["RESERVE", SKU, &user, &adm, &rid])
            .await
            .unwrap();
        let Value::Array(v) = v else { panic!("{v:?}") };
        assert_eq!(as_str(&v[0]), "RESERVED");
        out.push(Reserved {
            token: as_str(&v[1]),
            user,
            rid,
        });
    }
    srv.kill9();
    out
}

/// The segment holding the final record and that record's span; checks that it is the
/// final reservation's record.
fn final_record(dir: &Path, last: &Reserved) -> (std::path::PathBuf, usize, usize) {
    let seg = wal_segments(dir).pop().expect("a segment");
    let bytes = std::fs::read(&seg).unwrap();
    let spans = record_spans(&bytes);
    let &(s, e) = spans.last().expect("a record");
    assert_eq!(e, bytes.len(), "the log ends with a whole record");
    assert!(
        contains_bytes(&bytes[s..e], last.token.as_bytes()),
        "the final record is the final reservation"
    );
    (seg, s, e)
}

/// The state must be: reservations `0..present` there and RESERVED, the rest absent,
/// counters matching.
async fn check_state(c: &mut MultiplexedConnection, res: &[Reserved], present: usize, what: &str) {
    for (i, r) in res.iter().enumerate() {
        let v = cmd(c, &["RESERVATION", &r.token]).await.unwrap();
        if i < present {
            assert!(
                !matches!(v, Value::Nil),
                "{what}: reservation {i} (before the cut) is missing"
            );
            assert_eq!(as_str(&field(&v, "state").unwrap()), "RESERVED", "{what}");
            assert_eq!(as_str(&field(&v, "request_id").unwrap()), r.rid, "{what}");
        } else {
            assert_eq!(
                v,
                Value::Nil,
                "{what}: reservation {i} (cut off) is present"
            );
        }
    }
    let info = cmd(c, &["SALE.INFO", SKU]).await.unwrap();
    let n = present as i64;
    assert_eq!(as_int(&field(&info, "reserved").unwrap()), n, "{what}");
    assert_eq!(
        as_int(&field(&info, "available").unwrap()),
        TOTAL - n,
        "{what}"
    );
    assert_eq!(as_int(&field(&info, "total").unwrap()), TOTAL, "{what}");
    assert_eq!(as_int(&cmd(c, &["DBSIZE"]).await.unwrap()), n, "{what}");
}

fn file_len(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

/// Starts on a damaged copy; panics with the server's stderr if it refuses.
fn start_ok(dir: &Path, what: &str) -> Server {
    try_start_in(dir, ARGS).unwrap_or_else(|f| {
        panic!(
            "{what}: server refused to start on a torn tail (exit {:?}):\n{}",
            f.code, f.stderr
        )
    })
}

/// Cuts copies of `orig` at each offset in `cuts` inside the final record (and checks the
/// recovered state); every `resume_every`-th cut also checks appending after the cut.
async fn cut_everywhere(orig: &Path, res: &[Reserved], cuts: std::ops::Range<usize>) -> usize {
    let n = res.len();
    let last = &res[n - 1];
    let (seg, s, _) = final_record(orig, last);
    let seg_name = seg.file_name().unwrap().to_owned();
    let mut resumed = 0;
    for cut in cuts {
        let what = format!("cut at byte {cut} (final record starts at {s})");
        let work = TempDir::new("torn-cut");
        copy_dir(orig, work.path());
        let wseg = work.path().join("wal").join(&seg_name);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&wseg)
            .unwrap()
            .set_len(cut as u64)
            .unwrap();
        let mut srv = start_ok(work.path(), &what);
        let mut c = srv.conn().await;
        check_state(&mut c, res, n - 1, &what).await;
        // The torn bytes are gone from the file (a segment left without a whole header
        // may be deleted and recreated empty).
        let len = file_len(&wseg);
        assert!(
            len == Some(s as u64) || (cut < 16 && matches!(len, None | Some(16))),
            "{what}: segment is {len:?} bytes after recovery, expected {s}"
        );
        // Appending after the cut: the lost request, sent again, is reserved afresh with
        // the same token, and survives another kill.
        let adm = srv.keyring().mint(SKU, &last.user, now_ms() + 600_000);
        let v = cmd(&mut c, &["RESERVE", SKU, &last.user, &adm, &last.rid])
            .await
            .unwrap();
        let Value::Array(v) = v else { panic!("{v:?}") };
        assert_eq!(as_str(&v[0]), "RESERVED", "{what}: {v:?}");
        assert_eq!(as_str(&v[1]), last.token, "{what}");
        srv.kill9();
        let srv = start_ok(work.path(), &what);
        let mut c = srv.conn().await;
        check_state(
            &mut c,
            res,
            n,
            &format!("{what}, re-reserved and killed again"),
        )
        .await;
        resumed += 1;
    }
    resumed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_torn_tail_cut_at_every_byte_of_the_final_record() {
    let orig = TempDir::new("torn-orig");
    let res = produce(orig.path(), 12, false).await;
    let (_, s, e) = final_record(orig.path(), &res[11]);
    // Untouched, everything is there.
    {
        let work = TempDir::new("torn-whole");
        copy_dir(orig.path(), work.path());
        let srv = start_ok(work.path(), "untouched");
        check_state(&mut srv.conn().await, &res, 12, "untouched log").await;
    }
    let t = std::time::Instant::now();
    let n = cut_everywhere(orig.path(), &res, s..e).await;
    assert_eq!(n, e - s);
    eprintln!("{n} cuts of a {}-byte record in {:?}", e - s, t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_torn_tail_in_fresh_segment_after_snapshot() {
    // SAVE rolls the log: the final record is alone in the newest segment, after the
    // snapshot. Cut at every offset of that segment, its header included.
    let orig = TempDir::new("torn-snap");
    let res = produce(orig.path(), 8, true).await;
    let (seg, s, e) = final_record(orig.path(), &res[7]);
    assert_eq!(s, 16, "the final record is the first of its segment");
    let snaps = std::fs::read_dir(orig.path().join("wal"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("snapshot-") && name.ends_with(".snap")
        })
        .count();
    assert_eq!(snaps, 1, "SAVE left a snapshot");
    assert!(file_len(&seg) == Some(e as u64));
    let n = cut_everywhere(orig.path(), &res, 0..e).await;
    assert_eq!(n, e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_zero_filled_tail_is_a_torn_tail() {
    let orig = TempDir::new("torn-zero");
    let res = produce(orig.path(), 6, false).await;
    let (seg, s, e) = final_record(orig.path(), &res[5]);
    let seg_name = seg.file_name().unwrap().to_owned();

    // The final record's blocks never written: zeros where it was.
    let work = TempDir::new("torn-zero-rec");
    copy_dir(orig.path(), work.path());
    let wseg = work.path().join("wal").join(&seg_name);
    let mut bytes = std::fs::read(&wseg).unwrap();
    bytes[s..e].fill(0);
    std::fs::write(&wseg, &bytes).unwrap();
    let srv = start_ok(work.path(), "zeroed final record");
    check_state(&mut srv.conn().await, &res, 5, "zeroed final record").await;
    assert_eq!(file_len(&wseg), Some(s as u64));
    drop(srv);

    // Its payload half written: length and CRC there, the rest zeros.
    let work = TempDir::new("torn-zero-half");
    copy_dir(orig.path(), work.path());
    let wseg = work.path().join("wal").join(&seg_name);
    let mut bytes = std::fs::read(&wseg).unwrap();
    bytes[(s + e) / 2..e].fill(0);
    std::fs::write(&wseg, &bytes).unwrap();
    let srv = start_ok(work.path(), "half-zeroed final record");
    check_state(&mut srv.conn().await, &res, 5, "half-zeroed final record").await;
    drop(srv);

    // Preallocated space after a whole log: nothing lost, the zeros cut off.
    let work = TempDir::new("torn-zero-tail");
    copy_dir(orig.path(), work.path());
    let wseg = work.path().join("wal").join(&seg_name);
    let mut bytes = std::fs::read(&wseg).unwrap();
    bytes.extend(std::iter::repeat_n(0u8, 64 * 1024));
    std::fs::write(&wseg, &bytes).unwrap();
    let srv = start_ok(work.path(), "zeros after the log");
    check_state(&mut srv.conn().await, &res, 6, "zeros after the log").await;
    assert_eq!(file_len(&wseg), Some(e as u64));
}
