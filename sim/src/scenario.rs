//! One run: a three-member group formed, a client reserving against whoever leads,
//! seeded faults for a while, then healing, and the invariants checked.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::{Config, SnapshotPolicy};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_server::engine::{
    Engine, Millis, Monotonic, ReservationState, ReservationView, WallSource,
};
use stockgate_server::raft::speculation::Speculation;
use stockgate_server::raft::{authority, NodeId, NodeInfo, Raft};
use stockgate_server::session::{NoDurability, ServerConfig, Shared};
use stockgate_server::wal::{FsyncPolicy, WalOptions};
use tokio::sync::Notify;
use tokio::time::{sleep, Instant};

use crate::disk::{Armed, Disk, Log, Op};
use crate::history::History;
use crate::member::{self, Boot, Env, Member};
use crate::net::{Flap, Net};
use crate::Outcome;
use commands::Reserved;

mod bit_flip;
mod commands;
mod damage;
mod feed;
mod feed_checks;
pub(crate) mod log_matching;
mod pause_and_membership;
mod retries;
mod snapshots;

/// How a run goes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Members in the group.
    pub members: u64,
    /// Fault steps before healing.
    pub steps: u32,
    /// Print the history as it is written.
    pub verbose: bool,
    /// Members' WALs under `--fsync no` instead of `everysec` (what a server gives a
    /// member's WAL): a standalone server's policy, for the known bug it shows (a power
    /// loss after a segment rolled leaves a log that refuses to start; docs/simulation.md).
    pub fsync_no: bool,
    /// The network faults beyond lost and late legs and two-way partitions: one-way
    /// partitions, flapping links, duplicated and replayed requests. Off, a seed runs
    /// as it did before they existed (the same draws, the same digest), which keeps
    /// the seeds of older regressions meaning what they meant.
    pub net_faults: bool,
    /// Two more fault kinds: a member stopped and continued (SIGSTOP, SIGCONT), often
    /// the leader, and membership changes (a voter removed through the leader, later
    /// added back) in the middle of the other faults. Off, a seed draws what it drew
    /// before they existed, as with `net_faults`.
    pub pause_and_membership: bool,
    /// Holds expire: the sales' holds last a drawn while (short in one sale, long in the
    /// other), the clients EXTEND some, every member runs the server's ticker (expiry
    /// with `auto_release`) while it takes writes, and a fault step may make a member's
    /// wall clock jump forward or back. Off, a seed draws what it drew before, as with
    /// `net_faults`.
    pub expiry: bool,
    /// One more fault kind: a member restarts reading one flipped bit of its Raft log
    /// or of a WAL segment (`scenario/bit_flip.rs`; in the `RaftNode` scenario
    /// `nodes/disk_faults.rs`). Off, a seed draws what it drew before it existed, as
    /// with `net_faults`.
    pub bit_flips: bool,
    /// What a process hands on lives its own life: the Raft log writes and syncs a
    /// change a drawn while after it is made, as its writer thread does in a server (so
    /// entries reach peers before they are durable here, and a process that dies
    /// first loses them: `DiskHook::lags`), and a request on the wire arrives even if its
    /// sender dies or gives up meanwhile (`Net::keep_sent_requests`). Off, every change
    /// is synced before it returns, a sender's death cancels what it had in flight, and
    /// a seed runs as it did before. In the `RaftNode` scenario: the Raft log's lag, and
    /// the WAL's once-a-second sync (so a failed WAL `fsync` is drawn).
    pub lagging_io: bool,
    /// Raft snapshots: every member snapshots every few records (drawn by the seed), the
    /// log is purged behind them and a member that fell behind is sent one
    /// (`scenario/snapshots.rs`). Off, no snapshot is built and a seed draws what it drew
    /// before, as with `net_faults`.
    pub snapshots: bool,
    /// A client whose RESERVE went unanswered sends it again with the same request id
    /// (`scenario/retries.rs`); the group must never make two holds for it. Off, a
    /// seed draws what it drew before, as with `net_faults`.
    pub retries: bool,
    /// One more fault kind: a record in the middle of a member's Raft log or of a WAL
    /// segment is damaged beyond one bit, so the member refuses to start, and the
    /// operator wipes it and re-admits it (`scenario/damage.rs`; in the `RaftNode`
    /// scenario `nodes/disk_faults.rs`). Off, a seed draws what it drew before it
    /// existed, as with `net_faults`.
    pub damage: bool,
    /// The clients' writes go through the command layer (`cmd::dispatch`) as command
    /// lines, and their replies are read as a client reads them
    /// (`scenario/commands.rs`). Off, the clients call the engine, and a seed runs as it
    /// did before. In the `RaftNode` scenario (whose clients always send command lines)
    /// it sends `RAFT.READMIT` as a command line too; off, through
    /// `Replication::raft_change`.
    pub commands: bool,
    /// Consumers of the order feed (`scenario/feed.rs`): a reader on any member, a
    /// materializer holding its group `hold.m` at its position, a consumer group read
    /// and acknowledged; the feed's rules checked (`scenario/feed_checks.rs`). Off, no
    /// consumer runs and a seed draws what it drew before, as with `net_faults` (every
    /// member opens its feed and its groups hold its snapshots back either way, as a
    /// server's do; without groups the hold is none). The `RaftNode` scenario runs its
    /// own consumers through the command layer under the same setting (`nodes/feed.rs`).
    pub feed: bool,
    /// The `RaftNode` scenario (`--raftnode`) only: faults that overlap (a storage error
    /// or a crash while a link fault or a stop lasts, a voter out and back while another
    /// fault lasts, a stopped member crashed: `nodes/overlap.rs`). Off, a seed draws what
    /// it drew before, as with `net_faults`.
    pub overlaps: bool,
    /// The `RaftNode` scenario's feed only: a second worker of the consumer group takes
    /// over the first's idle entries (`XAUTOCLAIM`, `XCLAIM`), the pending list is read
    /// (`XPENDING`), and the reader's `XREAD` sometimes blocks (`BLOCK`):
    /// `nodes/feed/claims.rs`. Off, a seed draws what it drew before, as with
    /// `net_faults`.
    pub claims: bool,
    /// The `RaftNode` scenario only: a member's data dir loses its Raft log but keeps its
    /// identity file; its start must refuse, and `--rejoin-empty` brings it back
    /// (`nodes/amnesia.rs`, `lose_log`). Off, a seed draws what it drew before.
    pub lost_log: bool,
    /// The `RaftNode` scenario only: two faults of one kind at once (two members'
    /// storage errors, two members stopped, two links cut by different steps, a second
    /// storage error on a member before it restarts from the first:
    /// `nodes/doubled.rs`). Off, a seed draws what it drew before.
    pub doubled: bool,
    /// The `RaftNode` scenario only: a storage error or a crash between a membership
    /// change's request and its commit (`nodes/change_faults.rs`). Off, likewise.
    pub change_faults: bool,
    /// The `RaftNode` scenario only: the leader's Raft log syncs far behind the network
    /// (a slow disk on the leader alone), then the power goes and it restarts at once
    /// (`nodes/slow_leader.rs`). Off, likewise.
    pub slow_leader: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            members: 3,
            steps: 30,
            verbose: false,
            fsync_no: false,
            net_faults: true,
            pause_and_membership: true,
            expiry: true,
            bit_flips: true,
            lagging_io: true,
            snapshots: true,
            retries: true,
            damage: true,
            commands: true,
            feed: true,
            overlaps: true,
            claims: true,
            lost_log: true,
            doubled: true,
            change_faults: true,
            slow_leader: true,
        }
    }
}

/// The sales the client reserves from: sku, total units.
const SALES: [(&str, u64); 2] = [("A", 40), ("B", 400)];
/// After healing, a connected majority must elect a leader within this (simulated).
const ELECT_WITHIN: Duration = Duration::from_secs(10);
/// After healing, every member must apply the whole log within this.
const QUIESCE_WITHIN: Duration = Duration::from_secs(30);
/// A reply not released within this is given up (counted neither way).
const REPLY_TTL: Duration = Duration::from_secs(5);

/// Where the simulated wall clocks stand when a run begins.
const EPOCH_MS: Millis = 1_700_000_000_000;

/// A member's wall clock: a fixed epoch plus the simulated time since the run began,
/// plus the member's offset, which clock jumps move (`jump_clock`). Its engine reads it
/// through `Monotonic`, as a server reads the system clock (`SystemClock`).
struct SimWall {
    start: Instant,
    offset: Arc<AtomicI64>,
}

impl WallSource for SimWall {
    fn wall_ms(&self) -> Millis {
        let t = EPOCH_MS + self.start.elapsed().as_millis() as u64;
        t.saturating_add_signed(self.offset.load(Ordering::Acquire))
    }
}

/// What became of an acknowledged hold, as far as acknowledged replies say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Held,
    Released,
    Committed,
}

/// An acknowledged RESERVE.
#[derive(Clone, Debug)]
struct Hold {
    sku: String,
    qty: u32,
    fate: Fate,
    /// A RELEASE or COMMIT of it ran and its reply never came: either outcome is right.
    in_doubt: bool,
    /// Its deadline as the last acknowledged RESERVE or EXTEND set it; `None` while an
    /// EXTEND is in flight or after one went unanswered (either deadline may hold).
    deadline: Option<Millis>,
    /// An EXTEND of it is in flight (one at a time, so an acknowledged one is the last).
    extending: bool,
    /// A COMMIT, RELEASE or EXTEND of it was refused (it expired): the client leaves it.
    refused: bool,
}

/// What a reply waits to acknowledge.
enum Done {
    /// Token, sku, units, deadline.
    Reserved(String, String, u32, Millis),
    Finished(String, Fate),
    /// Token, new deadline.
    Extended(String, Millis),
    /// A RESERVE sent again (`retries`): request id, token, sku, units, deadline.
    Retried(String, String, String, u32, Millis),
    /// A consumer group's command (`Settings::feed`).
    Feed(feed::FeedDone),
}

/// The group and what the run learned so far.
pub(crate) struct Cluster {
    env: Env,
    ids: BTreeSet<NodeId>,
    live: Mutex<BTreeMap<NodeId, Member>>,
    origins: Mutex<StdRng>,
    /// The storage each member id runs on now (a wiped data dir is a new one).
    incarnations: Mutex<BTreeMap<NodeId, u64>>,
    /// A wiped member is being re-admitted: no second wipe meanwhile.
    readmitting: AtomicBool,
    /// A drawn membership change is in flight: one at a time
    /// (`pause_and_membership::reconfigure`).
    changing: AtomicBool,
    /// The member a drawn change took (or tried to take) out of the voters, until a
    /// later one brings it back; at the latest after healing
    /// (`pause_and_membership::rejoin`).
    removed: Mutex<Option<NodeId>>,
    /// Acknowledged holds by token.
    acked: Mutex<BTreeMap<String, Hold>>,
    failures: Mutex<Vec<String>>,
    waiting: AtomicU64,
    /// Reads of a hold's state checked (`read_holds`).
    reads: AtomicU64,
    /// The token of the newest acknowledged RESERVE, RELEASE or COMMIT.
    newest: Mutex<Option<String>>,
    /// The reply queue of each member's current process.
    replies: Mutex<BTreeMap<NodeId, Arc<Replies>>>,
    /// Each member's disk (what a power loss keeps), replaced when the disk is wiped.
    disks: Mutex<BTreeMap<NodeId, Arc<Disk>>>,
    /// Each member's WAL options (fsync policy, segment size), drawn by the seed.
    wal: BTreeMap<NodeId, WalOptions>,
    /// What a power loss keeps of each unsynced tail, and which storage errors strike.
    disk_rng: Mutex<StdRng>,
    /// `Settings::expiry`.
    expiry: bool,
    /// When the run began: the wall clocks' epoch.
    start: Instant,
    /// Each member's wall clock's offset from simulated time (ms), moved by clock jumps;
    /// it outlives the member's processes, as the machine's clock does.
    offsets: BTreeMap<NodeId, Arc<AtomicI64>>,
    /// Every token the client sent a RELEASE for: a hold released otherwise expired.
    release_sent: Mutex<BTreeSet<String>>,
    /// `Settings::lagging_io`.
    lagging_io: bool,
    /// `Settings::retries`.
    retries: bool,
    /// What the clients' commands run in (`Settings::commands`): the settings, users and
    /// counters a server's connections share; `None`, the clients call the engine.
    commands: Option<Shared>,
    /// Every RESERVE that took units, by request id (with `retries`).
    requests: Mutex<BTreeMap<String, retries::Request>>,
    /// Request ids whose RESERVE went unanswered, to send again.
    to_retry: Mutex<VecDeque<String>>,
    /// `Settings::feed`.
    feed: bool,
    /// What the feed's consumers know (with `feed`).
    consumers: Mutex<feed::Consumers>,
}

/// How a member process ends.
enum End {
    /// It exits (re-executes when deposed): its WAL's close is a real close.
    Exit,
    /// `kill -9`: every written byte stays, synced or not.
    Kill,
    /// The machine loses power: every log file keeps what was synced (and by the seed
    /// part of the rest, perhaps torn).
    PowerLoss,
    /// It exits on a storage error in this file, whose unsynced tail may be lost (after a
    /// failed `fsync` the kernel may drop the pages it could not write).
    StorageError(PathBuf),
}

impl Cluster {
    fn fail(&self, what: String) {
        // Paths relative to the run's directory: its name holds the process id.
        let root = format!("{}/", self.env.root.display());
        let what = what.replace(&root, "");
        self.env.history.note(format!("FAIL {what}"));
        self.failures.lock().push(what);
    }

    async fn start(self: &Arc<Self>, id: NodeId) {
        if let Err(e) = self.try_start(id).await {
            self.fail(format!("n{id} refuses to start: {e}"));
        }
    }

    /// Starts member `id`; `Err` when it refuses to, as a server exits on a log it
    /// cannot recover.
    async fn try_start(self: &Arc<Self>, id: NodeId) -> Result<(), String> {
        let origin = self.origins.lock().gen::<u64>();
        let disk = self.disks.lock()[&id].clone();
        let boot = Boot {
            origin,
            incarnation: self.incarnations.lock()[&id],
            wal: self.wal[&id].clone(),
            disk: disk.clone(),
            clock: Arc::new(Monotonic::over(SimWall {
                start: self.start,
                offset: self.offsets[&id].clone(),
            })),
            lagging_io: self.lagging_io,
        };
        let m = member::start(id, &self.env, boot).await?;
        disk.settle();
        self.env
            .history
            .note(format!("n{id} starts (origin {origin:016x})"));
        let q = Arc::new(Replies {
            id,
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            gone: AtomicBool::new(false),
        });
        tokio::spawn(q.clone().run(self.clone(), m.spec.clone()));
        self.replies.lock().insert(id, q);
        self.live.lock().insert(id, m);
        // A start recovers the groups from the snapshot and the log after it: what a
        // snapshot let go of must not be what they still need.
        if self.feed {
            feed_checks::check_groups(self);
        }
        Ok(())
    }

    async fn crash(&self, id: NodeId, why: &str, end: End) {
        let Some(m) = self.live.lock().remove(&id) else {
            return;
        };
        self.env.history.note(format!("n{id} crashes ({why})"));
        if self.env.net.is_paused(id) {
            // A stopped process killed never continues: its held replies never go.
            if let Some(q) = self.replies.lock().get(&id) {
                q.gone.store(true, Ordering::Release);
            }
            self.env
                .history
                .note(format!("n{id} was stopped: it dies so"));
        }
        if !matches!(end, End::Exit) {
            m.hook.die();
        }
        m.crash(&self.env.net).await;
        let only = match &end {
            End::Exit | End::Kill => return,
            End::PowerLoss => None,
            End::StorageError(p) => Some(p.as_path()),
        };
        let disk = self.disks.lock()[&id].clone();
        disk.power_cut(&mut self.disk_rng.lock(), only, &self.env.history);
    }

    /// Whether one member may lose its storage now: not while a change is in flight or
    /// a voter is out (with three members a lost disk among two voters would be a lost
    /// majority).
    fn may_lose_a_disk(&self) -> bool {
        !self.readmitting.load(Ordering::Acquire)
            && !self.changing.load(Ordering::Acquire)
            && self.removed.lock().is_none()
    }

    /// A deposed member restarts from its durable state, as a server re-executes; one
    /// whose disk failed it exits and its supervisor starts it again.
    async fn restart_deposed(self: &Arc<Self>) {
        let deposed: Vec<(NodeId, Option<PathBuf>)> = self
            .live
            .lock()
            .values()
            .filter(|m| m.deposed.load(Ordering::Acquire) && !self.env.net.is_paused(m.id))
            .map(|m| (m.id, m.hook.failed()))
            .collect();
        for (id, failed) in deposed {
            match failed {
                Some(p) => self.crash(id, "storage error", End::StorageError(p)).await,
                None => self.crash(id, "deposed", End::Exit).await,
            }
            self.start(id).await;
        }
    }

    /// The member taking writes, if any. If two say they do (which the lease is there
    /// to rule out), the one in the newer term, as discovery would name it to clients;
    /// the older one then still answers reads (`read_holds`).
    fn writer(&self) -> Option<(NodeId, Arc<Engine>, Arc<Speculation>)> {
        let live = self.live.lock();
        newest_writer(&live, &self.env.net).map(|m| (m.id, m.engine.clone(), m.spec.clone()))
    }

    /// The `pick`th (modulo) acknowledged hold still held and not in doubt.
    /// A client of `engine`, through the command layer with `Settings::commands`.
    fn client<'a>(&'a self, engine: &'a Engine) -> commands::Client<'a> {
        commands::Client {
            engine,
            shared: self.commands.as_ref(),
        }
    }

    fn pick_held(&self, pick: usize) -> Option<String> {
        let acked = self.acked.lock();
        let held: Vec<&String> = acked
            .iter()
            .filter(|(_, h)| h.fate == Fate::Held && !h.in_doubt && !h.refused)
            .map(|(t, _)| t)
            .collect();
        (!held.is_empty()).then(|| held[pick % held.len()].clone())
    }

    /// The member taking writes and its Raft handle (membership changes go there).
    fn leader_raft(&self) -> Option<(NodeId, Raft)> {
        let live = self.live.lock();
        newest_writer(&live, &self.env.net).map(|m| (m.id, m.raft.clone()))
    }

    /// Each live member's Raft view, for a failure's diagnosis.
    fn raft_states(&self) -> String {
        let live = self.live.lock();
        let mut out = String::from("raft states:");
        for m in live.values() {
            let r = m.raft.metrics().borrow().clone();
            out += &format!(
                " [n{} {:?} term {} leader {:?} vote {} last {:?} applied {:?} voters {:?} writable {}]",
                m.id,
                r.state,
                r.current_term,
                r.current_leader,
                r.vote,
                r.last_log_index,
                r.last_applied.map(|l| l.index),
                r.membership_config.membership().voter_ids().collect::<Vec<_>>(),
                m.writable()
            );
        }
        out
    }

    fn down(&self) -> Vec<NodeId> {
        let live = self.live.lock();
        self.ids
            .iter()
            .copied()
            .filter(|i| !live.contains_key(i))
            .collect()
    }
}

/// The writable member in the newest term (the lowest id among equals). A stopped one
/// answers nobody: clients and admin commands skip it.
fn newest_writer<'a>(live: &'a BTreeMap<NodeId, Member>, net: &Net) -> Option<&'a Member> {
    live.values()
        .filter(|m| m.writable() && !net.is_paused(m.id))
        .max_by_key(|m| {
            (
                m.raft.metrics().borrow().current_term,
                std::cmp::Reverse(m.id),
            )
        })
}

/// openraft's settings: the server's rules (`node::openraft_config`; its own trigger,
/// `snapshot::trigger_loop`, asks for snapshots) with the entries kept behind a
/// snapshot of `snapshot_records` (openraft's default when snapshots are off).
fn config(snapshot_records: Option<u64>) -> Arc<Config> {
    let keep = snapshot_records.map_or(Config::default().max_in_snapshot_log_to_keep, |r| {
        stockgate_server::raft::snapshot::log_to_keep(r)
    });
    let c = Config {
        cluster_name: "sim".into(),
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: keep,
        max_payload_entries: 16,
        ..Config::default()
    };
    Arc::new(c.validate().unwrap())
}

/// Each member's WAL options: `everysec`, as a server sets a member's WAL whatever
/// `--fsync` says (inline there is no once-a-second sync: a segment is synced when it is
/// left, and at a clean close), and a segment size drawn by the seed, small enough in
/// most runs that segments roll over within a run.
fn wal_options(
    rng: &mut StdRng,
    s: &Settings,
    ids: &BTreeSet<NodeId>,
    h: &History,
) -> BTreeMap<NodeId, WalOptions> {
    let fsync = if s.fsync_no {
        FsyncPolicy::No
    } else {
        FsyncPolicy::EverySec
    };
    let mut out = BTreeMap::new();
    for &id in ids {
        let segment_bytes = [64 << 20, 32 << 10, 4 << 10][rng.gen_range(0..3)];
        h.note(format!(
            "n{id} WAL: fsync {fsync}, segments of {segment_bytes} bytes"
        ));
        out.insert(
            id,
            WalOptions {
                fsync,
                segment_bytes,
                ..WalOptions::default()
            },
        );
    }
    out
}

/// What every member of the run shares: the network, openraft's settings (with the
/// snapshot threshold, drawn only with snapshots on: off, every later draw is what it
/// was), the history, the data dirs.
fn environment(seed: u64, rng: &mut StdRng, root: PathBuf, s: &Settings, h: &History) -> Env {
    let net = Net::new(StdRng::seed_from_u64(rng.gen()));
    h.note(format!("seed {seed}, {} members", s.members));
    if s.lagging_io {
        net.keep_sent_requests();
    }
    let every = s.snapshots.then(|| snapshots::draw_every(rng, h));
    Env {
        net,
        config: config(every),
        expiry: s.expiry,
        history: h.clone(),
        root,
        snapshot_records: every,
    }
}

pub(crate) async fn run(seed: u64, mut rng: StdRng, root: PathBuf, s: Arc<Settings>) -> Outcome {
    let history = History::new(s.verbose);
    let start = Instant::now();
    let env = environment(seed, &mut rng, root, &s, &history);
    let ids: BTreeSet<NodeId> = (1..=s.members).collect();
    let wal = wal_options(&mut rng, &s, &ids, &history);
    let disks = ids.iter().map(|&i| (i, Disk::new(i, env.dir(i)))).collect();
    let c = Arc::new(Cluster {
        env,
        ids,
        live: Mutex::new(BTreeMap::new()),
        origins: Mutex::new(StdRng::seed_from_u64(rng.gen())),
        incarnations: Mutex::new((1..=s.members).map(|i| (i, rng.gen())).collect()),
        readmitting: AtomicBool::new(false),
        changing: AtomicBool::new(false),
        removed: Mutex::new(None),
        acked: Mutex::new(BTreeMap::new()),
        failures: Mutex::new(Vec::new()),
        waiting: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        newest: Mutex::new(None),
        replies: Mutex::new(BTreeMap::new()),
        disks: Mutex::new(disks),
        wal,
        disk_rng: Mutex::new(StdRng::seed_from_u64(rng.gen())),
        expiry: s.expiry,
        start,
        offsets: (1..=s.members)
            .map(|i| (i, Arc::new(AtomicI64::new(0))))
            .collect(),
        release_sent: Mutex::new(BTreeSet::new()),
        lagging_io: s.lagging_io,
        retries: s.retries,
        commands: s
            .commands
            .then(|| Shared::new(ServerConfig::default(), None, Arc::new(NoDurability))),
        requests: Mutex::new(BTreeMap::new()),
        to_retry: Mutex::new(VecDeque::new()),
        feed: s.feed,
        consumers: Mutex::new(feed::Consumers::default()),
    });
    let ttls = sale_ttls(&mut rng, &s, &history);
    form(&c).await;
    let stop = Arc::new(AtomicBool::new(false));
    if create_sales(&c, ttls).await {
        let client = tokio::spawn(client(
            c.clone(),
            StdRng::seed_from_u64(rng.gen()),
            stop.clone(),
        ));
        // Drawn only with the feed's consumers, so that without them every later draw is
        // what it was.
        let consumers = s.feed.then(|| {
            let rng = StdRng::seed_from_u64(rng.gen());
            tokio::spawn(feed::run(c.clone(), rng, stop.clone()))
        });
        chaos(&c, &mut rng, &s).await;
        heal(&c).await;
        stop.store(true, Ordering::Release);
        let _ = client.await;
        if let Some(t) = consumers {
            let _ = t.await;
        }
        settle(&c).await;
        check_final(&c);
    }
    for id in c.ids.clone() {
        c.crash(id, "end of run", End::Exit).await;
    }
    let (sent, lost, dups) = c.env.net.counts();
    if s.net_faults {
        let reads = c.reads.load(Ordering::Acquire);
        history.note(format!(
            "legs sent {sent}, lost {lost}; {dups} requests twice; {reads} reads checked"
        ));
    } else {
        history.note(format!("legs sent {sent}, lost {lost}"));
    }
    let (digest, events) = history.digest();
    let failures = c.failures.lock().clone();
    Outcome {
        seed,
        digest,
        events,
        failures,
    }
}

/// Starts every member on empty storage and has member 1 form the group.
async fn form(c: &Arc<Cluster>) {
    for id in c.ids.clone() {
        c.start(id).await;
    }
    let members: BTreeMap<NodeId, NodeInfo> = c
        .ids
        .iter()
        .map(|&i| {
            let a = format!("n{i}");
            (
                i,
                NodeInfo {
                    raft_addr: a.clone(),
                    client_addr: a,
                    incarnation: c.incarnations.lock()[&i],
                },
            )
        })
        .collect();
    let raft = c.live.lock().get(&1).map(|m| m.raft.clone()).unwrap();
    if let Err(e) = raft.initialize(members).await {
        c.fail(format!("initialize: {e}"));
    }
}

/// Waits (bounded) for a member that takes writes.
async fn await_writer(c: &Arc<Cluster>, within: Duration) -> Option<NodeId> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        c.restart_deposed().await;
        if let Some((id, ..)) = c.writer() {
            return Some(id);
        }
        sleep(Duration::from_millis(20)).await;
    }
    None
}

/// How long each sale's holds last: an hour (nothing expires within a run) unless
/// `Settings::expiry`; then drawn, 200 ms to 5 s for the first sale (its holds expire
/// within the run, many while faults go on) and 10 s to 10 min for the second (mostly
/// through clock jumps forward, or EXTENDs to a short while).
fn sale_ttls(rng: &mut StdRng, s: &Settings, h: &History) -> [u64; 2] {
    if !s.expiry {
        return [3_600_000; 2];
    }
    let ttls = [rng.gen_range(200..5_000), rng.gen_range(10_000..600_000)];
    h.note(format!("hold TTLs: {ttls:?} ms"));
    ttls
}

/// The sales, created on the first leader and committed before the client starts.
async fn create_sales(c: &Arc<Cluster>, ttls: [u64; 2]) -> bool {
    if await_writer(c, ELECT_WITHIN).await.is_none() {
        c.fail("no leader within 10 s of forming the group".into());
        return false;
    }
    let Some((id, engine, spec)) = c.writer() else {
        return false;
    };
    let mut last = 0;
    for ((sku, total), ttl) in SALES.into_iter().zip(ttls) {
        match c.client(&engine).create_sale(sku, total, ttl) {
            Ok(lsn) => last = lsn,
            Err(e) => {
                c.fail(format!("SALE.CREATE {sku} on n{id}: {e}"));
                return false;
            }
        }
    }
    let ok = tokio::time::timeout(REPLY_TTL, spec.wait(last)).await;
    c.env
        .history
        .note(format!("sales created on n{id}: {ok:?}"));
    if !matches!(ok, Ok(Ok(()))) {
        c.fail("the sales never committed".into());
        return false;
    }
    true
}

/// Every few milliseconds one command on whichever member takes writes: mostly
/// RESERVE, sometimes RELEASE or COMMIT of an acknowledged hold. Each reply waits for
/// the group's commit in its own task, as a connection's does.
async fn client(c: Arc<Cluster>, mut rng: StdRng, stop: Arc<AtomicBool>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Acquire) {
        sleep(Duration::from_millis(rng.gen_range(5..40))).await;
        n += 1;
        let Some((id, engine, _)) = c.writer() else {
            continue;
        };
        // An unanswered RESERVE goes again first, in place of a new step.
        let again = c
            .retries
            .then(|| retries::retry_one(&c, &engine, id))
            .flatten();
        if let Some((lsn, what, who)) = again {
            queue_reply(&c, id, lsn, what, who);
            continue;
        }
        let who = format!("r{n}@n{id}");
        let roll = rng.gen_range(0..100);
        let pick = rng.gen::<usize>();
        read_holds(&c, pick, &who);
        let held = c.pick_held(pick);
        let done = match (roll, held) {
            (0..=14, Some(t)) => finish(&c, &engine, &t, Fate::Released, &who),
            (15..=29, Some(t)) => finish(&c, &engine, &t, Fate::Committed, &who),
            (30..=39, Some(t)) if c.expiry => extend(&c, &engine, &mut rng, &t, &who),
            _ => reserve(&c, &engine, &mut rng, &who),
        };
        if let Some((lsn, what)) = done {
            queue_reply(&c, id, lsn, what, who);
        }
    }
}

/// The reply to a write on member `id`, sent once the group commits `lsn` (or never).
fn queue_reply(c: &Cluster, id: NodeId, lsn: u64, what: Done, who: String) {
    c.waiting.fetch_add(1, Ordering::AcqRel);
    let q = c.replies.lock().get(&id).cloned();
    if let Some(q) = q {
        q.push(Pending {
            lsn,
            what,
            who,
            deadline: Instant::now() + REPLY_TTL,
        });
    }
}

/// Reads of acknowledged holds' states (the `pick`th, modulo, and the newest
/// acknowledged) on every member that takes writes (and is not stopped), answered from
/// its engine without a commit, as the command layer answers a read once the gate
/// (`acts_as_leader` with the lease) lets it; a client may still be talking to any
/// member that says it leads.
/// Each must see every acknowledged outcome of that hold: a member that leads in Raft's
/// view but was deposed without knowing it (the lease is what rules that out) would
/// answer from a state the group has moved past. A RELEASE or COMMIT not yet
/// acknowledged may show or not. Reads change nothing and draw nothing, and only a
/// stale one is written to the history, so they leave every run's history as it was.
fn read_holds(c: &Cluster, pick: usize, who: &str) {
    let tokens: Vec<(String, Hold)> = {
        let acked = c.acked.lock();
        let newest = c.newest.lock().clone();
        let random = acked.iter().nth(pick % acked.len().max(1));
        let newest = newest.and_then(|t| acked.get_key_value(&t));
        random
            .into_iter()
            .chain(newest)
            .map(|(t, h)| (t.clone(), h.clone()))
            .collect()
    };
    let mut stale = Vec::new();
    for m in c.live.lock().values() {
        if m.writable() && !c.env.net.is_paused(m.id) {
            stale.extend(read_on(c, m, &tokens, who));
        }
    }
    for s in stale {
        c.fail(s);
    }
}

/// The reads of `tokens` on member `m` that miss an acknowledged outcome.
fn read_on(c: &Cluster, m: &Member, tokens: &[(String, Hold)], who: &str) -> Vec<String> {
    let mut stale = Vec::new();
    for (token, h) in tokens {
        c.reads.fetch_add(1, Ordering::AcqRel);
        let seen = m.engine.reservation(token).map(|(v, _)| v);
        match seen {
            Some(v) if agrees(h, &v, c.expiry) => {}
            // Released before the acknowledged deadline: an early expiry, or a missed
            // acknowledged EXTEND.
            Some(v) if h.fate == Fate::Held && v.state == ReservationState::Released => {
                stale.push(format!(
                    "{who}: read on n{}: {token} acknowledged held until {:?}, read \
                     released at {} (deadline {})",
                    m.id, h.deadline, v.finished_at_ms, v.expires_at_ms
                ))
            }
            _ => {
                let fate = h.fate;
                let seen = seen.map(|v| v.state);
                stale.push(format!(
                    "{who}: stale read on n{}: {token} acknowledged {fate:?}, read {seen:?}",
                    m.id
                ));
            }
        }
    }
    stale
}

/// Right as member `id` continues, before it has handled anything held for it, clients
/// whose reads waited for it read every acknowledged hold there, if it takes writes: a
/// leader stopped for longer than its lease still leads in its own view, and only the
/// lease keeps it from answering from a state the group has passed meanwhile.
pub(crate) fn read_after_resume(c: &Cluster, id: NodeId) {
    let tokens: Vec<(String, Hold)> = c
        .acked
        .lock()
        .iter()
        .map(|(t, h)| (t.clone(), h.clone()))
        .collect();
    let who = format!("resume@n{id}");
    let (leads, writable, stale) = match c.live.lock().get(&id) {
        Some(m) => {
            let r = m.raft.metrics().borrow().clone();
            let leads = r.state == openraft::ServerState::Leader && r.current_leader == Some(id);
            let stale = if m.writable() {
                Some(read_on(c, m, &tokens, &who))
            } else {
                None
            };
            (leads, stale.is_some(), stale.unwrap_or_default())
        }
        None => (false, false, Vec::new()),
    };
    c.env.history.note(format!(
        "n{id} continues; leads in its view: {leads}, takes writes: {writable}, {} reads",
        if writable { tokens.len() } else { 0 }
    ));
    for s in stale {
        c.fail(s);
    }
}

/// Whether hold `v` (as a member has it) shows what acknowledged replies said of it
/// (`h`), or what may have followed: an acknowledged COMMIT or RELEASE stays so; a hold
/// acknowledged held with nothing in doubt is still held with its acknowledged deadline
/// (RESERVE's or the last EXTEND's), or (with `expiry`) expired, released no earlier
/// than that deadline by the clock of the engine that expired it (`finished_at_ms`,
/// which the log carries to every member). With a RELEASE or COMMIT in doubt any state
/// is right. Nothing but expiry releases a hold the client did not RELEASE.
fn agrees(h: &Hold, v: &ReservationView, expiry: bool) -> bool {
    use ReservationState as S;
    match (h.fate, v.state) {
        (Fate::Released, S::Released) | (Fate::Committed, S::Committed) => true,
        (Fate::Held, _) if h.in_doubt => true,
        (Fate::Held, S::Reserved) => h.deadline.is_none_or(|d| v.expires_at_ms == d),
        (Fate::Held, S::Released) => expiry && h.deadline.is_none_or(|d| v.finished_at_ms >= d),
        _ => false,
    }
}

/// One RESERVE; the LSN and hold to wait for when it took units.
fn reserve(c: &Cluster, engine: &Engine, rng: &mut StdRng, who: &str) -> Option<(u64, Done)> {
    let sku = SALES[rng.gen_range(0..SALES.len())].0;
    let user = format!("u{}", rng.gen_range(0..30));
    let qty = rng.gen_range(1..=3u32);
    match c.client(engine).reserve(sku, &user, who, qty) {
        (
            Reserved::Hold {
                token,
                expires_at_ms,
            },
            lsn,
        ) => {
            if c.retries {
                let r = retries::Request::new(sku, &user, qty, &token);
                c.requests.lock().insert(who.to_owned(), r);
            }
            Some((
                lsn,
                Done::Reserved(token, sku.to_owned(), qty, expires_at_ms),
            ))
        }
        (Reserved::Replay { token, .. }, _) => {
            c.fail(format!("{who}: a new request id answered REPLAY {token}"));
            None
        }
        (Reserved::Unreserved(o), _) => {
            note_unreserved(c, &format!("{who} {sku}x{qty}"), &o);
            None
        }
        (Reserved::Refused(e), _) => {
            c.env.history.note(format!("{who} {sku}x{qty}: {e}"));
            None
        }
    }
}

/// RELEASE or COMMIT of `token`; the hold is in doubt until the reply.
fn finish(c: &Cluster, engine: &Engine, token: &str, fate: Fate, who: &str) -> Option<(u64, Done)> {
    if fate == Fate::Released {
        c.release_sent.lock().insert(token.to_owned());
    }
    match c.client(engine).finish(token, fate) {
        Ok(lsn) => {
            if let Some(h) = c.acked.lock().get_mut(token) {
                h.in_doubt = true;
            }
            Some((lsn, Done::Finished(token.to_owned(), fate)))
        }
        Err(other) => {
            c.env
                .history
                .note(format!("{who} {fate:?} {token}: {other}"));
            // Refused: it expired (a late COMMIT, a RELEASE of what expiry released).
            if c.expiry {
                if let Some(h) = c.acked.lock().get_mut(token) {
                    h.refused = true;
                }
            }
            None
        }
    }
}

/// EXTEND of `token` by a drawn while (short or long), one at a time per hold; its
/// deadline is unknown until the reply. Refused once the hold expired (a normal outcome,
/// in the history).
fn extend(
    c: &Cluster,
    engine: &Engine,
    rng: &mut StdRng,
    token: &str,
    who: &str,
) -> Option<(u64, Done)> {
    let ms = if rng.gen_bool(0.5) {
        rng.gen_range(200..5_000)
    } else {
        rng.gen_range(10_000..600_000)
    };
    if c.acked.lock().get(token).is_none_or(|h| h.extending) {
        return None;
    }
    match c.client(engine).extend(token, ms) {
        Ok((at, lsn)) => {
            if let Some(h) = c.acked.lock().get_mut(token) {
                (h.extending, h.deadline) = (true, None);
            }
            Some((lsn, Done::Extended(token.to_owned(), at)))
        }
        Err(e) => {
            c.env
                .history
                .note(format!("{who} Extend {token} by {ms} ms: {}", e.text));
            if e.gone {
                if let Some(h) = c.acked.lock().get_mut(token) {
                    h.refused = true;
                }
            }
            None
        }
    }
}

/// A reply waiting for the group's commit.
struct Pending {
    lsn: u64,
    what: Done,
    who: String,
    deadline: Instant,
}

/// One member process's replies, in LSN order, released by one task as the commit
/// point passes them. One waiter per member, not one per reply as the server has:
/// tokio spreads a watch channel's waiters over its notifiers by an unseeded random
/// draw, so many waiters on one commit point would wake in an order no seed fixes.
pub(crate) struct Replies {
    /// The member whose process this is.
    id: NodeId,
    queue: Mutex<VecDeque<Pending>>,
    wake: Notify,
    /// The process died while stopped: what it held back is never sent.
    gone: AtomicBool,
}

impl Replies {
    fn push(&self, p: Pending) {
        self.queue.lock().push_back(p);
        self.wake.notify_one();
    }

    /// Releases the replies of `spec` (one member process) until it stops.
    async fn run(self: Arc<Self>, c: Arc<Cluster>, spec: Arc<Speculation>) {
        loop {
            let front = self.queue.lock().front().map(|p| (p.lsn, p.deadline));
            let Some((lsn, deadline)) = front else {
                self.wake.notified().await;
                continue;
            };
            let r = tokio::time::timeout_at(deadline, spec.wait(lsn)).await;
            let done: Vec<Pending> = {
                let mut q = self.queue.lock();
                match &r {
                    Ok(Ok(())) => {
                        let upto = spec.committed_lsn();
                        let n = q.iter().take_while(|p| p.lsn <= upto).count();
                        q.drain(..n).collect()
                    }
                    Ok(Err(_)) => q.drain(..).collect(),
                    Err(_) => q.pop_front().into_iter().collect(),
                }
            };
            let mut outcome = r
                .map_err(|_| "timed out".to_owned())
                .and_then(|x| x.map_err(|e| e.to_string()));
            // A stopped process answers once it continues.
            if c.env.net.is_paused(self.id) {
                c.env.net.resumed(self.id).await;
                if self.gone.load(Ordering::Acquire) {
                    outcome = Err("the process died stopped".into());
                }
            }
            for p in done {
                reply(&c, p, outcome.clone());
            }
        }
    }
}

/// One reply, sent once the group committed the command's records (or never).
fn reply(c: &Cluster, p: Pending, r: Result<(), String>) {
    let who = p.who;
    match (r, p.what) {
        (Ok(()), Done::Reserved(token, sku, qty, deadline)) => {
            if !ack_reserve(c, &who, &token, sku, qty, deadline) {
                c.fail(format!("token {token} handed out twice"));
            }
        }
        (Ok(()), Done::Finished(token, fate)) => {
            c.env.history.note(format!("{who} {fate:?} acked {token}"));
            if let Some(h) = c.acked.lock().get_mut(&token) {
                (h.fate, h.in_doubt) = (fate, false);
            }
            *c.newest.lock() = Some(token);
        }
        (Ok(()), Done::Extended(token, at)) => {
            c.env
                .history
                .note(format!("{who} Extend acked {token}, until {at}"));
            if let Some(h) = c.acked.lock().get_mut(&token) {
                (h.extending, h.deadline) = (false, Some(at));
            }
            *c.newest.lock() = Some(token);
        }
        (Ok(()), Done::Retried(_, token, sku, qty, deadline)) => {
            // A replay's token may have been acknowledged to an earlier retry.
            ack_reserve(c, &who, &token, sku, qty, deadline);
        }
        (r, Done::Feed(done)) => feed::reply(c, &who, done, r),
        (Err(e), what) => {
            c.env.history.note(format!("{who} unanswered: {e}"));
            match &what {
                Done::Reserved(..) if c.retries => retries::unanswered(c, &who),
                Done::Retried(request_id, ..) => retries::unanswered(c, request_id),
                _ => {}
            }
            // An EXTEND that may or may not have happened: its deadline stays unknown.
            if let Done::Extended(token, _) = what {
                if let Some(h) = c.acked.lock().get_mut(&token) {
                    h.extending = false;
                }
            }
        }
    }
    c.waiting.fetch_sub(1, Ordering::AcqRel);
}

/// An acknowledged RESERVE of `token`, held until `deadline`: in the history, the newest
/// acknowledged, and among the acknowledged holds unless it was already (false then).
fn ack_reserve(
    c: &Cluster,
    who: &str,
    token: &str,
    sku: String,
    qty: u32,
    deadline: Millis,
) -> bool {
    c.env
        .history
        .note(format!("{who} {sku}x{qty} acked {token}"));
    *c.newest.lock() = Some(token.to_owned());
    let mut acked = c.acked.lock();
    if acked.contains_key(token) {
        return false;
    }
    let h = Hold {
        sku,
        qty,
        fate: Fate::Held,
        in_doubt: false,
        deadline: Some(deadline),
        extending: false,
        refused: false,
    };
    acked.insert(token.to_owned(), h);
    true
}

/// A RESERVE that took nothing (sold out, over a limit), in the history as `what: outcome`.
fn note_unreserved(c: &Cluster, what: &str, outcome: &str) {
    let o: String = outcome.chars().take(40).collect();
    c.env.history.note(format!("{what}: {o}"));
}

/// Seeded faults, one every few hundred milliseconds; safety checked after each.
async fn chaos(c: &Arc<Cluster>, rng: &mut StdRng, s: &Settings) {
    let all = c.ids.clone();
    // The kinds of `Settings::net_faults` come after the older ones, and those of
    // `Settings::pause_and_membership` after them, so that without them the draws are
    // what they were.
    let kinds = match (s.net_faults, s.pause_and_membership) {
        (false, _) => 10,
        (true, false) => 13,
        (true, true) => 17,
    };
    let kinds = kinds + u32::from(s.bit_flips) + u32::from(s.damage);
    for _ in 0..s.steps {
        let next = Instant::now() + Duration::from_millis(rng.gen_range(100..1500));
        // A deposed member restarts soon after, as a server re-executes at once.
        while Instant::now() < next {
            sleep(Duration::from_millis(50).min(next - Instant::now())).await;
            c.restart_deposed().await;
        }
        let h = &c.env.history;
        let kind = rng.gen_range(0..kinds);
        // `Settings::damage`'s kind is the last, `Settings::bit_flips`'s the one before
        // it, whichever others are on.
        if s.damage && kind + 1 == kinds {
            damage::damage(c, rng).await;
            check_units(c);
            continue;
        }
        if s.bit_flips && kind + 1 + u32::from(s.damage) == kinds {
            bit_flip::bit_flip(c, rng).await;
            check_units(c);
            continue;
        }
        match kind {
            0 | 1 => partition(c, rng, s.net_faults),
            2 => {
                c.env.net.heal();
                h.note("heal");
            }
            3 => {
                let (d, l) = (rng.gen_range(0..30), rng.gen_range(0..120));
                c.env.net.set_quality(d, l);
                h.note(format!("links: {d}% lost, up to {l} ms late"));
            }
            4 | 5 => {
                let id = rng.gen_range(1..=all.len() as u64);
                if rng.gen_bool(0.5) {
                    c.crash(id, "power loss", End::PowerLoss).await;
                } else {
                    c.crash(id, "kill -9", End::Kill).await;
                }
            }
            9 => arm_storage_error(c, rng),
            8 if c.may_lose_a_disk() => {
                let id = rng.gen_range(1..=all.len() as u64);
                wipe(c, id).await;
            }
            10 | 11 => flap(c, rng),
            12 => {
                let (pct, late) = (rng.gen_range(0..40), rng.gen_range(0..2000));
                c.env.net.set_duplicates(pct, late);
                h.note(format!(
                    "requests: {pct}% delivered twice, up to {late} ms apart"
                ));
            }
            13 | 14 => pause_and_membership::pause(c, rng),
            15 | 16 => pause_and_membership::reconfigure(c, rng),
            _ => {
                for id in c.down() {
                    c.start(id).await;
                }
            }
        }
        // A draw of its own, after the step's, so that without `Settings::expiry` the
        // draws are what they were.
        if s.expiry && rng.gen_range(0..5) == 0 {
            jump_clock(c, rng);
        }
        check_units(c);
    }
}

/// A member's wall clock steps forward or back (an NTP step, an operator's `date`), by
/// up to 5 s or up to 5 min. Its engine sees it through its `Monotonic` clock: forward
/// at once, backwards not until the wall passes what it read before, unless the process
/// restarts meanwhile (a new process reads the wall afresh).
fn jump_clock(c: &Cluster, rng: &mut StdRng) {
    let id = rng.gen_range(1..=c.ids.len() as u64);
    let ms: i64 = if rng.gen_bool(0.5) {
        rng.gen_range(50..5_000)
    } else {
        rng.gen_range(5_000..300_000)
    };
    let step = if rng.gen_bool(0.5) { -ms } else { ms };
    let now = c.offsets[&id].fetch_add(step, Ordering::AcqRel) + step;
    c.env.history.note(format!(
        "n{id} clock steps {step:+} ms (now {now:+} ms off)"
    ));
}

/// A minority cut off from the rest: both ways, or (with `one_way`, by the seed) only
/// what it sends, or only what it receives.
fn partition(c: &Cluster, rng: &mut StdRng, one_way: bool) {
    let all = &c.ids;
    let k = rng.gen_range(1..=(all.len() / 2).max(1));
    let mut side = BTreeSet::new();
    while side.len() < k {
        side.insert(rng.gen_range(1..=all.len() as u64));
    }
    let net = &c.env.net;
    let h = &c.env.history;
    match if one_way { rng.gen_range(0..3) } else { 0 } {
        0 => {
            net.partition(&side, all);
            h.note(format!("partition {side:?} from the rest"));
        }
        1 => {
            net.partition_one_way(&side, all);
            h.note(format!("partition one way: {side:?} not heard by the rest"));
        }
        _ => {
            let rest: BTreeSet<NodeId> = all.difference(&side).copied().collect();
            net.partition_one_way(&rest, all);
            h.note(format!("partition one way: {side:?} hears nobody"));
        }
    }
}

/// One link (one direction or both) cut and healed in turn, on a period drawn by the
/// seed, for a few seconds.
fn flap(c: &Cluster, rng: &mut StdRng) {
    let n = c.ids.len() as u64;
    let a = rng.gen_range(1..=n);
    let b = (a - 1 + rng.gen_range(1..n.max(2))) % n + 1;
    let both = rng.gen_bool(0.5);
    let down = Duration::from_millis(rng.gen_range(20..400));
    let up = Duration::from_millis(rng.gen_range(20..400));
    let start = Instant::now();
    let until = start + Duration::from_millis(rng.gen_range(1000..6000));
    let mut links = vec![(a, b)];
    if both {
        links.push((b, a));
    }
    for link in links {
        c.env.net.flap(Flap {
            link,
            start,
            down,
            up,
            until,
        });
    }
    c.env.history.note(format!(
        "link n{a} {} n{b} flaps: {} ms down, {} ms up, for {} ms",
        if both { "<->" } else { "->" },
        down.as_millis(),
        up.as_millis(),
        (until - start).as_millis()
    ));
}

/// The next write or sync of one log of a live member fails (`ENOSPC`, `EIO`): the
/// member exits on it and restarts from what its disk kept (`Cluster::restart_deposed`).
fn arm_storage_error(c: &Cluster, rng: &mut StdRng) {
    let id = rng.gen_range(1..=c.ids.len() as u64);
    let a = Armed {
        log: if rng.gen_bool(0.5) {
            Log::Wal
        } else {
            Log::Raft
        },
        op: if rng.gen_bool(0.5) {
            Op::Write
        } else {
            Op::Sync
        },
        errno: if rng.gen_bool(0.5) { 28 } else { 5 },
    };
    if let Some(m) = c.live.lock().get(&id) {
        m.hook.arm(a);
        c.env.history.note(format!("n{id} disk: next {a:?}"));
    }
}

/// Member `id` loses its disk: crashed, its data dir removed, started on new storage
/// (a new incarnation), which the group refuses until re-admitted (`readmit`).
pub(super) async fn wipe(c: &Arc<Cluster>, id: NodeId) {
    c.crash(id, "wiped", End::Kill).await;
    remove_dir(&c.env.dir(id));
    c.disks.lock().insert(id, Disk::new(id, c.env.dir(id)));
    let fresh = c.origins.lock().gen::<u64>();
    c.incarnations.lock().insert(id, fresh);
    c.env
        .history
        .note(format!("n{id} data dir wiped, storage {fresh:016x}"));
    c.start(id).await;
    c.readmitting.store(true, Ordering::Release);
    tokio::spawn(readmit(c.clone(), id));
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        panic!("the harness cannot remove {}: {e}", dir.display());
    }
}

/// `RAFT.READMIT id` on whoever leads, retried until it succeeds: out of the membership,
/// back as a learner under the new storage, caught up, a voter again (`RaftNode::readmit`).
async fn readmit(c: Arc<Cluster>, id: NodeId) {
    loop {
        sleep(Duration::from_millis(200)).await;
        let Some((leader, raft)) = c.leader_raft() else {
            continue;
        };
        // Done already (an earlier try's last step committed, its reply lost).
        let fresh = c.incarnations.lock()[&id];
        if admitted(&raft, id, fresh) {
            c.env
                .history
                .note(format!("n{id} re-admitted (seen on n{leader})"));
            c.readmitting.store(false, Ordering::Release);
            return;
        }
        let named = names(&raft, id, fresh);
        if leader == id && !named {
            continue;
        }
        let r = tokio::time::timeout(Duration::from_secs(10), readmit_on(&c, &raft, id, named));
        let r = r.await;
        match r {
            Ok(Ok(())) => {
                c.env
                    .history
                    .note(format!("n{id} re-admitted by n{leader}"));
                c.readmitting.store(false, Ordering::Release);
                return;
            }
            Ok(Err(e)) => c
                .env
                .history
                .note(format!("readmit n{id} on n{leader}: {e}")),
            Err(_) => c
                .env
                .history
                .note(format!("readmit n{id} on n{leader}: timed out")),
        }
    }
}

/// The steps of `RAFT.READMIT`; when the membership already `named` the new storage a
/// voter (a try cut short in its joint configuration, which openraft 0.9 does not end by
/// itself under a new leader), only the last: the voters again, uniform.
async fn readmit_on(c: &Cluster, raft: &Raft, id: NodeId, named: bool) -> Result<(), String> {
    if named {
        return raft
            .change_membership(voters(raft), false)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
    }
    let info = NodeInfo {
        raft_addr: format!("n{id}"),
        client_addr: format!("n{id}"),
        incarnation: c.incarnations.lock()[&id],
    };
    let mut voters = voters(raft);
    if voters.remove(&id) {
        raft.change_membership(voters.clone(), false)
            .await
            .map_err(|e| e.to_string())?;
    }
    // Not `blocking`: openraft waits for the catch-up in a `select!` without `biased`.
    raft.add_learner(id, info, false)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let m = raft.metrics().borrow().clone();
        let behind = m.replication.as_ref().and_then(|r| r.get(&id).copied());
        if behind.flatten().map(|l| l.index) == m.last_log_index {
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    voters.insert(id);
    raft.change_membership(voters, false)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Whether `raft`'s membership lists `id` as a voter under storage `incarnation`, and
/// is applied (so committed) and not joint. Seen earlier, a second wipe could hit the
/// old half of a joint configuration not yet committed, which needs the wiped member
/// to decide anything: two lost disks at once, outside the fault model.
fn admitted(raft: &Raft, id: NodeId, incarnation: u64) -> bool {
    let m = raft.metrics().borrow().clone();
    let uniform = m.membership_config.membership().get_joint_config().len() == 1;
    let applied = m.membership_config.log_id().as_ref() <= m.last_applied.as_ref();
    uniform && applied && names(raft, id, incarnation)
}

/// Whether `raft`'s membership (joint or not, committed or not) names `id` a voter on
/// storage `incarnation`.
fn names(raft: &Raft, id: NodeId, incarnation: u64) -> bool {
    let m = raft.metrics().borrow().clone();
    let ms = m.membership_config.membership();
    ms.voter_ids().any(|v| v == id)
        && ms
            .get_node(&id)
            .is_some_and(|n| n.incarnation == incarnation)
}

fn voters(raft: &Raft) -> BTreeSet<NodeId> {
    authority::voters(&raft.metrics().borrow())
}

/// Links healed and clean, every member up: a leader must come within `ELECT_WITHIN`.
async fn heal(c: &Arc<Cluster>) {
    c.env.net.heal();
    c.env.net.set_quality(0, 5);
    c.env.net.set_duplicates(0, 0);
    c.env.history.note("heal all, every member up");
    pause_and_membership::resume_all(c);
    for id in c.down() {
        c.start(id).await;
    }
    match await_writer(c, ELECT_WITHIN).await {
        Some(id) => c
            .env
            .history
            .note(format!("n{id} takes writes after healing")),
        None => {
            c.env.history.note(c.raft_states());
            c.fail("no leader within 10 s of healing".into());
        }
    }
    pause_and_membership::rejoin(c).await;
}

/// Waits for every reply, then for every member to apply the whole log.
async fn settle(c: &Arc<Cluster>) {
    let until = Instant::now() + QUIESCE_WITHIN;
    while c.waiting.load(Ordering::Acquire) > 0 && Instant::now() < until {
        sleep(Duration::from_millis(50)).await;
    }
    while Instant::now() < until {
        c.restart_deposed().await;
        if quiet(c) {
            c.env.history.note("quiescent");
            return;
        }
        sleep(Duration::from_millis(50)).await;
    }
    c.fail("members never reached the same applied log within 30 s".into());
}

/// Every member up, one writer, every member applied up to the writer's last entry.
fn quiet(c: &Cluster) -> bool {
    if c.readmitting.load(Ordering::Acquire) {
        return false;
    }
    let live = c.live.lock();
    if live.len() != c.ids.len() {
        return false;
    }
    let Some(w) = live.values().find(|m| m.writable()) else {
        return false;
    };
    let last = w.raft.metrics().borrow().last_log_index;
    live.values().all(|m| {
        let mm = m.raft.metrics().borrow().clone();
        mm.last_applied.map(|l| l.index) == last && m.spec.in_flight() == 0
    })
}

/// Units handed out never exceed the total, on any member; each member's counters are
/// its holds' states, and none of its holds expired early (`check_holds`).
fn check_units(c: &Cluster) {
    let mut bad = Vec::new();
    let sent = c.release_sent.lock().clone();
    let live = c.live.lock();
    bad.extend(log_matching::differing_entries(
        live.values().map(|m| (m.id, &m.store)),
    ));
    for m in live.values() {
        bad.extend(check_holds(m, &sent));
        for (sku, _) in SALES {
            let Ok(v) = m.engine.sale_info(sku) else {
                continue;
            };
            if v.reserved + v.committed > v.total || v.available < 0 {
                bad.push(format!(
                    "n{}: {sku} hands out more than it has: {v:?}",
                    m.id
                ));
            }
        }
    }
    drop(live);
    for b in bad {
        c.fail(b);
    }
}

/// Member `m`'s counters against its holds, per sale: held is the units of its RESERVED
/// holds, sold those of its COMMITTED ones, and available + held + sold = total. And no
/// hold the client never sent a RELEASE for (so released by expiry, `auto_release`) was
/// released before its deadline by the clock of the engine that expired it:
/// `finished_at_ms` is that engine's reading, which the log carries to every member, and
/// the wheel fires a hold only once that reading reached its deadline, so an earlier one
/// means the engine's time went back or expiry ignored the deadline.
fn check_holds(m: &Member, sent: &BTreeSet<String>) -> Vec<String> {
    let (snap, ()) = m.engine.snapshot_with(|| ());
    let mut units: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut bad = Vec::new();
    for r in &snap.reservations {
        let u = units.entry(r.sku.as_str()).or_default();
        match r.state {
            ReservationState::Reserved => u.0 += u64::from(r.qty),
            ReservationState::Committed => u.1 += u64::from(r.qty),
            ReservationState::Released => {
                if !sent.contains(&r.token) && r.finished_at_ms < r.expires_at_ms {
                    bad.push(format!(
                        "n{}: {} expired early: deadline {}, released at {}",
                        m.id, r.token, r.expires_at_ms, r.finished_at_ms
                    ));
                }
            }
        }
    }
    for v in &snap.sales {
        let (held, sold) = units.get(v.sku.as_str()).copied().unwrap_or_default();
        let sum = v.available + (held + sold) as i64;
        if v.reserved != held || v.committed != sold || sum != v.total as i64 {
            bad.push(format!(
                "n{}: {} counters (available {}, reserved {}, committed {}, total {}) \
                 disagree with its holds (held {held}, sold {sold})",
                m.id, v.sku, v.available, v.reserved, v.committed, v.total
            ));
        }
    }
    bad
}

/// A member's state as the comparison sees it.
fn summary(m: &Member) -> String {
    let mut s = format!(
        "lsn {} holds {}",
        m.dur.wal.last_lsn(),
        m.engine.reservation_count()
    );
    for (sku, _) in SALES {
        match m.engine.sale_info(sku) {
            Ok(v) => {
                s += &format!(
                    " {sku}:total {} avail {} reserved {} committed {}",
                    v.total, v.available, v.reserved, v.committed
                )
            }
            Err(e) => s += &format!(" {sku}:{e}"),
        }
    }
    s
}

/// At quiescence: members equal, every acknowledged hold on every member in the state
/// its acknowledged replies say, units within the totals.
fn check_final(c: &Cluster) {
    check_units(c);
    let acked = c.acked.lock().clone();
    let mut seen = BTreeSet::new();
    let mut bad = Vec::new();
    for m in c.live.lock().values() {
        let s = summary(m);
        c.env.history.note(format!("n{} final: {s}", m.id));
        seen.insert(s);
        let wrong = acked
            .iter()
            .filter(|(t, h)| !hold_agrees(m, t, h, c.expiry))
            .count();
        if wrong > 0 {
            bad.push(format!(
                "n{}: {wrong} acknowledged hold(s) missing or in the wrong state",
                m.id
            ));
        }
    }
    if seen.len() > 1 {
        bad.push(format!("members differ at quiescence: {seen:?}"));
    }
    bad.extend(snapshots::differing_states(&c.live.lock()));
    if c.feed {
        feed_checks::check_final(c);
    }
    // A hold acknowledged held may have expired since and its units gone to another
    // buyer: with expiry only sold units add up here (the counters against the holds,
    // `check_holds`, cover the rest).
    let mut held: BTreeMap<&str, u64> = BTreeMap::new();
    let counts = |h: &&Hold| match h.fate {
        Fate::Held => !c.expiry,
        Fate::Committed => true,
        Fate::Released => false,
    };
    for h in acked.values().filter(|h| !h.in_doubt).filter(counts) {
        *held.entry(h.sku.as_str()).or_default() += u64::from(h.qty);
    }
    for (sku, total) in SALES {
        let got = held.get(sku).copied().unwrap_or(0);
        if got > total {
            bad.push(format!("{sku}: {got} units acknowledged held of {total}"));
        }
    }
    for b in bad {
        c.fail(b);
    }
    c.env.history.note(format!(
        "{} holds acknowledged, units held: {held:?}",
        acked.len()
    ));
    if c.expiry {
        note_expired(c);
    }
}

/// How many holds expired (released with no RELEASE sent), as the first member has them.
fn note_expired(c: &Cluster) {
    let sent = c.release_sent.lock().clone();
    let live = c.live.lock();
    let Some(m) = live.values().next() else {
        return;
    };
    let (snap, ()) = m.engine.snapshot_with(|| ());
    let expired = snap
        .reservations
        .iter()
        .filter(|r| r.state == ReservationState::Released && !sent.contains(&r.token))
        .count();
    c.env.history.note(format!("{expired} holds expired"));
}

/// Whether member `m` holds `token` as its acknowledged replies say (`agrees`).
fn hold_agrees(m: &Member, token: &str, h: &Hold, expiry: bool) -> bool {
    m.engine
        .reservation(token)
        .is_some_and(|(v, _)| agrees(h, &v, expiry))
}
