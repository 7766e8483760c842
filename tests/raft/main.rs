//! Raft groups of real server processes: replication, elections and switchovers, snapshots,
//! wiped and dead members, a full disk, the storm (nemesis), the feed and the materializer
//! across failovers, the operator tools against a group.
//!
//! `raft_dead_peer` and `raft_full_disk` read their members' logs: they give the group
//! their own log dir (`Group::start_logged`) rather than setting `RAFT_TEST_LOG_DIR`,
//! which would send every group of this binary to it.
//!
//! One module per former test file (`tests/raft/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test raft raft_amnesia::`; one test:
//! `cargo test --test raft raft_amnesia::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../operator/mod.rs"]
mod operator;

mod raft_amnesia;
mod raft_dead_peer;
mod raft_feed;
mod raft_full_disk;
mod raft_group;
mod raft_isolated_leader;
mod raft_materializer;
mod raft_replication;
mod raft_room;
mod raft_snapshot;
mod raft_storm;
mod raft_switchover;
mod raft_tools;
