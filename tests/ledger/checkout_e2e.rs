//! End to end: a sale of 1,000 units, 3,000 buyers against the real server and a real
//! Postgres; 40% pay in time, some pay late (after expiry, before and after the sweep),
//! some cancel, the rest abandon. A sweeper runs throughout with a short interval.

use std::time::{Duration, Instant};

use rand::Rng;
use stockgate_client::types::now_ms;
use stockgate_ledger::checkout::{CheckoutError, PayOutcome};
use stockgate_ledger::{Checkout, Ledger, Sweeper, SweeperConfig};
use stockgate_testkit::Harness;

const SKU: &str = "E2E";
const UNITS: u64 = 1000;
const BUYERS: usize = 3000;
const TTL_MS: u64 = 1500;

#[derive(Debug, PartialEq, Eq)]
enum BuyerResult {
    Bought,
    SoldOut,
    Late(PayOutcome),
    Cancelled,
    Abandoned,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_sale_end_to_end() {
    let h = Harness::start().await.expect("harness");
    h.create_sale_sharded(SKU, UNITS, 8, TTL_MS, None)
        .await
        .unwrap();
    let sweeper = Sweeper::new(
        h.ledger.clone(),
        h.client.clone(),
        SweeperConfig {
            interval: Duration::from_millis(200),
            batch_size: 500,
            ..Default::default()
        },
    );
    let task = sweeper.clone().spawn();
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    let started = Instant::now();
    let deadline = now_ms() + 4 * TTL_MS as i64;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(200));
    let mut tasks = Vec::new();
    for i in 0..BUYERS {
        let checkout = checkout.clone();
        let user = format!("b{i}");
        let adm = h.keys.admission(SKU, &user, 600_000);
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _p = gate.acquire_owned().await;
            let hold = loop {
                match checkout.start(SKU, &user, &adm, &format!("r{i}"), 1).await {
                    Ok(h) => break h,
                    Err(CheckoutError::SoldOut) if now_ms() < deadline => {
                        let ms = rand::thread_rng().gen_range(50..300);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    Err(CheckoutError::SoldOut) => return (i, BuyerResult::SoldOut),
                    Err(e) => panic!("buyer {i}: {e}"),
                }
            };
            let until_expiry = (hold.expires_at_ms - now_ms()).max(0) as u64;
            let out = match i % 10 {
                0..=3 => {
                    let ms = rand::thread_rng().gen_range(0..TTL_MS / 2);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    match checkout
                        .pay(&hold.token, &format!("p{i}"), true)
                        .await
                        .unwrap()
                    {
                        PayOutcome::Committed { .. } => BuyerResult::Bought,
                        other => panic!("in-time payment of {i}: {other:?}"),
                    }
                }
                4 | 5 => {
                    // Late: just after expiry (often before the sweep) or well after it.
                    let extra = if i % 10 == 4 { 5 } else { 700 };
                    tokio::time::sleep(Duration::from_millis(until_expiry + extra)).await;
                    // Half of them have already been charged (one-step payment).
                    let moved = i % 20 < 10;
                    BuyerResult::Late(
                        checkout
                            .pay(&hold.token, &format!("p{i}"), moved)
                            .await
                            .unwrap(),
                    )
                }
                6 => {
                    checkout.cancel(&hold.token).await.unwrap();
                    BuyerResult::Cancelled
                }
                _ => BuyerResult::Abandoned,
            };
            (i, out)
        }));
    }
    let mut bought = 0u64;
    let mut late = Vec::new();
    for t in tasks {
        let (_, out) = t.await.unwrap();
        match out {
            BuyerResult::Bought => bought += 1,
            BuyerResult::Late(p) => late.push(p),
            _ => {}
        }
    }
    // Let every hold expire, then let the sweeper finish.
    tokio::time::sleep(Duration::from_millis(TTL_MS + 300)).await;
    task.shutdown().await;
    sweeper.run_pass().await.unwrap();
    eprintln!("e2e finished in {:.2?}", started.elapsed());

    let info = h.client.sale_info(SKU).await.unwrap();
    let t = h.ledger.totals(SKU).await.unwrap();
    eprintln!(
        "server {info:?}\nledger {t:?}\nbought {bought}, late {}",
        late.len()
    );
    assert!(t.committed_units <= UNITS, "never beyond stock");
    assert_eq!(
        info.committed as u64, t.committed_units,
        "server committed == SQL COMMITTED"
    );
    assert_eq!(bought, t.committed_orders);
    assert_eq!(info.reserved, 0, "no hold left");
    assert_eq!(t.pending_orders, 0);
    assert_eq!(
        info.available as u64,
        UNITS - t.committed_units,
        "available = units - committed"
    );
    assert_eq!(info.available + info.reserved + info.committed, info.total);
    assert!(!late.is_empty());
    for p in &late {
        assert!(
            matches!(
                p,
                PayOutcome::Refused { .. } | PayOutcome::RefundRequired { .. }
            ),
            "late payment accepted: {p:?}"
        );
    }
    assert!(late
        .iter()
        .any(|p| matches!(p, PayOutcome::RefundRequired { .. })));
    assert!(late.iter().any(|p| matches!(p, PayOutcome::Refused { .. })));
}
