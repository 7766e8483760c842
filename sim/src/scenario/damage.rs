//! The fault kind of `Settings::damage`: a record of a member's log damaged beyond what
//! one flipped bit is (two bits of one record, not the file's last), and the operator's
//! answer to it.
//!
//! A start must refuse such a log: it cannot tell what the record said, and a member
//! that went on without it could forget an entry it acknowledged or a vote it cast. The
//! operator then does what docs/operations.md says for a member whose disk is lost:
//! wipes its data dir and re-admits it (`RAFT.READMIT`), and it comes back as new
//! storage, caught up from the others. Damage to the last record is left to the torn
//! write of a power loss and to `Settings::bit_flips`: to a start it is a torn write.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;

use super::{wipe, Cluster, End};
use crate::disk::Damage;

/// Member `id` (drawn) restarts on a damaged record; if it refuses, it is wiped and
/// re-admitted. A Raft log it starts on anyway is a failure: the damage was read past.
pub(super) async fn damage(c: &Arc<Cluster>, rng: &mut StdRng) {
    let id = rng.gen_range(1..=c.ids.len() as u64);
    let Damage { raft_log, pick } = Damage::draw(rng);
    if c.env.net.is_paused(id) || !c.may_lose_a_disk() || !c.live.lock().contains_key(&id) {
        return;
    }
    c.crash(id, "kill -9, to restart on a damaged record", End::Kill)
        .await;
    let disk = c.disks.lock()[&id].clone();
    let Some(what) = disk.damage(raft_log, pick) else {
        c.env
            .history
            .note(format!("n{id} disk: no record to damage"));
        c.start(id).await;
        return;
    };
    c.env.history.note(format!("n{id} disk: {what}"));
    match c.try_start(id).await {
        Ok(()) if raft_log => c.fail(format!("n{id} started on a damaged Raft log: {what}")),
        Ok(()) => c
            .env
            .history
            .note(format!("n{id} starts: the damaged segment is not read")),
        Err(e) => {
            let e = e.replace(&format!("{}/", c.env.root.display()), "");
            c.env.history.note(format!("n{id} refuses to start: {e}"));
            wipe(c, id).await;
        }
    }
}
