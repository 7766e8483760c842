//! Every binary takes the server's log flags: `--log-format json` gives one JSON object
//! per stderr line (for log shippers), text output has no colour codes when stderr is not
//! a terminal, and `--log-level` filters. Run against a database that is not there, so
//! each tool logs its failure and exits.

use std::process::Command;

use crate::common::ha::free_port;
use crate::common::server_bin;

fn run(bin: &str, extra: &[&str]) -> (bool, String) {
    let port = free_port();
    let db = format!("postgres://nobody@127.0.0.1:{port}/none?connect_timeout=1");
    let mut c = Command::new(server_bin().with_file_name(bin));
    c.args(["--database-url", &db, "--server", "127.0.0.1:1"])
        .args(extra)
        .env_remove("STOCKGATE_LOG")
        .env_remove("RUST_LOG");
    if bin == "stockgate-sweeper" {
        c.args(["run", "--once"]);
    }
    let out = c.output().expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_ledger_tools_take_the_servers_log_flags() {
    for bin in ["stockgate-sweeper", "stockgate-materializer"] {
        let (ok, err) = run(bin, &["--log-format", "json"]);
        assert!(!ok, "{bin} succeeded without a database");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with('{')).collect();
        assert!(!lines.is_empty(), "{bin}: no JSON log line in {err}");
        for l in &lines {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{bin}: not JSON ({e}): {l}"));
            assert!(v.get("level").is_some(), "{bin}: {l}");
        }
        let (_, text) = run(bin, &[]);
        assert!(
            !text.contains('\u{1b}'),
            "{bin}: colour codes in a redirected log: {text}"
        );
        // A filter above the failure's level: nothing logged through tracing.
        let (_, quiet) = run(bin, &["--log-format", "json", "--log-level", "off"]);
        assert!(
            !quiet.lines().any(|l| l.starts_with('{')),
            "{bin}: --log-level off still logged: {quiet}"
        );
    }
}
