//! The per-user limit over a whole split sale, kept by the ledger at payment
//! (docs/cluster.md, "A split sale"; migration 0010): three single-node groups, a real
//! Postgres ledger, the real `stockgate-sweeper split`, and the checkout's `pay`.
//!
//! Each part's server holds a buyer to the limit on that part only, so a buyer who sends
//! `RESERVE` to every part directly holds the limit three times over. What they can pay
//! for is the limit across the parent: of concurrent payments for one buyer's holds on
//! three parts, exactly the ones that fit commit; the others are refused (`LIMIT`, no
//! money moved) or marked `REFUND_REQUIRED` (money moved). The ledger's paid units per
//! buyer and parent never exceed the limit, and the servers committed exactly what the
//! ledger did.

use std::collections::HashMap;
use std::process::Command;

use crate::common::cluster::{Cluster, THREE};
use crate::common::{now_ms, runtime};
use crate::operator::sweeper_bin;
use stockgate_client::StockgateClient;
use stockgate_ledger::{Checkout, PayOutcome, PgLedger};
use stockgate_testkit::pgtemp::TempPostgres;

const LIMIT: u32 = 2;

fn split_parts(pg: &TempPostgres, seed: u16) -> Vec<String> {
    let out = Command::new(sweeper_bin())
        .args(["--database-url", pg.url(), "--server"])
        .arg(format!("127.0.0.1:{seed}"))
        .args([
            "split", "--parent", "LIM", "--parts", "3", "--total", "300", "--limit", "2",
            "--ttl-ms", "600000",
        ])
        .env("STOCKGATE_LOG", "warn")
        .output()
        .expect("run stockgate-sweeper split");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "split failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|l| l.strip_prefix("part "))
        .map(|l| l.split_whitespace().nth(1).expect("sku").to_string())
        .collect()
}

type PartCheckout = Checkout<PgLedger, StockgateClient>;

/// One checkout per part, each over that part's group and the one ledger.
async fn checkouts(cluster: &Cluster, pg: &TempPostgres, parts: &[String]) -> Vec<PartCheckout> {
    let ledger = PgLedger::connect(pg.url()).await.expect("ledger");
    let mut out = Vec::new();
    for p in parts {
        let port = cluster.nodes[cluster.owner(p)].port;
        let gate = StockgateClient::connect(&format!("127.0.0.1:{port}"))
            .await
            .expect("connect");
        out.push(Checkout::new(ledger.clone(), gate));
    }
    out
}

#[test]
fn split_sale_per_user_limit_over_the_parent_is_kept_at_payment() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&THREE);
    let parts = split_parts(&pg, cluster.nodes[0].port);
    assert_eq!(parts.len(), 3, "{parts:?}");
    let keyring = cluster.keys.keyring();
    let cos = rt.block_on(checkouts(&cluster, &pg, &parts));
    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");

    // Twenty buyers, each holding the limit on every part (RESERVE sent to each part,
    // past reserve_split): three holds of 2 units, 6 units held against a limit of 2.
    const USERS: usize = 20;
    let mut holds: Vec<(String, Vec<String>)> = Vec::new();
    for u in 0..USERS {
        let user = format!("greedy-{u}");
        let mut tokens = Vec::new();
        for (co, sku) in cos.iter().zip(&parts) {
            let adm = keyring.mint(sku, &user, now_ms() + 600_000);
            let h = rt
                .block_on(co.start(sku, &user, &adm, "r1", LIMIT))
                .unwrap_or_else(|e| panic!("{user} on {sku}: {e}"));
            tokens.push(h.token);
        }
        holds.push((user, tokens));
    }

    // Each buyer pays for the three at once; half of them with the money already taken.
    let outcomes: Vec<(String, bool, Vec<PayOutcome>)> = rt.block_on(async {
        let mut all = Vec::new();
        for (i, (user, tokens)) in holds.iter().enumerate() {
            let moved = i % 2 == 1;
            let pay = |k: usize| {
                let (t, co) = (&tokens[k], &cos[k]);
                async move { co.pay(t, &format!("pay-{t}"), moved).await }
            };
            let (a, b, c) = tokio::join!(pay(0), pay(1), pay(2));
            let got: Vec<PayOutcome> = [a, b, c].into_iter().map(|r| r.expect("pay")).collect();
            all.push((user.clone(), moved, got));
        }
        all
    });
    for (user, moved, got) in &outcomes {
        let committed = got
            .iter()
            .filter(|p| matches!(p, PayOutcome::Committed { .. }))
            .count();
        assert_eq!(
            committed, 1,
            "{user}: one payment of 2 fits the limit: {got:?}"
        );
        for p in got {
            match (p, moved) {
                (PayOutcome::Committed { .. }, _) => {}
                (PayOutcome::Limit, false) => {}
                (PayOutcome::RefundRequired { .. }, true) => {}
                other => panic!("{user}: unexpected {other:?}"),
            }
        }
    }

    // The ledger: paid units per buyer over the parent, and the refunds owed.
    let rows: Vec<(String, String, i64)> = rt
        .block_on(
            sqlx::query_as(
                "SELECT o.user_id, o.status, sum(o.qty)::bigint FROM stockgate.orders o \
                 JOIN stockgate.split_parts sp ON sp.sku = o.sku \
                 WHERE sp.parent = 'LIM' GROUP BY o.user_id, o.status",
            )
            .fetch_all(&pool),
        )
        .expect("orders");
    let mut paid: HashMap<String, i64> = HashMap::new();
    let mut refunds = 0;
    for (user, status, qty) in rows {
        match status.as_str() {
            "COMMITTED" => *paid.entry(user).or_default() += qty,
            "REFUND_REQUIRED" => refunds += qty,
            _ => {}
        }
    }
    assert_eq!(paid.len(), USERS);
    assert!(
        paid.values().all(|q| *q == i64::from(LIMIT)),
        "every buyer paid exactly the limit over the parent: {paid:?}"
    );
    assert_eq!(
        refunds,
        (USERS as i64 / 2) * 2 * i64::from(LIMIT),
        "the money-moved buyers' two refused payments each are owed back"
    );
    // The servers committed what the ledger did, no more.
    let committed_on_servers: u64 = parts
        .iter()
        .map(|p| crate::common::raft::sale_info(cluster.nodes[cluster.owner(p)].port, p).3 as u64)
        .sum();
    assert_eq!(committed_on_servers, (USERS as u64) * u64::from(LIMIT));

    // One unit at a time: two 1-unit payments fit a limit of 2, the third does not, on
    // whichever part it is.
    let user = "stepwise";
    let mut tokens = Vec::new();
    for (co, sku) in cos.iter().zip(&parts) {
        let adm = keyring.mint(sku, user, now_ms() + 600_000);
        let h = rt
            .block_on(co.start(sku, user, &adm, "r1", 1))
            .expect("hold");
        tokens.push(h.token);
    }
    let got: Vec<PayOutcome> = tokens
        .iter()
        .zip(&cos)
        .map(|(t, co)| {
            rt.block_on(co.pay(t, &format!("pay-{t}"), false))
                .expect("pay")
        })
        .collect();
    assert!(matches!(got[0], PayOutcome::Committed { .. }), "{got:?}");
    assert!(matches!(got[1], PayOutcome::Committed { .. }), "{got:?}");
    assert_eq!(got[2], PayOutcome::Limit, "{got:?}");
    // A refused payment changed nothing: the order is still PENDING and can be released.
    let status: String = rt
        .block_on(
            sqlx::query_scalar("SELECT status FROM stockgate.orders WHERE reservation_token = $1")
                .bind(&tokens[2])
                .fetch_one(&pool),
        )
        .expect("order");
    assert_eq!(status, "PENDING");
}
