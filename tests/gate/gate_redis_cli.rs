//! `redis-cli` (Debian's redis-tools) drives a reservation's whole life against the real
//! server: SALE.CREATE, RESERVE with a minted token, RESERVATION, COMMIT, STOCK.

use std::process::Command;

use crate::common::*;

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli must be installed (apt-get install redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().collect()
}

#[test]
fn redis_cli_session() {
    let srv = Server::start(&[]);
    let p = srv.port;
    assert_eq!(cli(p, &["PING"]).trim(), "PONG");
    assert_eq!(
        cli(p, &["SALE.CREATE", "SKU-CLI", "3", "SHARDS", "1"]).trim(),
        "OK"
    );
    // Mint with the binary, as an outside tool would.
    let mint = Command::new(server_bin())
        .args(["mint-token", "--data-dir"])
        .arg(&srv.data_dir)
        .args(["--sku", "SKU-CLI", "--user", "alice"])
        .output()
        .unwrap();
    assert!(mint.status.success());
    let tok = String::from_utf8(mint.stdout).unwrap().trim().to_string();

    let r = cli(p, &["RESERVE", "SKU-CLI", "alice", &tok, "order-1"]);
    let l = lines(&r);
    assert_eq!(l[0], "RESERVED");
    let token = l[1].to_string();
    assert!(token.starts_with("{SKU-CLI}"));
    assert_eq!(l[3], "0", "one shard");
    let r = cli(p, &["RESERVE", "SKU-CLI", "alice", &tok, "order-1"]);
    assert_eq!(lines(&r)[0], "REPLAY");
    assert_eq!(lines(&r)[1], token);
    assert_eq!(cli(p, &["STOCK", "SKU-CLI"]).trim(), "2");

    let r = cli(p, &["RESERVATION", &token]);
    let l = lines(&r);
    let get = |k: &str| l[l.iter().position(|x| *x == k).unwrap() + 1];
    assert_eq!(get("state"), "RESERVED");
    assert_eq!(get("user"), "alice");
    assert_eq!(get("request_id"), "order-1");
    assert_eq!(get("qty"), "1");

    assert_eq!(cli(p, &["COMMIT", &token]).trim(), "1");
    assert_eq!(cli(p, &["COMMIT", &token]).trim(), "0");
    assert_eq!(cli(p, &["RELEASE", &token]).trim(), "0");
    let r = cli(p, &["RESERVATION", &token]);
    assert!(r.contains("COMMITTED"));
    assert_eq!(cli(p, &["STOCK", "SKU-CLI"]).trim(), "2");
    let info = cli(p, &["SALE.INFO", "SKU-CLI"]);
    let l = lines(&info);
    let get = |k: &str| l[l.iter().position(|x| *x == k).unwrap() + 1];
    assert_eq!(get("committed"), "1");
    assert_eq!(get("available"), "2");

    // Errors come back as errors, with their codes.
    assert!(cli(p, &["STOCK", "NOPE"]).starts_with("NOSALE"));
    assert!(cli(p, &["RESERVE", "SKU-CLI", "bob", &tok, "x"]).starts_with("DENIED"));
    assert!(cli(p, &["RESERVE", "SKU-CLI", "bad|user", &tok, "x"]).contains("invalid user"));
    assert!(cli(p, &["COMMIT", "{SKU-CLI}aaaaaaaaaaaaaaaaaaaaaaaaaa"]).starts_with("NORES"));
    assert!(cli(p, &["NOSUCH"]).contains("unknown command"));
    // RESP3 through redis-cli -3: maps.
    let out = Command::new("redis-cli")
        .args(["-3", "-p", &p.to_string(), "SALE.INFO", "SKU-CLI"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("total") && s.contains("=>") || s.contains("total"),
        "{s}"
    );
}
