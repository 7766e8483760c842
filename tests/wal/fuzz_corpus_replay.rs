//! The fuzz targets without cargo-fuzz: replays every file of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/` through the very bodies libFuzzer runs
//! (`fuzz/src/bodies.rs`, included below with `#[path]`), and checks that the committed
//! seed corpus is what `bodies::seed_corpus()` generates, so neither the targets nor the
//! seeds rot while nobody fuzzes.
//!
//! Regenerate the seeds after changing them (or the formats they encode):
//! `FUZZ_WRITE_SEEDS=1 cargo test --test wal fuzz_corpus_replay::`.

#[path = "../../fuzz/src/bodies.rs"]
#[allow(dead_code)]
mod bodies;

use std::path::{Path, PathBuf};

const TARGETS: [&str; 5] = [
    "resp_frame",
    "admission_token",
    "wal_record",
    "raft_frame",
    "stream_commands",
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn body(target: &str) -> fn(&[u8]) {
    match target {
        "resp_frame" => bodies::resp_frame,
        "admission_token" => bodies::admission_token,
        "wal_record" => bodies::wal_record,
        "raft_frame" => bodies::raft_frame,
        "stream_commands" => bodies::stream_commands,
        other => panic!("fuzz/{other}: no fuzz target of that name"),
    }
}

/// `(target, file)` for every file in `<root>/<target>/`, dotfiles skipped, sorted.
fn inputs(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(root) else {
        return out;
    };
    for d in dirs.flatten() {
        if !d.path().is_dir() {
            continue;
        }
        let target = d.file_name().to_string_lossy().into_owned();
        for f in std::fs::read_dir(d.path())
            .expect("read corpus dir")
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && f.path().is_file() {
                out.push((target.clone(), f.path()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn fuzz_corpus_and_regressions_replay() {
    let corpus = inputs(&fuzz_dir().join("corpus"));
    let regressions = inputs(&fuzz_dir().join("regressions"));
    for target in TARGETS {
        assert!(
            corpus.iter().any(|(t, _)| t == target),
            "fuzz/corpus/{target}/ has no seeds"
        );
    }
    for (target, path) in corpus.iter().chain(&regressions) {
        let run = body(target);
        let data = std::fs::read(path).expect("read corpus file");
        println!("replaying {} ({} bytes)", path.display(), data.len());
        run(&data);
    }
    println!(
        "replayed {} corpus and {} regression inputs",
        corpus.len(),
        regressions.len()
    );
}

#[test]
fn fuzz_seed_corpus_is_current() {
    let write = std::env::var_os("FUZZ_WRITE_SEEDS").is_some();
    let seeds = bodies::seed_corpus();
    for (target, name, bytes) in &seeds {
        let dir = fuzz_dir().join("corpus").join(target);
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).expect("create corpus dir");
            std::fs::write(&path, bytes).expect("write seed");
            continue;
        }
        let have = std::fs::read(&path).unwrap_or_default();
        assert!(
            have == *bytes,
            "{} is missing or stale: run FUZZ_WRITE_SEEDS=1 cargo test --test wal fuzz_corpus_replay::",
            path.display()
        );
    }
    // No seed file that the generator no longer makes.
    for (target, path) in inputs(&fuzz_dir().join("corpus")) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        if name.starts_with("seed-") {
            let known = seeds.iter().any(|(t, n, _)| *t == target && *n == name);
            if write && !known {
                std::fs::remove_file(&path).expect("remove stale seed");
            } else {
                assert!(known, "{} is not generated any more", path.display());
            }
        }
    }
}
