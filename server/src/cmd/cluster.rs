//! Cluster mode's commands and its routing check (docs/cluster.md): `CLUSTER SLOTS`,
//! `SHARDS`, `NODES`, `INFO`, `MYID`, `KEYSLOT`, `HELP`; `READONLY`, `READWRITE`,
//! `ASKING`; and the `-MOVED` / `-CROSSSLOT` / `-CLUSTERDOWN` refusals, in Redis's words
//! and shapes so that Redis Cluster clients follow them unmodified.

use std::sync::atomic::Ordering;

use super::command_table::Spec;
use super::{Ctx, Outcome};
use crate::cluster::{key_slot, Cluster, Group, Node, Route, SLOTS};
use crate::protocol::Reply;

const DISABLED: &str = "ERR This instance has cluster support disabled";
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
const DOWN: &str = "CLUSTERDOWN Hash slot not served";
/// The node-wide order feed: every node has its own, so it is never redirected.
const NODE_STREAM: &[u8] = b"stockgate:events";

/// The key a command routes on: every keyed stockgate command has one key (the sku, a
/// token `{sku}…`, or a sale's stream `{sku}:events`). Keyless commands and the
/// node-wide stream run on whichever node receives them.
fn routed_key<'a>(spec: &Spec, argv: &[&'a [u8]]) -> Option<&'a [u8]> {
    if spec.first_key <= 0 || !matches!(spec.group, "stockgate" | "stream") {
        return None;
    }
    let key = *argv.get(usize::try_from(spec.first_key).ok()?)?;
    (key != NODE_STREAM).then_some(key)
}

/// The routing check every command gets after the dispatcher's other checks: `None` to
/// run it here, or the refusal. Inside `MULTI` it also notes the queued command's slot,
/// so that `EXEC` over several slots answers `-CROSSSLOT` as Redis does.
pub fn check(ctx: &mut Ctx<'_>, spec: &Spec, argv: &[&[u8]]) -> Option<Reply> {
    let c = ctx.shared.cluster.get()?;
    // ASKING lets exactly the next command through (taken here by every command).
    let asking = spec.name != "asking" && std::mem::take(&mut ctx.conn.asking);
    if spec.name == "exec" {
        let q = ctx.conn.multi.as_ref()?;
        if !q.cross_slot || q.aborted {
            return None;
        }
        ctx.conn.multi = None;
        c.crossslot.fetch_add(1, Ordering::Relaxed);
        return Some(Reply::err(CROSSSLOT));
    }
    let key = routed_key(spec, argv)?;
    let slot = key_slot(key);
    match c.route(slot) {
        Route::Here => {
            if let Some(to) = c.slots.load().migrating(slot) {
                if let Some(refusal) = while_migrating(ctx, c, spec, key, slot, to) {
                    return Some(refusal);
                }
            }
            serve_here(ctx, c, spec, slot)
        }
        Route::Moved(_) if asking && c.slots.load().importing(slot).is_some() => {
            serve_here(ctx, c, spec, slot)
        }
        Route::Moved(n) => {
            c.moved.fetch_add(1, Ordering::Relaxed);
            Some(Reply::err(format!("MOVED {slot} {}:{}", n.host, n.port)))
        }
        Route::Unowned => Some(Reply::err(DOWN)),
    }
}

/// A slot this group serves: a Raft follower still sends writes to its leader, and a
/// transaction notes the slot.
fn serve_here(ctx: &mut Ctx<'_>, c: &Cluster, spec: &Spec, slot: u16) -> Option<Reply> {
    if let Some(leader) = leader_elsewhere(ctx, spec) {
        c.moved.fetch_add(1, Ordering::Relaxed);
        return Some(Reply::err(format!("MOVED {slot} {leader}")));
    }
    if let Some(q) = ctx.conn.multi.as_mut() {
        match q.slot {
            None => q.slot = Some(slot),
            Some(s) if s != slot => q.cross_slot = true,
            Some(_) => {}
        }
    }
    None
}

/// The sale a routed key names: a token's or a stream's hash tag, else the sku itself.
fn sku_of_key(key: &[u8]) -> &[u8] {
    key.strip_prefix(b"{")
        .and_then(|rest| rest.iter().position(|&b| b == b'}').map(|end| &rest[..end]))
        .unwrap_or(key)
}

/// On the source of a migrating slot, as Redis: a sale still here is served (its writes
/// refused with `-TRYAGAIN` while it is frozen for its move); a sale not here (moved
/// already, or new) is asked of the destination.
fn while_migrating(
    ctx: &Ctx<'_>,
    c: &Cluster,
    spec: &Spec,
    key: &[u8],
    slot: u16,
    to: usize,
) -> Option<Reply> {
    let sku = String::from_utf8_lossy(sku_of_key(key));
    let state = match spec.name {
        "sale.create" => None,
        _ => ctx.engine.sale_info(&sku).ok().map(|v| v.state),
    };
    match state {
        Some(s) if s.is_moving() && spec.flags.contains(&"write") => Some(Reply::err(format!(
            "TRYAGAIN the sale {sku} is moving to another group; retry"
        ))),
        Some(_) => None,
        None => {
            let n = c.node_for(to)?;
            c.ask.fetch_add(1, Ordering::Relaxed);
            Some(Reply::err(format!("ASK {slot} {}:{}", n.host, n.port)))
        }
    }
}

/// A member of a Raft group that would refuse this command (a follower, for a write)
/// sends it to the group's leader, as a Redis replica sends a write to its primary: a
/// client told a stale leader pays one redirection, and the write runs only where Raft
/// lets it. A leader that refuses (no majority) answers its own refusal.
fn leader_elsewhere(ctx: &Ctx<'_>, spec: &Spec) -> Option<String> {
    let repl = ctx.shared.repl.get()?;
    let refused = if spec.flags.contains(&"write") {
        repl.write_refusal()
    } else if spec.group == "stockgate" {
        repl.read_refusal(ctx.conn.stale_reads)
    } else {
        None
    };
    refused?;
    repl.other_leader_addr()
}

/// `READONLY`, `READWRITE`, `ASKING`: accepted in cluster mode and by a Raft member.
/// `READONLY` lets a follower answer this connection's stock reads from its own state,
/// possibly behind the leader (without it a follower refuses them, or in cluster mode
/// sends them to the leader); `READWRITE` takes that back; `ASKING` lets the next
/// command run on a slot this node is importing. A single node refuses them as Redis
/// does without cluster support.
pub fn connection_flag(ctx: &mut Ctx<'_>, name: &str) -> Outcome {
    let cluster = ctx.shared.cluster.get().is_some();
    if !cluster && (name == "asking" || ctx.shared.repl.get().is_none()) {
        return Reply::err(DISABLED).into();
    }
    match name {
        "asking" => ctx.conn.asking = true,
        "readonly" => ctx.conn.stale_reads = true,
        _ => ctx.conn.stale_reads = false,
    }
    Reply::ok().into()
}

/// `CLUSTER <subcommand> [args]`
pub fn cluster(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let Some(c) = ctx.shared.cluster.get() else {
        return Reply::err(DISABLED).into();
    };
    let sub = String::from_utf8_lossy(args[0]).to_ascii_lowercase();
    let rest = &args[1..];
    let reply = match (sub.as_str(), rest.len()) {
        ("slots", 0) => slots(c, &leaders(ctx, c)),
        ("shards", 0) => shards(c, &leaders(ctx, c)),
        ("nodes", 0) => Reply::bulk(nodes(c, &leaders(ctx, c))),
        ("info", 0) => Reply::bulk(info(c)),
        ("myid", 0) => Reply::bulk(&c.myself().id),
        ("keyslot", 1) => Reply::Int(i64::from(key_slot(rest[0]))),
        ("help", 0) => help(),
        ("setslot", 2 | 3) => return super::slot_move::setslot(ctx, c, rest),
        ("countkeysinslot", 1) => super::slot_move::count_keys(ctx, rest[0]),
        ("getkeysinslot", 2) => super::slot_move::get_keys(ctx, rest[0], rest[1]),
        (
            "slots" | "shards" | "nodes" | "info" | "myid" | "keyslot" | "help" | "setslot"
            | "countkeysinslot" | "getkeysinslot",
            _,
        ) => Reply::err(format!(
            "ERR wrong number of arguments for 'cluster|{sub}' command"
        )),
        _ => {
            let shown: String = String::from_utf8_lossy(args[0]).chars().take(128).collect();
            Reply::err(format!(
                "ERR unknown subcommand '{shown}'. Try CLUSTER HELP."
            ))
        }
    };
    reply.into()
}

/// Per group, the member `CLUSTER SLOTS`, `SHARDS` and `NODES` name as its master: for
/// this node's group what its Raft member knows (itself only when it takes writes), for
/// the others what their members last answered `ROLE`; the map's first member while
/// nothing is known.
fn leaders(ctx: &Ctx<'_>, c: &Cluster) -> Vec<usize> {
    (0..c.map.groups.len())
        .map(|g| {
            if g == c.my_group {
                my_groups_leader(ctx, c)
            } else {
                c.leader_of(g)
            }
        })
        .collect()
}

fn my_groups_leader(ctx: &Ctx<'_>, c: &Cluster) -> usize {
    // Without Raft the node is its group's only server: the map's first node.
    let Some(repl) = ctx.shared.repl.get() else {
        return 0;
    };
    let nodes = &c.map.groups[c.my_group].nodes;
    if let Some(addr) = repl.other_leader_addr() {
        if let Some(i) = nodes
            .iter()
            .position(|n| format!("{}:{}", n.host, n.port) == addr)
        {
            return i;
        }
    }
    if repl.write_refusal().is_none() {
        return c.my_node;
    }
    // No leader known and this member takes no writes (a leader without a majority
    // among them): the format needs a master per range, and naming itself would keep
    // clients on a member that refuses them. Another member at worst redirects them.
    (0..nodes.len())
        .find(|&i| i != c.my_node)
        .unwrap_or(c.my_node)
}

fn help() -> Reply {
    const LINES: &[&str] = &[
        "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "INFO",
        "    Return information about the cluster.",
        "KEYSLOT <key>",
        "    Return the hash slot for <key>.",
        "MYID",
        "    Return the node id.",
        "NODES",
        "    Return cluster configuration seen by node. Output format:",
        "    <id> <ip:port@bus-port> <flags> <master> <pings> <pongs> <epoch> <link> <slot> ...",
        "SHARDS",
        "    Return information about slot range mappings and the nodes associated with them.",
        "SETSLOT <slot> (IMPORTING <node-id>|MIGRATING <node-id>|STABLE|NODE <node-id>)",
        "    Set slot state.",
        "COUNTKEYSINSLOT <slot>",
        "    Return the number of keys in <slot>.",
        "GETKEYSINSLOT <slot> <count>",
        "    Return key names stored by current node in a slot.",
        "SLOTS",
        "    Return information about slots range mappings. Each range is made of:",
        "    start, end, master and replicas IP addresses, ports and ids",
        "HELP",
        "    Print this help.",
    ];
    Reply::Array(LINES.iter().map(|l| Reply::Simple(l)).collect())
}

/// One node as `CLUSTER SLOTS` lists it (Redis 7): ip, port, id, networking metadata.
fn slots_node(n: &Node) -> Reply {
    Reply::Array(vec![
        Reply::bulk(&n.host),
        Reply::Int(i64::from(n.port)),
        Reply::bulk(&n.id),
        Reply::Map(vec![]),
    ])
}

/// `CLUSTER SLOTS`: one entry per owned range, in slot order, the leader first.
fn slots(c: &Cluster, leaders: &[usize]) -> Reply {
    let table = c.slots.load();
    let mut ranges: Vec<(u16, u16, usize)> = c
        .map
        .groups
        .iter()
        .enumerate()
        .flat_map(|(gi, _)| table.ranges(gi).into_iter().map(move |(a, b)| (a, b, gi)))
        .collect();
    ranges.sort_unstable_by_key(|r| r.0);
    Reply::Array(
        ranges
            .into_iter()
            .map(|(a, b, gi)| {
                let (g, lead) = (&c.map.groups[gi], leaders[gi]);
                let mut e = vec![Reply::Int(i64::from(a)), Reply::Int(i64::from(b))];
                e.extend(g.nodes.get(lead).map(slots_node));
                e.extend(
                    g.nodes
                        .iter()
                        .enumerate()
                        .filter(|&(ni, _)| ni != lead)
                        .map(|(_, n)| slots_node(n)),
                );
                Reply::Array(e)
            })
            .collect(),
    )
}

fn role(ni: usize, lead: usize) -> &'static str {
    if ni == lead {
        "master"
    } else {
        "replica"
    }
}

/// `CLUSTER SHARDS` (Redis 7): per group, its slot ranges and its nodes.
fn shards(c: &Cluster, leaders: &[usize]) -> Reply {
    let table = c.slots.load();
    let shard = |(gi, (g, &lead)): (usize, (&Group, &usize))| {
        let slots = table
            .ranges(gi)
            .iter()
            .flat_map(|&(a, b)| [Reply::Int(i64::from(a)), Reply::Int(i64::from(b))])
            .collect();
        let nodes = g
            .nodes
            .iter()
            .enumerate()
            .map(|(ni, n)| {
                Reply::map([
                    ("id", Reply::bulk(&n.id)),
                    ("port", Reply::Int(i64::from(n.port))),
                    ("ip", Reply::bulk(&n.host)),
                    ("endpoint", Reply::bulk(&n.host)),
                    ("role", Reply::bulk(role(ni, lead))),
                    ("replication-offset", Reply::Int(0)),
                    ("health", Reply::bulk("online")),
                ])
            })
            .collect();
        Reply::map([
            ("slots", Reply::Array(slots)),
            ("nodes", Reply::Array(nodes)),
        ])
    };
    Reply::Array(
        c.map
            .groups
            .iter()
            .zip(leaders)
            .enumerate()
            .map(shard)
            .collect(),
    )
}

fn ranges_text(ranges: &[(u16, u16)]) -> String {
    ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                format!(" {a}")
            } else {
                format!(" {a}-{b}")
            }
        })
        .collect()
}

/// `CLUSTER NODES`: Redis's line format. No cluster bus runs, so the bus port is 0,
/// and pings and pongs are 0; a group's epoch is its place in the map file.
fn nodes(c: &Cluster, leaders: &[usize]) -> String {
    let mut out = String::new();
    for (gi, ni, n) in c.map.nodes() {
        let g = &c.map.groups[gi];
        let lead = leaders[gi];
        let me = gi == c.my_group && ni == c.my_node;
        let flags = match (me, ni == lead) {
            (true, true) => "myself,master",
            (true, false) => "myself,slave",
            (false, true) => "master",
            (false, false) => "slave",
        };
        let master = match g.nodes.get(lead) {
            Some(l) if ni != lead => l.id.as_str(),
            _ => "-",
        };
        let slots = if ni == lead {
            ranges_text(&c.slots.load().ranges(gi))
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{} {}:{}@0 {flags} {master} 0 0 {} connected{slots}\n",
            n.id,
            n.host,
            n.port,
            gi + 1
        ));
    }
    out
}

/// `CLUSTER INFO`: Redis's fields. The state is `ok` when every slot has an owner.
fn info(c: &Cluster) -> String {
    let assigned = c.slots.load().assigned();
    let state = if assigned == usize::from(SLOTS) {
        "ok"
    } else {
        "fail"
    };
    let groups = c.map.groups.len();
    format!(
        "cluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\ncluster_slots_ok:{assigned}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{}\r\ncluster_size:{groups}\r\ncluster_current_epoch:{groups}\r\ncluster_my_epoch:{}\r\ncluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n",
        c.map.nodes().count(),
        c.my_group + 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::command_table::{lookup, COMMANDS};

    fn v(words: &[&'static str]) -> Vec<&'static [u8]> {
        words.iter().map(|w| w.as_bytes()).collect()
    }

    #[test]
    fn every_keyed_stock_command_routes_on_its_first_argument() {
        for s in COMMANDS.iter().filter(|s| s.group == "stockgate") {
            let argv = v(&[s.name, "SKU-1", "x", "y", "z", "w", "v"]);
            let key = routed_key(s, &argv);
            if matches!(
                s.name,
                "expired" | "sale.list" | "sale.import" | "sale.migrate"
            ) {
                assert_eq!(key, None, "{}", s.name);
            } else {
                assert_eq!(key, Some(&b"SKU-1"[..]), "{}", s.name);
            }
        }
    }

    #[test]
    fn a_key_names_its_sale_through_its_hash_tag() {
        assert_eq!(sku_of_key(b"SKU-1"), b"SKU-1");
        assert_eq!(sku_of_key(b"{SKU-1}abcdef"), b"SKU-1");
        assert_eq!(sku_of_key(b"{SKU-1}:events"), b"SKU-1");
        assert_eq!(sku_of_key(b"{unclosed"), b"{unclosed");
    }

    #[test]
    fn a_sale_stream_is_routed_and_the_node_stream_is_not() {
        let xlen = lookup("xlen").unwrap();
        assert_eq!(routed_key(xlen, &v(&["xlen", "stockgate:events"])), None);
        assert_eq!(
            routed_key(xlen, &v(&["xlen", "{S}:events"])),
            Some(&b"{S}:events"[..])
        );
        let xgroup = lookup("xgroup").unwrap();
        let create = v(&["xgroup", "CREATE", "{S}:events", "g", "0"]);
        assert_eq!(routed_key(xgroup, &create), Some(&b"{S}:events"[..]));
        assert_eq!(routed_key(xgroup, &v(&["xgroup", "HELP"])), None);
        let xread = lookup("xread").unwrap();
        assert_eq!(
            routed_key(xread, &v(&["xread", "STREAMS", "{S}:events", "0"])),
            None
        );
        for name in ["ping", "info", "save", "cluster", "multi"] {
            let s = lookup(name).unwrap();
            assert_eq!(routed_key(s, &v(&[name, "x", "y"])), None, "{name}");
        }
    }
}
