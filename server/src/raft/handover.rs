//! `SENTINEL FAILOVER` on a leader: Raft's leadership transfer (the thesis, §3.10), done
//! with what openraft 0.9 offers (it has no transfer of its own).
//!
//! The leader stops taking writes, waits until nothing of its own is in flight and a
//! target voter's log matches its own, makes sure the votes the target needs are free,
//! and asks the target (`Rpc::Elect`) to stand. The target's vote request then carries a
//! log as long as any member's, so every member whose vote is free grants it.
//!
//! Why the votes must be freed first: openraft's leader lease. A member refuses every
//! vote request while its vote is committed and less than `leader_lease` (the longest
//! election timeout) has passed since it last took a message of that vote (an append,
//! a snapshot), or, on the leader, since its own election (`Engine::handle_vote_req`;
//! only `update_vote` renews the instant, and a leader's own vote is renewed by nothing
//! after its election). Asked inside either, the target gets no votes but its own; its
//! higher term still unseats the leader, and the leader, whose log is as long, wins
//! again: the group would have moved nothing and the client been told `OK`.
//!
//! So the handover waits:
//!
//! - until the leader's own lease has run out (its first append of the term, which
//!   follows its election, and the longest election timeout and a heartbeat since): in a
//!   group of up to three voters the leader's vote and the target's own are a majority,
//!   and the leader keeps feeding every follower meanwhile;
//! - in a larger group, the target needs other followers' votes too, and they refuse
//!   while the leader's appends reach them. The leader holds back its appends (and
//!   snapshots) to every member but the target ([`AppendHold`], checked by the network
//!   before each one), waits until none of those is still on its way, and then the
//!   longest election timeout and a heartbeat (for the last one's delivery): their
//!   leases have run out, and its own with them. The followers held back do not stand
//!   meanwhile: openraft's timer waits the lease *and* an election timeout (at least
//!   1.5 times the window), and the prompted election (`stand_if_leader_gone`) waits for
//!   a leader that stops answering `Hello`, which this one still answers.
//!
//! Safety does not rest on any of it: the target is elected by Raft's own votes, and the
//! leader closed its writes first, so at most one member takes writes and nothing
//! acknowledged is missing from the target's log. A wrong guess only costs the
//! handover: the group then elects as after a lost heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`), the one
// openraft's lease is counted on.
use tokio::time::Instant;

use openraft::ServerState;

use super::append_hold::AppendHold;
use super::lease::Lease;
use super::speculation::Speculation;
use super::{network, NodeId, NodeInfo, Raft};

/// A voter that may take over: its matched log index, id and addresses.
pub type Target = (u64, NodeId, NodeInfo);

/// A leader handing over; see the module's documentation.
pub(crate) struct Handover {
    pub(crate) raft: Raft,
    pub(crate) spec: Arc<Speculation>,
    pub(crate) net: network::Network,
    pub(crate) id: NodeId,
    /// The term handed over: a handover never acts in a later one.
    pub(crate) term: u64,
    pub(crate) epoch: Instant,
    /// Writes are refused until this many ms since `epoch` (`RaftNode::refusal`).
    pub(crate) until: Arc<AtomicU64>,
    pub(crate) lease: Arc<Lease>,
    pub(crate) hold: Arc<AppendHold>,
    /// openraft's leader lease: the longest election timeout.
    pub(crate) vote_lease: Duration,
    /// The heartbeat interval: room for an append's delivery.
    pub(crate) beat: Duration,
    /// How long, at most, writes stay refused.
    pub(crate) window_ms: u64,
}

/// How often a handover looks again while it waits.
const POLL: Duration = Duration::from_millis(5);

impl Handover {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn leading(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader
            && m.current_leader == Some(self.id)
            && m.current_term == self.term
    }

    fn going_on(&self, deadline: u64) -> bool {
        self.now_ms() < deadline && self.leading()
    }

    /// Hands over to the first of `targets` that catches up (the others, in order, if
    /// it cannot stand); writes are taken again after the window if this member still
    /// leads.
    pub(crate) async fn run(self, targets: Vec<Target>) {
        let deadline = self.now_ms() + self.window_ms;
        self.until.store(deadline, Ordering::Release);
        if let Some(targets) = self.ready(targets, deadline).await {
            self.ask(&targets, deadline).await;
        }
        while self.going_on(deadline) {
            tokio::time::sleep(POLL).await;
        }
        self.hold.release(self.term);
        // Unless a later FAILOVER opened a window of its own.
        let _ = self
            .until
            .compare_exchange(deadline, 0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A caught-up target first, with the votes it needs free (see the module's
    /// documentation); `None` if the window ends or the leadership goes first.
    async fn ready(&self, targets: Vec<Target>, deadline: u64) -> Option<Vec<Target>> {
        let start = Instant::now();
        let targets = self.caught_up(targets, deadline).await?;
        let target = targets.first()?.1;
        let voters = super::authority::voters(&self.raft.metrics().borrow());
        let majority = voters.len() / 2 + 1;
        // The target's own vote and this leader's: a majority of up to three voters.
        let held = majority > 2;
        if held {
            self.hold.hold(self.term, target, Instant::now());
        }
        let leads_since = self.lease.began(self.term).unwrap_or(start);
        loop {
            if !self.going_on(deadline) {
                return None;
            }
            let free_from = if held {
                self.hold.quiet_since(self.term)
            } else {
                Some(leads_since)
            };
            if free_from.is_some_and(|t| Instant::now() >= t + self.vote_lease + self.beat) {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        // Anything this leader appended meanwhile (the held-back followers got none of
        // it; the target did).
        self.caught_up(targets, deadline).await
    }

    /// Waits until nothing of this leader's is in flight and a target matched its whole
    /// log; that target first (the others keep their order).
    async fn caught_up(&self, mut targets: Vec<Target>, deadline: u64) -> Option<Vec<Target>> {
        while self.going_on(deadline) {
            let m = self.raft.metrics().borrow().clone();
            let last = m.last_log_index.unwrap_or(0);
            let caught_up = |id: NodeId| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .is_some_and(|l| l.index >= last)
            };
            if self.spec.in_flight() == 0 {
                if let Some(i) = targets.iter().position(|(_, id, _)| caught_up(*id)) {
                    let t = targets.remove(i);
                    targets.insert(0, t);
                    return Some(targets);
                }
            }
            tokio::time::sleep(POLL).await;
        }
        None
    }

    /// Asks the targets in order to stand, until one starts an election.
    async fn ask(&self, targets: &[Target], deadline: u64) {
        for (_, target, info) in targets {
            if !self.going_on(deadline) {
                return;
            }
            match network::ask_to_elect(self.net.clone(), *target, info).await {
                Ok(()) => {
                    tracing::info!("raft: SENTINEL FAILOVER: node {target} stands for election");
                    return;
                }
                Err(e) => tracing::warn!(
                    "raft: SENTINEL FAILOVER: node {target} did not start an election: {e}"
                ),
            }
        }
    }
}
