//! The write-ahead log and snapshots on disk: `kill -9` at any point, torn and corrupt tails
//! and segments; and the fuzz targets' corpora replayed through their bodies
//! (`fuzz_corpus_replay`: `FUZZ_WRITE_SEEDS=1 cargo test --test wal fuzz_corpus_replay::`
//! rewrites the seeds).
//!
//! One module per former test file (`tests/wal/<file>.rs`); a test's name is
//! `<file>::<fn>`. Run one file's tests: `cargo test --test wal wal_corrupt::`; one test:
//! `cargo test --test wal wal_corrupt::<fn> -- --exact`.

#[path = "../common/mod.rs"]
mod common;

mod fuzz_corpus_replay;
mod wal_corrupt;
mod wal_kill;
mod wal_snapshot;
mod wal_torn;
