//! Criterion micro-benchmarks of the hot path, in-process (no sockets, no WAL):
//!
//! - `reserve/*`: `Engine::reserve` for a new reservation, an idempotent replay, a
//!   sold-out sale and a sale with a per-user limit (NullSink: the WAL hand-off is
//!   measured by the load benchmark, not here);
//! - `admission/verify`: HMAC-SHA256 admission-token verification (`Keyring::verify`);
//! - `resp/parse_reserve`: framing one RESERVE command (`protocol::frame::parse_command`);
//! - `resp/parse_reserve_into`: the same into a reused argument vector, as a connection
//!   does (`parse_command_into`);
//! - `resp/encode_reserve_reply`: encoding a RESERVED reply (`Reply::encode`, numbers);
//! - `token/derive`: deriving a reservation token into a stack buffer
//!   (`ReservationKey::derive_buf`), beside the heap version (`derive`).
//!
//! `cargo bench --bench micro` (add `-- --quick` for a fast pass).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use stockgate_core::engine::{
    Engine, EngineConfig, Keyring, NullSink, ReservationKey, ReserveOutcome, ReserveRequest,
    SystemClock,
};
use stockgate_server::protocol::frame::{
    parse_command, parse_command_into, parse_frame, Frame, Limits, Parsed,
};
use stockgate_server::protocol::Reply;

const SECRET_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SKU: &str = "HOT-SKU-1";

fn keyring() -> Keyring {
    match Keyring::parse(&format!("bench {SECRET_HEX}\n")) {
        Ok(k) => k,
        Err(e) => panic!("keyring: {e:?}"),
    }
}

fn engine(total: u64, limit: Option<u32>) -> Engine {
    let e = Engine::new(
        EngineConfig::default(),
        Arc::new(SystemClock::new()),
        Arc::new(NullSink),
        keyring(),
        ReservationKey::from_bytes(&[7u8; 32]),
    );
    if let Err(err) = e.create_sale(SKU, total, None, None, limit) {
        panic!("create_sale: {err:?}");
    }
    e
}

fn far_future_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        + 24 * 3600 * 1000
}

fn users(n: usize) -> (Vec<String>, Vec<String>) {
    let k = keyring();
    let exp = far_future_ms();
    let users: Vec<String> = (0..n).map(|i| format!("buyer{i}")).collect();
    let tokens = users.iter().map(|u| k.mint(SKU, u, exp)).collect();
    (users, tokens)
}

fn bench_reserve(c: &mut Criterion) {
    let mut g = c.benchmark_group("reserve");
    let (users, tokens) = users(1024);
    let ids: Vec<String> = (0..1 << 16).map(|i| format!("req-{i}")).collect();

    // A new reservation every call. A fresh engine per sample keeps memory bounded
    // (creating it is not timed).
    g.bench_function("new_reservation", |b| {
        b.iter_custom(|iters| {
            let e = engine(1 << 40, None);
            let mut spent = Duration::ZERO;
            let mut i = 0u64;
            while i < iters {
                let chunk = (iters - i).min(ids.len() as u64);
                // Each chunk uses a different user so (user, request-id) never repeats.
                let round = (i / ids.len() as u64) as usize;
                let u = round % users.len();
                let start = Instant::now();
                for id in &ids[..chunk as usize] {
                    let r = e.reserve(&ReserveRequest {
                        sku: SKU,
                        user: &users[u],
                        admission: tokens[u].as_bytes(),
                        request_id: id,
                        qty: 1,
                    });
                    black_box(&r);
                }
                spent += start.elapsed();
                i += chunk;
            }
            spent
        })
    });

    g.bench_function("replay", |b| {
        let e = engine(1 << 40, None);
        let req = ReserveRequest {
            sku: SKU,
            user: &users[0],
            admission: tokens[0].as_bytes(),
            request_id: "same-request",
            qty: 1,
        };
        let _ = e.reserve(&req);
        b.iter(|| {
            let r = e.reserve(black_box(&req));
            debug_assert!(matches!(r, Ok((ReserveOutcome::Replay { .. }, _))));
            black_box(r)
        })
    });

    g.bench_function("soldout", |b| {
        let e = engine(0, None);
        let req = ReserveRequest {
            sku: SKU,
            user: &users[1],
            admission: tokens[1].as_bytes(),
            request_id: "late",
            qty: 1,
        };
        b.iter(|| black_box(e.reserve(black_box(&req))))
    });

    // Per-user limit 1: the user's stripe lock and entry are on the path; the user
    // already holds a unit, so every call answers LIMIT.
    g.bench_function("limit_reached", |b| {
        let e = engine(1 << 40, Some(1));
        let _ = e.reserve(&ReserveRequest {
            sku: SKU,
            user: &users[2],
            admission: tokens[2].as_bytes(),
            request_id: "first",
            qty: 1,
        });
        let req = ReserveRequest {
            sku: SKU,
            user: &users[2],
            admission: tokens[2].as_bytes(),
            request_id: "second",
            qty: 1,
        };
        b.iter(|| black_box(e.reserve(black_box(&req))))
    });
    g.finish();
}

fn bench_admission(c: &mut Criterion) {
    let k = keyring();
    let token = k.mint(SKU, "buyer42", far_future_ms());
    c.bench_function("admission/verify", |b| {
        b.iter(|| black_box(k.verify(black_box(&token), SKU, "buyer42")))
    });
    let mut bad = token.clone();
    bad.pop();
    bad.push('A');
    c.bench_function("admission/verify_bad_signature", |b| {
        b.iter(|| black_box(k.verify(black_box(&bad), SKU, "buyer42")))
    });
}

fn bench_resp(c: &mut Criterion) {
    let (_, tokens) = users(1);
    let mut frame = Vec::new();
    let args: [&[u8]; 5] = [
        b"RESERVE",
        SKU.as_bytes(),
        b"buyer0",
        tokens[0].as_bytes(),
        b"req-123456",
    ];
    frame.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        frame.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        frame.extend_from_slice(a);
        frame.extend_from_slice(b"\r\n");
    }
    let limits = Limits::default();
    c.bench_function("resp/parse_reserve", |b| {
        b.iter_batched_ref(
            || BytesMut::from(&frame[..]),
            |buf| {
                let r = parse_command(buf, &limits);
                debug_assert!(matches!(r, Ok(Parsed::Command(ref v)) if v.len() == 5));
                black_box(r)
            },
            BatchSize::SmallInput,
        )
    });
    let mut argv = Vec::with_capacity(8);
    c.bench_function("resp/parse_reserve_into", |b| {
        b.iter_batched_ref(
            || BytesMut::from(&frame[..]),
            |buf| {
                let r = parse_command_into(buf, &limits, &mut argv);
                debug_assert!(matches!(r, Ok(true)) && argv.len() == 5);
                black_box(&argv);
                argv.clear();
                black_box(r)
            },
            BatchSize::SmallInput,
        )
    });
    // What the connection runs: the frame's argument ranges, then slices of the buffer
    // (no `Bytes` handle per argument).
    let mut ranges = Vec::with_capacity(8);
    c.bench_function("resp/parse_frame_reserve", |b| {
        b.iter(|| {
            let r = parse_frame(black_box(&frame[..]), &limits, &mut ranges);
            debug_assert!(matches!(r, Ok(Frame::Array { .. })) && ranges.len() == 5);
            let mut argv = [&b""[..]; 8];
            for (slot, &(a, b)) in argv.iter_mut().zip(ranges.iter()) {
                *slot = &frame[a..b];
            }
            black_box(&argv);
            black_box(r)
        })
    });
    let reply = Reply::Array(vec![
        Reply::StaticBulk("RESERVED"),
        Reply::bulk("{HOT-SKU-1}abcdefghijklmnopqrstuvwxyz"),
        Reply::Int(1_796_114_938_658),
        Reply::Int(5),
    ]);
    let mut out = BytesMut::with_capacity(1024);
    c.bench_function("resp/encode_reserve_reply", |b| {
        b.iter(|| {
            out.clear();
            black_box(&reply).encode(2, &mut out);
            black_box(out.len())
        })
    });
}

fn bench_token(c: &mut Criterion) {
    let k = ReservationKey::from_bytes(&[7u8; 32]);
    c.bench_function("token/derive_buf", |b| {
        b.iter(|| {
            black_box(
                k.derive_buf(black_box(SKU), "buyer42", "req-123456")
                    .as_str()
                    .len(),
            )
        })
    });
    c.bench_function("token/derive_string", |b| {
        b.iter(|| black_box(k.derive(black_box(SKU), "buyer42", "req-123456")))
    });
}

criterion_group!(
    benches,
    bench_reserve,
    bench_admission,
    bench_resp,
    bench_token
);
criterion_main!(benches);
