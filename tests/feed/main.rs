//! The reservation feed: entries and their format, `XREAD`/consumer groups (redis-py),
//! retention, history across restarts and Raft members.
//!
//! One module per former test file (`tests/feed/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test feed feed_e2e::`; one test:
//! `cargo test --test feed feed_e2e::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;

mod feed_e2e;
mod feed_entries;
mod feed_history;
mod groups_e2e;
