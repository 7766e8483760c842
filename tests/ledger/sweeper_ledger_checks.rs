//! The sweeper holds the server to the ledger, against the
//! real `stockgate` server, the real `stockgate-sweeper` binary and a real Postgres:
//! - adjustments interrupted between the ledger and the server finish exactly once on a
//!   retry; a total the ledger never heard of is reported, and fenced if it exceeds the
//!   allocation;
//! - a server that lost acknowledged state (more committed units in the ledger than its
//!   total, a live pending order it does not know) is fenced; retention purges are not
//!   mistaken for loss;
//! - a hold the ledger's payment did not pay for is never committed.

use std::time::Duration;

use crate::operator::{copy_dir, sweeper_cli, wait_for_server};
use stockgate_client::types::ReserveOutcome;
use stockgate_client::{ClientError, StockgateClient};
use stockgate_ledger::checkout::PayOutcome;
use stockgate_ledger::ledger::AdjustmentStatus;
use stockgate_ledger::{Checkout, Ledger, PassReport, Sweeper, SweeperConfig};
use stockgate_testkit::{Harness, ServerProcess};

fn cfg(sku: &str) -> SweeperConfig {
    SweeperConfig {
        interval: Duration::from_millis(100),
        skus: Some(vec![sku.to_string()]),
        ..Default::default()
    }
}

async fn pass(h: &Harness, cfg: SweeperConfig) -> PassReport {
    Sweeper::new(h.ledger.clone(), h.client.clone(), cfg)
        .run_pass()
        .await
        .expect("sweeper pass")
}

async fn total(h: &Harness, sku: &str) -> i64 {
    h.client.sale_info(sku).await.expect("info").total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjustments_finish_once_and_hand_adjustments_are_caught() {
    let h = Harness::start().await.expect("harness");
    let sku = "ADJ";
    h.create_sale_sharded(sku, 50, 2, 60_000, None)
        .await
        .unwrap();
    macro_rules! cli {
        ($($a:expr),* $(,)?) => { sweeper_cli(&h, &[$($a),*]) };
    }

    // A crash between the ledger and the server: the ledger has +10, the server not.
    h.ledger.record_adjustment(sku, "a1", 10).await.unwrap();
    let r = pass(&h, cfg(sku)).await;
    assert!(
        r.fenced_now.is_empty() && r.allocation_mismatch.is_empty(),
        "an adjustment in flight is not a mismatch: {r:?}"
    );
    let out = cli!("adjust", "--sku", sku, "--delta", "10", "--id", "a1").ok();
    assert!(
        out.contains("applied; allocation 60 server total 60"),
        "{out}"
    );
    let out = cli!("adjust", "--sku", sku, "--delta", "10", "--id", "a1").ok();
    assert!(out.contains("already applied"), "{out}");
    assert_eq!(total(&h, sku).await, 60);

    // A crash after the server, before the ledger heard back: the retry must not send it
    // again.
    h.ledger.record_adjustment(sku, "a2", -5).await.unwrap();
    assert_eq!(h.client.sale_adjust(sku, -5).await.unwrap(), 55);
    let out = cli!("adjust", "--sku", sku, "--delta", "-5", "--id", "a2").ok();
    assert!(out.contains("already on the server"), "{out}");
    assert_eq!(total(&h, sku).await, 55, "applied exactly once");
    assert_eq!(
        h.ledger.adjustment("a2").await.unwrap().unwrap().status,
        AdjustmentStatus::Applied
    );

    // Someone runs SALE.ADJUST by hand, downwards: reported, not fenced (it undersells).
    assert_eq!(h.client.sale_adjust(sku, -3).await.unwrap(), 52);
    let r = pass(&h, cfg(sku)).await;
    assert_eq!(
        r.allocation_mismatch,
        vec![(sku.to_string(), 52, 55)],
        "{r:?}"
    );
    assert!(r.fenced_now.is_empty(), "{r:?}");
    assert!(!h.client.sale_info(sku).await.unwrap().is_fenced());
    // The operator records it: the server already has it.
    let out = cli!("adjust", "--sku", sku, "--delta", "-3", "--id", "hand-1").ok();
    assert!(out.contains("already on the server"), "{out}");
    assert_eq!(h.ledger.sale(sku).await.unwrap().unwrap().allocation, 52);
    let r = pass(&h, cfg(sku)).await;
    assert!(
        r.allocation_mismatch.is_empty() && r.fenced_now.is_empty(),
        "{r:?}"
    );

    // By hand, upwards: units the ledger never allocated could be sold. Fenced.
    assert_eq!(h.client.sale_adjust(sku, 7).await.unwrap(), 59);
    let r = pass(&h, cfg(sku)).await;
    assert_eq!(r.fenced_now.len(), 1, "{r:?}");
    assert_eq!(r.fenced_now[0].0, sku);
    assert!(r.fenced_now[0].1.contains("exceeds"), "{r:?}");
    let adm = h.keys.admission(sku, "x", 60_000);
    assert!(matches!(
        h.client.reserve(sku, "x", &adm, "x1", 1).await,
        Err(ClientError::Fenced)
    ));
    // The rebuild puts the ledger's allocation back.
    let out = cli!("rebuild", "--sku", sku).ok();
    assert!(out.contains("total 52"), "{out}");
    assert_eq!(total(&h, sku).await, 52);

    // A withdrawal that never reached the server and is no longer "in flight": the server
    // sells units the ledger withdrew. Fenced.
    h.ledger.record_adjustment(sku, "a3", -2).await.unwrap();
    let r = pass(
        &h,
        SweeperConfig {
            adjust_grace: Duration::ZERO,
            ..cfg(sku)
        },
    )
    .await;
    assert_eq!(r.fenced_now.len(), 1, "{r:?}");
    // Its retry on a fenced sale leaves it to the rebuild, which applies and confirms it.
    let retry = cli!("adjust", "--sku", sku, "--delta", "-2", "--id", "a3");
    assert!(
        !retry.success && retry.stderr.contains("rebuild"),
        "{retry:?}"
    );
    let out = cli!("rebuild", "--sku", sku).ok();
    assert!(out.contains("total 50"), "{out}");
    assert_eq!(total(&h, sku).await, 50);
    assert_eq!(
        h.ledger.adjustment("a3").await.unwrap().unwrap().status,
        AdjustmentStatus::Applied
    );
    let r = pass(&h, cfg(sku)).await;
    assert!(
        r.allocation_mismatch.is_empty() && r.fenced_now.is_empty(),
        "{r:?}"
    );
}

/// Replace the server's data dir by an older copy (a restore from an old backup, or a log
/// truncated by `--repair`), keeping the process's address.
async fn restore_old_data_dir(h: &mut Harness, old: &std::path::Path) {
    h.server.kill();
    let dir = h.server.data_dir().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    copy_dir(old, &dir);
    h.server.restart().expect("restart");
    wait_for_server(&h.client).await;
}

async fn snapshot_data_dir(h: &mut Harness, to: &std::path::Path) {
    h.server.kill();
    copy_dir(h.server.data_dir(), to);
    h.server.restart().expect("restart");
    wait_for_server(&h.client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_committed_units_than_the_server_total_fences() {
    let mut h = Harness::start().await.expect("harness");
    let sku = "LOSTCOMMITS";
    h.create_sale(sku, 5, 60_000, None).await.unwrap();
    let old = h.data.path().join("old");
    snapshot_data_dir(&mut h, &old).await;

    let out = sweeper_cli(
        &h,
        &["adjust", "--sku", sku, "--delta", "10", "--id", "grow"],
    )
    .ok();
    assert!(out.contains("server total 15"), "{out}");
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    for hold in h.reserve_many(sku, "b", 8, true).await.unwrap() {
        checkout.pay(&hold.token, "psp", true).await.unwrap();
    }
    let r = pass(&h, cfg(sku)).await;
    assert!(r.fenced_now.is_empty(), "{r:?}");

    // The server comes back from the old copy: total 5, nothing sold; the ledger: 8 sold.
    restore_old_data_dir(&mut h, &old).await;
    let r = pass(&h, cfg(sku)).await;
    assert_eq!(r.fenced_now.len(), 1, "{r:?}");
    assert!(r.fenced_now[0].1.contains("8 committed units"), "{r:?}");
    assert!(h.client.sale_info(sku).await.unwrap().is_fenced());
    // The operator rebuilds; the sale is whole again.
    let out = sweeper_cli(&h, &["rebuild", "--sku", sku]).ok();
    assert!(out.contains("total 15 committed 8"), "{out}");
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!((info.total, info.available, info.committed), (15, 7, 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_pending_order_the_server_does_not_know_fences() {
    let mut h = Harness::start().await.expect("harness");
    let sku = "LOSTHOLDS";
    h.create_sale(sku, 10, 60_000, None).await.unwrap();
    let old = h.data.path().join("old");
    snapshot_data_dir(&mut h, &old).await;
    let holds = h.reserve_many(sku, "p", 3, true).await.unwrap();
    let r = pass(&h, cfg(sku)).await;
    assert!(r.fenced_now.is_empty(), "{r:?}");

    restore_old_data_dir(&mut h, &old).await;
    // The server now has 10 available and no holds: 3 units could be sold twice.
    let r = pass(&h, cfg(sku)).await;
    assert_eq!(r.fenced_now.len(), 1, "{r:?}");
    assert!(r.fenced_now[0].1.contains("unknown to the server"), "{r:?}");
    let out = sweeper_cli(&h, &["rebuild", "--sku", sku]).ok();
    assert!(out.contains("restored 3 pending"), "{out}");
    for hold in &holds {
        let r = h.client.reservation(&hold.token).await.unwrap();
        assert!(r.is_some(), "restored");
    }
    assert_eq!(h.client.stock(sku).await.unwrap(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_committed_reservations_are_not_evidence_of_loss() {
    let mut h = Harness::start().await.expect("harness");
    // A server that purges finished reservations after 300 ms.
    h.server.kill();
    let data = h.data.path().join("short-retention");
    h.server = ServerProcess::start(
        &data,
        &[
            "--secret-file".into(),
            h.keys.secret_file().display().to_string(),
            "--reservation-key-file".into(),
            h.keys.reservation_key_file().display().to_string(),
            "--fsync".into(),
            "no".into(),
            "--retention-ms".into(),
            "300".into(),
        ],
    )
    .expect("server");
    h.client = StockgateClient::connect(h.server.addr()).await.unwrap();
    let sku = "PURGED";
    h.create_sale(sku, 10, 60_000, Some(1)).await.unwrap();
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    let holds = h.reserve_many(sku, "b", 5, true).await.unwrap();
    for hold in &holds {
        checkout.pay(&hold.token, "psp", true).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h
        .client
        .reservation(&holds[0].token)
        .await
        .unwrap()
        .is_some()
    {
        assert!(std::time::Instant::now() < deadline, "never purged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = pass(&h, cfg(sku)).await;
    assert!(r.fenced_now.is_empty(), "{r:?}");
    assert!(!h.client.sale_info(sku).await.unwrap().is_fenced());
    // A retry of a paid request after the purge takes nothing for good.
    for hold in &holds {
        let adm = h.keys.admission(sku, &hold.user, 60_000);
        let again = checkout
            .start(sku, &hold.user, &adm, &hold.request_id, 1)
            .await
            .unwrap();
        assert!(again.already_committed, "{again:?}");
    }
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!((info.available, info.reserved, info.committed), (5, 0, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_no_payment_paid_for_is_never_committed() {
    let mut h = Harness::start().await.expect("harness");
    let sku = "FOREIGN";
    let ttl = 400u64;
    h.create_sale(sku, 10, ttl, None).await.unwrap();
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    let paid = h.reserve_many(sku, "b", 3, true).await.unwrap();
    for hold in &paid {
        checkout.pay(&hold.token, "psp", true).await.unwrap();
    }

    // The server loses its state and an operator, instead of rebuilding, creates the sale
    // again by hand: the server has no record of the three paid reservations.
    h.server.kill();
    std::fs::remove_dir_all(h.server.data_dir()).unwrap();
    h.server.restart().expect("restart");
    wait_for_server(&h.client).await;
    h.client
        .sale_create(sku, 10, Some(1), Some(ttl), None)
        .await
        .unwrap();
    // ... and binds the ledger to the new history, so the tools talk to it again.
    let id = h.client.history().await.unwrap();
    let to = id.clone().expect("a history id");
    stockgate_ledger::identity::rebind(&h.ledger, id, &to)
        .await
        .unwrap();

    // Retries of the paid requests take new holds under the same tokens.
    let retry = |i: usize| {
        let hold = paid[i].clone();
        let client = h.client.clone();
        let adm = h.keys.admission(sku, &hold.user, 60_000);
        async move {
            client
                .reserve(sku, &hold.user, &adm, &hold.request_id, 1)
                .await
                .unwrap()
        }
    };
    // 0: an app that died after RESERVE; the sweeper later finds the hold expired.
    let r0 = retry(0).await;
    assert!(matches!(&r0, ReserveOutcome::Reserved { token, .. } if *token == paid[0].token));
    // 1: a payment retried for it: the ledger has the payment, the hold is not the paid one.
    let r1 = retry(1).await;
    assert!(matches!(r1, ReserveOutcome::Reserved { .. }));
    assert_eq!(
        checkout.pay(&paid[1].token, "psp", true).await.unwrap(),
        PayOutcome::AlreadyCommitted
    );
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!(
        info.committed, 0,
        "the retried payment committed nothing new"
    );
    // 2: a checkout retry: the ledger says paid, the fresh hold is given back at once.
    let adm = h.keys.admission(sku, &paid[2].user, 60_000);
    let again = checkout
        .start(sku, &paid[2].user, &adm, &paid[2].request_id, 1)
        .await
        .unwrap();
    assert!(again.already_committed && !again.replay, "{again:?}");
    assert_eq!(
        h.client.stock(sku).await.unwrap(),
        9,
        "only hold 0 is still out"
    );

    // The sweeper's committed-cleanup branch meets hold 0: released, not committed.
    tokio::time::sleep(Duration::from_millis(ttl + 200)).await;
    let r = pass(&h, cfg(sku)).await;
    assert_eq!(r.foreign_holds_released, 1, "{r:?}");
    assert_eq!(r.commit_cleanup, 0, "{r:?}");
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!(
        (info.available, info.reserved, info.committed),
        (10, 0, 0),
        "no unit went to a hold nobody paid for"
    );
    let again = pass(&h, cfg(sku)).await;
    assert_eq!(again.seen, 0, "{again:?}");
}
