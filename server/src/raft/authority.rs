//! Whether this member may act as the group's leader for clients right now: the one
//! predicate the write gate, the read gate of stock state and every discovery answer
//! (`SENTINEL`, `ROLE`, `INFO replication`, `CLUSTER SLOTS|SHARDS|NODES`) share, so that
//! a member never names itself master while it refuses writes for want of a majority.
//!
//! openraft 0.9 keeps a leader a leader until it hears of a higher term: a leader cut
//! off from every follower stays `ServerState::Leader` for as long as the cut lasts (it
//! has no step-down on a lost quorum, no pre-vote, no leader transfer). A follower
//! refuses to vote until its own lease (the longest election timeout) has run out since
//! the leader's last heartbeat, so no other leader can exist while a majority accepted
//! appends this leader sent within the shortest election timeout: that is the lease,
//! dated by the sends ([`lease`](super::lease)), never by when a reply was read.

use std::collections::BTreeSet;

use openraft::{RaftMetrics, ServerState};

use super::{NodeId, NodeInfo};

/// The lease: a majority acknowledged this leader `age_ms` ago (`None`: never in this
/// process), and it holds while that is shorter than `window_ms` (the shortest election
/// timeout). A group of one voter is its own majority; with no voters known (a member
/// not yet told its membership) nobody holds it.
pub fn lease_held(age_ms: Option<u64>, window_ms: u64, voters: usize) -> bool {
    voters == 1 || age_ms.is_some_and(|a| a < window_ms)
}

/// This member leads in Raft's view and holds the lease: it may say so to clients.
pub fn acts_as_leader(me: NodeId, m: &RaftMetrics<NodeId, NodeInfo>, lease: bool) -> bool {
    leads(me, m) && lease
}

/// The group's voters as `m` shows them.
pub fn voters(m: &RaftMetrics<NodeId, NodeInfo>) -> BTreeSet<NodeId> {
    m.membership_config.membership().voter_ids().collect()
}

/// Writes opened for `open_term` must close: this member no longer leads in Raft's
/// view, or leads another term.
pub fn must_close_writes(me: NodeId, m: &RaftMetrics<NodeId, NodeInfo>, open_term: u64) -> bool {
    !leads(me, m) || m.current_term != open_term
}

/// Writes may open: this member leads in Raft's view, everything in its log is applied
/// and the last entry is of its term (a leader's records get the LSNs after its WAL's
/// last, so no entry still unapplied may hold LSNs of its own: a leader restarted within
/// the election timeout resumes its term with its previous process's entries not yet
/// applied), and a majority answered it in this process (`answered`).
pub fn may_open_writes(me: NodeId, m: &RaftMetrics<NodeId, NodeInfo>, answered: bool) -> bool {
    let caught_up = m
        .last_applied
        .is_some_and(|l| l.leader_id.term == m.current_term && Some(l.index) == m.last_log_index);
    leads(me, m) && caught_up && answered
}

/// Whether this process's engine may run its timers (expiry, purges), given its
/// replication: `refused` is `None` for a server without one, else whether writes are
/// refused here (`Replication::write_refusal`: another member leads, or this leader
/// hands over, catches up or has no majority). A follower expires and purges nothing
/// itself: the leader decides and its log says so (EXPIRED still lists what is due),
/// and a record written while not leading deposes the member. Nor does a leader whose
/// writes are closed: a release it logged while handing over would be in flight when
/// its target stands, leaving the target's log behind a follower that got it (which
/// then refuses the target its vote), and would depose this leader when it steps down.
pub fn may_tick(refused: Option<bool>) -> bool {
    refused != Some(true)
}

fn leads(me: NodeId, m: &RaftMetrics<NodeId, NodeInfo>) -> bool {
    m.state == ServerState::Leader && m.current_leader == Some(me)
}

/// The leader this member names to clients: the newest one Raft told it of (that of its
/// current term), except itself without the lease. `None` while it knows of no other
/// (clients then ask the next member).
pub fn advertised_leader(
    me: NodeId,
    m: &RaftMetrics<NodeId, NodeInfo>,
    lease: bool,
) -> Option<NodeId> {
    let id = m.current_leader?;
    (id != me || acts_as_leader(me, m, lease)).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(
        me: NodeId,
        state: ServerState,
        leader: Option<NodeId>,
    ) -> RaftMetrics<NodeId, NodeInfo> {
        let mut m = RaftMetrics::new_initial(me);
        m.state = state;
        m.current_leader = leader;
        m
    }

    #[test]
    fn only_a_member_taking_writes_or_a_lone_server_ticks() {
        assert!(may_tick(None));
        assert!(may_tick(Some(false)));
        assert!(!may_tick(Some(true)));
    }

    #[test]
    fn the_lease_runs_out_after_the_shortest_election_timeout() {
        assert!(lease_held(Some(0), 300, 3));
        assert!(lease_held(Some(299), 300, 3));
        assert!(!lease_held(Some(300), 300, 3));
        assert!(!lease_held(None, 300, 3));
        // One voter is its own majority.
        assert!(lease_held(None, 300, 1));
        assert!(!lease_held(None, 300, 0));
    }

    #[test]
    fn a_leader_without_the_lease_names_nobody() {
        let m = metrics(1, ServerState::Leader, Some(1));
        assert_eq!(advertised_leader(1, &m, true), Some(1));
        assert_eq!(advertised_leader(1, &m, false), None);
        assert!(!acts_as_leader(1, &m, false));
    }

    #[test]
    fn another_members_leadership_is_named_as_raft_reports_it() {
        let m = metrics(1, ServerState::Follower, Some(3));
        assert_eq!(advertised_leader(1, &m, false), Some(3));
        assert!(!acts_as_leader(1, &m, true));
        let m = metrics(1, ServerState::Candidate, None);
        assert_eq!(advertised_leader(1, &m, false), None);
        // Raft still names this member, but it no longer leads: not advertised.
        let m = metrics(1, ServerState::Follower, Some(1));
        assert_eq!(advertised_leader(1, &m, true), None);
    }
}
