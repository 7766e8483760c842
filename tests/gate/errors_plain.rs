//! Every error says what was wrong and what is accepted, in plain words: bad arguments
//! sent to a real server, bad flag values given to every binary, a ledger login refused.
//! The exact messages are asserted; the code before them (ERR, NOPROTO...) is what
//! clients decode and stays as it was.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;
use stockgate_testkit::sibling_binary as bin;

use crate::common::*;
use redis::Value;
use stockgate_client::types::ReserveOutcome;
use stockgate_client::StockgateClient;

/// One command over a fresh connection; the first line of the reply.
fn first_line(addr: &str, args: &[&[u8]]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a);
        req.extend_from_slice(b"\r\n");
    }
    s.write_all(&req).expect("write");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("read");
    line.trim_end().to_string()
}

/// The error a command is answered with, without the leading `-`.
fn error_of_bytes(addr: &str, args: &[&[u8]]) -> String {
    let line = first_line(addr, args);
    let shown: Vec<_> = args.iter().map(|a| String::from_utf8_lossy(a)).collect();
    assert!(
        line.starts_with('-'),
        "{shown:?} answered {line:?}, not an error"
    );
    let msg = line[1..].to_string();
    assert!(
        !msg.contains("..="),
        "{shown:?}: Rust range syntax in {msg:?}"
    );
    msg
}

fn error_of(addr: &str, args: &[&str]) -> String {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    error_of_bytes(addr, &a)
}

const I64_MAX: &str = "9223372036854775807";

#[test]
fn numeric_arguments_say_the_accepted_range() {
    let srv = Server::start(&[]);
    let a = srv.addr.as_str();
    let qty = "ERR qty must be between 1 and 1000000";
    let qty_nan = "ERR qty is not an integer (must be between 1 and 1000000)";
    // Negative, zero, too large, too large for any integer: the range every time.
    for q in ["-1", "0", "1000001", "1000000000000000000000000000000"] {
        assert_eq!(
            error_of(a, &["RESERVE", "S", "alice", "adm", "r1", "QTY", q]),
            qty,
            "QTY {q}"
        );
    }
    for q in ["10^30", "two", "1.5", ""] {
        assert_eq!(
            error_of(a, &["RESERVE", "S", "alice", "adm", "r1", "QTY", q]),
            qty_nan,
            "QTY {q:?}"
        );
    }
    let shards = "ERR shards must be between 1 and 1024";
    assert_eq!(
        error_of(a, &["SALE.CREATE", "S", "10", "SHARDS", "0"]),
        shards
    );
    assert_eq!(
        error_of(a, &["SALE.CREATE", "S", "10", "SHARDS", "100000"]),
        shards
    );
    assert_eq!(
        error_of(a, &["SALE.CREATE", "S", "10", "SHARDS", "many"]),
        "ERR shards is not an integer (must be between 1 and 1024)"
    );
    assert_eq!(
        error_of(a, &["SALE.CREATE", "S", "10", "TTL", "0"]),
        "ERR ttl must be between 1 and 2592000000"
    );
    assert_eq!(
        error_of(a, &["SALE.CREATE", "S", "10", "LIMIT", "-1"]),
        "ERR limit must be between 0 and 4294967295"
    );
    assert_eq!(
        error_of(a, &["SALE.CREATE", "S", "-1"]),
        "ERR total must be between 0 and 1099511627776"
    );
    assert_eq!(
        error_of(a, &["SALE.ADJUST", "S", "99999999999999999999"]),
        "ERR delta must be between -1099511627776 and 1099511627776"
    );
    assert_eq!(
        error_of(a, &["EXTEND", "{S}aaaaaaaaaaaaaaaaaaaaaaaaaa", "0"]),
        "ERR ms must be between 1 and 2592000000"
    );
    for c in ["0", "-5", "99999999999999999999"] {
        assert_eq!(
            error_of(a, &["EXPIRED", "COUNT", c]),
            format!("ERR count must be between 1 and {I64_MAX}"),
            "EXPIRED COUNT {c}"
        );
    }
    assert_eq!(
        error_of(a, &["EXPIRED", "COUNT", "ten"]),
        format!("ERR count is not an integer (must be between 1 and {I64_MAX})")
    );
    assert_eq!(
        error_of(
            a,
            &["XREAD", "COUNT", "ten", "STREAMS", "stockgate:orders", "0"]
        ),
        format!("ERR count is not an integer (must be between 0 and {I64_MAX})")
    );
    assert_eq!(
        error_of(
            a,
            &["XREAD", "BLOCK", "-1", "STREAMS", "stockgate:orders", "0"]
        ),
        format!("ERR timeout must be between 0 and {I64_MAX}")
    );
    assert_eq!(
        error_of(a, &["SLOWLOG", "GET", "-2"]),
        format!("ERR count must be between -1 and {I64_MAX}")
    );
    assert_eq!(
        error_of(a, &["WAIT", "0", "-1"]),
        format!("ERR timeout must be between 0 and {I64_MAX}")
    );
    assert_eq!(
        error_of(a, &["HELLO", "three"]),
        "ERR protocol version is not an integer (must be between 2 and 3)"
    );
    assert_eq!(
        error_of(a, &["HELLO", "4"]),
        "NOPROTO unsupported protocol version: stockgate speaks RESP 2 and 3"
    );
    assert_eq!(
        error_of(
            a,
            &[
                "SALE.RESTORE",
                "S",
                "alice",
                "r1",
                "1",
                "1",
                "1",
                "STATE",
                "PAID"
            ]
        ),
        "ERR state must be one of RESERVED, COMMITTED or RELEASED"
    );
}

#[test]
fn identifiers_say_their_rule() {
    let srv = Server::start(&[]);
    let a = srv.addr.as_str();
    let long = "A".repeat(100);
    assert_eq!(
        error_of(a, &["RESERVE", &long, "alice", "adm", "r1"]),
        "ERR invalid sku: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"
    );
    assert_eq!(
        error_of(a, &["STOCK", "has space"]),
        "ERR invalid sku: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"
    );
    assert_eq!(
        error_of(a, &["RESERVE", "S", "a|b", "adm", "r1"]),
        "ERR invalid user: must be 1 to 128 printable ASCII characters, no space, | { or }"
    );
    assert_eq!(
        error_of(a, &["RESERVE", "S", "alice", "adm", &"r".repeat(129)]),
        "ERR invalid request-id: must be 1 to 128 printable ASCII characters, no space, | { or }"
    );
    assert_eq!(
        error_of(a, &["COMMIT", "{S}short"]),
        "ERR invalid token: must be {sku} followed by 26 characters of a-z and 2-7, as \
         RESERVE returned it"
    );
    assert_eq!(
        error_of_bytes(a, &[b"SALE.REBUILD", b"S", b"10", b"0", b"\xff\xfe"]),
        "ERR invalid fingerprint: must be UTF-8 text"
    );
}

/// LIMIT keeps its shape (`[LIMIT, token...]`, what clients parse); `WITHLIMIT` asks for
/// `[LIMIT, limit, held, [token...]]`, and the Rust client reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_reply_can_say_the_limit_and_the_units_held() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    cmd(
        &mut c,
        &["SALE.CREATE", "L", "10", "SHARDS", "1", "LIMIT", "2"],
    )
    .await
    .unwrap();
    let adm = srv.keyring().mint("L", "alice", now_ms() + 60_000);
    let r = cmd(&mut c, &["RESERVE", "L", "alice", &adm, "r1", "QTY", "2"])
        .await
        .unwrap();
    let Value::Array(r) = r else { panic!("{r:?}") };
    assert_eq!(r.len(), 4, "{r:?}");
    let token = as_str(&r[1]);

    let plain = cmd(&mut c, &["RESERVE", "L", "alice", &adm, "r2"])
        .await
        .unwrap();
    assert_eq!(
        plain,
        Value::Array(vec![
            Value::BulkString(b"LIMIT".to_vec()),
            Value::BulkString(token.clone().into_bytes()),
        ]),
        "without WITHLIMIT the reply is unchanged"
    );
    let detailed = cmd(&mut c, &["RESERVE", "L", "alice", &adm, "r3", "WITHLIMIT"])
        .await
        .unwrap();
    assert_eq!(
        detailed,
        Value::Array(vec![
            Value::BulkString(b"LIMIT".to_vec()),
            Value::Int(2),
            Value::Int(2),
            Value::Array(vec![Value::BulkString(token.clone().into_bytes())]),
        ])
    );
    // WITHLIMIT changes nothing else: a reservation that fits answers RESERVED as ever.
    let bob = srv.keyring().mint("L", "bob", now_ms() + 60_000);
    let ok = cmd(&mut c, &["RESERVE", "L", "bob", &bob, "r1", "WITHLIMIT"])
        .await
        .unwrap();
    let Value::Array(ok) = ok else {
        panic!("{ok:?}")
    };
    assert_eq!(as_str(&ok[0]), "RESERVED");
    assert_eq!(ok.len(), 4);

    let client = StockgateClient::connect(&srv.addr).await.unwrap();
    let out = client.reserve("L", "alice", &adm, "r4", 1).await.unwrap();
    assert_eq!(
        out,
        ReserveOutcome::Limit {
            live_tokens: vec![token],
            limit: 2,
            held: 2,
        }
    );
}

/// A binary next to this test's executable (`target/<profile>/<name>`).
/// Runs `name args`, which must fail; its stderr.
fn refused(name: &str, args: &[&str]) -> String {
    let out = Command::new(bin(name))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("STOCKGATE_BENCH_AUTH")
        .output()
        .expect("run the binary");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{name} {args:?} was accepted: {stderr}"
    );
    assert!(
        !stderr.contains("..="),
        "{name} {args:?}: Rust range syntax: {stderr}"
    );
    stderr
}

/// The first line of a refusal.
fn refusal(name: &str, args: &[&str]) -> String {
    refused(name, args).lines().next().unwrap_or("").to_string()
}

#[test]
fn every_binary_says_a_flag_values_range() {
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "stockgate",
            &["--shards", "0"],
            "error: invalid value '0' for '--shards <SHARDS>': out of range: must be between 1 and 1024",
        ),
        (
            "stockgate",
            &["--shards", "100000"],
            "error: invalid value '100000' for '--shards <SHARDS>': out of range: must be between 1 and 1024",
        ),
        (
            "stockgate",
            &["--port", "99999"],
            "error: invalid value '99999' for '--port <PORT>': out of range: must be between 0 and 65535",
        ),
        (
            "stockgate",
            &["--port", "-1"],
            "error: invalid value '-1' for '--port <PORT>': out of range: must be between 0 and 65535",
        ),
        (
            "stockgate",
            &["--port", "abc"],
            "error: invalid value 'abc' for '--port <PORT>': not a whole number (must be between 0 and 65535)",
        ),
        (
            "stockgate",
            &["--tcp-backlog", "0"],
            "error: invalid value '0' for '--tcp-backlog <TCP_BACKLOG>': out of range: must be between 1 and 65535",
        ),
        (
            "stockgate",
            &["--ttl-ms", "0"],
            "error: invalid value '0' for '--ttl-ms <TTL_MS>': out of range: must be between 1 and 2592000000",
        ),
        (
            "stockgate",
            &["top", "--interval-ms", "10"],
            "error: invalid value '10' for '--interval-ms <INTERVAL_MS>': out of range: must be between 100 and 3600000",
        ),
        (
            "stockgate-sweeper",
            &["--batch", "0"],
            "error: invalid value '0' for '--batch <BATCH>': out of range: must be between 1 and 10000",
        ),
        (
            "stockgate-sweeper",
            &["--interval-secs", "-1"],
            "error: invalid value '-1' for '--interval-secs <INTERVAL_SECS>': out of range: must be between 0.001 and 86400 seconds",
        ),
        (
            "stockgate-sweeper",
            &["--interval-secs", "soon"],
            "error: invalid value 'soon' for '--interval-secs <INTERVAL_SECS>': not a number (must be between 0.001 and 86400 seconds)",
        ),
        (
            "stockgate-sweeper",
            &["create-sale", "--sku", "S", "--total", "-1"],
            "error: invalid value '-1' for '--total <TOTAL>': out of range: must be between 0 and 1099511627776",
        ),
        (
            "stockgate-sweeper",
            &["create-sale", "--sku", "S", "--total", "5", "--shards", "0"],
            "error: invalid value '0' for '--shards <SHARDS>': out of range: must be between 1 and 1024",
        ),
        (
            "stockgate-sweeper",
            &["adjust", "--sku", "S", "--delta", "10^30"],
            "error: invalid value '10^30' for '--delta <DELTA>': not a whole number (must be between -1099511627776 and 1099511627776)",
        ),
        (
            "stockgate-materializer",
            &["--batch", "0"],
            "error: invalid value '0' for '--batch <BATCH>': out of range: must be between 1 and 10000",
        ),
        (
            "stockgate-bench",
            &["--runs", "0"],
            "error: invalid value '0' for '--runs <RUNS>': out of range: must be between 1 and 1000",
        ),
        (
            "stockgate-bench",
            &["--duration", "0"],
            "error: invalid value '0' for '--duration <DURATION>': out of range: must be between 0.05 and 86400 seconds",
        ),
    ];
    for (name, args, want) in cases {
        assert_eq!(&refusal(name, args), want, "{name} {args:?}");
    }
}

#[test]
fn mint_token_and_bench_name_what_is_missing() {
    let dir = TempDir::new("errors-plain-mint");
    std::fs::write(
        dir.path().join("secret"),
        format!("k1 {}\n", "ab".repeat(32)),
    )
    .unwrap();
    let d = dir.path().to_str().unwrap();
    assert_eq!(
        refusal(
            "stockgate",
            &[
                "mint-token",
                "--data-dir",
                d,
                "--sku",
                "no space",
                "--user",
                "u"
            ]
        ),
        "stockgate: --sku: invalid sku: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"
    );
    assert_eq!(
        refusal(
            "stockgate",
            &[
                "mint-token",
                "--data-dir",
                d,
                "--sku",
                "S",
                "--user",
                "u",
                "--kid",
                "k9"
            ]
        ),
        format!("stockgate: no key with id k9 in {d}/secret")
    );
    assert_eq!(
        refusal("stockgate-bench", &["--addr", "127.0.0.1:1"]),
        "stockgate-bench: --addr needs --secret-file: the deployment's admission keys (the \
         file its server takes as --secret-file), to sign the buyers' admission tokens"
    );
}

/// A login Postgres refuses is reported as that, naming the user, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_migrate_says_the_database_refused_the_login() {
    use sqlx::Connection;
    use stockgate_testkit::pgtemp::{PgOptions, TempPostgres};
    if std::env::var("STOCKGATE_TEST_DATABASE_URL").is_ok_and(|u| !u.trim().is_empty()) {
        eprintln!("skipped: an external Postgres's pg_hba.conf is not ours to change");
        return;
    }
    // Our own pg_hba.conf: the superuser is trusted (to create the role), everyone else
    // must give a password.
    let dir = TempDir::new("errors-plain-hba");
    let hba = dir.path().join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 scram-sha-256\n\
         host all postgres ::1/128 trust\n\
         host all all ::1/128 scram-sha-256\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755));
        let _ = std::fs::set_permissions(&hba, std::fs::Permissions::from_mode(0o644));
    }
    let mut opts = PgOptions::default();
    opts.settings
        .push(("hba_file".into(), hba.to_string_lossy().into_owned()));
    let pg = TempPostgres::start_with(opts).await.expect("postgres");
    let port = pg.port().expect("an owned cluster");
    let mut admin = sqlx::PgConnection::connect(pg.url()).await.unwrap();
    sqlx::query("CREATE ROLE sg LOGIN PASSWORD 'right-pw'")
        .execute(&mut admin)
        .await
        .unwrap();
    let _ = admin.close().await;

    let password = "wrong-pw-SECRET-19";
    let url = format!("postgres://sg:{password}@127.0.0.1:{port}/postgres");
    let out = Command::new(bin("stockgate-sweeper"))
        .args(["--database-url", &url, "migrate"])
        .output()
        .expect("run stockgate-sweeper");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "the database refused the login: password authentication failed for user \\\"sg\\\"; \
             check the user and password of --database-url (DATABASE_URL)"
        ) || stderr.contains(
            "the database refused the login: password authentication failed for user \"sg\"; \
             check the user and password of --database-url (DATABASE_URL)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("migration error"), "{stderr}");
    for text in [&stderr, &stdout] {
        assert!(!text.contains(password), "the password was printed: {text}");
    }
}
