//! The storm: three real members, a dozen checkout clients reserving, committing and
//! releasing against whoever leads (found through the Sentinel interface), while the
//! leader is `kill -9`ed twelve times and partitioned from one or both followers six
//! times, at seeded-random moments (an ignored variant adds leader pauses and
//! whole-group `kill -9`s). Every invocation and completion is recorded into a
//! history file; at the end the final state of every token and the sale's counters are
//! read from the final leader, appended, and the history is judged by
//! `stockgate_tools::checker::check` and by the `stockgate-history-check` binary.
//!
//! `raft_storm_at_the_groups_edges` adds the faults at the group's edges: wiped data dirs
//! re-admitted with `RAFT.READMIT`, a full disk (tmpfs) on the leader and on a follower,
//! the member every client lists first cut off, one-way link cuts, a member down for
//! long. It also judges reads against the writes acknowledged before them (`stale_reads`)
//! and prints each fault kind's failover time, fault to first acknowledged RESERVE
//! through a Sentinel-aware client, as a table at the end of the run.
//!
//! Replay a run: `STORM_SEED=<seed printed by the run> cargo test --test raft raft_storm::`.
//! Keep its history: `STORM_HISTORY_OUT=/some/file.jsonl` (a failing run keeps it anyway).
//! The nemesis schedule follows the seed; the clients' interleaving follows the machine.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_client::types::{CommitOk, ReserveOutcome};
use stockgate_client::{ClientConfig, ClientError, SentinelConfig, StockgateClient};
use stockgate_server::engine::Keyring;
use stockgate_tools::checker::{self, OpKind, Outcome, Record, Recorder, ViolationKind};

use crate::common::nemesis::*;
use crate::common::raft::*;
use crate::common::{now_ms, TempDir};

const SKU: &str = "STORM";
const TOTAL: i64 = 300;
const CLIENTS: u64 = 12;
/// Clients 1..=SENTINEL_CLIENTS use `StockgateClient::connect_sentinel`.
const SENTINEL_CLIENTS: u64 = 4;
const KILLS: usize = 12;
const PARTITIONS: usize = 6;
const PAUSES: usize = 3;
const CRASHES: usize = 2;
/// The probe's sale: large enough never to sell out, so its RESERVEs are acknowledged
/// whenever the group takes writes.
const PROBE: &str = "PROBE";
const PROBE_TOTAL: i64 = 1_000_000;
const PROBE_EVERY: Duration = Duration::from_millis(100);

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
        sku: &'a str,
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
    /// The member `conn` reaches, named in the history's read replies.
    port: u16,
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
            self.port = port;
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
            Req::Reserve {
                sku,
                user,
                req,
                adm,
            } => cmd.arg(*sku).arg(*user).arg(*adm).arg(*req),
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
                let word = crate::common::as_str(&items[0]);
                if (word == "RESERVED" || word == "REPLAY") && items.len() >= 2 {
                    (Outcome::Ok, word, Some(crate::common::as_str(&items[1])))
                } else {
                    (Outcome::Fail, word, None)
                }
            }
            (Req::Commit(_) | Req::Release(_), redis::Value::Int(i)) => {
                (Outcome::Ok, i.to_string(), None)
            }
            // The member that answered a read follows its state word (the checker takes
            // the first word): a stale read names where it came from.
            (Req::Read(_), redis::Value::Nil) => {
                (Outcome::Ok, format!("nil via {}", self.port), None)
            }
            (Req::Read(_), v) => match crate::common::field(v, "state") {
                Some(s) => (
                    Outcome::Ok,
                    format!("{} via {}", crate::common::as_str(&s), self.port),
                    None,
                ),
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
            Req::Reserve {
                sku,
                user,
                req,
                adm,
            } => match self.rt.block_on(c.reserve(sku, user, adm, req, 1)) {
                Ok(ReserveOutcome::Reserved { token, .. }) => {
                    (Outcome::Ok, "RESERVED".into(), Some(token))
                }
                Ok(ReserveOutcome::Replay { token, .. }) => {
                    (Outcome::Ok, "REPLAY".into(), Some(token))
                }
                Ok(ReserveOutcome::SoldOut) => (Outcome::Fail, "SOLDOUT".into(), None),
                Ok(ReserveOutcome::Limit { .. }) => (Outcome::Fail, "LIMIT".into(), None),
                Err(e) => Self::failed(&e),
            },
            Req::Commit(t) => match self.rt.block_on(c.commit(t)) {
                Ok(CommitOk::Committed) => (Outcome::Ok, "1".into(), None),
                Ok(CommitOk::AlreadyCommitted) => (Outcome::Ok, "0".into(), None),
                Err(e) => Self::failed(&e),
            },
            Req::Release(t) => match self.rt.block_on(c.release(t)) {
                Ok(n) => (Outcome::Ok, if n { "1" } else { "0" }.into(), None),
                Err(e) => Self::failed(&e),
            },
            Req::Read(t) => {
                let r = self.rt.block_on(c.reservation(t));
                let via = c.primary_addr().unwrap_or_else(|| "?".into());
                match r {
                    Ok(None) => (Outcome::Ok, format!("nil via {via}"), None),
                    Ok(Some(info)) => (
                        Outcome::Ok,
                        format!("{} via {via}", info.state.as_str()),
                        None,
                    ),
                    Err(e) => Self::failed(&e),
                }
            }
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
    /// The sale this client reserves in.
    sku: &'static str,
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
    /// Where a Sentinel-aware client notes its acknowledged RESERVEs (failover times).
    failovers: Option<Arc<Failovers>>,
    /// Every client's acknowledged tokens, read back by the others when `cross_reads`.
    acked: Arc<Mutex<Vec<String>>>,
    cross_reads: bool,
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
            sku: self.sku.into(),
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
        let adm = self.keyring.mint(self.sku, user, now_ms() + 600_000);
        t.reserves += 1;
        loop {
            let (result, reply, tok) = self.op(&Req::Reserve {
                sku: self.sku,
                user,
                req,
                adm: &adm,
            });
            if result == Outcome::Ok {
                t.acked += 1;
                t.last_answer = Some(Instant::now());
                self.answers.record(self.process);
                if let Some(f) = &self.failovers {
                    f.ack();
                }
                if let Some(tok) = tok.as_ref().filter(|_| self.sku == SKU) {
                    self.acked.lock().expect("acked tokens").push(tok.clone());
                }
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
            if self.cross_reads && self.rng.gen_bool(0.3) {
                // Another client's token, whose newest acknowledged state this client
                // never saw: `stale_reads` holds the answer against it.
                let other = {
                    let all = self.acked.lock().expect("acked tokens");
                    (!all.is_empty()).then(|| all[self.rng.gen_range(0..all.len())].clone())
                };
                if let Some(other) = other {
                    self.op(&Req::Read(&other));
                }
            }
            // Paced: a few hundred RESERVEs over the storm, enough to sell out and not
            // more than the shared cores carry.
            std::thread::sleep(Duration::from_millis(self.rng.gen_range(200..700)));
        }
        (tokens, tally)
    }
}

impl Client {
    /// The probe: a RESERVE every `PROBE_EVERY` until the storm ends, each retried until
    /// answered, so that an acknowledgement follows every fault as soon as the group
    /// takes writes again (the checkout clients pause between operations and sell out).
    fn probe(mut self) -> Tally {
        let mut t = Tally::default();
        let mut i = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            i += 1;
            self.reserve(&format!("p{i}"), "r1", &mut t);
            std::thread::sleep(PROBE_EVERY);
        }
        t
    }
}

/// Each token of the history and the sale it belongs to (from the operations naming it).
fn token_skus(records: &[Record]) -> BTreeMap<String, String> {
    let mut sku_of_op = HashMap::new();
    let mut out = BTreeMap::new();
    for r in records {
        match r {
            Record::Invoke {
                op_id, sku, token, ..
            } => {
                sku_of_op.insert(*op_id, sku.clone());
                if let Some(t) = token {
                    out.entry(t.clone()).or_insert_with(|| sku.clone());
                }
            }
            Record::Complete {
                op_id,
                token: Some(t),
                ..
            } => {
                let sku = sku_of_op.get(op_id).cloned().unwrap_or_else(|| SKU.into());
                out.entry(t.clone()).or_insert(sku);
            }
            _ => {}
        }
    }
    out
}

/// How far along a token's state is: none, held, or ended (`COMMITTED`, `RELEASED`,
/// `EXPIRED`; `ENDED` stands for a RELEASE answered 0: no longer held, but which end
/// is not said).
fn rank(state: &str) -> u8 {
    match state {
        "nil" => 0,
        "RESERVED" => 1,
        _ => 2,
    }
}

/// What an answered operation tells of its token's state, if anything.
fn acknowledged_state(op: OpKind, result: Outcome, word: &str) -> Option<&str> {
    match (op, result, word) {
        (OpKind::Reserve, Outcome::Ok, _) => Some("RESERVED"),
        (OpKind::Commit, Outcome::Ok, _) => Some("COMMITTED"),
        (OpKind::Commit, Outcome::Fail, "RELEASED") => Some("RELEASED"),
        (OpKind::Release, Outcome::Ok, "1") => Some("RELEASED"),
        (OpKind::Release, Outcome::Ok, _) => Some("ENDED"),
        (OpKind::Read, Outcome::Ok, w) => Some(w),
        _ => None,
    }
}

/// Reads that returned an older state of a token than one already acknowledged to any
/// client (by a write's answer or another read's) before the read was sent, or another
/// end than an acknowledged one. Only answers completed strictly before the read's
/// invocation count (the clocks are one machine's, in ms). A refusal (`-READONLY`,
/// `-LOADING`) is no answer: only `ok` reads are judged.
fn stale_reads(records: &[Record]) -> Vec<String> {
    struct Op<'a> {
        kind: OpKind,
        token: Option<&'a str>,
        invoked: u64,
        process: u64,
    }
    let mut ops: HashMap<u64, Op> = HashMap::new();
    // Per token: (answered at, state) of every answer that says something of it.
    let mut known: HashMap<&str, Vec<(u64, String)>> = HashMap::new();
    let mut reads: Vec<(&str, u64, u64, String, u64)> = Vec::new();
    for r in records {
        match r {
            Record::Invoke {
                op_id,
                op,
                token,
                t_ms,
                process,
                ..
            } => {
                ops.insert(
                    *op_id,
                    Op {
                        kind: *op,
                        token: token.as_deref(),
                        invoked: *t_ms,
                        process: *process,
                    },
                );
            }
            Record::Complete {
                op_id,
                result,
                reply,
                token,
                t_ms,
                ..
            } => {
                let Some(o) = ops.get(op_id) else { continue };
                let Some(tok) = o.token.or(token.as_deref()) else {
                    continue;
                };
                let reply = reply.as_deref().unwrap_or("");
                let word = reply.trim_start_matches('-').split_whitespace().next();
                let Some(st) = acknowledged_state(o.kind, *result, word.unwrap_or("")) else {
                    continue;
                };
                known.entry(tok).or_default().push((*t_ms, st.to_owned()));
                if o.kind == OpKind::Read && *result == Outcome::Ok {
                    reads.push((tok, o.invoked, *op_id, reply.to_owned(), o.process));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (tok, invoked, op_id, reply, process) in reads {
        let seen = reply.split_whitespace().next().unwrap_or("");
        let before = known[tok].iter().filter(|(at, _)| *at < invoked);
        let Some((at, newest)) = before.max_by_key(|(at, st)| (rank(st), *at)) else {
            continue;
        };
        let ended_otherwise = rank(seen) == 2
            && rank(newest) == 2
            && seen != newest
            && newest != "ENDED"
            && !(seen == "EXPIRED" && newest == "RELEASED");
        if rank(seen) < rank(newest) || ended_otherwise {
            out.push(format!(
                "token {tok}: READ (op {op_id}, process {process}) invoked at {invoked} ms answered \
                 {reply:?}, but {newest} was acknowledged at {at} ms"
            ));
        }
    }
    out
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

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Kill,
    Pause,
    CrashAll,
    PartitionAll,
    PartitionOne,
    /// A follower's whole data dir wiped; the member re-admitted (`RAFT.READMIT`).
    WipeOne,
    /// Two members wiped in turn, each re-admitted before the next is wiped.
    WipeTwo,
    WipeLeader,
    /// The data dir's tmpfs filled up, freed again a few seconds later.
    DiskFullLeader,
    DiskFullFollower,
    /// Every link to and from the member every client lists first cut.
    IsolateFirst,
    /// Links cut in one direction only.
    OneWay,
    /// A member `kill -9`ed and left down for `Edges::long_down`.
    LongDown,
}

impl Fault {
    fn is_wipe(self) -> bool {
        matches!(self, Fault::WipeOne | Fault::WipeTwo | Fault::WipeLeader)
    }
}

/// The faults at the group's edges a storm adds to the others. It also runs a probe (a
/// Sentinel-aware client reserving in a sale of its own every `PROBE_EVERY`, whose
/// acknowledgements time each fault's failover) and has the clients read each other's
/// tokens, judged for stale reads.
struct Edges {
    wipes: bool,
    /// Both disk faults; dropped (with the reason printed) where tmpfs cannot be mounted.
    disk: bool,
    isolations: usize,
    one_way: usize,
    long_downs: usize,
    long_down: Duration,
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
    edges: Option<Edges>,
}

impl Plan {
    /// The faults in a seeded order. The wipes keep theirs (one member, two in turn,
    /// then the leader): each needs the group whole again after the one before.
    fn schedule(&self, rng: &mut StdRng, disk: bool) -> Vec<Fault> {
        let mut faults: Vec<Fault> = std::iter::repeat_n(Fault::Kill, self.kills)
            .chain((0..self.partitions).map(|i| {
                if i % 2 == 0 {
                    Fault::PartitionAll
                } else {
                    Fault::PartitionOne
                }
            }))
            .chain(std::iter::repeat_n(Fault::Pause, self.pauses))
            .chain(std::iter::repeat_n(Fault::CrashAll, self.crashes))
            .collect();
        if let Some(e) = &self.edges {
            if e.wipes {
                faults.extend([Fault::WipeOne, Fault::WipeTwo, Fault::WipeLeader]);
            }
            if disk {
                faults.extend([Fault::DiskFullLeader, Fault::DiskFullFollower]);
            }
            faults.extend(std::iter::repeat_n(Fault::IsolateFirst, e.isolations));
            faults.extend(std::iter::repeat_n(Fault::OneWay, e.one_way));
            faults.extend(std::iter::repeat_n(Fault::LongDown, e.long_downs));
        }
        for i in (1..faults.len()).rev() {
            faults.swap(i, rng.gen_range(0..=i));
        }
        let wipes: Vec<usize> = (0..faults.len()).filter(|i| faults[*i].is_wipe()).collect();
        for (i, f) in wipes
            .into_iter()
            .zip([Fault::WipeOne, Fault::WipeTwo, Fault::WipeLeader])
        {
            faults[i] = f;
        }
        faults
    }
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
        edges: None,
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
        edges: None,
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
        edges: None,
    });
}

/// The storm at the group's edges: wiped data dirs (a follower, two members in turn, the
/// leader, each brought back by `RAFT.READMIT`), a full disk on the leader and on a
/// follower (each member's data dir on a tmpfs of its own: needs root; skipped with the
/// reason printed where it cannot be mounted), the member every client lists first cut
/// off, one-way link cuts, and a member down for 25 s, among a few leader `kill -9`s and
/// partitions. Judged as the storm is, plus stale reads (`stale_reads`); prints each fault
/// kind's failover time (fault → first acknowledged RESERVE through a Sentinel-aware
/// client). About 3 minutes in a debug build on two cores.
#[test]
fn raft_storm_at_the_groups_edges() {
    run_storm(Plan {
        kills: 3,
        immediate: false,
        partitions: 2,
        pauses: 0,
        crashes: 0,
        check_lsn_reuse: false,
        edges: Some(Edges {
            wipes: true,
            disk: true,
            isolations: 2,
            one_way: 3,
            long_downs: 1,
            long_down: Duration::from_secs(25),
        }),
    });
}

/// The same with the storm's full count of kills and partitions, more of the edge faults
/// and members down for three minutes each (about 12 minutes).
#[test]
#[ignore = "about 12 minutes: members down for three minutes each"]
fn raft_storm_at_the_groups_edges_long() {
    run_storm(Plan {
        kills: KILLS,
        immediate: false,
        partitions: PARTITIONS,
        pauses: PAUSES,
        crashes: 0,
        check_lsn_reuse: false,
        edges: Some(Edges {
            wipes: true,
            disk: true,
            isolations: 4,
            one_way: 6,
            long_downs: 2,
            long_down: Duration::from_secs(180),
        }),
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

/// Every member's data dir moved onto a tmpfs of its own, for the disk faults; the
/// members that made it. Stops at the first failure, saying why.
fn onto_tmpfs_all(g: &mut Group) -> (Vec<Tmpfs>, Vec<u64>) {
    let (mut mounts, mut ids) = (Vec::new(), Vec::new());
    for id in [1, 2, 3] {
        match onto_tmpfs(g, id, "64m") {
            Ok(fs) => {
                mounts.push(fs);
                ids.push(id);
            }
            Err(e) => {
                eprintln!("raft storm: the full-disk faults are skipped: {e}");
                return (mounts, Vec::new());
            }
        }
        g.leader(None, Duration::from_secs(20));
    }
    (mounts, ids)
}

/// What every client thread shares.
struct Shared {
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    answers: Arc<Answers>,
    failovers: Arc<Failovers>,
    acked: Arc<Mutex<Vec<String>>>,
    seed: u64,
}

impl Shared {
    /// Client `p` of sale `sku`: through the client crate's Sentinel support when
    /// `sentinel`, else through the test's own discovery.
    fn client(&self, g: &Group, p: u64, sku: &'static str, sentinel: bool, cross: bool) -> Client {
        let link: Box<dyn Transport> = if sentinel {
            Box::new(ViaSentinel::new(&g.ports()))
        } else {
            Box::new(Direct {
                ports: g.ports(),
                conn: None,
                port: 0,
            })
        };
        Client {
            process: p,
            sku,
            link,
            rec: self.rec.clone(),
            keyring: g.keys.keyring(),
            rng: StdRng::seed_from_u64(self.seed ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            stop: self.stop.clone(),
            give_up: None,
            answers: self.answers.clone(),
            failovers: sentinel.then(|| self.failovers.clone()),
            acked: self.acked.clone(),
            cross_reads: cross,
        }
    }
}

/// Whether the member on `port` commits writes (the probe's) within a second: its
/// committed LSN moves.
fn commits_on(port: u16) -> bool {
    let lsn = || info_text(port, "raft_committed_lsn").and_then(|v| v.parse::<u64>().ok());
    let Some(before) = lsn() else {
        return false;
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        if lsn().is_some_and(|now| now > before) {
            return true;
        }
    }
    false
}

/// Injects the faults, each on the leader of the moment, and notes when each began.
struct Nemesis<'a> {
    g: &'a mut Group,
    rng: StdRng,
    started: Instant,
    immediate: bool,
    long_down: Duration,
    failovers: Arc<Failovers>,
    /// Members whose data dir is on a tmpfs of its own (the disk faults need one).
    on_tmpfs: Vec<u64>,
    /// What the faults found wrong with the group, judged after the history.
    problems: Vec<String>,
    /// Set once a re-admission failed: another wiped member would leave no majority.
    wipes_off: bool,
    /// Members taken out of the group (`RAFT.REMOVE`) after a failed re-admission.
    removed: Vec<u64>,
}

impl Nemesis<'_> {
    fn run(&mut self, faults: &[Fault]) {
        for f in faults {
            // Healthy time first, so each fault finds writes in flight.
            std::thread::sleep(Duration::from_millis(self.rng.gen_range(700..1800)));
            let l = self.g.leader(None, Duration::from_secs(20));
            let at = self.started.elapsed().as_millis();
            let what = match f {
                Fault::Kill | Fault::Pause | Fault::CrashAll => self.process_fault(*f, l),
                Fault::PartitionAll | Fault::PartitionOne => self.partition(*f, l),
                Fault::WipeOne => {
                    let v = self.follower(l, None);
                    self.wipe("wipe one", v)
                }
                Fault::WipeTwo => {
                    let v = self.follower(l, None);
                    let first = self.wipe("wipe two (first)", v);
                    let l = self.g.leader(None, Duration::from_secs(20));
                    let w = self.follower(l, Some(v));
                    format!("{first}; then {}", self.wipe("wipe two (second)", w))
                }
                Fault::WipeLeader => self.wipe("wipe leader", l),
                Fault::DiskFullLeader => self.disk_full("disk full (leader)", l),
                Fault::DiskFullFollower => {
                    let v = self.follower(l, None);
                    self.disk_full("disk full (follower)", v)
                }
                Fault::IsolateFirst => self.isolate_first(l),
                Fault::OneWay => self.one_way(l),
                Fault::LongDown => self.down_long(l),
            };
            // Printed as it happens: a run that fails half-way still says what was done.
            eprintln!("raft storm: {at} ms: {what}");
        }
    }

    fn mark(&self, kind: &str) {
        self.failovers.fault(kind, Instant::now());
    }

    /// A follower of `l` other than `not` (when there is one), at random.
    fn follower(&mut self, l: u64, not: Option<u64>) -> u64 {
        let all: Vec<u64> = [1, 2, 3]
            .into_iter()
            .filter(|i| *i != l && !self.removed.contains(i))
            .collect();
        let some: Vec<u64> = all.iter().copied().filter(|i| Some(*i) != not).collect();
        let from = if some.is_empty() { all } else { some };
        from[self.rng.gen_range(0..from.len())]
    }

    fn process_fault(&mut self, f: Fault, l: u64) -> String {
        match f {
            Fault::Kill => {
                let wait = if self.immediate || self.rng.gen_bool(0.5) {
                    0
                } else {
                    self.rng.gen_range(300..1500)
                };
                self.mark("kill -9 leader");
                self.g.member(l).kill9();
                std::thread::sleep(Duration::from_millis(wait));
                self.g.member(l).spawn();
                format!("kill -9 leader {l}, restart after {wait} ms")
            }
            Fault::Pause => {
                let hold = self.rng.gen_range(500..1500);
                self.mark("pause leader");
                self.g.member(l).pause(true);
                std::thread::sleep(Duration::from_millis(hold));
                self.g.member(l).pause(false);
                format!("leader {l} paused (SIGSTOP) for {hold} ms")
            }
            _ => {
                // Every member at once, as a power loss: only what was durable on a
                // majority was acknowledged, so it must all come back.
                let wait = self.rng.gen_range(0..800);
                self.mark("kill -9 all");
                for id in [1, 2, 3] {
                    self.g.member(id).kill9();
                }
                std::thread::sleep(Duration::from_millis(wait));
                for id in [1, 2, 3] {
                    self.g.member(id).spawn();
                }
                format!("kill -9 of all three (leader was {l}), restart after {wait} ms")
            }
        }
    }

    fn partition(&mut self, f: Fault, l: u64) -> String {
        let hold = self.rng.gen_range(500..1500);
        let from: Vec<u64> = match f {
            Fault::PartitionAll => [1, 2, 3].into_iter().filter(|i| *i != l).collect(),
            _ => vec![self.follower(l, None)],
        };
        self.mark(if from.len() == 2 {
            "leader cut from both"
        } else {
            "leader cut from one"
        });
        for &o in &from {
            self.g.cut_link(l, o, true);
        }
        std::thread::sleep(Duration::from_millis(hold));
        self.g.heal_all();
        format!("leader {l} cut from {from:?} for {hold} ms")
    }

    /// Wipes member `id`'s data dir and brings it back as the operator would: started
    /// with its usual command line it must not vote; `RAFT.READMIT` on the leader makes
    /// it a voter again.
    fn wipe(&mut self, kind: &str, id: u64) -> String {
        if self.wipes_off {
            return format!("{kind}: skipped, an earlier re-admission failed");
        }
        self.mark(kind);
        wipe_and_restart(self.g, id);
        if let Err(e) = wait_voting(self.g, id, "0", Duration::from_secs(5)) {
            self.problems
                .push(format!("{kind}: on a wiped data dir, {e}"));
        }
        let t = Instant::now();
        let back = readmit(self.g, id, Duration::from_secs(90)).and_then(|(l, said)| {
            wait_voting(self.g, id, "1", Duration::from_secs(30))
                .map(|_| (l, said.clone()))
                .map_err(|e| format!("RAFT.READMIT on leader {l} answered {said:?}, then {e}"))
        });
        match back {
            Ok((l, said)) => {
                format!(
                    "{kind}: member {id} wiped, RAFT.READMIT on leader {l}: {said}, voting \
                     again {} ms later",
                    t.elapsed().as_millis()
                )
            }
            Err(e) => self.not_readmitted(kind, id, &e),
        }
    }

    /// A wiped member that never became a voter again: a problem, reported with how it
    /// and the others see the membership; it is taken out of the group so the storm goes
    /// on with two.
    fn not_readmitted(&mut self, kind: &str, id: u64, e: &str) -> String {
        self.wipes_off = true;
        let views = membership_views(self.g);
        let l = self.g.leader(Some(id), Duration::from_secs(20));
        let runs = info_text(self.g.port(l), "raft_incarnation");
        let seen = incarnation_seen(self.g.port(id), l);
        let what = format!(
            "{kind}: member {id}: {e}; it knows leader {l} as incarnation {seen:?}, which \
             runs on {runs:?}; the members' views:\n{views}"
        );
        self.problems.push(what.clone());
        match remove_member(self.g, id, Duration::from_secs(60)) {
            Ok(()) => self.removed.push(id),
            Err(e) => self.problems.push(format!("{kind}: {e}")),
        }
        format!("{what}member {id} removed from the group")
    }

    /// Fills member `id`'s tmpfs for a few seconds. A member that exits must say so
    /// with the storage status, and is restarted once space is back, as systemd would.
    fn disk_full(&mut self, kind: &str, id: u64) -> String {
        if !self.on_tmpfs.contains(&id) {
            return format!("{kind}: skipped, member {id} has no tmpfs of its own");
        }
        let dir = self.g.member(id).dir.clone();
        let hold = self.rng.gen_range(3000..5000);
        let filler = fill(&dir);
        // From the moment no byte is left (filling takes a while, the member writes on).
        self.mark(kind);
        std::thread::sleep(Duration::from_millis(hold));
        let during = reap(self.g, id);
        // Writes flow all the while (the probe). A member on a full disk may go on
        // leading only while its writes still commit: its Raft log writes into space
        // the file was given ahead (4 MiB), and it exits once a write finds none.
        if during.is_none() && says_master(self.g.port(id)) && !commits_on(self.g.port(id)) {
            self.problems.push(format!(
                "{kind}: member {id} still says master after {hold} ms on a full disk, and commits nothing"
            ));
        }
        std::fs::remove_file(&filler).expect("free the space");
        std::thread::sleep(Duration::from_millis(300));
        match during.or_else(|| reap(self.g, id)) {
            Some(code) => {
                if code != EXIT_STORAGE {
                    self.problems.push(format!(
                        "{kind}: member {id} exited with status {code}, not {EXIT_STORAGE}"
                    ));
                }
                self.g.member(id).spawn();
                format!("{kind}: member {id}'s disk full for {hold} ms, it exited with {code}, restarted")
            }
            None => format!("{kind}: member {id}'s disk full for {hold} ms, it kept running"),
        }
    }

    /// Cuts every link to and from the member every client asks first (clients list
    /// the members in id order), whatever its role.
    fn isolate_first(&mut self, l: u64) -> String {
        let first = self.g.members[0].id;
        let hold = self.rng.gen_range(2000..4000);
        self.mark(if first == l {
            "isolate first (leader)"
        } else {
            "isolate first (follower)"
        });
        self.g.cut(first, true);
        std::thread::sleep(Duration::from_millis(hold));
        self.g.heal_all();
        format!("member {first} (listed first; leader {l}) cut from both for {hold} ms")
    }

    /// One direction cut: the leader cannot call its followers (they stop hearing it and
    /// stand, while their calls still reach it), or they cannot call it, or it cannot
    /// call one of them.
    fn one_way(&mut self, l: u64) -> String {
        let others: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != l).collect();
        let hold = self.rng.gen_range(1000..3000);
        let (kind, links): (&str, Vec<(u64, u64)>) = match self.rng.gen_range(0..3) {
            0 => (
                "one-way leader->both",
                others.iter().map(|o| (l, *o)).collect(),
            ),
            1 => (
                "one-way both->leader",
                others.iter().map(|o| (*o, l)).collect(),
            ),
            _ => ("one-way leader->one", vec![(l, self.follower(l, None))]),
        };
        self.mark(kind);
        for (from, to) in &links {
            cut_one_way(self.g, *from, *to, true);
        }
        std::thread::sleep(Duration::from_millis(hold));
        self.g.heal_all();
        format!("{kind}: links {links:?} (from, to) cut for {hold} ms")
    }

    /// A member (the leader half the time) `kill -9`ed and left down a long while.
    fn down_long(&mut self, l: u64) -> String {
        let (kind, id) = if self.rng.gen_bool(0.5) {
            ("long down (leader)", l)
        } else {
            ("long down (follower)", self.follower(l, None))
        };
        self.mark(kind);
        self.g.member(id).kill9();
        std::thread::sleep(self.long_down);
        self.g.member(id).spawn();
        format!(
            "{kind}: member {id} kill -9, restarted after {} s",
            self.long_down.as_secs()
        )
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
    g.leader(None, Duration::from_secs(10));
    // Declared after the group: unmounted (lazily) before its members are killed.
    let (_mounts, on_tmpfs) = match &plan.edges {
        Some(e) if e.disk => onto_tmpfs_all(&mut g),
        _ => (Vec::new(), Vec::new()),
    };
    let l = g.leader(None, Duration::from_secs(10));
    let mut sales = vec![(SKU, TOTAL)];
    if plan.edges.is_some() {
        sales.push((PROBE, PROBE_TOTAL));
    }
    for (sku, total) in &sales {
        create_sale(g.port(l), sku, *total as u64);
        rec.append(&Record::Sale {
            sku: (*sku).into(),
            total: *total,
        })
        .expect("append");
    }

    if plan.check_lsn_reuse {
        for m in &mut g.members {
            m.log_file = Some(hist_dir.path().join(format!("member-{}.log", m.id)));
        }
    }
    let shared = Shared {
        rec: rec.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        answers: Arc::new(Answers::new(CLIENTS)),
        failovers: Arc::new(Failovers::default()),
        acked: Arc::new(Mutex::new(Vec::new())),
        seed,
    };
    let (stop, answers, failovers) = (
        shared.stop.clone(),
        shared.answers.clone(),
        shared.failovers.clone(),
    );
    let edges = plan.edges.is_some();
    // A third of the clients go through the client crate's Sentinel support.
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|p| {
            let c = shared.client(&g, p, SKU, p <= SENTINEL_CLIENTS, edges);
            std::thread::spawn(move || c.run())
        })
        .collect();
    let probe = edges.then(|| {
        let c = shared.client(&g, CLIENTS + 1, PROBE, true, false);
        std::thread::spawn(move || c.probe())
    });

    // The nemesis: the faults in a seeded order, each on the leader of the moment.
    let faults = plan.schedule(&mut rng, !on_tmpfs.is_empty());
    let mut nemesis = Nemesis {
        g: &mut g,
        rng,
        started,
        immediate: plan.immediate,
        long_down: plan.edges.as_ref().map_or(Duration::ZERO, |e| e.long_down),
        failovers: failovers.clone(),
        on_tmpfs,
        problems: Vec::new(),
        wipes_off: false,
        removed: Vec::new(),
    };
    nemesis.run(&faults);
    let problems = std::mem::take(&mut nemesis.problems);
    let removed = std::mem::take(&mut nemesis.removed);
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
    if let Some(p) = probe {
        let t = p.join().expect("probe thread");
        eprintln!("raft storm: the probe: {t:?}");
    }
    if edges {
        eprintln!(
            "raft storm: failover, from each fault's start to the first acknowledged RESERVE \
             through a Sentinel-aware client (STORM_SEED={seed}):\n{}",
            failovers.table()
        );
    }

    // The final state, from the final leader, once every member has the same log.
    for m in &mut g.members {
        if m.child.is_none() && !removed.contains(&m.id) {
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
    let so_far = checker::load(&hist_path).expect("load history");
    let sku_of = token_skus(&so_far);
    let known: Vec<String> = sku_of.keys().cloned().collect();
    let read_all = |port: u16| -> BTreeMap<String, Option<String>> {
        known.iter().cloned().zip(states(port, &known)).collect()
    };
    let finals = read_all(lport);
    for (t, st) in &finals {
        rec.append(&Record::FinalReservation {
            sku: sku_of[t].clone(),
            token: t.clone(),
            state: st.clone(),
        })
        .expect("append");
    }
    for (sku, _) in &sales {
        let (total, available, reserved, committed) = sale_info(lport, sku);
        rec.append(&Record::FinalSale {
            sku: (*sku).into(),
            total,
            available,
            reserved,
            committed,
        })
        .expect("append");
    }
    let (total, available, reserved, committed) = sale_info(lport, SKU);
    rec.flush().expect("flush");

    // The checker, as a library and as the binary on the saved file.
    let records = checker::load(&hist_path).expect("load history");
    let report = checker::check(&records);
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
    let stale = stale_reads(&records);
    assert!(
        stale.is_empty(),
        "{} stale read(s) (STORM_SEED={seed}):\n{}",
        stale.len(),
        stale.join("\n")
    );
    assert!(
        problems.is_empty(),
        "the group misbehaved under the edge faults (STORM_SEED={seed}):\n{}",
        problems.join("\n")
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
    let bad = checker::check(&mutated);
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
    for m in g.members.iter().filter(|m| m.child.is_some()) {
        let info = sale_info(m.port, SKU);
        assert_eq!(
            info,
            (total, available, reserved, committed),
            "member {} SALE.INFO differs from the leader's",
            m.id
        );
        let states = read_all(m.port);
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
                            *words.entry(crate::common::as_str(&items[0])).or_insert(0) += 1;
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

/// Member A wiped and re-admitted, A elected leader, then member B wiped and
/// `RAFT.READMIT B` sent to A: B votes again. B replays a log whose membership names A
/// under its old storage; it must still take A's appends until it catches up.
#[test]
fn raft_a_readmitted_leader_readmits_a_wiped_member() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(15));
    create_sale(g.port(l), SKU, TOTAL as u64);
    for i in 0..20 {
        reserve(g.port(l), &g, SKU, &format!("u{i}"), "r1").expect("reserve");
    }
    let a = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    wipe_and_restart(&mut g, a);
    readmit(&g, a, Duration::from_secs(60)).expect("RAFT.READMIT of the first");
    wait_voting(&g, a, "1", Duration::from_secs(60)).expect("the first votes again");
    // Whoever else leads is killed and restarted until A is elected.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = g.leader(None, Duration::from_secs(20));
        if now == a {
            break;
        }
        assert!(Instant::now() < deadline, "member {a} never elected");
        g.member(now).kill9();
        std::thread::sleep(Duration::from_millis(1500));
        g.member(now).spawn();
    }
    let b = [1, 2, 3].into_iter().find(|i| *i != a).expect("another");
    wipe_and_restart(&mut g, b);
    let (on, said) = readmit(&g, b, Duration::from_secs(60)).expect("RAFT.READMIT");
    let voting = wait_voting(&g, b, "1", Duration::from_secs(30));
    assert!(
        voting.is_ok(),
        "RAFT.READMIT {b} on leader {on} (itself re-admitted) answered {said:?}, then \
         {voting:?}; member {b} knows {on} as {:?}, which runs on {:?}:\n{}",
        incarnation_seen(g.port(b), on),
        info_text(g.port(on), "raft_incarnation"),
        membership_views(&g)
    );
}

/// `stale_reads` has teeth: a read sent after a COMMIT was acknowledged that still sees
/// the hold is flagged, the same read sent before the acknowledgement is not, and a
/// refusal is no read.
#[test]
fn stale_reads_flags_a_read_older_than_an_acknowledged_write() {
    let tok = "{S}aaaaaaaaaaaaaaaaaaaaaaaaaa";
    let op = |op_id: u64, op: OpKind, t: u64, result: Outcome, reply: &str| {
        let reserve = op == OpKind::Reserve;
        [
            Record::Invoke {
                op_id,
                process: op_id,
                op,
                sku: "S".into(),
                user: reserve.then(|| "u1".into()),
                req: reserve.then(|| "r1".into()),
                token: (!reserve).then(|| tok.into()),
                qty: 1,
                t_ms: t,
            },
            Record::Complete {
                op_id,
                process: op_id,
                result,
                reply: Some(reply.into()),
                token: reserve.then(|| tok.into()),
                t_ms: t + 5,
            },
        ]
    };
    let mut h: Vec<Record> = Vec::new();
    h.extend(op(1, OpKind::Reserve, 100, Outcome::Ok, "RESERVED"));
    h.extend(op(2, OpKind::Commit, 200, Outcome::Ok, "1"));
    // Sent before the COMMIT was answered: RESERVED is still a possible answer.
    h.extend(op(3, OpKind::Read, 203, Outcome::Ok, "RESERVED via 1"));
    h.extend(op(
        4,
        OpKind::Read,
        300,
        Outcome::Fail,
        "READONLY leads no majority",
    ));
    assert!(stale_reads(&h).is_empty(), "{:?}", stale_reads(&h));
    h.extend(op(5, OpKind::Read, 400, Outcome::Ok, "RESERVED via 2"));
    h.extend(op(6, OpKind::Read, 500, Outcome::Ok, "nil via 3"));
    let stale = stale_reads(&h);
    assert_eq!(stale.len(), 2, "{stale:?}");
    assert!(
        stale[0].contains("op 5") && stale[0].contains("COMMITTED"),
        "{stale:?}"
    );
}
