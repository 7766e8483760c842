//! Feed entries stand on their own: a consumer that never saw a hold's `reserved` entry
//! still learns, from its `committed`, `released` or `extended` entry, the sale, the
//! buyer, the request and the quantity, and for a release why it happened. Every entry
//! carries the format version `v`.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::*;

type Fields = HashMap<String, String>;

fn entries(con: &mut redis::Connection, stream: &str) -> Vec<(String, Fields)> {
    let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    v.into_iter()
        .map(|(id, kv)| (id, kv.into_iter().collect()))
        .collect()
}

fn reserve(srv: &Server, con: &mut redis::Connection, user: &str, req: &str, qty: u32) -> String {
    let adm = srv.keyring().mint("SELF", user, now_ms() + 60_000);
    let v: Vec<redis::Value> = redis::cmd("RESERVE")
        .arg("SELF")
        .arg(user)
        .arg(adm)
        .arg(req)
        .arg("QTY")
        .arg(qty)
        .query(con)
        .expect("RESERVE");
    assert_eq!(as_str(&v[0]), "RESERVED", "{v:?}");
    as_str(&v[1])
}

fn int(con: &mut redis::Connection, cmd: &mut redis::Cmd) -> i64 {
    cmd.query(con).expect("command")
}

#[test]
fn feed_entries_name_the_buyer_request_quantity_and_reason() {
    let srv = Server::start(&[]);
    let mut con = srv.client().get_connection().expect("connect");
    let _: () = redis::cmd("SALE.CREATE")
        .arg("SELF")
        .arg(100)
        .arg("TTL")
        .arg(1_000)
        .query(&mut con)
        .expect("SALE.CREATE");
    let paid = reserve(&srv, &mut con, "ann", "r-paid", 2);
    let cancelled = reserve(&srv, &mut con, "bob", "r-cancel", 1);
    let by_admin = reserve(&srv, &mut con, "cat", "r-admin", 3);
    let extended = reserve(&srv, &mut con, "dan", "r-ext", 1);
    let expired = reserve(&srv, &mut con, "eve", "r-late", 4);

    assert_eq!(int(&mut con, redis::cmd("COMMIT").arg(&paid)), 1);
    assert_eq!(int(&mut con, redis::cmd("RELEASE").arg(&cancelled)), 1);
    let stated = redis::cmd("RELEASE")
        .arg(&by_admin)
        .arg("REASON")
        .arg("admin")
        .clone();
    assert_eq!(int(&mut con, &mut stated.clone()), 1);
    let _: i64 = redis::cmd("EXTEND")
        .arg(&extended)
        .arg(60_000)
        .query(&mut con)
        .expect("EXTEND");
    // Past its deadline, a RELEASE that states no reason reports the expiry.
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(int(&mut con, redis::cmd("RELEASE").arg(&expired)), 1);

    // A reason the server does not know is refused, naming the ones it does.
    let err = redis::cmd("RELEASE")
        .arg(&extended)
        .arg("REASON")
        .arg("bored")
        .query::<i64>(&mut con)
        .expect_err("an unknown reason");
    assert!(
        err.to_string()
            .contains("release reason must be one of cancel, expired, admin, rebuild"),
        "{err}"
    );

    let all = entries(&mut con, "{SELF}:events");
    assert!(all
        .iter()
        .all(|(_, f)| f.get("v").map(String::as_str) == Some("2")));
    let find = |ty: &str, token: &str| -> Fields {
        all.iter()
            .find(|(_, f)| f["type"] == ty && f.get("token").map(String::as_str) == Some(token))
            .map(|(_, f)| f.clone())
            .unwrap_or_else(|| panic!("no {ty} entry for {token}: {all:?}"))
    };
    let expect = |f: &Fields, user: &str, req: &str, qty: &str| {
        assert_eq!(f["sku"], "SELF", "{f:?}");
        assert_eq!(f["user"], user, "{f:?}");
        assert_eq!(f["request_id"], req, "{f:?}");
        assert_eq!(f["qty"], qty, "{f:?}");
    };
    let c = find("committed", &paid);
    expect(&c, "ann", "r-paid", "2");
    let r = find("released", &cancelled);
    expect(&r, "bob", "r-cancel", "1");
    assert_eq!(r["reason"], "cancel");
    let r = find("released", &by_admin);
    expect(&r, "cat", "r-admin", "3");
    assert_eq!(r["reason"], "admin");
    let r = find("released", &expired);
    expect(&r, "eve", "r-late", "4");
    assert_eq!(r["reason"], "expired");
    let e = find("extended", &extended);
    expect(&e, "dan", "r-ext", "1");

    // The same entries after a restart: they are read back from the WAL, not from memory.
    let mut srv = srv;
    srv.kill9();
    let srv = Server::start_in(&srv.data_dir, &[]);
    let mut con = srv.client().get_connection().expect("connect");
    let again = entries(&mut con, "{SELF}:events");
    assert_eq!(again, all);
}
