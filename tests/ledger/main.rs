//! The ledgers (Postgres and sled), their SQL functions and schema, the checkout flow, the
//! sweeper (creates, faults, checks, `rebuild`), the materializer, ledger bindings.
//!
//! `sweeper_bench` is `#[ignore]`d: `cargo test --release --test ledger sweeper_bench:: --
//! --ignored --nocapture --test-threads 1`. The sweeper's fail-point test is not here
//! (fail points are process-global and these tests run sweepers): see `tests/failpoints`.
//!
//! One module per former test file (`tests/ledger/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test ledger ledger_binding::`; one test:
//! `cargo test --test ledger ledger_binding::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../operator/mod.rs"]
mod operator;

mod checkout_e2e;
mod checkout_scenario;
mod ledger_binding;
mod ledger_functions;
mod ledger_schema;
mod ledger_suite;
mod materializer_e2e;
mod rebuild_e2e;
mod rebuild_operator_e2e;
mod sweeper_bench;
mod sweeper_create;
mod sweeper_faults;
mod sweeper_ledger_checks;
