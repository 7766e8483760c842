//! MULTI/EXEC/DISCARD over raw RESP against the real binary, byte for byte as Redis 7
//! answers: `+QUEUED`, EXECABORT after a queue-time error (and nothing runs), runtime
//! errors inside EXEC's array, nested MULTI, EXEC/DISCARD without MULTI, WATCH refused,
//! the queue bound, roles checked at queue time, pipelined transactions.

use crate::common::*;
use crate::resp::{Raw, V};

fn ok() -> V {
    V::Simple("OK".into())
}

fn queued() -> V {
    V::Simple("QUEUED".into())
}

const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

#[test]
fn transactions_over_raw_resp() {
    let srv = Server::start(&["--max-args", "16"]);
    let keys = srv.keyring();
    let adm = |u: &str| keys.mint("S", u, now_ms() + 600_000);
    let mut c = Raw::connect(&srv.addr);
    assert_eq!(c.call(&["SALE.CREATE", "S", "10", "SHARDS", "1"]), ok());

    // Without MULTI.
    assert_eq!(c.call(&["EXEC"]), V::Err("ERR EXEC without MULTI".into()));
    assert_eq!(
        c.call(&["DISCARD"]),
        V::Err("ERR DISCARD without MULTI".into())
    );

    // A transaction: each command QUEUED, EXEC answers the replies in order.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["RESERVE", "S", "u1", &adm("u1"), "r"]), queued());
    assert_eq!(c.call(&["RESERVE", "S", "u2", &adm("u2"), "r"]), queued());
    assert_eq!(
        c.call(&["stock", "S"]),
        queued(),
        "names are case-insensitive"
    );
    let r = c.call(&["EXEC"]);
    let items = r.arr();
    assert_eq!(items.len(), 3, "{r:?}");
    assert_eq!(items[0].arr()[0].text(), "RESERVED");
    assert_eq!(items[1].arr()[0].text(), "RESERVED");
    assert_eq!(items[2], V::Int(8));
    assert_eq!(
        c.call(&["STOCK", "S"]),
        V::Int(8),
        "each RESERVE took one unit"
    );
    let t1 = items[0].arr()[1].text();

    // Runtime errors are elements of the array; the rest still runs.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["STOCK", "NOPE"]), queued());
    assert_eq!(c.call(&["STOCK", "bad sku"]), queued());
    assert_eq!(c.call(&["RESERVE", "S", "u3", &adm("u3"), "r"]), queued());
    let r = c.call(&["EXEC"]);
    let items = r.arr();
    assert!(items[0].err_text().starts_with("NOSALE"), "{r:?}");
    assert_eq!(
        items[1],
        V::Err("ERR invalid sku: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -".into())
    );
    assert_eq!(items[2].arr()[0].text(), "RESERVED");
    assert_eq!(c.call(&["STOCK", "S"]), V::Int(7));

    // Queue-time errors (unknown command, wrong arity) answer at once, EXEC aborts, and
    // nothing queued before or after them runs.
    for bad in [
        vec!["NOSUCHCMD", "x"],
        vec!["RESERVE", "S"],
        vec!["HELLO", "3"],
    ] {
        assert_eq!(c.call(&["MULTI"]), ok());
        assert_eq!(c.call(&["RESERVE", "S", "u4", &adm("u4"), "r"]), queued());
        let e = c.call(&bad);
        assert!(e.err_text().starts_with("ERR"), "{bad:?}: {e:?}");
        assert_eq!(c.call(&["RELEASE", &t1]), queued());
        assert_eq!(c.call(&["EXEC"]), V::Err(EXECABORT.into()), "{bad:?}");
        assert_eq!(c.call(&["STOCK", "S"]), V::Int(7), "{bad:?}: nothing ran");
    }
    assert_eq!(c.call(&["RESERVATION", &t1]).arr()[13].text(), "RESERVED");
    assert_eq!(c.call(&["PING"]), V::Simple("PONG".into()), "RESP2 still");

    // Nested MULTI is an error that leaves the transaction open and valid.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(
        c.call(&["MULTI"]),
        V::Err("ERR MULTI calls can not be nested".into())
    );
    assert_eq!(c.call(&["STOCK", "S"]), queued());
    assert_eq!(c.call(&["EXEC"]), V::Arr(vec![V::Int(7)]));

    // DISCARD forgets the queue; nothing runs.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["RESERVE", "S", "u5", &adm("u5"), "r"]), queued());
    assert_eq!(c.call(&["DISCARD"]), ok());
    assert_eq!(c.call(&["EXEC"]), V::Err("ERR EXEC without MULTI".into()));
    assert_eq!(c.call(&["STOCK", "S"]), V::Int(7));

    // An empty transaction.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["EXEC"]), V::Arr(vec![]));

    // WATCH is refused with a clear error (no fake optimistic locking); UNWATCH is a no-op.
    let w = c.call(&["WATCH", "S"]);
    assert!(w.err_text().contains("WATCH is not supported"), "{w:?}");
    assert_eq!(c.call(&["UNWATCH"]), ok());

    // The queue is bounded (--max-args commands): past it, an error and EXECABORT.
    assert_eq!(c.call(&["MULTI"]), ok());
    for _ in 0..16 {
        assert_eq!(c.call(&["RESERVE", "S", "u6", &adm("u6"), "r"]), queued());
    }
    let e = c.call(&["PING"]);
    assert!(e.err_text().contains("queue limit"), "{e:?}");
    assert_eq!(c.call(&["EXEC"]), V::Err(EXECABORT.into()));
    assert_eq!(c.call(&["STOCK", "S"]), V::Int(7));

    // A whole transaction pipelined in one write, as client libraries send it.
    let mut batch = Vec::new();
    batch.extend(Raw::encode(&["MULTI"]));
    batch.extend(Raw::encode(&["RESERVE", "S", "u7", &adm("u7"), "r"]));
    batch.extend(Raw::encode(&["RESERVE", "S", "u7", &adm("u7"), "r"]));
    batch.extend(Raw::encode(&["EXEC"]));
    batch.extend(Raw::encode(&["STOCK", "S"]));
    c.send_bytes(&batch);
    assert_eq!(c.read(), ok());
    assert_eq!(c.read(), queued());
    assert_eq!(c.read(), queued());
    let r = c.read();
    assert_eq!(r.arr()[0].arr()[0].text(), "RESERVED");
    assert_eq!(
        r.arr()[1].arr()[0].text(),
        "REPLAY",
        "idempotent inside EXEC too"
    );
    assert_eq!(c.read(), V::Int(6));

    // RESET discards an open transaction.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["RESERVE", "S", "u8", &adm("u8"), "r"]), queued());
    assert_eq!(c.call(&["RESET"]), V::Simple("RESET".into()));
    assert_eq!(c.call(&["EXEC"]), V::Err("ERR EXEC without MULTI".into()));
    assert_eq!(c.call(&["STOCK", "S"]), V::Int(6));

    // Another client's commands are unaffected by an open transaction here.
    assert_eq!(c.call(&["MULTI"]), ok());
    let mut other = Raw::connect(&srv.addr);
    assert_eq!(other.call(&["STOCK", "S"]), V::Int(6));
    assert_eq!(c.call(&["DISCARD"]), ok());
}

#[test]
fn roles_are_checked_when_queuing() {
    let dir = TempDir::new("multi-users");
    let f = dir.path().join("users");
    std::fs::write(&f, "boss admin pw-admin\nshop checkout pw-shop\n").unwrap();
    let srv = Server::start(&["--users-file", f.to_str().unwrap()]);
    let mut anon = Raw::connect(&srv.addr);
    assert!(anon.call(&["MULTI"]).err_text().starts_with("NOAUTH"));
    let mut admin = Raw::connect(&srv.addr);
    assert_eq!(admin.call(&["AUTH", "boss", "pw-admin"]), ok());
    assert_eq!(admin.call(&["SALE.CREATE", "S", "10"]), ok());

    let mut shop = Raw::connect(&srv.addr);
    assert_eq!(shop.call(&["AUTH", "shop", "pw-shop"]), ok());
    assert_eq!(shop.call(&["MULTI"]), ok());
    assert_eq!(shop.call(&["STOCK", "S"]), queued());
    assert!(shop
        .call(&["SALE.ADJUST", "S", "-5"])
        .err_text()
        .starts_with("NOPERM"));
    assert_eq!(shop.call(&["EXEC"]), V::Err(EXECABORT.into()));
    assert_eq!(admin.call(&["SALE.INFO", "S"]).arr()[1], V::Int(10));
    // What the role allows runs.
    assert_eq!(shop.call(&["MULTI"]), ok());
    assert_eq!(shop.call(&["STOCK", "S"]), queued());
    assert_eq!(shop.call(&["EXEC"]), V::Arr(vec![V::Int(10)]));
}

/// Under `--fsync always`, what EXEC acknowledged survives a `kill -9` right after it.
#[test]
fn exec_reply_is_durable() {
    let mut srv = Server::start(&["--fsync", "always"]);
    let keys = srv.keyring();
    let mut c = Raw::connect(&srv.addr);
    let mut batch = Raw::encode(&["MULTI"]);
    batch.extend(Raw::encode(&["SALE.CREATE", "D", "5", "SHARDS", "1"]));
    for u in ["a", "b"] {
        let t = keys.mint("D", u, now_ms() + 600_000);
        batch.extend(Raw::encode(&["RESERVE", "D", u, &t, "r"]));
    }
    batch.extend(Raw::encode(&["EXEC"]));
    c.send_bytes(&batch);
    for _ in 0..4 {
        c.read();
    }
    let r = c.read();
    let tokens: Vec<String> = r.arr()[1..].iter().map(|x| x.arr()[1].text()).collect();
    srv.kill9();
    let srv = Server::start_in(&srv.data_dir.clone(), &[]);
    let mut c = Raw::connect(&srv.addr);
    assert_eq!(c.call(&["STOCK", "D"]), V::Int(3));
    for t in &tokens {
        assert_eq!(c.call(&["RESERVATION", t]).arr()[13].text(), "RESERVED");
    }
}
