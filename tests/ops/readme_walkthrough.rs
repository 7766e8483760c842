//! The README's walkthrough ("A reservation's life with redis-cli") runs as written:
//! every `$ ` line of its shell block, in order, in one bash (on a free port and a fresh
//! data dir instead of 7380 and /tmp/sg-walk, with this build's binaries on PATH). It must
//! show what it says: the hold released after its TTL and the unit back in stock.

use std::process::Command;

use crate::common::ha::free_port;
use crate::common::{server_bin, TempDir};

fn walkthrough() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## A reservation's life with redis-cli")
        .nth(1)
        .expect("the walkthrough section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("its shell block");
    block
        .lines()
        .filter_map(|l| l.strip_prefix("$ "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_walkthrough_runs_as_written() {
    let lines = walkthrough();
    assert!(lines.len() >= 10, "walkthrough too short: {lines:?}");
    let dir = TempDir::new("walk");
    let data = dir.path().join("sg-walk");
    let port = free_port().to_string();
    let bin_dir = server_bin()
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let script: String = lines
        .iter()
        // The README's own PATH line points at target/release; this build is elsewhere.
        .filter(|l| !l.starts_with("export PATH="))
        .map(|l| {
            l.replace("/tmp/sg-walk", &data.display().to_string())
                .replace("7380", &port)
        })
        .collect::<Vec<_>>()
        .join("\n");
    let out = Command::new("timeout")
        .args(["60", "bash", "-c"])
        .arg(format!(
            "export PATH=\"{bin_dir}:$PATH\"\nset -e\n{script}\n# wait for the server to exit\nwait\n"
        ))
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "walkthrough failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let got: Vec<&str> = stdout.lines().collect();
    assert!(got.contains(&"OK"), "{stdout}");
    assert!(got.contains(&"RESERVED"), "{stdout}");
    assert!(
        got.iter()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["state", "RELEASED"]),
        "the abandoned hold was not released: {stdout}"
    );
    // STOCK after the retry, after bob's hold, after the expiry.
    let stock: Vec<&str> = got
        .iter()
        .copied()
        .filter(|l| l.parse::<u64>().is_ok_and(|n| n > 900 && n <= 1000))
        .collect();
    assert_eq!(stock, ["999", "998", "999"], "{stdout}");
}
