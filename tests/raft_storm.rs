//! The storm: three real members, a dozen checkout clients reserving, committing and
//! releasing against whoever leads (found through the Sentinel interface), while the
//! leader is `kill -9`ed twelve times and partitioned from one or both followers six
//! times, at seeded-random moments (an ignored variant adds leader pauses and
//! whole-group `kill -9`s). Every invocation and completion is recorded into a
//! history file; at the end the final state of every token and the sale's counters are
//! read from the final leader, appended, and the history is judged by
//! `stockgate_client::history::check` and by the `stockgate-history-check` binary.
//!
//! Replay a run: `STORM_SEED=<seed printed by the run> cargo test --test raft_storm`.
//! Keep its history: `STORM_HISTORY_OUT=/some/file.jsonl` (a failing run keeps it anyway).
//! The nemesis schedule follows the seed; the clients' interleaving follows the machine.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_client::history::{self, OpKind, Outcome, Record, Recorder, ViolationKind};
use stockgate_client::types::{CommitOk, ReserveOutcome};
use stockgate_client::{ClientConfig, ClientError, SentinelConfig, StockgateClient};
use stockgate_server::engine::Keyring;

use common::raft::*;
use common::{now_ms, TempDir};

const SKU: &str = "STORM";
const TOTAL: i64 = 300;
const CLIENTS: u64 = 12;
/// Clients 1..=SENTINEL_CLIENTS use `StockgateClient::connect_sentinel`.
const SENTINEL_CLIENTS: u64 = 4;
const KILLS: usize = 12;
const PARTITIONS: usize = 6;
const PAUSES: usize = 3;
const CRASHES: usize = 2;

/// The history checker binary next to this test's executable.
fn checker_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join("stockgate-history-check");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        bin.display()
    );
    bin
}

/// What a client sends; each is one operation of the history.
enum Req<'a> {
    Reserve {
        user: &'a str,
        req: &'a str,
        adm: &'a str,
    },
    Commit(&'a str),
    Release(&'a str),
    Read(&'a str),
}

impl Req<'_> {
    fn kind(&self) -> OpKind {
        match self {
            Req::Reserve { .. } => OpKind::Reserve,
            Req::Commit(_) => OpKind::Commit,
            Req::Release(_) => OpKind::Release,
            Req::Read(_) => OpKind::Read,
        }
    }
}

/// How an operation ended: `(result, reply, token)` as the history records them.
type Answered = (Outcome, String, Option<String>);

/// The way a client reaches whoever leads.
trait Transport: Send {
    /// Whether a leader is at hand (only a command actually sent is recorded).
    fn ready(&mut self) -> bool;
    fn exec(&mut self, r: &Req) -> Answered;
}

/// The test's own discovery (`SENTINEL get-master-addr-by-name`, `ROLE`) and a plain
/// connection, dropped after any error so the next command goes to whoever leads then.
struct Direct {
    ports: Vec<u16>,
    conn: Option<redis::Connection>,
}

impl Direct {
    fn connection(&mut self) -> Option<&mut redis::Connection> {
        if self.conn.is_none() {
            let port = discover(&self.ports, Duration::from_secs(1))?;
            let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .ok()?;
            // Longer than a partition is held (1.5 s) plus a deposed leader's restart: a
            // write stuck on an isolated leader ends with its connection, not the timeout.
            c.set_read_timeout(Some(Duration::from_secs(4))).ok()?;
            c.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
            self.conn = Some(c);
        }
        self.conn.as_mut()
    }
}

impl Transport for Direct {
    fn ready(&mut self) -> bool {
        self.connection().is_some()
    }

    fn exec(&mut self, r: &Req) -> Answered {
        let mut cmd = match r {
            Req::Reserve { .. } => redis::cmd("RESERVE"),
            Req::Commit(_) => redis::cmd("COMMIT"),
            Req::Release(_) => redis::cmd("RELEASE"),
            Req::Read(_) => redis::cmd("RESERVATION"),
        };
        match r {
            Req::Reserve { user, req, adm } => cmd.arg(SKU).arg(*user).arg(*adm).arg(*req),
            Req::Commit(t) | Req::Release(t) | Req::Read(t) => cmd.arg(*t),
        };
        let Some(c) = self.connection() else {
            return (Outcome::Unknown, "no leader found".into(), None);
        };
        let v: redis::Value = match cmd.query(c) {
            Ok(v) => v,
            Err(e) => {
                self.conn = None;
                let io = e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal();
                return match e.code() {
                    // An error reply: the server refused before running it.
                    Some(code) if !io => (
                        Outcome::Fail,
                        format!("{code} {}", e.detail().unwrap_or("")),
                        None,
                    ),
                    _ => (Outcome::Unknown, e.to_string(), None),
                };
            }
        };
        match (r, &v) {
            (Req::Reserve { .. }, redis::Value::Array(items)) if !items.is_empty() => {
                let word = common::as_str(&items[0]);
                if (word == "RESERVED" || word == "REPLAY") && items.len() >= 2 {
                    (Outcome::Ok, word, Some(common::as_str(&items[1])))
                } else {
                    (Outcome::Fail, word, None)
                }
            }
            (Req::Commit(_) | Req::Release(_), redis::Value::Int(i)) => {
                (Outcome::Ok, i.to_string(), None)
            }
            (Req::Read(_), redis::Value::Nil) => (Outcome::Ok, "nil".into(), None),
            (Req::Read(_), v) => match common::field(v, "state") {
                Some(s) => (Outcome::Ok, common::as_str(&s), None),
                None => (Outcome::Unknown, format!("unexpected {v:?}"), None),
            },
            (_, other) => (Outcome::Unknown, format!("unexpected {other:?}"), None),
        }
    }
}

/// The client crate's Sentinel-aware connection, the members listed as its sentinels:
/// it discovers the leader, and rediscovers and retries on its own.
struct ViaSentinel {
    rt: tokio::runtime::Runtime,
    cfg: SentinelConfig,
    client: Option<StockgateClient>,
}

impl ViaSentinel {
    fn new(ports: &[u16]) -> ViaSentinel {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let sentinels = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        ViaSentinel {
            rt,
            cfg: SentinelConfig::new(sentinels, "stockgate"),
            client: None,
        }
    }

    /// After the crate's own retries, only an answer about the token itself is certain;
    /// anything else may follow an attempt whose reply was lost.
    fn failed(e: &ClientError) -> Answered {
        let word = match e {
            ClientError::Released => return (Outcome::Fail, "RELEASED".into(), None),
            ClientError::NoReservation => return (Outcome::Fail, "NORES".into(), None),
            ClientError::Expired => return (Outcome::Fail, "EXPIRED".into(), None),
            ClientError::Server { code, .. } => code.clone(),
            ClientError::Connection(_) => "CONNECTION".into(),
            ClientError::ReadOnly => "READONLY".into(),
            ClientError::NoPrimary { .. } => "NOPRIMARY".into(),
            _ => "OTHER".into(),
        };
        // The word first: the checker's report counts replies by it.
        (Outcome::Unknown, format!("{word} (client crate) {e}"), None)
    }
}

impl Transport for ViaSentinel {
    fn ready(&mut self) -> bool {
        if self.client.is_none() {
            let ccfg = ClientConfig {
                connect_timeout: Duration::from_millis(500),
                response_timeout: Duration::from_secs(4),
                reconnect_retries: 0,
            };
            self.client = self
                .rt
                .block_on(StockgateClient::connect_sentinel_with(
                    self.cfg.clone(),
                    ccfg,
                ))
                .ok();
        }
        self.client.is_some()
    }

    fn exec(&mut self, r: &Req) -> Answered {
        let Some(c) = self.client.clone() else {
            return (Outcome::Unknown, "not connected".into(), None);
        };
        match r {
            Req::Reserve { user, req, adm } => {
                match self.rt.block_on(c.reserve(SKU, user, adm, req, 1)) {
                    Ok(ReserveOutcome::Reserved { token, .. }) => {
                        (Outcome::Ok, "RESERVED".into(), Some(token))
                    }
                    Ok(ReserveOutcome::Replay { token, .. }) => {
                        (Outcome::Ok, "REPLAY".into(), Some(token))
                    }
                    Ok(ReserveOutcome::SoldOut) => (Outcome::Fail, "SOLDOUT".into(), None),
                    Ok(ReserveOutcome::Limit { .. }) => (Outcome::Fail, "LIMIT".into(), None),
                    Err(e) => Self::failed(&e),
                }
            }
            Req::Commit(t) => match self.rt.block_on(c.commit(t)) {
                Ok(CommitOk::Committed) => (Outcome::Ok, "1".into(), None),
                Ok(CommitOk::AlreadyCommitted) => (Outcome::Ok, "0".into(), None),
                Err(e) => Self::failed(&e),
            },
            Req::Release(t) => match self.rt.block_on(c.release(t)) {
                Ok(n) => (Outcome::Ok, if n { "1" } else { "0" }.into(), None),
                Err(e) => Self::failed(&e),
            },
            Req::Read(t) => match self.rt.block_on(c.reservation(t)) {
                Ok(None) => (Outcome::Ok, "nil".into(), None),
                Ok(Some(info)) => (Outcome::Ok, info.state.as_str().into(), None),
                Err(e) => Self::failed(&e),
            },
        }
    }
}

/// The end state a client expects of a token from the answers it got.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Reserved,
    Committed,
    Released,
    /// A COMMIT or RELEASE never got an answer before the client stopped.
    Either,
}

struct Client {
    process: u64,
    link: Box<dyn Transport>,
    rec: Arc<Recorder>,
    keyring: Keyring,
    rng: StdRng,
    stop: Arc<AtomicBool>,
    /// Past this, a retry loop gives up (the outcome stays unknown): set once the storm
    /// is over, so a client stuck on a group that never recovers still ends.
    give_up: Option<Instant>,
    /// Shared with the nemesis: when this client last got a definite answer.
    answers: Arc<Answers>,
}

/// Each client's last definite answer, in ms since `origin` (0: none yet), so the storm
/// can wait for every client to be answered again after its last fault.
struct Answers {
    origin: Instant,
    at_ms: Vec<AtomicU64>,
}

impl Answers {
    fn new(clients: u64) -> Answers {
        Answers {
            origin: Instant::now(),
            at_ms: (0..clients).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn record(&self, process: u64) {
        let ms = self.origin.elapsed().as_millis() as u64 + 1;
        if let Some(a) = self.at_ms.get((process - 1) as usize) {
            a.store(ms, Ordering::SeqCst);
        }
    }

    /// Whether every client was answered after `since`.
    fn all_after(&self, since: Instant) -> bool {
        let since_ms = since.duration_since(self.origin).as_millis() as u64 + 1;
        self.at_ms
            .iter()
            .all(|a| a.load(Ordering::SeqCst) > since_ms)
    }
}

#[derive(Default, Debug)]
struct Tally {
    reserves: u64,
    acked: u64,
    soldout: u64,
    retries: u64,
    lost: u64,
    /// Holds committed or released long after they were taken (across faults).
    late_finishes: u64,
    /// When this client last got a definite answer (an acknowledgement or SOLDOUT).
    last_answer: Option<Instant>,
}

impl Tally {
    fn add(&mut self, t: &Tally) {
        self.reserves += t.reserves;
        self.acked += t.acked;
        self.soldout += t.soldout;
        self.retries += t.retries;
        self.lost += t.lost;
        self.late_finishes += t.late_finishes;
        self.last_answer = self.last_answer.max(t.last_answer);
    }
}

impl Client {
    fn record(&self, r: Record) {
        self.rec.append(&r).expect("append to the history");
    }

    /// Sends `r`, recording its invocation and completion.
    fn op(&mut self, r: &Req) -> Answered {
        if !self.link.ready() {
            return (Outcome::Fail, "NOLEADER".into(), None);
        }
        let op_id = self.rec.next_op_id();
        let (user, req, token) = match r {
            Req::Reserve { user, req, .. } => (Some(*user), Some(*req), None),
            Req::Commit(t) | Req::Release(t) | Req::Read(t) => (None, None, Some(*t)),
        };
        self.record(Record::Invoke {
            op_id,
            process: self.process,
            op: r.kind(),
            sku: SKU.into(),
            user: user.map(Into::into),
            req: req.map(Into::into),
            token: token.map(Into::into),
            qty: 1,
            t_ms: now_ms(),
        });
        let (result, reply, tok) = self.link.exec(r);
        self.record(Record::Complete {
            op_id,
            process: self.process,
            result,
            reply: Some(reply.clone()),
            token: tok.clone(),
            t_ms: now_ms(),
        });
        (result, reply, tok)
    }

    fn retryable(result: Outcome, reply: &str) -> bool {
        result == Outcome::Unknown
            || reply.starts_with("READONLY")
            || reply.starts_with("LOADING")
            || reply.starts_with("NOLEADER")
    }

    fn gave_up(&mut self) -> bool {
        if self.give_up.is_none() && self.stop.load(Ordering::SeqCst) {
            self.give_up = Some(Instant::now() + Duration::from_secs(20));
        }
        self.give_up.is_some_and(|t| Instant::now() > t)
    }

    /// RESERVE until a definite answer: the token, or None (SOLDOUT, or given up).
    fn reserve(&mut self, user: &str, req: &str, t: &mut Tally) -> Option<String> {
        let adm = self.keyring.mint(SKU, user, now_ms() + 600_000);
        t.reserves += 1;
        loop {
            let (result, reply, tok) = self.op(&Req::Reserve {
                user,
                req,
                adm: &adm,
            });
            if result == Outcome::Ok {
                t.acked += 1;
                t.last_answer = Some(Instant::now());
                self.answers.record(self.process);
                return tok;
            }
            if reply == "SOLDOUT" {
                t.soldout += 1;
                t.last_answer = Some(Instant::now());
                self.answers.record(self.process);
                return None;
            }
            if !Self::retryable(result, &reply) {
                // Recorded; the checker judges it (LIMIT, DENIED... are not expected here).
                eprintln!("raft storm: RESERVE {user} {req}: unexpected answer {reply}");
                return None;
            }
            if result == Outcome::Unknown {
                t.lost += 1;
            }
            if self.gave_up() {
                return None;
            }
            t.retries += 1;
            std::thread::sleep(Duration::from_millis(self.rng.gen_range(10..60)));
        }
    }

    /// COMMIT or RELEASE until a definite answer; what the token should end as.
    fn finish(&mut self, commit: bool, tok: &str, t: &mut Tally) -> Expect {
        loop {
            let r = if commit {
                Req::Commit(tok)
            } else {
                Req::Release(tok)
            };
            let (result, reply, _) = self.op(&r);
            if result == Outcome::Ok {
                t.last_answer = Some(Instant::now());
                self.answers.record(self.process);
                return if commit {
                    Expect::Committed
                } else {
                    Expect::Released
                };
            }
            if !Self::retryable(result, &reply) {
                // Recorded (NORES would be a lost write); the checker judges it.
                eprintln!("raft storm: {} {tok}: unexpected answer {reply}", r.kind());
                return Expect::Either;
            }
            if result == Outcome::Unknown {
                t.lost += 1;
            }
            if self.gave_up() {
                return Expect::Either;
            }
            t.retries += 1;
            std::thread::sleep(Duration::from_millis(self.rng.gen_range(10..60)));
        }
    }

    fn run(mut self) -> (Vec<(String, Expect)>, Tally) {
        let mut tokens: Vec<(String, Expect)> = Vec::new();
        // Indices into `tokens` of holds left RESERVED, some finished later.
        let mut held: Vec<usize> = Vec::new();
        let mut tally = Tally::default();
        let mut i = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            i += 1;
            if !held.is_empty() && self.rng.gen_bool(0.15) {
                let at = held.swap_remove(self.rng.gen_range(0..held.len()));
                let tok = tokens[at].0.clone();
                let commit = self.rng.gen_bool(0.5);
                tokens[at].1 = self.finish(commit, &tok, &mut tally);
                tally.late_finishes += 1;
            }
            let user = format!("u{}-{i}", self.process);
            let req = format!("r{i}");
            if let Some(tok) = self.reserve(&user, &req, &mut tally) {
                let roll = self.rng.gen_range(0..100);
                let expect = if roll < 35 {
                    self.finish(true, &tok, &mut tally)
                } else if roll < 70 {
                    self.finish(false, &tok, &mut tally)
                } else {
                    held.push(tokens.len());
                    Expect::Reserved
                };
                if self.rng.gen_bool(0.3) {
                    // Recorded; the checker holds what it saw against the final state.
                    self.op(&Req::Read(&tok));
                }
                tokens.push((tok, expect));
            }
            // Paced: a few hundred RESERVEs over the storm, enough to sell out and not
            // more than the shared cores carry.
            std::thread::sleep(Duration::from_millis(self.rng.gen_range(200..700)));
        }
        (tokens, tally)
    }
}

/// The cause `raft_restarted_leader_repro` looks for in the members' logs: writes
/// opened, then a batch of another process arrives while still leading.
fn lsn_reuse(g: &Group) -> Vec<String> {
    let mut hits = Vec::new();
    for m in &g.members {
        let Some(text) = m
            .log_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
        else {
            continue;
        };
        let mut open: Option<&str> = None;
        for line in text.lines() {
            if line.contains("raft: leading term") {
                open = Some(line);
            } else if line.contains("another leader's batch arrived")
                || line.contains("a batch of another leader")
            {
                if let Some(o) = open.take() {
                    hits.push(format!("member {}:\n  {o}\n  {line}", m.id));
                }
            } else if line.contains("no longer leading") || line.contains("deposed") {
                open = None;
            }
        }
    }
    hits
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Pause,
    CrashAll,
    PartitionAll,
    PartitionOne,
}

/// How many faults of each kind a storm injects.
struct Plan {
    kills: usize,
    /// Every killed leader restarts at once (before its followers' election timeout).
    immediate: bool,
    partitions: usize,
    pauses: usize,
    crashes: usize,
    /// Fail if a member that opened writes then met a batch of another process in the
    /// same leadership (members log to files for this).
    check_lsn_reuse: bool,
}

#[test]
fn raft_storm_of_kills_and_partitions_loses_no_acknowledged_state() {
    run_storm(Plan {
        kills: KILLS,
        immediate: false,
        partitions: PARTITIONS,
        pauses: 0,
        crashes: 0,
        check_lsn_reuse: false,
    });
}

/// The same storm with leader pauses (SIGSTOP) and whole-group `kill -9`s added. A
/// leader restarted before its followers noticed is the case to watch: it must not
/// resume its term (`LogStore::open` loads the vote uncommitted) nor open writes before
/// its whole log is applied (its new records would reuse LSNs of entries still in it).
#[test]
fn raft_storm_with_pauses_and_group_crashes() {
    run_storm(Plan {
        kills: KILLS,
        immediate: false,
        partitions: PARTITIONS,
        pauses: PAUSES,
        crashes: CRASHES,
        check_lsn_reuse: false,
    });
}

/// That case narrowed: only leader `kill -9`s, each restarted at once, with entries of
/// its previous process in its log. Checks the members' logs for the sign of reused LSNs:
/// a member logs `raft: leading term T from LSN X` and then, still leading, that another
/// leader's batch arrived (it opened writes while its log held records from X+1 on).
/// The members' logs are kept in the temp dir on failure (the path is printed).
#[test]
fn raft_restarted_leader_repro() {
    run_storm(Plan {
        kills: 25,
        immediate: true,
        partitions: 0,
        pauses: 0,
        crashes: 0,
        check_lsn_reuse: true,
    });
}

/// Keeps the history when the storm fails before its end (a panic drops the temp dir).
struct KeepOnPanic {
    path: PathBuf,
    seed: u64,
    rec: Arc<Recorder>,
}

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.rec.flush();
            let keep = std::env::temp_dir().join(format!("stockgate-storm-{}.jsonl", self.seed));
            if std::fs::copy(&self.path, &keep).is_ok() {
                eprintln!("raft storm: history kept in {}", keep.display());
            }
        }
    }
}

fn run_storm(plan: Plan) {
    let seed: u64 = std::env::var("STORM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("raft storm: STORM_SEED={seed}");
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let hist_dir = TempDir::new("storm-history");
    let hist_path = hist_dir.path().join("history.jsonl");
    let rec = Arc::new(Recorder::create(&hist_path).expect("history file"));
    let _keep = KeepOnPanic {
        path: hist_path.clone(),
        seed,
        rec: rec.clone(),
    };

    let mut g = Group::start(true);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, TOTAL as u64);
    rec.append(&Record::Sale {
        sku: SKU.into(),
        total: TOTAL,
    })
    .expect("append");

    if plan.check_lsn_reuse {
        for m in &mut g.members {
            m.log_file = Some(hist_dir.path().join(format!("member-{}.log", m.id)));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Answers::new(CLIENTS));
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|p| {
            // A third of the clients go through the client crate's Sentinel support.
            let link: Box<dyn Transport> = if p <= SENTINEL_CLIENTS {
                Box::new(ViaSentinel::new(&g.ports()))
            } else {
                Box::new(Direct {
                    ports: g.ports(),
                    conn: None,
                })
            };
            let c = Client {
                process: p,
                link,
                rec: rec.clone(),
                keyring: g.keys.keyring(),
                rng: StdRng::seed_from_u64(seed ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                stop: stop.clone(),
                give_up: None,
                answers: answers.clone(),
            };
            std::thread::spawn(move || c.run())
        })
        .collect();

    // The nemesis: the faults in a seeded order, each on the leader of the moment.
    let mut faults: Vec<Fault> = std::iter::repeat_n(Fault::Kill, plan.kills)
        .chain((0..plan.partitions).map(|i| {
            if i % 2 == 0 {
                Fault::PartitionAll
            } else {
                Fault::PartitionOne
            }
        }))
        .chain(std::iter::repeat_n(Fault::Pause, plan.pauses))
        .chain(std::iter::repeat_n(Fault::CrashAll, plan.crashes))
        .collect();
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.gen_range(0..=i));
    }
    // Printed as it happens: a run that fails half-way still says what was done.
    let note = |line: String| eprintln!("raft storm: {line}");
    for f in &faults {
        // Healthy time first, so each fault finds writes in flight.
        std::thread::sleep(Duration::from_millis(rng.gen_range(700..1800)));
        let l = g.leader(None, Duration::from_secs(20));
        let at = started.elapsed().as_millis();
        match f {
            Fault::Kill => {
                let wait = if plan.immediate || rng.gen_bool(0.5) {
                    0
                } else {
                    rng.gen_range(300..1500)
                };
                g.member(l).kill9();
                std::thread::sleep(Duration::from_millis(wait));
                g.member(l).spawn();
                note(format!(
                    "{at} ms: kill -9 leader {l}, restart after {wait} ms"
                ));
            }
            Fault::Pause => {
                let hold = rng.gen_range(500..1500);
                g.member(l).pause(true);
                std::thread::sleep(Duration::from_millis(hold));
                g.member(l).pause(false);
                note(format!(
                    "{at} ms: leader {l} paused (SIGSTOP) for {hold} ms"
                ));
            }
            Fault::CrashAll => {
                // Every member at once, as a power loss: only what was durable on a
                // majority was acknowledged, so it must all come back.
                let wait = rng.gen_range(0..800);
                for id in [1, 2, 3] {
                    g.member(id).kill9();
                }
                std::thread::sleep(Duration::from_millis(wait));
                for id in [1, 2, 3] {
                    g.member(id).spawn();
                }
                note(format!(
                    "{at} ms: kill -9 of all three (leader was {l}), restart after {wait} ms"
                ));
            }
            Fault::PartitionAll | Fault::PartitionOne => {
                let hold = rng.gen_range(500..1500);
                let from: Vec<u64> = match f {
                    Fault::PartitionAll => [1, 2, 3].into_iter().filter(|i| *i != l).collect(),
                    _ => {
                        let others: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != l).collect();
                        vec![others[rng.gen_range(0..others.len())]]
                    }
                };
                for &o in &from {
                    g.cut_link(l, o, true);
                }
                std::thread::sleep(Duration::from_millis(hold));
                g.heal_all();
                note(format!(
                    "{at} ms: leader {l} cut from {from:?} for {hold} ms"
                ));
            }
        }
    }
    let storm_ms = started.elapsed().as_millis();
    // A healthy tail: every client must get answers from the last leader. At least 3 s,
    // and longer while a client still waits for its first answer since the last fault (a
    // slower machine elects later), bounded: the assertion below judges a client that
    // never gets one.
    let last_fault = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let tail_limit = Instant::now() + Duration::from_secs(30);
    while !answers.all_after(last_fault) && Instant::now() < tail_limit {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::SeqCst);
    let mut expected: Vec<(String, Expect)> = Vec::new();
    let mut tally = Tally::default();
    let mut via_crate = Tally::default();
    for (p, c) in (1..=CLIENTS).zip(clients) {
        let (toks, t) = c.join().expect("client thread");
        expected.extend(toks);
        tally.add(&t);
        if p <= SENTINEL_CLIENTS {
            via_crate.add(&t);
        }
        let via = if p <= SENTINEL_CLIENTS {
            "the client crate's Sentinel connection"
        } else {
            "the test's discovery"
        };
        assert!(
            t.last_answer.is_some_and(|a| a > last_fault),
            "client {p} ({via}) got no answer after the last fault: {t:?}"
        );
    }

    // The final state, from the final leader, once every member has the same log.
    for m in &mut g.members {
        if m.child.is_none() {
            m.spawn();
        }
    }
    // Judged even if the members do not converge: the history says whether anything
    // acknowledged was lost, which matters more than the convergence failure itself.
    let converged = g.try_converge(Duration::from_secs(30));
    let dead = g.exited();
    if !dead.is_empty() {
        eprintln!("raft storm: members exited on their own: {dead:?}");
    }
    let leader = g.leader(None, Duration::from_secs(20));
    let lport = g.port(leader);
    rec.flush().expect("flush");
    let so_far = history::load(&hist_path).expect("load history");
    let mut known: Vec<String> = so_far
        .iter()
        .filter_map(|r| match r {
            Record::Complete { token: Some(t), .. } => Some(t.clone()),
            Record::Invoke { token: Some(t), .. } => Some(t.clone()),
            _ => None,
        })
        .collect();
    known.sort();
    known.dedup();
    let mut lc = conn(lport);
    let read_all = |c: &mut redis::Connection| -> BTreeMap<String, Option<String>> {
        known
            .iter()
            .map(|t| {
                let v: redis::Value = redis::cmd("RESERVATION")
                    .arg(t)
                    .query(c)
                    .expect("RESERVATION");
                let st = common::field(&v, "state").map(|s| common::as_str(&s));
                (t.clone(), st)
            })
            .collect()
    };
    let finals = read_all(&mut lc);
    for (t, st) in &finals {
        rec.append(&Record::FinalReservation {
            sku: SKU.into(),
            token: t.clone(),
            state: st.clone(),
        })
        .expect("append");
    }
    let (total, available, reserved, committed) = sale_info(lport, SKU);
    rec.append(&Record::FinalSale {
        sku: SKU.into(),
        total,
        available,
        reserved,
        committed,
    })
    .expect("append");
    rec.flush().expect("flush");

    // The checker, as a library and as the binary on the saved file.
    let records = history::load(&hist_path).expect("load history");
    let report = history::check(&records);
    eprintln!(
        "raft storm: history {} ({} records)\n{report}",
        hist_path.display(),
        records.len()
    );
    let out = Command::new(checker_bin())
        .arg(&hist_path)
        .output()
        .expect("run stockgate-history-check");
    if let Ok(keep) = std::env::var("STORM_HISTORY_OUT") {
        std::fs::copy(&hist_path, &keep).expect("copy the history to STORM_HISTORY_OUT");
    }
    if !report.ok() || !out.status.success() {
        // Kept for a post-mortem: the temp dir goes with the test.
        let keep = std::env::temp_dir().join(format!("stockgate-storm-{seed}.jsonl"));
        let _ = std::fs::copy(&hist_path, &keep);
        eprintln!("raft storm: history kept in {}", keep.display());
    }
    assert!(
        report.ok(),
        "the history checker found violations (STORM_SEED={seed}):\n{report}"
    );
    if plan.check_lsn_reuse {
        let hits = lsn_reuse(&g);
        if !hits.is_empty() {
            let keep = std::env::temp_dir().join(format!("stockgate-storm-{seed}-logs"));
            let _ = std::fs::create_dir_all(&keep);
            for m in &g.members {
                if let Some(f) = &m.log_file {
                    let _ = std::fs::copy(f, keep.join(format!("member-{}.log", m.id)));
                }
            }
            panic!(
                "{} time(s) a leader opened writes while its log held records it had not \
                 applied (logs kept in {}):\n{}",
                hits.len(),
                keep.display(),
                hits.join("\n")
            );
        }
    }
    assert!(
        dead.is_empty(),
        "members exited on their own (a panic? their stderr says): {dead:?} (STORM_SEED={seed})"
    );
    if let Err(lens) = &converged {
        panic!("members did not converge: XLEN {lens:?} (STORM_SEED={seed})");
    }
    assert!(
        out.status.success(),
        "stockgate-history-check failed on the saved history: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );

    // The checker has teeth on this very history: one acknowledged COMMIT's token made
    // to look lost must fail it, in the library and in the binary.
    let victim = records
        .iter()
        .find_map(|r| match r {
            Record::FinalReservation {
                token,
                state: Some(s),
                ..
            } if s == "COMMITTED" => Some(token.clone()),
            _ => None,
        })
        .expect("some token ended COMMITTED");
    let mutated: Vec<Record> = records
        .iter()
        .map(|r| match r {
            Record::FinalReservation { sku, token, .. } if *token == victim => {
                Record::FinalReservation {
                    sku: sku.clone(),
                    token: token.clone(),
                    state: None,
                }
            }
            other => other.clone(),
        })
        .collect();
    let bad = history::check(&mutated);
    assert!(
        bad.violations
            .iter()
            .any(|v| v.kind == ViolationKind::LostWrite && v.detail.contains(&victim)),
        "the checker missed a lost write of {victim}:\n{bad}"
    );
    let mutated_path = hist_dir.path().join("mutated.jsonl");
    let text: String = mutated
        .iter()
        .map(|r| serde_json::to_string(r).expect("encode") + "\n")
        .collect();
    std::fs::write(&mutated_path, text).expect("write the mutated history");
    let out = Command::new(checker_bin())
        .arg(&mutated_path)
        .output()
        .expect("run stockgate-history-check");
    assert_eq!(
        out.status.code(),
        Some(1),
        "stockgate-history-check passed a history with a lost write: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The same, said directly.
    let mut seen = HashMap::new();
    for (t, e) in &expected {
        assert!(
            seen.insert(t.clone(), *e).is_none(),
            "token {t} acknowledged twice"
        );
        let st = finals.get(t).cloned().flatten();
        let ok = match e {
            Expect::Reserved => st.as_deref() == Some("RESERVED"),
            Expect::Committed => st.as_deref() == Some("COMMITTED"),
            Expect::Released => st.as_deref() == Some("RELEASED"),
            Expect::Either => st.is_some(),
        };
        assert!(
            ok,
            "token {t}: acknowledged as {e:?}, final leader says {st:?} (STORM_SEED={seed})"
        );
    }
    let live = expected
        .iter()
        .filter(|(t, _)| {
            matches!(
                finals.get(t).cloned().flatten().as_deref(),
                Some("RESERVED") | Some("COMMITTED")
            )
        })
        .count() as i64;
    assert_eq!(total, TOTAL);
    assert!(live <= TOTAL, "{live} units handed out of {TOTAL}");
    assert_eq!(
        available + reserved + committed,
        TOTAL,
        "counters do not add up"
    );

    // Every member holds the same: the same feed length, counters and token states.
    let xlen = g.converge(Duration::from_secs(10));
    for m in &g.members {
        let info = sale_info(m.port, SKU);
        assert_eq!(
            info,
            (total, available, reserved, committed),
            "member {} SALE.INFO differs from the leader's",
            m.id
        );
        let states = read_all(&mut conn(m.port));
        if states != finals {
            let diff: Vec<_> = finals
                .iter()
                .filter(|(t, f)| states.get(*t) != Some(*f))
                .map(|(t, f)| (t.clone(), f.clone(), states.get(t).cloned()))
                .take(10)
                .collect();
            panic!(
                "member {} token states differ from the final leader's (token, leader, member): {diff:?}",
                m.id
            );
        }
    }
    // The restart-only plan spends much of its time without a leader: it is about the
    // members' logs, not about selling out.
    assert!(
        tally.soldout > 0 || plan.check_lsn_reuse,
        "the sale never sold out ({tally:?}): the storm is too short for the total"
    );
    eprintln!(
        "raft storm: seed {seed}, {} faults in {storm_ms} ms, {} s in all; {tally:?}; \
         of which the {SENTINEL_CLIENTS} clients through the client crate: {} RESERVEs, {} \
         acknowledged, {} SOLDOUT; {} tokens, final available {available} reserved {reserved} committed {committed}, \
         XLEN {xlen} on every member",
        faults.len(),
        started.elapsed().as_secs(),
        via_crate.reserves,
        via_crate.acked,
        via_crate.soldout,
        expected.len()
    );
}

/// A history whose one acknowledged reservation the final leader does not know: the
/// binary exits 1 and says so; the same history with the token present exits 0; a file
/// that is no history exits 2.
#[test]
fn the_history_checker_binary_fails_a_lost_acknowledged_write() {
    let dir = TempDir::new("history-check");
    let write = |name: &str, state: &str, reserved: i64| -> PathBuf {
        let text = [
            r#"{"type":"sale","sku":"S","total":10}"#.to_string(),
            r#"{"type":"invoke","op_id":1,"process":1,"op":"RESERVE","sku":"S","user":"u1","req":"r1","t_ms":1}"#.into(),
            r#"{"type":"complete","op_id":1,"process":1,"result":"ok","reply":"RESERVED","token":"{S}aaaaaaaaaaaaaaaaaaaaaaaaaa","t_ms":2}"#.into(),
            format!(r#"{{"type":"final_reservation","sku":"S","token":"{{S}}aaaaaaaaaaaaaaaaaaaaaaaaaa","state":{state}}}"#),
            format!(r#"{{"type":"final_sale","sku":"S","total":10,"available":{},"reserved":{reserved},"committed":0}}"#, 10 - reserved),
        ]
        .join("\n");
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write history");
        p
    };
    let lost = write("lost.jsonl", "null", 0);
    let out = Command::new(checker_bin())
        .arg(&lost)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("lost acknowledged write")
            && stdout.contains("{S}aaaaaaaaaaaaaaaaaaaaaaaaaa"),
        "{stdout}"
    );
    let clean = write("clean.jsonl", "\"RESERVED\"", 1);
    let out = Command::new(checker_bin())
        .arg(&clean)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let junk = dir.path().join("junk.jsonl");
    std::fs::write(&junk, "not json\n").expect("write");
    let out = Command::new(checker_bin())
        .arg(&junk)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let help = Command::new(checker_bin())
        .arg("--help")
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&help.stdout).contains("final_reservation"));
}

/// The leader cut from its followers, 1,500 RESERVEs pipelined to it (records in its own
/// log only, not committed), the leader `kill -9`ed 80 ms later, the links healed and the
/// leader restarted at once, while a client resends the same requests (same request ids)
/// to whoever leads until the group takes them; each round prints how the retries were answered. Fails
/// when a member stops converging or exits (openraft refuses a follower whose log would
/// hold two different entries of one term at one index: `follower log reversion`).
#[test]
fn raft_restarted_leader_reserves_a_retried_request_twice() {
    use std::io::Write as _;
    let mut g = Group::start(true);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "DUP", 1_000_000);
    let keyring = g.keys.keyring();
    for round in 0..15 {
        let l = g.leader(None, Duration::from_secs(20));
        let port = g.port(l);
        let reqs: Vec<(String, String)> = (0..1500)
            .map(|i| {
                let user = format!("r{round}-u{i}");
                let adm = keyring.mint("DUP", &user, now_ms() + 600_000);
                (user, adm)
            })
            .collect();
        let mut pipe = redis::pipe();
        for (user, adm) in &reqs {
            pipe.cmd("RESERVE")
                .arg("DUP")
                .arg(user)
                .arg(adm)
                .arg("req-1");
        }
        let packed = pipe.get_packed_pipeline();
        let mut raw = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        g.cut(l, true);
        raw.write_all(&packed).expect("send the pipeline");
        std::thread::sleep(Duration::from_millis(80));
        g.member(l).kill9();
        g.cut(l, false);
        // The retrying client, already at work while the member restarts, sending to
        // whoever leads (the restarted member leads again only by winning a new term).
        let ports = g.ports();
        let hammer = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                let port = discover(&ports, Duration::from_millis(500)).unwrap_or(port);
                let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                if let Ok(replies) = pipe.query::<Vec<redis::Value>>(&mut c) {
                    // How the retries were answered: REPLAY (the first send was in the log
                    // and applied) or RESERVED (taken now).
                    let mut words = BTreeMap::new();
                    for r in &replies {
                        if let redis::Value::Array(items) = r {
                            *words.entry(common::as_str(&items[0])).or_insert(0) += 1;
                        }
                    }
                    return Some(words);
                }
            }
            None
        });
        g.member(l).spawn();
        let took = hammer.join().expect("hammer");
        eprintln!("round {round}: leader {l}, retries answered {took:?}");
        let dead = g.exited();
        let converged = g.try_converge(Duration::from_secs(20));
        assert!(
            dead.is_empty() && converged.is_ok(),
            "round {round}: members exited {dead:?}, convergence {converged:?} (their stderr \
             above says `reserved twice in the log` when this is the bug)"
        );
        assert!(
            took.is_some(),
            "round {round}: no leader took the retries within 10 s"
        );
    }
}
