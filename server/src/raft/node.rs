//! A group member as the rest of the server sees it: who leads, whether this node takes
//! writes, the Sentinel discovery commands answered from the Raft leadership, the
//! membership commands, and the restart of a deposed leader.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`): the lease
// and the leadership checks read it.
use tokio::time::Instant;

use openraft::error::ClientWriteError;
use openraft::{Config, ServerState, SnapshotPolicy};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::append_hold::AppendHold;
use super::handover::Handover;
use super::identity::Identity;
use super::lease::Lease;
use super::log_store::LogStore;
use super::peers::PeerTable;
use super::prepare_env::{PrepareEnv, System};
use super::respond::{LastAppend, Responder};
use super::runtime::gated;
use super::snapshot::{SnapshotHooks, Snapshots};
use super::speculation::Speculation;
use super::state_machine::StateMachine;
use super::transport::Transport;
use super::{authority, network, NodeId, NodeInfo, Raft};
use crate::engine::{Engine, Lsn};
use crate::persist::WalDurability;
use crate::session::{
    Durability, FollowerProgress, LeaderProgress, MemberRole, NotDurable, PeerLink, RaftChange,
    RaftChangeFuture, RaftError, RaftMember, Replication, ReplicationInfo, ReplicationLink,
    RoleView, SentinelAnswer, SentinelError, SentinelMaster, SentinelPeer, SentinelQuery,
    SentinelReplica,
};
use tokio::task::JoinHandle;

/// Flags of a group member (`--raft-*`).
#[derive(Clone, Debug)]
pub struct RaftNodeConfig {
    /// This member's id (`--raft-id`).
    pub id: NodeId,
    /// Where this node listens for its peers.
    pub listen: String,
    /// `--raft-peers`: the members the bootstrapping member forms the group of (this
    /// node included). Read only with `--raft-bootstrap`.
    pub bootstrap: BTreeMap<NodeId, NodeInfo>,
    /// `--raft-bootstrap`: form a new group of `--raft-peers`, once, if this member's
    /// storage holds no Raft state. Never inferred from an empty data dir: a member that
    /// lost its disk starts empty too.
    pub form_group: bool,
    /// `--raft-route ID=ADDR`: reach that peer through another address.
    pub routes: HashMap<NodeId, String>,
    /// The name Sentinel-aware clients ask for (`--group-name`).
    pub group_name: String,
    /// How often the leader sends heartbeats, in ms (`--raft-heartbeat-ms`).
    pub heartbeat_ms: u64,
    /// Shortest election timeout, in ms: how long a follower waits without hearing from a leader
    /// before standing.
    pub election_min_ms: u64,
    /// Longest election timeout, in ms; each timeout is drawn between the two so that candidates
    /// rarely collide.
    pub election_max_ms: u64,
    /// `--rejoin-empty`: this data dir lost its Raft log; start empty under a new
    /// incarnation (the WAL set aside), never vote before the group re-admits it.
    pub rejoin_empty: bool,
    /// The command line a deposed node re-executes.
    pub restart_argv: Vec<OsString>,
    /// The data directory, holding the WAL, the Raft log and the snapshots.
    pub data_dir: PathBuf,
    /// `--snapshot-records`: a snapshot after this many records.
    pub snapshot_records: u64,
    /// `--tls-replication`: the Raft port and the calls to peers over TLS.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// The id of the history this member begins if it leads before any member began one;
    /// `None` draws a random one (a server). The simulation gives one from its seed, so
    /// that a run's logs are the same bytes each time.
    pub history_id: Option<String>,
}

/// What `prepare` found on disk.
pub struct Prepared {
    /// The Raft log store opened from the data directory.
    pub store: LogStore,
    /// This storage's identity: node id, incarnation, group.
    pub ident: Arc<Identity>,
    /// `--raft-bootstrap` on storage with no Raft state: this member forms the group.
    forming: bool,
    /// The start adopted a snapshot received from the group's leader as its WAL.
    adopted: bool,
}

impl Prepared {
    /// Whether the start adopted a snapshot received from the group's leader (it then
    /// starts from the snapshot the log records).
    pub fn adopted_snapshot(&self) -> bool {
        self.adopted
    }
}

const ID_FILE: &str = "id";

/// How a member that lost its state comes back, for the refusals.
const READMIT_HOWTO: &str = "start it on an empty data dir with its usual command line but without --raft-bootstrap (it waits as a non-voter), then on the leader `RAFT.READMIT <id>` (docs/replication.md, \"A member lost its disk\")";

/// Checks the data dir's Raft identity and opens the log, before the engine is
/// recovered (a rejoin discards the WAL, which the group then sends again).
pub fn prepare(data_dir: &Path, cfg: &RaftNodeConfig) -> Result<Prepared, String> {
    prepare_on(data_dir, cfg, &System)
}

/// [`prepare`] with the log opened, the ids drawn and the time read by `env`.
pub fn prepare_on(
    data_dir: &Path,
    cfg: &RaftNodeConfig,
    env: &dyn PrepareEnv,
) -> Result<Prepared, String> {
    let dir = data_dir.join("raft");
    let id_path = dir.join(ID_FILE);
    let log_path = dir.join("log");
    let recorded = Identity::load(&id_path).map_err(|e| e.to_string())?;
    if let Some(r) = &recorded {
        if r.node != cfg.id {
            return Err(format!(
                "{} says this data dir is node {} of its group, the command line says --raft-id {}; refusing to start (one data dir, one identity)",
                id_path.display(),
                r.node,
                cfg.id
            ));
        }
    }
    let ident = match recorded {
        Some(r) if !log_path.exists() => rejoin_identity(data_dir, cfg, &r, env)?,
        Some(r) => r,
        None => new_identity(data_dir, cfg, env)?,
    };
    let store = env.open_log(&dir).map_err(|e| e.to_string())?;
    let adopted = super::snapshot::adopt_staged(data_dir, store.snapshot().as_ref())?;
    if adopted {
        env.notice("starting from the snapshot received from the group's leader");
    }
    // `--rejoin-empty` says this member lost its state: it rejoins, it never forms.
    let forming = cfg.form_group && store.is_pristine() && !cfg.rejoin_empty;
    if forming {
        if !cfg.bootstrap.contains_key(&cfg.id) {
            return Err(format!(
                "--raft-bootstrap needs --raft-peers listing every member of the new group, this one (--raft-id {}) included",
                cfg.id
            ));
        }
        // Made and recorded before any peer hears of it: a bootstrap interrupted half
        // way resumes with the same group id.
        if ident.group().is_none() {
            ident
                .adopt_group(env.group_id())
                .map_err(|e| e.to_string())?;
        }
    } else if cfg.form_group {
        tracing::info!("raft: --raft-bootstrap ignored: this member already holds Raft state");
    }
    Ok(Prepared {
        store,
        ident: Arc::new(ident),
        forming,
        adopted,
    })
}

/// A data dir with no identity file: new storage, unless something of a member is
/// already there (then that member lost part of its state).
fn new_identity(
    data_dir: &Path,
    cfg: &RaftNodeConfig,
    env: &dyn PrepareEnv,
) -> Result<Identity, String> {
    let dir = data_dir.join("raft");
    let id_path = dir.join(ID_FILE);
    let wal = data_dir.join("wal");
    let wal_used = std::fs::read_dir(&wal).is_ok_and(|mut d| d.next().is_some());
    // An empty log is what a start that stopped right after creating it leaves.
    let log_used = std::fs::metadata(dir.join("log")).is_ok_and(|m| m.len() > 0);
    if log_used || wal_used {
        return Err(format!(
            "{} is missing, but this data dir holds {}: part of this member's state is lost, and a member never continues a history it cannot vouch for. Refusing to start. To bring it back: move the data dir aside, {READMIT_HOWTO}",
            id_path.display(),
            if wal_used { "a WAL" } else { "a Raft log" }
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The (empty) log first: an identity without a log reads as a lost log at the next
    // start, a log without an identity as the start of a new storage.
    let log = dir.join("log");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let ident =
        Identity::create_as(&id_path, cfg.id, env.incarnation()).map_err(|e| e.to_string())?;
    if !cfg.form_group {
        tracing::info!(
            "raft: new storage (incarnation {:016x}); this member takes no part in any vote until a group admits it (RAFT.ADD, or RAFT.READMIT if it was a member before)",
            ident.incarnation
        );
    }
    Ok(ident)
}

/// `raft/id` present, `raft/log` gone: refused unless `--rejoin-empty`, which sets the
/// WAL aside and gives the storage a new incarnation (its votes are lost with the log).
fn rejoin_identity(
    data_dir: &Path,
    cfg: &RaftNodeConfig,
    old: &Identity,
    env: &dyn PrepareEnv,
) -> Result<Identity, String> {
    let dir = data_dir.join("raft");
    let (id_path, log_path) = (dir.join(ID_FILE), dir.join("log"));
    if !cfg.rejoin_empty {
        return Err(format!(
            "{} is missing, but {} says this data dir is node {} of a group: its log and the votes it cast are lost. Refusing to start: a node never continues a history it did not come from. To bring it back: start this node with --rejoin-empty (its WAL is set aside; it waits as a non-voter), then on the leader `RAFT.READMIT {}`",
            log_path.display(),
            id_path.display(),
            cfg.id,
            cfg.id
        ));
    }
    let wal = data_dir.join("wal");
    if wal.exists() {
        let aside = data_dir.join(format!("wal.before-rejoin-{}", env.now_ms()));
        std::fs::rename(&wal, &aside)
            .map_err(|e| format!("--rejoin-empty: moving {} aside: {e}", wal.display()))?;
        env.notice(&format!(
            "--rejoin-empty: the old WAL is kept in {}",
            aside.display()
        ));
    }
    let ident =
        Identity::create_as(&id_path, cfg.id, env.incarnation()).map_err(|e| e.to_string())?;
    if let Some(g) = old.group() {
        ident.adopt_group(g).map_err(|e| e.to_string())?;
    }
    Ok(ident)
}

/// Whether the membership in `m` lists `me` as a voter under `incarnation`.
fn admitted(m: &openraft::RaftMetrics<NodeId, NodeInfo>, me: NodeId, incarnation: u64) -> bool {
    let ms = m.membership_config.membership();
    ms.voter_ids().any(|v| v == me)
        && ms
            .get_node(&me)
            .is_some_and(|n| n.incarnation == incarnation)
}

/// Why forming the group failed for good.
#[derive(Debug, thiserror::Error)]
enum FormError {
    /// A listed member already belongs to a group: the group exists, and this member,
    /// started with `--raft-bootstrap` on empty storage, lost its state.
    #[error("node {peer} already belongs to group {group:016x}: the group was formed before, and this member (node {me}) lost its state. --raft-bootstrap is a one-time act. To bring this member back: {READMIT_HOWTO}")]
    Formed {
        /// The peer that answered.
        peer: NodeId,
        /// Its group.
        group: u64,
        /// This member.
        me: NodeId,
    },
    /// A listed member holds Raft state of no group.
    #[error("node {0} holds Raft state but no group id: not a member to form a new group with")]
    NotEmpty(NodeId),
    /// A listed member refused the group's first membership.
    #[error("node {0} refused the new group: {1}")]
    Refused(NodeId, String),
}

/// `--raft-bootstrap`: asks every listed member who it is (waiting for those not up
/// yet), refuses if any already belongs to a group, then hands each the group id and the
/// first membership (every member a voter under the incarnation it answered) and takes
/// it itself. Exits the process on a refusal: serving on would hide it.
async fn form_group(
    raft: Raft,
    net: network::Network,
    ident: Arc<Identity>,
    peers: BTreeMap<NodeId, NodeInfo>,
) {
    match form_group_inner(&raft, &net, &ident, peers).await {
        Ok(n) => tracing::info!("raft: formed a group of {n} member(s)"),
        Err(e) => {
            tracing::error!("raft: --raft-bootstrap: {e}");
            eprintln!("stockgate: --raft-bootstrap: {e}");
            std::process::exit(1);
        }
    }
}

async fn form_group_inner(
    raft: &Raft,
    net: &network::Network,
    ident: &Identity,
    mut members: BTreeMap<NodeId, NodeInfo>,
) -> Result<usize, FormError> {
    let me = ident.node;
    let group = ident.group().unwrap_or(0);
    let others: Vec<NodeId> = members.keys().copied().filter(|i| *i != me).collect();
    for &id in &others {
        let info = members.get(&id).cloned().unwrap_or_default();
        let h = retry(&format!("asking node {id} who it is"), || {
            network::hello(net.clone(), id, &info)
        })
        .await;
        if h.group != 0 && h.group != group {
            return Err(FormError::Formed {
                peer: id,
                group: h.group,
                me,
            });
        }
        if h.group == 0 && !h.pristine {
            return Err(FormError::NotEmpty(id));
        }
        if let Some(n) = members.get_mut(&id) {
            n.incarnation = h.incarnation;
        }
    }
    if let Some(n) = members.get_mut(&me) {
        n.incarnation = ident.incarnation;
    }
    for &id in &others {
        init_peer(net, id, group, &members).await?;
    }
    // This member alone stands first: the others grant it their votes by the membership
    // just handed to them, and learn the group's log from it.
    if let Err(e) = raft.initialize(members.clone()).await {
        // Initialized by an earlier run of this bootstrap: the group exists already.
        tracing::info!("raft: group already initialized here: {e}");
    }
    // A member that restarted before the first leader reached it forgot the membership:
    // hand it again until a leader is known.
    while raft.metrics().borrow().current_leader.is_none() {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for &id in &others {
            let _ = network::init(net.clone(), id, group, &members).await;
        }
    }
    Ok(members.len())
}

/// Hands `id` the group's id and first membership, retrying while it is unreachable.
async fn init_peer(
    net: &network::Network,
    id: NodeId,
    group: u64,
    members: &BTreeMap<NodeId, NodeInfo>,
) -> Result<(), FormError> {
    let r = retry(&format!("handing node {id} the group"), || async {
        // A refusal is an answer, not a network error: it ends the retries.
        match network::init(net.clone(), id, group, members).await {
            Err(e) if e.to_string().starts_with("refused") => Ok(Err(e.to_string())),
            Err(e) => Err(e),
            Ok(()) => Ok(Ok(())),
        }
    })
    .await;
    r.map_err(|why| FormError::Refused(id, why))
}

/// Calls `f` until it succeeds, every 200 ms, saying once that it waits.
async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    let mut said = false;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if !said => {
                tracing::info!("raft: --raft-bootstrap: {what}: {e}; retrying");
                said = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The state machine over `engine` and `dur`, from where the WAL and the Raft log left
/// off (refused if the WAL is not of this log's history).
fn state_machine(
    cfg: &RaftNodeConfig,
    store: &LogStore,
    engine: &Arc<Engine>,
    dur: &Arc<WalDurability>,
    spec: &Arc<Speculation>,
    snapshots: &Arc<Snapshots>,
) -> Result<StateMachine, String> {
    let wal_last = dur.wal.last_lsn();
    let (applied, membership) = store.applied_for(wal_last).map_err(|e| {
        format!("{e}; refusing to start (a node never continues a history it did not come from)")
    })?;
    Ok(StateMachine::new(
        engine.clone(),
        dur.clone(),
        spec.clone(),
        (applied, membership),
        snapshots.clone(),
        (store.clone(), cfg.data_dir.clone()),
    ))
}

/// The member's snapshots: built and installed on blocking threads, or on the caller's
/// task for a Raft log written inline (the simulation's, whose one thread must run them
/// in an order its seed fixes).
fn snapshots(
    store: &LogStore,
    engine: &Arc<Engine>,
    dur: &Arc<WalDurability>,
    hooks: SnapshotHooks,
) -> Snapshots {
    let (dur, engine, store) = (dur.clone(), engine.clone(), store.clone());
    if store.is_inline() {
        Snapshots::new_inline(dur, engine, store, hooks)
    } else {
        Snapshots::new(dur, engine, store, hooks)
    }
}

/// openraft's settings from the member's flags.
fn openraft_config(cfg: &RaftNodeConfig) -> Result<Config, String> {
    Config {
        cluster_name: cfg.group_name.clone(),
        heartbeat_interval: cfg.heartbeat_ms,
        election_timeout_min: cfg.election_min_ms,
        election_timeout_max: cfg.election_max_ms,
        // Our own trigger (`snapshot::trigger_loop`): by records, held back by consumer groups.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: super::snapshot::log_to_keep(cfg.snapshot_records),
        // openraft cuts an append that takes longer than the heartbeat interval and
        // sends it again: the payload must stay small enough to make it under load,
        // or a follower behind by large batches never catches up.
        max_payload_entries: 16,
        ..Config::default()
    }
    .validate()
    .map_err(|e| format!("raft settings: {e}"))
}

/// What a member calls its peers with: its transport, its view of the peers' links,
/// its identity and its lease, all shared by openraft's clients and its own calls.
#[derive(Clone)]
struct Wire {
    transport: Arc<dyn Transport>,
    peers: Arc<PeerTable>,
    ident: Arc<Identity>,
    lease: Arc<Lease>,
    hold: Arc<AppendHold>,
}

/// A client of the peers' network, as openraft's own (transport, identity, lease).
fn peer_network(cfg: &RaftNodeConfig, wire: &Wire) -> network::Network {
    network::Network {
        transport: wire.transport.clone(),
        peers: wire.peers.clone(),
        ident: wire.ident.clone(),
        lease: wire.lease.clone(),
        mute_after: Duration::from_millis(cfg.election_max_ms),
        hold: wire.hold.clone(),
    }
}

/// Starts answering the peers (`--raft-listen` over TCP), with votes and elections off
/// until the membership names this storage as a voter: the switch `watch_leadership`
/// opens. Returns that switch and the listener's task.
async fn serve_peers(
    raft: &Raft,
    wire: &Wire,
    (heard, spec): (&Arc<LastAppend>, &Arc<Speculation>),
) -> Result<(Arc<AtomicBool>, JoinHandle<()>), String> {
    // Nobody votes or stands until the membership names this storage as a voter
    // (`watch_leadership` opens both): a member that lost its state must not.
    let no_votes = Arc::new(AtomicBool::new(true));
    let responder = Responder::new(
        raft.clone(),
        no_votes.clone(),
        wire.ident.clone(),
        heard.clone(),
        spec.clone(),
    );
    raft.runtime_config().elect(false);
    let serving = wire.transport.serve(Arc::new(responder)).await?;
    Ok((no_votes, serving))
}

/// Publishes `(channel, message)` on this node's pub/sub hub.
pub type Publisher = Box<dyn Fn(&[u8], &[u8]) + Send + Sync>;

/// A running group member.
pub struct RaftNode {
    /// This member's id.
    pub id: NodeId,
    /// The openraft handle: membership changes, metrics, client writes.
    pub raft: Raft,
    /// The member's engine, for the one record a leader writes of its own accord: the
    /// history id of a group that has none yet.
    engine: Arc<Engine>,
    /// The leader's speculation: assigns LSNs to the engine's records and releases replies once
    /// committed.
    pub spec: Arc<Speculation>,
    store: LogStore,
    dur: Arc<WalDurability>,
    cfg: RaftNodeConfig,
    ident: Arc<Identity>,
    metrics: watch::Receiver<openraft::RaftMetrics<NodeId, NodeInfo>>,
    /// The followers' acknowledgements of this member's appends, as a leader.
    lease: Arc<Lease>,
    epoch: Instant,
    no_votes: Arc<AtomicBool>,
    /// A majority of the voters (this member included) answered its last round of
    /// `Hello`s: it may stand for election (`reach_loop`).
    in_reach: AtomicBool,
    publish: OnceLock<Publisher>,
    last_leader: Mutex<Option<NodeId>>,
    /// Until this many milliseconds since `epoch`, writes are refused: the leader is
    /// handing over (`SENTINEL FAILOVER`) and its log must stop growing.
    handover_until_ms: Arc<AtomicU64>,
    /// A handover's hold on this member's appends, shared with its network.
    hold: Arc<AppendHold>,
    /// What carries this member's requests to its peers and theirs to it.
    transport: Arc<dyn Transport>,
    /// This member's view of its peers' links (back-off, counts).
    peers: Arc<PeerTable>,
    /// The leader whose append this member last took, and when.
    heard: Arc<LastAppend>,
    /// Every task this member spawned and still runs: [`RaftNode::stop`] ends them.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// How long a deposed member waits, its log closed, before it re-executes itself.
const REPLIES_GRACE: Duration = Duration::from_millis(100);
const READONLY: &str = "READONLY You can't write against a read only replica. (this stockgate node is not the Raft leader; ask SENTINEL get-master-addr-by-name)";
const NO_QUORUM: &str = "READONLY this stockgate node leads no majority right now (partitioned or the others are down); a new leader may exist";
const FOLLOWER_READ: &str = "READONLY this stockgate node is a follower and its state may be behind the leader's: read from the leader (ask SENTINEL get-master-addr-by-name), or send READONLY on this connection to accept possibly stale reads";
const STARTING: &str = "LOADING this stockgate node is catching up with its group";
const HANDING_OVER: &str = "READONLY this stockgate node is handing its leadership over (SENTINEL FAILOVER); ask SENTINEL get-master-addr-by-name";

/// Elections a follower started itself because its leader went silent (see
/// `RaftNode::stand_if_leader_gone`): for which leader, in what order, how many.
#[derive(Default)]
struct Prompt {
    leader: Option<NodeId>,
    /// The term this member followed `leader` in.
    term: u64,
    /// Who stands first, second, ... (asked once per silent leader).
    order: Vec<NodeId>,
    tries: u32,
    /// The turn (two heartbeats each, counted from when the leader's lease ran out) this
    /// member last stood in.
    last_slot: Option<u128>,
}

impl Prompt {
    fn reset(&mut self) {
        *self = Prompt::default();
    }
}

/// Prompt elections per silent leader; after these openraft's own timer goes on alone.
const PROMPT_TRIES: u32 = 3;

/// Whether a follower prompted to stand for its silent `leader` (followed in `term`)
/// gives way: another leader is known, or its term moved on. A term moves on a member
/// only when it grants a vote (a vote refused for its log or under the leader lease
/// changes nothing) or stands itself: a candidate it voted for may be winning, or has
/// won and its first append is still on the way. Standing then, in a higher term, would
/// unseat that leader (openraft 0.9 has no pre-vote); if that candidate loses, every
/// member that voted for it holds an uncommitted vote, and openraft's own timer stands
/// again after an election timeout, without the leader lease in front.
fn gave_way(m: &openraft::RaftMetrics<NodeId, NodeInfo>, leader: NodeId, term: u64) -> bool {
    m.current_term != term || m.current_leader.is_some_and(|l| l != leader)
}

impl RaftNode {
    /// Starts Raft on this node: the state machine over `engine` and `dur`, the peers'
    /// listener (`transport`'s: TCP in a server), the proposer and the leadership
    /// watcher. With `--raft-bootstrap` on storage holding no Raft state it forms the
    /// group ([`form_group`]).
    pub async fn start(
        cfg: RaftNodeConfig,
        prepared: Prepared,
        engine: Arc<Engine>,
        dur: Arc<WalDurability>,
        spec: Arc<Speculation>,
        hooks: SnapshotHooks,
        transport: Arc<dyn Transport>,
    ) -> Result<Arc<RaftNode>, String> {
        let store = prepared.store;
        let snapshots = Arc::new(snapshots(&store, &engine, &dur, hooks));
        let sm = state_machine(&cfg, &store, &engine, &dur, &spec, &snapshots)?;
        let config = openraft_config(&cfg)?;
        let wire = Wire {
            transport,
            peers: Arc::new(PeerTable::default()),
            ident: prepared.ident,
            lease: Arc::new(Lease::default()),
            hold: Arc::new(AppendHold::default()),
        };
        let net = peer_network(&cfg, &wire);
        let raft = Raft::new(cfg.id, Arc::new(config), net.clone(), store.clone(), sm)
            .await
            .map_err(|e| format!("raft: {e}"))?;
        let heard = Arc::new(LastAppend::default());
        let (no_votes, serving) = serve_peers(&raft, &wire, (&heard, &spec)).await?;
        let mut tasks = vec![serving];
        if prepared.forming {
            let peers = cfg.bootstrap.clone();
            let ident = wire.ident.clone();
            tasks.push(tokio::spawn(gated(form_group(
                raft.clone(),
                net,
                ident,
                peers,
            ))));
        }
        let node = Arc::new(RaftNode {
            id: cfg.id,
            metrics: raft.metrics(),
            raft: raft.clone(),
            spec: spec.clone(),
            store,
            dur,
            engine,
            cfg,
            ident: wire.ident,
            lease: wire.lease,
            epoch: Instant::now(),
            no_votes,
            in_reach: AtomicBool::new(true),
            publish: OnceLock::new(),
            last_leader: Mutex::new(None),
            handover_until_ms: Arc::new(AtomicU64::new(0)),
            hold: wire.hold,
            transport: wire.transport,
            peers: wire.peers,
            heard,
            tasks: Mutex::new(Vec::new()),
        });
        tasks.push(tokio::spawn(gated(spec.propose(raft))));
        tasks.push(tokio::spawn(gated(node.clone().watch_leadership())));
        tasks.push(tokio::spawn(gated(node.clone().reach_loop())));
        let every = node.cfg.snapshot_records;
        let trigger = super::snapshot::trigger_loop(node.raft.clone(), snapshots, every);
        tasks.push(tokio::spawn(gated(trigger)));
        node.tasks.lock().extend(tasks);
        Ok(node)
    }

    /// Keeps a task this member spawned, for [`RaftNode::stop`] (dropping those that
    /// ended, so the list stays short).
    fn keep(&self, task: JoinHandle<()>) {
        let mut tasks = self.tasks.lock();
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// Ends the member as a killed process ends: every task it spawned is aborted (the
    /// listener, the proposer, the watchers, the bootstrap, a handover) and openraft is
    /// shut down. Its files are left as they are. A server never calls it (it exits); the
    /// simulation's crash does.
    pub async fn stop(&self) {
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *self.tasks.lock());
        for t in &tasks {
            t.abort();
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::debug!("raft: shutting down: {e}");
        }
        for t in tasks {
            // An aborted task's end (cancelled) is what is expected here.
            let _ = t.await;
        }
    }

    /// Where Sentinel-style `+switch-master` messages go (the pub/sub hub).
    pub fn set_publisher(&self, f: Publisher) {
        let _ = self.publish.set(f);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Opens writes when this node leads and has applied its own term's first entry;
    /// closes them (deposing the node if it has records in flight) when it stops.
    async fn watch_leadership(self: Arc<Self>) {
        let mut rx = self.metrics.clone();
        loop {
            let m = rx.borrow_and_update().clone();
            self.lease.set_voters(self.id, authority::voters(&m));
            if self.spec.writable() && authority::must_close_writes(self.id, &m, self.spec.term()) {
                self.spec
                    .close(&format!("no longer leading term {}", self.spec.term()));
            }
            // A majority must have answered this leader in this process (a restart never
            // resumes a leadership, `LogStore::open`; this holds even if one did).
            let answered = self
                .lease
                .age_ms(m.current_term, Instant::now())
                .is_some_and(|ms| ms < self.cfg.election_min_ms);
            if authority::may_open_writes(self.id, &m, answered)
                && !self.spec.writable()
                && !self.spec.is_deposed()
            {
                let last = self.dur.wal.last_lsn();
                self.spec.open(m.current_term, last);
                tracing::info!("raft: leading term {} from LSN {last}", m.current_term);
                // Everything committed is applied: a history begun by an earlier leader
                // is known here, so the group gets one id.
                if self.engine.history().is_none() {
                    let id = self.cfg.history_id.clone();
                    self.engine
                        .begin_history(&id.unwrap_or_else(crate::engine::new_history_id));
                }
            }
            self.follow_admission(&m);
            self.announce_leader(m.current_leader, &m);
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Votes and stands for election only while the membership lists this member as a
    /// voter under this storage's incarnation: a member that lost its state (a new
    /// incarnation) waits until the group re-admits it (`RAFT.READMIT`), which adds it as
    /// a learner, lets it catch up, then makes it a voter.
    fn follow_admission(&self, m: &openraft::RaftMetrics<NodeId, NodeInfo>) {
        let admitted = admitted(m, self.id, self.ident.incarnation);
        if admitted != self.no_votes.load(Ordering::Acquire) {
            return;
        }
        self.no_votes.store(!admitted, Ordering::Release);
        self.raft
            .runtime_config()
            .elect(admitted && self.in_reach.load(Ordering::Acquire));
        if admitted {
            tracing::info!("raft: a voter of the group under this storage's incarnation; voting");
        } else {
            tracing::info!(
                "raft: not a voter under this storage's incarnation {:016x}; not voting",
                self.ident.incarnation
            );
        }
    }

    /// Stands for election only with a majority in reach: every heartbeat interval a
    /// member that does not lead asks each other voter `Hello` (on a connection kept for
    /// it), and stands only while a majority (itself included) answered. A member cut
    /// off from the others so does not raise its term again and again; once they answer
    /// again it waits [`REACH_HOLD`] more (the leader's back-off to it ends within it)
    /// before it may stand, so that it hears and follows the leader instead of deposing
    /// it with a higher term (openraft 0.9 has no pre-vote). A member that loses its
    /// leader while the others answer stands at once; one whose leader still answers
    /// does not ([`RaftNode::leader_answers`]), nor one that could not win for its
    /// shorter log ([`RaftNode::could_win`]).
    async fn reach_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.cfg.heartbeat_ms);
        let ttl = Duration::from_millis(self.cfg.election_min_ms);
        let hold = Duration::from_millis(self.cfg.election_max_ms) + network::BACKOFF_MAX;
        let mut peers: HashMap<NodeId, network::Peer> = HashMap::new();
        let long_ago = || {
            Instant::now()
                .checked_sub(hold)
                .unwrap_or_else(Instant::now)
        };
        let mut reached_since = Some(long_ago());
        let mut prompt = Prompt::default();
        loop {
            tokio::time::sleep(every).await;
            if self.metrics.borrow().state == ServerState::Leader {
                reached_since.get_or_insert_with(long_ago);
                self.give_way_if_unanswered();
                continue;
            }
            let answered = self.reach(&mut peers, ttl).await;
            let (reached, voters) = (answered.len(), self.voters().len());
            let in_reach = reached * 2 > voters;
            if !in_reach {
                reached_since = None;
            } else if reached_since.is_none() {
                reached_since = Some(Instant::now());
            }
            let due = reached_since.is_some_and(|t| t.elapsed() >= hold)
                && !self.leader_answers(&answered, &mut peers, ttl).await;
            let behind = due && !self.could_win(&answered, &mut peers).await;
            let may = due && !behind;
            if may && !self.no_votes.load(Ordering::Acquire) {
                self.stand_if_leader_gone(&answered, &mut peers, &mut prompt)
                    .await;
            }
            if self.in_reach.swap(may, Ordering::AcqRel) != may {
                let admitted = !self.no_votes.load(Ordering::Acquire);
                self.raft.runtime_config().elect(admitted && may);
                if may {
                    tracing::info!(
                        "raft: a majority in reach again; standing for election when due"
                    );
                } else if !in_reach {
                    tracing::warn!(
                        "raft: {reached} of {voters} voters in reach: not standing for election"
                    );
                } else if behind {
                    tracing::info!(
                        "raft: the voters in reach with no longer a log than this member's are no majority: not standing for election"
                    );
                }
            }
        }
    }

    /// The leader this member last followed answered its `Hello` just now and says it
    /// still leads with its writes open, in this member's term or a later one: it is alive and reachable both
    /// ways, so this member does not stand even if no append comes (it was taken out of
    /// the membership and never heard of the change, or its appends are held back): its
    /// vote requests would fail against the leader's lease anyway, and the higher term
    /// they leave behind would depose that leader as soon as it sends to this member
    /// again (`RAFT.ADD` after `RAFT.REMOVE`). openraft 0.9 has no pre-vote; this is the
    /// part of it a member can decide alone. A leader that stops answering (dead, paused,
    /// cut off), no longer leads (a new process, a wiped disk) or serves nobody (its
    /// writes closed) lifts the rule.
    async fn leader_answers(
        &self,
        answered: &BTreeSet<NodeId>,
        peers: &mut HashMap<NodeId, network::Peer>,
        ttl: Duration,
    ) -> bool {
        let Some(l) = *self.last_leader.lock() else {
            return false;
        };
        let Some(peer) = peers
            .get_mut(&l)
            .filter(|_| l != self.id && answered.contains(&l))
        else {
            return false;
        };
        let term = self.metrics.borrow().current_term;
        matches!(network::ask_leads(peer, ttl).await, Ok(Some(t)) if t >= term)
    }

    /// Whether the voters in reach that would grant this member their vote make a
    /// majority: those whose log is no longer than its own, as openraft's vote compares
    /// them (the last entry's id; asked with [`network::ask_last_log`]; one that does not
    /// say counts as one that would). A member that cannot win only raises the term
    /// when it stands, and the member that could win is then refused by its vote for
    /// itself in that term and waits out another election timeout: a member restarted
    /// on an older snapshot, standing again and again, delays the election past the
    /// group's bound (openraft 0.9 has no pre-vote; this is its log check, made by the
    /// member itself). The member with the longest log among the voters in reach is
    /// never held by this, so a majority in reach still elects one. In a joint membership
    /// the majority is one of each of its configurations.
    async fn could_win(
        &self,
        answered: &BTreeSet<NodeId>,
        peers: &mut HashMap<NodeId, network::Peer>,
    ) -> bool {
        let ttl = Duration::from_millis(self.cfg.heartbeat_ms);
        let mine = self.raft.data_metrics().borrow().last_log;
        let mut granting = BTreeSet::new();
        for &id in answered {
            let theirs = match peers.get_mut(&id).filter(|_| id != self.id) {
                Some(p) => network::ask_last_log(p, ttl).await.ok(),
                None => None,
            };
            // This member itself, and a voter that did not say, count as granting.
            if theirs.is_none_or(|l| l <= mine) {
                granting.insert(id);
            }
        }
        // In a joint membership (a change in flight) a vote needs a majority of each
        // configuration, as openraft counts it: a member the new configuration leaves
        // out cannot win without the longer log of one it keeps, and its elections would
        // only raise the term over that member's, again and again.
        let membership = self.metrics.borrow().membership_config.clone();
        let configs = membership.membership().get_joint_config();
        configs
            .iter()
            .all(|c| c.intersection(&granting).count() * 2 > c.len())
    }

    /// A leader that no majority answered for the longest election timeout (its appends
    /// held back, `Lease::muted`) closes its writes: one with records in flight is
    /// deposed and restarts, so a client waiting on it learns at once (its connection
    /// ends) instead of at its socket timeout, and retries where the group now leads.
    fn give_way_if_unanswered(&self) {
        let term = self.metrics.borrow().current_term;
        let after = Duration::from_millis(self.cfg.election_max_ms);
        if self.spec.writable() && self.lease.muted(term, Instant::now(), after) {
            self.spec.close(&format!(
                "no majority answered term {term} for {} ms",
                after.as_millis()
            ));
        }
    }

    /// A follower whose leader stopped answering stands as soon as the others may vote
    /// for it, rather than when openraft's own timer fires. openraft makes a follower wait
    /// the leader lease (`election_timeout_max`, while the others refuse votes) plus its
    /// own election timeout before it stands: 900 to 1,200 ms with the defaults. A member
    /// that neither took an append from its leader for the lease and a half heartbeat nor
    /// had a `Hello` answered by it may stand then. The followers in reach take turns two
    /// heartbeats apart, the longest log first (asked once with [`network::ask_progress`];
    /// by id among equals), so the first to stand is not refused for a shorter log and two
    /// do not split the vote. A live leader answers `Hello`, so a slow heartbeat alone
    /// never deposes it.
    async fn stand_if_leader_gone(
        &self,
        answered: &BTreeSet<NodeId>,
        peers: &mut HashMap<NodeId, network::Peer>,
        prompt: &mut Prompt,
    ) {
        let Some((leader, ago)) = self.silent_leader(answered, prompt) else {
            return;
        };
        let lease = Duration::from_millis(self.cfg.election_max_ms);
        let beat = Duration::from_millis(self.cfg.heartbeat_ms);
        let Some(late) = ago.checked_sub(lease + beat / 2) else {
            return;
        };
        if prompt.order.is_empty() {
            prompt.order = self.standing_order(answered, leader, peers).await;
        }
        let n = prompt.order.len().max(1) as u128;
        let Some(turn) = prompt.order.iter().position(|id| *id == self.id) else {
            return;
        };
        let slot = late.as_millis() / (beat * 2).as_millis().max(1);
        if slot % n != turn as u128 || prompt.last_slot == Some(slot) {
            return;
        }
        if prompt.tries >= PROMPT_TRIES {
            return;
        }
        // Asking the others' logs took a while: another member may have been elected,
        // or asked for this member's vote, meanwhile.
        let term = prompt.term;
        if gave_way(&self.metrics.borrow(), leader, term) {
            return;
        }
        prompt.tries += 1;
        prompt.last_slot = Some(slot);
        tracing::info!(
            "raft: leader {leader} silent for {} ms and not answering; standing for election",
            ago.as_millis()
        );
        let raft = self.raft.clone();
        self.keep(tokio::spawn(gated(async move {
            // No await between this look and the request to stand.
            if gave_way(&raft.metrics().borrow(), leader, term) {
                return;
            }
            if let Err(e) = raft.trigger().elect().await {
                tracing::warn!("raft: standing for election: {e}");
            }
        })));
    }

    /// The leader this follower last followed, if it neither answered `Hello` nor sent an
    /// append since, and for how long it has sent none; resets `prompt` when a leader is
    /// back, another leads, or this member's term moved on ([`gave_way`]).
    fn silent_leader(
        &self,
        answered: &BTreeSet<NodeId>,
        prompt: &mut Prompt,
    ) -> Option<(NodeId, Duration)> {
        let m = self.metrics.borrow().clone();
        if let Some(l) = m.current_leader.filter(|l| *l != self.id) {
            if prompt.leader != Some(l) {
                prompt.reset();
                prompt.leader = Some(l);
            }
            prompt.term = m.current_term;
        }
        let leader = prompt.leader?;
        if answered.contains(&leader)
            || m.state == ServerState::Leader
            || gave_way(&m, leader, prompt.term)
        {
            prompt.reset();
            return None;
        }
        self.heard.heard_from(leader).map(|ago| (leader, ago))
    }

    /// The followers in reach, the one with the longest log first, then by id (a member
    /// that does not answer [`network::ask_progress`] counts as having no log).
    async fn standing_order(
        &self,
        answered: &BTreeSet<NodeId>,
        leader: NodeId,
        peers: &mut HashMap<NodeId, network::Peer>,
    ) -> Vec<NodeId> {
        let ttl = Duration::from_millis(self.cfg.heartbeat_ms);
        let mut logs: Vec<(Option<u64>, NodeId)> = Vec::new();
        for &id in answered.iter().filter(|id| **id != leader) {
            let last = if id == self.id {
                self.metrics.borrow().last_log_index
            } else {
                match peers.get_mut(&id) {
                    Some(p) => network::ask_progress(p, ttl).await.ok().flatten(),
                    None => None,
                }
            };
            logs.push((last, id));
        }
        logs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        logs.into_iter().map(|(_, id)| id).collect()
    }

    /// One round of `Hello`s to the other voters, at once: the voters that answered
    /// (this member counting).
    async fn reach(
        &self,
        peers: &mut HashMap<NodeId, network::Peer>,
        ttl: Duration,
    ) -> BTreeSet<NodeId> {
        let voters = self.voters();
        let mut reached = BTreeSet::new();
        if voters.contains(&self.id) {
            reached.insert(self.id);
        }
        let mut calls = tokio::task::JoinSet::new();
        for (id, n) in self.nodes() {
            if id == self.id || !voters.contains(&id) {
                continue;
            }
            let mut peer = match peers.remove(&id) {
                Some(p) => p,
                None => network::hello_client(self.net(), id, &n).await,
            };
            calls.spawn(gated(async move {
                let ok = network::say_hello(&mut peer, id, ttl).await.is_ok();
                (id, peer, ok)
            }));
        }
        while let Some(done) = calls.join_next().await {
            if let Ok((id, peer, ok)) = done {
                if ok {
                    reached.insert(id);
                }
                peers.insert(id, peer);
            }
        }
        reached
    }

    fn announce_leader(&self, leader: Option<NodeId>, m: &openraft::RaftMetrics<NodeId, NodeInfo>) {
        let mut last = self.last_leader.lock();
        if leader.is_none() || *last == leader {
            return;
        }
        let addr = |id: Option<NodeId>| {
            id.and_then(|i| m.membership_config.membership().get_node(&i).cloned())
                .map(|n| split_addr(&n.client_addr))
                .unwrap_or_else(|| ("0.0.0.0".into(), 0))
        };
        let (oh, op) = addr(*last);
        let (nh, np) = addr(leader);
        *last = leader;
        if let Some(p) = self.publish.get() {
            let name = &self.cfg.group_name;
            // What Sentinel publishes around a failover, in its order: clients listen to
            // different ones (node-redis's pattern subscriptions see `+sdown`/`+odown`,
            // redis-py and ioredis `+switch-master`).
            if op != 0 {
                p(b"+sdown", format!("master {name} {oh} {op}").as_bytes());
                p(
                    b"+odown",
                    format!("master {name} {oh} {op} #quorum 2/2").as_bytes(),
                );
            }
            p(
                b"+switch-master",
                format!("{name} {oh} {op} {nh} {np}").as_bytes(),
            );
        }
    }

    /// Heard from a majority within the election timeout (a newer leader can only exist
    /// after that long without this one's heartbeats); `authority` has the rule.
    fn lease_held(&self) -> bool {
        let term = self.metrics.borrow().current_term;
        // The voters the lease counts with, not a set built from the metrics: this runs
        // on every request.
        let (age, voters) = self.lease.standing(term, Instant::now());
        authority::lease_held(age, self.cfg.election_min_ms, voters)
    }

    /// Leads in Raft's view and holds the lease: the one predicate behind the write and
    /// read gates and every discovery answer naming this member.
    fn acts_as_leader(&self) -> bool {
        // The lease first: both read the metrics, never nested.
        let lease = self.lease_held();
        authority::acts_as_leader(self.id, &self.metrics.borrow(), lease)
    }

    fn voters(&self) -> BTreeSet<NodeId> {
        self.metrics
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    fn nodes(&self) -> Vec<(NodeId, NodeInfo)> {
        self.metrics
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(i, n)| (*i, n.clone()))
            .collect()
    }

    /// The leader discovery names: never this member without the lease.
    fn leader(&self) -> Option<(NodeId, NodeInfo)> {
        let lease = self.lease_held();
        let m = self.metrics.borrow();
        let id = authority::advertised_leader(self.id, &m, lease)?;
        // A follower that has not heard its leader for the longest election timeout no
        // longer names it: the leader may be gone, and a member with no majority in reach
        // does not stand, so Raft would go on naming it.
        let window = Duration::from_millis(self.cfg.election_max_ms);
        if id != self.id && self.heard.heard_from(id).is_none_or(|ago| ago > window) {
            return None;
        }
        let n = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, n))
    }

    fn refusal(&self) -> Option<&'static str> {
        if self.spec.is_deposed() {
            return Some(READONLY);
        }
        // No clock read unless a handover was ever started (this runs on every write).
        let handover = self.handover_until_ms.load(Ordering::Acquire);
        if handover != 0 && self.now_ms() < handover {
            return Some(HANDING_OVER);
        }
        if !self.spec.writable() {
            let m = self.metrics.borrow();
            return Some(if m.state == ServerState::Leader {
                STARTING
            } else {
                READONLY
            });
        }
        (!self.acts_as_leader()).then_some(NO_QUORUM)
    }

    /// The re-execution a deposed node does (same PID, same arguments, the port it
    /// serves on now).
    pub fn restart_hook(
        argv: Vec<OsString>,
        port: u16,
        dur: Arc<WalDurability>,
    ) -> super::speculation::DeposeHook {
        Box::new(move |_why| {
            let (argv, dur) = (argv.clone(), dur.clone());
            // Not on the caller's thread: it may hold the engine's locks.
            let _ = std::thread::Builder::new()
                .name("stockgate-restart".into())
                .spawn(move || {
                    let _ = dur.wal.flush_and_close();
                    // The replies that were waiting are answered -READONLY by their
                    // connections (woken by the depose): let them go out before the
                    // re-execution closes every socket.
                    std::thread::sleep(REPLIES_GRACE);
                    restart(&argv, port)
                });
        })
    }

    /// INFO's `# Replication` facts.
    fn info_data(&self) -> ReplicationInfo {
        let m = self.metrics.borrow().clone();
        let snap = self.store.snapshot();
        // The leader discovery names (none a follower has stopped hearing).
        let leader = self.leader();
        ReplicationInfo {
            master: self.spec.writable() && self.acts_as_leader(),
            node_id: self.id,
            state: format!("{:?}", m.state).to_ascii_lowercase(),
            term: m.current_term,
            leader_id: leader.as_ref().map(|(l, _)| *l),
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied_index: m.last_applied.map_or(0, |l| l.index),
            log_entries: self.store.entry_count(),
            voters: self.voters().len(),
            lease_held: self.spec.writable() && self.lease_held(),
            in_flight_records: self.spec.in_flight(),
            committed_lsn: self.spec.committed_lsn(),
            snapshot_index: snap
                .as_ref()
                .and_then(|s| s.meta.last_log_id)
                .map_or(0, |l| l.index),
            snapshot_lsn: snap.as_ref().map_or(0, |s| s.lsn),
            group: self.cfg.group_name.clone(),
            followers_caught_up: followers_caught_up(&m, self.id),
            group_id: self.ident.group(),
            incarnation: self.ident.incarnation,
            // Whether this storage is the one the group admitted as a voter: false on a
            // member that lost its state and waits to be re-admitted (RAFT.READMIT).
            voting: admitted(&m, self.id, self.ident.incarnation),
            leader_addr: leader.as_ref().map(|(_, n)| n.client_addr.clone()),
            peers: self.peer_links(),
            // Only a leader knows the followers' positions and the group's commit point.
            progress: (m.state == ServerState::Leader).then(|| self.leader_progress(&m)),
            link: self.link(leader),
        }
    }

    /// The links to the other members.
    fn peer_links(&self) -> Vec<PeerLink> {
        self.nodes()
            .into_iter()
            .filter(|(i, _)| *i != self.id)
            .map(|(id, _)| {
                let (up, connects, refused) = self.peers.peer_stats(id);
                PeerLink {
                    id,
                    up,
                    connects,
                    refused,
                }
            })
            .collect()
    }

    /// On a leader: the group's commit point and the followers' positions.
    fn leader_progress(&self, m: &openraft::RaftMetrics<NodeId, NodeInfo>) -> LeaderProgress {
        let last = m.last_log_index.unwrap_or(0);
        let matched = |id: NodeId| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .map_or(0, |l| l.index)
        };
        let voters = self.voters();
        let commit_index =
            quorum_index(
                voters
                    .iter()
                    .map(|&v| if v == self.id { last } else { matched(v) }),
            );
        let followers = self
            .nodes()
            .into_iter()
            .filter(|(i, _)| *i != self.id)
            .map(|(id, n)| {
                let at = matched(id);
                FollowerProgress {
                    id,
                    addr: n.client_addr,
                    voter: voters.contains(&id),
                    matched: at,
                    lag: last.saturating_sub(at),
                }
            })
            .collect();
        LeaderProgress {
            commit_index,
            // The lease's own count (dated by the sends acknowledged), which the gates
            // use, rather than openraft's report.
            millis_since_quorum_ack: self.lease.age_ms(m.current_term, Instant::now()),
            followers,
        }
    }

    /// Redis's view of this member: the master it follows, or its replicas.
    fn link(&self, leader: Option<(NodeId, NodeInfo)>) -> ReplicationLink {
        match leader {
            Some((id, n)) if id != self.id => ReplicationLink::Following {
                leader: split_addr(&n.client_addr),
                offset: self.dur.wal.last_lsn(),
            },
            // No leader to name (this member included): a replica whose link is down.
            None => ReplicationLink::NoLeader {
                offset: self.dur.wal.last_lsn(),
            },
            Some(_) => ReplicationLink::Leading {
                replicas: self
                    .nodes()
                    .into_iter()
                    .filter(|(i, _)| *i != self.id)
                    .map(|(_, n)| split_addr(&n.client_addr))
                    .collect(),
            },
        }
    }

    /// `SENTINEL ...`: the discovery commands Sentinel-aware clients send, answered from
    /// the Raft leadership (the members are the "sentinels").
    fn sentinel_answer(&self, query: SentinelQuery<'_>) -> Result<SentinelAnswer, SentinelError> {
        let name_ok = |n: &[u8]| n == self.cfg.group_name.as_bytes();
        let check = |n: &[u8]| {
            if name_ok(n) {
                Ok(())
            } else {
                Err(SentinelError::NoSuchMaster)
            }
        };
        Ok(match query {
            SentinelQuery::MasterAddr(name) => SentinelAnswer::MasterAddr(
                self.leader()
                    .filter(|_| name_ok(name))
                    .map(|(_, n)| split_addr(&n.client_addr)),
            ),
            SentinelQuery::Masters => SentinelAnswer::Masters(self.master_entry()),
            SentinelQuery::Master(name) => match self.master_entry() {
                Some(e) if name_ok(name) => SentinelAnswer::Master(e),
                _ => return Err(SentinelError::NoSuchMaster),
            },
            SentinelQuery::Replicas(name) => {
                check(name)?;
                let leader = self.leader().map(|(i, _)| i);
                let lh = self.leader().map(|(_, n)| split_addr(&n.client_addr));
                SentinelAnswer::Replicas(
                    self.nodes()
                        .into_iter()
                        .filter(|(i, _)| Some(*i) != leader)
                        .map(|(i, n)| {
                            let (host, port) = split_addr(&n.client_addr);
                            SentinelReplica {
                                id: i,
                                host,
                                port,
                                leader: lh.clone(),
                            }
                        })
                        .collect(),
                )
            }
            SentinelQuery::Sentinels(name) => {
                check(name)?;
                SentinelAnswer::Sentinels(
                    self.nodes()
                        .into_iter()
                        .filter(|(i, _)| *i != self.id)
                        .map(|(i, n)| {
                            let (host, port) = split_addr(&n.client_addr);
                            SentinelPeer { id: i, host, port }
                        })
                        .collect(),
                )
            }
            SentinelQuery::Failover(name) => {
                check(name)?;
                self.switchover()?;
                SentinelAnswer::FailoverStarted
            }
            SentinelQuery::MyId => SentinelAnswer::MyId(self.id),
            SentinelQuery::CkQuorum => SentinelAnswer::Quorum(self.leader().is_some()),
        })
    }

    /// `SENTINEL FAILOVER NAME`: moves leadership without a fault. A follower stands for
    /// election at once (a candidate whose log is behind the leader's is refused, and the
    /// group then elects as after any lost heartbeat); the leader hands over
    /// ([`Handover`]: openraft 0.9 has no leader transfer of its own). The reply comes
    /// once that is started, not won.
    fn switchover(&self) -> Result<(), SentinelError> {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Err(SentinelError::NoRuntime);
        };
        let m = self.metrics.borrow().clone();
        let voters = self.voters();
        if m.state != ServerState::Leader {
            // A learner cannot stand, nor a member the group has not admitted under this
            // storage's incarnation.
            if !voters.contains(&self.id) || self.no_votes.load(Ordering::Acquire) {
                return Err(SentinelError::NoGoodReplica);
            }
            let raft = self.raft.clone();
            self.keep(rt.spawn(gated(async move {
                if let Err(e) = raft.trigger().elect().await {
                    tracing::warn!("raft: SENTINEL FAILOVER: election not started: {e}");
                }
            })));
            return Ok(());
        }
        // One at a time: a second would hold and release the first one's appends.
        let until = self.handover_until_ms.load(Ordering::Acquire);
        if until != 0 && self.now_ms() < until {
            return Err(SentinelError::InProgress);
        }
        // No majority has answered lately: nobody could win an election now.
        if !self.lease_held() {
            return Err(SentinelError::NoGoodReplica);
        }
        let targets = handover_targets(&m, self.id, &voters);
        if targets.is_empty() {
            return Err(SentinelError::NoGoodReplica);
        }
        let (max, beat) = (self.cfg.election_max_ms, self.cfg.heartbeat_ms);
        let handover = Handover {
            raft: self.raft.clone(),
            spec: self.spec.clone(),
            net: self.net(),
            id: self.id,
            term: m.current_term,
            epoch: self.epoch,
            until: self.handover_until_ms.clone(),
            lease: self.lease.clone(),
            hold: self.hold.clone(),
            vote_lease: Duration::from_millis(max),
            beat: Duration::from_millis(beat),
            // To catch up (a target that never does gives the writes back after it), to
            // wait out the leader lease the votes need, and to elect.
            window_ms: max * 3 + beat,
        };
        self.keep(rt.spawn(gated(handover.run(targets))));
        Ok(())
    }

    fn master_entry(&self) -> Option<SentinelMaster> {
        let (id, n) = self.leader()?;
        let (host, port) = split_addr(&n.client_addr);
        let m = self.metrics.borrow().clone();
        let others = self.nodes().len().saturating_sub(1);
        // A follower looks before it names the leader, as a Sentinel pings its master: a
        // leader whose client port refuses (killed, not yet replaced) is `s_down`, so a
        // client does not wait on a connection to it (node-redis does, forever).
        let down = id != self.id && !self.transport.client_port_answers(&n.client_addr);
        Some(SentinelMaster {
            name: self.cfg.group_name.clone(),
            host,
            port,
            id,
            down,
            down_after_ms: self.cfg.election_min_ms,
            config_epoch: m.current_term,
            others,
            quorum: self.voters().len() / 2 + 1,
            failover_timeout_ms: self.cfg.election_max_ms,
        })
    }

    /// `RAFT.MEMBERS`: every member, its addresses and part.
    fn member_rows(&self) -> Vec<RaftMember> {
        let voters = self.voters();
        let leader = self.leader().map(|(i, _)| i);
        self.nodes()
            .into_iter()
            .map(|(i, n)| RaftMember {
                id: i,
                role: if Some(i) == leader {
                    MemberRole::Leader
                } else if voters.contains(&i) {
                    MemberRole::Voter
                } else {
                    MemberRole::Learner
                },
                client_addr: n.client_addr,
                raft_addr: n.raft_addr,
                incarnation: n.incarnation,
            })
            .collect()
    }

    /// `RAFT.ADD`, `RAFT.REMOVE`, `RAFT.READMIT`: membership changes.
    fn raft_command(&self, change: RaftChange) -> Result<RaftChangeFuture, RaftError> {
        match change {
            RaftChange::Add {
                id,
                client_addr,
                raft_addr,
            } => self.add_member(&format!("{id}={client_addr}/{raft_addr}")),
            RaftChange::Readmit(id) => self.readmit(id),
            RaftChange::Remove(id) => self.remove_voter(id),
        }
    }

    /// `RAFT.REMOVE id`: takes a voter out of the membership.
    fn remove_voter(&self, id: NodeId) -> Result<RaftChangeFuture, RaftError> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(RaftError::NotVoter(id));
        }
        if voters.is_empty() {
            return Err(RaftError::LastVoter);
        }
        let raft = self.raft.clone();
        Ok(Box::pin(async move {
            raft.change_membership(voters, false)
                .await
                .map(|_| ())
                .map_err(|e| RaftError::Remove {
                    id,
                    why: change_failed(&e),
                })
        }))
    }
}

impl RaftNode {
    /// A client of the peers' network, as openraft's own (transport, identity, lease).
    fn net(&self) -> network::Network {
        let wire = Wire {
            transport: self.transport.clone(),
            peers: self.peers.clone(),
            ident: self.ident.clone(),
            lease: self.lease.clone(),
            hold: self.hold.clone(),
        };
        peer_network(&self.cfg, &wire)
    }

    /// `RAFT.ADD id client-addr raft-addr` (`spec` is `ID=CLIENT/RAFT`): asks the member
    /// for its storage's incarnation, adds it as a learner under it, then makes it a
    /// voter once caught up.
    fn add_member(&self, spec: &str) -> Result<RaftChangeFuture, RaftError> {
        let raft = self.raft.clone();
        let (id, info) = super::parse_peer(spec).map_err(RaftError::BadPeer)?;
        let known = self
            .nodes()
            .into_iter()
            .find(|(i, _)| *i == id)
            .map(|(_, n)| n.incarnation);
        let (net, group) = (self.net(), self.ident.group());
        Ok(Box::pin(async move {
            let info = ask_incarnation(net, group, id, info).await?;
            // The same storage again (a RAFT.ADD cut short, retried) goes on; a
            // new one under a member's id is a re-admission, never implied.
            if known.is_some_and(|k| k != info.incarnation) {
                return Err(RaftError::OtherIncarnation(id));
            }
            add_voter(&raft, id, info).await
        }))
    }

    /// `RAFT.READMIT id`: brings back a member that lost its state (it runs on new
    /// storage, under a new incarnation, and takes no part meanwhile). Asks it for its
    /// incarnation, takes it out of the membership (so its old entry stops counting
    /// toward any majority), adds it as a learner under the new incarnation, waits until
    /// it has caught up, and makes it a voter again.
    fn readmit(&self, id: NodeId) -> Result<RaftChangeFuture, RaftError> {
        let Some((_, known)) = self.nodes().into_iter().find(|(i, _)| *i == id) else {
            return Err(RaftError::UnknownMember(id));
        };
        if id == self.id {
            return Err(RaftError::ReadmitSelf);
        }
        let (net, group, raft) = (self.net(), self.ident.group(), self.raft.clone());
        Ok(Box::pin(async move {
            let fresh = ask_incarnation(net, group, id, known.clone()).await?;
            if fresh.incarnation == known.incarnation {
                return Err(RaftError::SameIncarnation {
                    id,
                    incarnation: known.incarnation,
                });
            }
            remove_node(&raft, id).await?;
            add_voter(&raft, id, fresh).await
        }))
    }
}

/// Asks the member at `info` for its incarnation (RAFT.ADD, RAFT.READMIT name a member
/// by the storage it runs on), refusing one of another group.
async fn ask_incarnation(
    net: network::Network,
    group: Option<u64>,
    id: NodeId,
    info: NodeInfo,
) -> Result<NodeInfo, RaftError> {
    let h = network::hello(net, id, &info)
        .await
        .map_err(|e| RaftError::Unreachable {
            id,
            addr: info.raft_addr.clone(),
            why: e.to_string(),
        })?;
    if h.group != 0 && Some(h.group) != group {
        return Err(RaftError::OtherGroup { id, group: h.group });
    }
    Ok(NodeInfo {
        incarnation: h.incarnation,
        ..info
    })
}

/// Takes `id` out of the membership altogether, voter or learner.
async fn remove_node(raft: &Raft, id: NodeId) -> Result<(), RaftError> {
    let mut voters = voter_ids(raft);
    let r = if voters.remove(&id) {
        if voters.is_empty() {
            return Err(RaftError::LastVoter);
        }
        raft.change_membership(voters, false).await
    } else {
        let gone = BTreeSet::from([id]);
        raft.change_membership(openraft::ChangeMembers::RemoveNodes(gone), false)
            .await
    };
    r.map(|_| ()).map_err(|e| RaftError::Remove {
        id,
        why: change_failed(&e),
    })
}

/// Adds `id` as a learner, waits for it to catch up from the log, then makes it a voter
/// by joint consensus.
async fn add_voter(raft: &Raft, id: NodeId, info: NodeInfo) -> Result<(), RaftError> {
    if let Err(e) = raft.add_learner(id, info, true).await {
        return Err(RaftError::AddLearner {
            id,
            why: change_failed(&e),
        });
    }
    let mut voters = voter_ids(raft);
    voters.insert(id);
    raft.change_membership(voters, false)
        .await
        .map(|_| ())
        .map_err(|e| RaftError::Promote {
            id,
            why: change_failed(&e),
        })
}

/// What a membership change of openraft's fails with.
type ChangeError = openraft::error::RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>;

/// Why a membership change failed, in an operator's words: the leadership moving away
/// in the middle of it is the usual case, and openraft's own text for it is a debug
/// dump of the new leader's record.
fn change_failed(e: &ChangeError) -> String {
    match e {
        openraft::error::RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            match (&f.leader_id, &f.leader_node) {
                (Some(id), Some(n)) => format!(
                    "this member no longer leads the group: send the command to the leader, node {id} at {}",
                    n.client_addr
                ),
                _ => "this member no longer leads the group and no leader is known yet: send the command to the leader once one is named (SENTINEL get-master-addr-by-name)".into(),
            }
        }
        openraft::error::RaftError::Fatal(_) => {
            "this member's Raft core stopped (the process is restarting): send the command to the leader".into()
        }
        other => other.to_string(),
    }
}

/// The group's voters as the Raft metrics show them now.
fn voter_ids(raft: &Raft) -> BTreeSet<NodeId> {
    authority::voters(&raft.metrics().borrow())
}

/// The voters a leader may hand over to: every other voter, the one holding most of
/// the log first.
fn handover_targets(
    m: &openraft::RaftMetrics<NodeId, NodeInfo>,
    me: NodeId,
    voters: &BTreeSet<NodeId>,
) -> Vec<super::handover::Target> {
    let mut targets: Vec<super::handover::Target> = m
        .replication
        .iter()
        .flatten()
        .filter(|(id, _)| **id != me && voters.contains(*id))
        .filter_map(|(id, matched)| {
            let info = m.membership_config.membership().get_node(id)?.clone();
            Some((matched.map_or(0, |l| l.index), *id, info))
        })
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.0));
    targets
}

fn split_addr(a: &str) -> (String, u16) {
    match a.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(['[', ']']).to_owned(),
            p.parse().unwrap_or(0),
        ),
        None => (a.to_owned(), 0),
    }
}

/// Re-executes this binary with its own arguments (same PID) on the same port.
fn restart(argv: &[OsString], port: u16) -> ! {
    use std::os::unix::process::CommandExt as _;
    let mut args: Vec<OsString> = Vec::new();
    let mut skip = false;
    for a in argv.iter().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if a == "--port" {
            skip = true;
            continue;
        }
        if a.to_string_lossy().starts_with("--port=") {
            continue;
        }
        args.push(a.clone());
    }
    args.push("--port".into());
    args.push(port.to_string().into());
    let err = std::process::Command::new("/proc/self/exe")
        .args(&args)
        .exec();
    eprintln!("stockgate: restart after losing the leadership failed: {err}");
    std::process::exit(1)
}

/// The durability of a group member's replies: committed by the group (see
/// `Speculation::wait`).
pub struct RaftDurability {
    /// The member's own WAL, which applied batches are logged to.
    pub local: Arc<WalDurability>,
    /// The group's commit point, which replies wait on.
    pub spec: Arc<Speculation>,
}

impl Durability for RaftDurability {
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), NotDurable>> + Send + '_>> {
        Box::pin(self.spec.wait(lsn))
    }

    fn save(&self, _engine: &Engine) -> Result<(), String> {
        Err("SAVE is not available on a Raft group member: it snapshots on its own every --snapshot-records records, at a point every member agrees on".into())
    }

    fn backup(
        &self,
        _target: &std::path::Path,
    ) -> Result<crate::wal::BackupWritten, crate::wal::BackupError> {
        // A copy of a member's log restored elsewhere would carry the member's Raft vote
        // and term and could rejoin the group with an old vote; a lost member rejoins empty
        // instead (docs/operations.md, section 5).
        Err(crate::wal::BackupError::Unsupported(
            "BACKUP is not available on a Raft group member: a restored copy would carry this member's Raft log and vote; a lost member rejoins empty and takes a snapshot from the leader, and a group lost entirely is rebuilt from the ledger",
        ))
    }

    fn info(&self) -> String {
        self.local.info()
    }

    fn failure(&self) -> Option<String> {
        self.local.failure()
    }
}

impl Replication for RaftNode {
    fn write_refusal(&self) -> Option<&'static str> {
        self.refusal()
    }

    fn other_leader_addr(&self) -> Option<String> {
        let (id, n) = self.leader()?;
        (id != self.id).then_some(n.client_addr)
    }

    /// A follower's committed state may be behind the leader's by what is in flight, so
    /// it serves stock reads only to a connection that accepted that (`READONLY`); a
    /// leader's state is the newest only while it holds its lease (a newer leader may
    /// have moved past it) and once it has applied its predecessor's entries; a deposed
    /// leader's state holds records that were never committed and serves nobody.
    /// docs/replication.md, "Who takes writes, who answers reads".
    fn read_refusal(&self, stale_ok: bool) -> Option<&'static str> {
        if self.spec.is_deposed() {
            return Some(READONLY);
        }
        let leads = self.spec.writable() || self.metrics.borrow().state == ServerState::Leader;
        if !leads {
            return (!stale_ok).then_some(FOLLOWER_READ);
        }
        if !self.acts_as_leader() {
            Some(NO_QUORUM)
        } else if !self.spec.writable() && !stale_ok {
            Some(STARTING)
        } else {
            None
        }
    }

    fn is_replica(&self) -> bool {
        !self.spec.writable()
    }

    fn info(&self) -> ReplicationInfo {
        self.info_data()
    }

    fn role(&self) -> RoleView {
        let offset = self.dur.wal.last_lsn() as i64;
        match self.leader() {
            Some((id, n)) if id != self.id || !self.spec.writable() => RoleView::Follower {
                leader: Some(split_addr(&n.client_addr)),
                connected: id != self.id,
                offset,
            },
            None => RoleView::Follower {
                leader: None,
                connected: false,
                offset,
            },
            Some(_) => RoleView::Leader {
                offset,
                replicas: self
                    .nodes()
                    .into_iter()
                    .filter(|(i, _)| *i != self.id)
                    .map(|(_, n)| split_addr(&n.client_addr))
                    .collect(),
            },
        }
    }

    fn wait_count(
        &self,
        lsn: Lsn,
        _n: usize,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = usize> + Send + '_>> {
        Box::pin(async move {
            // A committed write is on a majority: the leader and at least this many others.
            let others = self.voters().len() / 2;
            match tokio::time::timeout(timeout, self.spec.wait(lsn)).await {
                Ok(Ok(())) => others,
                _ => 0,
            }
        })
    }

    fn sentinel(&self, query: SentinelQuery<'_>) -> Result<SentinelAnswer, SentinelError> {
        self.sentinel_answer(query)
    }

    fn members(&self) -> Option<Vec<RaftMember>> {
        Some(self.member_rows())
    }

    fn raft_change(&self, change: RaftChange) -> Result<RaftChangeFuture, RaftError> {
        self.raft_command(change)
    }
}

/// How far behind the leader's last log index a follower may be and still count as
/// replicating (`raft_followers_caught_up`): a few batches of group commit.
pub const CAUGHT_UP_ENTRIES: u64 = 1000;

/// The highest log index a majority of the voters have (their matched indexes given, the
/// leader's own as its last): the group's commit point as the leader sees it.
fn quorum_index(matched: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = matched.collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// On a leader, the voters other than itself whose matched log index is within
/// [`CAUGHT_UP_ENTRIES`] of its last one; 0 on any other member (only a leader knows).
fn followers_caught_up(m: &openraft::RaftMetrics<NodeId, NodeInfo>, me: NodeId) -> usize {
    if m.state != ServerState::Leader {
        return 0;
    }
    let last = m.last_log_index.unwrap_or(0);
    let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
    m.replication.as_ref().map_or(0, |r| {
        r.iter()
            .filter(|(id, matched)| {
                **id != me
                    && voters.contains(id)
                    && matched.is_some_and(|l| l.index + CAUGHT_UP_ENTRIES >= last)
            })
            .count()
    })
}

#[cfg(test)]
mod quorum_tests {
    use super::quorum_index;

    #[test]
    fn the_commit_point_is_what_a_majority_of_voters_have() {
        assert_eq!(quorum_index([10, 5, 9].into_iter()), 9);
        assert_eq!(quorum_index([10, 3, 9, 5].into_iter()), 5);
        assert_eq!(quorum_index([7].into_iter()), 7);
        assert_eq!(quorum_index(std::iter::empty()), 0);
    }

    #[test]
    fn a_change_cut_short_by_a_new_leader_names_it_in_plain_words() {
        use super::{change_failed, ChangeError, ClientWriteError, NodeId, NodeInfo};
        use openraft::error::{ForwardToLeader, RaftError};
        let forward = |leader: Option<(NodeId, &str)>| -> ChangeError {
            RaftError::APIError(ClientWriteError::ForwardToLeader(ForwardToLeader {
                leader_id: leader.map(|l| l.0),
                leader_node: leader.map(|l| NodeInfo {
                    raft_addr: "10.0.0.1:7000".into(),
                    client_addr: l.1.into(),
                    incarnation: 7,
                }),
            }))
        };
        assert_eq!(
            change_failed(&forward(Some((1, "10.0.0.1:6379")))),
            "this member no longer leads the group: send the command to the leader, node 1 at 10.0.0.1:6379"
        );
        let none = change_failed(&forward(None));
        assert!(
            none.starts_with("this member no longer leads the group and no leader is known yet")
        );
        assert!(!none.contains("NodeInfo"));
    }
}
