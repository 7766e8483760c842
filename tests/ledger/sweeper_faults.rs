//! Sweeper fault tests against the real `stockgate` server and a real Postgres.

use std::time::Duration;

use stockgate_client::types::now_ms;
use stockgate_client::StockgateClient;
use stockgate_ledger::checkout::CheckoutError;
use stockgate_ledger::ledger::NewOrder;
use stockgate_ledger::{Checkout, Ledger, OrderStatus, PassReport, Sweeper, SweeperConfig};
use stockgate_testkit::Harness;

const TTL_MS: u64 = 400;

fn cfg(sku: &str) -> SweeperConfig {
    SweeperConfig {
        interval: Duration::from_millis(100),
        batch_size: 200,
        skus: Some(vec![sku.to_string()]),
        max_backoff: Duration::from_millis(400),
        ..Default::default()
    }
}

async fn wait_expired() {
    tokio::time::sleep(Duration::from_millis(TTL_MS + 150)).await;
}

async fn racing_sweepers(n: usize) {
    let h = Harness::start().await.expect("harness");
    let sku = format!("RACE{n}");
    h.create_sale(&sku, 1000, TTL_MS, None).await.unwrap();
    let holds = h.reserve_many(&sku, "u", 1000, true).await.unwrap();
    assert_eq!(holds.len(), 1000);
    assert_eq!(h.client.stock(&sku).await.unwrap(), 0);
    wait_expired().await;

    let mut tasks = Vec::new();
    for _ in 0..n {
        // Each sweeper has its own connection, as separate processes would.
        let client = StockgateClient::connect(h.server.addr()).await.unwrap();
        let s = Sweeper::new(h.ledger.clone(), client, cfg(&sku));
        tasks.push(tokio::spawn(async move { s.run_pass().await }));
    }
    let mut total = PassReport::default();
    for t in tasks {
        let r = t.await.unwrap().expect("pass");
        total.released += r.released;
        total.release_noop += r.release_noop;
        total.cancelled_now += r.cancelled_now;
    }
    assert_eq!(
        total.released, 1000,
        "each unit released exactly once: {total:?}"
    );
    assert_eq!(
        total.cancelled_now, 1000,
        "each order cancelled exactly once"
    );
    assert_eq!(h.client.stock(&sku).await.unwrap(), 1000);
    let info = h.client.sale_info(&sku).await.unwrap();
    assert_eq!(
        (info.available, info.reserved, info.committed),
        (1000, 0, 0)
    );
    let t = h.ledger.totals(&sku).await.unwrap();
    assert_eq!(t.cancelled_by_sweeper_orders, 1000);
    // Nothing left for anyone.
    let again = Sweeper::new(h.ledger.clone(), h.client.clone(), cfg(&sku))
        .run_pass()
        .await
        .unwrap();
    assert_eq!(again.seen, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sweepers_release_each_unit_once() {
    racing_sweepers(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_sweepers_release_each_unit_once() {
    racing_sweepers(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_order_is_tombstoned_then_released_and_late_materialize_refused() {
    let h = Harness::start().await.expect("harness");
    let sku = "TOMB";
    h.create_sale(sku, 20, TTL_MS, None).await.unwrap();
    // Reserved on the server, never materialized (the checkout app died).
    let holds = h.reserve_many(sku, "t", 10, false).await.unwrap();
    assert_eq!(h.client.stock(sku).await.unwrap(), 10);
    wait_expired().await;
    let s = Sweeper::new(h.ledger.clone(), h.client.clone(), cfg(sku));
    let r = s.run_pass().await.unwrap();
    assert_eq!((r.tombstoned, r.released), (10, 10), "{r:?}");
    assert_eq!(h.client.stock(sku).await.unwrap(), 20);
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    for hold in &holds {
        let o = h.ledger.order(&hold.token).await.unwrap().unwrap();
        assert_eq!(o.status, OrderStatus::CancelledBySweeper);
        let late = NewOrder {
            token: hold.token.clone(),
            sku: sku.into(),
            user: hold.user.clone(),
            request_id: hold.request_id.clone(),
            qty: 1,
            expires_at_ms: hold.expires_at_ms,
            created_at_ms: now_ms(),
        };
        assert!(matches!(
            checkout.materialize(&late).await,
            Err(CheckoutError::Refused {
                status: OrderStatus::CancelledBySweeper,
                ..
            })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_order_gives_no_stock_back() {
    let h = Harness::start().await.expect("harness");
    let sku = "COMMITTED";
    h.create_sale(sku, 10, TTL_MS, None).await.unwrap();
    let holds = h.reserve_many(sku, "c", 10, true).await.unwrap();
    // Five paid in the ledger, but the app died before COMMIT reached the server.
    for hold in &holds[..5] {
        h.ledger.commit(&hold.token, "pay").await.unwrap();
    }
    wait_expired().await;
    let s = Sweeper::new(h.ledger.clone(), h.client.clone(), cfg(sku));
    let r = s.run_pass().await.unwrap();
    assert_eq!((r.commit_cleanup, r.released), (5, 5), "{r:?}");
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!((info.available, info.reserved, info.committed), (5, 0, 5));
    let t = h.ledger.totals(sku).await.unwrap();
    assert_eq!(t.committed_units, 5);
    assert_eq!(t.cancelled_by_sweeper_orders, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_releases_nothing_until_it_returns() {
    let mut h = Harness::start().await.expect("harness");
    let sku = "PGDOWN";
    h.create_sale(sku, 100, TTL_MS, None).await.unwrap();
    h.reserve_many(sku, "p", 100, true).await.unwrap();
    wait_expired().await;
    h.pg.stop().unwrap();
    let s = Sweeper::new(h.ledger.clone(), h.client.clone(), cfg(sku));
    assert!(
        s.run_pass().await.is_err(),
        "a pass without the ledger fails"
    );
    // The daemon loop keeps trying (and backing off) meanwhile, releasing nothing.
    let task = s.clone().spawn();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        h.client.stock(sku).await.unwrap(),
        0,
        "nothing released without the ledger"
    );
    h.pg.restart(Default::default())
        .await
        .expect("postgres back");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.client.stock(sku).await.unwrap() < 100 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.shutdown().await;
    assert_eq!(h.client.stock(sku).await.unwrap(), 100);
    let t = h.ledger.totals(sku).await.unwrap();
    assert_eq!(t.cancelled_by_sweeper_orders, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_then_back_resumes() {
    let mut h = Harness::start().await.expect("harness");
    let sku = "SRVDOWN";
    h.create_sale(sku, 50, TTL_MS, None).await.unwrap();
    h.reserve_many(sku, "s", 50, true).await.unwrap();
    wait_expired().await;
    h.server.stop();
    let s = Sweeper::new(h.ledger.clone(), h.client.clone(), cfg(sku));
    assert!(s.run_pass().await.is_err());
    // The ledger was not touched: nothing was listed, so nothing was decided.
    assert_eq!(h.ledger.totals(sku).await.unwrap().pending_orders, 50);
    h.server.restart().expect("restart");
    let task = s.clone().spawn();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut stock = 0;
    while std::time::Instant::now() < deadline {
        if let Ok(n) = h.client.stock(sku).await {
            stock = n;
            if n == 50 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    task.shutdown().await;
    assert_eq!(stock, 50);
}
