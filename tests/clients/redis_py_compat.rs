//! redis-py (a client users will point at stockgate) runs a session in RESP2 and RESP3:
//! HELLO, CLIENT SETINFO, pipelines, errors, COMMAND INFO.

use std::process::Command;

use crate::common::*;

/// Runs `tests/py/<script>` against a fresh server; it must exit 0 and print `marker`.
fn run_py(script: &str, marker: &str) {
    let srv = Server::start(&[]);
    let path = format!("{}/tests/py/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .arg(srv.port.to_string())
        .arg(&srv.data_dir)
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed (needs `pip install redis`):\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(marker));
}

#[test]
fn redis_py_session() {
    let _shared = crate::shared();
    run_py("compat.py", "redis-py ok");
}

/// redis-py's default `pipeline()` is a transaction (MULTI … EXEC): replies in order,
/// stock taken exactly once per RESERVE, a queue-time error aborts and takes nothing.
#[test]
fn redis_py_default_pipeline_is_a_transaction() {
    let _shared = crate::shared();
    run_py("transactions.py", "redis-py transactions ok");
}
