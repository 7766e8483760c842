//! Replication from the write-ahead log: a primary streams its log to replicas, replicas
//! apply it through the recovery path (`Engine::apply`) and write it to their own log
//! under the same LSNs, and a reply that reports a state change can be held until the
//! replicas have it durable (`--min-replicas-ack`).
//!
//! Modelled on Redis (replication id + offset, `PSYNC`, a backlog, full sync when the
//! history does not match), with the offset being the LSN: every node of a group holds
//! the same records under the same LSNs, so "replica at offset N" means "has records
//! 1..=N of this history".
//!
//! Failover is Sentinel's job; what this module guarantees is that a failover cannot
//! lose an acknowledged state (see `ack_rule` below and the README):
//! - with `--min-replicas-ack N` (N ≥ 1), a write is acknowledged only when **every
//!   replica attached to the primary** has it durable, and at least N are attached;
//! - a replica told to leave its primary (`REPLICAOF NO ONE` or another primary) first
//!   stops applying, then sends its primary `REPLCONF FENCE`: a primary fenced this way
//!   ("deposed") acknowledges nothing more and refuses writes with `-READONLY` until it is
//!   made a replica (or promoted again by `REPLICAOF NO ONE`).
//!
//! So whichever replica Sentinel promotes holds every acknowledged record: it was
//! attached (and acknowledging) until it left, and once it left, the old primary could
//! acknowledge nothing more. A replica that dies simply detaches (writes go on with the
//! others if at least N remain); one that stops answering is detached after
//! `--repl-timeout-ms`, during which writes wait.
//!
//! Depends on the engine, the WAL and `persist`; nothing below depends on it.

pub mod primary;
pub mod replica;
pub mod state;
mod wire;

use std::ffi::OsString;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::engine::{Engine, Lsn};
use crate::persist::WalDurability;
use crate::session::Durability;
use state::{PersistedState, RoleConf, StateError};

/// Replication settings (flags of the binary).
#[derive(Clone, Debug)]
pub struct ReplConfig {
    pub data_dir: PathBuf,
    /// `--min-replicas-ack`: 0 = asynchronous replication (as Redis by default).
    pub min_replicas_ack: usize,
    /// `--repl-timeout-ms`: a replica silent this long is detached; a replica that hears
    /// nothing from its primary this long reconnects.
    pub timeout: Duration,
    /// `--replica-priority` (Sentinel prefers lower, 0 = never promote).
    pub priority: u32,
    /// The port this node serves clients on, announced to its primary.
    pub announce_port: u16,
    /// `--primary-user` / `--primary-password`: how this node authenticates to its primary.
    pub primary_auth: Option<(String, String)>,
    /// The command line to re-execute after a full sync (see `replica::full_sync`).
    pub restart_argv: Vec<OsString>,
    /// Fault injection for failover tests: the primary holds each batch this long before
    /// sending it, widening the window in which a record is acknowledged locally but not
    /// yet on any replica. 0 in production; the binary reads `STOCKGATE_FAULT_REPL_DELAY_MS`.
    pub fault_send_delay_ms: u64,
}

/// The link of a replica to its primary, as INFO and ROLE report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkStatus {
    Connecting,
    Sync,
    Up,
}

struct Link {
    status: LinkStatus,
    last_io: Instant,
    down_since: Instant,
}

/// A replica attached to this primary.
pub struct Attached {
    pub id: u64,
    pub ip: String,
    pub port: u16,
    /// The highest LSN the replica reported durable in its log.
    pub acked: AtomicU64,
    /// The highest LSN sent to it.
    pub sent: AtomicU64,
    /// When it last reported (ms since the primary's `started`).
    pub last_ack_ms: AtomicU64,
}

/// Why a write is refused before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A replica, or a primary fenced by its replica's promotion: Redis's wording, so
    /// Sentinel-aware clients (redis-py, ioredis) rediscover the primary.
    ReadOnly,
    /// Fewer than `--min-replicas-ack` replicas attached.
    NoReplicas,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::ReadOnly => "READONLY You can't write against a read only replica.",
            Refusal::NoReplicas => "NOREPLICAS Not enough good replicas to write.",
        }
    }
}

pub struct Repl {
    cfg: ReplConfig,
    engine: Arc<Engine>,
    dur: Arc<WalDurability>,
    ids: Mutex<PersistedState>,
    /// Bumped by every role change: a replica link started under an older epoch stops.
    epoch: AtomicU64,
    is_replica: AtomicBool,
    deposed: AtomicBool,
    replicas: Mutex<Vec<Arc<Attached>>>,
    attached: AtomicUsize,
    /// Woken by every acknowledgement, attach, detach and fence (waiters re-check).
    acks: Notify,
    /// Highest LSN released under `--min-replicas-ack` so far (see [`Repl::acknowledged_lsn`]).
    released: AtomicU64,
    /// Wakes the replica task when the role changes.
    role_changed: Notify,
    link: Mutex<Link>,
    next_id: AtomicU64,
    started: Instant,
    full_syncs: AtomicU64,
    partial_syncs: AtomicU64,
    announce_port: std::sync::atomic::AtomicU16,
    /// Replicas that detached recently: (address, last acknowledged LSN, when). Their
    /// position is kept in the log for [`BACKLOG_HOLD`], so a replica that restarts (or
    /// re-executes after a full copy) resumes instead of needing another full copy.
    detached: Mutex<Vec<(String, u64, Instant)>>,
}

/// How long the log keeps a detached replica's position (the backlog's time bound).
pub const BACKLOG_HOLD: Duration = Duration::from_secs(60);

impl Repl {
    /// Loads `repl.state` (or creates it: primary, or replica of `replicaof` when given;
    /// an existing state file wins over the flag, since it is what Sentinel last set).
    pub fn open(
        cfg: ReplConfig,
        engine: Arc<Engine>,
        dur: Arc<WalDurability>,
        replicaof: Option<(String, u16)>,
    ) -> Result<Arc<Repl>, StateError> {
        let st = match PersistedState::load(&cfg.data_dir)? {
            Some(s) => s,
            None => {
                let s = PersistedState {
                    role: match replicaof {
                        Some((host, port)) => RoleConf::Replica { host, port },
                        None => RoleConf::Primary,
                    },
                    replid: state::new_id(),
                    previous: None,
                    fenced: None,
                };
                s.save(&cfg.data_dir)?;
                s
            }
        };
        let is_replica = matches!(st.role, RoleConf::Replica { .. });
        let fenced = st.fenced.is_some() && !is_replica;
        let now = Instant::now();
        let cfg_port = cfg.announce_port;
        Ok(Arc::new(Repl {
            cfg,
            engine,
            dur,
            ids: Mutex::new(st),
            epoch: AtomicU64::new(1),
            is_replica: AtomicBool::new(is_replica),
            deposed: AtomicBool::new(fenced),
            replicas: Mutex::new(Vec::new()),
            attached: AtomicUsize::new(0),
            acks: Notify::new(),
            released: AtomicU64::new(0),
            role_changed: Notify::new(),
            link: Mutex::new(Link {
                status: LinkStatus::Connecting,
                last_io: now,
                down_since: now,
            }),
            next_id: AtomicU64::new(1),
            started: now,
            full_syncs: AtomicU64::new(0),
            partial_syncs: AtomicU64::new(0),
            announce_port: cfg_port.into(),
            detached: Mutex::new(Vec::new()),
        }))
    }

    /// Starts the task that follows the primary whenever this node is a replica.
    pub fn start(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(replica::follow(self.clone()))
    }

    /// The port actually bound (when `--port 0` picked one).
    pub fn set_announce_port(&self, port: u16) {
        self.announce_port.store(port, Ordering::Relaxed);
    }

    pub fn is_replica(&self) -> bool {
        self.is_replica.load(Ordering::Acquire)
    }

    pub fn is_deposed(&self) -> bool {
        self.deposed.load(Ordering::Acquire)
    }

    pub fn min_replicas_ack(&self) -> usize {
        self.cfg.min_replicas_ack
    }

    /// Whether a write command may run now (checked before it changes anything).
    pub fn write_refusal(&self) -> Option<Refusal> {
        if self.is_replica() || self.is_deposed() {
            return Some(Refusal::ReadOnly);
        }
        if self.cfg.min_replicas_ack > 0
            && self.attached.load(Ordering::Acquire) < self.cfg.min_replicas_ack
        {
            return Some(Refusal::NoReplicas);
        }
        None
    }

    /// Resolves when the replicas have `lsn` as the acknowledgement rule demands (see the
    /// module docs). An error: the reply must not leave (the record may never reach the
    /// primary that comes next).
    pub async fn wait_acks(&self, lsn: Lsn) -> Result<(), String> {
        let need = self.cfg.min_replicas_ack;
        if need == 0 || lsn == 0 {
            return Ok(());
        }
        // Bounded: twice the replication timeout (by then a silent replica is detached
        // and the count is re-checked one last time).
        let deadline = tokio::time::Instant::now() + self.cfg.timeout * 2;
        loop {
            let notified = self.acks.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_replica() {
                // Reads on a replica report what its own log holds.
                return Ok(());
            }
            if self.is_deposed() {
                return Err("this primary was replaced (fenced by a promoted replica)".into());
            }
            {
                let reps = self.replicas.lock();
                if reps.len() < need {
                    return Err(format!(
                        "{} replica(s) attached, --min-replicas-ack {need}",
                        reps.len()
                    ));
                }
                if reps.iter().all(|r| r.acked.load(Ordering::Acquire) >= lsn) {
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(format!("replicas did not acknowledge LSN {lsn} in time"));
            }
        }
    }

    /// The highest LSN whose reply may have left this node under the acknowledgement
    /// rule, i.e. every LSN [`Repl::wait_acks`] has let through or would now: `None` when
    /// the rule does not apply (no `--min-replicas-ack`, or a replica: its log is what
    /// it serves). Readers of the order feed stop here, so nothing a failover can lose is
    /// ever consumed. Monotonic: what was released stays released when a slower replica
    /// attaches later.
    pub fn acknowledged_lsn(&self) -> Option<Lsn> {
        let need = self.cfg.min_replicas_ack;
        if need == 0 || self.is_replica() {
            return None;
        }
        if !self.is_deposed() {
            let reps = self.replicas.lock();
            if reps.len() >= need {
                if let Some(m) = reps.iter().map(|r| r.acked.load(Ordering::Acquire)).min() {
                    self.released.fetch_max(m, Ordering::AcqRel);
                }
            }
        }
        Some(self.released.load(Ordering::Acquire))
    }

    /// Resolves at the next acknowledgement, attach, detach or fence.
    pub async fn ack_changed(&self) {
        self.acks.notified().await
    }

    /// Replicas attached now whose log has `lsn` (for `WAIT`).
    pub fn count_acked(&self, lsn: Lsn) -> usize {
        self.replicas
            .lock()
            .iter()
            .filter(|r| r.acked.load(Ordering::Acquire) >= lsn)
            .count()
    }

    /// `WAIT n timeout`: how many replicas have `lsn` once `n` do or the time is up.
    pub async fn wait_count(&self, lsn: Lsn, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.acks.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let have = self.count_acked(lsn);
            if have >= n || self.is_replica() {
                return have;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count_acked(lsn);
            }
        }
    }

    /// `REPLICAOF host port` (`Some`) or `REPLICAOF NO ONE` (`None`).
    pub fn replicaof(&self, target: Option<(String, u16)>) -> Result<&'static str, String> {
        let mut ids = self.ids.lock();
        let new_role = match &target {
            Some((host, port)) => RoleConf::Replica {
                host: host.clone(),
                port: *port,
            },
            None => RoleConf::Primary,
        };
        if ids.role == new_role && !(new_role == RoleConf::Primary && self.is_deposed()) {
            return Ok(match new_role {
                RoleConf::Primary => "OK",
                RoleConf::Replica { .. } => "OK Already connected to specified master",
            });
        }
        // Stop the link first and wait out a batch being applied: from here on nothing of
        // the old primary's history enters this log, so the last LSN below is exactly
        // where this node's history forks (or continues).
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let gate = self.dur.apply_gate();
        let last = self.dur.wal.last_lsn();
        match &new_role {
            RoleConf::Primary => {
                // A new history that shares records 1..=last with the old one: replicas
                // of the old primary continue from here (PSYNC with the old id).
                let old = std::mem::replace(&mut ids.replid, state::new_id());
                ids.previous = Some((old, last));
                self.deposed.store(false, Ordering::Release);
            }
            RoleConf::Replica { .. } => {
                // A former primary now follows someone else: it must take no more writes;
                // its replicas are cut off (they follow the same chain again by Sentinel).
                self.deposed.store(false, Ordering::Release);
            }
        }
        ids.role = new_role.clone();
        ids.fenced = None;
        self.is_replica.store(
            matches!(new_role, RoleConf::Replica { .. }),
            Ordering::Release,
        );
        drop(gate);
        let saved = ids.save(&self.cfg.data_dir);
        drop(ids);
        if matches!(new_role, RoleConf::Replica { .. }) {
            self.detach_all();
        }
        {
            let mut l = self.link.lock();
            l.status = LinkStatus::Connecting;
            l.down_since = Instant::now();
        }
        self.role_changed.notify_waiters();
        self.acks.notify_waiters();
        tracing::warn!(
            "replication: now {} (history forks after LSN {last})",
            match &target {
                Some((h, p)) => format!("a replica of {h}:{p}"),
                None => "the primary".to_owned(),
            }
        );
        saved.map_err(|e| e.to_string())?;
        Ok("OK")
    }

    /// `CONFIG REWRITE`: the role is written at every change; this writes it again.
    pub fn persist(&self) -> Result<(), String> {
        self.ids
            .lock()
            .save(&self.cfg.data_dir)
            .map_err(|e| e.to_string())
    }

    /// Fenced by a replica that left to become (or follow) another primary.
    fn depose(&self, by: &str) {
        if !self.is_replica() && !self.deposed.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "replication: fenced by replica {by}: it left this primary, which now refuses writes until it is made a replica"
            );
            // Kept across a restart: a replica that still follows this node (not yet
            // reconfigured by Sentinel) must not let it acknowledge again.
            let mut ids = self.ids.lock();
            ids.fenced = Some(by.to_owned());
            if let Err(e) = ids.save(&self.cfg.data_dir) {
                tracing::error!("replication: cannot persist the fence: {e}");
            }
        }
        self.acks.notify_waiters();
    }

    /// Tells the log which segments replicas still need: from the oldest position of an
    /// attached replica or one detached less than [`BACKLOG_HOLD`] ago.
    fn hold_backlog(&self) {
        let mut floor = self
            .replicas
            .lock()
            .iter()
            .map(|r| r.acked.load(Ordering::Acquire) + 1)
            .min()
            .unwrap_or(Lsn::MAX);
        {
            let mut d = self.detached.lock();
            d.retain(|(_, _, at)| at.elapsed() < BACKLOG_HOLD);
            if let Some(m) = d.iter().map(|(_, acked, _)| acked + 1).min() {
                floor = floor.min(m);
            }
        }
        self.dur.wal.retain_from(floor);
    }

    /// A replica attached: if it is the one whose promotion fenced this primary, that
    /// promotion did not hold (Sentinel aborted the failover and made it follow this node
    /// again). It acknowledges what this node writes from now on, so the fence is lifted;
    /// otherwise nobody would take writes until an operator stepped in.
    fn lift_fence_if_back(&self, addr: &str) {
        if !self.is_deposed() {
            return;
        }
        let mut ids = self.ids.lock();
        if ids.fenced.as_deref() != Some(addr) || self.is_replica() {
            return;
        }
        ids.fenced = None;
        if let Err(e) = ids.save(&self.cfg.data_dir) {
            tracing::error!("replication: cannot persist lifting the fence: {e}");
            return;
        }
        self.deposed.store(false, Ordering::Release);
        drop(ids);
        tracing::warn!(
            "replication: {addr}, whose promotion fenced this primary, follows it again: the fence is lifted"
        );
        self.acks.notify_waiters();
    }

    fn detach_all(&self) {
        let mut reps = self.replicas.lock();
        reps.clear();
        self.attached.store(0, Ordering::Release);
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn role_conf(&self) -> RoleConf {
        self.ids.lock().role.clone()
    }

    /// INFO's `# Replication` section, with the fields Sentinel reads.
    pub fn info(&self) -> String {
        let ids = self.ids.lock().clone();
        let last = self.dur.wal.last_lsn();
        let wal = &self.dur.wal;
        let first = wal.first_readable_lsn();
        let mut o = String::from("# Replication\r\n");
        let now = self.now_ms();
        match &ids.role {
            RoleConf::Primary => {
                let reps = self.replicas.lock();
                o.push_str(&format!(
                    "role:master\r\nconnected_slaves:{}\r\n",
                    reps.len()
                ));
                for (i, r) in reps.iter().enumerate() {
                    let lag = now.saturating_sub(r.last_ack_ms.load(Ordering::Relaxed)) / 1000;
                    o.push_str(&format!(
                        "slave{i}:ip={},port={},state=online,offset={},lag={lag}\r\n",
                        r.ip,
                        r.port,
                        r.acked.load(Ordering::Relaxed)
                    ));
                }
            }
            RoleConf::Replica { host, port } => {
                let l = self.link.lock();
                let up = l.status == LinkStatus::Up;
                o.push_str(&format!(
                    "role:slave\r\nmaster_host:{host}\r\nmaster_port:{port}\r\nmaster_link_status:{}\r\nmaster_last_io_seconds_ago:{}\r\nmaster_sync_in_progress:{}\r\nslave_read_repl_offset:{last}\r\nslave_repl_offset:{}\r\n",
                    if up { "up" } else { "down" },
                    if up { l.last_io.elapsed().as_secs() as i64 } else { -1 },
                    u8::from(l.status == LinkStatus::Sync),
                    wal.durable_lsn(),
                ));
                if !up {
                    o.push_str(&format!(
                        "master_link_down_since_seconds:{}\r\n",
                        l.down_since.elapsed().as_secs()
                    ));
                }
                o.push_str(&format!(
                    "slave_priority:{}\r\nslave_read_only:1\r\nreplica_announced:1\r\nconnected_slaves:0\r\n",
                    self.cfg.priority
                ));
            }
        }
        let (id2, off2) = match &ids.previous {
            Some((id, off)) => (id.clone(), (*off + 1) as i64),
            None => ("0".repeat(40), -1),
        };
        o.push_str(&format!(
            "master_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_replid2:{id2}\r\nmaster_repl_offset:{last}\r\nsecond_repl_offset:{off2}\r\nrepl_backlog_active:1\r\nrepl_backlog_size:{}\r\nrepl_backlog_first_byte_offset:{first}\r\nrepl_backlog_histlen:{}\r\nmin_replicas_ack:{}\r\nstockgate_deposed:{}\r\nsync_full:{}\r\nsync_partial_ok:{}\r\n",
            ids.replid,
            wal.stats().bytes_written,
            (last + 1).saturating_sub(first),
            self.cfg.min_replicas_ack,
            u8::from(self.is_deposed()),
            self.full_syncs.load(Ordering::Relaxed),
            self.partial_syncs.load(Ordering::Relaxed),
        ));
        o
    }

    /// What `ROLE` answers.
    pub fn role_reply(&self) -> crate::protocol::Reply {
        use crate::protocol::Reply;
        let last = self.dur.wal.last_lsn() as i64;
        match self.role_conf() {
            RoleConf::Primary => Reply::Array(vec![
                Reply::bulk("master"),
                Reply::Int(last),
                Reply::Array(
                    self.replicas
                        .lock()
                        .iter()
                        .map(|r| {
                            Reply::Array(vec![
                                Reply::bulk(&r.ip),
                                Reply::bulk(r.port.to_string()),
                                Reply::bulk(r.acked.load(Ordering::Relaxed).to_string()),
                            ])
                        })
                        .collect(),
                ),
            ]),
            RoleConf::Replica { host, port } => {
                let status = match self.link.lock().status {
                    LinkStatus::Connecting => "connecting",
                    LinkStatus::Sync => "sync",
                    LinkStatus::Up => "connected",
                };
                Reply::Array(vec![
                    Reply::bulk("slave"),
                    Reply::bulk(host),
                    Reply::Int(port as i64),
                    Reply::bulk(status),
                    Reply::Int(last),
                ])
            }
        }
    }
}

/// The durability a replicated server's replies wait for: the local log, then the
/// replicas (see [`Repl::wait_acks`]).
pub struct ReplDurability {
    pub local: Arc<WalDurability>,
    pub repl: Arc<Repl>,
}

impl Durability for ReplDurability {
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move {
            self.local.wait(lsn).await?;
            self.repl.wait_acks(lsn).await
        })
    }

    fn save(&self, engine: &Engine) -> Result<(), String> {
        self.local.save(engine)
    }

    fn info(&self) -> String {
        self.local.info()
    }
}

impl crate::session::Replication for Repl {
    fn write_refusal(&self) -> Option<&'static str> {
        Repl::write_refusal(self).map(Refusal::message)
    }

    fn read_refusal(&self) -> Option<&'static str> {
        if Repl::is_replica(self) {
            return None;
        }
        Repl::write_refusal(self).map(Refusal::message)
    }

    fn feed_refusal(&self) -> Option<&'static str> {
        (!Repl::is_replica(self) && Repl::is_deposed(self)).then(|| Refusal::ReadOnly.message())
    }

    fn is_replica(&self) -> bool {
        Repl::is_replica(self)
    }

    fn info(&self) -> String {
        Repl::info(self)
    }

    fn role_reply(&self) -> crate::protocol::Reply {
        Repl::role_reply(self)
    }

    fn replicaof(&self, target: Option<(String, u16)>) -> Result<&'static str, String> {
        Repl::replicaof(self, target)
    }

    fn persist(&self) -> Result<(), String> {
        Repl::persist(self)
    }

    fn wait_count(
        &self,
        lsn: Lsn,
        n: usize,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = usize> + Send + '_>> {
        Box::pin(Repl::wait_count(self, lsn, n, timeout))
    }

    fn serve_replica(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        inbuf: bytes::BytesMut,
        req: crate::session::SyncRequest,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(primary::serve(self, stream, inbuf, req))
    }
}
