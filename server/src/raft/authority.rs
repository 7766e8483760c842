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

use openraft::{RaftMetrics, ServerState};

use super::{NodeId, NodeInfo};

/// The lease: a majority acknowledged this leader `age_ms` ago (`None`: never in this
/// process), and it holds while that is shorter than `window_ms` (the shortest election
/// timeout). A group of one voter is its own majority.
pub fn lease_held(age_ms: Option<u64>, window_ms: u64, voters: usize) -> bool {
    voters <= 1 || age_ms.is_some_and(|a| a < window_ms)
}

/// This member leads in Raft's view and holds the lease: it may say so to clients.
pub fn acts_as_leader(me: NodeId, m: &RaftMetrics<NodeId, NodeInfo>, lease: bool) -> bool {
    m.state == ServerState::Leader && m.current_leader == Some(me) && lease
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
    fn the_lease_runs_out_after_the_shortest_election_timeout() {
        assert!(lease_held(Some(0), 300, 3));
        assert!(lease_held(Some(299), 300, 3));
        assert!(!lease_held(Some(300), 300, 3));
        assert!(!lease_held(None, 300, 3));
        // One voter is its own majority.
        assert!(lease_held(None, 300, 1));
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
