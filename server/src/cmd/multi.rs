//! Transactions: `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`, with Redis's semantics,
//! because redis-py's default `pipeline()`, ioredis `multi()` and node-redis `multi()`
//! wrap their commands in `MULTI … EXEC`.
//!
//! - Between `MULTI` and `EXEC` every command except the transaction commands themselves,
//!   `QUIT` and `RESET` is queued and answered `+QUEUED`.
//! - A command refused at queue time (unknown, wrong arity, `NOAUTH`, `NOPERM`, not
//!   allowed in a transaction, queue full) gets its error at once and dooms the
//!   transaction: `EXEC` answers `-EXECABORT` and runs nothing.
//! - `EXEC` runs the queue in order through `dispatch` (so every check a command gets
//!   outside a transaction, it gets inside too) and answers the array of replies; a
//!   runtime error is one element of that array and the rest still runs.
//! - Not isolated: other connections' commands may run between two queued commands (each
//!   command is atomic on its own). `WATCH` is refused rather than faked, so no client
//!   believes it has optimistic locking it does not have; `UNWATCH` is a no-op.
//! - Durability: `EXEC`'s outcome carries the highest log position of its commands, so
//!   its reply waits until every record any of them depends on is acknowledged.

use bytes::{Bytes, BytesMut};

use super::command_table::Spec;
use super::{dispatch, Ctx, Outcome};
use crate::protocol::Reply;
use crate::session::MultiQueue;

/// Commands that are not queued inside a transaction but run at once (as in Redis).
pub fn runs_at_once(spec: &Spec) -> bool {
    matches!(
        spec.name,
        "multi" | "exec" | "discard" | "watch" | "quit" | "reset"
    )
}

/// Commands refused inside a transaction. `HELLO` would switch the protocol the `EXEC`
/// reply is encoded in halfway through it.
fn not_in_multi(spec: &Spec) -> bool {
    // SUBSCRIBE turns the connection into something else, which EXEC cannot; BACKUP's
    // reply comes from a copy that EXEC cannot wait for; SHUTDOWN ends the process, as
    // Redis refuses it in a transaction.
    matches!(
        spec.name,
        "hello" | "subscribe" | "psubscribe" | "backup" | "sale.migrate" | "shutdown"
    )
}

/// A refusal by the dispatcher's checks (unknown command, arity, auth, role). Inside a
/// transaction it also marks the transaction aborted, so that `EXEC` runs nothing.
pub fn refused(ctx: &mut Ctx<'_>, reply: Reply) -> Outcome {
    if let Some(q) = ctx.conn.multi.as_mut() {
        abort(q);
    }
    reply.into()
}

fn abort(q: &mut MultiQueue) {
    q.aborted = true;
    // Nothing queued will ever run: give the memory back now.
    q.commands = Vec::new();
    q.bytes = 0;
}

/// A queued command's arguments as the borrowed views `dispatch` takes.
pub fn views(argv: &[Bytes]) -> smallvec::SmallVec<[&[u8]; 8]> {
    argv.iter().map(|a| &a[..]).collect()
}

/// Queues `argv` (already checked by the dispatcher) in the open transaction.
pub fn queue(ctx: &mut Ctx<'_>, spec: &Spec, argv: &[&[u8]]) -> Outcome {
    let max_cmds = ctx.shared.config.limits.max_args;
    let max_bytes = ctx.shared.live.max_query_buffer();
    let Some(q) = ctx.conn.multi.as_mut() else {
        return Reply::err("ERR no transaction open").into();
    };
    if not_in_multi(spec) {
        abort(q);
        return Reply::err("ERR Command not allowed inside a transaction").into();
    }
    if q.aborted {
        // Redis keeps answering QUEUED after an error; EXEC will abort. Nothing is kept.
        return Reply::Simple("QUEUED").into();
    }
    // What the copy below holds: the bytes and one `Bytes` handle per argument.
    let size: usize = argv
        .iter()
        .map(|a| a.len() + std::mem::size_of::<Bytes>())
        .sum();
    if q.commands.len() >= max_cmds || q.bytes.saturating_add(size) > max_bytes {
        // Bounded so that a client cannot grow the server's memory without end; the whole
        // transaction is refused rather than run in part.
        abort(q);
        return Reply::err(format!(
            "ERR MULTI queue limit reached (at most {max_cmds} commands and {max_bytes} bytes); the transaction is discarded"
        ))
        .into();
    }
    q.bytes += size;
    // Copied out of the read buffer: a slice of it would keep that whole buffer alive
    // until EXEC, and the memory held would be far more than `bytes` counts.
    q.commands
        .push(argv.iter().map(|a| Bytes::copy_from_slice(a)).collect());
    Reply::Simple("QUEUED").into()
}

/// `MULTI`
pub fn multi(ctx: &mut Ctx<'_>) -> Outcome {
    if ctx.conn.in_multi() {
        // As Redis: an error, but the open transaction stays valid.
        return Reply::err("ERR MULTI calls can not be nested").into();
    }
    ctx.conn.multi = Some(MultiQueue::default());
    Reply::ok().into()
}

/// `DISCARD`
pub fn discard(ctx: &mut Ctx<'_>) -> Outcome {
    match ctx.conn.multi.take() {
        Some(_) => Reply::ok().into(),
        None => Reply::err("ERR DISCARD without MULTI").into(),
    }
}

/// `EXEC`
pub fn exec(ctx: &mut Ctx<'_>) -> Outcome {
    // Taken out of the connection first: the queued commands then run as they would
    // outside a transaction (and a queued MULTI/EXEC cannot exist: those run at once).
    let Some(q) = ctx.conn.multi.take() else {
        return Reply::err("ERR EXEC without MULTI").into();
    };
    if q.aborted {
        return Reply::err("EXECABORT Transaction discarded because of previous errors.").into();
    }
    let max_out = ctx.shared.live.max_output_buffer();
    let mut replies = Vec::with_capacity(q.commands.len());
    let mut lsn = 0;
    let mut close = false;
    // Encoded size of the replies so far: the array is built whole before it is encoded,
    // so the output limit is enforced here (pipelined replies are checked in `server`).
    let mut out_bytes = 0usize;
    let mut overflow = false;
    let mut scratch = BytesMut::new();
    for argv in &q.commands {
        let o = dispatch(ctx, &views(argv));
        lsn = lsn.max(o.lsn);
        close |= o.close;
        if overflow {
            // Every command still runs (Redis's semantics); only its reply is dropped.
            continue;
        }
        scratch.clear();
        o.reply.encode(ctx.conn.proto, &mut scratch);
        out_bytes += scratch.len();
        if out_bytes > max_out {
            overflow = true;
            replies = Vec::new();
        } else {
            replies.push(o.reply);
        }
    }
    if overflow {
        ctx.shared
            .stats
            .obuf_disconnects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Outcome {
            reply: Reply::err("ERR output buffer limit reached; closing connection"),
            lsn,
            close: true,
            wait: None,
            takeover: None,
        };
    }
    Outcome {
        reply: Reply::Array(replies),
        lsn,
        close,
        // A queued blocking read answers at once (its `reply`), as in Redis.
        wait: None,
        takeover: None,
    }
}

/// `WATCH key...`: refused. stockgate has no keys to watch, and a fake `+OK` would let
/// a client believe its `EXEC` is conditional when it is not.
pub fn watch() -> Outcome {
    Reply::err(
        "ERR WATCH is not supported by stockgate: transactions are not isolated (docs/protocol.md, Transactions)",
    )
    .into()
}

/// `UNWATCH`: nothing is ever watched, so there is nothing to forget.
pub fn unwatch() -> Outcome {
    Reply::ok().into()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::engine::{
        Engine, EngineConfig, EventRef, EventSink, Keyring, Lsn, ManualClock, ReservationKey,
    };
    use crate::session::{ConnState, NoDurability, Role, ServerConfig, Shared};

    /// Hands out increasing log positions, as the WAL does.
    #[derive(Default)]
    struct CountingSink(AtomicU64);

    impl EventSink for CountingSink {
        fn record(&self, _event: &EventRef<'_>) -> Lsn {
            self.0.fetch_add(1, Ordering::SeqCst) + 1
        }

        fn last_lsn(&self) -> Lsn {
            self.0.load(Ordering::SeqCst)
        }
    }

    struct World {
        engine: Engine,
        sink: Arc<CountingSink>,
        shared: Shared,
        conn: ConnState,
    }

    fn world(max_args: usize) -> World {
        let sink = Arc::new(CountingSink::default());
        let engine = Engine::new(
            EngineConfig::default(),
            Arc::new(ManualClock::new(1_700_000_000_000)),
            sink.clone(),
            Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap(),
            ReservationKey::from_bytes(&[9u8; 32]),
        );
        let mut config = ServerConfig::default();
        config.limits.max_args = max_args;
        World {
            engine,
            sink,
            shared: Shared::new(config, None, Arc::new(NoDurability)),
            conn: ConnState::new(1, Some(Role::Admin), "a".into(), "b".into()),
        }
    }

    impl World {
        fn run(&mut self, args: &[&str]) -> Outcome {
            let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            let mut ctx = Ctx {
                engine: &self.engine,
                conn: &mut self.conn,
                shared: &self.shared,
            };
            dispatch(&mut ctx, &argv)
        }

        fn admission(&self, sku: &str, user: &str) -> String {
            self.engine
                .keyring()
                .mint(sku, user, self.engine.now_ms() + 60_000)
        }
    }

    fn queued(o: &Outcome) {
        assert_eq!(o.reply, Reply::Simple("QUEUED"));
        assert_eq!(o.lsn, 0, "queuing logs nothing");
    }

    #[test]
    fn exec_waits_for_the_last_record_of_any_queued_command() {
        let mut w = world(1024);
        assert_eq!(w.run(&["MULTI"]).reply, Reply::ok());
        queued(&w.run(&["SALE.CREATE", "S", "10", "SHARDS", "1"]));
        let adm = w.admission("S", "alice");
        queued(&w.run(&["RESERVE", "S", "alice", &adm, "r1"]));
        // Last command logs nothing: the max over the queue must still win.
        queued(&w.run(&["STOCK", "S"]));
        assert_eq!(w.sink.0.load(Ordering::SeqCst), 0, "nothing ran yet");
        let o = w.run(&["EXEC"]);
        let Reply::Array(replies) = &o.reply else {
            panic!("EXEC must answer an array: {:?}", o.reply);
        };
        assert_eq!(replies.len(), 3);
        assert_eq!(replies[0], Reply::ok());
        assert!(matches!(&replies[1], Reply::Array(v) if v[0] == Reply::bulk("RESERVED")));
        assert_eq!(replies[2], Reply::Int(9));
        let last = w.sink.0.load(Ordering::SeqCst);
        assert!(last >= 2);
        assert_eq!(o.lsn, last, "EXEC's reply waits for its last record");
        assert!(!w.conn.in_multi());
    }

    #[test]
    fn queue_time_errors_abort_and_nothing_runs() {
        let mut w = world(1024);
        w.run(&["SALE.CREATE", "S", "10"]);
        let before = w.sink.0.load(Ordering::SeqCst);
        w.run(&["MULTI"]);
        let adm = w.admission("S", "alice");
        queued(&w.run(&["RESERVE", "S", "alice", &adm, "r1"]));
        assert!(w.run(&["NOSUCH"]).reply.is_error());
        assert!(w.run(&["STOCK"]).reply.is_error());
        assert!(w.run(&["HELLO", "3"]).reply.is_error());
        // Still answered QUEUED after the error, as Redis does.
        queued(&w.run(&["STOCK", "S"]));
        let o = w.run(&["EXEC"]);
        assert_eq!(
            o.reply,
            Reply::err("EXECABORT Transaction discarded because of previous errors.")
        );
        assert_eq!(w.sink.0.load(Ordering::SeqCst), before, "nothing logged");
        assert_eq!(w.engine.stock("S").unwrap(), 10);
        assert_eq!(w.conn.proto, 2);
    }

    #[test]
    fn bounded_queue() {
        let mut w = world(4);
        w.run(&["MULTI"]);
        for _ in 0..4 {
            queued(&w.run(&["PING"]));
        }
        assert!(w.run(&["PING"]).reply.is_error(), "fifth command refused");
        assert!(w.conn.multi.as_ref().unwrap().commands.is_empty(), "freed");
        assert!(w.run(&["EXEC"]).reply.is_error());
    }

    #[test]
    fn transaction_commands_outside_and_nested() {
        let mut w = world(1024);
        assert_eq!(w.run(&["EXEC"]).reply, Reply::err("ERR EXEC without MULTI"));
        assert_eq!(
            w.run(&["DISCARD"]).reply,
            Reply::err("ERR DISCARD without MULTI")
        );
        w.run(&["MULTI"]);
        assert_eq!(
            w.run(&["MULTI"]).reply,
            Reply::err("ERR MULTI calls can not be nested")
        );
        queued(&w.run(&["PING"]));
        assert!(w.run(&["WATCH", "x"]).reply.is_error());
        queued(&w.run(&["UNWATCH"]));
        let o = w.run(&["EXEC"]);
        assert_eq!(
            o.reply,
            Reply::Array(vec![Reply::Simple("PONG"), Reply::ok()])
        );
        w.run(&["MULTI"]);
        queued(&w.run(&["PING"]));
        assert_eq!(w.run(&["DISCARD"]).reply, Reply::ok());
        assert!(!w.conn.in_multi());
        w.run(&["MULTI"]);
        assert_eq!(w.run(&["RESET"]).reply, Reply::Simple("RESET"));
        assert!(!w.conn.in_multi(), "RESET discards the transaction");
        assert_eq!(w.run(&["EXEC"]).reply, Reply::err("ERR EXEC without MULTI"));
    }
}
