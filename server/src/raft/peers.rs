//! What one member knows of its peers' links: whether each last answered, its
//! connection back-off, the counts `INFO replication` shows. One table per member (a
//! server runs one member; the simulation runs several in one process), shared by every
//! client openraft makes to a peer (one per replication stream, one for votes) and by
//! the member's own calls (`Hello`, the bootstrap), so that they share a peer's
//! back-off.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`).
use tokio::time::Instant;

use openraft::AsyncRuntime as _;
use parking_lot::Mutex;
use rand::Rng as _;

use super::message::LOG;
use super::runtime::Runtime;
use super::NodeId;

/// What a member knows of one peer.
#[derive(Clone, Copy, Default)]
struct PeerState {
    /// Whether the last call answered; `None`: not called yet.
    up: Option<bool>,
    /// Whether it ever answered.
    ever: bool,
    /// Connections that failed in a row.
    failures: u32,
    /// No new connection before this instant.
    retry_at: Option<Instant>,
    /// Connections tried since the member started.
    attempts: u64,
    /// Replies not counted since the member started (another storage, a refusal).
    refused: u64,
}

/// A member's peers, by node id.
#[derive(Default)]
pub struct PeerTable(Mutex<HashMap<NodeId, PeerState>>);

/// The jitter of a back-off pause, in 0.5..1: drawn from the generator openraft's
/// election timeouts come from (`rand::thread_rng()` in a server; seeded where the
/// simulation seeds it), so a seed fixes it too.
fn jitter() -> f64 {
    Runtime::thread_rng().gen::<f64>() * 0.5 + 0.5
}

impl PeerTable {
    fn with<T>(&self, target: NodeId, f: impl FnOnce(&mut PeerState) -> T) -> T {
        f(self.0.lock().entry(target).or_default())
    }

    /// How long `target` is still backed off, if it is.
    pub fn backoff_left(&self, target: NodeId) -> Option<Duration> {
        let at = self.with(target, |p| p.retry_at)?;
        at.checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// Counts a connection attempt; a failed one backs the peer off for longer, a good
    /// one ends its back-off.
    pub fn note_connect(&self, target: NodeId, ok: bool) {
        self.with(target, |p| {
            p.attempts += 1;
            if ok {
                p.failures = 0;
                p.retry_at = None;
            } else {
                p.failures = p.failures.saturating_add(1);
                let pause = backoff_delay(p.failures, jitter());
                p.retry_at = Some(Instant::now() + pause);
            }
        })
    }

    /// Counts a reply: one that counts ends the peer's back-off, one that does not (a
    /// member that lost its state, a refusal) backs it off as a failed connection would.
    pub fn note_answer(&self, target: NodeId, counted: bool) {
        self.with(target, |p| {
            if counted {
                p.failures = 0;
                p.retry_at = None;
            } else {
                p.refused += 1;
                p.failures = p.failures.saturating_add(1);
                let pause = backoff_delay(p.failures, jitter());
                p.retry_at = Some(Instant::now() + pause);
            }
        })
    }

    /// How many connections this member tried to open to `target`.
    pub fn connect_attempts(&self, target: NodeId) -> u64 {
        self.with(target, |p| p.attempts)
    }

    /// What `INFO replication` shows of a peer: whether its last call answered (`None`:
    /// not called yet), connections tried, replies not counted.
    pub fn peer_stats(&self, target: NodeId) -> (Option<bool>, u64, u64) {
        self.with(target, |p| (p.up, p.attempts, p.refused))
    }

    /// Logs a peer's reachability when it changes, never per call: openraft retries a
    /// peer many times a second, and a peer not up yet (members start one after another)
    /// or down for a while is a state for the operator to see once, not an error per
    /// heartbeat.
    pub fn note_reachable(&self, target: NodeId, addr: &str, outcome: Result<(), &io::Error>) {
        let now = outcome.is_ok();
        let (before, ever) = self.with(target, |p| {
            let before = (p.up, p.ever);
            p.up = Some(now);
            p.ever |= now;
            before
        });
        match (before, ever, outcome) {
            (Some(was), _, _) if was == now => {}
            (_, false, Ok(())) => {
                tracing::info!(target: LOG, "raft: peer {target} at {addr} reachable")
            }
            (_, true, Ok(())) => {
                tracing::info!(target: LOG, "raft: peer {target} at {addr} reachable again")
            }
            (None, _, Err(e)) => {
                tracing::info!(target: LOG, "raft: peer {target} at {addr} not reachable yet: {e}")
            }
            (Some(_), _, Err(e)) => {
                tracing::warn!(target: LOG, "raft: peer {target} at {addr} unreachable: {e}")
            }
        }
    }
}

/// The first pause after a failed connection to a peer.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(10);
/// The longest pause: how late, at most, a peer back up is called again.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The pause after `failures` failed connections in a row: [`BACKOFF_FIRST`] doubling,
/// at most [`BACKOFF_MAX`], scaled by `jitter` (taken in 0.5..=1) so that the members
/// calling a peer that comes back do not all call at the same instant.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let doubled = BACKOFF_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let jitter = if jitter.is_nan() {
        1.0
    } else {
        jitter.clamp(0.5, 1.0)
    };
    doubled.min(BACKOFF_MAX).mul_f64(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_connection_backs_a_peer_off_and_a_good_one_ends_it() {
        let table = PeerTable::default();
        let peer = 9_999_001;
        assert_eq!(table.backoff_left(peer), None);
        table.note_connect(peer, false);
        table.note_connect(peer, false);
        let (failures, until) = table.with(peer, |p| (p.failures, p.retry_at));
        assert_eq!(failures, 2);
        assert!(until.is_some_and(|u| u <= Instant::now() + BACKOFF_FIRST * 2));
        table.note_connect(peer, true);
        assert_eq!(table.backoff_left(peer), None);
        assert_eq!(table.with(peer, |p| p.failures), 0);
        assert_eq!(table.connect_attempts(peer), 3);
    }

    #[test]
    fn each_member_has_its_own_table() {
        let (a, b) = (PeerTable::default(), PeerTable::default());
        a.note_connect(7, false);
        assert!(a.backoff_left(7).is_some());
        assert_eq!(b.backoff_left(7), None);
        assert_eq!(b.connect_attempts(7), 0);
    }
}
