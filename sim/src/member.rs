//! One group member, built as a server builds it (`app::recover`, `RaftNode::start`)
//! from the real pieces: the WAL (written inline), the engine recovered from it, the
//! speculation, the Raft log store (written inline), the state machine and openraft,
//! on the simulated network. What `RaftNode` adds is mirrored by [`watch`]: writes open
//! only for a leader caught up in its term whose lease a majority answered.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::SeedableRng;

use openraft::{Config, ServerState};
use stockgate_server::app::feed as app_feed;
use stockgate_server::engine::{Clock, Engine, EngineConfig, Keyring, ReservationKey};
use stockgate_server::feed::Feed;
use stockgate_server::persist::{recover_engine_from, RecoveryReport, WalDurability};
use stockgate_server::raft::lease::Lease;
use stockgate_server::raft::log_store::LogStore;
use stockgate_server::raft::snapshot::{self, SnapshotHooks, Snapshots};
use stockgate_server::raft::speculation::Speculation;
use stockgate_server::raft::state_machine::StateMachine;
use stockgate_server::raft::{authority, network, NodeId, NodeInfo, Raft};
use stockgate_server::session::ServerConfig;
use stockgate_server::wal::{Wal, WalOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::disk::Hook;

/// Mixed into a process's origin to seed the lags of its Raft log's syncs.
const LAG_SEED: u64 = 0x6c61_6767_696e_6721;
use crate::history::History;
use crate::net::{Factory, Net};

/// A running member.
pub struct Member {
    /// Its id.
    pub id: NodeId,
    /// Its openraft handle.
    pub raft: Raft,
    /// Its engine.
    pub engine: Arc<Engine>,
    /// Its WAL.
    pub dur: Arc<WalDurability>,
    /// Where its engine's records go.
    pub spec: Arc<Speculation>,
    /// Its order feed over its WAL, with its consumer groups (as `app::feed` opens a
    /// server's).
    pub feed: Arc<Feed>,
    /// The member must restart: set by the speculation's depose hook (a server
    /// re-executes itself) and when openraft's core stopped (a server exits and its
    /// supervisor starts it again).
    pub deposed: Arc<AtomicBool>,
    /// What its WAL and Raft log write through (the simulated disk).
    pub hook: Arc<Hook>,
    /// Its Raft log, as openraft sees it (what was appended, synced or not).
    pub store: LogStore,
    lease: Arc<Lease>,
    election_min_ms: u64,
    tasks: Vec<JoinHandle<()>>,
}

/// What every member of a run shares.
#[derive(Clone)]
pub struct Env {
    /// The network.
    pub net: Arc<Net>,
    /// openraft's settings.
    pub config: Arc<Config>,
    /// Holds expire (the engines release them at their deadline, `auto_release`) and
    /// each member runs the server's ticker (`Settings::expiry`).
    pub expiry: bool,
    /// The run's history.
    pub history: History,
    /// Where the members' data dirs live.
    pub root: PathBuf,
    /// `--snapshot-records` of every member (`Settings::snapshots`); `None`: no member
    /// snapshots, as before snapshots were simulated.
    pub snapshot_records: Option<u64>,
}

impl Env {
    /// Member `id`'s data dir.
    pub fn dir(&self, id: NodeId) -> PathBuf {
        self.root.join(format!("n{id}"))
    }
}

fn keys() -> (Keyring, ReservationKey) {
    let ring = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap();
    (ring, ReservationKey::from_bytes(&[9u8; 32]))
}

/// A member process's engine, WAL and speculation, and what recovery found (the feed's
/// groups among it).
pub(crate) type Recovered = (
    Arc<Engine>,
    Arc<WalDurability>,
    Arc<Speculation>,
    RecoveryReport,
);

/// The engine, its WAL and its speculation, recovered from `dir` as a server's are;
/// `auto_release`: the engine releases expired holds itself (a server with no ledger).
pub(crate) fn recover(
    dir: &Path,
    auto_release: bool,
    (origin, clock): (u64, Arc<dyn Clock>),
    (opts, hook): (WalOptions, Arc<Hook>),
) -> Result<Recovered, String> {
    let opened = Wal::open_inline_on(dir, opts, hook).map_err(|e| format!("WAL: {e}"))?;
    let cfg = EngineConfig {
        // Nothing is forgotten within a run: every acknowledged hold must still be
        // there at the end, held, sold or released.
        retention_ms: 1 << 40,
        // A server with no ledger (no sweeper) releases expired holds itself.
        auto_release,
        ..EngineConfig::default()
    };
    let mut spec = None;
    let (engine, dur, report) = recover_engine_from(opened, cfg, clock, keys(), |wal| {
        let s = Arc::new(Speculation::new(origin, wal.last_lsn()));
        spec = Some(s.clone());
        s
    })
    .map_err(|e| format!("recovery: {e}"))?;
    let spec = spec.ok_or("recovery built no speculation")?;
    Ok((engine, dur, spec, report))
}

/// How one member process starts: its origin (names the process), the incarnation of
/// its storage, its WAL's options, the disk model it writes through and its clock.
pub struct Boot {
    /// Names this process.
    pub origin: u64,
    /// The storage it runs on.
    pub incarnation: u64,
    /// Its WAL's options (fsync policy, segment size).
    pub wal: WalOptions,
    /// Its disk.
    pub disk: Arc<crate::disk::Disk>,
    /// Its Raft log writes a while after each change (`Settings::lagging_io`).
    pub lagging_io: bool,
    /// Its engine's clock, new for each process (a restart starts a new monotonic
    /// clock, as a restarted server's `SystemClock` is new).
    pub clock: Arc<dyn Clock>,
}

/// Starts member `id` from its data dir; `Err` when it refuses to start (as a server
/// exits on a log it cannot recover).
pub async fn start(id: NodeId, env: &Env, boot: Boot) -> Result<Member, String> {
    let Boot {
        origin,
        incarnation,
        wal,
        disk,
        lagging_io,
        clock,
    } = boot;
    let dir = env.dir(id);
    let deposed = Arc::new(AtomicBool::new(false));
    // The lags are drawn from the process's origin: no draw from the run's generators.
    let lag = lagging_io.then(|| StdRng::seed_from_u64(origin ^ LAG_SEED));
    let hook = Hook::new(disk, Some(deposed.clone()), env.history.clone(), lag);
    let store = LogStore::open_inline_on(&dir.join("raft"), hook.clone())
        .map_err(|e| format!("raft log: {e}"))?;
    adopt_staged(id, &dir, &store, &env.history)?;
    let (engine, dur, spec, report) =
        recover(&dir, env.expiry, (origin, clock), (wal, hook.clone()))?;
    let flag = deposed.clone();
    spec.set_depose_hook(Box::new(move |_why| flag.store(true, Ordering::Release)));
    // Opened before the state machine applies anything, as a server opens it
    // (`app::shared::build`) before the member starts.
    let feed = app_feed::open_on(&dur, Some(&spec), &report, engine.clock());
    let (sm, snapshots) = state_machine(&engine, &dur, &spec, (&store, &dir), &feed)?;
    let lease = Arc::new(Lease::default());
    let factory = Factory {
        from: id,
        net: env.net.clone(),
        lease: lease.clone(),
    };
    let raft = Raft::new(id, env.config.clone(), factory, store.clone(), sm)
        .await
        .map_err(|e| format!("openraft: {e}"))?;
    // Nobody stands before the membership names this storage as a voter (as
    // `RaftNode::serve_peers` and `follow_admission`).
    raft.runtime_config().elect(false);
    env.net.attach(id, raft.clone(), incarnation);
    let watcher = Watcher {
        id,
        net: env.net.clone(),
        reach: Mutex::new(Reach::default()),
        hold: Duration::from_millis(env.config.election_timeout_max) + network::BACKOFF_MAX,
        restart: deposed.clone(),
        incarnation,
        admitted: AtomicBool::new(false),
        raft: raft.clone(),
        spec: spec.clone(),
        dur: dur.clone(),
        lease: lease.clone(),
        history: env.history.clone(),
        election_min: Duration::from_millis(env.config.election_timeout_min),
        heartbeat: Duration::from_millis(env.config.heartbeat_interval),
        store: store.clone(),
        seen: Mutex::new(None),
    };
    let mut tasks = spawn_tasks(env, &raft, &spec, watcher, snapshots);
    if env.expiry {
        let t = Ticker {
            id,
            net: env.net.clone(),
            engine: engine.clone(),
            spec: spec.clone(),
        };
        tasks.push(tokio::spawn(t.run()));
    }
    Ok(Member {
        id,
        raft,
        engine,
        dur,
        spec,
        feed,
        deposed,
        hook,
        store,
        lease,
        election_min_ms: env.config.election_timeout_min,
        tasks,
    })
}

/// The member process's own tasks: the proposer, the watcher and, with snapshots, the
/// server's own trigger (`RaftNode::start` spawns the same loop).
fn spawn_tasks(
    env: &Env,
    raft: &Raft,
    spec: &Arc<Speculation>,
    watcher: Watcher,
    snapshots: Arc<Snapshots>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(spec.clone().propose(raft.clone())),
        tokio::spawn(watcher.run()),
    ];
    if let Some(every) = env.snapshot_records {
        let trigger = snapshot::trigger_loop(raft.clone(), snapshots, every);
        tasks.push(tokio::spawn(trigger));
    }
    tasks
}

/// A snapshot received from the leader, staged before the member restarted, becomes its
/// WAL dir if the Raft log names it, as a server's start does (`node::prepare`, before
/// the WAL is opened); any other staged dir is an interrupted transfer and is dropped.
fn adopt_staged(id: NodeId, dir: &Path, store: &LogStore, h: &History) -> Result<(), String> {
    let recorded = store.snapshot();
    let adopted = snapshot::adopt_staged(dir, recorded.as_ref())
        .map_err(|e| format!("staged snapshot: {e}"))?;
    if let (true, Some(s)) = (adopted, recorded) {
        let at = s.meta.last_log_id.map(|l| l.index);
        h.note(format!(
            "n{id} adopts the group's snapshot: entry {at:?}, LSN {}",
            s.lsn
        ));
    }
    Ok(())
}

/// The member's state machine over its engine, WAL and Raft log, where recovery left
/// them (as `RaftNode::start` builds it), and its snapshots, built and installed on the
/// caller's task (`Snapshots::new_inline`), held back by the consumer groups of `feed`
/// as a server's are (`app::feed::snapshot_hold`).
fn state_machine(
    engine: &Arc<Engine>,
    dur: &Arc<WalDurability>,
    spec: &Arc<Speculation>,
    (store, dir): (&LogStore, &Path),
    feed: &Arc<Feed>,
) -> Result<(StateMachine, Arc<Snapshots>), String> {
    let hooks = SnapshotHooks {
        hold: app_feed::snapshot_hold(Some(feed.clone())),
        compact_slots: Box::new(|r| r),
    };
    let snapshots = Arc::new(Snapshots::new_inline(
        dur.clone(),
        engine.clone(),
        store.clone(),
        hooks,
    ));
    let applied = store.applied_for(dur.wal.last_lsn())?;
    let sm = StateMachine::new(
        engine.clone(),
        dur.clone(),
        spec.clone(),
        applied,
        snapshots.clone(),
        (store.clone(), dir.to_path_buf()),
    );
    Ok((sm, snapshots))
}

impl Member {
    /// The process ends: its tasks stop and its handles go. What its files keep is the
    /// caller's (`Hook::die` first for a `kill -9` or a power loss, so the close below
    /// syncs nothing the disk model counts; then `Disk::power_cut` for a power loss).
    pub async fn crash(self, net: &Net) {
        // The process is gone: its Raft log writes nothing it had not written yet.
        self.hook.end();
        net.detach(self.id);
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.raft.shutdown().await;
        for t in self.tasks {
            let _ = t.await;
        }
        // The directory lock, released as the server's restart hook releases it: a
        // deposed member's state machine waits for ever inside `apply` (the server
        // re-executes meanwhile), so its WAL handle is never dropped here. After
        // `Hook::die` the close's syncs do not count: a killed process syncs nothing.
        let _ = self.dur.wal.flush_and_close();
        drop(self.dur);
        drop(self.spec);
        drop(self.feed);
        drop(self.engine);
        drop(self.raft);
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// Whether this member takes writes now: the server's write gate (`RaftNode`'s
    /// refusal): writes opened, and leading in Raft's view with the lease held.
    pub fn writable(&self) -> bool {
        if !self.spec.writable() || self.deposed.load(Ordering::Acquire) {
            return false;
        }
        let m = self.raft.metrics().borrow().clone();
        let voters = m.membership_config.membership().voter_ids().count();
        let age = self.lease.age_ms(m.current_term, Instant::now());
        let lease = authority::lease_held(age, self.election_min_ms, voters);
        authority::acts_as_leader(self.id, &m, lease)
    }
}

/// The server's ticker (`server::spawn_ticker`): the engine's timers (expiry, purges)
/// every `tick_ms` of the server's default settings, while the member takes writes
/// (`authority::may_tick`, the server's rule; `RaftNode::is_replica` is
/// `!spec.writable()`).
struct Ticker {
    id: NodeId,
    net: Arc<Net>,
    engine: Arc<Engine>,
    spec: Arc<Speculation>,
}

impl Ticker {
    async fn run(self) {
        let period = Duration::from_millis(ServerConfig::default().tick_ms.max(1));
        let mut iv = tokio::time::interval(period);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            iv.tick().await;
            // A stopped process runs none of its own code.
            if self.net.is_paused(self.id) {
                continue;
            }
            if authority::may_tick(Some(!self.spec.writable())) {
                self.engine.tick();
            }
        }
    }
}

/// `RaftNode::watch_leadership`'s rule for opening and closing writes.
struct Watcher {
    id: NodeId,
    net: Arc<Net>,
    reach: Mutex<Reach>,
    /// In reach this long before standing again (`RaftNode::reach_loop`'s hold).
    hold: Duration,
    /// Set when openraft's core stopped on an error: the server exits then
    /// (`storage_fault`) and its supervisor starts it again; here it is restarted.
    restart: Arc<AtomicBool>,
    incarnation: u64,
    admitted: AtomicBool,
    raft: Raft,
    spec: Arc<Speculation>,
    dur: Arc<WalDurability>,
    lease: Arc<Lease>,
    history: History,
    election_min: Duration,
    heartbeat: Duration,
    /// The Raft log, for what a snapshot covers.
    store: LogStore,
    /// The snapshot and the purge point last written to the history (the first look
    /// only records them).
    seen: Mutex<Option<(Option<u64>, Option<u64>)>>,
}

impl Watcher {
    async fn run(self) {
        let mut rx = self.raft.metrics();
        loop {
            let m = rx.borrow_and_update().clone();
            self.step(&m);
            tokio::select! {
                biased;
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(self.heartbeat) => {}
            }
        }
    }

    fn step(&self, m: &openraft::RaftMetrics<NodeId, stockgate_server::raft::NodeInfo>) {
        // A stopped process runs none of its own code: the watcher looks again once it
        // continues. (openraft's ticks are off meanwhile, but its core still handles what
        // the member's own tasks hand it: docs/simulation.md.)
        if self.net.is_paused(self.id) {
            return;
        }
        if let Err(e) = &m.running_state {
            if !matches!(e, openraft::error::Fatal::Stopped)
                && !self.restart.swap(true, Ordering::AcqRel)
            {
                self.history
                    .note(format!("n{} raft core stopped: {e}", self.id));
            }
            return;
        }
        self.note_snapshot(m);
        self.follow_admission(m);
        self.lease.set_voters(self.id, authority::voters(m));
        if self.spec.writable() && authority::must_close_writes(self.id, m, self.spec.term()) {
            let term = self.spec.term();
            self.spec.close(&format!("no longer leading term {term}"));
            self.history.note(format!(
                "n{} closes term {term} (deposed {})",
                self.id,
                self.spec.is_deposed()
            ));
        }
        let answered = self
            .lease
            .age_ms(m.current_term, Instant::now())
            .is_some_and(|ms| ms < self.election_min.as_millis() as u64);
        if authority::may_open_writes(self.id, m, answered)
            && !self.spec.writable()
            && !self.spec.is_deposed()
        {
            let last = self.dur.wal.last_lsn();
            self.spec.open(m.current_term, last);
            self.history.note(format!(
                "n{} leads term {} from LSN {last}",
                self.id, m.current_term
            ));
        }
    }
}

impl Watcher {
    /// Each snapshot this process built, and each purge of its Raft log, goes into the
    /// history once (never a change: the history is what the digest covers).
    fn note_snapshot(&self, m: &openraft::RaftMetrics<NodeId, NodeInfo>) {
        let now = (m.snapshot.map(|l| l.index), m.purged.map(|l| l.index));
        let Some(before) = self.seen.lock().replace(now) else {
            return;
        };
        if now.0 > before.0 {
            let lsn = self.store.snapshot().map_or(0, |s| s.lsn);
            self.history.note(format!(
                "n{} snapshot built: entry {:?}, LSN {lsn}",
                self.id, now.0
            ));
        }
        if now.1 > before.1 {
            self.history
                .note(format!("n{} raft log purged to entry {:?}", self.id, now.1));
        }
    }

    /// Stands for election only while the membership lists this member as a voter under
    /// its storage's incarnation (`RaftNode::follow_admission`).
    fn follow_admission(
        &self,
        m: &openraft::RaftMetrics<NodeId, stockgate_server::raft::NodeInfo>,
    ) {
        let ms = m.membership_config.membership();
        let admitted = ms.voter_ids().any(|v| v == self.id)
            && ms
                .get_node(&self.id)
                .is_some_and(|n| n.incarnation == self.incarnation);
        let may = admitted && self.in_reach(m);
        if self.admitted.swap(may, Ordering::AcqRel) != may {
            self.raft.runtime_config().elect(may);
            self.history.note(format!(
                "n{} {} elections",
                self.id,
                if may { "joins" } else { "stays out of" }
            ));
        }
    }

    /// `RaftNode::reach_loop`: once per heartbeat a member that does not lead asks each
    /// other voter `Hello`; it may stand only after a majority (itself included) has
    /// answered for `hold`. Keeps a member that cannot win (its voters unreachable, or
    /// on storage the group refuses) from raising its term again and again.
    fn in_reach(&self, m: &openraft::RaftMetrics<NodeId, NodeInfo>) -> bool {
        let now = Instant::now();
        let mut r = self.reach.lock();
        let may = |r: &Reach| match r.since {
            Since::Always => true,
            Since::At(t) => now.saturating_duration_since(t) >= self.hold,
            Since::Not => false,
        };
        if r.last
            .is_some_and(|l| now.saturating_duration_since(l) < self.heartbeat)
        {
            return may(&r);
        }
        r.last = Some(now);
        if m.state == ServerState::Leader {
            if r.since == Since::Not {
                r.since = Since::Always;
            }
            return true;
        }
        let ms = m.membership_config.membership();
        let voters: Vec<NodeId> = ms.voter_ids().collect();
        let reached = voters
            .iter()
            .filter(|&&v| {
                v == self.id
                    || ms
                        .get_node(&v)
                        .is_some_and(|n| self.net.hello(self.id, v, n.incarnation))
            })
            .count();
        if reached * 2 <= voters.len() {
            r.since = Since::Not;
        } else if r.since == Since::Not {
            r.since = Since::At(now);
        }
        may(&r)
    }
}

/// What the reach check last found.
#[derive(Default)]
struct Reach {
    /// When it last asked.
    last: Option<Instant>,
    since: Since,
}

/// Since when a majority has answered. No instant stands for "long ago" (the server
/// subtracts the hold from now): the simulated clock starts at the machine's
/// monotonic time, and a subtraction that fails on a machine up for less than the hold
/// would make the history depend on the machine.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Since {
    /// From the start (a member may stand at once, as the server's may) or while leading.
    #[default]
    Always,
    At(Instant),
    /// Not in reach now.
    Not,
}
