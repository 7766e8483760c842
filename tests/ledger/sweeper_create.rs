//! `stockgate-sweeper create-sale` on a sale the server already has, with a real Postgres
//! and the real binaries: one made by hand that sold a unit the ledger has no order for is
//! refused (nothing recorded, the way on named), and adopted once the materializer has
//! brought its orders into the ledger; a create retried after its ledger step failed (the
//! same parameters, nothing sold) still goes through; a total changed by hand is refused.

use crate::operator::sweeper_cli;
use stockgate_client::types::ReserveOutcome;
use stockgate_ledger::Ledger as _;
use stockgate_testkit::{sibling_binary, Harness};

const TTL_MS: &str = "600000";

/// `create-sale --sku SKU --total N --shards 1 --ttl-ms TTL_MS`, as the sale was made by hand.
fn create_sale(h: &Harness, sku: &str, total: &str) -> crate::operator::CliOutput {
    sweeper_cli(
        h,
        &[
            "create-sale",
            "--sku",
            sku,
            "--total",
            total,
            "--shards",
            "1",
            "--ttl-ms",
            TTL_MS,
        ],
    )
}

/// One unit reserved and committed on the server alone: no order in the ledger.
async fn sell_one_by_hand(h: &Harness, sku: &str) {
    let adm = h.keys.admission(sku, "u1", 600_000);
    let token = match h.client.reserve(sku, "u1", &adm, "r1", 1).await {
        Ok(ReserveOutcome::Reserved { token, .. }) => token,
        other => panic!("reserve: {other:?}"),
    };
    h.client.commit(&token).await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_sold_without_orders_is_refused_then_adopted_with_its_orders() {
    let h = Harness::start().await.expect("harness");
    h.client
        .sale_create("HAND", 10, Some(1), Some(600_000), None)
        .await
        .expect("SALE.CREATE by hand");
    sell_one_by_hand(&h, "HAND").await;

    let out = create_sale(&h, "HAND", "10");
    assert!(
        !out.success,
        "created a sale it cannot account for: {out:?}"
    );
    assert!(!out.stdout.contains("created"), "{out:?}");
    for words in [
        "sale HAND already exists on the server with 1 unit(s) committed",
        "orders for only 0 of them",
        "nothing was recorded",
        "stockgate-materializer --drain",
    ] {
        assert!(
            out.stderr.contains(words),
            "{words:?} missing: {}",
            out.stderr
        );
    }
    assert!(h.ledger.sale("HAND").await.unwrap().is_none(), "recorded");

    // The materializer writes the sold unit's order from the feed; then the ledger
    // accounts for the sale, and create-sale adopts it.
    let drain = std::process::Command::new(sibling_binary("stockgate-materializer"))
        .args(["--database-url", h.pg.url(), "--server", h.server.addr()])
        .arg("--drain")
        .output()
        .expect("run the materializer");
    assert!(drain.status.success(), "{drain:?}");
    assert!(create_sale(&h, "HAND", "10").ok().contains("created HAND"));
    let sale = h.ledger.sale("HAND").await.unwrap().expect("recorded");
    assert_eq!(sale.allocation, 10);
    assert_eq!(h.ledger.totals("HAND").await.unwrap().committed_units, 1);
    let pass = sweeper_cli(&h, &["run", "--once", "--sku", "HAND"]).ok();
    assert!(pass.contains("allocation mismatch: none"), "{pass}");
    assert!(pass.contains("fenced now: none"), "{pass}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_with_nothing_sold_still_goes_through() {
    let h = Harness::start().await.expect("harness");
    // A create-sale whose SALE.CREATE went through and whose ledger step did not.
    h.client
        .sale_create("RETRY", 10, Some(1), Some(600_000), None)
        .await
        .expect("SALE.CREATE");
    assert!(create_sale(&h, "RETRY", "10")
        .ok()
        .contains("created RETRY"));
    assert_eq!(
        h.ledger
            .sale("RETRY")
            .await
            .unwrap()
            .expect("recorded")
            .allocation,
        10
    );
    // Run again once the ledger has it, even after a sale: a re-run, as before.
    sell_one_by_hand(&h, "RETRY").await;
    assert!(create_sale(&h, "RETRY", "10")
        .ok()
        .contains("created RETRY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_changed_by_hand_is_refused() {
    let h = Harness::start().await.expect("harness");
    h.client
        .sale_create("ADJ", 10, Some(1), Some(600_000), None)
        .await
        .expect("SALE.CREATE");
    h.client.sale_adjust("ADJ", 5).await.expect("SALE.ADJUST");
    let out = create_sale(&h, "ADJ", "10");
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr
            .contains("sale ADJ already exists on the server with total 15, not --total 10"),
        "{}",
        out.stderr
    );
    assert!(h.ledger.sale("ADJ").await.unwrap().is_none(), "recorded");
}
