//! How a client's write reaches a member: with `Settings::commands` (the default) as a
//! server's connection makes it, a command line (`RESERVE`, `COMMIT`, `RELEASE`,
//! `EXTEND`, `SALE.CREATE`) run by the command layer (`cmd::dispatch`, the function a
//! connection calls for each command), its reply read as a client reads it, and the LSN
//! the reply waits for taken from the command's `Outcome`, as the connection takes it.
//! Without it, the engine's own calls, as before the setting existed (the same history
//! lines, so the same digests).
//!
//! Reads of a hold's state still call the engine: the read check needs when a hold
//! finished, which `RESERVATION` does not report. The connection's gate (`-READONLY` on a
//! member that does not take writes) is not crossed either: the harness's members have
//! no `Replication` (`Shared::repl` unset), and the client picks the member that takes
//! writes as before.

use stockgate_server::cmd::{dispatch, Ctx};
use stockgate_server::engine::{Engine, EngineError, Lsn, Millis, ReserveOutcome, ReserveRequest};
use stockgate_server::protocol::reply::from_engine_error;
use stockgate_server::protocol::Reply;
use stockgate_server::session::{ConnState, Shared};
use stockgate_server::users::Role;

use super::Fate;

/// What a RESERVE was answered.
pub(super) enum Reserved {
    /// A new hold.
    Hold {
        token: String,
        expires_at_ms: Millis,
    },
    /// An earlier attempt's hold, named again.
    Replay {
        token: String,
        expires_at_ms: Millis,
    },
    /// Nothing taken (sold out, over the limit): the answer, for the history.
    Unreserved(String),
    /// An error reply.
    Refused(String),
}

/// An EXTEND refused: the reason for the history, and whether the hold is gone
/// (expired or unknown), which makes a later refusal of it expected.
pub(super) struct Refusal {
    pub text: String,
    pub gone: bool,
}

/// One member's engine, reached through the command layer when `shared` is given.
pub(super) struct Client<'a> {
    pub engine: &'a Engine,
    pub shared: Option<&'a Shared>,
}

impl Client<'_> {
    /// `RESERVE sku user admission request-id QTY qty`, the admission minted as a gate
    /// in front of the server would mint it.
    pub fn reserve(&self, sku: &str, user: &str, request_id: &str, qty: u32) -> (Reserved, Lsn) {
        let e = self.engine;
        let admission = e.keyring().mint(sku, user, e.now_ms() + 60_000);
        let Some(shared) = self.shared else {
            let req = ReserveRequest {
                sku,
                user,
                admission: admission.as_bytes(),
                request_id,
                qty,
            };
            return match e.reserve(&req) {
                Ok((o, lsn)) => (from_outcome(o), lsn),
                Err(err) => (Reserved::Refused(err.to_string()), 0),
            };
        };
        let qty = qty.to_string();
        let argv: [&[u8]; 7] = [
            b"RESERVE",
            sku.as_bytes(),
            user.as_bytes(),
            admission.as_bytes(),
            request_id.as_bytes(),
            b"QTY",
            qty.as_bytes(),
        ];
        let (reply, lsn) = run(e, shared, &argv);
        (reserve_reply(reply), lsn)
    }

    /// `RELEASE token` or `COMMIT token`: `Ok` with the LSN to wait for when it changed
    /// the hold, `Err` with the answer otherwise.
    pub fn finish(&self, token: &str, fate: Fate) -> Result<Lsn, String> {
        let Some(shared) = self.shared else {
            let r = match fate {
                Fate::Released => Ok(self.engine.release(token)),
                _ => self.engine.commit(token),
            };
            return match r {
                Ok((true, lsn)) => Ok(lsn),
                other => Err(format!("{other:?}")),
            };
        };
        let name: &[u8] = match fate {
            Fate::Released => b"RELEASE",
            _ => b"COMMIT",
        };
        match run(self.engine, shared, &[name, token.as_bytes()]) {
            (Reply::Int(1), lsn) => Ok(lsn),
            (reply, _) => Err(words(&reply)),
        }
    }

    /// `EXTEND token ms`: the new deadline and the LSN to wait for.
    pub fn extend(&self, token: &str, ms: u64) -> Result<(Millis, Lsn), Refusal> {
        let Some(shared) = self.shared else {
            return self.engine.extend(token, ms).map_err(|e| Refusal {
                gone: matches!(e, EngineError::Expired | EngineError::NoReservation),
                text: e.to_string(),
            });
        };
        let ms = ms.to_string();
        match run(
            self.engine,
            shared,
            &[b"EXTEND", token.as_bytes(), ms.as_bytes()],
        ) {
            (Reply::Int(at), lsn) => Ok((at.max(0) as Millis, lsn)),
            (Reply::Error(text), _) => {
                let is = |e: EngineError| from_engine_error(&e) == Reply::Error(text.clone());
                let gone = is(EngineError::Expired) || is(EngineError::NoReservation);
                Err(Refusal { text, gone })
            }
            (reply, _) => Err(Refusal {
                text: words(&reply),
                gone: false,
            }),
        }
    }

    /// `SALE.CREATE sku total SHARDS 2 TTL ttl`: the LSN to wait for.
    pub fn create_sale(&self, sku: &str, total: u64, ttl: u64) -> Result<Lsn, String> {
        let Some(shared) = self.shared else {
            return self
                .engine
                .create_sale(sku, total, Some(2), Some(ttl), None)
                .map_err(|e| e.to_string());
        };
        let (total, ttl) = (total.to_string(), ttl.to_string());
        let argv: [&[u8]; 7] = [
            b"SALE.CREATE",
            sku.as_bytes(),
            total.as_bytes(),
            b"SHARDS",
            b"2",
            b"TTL",
            ttl.as_bytes(),
        ];
        match run(self.engine, shared, &argv) {
            (Reply::Simple("OK"), lsn) => Ok(lsn),
            (reply, _) => Err(words(&reply)),
        }
    }
}

/// One command on a fresh admin connection, as `Session` runs it: the reply and the LSN
/// it must wait for.
fn run(engine: &Engine, shared: &Shared, argv: &[&[u8]]) -> (Reply, Lsn) {
    let mut conn = ConnState::new(1, Some(Role::Admin), "sim".into(), "sim".into());
    let mut ctx = Ctx {
        engine,
        conn: &mut conn,
        shared,
    };
    let out = dispatch(&mut ctx, argv);
    (out.reply, out.lsn)
}

/// The engine's answer as the history has always written it.
fn from_outcome(o: ReserveOutcome) -> Reserved {
    match o {
        ReserveOutcome::Reserved {
            token,
            expires_at_ms,
            ..
        } => Reserved::Hold {
            token: token.to_string(),
            expires_at_ms,
        },
        ReserveOutcome::Replay {
            token,
            expires_at_ms,
            ..
        } => Reserved::Replay {
            token: token.to_string(),
            expires_at_ms,
        },
        other => Reserved::Unreserved(format!("{other:?}")),
    }
}

/// A RESERVE reply as a client reads it: `RESERVED token deadline shard`, `REPLAY ...`,
/// `SOLDOUT`, `LIMIT ...`, or an error.
fn reserve_reply(reply: Reply) -> Reserved {
    let Reply::Array(items) = reply else {
        return match reply {
            Reply::Error(e) => Reserved::Refused(e),
            other => Reserved::Refused(format!("unexpected reply {}", words(&other))),
        };
    };
    let head = items.first().and_then(|w| w.as_bulk()).unwrap_or_default();
    let token = items.get(1).and_then(|w| w.as_bulk());
    let at = match items.get(2) {
        Some(Reply::Int(at)) => Some((*at).max(0) as Millis),
        _ => None,
    };
    let token = token.map(|t| String::from_utf8_lossy(t).into_owned());
    match (head, token, at) {
        (b"RESERVED", Some(token), Some(expires_at_ms)) => Reserved::Hold {
            token,
            expires_at_ms,
        },
        (b"REPLAY", Some(token), Some(expires_at_ms)) => Reserved::Replay {
            token,
            expires_at_ms,
        },
        _ => Reserved::Unreserved(words(&Reply::Array(items))),
    }
}

/// A reply as `redis-cli` would print it on one line: the words of an array joined by
/// spaces, an error as its text.
fn words(reply: &Reply) -> String {
    match reply {
        Reply::Simple(s) => (*s).to_owned(),
        Reply::Error(e) => e.clone(),
        Reply::Int(n) => n.to_string(),
        Reply::Nil => "(nil)".to_owned(),
        Reply::Array(v) | Reply::Set(v) => v.iter().map(words).collect::<Vec<_>>().join(" "),
        Reply::Map(kv) => kv
            .iter()
            .map(|(k, v)| format!("{} {}", words(k), words(v)))
            .collect::<Vec<_>>()
            .join(" "),
        bulk => String::from_utf8_lossy(bulk.as_bulk().unwrap_or_default()).into_owned(),
    }
}
