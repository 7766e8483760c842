//! A leader on a slow disk loses the power and comes back at once (`Kinds::slow_leader`).
//!
//! Why this kind: a leader sends its entries to the followers before its own Raft log
//! has synced them (openraft replicates what is appended; a server's writer thread syncs
//! a while later), and the followers' acknowledgements commit them without it. With a
//! disk far slower than the network on the leader alone, the followers hold entries of
//! the leader's term that the leader has not made durable; a power loss then takes them
//! from the leader only. Restarted at once, before any follower's election timeout, it
//! finds its vote for itself in its log. If it led that term again (a restart resuming
//! its leadership), it would write other entries at the indexes it lost, under the same
//! log ids the followers hold, and a follower, which compares log ids and never
//! payloads, would keep its own: Log Matching broken, the members applying different
//! batches at one index. The server's rule is that a restart never resumes a leadership
//! (`LogStore` recovers the vote uncommitted), so it must stand in a new term, which
//! the followers with the longer log refuse it until one of them leads.
//!
//! Checked: after the restart all agree within [`HEAL_WITHIN`], the member catches up,
//! and no two members hold different entries under one log id (`logs_match`); the end's
//! checks find every acknowledged outcome on every member.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, Instant};

use super::checks;
use super::crash::down;
use super::members::{restart, writer};
use super::storage_faults::caught_up;
use super::{Run, HEAL_WITHIN};
use crate::disk::Hook;

/// The member taking writes gets a disk on which each Raft log write and sync takes 50
/// to 400 ms (the network's legs take at most 30 ms), keeps taking writes until a
/// follower holds an entry it has not synced, or for 0.3 to 2 s at most, loses the
/// power, and starts again 0 to 50 ms later.
pub(super) async fn power_loss(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let lo = rng.gen_range(50..200);
    let hi = lo + rng.gen_range(50..200);
    let lasts = rng.gen_range(300..2_000);
    let back_in = rng.gen_range(0..=50);
    let Some(id) = writer(r) else {
        r.note("slow disk: no member takes writes".into());
        return true;
    };
    let hook = r.live.lock().get(&id).map(|n| n.hook.clone());
    let Some(hook) = hook else {
        return true;
    };
    if !hook.slow_syncs(lo * 1_000, hi * 1_000) {
        // Without lagging I/O the Raft log syncs each change before it returns.
        r.note(format!("n{id} disk: syncs inline, not slowed"));
        return true;
    }
    r.note(format!(
        "n{id} disk slow: its Raft log syncs {lo} to {hi} ms after each change, taking writes, for {lasts} ms"
    ));
    let ahead = follower_ahead(r, id, &hook, Duration::from_millis(lasts)).await;
    if let Some((f, at, synced)) = ahead {
        r.note(format!(
            "n{f} holds entry {at}, n{id} has synced only up to about {synced}"
        ));
    }
    let last = r.live.lock().get(&id).map(|n| n.store.last_index());
    let others: Vec<(NodeId, u64)> = {
        let live = r.live.lock();
        let o = live.values().filter(|n| n.id != id);
        o.map(|n| (n.id, n.store.last_index())).collect()
    };
    let Some((id, how)) = down(r, rng, true, Some(id)).await else {
        return true;
    };
    sleep(Duration::from_millis(back_in)).await;
    if !restart(r, id).await {
        return false;
    }
    let now = r.live.lock().get(&id).map(|n| n.store.last_index());
    r.note(format!(
        "n{id} back {back_in} ms after its {how}: its log ended at {last:?}, now at {now:?}; the others' at the loss {others:?}"
    ));
    let what = format!("n{id} back after a {how} on a slow disk");
    let Some(leader) = checks::agreement(r, &what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    caught_up(r, id, leader).await && checks::logs_match(r, &what)
}

/// Waits, at most `within`, until a follower of leader `id` holds an entry past what the
/// leader's Raft log has synced (taken as the leader's last entry when its latest sync
/// was seen, looked at every millisecond: a little ahead of the truth, never behind):
/// that follower, its last entry, and the leader's synced end.
async fn follower_ahead(
    r: &Run,
    id: NodeId,
    hook: &Hook,
    within: Duration,
) -> Option<(NodeId, u64, u64)> {
    let start = Instant::now();
    let (mut syncs, mut synced) = (u64::MAX, 0);
    while start.elapsed() < within {
        let ahead = {
            let live = r.live.lock();
            let leader = live.get(&id)?;
            if hook.raft_syncs() != syncs {
                syncs = hook.raft_syncs();
                synced = leader.store.last_index();
            }
            let o = live.values().filter(|n| n.id != id);
            o.map(|n| (n.id, n.store.last_index())).max_by_key(|f| f.1)
        };
        if let Some((f, at)) = ahead.filter(|f| f.1 > synced) {
            return Some((f, at, synced));
        }
        sleep(Duration::from_millis(1)).await;
    }
    None
}
