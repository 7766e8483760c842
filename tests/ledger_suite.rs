//! One ledger test suite, run against both backends: Postgres (a real throwaway cluster,
//! no mocks) and the embedded sled ledger.
//!
//! Each backend runs every case in sequence inside one test, so one Postgres serves the
//! whole suite; a failure names the case.

use std::collections::HashSet;

use stockgate_client::ledger::{
    LedgerCommit, Materialized, NewOrder, ReleaseReason, SaleRecord, SweepVerdict,
};
use stockgate_client::pgtemp::TempPostgres;
use stockgate_client::types::{now_ms, ExpiredReservation};
use stockgate_client::{Ledger, LedgerError, OrderStatus, PgLedger, SledLedger};

const SKU: &str = "SUITE";

fn order(tag: &str, expires_in_ms: i64) -> NewOrder {
    let now = now_ms();
    NewOrder {
        token: format!("{{{SKU}}}{tag}"),
        sku: SKU.into(),
        user: format!("user-{tag}"),
        request_id: format!("req-{tag}"),
        qty: 1,
        expires_at_ms: now + expires_in_ms,
        created_at_ms: now - 10,
    }
}

fn expired_item(o: &NewOrder) -> ExpiredReservation {
    ExpiredReservation {
        token: o.token.clone(),
        sku: o.sku.clone(),
        user: o.user.clone(),
        qty: o.qty,
        shard: 0,
        expires_at_ms: o.expires_at_ms,
    }
}

fn missing_item(tag: &str) -> ExpiredReservation {
    ExpiredReservation {
        token: format!("{{{SKU}}}{tag}"),
        sku: SKU.into(),
        user: format!("user-{tag}"),
        qty: 2,
        shard: 1,
        expires_at_ms: now_ms() - 1000,
    }
}

async fn status<L: Ledger>(l: &L, token: &str) -> OrderStatus {
    l.order(token).await.expect("order").expect("exists").status
}

/// Audit rows must replay to the current status: first from nothing, each `from` equal
/// to the previous `to`, the last `to` equal to the row's status, and every edge legal.
async fn assert_audit_matches<L: Ledger>(l: &L, token: &str, expected_len: usize) {
    let evs = l.events(token).await.expect("events");
    assert_eq!(evs.len(), expected_len, "audit rows of {token}: {evs:?}");
    let mut prev: Option<OrderStatus> = None;
    for e in &evs {
        assert_eq!(e.from, prev, "audit chain of {token}: {evs:?}");
        if let Some(p) = prev {
            assert!(p.can_become(e.to), "illegal edge {p} -> {} in audit", e.to);
        }
        prev = Some(e.to);
    }
    if let Some(o) = l.order(token).await.expect("order") {
        assert_eq!(prev, Some(o.status), "last audit row vs status of {token}");
    }
}

async fn case_sales<L: Ledger>(l: &L) {
    let mut s = SaleRecord::new(SKU, 1000);
    s.shards = Some(4);
    l.register_sale(&s).await.expect("register");
    l.register_sale(&s).await.expect("register is idempotent");
    let mut other = s.clone();
    other.initial_allocation = 999;
    assert!(matches!(
        l.register_sale(&other).await,
        Err(LedgerError::Conflict(_))
    ));
    // A missing fingerprint is filled in, a different one refused.
    let mut fp = s.clone();
    fp.key_fingerprint = Some("aaaa".into());
    l.register_sale(&fp).await.expect("fill fingerprint");
    let got = l.sale(SKU).await.expect("sale").expect("exists");
    assert_eq!(got.key_fingerprint.as_deref(), Some("aaaa"));
    assert_eq!(got.shards, Some(4));
    fp.key_fingerprint = Some("bbbb".into());
    assert!(matches!(
        l.register_sale(&fp).await,
        Err(LedgerError::Conflict(_))
    ));
    assert_eq!(l.adjust_allocation(SKU, 10).await.expect("adjust"), 1010);
    assert_eq!(l.adjust_allocation(SKU, -10).await.expect("adjust"), 1000);
    assert!(l.adjust_allocation(SKU, -5000).await.is_err());
    assert!(matches!(
        l.adjust_allocation("NOPE", 1).await,
        Err(LedgerError::UnknownSale(_))
    ));
    assert!(l.sales().await.expect("sales").iter().any(|x| x.sku == SKU));
}

async fn case_materialize_commit<L: Ledger>(l: &L) {
    let o = order("mc", 60_000);
    assert_eq!(l.materialize(&o).await.unwrap(), Materialized::Created);
    assert_eq!(
        l.materialize(&o).await.unwrap(),
        Materialized::AlreadyPending
    );
    let got = l.order(&o.token).await.unwrap().unwrap();
    assert_eq!(got.status, OrderStatus::Pending);
    assert_eq!(got.request_id.as_deref(), Some("req-mc"));
    assert_eq!(got.expires_at_ms, o.expires_at_ms, "expiry kept to the ms");
    assert_eq!(got.reservation_created_at_ms, Some(o.created_at_ms));
    assert_eq!(
        l.commit(&o.token, "pay-1").await.unwrap(),
        LedgerCommit::Committed
    );
    // Same token = same payment.
    assert_eq!(
        l.commit(&o.token, "pay-1").await.unwrap(),
        LedgerCommit::AlreadyCommitted
    );
    assert_eq!(
        l.materialize(&o).await.unwrap(),
        Materialized::AlreadyCommitted
    );
    let got = l.order(&o.token).await.unwrap().unwrap();
    assert_eq!(got.status, OrderStatus::Committed);
    assert_eq!(got.payment_ref.as_deref(), Some("pay-1"));
    // A committed order cannot be cancelled.
    assert!(matches!(
        l.cancel(&o.token).await,
        Err(LedgerError::Refused {
            status: OrderStatus::Committed,
            ..
        })
    ));
    assert_audit_matches(l, &o.token, 2).await;

    // Same token, other details: a conflict, not a silent success.
    let mut bad = o.clone();
    bad.user = "someone-else".into();
    assert!(matches!(
        l.materialize(&bad).await,
        Err(LedgerError::Conflict(_))
    ));
    // Unknown token.
    assert!(matches!(
        l.commit("{SUITE}nope", "p").await,
        Err(LedgerError::NotFound(_))
    ));
}

async fn case_late_payment<L: Ledger>(l: &L) {
    let o = order("late", -1_000);
    assert_eq!(l.materialize(&o).await.unwrap(), Materialized::Created);
    assert!(matches!(
        l.commit(&o.token, "pay-late").await,
        Err(LedgerError::Expired { .. })
    ));
    assert_eq!(status(l, &o.token).await, OrderStatus::Pending);
    // Money moved anyway: compensation.
    assert_eq!(
        l.mark_refund_required(&o.token, "pay-late", "late")
            .await
            .unwrap(),
        OrderStatus::Pending
    );
    assert_eq!(
        l.mark_refund_required(&o.token, "pay-late", "late")
            .await
            .unwrap(),
        OrderStatus::RefundRequired
    );
    l.mark_refunded(&o.token).await.unwrap();
    l.mark_refunded(&o.token).await.unwrap();
    assert_eq!(status(l, &o.token).await, OrderStatus::Refunded);
    assert_audit_matches(l, &o.token, 3).await;

    // An unexpired PENDING order is not refundable (it can still be sold).
    let p = order("late-live", 60_000);
    l.materialize(&p).await.unwrap();
    assert!(matches!(
        l.mark_refund_required(&p.token, "x", "y").await,
        Err(LedgerError::Refused { .. })
    ));
    // Extending brings an expired order back into the payable window.
    let e = order("late-ext", -1_000);
    l.materialize(&e).await.unwrap();
    l.extend(&e.token, now_ms() + 60_000).await.unwrap();
    assert_eq!(
        l.commit(&e.token, "pay-ext").await.unwrap(),
        LedgerCommit::Committed
    );
    assert!(matches!(
        l.extend(&e.token, now_ms() + 1).await,
        Err(LedgerError::Refused { .. })
    ));
}

async fn case_cancel<L: Ledger>(l: &L) {
    let o = order("cancel", 60_000);
    l.materialize(&o).await.unwrap();
    l.cancel(&o.token).await.unwrap();
    l.cancel(&o.token).await.unwrap();
    assert_eq!(status(l, &o.token).await, OrderStatus::Cancelled);
    assert!(matches!(
        l.commit(&o.token, "p").await,
        Err(LedgerError::Refused {
            status: OrderStatus::Cancelled,
            ..
        })
    ));
    // A cancelled token cannot be materialized again.
    assert!(matches!(
        l.materialize(&o).await,
        Err(LedgerError::Refused {
            status: OrderStatus::Cancelled,
            ..
        })
    ));
    assert_eq!(
        l.mark_refund_required(&o.token, "p", "capture after cancel")
            .await
            .unwrap(),
        OrderStatus::Cancelled
    );
    assert_audit_matches(l, &o.token, 3).await;
}

async fn case_sweeper_branches<L: Ledger>(l: &L) {
    let expired = order("sw-expired", -1_000);
    let live = order("sw-live", 60_000);
    let committed = order("sw-committed", 60_000);
    let cancelled = order("sw-cancelled", 60_000);
    let refund = order("sw-refund", -1_000);
    for o in [&expired, &live, &committed, &cancelled, &refund] {
        l.materialize(o).await.unwrap();
    }
    l.commit(&committed.token, "p").await.unwrap();
    l.cancel(&cancelled.token).await.unwrap();
    l.mark_refund_required(&refund.token, "p", "r")
        .await
        .unwrap();
    let missing = missing_item("sw-missing");
    let batch = vec![
        expired_item(&expired),
        expired_item(&live),
        expired_item(&committed),
        expired_item(&cancelled),
        expired_item(&refund),
        missing.clone(),
    ];
    let v = l.reconcile_expired(&batch).await.unwrap();
    assert_eq!(
        v,
        vec![
            SweepVerdict::Release(ReleaseReason::CancelledNow),
            SweepVerdict::Skip,
            SweepVerdict::CommitCleanup,
            SweepVerdict::Release(ReleaseReason::CancelledByBuyer),
            SweepVerdict::Release(ReleaseReason::Refund),
            SweepVerdict::Release(ReleaseReason::Tombstoned),
        ]
    );
    assert_eq!(
        status(l, &expired.token).await,
        OrderStatus::CancelledBySweeper
    );
    assert_eq!(status(l, &live.token).await, OrderStatus::Pending);
    let tomb = l.order(&missing.token).await.unwrap().unwrap();
    assert_eq!(tomb.status, OrderStatus::CancelledBySweeper);
    assert_eq!(tomb.request_id, None);
    assert_eq!(tomb.qty, 2);

    // A second pass (an earlier sweep crashed before releasing) says "release anyway"
    // without writing anything new.
    let v2 = l.reconcile_expired(&batch).await.unwrap();
    assert_eq!(
        v2[0],
        SweepVerdict::Release(ReleaseReason::AlreadyCancelledBySweeper)
    );
    assert_eq!(
        v2[5],
        SweepVerdict::Release(ReleaseReason::AlreadyCancelledBySweeper)
    );
    assert_eq!(v2[1], SweepVerdict::Skip);

    // A late materialize of the tombstoned token is refused; a late payment for the swept
    // order is refused (and compensated if money moved).
    let late = NewOrder {
        token: missing.token.clone(),
        sku: SKU.into(),
        user: missing.user.clone(),
        request_id: "req-x".into(),
        qty: 2,
        expires_at_ms: now_ms() + 60_000,
        created_at_ms: now_ms(),
    };
    assert!(matches!(
        l.materialize(&late).await,
        Err(LedgerError::Refused {
            status: OrderStatus::CancelledBySweeper,
            ..
        })
    ));
    assert!(matches!(
        l.commit(&expired.token, "p").await,
        Err(LedgerError::Refused {
            status: OrderStatus::CancelledBySweeper,
            ..
        })
    ));
    assert_audit_matches(l, &expired.token, 2).await;
    assert_audit_matches(l, &missing.token, 1).await;
    assert_audit_matches(l, &live.token, 1).await;
    assert_audit_matches(l, &committed.token, 2).await;
}

async fn case_commit_races_cancel<L: Ledger>(l: &L) {
    const N: usize = 40;
    let orders: Vec<NewOrder> = (0..N)
        .map(|i| order(&format!("race-c{i}"), 60_000))
        .collect();
    for o in &orders {
        l.materialize(o).await.unwrap();
    }
    let mut handles = Vec::new();
    for o in &orders {
        let (a, b) = (l.clone(), l.clone());
        let (t1, t2) = (o.token.clone(), o.token.clone());
        let commit = tokio::spawn(async move { a.commit(&t1, "p").await });
        let cancel = tokio::spawn(async move { b.cancel(&t2).await });
        handles.push((o.token.clone(), commit, cancel));
    }
    for (token, commit, cancel) in handles {
        let c = commit.await.unwrap();
        let x = cancel.await.unwrap();
        assert!(
            c.is_ok() != x.is_ok(),
            "exactly one of commit/cancel wins for {token}: {c:?} / {x:?}"
        );
        let st = status(l, &token).await;
        if c.is_ok() {
            assert_eq!(st, OrderStatus::Committed);
        } else {
            assert_eq!(st, OrderStatus::Cancelled);
        }
        assert_audit_matches(l, &token, 2).await;
    }
}

async fn case_sweepers_race<L: Ledger>(l: &L) {
    // Four sweepers judge the same 100 expired orders (and 20 missing ones) at once:
    // each order is cancelled by exactly one of them; the others say "release anyway"
    // (safe: RELEASE is exactly-once on the server) or skip a row another holds.
    let orders: Vec<NewOrder> = (0..100)
        .map(|i| order(&format!("race-s{i}"), -1_000))
        .collect();
    for o in &orders {
        l.materialize(o).await.unwrap();
    }
    let mut batch: Vec<ExpiredReservation> = orders.iter().map(expired_item).collect();
    batch.extend((0..20).map(|i| missing_item(&format!("race-m{i}"))));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (l, b) = (l.clone(), batch.clone());
        tasks.push(tokio::spawn(async move { l.reconcile_expired(&b).await }));
    }
    let mut decided = vec![0usize; batch.len()];
    for t in tasks {
        let v = t.await.unwrap().unwrap();
        for (i, v) in v.iter().enumerate() {
            if matches!(
                v,
                SweepVerdict::Release(ReleaseReason::CancelledNow)
                    | SweepVerdict::Release(ReleaseReason::Tombstoned)
            ) {
                decided[i] += 1;
            }
        }
    }
    assert!(
        decided.iter().all(|&n| n == 1),
        "each reservation judged exactly once: {decided:?}"
    );
    for item in &batch {
        assert_eq!(
            status(l, &item.token).await,
            OrderStatus::CancelledBySweeper
        );
        let expected = if item.token.contains("race-m") { 1 } else { 2 };
        assert_audit_matches(l, &item.token, expected).await;
    }
}

async fn case_tombstone_races_materialize<L: Ledger>(l: &L) {
    // Whoever comes first, the end state is the same: the expired reservation is
    // cancelled by the sweeper and its units may go back; the materialize either failed
    // (tombstone first) or its order was then swept.
    for i in 0..20 {
        let o = order(&format!("race-t{i}"), -1_000);
        let item = expired_item(&o);
        let (a, b) = (l.clone(), l.clone());
        let oc = o.clone();
        let m = tokio::spawn(async move { a.materialize(&oc).await });
        let s = tokio::spawn(async move { b.reconcile_expired(&[item]).await });
        let m = m.await.unwrap();
        let s = s.await.unwrap().unwrap();
        match m {
            Ok(Materialized::Created) => assert!(
                matches!(s[0], SweepVerdict::Release(_)) || s[0] == SweepVerdict::Skip,
                "{s:?}"
            ),
            Err(LedgerError::Refused {
                status: OrderStatus::CancelledBySweeper,
                ..
            }) => assert_eq!(s[0], SweepVerdict::Release(ReleaseReason::Tombstoned)),
            other => panic!("unexpected materialize result {other:?}"),
        }
        // Whatever the interleaving, a second sweep settles it.
        let again = l.reconcile_expired(&[expired_item(&o)]).await.unwrap();
        assert!(matches!(again[0], SweepVerdict::Release(_)), "{again:?}");
        assert_eq!(status(l, &o.token).await, OrderStatus::CancelledBySweeper);
        assert_audit_matches(l, &o.token, l.events(&o.token).await.unwrap().len()).await;
    }
}

async fn case_totals<L: Ledger>(l: &L) {
    let t = l.totals(SKU).await.unwrap();
    let all = l.orders(SKU, None).await.unwrap();
    let count = |s: OrderStatus| all.iter().filter(|o| o.status == s).count() as u64;
    assert_eq!(t.committed_orders, count(OrderStatus::Committed));
    assert_eq!(t.pending_orders, count(OrderStatus::Pending));
    assert_eq!(
        t.cancelled_by_sweeper_orders,
        count(OrderStatus::CancelledBySweeper)
    );
    assert_eq!(
        t.committed_units,
        all.iter()
            .filter(|o| o.status == OrderStatus::Committed)
            .map(|o| u64::from(o.qty))
            .sum::<u64>()
    );
    let pending = l.orders(SKU, Some(OrderStatus::Pending)).await.unwrap();
    assert!(pending.iter().all(|o| o.status == OrderStatus::Pending));
    let tokens: HashSet<_> = all.iter().map(|o| o.token.clone()).collect();
    assert_eq!(tokens.len(), all.len());
    // Every order's audit trail replays to its status.
    for o in &all {
        let n = l.events(&o.token).await.unwrap().len();
        assert!(n >= 1);
        assert_audit_matches(l, &o.token, n).await;
    }
}

async fn run_suite<L: Ledger>(l: L) {
    macro_rules! case {
        ($name:ident) => {
            eprintln!("ledger suite case: {}", stringify!($name));
            $name(&l).await;
        };
    }
    case!(case_sales);
    case!(case_materialize_commit);
    case!(case_late_payment);
    case!(case_cancel);
    case!(case_sweeper_branches);
    case!(case_commit_races_cancel);
    case!(case_sweepers_race);
    case!(case_tombstone_races_materialize);
    case!(case_totals);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_ledger_passes_the_suite() {
    let pg = TempPostgres::start().await.expect("postgres");
    let l = PgLedger::connect(pg.url()).await.expect("connect");
    l.migrate().await.expect("migrate");
    l.migrate().await.expect("migrate is idempotent");
    run_suite(l.clone()).await;

    // The database itself refuses what the state machine forbids.
    let pool = l.pool();
    let err = sqlx::query(
        "UPDATE orders SET status = 'PENDING' WHERE reservation_token = '{SUITE}cancel'",
    )
    .execute(pool)
    .await;
    assert!(
        err.is_err(),
        "CANCELLED/REFUND_REQUIRED -> PENDING must be refused"
    );
    let err =
        sqlx::query("UPDATE orders SET status = 'BOGUS' WHERE reservation_token = '{SUITE}mc'")
            .execute(pool)
            .await;
    assert!(err.is_err(), "CHECK constraint on status");
    let err = sqlx::query("DELETE FROM order_events").execute(pool).await;
    assert!(err.is_err(), "order_events is append-only");
    let err = sqlx::query("UPDATE order_events SET actor = 'x'")
        .execute(pool)
        .await;
    assert!(err.is_err(), "order_events is append-only");
    let err = sqlx::query("DELETE FROM orders").execute(pool).await;
    assert!(err.is_err(), "orders are never deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sled_ledger_passes_the_suite() {
    let dir = stockgate_client::testkit::TempDir::new("sgsled").expect("tempdir");
    let l = SledLedger::open(dir.path().join("ledger")).expect("open");
    run_suite(l.clone()).await;
    // Reopening keeps everything (the embedded ledger is durable).
    drop(l);
    let l = SledLedger::open(dir.path().join("ledger")).expect("reopen");
    assert_eq!(
        l.order("{SUITE}mc").await.unwrap().map(|o| o.status),
        Some(OrderStatus::Committed)
    );
}
