//! The benchmark harness (benches/loadgen, binary `stockgate-bench`) in a tiny
//! configuration: every target starts, runs both workloads, passes its outcome checks,
//! is stopped again, and the JSON report parses. Seconds, not minutes.
//!
//! Needs `redis-server` on PATH and the PostgreSQL 15 binaries (see ENVIRONMENT.md);
//! the stockgate binary is built here in the test's own profile unless `STOCKGATE_BIN`
//! names one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TARGETS: [&str; 8] = [
    "stockgate-fsync-no",
    "stockgate-fsync-everysec",
    "stockgate-fsync-always",
    "redis-lua",
    "redis-lua-aof",
    "redis-lua-per-user",
    "pg-hot-row",
    "pg-16-rows",
];

fn stockgate_bin(bench: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("STOCKGATE_BIN") {
        return PathBuf::from(p);
    }
    let dir = bench.parent().expect("bench binary has a parent dir");
    let release = dir.file_name().is_some_and(|n| n == "release");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "stockgate-server", "--bin", "stockgate"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build for stockgate");
    assert!(status.success(), "building the stockgate binary failed");
    dir.join("stockgate")
}

#[test]
fn harness_runs_every_target_in_a_tiny_configuration() {
    let _shared = crate::shared();
    let bench = crate::common::bench_bin();
    let stockgate = stockgate_bin(&bench);
    assert!(stockgate.is_file(), "no stockgate binary at {stockgate:?}");
    let out = std::env::temp_dir().join(format!("stockgate-bench-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);

    let started = Instant::now();
    let mut child = Command::new(&bench)
        .arg("--stockgate-bin")
        .arg(&stockgate)
        .args(["--targets", "all"])
        .args(["--storm-units", "100", "--storm-buyers", "300"])
        .args(["--storm-concurrency", "8", "--storm-pipeline", "2"])
        .args(["--concurrency", "1,8", "--pipeline", "1,4"])
        .args(["--duration", "0.2", "--warmup", "0.05"])
        .args(["--throughput-buyers", "50", "--runs", "1"])
        .args(["--point-timeout", "60", "--no-progress"])
        .arg("--out-dir")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting stockgate-bench");
    // The harness has its own per-point deadlines; this is the backstop.
    let deadline = started + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = child.try_wait().expect("polling stockgate-bench") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stockgate-bench did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        s
    };
    println!("{stdout}");
    assert!(
        status.success(),
        "stockgate-bench exited with {status}; stdout:\n{stdout}"
    );

    let json = std::fs::read_to_string(out.join("results.json")).expect("results.json written");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("results.json parses");
    assert_eq!(doc["all_ok"], serde_json::Value::Bool(true));
    assert!(doc["machine"]["cores"].as_u64().unwrap_or(0) >= 1);
    for v in ["stockgate", "redis-server", "postgres"] {
        assert!(doc["versions"][v].is_string(), "version of {v} recorded");
    }
    let summary = doc["summary"].as_array().expect("summary array");
    for t in TARGETS {
        let mine: Vec<&serde_json::Value> = summary.iter().filter(|s| s["target"] == t).collect();
        let storm: Vec<_> = mine.iter().filter(|s| s["workload"] == "storm").collect();
        assert_eq!(storm.len(), 1, "{t}: one storm point");
        assert_eq!(
            storm[0]["status"], "OK",
            "{t}: storm outcome {:?}",
            storm[0]
        );
        assert_eq!(storm[0]["reserved"], 100, "{t}: exactly U successes");
        let tput = mine
            .iter()
            .filter(|s| s["workload"] == "throughput")
            .count();
        let expected = if t.starts_with("pg-") { 2 } else { 4 };
        assert_eq!(tput, expected, "{t}: throughput points");
        for s in &mine {
            assert_eq!(s["status"], "OK", "{t}: {s:?}");
            assert!(s["ops_per_sec"].as_f64().unwrap_or(0.0) > 0.0, "{t}: {s:?}");
        }
    }
    // Every raw point carries the target's own audit: nothing handed out twice.
    for run in doc["runs"].as_array().expect("runs array") {
        for p in run.as_array().expect("run is an array") {
            assert_eq!(p["audit"]["negative"], false, "{p:?}");
            assert_eq!(p["audit"]["handed_out"], p["reserved"], "{p:?}");
        }
    }
    assert!(!doc["ratios"].as_array().expect("ratios").is_empty());
    let svg = std::fs::read_to_string(out.join("chart.svg")).expect("chart.svg written");
    assert!(svg.starts_with("<svg"));
    assert!(stdout.contains("no target oversold"));
    let _ = std::fs::remove_dir_all(&out);
}

/// The detector itself: the opt-in `redis-get-decr` target (GET the stock, then DECR in a
/// second round trip) oversells under concurrency, and the harness must say so loudly:
/// in the table, in the JSON and in its exit code.
#[test]
fn harness_reports_an_overselling_target_loudly() {
    let _shared = crate::shared();
    let bench = crate::common::bench_bin();
    let out = std::env::temp_dir().join(format!("stockgate-bench-oversell-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let output = Command::new(&bench)
        .args([
            "--targets",
            "redis-get-decr,redis-lua",
            "--workloads",
            "storm",
        ])
        .args(["--storm-units", "50", "--storm-buyers", "3000"])
        .args(["--storm-concurrency", "64", "--storm-pipeline", "4"])
        .args(["--point-timeout", "60", "--no-progress"])
        .arg("--out-dir")
        .arg(&out)
        .output()
        .expect("running stockgate-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert_eq!(output.status.code(), Some(1), "a failed point exits 1");
    assert!(stdout.contains("FAILED: OVERSOLD"), "{stdout}");
    let json = std::fs::read_to_string(out.join("results.json")).expect("results.json written");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("results.json parses");
    assert_eq!(doc["all_ok"], serde_json::Value::Bool(false));
    let summary = doc["summary"].as_array().expect("summary array");
    let status = |t: &str| {
        summary
            .iter()
            .find(|s| s["target"] == t)
            .map(|s| s["status"].clone())
    };
    assert_eq!(status("redis-get-decr"), Some("OVERSOLD".into()));
    assert_eq!(status("redis-lua"), Some("OK".into()));
    let _ = std::fs::remove_dir_all(&out);
}
