//! Client libraries and packages against real servers: redis-py, ioredis, node-redis,
//! redis-cli, the Python and Node packages (single server, ledger, Raft group, cluster),
//! Sentinel-style discovery of a Raft group's leader, and `stockgate-bench`.
//!
//! Tests that start a Raft group or a cluster together with a client process, or run a
//! timed scenario, take [`alone`]; the others take [`shared`]. So such a test has both
//! cores to itself, as when each file was its own binary (and two tests never run
//! `npm ci` in `tests/node` at once).
//!
//! One module per former test file (`tests/clients/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test clients bench_addr::`; one test:
//! `cargo test --test clients bench_addr::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static CORES: RwLock<()> = RwLock::new(());

/// Held for a whole test that wants both cores: no other test of this binary runs.
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    CORES.write().unwrap_or_else(|e| e.into_inner())
}

/// Held for a whole test that may run beside another one, but not beside an [`alone`] one.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    CORES.read().unwrap_or_else(|e| e.into_inner())
}

mod bench_addr;
mod bench_harness;
mod cluster_clients;
mod cluster_packages;
mod node_clients;
mod node_package;
mod python_package;
mod raft_clients;
mod redis_py_compat;
