//! Metrics against an in-process engine: a scripted workload through the real dispatcher
//! (via the same hook the server uses), then every reader checked against what happened.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::cmd::{dispatch_timed, Ctx};
use crate::engine::{Denied, Engine, EngineConfig, Keyring, ManualClock, NullSink, ReservationKey};
use crate::metrics::SaleEvent;
use crate::protocol::Reply;
use crate::session::{ConnState, NoDurability, Role, ServerConfig, Shared};

const T0: u64 = 1_700_000_000_000;

struct World {
    engine: Engine,
    clock: Arc<ManualClock>,
    shared: Shared,
    conn: ConnState,
}

impl World {
    fn new() -> World {
        let clock = Arc::new(ManualClock::new(T0));
        let keys = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap();
        let engine = Engine::new(
            EngineConfig::default(),
            clock.clone(),
            Arc::new(NullSink),
            keys,
            ReservationKey::from_bytes(&[7u8; 32]),
        );
        let shared = Shared::new(ServerConfig::default(), None, Arc::new(NoDurability));
        World {
            engine,
            clock,
            shared,
            conn: {
                let mut c = ConnState::new(
                    1,
                    Some(Role::Admin),
                    "127.0.0.1:5555".into(),
                    "127.0.0.1:7379".into(),
                );
                c.name = Some("tester".into());
                c
            },
        }
    }

    fn run(&mut self, args: &[&str]) -> Reply {
        let argv: Vec<Bytes> = args.iter().map(|a| Bytes::from(a.to_string())).collect();
        let mut ctx = Ctx {
            engine: &self.engine,
            conn: &mut self.conn,
            shared: &self.shared,
        };
        let o = dispatch_timed(&mut ctx, &crate::cmd::multi::views(&argv));
        self.conn.recorder.flush(&self.shared.metrics);
        o.reply
    }

    fn admit(&self, sku: &str, user: &str) -> String {
        self.engine
            .keyring()
            .mint(sku, user, self.engine.now_ms() + 60_000)
    }

    fn info(&mut self, section: &str) -> String {
        match self.run(&["INFO", section]) {
            Reply::Bulk(b) => String::from_utf8(b).unwrap(),
            r => panic!("INFO replied {r:?}"),
        }
    }
}

fn token_of(r: &Reply) -> String {
    match r {
        Reply::Array(v) => match &v[1] {
            Reply::Bulk(b) => String::from_utf8(b.clone()).unwrap(),
            x => panic!("{x:?}"),
        },
        x => panic!("{x:?}"),
    }
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
}

fn sub_field(v: &str, key: &str) -> Option<u64> {
    v.split(',')
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .and_then(|n| n.parse().ok())
}

/// The scripted workload: 3 RESERVED, 1 REPLAY, 1 LIMIT, 2 SOLDOUT, 1 DENIED, one arity
/// refusal, one unknown command, 1 commit, 1 release (+1 no-op release).
fn workload(w: &mut World) -> Vec<String> {
    assert_eq!(
        w.run(&["SALE.CREATE", "S1", "3", "SHARDS", "1", "LIMIT", "2"]),
        Reply::ok()
    );
    let mut tokens = Vec::new();
    for (user, rid) in [("alice", "a1"), ("alice", "a2"), ("bob", "b1")] {
        let adm = w.admit("S1", user);
        let r = w.run(&["RESERVE", "S1", user, &adm, rid]);
        tokens.push(token_of(&r));
    }
    let adm = w.admit("S1", "alice");
    assert!(
        matches!(w.run(&["RESERVE", "S1", "alice", &adm, "a1"]), Reply::Array(v) if v[0] == Reply::bulk("REPLAY"))
    );
    assert!(
        matches!(w.run(&["RESERVE", "S1", "alice", &adm, "a3"]), Reply::Array(v) if v[0] == Reply::bulk("LIMIT"))
    );
    for (user, rid) in [("carol", "c1"), ("dave", "d1")] {
        let adm = w.admit("S1", user);
        assert_eq!(
            w.run(&["RESERVE", "S1", user, &adm, rid]),
            Reply::Array(vec![Reply::bulk("SOLDOUT")])
        );
    }
    assert!(w.run(&["RESERVE", "S1", "eve", "garbage", "e1"]).is_error());
    assert!(w.run(&["RESERVE", "S1"]).is_error());
    assert!(w.run(&["NOSUCHCMD"]).is_error());
    assert_eq!(w.run(&["COMMIT", &tokens[0]]), Reply::Int(1));
    assert_eq!(w.run(&["RELEASE", &tokens[1]]), Reply::Int(1));
    assert_eq!(w.run(&["RELEASE", &tokens[1]]), Reply::Int(0));
    tokens
}

#[test]
fn counters_match_the_workload() {
    let mut w = World::new();
    workload(&mut w);
    let cmds = w.shared.metrics.commands();
    let reserve = cmds.iter().find(|c| c.name == "reserve").unwrap();
    // 3 + 1 + 1 + 2 + 1 ran (the DENIED one failed); the arity error was rejected.
    assert_eq!(reserve.calls, 8);
    assert_eq!(reserve.failed, 1);
    assert_eq!(reserve.rejected, 1);
    // Histogram counts equal call counts.
    assert_eq!(reserve.hist.as_ref().unwrap().len(), 8);
    let release = cmds.iter().find(|c| c.name == "release").unwrap();
    assert_eq!((release.calls, release.failed), (2, 0));

    let t = w.shared.metrics.sale_totals("S1");
    assert_eq!(t[SaleEvent::Reserved as usize], 3);
    assert_eq!(t[SaleEvent::Replay as usize], 1);
    assert_eq!(t[SaleEvent::Limit as usize], 1);
    assert_eq!(t[SaleEvent::SoldOut as usize], 2);
    assert_eq!(t[SaleEvent::Denied as usize], 1);
    assert_eq!(t[SaleEvent::Commit as usize], 1);
    assert_eq!(t[SaleEvent::Release as usize], 1);

    let (errors, total) = w.shared.metrics.errors();
    assert_eq!(total, 3);
    assert_eq!(
        errors,
        vec![("DENIED".to_string(), 1), ("ERR".to_string(), 2)]
    );
}

#[test]
fn info_sections_in_redis_format() {
    let mut w = World::new();
    workload(&mut w);
    let cs = w.info("commandstats");
    assert!(cs.starts_with("# Commandstats\r\n"), "{cs}");
    let line = field(&cs, "cmdstat_reserve").expect("cmdstat_reserve");
    assert_eq!(sub_field(line, "calls"), Some(8));
    assert_eq!(sub_field(line, "rejected_calls"), Some(1));
    assert_eq!(sub_field(line, "failed_calls"), Some(1));
    assert!(line.contains(",usec_per_call="), "{line}");

    let es = w.info("errorstats");
    assert!(es.contains("errorstat_DENIED:count=1\r\n"), "{es}");
    assert!(es.contains("errorstat_ERR:count=2\r\n"), "{es}");

    let ls = w.info("latencystats");
    let l = field(&ls, "latency_percentiles_usec_reserve").expect("latencystats");
    assert!(
        l.starts_with("p50=") && l.contains(",p99=") && l.contains(",p99.9="),
        "{l}"
    );

    let sales = w.info("sales");
    let s = field(&sales, "sale_S1").expect("sale line");
    for (k, v) in [
        ("total", 3),
        ("available", 1),
        ("reserved", 1),
        ("committed", 1),
        ("reserve_reserved", 3),
        ("reserve_replay", 1),
        ("reserve_soldout", 2),
        ("reserve_limit", 1),
        ("reserve_denied", 1),
        ("releases", 1),
        ("commits", 1),
        ("expired_pending", 0),
    ] {
        assert_eq!(sub_field(s, k), Some(v), "{k} in {s}");
    }

    // Default: no commandstats/latencystats; `all` and `everything`: every section.
    let d = match w.run(&["INFO"]) {
        Reply::Bulk(b) => String::from_utf8(b).unwrap(),
        r => panic!("{r:?}"),
    };
    for s in [
        "# Server",
        "# Clients",
        "# Memory",
        "# Persistence",
        "# Stats",
        "# Replication",
        "# CPU",
        "# Errorstats",
        "# Sales",
        "# Keyspace",
    ] {
        assert!(d.contains(s), "default lacks {s}");
    }
    assert!(!d.contains("# Commandstats") && !d.contains("# Latencystats"));
    let all = w.info("everything");
    assert!(all.contains("# Commandstats") && all.contains("# Latencystats"));
    assert!(field(&all, "role") == Some("master"));
    assert!(
        field(&all, "used_memory")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap()
            > 0
    );
    assert!(field(&all, "db0").unwrap().starts_with("keys=3,"));
    // Sections are separated by one empty line, as Redis's.
    assert!(all.contains("\r\n\r\n# Clients\r\n"));

    // CONFIG RESETSTAT zeroes the counters.
    assert_eq!(w.run(&["CONFIG", "RESETSTAT"]), Reply::ok());
    let cs = w.info("commandstats");
    assert!(field(&cs, "cmdstat_reserve").is_none(), "{cs}");
    assert_eq!(w.shared.metrics.sale_totals("S1")[0], 0);
}

#[test]
fn expired_backlog_and_sweeper_lag() {
    let mut w = World::new();
    w.run(&["SALE.CREATE", "S2", "10", "SHARDS", "1", "TTL", "1000"]);
    for u in ["u1", "u2"] {
        let adm = w.admit("S2", u);
        w.run(&["RESERVE", "S2", u, &adm, "r"]);
    }
    w.clock.advance(5_000);
    let sales = w.info("sales");
    let s = field(&sales, "sale_S2").unwrap();
    assert_eq!(sub_field(s, "expired_pending"), Some(2), "{s}");
    assert_eq!(sub_field(s, "oldest_expired_age_ms"), Some(4_000), "{s}");
}

#[test]
fn latency_histogram_reply_shape() {
    let mut w = World::new();
    workload(&mut w);
    let r = w.run(&["LATENCY", "HISTOGRAM", "reserve", "nosuch"]);
    let Reply::Map(entries) = r else {
        panic!("{r:?}")
    };
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].0, Reply::bulk("reserve"));
    let Reply::Map(body) = &entries[0].1 else {
        panic!()
    };
    assert_eq!(body[0], (Reply::bulk("calls"), Reply::Int(8)));
    assert_eq!(body[1].0, Reply::bulk("histogram_usec"));
    let Reply::Map(buckets) = &body[1].1 else {
        panic!()
    };
    // Cumulative, ending at the call count; bucket bounds grow.
    let mut last = (0, 0);
    for (b, n) in buckets {
        let (Reply::Int(b), Reply::Int(n)) = (b, n) else {
            panic!()
        };
        assert!(*b > last.0 || last == (0, 0));
        assert!(*n > last.1);
        last = (*b, *n);
    }
    assert_eq!(last.1, 8);
    // Without arguments: every command that ran.
    let Reply::Map(all) = w.run(&["LATENCY", "HISTOGRAM"]) else {
        panic!()
    };
    assert!(all.iter().any(|(k, _)| *k == Reply::bulk("sale.create")));
    assert_eq!(w.run(&["LATENCY", "LATEST"]), Reply::Array(vec![]));
}

#[test]
fn slowlog_threshold_shape_and_redaction() {
    let mut w = World::new();
    w.shared.metrics.configure(0, 3, 50);
    w.run(&["SALE.CREATE", "S3", "5"]);
    let adm = w.admit("S3", "zed");
    w.run(&["RESERVE", "S3", "zed", &adm, "z1"]);
    let long = "x".repeat(200);
    w.run(&["ECHO", &long]);
    assert_eq!(w.run(&["SLOWLOG", "LEN"]), Reply::Int(3));
    // Newest first; SLOWLOG LEN itself is logged too (as in Redis), and the ring keeps 3.
    let Reply::Array(entries) = w.run(&["SLOWLOG", "GET", "-1"]) else {
        panic!()
    };
    assert_eq!(entries.len(), 3);
    let Reply::Array(e0) = &entries[1] else {
        panic!()
    };
    assert_eq!(e0.len(), 6);
    // The ECHO, its argument cut at 128 bytes as Redis does.
    assert_eq!(e0[0], Reply::Int(2));
    let Reply::Array(args) = &e0[3] else { panic!() };
    assert_eq!(args[0], Reply::bulk("ECHO"));
    assert_eq!(
        args[1],
        Reply::bulk(format!("{}... (72 more bytes)", "x".repeat(128)))
    );
    assert_eq!(e0[4], Reply::bulk("127.0.0.1:5555"));
    assert_eq!(e0[5], Reply::bulk("tester"));
    // The admission token is not kept.
    let Reply::Array(e1) = &entries[2] else {
        panic!()
    };
    let Reply::Array(args) = &e1[3] else { panic!() };
    assert_eq!(args[0], Reply::bulk("RESERVE"));
    assert_eq!(args[3], Reply::bulk("(redacted)"));
    // Bounded at --slowlog-max-len.
    assert_eq!(w.run(&["SLOWLOG", "LEN"]), Reply::Int(3));
    // -1 disables.
    w.shared.metrics.configure(-1, 3, 50);
    assert_eq!(w.run(&["SLOWLOG", "RESET"]), Reply::ok());
    w.run(&["PING"]);
    assert_eq!(w.run(&["SLOWLOG", "LEN"]), Reply::Int(0));
    assert!(w.run(&["SLOWLOG", "GET", "-2"]).is_error());
}

#[test]
fn prometheus_text_matches_counters_and_bounds_labels() {
    let mut w = World::new();
    workload(&mut w);
    for i in 0..5 {
        w.run(&["SALE.CREATE", &format!("Z{i}"), "1"]);
    }
    w.shared.metrics.configure(10_000, 128, 2);
    let text = prom::render(&w.engine, &w.shared);
    assert!(
        text.contains("stockgate_commands_total{cmd=\"reserve\"} 8\n"),
        "{text}"
    );
    assert!(text.contains("stockgate_command_duration_seconds_count{cmd=\"reserve\"} 8\n"));
    assert!(
        text.contains("stockgate_command_duration_seconds_bucket{cmd=\"reserve\",le=\"+Inf\"} 8\n")
    );
    assert!(text.contains("stockgate_reserve_outcomes_total{sku=\"S1\",outcome=\"soldout\"} 2\n"));
    assert!(text.contains("stockgate_errors_total{code=\"DENIED\"} 1\n"));
    assert!(text.contains("stockgate_sale_units{sku=\"S1\",state=\"committed\"} 1\n"));
    // Two labelled sales (S1, Z0), the other four summed.
    assert!(text.contains("stockgate_sale_total_units{sku=\"Z0\"} 1\n"));
    assert!(!text.contains("sku=\"Z1\""));
    assert!(text.contains("stockgate_sale_total_units{sku=\"_other\"} 4\n"));
    // Every sample line is `name{labels} value` or `name value`.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, v) = l.rsplit_once(' ').unwrap();
        assert!(name.starts_with("stockgate_"), "{l}");
        assert!(v.parse::<f64>().is_ok(), "{l}");
    }
}

#[test]
fn json_and_top_render_the_same_state() {
    let mut w = World::new();
    workload(&mut w);
    let j = http::json(&w.engine, &w.shared);
    assert!(j.contains("\"sku\":\"S1\""), "{j}");
    assert!(j.contains("\"soldout\":2"), "{j}");

    // top: parse INFO, render into a test buffer, read the figures off the screen.
    let i0 = top::Info::parse(&w.info("everything"));
    let adm = w.admit("S1", "frank");
    w.run(&["RESERVE", "S1", "frank", &adm, "f1"]);
    let i1 = top::Info::parse(&w.info("everything"));
    let mut s = top::Screen {
        server: "test".into(),
        ..top::Screen::default()
    };
    s.update(Some((&i0, &[])), i1, &[], 1.0);
    let lines = top::render_text(&s, 160, 30);
    let row = lines
        .iter()
        .find(|l| l.trim_start().starts_with("S1"))
        .unwrap_or_else(|| panic!("{}", lines.join("\n")));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // sku state bar available reserved committed total reserve/s soldout/s ...
    assert_eq!(cols[0], "S1");
    assert_eq!(cols[1], "OPEN");
    assert_eq!(&cols[3..7], ["0", "2", "1", "3"], "{row}");
    assert_eq!(cols[7], "1.0", "{row}");
    assert!(
        lines.iter().any(|l| l.contains("DENIED")),
        "{}",
        lines.join("\n")
    );
}

#[test]
fn window_p99_and_bar() {
    let before = [(1, 10), (2, 20)];
    let after = [(1, 10), (2, 20), (4, 120), (8, 121)];
    // 101 new samples: 100 at ≤4 µs, 1 at ≤8 µs → p99 is the 4 µs bucket.
    assert_eq!(top::window_p99(&before, &after), Some(4));
    assert_eq!(top::window_p99(&after, &after), None);
    assert_eq!(top::bar(5, 3, 2, 10).chars().count(), 10);
    assert_eq!(top::bar(0, 0, 10, 10), "░".repeat(10));
}

#[test]
fn transactions_count_as_redis_does() {
    let mut w = World::new();
    w.run(&["SALE.CREATE", "TX", "1", "SHARDS", "1"]);
    let a = w.admit("TX", "ann");
    let b = w.admit("TX", "ben");
    assert_eq!(w.run(&["MULTI"]), Reply::ok());
    assert_eq!(
        w.run(&["RESERVE", "TX", "ann", &a, "1"]),
        Reply::Simple("QUEUED")
    );
    assert_eq!(
        w.run(&["RESERVE", "TX", "ben", &b, "1"]),
        Reply::Simple("QUEUED")
    );
    let Reply::Array(r) = w.run(&["EXEC"]) else {
        panic!()
    };
    assert_eq!(r.len(), 2);
    let cmds = w.shared.metrics.commands();
    let get = |n: &str| cmds.iter().find(|c| c.name == n).unwrap().calls;
    // Queuing is not a call; running inside EXEC is.
    assert_eq!((get("multi"), get("exec"), get("reserve")), (1, 1, 2));
    let reserve = cmds.iter().find(|c| c.name == "reserve").unwrap();
    assert_eq!(reserve.hist.as_ref().unwrap().len(), 2);
    let t = w.shared.metrics.sale_totals("TX");
    assert_eq!(
        (
            t[SaleEvent::Reserved as usize],
            t[SaleEvent::SoldOut as usize]
        ),
        (1, 1)
    );
    // INFO stats reads the same home: each outcome once.
    let stats = w.info("stats");
    assert_eq!(field(&stats, "reserve_reserved"), Some("1"));
    assert_eq!(field(&stats, "reserve_soldout"), Some("1"));
    assert_eq!(w.run(&["CONFIG", "RESETSTAT"]), Reply::ok());
    let stats = w.info("stats");
    assert_eq!(field(&stats, "reserve_reserved"), Some("0"));
    assert_eq!(field(&stats, "reserve_soldout"), Some("0"));
}

/// Admission tokens refused for each reason a different number of times, so a reason
/// counted under another shows: malformed 1, unknown_key 2, bad_signature 3, wrong_sku 1,
/// wrong_user 1, expired 4 (12 in all).
fn denial_workload(w: &mut World) {
    assert_eq!(w.run(&["SALE.CREATE", "D", "10"]), Reply::ok());
    assert_eq!(w.run(&["SALE.CREATE", "D2", "10"]), Reply::ok());
    let now = w.engine.now_ms();
    let foreign_secret = Keyring::parse(&format!("k1 {}\n", "cd".repeat(32))).unwrap();
    let foreign_kid = Keyring::parse(&format!("k9 {}\n", "ab".repeat(32))).unwrap();
    let mut tokens: Vec<(&str, String)> = vec![("u", "garbage".into())];
    for _ in 0..2 {
        tokens.push(("u", foreign_kid.mint("D", "u", now + 60_000)));
    }
    for _ in 0..3 {
        tokens.push(("u", foreign_secret.mint("D", "u", now + 60_000)));
    }
    tokens.push(("u", w.engine.keyring().mint("D2", "u", now + 60_000)));
    tokens.push(("u", w.engine.keyring().mint("D", "other", now + 60_000)));
    for i in 0..4 {
        tokens.push(("u", w.engine.keyring().mint("D", "u", now - 1 - i)));
    }
    for (i, (user, adm)) in tokens.iter().enumerate() {
        let r = w.run(&["RESERVE", "D", user, adm, &format!("r{i}")]);
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("DENIED ")),
            "{i}: {r:?}"
        );
    }
}

const DENIALS_WANTED: [(&str, u64); 6] = [
    ("malformed", 1),
    ("unknown_key", 2),
    ("bad_signature", 3),
    ("wrong_sku", 1),
    ("wrong_user", 1),
    ("expired", 4),
];

#[test]
fn denials_are_counted_by_reason_everywhere() {
    let mut w = World::new();
    denial_workload(&mut w);
    // The store, from the engine's typed refusal.
    let got: Vec<(&str, u64)> = w
        .shared
        .metrics
        .denials()
        .iter()
        .map(|(d, n)| (d.reason(), *n))
        .collect();
    assert_eq!(got, DENIALS_WANTED);
    // The totals that lump them together still count every one.
    let (errors, _) = w.shared.metrics.errors();
    assert_eq!(errors, vec![("DENIED".to_string(), 12)]);
    assert_eq!(
        w.shared.metrics.sale_totals("D")[SaleEvent::Denied as usize],
        12
    );

    // INFO: `denied_<reason>` in the sales section (so in the default INFO too).
    let sales = w.info("sales");
    let default = match w.run(&["INFO"]) {
        Reply::Bulk(b) => String::from_utf8(b).unwrap(),
        r => panic!("{r:?}"),
    };
    for (reason, n) in DENIALS_WANTED {
        let k = format!("denied_{reason}");
        assert_eq!(field(&sales, &k), Some(n.to_string().as_str()), "{sales}");
        assert_eq!(field(&default, &k), Some(n.to_string().as_str()));
    }
    assert_eq!(
        sub_field(field(&sales, "sale_D").unwrap(), "reserve_denied"),
        Some(12)
    );

    // Prometheus: one label value per reason; errors_total by code is kept.
    let text = prom::render(&w.engine, &w.shared);
    assert!(
        text.contains("# TYPE stockgate_denials_total counter\n"),
        "{text}"
    );
    for (reason, n) in DENIALS_WANTED {
        let want = format!("stockgate_denials_total{{reason=\"{reason}\"}} {n}\n");
        assert!(text.contains(&want), "no {want:?} in\n{text}");
    }
    assert!(text.contains("stockgate_errors_total{code=\"DENIED\"} 12\n"));

    // JSON (the status page's feed).
    let j = http::json(&w.engine, &w.shared);
    assert!(
        j.contains("\"denials\":{\"malformed\":1,\"unknown_key\":2,\"bad_signature\":3,\"wrong_sku\":1,\"wrong_user\":1,\"expired\":4}"),
        "{j}"
    );

    // top: totals and rates over the poll, read off the rendered screen.
    let i0 = top::Info::parse(&w.info("everything"));
    let foreign = Keyring::parse(&format!("k1 {}\n", "cd".repeat(32))).unwrap();
    let adm = foreign.mint("D", "u", w.engine.now_ms() + 60_000);
    assert!(w.run(&["RESERVE", "D", "u", &adm, "late"]).is_error());
    let i1 = top::Info::parse(&w.info("everything"));
    let mut s = top::Screen::default();
    s.update(Some((&i0, &[])), i1, &[], 1.0);
    let lines = top::render_text(&s, 160, 30);
    let line = lines
        .iter()
        .find(|l| l.starts_with("denied "))
        .unwrap_or_else(|| panic!("{}", lines.join("\n")));
    for want in [
        "bad_signature 4 1.0/s",
        "expired 4 0.0/s",
        "unknown_key 2 0.0/s",
    ] {
        assert!(line.contains(want), "no {want:?} in {line:?}");
    }

    // CONFIG RESETSTAT zeroes them with the other counters.
    assert_eq!(w.run(&["CONFIG", "RESETSTAT"]), Reply::ok());
    assert!(w.shared.metrics.denials().iter().all(|(_, n)| *n == 0));
}

#[test]
fn a_replay_is_no_denial_and_exec_counts_a_denial_once() {
    let mut w = World::new();
    w.run(&["SALE.CREATE", "R", "10"]);
    let adm = w.admit("R", "u");
    assert!(matches!(
        w.run(&["RESERVE", "R", "u", &adm, "r1"]),
        Reply::Array(_)
    ));
    // The admission has expired by now; the same request still replays.
    w.clock.advance(120_000);
    assert!(
        matches!(w.run(&["RESERVE", "R", "u", &adm, "r1"]), Reply::Array(v) if v[0] == Reply::bulk("REPLAY"))
    );
    assert!(w.shared.metrics.denials().iter().all(|(_, n)| *n == 0));
    assert_eq!(w.run(&["MULTI"]), Reply::ok());
    w.run(&["RESERVE", "R", "u", &adm, "r2"]);
    let Reply::Array(r) = w.run(&["EXEC"]) else {
        panic!()
    };
    assert!(
        matches!(&r[0], Reply::Error(e) if e == "DENIED expired"),
        "{r:?}"
    );
    let d = w.shared.metrics.denials();
    assert_eq!(d[Denied::Expired as usize], (Denied::Expired, 1));
    assert_eq!(d.iter().map(|(_, n)| n).sum::<u64>(), 1);
    assert_eq!(
        w.shared.metrics.sale_totals("R")[SaleEvent::Denied as usize],
        1
    );
}
