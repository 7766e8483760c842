//! Corruption: damage that is not a torn tail. The real binary must refuse to start
//! (non-zero exit) and name the file and the offset of the first bad record on stderr;
//! `--repair` then starts with exactly what came before that record, and the repaired log
//! starts cleanly afterwards without `--repair`.
//!
//! Cases: a byte damaged (two bits) in a middle record's payload, CRC or length; the last
//! record of an older segment damaged or cut short (not the end of the log, so not a torn
//! tail); a damaged snapshot. One flipped bit in any record is put right instead.

use std::path::{Path, PathBuf};

use crate::common::*;
use redis::aio::MultiplexedConnection;
use redis::Value;

const SKU: &str = "CORR";
const TOTAL: i64 = 1_000_000;

/// Reserves `n` times over one connection (pipelined in chunks, so log order is request
/// order) and returns the tokens.
async fn reserve_n(
    srv: &Server,
    c: &mut MultiplexedConnection,
    from: usize,
    n: usize,
) -> Vec<String> {
    let keys = srv.keyring();
    let exp = now_ms() + 3_600_000;
    let mut tokens = Vec::new();
    let ids: Vec<usize> = (from..from + n).collect();
    for chunk in ids.chunks(1000) {
        let mut p = redis::pipe();
        for i in chunk {
            let user = format!("user{}", i % 7);
            p.cmd("RESERVE")
                .arg(SKU)
                .arg(&user)
                .arg(keys.mint(SKU, &user, exp))
                .arg(format!("req-{i}"));
        }
        let vs: Vec<Value> = p.query_async(c).await.unwrap();
        for v in vs {
            let Value::Array(v) = v else { panic!("{v:?}") };
            assert_eq!(as_str(&v[0]), "RESERVED");
            tokens.push(as_str(&v[1]));
        }
    }
    tokens
}

async fn produce(dir: &Path, n: usize, extra: &[&str]) -> Vec<String> {
    let mut srv = Server::start_in(dir, extra);
    let mut c = srv.conn().await;
    let r = cmd(
        &mut c,
        &["SALE.CREATE", SKU, &TOTAL.to_string(), "SHARDS", "8"],
    )
    .await
    .unwrap();
    assert_eq!(r, Value::Okay);
    let tokens = reserve_n(&srv, &mut c, 0, n).await;
    srv.kill9();
    tokens
}

/// The span of the record holding `token` in `seg`.
fn span_of(seg: &Path, token: &str) -> (usize, usize) {
    let bytes = std::fs::read(seg).unwrap();
    record_spans(&bytes)
        .into_iter()
        .find(|&(s, e)| contains_bytes(&bytes[s..e], token.as_bytes()))
        .unwrap_or_else(|| panic!("no record of {token} in {}", seg.display()))
}

/// `offset <n>` followed by something other than a digit.
fn names_offset(stderr: &str, offset: usize) -> bool {
    let pat = format!("offset {offset}");
    stderr.match_indices(&pat).any(|(i, _)| {
        !stderr[i + pat.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

fn assert_refused(dir: &Path, file: &Path, offset: Option<usize>, what: &str) {
    match try_start_in(dir, &[]) {
        Ok(mut srv) => {
            srv.kill9();
            panic!("{what}: the server started on a corrupt log");
        }
        Err(f) => {
            assert!(
                f.code.is_some_and(|c| c != 0),
                "{what}: exit {:?}, stderr:\n{}",
                f.code,
                f.stderr
            );
            let name = file.file_name().unwrap().to_string_lossy();
            assert!(
                f.stderr.contains(&*name),
                "{what}: stderr does not name {name}:\n{}",
                f.stderr
            );
            if let Some(off) = offset {
                assert!(
                    names_offset(&f.stderr, off),
                    "{what}: stderr does not name offset {off}:\n{}",
                    f.stderr
                );
            }
        }
    }
}

/// Reservations `tokens[i]` for which `present(i)` holds must be there, the others absent;
/// the counters must match.
async fn check_exact(
    c: &mut MultiplexedConnection,
    tokens: &[String],
    present: impl Fn(usize) -> bool,
    what: &str,
) {
    let mut n = 0i64;
    for chunk in tokens.chunks(1000).enumerate() {
        let (ci, chunk) = chunk;
        let mut p = redis::pipe();
        for t in chunk {
            p.cmd("RESERVATION").arg(t);
        }
        let vs: Vec<Value> = p.query_async(c).await.unwrap();
        for (j, v) in vs.iter().enumerate() {
            let i = ci * 1000 + j;
            if present(i) {
                assert!(!matches!(v, Value::Nil), "{what}: reservation {i} lost");
                assert_eq!(as_str(&field(v, "state").unwrap()), "RESERVED", "{what}");
                n += 1;
            } else {
                assert_eq!(*v, Value::Nil, "{what}: reservation {i} should be gone");
            }
        }
    }
    let info = cmd(c, &["SALE.INFO", SKU]).await.unwrap();
    assert_eq!(as_int(&field(&info, "reserved").unwrap()), n, "{what}");
    assert_eq!(
        as_int(&field(&info, "available").unwrap()),
        TOTAL - n,
        "{what}"
    );
    assert_eq!(as_int(&cmd(c, &["DBSIZE"]).await.unwrap()), n, "{what}");
}

/// Refused as is; `--repair` keeps reservations for which `present` holds; a plain restart
/// of the repaired log works and keeps the same; new reservations go on.
async fn refuse_then_repair(
    dir: &Path,
    file: &Path,
    offset: usize,
    tokens: &[String],
    present: impl Fn(usize) -> bool + Copy,
    what: &str,
) {
    assert_refused(dir, file, Some(offset), what);
    // Refusing changed nothing: still refused.
    assert_refused(dir, file, Some(offset), &format!("{what} (second start)"));
    let mut srv = try_start_in(dir, &["--repair"]).unwrap_or_else(|f| {
        panic!(
            "{what}: --repair refused (exit {:?}):\n{}",
            f.code, f.stderr
        )
    });
    check_exact(
        &mut srv.conn().await,
        tokens,
        present,
        &format!("{what}, repaired"),
    )
    .await;
    srv.kill9();
    let mut srv = try_start_in(dir, &[]).unwrap_or_else(|f| {
        panic!(
            "{what}: the repaired log does not start without --repair (exit {:?}):\n{}",
            f.code, f.stderr
        )
    });
    let mut c = srv.conn().await;
    check_exact(&mut c, tokens, present, &format!("{what}, after repair")).await;
    let more = reserve_n(&srv, &mut c, 1_000_000, 3).await;
    srv.kill9();
    let srv = try_start_in(dir, &[]).expect("restart after repair and more traffic");
    let mut c = srv.conn().await;
    let mut all: Vec<String> = tokens.to_vec();
    all.extend(more);
    let n = tokens.len();
    check_exact(
        &mut c,
        &all,
        |i| i >= n || present(i),
        &format!("{what}, resumed"),
    )
    .await;
}

fn flip(path: &Path, at: usize, mask: u8) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= mask;
    std::fs::write(path, b).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_corrupt_middle_record_refuses_and_repair_keeps_what_came_before() {
    let orig = TempDir::new("corrupt-orig");
    let tokens = produce(orig.path(), 20, &["--fsync", "always"]).await;
    let segs = wal_segments(orig.path());
    assert_eq!(segs.len(), 1);
    let (s, e) = span_of(&segs[0], &tokens[9]);
    let payload_mid = s + 8 + (e - s - 8) / 2;
    // Two bits each: one flipped bit is put right (below), two are damage.
    let cases: [(&str, usize, u8); 5] = [
        ("payload byte damaged", payload_mid, 0x41),
        ("payload's last byte damaged", e - 1, 0x03),
        ("CRC byte damaged", s + 5, 0x81),
        ("length off by three", s, 0x03),
        ("length huge", s + 3, 0x41),
    ];
    for (what, at, mask) in cases {
        let work = TempDir::new("corrupt-mid");
        copy_dir(orig.path(), work.path());
        let seg = wal_segments(work.path()).remove(0);
        flip(&seg, at, mask);
        refuse_then_repair(work.path(), &seg, s, &tokens, |i| i < 9, what).await;
    }
}

/// One flipped bit, in a middle record or in the last one (which would otherwise pass
/// for a torn write and be cut, an acknowledged reservation with it): the server starts
/// with every reservation, and the file is put right on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_one_flipped_bit_anywhere_in_a_record_is_put_right() {
    let orig = TempDir::new("flip-orig");
    let tokens = produce(orig.path(), 20, &["--fsync", "always"]).await;
    let seg = wal_segments(orig.path()).remove(0);
    let written = std::fs::read(&seg).unwrap();
    let (s, e) = span_of(&seg, &tokens[9]);
    let (ls, le) = span_of(&seg, &tokens[19]);
    assert_eq!(le, written.len(), "the last reservation is the last record");
    let cases: [(&str, usize, u8); 6] = [
        ("a middle record's payload", s + 8 + (e - s - 8) / 2, 0x40),
        ("a middle record's CRC", s + 5, 0x80),
        ("a middle record's length", s, 0x01),
        ("the last record's payload", le - 1, 0x01),
        ("the last record's CRC", ls + 6, 0x02),
        ("the last record's length", ls + 1, 0x08),
    ];
    for (what, at, mask) in cases {
        let work = TempDir::new("flip");
        copy_dir(orig.path(), work.path());
        let seg = wal_segments(work.path()).remove(0);
        flip(&seg, at, mask);
        let srv = try_start_in(work.path(), &[])
            .unwrap_or_else(|f| panic!("{what}: refused (exit {:?}):\n{}", f.code, f.stderr));
        check_exact(&mut srv.conn().await, &tokens, |_| true, what).await;
        drop(srv);
        assert_eq!(
            std::fs::read(&seg).unwrap()[..written.len()],
            written[..],
            "{what}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_corrupt_end_of_an_older_segment_is_not_a_torn_tail() {
    // 1 MiB segments: ~14k reservation records fill one.
    let orig = TempDir::new("corrupt-seg");
    let tokens = produce(orig.path(), 30_000, &["--segment-mib", "1"]).await;
    let segs = wal_segments(orig.path());
    assert!(segs.len() >= 2, "expected a rolled log, got {segs:?}");
    let first = std::fs::read(&segs[0]).unwrap();
    let spans = record_spans(&first);
    let &(s, e) = spans.last().unwrap();
    assert_eq!(e, first.len(), "older segment ends with a whole record");
    // Tokens are stored verbatim: `{CORR}` and 26 base32 characters.
    let tag = format!("{{{SKU}}}");
    let logged: std::collections::HashSet<&[u8]> = first[..s]
        .windows(tag.len())
        .enumerate()
        .filter(|(_, w)| *w == tag.as_bytes())
        .map(|(i, _)| &first[i..i + tag.len() + 26])
        .collect();
    let kept: Vec<bool> = tokens
        .iter()
        .map(|t| logged.contains(t.as_bytes()))
        .collect();
    assert!(kept.iter().any(|&k| k) && !kept.iter().all(|&k| k));

    // A damaged byte (two bits) in its last record.
    let work = TempDir::new("corrupt-seg-flip");
    copy_dir(orig.path(), work.path());
    let seg = wal_segments(work.path()).remove(0);
    flip(&seg, e - 3, 0x30);
    refuse_then_repair(
        work.path(),
        &seg,
        s,
        &tokens,
        |i| kept[i],
        "older segment's last record flipped",
    )
    .await;

    // Its last record cut short: records are missing in the middle of the log.
    let work = TempDir::new("corrupt-seg-cut");
    copy_dir(orig.path(), work.path());
    let seg = wal_segments(work.path()).remove(0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len((s + e) as u64 / 2)
        .unwrap();
    refuse_then_repair(
        work.path(),
        &seg,
        s,
        &tokens,
        |i| kept[i],
        "older segment's last record cut short",
    )
    .await;

    // A whole older segment missing (no snapshot covers it): records are missing.
    let work = TempDir::new("corrupt-seg-gap");
    copy_dir(orig.path(), work.path());
    let segs = wal_segments(work.path());
    std::fs::remove_file(&segs[0]).unwrap();
    assert_refused(work.path(), &segs[1], Some(0), "the first segment deleted");
}

fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_corrupt_snapshot_refuses_to_start() {
    let orig = TempDir::new("corrupt-snap");
    let mut srv = Server::start_in(orig.path(), &["--fsync", "always"]);
    let mut c = srv.conn().await;
    assert_eq!(
        cmd(&mut c, &["SALE.CREATE", SKU, &TOTAL.to_string()])
            .await
            .unwrap(),
        Value::Okay
    );
    let mut tokens = reserve_n(&srv, &mut c, 0, 50).await;
    assert_eq!(cmd(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);
    tokens.extend(reserve_n(&srv, &mut c, 50, 10).await);
    srv.kill9();
    let snaps = snapshot_files(orig.path());
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let len = std::fs::metadata(&snaps[0]).unwrap().len() as usize;

    // Intact: snapshot + tail.
    let work = TempDir::new("corrupt-snap-ok");
    copy_dir(orig.path(), work.path());
    let srv = try_start_in(work.path(), &[]).expect("intact snapshot starts");
    check_exact(&mut srv.conn().await, &tokens, |_| true, "snapshot + tail").await;
    drop(srv);

    for (what, at) in [
        ("snapshot body", len / 2),
        ("snapshot's last byte", len - 1),
    ] {
        let work = TempDir::new("corrupt-snap-bad");
        copy_dir(orig.path(), work.path());
        let snap = snapshot_files(work.path()).remove(0);
        flip(&snap, at, 0x20);
        assert_refused(work.path(), &snap, None, what);
        // The segments the snapshot covered are gone, so nothing can prove the sale's
        // state: whatever --repair does, it must not sell from a state it cannot prove.
        if let Ok(srv) = try_start_in(work.path(), &["--repair"]) {
            let mut c = srv.conn().await;
            let keys = srv.keyring();
            let adm = keys.mint(SKU, "late", now_ms() + 60_000);
            let r = cmd(&mut c, &["RESERVE", SKU, "late", &adm, "late-1"]).await;
            match r {
                Err(e) => assert!(
                    matches!(e.code(), Some("NOSALE") | Some("FENCED")),
                    "{what}: after repair: {e}"
                ),
                Ok(v) => panic!("{what}: repaired server without the snapshot sells: {v:?}"),
            }
        }
    }
}
