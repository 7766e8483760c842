//! A handover's hold on a leader's appends (`SENTINEL FAILOVER` in a group of more than
//! three voters, `handover`): the appends of one term go to the target alone, and the
//! calls still on their way to each peer are counted, so that the handover knows when
//! the others' leader leases have run out. The network asks it before every append.

use std::collections::HashMap;
use std::sync::Arc;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`), the one
// openraft's lease is counted on.
use tokio::time::Instant;

use parking_lot::Mutex;

use super::NodeId;

/// A handover's hold on a leader's appends: while it holds a term, no append or
/// snapshot of that term goes to any member but the one spared (the target), so that
/// the others' leader leases run out. It also counts the appends on their way to each
/// peer, which tells when the last one held back was delivered or given up.
#[derive(Default)]
pub struct AppendHold(Mutex<HoldState>);

#[derive(Default)]
struct HoldState {
    held: Option<Held>,
    calls: HashMap<NodeId, Calls>,
}

/// The term held, the member still fed, and since when.
#[derive(Clone, Copy)]
struct Held {
    term: u64,
    spare: NodeId,
    since: Instant,
}

/// One peer's calls on their way, and when the last one ended.
#[derive(Default)]
struct Calls {
    open: u32,
    ended: Option<Instant>,
}

/// An append (or snapshot) on its way to a peer: counted until dropped, whether it was
/// answered, failed, or cut by openraft's time-to-live.
pub struct CallOnItsWay {
    hold: Arc<AppendHold>,
    to: NodeId,
}

impl Drop for CallOnItsWay {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut s = self.hold.0.lock();
        let c = s.calls.entry(self.to).or_default();
        c.open = c.open.saturating_sub(1);
        c.ended = Some(now);
    }
}

impl AppendHold {
    /// Holds back every append of `term` but those to `spare`, from `now`.
    pub fn hold(&self, term: u64, spare: NodeId, now: Instant) {
        self.0.lock().held = Some(Held {
            term,
            spare,
            since: now,
        });
    }

    /// Lets the appends of `term` go again (a newer hold is left alone).
    pub fn release(&self, term: u64) {
        let mut s = self.0.lock();
        if s.held.is_some_and(|h| h.term == term) {
            s.held = None;
        }
    }

    /// An append (or snapshot) of `term` to `to` may go: counted until the returned
    /// guard is dropped. `None`: held back.
    pub fn admit(self: &Arc<Self>, to: NodeId, term: u64) -> Option<CallOnItsWay> {
        let mut s = self.0.lock();
        if s.held.is_some_and(|h| h.term == term && h.spare != to) {
            return None;
        }
        s.calls.entry(to).or_default().open += 1;
        Some(CallOnItsWay {
            hold: self.clone(),
            to,
        })
    }

    /// Once `term` is held and nothing is on its way to a member held back: the
    /// instant the last member held back could have taken an append of it (the hold's
    /// start, or the end of the last call to one of them). `None` until then.
    pub fn quiet_since(&self, term: u64) -> Option<Instant> {
        let s = self.0.lock();
        let h = s.held.filter(|h| h.term == term)?;
        let mut quiet = h.since;
        for (_, c) in s.calls.iter().filter(|(to, _)| **to != h.spare) {
            if c.open > 0 {
                return None;
            }
            quiet = c.ended.map_or(quiet, |e| e.max(quiet));
        }
        Some(quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_spares_the_target_and_waits_for_the_calls_on_their_way() {
        let hold = Arc::new(AppendHold::default());
        let t0 = Instant::now();
        // Sent before the hold: still on its way when the hold begins.
        let early = hold.admit(3, 7);
        assert!(early.is_some());
        hold.hold(7, 2, t0);
        assert!(hold.admit(3, 7).is_none(), "held back");
        assert!(hold.admit(4, 7).is_none(), "held back");
        assert!(hold.admit(2, 7).is_some(), "the target is still fed");
        assert!(hold.admit(3, 8).is_some(), "another term is not held");
        assert_eq!(hold.quiet_since(7), None, "an append still on its way");
        drop(early);
        let quiet = hold.quiet_since(7).expect("nothing on its way");
        assert!(quiet >= t0);
        // The target's calls never keep the others' leases from running out.
        let _to_target = hold.admit(2, 7);
        assert_eq!(hold.quiet_since(7), Some(quiet));
        assert_eq!(hold.quiet_since(6), None, "not held");
        hold.release(6);
        assert!(
            hold.admit(3, 7).is_none(),
            "another term's release leaves it"
        );
        hold.release(7);
        assert!(hold.admit(3, 7).is_some());
    }
}
