//! A sweeper that dies between the ledger cancellation and the release: the next pass
//! (by any sweeper) releases each unit exactly once. The crash is injected with the
//! `fail` crate (feature `failpoints` of stockgate-ledger), alone in this test binary
//! because fail points are process-global.

use std::time::Duration;

use stockgate_client::StockgateClient;
use stockgate_ledger::sweeper::SweepError;
use stockgate_ledger::{Ledger, OrderStatus, Sweeper, SweeperConfig};
use stockgate_testkit::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_between_ledger_and_release_is_recovered_exactly_once() {
    let h = Harness::start().await.expect("harness");
    let sku = "CRASH";
    h.create_sale(sku, 300, 400, None).await.unwrap();
    let holds = h.reserve_many(sku, "x", 300, true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let cfg = SweeperConfig {
        batch_size: 1000,
        skus: Some(vec![sku.into()]),
        ..Default::default()
    };

    fail::cfg("sweeper::after_ledger", "return").unwrap();
    let s = Sweeper::new(h.ledger.clone(), h.client.clone(), cfg.clone());
    let err = s.run_pass().await.expect_err("injected crash");
    assert!(matches!(err, SweepError::Injected(_)));
    fail::remove("sweeper::after_ledger");

    // The ledger decided, the server never heard of it.
    for hold in &holds {
        let o = h.ledger.order(&hold.token).await.unwrap().unwrap();
        assert_eq!(o.status, OrderStatus::CancelledBySweeper);
    }
    assert_eq!(h.client.stock(sku).await.unwrap(), 0);

    // Recovery by two sweepers at once: "release anyway", exactly once per unit.
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = StockgateClient::connect(h.server.addr()).await.unwrap();
        let s = Sweeper::new(h.ledger.clone(), client, cfg.clone());
        tasks.push(tokio::spawn(async move { s.run_pass().await }));
    }
    let (mut released, mut recovered) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        released += r.released;
        recovered += r.recovered_cancelled_by_sweeper;
        assert_eq!(r.cancelled_now, 0);
    }
    assert_eq!(released, 300);
    assert!(recovered >= 300);
    assert_eq!(h.client.stock(sku).await.unwrap(), 300);
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!((info.available, info.reserved, info.committed), (300, 0, 0));
    // Audit: exactly one PENDING -> CANCELLED_BY_SWEEPER per order.
    for hold in &holds {
        let evs = h.ledger.events(&hold.token).await.unwrap();
        assert_eq!(evs.len(), 2, "{evs:?}");
    }
    let r = s.run_pass().await.unwrap();
    assert_eq!(r.seen, 0);
}
