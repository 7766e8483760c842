//! Tests that inject faults with the `fail` crate (feature `failpoints` of
//! stockgate-ledger). Fail points are process-global, and most tests elsewhere run a
//! sweeper in-process, so these live in a binary of their own; a second test here must not
//! run beside the first (serialize them with a lock, or `--test-threads 1`).
//!
//! One module per former test file (`tests/failpoints/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test failpoints sweeper_crash::`; one test:
//! `cargo test --test failpoints sweeper_crash::<fn> -- --exact`.

mod sweeper_crash;
