//! The fault kind of `Settings::bit_flips`: one bit of a member's log read back wrong.
//!
//! The logs are read whole only when a member starts (the Raft log's entries stay in
//! memory, the WAL is read again only by the feed and by snapshots, which the
//! simulation leaves out), so a flip read at a start is the flip that matters: the
//! member is taken down by a `kill -9`, one bit of its Raft log or of one of its WAL
//! segments is flipped on disk, and it starts again. Half the flips land in the file's
//! last record, the one a start may mistake for a torn write.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;

use super::{Cluster, End};
use crate::disk::Flip;

/// Member `id` (drawn) restarts reading one flipped bit of one of its log files.
pub(super) async fn bit_flip(c: &Arc<Cluster>, rng: &mut StdRng) {
    let id = rng.gen_range(1..=c.ids.len() as u64);
    if c.env.net.is_paused(id) {
        return;
    }
    let flip = Flip::draw(rng);
    c.crash(id, "kill -9, to restart on a flipped bit", End::Kill)
        .await;
    let disk = c.disks.lock()[&id].clone();
    match disk.flip(flip) {
        Some(f) => c.env.history.note(format!("n{id} disk: {}", f.what)),
        None => c.env.history.note(format!("n{id} disk: no record to flip")),
    }
    c.start(id).await;
}
