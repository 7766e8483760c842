//! A member's process dies (`RaftNode::stop`), by a `kill -9` (its files as they are)
//! or with the machine's power (each log file cut back to what was synced, or by the
//! seed part of the rest: `Disk::power_cut`). Shared by the drawn steps that crash a
//! member (`faults`, `overlap`).

use rand::rngs::StdRng;
use stockgate_server::raft::NodeId;

use super::members::pick;
use super::Run;

/// A member (`id`, or one drawn) dies, with the power or by a `kill -9`: which, and how.
/// `None` when that member is restarting already.
pub(super) async fn down(
    r: &Run,
    rng: &mut StdRng,
    power: bool,
    id: Option<NodeId>,
) -> Option<(NodeId, &'static str)> {
    let id = match id {
        Some(id) => id,
        None => pick(r, rng),
    };
    let n = r.live.lock().remove(&id)?;
    let how = if power { "power loss" } else { "kill -9" };
    r.note(format!("n{id} crashes ({how})"));
    n.kill().await;
    if power {
        let disk = r.env.disks.lock().get(&id).cloned();
        if let Some(disk) = disk {
            disk.power_cut(rng, None, &r.env.history);
        }
    }
    Some((id, how))
}
