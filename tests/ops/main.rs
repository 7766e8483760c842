//! Operating a server: ACLs, TLS, secrets, config, backup, `stockgate top` and status pages,
//! metrics, logs, `--help` without secrets, hardening against hostile clients, the deploy
//! files (systemd, Prometheus), the README walkthrough, repairs, a data-dir format upgrade.
//!
//! One module per former test file (`tests/ops/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test ops ops_acl::`; one test:
//! `cargo test --test ops ops_acl::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;

mod deploy_prometheus;
mod deploy_systemd;
mod hardening_auth;
mod hardening_hostile;
mod help_secrets;
mod live_common;
mod live_counts;
mod live_resp;
mod log_flags;
mod metrics_e2e;
mod metrics_sweeper;
mod ops_acl;
mod ops_backup;
mod ops_client;
mod ops_config;
mod ops_secret;
mod ops_snags;
mod ops_status;
mod ops_tls;
mod ops_top;
mod readme_walkthrough;
mod repair_server;
mod room_metrics;
mod upgrade_format;
