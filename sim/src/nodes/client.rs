//! The scenario's client: a RESERVE every few milliseconds on whichever member takes
//! writes (as the command layer lets one through once `write_refusal` says nothing),
//! each reply waiting for the group's commit, as a connection's does. A hold counts as
//! acknowledged only once that wait succeeds.
//!
//! The replies wait one after another in one task, in the order the RESERVEs were
//! made, rather than each in a task of its own: tasks waiting on one `watch` channel
//! (the speculation's commit point) wake in an order tokio draws from a generator it
//! seeds at random, and the history would follow it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use stockgate_server::raft::speculation::Speculation;
use tokio::time::{timeout_at, Instant};

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::engine::{ReserveOutcome, ReserveRequest};
use stockgate_server::raft::NodeId;
use stockgate_server::session::Replication;
use tokio::time::{sleep, timeout};

use super::{Run, REPLY_TTL};

/// The one sale the client reserves from: more units than a run can take.
const SKU: &str = "A";

/// Creates the sale on `leader` and waits for its commit; `false` (a failure) if it
/// never commits.
pub(super) async fn create_sale(r: &Run, leader: NodeId) -> bool {
    let Some((engine, spec)) = r
        .live
        .lock()
        .get(&leader)
        .map(|n| (n.engine.clone(), n.spec.clone()))
    else {
        return false;
    };
    // Holds of the longest TTL: clock jumps forward add up over a run, and every hold
    // of this client must still be held at the end.
    let ttl = stockgate_server::engine::MAX_TTL_MS;
    let lsn = match engine.create_sale(SKU, 1 << 30, Some(2), Some(ttl), None) {
        Ok(lsn) => lsn,
        Err(e) => {
            r.fail(format!("the sale: {e}"));
            return false;
        }
    };
    let ok = timeout(REPLY_TTL, spec.wait(lsn)).await;
    r.note(format!("sale created on n{leader}: {ok:?}"));
    if !matches!(ok, Ok(Ok(()))) {
        r.fail("the sale never committed".into());
        return false;
    }
    true
}

/// A RESERVE whose reply waits for the group's commit.
pub(super) struct Pending {
    who: String,
    id: NodeId,
    token: String,
    lsn: u64,
    spec: Arc<Speculation>,
    made: Instant,
    until: Instant,
}

/// The replies still waiting, oldest first.
#[derive(Default)]
pub(super) struct Replies(Mutex<VecDeque<Pending>>);

/// Reserves until `stop`, every 5 to 40 ms (drawn); returns once every reply is
/// answered or timed out.
pub(super) async fn run(r: Arc<Run>, mut rng: StdRng, stop: Arc<AtomicBool>) {
    let replies = tokio::spawn(answer(r.clone(), stop.clone()));
    let mut n = 0u64;
    while !stop.load(Ordering::Acquire) {
        sleep(Duration::from_millis(rng.gen_range(5..40))).await;
        n += 1;
        reserve(&r, n);
    }
    let _ = replies.await;
}

/// Answers the waiting replies in order until `stop` and none is left.
async fn answer(r: Arc<Run>, stop: Arc<AtomicBool>) {
    loop {
        let next = r.replies.0.lock().pop_front();
        let Some(p) = next else {
            if stop.load(Ordering::Acquire) {
                return;
            }
            sleep(super::STEP).await;
            continue;
        };
        match timeout_at(p.until, p.spec.wait(p.lsn)).await {
            Ok(Ok(())) => {
                r.note(format!("{} on n{}: held {}", p.who, p.id, p.token));
                r.acked.lock().insert(p.token);
            }
            other => {
                r.note(format!("{} on n{}: no reply ({other:?})", p.who, p.id));
                answered_in_time(&r, &p);
            }
        }
    }
}

/// A leader that no majority answers gives way within the longest election timeout
/// and a reach round (`RaftNode::give_way_if_unanswered`): the replies waiting on it are
/// answered then (its clients retry where the group now leads) rather than at their
/// socket timeouts. Checked for a member that lives and was cut off.
fn answered_in_time(r: &Run, p: &Pending) {
    if r.killed.lock().contains(&p.id) {
        return;
    }
    let Some(cut) = r.cut_at.lock().get(&p.id).copied() else {
        return;
    };
    let (beat, _, longest) = super::TIMING;
    let by = cut.max(p.made) + Duration::from_millis(longest + 2 * beat);
    let now = Instant::now();
    if now > by {
        r.fail(format!(
            "{} on n{}: answered {} ms after its member was cut off",
            p.who,
            p.id,
            now.saturating_duration_since(cut).as_millis()
        ));
    }
}

/// One RESERVE on the first member (by id) that takes writes; none when no member does
/// (a client then asks discovery again later).
fn reserve(r: &Arc<Run>, n: u64) {
    let target = r
        .live
        .lock()
        .values()
        .find(|m| Replication::write_refusal(&*m.node).is_none())
        .map(|m| (m.id, m.engine.clone(), m.spec.clone()));
    let Some((id, engine, spec)) = target else {
        return;
    };
    let (user, who) = (format!("u{n}"), format!("c{n}"));
    let admission = engine.keyring().mint(SKU, &user, engine.now_ms() + 60_000);
    let req = ReserveRequest {
        sku: SKU,
        user: &user,
        admission: admission.as_bytes(),
        request_id: &who,
        qty: 1,
    };
    let (token, lsn) = match engine.reserve(&req) {
        Ok((ReserveOutcome::Reserved { token, .. }, lsn)) => (token.to_string(), lsn),
        Ok((o, _)) => return r.note(format!("{who} on n{id}: {o:?}")),
        Err(e) => return r.note(format!("{who} on n{id}: {e}")),
    };
    let made = Instant::now();
    r.replies.0.lock().push_back(Pending {
        who,
        id,
        token,
        lsn,
        spec,
        made,
        until: made + REPLY_TTL,
    });
}
