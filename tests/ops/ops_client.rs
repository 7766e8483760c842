//! `CLIENT LIST`, `CLIENT HELP` and `SHUTDOWN` as Redis clients use them, over the real
//! binary: redis-cli's and redis-py's views of the client list, the help the unknown-
//! subcommand error points to, a shutdown that exits 0 with every write kept, and the
//! admin right both need where users exist.

use std::process::Command;
use std::time::Duration;

use crate::common::*;
use redis::Value;

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian package redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for the server's process to end by itself; its exit code.
fn exit_code(srv: &mut Server) -> Option<i32> {
    let mut child = srv.child.take().expect("running");
    for _ in 0..200 {
        if let Ok(Some(st)) = child.try_wait() {
            return st.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("the server did not exit after SHUTDOWN");
}

/// One CLIENT LIST line's `key=value` fields, in order.
fn fields(line: &str) -> Vec<(String, String)> {
    line.split(' ')
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_and_help_over_redis_cli() {
    let srv = Server::start(&[]);
    let mut named = srv.conn().await;
    cmd(&mut named, &["CLIENT", "SETNAME", "cart"])
        .await
        .unwrap();
    cmd(&mut named, &["PING"]).await.unwrap();
    let list = redis_cli(srv.port, &["CLIENT", "LIST"]);
    let line = list
        .lines()
        .find(|l| l.contains(" name=cart "))
        .unwrap_or_else(|| panic!("no line for the named client:\n{list}"));
    let f = fields(line);
    let keys: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
    // Redis's order for the fields clients read first and last.
    assert_eq!(
        &keys[..7],
        ["id", "addr", "laddr", "fd", "name", "age", "idle"],
        "{line}"
    );
    for k in [
        "flags", "db", "sub", "psub", "multi", "qbuf", "omem", "cmd", "user", "resp",
    ] {
        assert!(keys.contains(&k), "{k} missing: {line}");
    }
    let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("laddr"), Some(srv.addr.as_str()));
    assert_eq!(get("db"), Some("0"));
    assert_eq!(get("flags"), Some("N"));
    assert_eq!(get("cmd"), Some("ping"));
    assert_eq!(get("user"), Some("default"));
    // redis-cli's own connection is listed too.
    assert!(list.lines().count() >= 2, "{list}");

    let unknown = redis_cli(srv.port, &["CLIENT", "NOSUCH"]);
    assert!(unknown.contains("Try CLIENT HELP"), "{unknown}");
    let help = redis_cli(srv.port, &["CLIENT", "HELP"]);
    assert!(
        help.starts_with("CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"),
        "{help}"
    );
    for sub in ["LIST", "KILL <ip:port>", "SETNAME <name>", "HELP"] {
        assert!(help.lines().any(|l| l == sub), "{sub} missing:\n{help}");
    }
    // COMMAND INFO: the 10-element entries, with CLIENT's subcommands in the tenth.
    let mut c = srv.conn().await;
    let info = cmd(&mut c, &["COMMAND", "INFO", "shutdown", "client"])
        .await
        .unwrap();
    let Value::Array(entries) = info else {
        panic!("{info:?}")
    };
    for e in &entries {
        let Value::Array(e) = e else { panic!("{e:?}") };
        assert_eq!(e.len(), 10, "{e:?}");
    }
    let Value::Array(client) = &entries[1] else {
        unreachable!()
    };
    let Value::Array(subs) = &client[9] else {
        panic!("{:?}", client[9])
    };
    let names: Vec<String> = subs
        .iter()
        .map(|s| match s {
            Value::Array(s) if s.len() == 10 => as_str(&s[0]),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(names.contains(&"client|list".to_string()), "{names:?}");
    assert!(names.contains(&"client|help".to_string()), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_over_redis_cli_exits_0_and_keeps_the_data() {
    let mut srv = Server::start(&["--fsync", "everysec"]);
    let mut c = srv.conn().await;
    cmd(&mut c, &["SALE.CREATE", "shoe", "10"]).await.unwrap();
    drop(c);
    // Redis sends no reply to a SHUTDOWN that works: the connection just closes.
    let out = redis_cli(srv.port, &["SHUTDOWN", "NOSAVE"]);
    assert!(!out.contains("ERR"), "{out}");
    assert_eq!(exit_code(&mut srv), Some(0));
    let again = Server::start_in(&srv.data_dir, &[]);
    let mut c = again.conn().await;
    let info = cmd(&mut c, &["SALE.INFO", "shoe"]).await.unwrap();
    assert_eq!(
        field(&info, "total").map(|v| as_int(&v)),
        Some(10),
        "{info:?}"
    );
    // A modifier stockgate does not take is refused with the usage.
    let e = cmd(&mut c, &["SHUTDOWN", "ABORT"])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("syntax error: SHUTDOWN [NOSAVE|SAVE]"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_client_list_need_admin_where_users_exist() {
    let dir = TempDir::new("client-users");
    let users = dir.path().join("users");
    std::fs::write(&users, "boss admin boss-pw\nshop checkout shop-pw\n").unwrap();
    let mut srv = Server::start(&["--users-file", users.to_str().unwrap()]);
    let addr = srv.addr.clone();
    let as_user = |u: &str, p: &str| {
        let c = redis::Client::open(format!("redis://{u}:{p}@{addr}/")).unwrap();
        async move { c.get_multiplexed_tokio_connection().await.unwrap() }
    };
    let mut shop = as_user("shop", "shop-pw").await;
    for args in [&["SHUTDOWN"][..], &["CLIENT", "LIST"]] {
        let e = cmd(&mut shop, args).await.unwrap_err().to_string();
        assert!(e.contains("NOPERM"), "{args:?}: {e}");
    }
    assert!(srv.is_running());
    let mut boss = as_user("boss", "boss-pw").await;
    let list = as_str(&cmd(&mut boss, &["CLIENT", "LIST"]).await.unwrap());
    assert!(list.contains(" user=shop "), "{list}");
    let _ = cmd(&mut boss, &["SHUTDOWN", "SAVE"]).await;
    assert_eq!(exit_code(&mut srv), Some(0));
}

/// redis-py parses CLIENT LIST into dicts and COMMAND into its command table, and its
/// `shutdown()` takes the closed connection as success.
#[test]
fn redis_py_client_list_and_shutdown() {
    let mut srv = Server::start(&[]);
    let script = r#"
import sys, redis
r = redis.Redis(port=int(sys.argv[1]))
r.client_setname("py")
r.execute_command("SALE.CREATE", "hat", "5")
clients = r.client_list()
me = [c for c in clients if c["name"] == "py"]
assert len(me) == 1, clients
assert me[0]["laddr"] and me[0]["db"] == "0" and me[0]["user"] == "default", me
table = r.command()
assert table["shutdown"]["arity"] == -1, table["shutdown"]
assert table["client"]["name"] == "client", table["client"]
r.shutdown(nosave=True)
print("redis-py client ok")
"#;
    let out = Command::new("python3")
        .args(["-c", script, &srv.port.to_string()])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("redis-py client ok"),
        "needs `pip install redis`:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(exit_code(&mut srv), Some(0));
    let again = Server::start_in(&srv.data_dir, &[]);
    let rt = runtime();
    rt.block_on(async {
        let mut c = again.conn().await;
        let info = cmd(&mut c, &["SALE.INFO", "hat"]).await.unwrap();
        assert_eq!(
            field(&info, "total").map(|v| as_int(&v)),
            Some(5),
            "{info:?}"
        );
    });
}
