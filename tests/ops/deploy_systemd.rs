//! The systemd units in `deploy/systemd/` (docs/operations.md, "Service files"): each one
//! passes `systemd-analyze verify`, its hardening scores "OK" in `systemd-analyze security`,
//! and the command line it runs is one the binaries accept (the server's is started for
//! real, with its data dir and port moved into a temp dir).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::TempDir;

const UNITS: [&str; 3] = [
    "stockgate.service",
    "stockgate-sweeper.service",
    "stockgate-materializer.service",
];

fn bin_dir() -> PathBuf {
    crate::common::server_bin()
        .parent()
        .expect("target/<profile>")
        .to_path_buf()
}

fn unit_text(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/systemd")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The units with `/usr/local/bin/` pointed at the freshly built binaries (verify checks
/// that the executables exist).
fn installed_copies(dir: &Path) -> Vec<PathBuf> {
    let bins = format!("{}/", bin_dir().display());
    UNITS
        .iter()
        .map(|name| {
            let p = dir.join(name);
            std::fs::write(&p, unit_text(name).replace("/usr/local/bin/", &bins)).expect("write");
            p
        })
        .collect()
}

/// `ExecStart=` of a unit, continuation lines joined, split into words.
fn exec_start(name: &str) -> Vec<String> {
    let text = unit_text(name).replace("\\\n", " ");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("{name} has no ExecStart"));
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let dir = TempDir::new("systemd-verify");
    let units = installed_copies(dir.path());
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .expect("run systemd-analyze (Debian package systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verify failed: {stderr}");
    assert!(
        stderr.trim().is_empty(),
        "verify warned about the units: {stderr}"
    );
}

#[test]
fn units_are_hardened() {
    let dir = TempDir::new("systemd-security");
    for unit in installed_copies(dir.path()) {
        // --threshold makes the command fail above that exposure, in tenths (the verdict line
        // prints 0.0 safest .. 10.0 exposed): 20 is 2.0, inside systemd's "OK" band.
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--threshold=20"])
            .arg(&unit)
            .output()
            .expect("run systemd-analyze security");
        let text = String::from_utf8_lossy(&out.stdout);
        let verdict = text
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or("no verdict");
        assert!(
            out.status.success(),
            "{}: {verdict}\n{text}",
            unit.display()
        );
        // The settings the docs promise, whatever the score.
        let body = std::fs::read_to_string(&unit).expect("read unit");
        for needed in [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ProtectHome=yes",
        ] {
            assert!(body.contains(needed), "{} lacks {needed}", unit.display());
        }
    }
}

/// The server unit's exact flags start a server (data dir, port and users file moved into
/// a temp dir): a flag renamed in the binary fails here, not on an operator's machine.
#[test]
fn the_server_unit_command_line_starts_a_server() {
    let dir = TempDir::new("systemd-server");
    let users = dir.path().join("users");
    std::fs::write(&users, "ops admin a-long-test-password-0123456789\n").expect("users");
    let data = dir.path().join("data");
    let mut args = exec_start("stockgate.service");
    assert_eq!(args[0], "/usr/local/bin/stockgate");
    for (flag, value) in [
        ("--data-dir", data.display().to_string()),
        ("--port", "0".to_string()),
        ("--users-file", users.display().to_string()),
        ("--bind", "127.0.0.1".to_string()),
    ] {
        let at = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("the unit does not set {flag}"));
        args[at + 1] = value;
    }
    let mut child = Command::new(crate::common::server_bin())
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let stdout = child.stdout.take().expect("stdout");
    let first = BufReader::new(stdout).lines().next();
    let _ = child.kill();
    let _ = child.wait();
    let first = first.and_then(Result::ok).unwrap_or_default();
    assert!(
        first.starts_with("listening on 127.0.0.1:"),
        "the server did not start with the unit's flags: {first:?}"
    );
}

/// The sweeper's and the materializer's command lines parse (clap refuses an unknown
/// flag before it reaches `--help`).
#[test]
fn the_tool_units_command_lines_parse() {
    for (unit, bin) in [
        ("stockgate-sweeper.service", "stockgate-sweeper"),
        ("stockgate-materializer.service", "stockgate-materializer"),
    ] {
        let args = exec_start(unit);
        assert_eq!(args[0], format!("/usr/local/bin/{bin}"));
        let out = Command::new(bin_dir().join(bin))
            .args(&args[1..])
            .arg("--help")
            .output()
            .expect("run the tool");
        assert!(
            out.status.success(),
            "{unit}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
