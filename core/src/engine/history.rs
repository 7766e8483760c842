//! The history this state belongs to: a random id logged once, by the first record of a
//! data dir (or of a Raft group), and carried by every snapshot and every member after.
//!
//! A ledger describes one history. A server restored from an older copy keeps its id
//! (its state is a prefix of that history); a wiped data dir, another server or another
//! group has another one. The tools that write to a ledger compare the two before they
//! act (`stockgate_client::identity`), so a ledger is never applied to a server it does
//! not describe.

use super::*;

/// A fresh history id: 128 random bits in hex.
pub fn new_history_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Engine {
    /// The history id and the LSN of the record that began it (0 when it came from the
    /// log or a snapshot, so is as durable as they are). `None` before the first start
    /// that wrote one.
    pub fn history(&self) -> Option<(Arc<str>, Lsn)> {
        self.history.lock().clone()
    }

    /// Begins the history with `id` unless one is known: logs it and returns its LSN.
    /// The id of the first record wins everywhere, so two leaders that each began one
    /// leave the group with the one the log kept first.
    pub fn begin_history(&self, id: &str) -> Lsn {
        // Under a stripe lock, so a snapshot (which stops the world) never covers the
        // record without the id.
        let mut stripe = self.stripes[0].lock();
        let mut h = self.history.lock();
        if let Some((_, lsn)) = &*h {
            return *lsn;
        }
        let lsn = self.sink.record(&EventRef::HistoryBegun { id });
        stripe.logged(lsn);
        *h = Some((id.into(), lsn));
        lsn
    }

    /// Replay of the record (or a snapshot's id): the first one stays.
    pub(super) fn adopt_history(&self, id: &str) {
        let mut h = self.history.lock();
        if h.is_none() && !id.is_empty() {
            *h = Some((id.into(), 0));
        }
    }
}
