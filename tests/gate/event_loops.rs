//! `--threads N`: N independent event loops, each with its own `SO_REUSEPORT` listener on
//! the one address (server.rs, `serve`). What that must not change: one port, claimed
//! exclusively (a second server is refused as with one loop, although `SO_REUSEPORT`
//! alone would let a second process of the same user share it and take half the
//! connections), and one engine behind every loop (a storm over all of them sells exactly
//! the stock, no token twice).

use std::collections::HashSet;

use crate::common::*;
use crate::resp::{Raw, V};

#[test]
fn a_second_server_cannot_share_the_port_of_a_multi_loop_one() {
    let first = Server::start(&["--threads", "2"]);
    let dir = TempDir::new("second");
    let port = first.port.to_string();
    for threads in ["2", "1"] {
        match try_start_in(dir.path(), &["--port", &port, "--threads", threads]) {
            Ok(mut s) => {
                s.kill9();
                panic!("a second server (--threads {threads}) bound port {port} of a running one");
            }
            Err(f) => assert!(
                f.stderr.contains("bind") && f.stderr.contains(&port),
                "refused, but not for the port: {f:?}"
            ),
        }
    }
}

#[test]
fn every_loop_serves_one_engine() {
    const STOCK: usize = 500;
    const CONNS: usize = 64;
    const PER_CONN: usize = 20;
    let srv = Server::start(&["--threads", "4"]);
    let mut admin = Raw::connect(&srv.addr);
    assert_eq!(
        admin.call(&["SALE.CREATE", "LOOPS", &STOCK.to_string()]),
        V::Simple("OK".into())
    );
    let keys = srv.keyring();
    let handles: Vec<_> = (0..CONNS)
        .map(|c| {
            let addr = srv.addr.clone();
            let keys = keys.clone();
            std::thread::spawn(move || {
                let mut conn = Raw::connect(&addr);
                let mut tokens = Vec::new();
                for i in 0..PER_CONN {
                    let user = format!("u{c}-{i}");
                    let adm = keys.mint("LOOPS", &user, now_ms() + 60_000);
                    let r = conn.call(&["RESERVE", "LOOPS", user.as_str(), adm.as_str(), "r1"]);
                    let r = r.arr();
                    match r[0].text().as_str() {
                        "RESERVED" => tokens.push(r[1].text()),
                        "SOLDOUT" => {}
                        other => panic!("unexpected RESERVE outcome {other}: {r:?}"),
                    }
                }
                tokens
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().expect("client thread"));
    }
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "a token was handed out twice");
    assert_eq!(all.len(), STOCK, "sold {} of {STOCK}", all.len());
    assert_eq!(admin.call(&["STOCK", "LOOPS"]), V::Int(0));
}
