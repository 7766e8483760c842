//! `stockgate-sim SEED [COUNT] [--verbose] [--fsync-no] [--no-net-faults]
//! [--no-pause-and-membership] [--no-expiry] [--no-snapshots] [--no-bit-flips]
//! [--no-lagging-io] [--no-retries] [--no-damage] [--no-commands] [--no-feed] [--no-overlaps]
//! [--no-claims] [--no-lost-log] [--no-doubled] [--no-change-faults] [--no-slow-leader]
//! [--members=N] [--raftnode]`: runs the deterministic simulation of a replicated
//! group for seeds SEED .. SEED+COUNT-1, one line per seed: `seed <n> digest <hex>
//! PASS|FAIL <what>`. Exits 1 if any seed failed. `--fsync-no` runs the members' WALs
//! under `--fsync no` (a single node's setting, which a server never gives a member) to
//! hunt in the WAL's code. `--no-net-faults` leaves out one-way partitions, flapping
//! links and duplicated requests (`Settings::net_faults`): the histories from before
//! they existed. `--no-pause-and-membership` leaves out stopped members and membership
//! changes (`Settings::pause_and_membership`), likewise; `--no-expiry` hold expiry,
//! EXTENDs and clock jumps (`Settings::expiry`); `--no-snapshots` Raft snapshots
//! (`Settings::snapshots`); `--no-bit-flips` the flipped bit read at a start
//! (`Settings::bit_flips`); `--no-lagging-io` has the Raft log sync every change before
//! it returns and a request die with its sender (`Settings::lagging_io`); `--no-retries`
//! leaves out the RESERVEs sent again with the same request id (`Settings::retries`);
//! `--no-damage` the record damaged beyond one bit and the operator's wipe and
//! re-admission that follow (`Settings::damage`); `--no-commands` has the clients call
//! the engine instead of sending command lines through the command layer
//! (`Settings::commands`); `--no-feed` the order feed's consumers and their checks
//! (`Settings::feed`).
//! `--no-overlaps` the `RaftNode` scenario's overlapping faults (`Settings::overlaps`),
//! `--no-claims` its feed's second worker, claims, `XPENDING` and blocking reads
//! (`Settings::claims`), `--no-lost-log` its lost Raft log with the identity file kept
//! (`Settings::lost_log`), `--no-doubled` its two faults of one kind at once
//! (`Settings::doubled`), `--no-change-faults` its faults in the middle of a membership
//! change (`Settings::change_faults`), `--no-slow-leader` its slow-disk leader's power
//! loss (`Settings::slow_leader`).
//! `--members=N` runs a group of N members (3 unless told). `--raftnode` runs the other
//! scenario instead: three of the server's own `RaftNode`s over the in-memory transport
//! (`stockgate_sim::run_nodes_with`; of the other flags `--members`, `--verbose`,
//! `--no-feed`, `--no-bit-flips`, `--no-damage`, `--no-lagging-io`, `--no-commands`
//! (`RAFT.READMIT` through `Replication::raft_change` rather than as a command line) and
//! `--no-overlaps`, `--no-claims`, `--no-lost-log`, `--no-doubled`, `--no-change-faults`
//! and `--no-slow-leader` apply to it; the last eleven `--no-` flags give its histories
//! from before those kinds).

use stockgate_sim::{run, run_nodes_with, Settings};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let verbose = args.iter().any(|a| a == "--verbose" || a == "-v");
    let raftnode = args.iter().any(|a| a == "--raftnode");
    let fsync_no = args.iter().any(|a| a == "--fsync-no");
    let net_faults = !args.iter().any(|a| a == "--no-net-faults");
    let pause_and_membership = !args.iter().any(|a| a == "--no-pause-and-membership");
    let expiry = !args.iter().any(|a| a == "--no-expiry");
    let bit_flips = !args.iter().any(|a| a == "--no-bit-flips");
    let lagging_io = !args.iter().any(|a| a == "--no-lagging-io");
    let retries = !args.iter().any(|a| a == "--no-retries");
    let damage = !args.iter().any(|a| a == "--no-damage");
    let commands = !args.iter().any(|a| a == "--no-commands");
    let snapshots = !args.iter().any(|a| a == "--no-snapshots");
    let feed = !args.iter().any(|a| a == "--no-feed");
    let overlaps = !args.iter().any(|a| a == "--no-overlaps");
    let claims = !args.iter().any(|a| a == "--no-claims");
    let lost_log = !args.iter().any(|a| a == "--no-lost-log");
    let doubled = !args.iter().any(|a| a == "--no-doubled");
    let change_faults = !args.iter().any(|a| a == "--no-change-faults");
    let slow_leader = !args.iter().any(|a| a == "--no-slow-leader");
    let members = args
        .iter()
        .find_map(|a| a.strip_prefix("--members="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(Settings::default().members);
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let Some(&first) = nums.first() else {
        eprintln!(
            "usage: stockgate-sim SEED [COUNT] [--verbose] [--fsync-no] [--no-net-faults] \
             [--no-pause-and-membership] [--no-expiry] [--no-snapshots] [--no-bit-flips] \
             [--no-lagging-io] [--no-retries] [--no-damage] [--no-commands] [--no-feed] \
             [--no-overlaps] [--no-claims] [--no-lost-log] [--no-doubled] \
             [--no-change-faults] [--no-slow-leader] [--members=N] [--raftnode]"
        );
        std::process::exit(2);
    };
    let count = nums.get(1).copied().unwrap_or(1);
    if let Ok(filter) = std::env::var("SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .without_time()
            .init();
    }
    let settings = Settings {
        verbose,
        fsync_no,
        net_faults,
        pause_and_membership,
        expiry,
        bit_flips,
        lagging_io,
        snapshots,
        retries,
        damage,
        commands,
        feed,
        overlaps,
        claims,
        lost_log,
        doubled,
        change_faults,
        slow_leader,
        members,
        ..Settings::default()
    };
    let mut failed = false;
    for seed in first..first.saturating_add(count) {
        let out = if raftnode {
            run_nodes_with(seed, &settings)
        } else {
            run(seed, &settings)
        };
        println!("{}", out.line());
        failed |= !out.failures.is_empty();
    }
    std::process::exit(i32::from(failed));
}
