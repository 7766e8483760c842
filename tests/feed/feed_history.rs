//! The materializer's position names one entry of one history. Pointed at a feed that is
//! another history (a server restored from an older copy, another group, a node split
//! from its group), it refuses with a clear error (exit code 3) and applies nothing,
//! instead of reading "after" a position that means something else there. And a lagging
//! materializer reads a member that rejoined its group empty to the end: catching up
//! from the group's log trims nothing under it.

use crate::common::runtime;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::ha::{Keys, Node};
use crate::common::raft::{converge_wal, create_sale, reserve, state_of, Group};
use crate::common::{now_ms, server_bin};
use sqlx::Row;
use stockgate_testkit::pgtemp::TempPostgres;

fn materializer_bin() -> PathBuf {
    server_bin().with_file_name("stockgate-materializer")
}

/// `stockgate-materializer --drain` against one server.
fn drain(pg: &str, port: u16) -> Output {
    Command::new(materializer_bin())
        .args(["--database-url", pg, "--server"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--drain")
        .env("STOCKGATE_LOG", "warn")
        .output()
        .expect("run stockgate-materializer")
}

fn reserve_n(port: u16, keys: &Keys, sku: &str, users: &str, n: usize) -> Vec<String> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection())
        .expect("connect");
    let kr = keys.keyring();
    (0..n)
        .map(|i| {
            let user = format!("{users}{i}");
            let tok = kr.mint(sku, &user, now_ms() + 600_000);
            let v: Vec<redis::Value> = redis::cmd("RESERVE")
                .arg(sku)
                .arg(&user)
                .arg(tok)
                .arg(format!("r{i}"))
                .query(&mut c)
                .expect("reserve");
            assert_eq!(crate::common::as_str(&v[0]), "RESERVED");
            crate::common::as_str(&v[1])
        })
        .collect()
}

fn sale(port: u16, sku: &str) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection())
        .expect("connect");
    let r: String = redis::cmd("SALE.CREATE")
        .arg(sku)
        .arg(100)
        .arg("SHARDS")
        .arg(1)
        .query(&mut c)
        .expect("sale.create");
    assert_eq!(r, "OK");
}

async fn orders(url: &str) -> Vec<String> {
    let ledger = stockgate_ledger::PgLedger::connect(url)
        .await
        .expect("ledger");
    sqlx::query("SELECT reservation_token FROM orders ORDER BY 1")
        .fetch_all(ledger.pool())
        .await
        .expect("orders")
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect()
}

/// Binds the ledger to the history of the node on `port`, as `stockgate-sweeper rebind`
/// does: past the server binding, the feed's own check still stands.
async fn rebind(url: &str, port: u16) {
    let ledger = stockgate_ledger::PgLedger::connect(url)
        .await
        .expect("ledger");
    let client = stockgate_client::StockgateClient::connect(&format!("127.0.0.1:{port}"))
        .await
        .expect("connect");
    let id = client.history().await.expect("info").expect("a history id");
    stockgate_ledger::identity::rebind(&ledger, Some(id.clone()), &id)
        .await
        .expect("rebind");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_materializer_refuses_a_feed_from_another_history() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let keys = Keys::new();
    let a = Node::start(&keys, &[]);
    sale(a.port, "HIST");
    let ours = reserve_n(a.port, &keys, "HIST", "a", 5);
    let o = drain(pg.url(), a.port);
    assert!(o.status.success(), "first drain: {}", stderr(&o));
    assert_eq!(rt.block_on(orders(pg.url())).len(), 5);

    // Same sale, other buyers: every LSN of A's feed exists here, with other entries.
    let b = Node::start(&keys, &[]);
    sale(b.port, "HIST");
    reserve_n(b.port, &keys, "HIST", "b", 8);
    // The server binding refuses B first; bound to B by mistake, the position's
    // fingerprint still does.
    let o = drain(pg.url(), b.port);
    assert_eq!(o.status.code(), Some(3), "another server: {}", stderr(&o));
    assert!(
        stderr(&o).contains("describes server history"),
        "{}",
        stderr(&o)
    );
    rt.block_on(rebind(pg.url(), b.port));
    let o = drain(pg.url(), b.port);
    assert_eq!(o.status.code(), Some(3), "another history: {}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("history") && err.contains("holds a different entry"),
        "{err}"
    );
    // A feed that ends before the position.
    let c = Node::start(&keys, &[]);
    sale(c.port, "HIST");
    rt.block_on(rebind(pg.url(), c.port));
    let o = drain(pg.url(), c.port);
    assert_eq!(o.status.code(), Some(3), "a shorter feed: {}", stderr(&o));
    assert!(stderr(&o).contains("ends at"), "{}", stderr(&o));
    // Nothing of B's was applied; A's own feed still goes on where it was.
    let mut have = rt.block_on(orders(pg.url()));
    let mut want = ours.clone();
    want.sort();
    have.sort();
    assert_eq!(have, want);
    let more = reserve_n(a.port, &keys, "HIST", "a2-", 2);
    rt.block_on(rebind(pg.url(), a.port));
    let o = drain(pg.url(), a.port);
    assert!(o.status.success(), "drain of A again: {}", stderr(&o));
    assert_eq!(rt.block_on(orders(pg.url())).len(), 5 + more.len());
}

/// Hole 7 of the issue, in a group: the materializer's position holds the members'
/// snapshots back; a member that lost everything rejoins empty and catches up from the
/// group's log; the materializer, 120 entries behind, reads it to the end (nothing it
/// still needed was trimmed), one order per reservation.
#[test]
fn a_lagging_materializer_reads_a_rejoined_member_to_the_end() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let mut g = Group::start(false);
    // Snapshots every 20 records: without the materializer's hold the members would
    // compact past its position, and the rejoining member would get a snapshot instead
    // of the entries the materializer still needs.
    for id in [1, 2, 3] {
        let m = g.member(id);
        m.kill9();
        m.args
            .extend(["--snapshot-records".to_string(), "20".to_string()]);
    }
    for id in [1, 2, 3] {
        g.member(id).spawn();
    }
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "LAG", 200);
    let mut acked = Vec::new();
    for i in 0..10 {
        acked.push(reserve(g.port(l), &g, "LAG", &format!("e{i}"), "r").expect("reserve"));
    }
    let o = drain(pg.url(), g.port(l));
    assert!(o.status.success(), "{}", stderr(&o));
    for i in 0..120 {
        acked.push(reserve(g.port(l), &g, "LAG", &format!("l{i}"), "r").expect("reserve"));
    }
    g.converge(Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(600));

    // A follower loses its whole data dir and rejoins empty.
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    g.member(f).kill9();
    let dir = g.member(f).dir.clone();
    wipe(&dir);
    g.rejoin_empty(f, l);
    converge_wal(&g, Duration::from_secs(15));
    assert_eq!(state_of(g.port(f), &acked[0]).as_deref(), Some("RESERVED"));

    // The lagging materializer, pointed at the rejoined member (followers serve the
    // committed feed), reads to the end.
    let o = drain(pg.url(), g.port(f));
    assert!(o.status.success(), "{}", stderr(&o));
    let mut have = rt.block_on(orders(pg.url()));
    have.sort();
    acked.sort();
    assert_eq!(have, acked, "orders and acknowledged reservations differ");
}

fn wipe(dir: &Path) {
    std::fs::remove_dir_all(dir).expect("wipe data dir");
    std::fs::create_dir_all(dir).expect("empty data dir");
}
