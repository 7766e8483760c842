//! A client as an application runs it against a group: command lines (`SALE.CREATE`,
//! `RESERVE`, `COMMIT`, `RELEASE`) through the server's command layer (`cmd::dispatch`
//! with the member's `Shared`, whose `repl` is its `RaftNode`: so the `-READONLY` and
//! `-LOADING` gate is the server's), each reply waiting for the group's commit of the
//! LSN the command layer names. On a refusal or a lost connection (the member's process
//! gone, deposed, or no reply within the timeout) it asks a member drawn from the seed
//! `SENTINEL get-master-addr-by-name sim`, through the command layer too, and sends the
//! command again, with the same request id, to the member named.
//!
//! One command at a time, in one task: the outcome of each is in the history, and what
//! was acknowledged is kept for the final checks ([`quiescent`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_server::cmd::{dispatch, Ctx};
use stockgate_server::engine::{Engine, Lsn, ReservationState};
use stockgate_server::protocol::Reply;
use stockgate_server::raft::speculation::Speculation;
use stockgate_server::raft::{NodeId, RaftNode};
use stockgate_server::session::{ConnState, Shared};
use stockgate_server::users::Role;
use tokio::time::{sleep, Instant};

use super::boot::GROUP;
use super::{Run, REPLY_TTL, STEP};
use crate::wire::client_addr;

/// The sale this client reserves from (the other client's is `A`).
const SKU: &str = "B";
/// Attempts of one command (redirects and lost connections included) before the client
/// gives it up.
const ATTEMPTS: u32 = 20;

/// What became of an acknowledged hold, as far as the client knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Held,
    Committed,
    Released,
    /// A COMMIT or RELEASE sent and never answered: the hold is held or finished so.
    Maybe(ReservationState),
}

#[derive(Clone, Debug)]
struct Hold {
    token: String,
    qty: u32,
    fate: Fate,
}

/// The acknowledged outcomes, by request id, and the sale's size.
#[derive(Default)]
pub(super) struct Ledger {
    holds: BTreeMap<String, Hold>,
    total: u64,
    /// Counts for the history's last line: acknowledged, refused, given up.
    counts: [u64; 3],
}

/// The client's connection: the member it sends to, and the process that accepted it.
struct Conn {
    id: NodeId,
    node: Arc<RaftNode>,
    engine: Arc<Engine>,
    spec: Arc<Speculation>,
    shared: Arc<Shared>,
    deposed: Arc<AtomicBool>,
}

/// One attempt's result.
enum Answer {
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

fn connect(r: &Run, id: NodeId) -> Option<Conn> {
    let live = r.live.lock();
    // A stopped member reads nothing (`attempt` waits for it; discovery asks again).
    let n = live.get(&id).filter(|n| !n.gate.is_stopped())?;
    Some(Conn {
        id,
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
    let mut conn = ConnState::new(1, Some(Role::Admin), "sim".into(), "sim".into());
    let mut ctx = Ctx {
        engine: &c.engine,
        conn: &mut conn,
        shared: &c.shared,
    };
    let out = dispatch(&mut ctx, argv);
    (out.reply, out.lsn)
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
    let (reply, lsn) = dispatch_on(&c, &refs);
    if let Reply::Error(e) = &reply {
        if e.starts_with("READONLY") || e.starts_with("LOADING") {
            return Answer::Redirect(e.split_whitespace().next().unwrap_or("").to_owned());
        }
    }
    let until = Instant::now() + REPLY_TTL;
    // Polled rather than awaited on the commit's `watch`: tasks woken by one `watch`
    // wake in an order tokio draws at random, and the history would follow it.
    while c.spec.committed_lsn() < lsn {
        if !alive(r, &c) {
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
fn discover(r: &Run, rng: &mut StdRng) -> Option<NodeId> {
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
    r: Arc<Run>,
    rng: StdRng,
    target: Option<NodeId>,
    ledger: Arc<Mutex<Ledger>>,
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
        let t = total.to_string();
        let argv = move |_: &Engine| -> Vec<Vec<u8>> {
            let w: [&[u8]; 7] = [
                b"SALE.CREATE",
                SKU.as_bytes(),
                t.as_bytes(),
                b"SHARDS",
                b"2",
                b"TTL",
                b"3600000",
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
        let (b"RESERVED" | b"REPLAY", Some(token)) = (head, token) else {
            return self.unheld(&what, Some(Reply::Array(items)));
        };
        let head = String::from_utf8_lossy(head).into_owned();
        let at = self.target.unwrap_or(0);
        self.r.note(format!(
            "{what} on n{at}: {head} {token} (after a lost attempt: {lost})"
        ));
        self.held(rid, token, qty);
    }

    /// A hold acknowledged: its token is new (no other request was handed it).
    fn held(&mut self, rid: String, token: String, qty: u32) {
        let mut l = self.ledger.lock();
        l.counts[0] += 1;
        if let Some((other, _)) = l.holds.iter().find(|(o, h)| h.token == token && **o != rid) {
            self.r
                .fail(format!("token {token} handed to both {other} and {rid}"));
        }
        let fate = Fate::Held;
        l.holds.insert(rid, Hold { token, qty, fate });
    }

    /// A RESERVE answered without a hold (sold out), or never answered.
    fn unheld(&mut self, what: &str, reply: Option<Reply>) {
        let i = if reply.is_some() { 1 } else { 2 };
        self.ledger.lock().counts[i] += 1;
        self.r.note(format!("{what}: {reply:?}"));
    }

    /// `COMMIT` or `RELEASE` of an acknowledged hold still held, drawn.
    async fn finish(&mut self, commit: bool) {
        let held: Vec<(String, String)> = {
            let l = self.ledger.lock();
            let h = l.holds.iter().filter(|(_, h)| h.fate == Fate::Held);
            h.map(|(rid, h)| (rid.clone(), h.token.clone())).collect()
        };
        if held.is_empty() {
            return;
        }
        let (rid, token) = held[self.rng.gen_range(0..held.len())].clone();
        let name: &[u8] = if commit { b"COMMIT" } else { b"RELEASE" };
        let argv = |_: &Engine| vec![name.to_vec(), token.as_bytes().to_vec()];
        let what = format!("{} {rid}", String::from_utf8_lossy(name));
        let (reply, lost) = self.send(&what, &argv).await;
        let done = if commit {
            ReservationState::Committed
        } else {
            ReservationState::Released
        };
        let fate = match &reply {
            // 0: an earlier attempt, whose reply was lost, did it.
            Some(Reply::Int(1)) => Some(done),
            Some(Reply::Int(0)) if lost => Some(done),
            None => None,
            Some(other) => {
                self.r
                    .fail(format!("{what}: an acknowledged hold answered {other:?}"));
                return;
            }
        };
        self.r.note(format!("{what}: {reply:?}"));
        let mut l = self.ledger.lock();
        if let Some(h) = l.holds.get_mut(&rid) {
            h.fate = match fate {
                Some(ReservationState::Committed) => Fate::Committed,
                Some(_) => Fate::Released,
                None => Fate::Maybe(done),
            };
        }
    }
}

/// Runs the client until `stop`: the sale first, then a command every 40 to 160 ms,
/// RESERVE six times in ten, COMMIT or RELEASE of a hold the others.
pub(super) async fn run(
    r: Arc<Run>,
    rng: StdRng,
    stop: Arc<AtomicBool>,
    ledger: Arc<Mutex<Ledger>>,
) {
    let mut c = Client {
        target: None,
        r,
        rng,
        ledger,
    };
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
    }
    let counts = c.ledger.lock().counts;
    c.r.note(format!(
        "command client: {} holds acknowledged, {} RESERVEs answered without one, {} given up",
        counts[0], counts[1], counts[2]
    ));
}

/// The first disagreement of member `n`'s state with what was acknowledged, if any:
/// every acknowledged hold in its acknowledged state, and no more units handed out
/// than the sale has.
fn disagreement(l: &Ledger, id: NodeId, e: &Engine) -> Option<String> {
    for (rid, h) in &l.holds {
        let state = e.reservation(&h.token).map(|(v, _)| (v.state, v.qty));
        let ok = match (h.fate, state) {
            (_, None) => false,
            (_, Some((_, q))) if q != h.qty => false,
            (Fate::Held, Some((s, _))) => s == ReservationState::Reserved,
            (Fate::Committed, Some((s, _))) => s == ReservationState::Committed,
            (Fate::Released, Some((s, _))) => s == ReservationState::Released,
            (Fate::Maybe(d), Some((s, _))) => s == d || s == ReservationState::Reserved,
        };
        if !ok {
            return Some(format!(
                "n{id}: {rid} ({}) acknowledged {:?}, found {state:?}",
                h.token, h.fate
            ));
        }
    }
    let Ok(sale) = e.sale_info(SKU) else {
        return Some(format!("n{id}: no sale {SKU}"));
    };
    let out = sale.reserved + sale.committed;
    let acked: u64 = l
        .holds
        .values()
        .filter(|h| matches!(h.fate, Fate::Held | Fate::Committed))
        .map(|h| u64::from(h.qty))
        .sum();
    if out > l.total || sale.total != l.total || sale.available < 0 || acked > out {
        return Some(format!(
            "n{id}: sale {SKU} of {} has {} reserved, {} committed, {} available; {acked} units acknowledged held",
            l.total, sale.reserved, sale.committed, sale.available
        ));
    }
    None
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
) -> (
    tokio::task::JoinHandle<()>,
    Arc<AtomicBool>,
    Arc<Mutex<Ledger>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let own = StdRng::seed_from_u64(rng.gen());
    let task = tokio::spawn(run(r.clone(), own, stop.clone(), ledger.clone()));
    (task, stop, ledger)
}
