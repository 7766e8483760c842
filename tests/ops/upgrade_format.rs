//! Upgrade from the previous on-disk format: the current binary starts on a data dir that
//! the binary of commit 4202a3c wrote (snapshot version 2, no history id, records of kinds
//! 10–12, a consumer group checkpointed after the snapshot; tests/fixtures/format-v2,
//! README.md there says how it was made), serves exactly the state that binary served,
//! takes new writes and restarts cleanly on the data dir it then holds.

use std::path::Path;

use crate::common::*;
use redis::Value;

fn q(c: &mut redis::Connection, args: &[&str]) -> Value {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query(c)
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")))
}

fn counters(c: &mut redis::Connection, sku: &str) -> [i64; 4] {
    let v = q(c, &["SALE.INFO", sku]);
    ["total", "available", "reserved", "committed"]
        .map(|f| as_int(&field(&v, f).unwrap_or_else(|| panic!("{sku} {f}: {v:?}"))))
}

fn state(c: &mut redis::Connection, token: &str) -> (String, i64) {
    let v = q(c, &["RESERVATION", token]);
    (
        as_str(&field(&v, "state").unwrap_or_else(|| panic!("{token}: {v:?}"))),
        as_int(&field(&v, "qty").expect("qty")),
    )
}

/// `XRANGE` as (id, type, token or sku) triples.
fn feed(c: &mut redis::Connection, from: &str) -> Vec<(String, String, String)> {
    let Value::Array(entries) = q(c, &["XRANGE", "stockgate:events", from, "+"]) else {
        panic!("XRANGE");
    };
    entries
        .iter()
        .map(|e| {
            let Value::Array(pair) = e else {
                panic!("{e:?}")
            };
            let subject = field(&pair[1], "token")
                .or_else(|| field(&pair[1], "sku"))
                .expect("token or sku");
            (
                as_str(&pair[0]),
                as_str(&field(&pair[1], "type").expect("type")),
                as_str(&subject),
            )
        })
        .collect()
}

fn group(c: &mut redis::Connection) -> (String, i64, i64, String) {
    let Value::Array(groups) = q(c, &["XINFO", "GROUPS", "stockgate:events"]) else {
        panic!("XINFO GROUPS");
    };
    assert_eq!(groups.len(), 1, "{groups:?}");
    let g = &groups[0];
    (
        as_str(&field(g, "name").expect("name")),
        as_int(&field(g, "consumers").expect("consumers")),
        as_int(&field(g, "pending").expect("pending")),
        as_str(&field(g, "last-delivered-id").expect("last-delivered-id")),
    )
}

const FLAGS: [&str; 2] = ["--retention-ms", "2592000000"];

#[test]
fn a_data_dir_of_the_previous_format_is_served_exactly_then_written_and_restarted() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v2");
    let tokens: Vec<String> = std::fs::read_to_string(fixture.join("tokens.txt"))
        .expect("tokens.txt")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(tokens.len(), 7);
    let dir = TempDir::new("upgrade");
    let data = dir.path().join("data");
    copy_dir(&fixture.join("data"), &data);
    let names: Vec<String> = std::fs::read_dir(data.join("wal"))
        .expect("wal")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with(".snap")) && names.iter().any(|n| n.ends_with(".log")),
        "the fixture holds a snapshot and a log tail: {names:?}"
    );

    let mut s = Server::start_in(&data, &FLAGS);
    let mut c = s.client().get_connection().expect("connect");
    // What the binary of 4202a3c served on this data dir (README.md).
    assert_eq!(counters(&mut c, "FA"), [100, 85, 8, 7]);
    assert_eq!(counters(&mut c, "FB"), [15, 12, 0, 3]);
    let expected = [
        ("COMMITTED", 1),
        ("COMMITTED", 2),
        ("RELEASED", 3),
        ("COMMITTED", 4),
        ("RELEASED", 5),
        ("RESERVED", 6),
        ("COMMITTED", 3),
    ];
    for (t, (st, qty)) in tokens.iter().zip(expected) {
        assert_eq!(state(&mut c, t), (st.to_string(), qty), "{t}");
    }
    let old_feed = feed(&mut c, "16");
    let kinds: Vec<(&str, &str)> = old_feed
        .iter()
        .map(|(id, ty, _)| (id.as_str(), ty.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("17-0", "committed"),
            ("18-0", "released"),
            ("19-0", "committed"),
            ("20-0", "reserved"),
            ("22-0", "sale.adjusted"),
            // The first start of the current binary on a data dir without a history id
            // begins one (docs/operations.md, section 12).
            ("23-0", "history.begun"),
        ]
    );
    assert_eq!(old_feed[0].2, tokens[3]);
    assert_eq!(old_feed[1].2, tokens[4]);
    assert_eq!(old_feed[2].2, tokens[6]);
    assert_eq!(old_feed[4].2, "FB");
    assert_eq!(group(&mut c), ("g1".into(), 2, 4, "5-0".into()));

    // New writes on the upgraded data dir.
    let keys = s.keyring();
    let adm = keys.mint("FB", "u9", now_ms() + 60_000);
    let v = q(&mut c, &["RESERVE", "FB", "u9", &adm, "r9", "QTY", "2"]);
    let Value::Array(v) = v else { panic!("{v:?}") };
    assert_eq!(as_str(&v[0]), "RESERVED");
    let t9 = as_str(&v[1]);
    assert_eq!(as_int(&q(&mut c, &["COMMIT", &t9])), 1);
    assert_eq!(as_int(&q(&mut c, &["RELEASE", &tokens[5]])), 1);
    assert_eq!(
        as_int(&q(&mut c, &["XACK", "stockgate:events", "g1", "1-0"])),
        1
    );
    let after_writes = (
        counters(&mut c, "FA"),
        counters(&mut c, "FB"),
        feed(&mut c, "17"),
        group(&mut c),
    );
    assert_eq!(after_writes.0, [100, 91, 2, 7]);
    assert_eq!(after_writes.1, [15, 10, 0, 5]);
    assert_eq!(after_writes.3, ("g1".into(), 2, 3, "5-0".into()));
    drop(c);
    assert_eq!(s.terminate(), Some(0), "clean exit after the upgrade");

    let mut s2 = Server::start_in(&data, &FLAGS);
    let mut c = s2.client().get_connection().expect("connect");
    let restarted = (
        counters(&mut c, "FA"),
        counters(&mut c, "FB"),
        feed(&mut c, "17"),
        group(&mut c),
    );
    assert_eq!(restarted, after_writes);
    assert_eq!(state(&mut c, &t9), ("COMMITTED".into(), 2));
    assert_eq!(state(&mut c, &tokens[5]), ("RELEASED".into(), 6));
    // A snapshot in the current format replaces the old one; a restart from it keeps
    // the state and the group.
    q(&mut c, &["SAVE"]);
    drop(c);
    assert_eq!(s2.terminate(), Some(0));
    let s3 = Server::start_in(&data, &FLAGS);
    let mut c = s3.client().get_connection().expect("connect");
    assert_eq!(counters(&mut c, "FA"), after_writes.0);
    assert_eq!(counters(&mut c, "FB"), after_writes.1);
    assert_eq!(group(&mut c), after_writes.3);
    let snaps = std::fs::read_dir(data.join("wal"))
        .expect("wal")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        })
        .count();
    assert_eq!(
        snaps, 1,
        "SAVE on the upgraded data dir replaced the old snapshot"
    );
}
