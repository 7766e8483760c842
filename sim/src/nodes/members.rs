//! Who a step acts on: the member taking writes, a member drawn, and a member started
//! again as its supervisor starts it. Shared by the drawn steps (`faults` and the
//! kinds in files of their own).

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;

use super::checks::takes_writes;
use super::{boot, Run};

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
