//! `BACKUP <dir>` of a running single node: taken while reservers, committers and a
//! consumer group reader run, the copy restores to exactly the state after the LSN it
//! reports. "Exactly" is checked against an independent reference: after the load, the
//! source is stopped and its own data dir cut by this test after the record at that LSN
//! (from the record framing alone, `crate::common::record_spans`); a server on the backup and a
//! server on the reference must answer every SALE.INFO, every RESERVATION of every token
//! handed out, the feed (XRANGE), the consumer groups (XINFO GROUPS, XPENDING) and DBSIZE
//! alike. Every reservation acknowledged before BACKUP was sent is in the copy, none
//! acknowledged after its reply is. Also: a non-empty target is refused, an unwritable one
//! fails cleanly and the server keeps serving.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use redis::Value;

const SKUS: [&str; 3] = ["BA", "BB", "BC"];
const FEED: &str = "stockgate:events";

fn q(c: &mut redis::Connection, args: &[&str]) -> Result<Value, String> {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query(c).map_err(|e| e.to_string())
}

fn ok(c: &mut redis::Connection, args: &[&str]) -> Value {
    q(c, args).unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")))
}

/// Everything the comparison covers, as the server answers it.
fn dump(s: &Server, tokens: &[String], snapshot_lsn: i64) -> Vec<(String, Result<Value, String>)> {
    let mut c = s.client().get_connection().expect("connect");
    let mut out = Vec::new();
    let mut ask = |c: &mut redis::Connection, args: &[&str]| {
        out.push((args.join(" "), q(c, args)));
    };
    for sku in SKUS {
        ask(&mut c, &["SALE.INFO", sku]);
    }
    for t in tokens {
        ask(&mut c, &["RESERVATION", t]);
    }
    let from = (snapshot_lsn + 1).to_string();
    ask(&mut c, &["XRANGE", FEED, "-", "+"]);
    ask(&mut c, &["XRANGE", FEED, &from, "+"]);
    ask(&mut c, &["XINFO", "GROUPS", FEED]);
    // The summary form: the extended one shows idle times, which move with the clock.
    ask(&mut c, &["XPENDING", FEED, "g1"]);
    ask(&mut c, &["DBSIZE"]);
    out
}

fn info_field(c: &mut redis::Connection, name: &str) -> i64 {
    let text = as_str(&ok(c, &["INFO", "persistence"]));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

/// The source's data dir cut after the record at `lsn`: segments after it deleted, the
/// one holding it truncated after it.
fn cut_after(data: &Path, lsn: u64) {
    for seg in wal_segments(data) {
        let name = seg
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let first: u64 = name["wal-".len()..name.len() - ".log".len()]
            .parse()
            .expect("segment lsn");
        if first > lsn {
            std::fs::remove_file(&seg).expect("remove segment");
            continue;
        }
        let bytes = std::fs::read(&seg).expect("read segment");
        let spans = record_spans(&bytes);
        let keep = (lsn - first + 1) as usize;
        if keep < spans.len() {
            let end = spans[keep - 1].1;
            std::fs::write(&seg, &bytes[..end]).expect("cut segment");
        }
    }
    for e in std::fs::read_dir(data.join("wal")).expect("wal") {
        let p = e.expect("entry").path();
        let n = p.file_name().expect("name").to_string_lossy().into_owned();
        if let Some(l) = n
            .strip_prefix("snapshot-")
            .and_then(|n| n.strip_suffix(".snap"))
        {
            assert!(
                l.parse::<u64>().expect("snapshot lsn") <= lsn,
                "a snapshot after the backup: {n}"
            );
        }
    }
}

struct Load {
    stop: Arc<AtomicBool>,
    tokens: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn start_load(s: &Server) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let queue = Arc::new(Mutex::new(VecDeque::new()));
    let mut threads = Vec::new();
    for w in 0..2 {
        let (stop, tokens, queue) = (stop.clone(), tokens.clone(), queue.clone());
        let client = s.client();
        let keys = s.keyring();
        threads.push(std::thread::spawn(move || {
            let mut c = client.get_connection().expect("connect");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let sku = SKUS[(i % 3) as usize];
                let user = format!("w{w}u{i}");
                let adm = keys.mint(sku, &user, now_ms() + 60_000);
                let rid = format!("r{i}");
                let v = ok(&mut c, &["RESERVE", sku, &user, &adm, &rid, "QTY", "1"]);
                let Value::Array(v) = v else { panic!("{v:?}") };
                assert_eq!(as_str(&v[0]), "RESERVED");
                let t = as_str(&v[1]);
                tokens.lock().expect("tokens").push(t.clone());
                queue.lock().expect("queue").push_back(t);
            }
        }));
    }
    {
        let (stop, queue) = (stop.clone(), queue.clone());
        let client = s.client();
        threads.push(std::thread::spawn(move || {
            let mut c = client.get_connection().expect("connect");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let next = queue.lock().expect("queue").pop_front();
                let Some(t) = next else {
                    std::thread::yield_now();
                    continue;
                };
                i += 1;
                // Every third hold stays live: the copy carries holds of every state.
                match i % 3 {
                    0 => assert_eq!(as_int(&ok(&mut c, &["COMMIT", &t])), 1),
                    1 => assert_eq!(as_int(&ok(&mut c, &["RELEASE", &t])), 1),
                    _ => {}
                }
            }
        }));
    }
    {
        let stop = stop.clone();
        let client = s.client();
        threads.push(std::thread::spawn(move || {
            let mut c = client.get_connection().expect("connect");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let consumer = format!("c{}", n % 2);
                let v = ok(
                    &mut c,
                    &[
                        "XREADGROUP",
                        "GROUP",
                        "g1",
                        &consumer,
                        "COUNT",
                        "50",
                        "STREAMS",
                        FEED,
                        ">",
                    ],
                );
                // Ack the first entry of each read: the group keeps pending entries too.
                if let Value::Array(streams) = &v {
                    if let Some(Value::Array(s)) = streams.first() {
                        if let Some(Value::Array(entries)) = s.get(1) {
                            if let Some(Value::Array(e)) = entries.first() {
                                let id = as_str(&e[0]);
                                ok(&mut c, &["XACK", FEED, "g1", &id]);
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }));
    }
    Load {
        stop,
        tokens,
        threads,
    }
}

fn run_for(load: &Load, d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::thread::sleep(Duration::from_millis(20));
        for h in &load.threads {
            assert!(!h.is_finished(), "a load thread stopped early");
        }
    }
}

#[test]
fn a_backup_under_load_restores_exactly_the_state_at_its_lsn() {
    let dir = TempDir::new("backup");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).expect("src");
    // No automatic snapshot: the reference is the source's own log, cut by the test.
    // The feed keeps the log SAVE covers, so the group reads on and the copy holds more
    // than one segment.
    let flags = [
        "--snapshot-records",
        "100000000",
        "--retention-ms",
        "3600000",
        "--feed-retention",
        "1GiB",
    ];
    let mut s = Server::start_in(&src, &flags);
    let mut c = s.client().get_connection().expect("connect");
    for sku in SKUS {
        ok(&mut c, &["SALE.CREATE", sku, "1000000", "SHARDS", "4"]);
    }
    ok(&mut c, &["XGROUP", "CREATE", FEED, "g1", "0"]);

    let load = start_load(&s);
    run_for(&load, Duration::from_millis(400));
    // A snapshot: the copy is a snapshot plus a log tail with the group checkpoint in it.
    ok(&mut c, &["SAVE"]);
    run_for(&load, Duration::from_millis(400));

    let acked_before = load.tokens.lock().expect("tokens").len();
    let target = dir.path().join("copy");
    let target_s = target.to_string_lossy().into_owned();
    let reply = ok(&mut c, &["BACKUP", &target_s]);
    let acked_after_reply = load.tokens.lock().expect("tokens").len();
    let lsn = as_int(&field(&reply, "lsn").expect("lsn")) as u64;
    let snapshot_lsn = as_int(&field(&reply, "snapshot_lsn").expect("snapshot_lsn"));
    assert!(
        snapshot_lsn > 0,
        "the copy holds the snapshot SAVE wrote: {reply:?}"
    );
    assert_eq!(as_str(&field(&reply, "dir").expect("dir")), target_s);
    run_for(&load, Duration::from_millis(400));

    // A non-empty target is refused and left alone.
    let full = dir.path().join("full");
    std::fs::create_dir_all(&full).expect("full");
    std::fs::write(full.join("keep"), b"x").expect("keep");
    let e = q(&mut c, &["BACKUP", &full.to_string_lossy()]).expect_err("non-empty target");
    assert!(e.contains("exists and is not an empty directory"), "{e}");
    assert_eq!(std::fs::read_dir(&full).expect("full").count(), 1);
    // A place that cannot be written: a plain error, and the server keeps serving.
    let e = q(&mut c, &["BACKUP", "/proc/stockgate-backup"]).expect_err("unwritable target");
    assert!(e.contains("BACKUP: create backup directory"), "{e}");
    assert_eq!(as_str(&ok(&mut c, &["PING"])), "PONG");
    let e = q(&mut c, &["BACKUP", "relative/dir"]).expect_err("relative target");
    assert!(e.contains("not an absolute path"), "{e}");
    run_for(&load, Duration::from_millis(200));

    load.stop.store(true, Ordering::Relaxed);
    for h in load.threads {
        h.join().expect("load thread");
    }
    let tokens = load.tokens.lock().expect("tokens").clone();
    assert!(
        acked_before > 50 && tokens.len() > acked_after_reply + 20,
        "load before ({acked_before}) and after ({}) the backup",
        tokens.len() - acked_after_reply
    );
    drop(c);
    assert_eq!(s.terminate(), Some(0));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("backup-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let reference = dir.path().join("reference");
    copy_dir(&src, &reference);
    let _ = std::fs::remove_file(reference.join("wal/LOCK"));
    cut_after(&reference, lsn);

    let key = src.join("reservation.key").to_string_lossy().into_owned();
    let secret = src.join("secret").to_string_lossy().into_owned();
    let mut restored_flags = flags.to_vec();
    restored_flags.extend(["--reservation-key-file", &key, "--secret-file", &secret]);
    let b = Server::start_in(&target, &restored_flags);
    let r = Server::start_in(&reference, &flags);
    let mut bc = b.client().get_connection().expect("connect");
    assert_eq!(info_field(&mut bc, "wal_last_lsn"), lsn as i64);
    let restored = dump(&b, &tokens, snapshot_lsn);
    let expected = dump(&r, &tokens, snapshot_lsn);
    assert_eq!(restored.len(), expected.len());
    for (got, want) in restored.iter().zip(&expected) {
        assert_eq!(got, want, "the copy differs from the source at LSN {lsn}");
    }
    for t in &tokens[..acked_before] {
        assert_ne!(
            ok(&mut bc, &["RESERVATION", t]),
            Value::Nil,
            "{t} was acknowledged before BACKUP"
        );
    }
    for t in &tokens[acked_after_reply..] {
        assert_eq!(
            ok(&mut bc, &["RESERVATION", t]),
            Value::Nil,
            "{t} was acknowledged after BACKUP's reply"
        );
    }
    let groups = ok(&mut bc, &["XINFO", "GROUPS", FEED]);
    let Value::Array(g) = &groups else {
        panic!("{groups:?}")
    };
    assert_eq!(g.len(), 1, "the consumer group is in the copy: {groups:?}");
    assert!(
        as_int(&field(&g[0], "pending").expect("pending")) > 0,
        "{groups:?}"
    );
}
