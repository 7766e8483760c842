//! `--help` never prints a value taken from the environment that can hold a credential:
//! every built binary and every subcommand, with the database URL,
//! server and Sentinel URLs and passwords set to values carrying a marker.

use std::process::Command;
use stockgate_testkit::sibling_binary as bin;

/// Unlikely in any help text (which does say `--secret-file <SECRET_FILE>`).
const MARKER: &str = "SECRET-7f3a";

/// Environment an operator would export, each value with the marker in its credential.
const ENV: &[(&str, &str)] = &[
    ("DATABASE_URL", "postgres://sg:sgpass-SECRET-7f3a@h/db"),
    (
        "STOCKGATE_ADDR",
        "redis://shop:addr-SECRET-7f3a@127.0.0.1:7379",
    ),
    (
        "STOCKGATE_SENTINELS",
        "redis://:sentinel-SECRET-7f3a@127.0.0.1:26379",
    ),
    ("STOCKGATE_NODE_PASSWORD", "node-SECRET-7f3a"),
    ("STOCKGATE_REQUIREPASS", "requirepass-SECRET-7f3a"),
    ("STOCKGATE_PRIMARY_PASSWORD", "primary-SECRET-7f3a"),
    ("STOCKGATE_BENCH_AUTH", "ops:bench-SECRET-7f3a"),
];

/// A binary next to this test's executable (`target/<profile>/<name>`).
fn help_is_clean(name: &str, args: &[&str]) {
    let out = Command::new(bin(name))
        .args(args)
        .envs(ENV.iter().copied())
        .output()
        .expect("run the binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = format!("{name} {}", args.join(" "));
    assert!(out.status.success(), "{shown}: {stderr}");
    assert!(
        stdout.contains("Usage"),
        "{shown} printed no help:\n{stdout}"
    );
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains(MARKER),
            "{shown} printed a credential from the environment on {what}:\n{text}"
        );
    }
}

#[test]
fn no_binary_prints_a_credential_from_the_environment_in_its_help() {
    for (name, subcommands) in [
        ("stockgate", &["serve", "mint-token", "top"][..]),
        (
            "stockgate-sweeper",
            &["run", "migrate", "create-sale", "adjust", "rebuild"][..],
        ),
        ("stockgate-materializer", &[][..]),
        ("stockgate-bench", &[][..]),
    ] {
        help_is_clean(name, &["--help"]);
        help_is_clean(name, &["-h"]);
        for sub in subcommands {
            help_is_clean(name, &[sub, "--help"]);
            help_is_clean(name, &["help", sub]);
        }
    }
}
