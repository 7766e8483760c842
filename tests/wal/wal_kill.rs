//! Kill test: the real `stockgate` binary, several clients reserving, releasing and
//! committing at full speed across sales of different shapes (16 shards, 1 shard, a
//! per-user LIMIT, QTY > 1), SAVE now and then, SIGKILL at a random moment, restart on the
//! same data dir; many cycles, under `--fsync always` and `--fsync everysec` (a process
//! kill must lose nothing acknowledged under either).
//!
//! Every request is recorded before it is sent and every reply when it arrives. After each
//! restart:
//! - every reservation whose RESERVED reply arrived is there, with its fields, in its last
//!   acknowledged state or the one a sent-but-unanswered RELEASE/COMMIT asked for;
//! - a RESERVE sent without a reply is either absent or RESERVED with its own fields; an
//!   absent one can be reserved afresh (nothing half-remembered it);
//! - for every sale `available + reserved + committed == total`, no shard below zero, no
//!   user above the per-user limit, and
//!   `reserved`/`committed` equal exactly the units of the reservations the server holds
//!   in that state (every RESERVE ever sent is known, so this is provable), `DBSIZE` equals
//!   the number of reservations known: nothing phantom;
//! - no token was handed out twice; retrying an acknowledged `(sku, user, request-id)` is
//!   a REPLAY with the same token, shard and expiry, and takes nothing.
//!
//! Seed: `WAL_KILL_SEED=<n>` replays a run's random choices (timing still varies).
//! Cycles: `WAL_KILL_CYCLES=<n>` (default 20). `WAL_KILL_SABOTAGE=<k>` drops the final
//! k records of the log after each kill (what a server acknowledging too early would
//! lose): the test must fail then, which shows it can.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;
use redis::Value;
use stockgate_server::engine::{Keyring, ReservationKey};

struct SaleSpec {
    sku: &'static str,
    total: i64,
    shards: u32,
    limit: u32,
    max_qty: u32,
}

const SALES: &[SaleSpec] = &[
    SaleSpec {
        sku: "KBIG",
        total: 1_000_000,
        shards: 16,
        limit: 0,
        max_qty: 1,
    },
    SaleSpec {
        sku: "KONE",
        total: 40,
        shards: 1,
        limit: 0,
        max_qty: 3,
    },
    SaleSpec {
        sku: "KLIM",
        total: 5_000,
        shards: 4,
        limit: 3,
        max_qty: 2,
    },
    SaleSpec {
        sku: "KQTY",
        total: 3_000,
        shards: 8,
        limit: 0,
        max_qty: 5,
    },
];

const USERS: u32 = 40;
const CLIENTS: usize = 6;
/// A reply that takes longer than this counts as lost (the server is gone).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Reserved,
    Released,
    Committed,
}

impl St {
    fn parse(s: &str) -> St {
        match s {
            "RESERVED" => St::Reserved,
            "RELEASED" => St::Released,
            "COMMITTED" => St::Committed,
            other => panic!("unknown reservation state {other:?}"),
        }
    }
}

#[derive(Clone, Debug)]
struct Res {
    sale: usize,
    user: String,
    rid: String,
    qty: i64,
    shard: i64,
    expires_at: i64,
    /// Last state a reply confirmed.
    acked: St,
    /// A RELEASE/COMMIT was sent and no reply came: the state it asked for.
    maybe: Option<St>,
}

#[derive(Clone, Debug)]
struct Pending {
    sale: usize,
    user: String,
    qty: i64,
}

#[derive(Default)]
struct Model {
    /// Every reservation the server acknowledged (or showed us after a restart).
    known: HashMap<String, Res>,
    /// RESERVEs sent without a reply yet, by request id.
    inflight: HashMap<String, Pending>,
    /// RESERVED reservations no client task is working on.
    live: Vec<String>,
    /// Tokens acknowledged since the last restart, in order.
    this_cycle: Vec<String>,
    stats: Stats,
}

#[derive(Default, Debug, Clone)]
struct Stats {
    reserved: u64,
    soldout: u64,
    limited: u64,
    released: u64,
    committed: u64,
    saves: u64,
    unanswered_at_kill: u64,
    unanswered_reserves_found: u64,
    unanswered_reserves_absent: u64,
    unanswered_transitions_applied: u64,
    replays_checked: u64,
}

fn lock(m: &Mutex<Model>) -> std::sync::MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Reply {
    Value(Value),
    /// The connection broke or timed out: the server was killed. Stop this client.
    Gone,
}

async fn send(c: &mut MultiplexedConnection, args: &[&str]) -> Reply {
    match tokio::time::timeout(REPLY_TIMEOUT, cmd(c, args)).await {
        Ok(Ok(v)) => Reply::Value(v),
        Ok(Err(e)) if e.code().is_some() => {
            panic!(
                "server error reply to {:?}: {e}",
                &args[..args.len().min(2)]
            )
        }
        Ok(Err(_)) | Err(_) => Reply::Gone,
    }
}

fn array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(v) => v,
        other => panic!("expected an array, got {other:?}"),
    }
}

struct Ctx {
    keys: Keyring,
    rkey: ReservationKey,
    model: Mutex<Model>,
}

/// One request of a client.
enum Op {
    Reserve {
        sale: usize,
        user: String,
        qty: i64,
        rid: String,
    },
    /// RELEASE (or COMMIT) of a RESERVED reservation this client took from the pool.
    Finish { tok: String, commit: bool },
}

/// Picks the next request and records it as sent-without-reply (before it is sent).
fn next_op(ctx: &Ctx, rng: &mut StdRng, rid: String) -> Op {
    let mut m = lock(&ctx.model);
    if !m.live.is_empty() && rng.gen_bool(0.45) {
        let i = rng.gen_range(0..m.live.len());
        let tok = m.live.swap_remove(i);
        let commit = rng.gen_bool(0.35);
        m.known.get_mut(&tok).unwrap().maybe =
            Some(if commit { St::Committed } else { St::Released });
        return Op::Finish { tok, commit };
    }
    let sale = rng.gen_range(0..SALES.len());
    let spec = &SALES[sale];
    let user = format!("u{}", rng.gen_range(0..USERS));
    let qty: i64 = if spec.max_qty > 1 && rng.gen_bool(0.4) {
        rng.gen_range(2..=spec.max_qty as i64)
    } else {
        1
    };
    m.inflight.insert(
        rid.clone(),
        Pending {
            sale,
            user: user.clone(),
            qty,
        },
    );
    Op::Reserve {
        sale,
        user,
        qty,
        rid,
    }
}

fn op_args(ctx: &Ctx, op: &Op, admission_exp: u64) -> Vec<String> {
    match op {
        Op::Finish { tok, commit } => {
            let verb = if *commit { "COMMIT" } else { "RELEASE" };
            vec![verb.into(), tok.clone()]
        }
        Op::Reserve {
            sale,
            user,
            qty,
            rid,
        } => {
            let sku = SALES[*sale].sku;
            let mut a = vec![
                "RESERVE".into(),
                sku.into(),
                user.clone(),
                ctx.keys.mint(sku, user, admission_exp),
                rid.clone(),
            ];
            if *qty > 1 {
                a.extend(["QTY".into(), qty.to_string()]);
            }
            a
        }
    }
}

/// Records the reply to `op`.
fn on_reply(ctx: &Ctx, op: Op, v: Value) {
    let mut m = lock(&ctx.model);
    match op {
        Op::Finish { tok, commit } => {
            let verb = if commit { "COMMIT" } else { "RELEASE" };
            assert_eq!(
                v,
                Value::Int(1),
                "{verb} of RESERVED {tok} (only this client touches it)"
            );
            let r = m.known.get_mut(&tok).unwrap();
            r.acked = if commit { St::Committed } else { St::Released };
            r.maybe = None;
            if commit {
                m.stats.committed += 1;
            } else {
                m.stats.released += 1;
            }
        }
        Op::Reserve {
            sale,
            user,
            qty,
            rid,
        } => {
            let spec = &SALES[sale];
            let v = array(v);
            m.inflight.remove(&rid);
            match as_str(&v[0]).as_str() {
                "RESERVED" => {
                    let tok = as_str(&v[1]);
                    assert_eq!(
                        tok,
                        ctx.rkey.derive(spec.sku, &user, &rid),
                        "token is HMAC(key, sku|user|rid)"
                    );
                    assert!(
                        !m.known.contains_key(&tok),
                        "token {tok} handed out twice (RESERVED for a new request id)"
                    );
                    m.known.insert(
                        tok.clone(),
                        Res {
                            sale,
                            user,
                            rid,
                            qty,
                            shard: as_int(&v[3]),
                            expires_at: as_int(&v[2]),
                            acked: St::Reserved,
                            maybe: None,
                        },
                    );
                    m.live.push(tok.clone());
                    m.this_cycle.push(tok);
                    m.stats.reserved += 1;
                }
                "SOLDOUT" => m.stats.soldout += 1,
                "LIMIT" => {
                    assert!(spec.limit > 0, "LIMIT from a sale without a limit");
                    m.stats.limited += 1;
                }
                other => panic!("RESERVE with a fresh request id answered {other}: {v:?}"),
            }
        }
    }
}

/// One client: until its connection breaks, sends batches of `batch.0..=batch.1` requests
/// (one at a time when that is 1..=1, else as one pipeline), each either finishing a live
/// reservation (RELEASE or COMMIT) or reserving with a new request id.
async fn client(
    ctx: Arc<Ctx>,
    mut c: MultiplexedConnection,
    cycle: usize,
    id: usize,
    batch: (usize, usize),
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let admission_exp = now_ms() + 3_600_000;
    let mut n = 0u64;
    loop {
        let k = rng.gen_range(batch.0..=batch.1);
        let ops: Vec<Op> = (0..k)
            .map(|_| {
                n += 1;
                next_op(&ctx, &mut rng, format!("c{cycle}-t{id}-{n}"))
            })
            .collect();
        let args: Vec<Vec<String>> = ops
            .iter()
            .map(|o| op_args(&ctx, o, admission_exp))
            .collect();
        let replies = if k == 1 {
            let a: Vec<&str> = args[0].iter().map(String::as_str).collect();
            match send(&mut c, &a).await {
                Reply::Value(v) => vec![v],
                Reply::Gone => return,
            }
        } else {
            let mut p = redis::pipe();
            for a in &args {
                let mut k = redis::cmd(&a[0]);
                for x in &a[1..] {
                    k.arg(x);
                }
                p.add_command(k);
            }
            match tokio::time::timeout(REPLY_TIMEOUT, p.query_async::<Vec<Value>>(&mut c)).await {
                Ok(Ok(vs)) => vs,
                Ok(Err(e)) if e.code().is_some() => panic!("server error in a pipeline: {e}"),
                Ok(Err(_)) | Err(_) => return,
            }
        };
        assert_eq!(replies.len(), ops.len());
        for (op, v) in ops.into_iter().zip(replies) {
            on_reply(&ctx, op, v);
        }
    }
}

/// SAVE now and then, so kills land before, during and after snapshots.
async fn saver(ctx: Arc<Ctx>, mut c: MultiplexedConnection, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(30..250))).await;
        match send(&mut c, &["SAVE"]).await {
            Reply::Value(Value::Okay) => lock(&ctx.model).stats.saves += 1,
            Reply::Value(v) => panic!("SAVE answered {v:?}"),
            Reply::Gone => return,
        }
    }
}

fn int_field(v: &Value, name: &str) -> i64 {
    as_int(&field(v, name).unwrap_or_else(|| panic!("no field {name} in {v:?}")))
}

fn str_field(v: &Value, name: &str) -> String {
    as_str(&field(v, name).unwrap_or_else(|| panic!("no field {name} in {v:?}")))
}

/// Sends commands in pipelined chunks; returns one reply per command.
async fn pipelined(c: &mut MultiplexedConnection, cmds: &[Vec<String>]) -> Vec<Value> {
    let mut out = Vec::with_capacity(cmds.len());
    for chunk in cmds.chunks(500) {
        let mut p = redis::pipe();
        for args in chunk {
            let mut k = redis::cmd(&args[0]);
            for a in &args[1..] {
                k.arg(a);
            }
            p.add_command(k);
        }
        let vs: Vec<Value> = tokio::time::timeout(Duration::from_secs(60), p.query_async(c))
            .await
            .expect("pipelined query timed out")
            .expect("pipelined query");
        out.extend(vs);
    }
    out
}

fn check_fields(tok: &str, v: &Value, sale: usize, user: &str, rid: &str, qty: i64) {
    assert_eq!(str_field(v, "token"), tok);
    assert_eq!(str_field(v, "sku"), SALES[sale].sku, "{tok}");
    assert_eq!(str_field(v, "user"), user, "{tok}");
    assert_eq!(str_field(v, "request_id"), rid, "{tok}");
    assert_eq!(int_field(v, "qty"), qty, "{tok}");
}

/// Everything the brief asks to hold after a restart; updates the model to what the
/// server now holds (within what is allowed).
async fn verify(ctx: &Ctx, srv: &Server, rng: &mut StdRng, cycle: usize) {
    let mut c = srv.conn().await;
    // The clients are gone: work on the model without holding its lock across awaits.
    let mut model = std::mem::take(&mut *lock(&ctx.model));
    let m = &mut model;

    // 1. Every acknowledged reservation, in an allowed state.
    let tokens: Vec<String> = m.known.keys().cloned().collect();
    let cmds: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| vec!["RESERVATION".to_string(), t.clone()])
        .collect();
    let replies = pipelined(&mut c, &cmds).await;
    for (tok, v) in tokens.iter().zip(&replies) {
        let r = m.known.get_mut(tok).unwrap();
        assert!(
            !matches!(v, Value::Nil),
            "cycle {cycle}: acknowledged reservation {tok} ({r:?}) lost after kill -9"
        );
        check_fields(tok, v, r.sale, &r.user, &r.rid, r.qty);
        assert_eq!(int_field(v, "shard"), r.shard, "{tok}");
        assert_eq!(int_field(v, "expires_at_ms"), r.expires_at, "{tok}");
        let st = St::parse(&str_field(v, "state"));
        assert!(
            st == r.acked || Some(st) == r.maybe,
            "cycle {cycle}: {tok} is {st:?} after restart; last acknowledged {:?}, unanswered request {:?}",
            r.acked,
            r.maybe
        );
        if r.maybe.is_some() {
            if st != r.acked {
                m.stats.unanswered_transitions_applied += 1;
            }
            r.maybe = None;
        }
        r.acked = st;
    }

    // 2. RESERVEs that never got a reply: absent, or RESERVED with their own fields.
    let inflight: Vec<(String, Pending)> = m.inflight.drain().collect();
    let mut absent = Vec::new();
    for (rid, p) in inflight {
        let tok = ctx.rkey.derive(SALES[p.sale].sku, &p.user, &rid);
        assert!(
            !m.known.contains_key(&tok),
            "unanswered {rid} already known"
        );
        let v = cmd(&mut c, &["RESERVATION", &tok]).await.unwrap();
        if matches!(v, Value::Nil) {
            m.stats.unanswered_reserves_absent += 1;
            absent.push((rid, p));
            continue;
        }
        check_fields(&tok, &v, p.sale, &p.user, &rid, p.qty);
        assert_eq!(str_field(&v, "state"), "RESERVED", "{tok}");
        m.stats.unanswered_reserves_found += 1;
        m.known.insert(
            tok,
            Res {
                sale: p.sale,
                user: p.user,
                rid,
                qty: p.qty,
                shard: int_field(&v, "shard"),
                expires_at: int_field(&v, "expires_at_ms"),
                acked: St::Reserved,
                maybe: None,
            },
        );
    }

    // 3. Per-sale invariants and exact accounting, and nothing phantom.
    let infos = sale_infos(&mut c, m).await;
    let dbsize = as_int(&cmd(&mut c, &["DBSIZE"]).await.unwrap());
    assert_eq!(
        dbsize,
        m.known.len() as i64,
        "cycle {cycle}: the server holds reservations nobody was acknowledged or asked for"
    );

    // 4. Retries of acknowledged requests: REPLAY, same token, nothing taken. The newest
    //    (most at risk) and a random sample of the older ones.
    let mut sample: Vec<String> = m.this_cycle.iter().rev().take(200).cloned().collect();
    let all: Vec<&String> = m.known.keys().collect();
    for _ in 0..100.min(all.len()) {
        sample.push(all[rng.gen_range(0..all.len())].clone());
    }
    let exp = now_ms() + 600_000;
    let cmds: Vec<Vec<String>> = sample
        .iter()
        .map(|t| {
            let r = &m.known[t];
            let sku = SALES[r.sale].sku;
            vec![
                "RESERVE".into(),
                sku.into(),
                r.user.clone(),
                ctx.keys.mint(sku, &r.user, exp),
                r.rid.clone(),
            ]
        })
        .collect();
    let replies = pipelined(&mut c, &cmds).await;
    for (tok, v) in sample.iter().zip(replies) {
        let r = &m.known[tok];
        let v = array(v);
        assert_eq!(
            as_str(&v[0]),
            "REPLAY",
            "cycle {cycle}: retry of {tok}: {v:?}"
        );
        assert_eq!(as_str(&v[1]), *tok, "retry gives the same token");
        assert_eq!(as_int(&v[2]), r.expires_at, "{tok}");
        assert_eq!(as_int(&v[3]), r.shard, "{tok}");
    }
    m.stats.replays_checked += sample.len() as u64;
    assert_eq!(
        sale_infos(&mut c, m).await,
        infos,
        "cycle {cycle}: a REPLAY changed the counters"
    );

    // 5. Unanswered RESERVEs that did not survive can be made afresh: nothing remembers
    //    half of them (a REPLAY here would mean an idempotency entry without stock).
    for (rid, p) in absent {
        let spec = &SALES[p.sale];
        let adm = ctx.keys.mint(spec.sku, &p.user, exp);
        let q = p.qty.to_string();
        let v = array(
            cmd(
                &mut c,
                &["RESERVE", spec.sku, &p.user, &adm, &rid, "QTY", &q],
            )
            .await
            .unwrap(),
        );
        match as_str(&v[0]).as_str() {
            "RESERVED" => {
                let tok = as_str(&v[1]);
                assert_eq!(tok, ctx.rkey.derive(spec.sku, &p.user, &rid));
                m.known.insert(
                    tok,
                    Res {
                        sale: p.sale,
                        user: p.user,
                        rid,
                        qty: p.qty,
                        shard: as_int(&v[3]),
                        expires_at: as_int(&v[2]),
                        acked: St::Reserved,
                        maybe: None,
                    },
                );
            }
            "SOLDOUT" | "LIMIT" => {}
            other => panic!("cycle {cycle}: retry of lost unanswered {rid} answered {other}"),
        }
    }

    // The retries are accounted for exactly, too.
    sale_infos(&mut c, m).await;

    m.live = m
        .known
        .iter()
        .filter(|(_, r)| r.acked == St::Reserved)
        .map(|(t, _)| t.clone())
        .collect();
    m.live.sort();
    m.this_cycle.clear();
    *lock(&ctx.model) = model;
}

/// SALE.INFO of every sale with the docs/design.md invariants and the exact accounting against
/// the reservations the model knows. Returns (available, reserved, committed) per sale.
async fn sale_infos(c: &mut MultiplexedConnection, m: &Model) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    let mut listed: Vec<String> = array(cmd(c, &["SALE.LIST"]).await.unwrap())
        .iter()
        .map(as_str)
        .collect();
    listed.sort();
    let mut expected: Vec<String> = SALES.iter().map(|s| s.sku.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected, "SALE.LIST after restart");
    for (i, spec) in SALES.iter().enumerate() {
        let info = cmd(c, &["SALE.INFO", spec.sku]).await.unwrap();
        let total = int_field(&info, "total");
        let available = int_field(&info, "available");
        let reserved = int_field(&info, "reserved");
        let committed = int_field(&info, "committed");
        let shards: Vec<i64> = match field(&info, "shard_available").unwrap() {
            Value::Array(v) => v.iter().map(as_int).collect(),
            other => panic!("{other:?}"),
        };
        let sku = spec.sku;
        assert_eq!(
            total, spec.total,
            "{sku}: total changed without SALE.ADJUST"
        );
        assert_eq!(
            available + reserved + committed,
            total,
            "{sku}: available + reserved + committed != total ({info:?})"
        );
        assert!(
            shards.iter().all(|&s| s >= 0),
            "{sku}: shard below zero {shards:?}"
        );
        assert_eq!(shards.len(), spec.shards as usize, "{sku}");
        assert_eq!(shards.iter().sum::<i64>(), available, "{sku}");
        assert_eq!(int_field(&info, "limit"), spec.limit as i64, "{sku}");
        let (mut want_r, mut want_c) = (0, 0);
        for r in m.known.values().filter(|r| r.sale == i) {
            match r.acked {
                St::Reserved => want_r += r.qty,
                St::Committed => want_c += r.qty,
                St::Released => {}
            }
        }
        assert_eq!(
            reserved, want_r,
            "{sku}: reserved units differ from the RESERVED reservations held"
        );
        assert_eq!(
            committed, want_c,
            "{sku}: committed units differ from the COMMITTED reservations held"
        );
        if spec.limit > 0 {
            let mut held: HashMap<&str, i64> = HashMap::new();
            for r in m.known.values().filter(|r| r.sale == i) {
                if r.acked != St::Released {
                    *held.entry(&r.user).or_default() += r.qty;
                }
            }
            for (user, units) in held {
                assert!(
                    units <= spec.limit as i64,
                    "{sku}: {user} holds {units} units, limit {}",
                    spec.limit
                );
            }
        }
        out.push((available, reserved, committed));
    }
    out
}

async fn kill_cycles(fsync: &str) {
    let seed: u64 = std::env::var("WAL_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let cycles: usize = std::env::var("WAL_KILL_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    eprintln!(
        "wal_kill --fsync {fsync}: seed {seed} (WAL_KILL_SEED={seed} to replay), {cycles} cycles"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = TempDir::new(&format!("walkill-{fsync}"));
    // Small segments and a low automatic snapshot threshold: rolls, periodic snapshots and
    // segment deletion all happen during the run, besides the explicit SAVEs.
    let args = [
        "--fsync",
        fsync,
        "--segment-mib",
        "1",
        "--snapshot-records",
        "3000",
    ];
    let mut srv = Server::start_in(dir.path(), &args);
    let ctx = Arc::new(Ctx {
        keys: srv.keyring(),
        rkey: reservation_key(dir.path()),
        model: Mutex::new(Model::default()),
    });
    {
        let mut c = srv.conn().await;
        for s in SALES {
            let (t, sh, l) = (
                s.total.to_string(),
                s.shards.to_string(),
                s.limit.to_string(),
            );
            let r = cmd(
                &mut c,
                &["SALE.CREATE", s.sku, &t, "SHARDS", &sh, "LIMIT", &l],
            )
            .await
            .unwrap();
            assert_eq!(r, Value::Okay);
        }
    }
    let started = Instant::now();
    let mut restart_ms = Vec::new();
    for cycle in 0..cycles {
        let mut tasks = Vec::new();
        // Clients one request at a time on their own connections, two sharing one
        // connection (the multiplexer pipelines them), and one sending pipelines of up to
        // 12 requests (a batch is answered once its last record is acknowledged).
        let shared = srv.conn().await;
        for id in 0..CLIENTS {
            let (c, batch) = match id {
                0 | 1 => (shared.clone(), (1, 1)),
                2 => (srv.conn().await, (2, 12)),
                _ => (srv.conn().await, (1, 1)),
            };
            tasks.push(tokio::spawn(client(
                ctx.clone(),
                c,
                cycle,
                id,
                batch,
                rng.gen(),
            )));
        }
        drop(shared);
        let c = srv.conn().await;
        tasks.push(tokio::spawn(saver(ctx.clone(), c, rng.gen())));
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..900))).await;
        srv.kill9();
        for t in tasks {
            tokio::time::timeout(REPLY_TIMEOUT * 2, t)
                .await
                .expect("a client did not notice the kill")
                .expect("client task panicked");
        }
        {
            let mut m = lock(&ctx.model);
            let unanswered =
                m.inflight.len() + m.known.values().filter(|r| r.maybe.is_some()).count();
            m.stats.unanswered_at_kill += unanswered as u64;
        }
        if let Some(k) = std::env::var("WAL_KILL_SABOTAGE")
            .ok()
            .and_then(|k| k.parse::<usize>().ok())
        {
            // Checks the checker: drop the log's final k whole records, as a server that
            // acknowledged before writing would lose them. The run must then fail.
            let seg = wal_segments(dir.path()).pop().unwrap();
            let bytes = std::fs::read(&seg).unwrap();
            let spans = record_spans(&bytes);
            if let Some(&(s, _)) = spans.get(spans.len().saturating_sub(k)) {
                std::fs::write(&seg, &bytes[..s]).unwrap();
            }
        }
        let t = Instant::now();
        srv = Server::start_in(dir.path(), &args);
        restart_ms.push(t.elapsed().as_millis());
        verify(&ctx, &srv, &mut rng, cycle).await;
    }
    let m = lock(&ctx.model);
    eprintln!(
        "wal_kill --fsync {fsync}: {cycles} kill/restart cycles in {:?}; {} reservations known; {:?}; restart ms {:?}",
        started.elapsed(),
        m.known.len(),
        m.stats,
        restart_ms
    );
    // The run must have exercised what it claims to: traffic, snapshots, and kills that
    // caught requests in flight.
    assert!(m.stats.reserved >= 200, "too little traffic: {:?}", m.stats);
    assert!(
        m.stats.released > 0 && m.stats.committed > 0,
        "{:?}",
        m.stats
    );
    assert!(m.stats.saves > 0, "no SAVE completed: {:?}", m.stats);
    assert!(
        m.stats.unanswered_at_kill > 0,
        "no kill caught a request in flight: {:?}",
        m.stats
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_kill9_fsync_always_loses_nothing_acknowledged() {
    kill_cycles("always").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_kill9_fsync_everysec_loses_nothing_acknowledged() {
    kill_cycles("everysec").await;
}
