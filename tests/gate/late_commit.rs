//! `COMMIT` of a hold past its expiry: refused with `-EXPIRED` unless
//! the caller states, with `VERIFIED`, that the ledger accepted the payment before the
//! deadline; only the sweeper and admin roles may state it. The checkout flow and the
//! sweeper's cleanup of paid orders send the verified form.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use redis::Value;
use stockgate_client::gate::EngineGate;
use stockgate_client::types::ReservationState;
use stockgate_client::{ClientError, ReservationGate, StockgateClient};
use stockgate_ledger::checkout::PayOutcome;
use stockgate_ledger::ledger::SaleRecord;
use stockgate_ledger::{Checkout, Ledger, SledLedger, Sweeper, SweeperConfig};
use stockgate_server::engine::{Engine, EngineConfig, Keyring, ManualClock, NullSink};

const USERS: &str = "\
boss admin pw-admin
shop checkout pw-shop
broom sweeper pw-broom
";

fn err_code(r: &redis::RedisResult<Value>) -> Option<String> {
    match r {
        Err(e) => e.code().map(str::to_string),
        Ok(Value::ServerError(e)) => Some(e.code().to_string()),
        Ok(_) => None,
    }
}

async fn conn_as(srv: &Server, user: &str, pass: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{user}:{pass}@{}/", srv.addr))
        .unwrap()
        .get_multiplexed_tokio_connection()
        .await
        .expect("auth connect")
}

async fn reserve(
    c: &mut redis::aio::MultiplexedConnection,
    keys: &Keyring,
    sku: &str,
    user: &str,
) -> String {
    let adm = keys.mint(sku, user, now_ms() + 60_000);
    let v = cmd(c, &["RESERVE", sku, user, &adm, &format!("r-{user}")])
        .await
        .unwrap();
    let Value::Array(items) = v else {
        panic!("RESERVE: {v:?}")
    };
    as_str(&items[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_commit_needs_verified_and_a_ledger_role() {
    let dir = TempDir::new("late-commit");
    let f = dir.path().join("users");
    std::fs::write(&f, USERS).unwrap();
    let srv = Server::start(&["--users-file", f.to_str().unwrap()]);
    let keys = srv.keyring();
    let mut admin = conn_as(&srv, "boss", "pw-admin").await;
    let mut shop = conn_as(&srv, "shop", "pw-shop").await;
    let mut broom = conn_as(&srv, "broom", "pw-broom").await;
    cmd(
        &mut admin,
        &["SALE.CREATE", "L", "10", "SHARDS", "1", "TTL", "300"],
    )
    .await
    .unwrap();
    let on_time = reserve(&mut shop, &keys, "L", "a").await;
    let by_sweeper = reserve(&mut shop, &keys, "L", "b").await;
    let by_admin = reserve(&mut shop, &keys, "L", "c").await;
    let by_buyer = reserve(&mut shop, &keys, "L", "d").await;
    // Within the deadline the plain form commits, for the checkout role too.
    assert_eq!(
        cmd(&mut shop, &["COMMIT", &on_time]).await.unwrap(),
        Value::Int(1)
    );
    tokio::time::sleep(Duration::from_millis(450)).await;

    // Late: the plain form is refused for every role, and the reply says how to proceed.
    for c in [&mut shop, &mut broom, &mut admin] {
        let r = cmd(c, &["COMMIT", &by_buyer]).await;
        assert_eq!(err_code(&r).as_deref(), Some("EXPIRED"), "{r:?}");
        let msg = format!("{r:?}");
        assert!(msg.contains("VERIFIED"), "{msg}");
    }
    // The checkout role may not state that the ledger verified the payment.
    let r = cmd(&mut shop, &["COMMIT", &by_buyer, "VERIFIED"]).await;
    assert_eq!(err_code(&r).as_deref(), Some("NOPERM"), "{r:?}");
    // The sweeper and admin roles may (any case, as Redis keywords).
    assert_eq!(
        cmd(&mut broom, &["COMMIT", &by_sweeper, "VERIFIED"])
            .await
            .unwrap(),
        Value::Int(1)
    );
    assert_eq!(
        cmd(&mut admin, &["COMMIT", &by_admin, "verified"])
            .await
            .unwrap(),
        Value::Int(1)
    );
    let r = cmd(&mut admin, &["COMMIT", &by_buyer, "PAID"]).await;
    assert_eq!(err_code(&r).as_deref(), Some("ERR"), "{r:?}");

    let info = cmd(&mut admin, &["SALE.INFO", "L"]).await.unwrap();
    assert_eq!(as_int(&field(&info, "committed").unwrap()), 3);
    assert_eq!(as_int(&field(&info, "reserved").unwrap()), 1);
    assert_eq!(
        cmd(&mut broom, &["RELEASE", &by_buyer]).await.unwrap(),
        Value::Int(1)
    );
}

/// An engine and a ledger whose clocks the test moves apart: the ledger sees the payment
/// in time, the engine sees the COMMIT arrive after the deadline.
struct Split {
    engine_clock: Arc<ManualClock>,
    gate: EngineGate,
    ledger: SledLedger,
    keys: Keyring,
}

const T0: i64 = 1_700_000_000_000;

async fn split(sku: &str) -> Split {
    let engine_clock = Arc::new(ManualClock::new(T0 as u64));
    let keys = Keyring::parse(&Keyring::generate_file_text()).unwrap();
    let engine = Arc::new(Engine::new(
        EngineConfig::default(),
        engine_clock.clone(),
        Arc::new(NullSink),
        keys.clone(),
        stockgate_server::engine::ReservationKey::from_bytes(&[7u8; 32]),
    ));
    engine
        .create_sale(sku, 5, Some(1), Some(1_000), None)
        .unwrap();
    let ledger_now = Arc::new(AtomicI64::new(T0));
    let ledger = SledLedger::temporary()
        .unwrap()
        .with_clock(Arc::new(move || ledger_now.load(Ordering::SeqCst)));
    let mut rec = SaleRecord::new(sku, 5);
    rec.key_fingerprint = Some(engine.key_fingerprint().to_string());
    ledger.register_sale(&rec).await.unwrap();
    Split {
        engine_clock,
        gate: EngineGate::new(engine),
        ledger,
        keys,
    }
}

#[tokio::test]
async fn checkout_commits_a_payment_the_ledger_accepted_before_the_deadline() {
    let s = split("RACE").await;
    let checkout = Checkout::new(s.ledger.clone(), s.gate.clone());
    let adm = s.keys.mint("RACE", "alice", T0 as u64 + 60_000);
    let hold = checkout
        .start("RACE", "alice", &adm, "r1", 1)
        .await
        .unwrap();
    // The ledger's clock still reads T0 (payment in time); the COMMIT reaches the engine
    // after the hold's deadline.
    s.engine_clock.advance(5_000);
    assert!(matches!(
        s.gate.commit(&hold.token).await,
        Err(ClientError::Expired)
    ));
    assert_eq!(
        checkout.pay(&hold.token, "psp-1", true).await.unwrap(),
        PayOutcome::Committed {
            server_confirmed: true
        }
    );
    let r = s.gate.reservation(&hold.token).await.unwrap().unwrap();
    assert_eq!(r.state, ReservationState::Committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_role_leaves_a_late_verified_payment_to_the_sweeper() {
    let dir = TempDir::new("late-commit-flow");
    let f = dir.path().join("users");
    std::fs::write(&f, USERS).unwrap();
    let srv = Server::start(&["--users-file", f.to_str().unwrap()]);
    let keys = srv.keyring();
    let url = |u: &str, p: &str| format!("redis://{u}:{p}@{}/", srv.addr);
    let admin = StockgateClient::connect(&url("boss", "pw-admin"))
        .await
        .unwrap();
    let shop = StockgateClient::connect(&url("shop", "pw-shop"))
        .await
        .unwrap();
    admin
        .sale_create("FLOW", 5, Some(1), Some(300), None)
        .await
        .unwrap();
    let info = admin.sale_info("FLOW").await.unwrap();
    let ledger_now = Arc::new(AtomicI64::new(0));
    let frozen = ledger_now.clone();
    let ledger = SledLedger::temporary()
        .unwrap()
        .with_clock(Arc::new(move || match frozen.load(Ordering::SeqCst) {
            0 => stockgate_client::types::now_ms(),
            t => t,
        }));
    let mut rec = SaleRecord::new("FLOW", 5);
    rec.key_fingerprint = Some(info.key_fingerprint);
    ledger.register_sale(&rec).await.unwrap();

    let checkout = Checkout::new(ledger.clone(), shop.clone());
    let adm = keys.mint("FLOW", "bob", now_ms() + 60_000);
    let on_time = checkout.start("FLOW", "bob", &adm, "r1", 1).await.unwrap();
    let adm = keys.mint("FLOW", "eve", now_ms() + 60_000);
    let late = checkout.start("FLOW", "eve", &adm, "r1", 1).await.unwrap();
    // In time: committed at once, though this role may not send VERIFIED.
    assert_eq!(
        checkout.pay(&on_time.token, "psp-1", true).await.unwrap(),
        PayOutcome::Committed {
            server_confirmed: true
        }
    );
    // Accepted by the ledger while the hold was live; its COMMIT arrives late.
    ledger_now.store(stockgate_client::types::now_ms(), Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        checkout.pay(&late.token, "psp-2", true).await.unwrap(),
        PayOutcome::Committed {
            server_confirmed: false
        }
    );
    let r = shop.reservation(&late.token).await.unwrap().unwrap();
    assert_eq!(r.state, ReservationState::Reserved);
    // The sweeper's cleanup of paid orders commits it, with VERIFIED (its pass reads
    // SALE.INFO, so it runs as admin).
    ledger_now.store(0, Ordering::SeqCst);
    let sweeper = Sweeper::new(
        ledger.clone(),
        admin.clone(),
        SweeperConfig {
            skus: Some(vec!["FLOW".into()]),
            ..Default::default()
        },
    );
    let report = sweeper.run_pass().await.unwrap();
    assert_eq!(report.commit_cleanup, 1, "{report:?}");
    let r = shop.reservation(&late.token).await.unwrap().unwrap();
    assert_eq!(r.state, ReservationState::Committed);
    let info = admin.sale_info("FLOW").await.unwrap();
    assert_eq!((info.committed, info.reserved, info.available), (2, 0, 3));
}
