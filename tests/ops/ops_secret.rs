//! Admission keys rotated without a restart (docs/operations.md, "Key rotation"):
//! `SECRET.RELOAD` reads the secret file again, the new keys verify from the next
//! RESERVE on, a bad file changes nothing, and only an admin may run it.

use std::time::Duration;

use crate::common::ha::{Keys, Node};
use crate::common::{now_ms, TempDir};
use redis::Value;
use stockgate_server::engine::Keyring;

fn hex(seed: u8) -> String {
    (0..32u8)
        .map(|i| format!("{:02x}", i.wrapping_mul(seed).wrapping_add(7)))
        .collect()
}

fn ring(kid: &str, seed: u8) -> Keyring {
    Keyring::parse(&format!("{kid} {}\n", hex(seed))).expect("keyring")
}

fn conn(port: u16, user: &str, pw: &str) -> redis::Connection {
    redis::Client::open(format!("redis://{user}:{pw}@127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connect")
}

/// RESERVE's first element or the error's code and text.
fn reserve(c: &mut redis::Connection, user: &str, token: &str, req: &str) -> String {
    match redis::cmd("RESERVE")
        .arg("S")
        .arg(user)
        .arg(token)
        .arg(req)
        .query::<Value>(c)
    {
        Ok(Value::Array(v)) => match v.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        },
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
    }
}

fn reload(c: &mut redis::Connection) -> Result<Vec<String>, String> {
    redis::cmd("SECRET.RELOAD")
        .query::<Vec<String>>(c)
        .map_err(|e| format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")))
}

#[test]
fn admission_keys_are_added_and_retired_without_a_restart() {
    let keys = Keys::new();
    let dir = TempDir::new("secret-reload");
    let users = dir.path().join("users");
    std::fs::write(&users, "ops admin ops-pw\nshop checkout shop-pw\n").expect("users");
    let u = users.display().to_string();
    let node = Node::start(&keys, &["--users-file", &u]);
    let mut ops = conn(node.port, "ops", "ops-pw");
    let mut shop = conn(node.port, "shop", "shop-pw");
    redis::cmd("SALE.CREATE")
        .arg("S")
        .arg(100)
        .query::<()>(&mut ops)
        .expect("create");
    let old = keys.keyring();
    let k1 = std::fs::read_to_string(keys.secret_path()).expect("secret");
    let exp = now_ms() + 600_000;
    let k2_token = |user: &str| ring("k2", 13).mint("S", user, exp);

    // Before the reload a k2 token names a key the server does not hold.
    assert_eq!(
        reserve(&mut shop, "a", &k2_token("a"), "r1"),
        "DENIED unknown key id"
    );
    // Only an admin reloads.
    let e = reload(&mut shop).expect_err("checkout may not reload");
    assert!(e.starts_with("NOPERM"), "{e}");

    // Add k2 in front (it signs), keep k1: both verify.
    std::fs::write(keys.secret_path(), format!("k2 {}\n{k1}", hex(13))).expect("write");
    assert_eq!(reload(&mut ops), Ok(vec!["k2".into(), "k1".into()]));
    assert_eq!(reserve(&mut shop, "a", &k2_token("a"), "r1"), "RESERVED");
    assert_eq!(
        reserve(&mut shop, "b", &old.mint("S", "b", exp), "r1"),
        "RESERVED"
    );

    // A broken file is refused in words; the keys held stay.
    std::fs::write(keys.secret_path(), "k3 not-hex\n").expect("write");
    let e = reload(&mut ops).expect_err("bad file");
    assert!(e.contains("the admission keys held are unchanged"), "{e}");
    assert!(!e.contains(&hex(13)), "the refusal shows no secret: {e}");
    assert_eq!(reserve(&mut shop, "c", &k2_token("c"), "r1"), "RESERVED");

    // Retire k1: its tokens are refused from the next RESERVE on; k2's still pass.
    std::fs::write(keys.secret_path(), format!("k2 {}\n", hex(13))).expect("write");
    assert_eq!(reload(&mut ops), Ok(vec!["k2".into()]));
    assert_eq!(
        reserve(&mut shop, "d", &old.mint("S", "d", exp), "r1"),
        "DENIED unknown key id"
    );
    assert_eq!(reserve(&mut shop, "e", &k2_token("e"), "r1"), "RESERVED");
    // A retry of b's reservation with its k1 token is refused too: the admission token
    // is verified before the replay check, so a key is retired only once its tokens
    // (and their retries) are past their TTL.
    assert_eq!(
        reserve(&mut shop, "b", &old.mint("S", "b", exp), "r1"),
        "DENIED unknown key id"
    );
}
