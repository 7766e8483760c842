//! The simulated network between members: openraft's RPCs handed straight to the
//! target's `Raft`, each leg (request, reply) dropped or delayed as the seeded fault
//! state says, directed links cut by partitions (two-way or one-way) or flapping,
//! requests delivered twice (the copy perhaps late: a stale replay), crashed members
//! unreachable, stopped (paused) members holding what they send and what is sent to
//! them until they continue.
//!
//! What it leaves out of the server's network (`stockgate_server::raft::network`): the
//! TCP framing and bincode, the identity envelope (group, incarnation checks), the
//! connection back-off, and the lease's muting of a leader no majority answers. A lost
//! leg is a network error (never `Unreachable`): openraft's back-off after
//! `Unreachable` waits in a `select!` without `biased`, whose branch order tokio draws
//! from an unseeded generator.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::lease::Lease;
use stockgate_server::raft::network;
use stockgate_server::raft::{NodeId, NodeInfo, Raft, TypeConfig};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

/// The fault state and the live members, shared by every member's network client.
pub struct Net(Mutex<State>);

struct State {
    /// Each live member's Raft and the incarnation of the storage it runs on.
    rafts: BTreeMap<NodeId, (Raft, u64)>,
    /// Directed links that carry nothing.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Directed links cut and healed in turn for a while.
    flaps: Vec<Flap>,
    drop_pct: u32,
    max_delay_ms: u64,
    /// Each delivered request is delivered a second time with this probability (%),
    /// up to `dup_late_ms` after the first copy.
    dup_pct: u32,
    dup_late_ms: u64,
    rng: StdRng,
    sent: u64,
    lost: u64,
    dups: u64,
    /// Members stopped now (SIGSTOP): the pause's number, and what wakes the legs held
    /// until it continues.
    paused: BTreeMap<NodeId, (u64, Arc<Notify>)>,
    pauses: u64,
    /// A request on the wire arrives even if its sender dies or gives up
    /// (`Settings::lagging_io`).
    sent_outlives_sender: bool,
}

/// A directed link that is cut for `down`, then carries for `up`, again and again from
/// `start` until `until`. A function of the simulated time alone: no task toggles it,
/// so nothing about it depends on the order tasks run in.
#[derive(Clone, Copy, Debug)]
pub struct Flap {
    /// The link, from → to.
    pub link: (NodeId, NodeId),
    /// When the first cut begins.
    pub start: Instant,
    /// How long each cut lasts.
    pub down: Duration,
    /// How long the link carries between cuts.
    pub up: Duration,
    /// When the flapping ends (the link carries from then on).
    pub until: Instant,
}

impl Flap {
    fn cuts(&self, from: NodeId, to: NodeId, now: Instant) -> bool {
        if self.link != (from, to) || now < self.start || now >= self.until {
            return false;
        }
        let period = (self.down + self.up).as_millis().max(1);
        let into = (now - self.start).as_millis() % period;
        into < self.down.as_millis()
    }
}

impl Net {
    /// A network with no faults, drawing its delays and losses from `rng`.
    pub fn new(rng: StdRng) -> Arc<Net> {
        Arc::new(Net(Mutex::new(State {
            rafts: BTreeMap::new(),
            cut: BTreeSet::new(),
            flaps: Vec::new(),
            drop_pct: 0,
            max_delay_ms: 0,
            dup_pct: 0,
            dup_late_ms: 0,
            rng,
            sent: 0,
            lost: 0,
            dups: 0,
            paused: BTreeMap::new(),
            pauses: 0,
            sent_outlives_sender: false,
        })))
    }

    /// From now on a request on the wire arrives even if its sender dies or gives up.
    pub fn keep_sent_requests(&self) {
        self.0.lock().sent_outlives_sender = true;
    }

    /// `id` is up on storage `incarnation` and answers through `raft`.
    pub fn attach(&self, id: NodeId, raft: Raft, incarnation: u64) {
        self.0.lock().rafts.insert(id, (raft, incarnation));
    }

    /// `id` is down: calls to it fail at once (connection refused). A stopped process
    /// that dies continues no more: what was held for it is refused now.
    pub fn detach(&self, id: NodeId) {
        let mut s = self.0.lock();
        s.rafts.remove(&id);
        if let Some((_, wake)) = s.paused.remove(&id) {
            wake.notify_waiters();
        }
    }

    /// `id` stops (SIGSTOP): from now on it sends nothing and is answered nothing; every
    /// leg from or to it waits for [`Net::resume`] (its socket buffers keep them). `None`
    /// when it is down or stopped already; else the pause's number, for its resume.
    pub fn pause(&self, id: NodeId) -> Option<u64> {
        let mut s = self.0.lock();
        if !s.rafts.contains_key(&id) || s.paused.contains_key(&id) {
            return None;
        }
        s.pauses += 1;
        let n = s.pauses;
        s.paused.insert(id, (n, Arc::new(Notify::new())));
        Some(n)
    }

    /// Pause `n` of `id` ends (SIGCONT): what was held goes on, in the order it came.
    /// `false` when that pause ended already (the process died).
    pub fn resume(&self, id: NodeId, n: u64) -> bool {
        let mut s = self.0.lock();
        if s.paused.get(&id).map(|p| p.0) != Some(n) {
            return false;
        }
        if let Some((_, wake)) = s.paused.remove(&id) {
            wake.notify_waiters();
        }
        true
    }

    /// The number of the pause `id` is in now, if stopped.
    pub fn pause_of(&self, id: NodeId) -> Option<u64> {
        self.0.lock().paused.get(&id).map(|p| p.0)
    }

    /// Whether `id` is stopped now.
    pub fn is_paused(&self, id: NodeId) -> bool {
        self.0.lock().paused.contains_key(&id)
    }

    /// Returns once `id` is not stopped; at once (without yielding) when it is not, so
    /// a run without pauses schedules its tasks as it did before they existed. Waiters
    /// wake in the order they began to wait.
    pub async fn resumed(&self, id: NodeId) {
        loop {
            let wake = self.0.lock().paused.get(&id).map(|p| p.1.clone());
            let Some(wake) = wake else {
                return;
            };
            // Created before anything else runs (one thread): a resume from now on
            // wakes it.
            wake.notified().await;
        }
    }

    /// Cuts every link between `side` and the other members (both directions); the
    /// previous partition heals.
    pub fn partition(&self, side: &BTreeSet<NodeId>, all: &BTreeSet<NodeId>) {
        self.cut_from(side, all, true);
    }

    /// Cuts the links from `side` to the other members only: what `side` sends is
    /// lost, what the others send reaches it. The previous partition heals.
    pub fn partition_one_way(&self, side: &BTreeSet<NodeId>, all: &BTreeSet<NodeId>) {
        self.cut_from(side, all, false);
    }

    /// The links from `side` to the rest cut (and back with `both`), and no other.
    fn cut_from(&self, side: &BTreeSet<NodeId>, all: &BTreeSet<NodeId>, both: bool) {
        let mut s = self.0.lock();
        s.cut.clear();
        for a in side {
            for b in all.difference(side) {
                s.cut.insert((*a, *b));
                if both {
                    s.cut.insert((*b, *a));
                }
            }
        }
    }

    /// Adds a flapping link (it runs alongside any partition).
    pub fn flap(&self, f: Flap) {
        self.0.lock().flaps.push(f);
    }

    /// Every link carries again: partitions and flapping links end.
    pub fn heal(&self) {
        let mut s = self.0.lock();
        s.cut.clear();
        s.flaps.clear();
    }

    /// Each delivered request is delivered again with probability `pct`%, the copy up
    /// to `late_ms` after the first (so perhaps after later requests of the same link).
    pub fn set_duplicates(&self, pct: u32, late_ms: u64) {
        let mut s = self.0.lock();
        s.dup_pct = pct;
        s.dup_late_ms = late_ms;
    }

    /// Each leg is lost with probability `drop_pct`% and delayed up to `max_delay_ms`.
    pub fn set_quality(&self, drop_pct: u32, max_delay_ms: u64) {
        let mut s = self.0.lock();
        s.drop_pct = drop_pct;
        s.max_delay_ms = max_delay_ms;
    }

    /// Legs sent, lost, and requests delivered twice so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = self.0.lock();
        (s.sent, s.lost, s.dups)
    }

    /// The fate of one leg `from` → `to`: its delay, or `None` when it is lost.
    fn leg(&self, from: NodeId, to: NodeId) -> Option<Duration> {
        let mut s = self.0.lock();
        s.sent += 1;
        let lost_roll = s.rng.gen_range(0..100u32);
        let most = s.max_delay_ms;
        let delay = s.rng.gen_range(0..=most);
        let now = Instant::now();
        let flapping = s.flaps.iter().any(|f| f.cuts(from, to, now));
        if s.cut.contains(&(from, to)) || flapping || lost_roll < s.drop_pct {
            s.lost += 1;
            return None;
        }
        Some(Duration::from_millis(delay))
    }

    /// Whether a delivered request is delivered a second time, and how long after the
    /// first copy. Draws nothing while duplicates are off, so a run without them keeps
    /// the generator's sequence.
    fn duplicate(&self) -> Option<Duration> {
        let mut s = self.0.lock();
        if s.dup_pct == 0 {
            return None;
        }
        let roll = s.rng.gen_range(0..100u32);
        let most = s.dup_late_ms;
        let late = s.rng.gen_range(0..=most);
        if roll >= s.dup_pct {
            return None;
        }
        s.dups += 1;
        Some(Duration::from_millis(late))
    }

    /// A `Hello` from `from` to `to` and its answer, as `RaftNode::reach` sends it: both
    /// legs delivered, `to` up, and on the storage the membership names
    /// (`incarnation`). Instant: the reach check only counts who answered.
    pub fn hello(&self, from: NodeId, to: NodeId, incarnation: u64) -> bool {
        let there = self.leg(from, to).is_some();
        let back = self.leg(to, from).is_some();
        let up = self.raft(to).is_some_and(|(_, i)| i == incarnation);
        let stopped = self.is_paused(from) || self.is_paused(to);
        there && back && up && !stopped
    }

    fn raft(&self, id: NodeId) -> Option<(Raft, u64)> {
        self.0.lock().rafts.get(&id).cloned()
    }
}

/// One member's `RaftNetworkFactory`: its clients to the others.
pub struct Factory {
    /// The member these clients call from.
    pub from: NodeId,
    /// The shared network.
    pub net: Arc<Net>,
    /// The member's lease, fed by its appends as the server's network feeds it.
    pub lease: Arc<Lease>,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Peer {
        Peer {
            from: self.from,
            to: target,
            expect: node.incarnation,
            net: self.net.clone(),
            lease: self.lease.clone(),
        }
    }
}

/// A client of one peer.
pub struct Peer {
    from: NodeId,
    to: NodeId,
    /// The storage the membership names for `to`: an answer from any other (a member
    /// restarted on a wiped disk, not yet re-admitted) is never counted, as the
    /// server's identity envelope refuses it.
    expect: u64,
    net: Arc<Net>,
    lease: Arc<Lease>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, NodeInfo, E>>;

/// What became of a request that reached its target: the target's answer, or why
/// there was none (a network error).
type Delivered<T, E> = Result<Result<T, RaftError<NodeId, E>>, &'static str>;

fn net_err<E: std::error::Error>(why: &str) -> RPCError<NodeId, NodeInfo, E> {
    RPCError::Network(NetworkError::new(&io::Error::other(why.to_owned())))
}

impl Peer {
    /// One call: the request leg, the target's answer to `rpc`, the reply leg. A lost
    /// leg costs the call's time-to-live, as a silent peer does. A delivered request may
    /// be delivered again later (`Net::duplicate`); the copy's answer goes nowhere. A
    /// stopped caller sends only once it continues and reads the reply only then; a
    /// request reaching a stopped target waits in its buffer (`Peer::held`).
    async fn call<R, T, E, F, Fut>(
        &self,
        ttl: Duration,
        rpc: R,
        f: F,
    ) -> RpcResult<T, RaftError<NodeId, E>>
    where
        R: Clone + Send + 'static,
        T: Send + 'static,
        E: std::error::Error + Send + 'static,
        RaftError<NodeId, E>: std::error::Error,
        F: Fn(Raft, R) -> Fut + Copy + Send + 'static,
        Fut: Future<Output = Result<T, RaftError<NodeId, E>>> + Send + 'static,
    {
        self.net.resumed(self.from).await;
        let start = Instant::now();
        let Some(there) = self.net.leg(self.from, self.to) else {
            tokio::time::sleep(ttl).await;
            return Err(net_err("request lost"));
        };
        if let Some(late) = self.net.duplicate() {
            self.replay(there + late, rpc.clone(), f);
        }
        let r = if self.net.0.lock().sent_outlives_sender {
            self.detached(there, ttl, rpc, f).await
        } else {
            tokio::time::sleep(there).await;
            self.deliver(ttl, rpc, f).await
        };
        let r = r.map_err(net_err)?;
        // A stopped target sends its reply once it continues.
        self.net.resumed(self.to).await;
        let Some(back) = self.net.leg(self.to, self.from) else {
            tokio::time::sleep_until(start + ttl).await;
            return Err(net_err("reply lost"));
        };
        tokio::time::sleep(back).await;
        self.net.resumed(self.from).await;
        r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    /// The request handed to its target: held if the target is stopped, else answered.
    async fn deliver<R, T, E, F, Fut>(&self, ttl: Duration, rpc: R, f: F) -> Delivered<T, E>
    where
        R: Send + 'static,
        T: Send + 'static,
        E: std::error::Error + Send + 'static,
        RaftError<NodeId, E>: std::error::Error,
        F: Fn(Raft, R) -> Fut + Copy + Send + 'static,
        Fut: Future<Output = Result<T, RaftError<NodeId, E>>> + Send + 'static,
    {
        if self.net.is_paused(self.to) {
            self.held(ttl, rpc, f).await
        } else {
            answer(&self.net, (self.to, self.expect), ttl, rpc, f).await
        }
    }

    /// The request's leg and its delivery in a task of their own: a request on the wire
    /// arrives even if its sender dies meanwhile (the kernel sends what the socket
    /// holds) or gives up waiting; the answer then goes nowhere.
    async fn detached<R, T, E, F, Fut>(
        &self,
        there: Duration,
        ttl: Duration,
        rpc: R,
        f: F,
    ) -> Delivered<T, E>
    where
        R: Send + 'static,
        T: Send + 'static,
        E: std::error::Error + Send + 'static,
        RaftError<NodeId, E>: std::error::Error,
        F: Fn(Raft, R) -> Fut + Copy + Send + 'static,
        Fut: Future<Output = Result<T, RaftError<NodeId, E>>> + Send + 'static,
    {
        let peer = Peer {
            from: self.from,
            to: self.to,
            expect: self.expect,
            net: self.net.clone(),
            lease: self.lease.clone(),
        };
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            tokio::time::sleep(there).await;
            let _ = tx.send(peer.deliver(ttl, rpc, f).await);
        });
        rx.await.unwrap_or(Err("the request was never handled"))
    }

    /// A request that reached a stopped target: its socket keeps it, and it is handled
    /// when the target continues, in the order it came, even if the caller has given up
    /// meanwhile (openraft drops a call after its time-to-live); then the answer goes
    /// nowhere.
    async fn held<R, T, E, F, Fut>(&self, ttl: Duration, rpc: R, f: F) -> Delivered<T, E>
    where
        R: Send + 'static,
        T: Send + 'static,
        E: std::error::Error + Send + 'static,
        RaftError<NodeId, E>: std::error::Error,
        F: Fn(Raft, R) -> Fut + Copy + Send + 'static,
        Fut: Future<Output = Result<T, RaftError<NodeId, E>>> + Send + 'static,
    {
        let (net, to) = (self.net.clone(), (self.to, self.expect));
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            net.resumed(to.0).await;
            let _ = tx.send(answer(&net, to, ttl, rpc, f).await);
        });
        rx.await
            .unwrap_or(Err("the held request was never handled"))
    }

    /// A second copy of a delivered request, handed to `to` after `after` (or when it
    /// continues, if stopped then) if the same storage still answers there then. Its
    /// answer is dropped: the caller has taken the first copy's (or given up), so only
    /// the target's state sees the copy.
    fn replay<R, T, E, F, Fut>(&self, after: Duration, rpc: R, f: F)
    where
        R: Send + 'static,
        F: FnOnce(Raft, R) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, RaftError<NodeId, E>>> + Send + 'static,
    {
        let (net, to, expect) = (self.net.clone(), self.to, self.expect);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            net.resumed(to).await;
            if let Some((raft, incarnation)) = net.raft(to) {
                if incarnation == expect {
                    let _ = f(raft, rpc).await;
                }
            }
        });
    }
}

/// The target's side of a delivered request: refused when it is down, unanswered when
/// another storage runs under its id (the outer `Err`), else its Raft's answer.
async fn answer<R, T, E, F, Fut>(
    net: &Net,
    (to, expect): (NodeId, u64),
    ttl: Duration,
    rpc: R,
    f: F,
) -> Delivered<T, E>
where
    E: std::error::Error,
    RaftError<NodeId, E>: std::error::Error,
    F: Fn(Raft, R) -> Fut,
    Fut: Future<Output = Result<T, RaftError<NodeId, E>>>,
{
    let Some((raft, incarnation)) = net.raft(to) else {
        // The server backs a refused peer off (from `BACKOFF_FIRST`, doubling); a
        // refusal here costs the first pause, so openraft's retry of a network error
        // never spins without simulated time passing.
        tokio::time::sleep(network::BACKOFF_FIRST.max(Duration::from_millis(50))).await;
        return Err("connection refused");
    };
    if incarnation != expect {
        tokio::time::sleep(ttl).await;
        return Err("another storage answers under this id");
    }
    Ok(f(raft, rpc).await)
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let term = rpc.vote.leader_id.term;
        let sent = Instant::now();
        self.lease.sending(term, sent);
        let r = self
            .call(option.hard_ttl(), rpc, |raft, rpc| async move {
                raft.append_entries(rpc).await
            })
            .await;
        if matches!(&r, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
            self.lease.accepted(self.to, term, sent);
        }
        r
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<
        InstallSnapshotResponse<NodeId>,
        RaftError<NodeId, openraft::error::InstallSnapshotError>,
    > {
        self.call(option.hard_ttl(), rpc, |raft, rpc| async move {
            raft.install_snapshot(rpc).await
        })
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(option.hard_ttl(), rpc, |raft, rpc| async move {
            raft.vote(rpc).await
        })
        .await
    }
}
