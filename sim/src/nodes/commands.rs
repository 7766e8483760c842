//! A client as an application runs it against a group: command lines (`SALE.CREATE`,
//! `RESERVE`, `COMMIT`, `RELEASE`) through the server's command layer (`cmd::dispatch`
//! with the member's `Shared`, whose `repl` is its `RaftNode`: so the `-READONLY` and
//! `-LOADING` gate is the server's), each reply waiting for the group's commit of the
//! LSN the command layer names. On a refusal or a lost connection (the member's process
//! gone, deposed, or no reply within the timeout) it asks a member drawn from the seed
//! `SENTINEL get-master-addr-by-name sim`, through the command layer too, and sends the
//! command again, with the same request id, to the member named.
//!
//! Between them it EXTENDs holds it holds and reads (`reads`): a hold's state and the
//! sale's counters, from the member it takes for the master and, on a connection that
//! accepts stale reads, from any member.
//!
//! One command at a time, in one task: the outcome of each is in the history, and what
//! was acknowledged is kept for the reads' checks and the final ones ([`quiescent`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_server::cmd::{dispatch, Ctx, Outcome};
use stockgate_server::engine::{Engine, Lsn, Millis, ReservationState};
use stockgate_server::protocol::Reply;
use stockgate_server::raft::speculation::Speculation;
use stockgate_server::raft::{NodeId, RaftNode};
use stockgate_server::session::{ConnState, Shared};
use stockgate_server::users::Role;
use tokio::time::{sleep, Instant};

use super::boot::GROUP;
use super::ledger::{count, disagreement, Fate, Hold, Ledger, Reads, SKU};
use super::{Run, REPLY_TTL, STEP};
use crate::wire::client_addr;

/// Attempts of one command (redirects and lost connections included) before the client
/// gives it up.
const ATTEMPTS: u32 = 20;

/// The client's connection: the member it sends to, and the process that accepted it.
pub(super) struct Conn {
    pub id: NodeId,
    /// The process (its origin).
    pub process: u64,
    node: Arc<RaftNode>,
    engine: Arc<Engine>,
    spec: Arc<Speculation>,
    shared: Arc<Shared>,
    deposed: Arc<AtomicBool>,
}

/// One attempt's result.
pub(super) enum Answer {
    /// The reply, released by the commit of what it waited for.
    Reply(Reply),
    /// `-READONLY` or `-LOADING`: the member does not take writes.
    Redirect(String),
    /// No reply: the process is gone, deposed, or the reply timed out. The command may
    /// or may not have taken effect.
    Lost(String),
    /// No member to send to.
    Nowhere,
}

pub(super) fn connect(r: &Run, id: NodeId) -> Option<Conn> {
    let live = r.live.lock();
    // A stopped member reads nothing (`attempt` waits for it; discovery asks again).
    let n = live.get(&id).filter(|n| !n.gate.is_stopped())?;
    Some(Conn {
        id,
        process: n.process,
        node: n.node.clone(),
        engine: n.engine.clone(),
        spec: n.spec.clone(),
        shared: n.shared.clone(),
        deposed: n.deposed.clone(),
    })
}

/// Whether the process `c` was made on still runs (a connection to a process that died
/// is reset).
fn alive(r: &Run, c: &Conn) -> bool {
    let live = r.live.lock();
    live.get(&c.id)
        .is_some_and(|n| Arc::ptr_eq(&n.node, &c.node) && !c.deposed.load(Ordering::Acquire))
}

/// One command on a fresh admin connection, as `Session` runs it: the reply and the LSN
/// it waits for.
fn dispatch_on(c: &Conn, argv: &[&[u8]]) -> (Reply, Lsn) {
    dispatch_with(c, argv, false)
}

/// [`dispatch_on`] on a connection that sent `READONLY` (accepts stale reads) if
/// `stale`.
fn dispatch_with(c: &Conn, argv: &[&[u8]], stale: bool) -> (Reply, Lsn) {
    let out = outcome_of(c, argv, stale);
    (out.reply, out.lsn)
}

/// What the command layer gives for `argv` on `c`, a blocking read's wait included.
fn outcome_of(c: &Conn, argv: &[&[u8]], stale: bool) -> Outcome {
    let mut conn = ConnState::new(1, Some(Role::Admin), "sim".into(), "sim".into());
    conn.stale_reads = stale;
    let mut ctx = Ctx {
        engine: &c.engine,
        conn: &mut conn,
        shared: &c.shared,
    };
    dispatch(&mut ctx, argv)
}

/// A read that may block (`XREAD … BLOCK ms`) on `c`, on a connection that accepts
/// stale reads: its reply, or the one its wait gives (as a connection awaits it), taken
/// only once the member runs (a stopped process answers nothing until continued).
pub(super) async fn answer_blocking(r: &Run, c: &Conn, argv: &[&[u8]]) -> Answer {
    let out = outcome_of(c, argv, true);
    let Some(wait) = out.wait else {
        return Answer::Reply(out.reply);
    };
    let reply = wait.await;
    if !alive(r, c) || !super::pause::continued(r, c.id, REPLY_TTL).await {
        return Answer::Lost(format!("n{} went away while a read blocked", c.id));
    }
    Answer::Reply(reply)
}

/// Sends `argv` (built on the member's engine: a RESERVE's admission is minted by the
/// gate in front of it) to member `id` and waits for the reply's commit.
async fn attempt(r: &Run, id: NodeId, argv: &(dyn Fn(&Engine) -> Vec<Vec<u8>> + Sync)) -> Answer {
    if !super::pause::continued(r, id, REPLY_TTL).await {
        return Answer::Lost(format!("n{id} stopped: no reply within {REPLY_TTL:?}"));
    }
    let Some(c) = connect(r, id) else {
        return Answer::Lost(format!("n{id} is down"));
    };
    let words = argv(&c.engine);
    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
    answer(r, &c, &refs, false).await
}

/// `argv` on `c` (on a connection that accepts stale reads if `stale`), its reply once
/// what it waits for is committed there.
pub(super) async fn answer(r: &Run, c: &Conn, argv: &[&[u8]], stale: bool) -> Answer {
    let id = c.id;
    let (reply, lsn) = dispatch_with(c, argv, stale);
    if let Reply::Error(e) = &reply {
        if e.starts_with("READONLY") || e.starts_with("LOADING") {
            return Answer::Redirect(e.split_whitespace().next().unwrap_or("").to_owned());
        }
    }
    let until = Instant::now() + REPLY_TTL;
    // Polled rather than awaited on the commit's `watch`: tasks woken by one `watch`
    // wake in an order tokio draws at random, and the history would follow it.
    while c.spec.committed_lsn() < lsn {
        if !alive(r, c) {
            return Answer::Lost(format!("n{id} went away"));
        }
        if Instant::now() >= until {
            return Answer::Lost(format!("n{id}: no reply within {REPLY_TTL:?}"));
        }
        sleep(STEP).await;
    }
    Answer::Reply(reply)
}

/// `SENTINEL get-master-addr-by-name sim` on a member drawn from the live ones, through
/// the command layer: the member it names, if any.
pub(super) fn discover(r: &Run, rng: &mut StdRng) -> Option<NodeId> {
    let ids: Vec<NodeId> = r.ids().into_iter().collect();
    let asked = *ids.get(rng.gen_range(0..ids.len().max(1)))?;
    let c = connect(r, asked)?;
    let argv: [&[u8]; 3] = [b"SENTINEL", b"get-master-addr-by-name", GROUP.as_bytes()];
    let Reply::Array(items) = dispatch_on(&c, &argv).0 else {
        return None;
    };
    let host = items.first().and_then(|h| h.as_bulk())?;
    let port = items.get(1).and_then(|p| p.as_bulk())?;
    let addr = format!(
        "{}:{}",
        String::from_utf8_lossy(host),
        String::from_utf8_lossy(port)
    );
    r.env.ids.iter().copied().find(|i| client_addr(*i) == addr)
}

/// The client's state: where it sends, its generator, what was acknowledged.
pub(super) struct Client {
    pub r: Arc<Run>,
    pub rng: StdRng,
    /// The member it takes for the master.
    pub target: Option<NodeId>,
    pub ledger: Arc<Mutex<Ledger>>,
    /// The sale's hold TTL (ms).
    ttl_ms: u64,
    /// What reads saw, per member process.
    pub reads: Reads,
    /// Draws for EXTEND and the reads (a generator of their own).
    pub extra: StdRng,
}

impl Client {
    /// Sends `argv` until it is answered (discovering the leader again after each
    /// redirect or lost connection), at most [`ATTEMPTS`] times. `(reply, lost)`: the
    /// reply, if any, and whether an attempt before it was lost (its effect unknown).
    async fn send(
        &mut self,
        what: &str,
        argv: &(dyn Fn(&Engine) -> Vec<Vec<u8>> + Sync),
    ) -> (Option<Reply>, bool) {
        let mut lost = false;
        for _ in 0..ATTEMPTS {
            let answer = match self.target {
                Some(id) => attempt(&self.r, id, argv).await,
                None => Answer::Nowhere,
            };
            let why = match answer {
                Answer::Reply(reply) => return (Some(reply), lost),
                Answer::Redirect(e) => e,
                Answer::Lost(e) => {
                    lost = true;
                    e
                }
                Answer::Nowhere => "no master known".to_owned(),
            };
            self.r.note(format!("{what}: {why}: asks discovery"));
            sleep(Duration::from_millis(self.rng.gen_range(20..200))).await;
            self.target = discover(&self.r, &mut self.rng);
        }
        (None, lost)
    }

    /// Creates the sale (retried until answered): `false` if it never is.
    async fn create_sale(&mut self) -> bool {
        let total: u64 = self.rng.gen_range(30..300);
        self.ledger.lock().total = total;
        let (t, ttl) = (total.to_string(), self.ttl_ms.to_string());
        let argv = move |_: &Engine| -> Vec<Vec<u8>> {
            let w: [&[u8]; 7] = [
                b"SALE.CREATE",
                SKU.as_bytes(),
                t.as_bytes(),
                b"SHARDS",
                b"2",
                b"TTL",
                ttl.as_bytes(),
            ];
            w.iter().map(|x| x.to_vec()).collect()
        };
        let (reply, _) = self.send("SALE.CREATE B", &argv).await;
        // A second attempt of the same creation is answered OK too.
        let ok = matches!(&reply, Some(Reply::Simple("OK")));
        self.r.note(format!("SALE.CREATE B {total}: {reply:?}"));
        if !ok {
            self.r
                .fail(format!("SALE.CREATE B never answered OK: {reply:?}"));
        }
        ok
    }
}

impl Client {
    /// `RESERVE B user admission request-id QTY n`, sent again with the same request id
    /// until answered. The token acknowledged must be one no other request was handed.
    async fn reserve(&mut self, n: u64) {
        let (user, rid) = (format!("w{n}"), format!("q{n}"));
        let qty: u32 = self.rng.gen_range(1..=3);
        let argv = |e: &Engine| -> Vec<Vec<u8>> {
            let admission = e.keyring().mint(SKU, &user, e.now_ms() + 60_000);
            let q = qty.to_string();
            let w: [&[u8]; 7] = [
                b"RESERVE",
                SKU.as_bytes(),
                user.as_bytes(),
                admission.as_bytes(),
                rid.as_bytes(),
                b"QTY",
                q.as_bytes(),
            ];
            w.iter().map(|x| x.to_vec()).collect()
        };
        let what = format!("RESERVE {rid} x{qty}");
        let (reply, lost) = self.send(&what, &argv).await;
        let items = match reply {
            Some(Reply::Array(items)) => items,
            other => return self.unheld(&what, other),
        };
        let head = items.first().and_then(|w| w.as_bulk()).unwrap_or_default();
        let token = items.get(1).and_then(|w| w.as_bulk());
        let token = token.map(|t| String::from_utf8_lossy(t).into_owned());
        let deadline = match items.get(2) {
            Some(Reply::Int(at)) => Some((*at).max(0) as Millis),
            _ => None,
        };
        let (b"RESERVED" | b"REPLAY", Some(token), Some(deadline)) = (head, token, deadline) else {
            return self.unheld(&what, Some(Reply::Array(items)));
        };
        let head = String::from_utf8_lossy(head).into_owned();
        let at = self.target.unwrap_or(0);
        self.r.note(format!(
            "{what} on n{at}: {head} {token} until {deadline} (after a lost attempt: {lost})"
        ));
        self.held(rid, token, qty, deadline);
    }

    /// A hold acknowledged: its token is new (no other request was handed it).
    fn held(&mut self, rid: String, token: String, qty: u32, deadline: Millis) {
        let mut l = self.ledger.lock();
        l.counts[count::HELD] += 1;
        if let Some((other, _)) = l.holds.iter().find(|(o, h)| h.token == token && **o != rid) {
            self.r
                .fail(format!("token {token} handed to both {other} and {rid}"));
        }
        let hold = Hold {
            token,
            qty,
            fate: Fate::Held,
            deadline,
            extend_in_doubt: false,
        };
        l.holds.insert(rid, hold);
    }

    /// A RESERVE answered without a hold (sold out), or never answered.
    fn unheld(&mut self, what: &str, reply: Option<Reply>) {
        let i = if reply.is_some() {
            count::UNHELD
        } else {
            count::GIVEN_UP
        };
        self.ledger.lock().counts[i] += 1;
        self.r.note(format!("{what}: {reply:?}"));
    }

    /// An acknowledged hold still held (as far as the client knows), drawn from the
    /// client's generator (or, with `extra`, from the one of EXTEND and the reads): its
    /// request id and token.
    fn pick_held(&mut self, extra: bool) -> Option<(String, String)> {
        let held: Vec<(String, String)> = {
            let l = self.ledger.lock();
            let h = l.holds.iter().filter(|(_, h)| h.fate == Fate::Held);
            h.map(|(rid, h)| (rid.clone(), h.token.clone())).collect()
        };
        if held.is_empty() {
            return None;
        }
        let rng = if extra {
            &mut self.extra
        } else {
            &mut self.rng
        };
        Some(held[rng.gen_range(0..held.len())].clone())
    }

    /// `COMMIT` or `RELEASE` of an acknowledged hold still held, drawn.
    async fn finish(&mut self, commit: bool) {
        let Some((rid, token)) = self.pick_held(false) else {
            return;
        };
        let name: &[u8] = if commit { b"COMMIT" } else { b"RELEASE" };
        let argv = |_: &Engine| vec![name.to_vec(), token.as_bytes().to_vec()];
        let what = format!("{} {rid}", String::from_utf8_lossy(name));
        let (reply, lost) = self.send(&what, &argv).await;
        let done = if commit {
            ReservationState::Committed
        } else {
            ReservationState::Released
        };
        let late = |e: &str| e.starts_with("EXPIRED") || e.starts_with("RELEASED");
        let fate = match &reply {
            // 0: an earlier attempt, whose reply was lost, did it.
            Some(Reply::Int(1)) => Fate::from(done),
            Some(Reply::Int(0)) if lost || !commit => Fate::from(done),
            // Past its deadline where it was answered: expired, or soon.
            Some(Reply::Error(e)) if commit && late(e) => Fate::Late,
            None => Fate::Maybe(done),
            Some(other) => {
                self.r
                    .fail(format!("{what}: an acknowledged hold answered {other:?}"));
                return;
            }
        };
        self.r.note(format!("{what}: {reply:?}"));
        if let Some(h) = self.ledger.lock().holds.get_mut(&rid) {
            h.fate = fate;
        }
    }

    /// `EXTEND token ms` of an acknowledged hold still held, drawn, by 0.1 to 5 s (three
    /// times in four) or 30 s to 10 min: the new deadline acknowledged is what every
    /// member must have, unless a later EXTEND is in doubt.
    async fn extend(&mut self) {
        let Some((rid, token)) = self.pick_held(true) else {
            return;
        };
        let ms: u64 = if self.extra.gen_range(0..4) < 3 {
            self.extra.gen_range(100..5_000)
        } else {
            self.extra.gen_range(30_000..600_000)
        };
        let m = ms.to_string();
        let argv = |_: &Engine| {
            vec![
                b"EXTEND".to_vec(),
                token.as_bytes().to_vec(),
                m.as_bytes().to_vec(),
            ]
        };
        let what = format!("EXTEND {rid} {ms}");
        let (reply, lost) = self.send(&what, &argv).await;
        self.r
            .note(format!("{what}: {reply:?} (after a lost attempt: {lost})"));
        let gone = |e: &str| e.starts_with("EXPIRED") || e.starts_with("NORES");
        let mut l = self.ledger.lock();
        let (i, outcome) = match &reply {
            Some(Reply::Int(at)) => (count::EXTENDED, Ok(Some((*at).max(0) as Millis))),
            Some(Reply::Error(e)) if gone(e) => (count::EXTEND_LATE, Ok(None)),
            None => (count::EXTEND_GIVEN_UP, Err(true)),
            Some(_) => (count::EXTEND_LATE, Err(false)),
        };
        l.counts[i] += 1;
        let Some(h) = l.holds.get_mut(&rid) else {
            return;
        };
        match outcome {
            Ok(Some(at)) => {
                h.deadline = at;
                h.extend_in_doubt = false;
            }
            Ok(None) => h.fate = Fate::Late,
            Err(true) => h.extend_in_doubt = true,
            Err(false) => {
                drop(l);
                self.r
                    .fail(format!("{what}: an acknowledged hold answered {reply:?}"));
            }
        }
    }
}

impl From<ReservationState> for Fate {
    fn from(s: ReservationState) -> Fate {
        match s {
            ReservationState::Committed => Fate::Committed,
            ReservationState::Released => Fate::Released,
            ReservationState::Reserved => Fate::Held,
        }
    }
}

/// Runs the client until `stop`: the sale first, then a command every 40 to 160 ms,
/// RESERVE six times in ten, COMMIT or RELEASE of a hold the others; after each, one
/// time in four an EXTEND and one time in two a read (drawn from a generator of their
/// own, so the commands drawn are the ones drawn before these existed).
pub(super) async fn run(mut c: Client, stop: Arc<AtomicBool>) {
    if !c.create_sale().await {
        return;
    }
    let mut n = 0;
    while !stop.load(Ordering::Acquire) {
        sleep(Duration::from_millis(c.rng.gen_range(40..160))).await;
        match c.rng.gen_range(0..10) {
            0..=5 => {
                n += 1;
                c.reserve(n).await;
            }
            6 | 7 => c.finish(true).await,
            _ => c.finish(false).await,
        }
        if c.extra.gen_range(0..4) == 0 {
            c.extend().await;
        }
        if c.extra.gen_bool(0.5) {
            c.read().await;
        }
    }
    let counts = c.ledger.lock().counts;
    c.r.note(format!(
        "command client: {} holds acknowledged, {} RESERVEs answered without one, {} given up; \
         EXTENDs: {} acknowledged, {} refused past the deadline, {} given up; \
         reads: {} of a hold and {} of the sale from the master, {} stale, {} refused or lost",
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4],
        counts[5],
        counts[6],
        counts[7],
        counts[8],
        counts[9]
    ));
}

/// With every member up and every link healed: waits (at most `within`) until every
/// member holds every acknowledged outcome; a failure naming the first disagreement
/// if that never happens.
pub(super) async fn quiescent(r: &Run, ledger: &Mutex<Ledger>, within: Duration) {
    let start = Instant::now();
    loop {
        let found = {
            let l = ledger.lock();
            let live = r.live.lock();
            live.values()
                .find_map(|n| disagreement(&l, n.id, &n.engine))
        };
        let Some(what) = found else {
            let l = ledger.lock();
            return r.note(format!(
                "quiescent after {} ms: {} acknowledged holds of sale {SKU} as acknowledged on {:?}",
                start.elapsed().as_millis(),
                l.holds.len(),
                r.ids()
            ));
        };
        if start.elapsed() >= within {
            return r.fail(format!("not quiescent within {within:?}: {what}"));
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// Starts the client on its own generator (drawn from `rng`): its task, the flag that
/// stops it, and what it gets acknowledged.
pub(super) fn spawn(
    r: &Arc<Run>,
    rng: &mut StdRng,
    (ttl_ms, extra): (u64, StdRng),
) -> (
    tokio::task::JoinHandle<()>,
    Arc<AtomicBool>,
    Arc<Mutex<Ledger>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let c = Client {
        r: r.clone(),
        rng: StdRng::seed_from_u64(rng.gen()),
        target: None,
        ledger: ledger.clone(),
        ttl_ms,
        reads: Reads::default(),
        extra,
    };
    let task = tokio::spawn(run(c, stop.clone()));
    (task, stop, ledger)
}
