//! What a command may see of the server: the shared server state (configuration, users,
//! statistics, durability) and the state of its own connection.
//!
//! Its own module so that both the network layer (`server`) and the commands (`cmd`)
//! depend on it, and neither on the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::engine::{Engine, Lsn};
use crate::metrics::{Metrics, Recorder};
use crate::protocol::Limits;
pub use stockgate_core::durable::NotDurable;

/// The server's settings as it started (the flags, resolved).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The address the RESP port listens on.
    pub bind: String,
    /// The RESP port; 0 picks a free one (the real one is `Shared::local_port`).
    pub port: u16,
    /// Where the log, snapshots and keys live.
    pub data_dir: String,
    /// `always`, `everysec` or `no`: when an acknowledgement waits for the disk.
    pub fsync: String,
    /// False for a server without a log (tests, benchmarks): nothing survives it.
    pub durable: bool,
    /// Whether expired holds go back to stock by themselves or wait for the sweeper.
    pub auto_release: bool,
    /// Shards of a sale created without `SHARDS`.
    pub default_shards: u16,
    /// Hold time of a sale created without `TTL`, in ms.
    pub default_ttl_ms: u64,
    /// How long a finished reservation stays answerable before its tombstone, in ms.
    pub retention_ms: u64,
    /// Frame limits: arguments per command, bytes per argument.
    pub limits: Limits,
    /// The five limits below are the values at start: the running server reads
    /// `Shared::live`, which `CONFIG SET` changes.
    pub max_clients: usize,
    /// Bytes a client may leave buffered in an unfinished command (slowloris guard).
    pub max_query_buffer: usize,
    /// Bytes of replies one batch may produce before the client is disconnected.
    pub max_output_buffer: usize,
    /// Disconnect clients silent this long; 0 = never.
    pub idle_timeout_ms: u64,
    /// Disconnect clients that do not read their replies for this long.
    pub write_timeout_ms: u64,
    /// How often expiry, auto-release and retention run.
    pub tick_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "127.0.0.1".into(),
            port: 7379,
            data_dir: "./stockgate-data".into(),
            fsync: "everysec".into(),
            durable: false,
            auto_release: false,
            default_shards: 16,
            default_ttl_ms: 630_000,
            retention_ms: 86_400_000,
            limits: Limits::default(),
            max_clients: 10_000,
            max_query_buffer: 8 * 1024 * 1024,
            max_output_buffer: 64 * 1024 * 1024,
            idle_timeout_ms: 0,
            write_timeout_ms: 30_000,
            tick_ms: 20,
        }
    }
}

/// What the server needs from the persistence layer. `NoDurability` for a memory-only
/// server; the WAL implements it in `persist`.
pub trait Durability: Send + Sync {
    /// Resolves when everything up to `lsn` is acknowledged by the log. An error means
    /// the record may not be on disk: the reply must not be sent.
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), NotDurable>> + Send + '_>>;
    /// `SAVE`: write a snapshot now.
    fn save(&self, engine: &Engine) -> Result<(), String>;
    /// `BACKUP <dir>`: write a consistent copy of the data dir as of one LSN into `target`.
    /// Without a log there is nothing to copy.
    fn backup(
        &self,
        _target: &std::path::Path,
    ) -> Result<crate::wal::BackupWritten, crate::wal::BackupError> {
        Err(crate::wal::BackupError::Unsupported(
            "this server runs without a write-ahead log (persistence is disabled): there is nothing to back up",
        ))
    }
    /// Lines for INFO's Persistence section.
    fn info(&self) -> String;
    /// Why the log can no longer make a record durable (a write or fsync failed, the
    /// disk is full, the log was closed), if it cannot.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// Durability for a server without a log: every wait succeeds at once.
pub struct NoDurability;

impl Durability for NoDurability {
    fn wait(&self, _lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), NotDurable>> + Send + '_>> {
        Box::pin(async { Ok(()) })
    }
    fn save(&self, _engine: &Engine) -> Result<(), String> {
        Err("persistence is disabled".into())
    }
    fn info(&self) -> String {
        "aof_enabled:0\r\n".into()
    }
}

/// What the commands, INFO and the network layer need of replication (`crate::raft`
/// implements it; a trait so this module does not depend on that one). A single node
/// has none (`Shared::repl` unset).
pub trait Replication: Send + Sync {
    /// The error a write gets before it runs (`READONLY ...`, `LOADING ...`), if any.
    fn write_refusal(&self) -> Option<&'static str>;
    /// The error a read of stock state gets, if any: a follower's state may be behind
    /// the leader's, so it answers only a connection that accepted that (`stale_ok`, its
    /// `READONLY`); a leader without its lease or still catching up answers nobody.
    fn read_refusal(&self, stale_ok: bool) -> Option<&'static str>;
    /// The error a read of the order feed gets, if any.
    fn feed_refusal(&self) -> Option<&'static str> {
        None
    }
    /// True where writes are refused because another node leads.
    fn is_replica(&self) -> bool;
    /// The client address (`host:port`) of the group's leader when it is another member
    /// (cluster mode sends what this member refuses there, as `-MOVED`).
    fn other_leader_addr(&self) -> Option<String> {
        None
    }
    /// The facts of INFO's `# Replication` section (`report::info` writes them out).
    fn info(&self) -> ReplicationInfo;
    /// What `ROLE` reports: this member's place in the group.
    fn role(&self) -> RoleView;
    /// `WAIT`: replicas that have `lsn` once `n` do or `timeout` passed.
    fn wait_count(
        &self,
        lsn: Lsn,
        n: usize,
        timeout: std::time::Duration,
    ) -> Pin<Box<dyn Future<Output = usize> + Send + '_>>;
    /// `SENTINEL ...`: a Raft group member answers the discovery commands (and starts a
    /// FAILOVER) from its leadership.
    fn sentinel(&self, _query: SentinelQuery<'_>) -> Result<SentinelAnswer, SentinelError> {
        Err(SentinelError::NotMember)
    }
    /// `RAFT.MEMBERS`: the group's members; unset where this server is not a member.
    fn members(&self) -> Option<Vec<RaftMember>> {
        None
    }
    /// `RAFT.ADD`, `RAFT.REMOVE`, `RAFT.READMIT`: membership changes of a Raft group
    /// member. An error refuses the change at once; otherwise the future resolves when
    /// the group has decided.
    fn raft_change(&self, _change: RaftChange) -> Result<RaftChangeFuture, RaftError> {
        Err(RaftError::NotMember)
    }
}

/// A membership change under way: resolves when the group has decided.
pub type RaftChangeFuture = Pin<Box<dyn Future<Output = Result<(), RaftError>> + Send>>;

/// A `RAFT.*` membership change, its arguments read by the command layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RaftChange {
    /// `RAFT.ADD id client-host:port raft-host:port`, each as given (not yet checked).
    Add {
        /// The node id.
        id: String,
        /// Where clients reach it.
        client_addr: String,
        /// Where the other members reach it.
        raft_addr: String,
    },
    /// `RAFT.REMOVE id`: takes a voter out.
    Remove(u64),
    /// `RAFT.READMIT id`: brings back a member that lost its state.
    Readmit(u64),
}

/// Why a `RAFT.*` membership change was refused or failed (the command layer answers it
/// as `-ERR <this>`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RaftError {
    /// This server is not a member of a Raft group.
    #[error("this server is not a member of a Raft group (--raft-id)")]
    NotMember,
    /// `RAFT.ADD`'s member is not of the `ID=CLIENT/RAFT` shape.
    #[error("{0}")]
    BadPeer(String),
    /// `RAFT.REMOVE` of a node that does not vote.
    #[error("node {0} is not a voter of this group")]
    NotVoter(u64),
    /// The change would leave the group without a voter.
    #[error("cannot remove the last voter")]
    LastVoter,
    /// `RAFT.READMIT` of a node the group does not hold.
    #[error("node {0} is not a member of this group; add it with RAFT.ADD")]
    UnknownMember(u64),
    /// `RAFT.READMIT` of this member itself.
    #[error("RAFT.READMIT: send it to the leader, about another member")]
    ReadmitSelf,
    /// The member did not answer who it is.
    #[error("asking node {id} at {addr} who it is: {why} (is it running?)")]
    Unreachable {
        /// The node id.
        id: u64,
        /// The Raft address asked.
        addr: String,
        /// What went wrong.
        why: String,
    },
    /// The member answered from another group.
    #[error("node {id} belongs to another group ({group:016x})")]
    OtherGroup {
        /// The node id.
        id: u64,
        /// The group it belongs to.
        group: u64,
    },
    /// `RAFT.ADD` of a member's id on new storage: that is a re-admission.
    #[error("node {0} is a member under another storage incarnation: it lost its state; bring it back with RAFT.READMIT {0}")]
    OtherIncarnation(u64),
    /// `RAFT.READMIT` of a member still on the storage the group admitted.
    #[error("node {id} still runs on the storage the group admitted (incarnation {incarnation:016x}): nothing to re-admit")]
    SameIncarnation {
        /// The node id.
        id: u64,
        /// The incarnation it still runs under.
        incarnation: u64,
    },
    /// The membership change that takes a node out failed.
    #[error("removing node {id}: {why}")]
    Remove {
        /// The node id.
        id: u64,
        /// What went wrong.
        why: String,
    },
    /// Adding the node as a learner failed.
    #[error("adding node {id} as a learner: {why}")]
    AddLearner {
        /// The node id.
        id: u64,
        /// What went wrong.
        why: String,
    },
    /// Making the caught-up learner a voter failed.
    #[error("making node {id} a voter: {why}")]
    Promote {
        /// The node id.
        id: u64,
        /// What went wrong.
        why: String,
    },
}

/// The facts of INFO's `# Replication` section on a Raft group member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationInfo {
    /// Takes writes and acts as leader (`role:master`), else `role:slave`.
    pub master: bool,
    /// This member's node id.
    pub node_id: u64,
    /// The Raft state, lower case (`leader`, `follower`, ...).
    pub state: String,
    /// The Raft term.
    pub term: u64,
    /// The leader discovery names, if any.
    pub leader_id: Option<u64>,
    /// The last Raft log index.
    pub last_log_index: u64,
    /// The last applied Raft log index.
    pub last_applied_index: u64,
    /// Entries in the Raft log.
    pub log_entries: usize,
    /// Voters of the group.
    pub voters: usize,
    /// Takes writes and holds the lease.
    pub lease_held: bool,
    /// Records sent to the group and not yet committed.
    pub in_flight_records: u64,
    /// The group's commit point as an LSN.
    pub committed_lsn: u64,
    /// The last snapshot's Raft log index (0: none).
    pub snapshot_index: u64,
    /// The last snapshot's LSN (0: none).
    pub snapshot_lsn: u64,
    /// The group's name.
    pub group: String,
    /// Voters caught up with the leader (0 but on a leader).
    pub followers_caught_up: usize,
    /// The group's id, once known.
    pub group_id: Option<u64>,
    /// This storage's incarnation.
    pub incarnation: u64,
    /// This storage is the one the group admitted as a voter.
    pub voting: bool,
    /// The leader's client address, if one is known.
    pub leader_addr: Option<String>,
    /// The links to the other members.
    pub peers: Vec<PeerLink>,
    /// On a leader: the group's commit point and the followers' positions.
    pub progress: Option<LeaderProgress>,
    /// Redis's view: the master this member follows, or its replicas.
    pub link: ReplicationLink,
}

/// This member's link to another member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLink {
    /// The other member's node id.
    pub id: u64,
    /// Whether its last call got through (unset: never called).
    pub up: Option<bool>,
    /// Connections made to it.
    pub connects: u64,
    /// Calls it refused.
    pub refused: u64,
}

/// What only a leader knows: the group's commit point and the followers' positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderProgress {
    /// The highest log index a majority of the voters have.
    pub commit_index: u64,
    /// Since a majority last acknowledged this leader, if it ever did this term.
    pub millis_since_quorum_ack: Option<u64>,
    /// The other members.
    pub followers: Vec<FollowerProgress>,
}

/// A follower's position as its leader knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerProgress {
    /// The node id.
    pub id: u64,
    /// Its client address.
    pub addr: String,
    /// It votes.
    pub voter: bool,
    /// The highest log index it has.
    pub matched: u64,
    /// How far behind the leader's last index.
    pub lag: u64,
}

/// The master/replica part of INFO's `# Replication`, in Redis's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationLink {
    /// Another member leads, at this client address.
    Following {
        /// The leader's client address.
        leader: HostPort,
        /// The last LSN of this member's WAL.
        offset: u64,
    },
    /// No leader is known (this member included).
    NoLeader {
        /// The last LSN of this member's WAL.
        offset: u64,
    },
    /// This member leads; the client addresses of the others.
    Leading {
        /// The other members' client addresses.
        replicas: Vec<HostPort>,
    },
}

/// A client address split for a reply: host and port.
pub type HostPort = (String, u16);

/// `ROLE`'s facts (the command layer gives them Redis's shape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleView {
    /// This member takes writes; `replicas` are the client addresses of the others.
    Leader {
        /// The last log sequence number this member has.
        offset: i64,
        /// The client addresses of the other members.
        replicas: Vec<HostPort>,
    },
    /// Another member leads (or nobody is known to: `leader` unset). `connected` is false
    /// while this member is not yet, or no longer, following a leader it knows.
    Follower {
        /// The leader's client address, if one is known.
        leader: Option<HostPort>,
        /// False while this member follows no leader it knows.
        connected: bool,
        /// The last log sequence number this member has.
        offset: i64,
    },
}

/// A member's part in its Raft group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberRole {
    /// Leads the group.
    Leader,
    /// Votes.
    Voter,
    /// Receives the log without a vote.
    Learner,
}

/// A row of `RAFT.MEMBERS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftMember {
    /// The node id.
    pub id: u64,
    /// Where clients reach it.
    pub client_addr: String,
    /// Where the other members reach it.
    pub raft_addr: String,
    /// Its part in the group.
    pub role: MemberRole,
    /// Its storage's incarnation.
    pub incarnation: u64,
}

/// A `SENTINEL` subcommand with its arguments checked for number (`name` is the master
/// name the client gave).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SentinelQuery<'a> {
    /// `GET-MASTER-ADDR-BY-NAME name` (each variant holds the name given).
    MasterAddr(&'a [u8]),
    /// `MASTERS`.
    Masters,
    /// `MASTER name`.
    Master(&'a [u8]),
    /// `REPLICAS name` / `SLAVES name`.
    Replicas(&'a [u8]),
    /// `SENTINELS name`.
    Sentinels(&'a [u8]),
    /// `FAILOVER name`: moves the leadership.
    Failover(&'a [u8]),
    /// `MYID`.
    MyId,
    /// `CKQUORUM name`.
    CkQuorum,
}

/// The group's leader as Sentinel describes a master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelMaster {
    /// The group's name (Sentinel's master name).
    pub name: String,
    /// The client host.
    pub host: String,
    /// The client port.
    pub port: u16,
    /// The leader's node id.
    pub id: u64,
    /// Its client port does not answer (Sentinel's `s_down,o_down`).
    pub down: bool,
    /// How long without a leader before an election (ms).
    pub down_after_ms: u64,
    /// The Raft term.
    pub config_epoch: u64,
    /// The other members (replicas, and the other "sentinels").
    pub others: usize,
    /// A majority of the voters.
    pub quorum: usize,
    /// The longest election timeout (ms).
    pub failover_timeout_ms: u64,
}

/// A member that does not lead, as Sentinel describes a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelReplica {
    /// The node id.
    pub id: u64,
    /// The client host.
    pub host: String,
    /// The client port.
    pub port: u16,
    /// The leader's client address, if one is known.
    pub leader: Option<HostPort>,
}

/// Another member, as Sentinel describes a fellow sentinel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelPeer {
    /// The node id.
    pub id: u64,
    /// The client host.
    pub host: String,
    /// The client port.
    pub port: u16,
}

/// What a `SENTINEL` subcommand found (or started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentinelAnswer {
    /// The leader's client address; unset when none is known or the name is not the group's.
    MasterAddr(Option<HostPort>),
    /// `MASTERS`: the leader, if one is known.
    Masters(Option<SentinelMaster>),
    /// `MASTER name`.
    Master(SentinelMaster),
    /// `REPLICAS`: the members that do not lead.
    Replicas(Vec<SentinelReplica>),
    /// `SENTINELS`: the other members.
    Sentinels(Vec<SentinelPeer>),
    /// `FAILOVER`: started (not won).
    FailoverStarted,
    /// `MYID`: this member's node id.
    MyId(u64),
    /// `CKQUORUM`: whether a leader is known.
    Quorum(bool),
}

/// Why a `SENTINEL` subcommand has no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SentinelError {
    /// This server is not a member of a Raft group.
    NotMember,
    /// The name is not the group's, or no leader is known.
    NoSuchMaster,
    /// `FAILOVER`: no caught-up voter can stand for election.
    NoGoodReplica,
    /// `FAILOVER`: no runtime to start the election on.
    NoRuntime,
    /// `FAILOVER`: this leader is handing over already.
    InProgress,
}

pub use crate::users::{
    Role, UserDb, Users, UsersSource, ADMIN, CHECKOUT, REPLICATION, SENTINEL, SWEEPER,
};

/// Server-wide counters, INFO's `# Stats` and `# Clients` figures.
#[derive(Default)]
pub struct Stats {
    /// Connections open now.
    pub connected: AtomicU64,
    /// Connections accepted since start.
    pub connections: AtomicU64,
    /// Commands run since start.
    pub commands: AtomicU64,
    /// Bytes read from and written to clients (INFO's `total_net_input_bytes` /
    /// `total_net_output_bytes`), added once per batch like `commands`.
    pub net_input_bytes: AtomicU64,
    /// Bytes written to clients (see `net_input_bytes`).
    pub net_output_bytes: AtomicU64,
    /// Connections refused at `maxclients`.
    pub rejected: AtomicU64,
    /// AUTH or HELLO AUTH with a wrong password.
    pub auth_failures: AtomicU64,
    /// Commands refused because the user's role may not run them.
    pub noperm: AtomicU64,
    /// Connections closed for bytes that are not RESP.
    pub protocol_errors: AtomicU64,
    /// Connections closed for an unfinished command over the query buffer limit.
    pub qbuf_disconnects: AtomicU64,
    /// Connections closed for unread replies over the output buffer limit.
    pub obuf_disconnects: AtomicU64,
    /// Connections closed after the idle timeout.
    pub idle_disconnects: AtomicU64,
    /// Connections accepted on the TLS port, those connected after their handshake
    /// now, and handshakes that failed or timed out (INFO's `tls_*` fields).
    pub tls_connections: AtomicU64,
    /// TLS connections open now, past their handshake.
    pub tls_connected: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: AtomicU64,
}

/// What every connection of the server shares.
pub struct Shared {
    /// The settings as started.
    pub config: ServerConfig,
    /// `None`: no users configured, every connection is admin.
    pub users: Option<UserDb>,
    /// The settings `CONFIG SET` changes while the server runs.
    pub live: crate::live::LiveSettings,
    /// The config file the server was started with (`CONFIG REWRITE` writes it).
    pub config_file: Option<std::path::PathBuf>,
    /// The binary's `serve` flags: `CONFIG SET` checks a value with its flag's parser,
    /// and tells a setting fixed at start from one that does not exist.
    pub flags: Option<clap::Command>,
    /// Server-wide counters.
    pub stats: Stats,
    /// When the server started (INFO's uptime).
    pub started: Instant,
    /// The RESP port actually bound.
    pub local_port: AtomicU16,
    /// How a reply waits for its log record to be durable.
    pub durability: Arc<dyn Durability>,
    /// The order feed (XREAD...), when the server runs with a WAL; given at construction
    /// ([`SharedParts`]). A `OnceLock` so that an embedder that builds `Shared` first
    /// (the fuzz harness) can still attach one before serving.
    pub feed: std::sync::OnceLock<Arc<crate::feed::Feed>>,
    /// Command/latency/error/sale counters, the slow log (see `metrics`).
    pub metrics: Metrics,
    /// Replication: set once, when this server's Raft member has started. It cannot be
    /// given at construction: the member needs this `Shared` to start (it publishes on
    /// `pubsub`, and its snapshots wait for `feed`'s consumer groups).
    pub repl: std::sync::OnceLock<Arc<dyn Replication>>,
    /// PUBLISH/SUBSCRIBE channels (Sentinel's hello channel).
    pub pubsub: crate::pubsub::Hub,
    /// Live connections, for CLIENT KILL.
    pub clients: crate::pubsub::Clients,
    /// TLS on the RESP port (`--tls-port`); given at construction ([`SharedParts`]).
    pub tls: std::sync::OnceLock<Arc<crate::tls::Tls>>,
    /// Cluster mode (`--cluster-enabled yes`): the slot map and this node's place in it;
    /// given at construction ([`SharedParts`]).
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// The engine the connections serve, for work that outlives a command's borrow of it
    /// (`SALE.MIGRATE` drops the sale once the destination has it); given at construction
    /// ([`SharedParts`]).
    pub engine: std::sync::OnceLock<Arc<Engine>>,
    /// The admission secret file the keys were read from, which `SECRET.RELOAD` reads
    /// again; given at construction ([`SharedParts`]).
    pub secret_file: std::sync::OnceLock<std::path::PathBuf>,
}

/// What a server started from its settings holds beside them, its users and its
/// durability: each known before the first connection and never replaced. Left out
/// (`Default`), a part is absent: a server without a log has no feed, one without
/// `--tls-port` no TLS.
#[derive(Default)]
pub struct SharedParts {
    /// The engine the connections serve ([`Shared::engine`]).
    pub engine: Option<Arc<Engine>>,
    /// The order feed ([`Shared::feed`]).
    pub feed: Option<Arc<crate::feed::Feed>>,
    /// TLS on the RESP port ([`Shared::tls`]).
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// Cluster mode's slot map ([`Shared::cluster`]).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The admission secret file ([`Shared::secret_file`]).
    pub secret_file: Option<std::path::PathBuf>,
    /// The config file `CONFIG REWRITE` writes ([`Shared::config_file`]).
    pub config_file: Option<std::path::PathBuf>,
    /// The `serve` flags `CONFIG SET` checks values with ([`Shared::flags`]).
    pub flags: Option<clap::Command>,
}

impl Shared {
    /// Users given once, not reloadable (tests, embedding).
    pub fn new(
        config: ServerConfig,
        users: Option<Users>,
        durability: Arc<dyn Durability>,
    ) -> Self {
        Shared::with_user_db(config, users.map(UserDb::fixed), durability)
    }

    /// Users `ACL LOAD` can read again (from `--users-file`).
    pub fn with_user_db(
        config: ServerConfig,
        users: Option<UserDb>,
        durability: Arc<dyn Durability>,
    ) -> Self {
        Shared::with_parts(config, users, durability, SharedParts::default())
    }

    /// A server with its parts in place from the start, as the composition root builds
    /// it: nothing that reads a part can see it missing while the server is assembled.
    pub fn with_parts(
        config: ServerConfig,
        users: Option<UserDb>,
        durability: Arc<dyn Durability>,
        parts: SharedParts,
    ) -> Self {
        fn once<T>(v: Option<T>) -> std::sync::OnceLock<T> {
            v.map_or_else(std::sync::OnceLock::new, std::sync::OnceLock::from)
        }
        Shared {
            live: crate::live::LiveSettings::new(crate::live::Limits {
                max_clients: config.max_clients,
                max_query_buffer: config.max_query_buffer,
                max_output_buffer: config.max_output_buffer,
                idle_timeout_ms: config.idle_timeout_ms,
                write_timeout_ms: config.write_timeout_ms,
            }),
            config_file: parts.config_file,
            flags: parts.flags,
            config,
            users,
            stats: Stats::default(),
            started: Instant::now(),
            local_port: AtomicU16::new(0),
            durability,
            feed: once(parts.feed),
            metrics: Metrics::new(),
            repl: std::sync::OnceLock::new(),
            pubsub: crate::pubsub::Hub::default(),
            clients: crate::pubsub::Clients::default(),
            tls: once(parts.tls),
            cluster: once(parts.cluster),
            engine: once(parts.engine),
            secret_file: once(parts.secret_file),
        }
    }
}

/// Per-connection state.
pub struct ConnState {
    /// CLIENT ID: unique per connection since start.
    pub id: u64,
    /// 2 or 3: the RESP version HELLO chose.
    pub proto: u8,
    /// CLIENT SETNAME.
    pub name: Option<String>,
    /// The role AUTH gave; `None` before AUTH where passwords are set.
    pub role: Option<Role>,
    /// The user AUTH named (CLIENT LIST's `user`).
    pub user_name: Option<String>,
    /// CLIENT SETINFO LIB-NAME.
    pub lib_name: String,
    /// CLIENT SETINFO LIB-VER.
    pub lib_ver: String,
    /// The client's address, `ip:port`.
    pub addr: String,
    /// The local address it connected to.
    pub laddr: String,
    /// `Some` between `MULTI` and `EXEC`/`DISCARD`: the commands queued so far.
    pub multi: Option<MultiQueue>,
    /// `REPLCONF listening-port`: the port a replica serves clients on.
    pub repl_port: Option<u16>,
    /// `ASKING` came just before: the next command may run on a slot this node is
    /// importing (one command only, as in Redis).
    pub asking: bool,
    /// `READONLY` came (and no `READWRITE` since): this connection accepts stock reads
    /// from a follower, possibly behind the leader (Redis Cluster's convention).
    pub stale_reads: bool,
    /// What this connection's commands recorded since the batch began; the connection
    /// publishes it into `Shared::metrics` before the batch's replies leave.
    pub recorder: Recorder,
    /// What `CLIENT LIST` shows of this connection, shared with the client registry.
    pub seen: std::sync::Arc<crate::pubsub::Seen>,
}

/// A transaction being queued. The logic lives in `cmd::multi`; the queue lives here
/// because it belongs to the connection.
#[derive(Default)]
pub struct MultiQueue {
    /// The queued commands, each its arguments.
    pub commands: Vec<Vec<Bytes>>,
    /// Bytes of the queued arguments, bounded like an unfinished command's buffer.
    pub bytes: usize,
    /// A command was refused while queuing: `EXEC` must run nothing (`-EXECABORT`).
    pub aborted: bool,
    /// In cluster mode, the slot of the first queued command with a key, and whether a
    /// later one had another slot (`EXEC` then answers `-CROSSSLOT`).
    pub slot: Option<u16>,
    /// A queued command's key was on another slot than `slot`.
    pub cross_slot: bool,
}

impl ConnState {
    /// A new connection: RESP2, no name, `role` None until AUTH when users are configured.
    pub fn new(id: u64, role: Option<Role>, addr: String, laddr: String) -> Self {
        let c = ConnState {
            id,
            proto: 2,
            name: None,
            role,
            user_name: None,
            lib_name: String::new(),
            lib_ver: String::new(),
            addr,
            laddr,
            multi: None,
            repl_port: None,
            asking: false,
            stale_reads: false,
            recorder: Recorder::default(),
            seen: Default::default(),
        };
        c.show();
        c
    }

    /// Puts this connection's name, user, protocol and library where `CLIENT LIST` reads
    /// them (after a command that may have changed one).
    pub fn show(&self) {
        *self.seen.about.lock() = crate::pubsub::About {
            head: format!("laddr={}", self.laddr),
            name: self.name.clone().unwrap_or_default(),
            tail: format!(
                "user={} redir=-1 resp={} lib-name={} lib-ver={}",
                self.user_name.as_deref().unwrap_or("default"),
                self.proto,
                self.lib_name,
                self.lib_ver
            ),
        };
    }

    /// True between MULTI and EXEC or DISCARD.
    pub fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

    /// This connection as one CLIENT LIST line.
    pub fn describe(&self) -> String {
        format!(
            "id={} addr={} laddr={} name={} db=0 resp={} user={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.name.as_deref().unwrap_or(""),
            self.proto,
            self.user_name.as_deref().unwrap_or("default"),
            self.lib_name,
            self.lib_ver
        )
    }
}
