//! One member as a server runs it: its storage checked and opened by the server's
//! `node::prepare` (the log inline, on the simulated disk), its engine recovered from its WAL, and the server's
//! own `RaftNode::start` over the in-memory transport (`wire`). Everything `RaftNode`
//! spawns is its own: the listener, the proposer, the leadership watcher, the reach
//! loop, the bootstrap. A crash is `RaftNode::stop`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use stockgate_server::app::feed as app_feed;
use stockgate_server::engine::Clock;
use stockgate_server::engine::Engine;
use stockgate_server::feed::Feed;
use stockgate_server::persist::{RecoveryReport, WalDurability};
use stockgate_server::raft::log_store::{LogStore, OpenError};
use stockgate_server::raft::node::{self, Prepared};
use stockgate_server::raft::prepare_env::PrepareEnv;
use stockgate_server::raft::runtime::under_gate;
use stockgate_server::raft::speculation::Speculation;
use stockgate_server::raft::storage_fault::Watched;
use stockgate_server::raft::{NodeId, NodeInfo, RaftNode, RaftNodeConfig};
use stockgate_server::session::{NoDurability, Replication, ServerConfig, Shared, SharedParts};
use stockgate_server::wal::WalOptions;

use super::exit::{self, Exited, Process};
use super::expiry;
use crate::disk::{Disk, Hook};
use crate::gate::Gate;
use crate::history::History;
use crate::member;
use crate::wire::{client_addr, raft_addr, MemTransport, Wire};

/// The group's name, as Sentinel-aware clients ask for it.
pub const GROUP: &str = "sim";

/// What every member of the run shares.
pub struct Env {
    /// The transport's wire.
    pub wire: Arc<Wire>,
    /// The run's history.
    pub history: History,
    /// Where the members' data dirs live.
    pub root: PathBuf,
    /// The members the bootstrap forms the group of.
    pub ids: Vec<NodeId>,
    /// The new group's id (the bootstrapping member's draw, made here from the seed).
    pub group: u64,
    /// The openraft timings: heartbeat, shortest and longest election timeout (ms).
    pub timing: (u64, u64, u64),
    /// Member processes started so far.
    pub processes: AtomicU64,
    /// Each member's disk (what a power loss keeps), across its processes.
    pub disks: parking_lot::Mutex<BTreeMap<NodeId, Arc<Disk>>>,
    /// The members' wall clocks and whether their engines expire holds (`expiry`).
    pub clocks: expiry::Clocks,
    /// `--snapshot-records` of every member (drawn per run: small in some).
    pub snapshot_records: u64,
    /// Each member's task gate, across its processes (closed while it is stopped).
    pub gates: BTreeMap<NodeId, Arc<Gate>>,
    /// The logs' writes live their own life, as a server's writer threads (`Kinds`): the
    /// Raft log writes a while after each change, the WAL syncs once a second.
    pub lagging_io: bool,
}

impl Env {
    /// Member `id`'s gate.
    pub fn gate(&self, id: NodeId) -> Arc<Gate> {
        self.gates.get(&id).cloned().unwrap_or_default()
    }

    /// Member `id`'s disk, the same across its processes.
    pub fn disk(&self, id: NodeId) -> Arc<Disk> {
        let mut disks = self.disks.lock();
        let d = disks.entry(id);
        d.or_insert_with(|| Disk::new(id, self.dir(id))).clone()
    }

    /// Member `id`'s data dir.
    pub fn dir(&self, id: NodeId) -> PathBuf {
        self.root.join(format!("n{id}"))
    }
}

/// A running member.
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// The server's member.
    pub node: Arc<RaftNode>,
    /// Its engine.
    pub engine: Arc<Engine>,
    /// Where its engine's records go.
    pub spec: Arc<Speculation>,
    /// Set by the speculation's depose hook (a server re-executes itself then).
    pub deposed: Arc<AtomicBool>,
    /// What its connections share: the command layer reaches the member through it
    /// (`Shared::repl`, the write gate and discovery), as a server's does.
    pub shared: Arc<Shared>,
    /// Names this process (its origin): a restart is another process.
    pub process: u64,
    /// Its Raft log, for the snapshot it records.
    pub store: LogStore,
    /// Its task gate (closed while the member is stopped).
    pub gate: Arc<Gate>,
    /// Its view of its disk: storage errors are armed there.
    pub hook: Arc<Hook>,
    /// Its order feed over its WAL, with its consumer groups (`app::feed::open_on`).
    pub feed: Arc<Feed>,
    wal: Arc<WalDurability>,
    /// The server's ticker (`expiry::ticker`), ended with the process.
    ticker: Option<tokio::task::JoinHandle<()>>,
    /// The WAL's once-a-second sync (`Env::lagging_io`), ended with the process.
    wal_sync: Option<tokio::task::JoinHandle<()>>,
    /// The server's `storage_fault::watch`, ended with the process.
    watcher: tokio::task::JoinHandle<()>,
    /// Set when the watcher called for the process's exit.
    pub exited: Arc<Exited>,
}

/// The configuration a server gives member `id` from its flags.
fn config(env: &Env, id: NodeId, dir: &Path, rejoin: bool) -> RaftNodeConfig {
    let members: BTreeMap<NodeId, NodeInfo> = env
        .ids
        .iter()
        .map(|&i| {
            let info = NodeInfo {
                raft_addr: raft_addr(i),
                client_addr: client_addr(i),
                incarnation: 0,
            };
            (i, info)
        })
        .collect();
    let (heartbeat_ms, election_min_ms, election_max_ms) = env.timing;
    RaftNodeConfig {
        id,
        listen: raft_addr(id),
        bootstrap: members,
        form_group: id == env.ids[0],
        routes: Default::default(),
        group_name: GROUP.into(),
        heartbeat_ms,
        election_min_ms,
        election_max_ms,
        rejoin_empty: rejoin,
        restart_argv: Vec::new(),
        data_dir: dir.to_path_buf(),
        // Beyond any run, or (drawn per run) small enough that members snapshot and
        // purge their Raft log, and a member left behind gets the leader's snapshot.
        snapshot_records: env.snapshot_records,
        tls: None,
        // From the seed, as everything a run writes: a random id would make a damaged
        // record's checksum, which a refusal names, differ from run to run.
        history_id: Some(format!("{:016x}{id:016x}", env.group)),
    }
}

/// Starts member `id` from its data dir (new storage of `incarnation` if given), as a
/// server started with `--raft-id` (the first of `env.ids` with `--raft-bootstrap`,
/// which forms the group only on storage with no Raft state).
pub async fn start(env: &Env, id: NodeId, incarnation: Option<u64>) -> Result<Node, String> {
    start_as(env, id, incarnation, false).await
}

/// Starts member `id` on the empty data dir it was given after losing its disk, with
/// new storage of `incarnation` and `--rejoin-empty` (it never forms a group, and waits
/// as a non-voter until the group re-admits it).
pub async fn start_empty(env: &Env, id: NodeId, incarnation: u64) -> Result<Node, String> {
    start_as(env, id, Some(incarnation), true).await
}

async fn start_as(
    env: &Env,
    id: NodeId,
    incarnation: Option<u64>,
    rejoin: bool,
) -> Result<Node, String> {
    let dir = env.dir(id);
    let deposed = Arc::new(AtomicBool::new(false));
    let disk = env.disk(id);
    // Names this process (a server draws it at each start): the batches it writes are
    // the ones its own engine holds already.
    let origin = (id << 32) | (env.processes.fetch_add(1, Ordering::AcqRel) + 1);
    let hook = hook(env, &disk, origin);
    // A new monotonic clock over the member's wall, as a new server process reads it.
    let clock = env.clocks.clock(id);
    let cfg = config(env, id, &dir, rejoin);
    let outside = Outside {
        hook: hook.clone(),
        incarnation: incarnation.unwrap_or(origin ^ INCARNATION_SEED).max(1),
        group: env.group,
        clock: clock.clone(),
    };
    let prepared = prepare(env, &cfg, &outside)?;
    let store = prepared.store.clone();
    let expires = env.clocks.expiry;
    let (engine, dur, spec, report) = member::recover(
        &dir,
        expires,
        (origin, clock),
        (WalOptions::default(), hook.clone()),
    )?;
    let flag = deposed.clone();
    spec.set_depose_hook(Box::new(move |_why| flag.store(true, Ordering::Release)));
    let (feed, shared) = assemble(&engine, &dur, &spec, &report);
    // Every task the member spawns, and every task those spawn, runs under its gate.
    let gate = env.gate(id);
    let log = store.fault_record();
    let node = start_raft(env, (cfg, prepared), (&engine, &dur, &spec, &shared), &gate).await?;
    let _ = shared.repl.set(node.clone() as Arc<dyn Replication>);
    let watched = Watched {
        raft: node.raft.clone(),
        log,
        dur: dur.clone(),
        data_dir: dir.clone(),
    };
    let (watcher, exited) = watch(env, id, watched, (&hook, &gate));
    let ticker = expires.then(|| expiry::ticker(engine.clone(), shared.clone(), gate.clone()));
    let wal_sync = env.lagging_io.then(|| wal_sync(dur.clone(), gate.clone()));
    // Recovery may have cut a torn tail: what is left is what a power loss keeps.
    disk.settle();
    Ok(Node {
        id,
        node,
        engine,
        spec,
        deposed,
        shared,
        process: origin,
        store,
        gate,
        hook,
        feed,
        wal: dur,
        ticker,
        wal_sync,
        watcher,
        exited,
    })
}

/// Distinguishes the lags' generator from the process's other draws.
const LAG_SEED: u64 = 0x6c61_6767_696e_6722;

/// The WAL's sync once a second, as a member's WAL (`everysec`) has its writer thread
/// do it: written inline, it would otherwise sync only as it rolls or closes a segment.
/// A failed sync (an injected one closes the member's write gate: the hook) ends it.
fn wal_sync(wal: Arc<WalDurability>, gate: Arc<Gate>) -> tokio::task::JoinHandle<()> {
    // A stopped member's writer thread stops with it.
    tokio::spawn(under_gate(gate, async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            if wal.wal.sync_blocking().is_err() {
                return;
            }
        }
    }))
}

/// What the server assembles around a member before starting it: the feed opened on the
/// recovered WAL before anything is applied (`app::feed::open_on`), and the `Shared` its
/// connections use, built with the engine and the feed in place.
fn assemble(
    engine: &Arc<Engine>,
    dur: &Arc<WalDurability>,
    spec: &Arc<Speculation>,
    report: &RecoveryReport,
) -> (Arc<Feed>, Arc<Shared>) {
    let feed = app_feed::open_on(dur, Some(spec), report, engine.clock());
    let parts = SharedParts {
        engine: Some(engine.clone()),
        feed: Some(feed.clone()),
        ..SharedParts::default()
    };
    let shared = Shared::with_parts(ServerConfig::default(), None, Arc::new(NoDurability), parts);
    (feed, Arc::new(shared))
}

/// The process's view of member `id`'s disk. The server's rule
/// (`storage_fault::watch`) ends a member whose disk failed it, not the hook: it sets no
/// restart flag.
fn hook(env: &Env, disk: &Arc<Disk>, origin: u64) -> Arc<Hook> {
    // The lags are drawn from the process's origin: no draw from the run's generators.
    let lag = env
        .lagging_io
        .then(|| StdRng::seed_from_u64(origin ^ LAG_SEED));
    Hook::new(disk.clone(), None, env.history.clone(), lag)
}

/// The server's `RaftNode::start`, under the member's gate, over the in-memory wire.
async fn start_raft(
    env: &Env,
    (cfg, prepared): (RaftNodeConfig, Prepared),
    (engine, dur, spec, shared): (
        &Arc<Engine>,
        &Arc<WalDurability>,
        &Arc<Speculation>,
        &Arc<Shared>,
    ),
    gate: &Arc<Gate>,
) -> Result<Arc<RaftNode>, String> {
    under_gate(
        gate.clone(),
        RaftNode::start(
            cfg,
            prepared,
            engine.clone(),
            dur.clone(),
            spec.clone(),
            app_feed::snapshot_hooks(shared),
            Arc::new(MemTransport(env.wire.clone())),
        ),
    )
    .await
}

/// The member's storage checked and opened by the server's `node::prepare`, in the
/// simulation's outside world; a snapshot it adopted is noted.
fn prepare(env: &Env, cfg: &RaftNodeConfig, outside: &Outside) -> Result<Prepared, String> {
    let prepared = node::prepare_on(&cfg.data_dir, cfg, outside)?;
    if prepared.adopted_snapshot() {
        adopted(env, cfg.id, &prepared.store);
    }
    Ok(prepared)
}

/// Starts the server's `storage_fault::watch` on member `id`'s process.
fn watch(
    env: &Env,
    id: NodeId,
    watched: Watched,
    (hook, gate): (&Arc<Hook>, &Arc<Gate>),
) -> (tokio::task::JoinHandle<()>, Arc<Exited>) {
    let process = Process {
        id,
        hook: hook.clone(),
        gate: gate.clone(),
        history: env.history.clone(),
        root: env.root.clone(),
    };
    exit::watch(watched, process)
}

/// Notes the snapshot `node::prepare` adopted: one a previous process staged
/// (`install_snapshot`, which then deposed it) and the Raft log names.
fn adopted(env: &Env, id: NodeId, store: &LogStore) {
    if let Some(s) = store.snapshot() {
        let at = s.meta.last_log_id.map(|l| l.index);
        env.history.note(format!(
            "n{id} adopts the group's snapshot: entry {at:?}, LSN {}",
            s.lsn
        ));
    }
}

/// Distinguishes a start's incarnation, when it makes new storage it was given none
/// for, from the process's other draws.
const INCARNATION_SEED: u64 = 0x696e_6361_726e_6174;

/// What `node::prepare` takes from outside the data dir, in the simulation: the Raft
/// log written inline on the member's disk model, the incarnation and the group's id
/// from the seed (the system's generator would make a run's requests differ from run to
/// run), the member's simulated wall clock.
struct Outside {
    hook: Arc<Hook>,
    incarnation: u64,
    group: u64,
    clock: Arc<dyn Clock>,
}

impl PrepareEnv for Outside {
    fn open_log(&self, dir: &Path) -> Result<LogStore, OpenError> {
        LogStore::open_inline_on(dir, self.hook.clone())
    }

    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn group_id(&self) -> u64 {
        self.group
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    // A server's stderr line; the run's own notes say what happened to whom.
    fn notice(&self, line: &str) {
        tracing::debug!("{line}");
    }
}

impl Node {
    /// The process is killed: every task of its member aborted, openraft shut down, its
    /// listener gone from the wire (its task ends with the others). Nothing it syncs
    /// from then on counts.
    pub async fn kill(self) {
        self.hook.die();
        self.exit().await;
    }

    /// The process ends: its Raft log writes nothing it still had queued, its tasks
    /// stop, and its WAL is closed (the directory lock released, as the server's restart
    /// hook releases it before it re-executes: a deposed member's state machine never
    /// returns from `apply`, so its handles are never dropped).
    pub async fn exit(self) {
        self.hook.end();
        self.watcher.abort();
        for t in [&self.ticker, &self.wal_sync].into_iter().flatten() {
            t.abort();
        }
        self.node.stop().await;
        let _ = self.wal.wal.flush_and_close();
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }
}
