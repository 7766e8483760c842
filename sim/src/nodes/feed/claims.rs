//! `Settings::claims`: a second worker of the consumer group `orders` that takes over
//! the first's entries once they have waited long enough, as an application's standby
//! takes over a dead worker's, and reads the group's pending list.
//!
//! - `XAUTOCLAIM stockgate:events orders w2 <min-idle> 0 COUNT n`, or `XCLAIM` of the
//!   oldest entries the first worker holds, sent to the member taken for the master;
//!   what it claimed it acknowledges (`XACK`) after the first worker's own delay.
//! - `XPENDING stockgate:events orders - + 100`: the pending list, entry by entry.
//!
//! The checks: a claimed entry shows what it showed before; an entry whose `XACK` was
//! acknowledged is never claimed nor listed pending; a registered group's pending entry
//! is never reported deleted (trimmed); and once a claim was acknowledged, the entry is
//! never pending for the first worker again (here, at its re-reads and at quiescence:
//! `feed_checks::check_final`). Idle times are the engine's clock's, so a claim happens
//! when simulated time says the entry waited, not the machine's.

use rand::Rng;
use tokio::time::Instant;

use super::{count, entries, Consumers, Lsn, Reply, ORDERS, STREAM};

/// The first worker (the one that reads new entries).
pub(super) const FIRST: &str = "w1";
/// The second worker (the one that claims).
pub(super) const SECOND: &str = "w2";

impl Consumers {
    /// One step of the second worker: its claimed entries acknowledged once due, else one
    /// time in four the pending list read, else a claim.
    pub(super) async fn take_over(&mut self, who: &str) {
        if !self.log.lock().registered.contains(ORDERS) {
            return;
        }
        let due = super::due(&self.claimed, self.ack_after);
        if !due.is_empty() {
            return self.ack(due, who).await;
        }
        match self.rng.gen_range(0..4) {
            0 => self.list_pending(who).await,
            1 => self.claim_oldest(who).await,
            _ => self.auto_claim(who).await,
        }
    }

    /// `XAUTOCLAIM … w2 <min-idle> 0 COUNT n`: `[cursor, entries, deleted ids]`.
    async fn auto_claim(&mut self, who: &str) {
        let (idle, n) = (
            self.min_idle_ms.to_string(),
            self.rng.gen_range(1..=20u32).to_string(),
        );
        let argv: [&[u8]; 8] = [
            b"XAUTOCLAIM",
            STREAM,
            ORDERS.as_bytes(),
            SECOND.as_bytes(),
            idle.as_bytes(),
            b"0",
            b"COUNT",
            n.as_bytes(),
        ];
        let what = format!("{who} XAUTOCLAIM {ORDERS} {SECOND} {idle}");
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        let what = format!("{what} on n{id}");
        let Reply::Array(parts) = &reply else {
            return self.r.note(format!("{what}: {reply:?}"));
        };
        let claimed = match parts.get(1) {
            Some(Reply::Array(es)) => entries(es),
            _ => Vec::new(),
        };
        if let Some(Reply::Array(gone)) = parts.get(2) {
            if !gone.is_empty() {
                self.r.fail(format!(
                    "{what}: consumer group {ORDERS} registered, yet {} pending entries reported deleted: {gone:?}",
                    gone.len()
                ));
            }
        }
        self.took(id, &claimed, &what);
    }

    /// `XCLAIM … w2 <min-idle> <ids>` of the first worker's oldest entries (as far as
    /// its acknowledged reads say): those idle long enough move, the others stay.
    async fn claim_oldest(&mut self, who: &str) {
        let ids: Vec<String> = self
            .pending
            .keys()
            .take(10)
            .map(|l| format!("{l}-0"))
            .collect();
        if ids.is_empty() {
            return;
        }
        let idle = self.min_idle_ms.to_string();
        let mut argv: Vec<&[u8]> = vec![
            b"XCLAIM",
            STREAM,
            ORDERS.as_bytes(),
            SECOND.as_bytes(),
            idle.as_bytes(),
        ];
        argv.extend(ids.iter().map(|i| i.as_bytes()));
        let what = format!("{who} XCLAIM {ORDERS} {SECOND} {idle} {} ids", ids.len());
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        let what = format!("{what} on n{id}");
        match &reply {
            Reply::Array(es) => self.took(id, &entries(es), &what),
            other => self.r.note(format!("{what}: {other:?}")),
        }
    }

    /// What an acknowledged claim took: checked, then the second worker's.
    fn took(&mut self, id: u64, claimed: &[(Lsn, Option<String>)], what: &str) {
        self.r
            .note(format!("{what}: {} entries claimed", claimed.len()));
        self.saw(id, claimed, what);
        let now = Instant::now();
        let mut bad = Vec::new();
        {
            let mut l = self.log.lock();
            l.counts[count::CLAIMED] += claimed.len() as u64;
            for (lsn, fp) in claimed {
                if l.acked.contains(lsn) {
                    bad.push(format!(
                        "{what}: entry {lsn}-0 claimed after its XACK was acknowledged"
                    ));
                }
                if fp.is_none() {
                    bad.push(format!("{what}: claimed entry {lsn}-0 shown trimmed"));
                }
                l.claimed.insert(*lsn);
            }
        }
        for (lsn, _) in claimed {
            self.pending.remove(lsn);
            self.claimed.entry(*lsn).or_insert(now);
        }
        for b in bad {
            self.r.fail(b);
        }
    }

    /// `XPENDING stockgate:events orders - + 100`: `[[id, consumer, idle, deliveries],
    /// ...]`, none acknowledged, none held by the first worker after an acknowledged
    /// claim of it. Held to that only from a member taking writes: a follower shows the
    /// groups as far as it has applied the log (docs/feed.md, "Replication"), a view
    /// that may be behind what was acknowledged, as its `XREAD` may.
    async fn list_pending(&mut self, who: &str) {
        let argv: [&[u8]; 6] = [b"XPENDING", STREAM, ORDERS.as_bytes(), b"-", b"+", b"100"];
        let what = format!("{who} XPENDING {ORDERS}");
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        let what = format!("{what} on n{id}");
        let Reply::Array(rows) = &reply else {
            return self.r.note(format!("{what}: {reply:?}"));
        };
        let leads = self
            .r
            .live
            .lock()
            .get(&id)
            .is_some_and(super::super::checks::takes_writes);
        if !leads {
            return self
                .r
                .note(format!("{what}: {} entries, a follower's view", rows.len()));
        }
        let mut bad = Vec::new();
        {
            let mut l = self.log.lock();
            l.counts[count::LISTED] += 1;
            for row in rows {
                let Reply::Array(f) = row else { continue };
                let lsn = f.first().and_then(|i| i.as_bulk()).and_then(super::lsn_of);
                let holder = f.get(1).and_then(|c| c.as_bulk()).unwrap_or_default();
                let Some(lsn) = lsn else { continue };
                if l.acked.contains(&lsn) {
                    bad.push(format!(
                        "{what}: entry {lsn}-0 pending after its XACK was acknowledged"
                    ));
                }
                if holder == FIRST.as_bytes() && l.claimed.contains(&lsn) {
                    bad.push(format!(
                        "{what}: entry {lsn}-0 pending for {FIRST} after {SECOND}'s claim of it was acknowledged"
                    ));
                }
            }
        }
        self.r.note(format!("{what}: {} entries", rows.len()));
        for b in bad {
            self.r.fail(b);
        }
    }
}
