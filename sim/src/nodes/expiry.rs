//! Hold expiry and clock jumps in the `RaftNode` scenario. Each member has a wall
//! clock of its own: the paused clock from a fixed epoch plus an offset, which clock
//! jumps move and which outlives the member's processes (a machine's clock). Its engine
//! reads it through `Monotonic`, new in each process, as a server's `SystemClock`: a
//! jump forward is seen at once, one back not until the wall passes what the process
//! read before, unless it restarts meanwhile.
//!
//! Every member process runs the server's ticker (`server::spawn_ticker`'s loop, with
//! its rule `authority::may_tick`): only the member taking writes expires holds
//! (`auto_release`, a server with no ledger), and its Raft log carries the releases to
//! the others. At the end, every member's counters must equal its holds' states, and no
//! hold the client never released may have been released before its deadline by the
//! clock of the engine that released it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::engine::{Clock, Engine, Millis, Monotonic, ReservationState, WallSource};
use stockgate_server::raft::runtime::under_gate;
use stockgate_server::raft::{authority, NodeId};
use stockgate_server::session::{ServerConfig, Shared};
use tokio::task::JoinHandle;

use crate::gate::Gate;
use tokio::time::{sleep, Instant};

use super::Run;

/// Where the simulated wall clocks stand when a run begins.
const EPOCH_MS: Millis = 1_700_000_000_000;

/// A member's wall clock: the epoch plus the simulated time since the run began, plus
/// the member's offset.
struct SimWall {
    start: Instant,
    offset: Arc<AtomicI64>,
}

impl WallSource for SimWall {
    fn wall_ms(&self) -> Millis {
        let t = EPOCH_MS + self.start.elapsed().as_millis() as u64;
        t.saturating_add_signed(self.offset.load(Ordering::Acquire))
    }
}

/// The members' wall clocks, and whether their engines expire holds.
pub struct Clocks {
    start: Instant,
    offsets: BTreeMap<NodeId, Arc<AtomicI64>>,
    /// The engines run the ticker with `auto_release`.
    pub expiry: bool,
}

impl Clocks {
    /// Clocks for `ids`, all at the epoch now.
    pub fn new(ids: &[NodeId], expiry: bool) -> Clocks {
        let offsets = ids.iter().map(|&i| (i, Arc::default())).collect();
        Clocks {
            start: Instant::now(),
            offsets,
            expiry,
        }
    }

    /// A new process's clock on member `id`'s wall.
    pub fn clock(&self, id: NodeId) -> Arc<dyn Clock> {
        let offset = self.offsets.get(&id).cloned().unwrap_or_default();
        let wall = SimWall {
            start: self.start,
            offset,
        };
        Arc::new(Monotonic::over(wall))
    }

    /// Steps member `id`'s wall by `ms`: its offset after.
    fn jump(&self, id: NodeId, ms: i64) -> i64 {
        self.offsets
            .get(&id)
            .map_or(0, |o| o.fetch_add(ms, Ordering::AcqRel) + ms)
    }
}

/// The server's ticker (`server::spawn_ticker`): the engine's timers every `tick_ms` of
/// the server's defaults, when `authority::may_tick` says so given the member's write
/// gate (only the member taking writes).
pub fn ticker(engine: Arc<Engine>, shared: Arc<Shared>, gate: Arc<Gate>) -> JoinHandle<()> {
    let period = Duration::from_millis(ServerConfig::default().tick_ms.max(1));
    // A stopped member's ticker stops with it.
    tokio::spawn(under_gate(gate, async move {
        let mut iv = tokio::time::interval(period);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            iv.tick().await;
            let refused = shared.repl.get().map(|r| r.write_refusal().is_some());
            if authority::may_tick(refused) {
                engine.tick();
            }
        }
    }))
}

/// Until `stop`: every 0.5 to 3 s, one time in three, a member's wall clock steps
/// forward or back (an NTP step, an operator's `date`), by 50 ms to 5 s or 5 s to
/// 5 min (half each), as the first scenario's jumps. Returns how many.
pub(super) async fn jumps(r: Arc<Run>, mut rng: StdRng, stop: Arc<AtomicBool>) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::Acquire) {
        sleep(Duration::from_millis(rng.gen_range(500..3_000))).await;
        if rng.gen_range(0..3) != 0 {
            continue;
        }
        let ids = &r.env.ids;
        let id = ids[rng.gen_range(0..ids.len())];
        let ms: i64 = if rng.gen_bool(0.5) {
            rng.gen_range(50..5_000)
        } else {
            rng.gen_range(5_000..300_000)
        };
        let step = if rng.gen_bool(0.5) { -ms } else { ms };
        let now = r.env.clocks.jump(id, step);
        n += 1;
        r.note(format!(
            "n{id} clock steps {step:+} ms (now {now:+} ms off)"
        ));
    }
    n
}

/// Member `id`'s counters against its holds (held is the units of its RESERVED holds,
/// sold those of its COMMITTED ones, available + held + sold = total), and no hold
/// released before its deadline unless its token is in `released` (a RELEASE the
/// client sent): `finished_at_ms` is the reading of the engine that released it, which
/// the log carries to every member, and the wheel fires a hold only once that reading
/// reached its deadline.
pub(super) fn counters(id: NodeId, e: &Engine, released: &BTreeSet<String>) -> Vec<String> {
    let (snap, ()) = e.snapshot_with(|| ());
    let mut units: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut bad = Vec::new();
    for h in &snap.reservations {
        let u = units.entry(h.sku.as_str()).or_default();
        match h.state {
            ReservationState::Reserved => u.0 += u64::from(h.qty),
            ReservationState::Committed => u.1 += u64::from(h.qty),
            ReservationState::Released => {
                if !released.contains(&h.token) && h.finished_at_ms < h.expires_at_ms {
                    bad.push(format!(
                        "n{id}: {} expired early: deadline {}, released at {}",
                        h.token, h.expires_at_ms, h.finished_at_ms
                    ));
                }
            }
        }
    }
    for v in &snap.sales {
        let (held, sold) = units.get(v.sku.as_str()).copied().unwrap_or_default();
        let sum = v.available + (held + sold) as i64;
        if v.reserved != held || v.committed != sold || sum != v.total as i64 {
            bad.push(format!(
                "n{id}: {} counters (available {}, reserved {}, committed {}, total {}) \
                 disagree with its holds (held {held}, sold {sold})",
                v.sku, v.available, v.reserved, v.committed, v.total
            ));
        }
    }
    bad
}

/// The end check of every live member's counters ([`counters`]); the holds expired
/// (released by no RELEASE of the client) on the first member, for the history.
pub(super) fn check_counters(r: &Run, released: &BTreeSet<String>) {
    let mut bad = Vec::new();
    let mut expired = None;
    for n in r.live.lock().values() {
        bad.extend(counters(n.id, &n.engine, released));
        if expired.is_none() {
            let (snap, ()) = n.engine.snapshot_with(|| ());
            let x = snap
                .reservations
                .iter()
                .filter(|h| h.state == ReservationState::Released && !released.contains(&h.token));
            expired = Some(x.count());
        }
    }
    r.note(format!(
        "counters agree with the holds' states on every member: {}; {} holds expired",
        bad.is_empty(),
        expired.unwrap_or(0)
    ));
    for b in bad {
        r.fail(b);
    }
}
