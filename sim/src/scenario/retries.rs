//! `Settings::retries`: a client whose RESERVE went unanswered sends it again, with the
//! same request id, to whoever takes writes then, as the client packages do. The group
//! answers it with the hold the first attempt made, if that one is in the group's
//! history (a `REPLAY` of its token), or makes the hold now. A token is derived from the
//! sale, the user and the request id (`Keyring::derive`), so a second hold for one
//! request id cannot sit beside the first in a member's table; what is checked is that
//! a replay names the token the request's attempts were answered with, and (by the
//! run's other checks) that a hold acknowledged only to a retry, after a failover, is on
//! every member in its state, with the counters equal to the holds.

use stockgate_server::engine::Engine;

use super::commands::Reserved;
use super::{Cluster, Done};

/// How often one request is sent again at most.
const MAX_TRIES: u32 = 5;

/// A RESERVE that took units, as its client knows it.
#[derive(Clone, Debug)]
pub(super) struct Request {
    sku: String,
    user: String,
    qty: u32,
    /// Every token an attempt of it was answered with (acknowledged or not).
    tokens: Vec<String>,
    tries: u32,
}

impl Request {
    pub(super) fn new(sku: &str, user: &str, qty: u32, token: &str) -> Request {
        Request {
            sku: sku.to_owned(),
            user: user.to_owned(),
            qty,
            tokens: vec![token.to_owned()],
            tries: 0,
        }
    }
}

/// The attempt went unanswered: it is sent again later, a few times at most.
pub(super) fn unanswered(c: &Cluster, request_id: &str) {
    let again = c
        .requests
        .lock()
        .get_mut(request_id)
        .is_some_and(|r| r.tries < MAX_TRIES);
    if again {
        c.to_retry.lock().push_back(request_id.to_owned());
    }
}

/// Sends the oldest unanswered RESERVE again on `engine` (member `id`, which takes
/// writes); what to wait for, if it holds units.
pub(super) fn retry_one(c: &Cluster, engine: &Engine, id: u64) -> Option<(u64, Done, String)> {
    let request_id = c.to_retry.lock().pop_front()?;
    let r = {
        let mut requests = c.requests.lock();
        let r = requests.get_mut(&request_id)?;
        r.tries += 1;
        r.clone()
    };
    let who = format!("{request_id} again@n{id}");
    let (reply, lsn) = c
        .client(engine)
        .reserve(&r.sku, &r.user, &request_id, r.qty);
    match reply {
        Reserved::Hold {
            token,
            expires_at_ms,
        } => {
            if let Some(r) = c.requests.lock().get_mut(&request_id) {
                if !r.tokens.contains(&token) {
                    r.tokens.push(token.clone());
                }
            }
            let done = Done::Retried(request_id, token, r.sku, r.qty, expires_at_ms);
            Some((lsn, done, who))
        }
        Reserved::Replay {
            token,
            expires_at_ms,
        } => {
            if !r.tokens.contains(&token) {
                c.fail(format!(
                    "{who}: request {request_id} replayed as {token}, its attempts were answered {:?}",
                    r.tokens
                ));
                return None;
            }
            let done = Done::Retried(request_id, token, r.sku, r.qty, expires_at_ms);
            Some((lsn, done, who))
        }
        Reserved::Unreserved(o) => {
            super::note_unreserved(c, &who, &o);
            None
        }
        Reserved::Refused(e) => {
            c.env.history.note(format!("{who}: {e}"));
            None
        }
    }
}
