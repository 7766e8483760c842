//! `ROOM.*`, the waiting room over RESP: 50 buyers queue for a 5-unit sale, joins are
//! idempotent, admissions go first come first served and never past what the stock can
//! serve, an admitted buyer's token passes RESERVE, a release and an expired hold each
//! admit the next buyer, the queue's limit refuses the next join, tickets of another user
//! or altered ones are refused, a `kill -9` and restart keep every place, and a sale sold
//! out with nothing held tells every waiting buyer SOLDOUT.

use std::time::Duration;

use crate::common::*;
use redis::aio::MultiplexedConnection;
use redis::Value;

const SKU: &str = "ROOM-1";
const BUYERS: usize = 50;
const UNITS: usize = 5;

fn user(i: usize) -> String {
    format!("buyer-{i:02}")
}

fn items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items,
        other => panic!("not an array: {other:?}"),
    }
}

fn error_code(r: &redis::RedisResult<Value>) -> String {
    match r {
        Err(e) => e.code().unwrap_or("?").to_string(),
        Ok(Value::ServerError(e)) => e.code().to_string(),
        Ok(v) => panic!("not an error: {v:?}"),
    }
}

async fn join(c: &mut MultiplexedConnection, u: &str) -> (String, i64) {
    let v = items(cmd(c, &["ROOM.JOIN", SKU, u]).await.unwrap());
    assert_eq!(v.len(), 3, "ROOM.JOIN answers [ticket, position, eta_ms]");
    (as_str(&v[0]), as_int(&v[1]))
}

/// The status word and its values, as the reply carries them.
async fn status(c: &mut MultiplexedConnection, u: &str, ticket: &str) -> Vec<Value> {
    items(cmd(c, &["ROOM.STATUS", SKU, u, ticket]).await.unwrap())
}

fn word(s: &[Value]) -> String {
    as_str(&s[0])
}

/// Every buyer's status word and, while waiting, position (the ETA follows the clock).
async fn places(c: &mut MultiplexedConnection, tickets: &[String]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (i, t) in tickets.iter().enumerate() {
        let s = status(c, &user(i), t).await;
        let pos = if word(&s) == "WAITING" {
            as_int(&s[1])
        } else {
            0
        };
        out.push((word(&s), pos));
    }
    out
}

async fn info(c: &mut MultiplexedConnection, name: &str) -> i64 {
    let v = cmd(c, &["ROOM.INFO", SKU]).await.unwrap();
    as_int(&field(&v, name).unwrap_or_else(|| panic!("ROOM.INFO has no {name}: {v:?}")))
}

async fn available(c: &mut MultiplexedConnection) -> i64 {
    as_int(&cmd(c, &["STOCK", SKU]).await.unwrap())
}

/// The admission token an ADMITTED status carries, used for a RESERVE; the hold's token.
async fn reserve_admitted(c: &mut MultiplexedConnection, i: usize, ticket: &str) -> String {
    let s = status(c, &user(i), ticket).await;
    assert_eq!(word(&s), "ADMITTED", "{} is admitted: {s:?}", user(i));
    let admission = as_str(&s[1]);
    let v = items(
        cmd(
            c,
            &["RESERVE", SKU, &user(i), &admission, &format!("req-{i}")],
        )
        .await
        .unwrap(),
    );
    assert_eq!(as_str(&v[0]), "RESERVED", "{v:?}");
    as_str(&v[1])
}

/// Waits until `cond` holds for buyer `i`'s status word (ticks run every 20 ms).
async fn await_word(c: &mut MultiplexedConnection, i: usize, ticket: &str, want: &str) {
    for _ in 0..300 {
        if word(&status(c, &user(i), ticket).await) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} never became {want}", user(i));
}

/// The admitted buyers not yet reserved never outnumber the units left (factor 1.0).
async fn bounded_by_stock(c: &mut MultiplexedConnection) {
    let (admitted, left) = (info(c, "admitted").await, available(c).await);
    assert!(admitted <= left, "{admitted} admitted for {left} units");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_queue_admits_by_stock_and_keeps_places_across_kill9() {
    let dir = TempDir::new("room");
    let mut srv = Server::start_in(dir.path(), &["--auto-release"]);
    let mut c = srv.conn().await;
    cmd(
        &mut c,
        &["SALE.CREATE", SKU, "5", "SHARDS", "1", "TTL", "1500"],
    )
    .await
    .unwrap();
    assert_eq!(
        error_code(&cmd(&mut c, &["ROOM.JOIN", SKU, "x"]).await),
        "NOROOM"
    );
    // At most 45 waiting: the first five are admitted as they join (5 units). No
    // window: the holds here live about a second, so with one every hold would count as
    // coming back soon and more buyers than units would be let in.
    let open = [
        "ROOM.OPEN",
        SKU,
        "RATE",
        "1000",
        "ADMIT-TTL",
        "60000",
        "WINDOW",
        "0",
        "MAX",
        "45",
    ];
    assert_eq!(cmd(&mut c, &open).await.unwrap(), Value::Okay);
    assert_eq!(cmd(&mut c, &open).await.unwrap(), Value::Okay, "idempotent");
    let other = ["ROOM.OPEN", SKU, "MAX", "46"];
    assert_eq!(error_code(&cmd(&mut c, &other).await), "EXISTS");

    // 50 buyers join, each twice: the same ticket again, nothing queued twice.
    let mut tickets = Vec::new();
    for i in 0..BUYERS {
        let (t, pos) = join(&mut c, &user(i)).await;
        let (again, pos_again) = join(&mut c, &user(i)).await;
        assert_eq!((&t, pos), (&again, pos_again), "{} joined twice", user(i));
        let want = if i < UNITS { 0 } else { (i - UNITS + 1) as i64 };
        assert_eq!(pos, want, "{}'s position", user(i));
        tickets.push(t);
        bounded_by_stock(&mut c).await;
    }
    assert_eq!(info(&mut c, "waiting").await, (BUYERS - UNITS) as i64);
    assert_eq!(info(&mut c, "admitted").await, UNITS as i64);
    // The queue is full: the next join is refused with a clear error.
    let full = cmd(&mut c, &["ROOM.JOIN", SKU, "latecomer"]).await;
    assert_eq!(error_code(&full), "QUEUEFULL", "{full:?}");

    // First come, first served: the first five are admitted, the rest wait in order.
    let before = places(&mut c, &tickets).await;
    for (i, (w, pos)) in before.iter().enumerate() {
        if i < UNITS {
            assert_eq!(w, "ADMITTED");
        } else {
            assert_eq!((w.as_str(), *pos), ("WAITING", (i - UNITS + 1) as i64));
        }
    }

    // A ticket of another buyer, an altered one and garbage are refused.
    let s = cmd(&mut c, &["ROOM.STATUS", SKU, &user(7), &tickets[6]]).await;
    assert_eq!(error_code(&s), "BADTICKET");
    let forged = tickets[7].replace(&user(7), &user(8));
    let s = cmd(&mut c, &["ROOM.STATUS", SKU, &user(8), &forged]).await;
    assert_eq!(error_code(&s), "BADTICKET");
    let s = cmd(&mut c, &["ROOM.STATUS", SKU, &user(8), "t1|nope"]).await;
    assert_eq!(error_code(&s), "BADTICKET");

    // An admitted buyer's token passes RESERVE; the admission is used.
    let hold0 = reserve_admitted(&mut c, 0, &tickets[0]).await;
    assert_eq!(
        word(&status(&mut c, &user(0), &tickets[0]).await),
        "RESERVED"
    );
    assert_eq!(info(&mut c, "admitted").await, 4);
    bounded_by_stock(&mut c).await;
    // Nobody new: 4 units for 4 admitted.
    assert_eq!(
        word(&status(&mut c, &user(5), &tickets[5]).await),
        "WAITING"
    );

    // A RELEASE gives the unit back: the head of the line (buyer 5) is admitted.
    cmd(&mut c, &["RELEASE", &hold0]).await.unwrap();
    await_word(&mut c, 5, &tickets[5], "ADMITTED").await;
    assert_eq!(
        word(&status(&mut c, &user(6), &tickets[6]).await),
        "WAITING"
    );
    bounded_by_stock(&mut c).await;

    // An expired hold does too: buyer 5 reserves and lets the hold expire (1.5 s,
    // released by --auto-release), and buyer 6 is admitted.
    reserve_admitted(&mut c, 5, &tickets[5]).await;
    assert_eq!(
        word(&status(&mut c, &user(6), &tickets[6]).await),
        "WAITING"
    );
    await_word(&mut c, 6, &tickets[6], "ADMITTED").await;
    bounded_by_stock(&mut c).await;

    // A buyer leaves: everyone behind moves up one place.
    assert_eq!(
        as_int(&cmd(&mut c, &["ROOM.LEAVE", SKU, &user(10)]).await.unwrap()),
        1
    );
    assert_eq!(
        as_int(&cmd(&mut c, &["ROOM.LEAVE", SKU, &user(10)]).await.unwrap()),
        0,
        "a repeated leave changes nothing"
    );
    assert_eq!(word(&status(&mut c, &user(10), &tickets[10]).await), "LEFT");

    // kill -9, restart on the same data dir: every place is where it was.
    let before = places(&mut c, &tickets).await;
    let waiting = info(&mut c, "waiting").await;
    srv.kill9();
    drop(c);
    let srv = Server::start_in(dir.path(), &["--auto-release"]);
    let mut c = srv.conn().await;
    let after = places(&mut c, &tickets).await;
    assert_eq!(after, before, "places after kill -9");
    assert_eq!(info(&mut c, "waiting").await, waiting);
    let (t, pos) = join(&mut c, &user(20)).await;
    assert_eq!(t, tickets[20], "the same ticket after the restart");
    assert_eq!(pos, before[20].1);

    // Everything sells: the admitted buyers reserve and pay. With nothing left and
    // nothing held, every waiting buyer is told SOLDOUT (and nobody new is queued).
    for i in [1, 2, 3, 4, 6] {
        let hold = reserve_admitted(&mut c, i, &tickets[i]).await;
        assert_eq!(as_int(&cmd(&mut c, &["COMMIT", &hold]).await.unwrap()), 1);
    }
    assert_eq!(available(&mut c).await, 0);
    for i in (7..BUYERS).filter(|&i| i != 10) {
        assert_eq!(
            word(&status(&mut c, &user(i), &tickets[i]).await),
            "SOLDOUT",
            "{}",
            user(i)
        );
    }
    assert_eq!(info(&mut c, "sold_out").await, 1);
    let late = cmd(&mut c, &["ROOM.JOIN", SKU, "another"]).await;
    assert_eq!(error_code(&late), "SOLDOUT");
}

/// `WINDOW`: with nothing available, holds whose deadline falls within the window count
/// as stock about to come back. Two 1-unit holds due in 6 s and a 2 s window: nobody is
/// admitted while they are due later than the window, then two buyers (one per unit, the
/// default factor) are, before the holds expire; the third keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_window_admits_for_holds_due_soon_before_they_expire() {
    const W: &str = "ROOM-WINDOW";
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    let create = ["SALE.CREATE", W, "2", "SHARDS", "1", "TTL", "6000"];
    cmd(&mut c, &create).await.unwrap();
    let keys = srv.keyring();
    let mut due_at = i64::MAX;
    for u in ["early-a", "early-b"] {
        let adm = keys.mint(W, u, now_ms() + 60_000);
        let v = items(cmd(&mut c, &["RESERVE", W, u, &adm, "r"]).await.unwrap());
        assert_eq!(as_str(&v[0]), "RESERVED", "{v:?}");
        due_at = due_at.min(as_int(&v[2]));
    }
    let open = ["ROOM.OPEN", W, "RATE", "1000", "WINDOW", "2000"];
    assert_eq!(cmd(&mut c, &open).await.unwrap(), Value::Okay);
    let room = cmd(&mut c, &["ROOM.INFO", W]).await.unwrap();
    assert_eq!(field(&room, "window_ms").map(|v| as_int(&v)), Some(2000));
    let mut tickets = Vec::new();
    for u in ["w-0", "w-1", "w-2"] {
        let v = items(cmd(&mut c, &["ROOM.JOIN", W, u]).await.unwrap());
        tickets.push(as_str(&v[0]));
    }
    let admitted = |v: &Value| as_int(&field(v, "admitted").expect("admitted"));
    let info = cmd(&mut c, &["ROOM.INFO", W]).await.unwrap();
    if (now_ms() as i64) < due_at - 2000 {
        assert_eq!(admitted(&info), 0, "holds due later than the window");
    }
    // The tick (every 20 ms) admits once the holds are due within the window.
    let seen_at = loop {
        let info = cmd(&mut c, &["ROOM.INFO", W]).await.unwrap();
        if admitted(&info) == 2 {
            break now_ms() as i64;
        }
        assert!(
            (now_ms() as i64) < due_at,
            "nobody admitted before the holds expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        seen_at < due_at,
        "admitted at {seen_at}, holds due at {due_at}"
    );
    assert_eq!(as_int(&cmd(&mut c, &["STOCK", W]).await.unwrap()), 0);
    for (u, t) in ["w-0", "w-1"].iter().zip(&tickets) {
        let s = items(cmd(&mut c, &["ROOM.STATUS", W, u, t]).await.unwrap());
        assert_eq!(as_str(&s[0]), "ADMITTED", "{u}: {s:?}");
    }
    let s = items(
        cmd(&mut c, &["ROOM.STATUS", W, "w-2", &tickets[2]])
            .await
            .unwrap(),
    );
    assert_eq!(as_str(&s[0]), "WAITING", "only two units come back: {s:?}");
}
