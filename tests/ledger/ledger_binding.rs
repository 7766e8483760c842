//! A ledger describes the server histories it is bound to. Pointed at another server
//! (another group, a wiped data dir), every tool that writes to the ledger refuses before
//! it changes anything, naming both ids and the deliberate ways on (`bind` another
//! group, `rebind` to follow this server); the same server after a `kill -9` is the same
//! history. Several groups on one ledger: `tests/cluster/cluster_ledger.rs`.

use std::path::Path;
use std::process::Command;

use crate::operator::{sweeper_bin, sweeper_cli, wait_for_server};
use stockgate_client::StockgateClient;
use stockgate_ledger::Ledger;
use stockgate_testkit::Harness;

/// A binary of the workspace, next to this test's executable.
fn bin(name: &str) -> std::path::PathBuf {
    sweeper_bin().with_file_name(name)
}

/// `stockgate-sweeper` against `server` (not the harness's), bounded by `timeout`.
fn sweeper_at(h: &Harness, server: &str, args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .arg("60")
        .arg(sweeper_bin())
        .arg("--database-url")
        .arg(h.pg.url())
        .arg("--server")
        .arg(server)
        .args(args)
        .output()
        .expect("stockgate-sweeper")
}

fn refused_naming(out: &std::process::Output, ledger: &str, server: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains(&format!("describes server history {ledger}"))
            && err.contains(&format!("reports history {server}"))
            && err.contains(&format!("stockgate-sweeper rebind --history {server}"))
            && err.contains(&format!("stockgate-sweeper bind --history {server}")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_refuses_a_server_of_another_history() {
    let mut h = Harness::start().await.expect("harness");
    let other = crate::common::Server::start(&[]);
    let other_addr = format!("127.0.0.1:{}", other.port);
    let foreign = StockgateClient::connect(&other_addr)
        .await
        .expect("connect");

    // First contact binds the ledger to the server it talks to.
    assert_eq!(h.ledger.bound_history().await.unwrap(), None);
    sweeper_cli(&h, &["create-sale", "--sku", "BIND", "--total", "10"]).ok();
    let mine = h.client.history().await.unwrap().expect("a history id");
    let theirs = foreign.history().await.unwrap().expect("a history id");
    assert_ne!(mine, theirs);
    assert_eq!(h.ledger.bound_history().await.unwrap(), Some(mine.clone()));

    // Against the other server: refused, and nothing happened there (the sweeper would
    // otherwise fence a sale it does not know).
    refused_naming(
        &sweeper_at(&h, &other_addr, &["run", "--once"]),
        &mine,
        &theirs,
    );
    refused_naming(
        &sweeper_at(
            &h,
            &other_addr,
            &["adjust", "--sku", "BIND", "--delta", "5"],
        ),
        &mine,
        &theirs,
    );
    refused_naming(
        &sweeper_at(&h, &other_addr, &["rebuild", "--sku", "BIND", "--fence"]),
        &mine,
        &theirs,
    );
    assert!(foreign.sale_list().await.unwrap().is_empty());
    assert_eq!(h.ledger.sale("BIND").await.unwrap().unwrap().allocation, 10);
    let mat = Command::new("timeout")
        .arg("60")
        .arg(bin("stockgate-materializer"))
        .arg("--database-url")
        .arg(h.pg.url())
        .arg("--server")
        .arg(&other_addr)
        .arg("--drain")
        .output()
        .expect("stockgate-materializer");
    assert_eq!(mat.status.code(), Some(3), "{mat:?}");
    refused_naming(&mat, &mine, &theirs);
    // The daemon too stops at once: a mismatch is no outage to wait out (`timeout`'s
    // 124 would mean it kept retrying).
    let daemon = Command::new("timeout")
        .arg("20")
        .arg(bin("stockgate-materializer"))
        .arg("--database-url")
        .arg(h.pg.url())
        .arg("--server")
        .arg(&other_addr)
        .output()
        .expect("stockgate-materializer");
    assert_eq!(daemon.status.code(), Some(3), "{daemon:?}");
    refused_naming(&daemon, &mine, &theirs);

    // The same server after a kill -9 keeps its history; the tools go on.
    h.server.kill();
    h.server.restart().expect("restart");
    wait_for_server(&h.client).await;
    assert_eq!(h.client.history().await.unwrap(), Some(mine.clone()));
    let out = sweeper_cli(&h, &["run", "--once"]).ok();
    assert!(out.contains("sweeper pass"), "{out}");
    assert!(Path::new(&other.data_dir).exists());
}
