//! What metrics cost per command: the dispatcher alone vs the dispatcher through
//! `cmd::dispatch_timed` (two clock reads, command lookup, and one stripe publish per
//! batch of 1 or 16 commands, as unpipelined and pipelined clients produce). A sale's
//! outcome is counted by the command itself, so both variants pay for it. Same process, same engine, same command; the difference is the overhead.
//!
//! `cargo bench --bench metrics` (add `-- --quick` for a fast pass).
//!
//! Instruction counts, stable on a noisy machine: run one variant a fixed number of
//! times under callgrind and compare totals, e.g.
//! `METRICS_VARIANT=ping/metrics_p16 METRICS_ITERS=200000 valgrind --tool=callgrind
//! target/release/deps/metrics-<hash>` (variants: `{ping,reserve_replay}/{plain,
//! metrics_p1,metrics_p16}`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{black_box, criterion_group, Criterion};
use stockgate_core::engine::{
    Engine, EngineConfig, Keyring, NullSink, ReservationKey, SystemClock,
};
use stockgate_server::cmd::{dispatch, dispatch_timed, Ctx};
use stockgate_server::server::{ConnState, NoDurability, Role, ServerConfig, Shared};

const SKU: &str = "HOT-SKU-1";

fn setup() -> (Engine, Shared, ConnState, Vec<Bytes>, Vec<Bytes>) {
    let keys = match Keyring::parse(&format!("bench {}\n", "ab".repeat(32))) {
        Ok(k) => k,
        Err(e) => panic!("keyring: {e:?}"),
    };
    let e = Engine::new(
        EngineConfig::default(),
        Arc::new(SystemClock::new()),
        Arc::new(NullSink),
        keys,
        ReservationKey::from_bytes(&[7u8; 32]),
    );
    if let Err(err) = e.create_sale(SKU, 1_000_000, None, None, None) {
        panic!("create_sale: {err:?}");
    }
    let adm = e
        .keyring()
        .mint(SKU, "buyer", e.now_ms() + 24 * 3600 * 1000);
    let shared = Shared::new(ServerConfig::default(), None, Arc::new(NoDurability));
    let conn = ConnState::new(
        1,
        Some(Role::Admin),
        "127.0.0.1:1".into(),
        "127.0.0.1:2".into(),
    );
    let reserve: Vec<Bytes> = ["RESERVE", SKU, "buyer", adm.as_str(), "req-1"]
        .iter()
        .map(|s| Bytes::from(s.to_string()))
        .collect();
    let ping = vec![Bytes::from_static(b"PING")];
    (e, shared, conn, reserve, ping)
}

fn bench(c: &mut Criterion) {
    let (engine, shared, mut conn, reserve_owned, ping_owned) = setup();
    // `dispatch` takes the arguments as slices, as the server hands them out of its buffer.
    let reserve: Vec<&[u8]> = reserve_owned.iter().map(|b| &b[..]).collect();
    let ping: Vec<&[u8]> = ping_owned.iter().map(|b| &b[..]).collect();
    // The first RESERVE reserves; every later one is a REPLAY (constant engine work).
    {
        let mut ctx = Ctx {
            engine: &engine,
            conn: &mut conn,
            shared: &shared,
        };
        black_box(dispatch(&mut ctx, &reserve));
    }
    let mut g = c.benchmark_group("metrics");
    g.measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    for (name, argv) in [("reserve_replay", &reserve), ("ping", &ping)] {
        g.bench_function(format!("{name}/plain"), |b| {
            b.iter(|| {
                let mut ctx = Ctx {
                    engine: &engine,
                    conn: &mut conn,
                    shared: &shared,
                };
                black_box(dispatch(&mut ctx, argv))
            })
        });
        g.bench_function(format!("{name}/metrics_p1"), |b| {
            b.iter(|| {
                let mut ctx = Ctx {
                    engine: &engine,
                    conn: &mut conn,
                    shared: &shared,
                };
                let o = dispatch_timed(&mut ctx, argv);
                conn.recorder.flush(&shared.metrics);
                black_box(o)
            })
        });
        g.bench_function(format!("{name}/metrics_p16"), |b| {
            let mut n = 0u32;
            b.iter(|| {
                let mut ctx = Ctx {
                    engine: &engine,
                    conn: &mut conn,
                    shared: &shared,
                };
                let o = dispatch_timed(&mut ctx, argv);
                n += 1;
                if n.is_multiple_of(16) {
                    conn.recorder.flush(&shared.metrics);
                }
                black_box(o)
            })
        });
    }
    g.finish();
}

/// One variant, `iters` times, outside criterion (for callgrind).
fn fixed(variant: &str, iters: u64) {
    let (engine, shared, mut conn, reserve_owned, ping_owned) = setup();
    // `dispatch` takes the arguments as slices, as the server hands them out of its buffer.
    let reserve: Vec<&[u8]> = reserve_owned.iter().map(|b| &b[..]).collect();
    let ping: Vec<&[u8]> = ping_owned.iter().map(|b| &b[..]).collect();
    {
        let mut ctx = Ctx {
            engine: &engine,
            conn: &mut conn,
            shared: &shared,
        };
        black_box(dispatch(&mut ctx, &reserve));
    }
    let (cmd, mode) = variant.split_once('/').unwrap_or((variant, "plain"));
    let argv = if cmd == "ping" { &ping } else { &reserve };
    for n in 1..=iters {
        let mut ctx = Ctx {
            engine: &engine,
            conn: &mut conn,
            shared: &shared,
        };
        match mode {
            "plain" => {
                black_box(dispatch(&mut ctx, argv));
            }
            "metrics_p1" => {
                black_box(dispatch_timed(&mut ctx, argv));
                conn.recorder.flush(&shared.metrics);
            }
            _ => {
                black_box(dispatch_timed(&mut ctx, argv));
                if n.is_multiple_of(16) {
                    conn.recorder.flush(&shared.metrics);
                }
            }
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(v) = std::env::var("METRICS_VARIANT") {
        let iters = std::env::var("METRICS_ITERS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(100_000);
        fixed(&v, iters);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
