//! One server's command surface over real TCP: reservations under contention, MULTI/EXEC,
//! identifiers and hostile input, the errors clients decode, units and shards, replies held
//! until durable, late commits, event loops, and the embedded `EngineGate`.
//!
//! One module per former test file (`tests/gate/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test gate gate_bad_input::`; one test:
//! `cargo test --test gate gate_bad_input::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/resp.rs"]
mod resp;

mod durable_replies;
mod embedded_durability;
mod errors_plain;
mod event_loops;
mod gate_bad_input;
mod gate_identifiers;
mod gate_multi;
mod gate_redis_cli;
mod gate_storm;
mod late_commit;
mod multi_unit;
mod room;
mod room_scenario;
