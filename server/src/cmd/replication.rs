//! Replication and Sentinel commands: ROLE, WAIT, SENTINEL and RAFT.* (answered by a
//! Raft group member, `crate::raft`), and the Redis replication commands a stockgate
//! node refuses in plain words (REPLICAOF/SLAVEOF, REPLCONF, PSYNC/SYNC): its replicas
//! are group members.

use std::sync::Arc;
use std::time::Duration;

use super::args::i64_in;
use super::{Ctx, Outcome};
use crate::protocol::Reply;
use crate::session::Replication;

fn repl(ctx: &Ctx<'_>) -> Result<Arc<dyn Replication>, Reply> {
    ctx.shared.repl.get().cloned().ok_or_else(|| {
        Reply::err("ERR this server is not a member of a Raft group (start it with --raft-id; docs/replication.md)")
    })
}

/// `REPLICAOF`/`SLAVEOF`, `REPLCONF`, `PSYNC`/`SYNC`: Redis's replication, which
/// stockgate does not speak (a failover by Sentinel can lose acknowledged writes).
pub fn not_served(name: &str) -> Outcome {
    Reply::err(format!(
        "ERR {} is not supported: stockgate replicates through a Raft group (--raft-id); change a group with RAFT.ADD, RAFT.REMOVE and SENTINEL FAILOVER",
        name.to_ascii_uppercase()
    ))
    .into()
}

/// `ROLE`: master or replica and its peers, in Redis's shape, from the replication in use.
pub fn role(ctx: &mut Ctx<'_>) -> Outcome {
    match ctx.shared.repl.get() {
        Some(r) => r.role_reply().into(),
        None => Reply::Array(vec![
            Reply::bulk("master"),
            Reply::Int(ctx.engine.last_lsn() as i64),
            Reply::Array(vec![]),
        ])
        .into(),
    }
}

/// `WAIT numreplicas timeout`: blocks until that many replicas have everything this
/// server logged so far, or the timeout (ms; 0 = up to an hour) passes; answers the count.
pub struct Wait {
    n: usize,
    timeout: Duration,
}

impl Wait {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let [n, t] = args else {
            return Err(Reply::arity("wait"));
        };
        let n = i64_in(n, "numreplicas", 0, i64::MAX)?;
        let t = i64_in(t, "timeout", 0, i64::MAX)?;
        let timeout = if t == 0 {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(t as u64)
        };
        Ok(Wait {
            n: n.max(0) as usize,
            timeout,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let r = match repl(ctx) {
            Ok(r) => r,
            Err(_) => return Reply::Int(0).into(),
        };
        if r.is_replica() {
            return Reply::err("ERR WAIT cannot be used with replica instances.").into();
        }
        let lsn = ctx.engine.last_lsn();
        let (n, timeout) = (self.n, self.timeout);
        let wait: super::Deferred =
            Box::pin(async move { Reply::Int(r.wait_count(lsn, n, timeout).await as i64) });
        // Inside EXEC (no waiting there): 0.
        Outcome::deferred(Reply::Int(0), wait)
    }
}

/// `SENTINEL subcommand ...`, answered by a Raft group member from its leadership.
pub fn sentinel(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    // Discovery is open to every role (clients ask it); moving the leadership is an
    // operator's act.
    let moves = args
        .first()
        .is_some_and(|a| a.eq_ignore_ascii_case(b"failover"));
    if moves
        && !matches!(
            ctx.conn.role,
            Some(crate::session::Role::Admin | crate::session::Role::Sentinel)
        )
    {
        let user = ctx.conn.user_name.as_deref().unwrap_or_default();
        return Reply::err(format!(
            "NOPERM User {user} has no permissions to run the 'sentinel|failover' command: only the admin and sentinel roles move a group's leadership"
        ))
        .into();
    }
    match repl(ctx) {
        Ok(r) => r.sentinel(args).into(),
        Err(e) => e.into(),
    }
}

/// `RAFT.MEMBERS`, `RAFT.ADD`, `RAFT.REMOVE`: the reply comes when the group has decided
/// (inside EXEC, where a connection cannot wait, they are refused).
pub fn raft(ctx: &mut Ctx<'_>, name: &str, args: &[&[u8]]) -> Outcome {
    let r = match repl(ctx) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    match r.raft(name, args) {
        Ok(fut) => Outcome::deferred(Reply::err("ERR RAFT commands cannot run inside MULTI"), fut),
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text};

    #[test]
    fn wait_parses_a_count_and_a_timeout_where_zero_means_an_hour() {
        let w = Wait::parse(&argv(&["1", "250"])).unwrap();
        assert_eq!((w.n, w.timeout), (1, Duration::from_millis(250)));
        let w = Wait::parse(&argv(&["0", "0"])).unwrap();
        assert_eq!((w.n, w.timeout), (0, Duration::from_secs(3600)));
    }

    #[test]
    fn wait_refuses_in_words() {
        assert_eq!(error_text(Wait::parse(&argv(&["1"]))), arity("wait"));
        assert_eq!(
            error_text(Wait::parse(&argv(&["1", "2", "3"]))),
            arity("wait")
        );
        let negative = error_text(Wait::parse(&argv(&["-1", "0"])));
        assert!(negative.contains("numreplicas"), "{negative}");
        let word = error_text(Wait::parse(&argv(&["1", "soon"])));
        assert!(word.contains("timeout"), "{word}");
    }
}
