//! Replication and Sentinel commands: ROLE, WAIT, SENTINEL and RAFT.* (answered by a
//! Raft group member, `crate::raft`), and the Redis replication commands a stockgate
//! node refuses in plain words (REPLICAOF/SLAVEOF, REPLCONF, PSYNC/SYNC): its replicas
//! are group members.

use std::sync::Arc;
use std::time::Duration;

use super::args::i64_in;
use super::{Ctx, Outcome};
use crate::protocol::Reply;
use crate::session::{
    MemberRole, RaftChange, RaftError, RaftMember, Replication, RoleView, SentinelAnswer,
    SentinelError, SentinelMaster, SentinelQuery,
};

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
        Some(r) => role_reply(r.role()).into(),
        None => Reply::Array(vec![
            Reply::bulk("master"),
            Reply::Int(ctx.engine.last_lsn() as i64),
            Reply::Array(vec![]),
        ])
        .into(),
    }
}

/// `ROLE`'s reply in Redis's shape.
fn role_reply(view: RoleView) -> Reply {
    match view {
        RoleView::Leader { offset, replicas } => Reply::Array(vec![
            Reply::bulk("master"),
            Reply::Int(offset),
            Reply::Array(
                replicas
                    .into_iter()
                    .map(|(h, p)| {
                        Reply::Array(vec![
                            Reply::bulk(h),
                            Reply::bulk(p.to_string()),
                            Reply::bulk("0"),
                        ])
                    })
                    .collect(),
            ),
        ]),
        RoleView::Follower {
            leader,
            connected,
            offset,
        } => {
            let (h, p) = leader.unwrap_or_else(|| ("?".into(), 0));
            Reply::Array(vec![
                Reply::bulk("slave"),
                Reply::bulk(h),
                Reply::Int(i64::from(p)),
                Reply::bulk(if connected { "connected" } else { "connecting" }),
                Reply::Int(offset),
            ])
        }
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
    let r = match repl(ctx) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let query = match sentinel_query(args) {
        Ok(q) => q,
        Err(e) => return e.into(),
    };
    match r.sentinel(query) {
        Ok(answer) => sentinel_reply(answer),
        Err(e) => sentinel_error(e),
    }
    .into()
}

/// Reads a `SENTINEL` subcommand and checks its number of arguments.
fn sentinel_query<'a>(args: &[&'a [u8]]) -> Result<SentinelQuery<'a>, Reply> {
    let sub = args
        .first()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .unwrap_or_default();
    Ok(match (sub.as_str(), args) {
        ("get-master-addr-by-name", [_, name]) => SentinelQuery::MasterAddr(name),
        ("masters", [_]) => SentinelQuery::Masters,
        ("master", [_, name]) => SentinelQuery::Master(name),
        ("replicas" | "slaves", [_, name]) => SentinelQuery::Replicas(name),
        ("sentinels", [_, name]) => SentinelQuery::Sentinels(name),
        ("failover", [_, name]) => SentinelQuery::Failover(name),
        ("myid", [_]) => SentinelQuery::MyId,
        ("ckquorum", [_, _]) => SentinelQuery::CkQuorum,
        _ => {
            return Err(Reply::err(format!(
                "ERR unknown or malformed SENTINEL subcommand '{sub}' (stockgate answers GET-MASTER-ADDR-BY-NAME, MASTERS, MASTER, REPLICAS, SLAVES, SENTINELS, MYID, CKQUORUM, FAILOVER)"
            )))
        }
    })
}

fn sentinel_reply(answer: SentinelAnswer) -> Reply {
    match answer {
        SentinelAnswer::MasterAddr(Some((h, p))) => {
            Reply::Array(vec![Reply::bulk(h), Reply::bulk(p.to_string())])
        }
        SentinelAnswer::MasterAddr(None) => Reply::Nil,
        SentinelAnswer::Masters(m) => Reply::Array(m.map(master_entry).into_iter().collect()),
        SentinelAnswer::Master(m) => master_entry(m),
        SentinelAnswer::Replicas(rs) => Reply::Array(
            rs.into_iter()
                .map(|r| {
                    let (mh, mp) = r.leader.unwrap_or_else(|| ("?".into(), 0));
                    flat(&[
                        ("name", format!("{}:{}", r.host, r.port)),
                        ("ip", r.host),
                        ("port", r.port.to_string()),
                        ("runid", format!("stockgate-node-{}", r.id)),
                        ("flags", "slave".into()),
                        ("role-reported", "slave".into()),
                        ("master-link-status", "ok".into()),
                        ("master-host", mh),
                        ("master-port", mp.to_string()),
                        ("slave-priority", "100".into()),
                    ])
                })
                .collect(),
        ),
        SentinelAnswer::Sentinels(ps) => Reply::Array(
            ps.into_iter()
                .map(|p| {
                    flat(&[
                        ("name", format!("stockgate-node-{}", p.id)),
                        ("ip", p.host),
                        ("port", p.port.to_string()),
                        ("runid", format!("stockgate-node-{}", p.id)),
                        ("flags", "sentinel".into()),
                    ])
                })
                .collect(),
        ),
        SentinelAnswer::FailoverStarted => Reply::Simple("OK"),
        SentinelAnswer::MyId(id) => Reply::bulk(format!("stockgate-node-{id}")),
        SentinelAnswer::Quorum(true) => Reply::Simple("OK"),
        SentinelAnswer::Quorum(false) => {
            Reply::err("NOQUORUM no Raft leader is known to this node")
        }
    }
}

fn sentinel_error(e: SentinelError) -> Reply {
    match e {
        SentinelError::NotMember => Reply::err(
            "ERR SENTINEL is answered by the members of a Raft group (--raft-id); this server is not one",
        ),
        SentinelError::NoSuchMaster => Reply::err("ERR No such master with that name"),
        SentinelError::NoGoodReplica => Reply::err(
            "NOGOODSLAVE No suitable replica to promote (no caught-up voter can stand for election)",
        ),
        SentinelError::NoRuntime => {
            Reply::err("ERR SENTINEL FAILOVER: no runtime to start the election on")
        }
        SentinelError::InProgress => Reply::err(
            "INPROG Failover already in progress (this leader is handing its leadership over)",
        ),
    }
}

/// What a server outside a Raft group answers `RAFT.*`.
fn not_member() -> Reply {
    Reply::err("ERR this server is not a member of a Raft group (--raft-id)")
}

/// `RAFT.MEMBERS`' reply: a row per member.
fn members_reply(rows: Vec<RaftMember>) -> Reply {
    Reply::Array(
        rows.into_iter()
            .map(|m| {
                let role = match m.role {
                    MemberRole::Leader => "leader",
                    MemberRole::Voter => "voter",
                    MemberRole::Learner => "learner",
                };
                Reply::Array(vec![
                    Reply::Int(m.id as i64),
                    Reply::bulk(m.client_addr),
                    Reply::bulk(m.raft_addr),
                    Reply::bulk(role),
                    Reply::bulk(format!("{:016x}", m.incarnation)),
                ])
            })
            .collect(),
    )
}

/// The leader as Sentinel's master entry.
fn master_entry(m: SentinelMaster) -> Reply {
    let flags = if m.down {
        "master,s_down,o_down"
    } else {
        "master"
    };
    flat(&[
        ("name", m.name),
        ("ip", m.host),
        ("port", m.port.to_string()),
        ("runid", format!("stockgate-node-{}", m.id)),
        ("flags", flags.into()),
        ("link-pending-commands", "0".into()),
        ("link-refcount", "1".into()),
        ("last-ping-sent", "0".into()),
        ("last-ok-ping-reply", "0".into()),
        ("last-ping-reply", "0".into()),
        ("down-after-milliseconds", m.down_after_ms.to_string()),
        ("info-refresh", "0".into()),
        ("role-reported", "master".into()),
        ("role-reported-time", "0".into()),
        ("config-epoch", m.config_epoch.to_string()),
        ("num-slaves", m.others.to_string()),
        ("num-other-sentinels", m.others.to_string()),
        ("quorum", m.quorum.to_string()),
        ("failover-timeout", m.failover_timeout_ms.to_string()),
        ("parallel-syncs", "1".into()),
    ])
}

/// A Sentinel state entry: a map in RESP3 (what redis-py parses there), the flat
/// field-value array of Redis's Sentinel in RESP2.
fn flat(fields: &[(&str, String)]) -> Reply {
    Reply::Map(
        fields
            .iter()
            .map(|(k, v)| (Reply::bulk(*k), Reply::bulk(v.clone())))
            .collect(),
    )
}

/// `RAFT.MEMBERS`, `RAFT.ADD`, `RAFT.REMOVE`, `RAFT.READMIT`: the reply comes when the
/// group has decided (inside EXEC, where a connection cannot wait, they are refused).
pub fn raft(ctx: &mut Ctx<'_>, name: &str, args: &[&[u8]]) -> Outcome {
    let r = match repl(ctx) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    if name == "raft.members" {
        let rows = match r.members() {
            Some(rows) => rows,
            None => return not_member().into(),
        };
        let reply = members_reply(rows);
        return Outcome::deferred(in_multi(), Box::pin(async move { reply }));
    }
    let change = match raft_change(name, args) {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    match r.raft_change(change) {
        Ok(fut) => Outcome::deferred(
            in_multi(),
            Box::pin(async move {
                match fut.await {
                    Ok(()) => Reply::Simple("OK"),
                    Err(e) => raft_error(e),
                }
            }),
        ),
        Err(e) => raft_error(e).into(),
    }
}

/// What a `RAFT.*` command answers inside EXEC.
fn in_multi() -> Reply {
    Reply::err("ERR RAFT commands cannot run inside MULTI")
}

/// Reads a membership change's arguments.
fn raft_change(name: &str, args: &[&[u8]]) -> Result<RaftChange, Reply> {
    let text = |a: &[u8]| String::from_utf8_lossy(a).into_owned();
    let id = |a: &[u8]| {
        std::str::from_utf8(a)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
    };
    match name {
        "raft.add" => {
            let [id, client, raft_addr] = args else {
                return Err(Reply::err(
                    "ERR usage: RAFT.ADD id client-host:port raft-host:port",
                ));
            };
            Ok(RaftChange::Add {
                id: text(id),
                client_addr: text(client),
                raft_addr: text(raft_addr),
            })
        }
        "raft.remove" => {
            let [a] = args else {
                return Err(Reply::err("ERR usage: RAFT.REMOVE id"));
            };
            id(a).map(RaftChange::Remove).ok_or_else(|| {
                Reply::err("ERR RAFT.REMOVE: the node id must be a positive integer")
            })
        }
        "raft.readmit" => {
            let [a] = args else {
                return Err(Reply::err("ERR usage: RAFT.READMIT id"));
            };
            id(a)
                .filter(|i| *i > 0)
                .map(RaftChange::Readmit)
                .ok_or_else(|| {
                    Reply::err("ERR RAFT.READMIT: the node id must be a positive integer")
                })
        }
        _ => Err(Reply::err(format!("ERR unknown command '{name}'"))),
    }
}

/// A refused or failed membership change, in words.
fn raft_error(e: RaftError) -> Reply {
    Reply::err(format!("ERR {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text};

    #[test]
    fn raft_changes_are_read_and_refused_in_the_same_words() {
        assert_eq!(
            raft_change("raft.remove", &argv(&["3"])),
            Ok(RaftChange::Remove(3))
        );
        assert_eq!(
            raft_change("raft.readmit", &argv(&["2"])),
            Ok(RaftChange::Readmit(2))
        );
        assert_eq!(
            raft_change("raft.add", &argv(&["4", "h:1", "h:2"])),
            Ok(RaftChange::Add {
                id: "4".into(),
                client_addr: "h:1".into(),
                raft_addr: "h:2".into(),
            })
        );
        for (name, args, want) in [
            (
                "raft.add",
                &["4"][..],
                "ERR usage: RAFT.ADD id client-host:port raft-host:port",
            ),
            ("raft.remove", &[][..], "ERR usage: RAFT.REMOVE id"),
            (
                "raft.remove",
                &["x"][..],
                "ERR RAFT.REMOVE: the node id must be a positive integer",
            ),
            (
                "raft.readmit",
                &["1", "2"][..],
                "ERR usage: RAFT.READMIT id",
            ),
            (
                "raft.readmit",
                &["0"][..],
                "ERR RAFT.READMIT: the node id must be a positive integer",
            ),
        ] {
            assert_eq!(error_text(raft_change(name, &argv(args))), want);
        }
        assert_eq!(
            raft_error(RaftError::OtherIncarnation(2)),
            Reply::err("ERR node 2 is a member under another storage incarnation: it lost its state; bring it back with RAFT.READMIT 2")
        );
        assert_eq!(
            raft_error(RaftError::SameIncarnation { id: 2, incarnation: 0xab }),
            Reply::err("ERR node 2 still runs on the storage the group admitted (incarnation 00000000000000ab): nothing to re-admit")
        );
    }

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
