//! What the command client was acknowledged, and which states of a hold agree with it.
//! Holds expire (the leader's ticker, `auto_release`): a hold acknowledged held may be
//! found released, by no earlier than its acknowledged deadline, but never committed; an
//! acknowledged COMMIT or RELEASE stays so; an acknowledged EXTEND's deadline is what a
//! member has (unless a later EXTEND is in doubt).

use std::collections::{BTreeMap, BTreeSet};

use stockgate_server::engine::{Engine, Millis, ReservationState};
use stockgate_server::raft::NodeId;

/// The sale the command client reserves from (the other client's is `A`).
pub(super) const SKU: &str = "B";

/// What became of an acknowledged hold, as far as the client knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    Held,
    Committed,
    Released,
    /// A COMMIT or RELEASE sent and never answered: the hold is held or finished so (or
    /// expired).
    Maybe(ReservationState),
    /// Found past its deadline by the member that answered (COMMIT refused `EXPIRED` or
    /// `RELEASED`, EXTEND refused `EXPIRED` or `NORES`): held until a leader's ticker
    /// releases it, never committed.
    Late,
}

/// An acknowledged hold.
#[derive(Clone, Debug)]
pub(super) struct Hold {
    pub token: String,
    pub qty: u32,
    pub fate: Fate,
    /// Its deadline as last acknowledged (RESERVE's, or the last EXTEND's).
    pub deadline: Millis,
    /// An EXTEND was sent and never answered: its deadline is either.
    pub extend_in_doubt: bool,
}

/// The acknowledged outcomes, by request id, and the sale's size.
#[derive(Default)]
pub(super) struct Ledger {
    pub holds: BTreeMap<String, Hold>,
    pub total: u64,
    /// Counts for the history's last lines: holds acknowledged, RESERVEs refused, given
    /// up; EXTENDs acknowledged, refused (past the deadline), given up; reads of a hold
    /// and of the sale answered by a member taking writes, answered by any member on a
    /// connection that accepts stale reads, refused or lost.
    pub counts: [u64; 10],
}

/// Indexes into [`Ledger::counts`].
pub(super) mod count {
    pub const HELD: usize = 0;
    pub const UNHELD: usize = 1;
    pub const GIVEN_UP: usize = 2;
    pub const EXTENDED: usize = 3;
    pub const EXTEND_LATE: usize = 4;
    pub const EXTEND_GIVEN_UP: usize = 5;
    pub const READ_HOLD: usize = 6;
    pub const READ_SALE: usize = 7;
    pub const READ_STALE: usize = 8;
    pub const READ_REFUSED: usize = 9;
}

/// What a member has of a hold.
pub(super) struct Found {
    pub state: ReservationState,
    pub qty: u32,
    pub expires_at_ms: Millis,
    /// When it finished, where known (not in a `RESERVATION` reply).
    pub finished_at_ms: Option<Millis>,
}

/// Whether `f` (on a member whose state is as new as every acknowledgement: the end
/// state, or a read from a member taking writes) agrees with what was acknowledged of
/// `h`.
pub(super) fn agrees(h: &Hold, f: &Found) -> bool {
    use ReservationState as S;
    let deadline_ok = h.extend_in_doubt || f.expires_at_ms == h.deadline;
    let expired_ok = h.extend_in_doubt || f.finished_at_ms.is_none_or(|t| t >= h.deadline);
    f.qty == h.qty
        && match (h.fate, f.state) {
            (Fate::Held, S::Reserved) => deadline_ok,
            (Fate::Held, S::Released) => expired_ok,
            (Fate::Committed, S::Committed) | (Fate::Released, S::Released) => true,
            (Fate::Maybe(d), s) => s == d || s != S::Committed,
            (Fate::Late, s) => s != S::Committed,
            _ => false,
        }
}

/// Whether `f`, read from a member that may be behind (stale reads), could be a past
/// state of `h`: the units acknowledged, and never a finished state other than the one
/// acknowledged or sent (a follower may not have the RESERVE, the COMMIT or the EXTEND
/// yet, but never has what did not happen).
pub(super) fn could_have_been(h: &Hold, f: &Found) -> bool {
    use ReservationState as S;
    f.qty == h.qty
        && match (h.fate, f.state) {
            (_, S::Reserved) => true,
            (Fate::Committed, s) => s == S::Committed,
            (Fate::Maybe(S::Committed), _) => true,
            (_, s) => s == S::Released,
        }
}

/// The first disagreement of member `id`'s state with what was acknowledged, if any:
/// every acknowledged hold as [`agrees`] says, and no more units handed out than the
/// sale has, at least those acknowledged committed.
pub(super) fn disagreement(l: &Ledger, id: NodeId, e: &Engine) -> Option<String> {
    for (rid, h) in &l.holds {
        let found = e.reservation(&h.token).map(|(v, _)| Found {
            state: v.state,
            qty: v.qty,
            expires_at_ms: v.expires_at_ms,
            finished_at_ms: Some(v.finished_at_ms),
        });
        if !found.as_ref().is_some_and(|f| agrees(h, f)) {
            let state = found.map(|f| (f.state, f.qty, f.expires_at_ms, f.finished_at_ms));
            return Some(format!(
                "n{id}: {rid} ({}) acknowledged {:?} x{} until {}, found {state:?}",
                h.token, h.fate, h.qty, h.deadline
            ));
        }
    }
    let Ok(sale) = e.sale_info(SKU) else {
        return Some(format!("n{id}: no sale {SKU}"));
    };
    let out = sale.reserved + sale.committed;
    let sold = committed_units(l);
    if out > l.total || sale.total != l.total || sale.available < 0 || sold > sale.committed {
        return Some(format!(
            "n{id}: sale {SKU} of {} has {} reserved, {} committed, {} available; {sold} units acknowledged committed",
            l.total, sale.reserved, sale.committed, sale.available
        ));
    }
    None
}

/// The units of the holds acknowledged committed.
pub(super) fn committed_units(l: &Ledger) -> u64 {
    let c = l.holds.values().filter(|h| h.fate == Fate::Committed);
    c.map(|h| u64::from(h.qty)).sum()
}

/// The tokens the client sent a RELEASE for (answered or not): the holds released
/// before their deadline by right.
pub(super) fn released(l: &Ledger) -> BTreeSet<String> {
    let r = l.holds.values().filter(|h| {
        matches!(
            h.fate,
            Fate::Released | Fate::Maybe(ReservationState::Released)
        )
    });
    r.map(|h| h.token.clone()).collect()
}

/// What reads saw, per member process (its origin): a hold's state, the sale's
/// committed units (`reads`).
#[derive(Default)]
pub(super) struct Reads {
    pub(super) holds: BTreeMap<(u64, String), ReservationState>,
    pub(super) committed: BTreeMap<u64, u64>,
}
