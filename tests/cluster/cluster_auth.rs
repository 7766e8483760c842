//! Leaders of groups whose members require passwords (docs/cluster.md, "How leaders are
//! found"). Group `a` lists two members: the first is a port nothing listens on, the
//! second a running node with a users file, so the only way node `b` can name the live
//! member is by asking it `ROLE` after logging in. Without `--cluster-user` /
//! `--cluster-password-file` it cannot (every answer is `-NOAUTH`) and names the map's
//! first member; with them it names the live one in `CLUSTER SLOTS` and `-MOVED`.

use std::process::Command;
use std::time::Duration;

use crate::common::cluster::node_id;
use crate::common::ha::{free_port, wait_for, Keys, Node};
use crate::common::{server_bin, TempDir};
use stockgate_server::cluster::key_slot;

/// `probe-pw`'s SHA-256, as the users file takes it.
const PROBE_HASH: &str = "42fc698233366d78cc4e1afbc91f6f1b483cd6d0d6029bdc58e7337f07f8f281";

fn admin(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://admin:admin-pw@127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connect as admin")
}

/// The port `port`'s `CLUSTER SLOTS` names first for the range holding `slot`.
fn named_master(port: u16, slot: u16) -> Option<i64> {
    use redis::Value::{Array, Int};
    let v: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut admin(port))
        .ok()?;
    let Array(ranges) = v else { return None };
    ranges.iter().find_map(|r| {
        let Array(r) = r else { return None };
        match r.as_slice() {
            [Int(lo), Int(hi), Array(master), ..] if (*lo..=*hi).contains(&i64::from(slot)) => {
                match master.get(1) {
                    Some(Int(p)) => Some(*p),
                    _ => None,
                }
            }
            _ => None,
        }
    })
}

#[test]
fn members_behind_passwords_are_asked_after_logging_in() {
    let keys = Keys::new();
    let dir = TempDir::new("cluster-auth");
    let (dead, live, b_port) = (free_port(), free_port(), free_port());
    let map = dir.path().join("cluster.map");
    std::fs::write(
        &map,
        format!(
            "group a 0-8191\nnode {} 127.0.0.1:{dead}\nnode {} 127.0.0.1:{live}\ngroup b 8192-16383\nnode {} 127.0.0.1:{b_port}\n",
            node_id(0),
            node_id(1),
            node_id(2)
        ),
    )
    .expect("map");
    let users = dir.path().join("users");
    std::fs::write(
        &users,
        format!("admin admin admin-pw\nprobe replication #{PROBE_HASH}\n"),
    )
    .expect("users");
    let pw = dir.path().join("probe.pw");
    std::fs::write(&pw, "probe-pw\n").expect("password file");
    let (m, u, p) = (
        map.display().to_string(),
        users.display().to_string(),
        pw.display().to_string(),
    );
    let flags = [
        "--cluster-enabled",
        "yes",
        "--cluster-config",
        &m,
        "--users-file",
        &u,
    ];
    let _a = Node::start_on(&keys, live, &flags, &[]);
    let mut b = Node::start_on(&keys, b_port, &flags, &[]);
    let sku_a = (0..)
        .map(|i| format!("A{i}"))
        .find(|s| key_slot(s.as_bytes()) <= 8191)
        .unwrap_or_default();
    let slot_a = key_slot(sku_a.as_bytes());

    // Without a login every member of `a` answers -NOAUTH: b names the map's first.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(named_master(b_port, slot_a), Some(i64::from(dead)));

    b.kill9();
    b.args
        .extend(["--cluster-user", "probe", "--cluster-password-file", &p].map(String::from));
    b.restart();
    wait_for(
        "b to name the live member of a",
        Duration::from_secs(5),
        || named_master(b_port, slot_a) == Some(i64::from(live)),
    );
    let err = redis::cmd("SALE.CREATE")
        .arg(&sku_a)
        .arg(10)
        .query::<redis::Value>(&mut admin(b_port))
        .expect_err("a's sku is moved");
    assert_eq!(
        format!(
            "{} {}",
            err.code().unwrap_or("?"),
            err.detail().unwrap_or("")
        ),
        format!("MOVED {slot_a} 127.0.0.1:{live}")
    );
}

#[test]
fn probe_login_flags_are_checked_at_startup() {
    let dir = TempDir::new("cluster-auth-flags");
    let empty = dir.path().join("empty.pw");
    std::fs::write(&empty, "\n").expect("file");
    let map = dir.path().join("m");
    let port = free_port();
    std::fs::write(
        &map,
        format!("group a 0-16383\nnode {} 127.0.0.1:{port}\n", node_id(0)),
    )
    .expect("map");
    let run = |extra: &[&str]| {
        let out = Command::new(server_bin())
            .args(["--port", &port.to_string(), "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--create-keys",
                "--cluster-enabled",
                "yes",
                "--cluster-config",
            ])
            .arg(&map)
            .args(extra)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{extra:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = empty.display().to_string();
    assert!(run(&["--cluster-password-file", &e]).contains("the first line must hold the password"));
    assert!(
        run(&["--cluster-user", "probe"]).contains("--cluster-user needs --cluster-password-file")
    );
    assert!(run(&["--cluster-password-file", "/nonexistent/pw"])
        .contains("cannot read --cluster-password-file /nonexistent/pw"));
}
