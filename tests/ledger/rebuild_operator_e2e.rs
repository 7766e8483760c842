//! The whole repair path as an operator runs it, with the real
//! `stockgate` server, the real `stockgate-sweeper` binary and a real Postgres:
//! `create-sale`, `adjust` (and its retry), paid, pending and cancelled orders, the data
//! dir wiped, a sweeper pass that fences the lost sale, `rebuild`; then retries of paid,
//! pending and cancelled requests, the per-user limit, new buyers until sold out, and a
//! sweeper pass. Units handed out never exceed the current allocation, and every paid
//! request REPLAYs.

use std::time::Duration;

use crate::operator::{sweeper_cli, wait_for_server};
use stockgate_client::types::ReserveOutcome;
use stockgate_ledger::checkout::{CheckoutError, PayOutcome};
use stockgate_ledger::{Checkout, Ledger, OrderStatus, Sweeper, SweeperConfig};
use stockgate_testkit::Harness;

const SKU: &str = "OPS";
const TTL_MS: u64 = 120_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_rebuild_keeps_the_adjusted_allocation_and_every_paid_order() {
    let mut h = Harness::start().await.expect("harness");
    // A macro, not a closure: the harness is borrowed anew each time (the server restarts).
    macro_rules! cli {
        ($($a:expr),* $(,)?) => { sweeper_cli(&h, &[$($a),*]) };
    }

    // --- the sale, as an operator creates and adjusts it ---------------------------------
    cli!(
        "create-sale",
        "--sku",
        SKU,
        "--total",
        "100",
        "--shards",
        "4",
        "--ttl-ms",
        &TTL_MS.to_string(),
        "--limit",
        "1",
    )
    .ok();
    let out = cli!(
        "adjust",
        "--sku",
        SKU,
        "--delta",
        "-40",
        "--id",
        "withdraw-1",
    )
    .ok();
    assert!(
        out.contains("applied; allocation 60 server total 60"),
        "{out}"
    );
    // The operator is not sure it worked and runs it again: nothing moves twice.
    let out = cli!(
        "adjust",
        "--sku",
        SKU,
        "--delta",
        "-40",
        "--id",
        "withdraw-1",
    )
    .ok();
    assert!(out.contains("already applied"), "{out}");
    // An allocation below zero is refused by the ledger, before the server hears of it.
    let refused = cli!("adjust", "--sku", SKU, "--delta", "-1000", "--id", "too-much",);
    assert!(!refused.success, "{refused:?}");
    assert!(refused.stderr.contains("negative"), "{refused:?}");
    assert_eq!(h.client.sale_info(SKU).await.unwrap().total, 60);
    assert_eq!(h.ledger.sale(SKU).await.unwrap().unwrap().allocation, 60);

    // --- orders: 20 paid, 10 pending, 5 cancelled by their buyers -------------------------
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    let paid = h.reserve_many(SKU, "paid", 20, true).await.unwrap();
    for hold in &paid {
        let p = checkout.pay(&hold.token, "psp", true).await.unwrap();
        assert!(matches!(p, PayOutcome::Committed { .. }), "{p:?}");
    }
    let pending = h.reserve_many(SKU, "pend", 10, true).await.unwrap();
    let cancelled = h.reserve_many(SKU, "gone", 5, true).await.unwrap();
    for hold in &cancelled {
        assert!(checkout.cancel(&hold.token).await.unwrap());
    }
    // More than is available cannot be withdrawn: the server refuses, the ledger moves back.
    let refused = cli!(
        "adjust",
        "--sku",
        SKU,
        "--delta",
        "-31",
        "--id",
        "too-much-2"
    );
    assert!(!refused.success, "{refused:?}");
    assert!(refused.stderr.contains("refused"), "{refused:?}");
    assert_eq!(h.ledger.sale(SKU).await.unwrap().unwrap().allocation, 60);
    let before = h.client.sale_info(SKU).await.unwrap();
    assert_eq!(
        (
            before.total,
            before.available,
            before.reserved,
            before.committed
        ),
        (60, 30, 10, 20)
    );

    // --- the server loses its data dir ----------------------------------------------------
    h.server.kill();
    std::fs::remove_dir_all(h.server.data_dir()).unwrap();
    h.server.restart().expect("restart");
    wait_for_server(&h.client).await;

    // A wiped data dir is another history: every tool refuses it until the operator
    // binds the ledger to it, naming the id the server reports.
    let new = h.client.history().await.unwrap().expect("a history id");
    let refused = cli!("run", "--once", "--sku", SKU);
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains(&format!("stockgate-sweeper rebind --history {new}")),
        "{refused:?}"
    );
    let wrong = cli!("rebind", "--history", "0123");
    assert!(!wrong.success, "{wrong:?}");
    assert!(
        wrong
            .stderr
            .contains(&format!("reports history {new}, not 0123")),
        "{wrong:?}"
    );
    let bound = cli!("rebind", "--history", &new).ok();
    assert!(
        bound.contains(&format!("ledger bound to history {new} (was ")),
        "{bound}"
    );

    // The sweeper notices (the ledger knows the sale, the server does not) and fences it.
    let out = cli!("run", "--once", "--sku", SKU).ok();
    assert!(
        out.contains(&format!("lost by the server (fenced): {SKU};")),
        "{out}"
    );
    assert!(h.client.sale_info(SKU).await.unwrap().is_fenced());

    // --- rebuild ---------------------------------------------------------------------------
    let out = cli!("rebuild", "--sku", SKU).ok();
    assert!(
        out.contains("total 60 committed 20 restored 10 pending (10 units), 20 paid, 5 cancelled; available 30"),
        "{out}"
    );
    let info = h.client.sale_info(SKU).await.unwrap();
    assert_eq!(
        (
            info.state.as_str(),
            info.total,
            info.available,
            info.reserved,
            info.committed
        ),
        ("OPEN", 60, 30, 10, 20),
        "the allocation is the adjusted one, not the initial 100"
    );

    // --- retries -------------------------------------------------------------------------
    for hold in &paid {
        let adm = h.keys.admission(SKU, &hold.user, 60_000);
        // Every paid request REPLAYs: same token, nothing taken.
        let r = h
            .client
            .reserve(SKU, &hold.user, &adm, &hold.request_id, 1)
            .await
            .unwrap();
        assert!(
            matches!(&r, ReserveOutcome::Replay { token, .. } if *token == hold.token),
            "paid request {} must REPLAY after the rebuild: {r:?}",
            hold.request_id
        );
        let again = checkout
            .start(SKU, &hold.user, &adm, &hold.request_id, 1)
            .await
            .unwrap();
        assert!(again.replay && again.already_committed, "{again:?}");
        assert_eq!(
            checkout.pay(&hold.token, "psp", true).await.unwrap(),
            PayOutcome::AlreadyCommitted
        );
        // Limit 1, one unit bought: a new request of the same buyer is over the limit.
        let more = h
            .client
            .reserve(
                SKU,
                &hold.user,
                &adm,
                &format!("{}-more", hold.request_id),
                1,
            )
            .await
            .unwrap();
        assert!(
            matches!(&more, ReserveOutcome::Limit { live_tokens, .. } if live_tokens.is_empty()),
            "a buyer who paid their limit gets LIMIT: {more:?}"
        );
    }
    for hold in &pending {
        let adm = h.keys.admission(SKU, &hold.user, 60_000);
        let r = h
            .client
            .reserve(SKU, &hold.user, &adm, &hold.request_id, 1)
            .await
            .unwrap();
        assert!(matches!(&r, ReserveOutcome::Replay { token, .. } if *token == hold.token));
        // The restored hold still expires when it did, and can still be paid.
        let res = h.client.reservation(&hold.token).await.unwrap().unwrap();
        assert_eq!(res.expires_at_ms, hold.expires_at_ms);
        let p = checkout.pay(&hold.token, "psp", true).await.unwrap();
        assert_eq!(
            p,
            PayOutcome::Committed {
                server_confirmed: true
            }
        );
    }
    for hold in &cancelled {
        let adm = h.keys.admission(SKU, &hold.user, 60_000);
        let r = h
            .client
            .reserve(SKU, &hold.user, &adm, &hold.request_id, 1)
            .await
            .unwrap();
        assert!(
            matches!(r, ReserveOutcome::Replay { .. }),
            "a cancelled request REPLAYs, it takes nothing: {r:?}"
        );
        assert!(matches!(
            checkout
                .start(SKU, &hold.user, &adm, &hold.request_id, 1)
                .await,
            Err(CheckoutError::Refused {
                status: OrderStatus::Cancelled,
                ..
            })
        ));
    }
    let info = h.client.sale_info(SKU).await.unwrap();
    assert_eq!(
        (info.available, info.reserved, info.committed),
        (30, 0, 30),
        "no retry took stock"
    );

    // --- new buyers until sold out --------------------------------------------------------
    let mut new_holds = 0u64;
    for i in 0..40 {
        let user = format!("new-{i}");
        let adm = h.keys.admission(SKU, &user, 60_000);
        let mut got = false;
        // Bounded stealing can say SOLDOUT while another shard has units: retry while
        // the sale has stock.
        for _ in 0..20 {
            match checkout.start(SKU, &user, &adm, "first", 1).await {
                Ok(hold) => {
                    assert!(!hold.replay);
                    got = true;
                    break;
                }
                Err(CheckoutError::SoldOut) if h.client.stock(SKU).await.unwrap() > 0 => {}
                Err(CheckoutError::SoldOut) => break,
                Err(e) => panic!("new buyer {user}: {e}"),
            }
        }
        new_holds += u64::from(got);
    }
    assert_eq!(new_holds, 30, "exactly what the allocation had left");
    let info = h.client.sale_info(SKU).await.unwrap();
    let handed_out = info.reserved + info.committed;
    assert_eq!(info.available, 0);
    assert!(
        handed_out <= 60,
        "units handed out ({handed_out}) exceed the allocation (60)"
    );
    assert_eq!(info.available + info.reserved + info.committed, info.total);

    // --- a sweeper pass: nothing to fence, nothing unexplained ---------------------------
    let out = cli!("run", "--once", "--sku", SKU).ok();
    assert!(out.contains("fenced now: none;"), "{out}");
    let report = Sweeper::new(
        h.ledger.clone(),
        h.client.clone(),
        SweeperConfig {
            skus: Some(vec![SKU.into()]),
            interval: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .run_pass()
    .await
    .unwrap();
    assert!(report.fenced_now.is_empty(), "{report:?}");
    assert!(report.allocation_mismatch.is_empty(), "{report:?}");
    assert!(report.lost_skus.is_empty(), "{report:?}");
    assert_eq!(report.foreign_holds_released, 0);

    // The ledger agrees with the server, and nothing was sold twice.
    let t = h.ledger.totals(SKU).await.unwrap();
    assert_eq!(t.committed_units, 30);
    assert_eq!(t.pending_units, 30);
    assert_eq!(info.committed as u64, t.committed_units);
    assert_eq!(info.reserved as u64, t.pending_units);
    assert!(t.committed_units + t.pending_units <= 60);
}
