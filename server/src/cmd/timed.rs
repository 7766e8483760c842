//! The dispatcher with its measurements: each command run through [`super::dispatch`] is
//! timed and recorded into the connection's [`crate::metrics::Recorder`] under its slot in
//! the command table. The single hook of metrics into command execution; the store itself
//! knows no command.
//!
//! Transactions as Redis counts them: a command queued after `MULTI` is not a call (a
//! queue-time refusal still counts as rejected); `EXEC` is a call, and so is each command
//! it runs, with its reply. The commands inside share `EXEC`'s time evenly: the
//! dispatcher does not time them apart. Outcomes of a sale (RESERVE, RELEASE, COMMIT) are
//! counted by the commands themselves from their typed results, inside a transaction too.

use bytes::Bytes;

use super::command_table::{self, COMMANDS};
use super::{dispatch, multi, Ctx, Outcome};
use crate::metrics::{error_code, logging, CallKind};
use crate::protocol::Reply;

/// Slot of a command in [`COMMANDS`], without allocating.
fn command_slot(name: &[u8]) -> Option<usize> {
    COMMANDS
        .iter()
        .position(|s| s.name.len() == name.len() && s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Runs one command and records it (see the module's documentation).
pub fn dispatch_timed(ctx: &mut Ctx<'_>, argv: &[&[u8]]) -> Outcome {
    let mut queuing = false;
    let mut exec_queue: Option<Vec<Vec<Bytes>>> = None;
    if let Some(q) = ctx.conn.multi.as_ref() {
        let name = argv.first().map(|n| n.as_ref()).unwrap_or(b"");
        if name.eq_ignore_ascii_case(b"exec") {
            exec_queue = (!q.aborted).then(|| q.commands.clone());
        } else if !command_slot(name)
            .and_then(|i| COMMANDS.get(i))
            .is_some_and(multi::runs_at_once)
        {
            queuing = true;
        }
    }
    let t0 = ctx.conn.recorder.start();
    let o = dispatch(ctx, argv);
    let nanos = ctx.conn.recorder.stop(t0);
    if queuing && !o.reply.is_error() {
        return o;
    }
    record(ctx, argv, &o.reply, nanos);
    if let (Some(queue), Reply::Array(replies)) = (exec_queue, &o.reply) {
        if queue.len() == replies.len() && !queue.is_empty() {
            let each = nanos / queue.len() as u64;
            for (a, r) in queue.iter().zip(replies) {
                record(ctx, &multi::views(a), r, each);
            }
        }
    }
    o
}

fn record(ctx: &mut Ctx<'_>, argv: &[&[u8]], reply: &Reply, nanos: u64) {
    let Some(name) = argv.first() else { return };
    let conn = &mut *ctx.conn;
    let slot = conn.recorder.slot(name, command_slot);
    let err = match reply {
        Reply::Error(e) => Some(e.as_str()),
        _ => None,
    };
    if let Some(e) = err {
        conn.recorder.error(e);
    }
    // Unknown command: an error reply, no command counters (as Redis).
    let Some((slot, spec)) = slot.and_then(|i| Some((i, COMMANDS.get(i)?))) else {
        return;
    };
    let kind = match err {
        None => CallKind::Ok,
        Some(e) => {
            let code = error_code(e);
            if code == "NOAUTH" || code == "NOPERM" || !command_table::arity_ok(spec, argv.len()) {
                CallKind::Rejected
            } else {
                CallKind::Failed
            }
        }
    };
    conn.recorder.sample(slot, spec.name, nanos, kind);
    if kind != CallKind::Rejected {
        ctx.shared.metrics.log_if_slow(
            spec.name,
            argv,
            nanos / 1000,
            &conn.addr,
            conn.name.as_deref().unwrap_or(""),
        );
    }
    if spec.name.starts_with("sale.") {
        let ended = match reply {
            r if r.is_error() => logging::Ended::Refused,
            Reply::Int(n) => logging::Ended::Done(Some(*n)),
            _ => logging::Ended::Done(None),
        };
        logging::lifecycle(spec.name, argv, ended);
    }
}
