//! The command client's reads, through the command layer as the others: `RESERVATION
//! token` of a hold it was acknowledged, and `SALE.INFO B`. Sent to the member it takes
//! for the master on a plain connection, which the server answers only while it leads
//! with its lease (never stale, though possibly ahead of the commit: a leader answers
//! from its speculative engine), or, on a connection that sent `READONLY` (stale reads
//! accepted), to any member drawn.
//!
//! Checked, against what was acknowledged before the read was sent:
//! - a read from the master shows nothing older: each hold as the final check wants it
//!   (`ledger::agrees`: an acknowledged COMMIT committed, an acknowledged EXTEND's
//!   deadline, a hold acknowledged held held or expired, never committed), and the sale
//!   at least the units acknowledged committed;
//! - a stale read shows what could have been (`ledger::could_have_been`: the units
//!   acknowledged, never a finished state that was neither acknowledged nor sent);
//! - every read: the sale's counters add up to its total, and what one member process
//!   showed never goes back (a finished hold stays so; committed units never shrink).

use rand::Rng;
use stockgate_server::engine::{Millis, ReservationState};
use stockgate_server::protocol::Reply;

use super::commands::{answer, connect, discover, Answer, Client};
use super::ledger::{agrees, committed_units, could_have_been, count, Found, Hold, SKU};

/// A field of a map reply.
fn field<'a>(reply: &'a Reply, name: &str) -> Option<&'a Reply> {
    let Reply::Map(kv) = reply else {
        return None;
    };
    kv.iter()
        .find(|(k, _)| k.as_bulk() == Some(name.as_bytes()))
        .map(|(_, v)| v)
}

fn int(reply: &Reply, name: &str) -> Option<i64> {
    match field(reply, name) {
        Some(Reply::Int(n)) => Some(*n),
        _ => None,
    }
}

/// A `RESERVATION` reply as a client reads it.
fn found(reply: &Reply) -> Option<Found> {
    let word = field(reply, "state")?.as_bulk()?;
    let state = [
        ReservationState::Reserved,
        ReservationState::Committed,
        ReservationState::Released,
    ]
    .into_iter()
    .find(|s| s.as_str().as_bytes() == word)?;
    Some(Found {
        state,
        qty: u32::try_from(int(reply, "qty")?).ok()?,
        expires_at_ms: int(reply, "expires_at_ms")?.max(0) as Millis,
        finished_at_ms: None,
    })
}

/// What was acknowledged when a read was sent.
struct Before {
    hold: Option<(String, Hold)>,
    total: u64,
    sold: u64,
}

impl Client {
    /// One read: of a hold drawn (two times in three) or of the sale, from the master
    /// or (two times in five) stale from any member.
    pub(super) async fn read(&mut self) {
        let stale = self.extra.gen_bool(0.4);
        let before = {
            let l = self.ledger.lock();
            let holds: Vec<_> = l.holds.iter().collect();
            let pick = self.extra.gen_range(0..3) != 0 && !holds.is_empty();
            let hold = pick.then(|| {
                let (rid, h) = holds[self.extra.gen_range(0..holds.len())];
                (rid.clone(), h.clone())
            });
            Before {
                hold,
                total: l.total,
                sold: committed_units(&l),
            }
        };
        let id = if stale {
            let ids = &self.r.env.ids;
            Some(ids[self.extra.gen_range(0..ids.len())])
        } else {
            self.target
        };
        let Some(c) = id.and_then(|id| connect(&self.r, id)) else {
            self.ledger.lock().counts[count::READ_REFUSED] += 1;
            return;
        };
        let argv: Vec<&[u8]> = match &before.hold {
            Some((_, h)) => vec![b"RESERVATION", h.token.as_bytes()],
            None => vec![b"SALE.INFO", SKU.as_bytes()],
        };
        let what = match &before.hold {
            Some((rid, _)) => format!("read {rid} on n{}", c.id),
            None => format!("read sale {SKU} on n{}", c.id),
        };
        let what = if stale {
            format!("{what} (stale)")
        } else {
            what
        };
        match answer(&self.r, &c, &argv, stale).await {
            Answer::Reply(reply) => self.check_read(&what, c.process, stale, &before, &reply),
            Answer::Redirect(e) | Answer::Lost(e) => {
                self.ledger.lock().counts[count::READ_REFUSED] += 1;
                self.r.note(format!("{what}: {e}"));
                if !stale {
                    self.target = discover(&self.r, &mut self.extra);
                }
            }
            Answer::Nowhere => {}
        }
    }

    /// Checks one read's reply against what was acknowledged before it was sent.
    fn check_read(
        &mut self,
        what: &str,
        process: u64,
        stale: bool,
        before: &Before,
        reply: &Reply,
    ) {
        let i = match (&before.hold, stale) {
            (_, true) => count::READ_STALE,
            (Some(_), false) => count::READ_HOLD,
            (None, false) => count::READ_SALE,
        };
        self.ledger.lock().counts[i] += 1;
        let wrong = match &before.hold {
            Some((_, h)) => self.wrong_hold(process, stale, h, reply),
            None => self.wrong_sale(process, stale, before, reply),
        };
        match wrong {
            Some(why) => self.r.fail(format!("{what}: {why}")),
            None => self.r.note(format!("{what}: {}", short(reply))),
        }
    }

    /// What is wrong with a `RESERVATION` reply for `h`, if anything.
    fn wrong_hold(&mut self, process: u64, stale: bool, h: &Hold, reply: &Reply) -> Option<String> {
        if *reply == Reply::Nil {
            return (!stale).then(|| format!("{} unknown to the master", h.token));
        }
        let Some(f) = found(reply) else {
            return Some(format!("unreadable reply {reply:?}"));
        };
        let ok = if stale {
            could_have_been(h, &f)
        } else {
            agrees(h, &f)
        };
        let key = (process, h.token.clone());
        let was = self.reads.holds.insert(key, f.state);
        let back = was.is_some_and(|w| w != ReservationState::Reserved && w != f.state);
        if !ok || back {
            return Some(format!(
                "acknowledged {:?} x{} until {} (EXTEND in doubt: {}), read {:?} x{} until {} \
                 (this process read {was:?} before)",
                h.fate, h.qty, h.deadline, h.extend_in_doubt, f.state, f.qty, f.expires_at_ms
            ));
        }
        None
    }

    /// What is wrong with a `SALE.INFO` reply, if anything.
    fn wrong_sale(
        &mut self,
        process: u64,
        stale: bool,
        b: &Before,
        reply: &Reply,
    ) -> Option<String> {
        // A member far behind (a lost disk not caught up yet) may not have the sale at
        // all: a stale read answers from its own state. Once a process has shown the
        // sale, it never loses it.
        let behind = matches!(reply, Reply::Error(e) if e.starts_with("NOSALE"));
        if stale && behind && !self.reads.committed.contains_key(&process) {
            return None;
        }
        let get = |k| int(reply, k);
        let (Some(total), Some(available), Some(reserved), Some(committed)) = (
            get("total"),
            get("available"),
            get("reserved"),
            get("committed"),
        ) else {
            return Some(format!("unreadable reply {reply:?}"));
        };
        let was = self
            .reads
            .committed
            .insert(process, committed.max(0) as u64);
        let sums = available + reserved + committed == total && available >= 0;
        let older = !stale && (committed.max(0) as u64) < b.sold;
        let back = was.is_some_and(|w| (committed.max(0) as u64) < w);
        if total as u64 != b.total || !sums || older || back {
            return Some(format!(
                "total {total}, available {available}, reserved {reserved}, committed \
                 {committed}; acknowledged: total {}, {} units committed; this process read \
                 {was:?} committed before",
                b.total, b.sold
            ));
        }
        None
    }
}

/// A read's reply in a few words, for the history.
fn short(reply: &Reply) -> String {
    if let Some(f) = found(reply) {
        return format!("{} until {}", f.state.as_str(), f.expires_at_ms);
    }
    match (int(reply, "available"), int(reply, "committed")) {
        (Some(a), Some(c)) => format!("{a} available, {c} committed"),
        _ => format!("{reply:?}"),
    }
}
