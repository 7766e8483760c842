//! A Raft group's leader killed mid-sale in cluster mode (docs/cluster.md, "How leaders
//! are found"): group `a` is three Raft members, group `b` one node. Two writers reserve
//! through one redis-rs cluster client (async connections), one on `a`'s skus and one on `b`'s; `a`'s leader
//! gets SIGKILL. `b` keeps selling through the election; `a`'s skus sell again through
//! the same client once Raft elects a new leader; every node's `CLUSTER SLOTS` names that
//! leader within 10 s; every acknowledged reservation is there afterwards.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cluster::{slots_master, RaftBesideSingle};
use crate::common::ha::wait_for;
use crate::common::now_ms;
use crate::common::raft::sale_info;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::Value;
use stockgate_server::cluster::key_slot;
use stockgate_server::engine::Keyring;

/// Enough that neither writer sells out while the test runs.
const STOCK: i64 = 100_000;

/// `n` skus whose slots are in `lo..=hi`.
fn skus_in(prefix: &str, lo: u16, hi: u16, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|s| (lo..=hi).contains(&key_slot(s.as_bytes())))
        .take(n)
        .collect()
}

/// What one writer saw: when each answered request was sent and answered, and the
/// acknowledged tokens per sku.
#[derive(Default)]
struct Seen {
    answered: Vec<(Instant, Instant)>,
    errors: Vec<(Instant, String)>,
    acked: Vec<(String, String)>,
}

/// Reserves one unit for a new user at a time, round robin over `skus`, until `stop`,
/// on its own connection of the shared client (redis-rs's async cluster connection: its
/// blocking one keeps reconnecting to a dead master's address and never rereads
/// `CLUSTER SLOTS`, docs/cluster.md); a failed request is sent again with the same
/// request id (answered once).
fn writer(
    client: ClusterClient,
    keyring: Keyring,
    skus: Vec<String>,
    tag: &'static str,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut c = client
                .get_async_connection()
                .await
                .expect("cluster connection");
            let mut seen = Seen::default();
            let mut n = 0usize;
            let mut sold_out = 0;
            while !stop.load(Ordering::SeqCst) && sold_out < skus.len() {
                let sku = &skus[n % skus.len()];
                let user = format!("{tag}{n}");
                let adm = keyring.mint(sku, &user, now_ms() + 120_000);
                let sent = Instant::now();
                let r: redis::RedisResult<Vec<Value>> = redis::cmd("RESERVE")
                    .arg(sku)
                    .arg(&user)
                    .arg(&adm)
                    .arg(format!("q{n}"))
                    .query_async(&mut c)
                    .await;
                match r {
                    Ok(v) => {
                        seen.answered.push((sent, Instant::now()));
                        let word = v.first().map(crate::common::as_str).unwrap_or_default();
                        match word.as_str() {
                            "RESERVED" | "REPLAY" => {
                                seen.acked.push((sku.clone(), crate::common::as_str(&v[1])));
                                acks.fetch_add(1, Ordering::SeqCst);
                            }
                            "SOLDOUT" => sold_out += 1,
                            other => panic!("RESERVE {sku} answered {other}"),
                        }
                        n += 1;
                    }
                    Err(e) => {
                        seen.errors.push((Instant::now(), e.to_string()));
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            seen
        })
    })
}

#[test]
fn killing_a_groups_leader_costs_only_that_group_its_election() {
    let mut rc = RaftBesideSingle::start();
    let old = rc.a.leader(None, Duration::from_secs(20));
    let old_port = rc.a.port(old);
    let skus_a = skus_in("FA", 0, 8191, 2);
    let skus_b = skus_in("FB", 8192, 16383, 2);
    let slot_a = key_slot(skus_a[0].as_bytes());

    let client = ClusterClientBuilder::new(rc.urls())
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(2))
        .build()
        .expect("cluster client");
    {
        let mut c = client.get_connection().expect("cluster connection");
        for sku in skus_a.iter().chain(&skus_b) {
            let ok: String = redis::cmd("SALE.CREATE")
                .arg(sku)
                .arg(STOCK)
                .query(&mut c)
                .expect("SALE.CREATE");
            assert_eq!(ok, "OK");
        }
    }
    wait_for("b to learn a's leader", Duration::from_secs(5), || {
        slots_master(rc.b.port, slot_a) == Some(old_port)
    });

    let stop = Arc::new(AtomicBool::new(false));
    let keyring = rc.a.keys.keyring();
    let acks_a = Arc::new(AtomicUsize::new(0));
    let wa = writer(
        client.clone(),
        keyring.clone(),
        skus_a.clone(),
        "a",
        stop.clone(),
        acks_a.clone(),
    );
    let wb = writer(
        client.clone(),
        keyring,
        skus_b.clone(),
        "b",
        stop.clone(),
        Arc::new(AtomicUsize::new(0)),
    );
    std::thread::sleep(Duration::from_millis(1500));
    rc.a.member(old).kill9();
    // The old leader is gone (killed and reaped): what is sent from here on is
    // answered by another member or not at all.
    let killed_at = Instant::now();
    let before = acks_a.load(Ordering::SeqCst);

    // Raft elects a new leader; every live node names it within 10 s of the kill.
    let new = rc.a.leader(Some(old), Duration::from_secs(20));
    let new_port = rc.a.port(new);
    let live: Vec<u16> =
        rc.a.members
            .iter()
            .filter(|m| m.id != old)
            .map(|m| m.port)
            .chain([rc.b.port])
            .collect();
    wait_for(
        "CLUSTER SLOTS to name the new leader",
        Duration::from_secs(10),
        || {
            live.iter()
                .all(|&p| slots_master(p, slot_a) == Some(new_port))
        },
    );
    assert!(killed_at.elapsed() < Duration::from_secs(10) + Duration::from_millis(500));
    // The same client sells a's skus again (within 20 s of the kill), then both run on
    // a little before they stop.
    let t = Instant::now();
    while acks_a.load(Ordering::SeqCst) == before && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let (sa, sb) = (wa.join().expect("writer a"), wb.join().expect("writer b"));

    // a sold before the kill and again after it, through the same client.
    assert!(
        sa.answered.iter().any(|&(_, t)| t < killed_at),
        "a sold nothing before the kill"
    );
    let back = sa
        .answered
        .iter()
        .find(|&&(sent, _)| sent > killed_at)
        .map(|&(_, t)| t)
        .unwrap_or_else(|| {
            panic!(
                "a's skus never sold again after the kill: {:?}",
                sa.errors.iter().rev().take(5).collect::<Vec<_>>()
            )
        });
    // b never failed, and kept answering while a had none.
    assert!(
        sb.errors.is_empty(),
        "b failed: {:?}",
        &sb.errors[..sb.errors.len().min(3)]
    );
    let during = sb
        .answered
        .iter()
        .filter(|&&(_, t)| t > killed_at && t < back)
        .count();
    assert!(
        during > 0,
        "b answered nothing during a's election ({:?}); b: {} answers, last {:?} after the kill",
        back - killed_at,
        sb.answered.len(),
        sb.answered
            .last()
            .map(|&(_, t)| t.saturating_duration_since(killed_at))
    );
    let gaps = sb
        .answered
        .windows(2)
        .map(|w| w[1].1 - w[0].1)
        .max()
        .unwrap_or_default();
    assert!(gaps < Duration::from_secs(1), "b stalled {gaps:?}");
    eprintln!(
        "a back after {:?}; b answered {during} meanwhile; a {} acked, {} errors; b {} acked",
        back - killed_at,
        sa.acked.len(),
        sa.errors.len(),
        sb.acked.len()
    );

    // Every acknowledged reservation is there, and no sku handed out more than it has.
    let mut c = client.get_connection().expect("cluster connection");
    for (sku, token) in sa.acked.iter().chain(&sb.acked) {
        let v: Value = redis::cmd("RESERVATION")
            .arg(token)
            .query(&mut c)
            .expect("RESERVATION");
        let state = crate::common::field(&v, "state").map(|s| crate::common::as_str(&s));
        assert_eq!(state.as_deref(), Some("RESERVED"), "{sku} {token}");
    }
    for (sku, port, acked) in skus_a
        .iter()
        .map(|s| (s, new_port, &sa.acked))
        .chain(skus_b.iter().map(|s| (s, rc.b.port, &sb.acked)))
    {
        let mine = acked.iter().filter(|(k, _)| k == sku).count() as i64;
        let (total, avail, reserved, committed) = sale_info(port, sku);
        assert_eq!(total, STOCK);
        assert_eq!(avail + reserved + committed, total, "{sku}");
        assert!(
            reserved >= mine && mine <= STOCK,
            "{sku}: {reserved} < {mine}"
        );
    }
}
