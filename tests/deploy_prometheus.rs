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
