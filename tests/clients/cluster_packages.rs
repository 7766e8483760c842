//! The Python and Node client packages in cluster mode, against three single-node groups
//! in cluster mode (docs/cluster.md):
//!
//! - one `Client.cluster` / `AsyncClient.cluster` (Python) or `new Stockgate({ cluster })`
//!   (Node), given one seed, buys on sales owned by all three groups while
//!   `stockgate-sweeper move-slots` moves one sale's slot to another group: no
//!   redirection or TRYAGAIN reaches the caller, every acknowledged hold is on its
//!   group in its state, no token twice, counters equal the acknowledged holds; then the
//!   same client `reserve_split`s a split sale whose parts are on three groups;
//! - a checkout's `pay()` after the hold's slot moved away: with a single-address client
//!   of the old group (its COMMIT meets `-MOVED`) it answers "committed, server not yet
//!   confirmed" instead of raising, and the ledger has the order COMMITTED; with a cluster
//!   client the server's COMMIT lands on the new group.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::cluster::{Cluster, THREE};
use crate::common::raft::{sale_info, state_of};
use stockgate_server::cluster::key_slot;
use stockgate_testkit::pgtemp::TempPostgres;
use stockgate_testkit::{sibling_binary as bin, KillOnDrop};

const TOTAL: u64 = 100_000;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `stockgate-sweeper move-slots --from --to --slots`, which must succeed.
fn move_slots(from: &str, to: &str, slot: u16) {
    let out = Command::new(bin("stockgate-sweeper"))
        .args(["move-slots", "--from", from, "--to", to, "--slots"])
        .arg(slot.to_string())
        .output()
        .expect("run move-slots");
    assert!(
        out.status.success(),
        "move-slots failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One sku per group, each created on its owner.
fn sales(c: &Cluster, prefix: &str) -> Vec<String> {
    let skus: Vec<String> = c.skus(prefix, 1).into_iter().flatten().collect();
    for (g, sku) in skus.iter().enumerate() {
        crate::common::raft::create_sale(c.nodes[g].port, sku, TOTAL);
    }
    skus
}

/// Runs a buyer script to its end while the first sku's slot moves from group 0 to 1.
fn buy_through_a_move(c: &Cluster, skus: &[String], buyer: &mut Command) -> String {
    let mut child = KillOnDrop(
        buyer
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("buyer"),
    );
    let mut out = child.0.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).expect("read stdout");
        s
    });
    std::thread::sleep(Duration::from_millis(1500));
    move_slots(
        &c.nodes[0].addr(),
        &c.nodes[1].addr(),
        key_slot(skus[0].as_bytes()),
    );
    let status = child.0.wait().expect("buyer exit");
    let said = reader.join().expect("reader");
    let mut err = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        status.success() && said.contains("buyer ok"),
        "{said}\n{err}"
    );
    said
}

/// Every acknowledged hold on the group that owns its sku now, in its state; no token
/// twice; each sale's reserved + committed equal to its acknowledged holds.
fn check_holds(c: &Cluster, skus: &[String], said: &str) {
    let acked: Vec<(&str, bool)> = said
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .filter_map(|l| l.split_once(' '))
        .map(|(t, c)| (t, c == "1"))
        .collect();
    assert!(acked.len() > 30, "only {} holds acknowledged", acked.len());
    let unique: HashSet<&str> = acked.iter().map(|(t, _)| *t).collect();
    assert_eq!(unique.len(), acked.len(), "a token handed out twice");
    let owner = |sku: &str| if sku == skus[0] { 1 } else { c.owner(sku) };
    let mut per_sku: HashMap<&str, i64> = HashMap::new();
    for (token, committed) in &acked {
        let sku = &token[1..token.find('}').expect("hash tag")];
        let want = if *committed { "COMMITTED" } else { "RESERVED" };
        let port = c.nodes[owner(sku)].port;
        assert_eq!(state_of(port, token).as_deref(), Some(want), "{token}");
        *per_sku.entry(sku).or_default() += 1;
    }
    for sku in skus {
        let (total, _, reserved, committed) = sale_info(c.nodes[owner(sku)].port, sku);
        assert_eq!(total, TOTAL as i64);
        assert_eq!(
            reserved + committed,
            per_sku.get(sku.as_str()).copied().unwrap_or(0),
            "{sku}"
        );
    }
    let moved = acked
        .iter()
        .filter(|(t, _)| t[1..].starts_with(skus[0].as_str()))
        .count();
    assert!(moved > 5, "too few holds on the moved sale: {moved}");
}

fn python(args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.args(args)
        .current_dir(repo())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

fn node(args: &[&str]) -> Command {
    crate::common::node::package_dir();
    let mut cmd = Command::new("node");
    cmd.arg("tests/node/package_cluster.mjs")
        .args(args)
        .current_dir(repo());
    cmd
}

fn buy_with(which: &str) {
    let c = Cluster::start(&THREE);
    let skus = sales(&c, &format!("PKG{}", which.len()));
    let seed = c.nodes[2].addr();
    let secret = c.keys.secret_path().display().to_string();
    let list = skus.join(",");
    // Split parts named as the sweeper names them, one per group.
    let parts: Vec<String> = c.skus("SPLIT.p", 1).into_iter().flatten().collect();
    let parts = parts.join(",");
    let mut buyer = match which {
        "node" => node(&["buy", &seed, &secret, &list, "5", &parts]),
        mode => python(&[
            "tests/py/package_cluster.py",
            mode,
            &seed,
            &secret,
            &list,
            "5",
            &parts,
        ]),
    };
    let said = buy_through_a_move(&c, &skus, &mut buyer);
    check_holds(&c, &skus, &said);
    // Six units over three groups' parts, eight buyers, one client: every unit sells.
    assert_eq!(word_after(&said, "SPLIT_RESERVED "), "6", "{said}");
    eprintln!(
        "{which}: {} holds, {}",
        said.lines().filter(|l| l.starts_with("ACK ")).count(),
        said.lines()
            .find(|l| l.starts_with("RETRIED"))
            .unwrap_or("")
    );
}

#[test]
fn python_cluster_client_buys_through_a_slot_move() {
    let _shared = crate::shared();
    buy_with("sync");
}

#[test]
fn python_async_cluster_client_buys_through_a_slot_move() {
    let _shared = crate::shared();
    buy_with("async");
}

#[test]
fn node_cluster_client_buys_through_a_slot_move() {
    let _shared = crate::shared();
    buy_with("node");
}

fn ok(out: Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn word_after(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no `{key}` in:\n{text}"))
        .trim()
        .to_string()
}

/// A migrated ledger in a throwaway Postgres.
fn ledger(rt: &tokio::runtime::Runtime) -> (TempPostgres, String) {
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let url = pg.url().to_string();
    ok(
        Command::new(bin("stockgate-sweeper"))
            .args(["--database-url", &url, "migrate"])
            .env("STOCKGATE_LOG", "warn")
            .output()
            .expect("migrate"),
        "migrate",
    );
    (pg, url)
}

fn order_status(rt: &tokio::runtime::Runtime, url: &str, token: &str) -> String {
    rt.block_on(async {
        let pool = sqlx::PgPool::connect(url).await.expect("connect");
        let row: (String,) =
            sqlx::query_as("SELECT status FROM stockgate.orders WHERE reservation_token = $1")
                .bind(token)
                .fetch_one(&pool)
                .await
                .expect("order row");
        row.0
    })
}

/// Two holds taken on group 0, the slot moved to group 1, then paid: through a plain
/// client of group 0 (COMMIT meets -MOVED: committed in the ledger, not yet confirmed by
/// the server, nothing raised) and through a cluster client (confirmed on group 1).
fn pay_after_a_move(lang: &str) {
    let rt = crate::common::runtime();
    let (_pg, url) = ledger(&rt);
    let c = Cluster::start(&THREE);
    let sku = c.skus(&format!("PAY{}", lang.len()), 1).remove(0).remove(0);
    crate::common::raft::create_sale(c.nodes[0].port, &sku, TOTAL);
    let (a, secret) = (
        c.nodes[0].addr(),
        c.keys.secret_path().display().to_string(),
    );
    let run = |args: &[&str]| -> String {
        let mut cmd = match lang {
            "node" => node(args),
            _ => {
                let mut all = vec!["tests/py/package_cluster_pay.py"];
                all.extend_from_slice(args);
                python(&all)
            }
        };
        ok(cmd.output().expect("script"), &format!("{lang} {args:?}"))
    };
    let plain = word_after(&run(&["hold", &a, &secret, &url, &sku, "ann"]), "TOKEN ");
    let clustered = word_after(&run(&["hold", &a, &secret, &url, &sku, "bob"]), "TOKEN ");
    move_slots(&a, &c.nodes[1].addr(), key_slot(sku.as_bytes()));
    let out = run(&["pay", "plain", &a, &secret, &url, &plain]);
    let want_plain = if lang == "node" {
        "committed false"
    } else {
        "Committed False"
    };
    assert_eq!(word_after(&out, "OUTCOME "), want_plain, "{out}");
    assert_eq!(order_status(&rt, &url, &plain), "COMMITTED");
    // The server was not told: the hold waits on group 1 for the sweeper's cleanup.
    assert_eq!(
        state_of(c.nodes[1].port, &plain).as_deref(),
        Some("RESERVED")
    );
    let out = run(&["pay", "cluster", &a, &secret, &url, &clustered]);
    let want = if lang == "node" {
        "committed true"
    } else {
        "Committed True"
    };
    assert_eq!(word_after(&out, "OUTCOME "), want, "{out}");
    assert_eq!(order_status(&rt, &url, &clustered), "COMMITTED");
    assert_eq!(
        state_of(c.nodes[1].port, &clustered).as_deref(),
        Some("COMMITTED")
    );
}

#[test]
fn python_checkout_pays_after_the_slot_moved() {
    let _shared = crate::shared();
    pay_after_a_move("python");
}

#[test]
fn node_checkout_pays_after_the_slot_moved() {
    let _shared = crate::shared();
    pay_after_a_move("node");
}
