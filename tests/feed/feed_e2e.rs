//! The order feed against the real server: redis-py reads a scripted workload; nothing
//! non-durable is visible; a trimmed position answers the documented error; retention
//! keeps it readable.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn feed_redis_py_reads_every_state_change_once_in_order() {
    let srv = Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/feed.py");
    let out = Command::new("timeout")
        .arg("60")
        .arg("python3")
        .arg(script)
        .arg(srv.port.to_string())
        .arg(&srv.data_dir)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "redis-py feed failed (needs `pip install redis`):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis-py feed ok"));
}

fn xread_all(con: &mut redis::Connection) -> Vec<String> {
    let v: redis::Value = redis::cmd("XRANGE")
        .arg("stockgate:events")
        .arg("-")
        .arg("+")
        .query(con)
        .unwrap();
    let redis::Value::Array(items) = v else {
        panic!("{v:?}")
    };
    items.iter().map(|e| format!("{e:?}")).collect()
}

/// A RESERVE whose record is held in flight (the WAL writer sleeps before writing) is not
/// on the feed until it is durable; once its reply arrives, it is.
#[test]
fn feed_shows_nothing_before_it_is_durable() {
    let dir = TempDir::new("feed-held");
    let srv = Server::start_in_env(dir.path(), &[], &[("STOCKGATE_FAULT_WAL_DELAY_MS", "1500")]);
    let client = srv.client();
    let mut con = client.get_connection().unwrap();
    let _: () = redis::cmd("SALE.CREATE")
        .arg("HELD")
        .arg(10)
        .query(&mut con)
        .unwrap();
    let keys = srv.keyring();
    let adm = keys.mint("HELD", "alice", now_ms() + 60_000);
    let mut raw = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    let cmd = format!(
        "*5\r\n$7\r\nRESERVE\r\n$4\r\nHELD\r\n$5\r\nalice\r\n${}\r\n{adm}\r\n$2\r\nr1\r\n",
        adm.len()
    );
    raw.write_all(cmd.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = xread_all(&mut con);
    assert!(
        before.iter().all(|e| !e.contains("reserved")),
        "a record in flight is visible: {before:?}"
    );
    // A BLOCKed reader is woken only once the record is durable.
    let t0 = Instant::now();
    let v: redis::Value = redis::cmd("XREAD")
        .arg("BLOCK")
        .arg(5000)
        .arg("STREAMS")
        .arg("{HELD}:events")
        .arg("$")
        .query(&mut con)
        .unwrap();
    assert!(format!("{v:?}").contains("reserved"), "{v:?}");
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 256];
    let n = raw.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("RESERVED"));
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "woke before the write"
    );
    let after = xread_all(&mut con);
    assert_eq!(after.iter().filter(|e| e.contains("reserved")).count(), 1);
}

fn reserve_some(srv: &Server, sku: &str, n: usize) {
    let mut con = srv.client().get_connection().unwrap();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(sku)
        .arg(100_000)
        .query(&mut con)
        .unwrap();
    let keys = srv.keyring();
    for i in 0..n {
        let u = format!("u{i}");
        let adm = keys.mint(sku, &u, now_ms() + 60_000);
        let _: redis::Value = redis::cmd("RESERVE")
            .arg(sku)
            .arg(&u)
            .arg(&adm)
            .arg(format!("r{i}"))
            .query(&mut con)
            .unwrap();
    }
}

/// After a snapshot deletes the segments, reading from before them is the documented
/// `trimmed` error; with `--feed-retention` the same position stays readable.
#[test]
fn feed_trimmed_position_is_a_clear_error_and_retention_keeps_it() {
    for (flags, trimmed) in [
        (&["--segment-mib", "1"][..], true),
        (
            &["--segment-mib", "1", "--feed-retention", "1GiB"][..],
            false,
        ),
    ] {
        let srv = Server::start(flags);
        reserve_some(&srv, "TRIM", 200);
        let mut con = srv.client().get_connection().unwrap();
        let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
        reserve_some(&srv, "TRIM2", 3);
        let r: redis::RedisResult<redis::Value> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(5)
            .arg("STREAMS")
            .arg("stockgate:events")
            .arg("0-0")
            .query(&mut con);
        match r {
            Err(e) => {
                assert!(trimmed, "{e}");
                let msg = e.to_string();
                assert!(msg.contains("trimmed") && msg.contains("ledger"), "{msg}");
            }
            Ok(v) => {
                assert!(!trimmed, "no error after the snapshot: {v:?}");
                assert!(format!("{v:?}").contains("sale.created"), "{v:?}");
            }
        }
        // $ is always readable.
        let v: redis::Value = redis::cmd("XREAD")
            .arg("STREAMS")
            .arg("stockgate:events")
            .arg("$")
            .query(&mut con)
            .unwrap();
        assert_eq!(v, redis::Value::Nil);
    }
}
