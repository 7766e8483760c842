//! docs/protocol.md "Identifiers", over the real binary: every command that takes a sku, user,
//! request id or reservation token refuses a malformed one with `-ERR invalid <field>`,
//! before anything else (no `-NOSALE`, no nil, no `:0`), and changes nothing.

use crate::common::*;
use crate::resp::{Raw, V};

/// Malformed skus: a space, empty, 65 bytes, braces (would break the `{sku}` tag), not UTF-8.
fn bad_skus() -> Vec<Vec<u8>> {
    vec![
        b"bad sku".to_vec(),
        b"".to_vec(),
        vec![b'a'; 65],
        b"sku{x}".to_vec(),
        b"a|b".to_vec(),
        vec![0xff, 0xfe],
    ]
}

/// Malformed users and request ids: a space, empty, 129 bytes, `|`, braces, not UTF-8.
fn bad_users() -> Vec<Vec<u8>> {
    vec![
        b"bad user".to_vec(),
        b"".to_vec(),
        vec![b'u'; 129],
        b"a|b".to_vec(),
        b"u{x}".to_vec(),
        b"tab\there".to_vec(),
        vec![0xff],
    ]
}

fn bad_tokens(good: &str) -> Vec<Vec<u8>> {
    vec![
        b"".to_vec(),
        b"nope".to_vec(),
        b"{S}short".to_vec(),
        format!("{good}x").into_bytes(),
        good.as_bytes()[..good.len() - 1].to_vec(),
        // Upper-case base32: the server only ever derives lower case.
        format!("{{S}}{}", good["{S}".len()..].to_ascii_uppercase()).into_bytes(),
        format!("{{bad sku}}{}", "a".repeat(26)).into_bytes(),
        format!("S}}{}", "a".repeat(26)).into_bytes(),
        format!("{{S}}{}1", "a".repeat(25)).into_bytes(),
        vec![0xff; 29],
    ]
}

/// `template` with every `@` argument replaced by `bad`.
fn with(template: &[&str], bad: &[u8]) -> Vec<Vec<u8>> {
    template
        .iter()
        .map(|a| {
            if *a == "@" {
                bad.to_vec()
            } else {
                a.as_bytes().to_vec()
            }
        })
        .collect()
}

fn expect_invalid(c: &mut Raw, argv: &[Vec<u8>], field: &str) {
    let r = c.call(argv);
    let shown: Vec<String> = argv
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // The rule follows the field: `ERR invalid sku: must be 1 to 64 characters of ...`.
    assert!(
        matches!(&r, V::Err(e) if e.starts_with(&format!("ERR invalid {field}: must be "))),
        "{shown:?} must be refused as an invalid {field}, saying what one is: {r:?}"
    );
}

#[test]
fn every_command_refuses_malformed_identifiers() {
    let srv = Server::start(&[]);
    let keys = srv.keyring();
    let adm = keys.mint("S", "alice", now_ms() + 600_000);
    let mut c = Raw::connect(&srv.addr);
    assert_eq!(
        c.call(&["SALE.CREATE", "S", "10", "SHARDS", "2"]),
        V::Simple("OK".into())
    );
    let r = c.call(&["RESERVE", "S", "alice", &adm, "req-1"]);
    assert_eq!(r.arr()[0].text(), "RESERVED");
    let token = r.arr()[1].text();
    let exp = (now_ms() + 600_000).to_string();
    let now = now_ms().to_string();
    let before = c.call(&["SALE.INFO", "S"]);
    let before_res = c.call(&["RESERVATION", &token]);

    let sku_cmds: Vec<Vec<&str>> = vec![
        vec!["STOCK", "@"],
        vec!["RESERVE", "@", "alice", &adm, "req-2"],
        vec!["RESERVE", "@", "alice", &adm, "req-2", "QTY", "1"],
        vec!["SALE.CREATE", "@", "10"],
        vec!["SALE.INFO", "@"],
        vec!["SALE.PAUSE", "@"],
        vec!["SALE.RESUME", "@"],
        vec!["SALE.ADJUST", "@", "5"],
        vec!["SALE.ADJUST", "@", "0"],
        vec!["SALE.FENCE", "@"],
        vec!["SALE.FENCE", "@", "TOTAL", "10"],
        vec!["SALE.RESTORE", "@", "alice", "req-9", "1", &exp, &now],
        vec!["SALE.REBUILD", "@", "10", "0", "0011223344556677"],
        vec!["EXPIRED", "SKU", "@"],
        vec!["EXPIRED", "COUNT", "5", "SKU", "@"],
    ];
    let user_cmds: Vec<Vec<&str>> = vec![
        vec!["RESERVE", "S", "@", &adm, "req-2"],
        vec!["SALE.RESTORE", "S", "@", "req-9", "1", &exp, &now],
    ];
    let rid_cmds: Vec<Vec<&str>> = vec![
        vec!["RESERVE", "S", "alice", &adm, "@"],
        vec!["SALE.RESTORE", "S", "alice", "@", "1", &exp, &now],
    ];
    let token_cmds: Vec<Vec<&str>> = vec![
        vec!["RESERVATION", "@"],
        vec!["EXTEND", "@", "1000"],
        vec!["COMMIT", "@"],
        vec!["RELEASE", "@"],
    ];
    for t in &sku_cmds {
        for bad in bad_skus() {
            expect_invalid(&mut c, &with(t, &bad), "sku");
        }
    }
    for t in &user_cmds {
        for bad in bad_users() {
            expect_invalid(&mut c, &with(t, &bad), "user");
        }
    }
    for t in &rid_cmds {
        for bad in bad_users() {
            expect_invalid(&mut c, &with(t, &bad), "request-id");
        }
    }
    for t in &token_cmds {
        for bad in bad_tokens(&token) {
            expect_invalid(&mut c, &with(t, &bad), "token");
        }
    }

    // Nothing changed: no sale created, paused, fenced or adjusted, no stock taken, the
    // reservation untouched.
    assert_eq!(c.call(&["SALE.LIST"]), V::Arr(vec![V::Bulk(b"S".to_vec())]));
    assert_eq!(c.call(&["SALE.INFO", "S"]), before);
    assert_eq!(c.call(&["RESERVATION", &token]), before_res);
    assert_eq!(c.call(&["STOCK", "S"]), V::Int(9));

    // Well-formed but unknown identifiers still get the engine's answers.
    assert!(c.call(&["STOCK", "NOPE"]).err_text().starts_with("NOSALE"));
    assert!(c
        .call(&["SALE.PAUSE", "NOPE"])
        .err_text()
        .starts_with("NOSALE"));
    let unknown = format!("{{S}}{}", "a".repeat(26));
    assert_eq!(c.call(&["RESERVATION", &unknown]), V::Nil);
    assert_eq!(c.call(&["RELEASE", &unknown]), V::Int(0));
    assert!(c
        .call(&["COMMIT", &unknown])
        .err_text()
        .starts_with("NORES"));
    assert_eq!(c.call(&["EXPIRED", "SKU", "NOPE"]), V::Arr(vec![]));
    // The valid token still works.
    assert_eq!(c.call(&["COMMIT", &token]), V::Int(1));
}
