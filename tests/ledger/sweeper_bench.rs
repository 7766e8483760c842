//! Benchmark for the closing note (ignored by default; run with
//! `cargo test --release --test ledger sweeper_bench:: -- --ignored --nocapture`):
//! - materialize + commit rate against a durable Postgres (fsync on),
//! - sweeper throughput: 10,000 expired reservations reconciled (target < 10 s), with one
//!   and with two sweepers.

use std::time::{Duration, Instant};

use stockgate_client::types::now_ms;
use stockgate_client::StockgateClient;
use stockgate_ledger::ledger::NewOrder;
use stockgate_ledger::{Ledger, PassReport, Sweeper, SweeperConfig};
use stockgate_testkit::pgtemp::PgOptions;
use stockgate_testkit::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn materialize_commit_rate() {
    let h = Harness::start_with(PgOptions::durable())
        .await
        .expect("harness");
    let n = 5_000usize;
    let orders: Vec<NewOrder> = (0..n)
        .map(|i| NewOrder {
            token: format!("{{BENCH}}{i:08}"),
            sku: "BENCH".into(),
            user: format!("u{i}"),
            request_id: format!("r{i}"),
            qty: 1,
            expires_at_ms: now_ms() + 600_000,
            created_at_ms: now_ms(),
        })
        .collect();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for chunk in orders.chunks(n / 32) {
        let (l, chunk) = (h.ledger.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for o in &chunk {
                l.materialize(o).await.unwrap();
                l.commit(&o.token, "p").await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let el = t0.elapsed();
    println!(
        "materialize+commit: {n} orders in {el:.2?} = {:.0} orders/s (32 concurrent, fsync on)",
        n as f64 / el.as_secs_f64()
    );
}

async fn sweep_10k(sweepers: usize) {
    let h = Harness::start_with(PgOptions::durable())
        .await
        .expect("harness");
    let sku = "SWEEPBENCH";
    let n = 10_000usize;
    h.create_sale(sku, n as u64, 3_000, None).await.unwrap();
    let t0 = Instant::now();
    h.reserve_many(sku, "u", n, true).await.unwrap();
    println!("setup: {n} reserve+materialize in {:.2?}", t0.elapsed());
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let cfg = SweeperConfig {
        batch_size: 1000,
        skus: Some(vec![sku.into()]),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..sweepers {
        let client = StockgateClient::connect(h.server.addr()).await.unwrap();
        let s = Sweeper::new(h.ledger.clone(), client, cfg.clone());
        tasks.push(tokio::spawn(async move { s.run_pass().await }));
    }
    let mut released = 0;
    for t in tasks {
        let r: PassReport = t.await.unwrap().unwrap();
        released += r.released;
    }
    let el = t0.elapsed();
    assert_eq!(released, n as u64);
    assert_eq!(h.client.stock(sku).await.unwrap(), n as i64);
    println!(
        "sweeper x{sweepers}: {n} expired reservations reconciled in {el:.2?} = {:.0}/s (fsync on)",
        n as f64 / el.as_secs_f64()
    );
    assert!(el < Duration::from_secs(10), "target: 10,000 in under 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn sweeper_throughput_one() {
    sweep_10k(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn sweeper_throughput_two() {
    sweep_10k(2).await;
}
