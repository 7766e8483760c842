//! A member restarts on a damaged log, the first scenario's two disk kinds with its draws
//! (`disk::Flip`, `disk::Damage`): the member is killed (`kill -9`), one bit of its Raft
//! log or of a WAL segment is flipped on disk, or two bits of one record other than the
//! file's last, and it starts again from its data dir, as its supervisor starts it.
//!
//! What docs/design.md ("Recovery") promises a start: a record that one flipped bit is
//! all that is wrong with is put right, on disk too, wherever it is (`wal/bit_repair.rs`,
//! in the WAL's segments and in the Raft log), so the member starts with everything it
//! had; anything else before the end of the file is corruption, and the start refuses
//! it. The operator's answer to a refused start is docs/replication.md's for a lost disk:
//! the data dir wiped and the member re-admitted (`amnesia::rejoin`).
//!
//! Checked: on a flipped bit, the start succeeds and the byte reads what it read before
//! the flip (unless the file was replaced or removed since: a snapshot's rewrite); all
//! agree again and the member catches up. On a damaged record, a Raft log the start
//! accepts is a failure (the damage was read past, and with it an entry or a vote may
//! be lost), and so is a refusal that does not name the damaged record (its file and
//! where it starts: "naming file and offset"); a WAL segment the start does not read
//! (covered by a snapshot) is not. The end's checks find every acknowledged outcome on
//! the member.

use std::sync::Arc;

use rand::rngs::StdRng;
use stockgate_server::raft::NodeId;

use super::members::{pick, restart};
use super::storage_faults::caught_up;
use super::{amnesia, boot, checks, Run, HEAL_WITHIN};
use crate::disk::{Damage, Damaged, Disk, Flip};

/// A member drawn restarts on one flipped bit of one of its logs.
pub(super) async fn flip(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let f = Flip::draw(rng);
    let Some(disk) = killed(r, id, "to restart on a flipped bit").await else {
        return true;
    };
    let flipped = disk.flip(f);
    match &flipped {
        Some(f) if !f.read => r.note(format!(
            "n{id} disk: {} (a segment the snapshot covers: not read)",
            f.what
        )),
        Some(f) => r.note(format!("n{id} disk: {}", f.what)),
        None => r.note(format!("n{id} disk: no record to flip")),
    }
    if !restart(r, id).await {
        return false;
    }
    if let Some(f) = flipped {
        if let Some(wrong) = f.left_wrong() {
            r.fail(format!(
                "n{id} started on a flipped bit not put right ({}): {wrong}",
                f.what
            ));
            return false;
        }
    }
    back(r, id, "a flipped bit").await
}

/// A member drawn restarts on a record damaged beyond one bit; refused, it is wiped and
/// re-admitted.
pub(super) async fn damage(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let d = Damage::draw(rng);
    let Some(disk) = killed(r, id, "to restart on a damaged record").await else {
        return true;
    };
    let Some(damaged) = disk.damage_record(d) else {
        r.note(format!("n{id} disk: no record to damage"));
        return restart(r, id).await && back(r, id, "a kill").await;
    };
    let what = &damaged.what;
    r.note(format!("n{id} disk: {what}"));
    match boot::start(&r.env, id, None).await {
        Ok(n) => {
            r.live.lock().insert(id, n);
            if d.raft_log {
                r.fail(format!("n{id} started on a damaged Raft log: {what}"));
                return false;
            }
            r.note(format!("n{id} starts: the damaged segment is not read"));
            back(r, id, "a damaged segment").await
        }
        Err(e) => {
            let e = e.replace(&format!("{}/", r.env.root.display()), "");
            r.note(format!("n{id} refuses to start: {e}"));
            if !names_the_damage(&e, &damaged) {
                r.fail(format!(
                    "n{id} refused a damaged log for another reason than the damage ({what}): {e}"
                ));
                return false;
            }
            amnesia::rejoin(r, rng, id).await
        }
    }
}

/// Whether a refused start's error names the damaged record as docs/design.md
/// ("Recovery") says it must: the file, and the offset where the record starts. A
/// start that read past the damage and refused on a later check (the WAL holding
/// records past a Raft log it cut) lost the record without saying so.
fn names_the_damage(e: &str, d: &Damaged) -> bool {
    let at = if d.file.starts_with("raft") {
        format!("is corrupt at byte {}", d.from)
    } else {
        format!("at offset {}", d.from)
    };
    e.contains(&d.file) && e.contains(&at)
}

/// Kills member `id` (`kill -9`) for a disk fault: its disk, or `None` when it is down
/// already.
async fn killed(r: &Run, id: NodeId, why: &str) -> Option<Arc<Disk>> {
    let n = r.live.lock().remove(&id)?;
    r.note(format!("n{id} killed (kill -9), {why}"));
    n.kill().await;
    r.env.disks.lock().get(&id).cloned()
}

/// After member `id` started again: all agree, and it catches up.
async fn back(r: &Run, id: NodeId, after: &str) -> bool {
    let what = format!("n{id} back after {after}");
    let Some(leader) = checks::agreement(r, &what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    caught_up(r, id, leader).await
}
