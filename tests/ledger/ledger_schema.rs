//! The Postgres ledger in a schema of its own (`--schema`, default `stockgate`): where its
//! tables land, two ledgers side by side in one database, and the move of a ledger of
//! the old layout (everything in `public`) by `stockgate-sweeper migrate`, which every
//! other start refuses until then. Real Postgres, real binaries.

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use stockgate_testkit::sibling_binary as bin;

use sqlx::Row;
use stockgate_client::types::now_ms;
use stockgate_ledger::ledger::pg_schema::{
    SchemaError, LEDGER_FUNCTIONS, LEDGER_TABLES, SCHEMA_ENV,
};
use stockgate_ledger::ledger::postgres::{PgLedger, PgLedgerOptions};
use stockgate_ledger::ledger::{LedgerCommit, Materialized, NewOrder, SaleRecord};
use stockgate_ledger::{Ledger, LedgerError, OrderStatus};
use stockgate_testkit::pgtemp::TempPostgres;

async fn ledger_in(url: &str, schema: &str) -> PgLedger {
    PgLedger::connect_with(
        url,
        PgLedgerOptions {
            schema: schema.to_string(),
            ..Default::default()
        },
    )
    .await
    .expect("connect")
}

/// A connection with the server's default search_path, to look at the catalog.
async fn admin(url: &str) -> sqlx::PgPool {
    sqlx::PgPool::connect(url).await.expect("admin connect")
}

async fn tables(pool: &sqlx::PgPool, schema: &str) -> BTreeSet<String> {
    sqlx::query("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
        .bind(schema)
        .fetch_all(pool)
        .await
        .expect("pg_tables")
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect()
}

async fn functions(pool: &sqlx::PgPool, schema: &str) -> BTreeSet<String> {
    sqlx::query(
        "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = $1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .expect("pg_proc")
    .iter()
    .map(|r| r.get::<String, _>(0))
    .collect()
}

fn new_order(sku: &str, tag: &str) -> NewOrder {
    let now = now_ms();
    NewOrder {
        token: format!("{{{sku}}}{tag}"),
        sku: sku.into(),
        user: format!("user-{tag}"),
        request_id: format!("req-{tag}"),
        qty: 1,
        expires_at_ms: now + 600_000,
        created_at_ms: now - 10,
    }
}

/// A tool run against `url` with `args`, the schema variable cleared so only the
/// arguments decide. Port 1 for the server: these runs must fail or finish before they
/// would need one.
fn tool(name: &str, url: &str, args: &[&str]) -> Output {
    Command::new(bin(name))
        .args(["--database-url", url, "--server", "127.0.0.1:1"])
        .args(args)
        .env_remove(SCHEMA_ENV)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run tool")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_schema_is_stockgate_and_holds_everything() {
    let pg = TempPostgres::start().await.expect("postgres");
    let l = PgLedger::connect(pg.url()).await.expect("connect");
    assert_eq!(l.schema(), "stockgate");
    l.migrate().await.expect("migrate");
    l.migrate().await.expect("migrate is idempotent");
    l.register_sale(&SaleRecord::new("DEF", 5)).await.unwrap();

    let a = admin(pg.url()).await;
    // Every table, sqlx's bookkeeping included, is in the schema; the list the move
    // from public takes along is exactly what the migrations create.
    let want: BTreeSet<String> = LEDGER_TABLES.iter().map(|t| t.to_string()).collect();
    assert_eq!(tables(&a, "stockgate").await, want);
    assert!(tables(&a, "public").await.is_empty(), "nothing in public");
    // The functions too: the trigger functions of the ledger's tables (what the move
    // finds through the triggers) and the ledger's rule functions (LEDGER_FUNCTIONS).
    let fns = functions(&a, "stockgate").await;
    assert!(!fns.is_empty());
    assert!(functions(&a, "public").await.is_empty());
    let trigger_fns: BTreeSet<String> = sqlx::query(
        "SELECT DISTINCT p.proname::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid \
         JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'stockgate' AND NOT t.tgisinternal",
    )
    .fetch_all(&a)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<String, _>(0))
    .collect();
    let mut want_fns = trigger_fns;
    want_fns.extend(LEDGER_FUNCTIONS.iter().map(|f| f.to_string()));
    assert_eq!(fns, want_fns);
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM stockgate._sqlx_migrations")
        .fetch_one(&a)
        .await
        .unwrap();
    assert_eq!(
        applied as usize,
        stockgate_ledger::ledger::postgres::migrator()
            .migrations
            .len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schemas_in_one_database_do_not_see_each_other() {
    let pg = TempPostgres::start().await.expect("postgres");
    let a = ledger_in(pg.url(), "shop_a").await;
    let b = ledger_in(pg.url(), "shop_b").await;
    a.migrate().await.expect("migrate a");
    b.migrate().await.expect("migrate b");

    // The same sku with another allocation in each: no conflict, each keeps its own.
    a.register_sale(&SaleRecord::new("TWIN", 10)).await.unwrap();
    b.register_sale(&SaleRecord::new("TWIN", 99)).await.unwrap();
    assert_eq!(a.sale("TWIN").await.unwrap().unwrap().allocation, 10);
    assert_eq!(b.sale("TWIN").await.unwrap().unwrap().allocation, 99);

    let o = new_order("TWIN", "x");
    assert_eq!(a.materialize(&o).await.unwrap(), Materialized::Created);
    assert_eq!(
        a.commit(&o.token, "pay").await.unwrap(),
        LedgerCommit::Committed
    );
    assert!(
        b.order(&o.token).await.unwrap().is_none(),
        "b sees a's order"
    );
    assert_eq!(b.materialize(&o).await.unwrap(), Materialized::Created);
    assert_eq!(
        b.order(&o.token).await.unwrap().unwrap().status,
        OrderStatus::Pending
    );
    assert_eq!(
        a.order(&o.token).await.unwrap().unwrap().status,
        OrderStatus::Committed
    );
    assert_eq!(a.totals("TWIN").await.unwrap().committed_units, 1);
    assert_eq!(b.totals("TWIN").await.unwrap().committed_units, 0);
    // Raw SQL through each pool reaches its own schema only.
    for (l, schema) in [(&a, "shop_a"), (&b, "shop_b")] {
        let s: String = sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(l.pool())
            .await
            .unwrap();
        assert_eq!(s, schema);
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM order_events")
            .fetch_one(l.pool())
            .await
            .unwrap();
        assert_eq!(n, if schema == "shop_a" { 2 } else { 1 });
    }
    let adm = admin(pg.url()).await;
    assert!(tables(&adm, "public").await.is_empty());
    assert!(tables(&adm, "stockgate").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_take_the_schema_from_the_flag_or_the_environment() {
    let pg = TempPostgres::start().await.expect("postgres");
    let o = tool(
        "stockgate-sweeper",
        pg.url(),
        &["migrate", "--schema", "shop_ledger"],
    );
    assert!(o.status.success(), "migrate --schema: {}", stderr(&o));
    let o = Command::new(bin("stockgate-sweeper"))
        .args(["--database-url", pg.url(), "migrate"])
        .env(SCHEMA_ENV, "from_env")
        .output()
        .expect("run");
    assert!(
        o.status.success(),
        "migrate with {SCHEMA_ENV}: {}",
        stderr(&o)
    );
    let a = admin(pg.url()).await;
    assert!(tables(&a, "shop_ledger").await.contains("orders"));
    assert!(tables(&a, "from_env").await.contains("_sqlx_migrations"));
    assert!(tables(&a, "stockgate").await.is_empty());
    assert!(tables(&a, "public").await.is_empty());

    // A name that is not a plain identifier is refused before anything is touched, in
    // words, by every tool that opens the ledger.
    for name in ["stockgate-sweeper", "stockgate-materializer"] {
        for bad in ["Shop", "shop-ledger", "a;drop table orders", "pg_x", ""] {
            let o = tool(name, pg.url(), &["--schema", bad]);
            assert_eq!(o.status.code(), Some(2), "{name} --schema {bad:?}");
            let err = stderr(&o);
            assert!(err.contains("--schema"), "{name} {bad:?}: {err}");
            assert!(
                ["lowercase", "reserved", "empty"]
                    .iter()
                    .any(|w| err.contains(w)),
                "{name} {bad:?}: {err}"
            );
        }
    }
    let schemas: BTreeSet<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname NOT LIKE 'pg_%'")
            .fetch_all(&a)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let want: BTreeSet<String> = ["from_env", "information_schema", "public", "shop_ledger"]
        .map(String::from)
        .into();
    assert_eq!(schemas, want, "only the schemas asked for");
}

/// A ledger as the code before the schema option made it: the migrations run with
/// search_path = public, then some life in it.
async fn old_public_ledger(url: &str) -> Vec<NewOrder> {
    let old = ledger_in(url, "public").await;
    old.migrate().await.expect("old layout");
    let mut sale = SaleRecord::new("OLD", 100);
    sale.key_fingerprint = Some("fp".into());
    old.register_sale(&sale).await.unwrap();
    old.record_adjustment("OLD", "adj-1", -3).await.unwrap();
    let orders: Vec<NewOrder> = (0..5).map(|i| new_order("OLD", &format!("o{i}"))).collect();
    for o in &orders {
        old.materialize(o).await.unwrap();
    }
    old.commit(&orders[0].token, "pay-0").await.unwrap();
    old.cancel(&orders[1].token).await.unwrap();
    sqlx::query(
        "INSERT INTO feed_position (consumer, stream, last_lsn) VALUES ('materializer', 's', 42)",
    )
    .execute(old.pool())
    .await
    .unwrap();
    old.pool().close().await;
    orders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_in_public_is_refused_then_moved_by_migrate_with_its_rows() {
    let pg = TempPostgres::start().await.expect("postgres");
    let orders = old_public_ledger(pg.url()).await;
    let a = admin(pg.url()).await;
    let public_before = tables(&a, "public").await;
    let want: BTreeSet<String> = LEDGER_TABLES.iter().map(|t| t.to_string()).collect();
    assert_eq!(public_before, want);

    // A normal start refuses, says what to run, and creates nothing.
    let l = PgLedger::connect(pg.url()).await.expect("connect");
    let e = l.migrate().await.expect_err("a ledger only in public");
    assert!(
        matches!(
            &e,
            LedgerError::Schema(SchemaError::OldLayout { found_in, .. }) if found_in == "public"
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("stockgate-sweeper migrate --schema stockgate"),
        "{msg}"
    );
    for (name, args) in [
        ("stockgate-sweeper", &["run", "--once"][..]),
        (
            "stockgate-sweeper",
            &["create-sale", "--sku", "NEW", "--total", "1"][..],
        ),
        ("stockgate-materializer", &["--drain"][..]),
    ] {
        let o = tool(name, pg.url(), args);
        assert!(!o.status.success(), "{name} {args:?} must refuse");
        let err = stderr(&o);
        assert!(
            err.contains("schema public")
                && err.contains("stockgate-sweeper migrate --schema stockgate"),
            "{name} {args:?}: {err}"
        );
    }
    assert!(tables(&a, "stockgate").await.is_empty());
    assert_eq!(tables(&a, "public").await, public_before);

    // `migrate` moves it, says so in one line, and a second run has nothing to move.
    let o = tool("stockgate-sweeper", pg.url(), &["migrate"]);
    let err = stderr(&o);
    assert!(o.status.success(), "migrate: {err}");
    let moved: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("moved the ledger from schema public to schema stockgate"))
        .collect();
    assert_eq!(moved.len(), 1, "{err}");
    assert!(moved[0].contains("5 orders"), "{err}");
    let o = tool("stockgate-sweeper", pg.url(), &["migrate"]);
    assert!(o.status.success(), "second migrate: {}", stderr(&o));
    assert!(!stderr(&o).contains("moved the ledger"), "{}", stderr(&o));

    assert_eq!(tables(&a, "stockgate").await, want);
    assert!(tables(&a, "public").await.is_empty(), "public emptied");
    assert!(
        functions(&a, "public").await.is_empty(),
        "functions moved too"
    );
    assert!(!functions(&a, "stockgate").await.is_empty());

    // Rows intact.
    let l = PgLedger::connect(pg.url()).await.expect("connect");
    l.migrate().await.expect("a normal start now works");
    let sale = l.sale("OLD").await.unwrap().expect("sale moved");
    assert_eq!((sale.initial_allocation, sale.allocation), (100, 97));
    assert_eq!(sale.key_fingerprint.as_deref(), Some("fp"));
    assert!(l.adjustment("adj-1").await.unwrap().is_some());
    assert_eq!(
        l.order(&orders[0].token).await.unwrap().unwrap().status,
        OrderStatus::Committed
    );
    assert_eq!(
        l.order(&orders[1].token).await.unwrap().unwrap().status,
        OrderStatus::Cancelled
    );
    assert_eq!(
        l.orders("OLD", Some(OrderStatus::Pending))
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(l.events(&orders[0].token).await.unwrap().len(), 2);
    let lsn: i64 = sqlx::query_scalar("SELECT last_lsn FROM feed_position")
        .fetch_one(l.pool())
        .await
        .unwrap();
    assert_eq!(lsn, 42);

    // Still a working ledger: the sequences went along, the triggers still guard.
    let o = new_order("OLD", "after");
    assert_eq!(l.materialize(&o).await.unwrap(), Materialized::Created);
    assert_eq!(
        l.commit(&o.token, "pay").await.unwrap(),
        LedgerCommit::Committed
    );
    assert!(sqlx::query("DELETE FROM orders")
        .execute(l.pool())
        .await
        .is_err());
    assert!(sqlx::query("UPDATE order_events SET actor = 'x'")
        .execute(l.pool())
        .await
        .is_err());
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
        .fetch_all(l.pool())
        .await
        .unwrap();
    assert_eq!(ids, (1..=6).collect::<Vec<i64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_moves_at_once_move_once() {
    let pg = TempPostgres::start().await.expect("postgres");
    old_public_ledger(pg.url()).await;
    let x = PgLedger::connect(pg.url()).await.unwrap();
    let y = PgLedger::connect(pg.url()).await.unwrap();
    let (rx, ry) = tokio::join!(x.migrate_moving_old_layout(), y.migrate_moving_old_layout());
    let (rx, ry) = (rx.expect("first"), ry.expect("second"));
    assert_eq!(
        [rx.is_some(), ry.is_some()].iter().filter(|m| **m).count(),
        1,
        "{rx:?} {ry:?}"
    );
    assert_eq!(x.orders("OLD", None).await.unwrap().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_not_a_stockgate_ledger_in_public_is_left_alone() {
    let pg = TempPostgres::start().await.expect("postgres");
    let a = admin(pg.url()).await;
    // Another application's tables with our names, and sqlx migrations of its own.
    for sql in [
        "CREATE TABLE public.orders (id int)",
        "CREATE TABLE public.sales (id int)",
        "CREATE TABLE public.order_events (id int)",
        "CREATE TABLE public._sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT \
         NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
        "INSERT INTO public._sqlx_migrations VALUES (1, 'theirs', now(), true, '\\x00', 1)",
        "INSERT INTO public.orders VALUES (7)",
    ] {
        sqlx::query(sql).execute(&a).await.expect(sql);
    }
    let l = PgLedger::connect(pg.url()).await.unwrap();
    assert_eq!(l.migrate_moving_old_layout().await.expect("migrate"), None);
    l.register_sale(&SaleRecord::new("MINE", 1)).await.unwrap();
    let theirs: i32 = sqlx::query_scalar("SELECT id FROM public.orders")
        .fetch_one(&a)
        .await
        .unwrap();
    assert_eq!(theirs, 7);
    assert!(tables(&a, "stockgate").await.contains("orders"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_into_a_schema_with_a_clashing_table_moves_nothing() {
    let pg = TempPostgres::start().await.expect("postgres");
    old_public_ledger(pg.url()).await;
    let a = admin(pg.url()).await;
    sqlx::query("CREATE SCHEMA taken")
        .execute(&a)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE taken.orders (id int)")
        .execute(&a)
        .await
        .unwrap();
    let l = ledger_in(pg.url(), "taken").await;
    let e = l.migrate_moving_old_layout().await.expect_err("clash");
    assert!(
        matches!(&e, LedgerError::Schema(SchemaError::Occupied { table, .. }) if table == "orders"),
        "{e:?}"
    );
    assert!(e.to_string().contains("already has a table orders"), "{e}");
    assert_eq!(tables(&a, "taken").await.len(), 1);
    assert_eq!(tables(&a, "public").await.len(), LEDGER_TABLES.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_in_the_users_own_schema_is_found_there_too() {
    // With a schema named after the user, the default search_path ("$user", public) put
    // the old ledger there, not in public.
    let pg = TempPostgres::start().await.expect("postgres");
    let a = admin(pg.url()).await;
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&a)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE SCHEMA \"{user}\""))
        .execute(&a)
        .await
        .unwrap();
    let old = ledger_in(pg.url(), &user).await;
    old.migrate().await.expect("old layout");
    old.materialize(&new_order("USR", "a")).await.unwrap();
    old.pool().close().await;

    let e = PgLedger::connect(pg.url())
        .await
        .unwrap()
        .migrate()
        .await
        .expect_err("refused");
    assert!(
        e.to_string()
            .contains(&format!("the ledger is in schema {user}")),
        "{e}"
    );
    let o = tool("stockgate-sweeper", pg.url(), &["migrate"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "moved the ledger from schema {user} to schema stockgate"
        )),
        "{err}"
    );
    assert!(tables(&a, &user).await.is_empty());

    // An old-version tool started after the move makes a ledger there again: the tools
    // keep using theirs and say so.
    let stray = ledger_in(pg.url(), &user).await;
    stray.migrate().await.unwrap();
    let o = tool("stockgate-sweeper", pg.url(), &["migrate"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "schema {user} also holds a stockgate ledger; it is not used"
        )),
        "{err}"
    );
    let l = PgLedger::connect(pg.url()).await.unwrap();
    assert_eq!(l.orders("USR", None).await.unwrap().len(), 1);
}
