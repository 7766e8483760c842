//! `COMMAND`, `INFO`, `TIME`, `SAVE`, `LATENCY`, `SLOWLOG`: what clients probe on connect and
//! what operators read.

use super::command_table::{Spec, COMMANDS};
use super::{Ctx, Outcome};
use crate::metrics::SlowEntry;
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
        // READONLY, READWRITE and ASKING are Redis's `@connection` commands too.
        "connection" | "cluster" => "@connection",
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
        Reply::Array(
            super::command_table::subcommands(s.name)
                .iter()
                .map(info_entry)
                .collect(),
        ),
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
pub fn command(args: &[&[u8]]) -> Outcome {
    let Some(sub) = args.first() else {
        return Reply::Array(COMMANDS.iter().map(info_entry).collect()).into();
    };
    let find = |n: &&[u8]| {
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
    crate::pubsub::glob_match(&pattern.to_ascii_lowercase(), &s.to_ascii_lowercase())
}

/// `TIME`: seconds and microseconds of the server's clock, as Redis answers.
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

/// `SAVE`: writes a snapshot of the engine now and trims the log behind it.
pub fn save(ctx: &mut Ctx<'_>) -> Outcome {
    match ctx.shared.durability.save(ctx.engine) {
        Ok(()) => Reply::ok().into(),
        Err(e) => Reply::err(format!("ERR {e}")).into(),
    }
}

/// `INFO [section...]` in Redis 7's text format (see `report::info`).
pub fn info(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let wanted: Vec<String> = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Reply::bulk(crate::report::info::render(ctx.engine, ctx.shared, &wanted)).into()
}

/// Redis 7's `LATENCY HISTOGRAM` body of one command: `calls` and the cumulative count
/// per power-of-two bucket (µs), from 1024 ns up, empty buckets left out.
fn histogram_reply(c: &crate::metrics::CmdStats) -> Option<Reply> {
    let h = c.hist.as_ref().filter(|h| !h.is_empty())?;
    let mut buckets = Vec::new();
    let mut cumulative = 0u64;
    let mut previous = 0u64;
    for v in h.iter_log(1024, 2.0) {
        cumulative += v.count_since_last_iteration();
        if cumulative > previous {
            let micros = h.highest_equivalent(v.value_iterated_to()) / 1000;
            buckets.push((Reply::Int(micros as i64), Reply::Int(cumulative as i64)));
        }
        previous = cumulative;
    }
    Some(Reply::map([
        ("calls", Reply::Int(h.len() as i64)),
        ("histogram_usec", Reply::Map(buckets)),
    ]))
}

/// `LATENCY HISTOGRAM [command ...]`, `LATENCY LATEST|HISTORY|RESET` (stockgate has no
/// latency monitor events: those are empty), `LATENCY HELP`.
pub fn latency(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let sub = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
    match sub.as_str() {
        "HISTOGRAM" => {
            let cmds = ctx.shared.metrics.commands();
            let names: Vec<String> = args[1..]
                .iter()
                .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
                .collect();
            let mut out = Vec::new();
            let mut add = |c: &crate::metrics::CmdStats| {
                if let Some(r) = histogram_reply(c) {
                    out.push((Reply::bulk(c.name), r));
                }
            };
            if names.is_empty() {
                cmds.iter().for_each(&mut add);
            } else {
                // In the order asked, unknown names skipped (as Redis).
                for n in &names {
                    if let Some(c) = cmds.iter().find(|c| c.name == n) {
                        add(c);
                    }
                }
            }
            Reply::Map(out).into()
        }
        "LATEST" if args.len() == 1 => Reply::Array(vec![]).into(),
        "HISTORY" if args.len() == 2 => Reply::Array(vec![]).into(),
        "RESET" => Reply::Int(0).into(),
        "HELP" if args.len() == 1 => help_reply(&[
                "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "HISTOGRAM [COMMAND ...]",
                "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
                "    If no commands are specified then all histograms are replied.",
                "LATEST",
                "    Return the latest latency samples for all events (none: no latency monitor).",
                "HISTORY <event>",
                "    Return time-latency samples for the <event> class (none).",
                "RESET [<event> ...]",
                "    Reset latency data of one or more <event> classes.",
                "HELP",
                "    Print this help.",
        ]),
        _ => unknown_subcommand("LATENCY", args[0]),
    }
}

/// One `SLOWLOG GET` entry in Redis's shape: `[id, timestamp, micros, [args], client
/// addr, client name]`.
fn slow_entry_reply(e: &SlowEntry) -> Reply {
    Reply::Array(vec![
        Reply::Int(e.id as i64),
        Reply::Int(e.unix_secs as i64),
        Reply::Int(e.micros as i64),
        Reply::Array(e.argv.iter().map(|a| Reply::Bulk(a.clone())).collect()),
        Reply::bulk(&e.addr),
        Reply::bulk(&e.name),
    ])
}

/// `SLOWLOG GET [count] | LEN | RESET | HELP`, replies as Redis's.
pub fn slowlog(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let sub = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
    let log = &ctx.shared.metrics.slowlog;
    match (sub.as_str(), args.len()) {
        ("GET", 1 | 2) => {
            let count = match args.get(1) {
                None => 10,
                // -1: every entry, as in Redis.
                Some(a) => match super::args::i64_in(a, "count", -1, i64::MAX) {
                    Ok(-1) => usize::MAX,
                    Ok(n) => n as usize,
                    Err(e) => return e.into(),
                },
            };
            let entries = log.lock().get(count);
            Reply::Array(entries.iter().map(slow_entry_reply).collect()).into()
        }
        ("LEN", 1) => Reply::Int(log.lock().len() as i64).into(),
        ("RESET", 1) => {
            log.lock().reset();
            Reply::ok().into()
        }
        ("HELP", 1) => help_reply(&[
            "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "GET [<count>]",
            "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
            "    Entries are made of:",
            "    id, timestamp, time in microseconds, arguments array, client IP and port,",
            "    client name",
            "LEN",
            "    Return the length of the slowlog.",
            "RESET",
            "    Reset the slowlog.",
            "HELP",
            "    Print this help.",
        ]),
        _ => unknown_subcommand("SLOWLOG", args[0]),
    }
}

/// A `<CMD> HELP` reply: Redis answers it as an array of simple strings.
fn help_reply(lines: &[&'static str]) -> Outcome {
    Reply::Array(lines.iter().map(|l| Reply::Simple(l)).collect()).into()
}

/// Redis's error for an unknown subcommand of `cmd`, naming (at most 64 characters of) it.
fn unknown_subcommand(cmd: &str, sub: &[u8]) -> Outcome {
    let shown: String = String::from_utf8_lossy(sub).chars().take(64).collect();
    Reply::err(format!(
        "ERR unknown subcommand or wrong number of arguments for '{shown}'. Try {cmd} HELP."
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::{glob, slow_entry_reply};
    use crate::metrics::SlowEntry;
    use bytes::BytesMut;

    #[test]
    fn globbing() {
        assert!(glob(b"*", b"port"));
        assert!(glob(b"p?rt", b"port"));
        assert!(glob(b"*fsync", b"appendfsync"));
        assert!(glob(b"APPEND*", b"appendonly"));
        assert!(!glob(b"save*x", b"save"));
    }

    /// The wire bytes of a `SLOWLOG GET` entry, in both protocols: what Redis clients
    /// and exporters parse.
    #[test]
    fn slowlog_entry_bytes() {
        let e = SlowEntry {
            id: 7,
            unix_secs: 1_700_000_000,
            micros: 12_345,
            argv: vec![b"ECHO".to_vec(), b"hi".to_vec()],
            addr: "127.0.0.1:5555".into(),
            name: String::new(),
        };
        let expected = "*6\r\n:7\r\n:1700000000\r\n:12345\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n$14\r\n127.0.0.1:5555\r\n$0\r\n\r\n";
        for proto in [2, 3] {
            let mut out = BytesMut::new();
            slow_entry_reply(&e).encode(proto, &mut out);
            assert_eq!(&out[..], expected.as_bytes(), "RESP{proto}");
        }
    }
}
