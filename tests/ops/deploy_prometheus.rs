//! The Prometheus rules in `deploy/prometheus/` (docs/operations.md, "Alerts"): they load
//! (`promtool check rules`), their tests pass (`promtool test rules`), and every alert has
//! a test that needs it to fire: with any one alert's expression replaced by one that never
//! fires, the tests fail.

use std::path::{Path, PathBuf};
use std::process::Command;

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus")
}

fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool (Debian package prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn rules_text() -> String {
    std::fs::read_to_string(rules_dir().join("stockgate.rules.yml")).expect("read the rules")
}

/// The alert names, in file order.
fn alerts(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|s| s.trim().to_owned())
        .collect()
}

/// `rules` with the expression of alert `name` replaced by one that never fires (the
/// `expr:` line and its more-indented continuation lines).
fn disable(rules: &str, name: &str) -> String {
    let mut out = Vec::new();
    let mut in_alert = false;
    let mut skipping: Option<usize> = None;
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = skipping {
            if indent > at && !line.trim().is_empty() {
                continue;
            }
            skipping = None;
        }
        if let Some(n) = line.trim().strip_prefix("- alert: ") {
            in_alert = n.trim() == name;
        }
        if in_alert && line.trim_start().starts_with("expr:") {
            out.push(format!("{}expr: vector(0) > 1", " ".repeat(indent)));
            skipping = Some(indent);
            in_alert = false;
            continue;
        }
        out.push(line.to_owned());
    }
    out.join("\n") + "\n"
}

#[test]
fn rules_load_and_their_tests_pass() {
    let dir = rules_dir();
    let (ok, text) = promtool(&dir, &["check", "rules", "stockgate.rules.yml"]);
    assert!(ok, "promtool check rules: {text}");
    let (ok, text) = promtool(&dir, &["test", "rules", "stockgate.rules.test.yml"]);
    assert!(ok, "promtool test rules: {text}");
}

#[test]
fn every_alert_has_a_test_that_needs_it_to_fire() {
    let rules = rules_text();
    let names = alerts(&rules);
    assert!(names.len() >= 10, "alerts found: {names:?}");
    let tmp = std::env::temp_dir().join(format!("stockgate-rules-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    std::fs::copy(
        rules_dir().join("stockgate.rules.test.yml"),
        tmp.join("stockgate.rules.test.yml"),
    )
    .expect("copy the tests");
    for name in &names {
        let disabled = disable(&rules, name);
        assert_ne!(disabled, rules, "{name}: nothing replaced");
        std::fs::write(tmp.join("stockgate.rules.yml"), &disabled).expect("write");
        let (ok, _) = promtool(&tmp, &["check", "rules", "stockgate.rules.yml"]);
        assert!(ok, "{name}: the disabled copy does not load");
        let (ok, text) = promtool(&tmp, &["test", "rules", "stockgate.rules.test.yml"]);
        assert!(
            !ok && text.contains(name.as_str()),
            "{name} never firing goes unnoticed by the rule tests:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

use crate::common::ha::free_port;

/// Metric names an expression text refers to (`stockgate_...` words that are not part of a
/// recording rule's `level:metric:operation` name).
fn referenced(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while let Some(at) = text[i..].find("stockgate_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        let before_is_word = start > 0 && word(bytes[start - 1]);
        let name = &text[start..end];
        if !before_is_word && !name.contains(':') {
            out.insert(name.to_owned());
        }
        i = end.max(start + 1);
    }
    out
}

/// Sample names in a Prometheus exposition.
fn exported(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

fn scrape(addr: &str) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", &format!("http://{addr}/metrics")])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every metric the rules and the Grafana dashboard name is exported by a real process:
/// a Raft group member selling (server families and the group's), and a sweeper that
/// swept and probed the materializer's position. A renamed metric fails here, not in an
/// alert that silently never fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_name_only_exported_metrics() {
    use crate::common::raft::{create_sale, reserve, Group};
    use std::time::Duration;
    use stockgate_testkit::{sibling_binary, Harness};

    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/stockgate.json"),
    )
    .expect("read the dashboard");
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() >= 10));
    let mut wanted = referenced(&rules_text());
    wanted.extend(referenced(&dashboard));

    // A group member's exposition, with a sale that has holds.
    let mut g = Group::start(false);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    for (id, port) in [1u64, 2, 3].into_iter().zip(&ports) {
        let m = g.member(id);
        m.kill9();
        m.args
            .extend(["--metrics-addr".into(), format!("127.0.0.1:{port}")]);
        m.spawn();
    }
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "PROM", 10);
    reserve(g.port(l), &g, "PROM", "u1", "r1").expect("reserve");
    // An error reply, so the per-code error family has a sample.
    let refused: redis::RedisResult<redis::Value> = redis::cmd("STOCK")
        .arg("NO-SUCH-SALE")
        .query(&mut crate::common::raft::conn(g.port(l)));
    assert!(
        refused.is_err(),
        "STOCK of an unknown sale answered {refused:?}"
    );
    let mut have = exported(&scrape(&format!("127.0.0.1:{}", ports[(l - 1) as usize])));

    // The sweeper's, after a materializer run gave it a position to probe.
    let h = Harness::start().await.expect("harness");
    h.create_sale("PROM", 10, 300, None).await.expect("sale");
    h.reserve_many("PROM", "m", 2, true).await.expect("reserve");
    let bin = sibling_binary;
    let st = Command::new(bin("stockgate-materializer"))
        .args([
            "--database-url",
            h.pg.url(),
            "--server",
            h.server.addr(),
            "--drain",
        ])
        .env("STOCKGATE_LOG", "warn")
        .status()
        .expect("run the materializer");
    assert!(st.success(), "materializer --drain: {st}");
    let mport = free_port();
    let mut sweeper = Command::new(bin("stockgate-sweeper"))
        .args(["--database-url", h.pg.url(), "--server", h.server.addr()])
        .args(["run", "--interval-secs", "0.2", "--metrics-addr"])
        .arg(format!("127.0.0.1:{mport}"))
        .env("STOCKGATE_LOG", "warn")
        .spawn()
        .expect("start the sweeper");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let sweeper_text = loop {
        let t = scrape(&format!("127.0.0.1:{mport}"));
        let passes = t
            .lines()
            .find_map(|l| l.strip_prefix("stockgate_sweeper_passes_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if t.contains("stockgate_sweeper_materializer_lag_seconds{") && passes >= 2.0 {
            break t;
        }
        if std::time::Instant::now() > deadline {
            let _ = sweeper.kill();
            panic!("the sweeper's metrics never showed the materializer's lag:\n{t}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = sweeper.kill();
    let _ = sweeper.wait();
    have.extend(exported(&sweeper_text));

    let missing: Vec<&String> = wanted.iter().filter(|n| !have.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "named by deploy/ but exported by nothing: {missing:?}"
    );
}
