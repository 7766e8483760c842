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
