//! The fuzz targets' bodies live in [`bodies`], a plain module that
//! `tests/wal/fuzz_corpus_replay.rs` also includes (with `#[path]`) so `cargo test` replays the
//! corpus through exactly the code libFuzzer runs, without cargo-fuzz.
pub mod bodies;
