//! `stockgate-bench --addr` drives a deployment it did not start: a server with users,
//! reached with a password from a file and admission tokens signed with the server's own
//! secret file. Small N, bounded time; the report must have results and no password.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const PASSWORD: &str = "bench-pw-SECRET-10c";

#[test]
fn bench_runs_against_a_server_it_did_not_start() {
    let _shared = crate::shared();
    let dir = TempDir::new("bench-addr");
    let users = dir.path().join("users");
    std::fs::write(&users, format!("ops admin {PASSWORD}\n")).unwrap();
    let auth = dir.path().join("auth");
    std::fs::write(&auth, format!("ops:{PASSWORD}\n")).unwrap();
    let srv = Server::start(&["--users-file", users.to_str().unwrap()]);
    let out_dir = dir.path().join("results");

    let bench = crate::common::bench_bin();
    let started = Instant::now();
    let mut child = Command::new(&bench)
        .args(["--addr", &srv.addr])
        .arg("--auth-file")
        .arg(&auth)
        .arg("--secret-file")
        .arg(srv.data_dir.join("secret"))
        .args(["--storm-units", "40", "--storm-buyers", "80"])
        .args(["--storm-concurrency", "4", "--storm-pipeline", "2"])
        .args(["--concurrency", "2", "--pipeline", "1,4"])
        .args(["--duration", "0.2", "--warmup", "0.05"])
        .args(["--throughput-buyers", "20", "--no-progress", "--no-chart"])
        .args(["--point-timeout", "30"])
        .arg("--out-dir")
        .arg(&out_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting stockgate-bench");
    let deadline = started + Duration::from_secs(120);
    while child.try_wait().expect("polling").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stockgate-bench --addr did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("| stockgate-at-addr | 40/80 |"),
        "no storm row:\n{stdout}"
    );
    assert!(stdout.contains("all 3 points passed"), "{stdout}");

    let json = std::fs::read_to_string(out_dir.join("results.json")).expect("results.json");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("results.json parses");
    assert_eq!(doc["all_ok"], serde_json::Value::Bool(true), "{json}");
    let summary = doc["summary"].as_array().expect("summary");
    assert_eq!(summary.len(), 3, "{json}");
    assert!(summary
        .iter()
        .all(|s| s["target"] == "stockgate-at-addr" && s["ops_per_sec"].as_f64() > Some(0.0)));
    for (what, text) in [
        ("stdout", &*stdout),
        ("stderr", &*stderr),
        ("results.json", &json),
    ] {
        assert!(!text.contains(PASSWORD), "the password is in {what}");
    }
    // Nothing of the deployment was stopped.
    let mut srv = srv;
    assert!(srv.is_running());
}

/// A refused AUTH says which user and why, not the password.
#[test]
fn a_refused_login_names_the_user_only() {
    let _shared = crate::shared();
    let dir = TempDir::new("bench-addr-auth");
    let users = dir.path().join("users");
    std::fs::write(&users, format!("ops admin {PASSWORD}\n")).unwrap();
    let srv = Server::start(&["--users-file", users.to_str().unwrap()]);
    let wrong = "wrong-SECRET-pw";
    let out = Command::new(crate::common::bench_bin())
        .args(["--addr", &srv.addr])
        .arg("--secret-file")
        .arg(srv.data_dir.join("secret"))
        .env("STOCKGATE_BENCH_AUTH", format!("ops:{wrong}"))
        .args([
            "--workloads",
            "storm",
            "--storm-units",
            "5",
            "--storm-buyers",
            "10",
        ])
        .args(["--no-progress", "--no-chart", "--point-timeout", "30"])
        .arg("--out-dir")
        .arg(dir.path().join("results"))
        .output()
        .expect("run stockgate-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}");
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("refused AUTH as user ops: WRONGPASS"), "{all}");
    assert!(!all.contains(wrong), "the password was printed:\n{all}");
}
