//! The leader's lease, counted from what it sent, and when a leader stops asserting a
//! leadership no majority acknowledges.
//!
//! A follower that accepted an append sent at `t` took it after `t`, and refuses to vote
//! for anyone else until an election timeout has passed since: so while a majority
//! accepted appends of this term sent within the shortest election timeout, no other
//! leader can exist. Dating an acknowledgement by the *send* of the append it answers,
//! on this process's monotonic clock, keeps the lease right however late the reply is
//! read: a leader paused (SIGSTOP, a long GC-like stall) and resumed finds every send
//! older than the pause and its lease gone before it answers anyone.
//!
//! openraft 0.9 keeps a leader that hears from nobody a leader for as long as nobody
//! tells it of a higher term, and keeps it sending heartbeats. A leader that can send
//! but not receive (a half-broken link, a firewall dropping one direction) would so hold
//! every follower back from standing while it serves nobody. A leader whose term has
//! gone [`Lease::muted`] (no majority's acknowledgement for longer than the longest
//! election timeout) stops sending appends: its followers stop hearing it and elect
//! another. It still sends one append per peer every [`PROBE_EVERY`] election
//! timeouts, too seldom to hold anyone back from standing, so that it learns of a newer
//! term once its links work again (openraft does not make it step down for a vote it
//! refuses, so a member that cannot win and a leader that never sends would otherwise
//! wait on each other for ever).
//!
//! Time is passed in (`now`) rather than read here, so the rule is tested without a clock.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

// tokio's clock, not std's: the same monotonic clock in a server, and the one the
// deterministic simulation (`sim/`) pauses and advances.
use tokio::time::Instant;

use parking_lot::Mutex;

use super::NodeId;

/// What this member, as a leader, knows of its followers' acknowledgements.
#[derive(Default)]
pub struct Lease {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// This member and the group's voters, as the newest membership names them.
    me: NodeId,
    voters: BTreeSet<NodeId>,
    /// The newest term this member sent appends in, and when it first did.
    term: u64,
    began: Option<Instant>,
    /// Per follower: when the newest append of `term` it accepted was sent.
    acked: HashMap<NodeId, Instant>,
    /// Per follower: when a muted leader last let an append through to it.
    probed: HashMap<NodeId, Instant>,
    /// What `acked` and `voters` say of the majority, kept as they change: the write
    /// and read gates ask on every request, acknowledgements come once per append.
    quorum: Quorum,
}

/// Whose acknowledgements make a majority of the voters.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
enum Quorum {
    /// Too few acknowledgements (or no voters).
    #[default]
    Short,
    /// This member alone is a majority: it counts as "now".
    Me,
    /// Then: the oldest of the newest acknowledgements a majority needs from others.
    At(Instant),
}

impl State {
    fn recount(&mut self) {
        self.quorum = quorum_of(self.me, &self.voters, &self.acked);
    }

    fn quorum_since(&self, term: u64, now: Instant) -> Option<Instant> {
        if self.term != term {
            return None;
        }
        match self.quorum {
            Quorum::Short => None,
            Quorum::Me => Some(now),
            // A send is never later than `now` on one monotonic clock; `min` keeps the
            // answer that of a count made afresh at `now` even so.
            Quorum::At(t) => Some(t.min(now)),
        }
    }
}

fn age_ms(since: Option<Instant>, now: Instant) -> Option<u64> {
    since.map(|at| now.saturating_duration_since(at).as_millis() as u64)
}

/// A muted leader lets one append through to each peer once per this many `after`s.
pub const PROBE_EVERY: u32 = 3;

impl Lease {
    /// The membership changed (or is first known): who counts toward a majority.
    pub fn set_voters(&self, me: NodeId, voters: BTreeSet<NodeId>) {
        let mut s = self.state.lock();
        if s.me != me || s.voters != voters {
            s.me = me;
            s.voters = voters;
            s.recount();
        }
    }

    /// An append of `term` is about to be sent at `now`: a newer term starts afresh.
    pub fn sending(&self, term: u64, now: Instant) {
        let mut s = self.state.lock();
        if term > s.term {
            s.term = term;
            s.began = Some(now);
            s.acked.clear();
            s.probed.clear();
            s.recount();
        }
    }

    /// `from` accepted an append of `term` sent at `sent` (it did not answer with a
    /// higher vote).
    pub fn accepted(&self, from: NodeId, term: u64, sent: Instant) {
        let mut s = self.state.lock();
        if term == s.term {
            if s.acked.get(&from).is_some_and(|at| *at >= sent) {
                return;
            }
            s.acked.insert(from, sent);
            s.recount();
        }
    }

    /// When this member first sent an append of `term` (after its election to it), if
    /// `term` is the newest it sent in.
    pub fn began(&self, term: u64) -> Option<Instant> {
        let s = self.state.lock();
        s.began.filter(|_| s.term == term)
    }

    /// When a majority of the voters last acknowledged this member as leader of `term`
    /// (this member counting as `now`); `None` when never in this process.
    pub fn quorum_since(&self, term: u64, now: Instant) -> Option<Instant> {
        self.state.lock().quorum_since(term, now)
    }

    /// [`Self::age_ms`] and how many voters the membership names, read together (one
    /// lock; the gates ask on every request). No voters known yet: `(None, 0)`.
    pub fn standing(&self, term: u64, now: Instant) -> (Option<u64>, usize) {
        let s = self.state.lock();
        (age_ms(s.quorum_since(term, now), now), s.voters.len())
    }

    /// How long ago a majority acknowledged this member as leader of `term`, in ms.
    pub fn age_ms(&self, term: u64, now: Instant) -> Option<u64> {
        age_ms(self.quorum_since(term, now), now)
    }

    /// Whether an append of `term` to `to` may go now: always, unless the leader is
    /// [`muted`](Self::muted); then once per [`PROBE_EVERY`] `after`s per peer.
    pub fn may_send(&self, to: NodeId, term: u64, now: Instant, after: Duration) -> bool {
        if !self.muted(term, now, after) {
            return true;
        }
        let mut s = self.state.lock();
        let due = s
            .probed
            .get(&to)
            .is_none_or(|at| now.saturating_duration_since(*at) >= after * PROBE_EVERY);
        if due {
            s.probed.insert(to, now);
        }
        due
    }

    /// Whether a leader of `term` should stop sending appends: it has led for longer
    /// than `after` and no majority acknowledged it within `after`.
    pub fn muted(&self, term: u64, now: Instant, after: Duration) -> bool {
        let s = self.state.lock();
        if s.term != term {
            return false;
        }
        let since = match (s.began, s.quorum_since(term, now)) {
            (Some(b), Some(q)) => b.max(q),
            (b, q) => match b.or(q) {
                Some(t) => t,
                None => return false,
            },
        };
        now.saturating_duration_since(since) > after
    }
}

/// Which acknowledgements make a majority of `voters`: `me` counts as the newest (it is
/// "now"), the others by their newest acknowledgement; the majority's oldest of its newest.
fn quorum_of(me: NodeId, voters: &BTreeSet<NodeId>, acked: &HashMap<NodeId, Instant>) -> Quorum {
    if voters.is_empty() {
        return Quorum::Short;
    }
    let majority = voters.len() / 2 + 1;
    // This member counts as the newest acknowledgement: the others supply the rest.
    let from_others = majority - usize::from(voters.contains(&me));
    if from_others == 0 {
        return Quorum::Me;
    }
    let mut times: Vec<Instant> = voters
        .iter()
        .filter(|v| **v != me)
        .filter_map(|v| acked.get(v).copied())
        .collect();
    times.sort_unstable_by(|a, b| b.cmp(a));
    times
        .get(from_others - 1)
        .map_or(Quorum::Short, |t| Quorum::At(*t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The majority's instant counted afresh, the oracle for the kept one: `me` counts as `now`,
    /// the others by their newest acknowledgement; the majority's oldest of its newest.
    /// `None` with no voters or too few acknowledgements.
    fn quorum_instant(
        me: NodeId,
        voters: &BTreeSet<NodeId>,
        acked: &HashMap<NodeId, Instant>,
        now: Instant,
    ) -> Option<Instant> {
        if voters.is_empty() {
            return None;
        }
        let majority = voters.len() / 2 + 1;
        let mut times: Vec<Instant> = voters
            .iter()
            .filter_map(|v| {
                if *v == me {
                    Some(now)
                } else {
                    acked.get(v).copied()
                }
            })
            .collect();
        times.sort_unstable_by(|a, b| b.cmp(a));
        times.get(majority - 1).copied()
    }

    fn lease(voters: &[NodeId]) -> Lease {
        let l = Lease::default();
        l.set_voters(1, voters.iter().copied().collect());
        l
    }

    #[test]
    fn a_majority_is_the_leader_and_the_newest_of_the_others() {
        let t0 = Instant::now();
        let l = lease(&[1, 2, 3]);
        l.sending(5, t0);
        assert_eq!(l.quorum_since(5, t0), None);
        l.accepted(2, 5, t0);
        l.accepted(3, 5, t0 + Duration::from_millis(50));
        let now = t0 + Duration::from_millis(100);
        assert_eq!(l.quorum_since(5, now), Some(t0 + Duration::from_millis(50)));
        assert_eq!(l.age_ms(5, now), Some(50));
        // Five voters: the leader and two others.
        let l = lease(&[1, 2, 3, 4, 5]);
        l.sending(1, t0);
        l.accepted(2, 1, t0 + Duration::from_millis(10));
        assert_eq!(l.quorum_since(1, now), None);
        l.accepted(4, 1, t0 + Duration::from_millis(30));
        l.accepted(5, 1, t0 + Duration::from_millis(20));
        assert_eq!(l.quorum_since(1, now), Some(t0 + Duration::from_millis(20)));
    }

    #[test]
    fn a_late_reply_dates_from_its_send_and_an_old_term_counts_for_nothing() {
        let t0 = Instant::now();
        let l = lease(&[1, 2, 3]);
        l.sending(2, t0);
        // A reply read long after its send (the leader was paused) is still as old as
        // the send: the lease is gone.
        l.accepted(2, 2, t0);
        let resumed = t0 + Duration::from_secs(5);
        assert_eq!(l.age_ms(2, resumed), Some(5000));
        // An acknowledgement of an older term is not one of this term.
        l.sending(3, resumed);
        l.accepted(2, 2, resumed);
        assert_eq!(l.quorum_since(3, resumed), None);
        assert_eq!(l.quorum_since(2, resumed), None);
        // A single voter is its own majority.
        let one = lease(&[1]);
        assert_eq!(one.quorum_since(0, t0), Some(t0));
    }

    /// The kept answer is the one computed from scratch, after any sequence of
    /// acknowledgements (late, out of order, of other terms, from non-voters) and
    /// membership changes (this member in or out of the voters).
    #[test]
    fn the_kept_majority_equals_the_one_counted_afresh() {
        let t0 = Instant::now();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let l = Lease::default();
        let mut term = 1;
        l.sending(term, t0);
        for step in 0..20_000u64 {
            let at = t0 + Duration::from_millis(step);
            match next(10) {
                0 => {
                    let voters = (1..=5).filter(|_| next(3) > 0).collect();
                    l.set_voters(1 + next(2), voters);
                }
                1 => {
                    term += next(2);
                    l.sending(term, at);
                }
                _ => l.accepted(
                    1 + next(6),
                    term - next(2).min(term),
                    at - Duration::from_millis(next(50)),
                ),
            }
            let now = at + Duration::from_millis(next(100));
            let s = l.state.lock();
            let fresh = (s.term == term)
                .then(|| quorum_instant(s.me, &s.voters, &s.acked, now))
                .flatten();
            drop(s);
            assert_eq!(l.quorum_since(term, now), fresh, "step {step}");
        }
    }

    #[test]
    fn a_member_told_no_voters_yet_holds_no_lease() {
        let l = Lease::default();
        let t0 = Instant::now();
        assert_eq!(l.standing(0, t0), (None, 0));
        l.set_voters(1, [1].into_iter().collect());
        assert_eq!(l.standing(0, t0), (Some(0), 1));
    }

    #[test]
    fn a_leader_nobody_acknowledges_goes_quiet_after_the_window() {
        let t0 = Instant::now();
        let after = Duration::from_millis(600);
        let l = lease(&[1, 2, 3]);
        l.sending(4, t0);
        assert!(!l.muted(4, t0 + Duration::from_millis(600), after));
        assert!(l.muted(4, t0 + Duration::from_millis(601), after));
        l.accepted(3, 4, t0 + Duration::from_millis(500));
        assert!(!l.muted(4, t0 + Duration::from_millis(1000), after));
        assert!(l.muted(4, t0 + Duration::from_millis(1101), after));
        // A newer term starts its own count.
        assert!(!l.muted(5, t0 + Duration::from_secs(9), after));
        l.sending(5, t0 + Duration::from_secs(9));
        assert!(!l.muted(5, t0 + Duration::from_millis(9500), after));
    }

    #[test]
    fn a_muted_leader_still_probes_each_peer_now_and_then() {
        let t0 = Instant::now();
        let after = Duration::from_millis(600);
        let l = lease(&[1, 2, 3]);
        l.sending(4, t0);
        assert!(l.may_send(2, 4, t0 + Duration::from_millis(500), after));
        let muted = t0 + Duration::from_millis(700);
        // The first append of a muted leader to each peer goes, then none for a while.
        assert!(l.may_send(2, 4, muted, after));
        assert!(l.may_send(3, 4, muted, after));
        assert!(!l.may_send(2, 4, muted + Duration::from_millis(10), after));
        assert!(!l.may_send(
            2,
            4,
            muted + after * PROBE_EVERY - Duration::from_millis(1),
            after
        ));
        assert!(l.may_send(2, 4, muted + after * PROBE_EVERY, after));
        // Acknowledged again: every append goes.
        l.accepted(2, 4, muted + after * PROBE_EVERY);
        assert!(l.may_send(
            3,
            4,
            muted + after * PROBE_EVERY + Duration::from_millis(1),
            after
        ));
        assert!(l.may_send(
            3,
            4,
            muted + after * PROBE_EVERY + Duration::from_millis(2),
            after
        ));
    }
}
