//! Failover by the real Redis Sentinel (issue 13): three stockgate nodes (one primary, two
//! replicas, `--min-replicas-ack 1`), three `redis-sentinel` processes, and a storm of
//! redis-py checkout clients going through Sentinel (`tests/py/ha_storm.py`). The primary
//! is `kill -9`ed five times mid-storm; Sentinel promotes a replica each time, and the
//! killed node is restarted and rejoins as a replica. A sixth failover is of a primary
//! that is alive, clients still writing to it (`SENTINEL FAILOVER`).
//!
//! Asserted at the end, on the final primary: every reservation whose reply reached a
//! client is there, in (at least) its last acknowledged state; no token was handed out
//! twice; units held never exceed the total and the counters add up (DESIGN.md); all
//! three nodes converge to the same state. Run twice: with Sentinel pinging every 500 ms
//! (`SENTINEL DEBUG ping-period 500`) and with stock Sentinel settings, under which
//! Sentinel may also fail over a primary that is alive.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::field;
use common::ha::*;
use redis::Value;

const MASTER: &str = "sg";
const SKU: &str = "FLASH";
const TOTAL: i64 = 5000;
const FAILOVERS: usize = 5;

fn reserve(node: &Node, keys: &Keys, user: &str, req: &str) -> Option<String> {
    let mut c = node.try_conn().ok()?;
    let adm = keys.keyring().mint(SKU, user, common::now_ms() + 600_000);
    let v: Value = redis::cmd("RESERVE")
        .arg(SKU)
        .arg(user)
        .arg(adm)
        .arg(req)
        .query(&mut c)
        .ok()?;
    // Any answer proves the primary serves; only RESERVED/REPLAY carry a token.
    match v {
        Value::Array(a) => Some(match a.get(1) {
            Some(Value::BulkString(t)) => String::from_utf8_lossy(t).into_owned(),
            _ => String::new(),
        }),
        _ => None,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn int_field(v: &Value, name: &str) -> i64 {
    field(v, name)
        .map(|f| match f {
            Value::Int(i) => i,
            other => text(&other).parse().unwrap_or(-1),
        })
        .unwrap_or(-1)
}

fn switches_in_logs(dir: &Path) -> usize {
    // Each Sentinel logs +switch-master when it learns of a new primary; the leader's log
    // has one per failover it ran. Count the most any one Sentinel saw.
    (0..3)
        .map(|i| {
            std::fs::read_to_string(dir.join(format!("sentinel-{i}.log")))
                .map(|t| t.matches("+switch-master").count())
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

fn failover_storm(tuned: bool) {
    let keys = Keys::new();
    // `HA_MIN_REPLICAS_ACK=0 cargo test --test ha_sentinel` shows what the test catches:
    // with asynchronous replication the kills lose acknowledged reservations.
    let min_acks = std::env::var("HA_MIN_REPLICAS_ACK").unwrap_or_else(|_| "1".into());
    let ack = [
        "--min-replicas-ack",
        min_acks.as_str(),
        "--repl-timeout-ms",
        "2000",
    ];
    // Each batch reaches the replicas 30 ms late: a kill then always finds records that
    // are durable on the primary and on no replica yet (on loopback that window is
    // otherwise too small for five kills to hit).
    let env = [("STOCKGATE_FAULT_REPL_DELAY_MS", "30")];
    let mut nodes = vec![Node::start_env(&keys, &ack, &env)];
    let primary_addr = nodes[0].addr();
    for _ in 0..2 {
        let mut args = vec!["--replicaof", primary_addr.as_str()];
        args.extend_from_slice(&ack);
        nodes.push(Node::start_env(&keys, &args, &env));
    }
    wait_for("two replicas attached", Duration::from_secs(15), || {
        nodes[0].repl_field("connected_slaves") == "2"
    });
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(TOTAL)
        .query(&mut nodes[0].conn())
        .expect("SALE.CREATE");
    let sentinels = start_sentinels(MASTER, nodes[0].port, tuned);
    sentinels.wait_discovered(2);

    let out = sentinels.dir.path().join("storm.json");
    let ports: Vec<String> = sentinels.ports.iter().map(|p| p.to_string()).collect();
    let mut storm = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/ha_storm.py"))
        .arg("0")
        .arg(keys.dir.path())
        .arg(ports.join(","))
        .arg(MASTER)
        .arg(SKU)
        .arg("600")
        .arg("12")
        .arg(&out)
        .env(
            "PYTHONPATH",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py"),
        )
        .stdin(Stdio::null())
        .spawn()
        .expect("python3 tests/py/ha_storm.py");

    let mut probes: Vec<(String, String)> = Vec::new();
    let mut failover_ms = Vec::new();
    let mut live_failover_ms = None;
    // Five kills, then one failover of a primary that is alive, with the storm's clients
    // still connected to it and writing (`SENTINEL FAILOVER`: what a failover Sentinel
    // starts on its own against a slow primary looks like to the nodes).
    for round in 0..=FAILOVERS {
        let live = round == FAILOVERS;
        std::thread::sleep(Duration::from_millis(2500));
        let old = sentinel_primary(&sentinels).expect("a primary");
        let victim = nodes
            .iter()
            .position(|n| n.port == old)
            .expect("primary is ours");
        if live {
            sentinel(sentinels.ports[0], &["SENTINEL", "FAILOVER", MASTER])
                .expect("SENTINEL FAILOVER");
        } else {
            nodes[victim].kill9();
        }
        let t = Instant::now();
        // Kill → first RESERVE acknowledged by the new primary (what a buyer sees).
        let mut done = false;
        while t.elapsed() < Duration::from_secs(30) {
            if let Some(p) = sentinel_primary(&sentinels).filter(|p| *p != old) {
                if let Some(n) = nodes.iter().find(|n| n.port == p) {
                    let (user, req) = (format!("probe{round}"), format!("probe{round}"));
                    if let Some(tok) = reserve(n, &keys, &user, &req) {
                        if !tok.is_empty() {
                            probes.push((req, tok));
                        }
                        done = true;
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            done,
            "round {round}: no new primary took a reservation within 30 s"
        );
        if live {
            live_failover_ms = Some(t.elapsed().as_millis() as u64);
        } else {
            failover_ms.push(t.elapsed().as_millis() as u64);
            // The killed node comes back and Sentinel makes it a replica of the new primary.
            nodes[victim].restart();
        }
        wait_for(
            "the old primary to rejoin as a replica",
            Duration::from_secs(40),
            || {
                let n = &nodes[victim];
                n.repl_field("role") == "slave" && n.repl_field("master_link_status") == "up"
            },
        );
        // Asked of Sentinel each time: under load (stock settings, CI) Sentinel may fail
        // over the new primary by itself meanwhile, which is part of what is under test.
        wait_for("both replicas attached", Duration::from_secs(40), || {
            sentinel_primary(&sentinels)
                .and_then(|port| nodes.iter().find(|n| n.port == port))
                .is_some_and(|p| p.repl_field("connected_slaves") == "2")
        });
    }
    std::fs::write(out.with_extension("json.stop"), b"").expect("stop file");
    let t = Instant::now();
    let status = loop {
        if let Ok(Some(st)) = storm.try_wait() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = storm.kill();
            panic!("the storm did not stop");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "storm failed: {status}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("storm output")).expect("json");

    // The final state, once every node has everything.
    let primary_port = sentinel_primary(&sentinels).expect("final primary");
    let primary = nodes.iter().find(|n| n.port == primary_port).expect("ours");
    wait_for("all nodes converged", Duration::from_secs(30), || {
        let off = primary.offset();
        nodes.iter().all(|n| n.offset() == off)
    });
    let mut pc = primary.conn();
    let info: Value = redis::cmd("SALE.INFO")
        .arg(SKU)
        .query(&mut pc)
        .expect("SALE.INFO");
    let (total, avail, reserved, committed) = (
        int_field(&info, "total"),
        int_field(&info, "available"),
        int_field(&info, "reserved"),
        int_field(&info, "committed"),
    );
    assert_eq!(total, TOTAL);
    assert_eq!(
        avail + reserved + committed,
        total,
        "counters add up: {info:?}"
    );
    assert!(reserved + committed <= total);

    let mut acked: Vec<(String, String, String)> = report["acked"]
        .as_array()
        .expect("acked")
        .iter()
        .map(|e| {
            (
                e[0].as_str().unwrap_or_default().to_owned(),
                e[1].as_str().unwrap_or_default().to_owned(),
                e[2].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    acked.extend(probes.into_iter().map(|(r, t)| (r, t, "RESERVED".into())));
    assert!(
        acked.len() > 100,
        "the storm hardly ran: {} reservations",
        acked.len()
    );
    let tokens: HashSet<&str> = acked.iter().map(|a| a.1.as_str()).collect();
    assert_eq!(tokens.len(), acked.len(), "a token was handed out twice");
    let mut lost = Vec::new();
    let mut held = 0i64;
    for (req, tok, state) in &acked {
        assert!(!state.starts_with("ERR"), "{req}: {state}");
        let v: Value = redis::cmd("RESERVATION")
            .arg(tok)
            .query(&mut pc)
            .expect("RESERVATION");
        let now = field(&v, "state").map(|s| text(&s));
        let ok = match (state.as_str(), now.as_deref()) {
            ("RESERVED", Some("RESERVED" | "COMMITTED" | "RELEASED")) => true,
            (s, Some(n)) => s == n,
            (_, None) => false,
        };
        if !ok {
            lost.push(format!("{req} {tok}: acknowledged {state}, now {now:?}"));
        }
        if now.as_deref() != Some("RELEASED") {
            held += int_field(&v, "qty").max(1);
        }
    }
    assert!(
        lost.is_empty(),
        "{} acknowledged states lost across failovers, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(held <= total, "oversold: {held} units held of {total}");
    // Reservations whose reply never arrived (the storm ended mid-retry) hold units too.
    assert!(
        held <= reserved + committed,
        "held units within the sale's counters"
    );
    // Every node holds the same state.
    let sample: Vec<String> = acked.iter().step_by(7).map(|a| a.1.clone()).collect();
    let want = state_of(primary, SKU, &sample);
    for n in &nodes {
        assert_eq!(state_of(n, SKU, &sample), want, "node {} diverged", n.port);
    }
    let switches = switches_in_logs(sentinels.dir.path());
    println!(
        "failover ({}): {} reservations acknowledged, {} retries, {held}/{total} units held; kill -> first RESERVE on the new primary: {:?} ms; live primary failed over -> first RESERVE: {:?} ms; Sentinel switched primaries {switches} times for {FAILOVERS} kills and 1 live failover",
        if tuned { "ping-period 500" } else { "stock Sentinel" },
        acked.len(),
        report["retries"],
        failover_ms,
        live_failover_ms
    );
}

/// The two runs one after the other: each is a storm of its own on this machine's cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn failovers_by_sentinel_lose_no_acknowledged_reservation_tuned() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    failover_storm(true);
}

#[test]
fn failovers_by_sentinel_lose_no_acknowledged_reservation_stock_settings() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    failover_storm(false);
}
