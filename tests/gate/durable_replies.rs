//! Every reply that reports a state leaves only once the record that made that state is
//! durable, also when the reply itself changes nothing: an idempotent
//! `SALE.CREATE`, a `SALE.PAUSE` of a paused sale, `SALE.ADJUST 0`, `COMMIT` → `-RELEASED`,
//! `EXTEND` → `-NORES` / `-EXPIRED`, `RESERVE` → `LIMIT`.
//!
//! Each case: the real binary under `--fsync always` with the WAL writer held back by
//! fault injection (`STOCKGATE_FAULT_WAL_DELAY_MS`), so connection A's change is "in
//! flight" (in memory, not on disk) for over a second. Connection B then sends the
//! command whose reply reports A's state; as soon as B's reply arrives the server is
//! killed with SIGKILL and restarted on the same data dir. The state B was told of must be
//! there. A server that answers B at once (before A's record is on disk) loses it.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use redis::Value;

const DELAY_MS: &str = "1200";

fn always() -> Vec<&'static str> {
    vec!["--fsync", "always"]
}

/// A server on `dir` whose WAL writes are held back.
fn slow_server(dir: &Path) -> Server {
    Server::start_in_env(
        dir,
        &always(),
        &[("STOCKGATE_FAULT_WAL_DELAY_MS", DELAY_MS)],
    )
}

/// Sends `a` on one connection without waiting, waits a little so it is applied in
/// memory, then runs `b` on another connection and returns its reply; then SIGKILL.
async fn race(dir: &Path, a: Vec<String>, b: Vec<String>) -> redis::RedisResult<Value> {
    let mut s = slow_server(dir);
    let mut ca = s.conn().await;
    let mut cb = s.conn().await;
    let first = tokio::spawn(async move {
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        cmd(&mut ca, &args).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let args: Vec<&str> = b.iter().map(String::as_str).collect();
    let reply = cmd(&mut cb, &args).await;
    s.kill9();
    first.abort();
    reply
}

fn v(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Sets up state on a normal server, then stops it cleanly.
async fn setup(dir: &Path, f: impl AsyncFnOnce(&mut redis::aio::MultiplexedConnection, &Server)) {
    let mut s = Server::start_in(dir, &always());
    let mut c = s.conn().await;
    f(&mut c, &s).await;
    assert_eq!(s.terminate(), Some(0));
}

async fn reserve(
    c: &mut redis::aio::MultiplexedConnection,
    s: &Server,
    user: &str,
    rid: &str,
) -> String {
    let adm = s.keyring().mint("S", user, now_ms() + 60_000);
    let r = cmd(c, &["RESERVE", "S", user, &adm, rid]).await.unwrap();
    match r {
        Value::Array(items) => {
            assert_eq!(as_str(&items[0]), "RESERVED");
            as_str(&items[1])
        }
        other => panic!("{other:?}"),
    }
}

async fn after_restart(dir: &Path) -> (Server, redis::aio::MultiplexedConnection) {
    let s = Server::start_in(dir, &always());
    let c = s.conn().await;
    (s, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_create_waits_for_the_creation_record() {
    let dir = TempDir::new("dur-create");
    let create = v(&["SALE.CREATE", "S", "10"]);
    let r = race(dir.path(), create.clone(), create).await;
    assert_eq!(r.unwrap(), Value::Okay);
    let (_s, mut c) = after_restart(dir.path()).await;
    let info = cmd(&mut c, &["SALE.INFO", "S"]).await;
    assert!(
        info.is_ok(),
        "the sale acknowledged with +OK is gone: {info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_changes_nothing_waits_for_the_pause() {
    let dir = TempDir::new("dur-pause");
    setup(dir.path(), async |c, _| {
        cmd(c, &["SALE.CREATE", "S", "10"]).await.unwrap();
    })
    .await;
    let pause = v(&["SALE.PAUSE", "S"]);
    assert_eq!(
        race(dir.path(), pause.clone(), pause).await.unwrap(),
        Value::Okay
    );
    let (_s, mut c) = after_restart(dir.path()).await;
    let info = cmd(&mut c, &["SALE.INFO", "S"]).await.unwrap();
    assert_eq!(as_str(&field(&info, "state").unwrap()), "PAUSED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjust_zero_waits_for_the_total_it_reports() {
    let dir = TempDir::new("dur-adjust");
    setup(dir.path(), async |c, _| {
        cmd(c, &["SALE.CREATE", "S", "10"]).await.unwrap();
    })
    .await;
    let r = race(
        dir.path(),
        v(&["SALE.ADJUST", "S", "5"]),
        v(&["SALE.ADJUST", "S", "0"]),
    )
    .await;
    assert_eq!(r.unwrap(), Value::Int(15));
    let (_s, mut c) = after_restart(dir.path()).await;
    let info = cmd(&mut c, &["SALE.INFO", "S"]).await.unwrap();
    assert_eq!(as_int(&field(&info, "total").unwrap()), 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_refused_as_released_waits_for_the_release() {
    let dir = TempDir::new("dur-commit");
    let mut token = String::new();
    setup(dir.path(), async |c, s| {
        cmd(c, &["SALE.CREATE", "S", "10"]).await.unwrap();
        token = reserve(c, s, "alice", "r1").await;
    })
    .await;
    let r = race(dir.path(), v(&["RELEASE", &token]), v(&["COMMIT", &token])).await;
    let err = r.expect_err("COMMIT of a released reservation");
    assert_eq!(err.code(), Some("RELEASED"), "{err:?}");
    let (_s, mut c) = after_restart(dir.path()).await;
    let res = cmd(&mut c, &["RESERVATION", &token]).await.unwrap();
    assert_eq!(as_str(&field(&res, "state").unwrap()), "RELEASED");
    // And it can no longer be committed: the unit is back in stock.
    assert!(cmd(&mut c, &["COMMIT", &token]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_refused_waits_for_the_state_it_reports() {
    let dir = TempDir::new("dur-extend");
    let mut released = String::new();
    let mut expiring = String::new();
    setup(dir.path(), async |c, s| {
        cmd(c, &["SALE.CREATE", "S", "10"]).await.unwrap();
        released = reserve(c, s, "alice", "r1").await;
        expiring = reserve(c, s, "bob", "r2").await;
    })
    .await;
    // -NORES: reported because a RELEASE (in flight) finished it.
    let r = race(
        dir.path(),
        v(&["RELEASE", &released]),
        v(&["EXTEND", &released, "60000"]),
    )
    .await;
    assert_eq!(r.expect_err("NORES").code(), Some("NORES"));
    {
        let (mut s, mut c) = after_restart(dir.path()).await;
        let res = cmd(&mut c, &["RESERVATION", &released]).await.unwrap();
        assert_eq!(as_str(&field(&res, "state").unwrap()), "RELEASED");
        assert_eq!(s.terminate(), Some(0));
    }
    // -EXPIRED: reported because an EXTEND (in flight) moved the deadline to "soon".
    let r = race(
        dir.path(),
        v(&["EXTEND", &expiring, "50"]),
        v(&["EXTEND", &expiring, "60000"]),
    )
    .await;
    assert_eq!(r.expect_err("EXPIRED").code(), Some("EXPIRED"));
    let (_s, mut c) = after_restart(dir.path()).await;
    let res = cmd(&mut c, &["RESERVATION", &expiring]).await.unwrap();
    let exp = as_int(&field(&res, "expires_at_ms").unwrap()) as u64;
    assert!(
        exp <= now_ms(),
        "the short EXTEND the -EXPIRED reported was lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_names_only_tokens_that_survive() {
    let dir = TempDir::new("dur-limit");
    let mut adm = String::new();
    setup(dir.path(), async |c, s| {
        cmd(c, &["SALE.CREATE", "S", "10", "LIMIT", "1"])
            .await
            .unwrap();
        adm = s.keyring().mint("S", "alice", now_ms() + 120_000);
    })
    .await;
    let r = race(
        dir.path(),
        v(&["RESERVE", "S", "alice", &adm, "r1"]),
        v(&["RESERVE", "S", "alice", &adm, "r2"]),
    )
    .await
    .unwrap();
    let Value::Array(items) = r else {
        panic!("{r:?}")
    };
    assert_eq!(as_str(&items[0]), "LIMIT");
    assert_eq!(items.len(), 2, "LIMIT names the live reservation");
    let live = as_str(&items[1]);
    let (_s, mut c) = after_restart(dir.path()).await;
    let res = cmd(&mut c, &["RESERVATION", &live]).await.unwrap();
    assert_ne!(res, Value::Nil, "LIMIT named a token that a crash erased");
}
