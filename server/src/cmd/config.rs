//! `CONFIG GET | SET | REWRITE | RESETSTAT`. The settings that can change while the
//! server runs are listed in [`LIVE`], each with where the running server reads it; every
//! other setting is fixed at start, and `CONFIG SET` says why.

use std::sync::atomic::Ordering;

use super::introspect::glob;
use super::{Ctx, Outcome};
use crate::metrics::logging;
use crate::protocol::Reply;

/// A setting `CONFIG SET` changes live. `flag` is its `stockgate serve` flag (and config
/// file directive); `name` what CONFIG calls it (Redis's name where Redis has one).
struct Live {
    name: &'static str,
    flag: &'static str,
    /// CONFIG's unit is `scale` flag units (`timeout` is in seconds, its flag in ms).
    scale: u64,
    /// The value in the flag's unit.
    get: fn(&Ctx<'_>) -> String,
    /// Applies a value in the flag's unit (already checked by the flag's parser when the
    /// binary supplied it, `Shared::flags`).
    set: fn(&Ctx<'_>, &str) -> Result<(), String>,
}

fn num<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("'{v}' is not a valid number for this setting"))
}

const LIVE: &[Live] = &[
    Live {
        name: "slowlog-log-slower-than",
        flag: "slowlog-log-slower-than",
        scale: 1,
        get: |c| {
            let m = &c.shared.metrics;
            m.slowlog_slower_than.load(Ordering::Relaxed).to_string()
        },
        set: |c, v| {
            let n: i64 = num(v)?;
            if n < -1 {
                return Err("must be -1 (off), 0 (every command) or more microseconds".into());
            }
            c.shared
                .metrics
                .slowlog_slower_than
                .store(n, Ordering::Relaxed);
            Ok(())
        },
    },
    Live {
        name: "slowlog-max-len",
        flag: "slowlog-max-len",
        scale: 1,
        get: |c| c.shared.metrics.slowlog.lock().max_len().to_string(),
        set: |c, v| {
            c.shared.metrics.slowlog.lock().set_max_len(num(v)?);
            Ok(())
        },
    },
    Live {
        name: "maxclients",
        flag: "maxclients",
        scale: 1,
        get: |c| c.shared.live.max_clients().to_string(),
        set: |c, v| {
            let n: usize = num(v)?;
            if n == 0 {
                return Err("must be at least 1".into());
            }
            c.shared.live.max_clients.store(n, Ordering::Relaxed);
            Ok(())
        },
    },
    Live {
        name: "client-query-buffer-limit",
        flag: "max-query-buffer",
        scale: 1,
        get: |c| c.shared.live.max_query_buffer().to_string(),
        set: |c, v| positive(v, &c.shared.live.max_query_buffer),
    },
    Live {
        name: "client-output-buffer-limit",
        flag: "max-output-buffer",
        scale: 1,
        get: |c| c.shared.live.max_output_buffer().to_string(),
        set: |c, v| positive(v, &c.shared.live.max_output_buffer),
    },
    Live {
        name: "timeout",
        flag: "idle-timeout-ms",
        scale: 1000,
        get: |c| c.shared.live.idle_timeout_ms().to_string(),
        set: |c, v| store_u64(v, &c.shared.live.idle_timeout_ms),
    },
    Live {
        name: "idle-timeout-ms",
        flag: "idle-timeout-ms",
        scale: 1,
        get: |c| c.shared.live.idle_timeout_ms().to_string(),
        set: |c, v| store_u64(v, &c.shared.live.idle_timeout_ms),
    },
    Live {
        name: "write-timeout-ms",
        flag: "write-timeout-ms",
        scale: 1,
        get: |c| c.shared.live.write_timeout_ms().to_string(),
        set: |c, v| store_u64(v, &c.shared.live.write_timeout_ms),
    },
    Live {
        name: "retention-ms",
        flag: "retention-ms",
        scale: 1,
        get: |c| c.engine.retention_ms().to_string(),
        set: |c, v| {
            c.engine.set_retention_ms(num(v)?);
            Ok(())
        },
    },
    Live {
        name: "metrics-max-sales",
        flag: "metrics-max-sales",
        scale: 1,
        get: |c| {
            let m = &c.shared.metrics;
            m.max_label_sales.load(Ordering::Relaxed).to_string()
        },
        set: |c, v| {
            let n: usize = num(v)?;
            c.shared.metrics.max_label_sales.store(n, Ordering::Relaxed);
            Ok(())
        },
    },
    Live {
        name: "log-level",
        flag: "log-level",
        scale: 1,
        get: |_| logging::filter(),
        set: |_, v| logging::set_filter(&crate::config_file::redis_log_level(v)?),
    },
    Live {
        name: "loglevel",
        flag: "log-level",
        scale: 1,
        get: |_| redis_level_of(&logging::filter()).to_string(),
        set: |_, v| logging::set_filter(&crate::config_file::redis_log_level(v)?),
    },
];

/// A log filter in Redis's `loglevel` words where it is one of them (what Redis tools
/// reading `CONFIG GET loglevel` expect); any other filter as it is.
fn redis_level_of(filter: &str) -> &str {
    match filter {
        "debug" => "verbose",
        "info" => "notice",
        "warn" => "warning",
        "off" => "nothing",
        other => other,
    }
}

fn store_u64(v: &str, a: &std::sync::atomic::AtomicU64) -> Result<(), String> {
    a.store(num(v)?, Ordering::Relaxed);
    Ok(())
}

fn positive(v: &str, a: &std::sync::atomic::AtomicUsize) -> Result<(), String> {
    let n: usize = num(v)?;
    if n == 0 {
        return Err("must be at least 1 byte".into());
    }
    a.store(n, Ordering::Relaxed);
    Ok(())
}

/// Why a setting that exists cannot change while the server runs.
fn fixed_reason(name: &str) -> &'static str {
    match name {
        "port" => "the listening port is fixed at startup",
        "bind" => "the listening address is fixed at startup",
        "dir" | "data-dir" => "the data dir holds the log the server is running on",
        "appendonly" => "the write-ahead log is always on",
        "appendfsync" | "fsync" => "the log's fsync policy is fixed when the log is opened",
        "users-file" => "the users file is named at startup (ACL LOAD reads it again)",
        "requirepass" => "the default user's password is read at startup (put users in --users-file and use ACL LOAD)",
        "secret-file" => {
            "the secret file is named at startup (SECRET.RELOAD reads it again; docs/operations.md, \"Key rotation\")"
        }
        "reservation-key-file" | "create-keys" => {
            "the reservation key never changes while its sales live (docs/operations.md, \"Key rotation\")"
        }
        "shards" | "ttl-ms" | "auto-release" | "expected-reservations" => {
            "the engine takes it when it is built at startup"
        }
        "threads" | "tcp-backlog" => "the event loops and their listeners are made at startup",
        "proto-max-bulk-len" | "max-bulk" | "max-args" => {
            "the protocol limits are fixed at startup"
        }
        "metrics-addr" | "metrics-allow-remote" => "the metrics endpoint is bound at startup",
        "log-format" => "the log format is chosen when logging starts",
        n if n.starts_with("raft-") || n == "group-name" || n == "rejoin-empty" => {
            "a Raft member's settings are fixed at startup"
        }
        _ => "it is read once at startup",
    }
}

/// Names CONFIG GET shows that are no flag of their own.
const GET_ONLY: &[&str] = &[
    "bind",
    "port",
    "databases",
    "save",
    "appendonly",
    "appendfsync",
    "proto-max-bulk-len",
    "dir",
    "auto-release",
    "shards",
    "ttl-ms",
    "latency-tracking",
    "latency-tracking-info-percentiles",
];

/// `CONFIG GET|SET|REWRITE|RESETSTAT`
pub fn config(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let sub = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
    match (sub.as_str(), args.len()) {
        ("RESETSTAT", 1) => {
            ctx.shared.metrics.reset();
            crate::report::view::reset_server_stats(ctx.shared);
            Reply::ok().into()
        }
        ("REWRITE", 1) => rewrite(ctx).into(),
        ("GET", 2..) => get(ctx, &args[1..]).into(),
        ("SET", _) if ctx.conn.role != Some(crate::users::Role::Admin) => {
            let user = ctx.conn.user_name.as_deref().unwrap_or("default");
            Reply::err(format!(
                "NOPERM User {user} has no permissions to run the 'config|set' command"
            ))
            .into()
        }
        ("SET", n) if n >= 3 && n % 2 == 1 => set(ctx, &args[1..]).into(),
        ("SET", _) => Reply::arity("config|set").into(),
        _ => Reply::err("ERR CONFIG subcommands are GET, SET, REWRITE and RESETSTAT").into(),
    }
}

/// Every parameter CONFIG GET shows, with its value.
fn all_values(ctx: &Ctx<'_>) -> Vec<(&'static str, String)> {
    let c = &ctx.shared.config;
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let mut pairs: Vec<(&'static str, String)> = vec![
        ("bind", c.bind.clone()),
        ("port", c.port.to_string()),
        ("databases", "1".into()),
        ("save", String::new()),
        ("appendonly", yes_no(c.durable)),
        ("appendfsync", c.fsync.clone()),
        ("proto-max-bulk-len", c.limits.max_bulk.to_string()),
        ("dir", c.data_dir.clone()),
        ("auto-release", yes_no(c.auto_release)),
        ("shards", c.default_shards.to_string()),
        ("ttl-ms", c.default_ttl_ms.to_string()),
        ("latency-tracking", "yes".into()),
        ("latency-tracking-info-percentiles", "50 99 99.9".into()),
    ];
    for l in LIVE {
        let v = (l.get)(ctx);
        let v = match l.scale {
            1 => v,
            s => (v.parse::<u64>().unwrap_or(0) / s).to_string(),
        };
        pairs.push((l.name, v));
    }
    // A setting Redis names otherwise answers by its flag's name too (the config file
    // takes both); the ones whose value differs in unit are live settings listed above.
    for r in crate::config_file::REDIS_NAMES {
        if pairs.iter().any(|(k, _)| *k == r.flag) {
            continue;
        }
        if let Some(v) = pairs
            .iter()
            .find(|(k, _)| *k == r.name)
            .map(|(_, v)| v.clone())
        {
            pairs.push((r.flag, v));
        }
    }
    pairs
}

fn get(ctx: &Ctx<'_>, patterns: &[&[u8]]) -> Reply {
    let out = all_values(ctx)
        .into_iter()
        .filter(|(k, _)| patterns.iter().any(|p| glob(p, k.as_bytes())))
        .map(|(k, v)| (Reply::bulk(k), Reply::bulk(v)))
        .collect();
    Reply::Map(out)
}

/// `CONFIG SET name value [name value ...]`: every pair is checked before any applies.
fn set(ctx: &Ctx<'_>, pairs: &[&[u8]]) -> Reply {
    let mut checked = Vec::new();
    for pair in pairs.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
        let value = String::from_utf8_lossy(pair[1]).into_owned();
        match check(ctx, &name, &value) {
            Ok(x) => checked.push(x),
            Err(e) => return e,
        }
    }
    for (live, value) in checked {
        if let Err(e) = (live.set)(ctx, &value) {
            return Reply::err(format!("ERR CONFIG SET {}: {e}", live.name));
        }
        ctx.shared.live.changed.lock().insert(live.flag);
        tracing::info!(setting = live.name, value = %value, "CONFIG SET");
    }
    Reply::ok()
}

/// The live setting `name` is, and `value` in its flag's unit, checked by the flag's parser.
fn check(ctx: &Ctx<'_>, name: &str, value: &str) -> Result<(&'static Live, String), Reply> {
    let shown: String = name.chars().take(64).collect();
    let Some(live) = LIVE.iter().find(|l| l.name == name || l.flag == name) else {
        let known = GET_ONLY.contains(&name)
            || ctx
                .shared
                .flags
                .as_ref()
                .is_some_and(|c| c.get_arguments().any(|a| a.get_long() == Some(name)));
        return Err(Reply::err(if known {
            format!(
                "ERR CONFIG SET {shown}: {}; restart with a new value",
                fixed_reason(name)
            )
        } else {
            format!("ERR Unknown option or number of arguments for CONFIG SET - '{shown}'")
        }));
    };
    let value = match (live.scale, live.name == name) {
        (1, _) | (_, false) => value.to_string(),
        (s, true) => match value
            .trim()
            .parse::<u64>()
            .ok()
            .and_then(|v| v.checked_mul(s))
        {
            Some(v) => v.to_string(),
            None => {
                return Err(Reply::err(format!(
                    "ERR CONFIG SET {shown}: '{value}' is not a whole number of seconds"
                )))
            }
        },
    };
    if let Some(cmd) = &ctx.shared.flags {
        if let Err(e) = crate::config_file::check_flag(cmd, live.flag, &value) {
            return Err(Reply::err(format!("ERR CONFIG SET {shown}: {e}")));
        }
    }
    Ok((live, value))
}

/// `CONFIG REWRITE`: the live settings into the config file the server started with.
fn rewrite(ctx: &Ctx<'_>) -> Reply {
    let Some(path) = &ctx.shared.config_file else {
        return Reply::err("ERR The server is running without a config file");
    };
    let in_file: Vec<String> = crate::config_file::read(path)
        .map(|ds| ds.into_iter().map(|d| d.name).collect())
        .unwrap_or_default();
    let changed = ctx.shared.live.changed.lock().clone();
    let mut settings: Vec<(&str, String)> = Vec::new();
    for l in LIVE {
        if settings.iter().any(|(f, _)| *f == l.flag) {
            continue;
        }
        let value = (l.get)(ctx);
        let default = ctx
            .shared
            .flags
            .as_ref()
            .and_then(|c| crate::config_file::flag_default(c, l.flag));
        let differs = default.is_some_and(|d| d != value);
        if changed.contains(l.flag) || in_file.iter().any(|n| n == l.flag) || differs {
            settings.push((l.flag, value));
        }
    }
    match crate::config_file::rewrite_file(path, &settings) {
        Ok(()) => Reply::ok(),
        Err(e) => Reply::err(format!("ERR CONFIG REWRITE failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_live_setting_has_a_flag_name_and_a_reason_table_skips_it() {
        for l in LIVE {
            assert!(
                !l.flag.is_empty() && l.flag.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            );
            assert!(!GET_ONLY.contains(&l.name), "{} is live", l.name);
        }
        assert_eq!(
            fixed_reason("port"),
            "the listening port is fixed at startup"
        );
        assert_eq!(redis_level_of("warn"), "warning");
    }
}
