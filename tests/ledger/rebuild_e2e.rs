//! Fail closed and rebuild: the server loses its data dir mid-sale; after the restart the
//! sale is fenced (refuses reservations) until rebuilt from the ledger; then the
//! invariants hold against the ledger and the restored reservations still commit.

use std::time::Duration;

use stockgate_client::ClientError;
use stockgate_ledger::checkout::PayOutcome;
use stockgate_ledger::rebuild::{rebuild_sale, RebuildOptions};
use stockgate_ledger::{Checkout, Ledger, OrderStatus, Sweeper, SweeperConfig};
use stockgate_testkit::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_data_dir_fences_then_rebuilds_from_the_ledger() {
    let mut h = Harness::start().await.expect("harness");
    let sku = "REBUILD";
    h.create_sale_sharded(sku, 100, 4, 60_000, None)
        .await
        .unwrap();
    let checkout = Checkout::new(h.ledger.clone(), h.client.clone());
    let holds = h.reserve_many(sku, "m", 30, true).await.unwrap();
    for hold in &holds[..20] {
        let p = checkout.pay(&hold.token, "pay", true).await.unwrap();
        assert!(matches!(
            p,
            PayOutcome::Committed {
                server_confirmed: true
            }
        ));
    }
    // Reserved but never materialized: the ledger cannot vouch for these.
    let unmaterialized = h.reserve_many(sku, "n", 5, false).await.unwrap();

    // Lose everything the server knew.
    h.server.kill();
    std::fs::remove_dir_all(h.server.data_dir()).unwrap();
    h.server.restart().expect("restart");
    // The client reconnects on its own; the first call after the restart may still see
    // the old connection's failure.
    for _ in 0..50 {
        if h.client.ping().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let adm = h.keys.admission(sku, "late", 60_000);
    assert!(matches!(
        h.client.reserve(sku, "late", &adm, "x", 1).await,
        Err(ClientError::NoSale)
    ));

    // A wiped data dir is another history: the sweeper refuses it, changing nothing,
    // until the operator binds the ledger to it.
    let sweeper = Sweeper::new(h.ledger.clone(), h.client.clone(), SweeperConfig::default());
    let refused = sweeper.run_pass().await.expect_err("another history");
    let new = h.client.history().await.unwrap().expect("a history id");
    let msg = refused.to_string();
    assert!(
        msg.contains(&format!("stockgate-sweeper rebind --history {new}")),
        "{msg}"
    );
    assert!(matches!(
        h.client.sale_info(sku).await,
        Err(ClientError::NoSale)
    ));
    stockgate_ledger::identity::rebind(&h.ledger, Some(new.clone()), &new)
        .await
        .unwrap();

    // The sweeper notices the lost sale and fences it (fail closed).
    let r = sweeper.run_pass().await.unwrap();
    assert_eq!(r.lost_skus, vec![sku.to_string()]);
    assert!(matches!(
        h.client.reserve(sku, "late", &adm, "x", 1).await,
        Err(ClientError::Fenced)
    ));
    assert!(h.client.sale_info(sku).await.unwrap().is_fenced());

    let report = rebuild_sale(&h.ledger, &h.client, sku, &RebuildOptions::default())
        .await
        .expect("rebuild");
    assert!(report.was_lost || report.restored == 10);
    assert_eq!(report.committed_units, 20);
    assert_eq!(report.restored, 10);
    assert_eq!(report.available, 70);
    let info = h.client.sale_info(sku).await.unwrap();
    assert_eq!(info.state, "OPEN");
    assert_eq!(
        (info.available, info.reserved, info.committed),
        (70, 10, 20)
    );

    // A second rebuild is refused unless fenced; with --fence it converges to the same.
    assert!(
        rebuild_sale(&h.ledger, &h.client, sku, &RebuildOptions::default())
            .await
            .is_err()
    );

    // Restored reservations still commit (same tokens), with their expiry.
    for hold in &holds[20..25] {
        let r = h.client.reservation(&hold.token).await.unwrap().unwrap();
        assert_eq!(r.expires_at_ms, hold.expires_at_ms);
        let p = checkout.pay(&hold.token, "pay", true).await.unwrap();
        assert!(
            matches!(
                p,
                PayOutcome::Committed {
                    server_confirmed: true
                }
            ),
            "{p:?}"
        );
    }
    // The unmaterialized holds were lost with the server: a late materialize + payment
    // cannot become a sale beyond stock.
    for hold in &unmaterialized {
        let adm = h.keys.admission(sku, &hold.user, 60_000);
        let m = checkout
            .start(sku, &hold.user, &adm, &hold.request_id, 1)
            .await;
        // RESERVE takes a fresh unit from the rebuilt stock, with the same token.
        let h2 = m.expect("fresh reservation");
        assert_eq!(h2.token, hold.token);
    }

    let info = h.client.sale_info(sku).await.unwrap();
    let t = h.ledger.totals(sku).await.unwrap();
    assert_eq!(info.committed as u64, t.committed_units);
    assert_eq!(info.reserved as u64, t.pending_units);
    assert_eq!(info.available + info.reserved + info.committed, 100);
    assert_eq!(
        info.available as u64,
        100 - t.committed_units - t.pending_units
    );
    assert_eq!(
        h.ledger
            .order(&holds[0].token)
            .await
            .unwrap()
            .unwrap()
            .status,
        OrderStatus::Committed
    );

    // Operator-initiated rebuild of an open sale converges to the same numbers.
    let again = rebuild_sale(
        &h.ledger,
        &h.client,
        sku,
        &RebuildOptions {
            fence_if_open: true,
            ..Default::default()
        },
    )
    .await
    .expect("rebuild with --fence");
    let info2 = h.client.sale_info(sku).await.unwrap();
    assert_eq!(
        (info2.available, info2.reserved, info2.committed),
        (info.available, info.reserved, info.committed),
        "{again:?}"
    );
}
