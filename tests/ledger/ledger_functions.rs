//! The ledger's rules as database functions (`migrations/0006_ledger_functions.sql`),
//! called the way any language calls them: raw SQL, one statement each, against a real
//! Postgres. The mistakes an integration makes are refused by the ledger itself: paying
//! after the deadline, committing a hold the payment was not for, cancelling a paid
//! order, materializing over a sweeper tombstone, conflicting details, unknown tokens,
//! bad arguments. Retries are idempotent and every transition leaves one audit row.
//! The materializer's batch functions (`migrations/0007_materializer_functions.sql`)
//! skip what the rules do not let move, exactly as the materializer's batches do.

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::Row;
use stockgate_client::types::now_ms;
use stockgate_ledger::ledger::postgres::{PgLedger, PgLedgerOptions};
use stockgate_ledger::OrderStatus;
use stockgate_testkit::pgtemp::TempPostgres;

const SKU: &str = "FN";

fn tok(tag: &str) -> String {
    format!("{{{SKU}}}{tag}")
}

/// The SQLSTATE and message of a database error (panics on anything else).
fn sql_error(e: &sqlx::Error) -> (String, String) {
    match e {
        sqlx::Error::Database(d) => (
            d.code().map(|c| c.into_owned()).unwrap_or_default(),
            d.message().to_string(),
        ),
        other => panic!("not a database error: {other:?}"),
    }
}

/// `f` must fail with `code`; returns the message.
fn expect_code<T: std::fmt::Debug>(r: Result<T, sqlx::Error>, code: &str, what: &str) -> String {
    match r {
        Ok(v) => panic!("{what}: expected SQLSTATE {code}, got Ok({v:?})"),
        Err(e) => {
            let (c, m) = sql_error(&e);
            assert_eq!(c, code, "{what}: {m}");
            m
        }
    }
}

async fn materialize(
    pool: &PgPool,
    token: &str,
    user: &str,
    qty: i32,
    expires_at_ms: i64,
    created_at_ms: i64,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT materialize_order($1, $2, $3, $4, $5, $6, $7)")
        .bind(token)
        .bind(SKU)
        .bind(user)
        .bind(format!("req-{token}"))
        .bind(qty)
        .bind(expires_at_ms)
        .bind(created_at_ms)
        .fetch_one(pool)
        .await
}

/// A fresh PENDING order of one unit for `user`, expiring `expires_in_ms` from now.
/// Returns (created_at_ms, expires_at_ms).
async fn pending(pool: &PgPool, token: &str, user: &str, expires_in_ms: i64) -> (i64, i64) {
    let created = now_ms() - 10;
    let expires = now_ms() + expires_in_ms;
    assert_eq!(
        materialize(pool, token, user, 1, expires, created)
            .await
            .unwrap(),
        "CREATED"
    );
    (created, expires)
}

async fn pay(
    pool: &PgPool,
    token: &str,
    payment_ref: &str,
    money_moved: bool,
) -> Result<(String, Option<String>), sqlx::Error> {
    let row = sqlx::query("SELECT outcome, previous_status FROM pay_order($1, $2, $3)")
        .bind(token)
        .bind(payment_ref)
        .bind(money_moved)
        .fetch_one(pool)
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

async fn text_call(pool: &PgPool, sql: &str, token: &str) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(sql).bind(token).fetch_one(pool).await
}

async fn cancel(pool: &PgPool, token: &str) -> Result<String, sqlx::Error> {
    text_call(pool, "SELECT cancel_order($1)", token).await
}

async fn mark_refunded(pool: &PgPool, token: &str) -> Result<String, sqlx::Error> {
    text_call(pool, "SELECT mark_refunded($1)", token).await
}

async fn refund_required(
    pool: &PgPool,
    token: &str,
    payment_ref: Option<&str>,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT mark_refund_required($1, $2, 'test')")
        .bind(token)
        .bind(payment_ref)
        .fetch_one(pool)
        .await
}

async fn extend(pool: &PgPool, token: &str, at_ms: i64) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT extend_order($1, $2)")
        .bind(token)
        .bind(at_ms)
        .fetch_one(pool)
        .await
}

async fn is_hold(
    pool: &PgPool,
    token: &str,
    user: &str,
    qty: i32,
    created_at_ms: i64,
    expires_at_ms: i64,
) -> bool {
    sqlx::query_scalar("SELECT order_is_hold($1, $2, $3, $4, $5, $6)")
        .bind(token)
        .bind(SKU)
        .bind(user)
        .bind(qty)
        .bind(created_at_ms)
        .bind(expires_at_ms)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn sweep(pool: &PgPool, tokens: &[String]) -> Vec<(String, String)> {
    sqlx::query("SELECT token, verdict FROM sweep_cancel_expired($1)")
        .bind(tokens)
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn tombstone(pool: &PgPool, token: &str, user: &str, qty: i32) -> String {
    let rows = sqlx::query("SELECT token, verdict FROM sweep_tombstone($1, $2, $3, $4, $5)")
        .bind(vec![token.to_string()])
        .bind(vec![SKU.to_string()])
        .bind(vec![user.to_string()])
        .bind(vec![qty])
        .bind(vec![now_ms() - 1_000])
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<String, _>(0), token);
    rows[0].get(1)
}

struct Row_ {
    status: String,
    payment_ref: Option<String>,
    committed: bool,
}

async fn order(pool: &PgPool, token: &str) -> Row_ {
    let r = sqlx::query(
        "SELECT status, payment_ref, committed_at IS NOT NULL AS c FROM orders \
         WHERE reservation_token = $1",
    )
    .bind(token)
    .fetch_one(pool)
    .await
    .unwrap();
    Row_ {
        status: r.get(0),
        payment_ref: r.get(1),
        committed: r.get(2),
    }
}

async fn status(pool: &PgPool, token: &str) -> String {
    order(pool, token).await.status
}

/// (from, to, actor, detail) of every audit row of `token`, oldest first.
type Event = (Option<String>, String, String, Option<String>);

async fn events(pool: &PgPool, token: &str) -> Vec<Event> {
    sqlx::query(
        "SELECT from_status, to_status, actor, detail FROM order_events \
         WHERE reservation_token = $1 ORDER BY id",
    )
    .bind(token)
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// The audit trail of every order replays to its status over legal edges, one row per
/// transition.
async fn assert_audit_replays(pool: &PgPool) {
    let tokens: Vec<String> = sqlx::query_scalar("SELECT reservation_token FROM orders")
        .fetch_all(pool)
        .await
        .unwrap();
    assert!(!tokens.is_empty());
    for t in tokens {
        let evs = events(pool, &t).await;
        assert!(!evs.is_empty(), "{t} has no audit row");
        let mut prev: Option<String> = None;
        for (from, to, _, _) in &evs {
            assert_eq!(from, &prev, "audit chain of {t}: {evs:?}");
            if let Some(p) = &prev {
                let (p, to) = (
                    OrderStatus::parse(p).unwrap(),
                    OrderStatus::parse(to).unwrap(),
                );
                assert!(p.can_become(to), "illegal edge {p} -> {to} in {t}'s audit");
            }
            prev = Some(to.clone());
        }
        assert_eq!(
            prev.as_deref(),
            Some(status(pool, &t).await.as_str()),
            "{t}"
        );
    }
}

async fn case_on_time_payment_and_retries(pool: &PgPool) {
    let t = tok("paid");
    let (created, expires) = pending(pool, &t, "u-paid", 60_000).await;
    // A retried materialize finds its order.
    assert_eq!(
        materialize(pool, &t, "u-paid", 1, expires, created)
            .await
            .unwrap(),
        "ALREADY_PENDING"
    );
    assert_eq!(
        pay(pool, &t, "psp-1", true).await.unwrap(),
        ("COMMITTED".into(), Some("PENDING".into()))
    );
    // The token is the payment idempotency key: the same payment again, whatever the
    // provider says the second time.
    for (r, moved) in [("psp-1", true), ("psp-1", false), ("psp-other", true)] {
        assert_eq!(
            pay(pool, &t, r, moved).await.unwrap(),
            ("ALREADY_COMMITTED".into(), Some("COMMITTED".into())),
            "retry with {r} {moved}"
        );
    }
    assert_eq!(
        materialize(pool, &t, "u-paid", 1, expires, created)
            .await
            .unwrap(),
        "ALREADY_COMMITTED"
    );
    let o = order(pool, &t).await;
    assert_eq!(
        (o.status.as_str(), o.payment_ref.as_deref(), o.committed),
        ("COMMITTED", Some("psp-1"), true)
    );
    let evs = events(pool, &t).await;
    assert_eq!(
        evs,
        vec![
            (None, "PENDING".into(), "checkout".into(), None),
            (
                Some("PENDING".into()),
                "COMMITTED".into(),
                "payment".into(),
                Some("psp-1".into())
            ),
        ],
        "one row per transition, none for the retries"
    );
}

async fn case_paying_after_the_deadline(pool: &PgPool) {
    // Past its deadline by the database's clock: a real deadline passing, not a back-dated
    // one, so the guard is the function's and not the test's arithmetic.
    let t = tok("late");
    pending(pool, &t, "u-late", 1_200).await;
    let t2 = tok("late-auth");
    pending(pool, &t2, "u-late2", 1_200).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // Authorize-then-capture: refused, nothing changes, do not capture.
    for _ in 0..2 {
        assert_eq!(
            pay(pool, &t2, "auth-1", false).await.unwrap(),
            ("REFUSED".into(), Some("PENDING".into()))
        );
    }
    let o = order(pool, &t2).await;
    assert_eq!(
        (o.status.as_str(), o.payment_ref, o.committed),
        ("PENDING", None, false)
    );
    assert_eq!(events(pool, &t2).await.len(), 1, "a refusal writes nothing");

    // Money already moved: the order is marked for a refund, never COMMITTED.
    assert_eq!(
        pay(pool, &t, "cap-1", true).await.unwrap(),
        ("REFUND_REQUIRED".into(), Some("PENDING".into()))
    );
    // Retried capture webhook: idempotent.
    assert_eq!(
        pay(pool, &t, "cap-1", true).await.unwrap(),
        ("REFUND_REQUIRED".into(), Some("REFUND_REQUIRED".into()))
    );
    assert_eq!(
        pay(pool, &t, "cap-1", false).await.unwrap(),
        ("REFUSED".into(), Some("REFUND_REQUIRED".into()))
    );
    let o = order(pool, &t).await;
    assert_eq!(
        (o.status.as_str(), o.payment_ref.as_deref(), o.committed),
        ("REFUND_REQUIRED", Some("cap-1"), false)
    );
    let evs = events(pool, &t).await;
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!(
        evs[1],
        (
            Some("PENDING".into()),
            "REFUND_REQUIRED".into(),
            "payment".into(),
            Some("payment after the reservation ended".into())
        )
    );
    // The refund made; a retried webhook of the same payment changes nothing, another
    // payment for the refunded order is refused (it needs a refund of its own).
    assert_eq!(mark_refunded(pool, &t).await.unwrap(), "REFUNDED");
    assert_eq!(mark_refunded(pool, &t).await.unwrap(), "ALREADY_REFUNDED");
    assert_eq!(
        pay(pool, &t, "cap-1", true).await.unwrap(),
        ("REFUND_REQUIRED".into(), Some("REFUNDED".into()))
    );
    assert_eq!(
        pay(pool, &t, "cap-1", false).await.unwrap(),
        ("REFUSED".into(), Some("REFUNDED".into()))
    );
    let m = expect_code(
        pay(pool, &t, "cap-2", true).await,
        "SG001",
        "second payment",
    );
    assert!(
        m.contains(&t) && m.contains("REFUNDED") && m.contains("cap-2"),
        "{m}"
    );
    assert_eq!(status(pool, &t).await, "REFUNDED");

    // Late after the sweeper got there first, and after the buyer cancelled.
    let s = tok("late-swept");
    pending(pool, &s, "u-swept", -1_000).await;
    assert_eq!(
        sweep(pool, std::slice::from_ref(&s)).await,
        [(s.clone(), "CANCELLED_NOW".to_string())]
    );
    assert_eq!(
        pay(pool, &s, "cap-s", false).await.unwrap(),
        ("REFUSED".into(), Some("CANCELLED_BY_SWEEPER".into()))
    );
    assert_eq!(
        pay(pool, &s, "cap-s", true).await.unwrap(),
        (
            "REFUND_REQUIRED".into(),
            Some("CANCELLED_BY_SWEEPER".into())
        )
    );
    let c = tok("late-cancelled");
    pending(pool, &c, "u-cancelled", 60_000).await;
    assert_eq!(cancel(pool, &c).await.unwrap(), "CANCELLED");
    assert_eq!(
        pay(pool, &c, "cap-c", true).await.unwrap(),
        ("REFUND_REQUIRED".into(), Some("CANCELLED".into()))
    );
    for t in [&t, &t2, &s, &c] {
        assert!(!order(pool, t).await.committed, "{t} was never committed");
    }

    // No order at all: nothing to attach a refund to.
    assert_eq!(
        pay(pool, &tok("never"), "cap-n", true).await.unwrap(),
        ("NOT_FOUND".into(), None)
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM orders WHERE reservation_token = '{FN}never'"
        )
        .await,
        0
    );
}

async fn case_the_hold_the_payment_was_for(pool: &PgPool) {
    let t = tok("hold");
    let (created, expires) = pending(pool, &t, "u-hold", 60_000).await;
    pay(pool, &t, "psp-h", true).await.unwrap();
    // The server's reservation this order was materialized from.
    assert!(is_hold(pool, &t, "u-hold", 1, created, expires).await);
    // The same hold after an EXTEND reached the server but not the ledger (creation time
    // still matches), or with the creation time unknown (expiry matches).
    assert!(is_hold(pool, &t, "u-hold", 1, created, expires + 30_000).await);
    assert!(is_hold(pool, &t, "u-hold", 1, created + 3, expires).await);
    // Another hold under the same token (the paid one purged by retention, a new RESERVE
    // with the same request id): created later with a new deadline. Committing it would
    // sell a unit twice.
    assert!(!is_hold(pool, &t, "u-hold", 1, created + 90_000, expires + 90_000).await);
    // Other details are never the same hold.
    assert!(!is_hold(pool, &t, "u-other", 1, created, expires).await);
    assert!(!is_hold(pool, &t, "u-hold", 2, created, expires).await);
    let other_sku: bool = sqlx::query_scalar("SELECT order_is_hold($1, 'OTHER', $2, 1, $3, $4)")
        .bind(&t)
        .bind("u-hold")
        .bind(created)
        .bind(expires)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(!other_sku);
    // No order: false, not an error.
    assert!(!is_hold(pool, &tok("nohold"), "u-hold", 1, created, expires).await);
    // Exact to the millisecond: one ms off in both is another hold.
    assert!(!is_hold(pool, &t, "u-hold", 1, created + 1, expires + 1).await);
    assert!(!is_hold(pool, &t, "u-hold", 1, created - 1, expires - 1).await);
}

async fn case_cancel(pool: &PgPool) {
    let t = tok("cancel");
    pending(pool, &t, "u-cancel", 60_000).await;
    assert_eq!(cancel(pool, &t).await.unwrap(), "CANCELLED");
    assert_eq!(cancel(pool, &t).await.unwrap(), "ALREADY_CANCELLED");
    let evs = events(pool, &t).await;
    assert_eq!(evs.len(), 2);
    assert_eq!(
        evs[1],
        (
            Some("PENDING".into()),
            "CANCELLED".into(),
            "checkout".into(),
            Some("buyer cancelled".into())
        )
    );
    // A cancelled order is not paid afterwards, and not materialized again.
    assert_eq!(
        pay(pool, &t, "p", false).await.unwrap(),
        ("REFUSED".into(), Some("CANCELLED".into()))
    );
    let m = expect_code(
        materialize(pool, &t, "u-cancel", 1, now_ms() + 60_000, now_ms()).await,
        "SG001",
        "materialize a cancelled order",
    );
    assert!(m.contains("CANCELLED"), "{m}");

    // Cancelling a paid order would hand a sold unit back to stock: refused.
    let p = tok("cancel-paid");
    pending(pool, &p, "u-cp", 60_000).await;
    pay(pool, &p, "psp-cp", true).await.unwrap();
    let m = expect_code(cancel(pool, &p).await, "SG001", "cancel a paid order");
    assert_eq!(m, format!("order {p} is COMMITTED: cancel refused"));
    assert_eq!(status(pool, &p).await, "COMMITTED");
    assert_eq!(events(pool, &p).await.len(), 2, "a refusal writes nothing");
    // Swept, refund-required and refunded orders are not the buyer's to cancel either.
    let s = tok("cancel-swept");
    pending(pool, &s, "u-cs", -1_000).await;
    sweep(pool, std::slice::from_ref(&s)).await;
    let m = expect_code(cancel(pool, &s).await, "SG001", "cancel a swept order");
    assert!(m.contains("CANCELLED_BY_SWEEPER"), "{m}");
    refund_required(pool, &p, None).await.unwrap();
    expect_code(cancel(pool, &p).await, "SG001", "cancel REFUND_REQUIRED");
    mark_refunded(pool, &p).await.unwrap();
    expect_code(cancel(pool, &p).await, "SG001", "cancel REFUNDED");
}

async fn case_materialize_over_a_tombstone(pool: &PgPool) {
    // The sweeper saw the hold expire before the checkout recorded it: it wrote a
    // tombstone and gave the units back. The late materialize must not resurrect it.
    let t = tok("tomb");
    assert_eq!(tombstone(pool, &t, "u-tomb", 1).await, "TOMBSTONED");
    assert_eq!(tombstone(pool, &t, "u-tomb", 1).await, "EXISTS");
    let m = expect_code(
        materialize(pool, &t, "u-tomb", 1, now_ms() + 60_000, now_ms()).await,
        "SG001",
        "materialize over a tombstone",
    );
    assert!(
        m.starts_with(&format!("order {t} is CANCELLED_BY_SWEEPER: ")),
        "{m}"
    );
    // A tombstone's details come from EXPIRED; a mismatch does not turn the refusal into a
    // conflict.
    let m = expect_code(
        materialize(pool, &t, "u-tomb", 3, now_ms() + 60_000, now_ms()).await,
        "SG001",
        "materialize over a tombstone with other qty",
    );
    assert!(m.contains("CANCELLED_BY_SWEEPER"), "{m}");
    assert_eq!(status(pool, &t).await, "CANCELLED_BY_SWEEPER");
    let evs = events(pool, &t).await;
    assert_eq!(
        evs,
        vec![(
            None,
            "CANCELLED_BY_SWEEPER".into(),
            "sweeper".into(),
            Some("tombstone".into())
        )]
    );
    // A payment for it is refused too.
    assert_eq!(
        pay(pool, &t, "p", false).await.unwrap(),
        ("REFUSED".into(), Some("CANCELLED_BY_SWEEPER".into()))
    );
    // The other way round: the order came first, the tombstone finds it.
    let o = tok("tomb-late");
    pending(pool, &o, "u-tl", 60_000).await;
    assert_eq!(tombstone(pool, &o, "u-tl", 1).await, "EXISTS");
    assert_eq!(status(pool, &o).await, "PENDING");
}

async fn case_conflicting_details(pool: &PgPool) {
    let t = tok("conflict");
    let (created, expires) = pending(pool, &t, "u-conf", 60_000).await;
    for (user, qty) in [("someone-else", 1), ("u-conf", 2)] {
        let m = expect_code(
            materialize(pool, &t, user, qty, expires, created).await,
            "SG002",
            "same token, other details",
        );
        assert!(m.contains(&t), "{m}");
    }
    let other_sku = sqlx::query_scalar::<_, String>(
        "SELECT materialize_order($1, 'OTHER', 'u-conf', 'r', 1, $2, $3)",
    )
    .bind(&t)
    .bind(expires)
    .bind(created)
    .fetch_one(pool)
    .await;
    expect_code(other_sku, "SG002", "same token, other sku");
    // Paid orders too.
    pay(pool, &t, "psp-conf", true).await.unwrap();
    expect_code(
        materialize(pool, &t, "someone-else", 1, expires, created).await,
        "SG002",
        "same token, other details, paid",
    );
    assert_eq!(status(pool, &t).await, "COMMITTED");
}

async fn case_unknown_tokens(pool: &PgPool) {
    let t = tok("unknown");
    for (what, r) in [
        ("cancel", cancel(pool, &t).await),
        ("extend", extend(pool, &t, now_ms() + 1_000).await),
        ("refund", refund_required(pool, &t, Some("p")).await),
        ("refunded", mark_refunded(pool, &t).await),
    ] {
        let m = expect_code(r, "SG003", what);
        assert_eq!(m, format!("no order for reservation {t}"), "{what}");
    }
    assert_eq!(
        pay(pool, &t, "p", false).await.unwrap(),
        ("NOT_FOUND".into(), None)
    );
    assert_eq!(
        sweep(pool, std::slice::from_ref(&t)).await,
        [(t.clone(), "MISSING".to_string())]
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM orders WHERE reservation_token = '{FN}unknown'"
        )
        .await,
        0,
        "nothing is created for an unknown token"
    );
}

async fn case_bad_arguments(pool: &PgPool) {
    let before = count(pool, "SELECT count(*) FROM orders").await;
    let events_before = count(pool, "SELECT count(*) FROM order_events").await;
    let now = now_ms();
    let t = tok("bad");
    for (what, qty, exp, created) in [
        ("qty 0", 0, now + 1_000, now),
        ("qty < 0", -1, now + 1_000, now),
        ("negative expiry", 1, -5, now),
        ("negative creation", 1, now + 1_000, -1),
        ("beyond year 9999", 1, i64::MAX, now),
    ] {
        expect_code(
            materialize(pool, &t, "u", qty, exp, created).await,
            "SG004",
            what,
        );
    }
    expect_code(
        materialize(pool, "", "u", 1, now + 1_000, now).await,
        "SG004",
        "empty token",
    );
    expect_code(
        materialize(pool, &t, "", 1, now + 1_000, now).await,
        "SG004",
        "empty user",
    );
    let null_request =
        sqlx::query_scalar::<_, String>("SELECT materialize_order($1, $2, 'u', NULL, 1, $3, $4)")
            .bind(&t)
            .bind(SKU)
            .bind(now + 1_000)
            .bind(now)
            .fetch_one(pool)
            .await;
    expect_code(null_request, "SG004", "no request id");
    expect_code(pay(pool, "", "p", true).await, "SG004", "pay empty token");
    let null_moved = sqlx::query("SELECT * FROM pay_order($1, 'p', NULL)")
        .bind(tok("paid"))
        .fetch_one(pool)
        .await
        .map(|_| ());
    expect_code(null_moved, "SG004", "money_moved NULL");
    expect_code(cancel(pool, "").await, "SG004", "cancel empty token");
    expect_code(
        mark_refunded(pool, "").await,
        "SG004",
        "refunded empty token",
    );
    expect_code(
        refund_required(pool, "", None).await,
        "SG004",
        "refund empty token",
    );
    expect_code(extend(pool, "", now).await, "SG004", "extend empty token");
    expect_code(
        extend(pool, &tok("paid"), -1).await,
        "SG004",
        "extend to a negative time",
    );
    let uneven = sqlx::query("SELECT * FROM sweep_tombstone($1, $2, $3, $4, $5)")
        .bind(vec![tok("b1"), tok("b2")])
        .bind(vec![SKU.to_string()])
        .bind(vec!["u".to_string(), "v".to_string()])
        .bind(vec![1i32, 1])
        .bind(vec![now, now])
        .fetch_all(pool)
        .await
        .map(|_| ());
    expect_code(uneven, "SG004", "tombstone arrays of different lengths");
    let zero_qty = sqlx::query("SELECT * FROM sweep_tombstone($1, $2, $3, $4, $5)")
        .bind(vec![tok("b1")])
        .bind(vec![SKU.to_string()])
        .bind(vec!["u".to_string()])
        .bind(vec![0i32])
        .bind(vec![now])
        .fetch_all(pool)
        .await
        .map(|_| ());
    expect_code(zero_qty, "SG004", "tombstone qty 0");
    let null_batch = sqlx::query("SELECT * FROM sweep_cancel_expired(NULL)")
        .fetch_all(pool)
        .await
        .map(|_| ());
    expect_code(null_batch, "SG004", "sweep NULL");
    assert_eq!(count(pool, "SELECT count(*) FROM orders").await, before);
    assert_eq!(
        count(pool, "SELECT count(*) FROM order_events").await,
        events_before,
        "a refused call writes nothing"
    );
}

async fn case_extend_and_refund_rules(pool: &PgPool) {
    // Extending moves the deadline the payment guard reads.
    let t = tok("ext");
    pending(pool, &t, "u-ext", -1_000).await;
    assert_eq!(
        pay(pool, &t, "p", false).await.unwrap(),
        ("REFUSED".into(), Some("PENDING".into()))
    );
    assert_eq!(
        extend(pool, &t, now_ms() + 60_000).await.unwrap(),
        "EXTENDED"
    );
    assert_eq!(
        pay(pool, &t, "psp-ext", true).await.unwrap(),
        ("COMMITTED".into(), Some("PENDING".into()))
    );
    let m = expect_code(
        extend(pool, &t, now_ms() + 90_000).await,
        "SG001",
        "extend a paid order",
    );
    assert_eq!(m, format!("order {t} is COMMITTED: extend refused"));

    // A live PENDING order can still be sold: not refundable.
    let live = tok("refund-live");
    pending(pool, &live, "u-rl", 60_000).await;
    let m = expect_code(
        refund_required(pool, &live, Some("x")).await,
        "SG001",
        "refund a live order",
    );
    assert!(m.starts_with(&format!("order {live} is PENDING: ")), "{m}");
    // COMMITTED → REFUND_REQUIRED (the server released the units): the stored payment
    // reference survives a caller that does not know it.
    assert_eq!(refund_required(pool, &t, None).await.unwrap(), "COMMITTED");
    assert_eq!(
        refund_required(pool, &t, Some("")).await.unwrap(),
        "REFUND_REQUIRED"
    );
    assert_eq!(
        order(pool, &t).await.payment_ref.as_deref(),
        Some("psp-ext")
    );
    // Not refunded twice, and a refund needs a refund to be required first.
    assert_eq!(mark_refunded(pool, &t).await.unwrap(), "REFUNDED");
    expect_code(
        refund_required(pool, &t, None).await,
        "SG001",
        "REFUNDED back to REFUND_REQUIRED",
    );
    expect_code(
        mark_refunded(pool, &live).await,
        "SG001",
        "refund a live order",
    );
}

async fn case_sweep_verdicts(pool: &PgPool) {
    let expired = tok("sw-expired");
    let live = tok("sw-live");
    let locked = tok("sw-locked");
    pending(pool, &expired, "u1", -1_000).await;
    pending(pool, &live, "u2", 60_000).await;
    pending(pool, &locked, "u3", -1_000).await;
    let batch = vec![
        tok("paid"),
        live.clone(),
        expired.clone(),
        tok("cancel"),
        tok("late"),
        tok("nothing-here"),
        locked.clone(),
    ];
    // A concurrent transition holds `locked`: the sweep does not wait for it.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM orders WHERE reservation_token = $1 FOR UPDATE")
        .bind(&locked)
        .execute(&mut *holder)
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), sweep(pool, &batch))
        .await
        .expect("the sweep skips a locked row instead of waiting");
    let want = [
        "COMMIT_CLEANUP",
        "SKIP",
        "CANCELLED_NOW",
        "CANCELLED_BY_BUYER",
        "REFUND",
        "MISSING",
        "SKIP",
    ];
    assert_eq!(
        got,
        batch
            .iter()
            .cloned()
            .zip(want.iter().map(|s| s.to_string()))
            .collect::<Vec<_>>()
    );
    holder.rollback().await.unwrap();
    // Once released it is judged, and a second sweep finds its own earlier work.
    assert_eq!(
        sweep(pool, &[locked.clone(), expired.clone()]).await,
        [
            (locked.clone(), "CANCELLED_NOW".to_string()),
            (expired.clone(), "ALREADY_CANCELLED_BY_SWEEPER".to_string())
        ]
    );
    assert_eq!(
        events(pool, &expired).await[1],
        (
            Some("PENDING".into()),
            "CANCELLED_BY_SWEEPER".into(),
            "sweeper".into(),
            Some("expired".into())
        )
    );
    assert_eq!(status(pool, &live).await, "PENDING");
}

async fn case_pay_and_sweep_race(pool: &PgPool) {
    // Orders whose deadline passes while payments and sweeps run at once: each ends
    // exactly one way, and the payment's outcome says which.
    let n = 40;
    let tokens: Vec<String> = (0..n).map(|i| tok(&format!("race-{i}"))).collect();
    for (i, t) in tokens.iter().enumerate() {
        pending(pool, t, &format!("ur{i}"), 300).await;
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut tasks = Vec::new();
    for t in tokens.clone() {
        let p = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut last = None;
            for _ in 0..20 {
                last = Some(pay(&p, &t, "psp-race", true).await.unwrap());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (t, last)
        }));
    }
    let sweeper = {
        let p = pool.clone();
        let tokens = tokens.clone();
        tokio::spawn(async move {
            for _ in 0..40 {
                sweep(&p, &tokens).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    for task in tasks {
        let (t, last) = task.await.unwrap();
        let (outcome, _) = last.unwrap();
        let s = status(pool, &t).await;
        match outcome.as_str() {
            "ALREADY_COMMITTED" | "COMMITTED" => assert_eq!(s, "COMMITTED", "{t}"),
            "REFUND_REQUIRED" => assert_eq!(s, "REFUND_REQUIRED", "{t}"),
            other => panic!("{t}: {other}"),
        }
        let evs = events(pool, &t).await;
        let committed = evs.iter().filter(|e| e.1 == "COMMITTED").count();
        let swept = evs.iter().filter(|e| e.1 == "CANCELLED_BY_SWEEPER").count();
        assert!(committed + swept <= 1, "{t}: {evs:?}");
    }
    sweeper.await.unwrap();
}

async fn case_trigger_still_guards(pool: &PgPool) {
    // Under the functions, the transition trigger still refuses an illegal edge written
    // by hand.
    let e = sqlx::query("UPDATE orders SET status = 'PENDING' WHERE reservation_token = $1")
        .bind(tok("paid"))
        .execute(pool)
        .await
        .expect_err("COMMITTED -> PENDING");
    assert_eq!(sql_error(&e).0, "23514");
}

/// `materialize_reserved` over parallel arrays of one-unit holds for `tokens`.
async fn reserved_batch(
    pool: &PgPool,
    tokens: &[String],
    expires: i64,
) -> Result<i64, sqlx::Error> {
    let n = tokens.len();
    sqlx::query_scalar("SELECT materialize_reserved($1, $2, $3, $4, $5, $6, $7)")
        .bind(tokens)
        .bind(vec![SKU.to_string(); n])
        .bind(tokens.iter().map(|t| format!("u-{t}")).collect::<Vec<_>>())
        .bind(
            tokens
                .iter()
                .map(|t| format!("req-{t}"))
                .collect::<Vec<_>>(),
        )
        .bind(vec![1i32; n])
        .bind(vec![expires; n])
        .bind(vec![expires - 60_000; n])
        .fetch_one(pool)
        .await
}

async fn transition_batch(pool: &PgPool, to: &str, tokens: &[String]) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT materialize_transition($1, $2)")
        .bind(to)
        .bind(tokens)
        .fetch_one(pool)
        .await
}

async fn extended_batch(pool: &PgPool, token: &str, at_ms: i64) -> i64 {
    sqlx::query_scalar("SELECT materialize_extended($1, $2)")
        .bind(vec![token.to_string()])
        .bind(vec![at_ms])
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn expires_ms(pool: &PgPool, token: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT (extract(epoch FROM reservation_expires_at) * 1000)::int8 FROM orders \
         WHERE reservation_token = $1",
    )
    .bind(token)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn case_materializer_batches(pool: &PgPool) {
    let [a, b, c, cancelled, swept] = ["mb-a", "mb-b", "mb-c", "mb-x", "mb-s"].map(tok);
    pending(pool, &cancelled, &format!("u-{cancelled}"), 60_000).await;
    assert_eq!(cancel(pool, &cancelled).await.unwrap(), "CANCELLED");
    assert_eq!(
        tombstone(pool, &swept, &format!("u-{swept}"), 1).await,
        "TOMBSTONED"
    );
    let expires = now_ms() + 60_000;
    // A token twice in one batch, and orders the ledger already has: only new tokens.
    let batch = [&a, &b, &c, &a, &cancelled, &swept].map(|t| t.to_string());
    assert_eq!(reserved_batch(pool, &batch, expires).await.unwrap(), 3);
    assert_eq!(
        reserved_batch(pool, &batch, expires).await.unwrap(),
        0,
        "a retried batch"
    );
    assert_eq!(status(pool, &cancelled).await, "CANCELLED");
    assert_eq!(status(pool, &swept).await, "CANCELLED_BY_SWEEPER");
    assert_eq!(
        expires_ms(pool, &a).await,
        expires,
        "milliseconds kept exactly"
    );
    assert_eq!(
        events(pool, &a).await,
        vec![(
            None,
            "PENDING".into(),
            "materializer".into(),
            Some("feed".into())
        )]
    );

    // The deadline follows the server's forward only, and only while PENDING.
    assert_eq!(extended_batch(pool, &a, expires + 5_000).await, 1);
    assert_eq!(extended_batch(pool, &a, expires + 5_000).await, 0);
    assert_eq!(
        extended_batch(pool, &a, expires + 1_000).await,
        0,
        "an older entry"
    );
    assert_eq!(expires_ms(pool, &a).await, expires + 5_000);
    assert_eq!(extended_batch(pool, &cancelled, expires + 9_000).await, 0);

    // Only PENDING orders move; the rest (moved first, tombstoned, unknown) are skipped.
    let commit = [&a, &cancelled, &swept, &tok("mb-unknown")].map(|t| t.to_string());
    assert_eq!(
        transition_batch(pool, "COMMITTED", &commit).await.unwrap(),
        1
    );
    assert_eq!(
        transition_batch(pool, "COMMITTED", &commit).await.unwrap(),
        0
    );
    let release = [&a, &b].map(|t| t.to_string());
    assert_eq!(
        transition_batch(pool, "CANCELLED", &release).await.unwrap(),
        1
    );
    assert_eq!(
        transition_batch(pool, "CANCELLED", &release).await.unwrap(),
        0
    );
    let a_row = order(pool, &a).await;
    assert_eq!(
        (a_row.status.as_str(), a_row.committed),
        ("COMMITTED", true)
    );
    assert_eq!(status(pool, &b).await, "CANCELLED");
    assert_eq!(status(pool, &cancelled).await, "CANCELLED");
    assert_eq!(status(pool, &swept).await, "CANCELLED_BY_SWEEPER");
    assert_eq!(
        events(pool, &a).await[1],
        (
            Some("PENDING".into()),
            "COMMITTED".into(),
            "materializer".into(),
            Some("feed".into())
        )
    );
    assert_eq!(events(pool, &b).await.len(), 2);
    assert_eq!(
        events(pool, &cancelled).await.len(),
        2,
        "no materializer row"
    );

    // Targets the feed never produces are bad arguments, and change nothing.
    for to in ["REFUNDED", "PENDING", "CANCELLED_BY_SWEEPER"] {
        expect_code(
            transition_batch(pool, to, std::slice::from_ref(&c)).await,
            "SG004",
            to,
        );
    }
    assert_eq!(status(pool, &c).await, "PENDING");
    assert_eq!(events(pool, &c).await.len(), 1);
    let short =
        sqlx::query_scalar::<_, i64>("SELECT materialize_reserved($1, $2, $3, $4, $5, $6, $7)")
            .bind(vec![tok("mb-short")])
            .bind(Vec::<String>::new())
            .bind(vec!["u".to_string()])
            .bind(vec!["r".to_string()])
            .bind(vec![1i32])
            .bind(vec![expires])
            .bind(vec![expires])
            .fetch_one(pool)
            .await;
    expect_code(short, "SG004", "arrays of different lengths");
    let pos = sqlx::query("SELECT feed_set_position('no-such-consumer', 5, NULL)")
        .execute(pool)
        .await;
    expect_code(pos, "SG003", "unknown consumer");
}

async fn ledger(url: &str, schema: &str) -> PgLedger {
    let l = PgLedger::connect_with(
        url,
        PgLedgerOptions {
            schema: schema.to_string(),
            ..Default::default()
        },
    )
    .await
    .expect("connect");
    l.migrate().await.expect("migrate");
    l
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ledger_refuses_what_its_rules_forbid() {
    let pg = TempPostgres::start().await.expect("postgres");
    let l = ledger(pg.url(), "stockgate").await;
    let pool = l.pool();
    macro_rules! case {
        ($name:ident) => {
            eprintln!("ledger functions case: {}", stringify!($name));
            $name(pool).await;
        };
    }
    case!(case_on_time_payment_and_retries);
    case!(case_paying_after_the_deadline);
    case!(case_the_hold_the_payment_was_for);
    case!(case_cancel);
    case!(case_materialize_over_a_tombstone);
    case!(case_conflicting_details);
    case!(case_unknown_tokens);
    case!(case_bad_arguments);
    case!(case_extend_and_refund_rules);
    case!(case_sweep_verdicts);
    case!(case_pay_and_sweep_race);
    case!(case_trigger_still_guards);
    case!(case_materializer_batches);
    assert_audit_replays(pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qualified_calls_work_from_any_search_path_and_stay_in_their_schema() {
    // How another language calls them without setting search_path: `schema.function(...)`.
    // Each ledger's functions act on their own schema's tables, whatever the caller's
    // search_path says.
    let pg = TempPostgres::start().await.expect("postgres");
    let a = ledger(pg.url(), "stockgate").await;
    let b = ledger(pg.url(), "shop_ledger").await;
    let plain = PgPool::connect(pg.url()).await.expect("plain connection");
    let now = now_ms();
    for schema in ["stockgate", "shop_ledger"] {
        let got: String = sqlx::query_scalar(&format!(
            "SELECT {schema}.materialize_order('{{FN}}q', 'FN', 'u', 'r', 1, $1, $2)"
        ))
        .bind(now + 60_000)
        .bind(now)
        .fetch_one(&plain)
        .await
        .unwrap();
        assert_eq!(got, "CREATED", "{schema}");
    }
    let created: i64 = sqlx::query_scalar(
        "SELECT stockgate.materialize_reserved(ARRAY['{FN}m'], ARRAY['FN'], ARRAY['u'], \
         ARRAY['r'], ARRAY[1], ARRAY[$1::int8], ARRAY[$2::int8])",
    )
    .bind(now + 60_000)
    .bind(now)
    .fetch_one(&plain)
    .await
    .unwrap();
    assert_eq!(created, 1);
    assert_eq!(status(a.pool(), "{FN}m").await, "PENDING");
    let in_b = "SELECT count(*) FROM orders WHERE reservation_token = '{FN}m'";
    assert_eq!(
        count(b.pool(), in_b).await,
        0,
        "the batch went to its own ledger"
    );
    let row =
        sqlx::query("SELECT outcome, previous_status FROM stockgate.pay_order('{FN}q', 'p', true)")
            .fetch_one(&plain)
            .await
            .unwrap();
    assert_eq!(row.get::<String, _>(0), "COMMITTED");
    assert_eq!(status(a.pool(), "{FN}q").await, "COMMITTED");
    assert_eq!(
        status(b.pool(), "{FN}q").await,
        "PENDING",
        "the other ledger is untouched"
    );
    // A connection whose search_path points at the other ledger still reaches the named one.
    let mut conn = b.pool().acquire().await.unwrap();
    let m = sqlx::query_scalar::<_, String>("SELECT stockgate.cancel_order('{FN}q')")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| sql_error(&e))
        .expect_err("cancel a paid order in stockgate")
        .1;
    assert!(m.contains("COMMITTED"), "{m}");
    assert_eq!(
        sqlx::query_scalar::<_, String>("SELECT cancel_order('{FN}q')")
            .fetch_one(&mut *conn)
            .await
            .unwrap(),
        "CANCELLED",
        "unqualified: the connection's own ledger"
    );
    assert_eq!(status(a.pool(), "{FN}q").await, "COMMITTED");
    let in_public: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = 'public' AND p.proname = 'pay_order'",
    )
    .fetch_one(&plain)
    .await
    .unwrap();
    assert_eq!(
        in_public, 0,
        "nothing is created outside the ledger's schema"
    );
}
