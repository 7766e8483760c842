//! redis-py (a client users will point at stockgate) runs a session in RESP2 and RESP3:
//! HELLO, CLIENT SETINFO, pipelines, errors, COMMAND INFO.

mod common;

use std::process::Command;

use common::*;

#[test]
fn redis_py_session() {
    let srv = Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/compat.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(srv.port.to_string())
        .arg(&srv.data_dir)
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redis-py session failed (needs `pip install redis`):\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis-py ok"));
}

/// redis-py's default `pipeline()` is a transaction (MULTI … EXEC): replies in order,
/// stock taken exactly once per RESERVE, a queue-time error aborts and takes nothing.
#[test]
fn redis_py_default_pipeline_is_a_transaction() {
    let srv = Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/transactions.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(srv.port.to_string())
        .arg(&srv.data_dir)
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redis-py transactions failed (needs `pip install redis`):\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("redis-py transactions ok"));
}
