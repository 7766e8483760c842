//! The snapshots of `Settings::snapshots`: each member runs the server's own trigger
//! (`snapshot::trigger_loop`) with a small `--snapshot-records` drawn by the seed, so
//! that most runs build several snapshots, purge the Raft log behind them and send one
//! to a member that fell behind the purge (crashed, partitioned, stopped, wiped and
//! re-admitted: what the other fault steps already draw). Building, reading and
//! installing run inline (`Snapshots::new_inline`); an installing member is deposed and
//! restarts from its data dir, adopting the staged snapshot as a server's start does
//! (`member::start`, `snapshot::adopt_staged`).

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::engine::Snapshot;
use stockgate_server::raft::NodeId;

use crate::history::History;
use crate::member::Member;

/// The run's `--snapshot-records`: 10 to 150 records, so a run of a thousand-odd records
/// snapshots several times and (openraft keeping as many entries behind each snapshot,
/// `snapshot::log_to_keep`) a member a few seconds behind needs a snapshot.
pub(super) fn draw_every(rng: &mut StdRng, h: &History) -> u64 {
    let every = rng.gen_range(10..=150);
    h.note(format!("snapshots every {every} records"));
    every
}

/// A member's whole engine state, as a snapshot would write it, in an order that does
/// not depend on its hash tables: members that agree hold equal states, whether they
/// applied every entry or installed a snapshot and the entries after it.
pub(super) fn state_of(m: &Member) -> String {
    let (snap, ()) = m.engine.snapshot_with(|| ());
    let Snapshot {
        history,
        sales,
        reservations,
        tombs,
        rooms,
    } = snap;
    let mut res: Vec<String> = reservations.iter().map(|r| format!("{r:?}")).collect();
    res.sort();
    format!(
        "history {history:?} sales {sales:?} reservations {res:?} tombs {tombs:?} rooms {rooms:?}"
    )
}

/// At quiescence every member's engine state is the same (`state_of`); the members
/// whose state differs from the lowest id's, if any.
pub(super) fn differing_states(live: &BTreeMap<NodeId, Member>) -> Option<String> {
    let mut states = live.values().map(|m| (m.id, state_of(m)));
    let (first, want) = states.next()?;
    let odd: Vec<NodeId> = states
        .filter(|(_, s)| *s != want)
        .map(|(id, _)| id)
        .collect();
    (!odd.is_empty()).then(|| format!("engine states differ at quiescence: n{first} vs {odd:?}"))
}
