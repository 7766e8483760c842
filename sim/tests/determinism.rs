//! The simulation's promise: one seed, one history. Runs a few seeds twice each (fresh
//! runtimes, fresh directories) and compares the digests, and checks they pass; both
//! scenarios, the hand-built members' (`run`) and the server's own `RaftNode`s'
//! (`run_nodes`).

use stockgate_sim::{run, run_nodes, run_nodes_of, Settings};

#[test]
fn the_same_seed_gives_the_same_digest() {
    let settings = Settings {
        steps: 15,
        ..Settings::default()
    };
    for seed in [1, 7, 42] {
        let a = run(seed, &settings);
        let b = run(seed, &settings);
        assert_eq!(
            a.digest,
            b.digest,
            "seed {seed}: {} vs {}",
            a.line(),
            b.line()
        );
        assert!(a.failures.is_empty(), "{}", a.line());
    }
}

#[test]
fn different_seeds_give_different_histories() {
    let settings = Settings {
        steps: 5,
        ..Settings::default()
    };
    assert_ne!(run(3, &settings).digest, run(4, &settings).digest);
}

/// The CI seed set: every seed of 1..=200 passes every check. A failing seed prints its
/// line; `scripts/simulate.sh <seed> 1 --verbose` replays it with its history.
#[test]
fn the_ci_seed_set_passes() {
    all_pass(1..=200, &Settings::default());
}

/// A group of five members (a removed voter leaves four, a stopped one three that
/// answer): a few seeds pass every check.
#[test]
fn a_five_member_group_passes() {
    let settings = Settings {
        members: 5,
        ..Settings::default()
    };
    all_pass(1..=10, &settings);
}

#[test]
fn the_raftnode_scenario_gives_the_same_digest() {
    for seed in [1, 7, 42] {
        let (a, b) = (run_nodes(seed, false), run_nodes(seed, false));
        assert_eq!(
            a.digest,
            b.digest,
            "seed {seed}: {} vs {}",
            a.line(),
            b.line()
        );
        assert!(a.failures.is_empty(), "{}", a.line());
    }
    assert_ne!(run_nodes(3, false).digest, run_nodes(4, false).digest);
}

/// The CI seed set of the `RaftNode` scenario: every seed of 1..=200 passes
/// (`scripts/simulate.sh <seed> 1 --raftnode --verbose` replays one).
#[test]
fn the_raftnode_ci_seed_set_passes() {
    let failed: Vec<String> = (1..=200)
        .map(|seed| run_nodes(seed, false))
        .filter(|o| !o.failures.is_empty())
        .map(|o| o.line())
        .collect();
    assert!(failed.is_empty(), "failing seeds:\n{}", failed.join("\n"));
}

/// The `RaftNode` scenario with five members (the handover included): a few seeds pass
/// every check.
#[test]
fn a_five_member_raftnode_group_passes() {
    let failed: Vec<String> = (1..=10)
        .map(|seed| run_nodes_of(seed, 5, false))
        .filter(|o| !o.failures.is_empty())
        .map(|o| o.line())
        .collect();
    assert!(failed.is_empty(), "failing seeds:\n{}", failed.join("\n"));
}

/// Runs `seeds`; fails listing the line of each seed that failed.
fn all_pass(seeds: std::ops::RangeInclusive<u64>, settings: &Settings) {
    let failed: Vec<String> = seeds
        .map(|seed| run(seed, settings))
        .filter(|o| !o.failures.is_empty())
        .map(|o| o.line())
        .collect();
    assert!(failed.is_empty(), "failing seeds:\n{}", failed.join("\n"));
}
