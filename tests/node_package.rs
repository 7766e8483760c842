//! The Node package `clients/node` (`stockgate` on ioredis and pg), tested through its own
//! `node --test` suite against a real server (open mode): reply parsing, errors per code
//! and minting (`unit.test.js`), the commands, typed errors, denials, and retries while
//! its connections are killed (`server.test.js`), and its TypeScript types checked by
//! `tsc --noEmit` (`types.test.js`). Fails on any failed or skipped test.
//!
//! Its dependencies come from `clients/node/package-lock.json`
//! (`npm ci --prefix clients/node`, which `scripts/test-all.sh` runs).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

/// The longest the package's tests may take (the type check alone takes ~20 s on two
/// loaded cores).
const LIMIT: Duration = Duration::from_secs(150);

/// `# <name> N` from node's test runner summary.
fn summary(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("# {name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn node_package_against_a_server() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/node");
    assert!(
        dir.join("node_modules/ioredis").exists(),
        "clients/node has no node_modules: run `npm ci --prefix clients/node`"
    );
    let server = Server::start(&[]);
    let mut child = Command::new("node")
        .args([
            "--test",
            "--test-reporter=tap",
            "test/unit.test.js",
            "test/server.test.js",
            "test/types.test.js",
        ])
        .current_dir(&dir)
        .env("STOCKGATE_ADDR", &server.addr)
        .env(
            "STOCKGATE_SECRET_FILE",
            server.data_dir.join("secret").display().to_string(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node --test");
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().expect("node output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the Node package's tests failed:\n{text}"
    );
    assert_eq!(summary(&text, "fail"), Some(0), "{text}");
    assert_eq!(
        summary(&text, "skipped"),
        Some(0),
        "a test was skipped:\n{text}"
    );
    assert!(
        summary(&text, "pass").is_some_and(|n| n >= 40),
        "too few tests ran:\n{text}"
    );
}
