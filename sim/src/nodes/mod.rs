//! The second scenario: three (or five) of the server's own `RaftNode`s (not hand-built members)
//! over the in-memory transport (`wire`), in simulated time, with the delays drawn from
//! the seed. What it checks is what clients see through the `Replication` trait, the
//! command layer's view of a member: `SENTINEL get-master-addr-by-name` (the
//! discovery answer), `write_refusal` (the write gate) and `role`.
//!
//! The run: the group forms as the server's bootstrap forms it; every member's discovery
//! answer names the one member that takes writes; a client reserves on whichever member
//! takes writes, each reply waiting for the group's commit. The leader is cut off both
//! ways: within the lease (the shortest election timeout) and a heartbeat it no longer
//! names itself nor takes writes, and the other two elect and name a new leader. The
//! links heal and all three agree again. The same with the leader cut off from sending
//! only (it still hears the others). `SENTINEL FAILOVER` on the leader moves the
//! leadership to another member. The leader is killed (every task of its member
//! aborted): the other two elect and name a new one. Every acknowledged hold is on the
//! last leader and on the member following it. Throughout, at most one member takes
//! writes at any instant, and the RESERVEs waiting on the leader cut off are answered
//! (refused) once it gives way, within the longest election timeout and two heartbeats.
//!
//! Then the drawn phase (`faults`): the killed member comes back, and 4 to 7 fault steps
//! drawn from the seed (crashes with power loss, link cuts, flapping, lossy links, a
//! member cut off, a voter taken out and added back, a member stopped and continued, a
//! storage error, a lost disk re-admitted), each checked as the fixed ones. A second
//! client (`commands`) runs throughout, through the command layer, finding the leader
//! through discovery; at the end, all healed and up, every member holds what it was
//! acknowledged.

mod amnesia;
mod boot;
mod change_faults;
mod checks;
mod client;
mod commands;
mod crash;
mod disk_faults;
mod doubled;
mod exit;
mod expiry;
mod faults;
mod feed;
mod feed_checks;
mod kinds;
mod ledger;
mod lost_log;
mod members;
mod membership;
mod overlap;
mod pause;
mod reads;
mod slow_leader;
mod snapshots;
mod storage_faults;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_server::raft::NodeId;
use stockgate_server::session::{Replication, SentinelAnswer, SentinelQuery};
use tokio::time::{sleep, Instant};

use crate::gate::Gate;
use crate::history::History;
use crate::wire::Wire;
use crate::{Outcome, Settings};
use boot::{Env, Node};
pub(crate) use kinds::Kinds;

/// openraft's timings, as the hand-built scenario's (ms): heartbeat, shortest and
/// longest election timeout.
const TIMING: (u64, u64, u64) = (100, 400, 800);
/// The group forms and every member names its leader within this.
const FORM_WITHIN: Duration = Duration::from_secs(10);
/// After the leader is cut off or killed, the others elect a new one and name it within
/// this: openraft's leader lease (the longest election timeout), an election, and the
/// followers' first append from the new leader, with room for unlucky draws.
const FAILOVER_WITHIN: Duration = Duration::from_secs(4);
/// After the links heal, the cut-off member follows the leader within this: it stands
/// for nothing until a majority has answered its `Hello`s for the longest election
/// timeout plus the back-off's bound (`RaftNode::reach_loop`), then hears the leader.
const HEAL_WITHIN: Duration = Duration::from_secs(6);
/// An isolated leader stops claiming master within its lease (the shortest election
/// timeout, counted from its last acknowledged append) plus this.
const GIVE_UP_SLACK: Duration = Duration::from_millis(100);
/// How often the checks look.
const STEP: Duration = Duration::from_millis(5);
/// How long a deposed member is down before its new process serves (the restart hook's
/// grace for the replies).
const RESTART_AFTER: Duration = Duration::from_millis(100);
/// A reply waits this long for the group's commit.
const REPLY_TTL: Duration = Duration::from_secs(5);
/// With every member up and every link healed, every member holds every acknowledged
/// outcome within this.
const QUIESCE_WITHIN: Duration = Duration::from_secs(10);

/// The run's members and what its checks found.
pub(crate) struct Run {
    env: Env,
    live: Mutex<BTreeMap<NodeId, Node>>,
    failures: Mutex<Vec<String>>,
    /// The holds whose RESERVE was acknowledged (committed by the group).
    acked: Mutex<BTreeSet<String>>,
    /// The member cut off from the others, and since when.
    isolated: Mutex<Option<(NodeId, Instant)>>,
    /// The RESERVE replies still waiting for the group's commit.
    replies: client::Replies,
    /// The members the fixed steps killed (the drawn phase starts them again first).
    killed: Mutex<BTreeSet<NodeId>>,
    /// When each member that was cut off was cut off.
    cut_at: Mutex<BTreeMap<NodeId, Instant>>,
    /// The newer fault kinds this run draws.
    kinds: Kinds,
}

impl Run {
    fn fail(&self, what: String) {
        self.env.history.note(format!("FAIL {what}"));
        self.failures.lock().push(what);
    }

    fn note(&self, what: String) {
        self.env.history.note(what);
    }

    fn ids(&self) -> BTreeSet<NodeId> {
        self.live.lock().keys().copied().collect()
    }
}

/// Runs the scenario of `seed` with `members` members (ids 1 to `members`) in `root`
/// (the caller's runtime: current-thread, paused).
pub(crate) async fn run(seed: u64, mut rng: StdRng, root: PathBuf, settings: Settings) -> Outcome {
    let (members, verbose) = (settings.members as usize, settings.verbose);
    let kinds = Kinds::of(&settings);
    let history = History::new(verbose);
    let max_delay = rng.gen_range(1..=30);
    history.note(format!(
        "seed {seed}, {members} RaftNodes, legs delayed up to {max_delay} ms"
    ));
    let knobs = Knobs::draw(seed, &history);
    let ids: Vec<NodeId> = (1..=members as NodeId).collect();
    let wire = Wire::new(StdRng::seed_from_u64(rng.gen()), max_delay);
    let gates: BTreeMap<NodeId, Arc<Gate>> =
        (1..=members as NodeId).map(|i| (i, Gate::new())).collect();
    for (&i, g) in &gates {
        wire.set_gate(i, g.clone());
    }
    let env = Env {
        wire,
        history: history.clone(),
        root,
        clocks: expiry::Clocks::new(&ids, true),
        ids,
        group: rng.gen::<u64>().max(1),
        timing: TIMING,
        processes: AtomicU64::new(0),
        disks: Mutex::new(BTreeMap::new()),
        snapshot_records: knobs.snapshot_records,
        gates,
        lagging_io: kinds.lagging_io,
    };
    let r = Arc::new(Run {
        env,
        live: Mutex::new(BTreeMap::new()),
        failures: Mutex::new(Vec::new()),
        acked: Mutex::new(BTreeSet::new()),
        isolated: Mutex::new(None),
        replies: client::Replies::default(),
        killed: Mutex::new(BTreeSet::new()),
        cut_at: Mutex::new(BTreeMap::new()),
        kinds,
    });
    let done = Arc::new(AtomicBool::new(false));
    let monitor = tokio::spawn(checks::monitor(r.clone(), done.clone()));
    let supervisor = tokio::spawn(supervise(r.clone(), done.clone()));
    phases(&r, &mut rng, (&knobs, &settings)).await;
    done.store(true, Ordering::Release);
    let _ = monitor.await;
    let _ = supervisor.await;
    let nodes: Vec<Node> = std::mem::take(&mut *r.live.lock()).into_values().collect();
    for n in nodes {
        n.kill().await;
    }
    let (sent, lost) = r.env.wire.counts();
    history.note(format!("legs sent {sent}, lost {lost}"));
    let (digest, events) = history.digest();
    let failures = r.failures.lock().clone();
    Outcome {
        seed,
        digest,
        events,
        failures,
    }
}

/// A deposed member re-executes itself (`RaftNode::restart_hook`): its process ends
/// (its WAL closed, as the hook closes it), and after the hook's grace for the replies
/// it starts again from its data dir, throwing away the engine state its group never
/// committed. A member that exits with no storage error armed on it (its Raft core
/// stopped) fails the run, and starts again as its supervisor would start it.
async fn supervise(r: Arc<Run>, done: Arc<AtomicBool>) {
    while !done.load(Ordering::Acquire) {
        unexpected_exits(&r).await;
        // A stopped member re-executes once it continues; one whose disk failed it
        // exits (its watcher polls every 20 ms, within the restart hook's grace), and
        // the step that failed its disk starts it again (`storage_faults`).
        let deposed: Vec<NodeId> = {
            let live = r.live.lock();
            let d = live.values().filter(|n| {
                n.deposed.load(Ordering::Acquire)
                    && !n.gate.is_stopped()
                    && n.hook.failed().is_none()
            });
            d.map(|n| n.id).collect()
        };
        for id in deposed {
            let Some(n) = r.live.lock().remove(&id) else {
                continue;
            };
            r.note(format!("n{id} deposed: re-executes"));
            n.exit().await;
            sleep(RESTART_AFTER).await;
            members::restart(&r, id).await;
        }
        sleep(STEP).await;
    }
}

/// Members that exited with no storage error injected: the server's watcher found
/// their Raft core stopped (or a storage error the run did not arm).
async fn unexpected_exits(r: &Run) {
    let exited: Vec<NodeId> = {
        let live = r.live.lock();
        let e = live
            .values()
            .filter(|n| n.exited.fault().is_some() && n.hook.failed().is_none());
        e.map(|n| n.id).collect()
    };
    for id in exited {
        let Some(n) = r.live.lock().remove(&id) else {
            continue;
        };
        let what = n
            .exited
            .fault()
            .map(ToString::to_string)
            .unwrap_or_default();
        let what = what.replace(&format!("{}/", r.env.root.display()), "");
        r.fail(format!("n{id} exited with no storage error armed: {what}"));
        n.kill().await;
        sleep(RESTART_AFTER).await;
        members::restart(r, id).await;
    }
}

/// What a run draws for its holds' expiry, its clock jumps and its snapshots: from a
/// generator of its own (seeded from the seed), so that the run's other draws are the
/// ones they were before these existed.
pub(crate) struct Knobs {
    /// The command client's sale's hold TTL (ms).
    ttl_ms: u64,
    /// Every member's `--snapshot-records`.
    snapshot_records: u64,
    /// Seeds the clock jumps' generator and the command client's extra draws.
    rng: Mutex<StdRng>,
}

impl Knobs {
    /// Seven runs in ten hold for 0.3 to 5 s (most holds expire within the run, many
    /// while faults go on), the others 30 s to 10 min (expiring through clock jumps
    /// forward or EXTENDs to a short while); four runs in ten snapshot every 20 to 200
    /// records.
    fn draw(seed: u64, h: &History) -> Knobs {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6b6e_6f62_7321_0001);
        let ttl_ms = if rng.gen_range(0..10) < 7 {
            rng.gen_range(300..5_000)
        } else {
            rng.gen_range(30_000..600_000)
        };
        let snapshot_records = if rng.gen_range(0..10) < 4 {
            rng.gen_range(20..200)
        } else {
            1 << 40
        };
        h.note(format!(
            "hold TTL {ttl_ms} ms, snapshot every {snapshot_records} records"
        ));
        Knobs {
            ttl_ms,
            snapshot_records,
            rng: Mutex::new(rng),
        }
    }

    /// A generator of its own for one user of these knobs.
    fn fork(&self) -> StdRng {
        StdRng::seed_from_u64(self.rng.lock().gen())
    }
}

/// Starts every member, then the steps in order; a step that fails ends the run.
async fn phases(r: &Arc<Run>, rng: &mut StdRng, (knobs, settings): (&Knobs, &Settings)) {
    for id in r.env.ids.clone() {
        let incarnation = rng.gen::<u64>().max(1);
        match boot::start(&r.env, id, Some(incarnation)).await {
            Ok(n) => {
                r.note(format!("n{id} starts"));
                r.live.lock().insert(id, n);
            }
            Err(e) => return r.fail(format!("n{id} refuses to start: {e}")),
        }
    }
    let formed = checks::agreement(r, "the group formed", FORM_WITHIN, None, None).await;
    let Some(leader) = formed else {
        return;
    };
    if !client::create_sale(r, leader).await {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writes = tokio::spawn(client::run(
        r.clone(),
        StdRng::seed_from_u64(rng.gen()),
        stop.clone(),
    ));
    let (cmds, stop_cmds, ledger) = commands::spawn(r, rng, (knobs.ttl_ms, knobs.fork()));
    let jumps = tokio::spawn(expiry::jumps(r.clone(), knobs.fork(), stop_cmds.clone()));
    let snaps = tokio::spawn(snapshots::watch(r.clone(), stop_cmds.clone()));
    // Drawn last from the knobs, so the others' generators are the ones they were.
    let feed = settings
        .feed
        .then(|| feed::spawn(r, knobs.fork(), stop_cmds.clone()));
    let fixed = faults(r, rng, leader).await;
    if fixed {
        sleep(Duration::from_millis(rng.gen_range(500..2_000))).await;
    }
    stop.store(true, Ordering::Release);
    // Every reply is answered or timed out when the client returns.
    let _ = writes.await;
    let drawn = fixed && faults::random_phase(r, rng).await && faults::all_healed(r).await;
    stop_cmds.store(true, Ordering::Release);
    let _ = cmds.await;
    let jumped = jumps.await.unwrap_or(0);
    let snapped = snaps.await.unwrap_or_default();
    let feed_log = match feed {
        Some((task, log)) => {
            let _ = task.await;
            Some(log)
        }
        None => None,
    };
    r.note(format!("{jumped} clock jumps; {snapped}"));
    // The followers learn the last commits by the leader's next heartbeats.
    sleep(Duration::from_secs(1)).await;
    if drawn {
        commands::quiescent(r, &ledger, QUIESCE_WITHIN).await;
        checks::logs_match(r, "at quiescence");
        let released = ledger::released(&ledger.lock());
        expiry::check_counters(r, &released);
        snapshots::check_equal(r).await;
        if let Some(log) = &feed_log {
            feed_checks::check_final(r, log).await;
        }
    }
    checks::acked_holds(r).await;
}

/// The faults in order: the leader cut off both ways, then (after healing) cut off
/// from sending only, then handed over (`SENTINEL FAILOVER`), then killed. `false` when
/// a step failed.
async fn faults(r: &Arc<Run>, rng: &mut StdRng, leader: NodeId) -> bool {
    let Some(leader) = cut_off(r, rng, leader, true).await else {
        return false;
    };
    let Some(leader) = cut_off(r, rng, leader, false).await else {
        return false;
    };
    let Some(leader) = hand_over(r, rng, leader).await else {
        return false;
    };
    kill(r, rng, leader).await
}

/// Cuts `leader` off, both ways or only what it sends (what the others send still
/// reaches it); checks that it stops claiming master and that the others elect and
/// name another; heals. The leader the three agree on after healing.
async fn cut_off(r: &Arc<Run>, rng: &mut StdRng, leader: NodeId, both: bool) -> Option<NodeId> {
    sleep(Duration::from_millis(rng.gen_range(500..2_000))).await;
    let at = Instant::now();
    let ids = r.ids();
    if both {
        r.env.wire.isolate(leader, &ids);
    } else {
        for &o in ids.iter().filter(|o| **o != leader) {
            r.env.wire.cut(leader, o);
        }
    }
    *r.isolated.lock() = Some((leader, at));
    r.cut_at.lock().insert(leader, at);
    let how = if both { "both ways" } else { "from sending" };
    r.note(format!("n{leader} cut off {how}"));
    checks::gives_up(r, leader, at).await;
    let what = format!("n{leader} cut off {how}");
    checks::agreement(r, &what, FAILOVER_WITHIN, Some(leader), None).await?;
    sleep(Duration::from_millis(rng.gen_range(500..2_000))).await;
    r.env.wire.heal();
    *r.isolated.lock() = None;
    r.note("links healed".into());
    checks::agreement(r, "healed", HEAL_WITHIN, None, None).await
}

/// `SENTINEL FAILOVER` on `leader` (through the `Replication` trait, as a client sends
/// it): another member leads and every member names it, with no fault at all.
async fn hand_over(r: &Arc<Run>, rng: &mut StdRng, leader: NodeId) -> Option<NodeId> {
    sleep(Duration::from_millis(rng.gen_range(500..2_000))).await;
    let answer = r.live.lock().get(&leader).map(|n| {
        let q = SentinelQuery::Failover(boot::GROUP.as_bytes());
        Replication::sentinel(&*n.node, q)
    });
    r.note(format!("SENTINEL FAILOVER on n{leader}: {answer:?}"));
    if !matches!(answer, Some(Ok(SentinelAnswer::FailoverStarted))) {
        r.fail(format!(
            "SENTINEL FAILOVER on n{leader} refused: {answer:?}"
        ));
        return None;
    }
    let what = format!("n{leader} handed over");
    checks::agreement(r, &what, FAILOVER_WITHIN, None, Some(leader)).await
}

/// Kills `leader`: the other two elect and name a new leader.
async fn kill(r: &Arc<Run>, rng: &mut StdRng, leader: NodeId) -> bool {
    sleep(Duration::from_millis(rng.gen_range(500..2_000))).await;
    let Some(n) = r.live.lock().remove(&leader) else {
        r.note(format!("n{leader} is restarting: not killed"));
        return false;
    };
    r.note(format!("n{leader} killed"));
    r.killed.lock().insert(leader);
    n.kill().await;
    let what = format!("n{leader} killed");
    checks::agreement(r, &what, FAILOVER_WITHIN, None, None)
        .await
        .is_some()
}
