//! Cluster mode: several groups behind one slot map. Routing, `-MOVED`/`-ASK`, slot moves
//! (`move-slots`, a hot sale), splits and their per-buyer limit, auth and TLS between groups,
//! a Raft group as a cluster member and its failover, several groups on one ledger.
//!
//! One module per former test file (`tests/cluster/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test cluster cluster_auth::`; one test:
//! `cargo test --test cluster cluster_auth::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../operator/mod.rs"]
mod operator;

mod cluster_auth;
mod cluster_failover;
mod cluster_ledger;
mod cluster_move;
mod cluster_move_big;
mod cluster_raft;
mod cluster_routing;
mod cluster_split;
mod cluster_tls;
mod split_limit;
