//! `COMMAND`, `INFO`, `CONFIG GET`, `TIME`, `SAVE`: what clients probe on connect and
//! what operators read.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::table::{Spec, COMMANDS};
use super::{Ctx, Outcome};
use crate::protocol::Reply;

fn info_entry(s: &Spec) -> Reply {
    let key_specs = if s.first_key > 0 {
        vec![Reply::map([
            (
                "flags",
                Reply::Array(vec![Reply::Simple(if s.flags.contains(&"write") {
                    "RW"
                } else {
                    "RO"
                })]),
            ),
            (
                "begin_search",
                Reply::map([
                    ("type", Reply::bulk("index")),
                    ("spec", Reply::map([("index", Reply::Int(s.first_key))])),
                ]),
            ),
            (
                "find_keys",
                Reply::map([
                    ("type", Reply::bulk("range")),
                    (
                        "spec",
                        Reply::map([
                            ("lastkey", Reply::Int(0)),
                            ("keystep", Reply::Int(1)),
                            ("limit", Reply::Int(0)),
                        ]),
                    ),
                ]),
            ),
        ])]
    } else {
        vec![]
    };
    let category: &'static str = match s.group {
        "connection" => "@connection",
        "server" => "@admin",
        "transactions" => "@transaction",
        _ => "@stockgate",
    };
    Reply::Array(vec![
        Reply::bulk(s.name),
        Reply::Int(s.arity),
        Reply::Set(s.flags.iter().map(|f| Reply::Simple(f)).collect()),
        Reply::Int(s.first_key),
        Reply::Int(s.last_key),
        Reply::Int(s.step),
        Reply::Set(vec![Reply::Simple(category)]),
        Reply::Array(vec![]),
        Reply::Array(key_specs),
        Reply::Array(vec![]),
    ])
}

fn docs_entry(s: &Spec) -> Reply {
    Reply::map([
        ("summary", Reply::bulk(s.summary)),
        ("since", Reply::bulk("0.1.0")),
        ("group", Reply::bulk(s.group)),
    ])
}

/// `COMMAND`, `COMMAND COUNT`, `COMMAND INFO name...`, `COMMAND DOCS [name...]`
pub fn command(args: &[Bytes]) -> Outcome {
    let Some(sub) = args.first() else {
        return Reply::Array(COMMANDS.iter().map(info_entry).collect()).into();
    };
    let find = |n: &Bytes| {
        let lower = String::from_utf8_lossy(n).to_ascii_lowercase();
        COMMANDS.iter().find(|s| s.name == lower)
    };
    match String::from_utf8_lossy(sub).to_ascii_uppercase().as_str() {
        "COUNT" if args.len() == 1 => Reply::Int(COMMANDS.len() as i64).into(),
        "INFO" if args.len() == 1 => Reply::Array(COMMANDS.iter().map(info_entry).collect()).into(),
        "INFO" => Reply::Array(
            args[1..]
                .iter()
                .map(|n| find(n).map(info_entry).unwrap_or(Reply::Nil))
                .collect(),
        )
        .into(),
        "DOCS" => {
            let specs: Vec<&Spec> = if args.len() == 1 {
                COMMANDS.iter().collect()
            } else {
                args[1..].iter().filter_map(find).collect()
            };
            Reply::Map(
                specs
                    .into_iter()
                    .map(|s| (Reply::bulk(s.name), docs_entry(s)))
                    .collect(),
            )
            .into()
        }
        "LIST" if args.len() == 1 => {
            Reply::Array(COMMANDS.iter().map(|s| Reply::bulk(s.name)).collect()).into()
        }
        _ => Reply::err(
            "ERR unknown subcommand or wrong number of arguments for 'command'. Try COMMAND HELP.",
        )
        .into(),
    }
}

/// Redis-style glob (`*`, `?`, no classes), case-insensitive, for CONFIG GET and INFO.
pub fn glob(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while t < s.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&s[t])) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            mark = t;
            p += 1;
        } else if let Some(sp) = star {
            p = sp + 1;
            mark += 1;
            t = mark;
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

/// `CONFIG GET pattern...` (read-only: configuration comes from the command line).
pub fn config(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Outcome {
    let sub = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    if sub != "GET" || args.len() < 2 {
        return Reply::err(
            "ERR only CONFIG GET is supported: configuration comes from the command line",
        )
        .into();
    }
    let c = &ctx.shared.config;
    let pairs: Vec<(&str, String)> = vec![
        ("bind", c.bind.clone()),
        ("port", c.port.to_string()),
        ("maxclients", c.max_clients.to_string()),
        ("timeout", (c.idle_timeout_ms / 1000).to_string()),
        ("databases", "1".into()),
        ("save", String::new()),
        ("appendonly", if c.durable { "yes" } else { "no" }.into()),
        ("appendfsync", c.fsync.clone()),
        ("proto-max-bulk-len", c.limits.max_bulk.to_string()),
        ("client-query-buffer-limit", c.max_query_buffer.to_string()),
        (
            "client-output-buffer-limit",
            c.max_output_buffer.to_string(),
        ),
        ("dir", c.data_dir.clone()),
        (
            "auto-release",
            if c.auto_release { "yes" } else { "no" }.into(),
        ),
        ("shards", c.default_shards.to_string()),
        ("ttl-ms", c.default_ttl_ms.to_string()),
        ("retention-ms", c.retention_ms.to_string()),
    ];
    let mut out = Vec::new();
    for (k, v) in pairs {
        if args[1..].iter().any(|p| glob(p, k.as_bytes())) {
            out.push((Reply::bulk(k), Reply::bulk(v)));
        }
    }
    Reply::Map(out).into()
}

pub fn time() -> Outcome {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Reply::Array(vec![
        Reply::bulk(d.as_secs().to_string()),
        Reply::bulk(d.subsec_micros().to_string()),
    ])
    .into()
}

pub fn save(ctx: &mut Ctx<'_>) -> Outcome {
    match ctx.shared.durability.save(ctx.engine) {
        Ok(()) => Reply::ok().into(),
        Err(e) => Reply::err(format!("ERR {e}")).into(),
    }
}

/// `INFO [section...]` in Redis's text format.
pub fn info(ctx: &mut Ctx<'_>, args: &[Bytes]) -> Outcome {
    let wanted: Vec<String> = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "default" || w == "everything");
    let want = |s: &str| all || wanted.iter().any(|w| w == s);
    let sh = ctx.shared;
    let st = &sh.stats;
    let mut o = String::new();
    if want("server") {
        let uptime = sh.started.elapsed().as_secs();
        let _ = write!(
            o,
            "# Server\r\nredis_version:7.0.0\r\nstockgate_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nuptime_in_days:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            sh.local_port.load(Ordering::Relaxed),
            uptime,
            uptime / 86400
        );
    }
    if want("clients") {
        let _ = write!(
            o,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n",
            st.connected.load(Ordering::Relaxed),
            sh.config.max_clients
        );
    }
    if want("stats") {
        let _ = write!(
            o,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nauth_failures:{}\r\nnoperm_refusals:{}\r\nprotocol_errors:{}\r\nquery_buffer_limit_disconnects:{}\r\noutput_buffer_limit_disconnects:{}\r\nidle_timeout_disconnects:{}\r\nreserve_reserved:{}\r\nreserve_replay:{}\r\nreserve_soldout:{}\r\nreserve_limit:{}\r\n\r\n",
            st.connections.load(Ordering::Relaxed),
            st.commands.load(Ordering::Relaxed),
            st.rejected.load(Ordering::Relaxed),
            st.auth_failures.load(Ordering::Relaxed),
            st.noperm.load(Ordering::Relaxed),
            st.protocol_errors.load(Ordering::Relaxed),
            st.qbuf_disconnects.load(Ordering::Relaxed),
            st.obuf_disconnects.load(Ordering::Relaxed),
            st.idle_disconnects.load(Ordering::Relaxed),
            st.reserved.load(Ordering::Relaxed),
            st.replay.load(Ordering::Relaxed),
            st.soldout.load(Ordering::Relaxed),
            st.limit.load(Ordering::Relaxed),
        );
    }
    if want("persistence") {
        let _ = write!(o, "# Persistence\r\n{}\r\n", sh.durability.info());
    }
    if want("stockgate") {
        let sales = ctx.engine.list_sales();
        let _ = write!(
            o,
            "# Stockgate\r\nsales:{}\r\nreservations:{}\r\nkey_fingerprint:{}\r\nauto_release:{}\r\n",
            sales.len(),
            ctx.engine.reservation_count(),
            ctx.engine.key_fingerprint(),
            ctx.engine.config().auto_release as u8
        );
        for sku in sales.iter().take(1000) {
            if let Ok(v) = ctx.engine.sale_info(sku) {
                let _ = write!(
                    o,
                    "sale_{}:total={},available={},reserved={},committed={},state={}\r\n",
                    sku,
                    v.total,
                    v.available,
                    v.reserved,
                    v.committed,
                    v.state.as_str()
                );
            }
        }
        o.push_str("\r\n");
    }
    Reply::bulk(o).into()
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globbing() {
        assert!(glob(b"*", b"port"));
        assert!(glob(b"p?rt", b"port"));
        assert!(glob(b"*fsync", b"appendfsync"));
        assert!(glob(b"APPEND*", b"appendonly"));
        assert!(!glob(b"save*x", b"save"));
    }
}
