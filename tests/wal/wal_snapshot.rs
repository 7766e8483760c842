//! Snapshot equivalence: recovery from the newest snapshot plus the log after it gives the
//! same state as replaying the whole log, and the same as the live server had before the
//! kill. The whole log is kept by copying the data dir just before SAVE (SAVE deletes the
//! segments it covers) and adding the segments written after it; both data dirs hold the
//! same records, so full state dumps (every SALE.INFO, every RESERVATION with its times,
//! the EXPIRED listing, STOCK, DBSIZE) must be equal field for field.
//!
//! Also: reservations that expired while the server was down are listed by EXPIRED right
//! after the restart (from the snapshot and from the log tail), and `--auto-release`
//! returns them to stock.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use redis::aio::MultiplexedConnection;
use redis::Value;
use stockgate_server::engine::Keyring;

/// Every command of the deterministic workload and the tokens it produced.
#[derive(Default)]
struct Workload {
    /// Every token RESERVE handed out, with (sku, user, request id).
    tokens: Vec<(String, String, String, String)>,
    /// Latest expiry seen for a reservation of the short-TTL sale.
    short_max_expiry: i64,
}

const SKUS: [&str; 4] = ["SA", "SB", "SC", "SD"];
/// SC's TTL: its reservations expire during the test.
const SHORT_TTL_MS: i64 = 300;

async fn q(c: &mut MultiplexedConnection, args: &[&str]) -> Result<Value, String> {
    cmd(c, args).await.map_err(|e| e.to_string())
}

impl Workload {
    async fn reserve(
        &mut self,
        c: &mut MultiplexedConnection,
        keys: &Keyring,
        sku: &str,
        user: &str,
        rid: &str,
        qty: u32,
    ) {
        let adm = keys.mint(sku, user, now_ms() + 3_600_000);
        let qs = qty.to_string();
        let v = match q(c, &["RESERVE", sku, user, &adm, rid, "QTY", &qs]).await {
            Ok(v) => v,
            Err(e) if e.contains("PAUSED") => return,
            Err(e) => panic!("RESERVE {sku} {user} {rid}: {e}"),
        };
        let Value::Array(v) = v else { panic!("{v:?}") };
        match as_str(&v[0]).as_str() {
            "RESERVED" => {
                let tok = as_str(&v[1]);
                if sku == "SC" {
                    self.short_max_expiry = self.short_max_expiry.max(as_int(&v[2]));
                }
                self.tokens
                    .push((tok, sku.to_string(), user.to_string(), rid.to_string()));
            }
            "SOLDOUT" | "LIMIT" => {}
            "REPLAY" => panic!("fresh request id {rid} replayed"),
            other => panic!("{other}"),
        }
    }

    /// A deterministic mix over the tokens so far: release, commit, extend. Replies vary
    /// (a token may be finished already); errors like -RELEASED are part of the run.
    async fn finish_some(&mut self, c: &mut MultiplexedConnection, phase: usize) {
        let toks: Vec<(String, String)> = self
            .tokens
            .iter()
            .map(|(t, s, _, _)| (t.clone(), s.clone()))
            .collect();
        for (i, (t, sku)) in toks.iter().enumerate() {
            match (i + phase) % 9 {
                0 | 4 => {
                    let _ = q(c, &["RELEASE", t]).await;
                }
                2 => {
                    let _ = q(c, &["COMMIT", t]).await;
                }
                6 => {
                    let ms = if sku == "SC" { "150" } else { "900000" };
                    if let Ok(Value::Int(e)) = q(c, &["EXTEND", t, ms]).await {
                        if sku == "SC" {
                            self.short_max_expiry = self.short_max_expiry.max(e);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    async fn phase(&mut self, c: &mut MultiplexedConnection, keys: &Keyring, phase: usize) {
        for i in 0..60 {
            let sku = SKUS[i % SKUS.len()];
            let user = format!("u{}", (i * 7 + phase) % 11);
            let qty = 1 + (i % 3) as u32;
            self.reserve(c, keys, sku, &user, &format!("p{phase}-{i}"), qty)
                .await;
        }
        self.finish_some(c, phase).await;
    }
}

/// One RESERVE per user on SB (LIMIT 2, open): LIMIT (with the live tokens listed) for
/// users at their limit, RESERVED or SOLDOUT for the others.
async fn limit_probes(c: &mut MultiplexedConnection, keys: &Keyring) -> Vec<String> {
    let mut out = Vec::new();
    for u in 0..11 {
        let user = format!("u{u}");
        let adm = keys.mint("SB", &user, now_ms() + 60_000);
        let Value::Array(v) = q(c, &["RESERVE", "SB", &user, &adm, "probe"])
            .await
            .unwrap()
        else {
            panic!("RESERVE")
        };
        let mut parts: Vec<String> = v.iter().skip(1).map(|x| format!("{x:?}")).collect();
        if as_str(&v[0]) != "LIMIT" {
            parts.truncate(1); // RESERVED: the token (expiry times differ between runs)
        }
        parts.sort();
        out.push(format!("{} {user} {parts:?}", as_str(&v[0])));
    }
    out
}

/// Everything observable about the state, keyed by the command that showed it.
async fn dump(c: &mut MultiplexedConnection, w: &Workload) -> BTreeMap<String, Value> {
    let mut d = BTreeMap::new();
    let Value::Array(list) = q(c, &["SALE.LIST"]).await.unwrap() else {
        panic!("SALE.LIST")
    };
    let mut skus: Vec<String> = list.iter().map(as_str).collect();
    skus.sort();
    d.insert(
        "SALE.LIST".into(),
        Value::Array(
            skus.iter()
                .map(|s| Value::BulkString(s.clone().into()))
                .collect(),
        ),
    );
    for s in &skus {
        let info = q(c, &["SALE.INFO", s]).await.unwrap();
        let total = as_int(&field(&info, "total").unwrap());
        let parts: i64 = ["available", "reserved", "committed"]
            .iter()
            .map(|f| as_int(&field(&info, f).unwrap()))
            .sum();
        assert_eq!(
            parts, total,
            "{s}: available + reserved + committed == total"
        );
        d.insert(format!("SALE.INFO {s}"), info);
        d.insert(format!("STOCK {s}"), q(c, &["STOCK", s]).await.unwrap());
    }
    for (t, _, _, _) in &w.tokens {
        d.insert(
            format!("RESERVATION {t}"),
            q(c, &["RESERVATION", t]).await.unwrap(),
        );
    }
    let Value::Array(mut exp) = q(c, &["EXPIRED", "COUNT", "10000"]).await.unwrap() else {
        panic!("EXPIRED")
    };
    let times: Vec<i64> = exp
        .iter()
        .map(|e| match e {
            Value::Array(f) => as_int(&f[5]),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        times.windows(2).all(|p| p[0] <= p[1]),
        "EXPIRED out of order"
    );
    // Equal expiry times may list in any order: compare as a set.
    exp.sort_by_key(|e| format!("{e:?}"));
    d.insert("EXPIRED".into(), Value::Array(exp));
    d.insert("DBSIZE".into(), q(c, &["DBSIZE"]).await.unwrap());
    d
}

fn assert_same(got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>, what: &str) {
    for (k, v) in want {
        assert_eq!(got.get(k), Some(v), "{what}: {k} differs");
    }
    assert_eq!(got.len(), want.len(), "{what}");
}

async fn info_field(c: &mut MultiplexedConnection, name: &str) -> u64 {
    let v = q(c, &["INFO", "persistence"]).await.unwrap();
    let text = match v {
        Value::BulkString(b) => String::from_utf8(b).unwrap(),
        Value::VerbatimString { text, .. } => text,
        other => panic!("{other:?}"),
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in INFO: {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (by the clock) until every short-TTL reservation has expired, so the EXPIRED
/// listing no longer changes while the dumps are taken.
async fn wait_short_expiry(w: &Workload) {
    let until = w.short_max_expiry + 20;
    while (now_ms() as i64) < until {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn wal_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_snapshot_plus_tail_equals_the_full_log() {
    let a = TempDir::new("snap-a");
    let args = ["--fsync", "always"];
    let mut srv = Server::start_in(a.path(), &args);
    let keys = srv.keyring();
    let mut c = srv.conn().await;
    for (sku, spec) in [
        ("SA", vec!["500", "SHARDS", "16"]),
        ("SB", vec!["30", "SHARDS", "1", "LIMIT", "2"]),
        ("SC", vec!["200", "SHARDS", "4", "TTL", "300"]),
        ("SD", vec!["100", "SHARDS", "2"]),
    ] {
        let mut args = vec!["SALE.CREATE", sku];
        args.extend(spec);
        assert_eq!(q(&mut c, &args).await.unwrap(), Value::Okay);
    }
    assert_eq!(SHORT_TTL_MS, 300);
    let mut w = Workload::default();
    w.phase(&mut c, &keys, 1).await;
    assert_eq!(
        q(&mut c, &["SALE.ADJUST", "SA", "25"]).await,
        Ok(Value::Int(525))
    );
    q(&mut c, &["SALE.ADJUST", "SD", "-3"]).await.unwrap();
    q(&mut c, &["SALE.PAUSE", "SD"]).await.unwrap();

    // The whole log so far, before SAVE deletes what the snapshot covers.
    let pre = TempDir::new("snap-pre");
    copy_dir(a.path(), pre.path());
    assert_eq!(q(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);

    q(&mut c, &["SALE.RESUME", "SD"]).await.unwrap();
    q(&mut c, &["SALE.PAUSE", "SA"]).await.unwrap();
    q(&mut c, &["SALE.CREATE", "SE", "10", "SHARDS", "1"])
        .await
        .unwrap();
    w.phase(&mut c, &keys, 2).await;
    w.reserve(&mut c, &keys, "SE", "late", "se-1", 2).await;
    q(&mut c, &["SALE.ADJUST", "SA", "-10"]).await.unwrap();
    wait_short_expiry(&w).await;
    let live = dump(&mut c, &w).await;
    assert!(
        matches!(&live["EXPIRED"], Value::Array(v) if !v.is_empty()),
        "the workload leaves expired reservations"
    );
    srv.kill9();

    // B: the pre-SAVE copy plus every segment written since; no snapshot.
    let b = TempDir::new("snap-b");
    copy_dir(pre.path(), b.path());
    for seg in wal_segments(a.path()) {
        std::fs::copy(&seg, b.path().join("wal").join(seg.file_name().unwrap())).unwrap();
    }
    assert!(
        wal_files(b.path()).iter().all(|f| !f.ends_with(".snap")),
        "B has no snapshot"
    );
    let a_files = wal_files(a.path());
    assert!(
        a_files.iter().any(|f| f.ends_with(".snap")),
        "A has a snapshot"
    );
    assert!(
        wal_segments(b.path()).len() > wal_segments(a.path()).len(),
        "SAVE deleted covered segments from A ({a_files:?}), B keeps them"
    );

    let sa = Server::start_in(a.path(), &args);
    let mut ca = sa.conn().await;
    assert!(
        info_field(&mut ca, "wal_snapshot_lsn").await > 0,
        "A starts from its snapshot"
    );
    assert_same(
        &dump(&mut ca, &w).await,
        &live,
        "A (snapshot + tail) vs live",
    );

    let sb = Server::start_in(b.path(), &args);
    let mut cb = sb.conn().await;
    assert_eq!(
        info_field(&mut cb, "wal_snapshot_lsn").await,
        0,
        "B replays the whole log"
    );
    assert_same(&dump(&mut cb, &w).await, &live, "B (whole log) vs live");
    // Per-user holdings (not shown by any dump) agree too: the same probes get the same
    // answers from both.
    let probes_b = limit_probes(&mut cb, &keys).await;
    drop(sb);
    let probes_a = limit_probes(&mut ca, &keys).await;
    assert_eq!(probes_a, probes_b, "per-user limits after recovery");
    assert!(
        probes_a.iter().any(|p| p.starts_with("LIMIT")),
        "some user is at the limit: {probes_a:?}"
    );

    // A goes on from its snapshot: old requests replay, old tokens finish, another SAVE,
    // more traffic; kill -9 and a clean SIGTERM restart both give the live state back.
    let mut srv = sa;
    let mut c = ca;
    for (tok, sku, user, rid) in w.tokens.clone().iter().take(12) {
        let adm = keys.mint(sku, user, now_ms() + 60_000);
        let Value::Array(v) = q(&mut c, &["RESERVE", sku, user, &adm, rid]).await.unwrap() else {
            panic!("RESERVE")
        };
        assert_eq!(as_str(&v[0]), "REPLAY", "{rid} after snapshot recovery");
        assert_eq!(as_str(&v[1]), *tok);
    }
    q(&mut c, &["SALE.RESUME", "SA"]).await.unwrap();
    w.phase(&mut c, &keys, 3).await;
    assert_eq!(q(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);
    w.phase(&mut c, &keys, 4).await;
    wait_short_expiry(&w).await;
    let live2 = dump(&mut c, &w).await;
    srv.kill9();
    let mut srv = Server::start_in(a.path(), &args);
    let mut c = srv.conn().await;
    assert_same(
        &dump(&mut c, &w).await,
        &live2,
        "A after a second snapshot and kill -9",
    );
    assert_eq!(srv.terminate(), Some(0), "clean shutdown");
    let srv = Server::start_in(a.path(), &args);
    let mut c = srv.conn().await;
    assert_same(&dump(&mut c, &w).await, &live2, "A after SIGTERM");
}

/// [token, sku, user, qty, shard, expires_at_ms] as EXPIRED lists it.
fn entry(tok: &str, sku: &str, user: &str, qty: i64, shard: i64, exp: i64) -> Value {
    Value::Array(vec![
        Value::BulkString(tok.as_bytes().to_vec()),
        Value::BulkString(sku.as_bytes().to_vec()),
        Value::BulkString(user.as_bytes().to_vec()),
        Value::Int(qty),
        Value::Int(shard),
        Value::Int(exp),
    ])
}

/// Reserves on EXP (TTL 200 ms) before and after a SAVE, finishes two, and kills the
/// server; returns the EXPIRED entries expected once all have expired, oldest first.
async fn expiring_while_down(dir: &Path, extra: &[&str]) -> (Vec<Value>, i64) {
    let mut srv = Server::start_in(dir, extra);
    let keys = srv.keyring();
    let mut c = srv.conn().await;
    q(
        &mut c,
        &["SALE.CREATE", "EXP", "100", "SHARDS", "4", "TTL", "200"],
    )
    .await
    .unwrap();
    q(&mut c, &["SALE.CREATE", "LONG", "100"]).await.unwrap();
    let mut got = Vec::new();
    for i in 0..7 {
        if i == 4 {
            assert_eq!(q(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);
        }
        let user = format!("e{i}");
        let adm = keys.mint("EXP", &user, now_ms() + 60_000);
        let qty = (1 + i % 2).to_string();
        let Value::Array(v) = q(&mut c, &["RESERVE", "EXP", &user, &adm, "r", "QTY", &qty])
            .await
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(as_str(&v[0]), "RESERVED");
        got.push((as_str(&v[1]), user, 1 + i % 2, as_int(&v[3]), as_int(&v[2])));
    }
    let adm = keys.mint("LONG", "l0", now_ms() + 60_000);
    q(&mut c, &["RESERVE", "LONG", "l0", &adm, "r"])
        .await
        .unwrap();
    assert_eq!(q(&mut c, &["RELEASE", &got[1].0]).await, Ok(Value::Int(1)));
    assert_eq!(q(&mut c, &["COMMIT", &got[5].0]).await, Ok(Value::Int(1)));
    srv.kill9();
    let committed = got[5].2;
    let mut want: Vec<(String, String, i64, i64, i64)> = got
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 1 && *i != 5)
        .map(|(_, g)| g)
        .collect();
    want.sort_by_key(|g| g.4);
    // The server is down; let every EXP reservation's deadline pass.
    let until = want.iter().map(|g| g.4).max().unwrap() + 20;
    while (now_ms() as i64) < until {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    (
        want.into_iter()
            .map(|(t, u, qty, sh, e)| entry(&t, "EXP", &u, qty, sh, e))
            .collect(),
        committed,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_reservations_expired_while_down_are_listed_at_restart() {
    let dir = TempDir::new("snap-exp");
    let (want, committed) = expiring_while_down(dir.path(), &[]).await;
    let srv = Server::start_in(dir.path(), &[]);
    let mut c = srv.conn().await;
    // The first command after the restart already sees them, oldest first.
    let got = q(&mut c, &["EXPIRED"]).await.unwrap();
    let Value::Array(mut got) = got else { panic!() };
    // Equal deadlines may list in either order.
    let mut want_sorted = want.clone();
    let key = |v: &Value| match v {
        Value::Array(f) => (as_int(&f[5]), as_str(&f[0])),
        _ => panic!(),
    };
    got.sort_by_key(key);
    want_sorted.sort_by_key(key);
    assert_eq!(got, want_sorted, "EXPIRED right after restart");
    assert_eq!(
        q(&mut c, &["EXPIRED", "SKU", "LONG"]).await,
        Ok(Value::Array(vec![]))
    );
    let Value::Array(two) = q(&mut c, &["EXPIRED", "COUNT", "2"]).await.unwrap() else {
        panic!()
    };
    assert_eq!(two.len(), 2);
    assert!(key(&two[0]).0 <= key(&two[1]).0 && key(&two[1]).0 <= key(&want[2]).0);
    // The sweeper's release gives back exactly their units.
    for e in &want {
        let Value::Array(f) = e else { panic!() };
        assert_eq!(
            q(&mut c, &["RELEASE", &as_str(&f[0])]).await,
            Ok(Value::Int(1))
        );
    }
    assert_eq!(q(&mut c, &["EXPIRED"]).await, Ok(Value::Array(vec![])));
    assert_eq!(
        q(&mut c, &["STOCK", "EXP"]).await,
        Ok(Value::Int(100 - committed))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_auto_release_returns_what_expired_while_down() {
    let dir = TempDir::new("snap-auto");
    let (want, committed) = expiring_while_down(dir.path(), &["--auto-release"]).await;
    let srv = Server::start_in(dir.path(), &["--auto-release"]);
    let mut c = srv.conn().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let stock = as_int(&q(&mut c, &["STOCK", "EXP"]).await.unwrap());
        assert!(stock <= 100 - committed);
        if stock == 100 - committed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expired reservations not auto-released after restart (stock {stock})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for e in &want {
        let Value::Array(f) = e else { panic!() };
        let r = q(&mut c, &["RESERVATION", &as_str(&f[0])]).await.unwrap();
        assert_eq!(as_str(&field(&r, "state").unwrap()), "RELEASED");
    }
    let info = q(&mut c, &["SALE.INFO", "EXP"]).await.unwrap();
    assert_eq!(as_int(&field(&info, "reserved").unwrap()), 0);
    assert_eq!(as_int(&field(&info, "committed").unwrap()), committed);
}

/// Sale P after the purge: toks[0..4] finished (two released, two committed) and gone,
/// toks[4..6] RESERVED; the counters still count the committed units.
async fn check_purged(c: &mut MultiplexedConnection, toks: &[String], what: &str) {
    let info = q(c, &["SALE.INFO", "P"]).await.unwrap();
    assert_eq!(as_int(&field(&info, "available").unwrap()), 96, "{what}");
    assert_eq!(as_int(&field(&info, "reserved").unwrap()), 2, "{what}");
    assert_eq!(as_int(&field(&info, "committed").unwrap()), 2, "{what}");
    for (i, t) in toks.iter().enumerate() {
        let v = q(c, &["RESERVATION", t]).await.unwrap();
        if i < 4 {
            assert_eq!(v, Value::Nil, "{what}: finished {t} not purged");
        } else {
            assert_eq!(as_str(&field(&v, "state").unwrap()), "RESERVED", "{what}");
        }
    }
    assert_eq!(q(c, &["DBSIZE"]).await, Ok(Value::Int(2)), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_finished_reservations_are_purged_after_restart() {
    // Finished before a SAVE (restored from the snapshot) and after it (replayed from the
    // tail), killed before the retention passed: the restarted server still purges them,
    // the counters do not move, and the purge itself survives the next kill.
    let dir = TempDir::new("snap-purge");
    let args = ["--retention-ms", "400", "--fsync", "always"];
    let mut srv = Server::start_in(dir.path(), &args);
    let keys = srv.keyring();
    let mut c = srv.conn().await;
    q(&mut c, &["SALE.CREATE", "P", "100", "SHARDS", "2"])
        .await
        .unwrap();
    let mut toks = Vec::new();
    for i in 0..6 {
        let user = format!("p{i}");
        let adm = keys.mint("P", &user, now_ms() + 60_000);
        let Value::Array(v) = q(&mut c, &["RESERVE", "P", &user, &adm, "r"])
            .await
            .unwrap()
        else {
            panic!()
        };
        toks.push(as_str(&v[1]));
    }
    assert_eq!(q(&mut c, &["RELEASE", &toks[0]]).await, Ok(Value::Int(1)));
    assert_eq!(q(&mut c, &["COMMIT", &toks[1]]).await, Ok(Value::Int(1)));
    assert_eq!(q(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);
    assert_eq!(q(&mut c, &["RELEASE", &toks[2]]).await, Ok(Value::Int(1)));
    assert_eq!(q(&mut c, &["COMMIT", &toks[3]]).await, Ok(Value::Int(1)));
    srv.kill9();

    let mut srv = Server::start_in(dir.path(), &args);
    let mut c = srv.conn().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut gone = 0;
        for t in &toks[..4] {
            if q(&mut c, &["RESERVATION", t]).await.unwrap() == Value::Nil {
                gone += 1;
            }
        }
        if gone == 4 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "finished reservations restored at restart are never purged ({gone} of 4)"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    check_purged(&mut c, &toks, "purged after restart").await;
    srv.kill9();
    let srv = Server::start_in(dir.path(), &args);
    let mut c = srv.conn().await;
    check_purged(&mut c, &toks, "purge survives kill -9").await;
}
