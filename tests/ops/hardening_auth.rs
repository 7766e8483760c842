//! Authentication and roles: every command × every role, NOAUTH before AUTH, HELLO 3
//! AUTH, wrong passwords counted in INFO.

use crate::common::*;
use redis::Value;

const USERS: &str = "\
# user role password
boss admin s3cret-admin
shop checkout s3cret-shop
broom sweeper s3cret-broom
";

fn is_err_with(r: &redis::RedisResult<Value>, code: &str) -> bool {
    match r {
        Err(e) => e.code() == Some(code) || e.to_string().contains(code),
        Ok(Value::ServerError(e)) => e.code() == code,
        Ok(_) => false,
    }
}

async fn conn_as(srv: &Server, user: &str, pass: &str) -> redis::aio::MultiplexedConnection {
    let url = format!("redis://{user}:{pass}@{}/", srv.addr);
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_tokio_connection()
        .await
        .expect("auth connect")
}

fn users_server() -> (Server, TempDir) {
    let dir = TempDir::new("users");
    let f = dir.path().join("users");
    std::fs::write(&f, USERS).unwrap();
    let srv = Server::start(&["--users-file", f.to_str().unwrap()]);
    (srv, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_matrix() {
    let (srv, _d) = users_server();
    let mut admin = conn_as(&srv, "boss", "s3cret-admin").await;
    cmd(&mut admin, &["SALE.CREATE", "S", "10"]).await.unwrap();
    let keys = srv.keyring();
    let adm = keys.mint("S", "u", now_ms() + 60_000);
    let tok = "{S}aaaaaaaaaaaaaaaaaaaaaaaaaa";
    let fp = "0000000000000000";
    // (command line, roles allowed besides admin)
    let matrix: Vec<(Vec<&str>, &[&str])> = vec![
        (vec!["RESERVE", "S", "u", &adm, "r"], &["checkout"]),
        (vec!["STOCK", "S"], &["checkout"]),
        (vec!["RESERVATION", tok], &["checkout", "sweeper"]),
        (vec!["EXTEND", tok, "100"], &["checkout"]),
        (vec!["COMMIT", tok], &["checkout", "sweeper"]),
        (vec!["RELEASE", tok], &["checkout", "sweeper"]),
        (vec!["EXPIRED"], &["sweeper"]),
        (vec!["SALE.CREATE", "X", "1"], &[]),
        (vec!["SALE.INFO", "S"], &[]),
        (vec!["SALE.LIST"], &[]),
        (vec!["SALE.PAUSE", "S"], &[]),
        (vec!["SALE.RESUME", "S"], &[]),
        (vec!["SALE.ADJUST", "S", "0"], &[]),
        (vec!["SALE.FENCE", "Z"], &[]),
        (vec!["SALE.RESTORE", "Z", "u", "r", "1", "0", "0"], &[]),
        (vec!["SALE.REBUILD", "Z", "1", "0", fp], &[]),
        (vec!["SAVE"], &[]),
        (vec!["CONFIG", "GET", "port"], &[]),
        (vec!["TIME"], &[]),
        (vec!["DBSIZE"], &[]),
        (vec!["PING"], &["checkout", "sweeper"]),
        (vec!["ECHO", "x"], &["checkout", "sweeper"]),
        (vec!["CLIENT", "ID"], &["checkout", "sweeper"]),
        (vec!["SELECT", "0"], &["checkout", "sweeper"]),
        (vec!["COMMAND", "COUNT"], &["checkout", "sweeper"]),
        (vec!["INFO", "server"], &["checkout", "sweeper"]),
        // Discovery is for every client; moving a group's leadership is not.
        (
            vec!["SENTINEL", "get-master-addr-by-name", "stockgate"],
            &["checkout", "sweeper"],
        ),
        (vec!["SENTINEL", "FAILOVER", "stockgate"], &[]),
    ];
    let mut shop = conn_as(&srv, "shop", "s3cret-shop").await;
    let mut broom = conn_as(&srv, "broom", "s3cret-broom").await;
    for (line, allowed) in &matrix {
        for (role, c) in [
            ("admin", &mut admin),
            ("checkout", &mut shop),
            ("sweeper", &mut broom),
        ] {
            let r = cmd(c, line).await;
            let ok = role == "admin" || allowed.contains(&role);
            assert_eq!(
                !is_err_with(&r, "NOPERM"),
                ok,
                "{role} running {:?} gave {r:?}",
                line[0]
            );
            assert!(!is_err_with(&r, "NOAUTH"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noauth_hello_and_failures() {
    let (srv, _d) = users_server();
    let mut anon = srv.conn().await;
    assert!(is_err_with(
        &cmd(&mut anon, &["STOCK", "S"]).await,
        "NOAUTH"
    ));
    assert!(is_err_with(&cmd(&mut anon, &["PING"]).await, "NOAUTH"));
    assert!(is_err_with(
        &cmd(&mut anon, &["HELLO", "3"]).await,
        "NOAUTH"
    ));
    for _ in 0..3 {
        assert!(is_err_with(
            &cmd(&mut anon, &["AUTH", "boss", "wrong"]).await,
            "WRONGPASS"
        ));
    }
    assert!(is_err_with(
        &cmd(&mut anon, &["AUTH", "nobody", "s3cret-admin"]).await,
        "WRONGPASS"
    ));
    let r = cmd(&mut anon, &["HELLO", "2", "AUTH", "broom", "s3cret-broom"])
        .await
        .unwrap();
    assert_eq!(as_int(&field(&r, "proto").unwrap()), 2);
    assert!(is_err_with(&cmd(&mut anon, &["SALE.LIST"]).await, "NOPERM"));
    assert!(cmd(&mut anon, &["EXPIRED"]).await.is_ok());
    // RESET forgets the login.
    cmd(&mut anon, &["RESET"]).await.unwrap();
    assert!(is_err_with(&cmd(&mut anon, &["EXPIRED"]).await, "NOAUTH"));
    let mut admin = conn_as(&srv, "boss", "s3cret-admin").await;
    let info = as_str(&cmd(&mut admin, &["INFO", "stats"]).await.unwrap());
    assert!(info.contains("auth_failures:4"), "{info}");
    // Passwords are never echoed back anywhere.
    assert!(!info.contains("s3cret"));
}

#[test]
fn open_mode_refuses_non_loopback_without_flag() {
    let out = std::process::Command::new(server_bin())
        .args(["--bind", "0.0.0.0", "--port", "0", "--data-dir"])
        .arg(TempDir::new("open").path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-open"));
}
