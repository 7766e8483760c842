//! Consumer groups on the order feed against the real server: redis-py's group commands
//! over a scripted workload (exactly once across two consumers, in log order; XACK,
//! XAUTOCLAIM, BLOCK); group state surviving kill -9, snapshots that delete the segments
//! holding its records, and both; retention with a lagging group.

use crate::common::ha::free_port;

use std::process::Command;

use crate::common::*;

fn py(srv: &Server, args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/groups.py");
    let out = Command::new("timeout")
        .arg("120")
        .arg("python3")
        .arg(script)
        .arg(srv.port.to_string())
        .arg(&srv.data_dir)
        .args(args)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "redis-py groups {args:?} failed (needs `pip install redis`):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The whole redis-py scenario, then kill -9 and restart: the group's last-delivered id
/// and pending list (owners, delivery counts) are back, and reading on delivers exactly
/// the entries not delivered before the crash.
#[test]
fn groups_redis_py_exactly_once_and_state_survives_kill9() {
    let tmp = TempDir::new("groups-py");
    let mut srv = Server::start_in(tmp.path(), &[]);
    let out = py(&srv, &["run"]);
    assert!(out.contains("redis-py groups ok"), "{out}");
    let state = out
        .lines()
        .find_map(|l| l.strip_prefix("STATE "))
        .expect("state line")
        .to_owned();
    let dir = srv.data_dir.clone();
    srv.kill9();
    let srv = Server::start_in(&dir, &[]);
    let out = py(&srv, &["check", &state]);
    assert!(out.contains("redis-py groups check ok"), "{out}");
}

fn q(con: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn sale_adjusts(con: &mut redis::Connection, sku: &str, n: usize) {
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("SALE.ADJUST").arg(sku).arg(1).ignore();
        if i % 500 == 499 {
            p.query::<()>(con).unwrap();
            p = redis::pipe();
        }
    }
    p.query::<()>(con).unwrap();
}

/// Ids of an XREADGROUP reply on one stream (RESP2).
fn read_ids(v: &redis::Value) -> Vec<u64> {
    let redis::Value::Array(streams) = v else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in streams {
        let redis::Value::Array(kv) = s else {
            panic!("{s:?}")
        };
        let redis::Value::Array(entries) = &kv[1] else {
            panic!("{kv:?}")
        };
        for e in entries {
            let redis::Value::Array(e) = e else {
                panic!("{e:?}")
            };
            let id = as_str(&e[0]);
            out.push(id.trim_end_matches("-0").parse().unwrap());
        }
    }
    out
}

fn pending(con: &mut redis::Connection, stream: &str, group: &str) -> Vec<(u64, String, i64)> {
    let v = q(con, &["XPENDING", stream, group, "-", "+", "1000"]);
    let redis::Value::Array(items) = v else {
        panic!("{v:?}")
    };
    items
        .iter()
        .map(|it| {
            let redis::Value::Array(f) = it else {
                panic!("{it:?}")
            };
            (
                as_str(&f[0]).trim_end_matches("-0").parse().unwrap(),
                as_str(&f[1]),
                as_int(&f[3]),
            )
        })
        .collect()
}

/// A plain HTTP/1.0 GET (bounded wait for the endpoint to come up).
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
            let mut body = String::new();
            if s.read_to_string(&mut body).is_ok() && body.contains("\r\n\r\n") {
                return body;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{addr}{path} never answered"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn info_feed(con: &mut redis::Connection) -> String {
    let v = q(con, &["INFO", "feed"]);
    as_str(&v)
}

fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|s| s.trim().to_owned())
}

/// A snapshot deletes the segments that held the group's records (the default keeps
/// nothing for the feed): its checkpoint carries the state across, through kill -9,
/// twice; a caught-up group is not "trimmed" by records that were only its own.
#[test]
fn groups_state_survives_snapshots_that_delete_its_records() {
    // The test owns the data dir: each restart replaces the server (and its handle).
    let tmp = TempDir::new("groups-snap");
    let dir = tmp.path().to_path_buf();
    let mut srv = Server::start_in(&dir, &["--segment-mib", "1"]);
    let mut con = srv.client().get_connection().unwrap();
    let s = "{SNAPG}:events";
    q(
        &mut con,
        &["SALE.CREATE", "SNAPG", "1000", "SHARDS", "1024"],
    );
    q(&mut con, &["XGROUP", "CREATE", s, "g", "0"]);
    sale_adjusts(&mut con, "SNAPG", 1500); // ~1.5 MiB: at least one closed segment
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "COUNT",
            "5",
            "STREAMS",
            s,
            ">",
        ],
    );
    let first5 = read_ids(&v);
    assert_eq!(first5.len(), 5, "{v:?}");
    q(&mut con, &["XACK", s, "g", &format!("{}-0", first5[0])]);
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c2",
            "COUNT",
            "2",
            "STREAMS",
            s,
            ">",
        ],
    );
    let next2 = read_ids(&v);
    assert_eq!(next2.len(), 2);
    let want: Vec<(u64, String, i64)> = first5[1..]
        .iter()
        .map(|i| (*i, "c1".to_owned(), 1))
        .chain(next2.iter().map(|i| (*i, "c2".to_owned(), 1)))
        .collect();
    assert_eq!(pending(&mut con, s, "g"), want);
    // The rest is delivered without acknowledgement: the group is caught up.
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c2",
            "COUNT",
            "10000",
            "NOACK",
            "STREAMS",
            s,
            ">",
        ],
    );
    let rest = read_ids(&v);
    assert_eq!(rest.len(), 1 + 1500 - 7);
    let last = *rest.last().unwrap();

    q(&mut con, &["SAVE"]);
    let first: u64 = info_field(&info_feed(&mut con), "feed_first_lsn")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        first > next2[1],
        "the snapshot did not delete the segments holding the group's records (first lsn {first})"
    );
    for _ in 0..2 {
        srv.kill9();
        srv = Server::start_in(&dir, &["--segment-mib", "1"]);
        con = srv.client().get_connection().unwrap();
        assert_eq!(
            pending(&mut con, s, "g"),
            want,
            "pending list after restart"
        );
        let groups = q(&mut con, &["XINFO", "GROUPS", s]);
        let g = format!("{groups:?}");
        assert!(
            g.contains(&format!("\"{last}-0\"")),
            "last-delivered-id: {g}"
        );
        // Caught up: its own deleted records do not make its position "trimmed".
        let v = q(
            &mut con,
            &["XREADGROUP", "GROUP", "g", "c1", "STREAMS", s, ">"],
        );
        assert_eq!(v, redis::Value::Nil);
        // Its pending entries left the log with their segments: `[id, nil]`, as Redis
        // answers for deleted entries, and nothing changes.
        let v = q(
            &mut con,
            &["XREADGROUP", "GROUP", "g", "c1", "STREAMS", s, "0"],
        );
        assert_eq!(format!("{v:?}").matches("nil").count(), 4, "{v:?}");
        // Checkpoint of a checkpoint.
        q(&mut con, &["SAVE"]);
    }
    // A group whose position is only past its own records reads on without "trimmed".
    let caught_up = "stockgate:events";
    q(&mut con, &["XGROUP", "CREATE", caught_up, "tail", "$"]);
    q(
        &mut con,
        &["XGROUP", "CREATECONSUMER", caught_up, "tail", "t"],
    );
    q(&mut con, &["SAVE"]);
    srv.kill9();
    srv = Server::start_in(&dir, &["--segment-mib", "1"]);
    con = srv.client().get_connection().unwrap();
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "tail",
            "t",
            "STREAMS",
            caught_up,
            ">",
        ],
    );
    assert_eq!(v, redis::Value::Nil);
    // Reading on delivers exactly what follows, to a new consumer as well.
    sale_adjusts(&mut con, "SNAPG", 3);
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c3",
            "COUNT",
            "10",
            "STREAMS",
            s,
            ">",
        ],
    );
    let after = read_ids(&v);
    // XRANGE from `-` is "trimmed" once the log's start is gone: read from its start.
    let start = info_field(&info_feed(&mut con), "feed_first_lsn").unwrap();
    let all = q(&mut con, &["XRANGE", s, &start, "+"]);
    let expect: Vec<u64> = match all {
        redis::Value::Array(es) => es
            .iter()
            .map(|e| match e {
                redis::Value::Array(e) => as_str(&e[0]).trim_end_matches("-0").parse().unwrap(),
                e => panic!("{e:?}"),
            })
            .collect(),
        v => panic!("{v:?}"),
    };
    assert_eq!(expect.len(), 3);
    assert_eq!(after, expect);
    let info = info_feed(&mut con);
    assert!(info.contains("group=g,consumers=3,pending=9"), "{info}");
}

/// Retention with a lagging group: the segments it needs are kept while they fit in
/// `--feed-retention`; a group whose position falls past the cap gets the documented
/// `trimmed` error, INFO shows it trimmed, and one within the cap reads on.
#[test]
fn groups_retention_keeps_a_lagging_groups_segments_within_the_cap() {
    for (cap, early_trimmed) in [("64MiB", false), ("2MiB", true)] {
        let maddr = format!("127.0.0.1:{}", free_port());
        let flags = [
            "--segment-mib",
            "1",
            "--feed-retention",
            cap,
            "--metrics-addr",
            &maddr,
        ];
        let srv = Server::start(&flags);
        let mut con = srv.client().get_connection().unwrap();
        let all = "stockgate:events";
        q(&mut con, &["SALE.CREATE", "RET", "1000", "SHARDS", "1024"]);
        q(&mut con, &["XGROUP", "CREATE", all, "early", "0"]);
        sale_adjusts(&mut con, "RET", 3000); // ~3 MiB: several segments
        q(&mut con, &["XGROUP", "CREATE", all, "late", "$"]);
        sale_adjusts(&mut con, "RET", 200);
        q(&mut con, &["SAVE"]);
        let segments = wal_segments(&srv.data_dir);
        let bytes: u64 = segments
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum();
        let info = info_feed(&mut con);
        let first: u64 = info_field(&info, "feed_first_lsn")
            .unwrap()
            .parse()
            .unwrap();
        let r: redis::RedisResult<redis::Value> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("early")
            .arg("e")
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(all)
            .arg(">")
            .query(&mut con);
        if early_trimmed {
            assert!(
                first > 1,
                "nothing deleted with a {cap} cap ({bytes} bytes kept)"
            );
            assert!(bytes <= 3 << 20, "{bytes} bytes kept past a {cap} cap");
            assert!(
                info.contains("group=early,consumers=0,pending=0,last_delivered_id=0-0")
                    && info.contains("trimmed=1"),
                "{info}"
            );
            let e = r.expect_err("a position past the cap must be an error");
            let msg = e.to_string();
            assert!(msg.contains("trimmed") && msg.contains("ledger"), "{msg}");
        } else {
            assert_eq!(first, 1, "a segment the lagging group needs was deleted");
            let v = r.unwrap();
            assert_eq!(read_ids(&v), vec![1], "{v:?}");
        }
        // The late group's position is within the cap either way: it reads its 200.
        let v = q(
            &mut con,
            &[
                "XREADGROUP",
                "GROUP",
                "late",
                "l",
                "COUNT",
                "1000",
                "STREAMS",
                all,
                ">",
            ],
        );
        assert_eq!(read_ids(&v).len(), 200);
        let info = info_feed(&mut con);
        assert!(
            info.contains("group=late,consumers=1,pending=200"),
            "{info}"
        );
        assert!(info.contains("feed_groups:2"), "{info}");
        // The Prometheus endpoint exports the same figures.
        let text = http_get(&maddr, "/metrics");
        for want in [
            "stockgate_feed_group_pending{stream=\"stockgate:events\",group=\"late\"} 200",
            "stockgate_feed_group_lag{stream=\"stockgate:events\",group=\"late\"} 0",
            "stockgate_feed_group_lag{stream=\"stockgate:events\",group=\"early\"}",
        ] {
            assert!(text.contains(want), "{want} not in:\n{text}");
        }
    }
}

/// The client crate's `GroupReader`, as an order service would run it: two workers share
/// a group; one takes entries and dies without acknowledging; the other takes the rest,
/// and after the idle time its XAUTOCLAIM takes over the dead worker's entries. Every
/// reservation is handled exactly once, and nothing is left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_client_crate_workers_share_a_group_and_take_over_a_dead_one() {
    use stockgate_ledger::group::GroupReader;
    let srv = Server::start(&[]);
    let addr = srv.addr.clone();
    let stream = "{WORK}:events";
    let w1 = GroupReader::connect(&addr, stream, "orders", "w1")
        .await
        .unwrap();
    let w2 = GroupReader::connect(&addr, stream, "orders", "w2")
        .await
        .unwrap();
    assert!(w1.create("0").await.unwrap());
    assert!(
        !w2.create("0").await.unwrap(),
        "an existing group is left as it is"
    );
    {
        let mut con = srv.client().get_connection().unwrap();
        q(&mut con, &["SALE.CREATE", "WORK", "1000"]);
        let keys = srv.keyring();
        for i in 0..40 {
            let u = format!("u{i}");
            let adm = keys.mint("WORK", &u, now_ms() + 60_000);
            q(&mut con, &["RESERVE", "WORK", &u, &adm, &format!("r{i}")]);
        }
    }
    // w1 takes 7 and "dies".
    let taken = w1.read(7, 0).await.unwrap();
    assert_eq!(taken.len(), 7);
    // w2 handles everything else.
    let mut handled = Vec::new();
    loop {
        let batch = w2.read(10, 100).await.unwrap();
        if batch.is_empty() {
            break;
        }
        let ids: Vec<u64> = batch.iter().map(|e| e.lsn).collect();
        assert_eq!(w2.ack(&ids).await.unwrap(), ids.len() as u64);
        handled.extend(batch);
    }
    assert!(
        w2.autoclaim(60_000, 100).await.unwrap().is_empty(),
        "not idle yet"
    );
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    let claimed = w2.autoclaim(200, 100).await.unwrap();
    assert_eq!(
        claimed.iter().map(|e| e.lsn).collect::<Vec<_>>(),
        taken.iter().map(|e| e.lsn).collect::<Vec<_>>()
    );
    let ids: Vec<u64> = claimed.iter().map(|e| e.lsn).collect();
    assert_eq!(w2.ack(&ids).await.unwrap(), 7);
    handled.extend(claimed);
    let mut tokens: Vec<&str> = handled
        .iter()
        .filter(|e| e.kind() == "reserved")
        .filter_map(|e| e.get("token"))
        .collect();
    tokens.sort_unstable();
    let n = tokens.len();
    tokens.dedup();
    assert_eq!((n, tokens.len()), (40, 40), "each reservation exactly once");
    assert!(w1.pending_own(100).await.unwrap().is_empty());
    let mut con = srv.client().get_connection().unwrap();
    assert!(pending(&mut con, stream, "orders").is_empty());
}

/// Group replies wait for their records: with the log writer held back, XGROUP CREATE,
/// XREADGROUP and XACK answer only once their record is written (and then the state
/// they report survives a kill -9 straight after the reply).
#[test]
fn groups_replies_wait_for_their_records() {
    let tmp = TempDir::new("groups-durable");
    let env = [("STOCKGATE_FAULT_WAL_DELAY_MS", "700")];
    let mut srv = Server::start_in_env(tmp.path(), &[], &env);
    let mut con = srv.client().get_connection().unwrap();
    q(&mut con, &["SALE.CREATE", "DUR", "10"]);
    let s = "{DUR}:events";
    let timed = |con: &mut redis::Connection, args: &[&str]| {
        let t0 = std::time::Instant::now();
        let v = q(con, args);
        (v, t0.elapsed())
    };
    let (_, t) = timed(&mut con, &["XGROUP", "CREATE", s, "g", "0"]);
    assert!(
        t.as_millis() >= 600,
        "XGROUP CREATE answered in {t:?}, before its record was written"
    );
    let (v, t) = timed(
        &mut con,
        &["XREADGROUP", "GROUP", "g", "c", "STREAMS", s, ">"],
    );
    // The sale's first entry: LSN 2, after the data dir's `history.begun`.
    assert_eq!(read_ids(&v), vec![2]);
    assert!(t.as_millis() >= 600, "XREADGROUP answered in {t:?}");
    let (v, t) = timed(&mut con, &["XACK", s, "g", "2-0"]);
    assert_eq!(v, redis::Value::Int(1));
    assert!(t.as_millis() >= 600, "XACK answered in {t:?}");
    let (_, t) = timed(&mut con, &["XGROUP", "CREATECONSUMER", s, "g", "d"]);
    assert!(
        t.as_millis() >= 600,
        "XGROUP CREATECONSUMER answered in {t:?}"
    );
    srv.kill9();
    let srv = Server::start_in(tmp.path(), &[]);
    let mut con = srv.client().get_connection().unwrap();
    assert!(pending(&mut con, s, "g").is_empty());
    let c = format!("{:?}", q(&mut con, &["XINFO", "CONSUMERS", s, "g"]));
    assert!(c.contains("\"c\"") && c.contains("\"d\""), "{c}");
    let g = format!("{:?}", q(&mut con, &["XINFO", "GROUPS", s]));
    assert!(g.contains("\"2-0\""), "{g}");
}

/// A client cannot grow a group's pending list without bound: at 10,000 pending entries
/// a `>` read is refused until some are acknowledged; NOACK reads are not limited.
#[test]
fn groups_pending_entries_are_bounded() {
    let srv = Server::start(&[]);
    let mut con = srv.client().get_connection().unwrap();
    q(&mut con, &["SALE.CREATE", "BOUND", "100000"]);
    let s = "{BOUND}:events";
    q(&mut con, &["XGROUP", "CREATE", s, "g", "0"]);
    sale_adjusts(&mut con, "BOUND", 10_100);
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "a",
            "COUNT",
            "6000",
            "STREAMS",
            s,
            ">",
        ],
    );
    assert_eq!(read_ids(&v).len(), 6000);
    // Only what is left under the bound is delivered.
    let v = q(
        &mut con,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "b",
            "COUNT",
            "6000",
            "STREAMS",
            s,
            ">",
        ],
    );
    let b = read_ids(&v);
    assert_eq!(b.len(), 4000);
    let r: redis::RedisResult<redis::Value> = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("a")
        .arg("STREAMS")
        .arg(s)
        .arg(">")
        .query(&mut con);
    let e = r.expect_err("a full group must refuse a > read");
    assert!(e.to_string().contains("10000 pending entries"), "{e}");
    q(&mut con, &["XACK", s, "g", &format!("{}-0", b[0])]);
    let v = q(
        &mut con,
        &["XREADGROUP", "GROUP", "g", "a", "STREAMS", s, ">"],
    );
    assert_eq!(read_ids(&v).len(), 1);
    let v = q(
        &mut con,
        &["XREADGROUP", "GROUP", "g", "a", "NOACK", "STREAMS", s, ">"],
    );
    assert_eq!(read_ids(&v).len(), 10_101 - 10_001);
    let p = q(&mut con, &["XPENDING", s, "g"]);
    match &p {
        redis::Value::Array(v) => assert_eq!(v[0], redis::Value::Int(10_000), "{p:?}"),
        _ => panic!("{p:?}"),
    }
}
