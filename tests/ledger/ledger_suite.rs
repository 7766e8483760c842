//! One ledger test suite, run against both backends: Postgres (a real throwaway cluster,
//! no mocks) and the embedded sled ledger.
//!
//! Each backend runs every case in sequence inside one test, so one Postgres serves the
//! whole suite; a failure names the case.

use std::collections::HashSet;

use stockgate_client::types::{now_ms, ExpiredReservation, ReservationInfo, ReservationState};
use stockgate_ledger::ledger::{
    AdjustmentOutcome, AdjustmentStatus, LedgerCommit, LedgerPay, Materialized, NewOrder,
    PayVerdict, ReleaseReason, SaleRecord, SweepVerdict,
};
use stockgate_ledger::{Ledger, LedgerError, OrderStatus, PgLedger, SledLedger};
use stockgate_testkit::pgtemp::TempPostgres;

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
    assert_eq!(
        got.allocation, 1000,
        "a new sale's allocation is its initial one"
    );
    assert!(l.sales().await.expect("sales").iter().any(|x| x.sku == SKU));
}

async fn allocation<L: Ledger>(l: &L) -> u64 {
    l.sale(SKU).await.unwrap().unwrap().allocation
}

async fn case_adjustments<L: Ledger>(l: &L) {
    // Recorded once: the allocation moves on the first call only, however often retried.
    let a = l.record_adjustment(SKU, "adj-1", -40).await.unwrap();
    assert_eq!(a.status, AdjustmentStatus::Recorded);
    assert_eq!((a.delta, a.allocation_after), (-40, 960));
    assert_eq!(allocation(l).await, 960);
    let again = l.record_adjustment(SKU, "adj-1", -40).await.unwrap();
    assert_eq!(again.status, AdjustmentStatus::Recorded);
    assert_eq!(allocation(l).await, 960, "a retry does not adjust twice");
    // The same id for something else is refused, not silently merged.
    assert!(matches!(
        l.record_adjustment(SKU, "adj-1", -41).await,
        Err(LedgerError::Conflict(_))
    ));
    // The initial allocation stays what the sale was created with: registering it again
    // still works after adjustments.
    let s = l.sale(SKU).await.unwrap().unwrap();
    assert_eq!(s.initial_allocation, 1000);
    l.register_sale(&s)
        .await
        .expect("re-register after adjustments");
    assert_eq!(allocation(l).await, 960);

    // Unconfirmed until the server has it.
    let pending = l.adjustments(SKU, true).await.unwrap();
    assert_eq!(
        pending.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        ["adj-1"]
    );
    let done = l
        .finish_adjustment(
            "adj-1",
            &AdjustmentOutcome::Applied {
                server_total: Some(960),
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, AdjustmentStatus::Applied);
    assert_eq!(done.server_total, Some(960));
    // Idempotent; and an applied adjustment cannot become refused.
    l.finish_adjustment("adj-1", &AdjustmentOutcome::Applied { server_total: None })
        .await
        .unwrap();
    assert!(matches!(
        l.finish_adjustment("adj-1", &AdjustmentOutcome::Refused { reason: "x".into() })
            .await,
        Err(LedgerError::Conflict(_))
    ));
    assert!(l.adjustments(SKU, true).await.unwrap().is_empty());
    // A retry of an applied adjustment says so and moves nothing.
    assert_eq!(
        l.record_adjustment(SKU, "adj-1", -40).await.unwrap().status,
        AdjustmentStatus::Applied
    );
    assert_eq!(allocation(l).await, 960);

    // Refused by the server: the allocation moves back, once.
    l.record_adjustment(SKU, "adj-2", 15).await.unwrap();
    assert_eq!(allocation(l).await, 975);
    let refused = AdjustmentOutcome::Refused {
        reason: "not enough available units".into(),
    };
    let r = l.finish_adjustment("adj-2", &refused).await.unwrap();
    assert_eq!(r.status, AdjustmentStatus::Refused);
    assert_eq!(r.detail.as_deref(), Some("not enough available units"));
    assert_eq!(allocation(l).await, 960);
    l.finish_adjustment("adj-2", &refused).await.unwrap();
    assert_eq!(allocation(l).await, 960, "refusing twice moves back once");
    assert_eq!(
        l.record_adjustment(SKU, "adj-2", 15).await.unwrap().status,
        AdjustmentStatus::Refused
    );
    assert_eq!(allocation(l).await, 960);

    // Never below zero, never for an unknown sale, never a zero or empty adjustment.
    assert!(matches!(
        l.record_adjustment(SKU, "adj-3", -5000).await,
        Err(LedgerError::Conflict(_))
    ));
    assert!(l.adjustment("adj-3").await.unwrap().is_none());
    assert_eq!(allocation(l).await, 960);
    assert!(matches!(
        l.record_adjustment("NOPE", "adj-4", 1).await,
        Err(LedgerError::UnknownSale(_))
    ));
    assert!(matches!(
        l.record_adjustment(SKU, "adj-5", 0).await,
        Err(LedgerError::Invalid(_))
    ));
    assert!(matches!(
        l.record_adjustment(SKU, "", 1).await,
        Err(LedgerError::Invalid(_))
    ));
    assert!(matches!(
        l.finish_adjustment("nope", &refused).await,
        Err(LedgerError::NotFound(_))
    ));
    let all = l.adjustments(SKU, false).await.unwrap();
    assert_eq!(
        all.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        ["adj-1", "adj-2"]
    );

    // Concurrent retries of one id: recorded exactly once.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            l.record_adjustment(SKU, "adj-race", 7).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(allocation(l).await, 967, "eight racing retries adjust once");
    l.finish_adjustment(
        "adj-race",
        &AdjustmentOutcome::Applied { server_total: None },
    )
    .await
    .unwrap();
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
        l.mark_refund_required(&o.token, Some("pay-late"), "late")
            .await
            .unwrap(),
        OrderStatus::Pending
    );
    assert_eq!(
        l.mark_refund_required(&o.token, Some("pay-late"), "late")
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
        l.mark_refund_required(&p.token, Some("x"), "y").await,
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

fn paid(verdict: PayVerdict, previous: Option<OrderStatus>) -> LedgerPay {
    LedgerPay { verdict, previous }
}

/// The payment step with the expiry guard and the refund branch (`pay_order` in
/// Postgres, its Rust copy in the embedded ledger): the same answers from both.
async fn case_pay<L: Ledger>(l: &L) {
    use OrderStatus::*;
    use PayVerdict as V;
    let o = order("pay-ok", 60_000);
    l.materialize(&o).await.unwrap();
    assert_eq!(
        l.pay(&o.token, "psp-ok", true).await.unwrap(),
        paid(V::Committed, Some(Pending))
    );
    for (r, moved) in [("psp-ok", true), ("psp-ok", false), ("psp-2", true)] {
        assert_eq!(
            l.pay(&o.token, r, moved).await.unwrap(),
            paid(V::AlreadyCommitted, Some(Committed)),
            "{r} {moved}"
        );
    }
    let got = l.order(&o.token).await.unwrap().unwrap();
    assert_eq!(got.payment_ref.as_deref(), Some("psp-ok"));
    assert_audit_matches(l, &o.token, 2).await;

    // Late: refused without money, REFUND_REQUIRED with money, never COMMITTED.
    let late = order("pay-late", -1_000);
    l.materialize(&late).await.unwrap();
    assert_eq!(
        l.pay(&late.token, "cap", false).await.unwrap(),
        paid(V::Refused, Some(Pending))
    );
    assert_eq!(status(l, &late.token).await, Pending);
    assert_audit_matches(l, &late.token, 1).await;
    assert_eq!(
        l.pay(&late.token, "cap", true).await.unwrap(),
        paid(V::RefundRequired, Some(Pending))
    );
    assert_eq!(
        l.pay(&late.token, "cap", true).await.unwrap(),
        paid(V::RefundRequired, Some(RefundRequired))
    );
    assert_eq!(
        l.pay(&late.token, "cap", false).await.unwrap(),
        paid(V::Refused, Some(RefundRequired))
    );
    let got = l.order(&late.token).await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.payment_ref.as_deref()),
        (RefundRequired, Some("cap"))
    );
    let evs = l.events(&late.token).await.unwrap();
    assert_eq!(evs.len(), 2);
    assert_eq!(evs[1].actor, "payment");
    assert_eq!(
        evs[1].detail.as_deref(),
        Some("payment after the reservation ended")
    );
    // Refunded: the same payment again changes nothing, another one is refused.
    l.mark_refunded(&late.token).await.unwrap();
    assert_eq!(
        l.pay(&late.token, "cap", true).await.unwrap(),
        paid(V::RefundRequired, Some(Refunded))
    );
    assert!(matches!(
        l.pay(&late.token, "cap-2", true).await,
        Err(LedgerError::Refused {
            status: Refunded,
            ..
        })
    ));
    assert_eq!(status(l, &late.token).await, Refunded);
    assert_audit_matches(l, &late.token, 3).await;

    // Cancelled by the buyer, then by the sweeper.
    let c = order("pay-cancelled", 60_000);
    l.materialize(&c).await.unwrap();
    l.cancel(&c.token).await.unwrap();
    assert_eq!(
        l.pay(&c.token, "cap-c", true).await.unwrap(),
        paid(V::RefundRequired, Some(Cancelled))
    );
    let s = order("pay-swept", -1_000);
    l.materialize(&s).await.unwrap();
    l.reconcile_expired(&[expired_item(&s)]).await.unwrap();
    assert_eq!(
        l.pay(&s.token, "cap-s", false).await.unwrap(),
        paid(V::Refused, Some(CancelledBySweeper))
    );
    assert_eq!(
        l.pay(&s.token, "cap-s", true).await.unwrap(),
        paid(V::RefundRequired, Some(CancelledBySweeper))
    );
    assert_eq!(
        l.pay("{SUITE}pay-nothing", "x", true).await.unwrap(),
        paid(V::NotFound, None)
    );
    assert!(l.order("{SUITE}pay-nothing").await.unwrap().is_none());
    for t in [&c.token, &s.token] {
        assert_audit_matches(l, t, 3).await;
    }
}

/// The same-hold check (`order_is_hold` / `Order::same_hold`).
async fn case_is_hold<L: Ledger>(l: &L) {
    let o = order("hold", 60_000);
    l.materialize(&o).await.unwrap();
    let server = |created_at_ms: i64, expires_at_ms: i64| ReservationInfo {
        token: o.token.clone(),
        sku: o.sku.clone(),
        user: o.user.clone(),
        request_id: o.request_id.clone(),
        qty: o.qty,
        shard: 0,
        state: ReservationState::Reserved,
        created_at_ms,
        expires_at_ms,
    };
    let (c, e) = (o.created_at_ms, o.expires_at_ms);
    assert!(l.is_hold(&o.token, &server(c, e)).await.unwrap());
    assert!(l.is_hold(&o.token, &server(c, e + 5_000)).await.unwrap());
    assert!(l.is_hold(&o.token, &server(c + 7, e)).await.unwrap());
    // A later hold of the same token: created later, with a new deadline.
    assert!(!l
        .is_hold(&o.token, &server(c + 60_000, e + 60_000))
        .await
        .unwrap());
    let mut other = server(c, e);
    other.qty = 2;
    assert!(!l.is_hold(&o.token, &other).await.unwrap());
    other = server(c, e);
    other.user = "someone-else".into();
    assert!(!l.is_hold(&o.token, &other).await.unwrap());
    assert!(!l.is_hold("{SUITE}no-hold", &server(c, e)).await.unwrap());
}

async fn case_refund_keeps_payment_ref<L: Ledger>(l: &L) {
    // The sweeper's refund branch (ledger COMMITTED, server RELEASED) knows only the
    // token: the payment reference the refund needs must survive it.
    let o = order("refund-ref", 60_000);
    l.materialize(&o).await.unwrap();
    l.commit(&o.token, "psp-ref-9").await.unwrap();
    assert_eq!(
        l.mark_refund_required(&o.token, None, "server released a committed reservation")
            .await
            .unwrap(),
        OrderStatus::Committed
    );
    let got = l.order(&o.token).await.unwrap().unwrap();
    assert_eq!(got.status, OrderStatus::RefundRequired);
    assert_eq!(got.payment_ref.as_deref(), Some("psp-ref-9"));
    // An empty reference is "unknown" too, never a value that replaces the stored one.
    let e = order("refund-ref-empty", 60_000);
    l.materialize(&e).await.unwrap();
    l.commit(&e.token, "psp-ref-10").await.unwrap();
    l.mark_refund_required(&e.token, Some(""), "r")
        .await
        .unwrap();
    assert_eq!(
        l.order(&e.token)
            .await
            .unwrap()
            .unwrap()
            .payment_ref
            .as_deref(),
        Some("psp-ref-10")
    );
    l.mark_refunded(&e.token).await.unwrap();
    assert_eq!(
        l.order(&e.token)
            .await
            .unwrap()
            .unwrap()
            .payment_ref
            .as_deref(),
        Some("psp-ref-10")
    );
    // A late capture names its own payment: that one is recorded.
    let late = order("refund-ref-late", -1_000);
    l.materialize(&late).await.unwrap();
    l.mark_refund_required(&late.token, Some("psp-late"), "late")
        .await
        .unwrap();
    assert_eq!(
        l.order(&late.token)
            .await
            .unwrap()
            .unwrap()
            .payment_ref
            .as_deref(),
        Some("psp-late")
    );
}

async fn case_live_pending<L: Ledger>(l: &L) {
    const LIVE_SKU: &str = "LIVEPEND";
    let mk = |tag: &str, expires_in: i64| {
        let mut o = order(tag, expires_in);
        o.sku = LIVE_SKU.into();
        o.token = format!("{{{LIVE_SKU}}}{tag}");
        o
    };
    let live = mk("lp-live", 60_000);
    let late = mk("lp-late", -1_000);
    let paid = mk("lp-paid", 60_000);
    for o in [&live, &late, &paid] {
        l.materialize(o).await.unwrap();
    }
    l.commit(&paid.token, "p").await.unwrap();
    let got = l.live_pending_orders(LIVE_SKU).await.unwrap();
    assert_eq!(
        got.iter().map(|o| o.token.as_str()).collect::<Vec<_>>(),
        [live.token.as_str()],
        "only PENDING orders a payment could still commit"
    );
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
        l.mark_refund_required(&o.token, Some("p"), "capture after cancel")
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
    l.mark_refund_required(&refund.token, Some("p"), "r")
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
    case!(case_adjustments);
    case!(case_materialize_commit);
    case!(case_pay);
    case!(case_is_hold);
    case!(case_refund_keeps_payment_ref);
    case!(case_live_pending);
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
    let err = sqlx::query("UPDATE sales SET allocation = -1")
        .execute(pool)
        .await;
    assert!(err.is_err(), "an allocation is never negative");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sled_ledger_passes_the_suite() {
    let dir = stockgate_testkit::TempDir::new("sgsled").expect("tempdir");
    let l = SledLedger::open(dir.path().join("ledger")).expect("open");
    run_suite(l.clone()).await;
    // Reopening keeps everything (the embedded ledger is durable).
    drop(l);
    let l = SledLedger::open(dir.path().join("ledger")).expect("reopen");
    assert_eq!(
        l.order("{SUITE}mc").await.unwrap().map(|o| o.status),
        Some(OrderStatus::Committed)
    );
    assert_eq!(l.sale(SKU).await.unwrap().map(|s| s.allocation), Some(967));
    assert_eq!(
        l.adjustment("adj-1").await.unwrap().map(|a| a.status),
        Some(AdjustmentStatus::Applied)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_upgrade_to_allocations_keeps_existing_sales() {
    // A ledger created before migration 0002, with a sale whose initial_allocation
    // already includes adjustments mirrored the old way: after the upgrade its current
    // allocation is that figure, and adjustments work on it.
    let pg = TempPostgres::start().await.expect("postgres");
    let l = PgLedger::connect(pg.url()).await.expect("connect");
    let full = stockgate_ledger::ledger::postgres::migrator();
    let mut first = stockgate_ledger::ledger::postgres::migrator();
    first.migrations = std::borrow::Cow::Owned(full.migrations[..1].to_vec());
    l.ensure_schema().await.expect("schema");
    first.run(l.pool()).await.expect("migration 0001 alone");
    sqlx::query("INSERT INTO sales (sku, initial_allocation) VALUES ('OLD', 77)")
        .execute(l.pool())
        .await
        .expect("an old sale");
    l.migrate().await.expect("upgrade");
    let s = l.sale("OLD").await.unwrap().expect("sale");
    assert_eq!((s.initial_allocation, s.allocation), (77, 77));
    l.record_adjustment("OLD", "up-1", -7).await.unwrap();
    assert_eq!(l.sale("OLD").await.unwrap().unwrap().allocation, 70);
}
