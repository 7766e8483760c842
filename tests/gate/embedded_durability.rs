//! The embedded gate acknowledges only what its engine's log made durable.
//!
//! An engine embedded in a checkout service, writing its own WAL (the server crate's `wal`
//! and `persist` modules), whose writer is slowed down with the WAL's fault-injection delay
//! so every record stays "in flight" for a while. After every `EngineGate` call the log
//! must be durable up to the highest LSN the engine assigned: the call's own record, or,
//! for answers without one (an error such as RELEASED, LIMIT's list of live tokens, a
//! no-op ADJUST 0, SALE.INFO), whatever record made the state the answer reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use stockgate_client::gate::EngineGate;
use stockgate_client::types::{ReservationState, ReserveOutcome};
use stockgate_client::{ClientError, ReservationGate};
use stockgate_server::engine::{Engine, EngineConfig, Keyring, ReservationKey, SystemClock};
use stockgate_server::persist::{recover_engine, WalDurability};
use stockgate_server::wal::{FsyncPolicy, WalOptions};
use stockgate_testkit::TempDir;

/// How long the WAL writer sleeps before writing each batch.
const WRITE_DELAY_MS: u64 = 150;
const SKU: &str = "EMBDUR";

struct Embedded {
    _dir: TempDir,
    data: std::path::PathBuf,
    keyring: Keyring,
    engine: Arc<Engine>,
    durability: Arc<WalDurability>,
}

fn open(fsync: FsyncPolicy) -> Embedded {
    let dir = TempDir::new("sg-embdur").expect("temp dir");
    let data = dir.path().join("data");
    let keyring = Keyring::parse(&Keyring::generate_file_text()).expect("keyring");
    let rkey = ReservationKey::from_bytes(&rand::random());
    let opts = WalOptions {
        fsync,
        fault_write_delay_ms: WRITE_DELAY_MS,
        ..WalOptions::default()
    };
    let (engine, durability, _report) = recover_engine(
        &data,
        opts,
        EngineConfig::default(),
        Arc::new(SystemClock::new()),
        keyring.clone(),
        rkey,
    )
    .expect("open the WAL");
    Embedded {
        _dir: dir,
        data,
        keyring,
        engine,
        durability,
    }
}

impl Embedded {
    fn admission(&self, user: &str) -> String {
        self.keyring.mint(SKU, user, self.engine.now_ms() + 60_000)
    }

    /// The property: everything the engine has logged so far is durable.
    #[track_caller]
    fn assert_durable(&self, what: &str) {
        let last = self.engine.last_lsn();
        let durable = self.durability.wal.durable_lsn();
        assert!(
            durable >= last,
            "{what}: the gate answered while LSN {last} was in flight (durable up to {durable})"
        );
    }
}

async fn every_answer_waits_for_its_state(fsync: FsyncPolicy) {
    let e = open(fsync);
    let gate = EngineGate::with_durability(e.engine.clone(), e.durability.clone());
    // The sale, with a per-user limit of 1, created by the application directly.
    e.engine
        .create_sale(SKU, 10, Some(2), Some(60_000), Some(1))
        .expect("create sale");

    // A new reservation: its own LSN.
    let t0 = Instant::now();
    let out = gate
        .reserve(SKU, "alice", &e.admission("alice"), "r1", 1)
        .await
        .expect("reserve");
    let ReserveOutcome::Reserved { token, .. } = out else {
        panic!("expected RESERVED, got {out:?}");
    };
    e.assert_durable("RESERVE → RESERVED");
    assert!(
        t0.elapsed() >= Duration::from_millis(WRITE_DELAY_MS / 2),
        "the slow writer must be felt, or this test proves nothing"
    );
    // What a crash right now would leave: a copy of the data dir recovers the hold.
    let copy = e.data.with_extension("copy");
    copy_dir(&e.data, &copy);
    std::fs::remove_file(copy.join("wal").join("LOCK")).ok();
    let (_wal, rec) =
        stockgate_server::wal::Wal::open(&copy, WalOptions::default()).expect("recover the copy");
    assert!(
        rec.events
            .iter()
            .any(|ev| format!("{ev:?}").contains(&token)),
        "the acknowledged reservation is in the log on disk"
    );

    // A read: RESERVATION carries the record's LSN.
    let r = gate.reservation(&token).await.expect("reservation");
    assert_eq!(r.map(|r| r.state), Some(ReservationState::Reserved));
    e.assert_durable("RESERVATION");

    // LIMIT names live tokens: another reservation of this user, whose record is still in
    // flight (made by the engine directly, as another task of the service would).
    assert!(e.engine.release(&token).0);
    let (other, _) = e
        .engine
        .reserve(&stockgate_server::engine::ReserveRequest {
            sku: SKU,
            user: "alice",
            admission: e.admission("alice").as_bytes(),
            request_id: "r2",
            qty: 1,
        })
        .expect("reserve directly");
    assert!(matches!(
        other,
        stockgate_server::engine::ReserveOutcome::Reserved { .. }
    ));
    let out = gate
        .reserve(SKU, "alice", &e.admission("alice"), "r3", 1)
        .await
        .expect("reserve");
    assert!(
        matches!(out, ReserveOutcome::Limit { ref live_tokens, .. } if live_tokens.len() == 1),
        "{out:?}"
    );
    e.assert_durable("RESERVE → LIMIT");

    // An error that reports a state: COMMIT of a reservation released a moment ago by
    // someone else (its RELEASED record still in flight).
    let (_, other_lsn) = e
        .engine
        .reserve(&stockgate_server::engine::ReserveRequest {
            sku: SKU,
            user: "bob",
            admission: e.admission("bob").as_bytes(),
            request_id: "b1",
            qty: 1,
        })
        .expect("reserve bob");
    assert!(other_lsn > 0);
    let bob = e.engine.reservation_token(SKU, "bob", "b1");
    let (released, _) = e.engine.release(&bob);
    assert!(released);
    assert!(matches!(
        gate.commit(&bob).await,
        Err(ClientError::Released)
    ));
    e.assert_durable("COMMIT → -RELEASED");

    // "Already released" (RELEASE :0) and EXTEND → -NORES after a release in flight.
    let (_, _) = e
        .engine
        .reserve(&stockgate_server::engine::ReserveRequest {
            sku: SKU,
            user: "carol",
            admission: e.admission("carol").as_bytes(),
            request_id: "c1",
            qty: 1,
        })
        .expect("reserve carol");
    let carol = e.engine.reservation_token(SKU, "carol", "c1");
    assert!(e.engine.release(&carol).0);
    assert!(!gate.release(&carol, None).await.expect("release"));
    e.assert_durable("RELEASE → :0");
    let (_, _) = e
        .engine
        .reserve(&stockgate_server::engine::ReserveRequest {
            sku: SKU,
            user: "dave",
            admission: e.admission("dave").as_bytes(),
            request_id: "d1",
            qty: 1,
        })
        .expect("reserve dave");
    let dave = e.engine.reservation_token(SKU, "dave", "d1");
    assert!(e.engine.release(&dave).0);
    assert!(matches!(
        gate.extend(&dave, 1000).await,
        Err(ClientError::NoReservation)
    ));
    e.assert_durable("EXTEND → -NORES");

    // A no-op ADJUST and SALE.INFO report a total another change just made.
    e.engine.adjust(SKU, 5).expect("adjust directly");
    assert_eq!(gate.adjust(SKU, 0).await.expect("adjust 0"), 15);
    e.assert_durable("SALE.ADJUST 0");
    e.engine.adjust(SKU, -1).expect("adjust directly");
    let info = gate.sale_info(SKU).await.expect("info").expect("sale");
    assert_eq!(info.total, 14);
    e.assert_durable("SALE.INFO");
    let _ = std::fs::remove_dir_all(&copy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_gate_waits_for_the_log_fsync_always() {
    every_answer_waits_for_its_state(FsyncPolicy::Always).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_gate_waits_for_the_log_fsync_everysec() {
    every_answer_waits_for_its_state(FsyncPolicy::EverySec).await;
}

fn copy_dir(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).expect("create copy dir");
    for entry in std::fs::read_dir(src).expect("read dir") {
        let entry = entry.expect("dir entry");
        let to = dst.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).expect("copy file");
        }
    }
}
