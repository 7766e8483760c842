//! Who a step acts on: the member taking writes, a member drawn, a member started
//! again as its supervisor starts it, and the while it stays down. Shared by the drawn
//! steps (`faults` and the kinds in files of their own).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use tokio::time::sleep;

use super::checks::{self, takes_writes};
use super::{boot, Run, FAILOVER_WITHIN};

/// The member taking writes now, if one does.
pub(super) fn writer(r: &Run) -> Option<NodeId> {
    let live = r.live.lock();
    live.values().find(|n| takes_writes(n)).map(|n| n.id)
}

/// A member drawn: the one taking writes half the time (when one does), else any.
pub(super) fn pick(r: &Run, rng: &mut StdRng) -> NodeId {
    let ids = &r.env.ids;
    let any = ids[rng.gen_range(0..ids.len())];
    match writer(r) {
        Some(w) if rng.gen_bool(0.5) => w,
        _ => any,
    }
}

/// Starts member `id` again from its data dir, as its supervisor does.
pub(super) async fn restart(r: &Run, id: NodeId) -> bool {
    match boot::start(&r.env, id, None).await {
        Ok(n) => {
            r.note(format!("n{id} starts again"));
            r.live.lock().insert(id, n);
            true
        }
        Err(e) => {
            r.fail(format!("n{id} refuses to start again: {e}"));
            false
        }
    }
}

/// The others agree on a leader while `what` lasts (a member down), then a drawn while
/// (0.1 to 1.5 s) passes before the member is brought back; false if they did not agree.
pub(super) async fn agree_then_pause(r: &Run, rng: &mut StdRng, what: &str) -> bool {
    if checks::agreement(r, what, FAILOVER_WITHIN, None, None)
        .await
        .is_none()
    {
        return false;
    }
    sleep(Duration::from_millis(rng.gen_range(100..1_500))).await;
    true
}
