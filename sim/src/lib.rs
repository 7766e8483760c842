//! A deterministic simulation of a replicated stockgate group: the real engine, WAL,
//! Raft log store, state machine and its snapshots, speculation and lease under
//! openraft, every member
//! in one process on one single-threaded tokio runtime with a paused clock, the
//! network and the faults drawn from one seed (docs/simulation.md).
//!
//! A second scenario ([`run_nodes`]) runs the server's own `RaftNode`s (discovery
//! answers, write gate, reach loop, prompted elections, the bootstrap) over an
//! in-memory transport ([`wire`]).
//!
//! The workload calls the engine as the server's RESERVE does once the command layer
//! has checked that the member takes writes (`Engine::reserve`, then the reply waits
//! for the group's commit, `Speculation::wait`); the command layer itself (`cmd`,
//! sessions, RESP) is not in the loop.

pub mod disk;
mod feed_rules;
pub mod gate;
pub mod history;
pub mod member;
pub mod net;
mod nodes;
mod scenario;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;

pub use scenario::Settings;

/// What one run found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The seed it ran.
    pub seed: u64,
    /// SHA-256 of the whole history (hex).
    pub digest: String,
    /// How many events the history holds.
    pub events: u64,
    /// The invariants that failed, in the order they were found (empty: PASS).
    pub failures: Vec<String>,
}

impl Outcome {
    /// `seed <n> digest <hex> PASS|FAIL <what>`, as `scripts/simulate.sh` prints it.
    pub fn line(&self) -> String {
        let verdict = match self.failures.first() {
            None => format!("PASS {} events", self.events),
            Some(f) => format!("FAIL {f}"),
        };
        format!("seed {} digest {} {verdict}", self.seed, &self.digest[..16])
    }
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// Runs the simulation of `seed` to its end on a fresh single-threaded runtime with a
/// paused clock, in a fresh directory (removed afterwards unless the run failed).
pub fn run(seed: u64, settings: &Settings) -> Outcome {
    let settings = Arc::new(settings.clone());
    in_sim(seed, move |master, root| {
        scenario::run(seed, master, root, settings)
    })
}

/// Runs the scenario of the server's own `RaftNode`s for `seed` (the `nodes` module), as
/// [`run`] runs the hand-built members', with every fault kind of
/// [`Settings::default`].
pub fn run_nodes(seed: u64, verbose: bool) -> Outcome {
    run_nodes_of(seed, 3, verbose)
}

/// [`run_nodes`] with a group of `members` members (3 or 5: the faults cut off or kill
/// one member at a time).
pub fn run_nodes_of(seed: u64, members: usize, verbose: bool) -> Outcome {
    let settings = Settings {
        members: members as u64,
        verbose,
        ..Settings::default()
    };
    run_nodes_with(seed, &settings)
}

/// [`run_nodes`] with `settings`: of them, `members`, `verbose`, `feed` (the order
/// feed's consumers) and the fault kinds the `RaftNode` scenario has (`bit_flips`,
/// `damage`, `lagging_io`, `commands`, `overlaps`, `claims`, `lost_log`, `doubled`,
/// `change_faults`, `slow_leader`; off, a seed runs as it did before the kind existed
/// there) apply to this scenario.
pub fn run_nodes_with(seed: u64, settings: &Settings) -> Outcome {
    let settings = settings.clone();
    in_sim(seed, move |master, root| {
        nodes::run(seed, master, root, settings)
    })
}

/// Runs `scenario` (given the run's generator and its directory) to its end on a fresh
/// single-threaded runtime with a paused clock, in a fresh directory (removed afterwards
/// unless the run failed).
fn in_sim<F, Fut>(seed: u64, scenario: F) -> Outcome
where
    F: FnOnce(StdRng, std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let root = std::env::temp_dir().join(format!(
        "stockgate-sim-{}-{}-{seed}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    // openraft's election timeouts, drawn on this thread (the runtime's only one).
    let mut master = StdRng::seed_from_u64(seed);
    stockgate_server::raft::runtime::seed_thread_rng(Some(rand::Rng::gen(&mut master)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let out = rt.block_on(scenario(master, root.clone()));
    drop(rt);
    stockgate_server::raft::runtime::seed_thread_rng(None);
    if out.failures.is_empty() {
        let _ = std::fs::remove_dir_all(&root);
    } else {
        eprintln!("seed {seed}: data dirs kept in {}", root.display());
    }
    out
}
