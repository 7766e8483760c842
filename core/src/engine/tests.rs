//! Engine tests: unit tests of each command and a model test that runs random operation
//! sequences against a plain reference model, checking the docs/design.md invariants after
//! every step and that replaying the log (and loading a snapshot) reproduces the state.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Default)]
pub struct RecordingSink {
    pub events: Mutex<Vec<Event>>,
}

impl EventSink for RecordingSink {
    fn record(&self, event: &EventRef<'_>) -> Lsn {
        let mut e = self.events.lock();
        e.push(event.to_owned_event());
        e.len() as Lsn
    }

    fn last_lsn(&self) -> Lsn {
        self.events.lock().len() as Lsn
    }
}

const T0: u64 = 1_700_000_000_000;

fn keys() -> Keyring {
    Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap()
}

fn reservation_key() -> ReservationKey {
    ReservationKey::from_bytes(&[9u8; 32])
}

fn engine(auto_release: bool) -> (Engine, Arc<ManualClock>, Arc<RecordingSink>) {
    engine_with(auto_release, 50_000)
}

fn engine_with(
    auto_release: bool,
    retention_ms: u64,
) -> (Engine, Arc<ManualClock>, Arc<RecordingSink>) {
    let clock = Arc::new(ManualClock::new(T0));
    let sink = Arc::new(RecordingSink::default());
    let cfg = EngineConfig {
        auto_release,
        retention_ms,
        ..EngineConfig::default()
    };
    (
        Engine::new(cfg, clock.clone(), sink.clone(), keys(), reservation_key()),
        clock,
        sink,
    )
}

fn admit(e: &Engine, sku: &str, user: &str) -> String {
    e.keyring().mint(sku, user, e.now_ms() + 60_000)
}

fn reserve(
    e: &Engine,
    sku: &str,
    user: &str,
    rid: &str,
    qty: u32,
) -> Result<ReserveOutcome, EngineError> {
    let adm = admit(e, sku, user);
    e.reserve(&ReserveRequest {
        sku,
        user,
        admission: adm.as_bytes(),
        request_id: rid,
        qty,
    })
    .map(|x| x.0)
}

fn token_of(o: &ReserveOutcome) -> Arc<str> {
    match o {
        ReserveOutcome::Reserved { token, .. } | ReserveOutcome::Replay { token, .. } => {
            token.as_str().into()
        }
        other => panic!("no token in {other:?}"),
    }
}

fn check_invariants(e: &Engine) {
    for sku in e.list_sales() {
        let v = e.sale_info(&sku).unwrap();
        if v.state == SaleState::Fenced {
            continue;
        }
        assert!(v.shard_available.iter().all(|&a| a >= 0), "{v:?}");
        assert_eq!(
            v.available + v.reserved as i64 + v.committed as i64,
            v.total as i64,
            "{v:?}"
        );
    }
}

#[test]
fn reserve_replay_release_commit() {
    let (e, _c, _s) = engine(false);
    e.create_sale("SKU", 3, Some(1), Some(1000), None).unwrap();
    let a = reserve(&e, "SKU", "alice", "r1", 1).unwrap();
    assert!(matches!(a, ReserveOutcome::Reserved { .. }));
    let t = token_of(&a);
    assert!(matches!(
        reserve(&e, "SKU", "alice", "r1", 1).unwrap(),
        ReserveOutcome::Replay { .. }
    ));
    assert_eq!(e.stock("SKU").unwrap(), 2);
    assert!(e.release(&t).0);
    assert!(!e.release(&t).0);
    assert_eq!(e.commit(&t), Err(EngineError::Released));
    assert_eq!(e.stock("SKU").unwrap(), 3);
    // The same request id stays a replay even after release: it never takes stock twice.
    assert!(matches!(
        reserve(&e, "SKU", "alice", "r1", 1).unwrap(),
        ReserveOutcome::Replay { .. }
    ));
    let b = token_of(&reserve(&e, "SKU", "bob", "r1", 2).unwrap());
    assert!(e.commit(&b).unwrap().0);
    assert!(!e.commit(&b).unwrap().0);
    assert!(!e.release(&b).0);
    assert_eq!(
        reserve(&e, "SKU", "carol", "r", 2).unwrap(),
        ReserveOutcome::SoldOut
    );
    let v = e.sale_info("SKU").unwrap();
    assert_eq!((v.available, v.reserved, v.committed), (1, 0, 2));
    assert_eq!(e.commit("{SKU}nope"), Err(EngineError::NoReservation));
    check_invariants(&e);
}

#[test]
fn commit_past_expiry_needs_the_ledger_verified_form() {
    let (e, c, sink) = engine(false);
    e.create_sale("S", 3, Some(1), Some(1000), None).unwrap();
    let on_time = token_of(&reserve(&e, "S", "alice", "r1", 1).unwrap());
    let late = token_of(&reserve(&e, "S", "bob", "r1", 1).unwrap());
    let raced = token_of(&reserve(&e, "S", "carol", "r1", 1).unwrap());
    let deadline = e.reservation(&late).unwrap().0.expires_at_ms;

    // At the deadline itself a payment is still in time (the ledger's `>=`).
    c.set(deadline);
    assert!(e.commit(&on_time).unwrap().0);

    // One millisecond later a plain COMMIT sells nothing and logs nothing.
    c.advance(1);
    let logged = sink.events.lock().len();
    assert_eq!(
        e.commit(&late),
        Err(EngineError::LateCommit {
            expires_at_ms: deadline
        })
    );
    assert_eq!(sink.events.lock().len(), logged);
    assert_eq!(
        e.reservation(&late).unwrap().0.state,
        ReservationState::Reserved
    );
    let v = e.sale_info("S").unwrap();
    assert_eq!((v.available, v.reserved, v.committed), (0, 2, 1));
    // The sweeper gives it back as usual.
    assert!(e.release(&late).0);

    // The boundary race: the ledger accepted carol's payment before the deadline, the
    // COMMIT arrives after it. The verified form commits.
    assert!(
        e.commit_with(&raced, PaymentCheck::LedgerVerified)
            .unwrap()
            .0
    );
    assert!(
        !e.commit_with(&raced, PaymentCheck::LedgerVerified)
            .unwrap()
            .0
    );
    // Already committed stays `:0` for the plain form too, late or not.
    assert!(!e.commit(&raced).unwrap().0);
    let v = e.sale_info("S").unwrap();
    assert_eq!((v.available, v.reserved, v.committed), (1, 0, 2));
    check_invariants(&e);
    let events = sink.events.lock().clone();
    assert_eq!(dump(&replayed(&events, c.clone())), dump(&e));
}

#[test]
fn decision_order() {
    let (e, c, _s) = engine(false);
    assert_eq!(reserve(&e, "NOPE", "u", "r", 1), Err(EngineError::NoSale));
    assert_eq!(
        reserve(&e, "bad sku", "u", "r", 1),
        Err(EngineError::Invalid("sku"))
    );
    assert_eq!(
        reserve(&e, "S", "u|x", "r", 1),
        Err(EngineError::Invalid("user"))
    );
    e.create_sale("S", 10, Some(1), None, Some(2)).unwrap();
    let other = e.keyring().mint("S", "mallory", T0 + 100);
    let r = e.reserve(&ReserveRequest {
        sku: "S",
        user: "u",
        admission: other.as_bytes(),
        request_id: "r",
        qty: 1,
    });
    assert_eq!(r.map(|x| x.0), Err(EngineError::Denied(Denied::WrongUser)));
    // Expired admission: denied, but a replay of an existing reservation still answers.
    let adm = e.keyring().mint("S", "u", T0 + 100);
    let req = ReserveRequest {
        sku: "S",
        user: "u",
        admission: adm.as_bytes(),
        request_id: "r",
        qty: 1,
    };
    assert!(matches!(
        e.reserve(&req).unwrap().0,
        ReserveOutcome::Reserved { .. }
    ));
    c.advance(1000);
    assert!(matches!(
        e.reserve(&req).unwrap().0,
        ReserveOutcome::Replay { .. }
    ));
    let req2 = ReserveRequest {
        request_id: "r2",
        ..req
    };
    assert_eq!(
        e.reserve(&req2).map(|x| x.0),
        Err(EngineError::Denied(Denied::Expired))
    );
    // Paused: replay still answers, new requests are refused.
    e.set_paused("S", true).unwrap();
    assert!(matches!(
        reserve(&e, "S", "u", "r", 1).unwrap(),
        ReserveOutcome::Replay { .. }
    ));
    assert_eq!(reserve(&e, "S", "u", "r3", 1), Err(EngineError::Paused));
    e.set_paused("S", false).unwrap();
    // Limit 2: u holds 1; 2 more is over the limit and names the live reservation.
    match reserve(&e, "S", "u", "r4", 2).unwrap() {
        ReserveOutcome::Limit { live, limit, held } => {
            assert_eq!(live.len(), 1);
            assert_eq!((limit, held), (2, 1), "the limit and what the user holds");
        }
        o => panic!("{o:?}"),
    }
    assert!(matches!(
        reserve(&e, "S", "u", "r5", 1).unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    // Committed units still count against the limit.
    let live = match reserve(&e, "S", "u", "r6", 1).unwrap() {
        ReserveOutcome::Limit { live, .. } => live,
        o => panic!("{o:?}"),
    };
    assert_eq!(live.len(), 2);
    e.commit(&live[0]).unwrap();
    e.release(&live[1]);
    assert!(matches!(
        reserve(&e, "S", "u", "r7", 1).unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
    assert!(matches!(
        reserve(&e, "S", "u", "r8", 1).unwrap(),
        ReserveOutcome::Limit { .. }
    ));
    check_invariants(&e);
}

#[test]
fn create_is_idempotent_and_checks_params() {
    let (e, _c, _s) = engine(false);
    e.create_sale("S", 10, None, None, None).unwrap();
    // The same creation again: +OK, waiting for the creation record (LSN 1), never
    // before it (a crash would otherwise erase an acknowledged sale).
    assert_eq!(
        e.create_sale("S", 10, Some(16), Some(630_000), Some(0)),
        Ok(1)
    );
    assert_eq!(
        e.create_sale("S", 11, None, None, None),
        Err(EngineError::Exists)
    );
    // ADJUST does not change what "the same creation parameters" means.
    e.adjust("S", 5).unwrap();
    assert_eq!(e.create_sale("S", 10, None, None, None), Ok(2));
    assert!(e.create_sale("T", 1, Some(0), None, None).is_err());
}

#[test]
fn adjust_withdraws_at_most_available() {
    let (e, _c, _s) = engine(false);
    e.create_sale("S", 10, Some(4), None, None).unwrap();
    reserve(&e, "S", "u", "r", 3).unwrap();
    assert_eq!(e.adjust("S", -8), Err(EngineError::NotEnoughAvailable));
    assert_eq!(e.stock("S").unwrap(), 7);
    assert_eq!(e.adjust("S", -7).unwrap().0, 3);
    assert_eq!(e.stock("S").unwrap(), 0);
    assert_eq!(e.adjust("S", 4).unwrap().0, 7);
    check_invariants(&e);
}

#[test]
fn expiry_extend_and_expired_listing() {
    let (e, c, _s) = engine(false);
    e.create_sale("S", 100, Some(4), Some(1000), None).unwrap();
    let a = token_of(&reserve(&e, "S", "a", "r", 1).unwrap());
    c.advance(10);
    let b = token_of(&reserve(&e, "S", "b", "r", 1).unwrap());
    assert!(e.expired(10, None).is_empty());
    c.advance(995);
    let ex = e.expired(10, None);
    assert_eq!(ex.len(), 1);
    assert_eq!(&*ex[0].token, &*a);
    // Reading changed nothing; expired reservations can't be extended, live ones can.
    assert_eq!(e.expired(10, None).len(), 1);
    assert_eq!(e.extend(&a, 1000), Err(EngineError::Expired));
    let (new, _) = e.extend(&b, 5000).unwrap();
    assert_eq!(new, e.now_ms() + 5000);
    c.advance(10);
    assert_eq!(e.expired(10, None).len(), 1);
    assert_eq!(e.expired(10, Some("OTHER")).len(), 0);
    // Commit of an expired reservation needs the ledger's word (the sweeper's cleanup).
    assert!(matches!(e.commit(&a), Err(EngineError::LateCommit { .. })));
    assert!(e.commit_with(&a, PaymentCheck::LedgerVerified).unwrap().0);
    assert!(e.expired(10, None).is_empty());
    c.advance(5000);
    assert_eq!(e.expired(10, None).len(), 1);
    assert_eq!(e.extend(&a, 10), Err(EngineError::NoReservation));
}

#[test]
fn auto_release_and_retention() {
    let (e, c, _s) = engine(true);
    e.create_sale("S", 2, Some(1), Some(100), None).unwrap();
    let a = token_of(&reserve(&e, "S", "a", "r", 2).unwrap());
    assert_eq!(
        reserve(&e, "S", "b", "r", 1).unwrap(),
        ReserveOutcome::SoldOut
    );
    c.advance(100);
    e.tick();
    assert_eq!(e.stock("S").unwrap(), 2);
    assert_eq!(
        e.reservation(&a).unwrap().0.state,
        ReservationState::Released
    );
    c.advance(50_000);
    e.tick();
    assert!(e.reservation(&a).is_none(), "purged after retention");
    check_invariants(&e);
}

#[test]
fn release_races_exactly_once() {
    let (e, _c, _s) = engine(false);
    let e = Arc::new(e);
    e.create_sale("S", 100, Some(4), None, None).unwrap();
    let toks: Vec<Arc<str>> = (0..100)
        .map(|i| token_of(&reserve(&e, "S", &format!("u{i}"), "r", 1).unwrap()))
        .collect();
    let wins = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let hs: Vec<_> = (0..8)
        .map(|_| {
            let (e, toks, wins) = (e.clone(), toks.clone(), wins.clone());
            std::thread::spawn(move || {
                for t in toks.iter() {
                    if e.release(t).0 {
                        wins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(wins.load(std::sync::atomic::Ordering::Relaxed), 100);
    assert_eq!(e.stock("S").unwrap(), 100);
    check_invariants(&e);
}

#[test]
fn concurrent_storm_never_oversells() {
    let (e, _c, _s) = engine(false);
    let e = Arc::new(e);
    e.create_sale("S", 1000, Some(16), None, None).unwrap();
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for i in 0..2500 {
                    let u = format!("u{t}-{i}");
                    if let Ok(ReserveOutcome::Reserved { token, .. }) = reserve(&e, "S", &u, "r", 1)
                    {
                        got.push(Arc::<str>::from(token.as_str()));
                    }
                }
                got
            })
        })
        .collect();
    let mut all: Vec<Arc<str>> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "no token twice");
    // Bounded stealing may leave a few units unsold under a storm; never more than total.
    assert!(n <= 1000);
    assert_eq!(e.stock("S").unwrap(), 1000 - n as i64);
    check_invariants(&e);
}

#[test]
fn fence_restore_rebuild() {
    let (e, c, _s) = engine(false);
    e.create_sale("S", 10, Some(2), Some(1000), None).unwrap();
    let t = token_of(&reserve(&e, "S", "a", "r", 1).unwrap());
    e.fence("S", None, None, None, None).unwrap();
    assert_eq!(reserve(&e, "S", "b", "r", 1), Err(EngineError::Fenced));
    let (new, tok, _) = e
        .restore(
            "S",
            "b",
            "rb",
            2,
            c.now_ms() + 500,
            c.now_ms(),
            ReservationState::Reserved,
        )
        .unwrap();
    assert!(new);
    assert!(
        !e.restore("S", "b", "rb", 2, 0, 0, ReservationState::Reserved)
            .unwrap()
            .0
    );
    assert!(matches!(
        e.rebuild("S", 10, 3, "0000"),
        Err(EngineError::FingerprintMismatch { .. })
    ));
    let fp = e.key_fingerprint().to_string();
    // total 10 − committed 3 − reserved (1 + 2) = 4
    assert_eq!(e.rebuild("S", 10, 3, &fp).unwrap().0, 4);
    check_invariants(&e);
    assert!(e.commit(&tok).unwrap().0);
    assert!(e.release(&t).0);
    check_invariants(&e);
    // A sale this server never heard of is created fenced.
    e.fence("LOST", Some(5), None, None, None).unwrap();
    assert_eq!(e.sale_info("LOST").unwrap().state, SaleState::Fenced);
    assert_eq!(e.stock("LOST").unwrap(), 0);
    assert_eq!(e.rebuild("LOST", 5, 1, &fp).unwrap().0, 4);
    assert_eq!(
        e.restore("LOST", "x", "y", 1, 0, 0, ReservationState::Reserved),
        Err(EngineError::NotFenced)
    );
}

/// A comparable dump of everything observable.
fn dump(e: &Engine) -> (Vec<SaleView>, Vec<ReservationView>, Vec<TombView>) {
    let (s, _) = e.snapshot_with(|| ());
    let mut r = s.reservations;
    r.sort_by(|a, b| a.token.cmp(&b.token));
    (s.sales, r, s.tombs)
}

fn replayed(events: &[Event], clock: Arc<ManualClock>) -> Engine {
    let e = Engine::new(
        EngineConfig {
            retention_ms: 50_000,
            ..EngineConfig::default()
        },
        clock,
        Arc::new(NullSink),
        keys(),
        reservation_key(),
    );
    for ev in events {
        e.apply(ev);
    }
    e
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        sale: u8,
        total: u16,
        shards: u8,
        limit: u8,
    },
    Reserve {
        sale: u8,
        user: u8,
        req: u8,
        qty: u8,
    },
    Release {
        pick: u16,
    },
    Commit {
        pick: u16,
        verified: bool,
    },
    Extend {
        pick: u16,
        ms: u16,
    },
    Advance {
        ms: u16,
    },
    Adjust {
        sale: u8,
        delta: i64,
    },
    Tick,
    Expired,
    Fence {
        sale: u8,
    },
    Rebuild {
        sale: u8,
    },
    /// The sale handed over and back: freeze, export, drop, import into this engine.
    Roundtrip {
        sale: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..3, 0u16..40, 1u8..5, 0u8..4).prop_map(|(sale, total, shards, limit)| Op::Create { sale, total, shards, limit }),
        6 => (0u8..3, 0u8..12, 0u8..6, 1u8..4).prop_map(|(sale, user, req, qty)| Op::Reserve { sale, user, req, qty }),
        2 => any::<u16>().prop_map(|pick| Op::Release { pick }),
        2 => any::<(u16, bool)>().prop_map(|(pick, verified)| Op::Commit { pick, verified }),
        1 => any::<(u16, u16)>().prop_map(|(pick, ms)| Op::Extend { pick, ms: ms % 3000 + 1 }),
        2 => (0u16..2000).prop_map(|ms| Op::Advance { ms }),
        1 => (0u8..3, -10i64..10).prop_map(|(sale, delta)| Op::Adjust { sale, delta }),
        // Extremes: every one is refused (out of range) or fits; none may wrap.
        1 => (0u8..3, prop::sample::select(vec![
            i64::MIN, i64::MIN + 1, i64::MAX, -(MAX_TOTAL as i64), MAX_TOTAL as i64,
            -(MAX_TOTAL as i64) - 1, MAX_TOTAL as i64 + 1,
        ])).prop_map(|(sale, delta)| Op::Adjust { sale, delta }),
        1 => Just(Op::Tick),
        1 => Just(Op::Expired),
        1 => (0u8..3).prop_map(|sale| Op::Fence { sale }),
        1 => (0u8..3).prop_map(|sale| Op::Rebuild { sale }),
        1 => (0u8..3).prop_map(|sale| Op::Roundtrip { sale }),
    ]
}

#[derive(Clone, Debug)]
struct MRes {
    sku: String,
    user: String,
    qty: u32,
    state: ReservationState,
    expires: u64,
}

#[derive(Clone, Debug)]
struct MSale {
    total: i64,
    limit: u32,
    fenced: bool,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[allow(clippy::map_entry)]

    #[test]
    fn model(ops in proptest::collection::vec(op(), 1..120), auto in any::<bool>(), crash_at in any::<proptest::sample::Index>()) {
        // A short retention, so purges (and retries of purged requests) happen often.
        let (e, clock, sink) = engine_with(auto, 3_000);
        let mut sales: BTreeMap<String, MSale> = BTreeMap::new();
        let mut res: BTreeMap<String, MRes> = BTreeMap::new();
        let mut tokens: Vec<String> = Vec::new();
        let sku = |i: u8| format!("SKU{i}");
        for op in ops {
            let now = clock.now_ms();
            match op {
                Op::Create { sale, total, shards, limit } => {
                    let r = e.create_sale(&sku(sale), total as u64, Some(shards as u16), Some(1000), Some(limit as u32));
                    if sales.contains_key(&sku(sale)) {
                        prop_assert!(r.is_ok() || r == Err(EngineError::Exists));
                    } else {
                        prop_assert!(r.is_ok());
                        sales.insert(sku(sale), MSale { total: total as i64, limit: limit as u32, fenced: false });
                    }
                }
                Op::Reserve { sale, user, req, qty } => {
                    let (s, u, rq) = (sku(sale), format!("user{user}"), format!("req{req}"));
                    let r = reserve(&e, &s, &u, &rq, qty as u32);
                    let Some(ms) = sales.get(&s) else {
                        prop_assert_eq!(r, Err(EngineError::NoSale));
                        continue;
                    };
                    if ms.fenced {
                        prop_assert_eq!(r, Err(EngineError::Fenced));
                        continue;
                    }
                    let tok = e.reservation_token(&s, &u, &rq);
                    let r = r.unwrap();
                    if res.contains_key(&tok) {
                        prop_assert!(matches!(r, ReserveOutcome::Replay { .. }), "{:?}", r);
                        continue;
                    }
                    let held: u32 = res.values().filter(|x| x.sku == s && x.user == u && x.state != ReservationState::Released).map(|x| x.qty).sum();
                    if ms.limit > 0 && held + qty as u32 > ms.limit {
                        prop_assert!(matches!(r, ReserveOutcome::Limit { .. }), "{:?}", r);
                        continue;
                    }
                    let info = e.sale_info(&s).unwrap();
                    match r {
                        ReserveOutcome::Reserved { token, expires_at_ms, .. } => {
                            prop_assert_eq!(&*token, tok.as_str());
                            prop_assert_eq!(expires_at_ms, now + 1000);
                            res.insert(tok.clone(), MRes { sku: s.clone(), user: u, qty: qty as u32, state: ReservationState::Reserved, expires: expires_at_ms });
                            tokens.push(tok);
                        }
                        ReserveOutcome::SoldOut => {
                            // Exact with any number of shards: units spread over several
                            // are gathered.
                            prop_assert!(info.available < qty as i64, "{:?}", info);
                        }
                        other => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                Op::Release { pick } if !tokens.is_empty() => {
                    let t = &tokens[pick as usize % tokens.len()];
                    let m = res.get_mut(t).unwrap();
                    let (did, _) = e.release(t);
                    prop_assert_eq!(did, m.state == ReservationState::Reserved);
                    if did { m.state = ReservationState::Released; }
                }
                Op::Commit { pick, verified } if !tokens.is_empty() => {
                    let t = &tokens[pick as usize % tokens.len()];
                    let m = res.get_mut(t).unwrap();
                    let check = if verified { PaymentCheck::LedgerVerified } else { PaymentCheck::Unverified };
                    let r = e.commit_with(t, check).map(|x| x.0);
                    let fenced = sales.get(&m.sku).is_some_and(|s| s.fenced);
                    match m.state {
                        ReservationState::Reserved if !verified && now > m.expires => {
                            prop_assert_eq!(r, Err(EngineError::LateCommit { expires_at_ms: m.expires }))
                        }
                        ReservationState::Reserved if fenced => prop_assert_eq!(r, Err(EngineError::Fenced)),
                        ReservationState::Reserved => { prop_assert_eq!(r, Ok(true)); m.state = ReservationState::Committed; }
                        ReservationState::Committed => prop_assert_eq!(r, Ok(false)),
                        ReservationState::Released => prop_assert_eq!(r, Err(EngineError::Released)),
                    }
                }
                Op::Extend { pick, ms } if !tokens.is_empty() => {
                    let t = &tokens[pick as usize % tokens.len()];
                    let m = res.get_mut(t).unwrap();
                    let r = e.extend(t, ms as u64).map(|x| x.0);
                    if m.state != ReservationState::Reserved {
                        prop_assert_eq!(r, Err(EngineError::NoReservation));
                    } else if m.expires <= now {
                        prop_assert_eq!(r, Err(EngineError::Expired));
                    } else {
                        prop_assert_eq!(r, Ok(now + ms as u64));
                        m.expires = now + ms as u64;
                    }
                }
                Op::Advance { ms } => clock.advance(ms as u64),
                Op::Adjust { sale, delta } => {
                    let s = sku(sale);
                    let r = e.adjust(&s, delta);
                    if let Some(ms) = sales.get_mut(&s) {
                        let out_of_range = delta.unsigned_abs() > MAX_TOTAL
                            || (delta > 0 && ms.total as u64 + delta as u64 > MAX_TOTAL);
                        if delta.unsigned_abs() > MAX_TOTAL {
                            prop_assert!(matches!(r, Err(EngineError::Argument(_))), "{:?}", r);
                        } else if ms.fenced {
                            prop_assert_eq!(r.map(|x| x.0), Err(EngineError::Fenced));
                        } else if out_of_range {
                            prop_assert!(matches!(r, Err(EngineError::Argument(_))), "{:?}", r);
                        } else if let Ok((total, _)) = r {
                            ms.total += delta;
                            prop_assert_eq!(total as i64, ms.total);
                        } else {
                            prop_assert_eq!(r.map(|x| x.0), Err(EngineError::NotEnoughAvailable));
                            prop_assert!(e.stock(&s).unwrap() < -delta);
                        }
                    }
                }
                Op::Tick => {
                    e.tick();
                    if auto {
                        for m in res.values_mut() {
                            if m.state == ReservationState::Reserved && m.expires <= now {
                                m.state = ReservationState::Released;
                            }
                        }
                    }
                }
                Op::Expired => {
                    let got: Vec<String> = e.expired(1000, None).into_iter().map(|r| r.token).collect();
                    let mut want: Vec<(u64, String)> = res.iter()
                        .filter(|(_, m)| m.state == ReservationState::Reserved && m.expires <= now)
                        .map(|(t, m)| (m.expires, t.clone())).collect();
                    want.sort();
                    let want: Vec<String> = want.into_iter().map(|x| x.1).collect();
                    prop_assert_eq!(got, want);
                }
                Op::Fence { sale } => {
                    let s = sku(sale);
                    if let Some(ms) = sales.get_mut(&s) {
                        e.fence(&s, None, None, None, None).unwrap();
                        ms.fenced = true;
                    }
                }
                Op::Roundtrip { sale } => {
                    let s = sku(sale);
                    let before = dump(&e);
                    match e.freeze(&s) {
                        Ok(_) => {
                            let x = e.export_sale(&s).unwrap();
                            e.drop_sale(&s).unwrap();
                            e.import_sale(&x).unwrap();
                            prop_assert_eq!(dump(&e), before);
                        }
                        Err(err) => {
                            prop_assert!(err == EngineError::NoSale || err == EngineError::Fenced, "{:?}", err)
                        }
                    }
                }
                Op::Rebuild { sale } => {
                    let s = sku(sale);
                    if let Some(ms) = sales.get_mut(&s) {
                        if ms.fenced {
                            let committed: u32 = res.values().filter(|m| m.sku == s && m.state == ReservationState::Committed).map(|m| m.qty).sum();
                            let fp = e.key_fingerprint().to_string();
                            let r = e.rebuild(&s, ms.total as u64, committed as u64, &fp);
                            prop_assert!(r.is_ok(), "{:?}", r);
                            ms.fenced = false;
                        }
                    }
                }
                _ => {}
            }
            // Invariants after every step.
            check_invariants(&e);
            for (s, ms) in &sales {
                let v = e.sale_info(s).unwrap();
                prop_assert_eq!(v.state == SaleState::Fenced, ms.fenced);
                if ms.fenced { continue; }
                prop_assert_eq!(v.total as i64, ms.total);
                let reserved: u32 = res.values().filter(|m| &m.sku == s && m.state == ReservationState::Reserved).map(|m| m.qty).sum();
                let committed: u32 = res.values().filter(|m| &m.sku == s && m.state == ReservationState::Committed).map(|m| m.qty).sum();
                prop_assert_eq!(v.reserved, reserved as u64);
                prop_assert_eq!(v.committed, committed as u64);
            }
        }
        // Recovery: replaying the log reproduces the state; so does snapshot + nothing.
        let events = sink.events.lock().clone();
        // A crash after any record: the state rebuilt from that prefix of the log keeps
        // every invariant (the log never holds a transition before its cause).
        if !events.is_empty() {
            let cut = crash_at.index(events.len() + 1);
            let crashed = replayed(&events[..cut], clock.clone());
            check_invariants(&crashed);
        }
        let again = replayed(&events, clock.clone());
        prop_assert_eq!(dump(&again), dump(&e));
        let (snap, _) = e.snapshot_with(|| ());
        let from_snap = replayed(&[], clock.clone());
        from_snap.load_snapshot(&snap);
        prop_assert_eq!(dump(&from_snap), dump(&e));
        prop_assert_eq!(e.expired(1000, None), from_snap.expired(1000, None));
    }
}

/// `cargo test --release -p stockgate-core --lib bench_reserve_path -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_reserve_path() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::new(
        EngineConfig::default(),
        clock,
        Arc::new(NullSink),
        keys(),
        reservation_key(),
    );
    e.create_sale("BIG", 1 << 40, Some(16), None, None).unwrap();
    let adm = e.keyring().mint("BIG", "u1", T0 + 3_600_000);
    let n = 1_000_000;
    let ids: Vec<String> = (0..n).map(|i| format!("req{i}")).collect();
    let t = std::time::Instant::now();
    for id in &ids {
        let r = e.reserve(&ReserveRequest {
            sku: "BIG",
            user: "u1",
            admission: adm.as_bytes(),
            request_id: id,
            qty: 1,
        });
        assert!(r.is_ok());
    }
    let el = t.elapsed();
    println!("reserve: {:.0} ns/op", el.as_nanos() as f64 / n as f64);
    let t = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(e.keyring().verify(&adm, "BIG", "u1").unwrap());
    }
    println!(
        "verify admission: {:.0} ns/op",
        t.elapsed().as_nanos() as f64 / n as f64
    );
    let t = std::time::Instant::now();
    for id in &ids[..n / 10] {
        std::hint::black_box(e.reservation_token("BIG", "u1", id));
    }
    println!(
        "derive token: {:.0} ns/op",
        t.elapsed().as_nanos() as f64 / (n / 10) as f64
    );
}

#[test]
fn a_purged_request_replays_and_keeps_its_limit_across_restarts() {
    let (e, c, sink) = engine_with(false, 1_000);
    e.create_sale("S", 10, Some(1), Some(100_000), Some(1))
        .unwrap();
    let paid = reserve(&e, "S", "alice", "order-1", 1).unwrap();
    let t = token_of(&paid);
    assert!(e.commit(&t).unwrap().0);
    let gone = reserve(&e, "S", "bob", "order-2", 1).unwrap();
    assert!(e.release(&token_of(&gone)).0);
    c.advance(5_000);
    e.tick();
    assert!(e.reservation(&t).is_none(), "retention purged the record");
    let check = |e: &Engine| {
        // The paid request replays (same token), takes nothing; the limit still counts
        // the paid unit; the released request replays too.
        let again = reserve(e, "S", "alice", "order-1", 1).unwrap();
        assert!(matches!(again, ReserveOutcome::Replay { .. }), "{again:?}");
        assert_eq!(token_of(&again), t);
        assert!(matches!(
            reserve(e, "S", "alice", "order-3", 1).unwrap(),
            ReserveOutcome::Limit { .. }
        ));
        assert!(matches!(
            reserve(e, "S", "bob", "order-2", 1).unwrap(),
            ReserveOutcome::Replay { .. }
        ));
        let v = e.sale_info("S").unwrap();
        assert_eq!((v.available, v.committed, v.reserved), (9, 1, 0));
    };
    check(&e);
    // After a restart by replay of the log, and from a snapshot.
    let events = sink.events.lock().clone();
    check(&replayed(&events, c.clone()));
    let (snap, _) = e.snapshot_with(|| ());
    assert_eq!(snap.tombs.len(), 2);
    let from_snap = replayed(&[], c.clone());
    from_snap.load_snapshot(&snap);
    check(&from_snap);
}

#[test]
fn restore_puts_back_paid_and_cancelled_orders() {
    let (e, c, sink) = engine(false);
    e.create_sale("S", 10, Some(2), Some(100_000), Some(2))
        .unwrap();
    e.fence("S", None, None, None, None).unwrap();
    let now = c.now_ms();
    let (new, paid, _) = e
        .restore(
            "S",
            "alice",
            "o1",
            2,
            now + 50,
            now,
            ReservationState::Committed,
        )
        .unwrap();
    assert!(new);
    let (_, cancelled, _) = e
        .restore(
            "S",
            "bob",
            "o2",
            1,
            now + 50,
            now,
            ReservationState::Released,
        )
        .unwrap();
    let (_, pending, _) = e
        .restore(
            "S",
            "carol",
            "o3",
            1,
            now + 50,
            now,
            ReservationState::Reserved,
        )
        .unwrap();
    // Restoring again changes nothing.
    assert!(
        !e.restore(
            "S",
            "alice",
            "o1",
            2,
            now + 50,
            now,
            ReservationState::Committed
        )
        .unwrap()
        .0
    );
    let fp = e.key_fingerprint().to_string();
    assert_eq!(e.rebuild("S", 10, 2, &fp).unwrap().0, 7);
    let check = |e: &Engine| {
        assert_eq!(
            e.reservation(&paid).unwrap().0.state,
            ReservationState::Committed
        );
        assert_eq!(
            e.reservation(&cancelled).unwrap().0.state,
            ReservationState::Released
        );
        assert_eq!(
            e.reservation(&pending).unwrap().0.state,
            ReservationState::Reserved
        );
        for (user, rid) in [("alice", "o1"), ("bob", "o2"), ("carol", "o3")] {
            assert!(matches!(
                reserve(e, "S", user, rid, 1).unwrap(),
                ReserveOutcome::Replay { .. }
            ));
        }
        // alice paid for 2 with a limit of 2: a new request hits the limit.
        assert!(matches!(
            reserve(e, "S", "alice", "o9", 1).unwrap(),
            ReserveOutcome::Limit { .. }
        ));
        // The paid hold is never committed again, nor released into stock.
        assert_eq!(
            e.commit(&paid),
            Ok((false, e.reservation(&paid).unwrap().1))
        );
        check_invariants(e);
    };
    check(&e);
    assert!(!e.release(&paid).0);
    let v = e.sale_info("S").unwrap();
    assert_eq!((v.available, v.reserved, v.committed), (7, 1, 2));
    let events = sink.events.lock().clone();
    let again = replayed(&events, c.clone());
    assert_eq!(dump(&again), dump(&e));
}

#[test]
fn adjust_refuses_deltas_beyond_any_total() {
    let (e, _c, _s) = engine(false);
    e.create_sale("S", 100, Some(4), None, None).unwrap();
    for d in [i64::MIN, i64::MIN + 1, i64::MAX, MAX_TOTAL as i64 + 1] {
        assert!(
            matches!(e.adjust("S", d), Err(EngineError::Argument(_))),
            "{d}"
        );
    }
    assert_eq!(e.sale_info("S").unwrap().total, 100);
    check_invariants(&e);
}

#[test]
fn no_op_replies_wait_for_the_records_they_report() {
    let (e, _c, sink) = engine(false);
    let created = e.create_sale("S", 10, None, None, None).unwrap();
    assert_eq!(e.create_sale("S", 10, None, None, None).unwrap(), created);
    let paused = e.set_paused("S", true).unwrap();
    assert_eq!(e.set_paused("S", true).unwrap(), paused);
    assert_eq!(e.adjust("S", 0).unwrap().1, paused);
    assert_eq!(e.last_lsn(), sink.events.lock().len() as Lsn);
}

/// Each way a hold ends logs who held it and, for a release, why: the feed entry made
/// from the record needs nothing else.
#[test]
fn finishes_log_the_holder_and_the_reason() {
    let (e, c, sink) = engine(true);
    e.create_sale("S", 20, Some(2), Some(100), None).unwrap();
    let paid = token_of(&reserve(&e, "S", "ann", "r1", 2).unwrap());
    let cancel = token_of(&reserve(&e, "S", "bob", "r2", 1).unwrap());
    let admin = token_of(&reserve(&e, "S", "cat", "r3", 1).unwrap());
    let late = token_of(&reserve(&e, "S", "dan", "r4", 3).unwrap());
    e.commit(&paid).unwrap();
    e.release(&cancel);
    e.release_with(&admin, Some(ReleaseReason::Admin));
    c.advance(100);
    e.tick();
    e.fence("S", None, None, None, None).unwrap();
    let now = c.now_ms();
    let (_, restored, _) = e
        .restore(
            "S",
            "eve",
            "r5",
            1,
            now + 50,
            now,
            ReservationState::Released,
        )
        .unwrap();
    let log = sink.events.lock().clone();
    let released = |token: &str| {
        log.iter().find_map(|ev| match ev {
            Event::Released {
                token: t,
                user,
                request_id,
                qty,
                reason,
                ..
            } if t == token => Some((user.clone(), request_id.clone(), *qty, *reason)),
            _ => None,
        })
    };
    let holder = |u: &str, r: &str, q: u32, why| Some((u.to_string(), r.to_string(), q, why));
    assert_eq!(
        released(&cancel),
        holder("bob", "r2", 1, ReleaseReason::Cancel)
    );
    assert_eq!(
        released(&admin),
        holder("cat", "r3", 1, ReleaseReason::Admin)
    );
    assert_eq!(
        released(&late),
        holder("dan", "r4", 3, ReleaseReason::Expired)
    );
    assert_eq!(
        released(&restored),
        holder("eve", "r5", 1, ReleaseReason::Rebuild)
    );
    assert!(log.iter().any(|ev| matches!(ev,
        Event::Committed { token, user, request_id, qty: 2, .. }
            if **token == *paid && user == "ann" && request_id == "r1")));
}

/// A sink whose `record` waits at a gate: a RESERVE stands between taking its units and
/// having a log position for as long as the test likes.
#[derive(Default)]
struct GatedSink {
    open: Mutex<bool>,
    cv: std::sync::Condvar,
    gate: std::sync::Mutex<()>,
    n: std::sync::atomic::AtomicU64,
}

impl EventSink for GatedSink {
    fn record(&self, _event: &EventRef<'_>) -> Lsn {
        let mut g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        while !*self.open.lock() {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        self.n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    fn last_lsn(&self) -> Lsn {
        self.n.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A reader on another thread that sees a RESERVE's units gone waits, through
/// `observed_lsn`, for that RESERVE's record: its reply never reports a state a crash
/// could still erase.
#[test]
fn observed_lsn_covers_units_taken_before_their_record() {
    let sink = Arc::new(GatedSink::default());
    *sink.open.lock() = true;
    let clock = Arc::new(ManualClock::new(T0));
    let e = Arc::new(Engine::new(
        EngineConfig::default(),
        clock,
        sink.clone(),
        keys(),
        reservation_key(),
    ));
    e.create_sale("S", 10, Some(1), None, None).unwrap();
    let created = sink.last_lsn();
    *sink.open.lock() = false;
    let buyer = {
        let e = e.clone();
        std::thread::spawn(move || reserve(&e, "S", "u", "r", 1).unwrap())
    };
    // The units are gone while the record waits at the gate.
    while e.stock("S").unwrap() == 10 {
        std::thread::yield_now();
    }
    assert_eq!(e.last_lsn(), created, "no position yet for the RESERVE");
    let reader = {
        let e = e.clone();
        std::thread::spawn(move || e.observed_lsn())
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !reader.is_finished(),
        "observed_lsn returned before the record"
    );
    {
        let _g = sink.gate.lock().unwrap_or_else(|p| p.into_inner());
        *sink.open.lock() = true;
        sink.cv.notify_all();
    }
    buyer.join().unwrap();
    assert!(reader.join().unwrap() > created);
}

/// A second engine with the same keys (another group's), recording its own log.
fn other_group(clock: Arc<ManualClock>) -> (Engine, Arc<RecordingSink>) {
    let sink = Arc::new(RecordingSink::default());
    let cfg = EngineConfig {
        retention_ms: 50_000,
        ..EngineConfig::default()
    };
    let e = Engine::new(cfg, clock, sink.clone(), keys(), reservation_key());
    (e, sink)
}

/// Source `S` with a live hold (alice), a committed one (bob), a released one (carol),
/// a purged committed one (dave, a tombstone) and a per-user limit of 2.
fn sale_to_move() -> (Engine, Arc<ManualClock>, [Arc<str>; 4]) {
    let (a, c, _) = engine_with(false, 1_000);
    a.create_sale("S", 10, Some(2), Some(100_000), Some(2))
        .unwrap();
    let dave = token_of(&reserve(&a, "S", "dave", "d1", 1).unwrap());
    assert!(a.commit(&dave).unwrap().0);
    c.advance(5_000);
    a.tick();
    assert!(a.reservation(&dave).is_none(), "purged into a tombstone");
    let alice = token_of(&reserve(&a, "S", "alice", "a1", 2).unwrap());
    let bob = token_of(&reserve(&a, "S", "bob", "b1", 1).unwrap());
    assert!(a.commit(&bob).unwrap().0);
    let carol = token_of(&reserve(&a, "S", "carol", "c1", 1).unwrap());
    assert!(a.release(&carol).0);
    (a, c, [alice, bob, carol, dave])
}

#[test]
fn handover_frozen_sale_refuses_every_write() {
    let (a, c, [alice, bob, ..]) = sale_to_move();
    a.freeze("S").unwrap();
    let moving = Some(EngineError::Moving("S".into()));
    assert_eq!(reserve(&a, "S", "erin", "e1", 1).err(), moving);
    assert_eq!(a.commit(&alice).err(), moving);
    assert_eq!(a.try_release_with(&alice, None).err(), moving);
    assert_eq!(a.extend(&alice, 1_000).err(), moving);
    assert_eq!(a.adjust("S", 5).err(), moving);
    assert_eq!(a.set_paused("S", true).err(), moving);
    assert_eq!(
        a.fence("S", None, None, None, None),
        Err(EngineError::Moving("S".into()))
    );
    // Reads answer; a retry of an answered request replays.
    assert_eq!(a.sale_info("S").unwrap().state.as_str(), "MOVING");
    assert!(a.reservation(&alice).is_some());
    assert!(matches!(
        reserve(&a, "S", "bob", "b1", 1).unwrap(),
        ReserveOutcome::Replay { .. }
    ));
    // Expiry waits: even past alice's deadline, auto-release frees nothing.
    let (b, cb, _) = engine(true);
    b.create_sale("T", 3, Some(1), Some(1_000), None).unwrap();
    let t = token_of(&reserve(&b, "T", "u", "r", 1).unwrap());
    b.freeze("T").unwrap();
    cb.advance(10_000);
    b.tick();
    assert_eq!(
        b.reservation(&t).unwrap().0.state,
        ReservationState::Reserved
    );
    assert_eq!(b.stock("T").unwrap(), 2);
    // Thaw: back to open, writes work again.
    a.thaw("S").unwrap();
    assert_eq!(a.sale_info("S").unwrap().state, SaleState::Open);
    assert!(!a.commit(&bob).unwrap().0, "a commit replays");
    assert!(a.commit(&alice).unwrap().0);
    // A paused sale thaws paused.
    a.set_paused("S", true).unwrap();
    a.freeze("S").unwrap();
    assert_eq!(a.export_sale("S").unwrap().sale.state, SaleState::Paused);
    a.thaw("S").unwrap();
    assert_eq!(a.sale_info("S").unwrap().state, SaleState::Paused);
    // Export and drop need a frozen sale; a fenced one cannot freeze.
    assert_eq!(a.export_sale("S"), Err(EngineError::NotMoving));
    assert_eq!(a.drop_sale("S"), Err(EngineError::NotMoving));
    a.fence("S", None, None, None, None).unwrap();
    assert_eq!(a.freeze("S"), Err(EngineError::Fenced));
    drop(c);
}

#[test]
fn handover_moves_every_token_and_the_limit() {
    let (a, c, [alice, bob, carol, dave]) = sale_to_move();
    let before = a.sale_info("S").unwrap();
    a.freeze("S").unwrap();
    let export = a.export_sale("S").unwrap();
    assert_eq!(
        export,
        a.export_sale("S").unwrap(),
        "same state, same export"
    );
    let (b, b_log) = other_group(c.clone());
    b.import_sale(&export).unwrap();
    // Same export again: Ok, nothing logged.
    let logged = b_log.events.lock().len();
    b.import_sale(&export).unwrap();
    assert_eq!(b_log.events.lock().len(), logged);
    a.drop_sale("S").unwrap();
    assert_eq!(a.sale_info("S"), Err(EngineError::NoSale));
    assert!(a.reservation(&alice).is_none());
    assert_eq!(a.reservation_count(), 0);

    let check = |b: &Engine| {
        assert_eq!(b.sale_info("S").unwrap(), before);
        // Retries replay with the same tokens: the live hold, the paid, the released,
        // and the purged one.
        for (user, rid, t) in [
            ("alice", "a1", &alice),
            ("bob", "b1", &bob),
            ("carol", "c1", &carol),
            ("dave", "d1", &dave),
        ] {
            let again = reserve(b, "S", user, rid, 1).unwrap();
            assert!(matches!(again, ReserveOutcome::Replay { .. }), "{again:?}");
            assert_eq!(&token_of(&again), t);
        }
        // Alice holds 2 of her limit of 2: refused on B too.
        assert!(matches!(
            reserve(b, "S", "alice", "a2", 1).unwrap(),
            ReserveOutcome::Limit { held: 2, .. }
        ));
        assert!(!b.commit(&bob).unwrap().0, "a commit replays");
        assert_eq!(b.commit(&carol), Err(EngineError::Released));
        assert!(!b.commit(&dave).unwrap().0, "the tombstone replays");
    };
    check(&b);
    // Replay of B's log (a restart, a Raft follower) gives the same, and so does a
    // snapshot taken of the replayed engine.
    let events = b_log.events.lock().clone();
    let replayed_b = replayed(&events, c.clone());
    assert_eq!(dump(&replayed_b), dump(&b));
    check(&replayed_b);
    let (snap, _) = replayed_b.snapshot_with(|| ());
    let from_snap = replayed(&[], c.clone());
    from_snap.load_snapshot(&snap);
    check(&from_snap);
    // The live hold commits on B, once.
    assert!(b.commit(&alice).unwrap().0);
    let v = b.sale_info("S").unwrap();
    assert_eq!((v.available, v.reserved, v.committed), (6, 0, 4));
    check_invariants(&b);
    // Importing the old export now (the sale changed since): still the same handover.
    assert!(b.import_sale(&export).is_ok());
}

#[test]
fn handover_refuses_another_key_and_another_state() {
    let (a, c, _) = sale_to_move();
    a.freeze("S").unwrap();
    let export = a.export_sale("S").unwrap();
    let other_key = Engine::new(
        EngineConfig::default(),
        c.clone(),
        Arc::new(NullSink),
        keys(),
        ReservationKey::from_bytes(&[7u8; 32]),
    );
    assert!(matches!(
        other_key.import_sale(&export),
        Err(EngineError::Import(_))
    ));
    assert_eq!(other_key.list_sales(), Vec::<String>::new());
    let (b, _) = other_group(c.clone());
    b.create_sale("S", 10, Some(2), Some(100_000), Some(2))
        .unwrap();
    assert!(matches!(
        b.import_sale(&export),
        Err(EngineError::Import(_))
    ));
    let mut foreign = export.clone();
    foreign.reservations[0].sku = "X".into();
    let mut twice = export.clone();
    twice.reservations.push(twice.reservations[0].clone());
    let mut forged = export.clone();
    forged.reservations[0].user = "mallory".into();
    let mut no_shards = export.clone();
    no_shards.sale.params.shards = 0;
    no_shards.sale.shard_available.clear();
    let (d, _) = other_group(c);
    for bad in [&foreign, &twice, &forged, &no_shards] {
        assert!(matches!(d.import_sale(bad), Err(EngineError::Import(_))));
    }
    assert_eq!(d.list_sales(), Vec::<String>::new());
    assert!(d.import_sale(&export).is_ok());
}

#[test]
fn handover_drop_replays() {
    let (a, c, sink) = engine(false);
    a.create_sale("S", 5, Some(1), None, Some(1)).unwrap();
    a.create_sale("K", 5, Some(1), None, None).unwrap();
    let t = token_of(&reserve(&a, "S", "u", "r", 1).unwrap());
    let keep = token_of(&reserve(&a, "K", "u", "r", 1).unwrap());
    a.freeze("S").unwrap();
    a.drop_sale("S").unwrap();
    let events = sink.events.lock().clone();
    let r = replayed(&events, c);
    assert_eq!(dump(&r), dump(&a));
    assert_eq!(r.list_sales(), vec!["K".to_string()]);
    assert!(r.reservation(&t).is_none());
    assert!(r.reservation(&keep).is_some());
    // Recreated afterwards, the user's limit starts from nothing.
    r.create_sale("S", 5, Some(1), None, Some(1)).unwrap();
    assert!(matches!(
        reserve(&r, "S", "u", "r2", 1).unwrap(),
        ReserveOutcome::Reserved { .. }
    ));
}

// RESERVE of several units: a sale that has them grants them, however they are spread
// over its shards (they are gathered into one by a logged zero-sum move).

/// Each shard's counters, in shard order.
fn shard_counts(e: &Engine, sku: &str) -> Vec<sale::ShardCounts> {
    let s = e.sale(sku).unwrap();
    (0..s.shard_count()).map(|i| s.shard(i)).collect()
}

/// Every `SaleAdjusted` a RESERVE logged is a move: its deltas sum to zero.
fn moves_are_zero_sum(events: &[Event]) -> usize {
    let mut moves = 0;
    for ev in events {
        if let Event::SaleAdjusted { shard_deltas, .. } = ev {
            assert_eq!(shard_deltas.iter().sum::<i64>(), 0, "{ev:?}");
            moves += 1;
        }
    }
    moves
}

/// Units each shard holds for the sale's live reservations, from the reservations
/// themselves: a hold stays on the shard it names.
fn held_per_shard(e: &Engine, sku: &str, live: &[(Arc<str>, u32)]) -> Vec<i64> {
    let mut per = vec![0i64; e.sale(sku).unwrap().shard_count()];
    for (t, q) in live {
        let (view, _) = e.reservation(t).unwrap();
        assert_eq!(view.state, ReservationState::Reserved);
        assert_eq!(view.qty, *q);
        per[view.shard as usize] += i64::from(*q);
    }
    per
}

#[test]
fn multi_unit_reserve_gathers_units_spread_over_shards() {
    let (e, c, sink) = engine(false);
    // One unit per shard: no shard alone has two.
    e.create_sale("S", 16, Some(16), None, None).unwrap();
    let mut live = Vec::new();
    for i in 0..8 {
        let r = reserve(&e, "S", &format!("u{i}"), "r", 2).unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{i}: {r:?}");
        live.push((token_of(&r), 2));
    }
    assert_eq!(
        reserve(&e, "S", "u8", "r", 2).unwrap(),
        ReserveOutcome::SoldOut
    );
    assert_eq!(
        reserve(&e, "S", "u9", "r", 1).unwrap(),
        ReserveOutcome::SoldOut
    );
    assert_eq!(e.stock("S").unwrap(), 0);
    let v = e.sale_info("S").unwrap();
    assert_eq!(
        (v.total, v.available, v.reserved, v.committed),
        (16, 0, 16, 0)
    );
    let reserved: Vec<i64> = shard_counts(&e, "S").iter().map(|c| c.reserved).collect();
    assert_eq!(reserved, held_per_shard(&e, "S", &live));
    check_invariants(&e);
    assert_eq!(moves_are_zero_sum(&sink.events.lock()), 8);
    let again = replayed(&sink.events.lock().clone(), c.clone());
    assert_eq!(shard_counts(&again, "S"), shard_counts(&e, "S"));
    assert_eq!(dump(&again), dump(&e));
    // A release and a commit go to the shard the units were gathered into.
    assert!(e.release(&live[0].0).0);
    assert!(e.commit(&live[1].0).unwrap().0);
    let r = reserve(&e, "S", "u10", "r", 2).unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    check_invariants(&e);
    let again = replayed(&sink.events.lock().clone(), c);
    assert_eq!(shard_counts(&again, "S"), shard_counts(&e, "S"));
    assert_eq!(dump(&again), dump(&e));
}

#[test]
fn multi_unit_reserve_gathers_within_the_user_limit() {
    let (e, c, sink) = engine(false);
    e.create_sale("S", 8, Some(8), None, Some(4)).unwrap();
    let r = reserve(&e, "S", "alice", "r1", 3).unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    assert!(matches!(
        reserve(&e, "S", "alice", "r2", 2).unwrap(),
        ReserveOutcome::Limit { .. }
    ));
    let r = reserve(&e, "S", "bob", "r1", 4).unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    assert_eq!(
        reserve(&e, "S", "carol", "r1", 2).unwrap(),
        ReserveOutcome::SoldOut
    );
    let r = reserve(&e, "S", "carol", "r2", 1).unwrap();
    assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
    check_invariants(&e);
    let again = replayed(&sink.events.lock().clone(), c);
    assert_eq!(shard_counts(&again, "S"), shard_counts(&e, "S"));
    assert_eq!(dump(&again), dump(&e));
}

#[derive(Clone, Debug)]
enum UnitsOp {
    Reserve(u32),
    Release(u16),
    Commit(u16),
}

fn units_op() -> impl Strategy<Value = UnitsOp> {
    prop_oneof![
        4 => (1u32..=8).prop_map(UnitsOp::Reserve),
        1 => any::<u16>().prop_map(UnitsOp::Release),
        1 => any::<u16>().prop_map(UnitsOp::Commit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Few units per shard, random multi-unit RESERVEs (fresh buyer and request each, no
    /// limit), RELEASEs and COMMITs: a RESERVE of q succeeds exactly when the model has
    /// q available, the counters add up after every step, and replaying the log gives
    /// the same counters on every shard and the same reservations.
    #[test]
    fn multi_unit_model(total in 1u64..=64, shards in 1u16..=16, ops in proptest::collection::vec(units_op(), 1..80)) {
        let (e, c, sink) = engine(false);
        e.create_sale("S", total, Some(shards), Some(1000), None).unwrap();
        let (mut available, mut reserved, mut committed) = (total as i64, 0i64, 0i64);
        let mut live: Vec<(Arc<str>, u32)> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                UnitsOp::Reserve(q) => {
                    let r = reserve(&e, "S", &format!("u{step}"), &format!("r{step}"), q).unwrap();
                    if available >= i64::from(q) {
                        prop_assert!(matches!(r, ReserveOutcome::Reserved { .. }), "q {} of {}: {:?}", q, available, r);
                        live.push((token_of(&r), q));
                        available -= i64::from(q);
                        reserved += i64::from(q);
                    } else {
                        prop_assert_eq!(r, ReserveOutcome::SoldOut);
                    }
                }
                UnitsOp::Release(pick) if !live.is_empty() => {
                    let (t, q) = live.swap_remove(pick as usize % live.len());
                    prop_assert!(e.release(&t).0);
                    available += i64::from(q);
                    reserved -= i64::from(q);
                }
                UnitsOp::Commit(pick) if !live.is_empty() => {
                    let (t, q) = live.swap_remove(pick as usize % live.len());
                    prop_assert_eq!(e.commit(&t).map(|x| x.0), Ok(true));
                    committed += i64::from(q);
                    reserved -= i64::from(q);
                }
                _ => {}
            }
            let v = e.sale_info("S").unwrap();
            prop_assert_eq!((v.available, v.reserved as i64, v.committed as i64), (available, reserved, committed));
            prop_assert_eq!(v.available + v.reserved as i64 + v.committed as i64, total as i64);
            prop_assert_eq!(v.total, total);
            prop_assert!(v.shard_available.iter().all(|&a| a >= 0), "{:?}", v);
        }
        let counts = shard_counts(&e, "S");
        let on_shards: Vec<i64> = counts.iter().map(|c| c.reserved).collect();
        prop_assert_eq!(on_shards, held_per_shard(&e, "S", &live));
        let events = sink.events.lock().clone();
        moves_are_zero_sum(&events);
        let again = replayed(&events, c);
        prop_assert_eq!(shard_counts(&again, "S"), counts);
        prop_assert_eq!(dump(&again), dump(&e));
    }
}

/// Buyers on several threads reserve 1–4 units (and release some) from a sale with a
/// few units per shard: never more than the total handed out, no token twice, counters
/// that add up, and once they stop every unit left is still sellable, all in one
/// RESERVE. Replay reaches the same per-shard counters.
#[test]
fn multi_unit_storm_never_oversells_and_strands_nothing() {
    use rand::Rng;
    let mut moves = 0;
    for round in 0..150u64 {
        let (e, c, sink) = engine(false);
        let e = Arc::new(e);
        let total = 16 + round % 33;
        e.create_sale("S", total, Some(16), None, None).unwrap();
        let hs: Vec<_> = (0..6)
            .map(|t| {
                let e = e.clone();
                std::thread::spawn(move || {
                    let mut rng = rand::thread_rng();
                    let (mut kept, mut handed) = (Vec::new(), Vec::new());
                    for i in 0..60 {
                        let q = rng.gen_range(1..=4u32);
                        let u = format!("u{t}-{i}");
                        if let Ok(ReserveOutcome::Reserved { token, .. }) =
                            reserve(&e, "S", &u, "r", q)
                        {
                            let tok: Arc<str> = token.as_str().into();
                            handed.push(tok.clone());
                            kept.push((tok, q));
                        }
                        if !kept.is_empty() && rng.gen_ratio(1, 4) {
                            let (tok, _) = kept.swap_remove(rng.gen_range(0..kept.len()));
                            assert!(e.release(&tok).0);
                        }
                    }
                    (kept, handed)
                })
            })
            .collect();
        let mut live: Vec<(Arc<str>, u32)> = Vec::new();
        let mut handed: Vec<Arc<str>> = Vec::new();
        for h in hs {
            let (k, t) = h.join().unwrap();
            live.extend(k);
            handed.extend(t);
        }
        let n = handed.len();
        handed.sort();
        handed.dedup();
        assert_eq!(handed.len(), n, "no token twice");
        let held: i64 = live.iter().map(|(_, q)| i64::from(*q)).sum();
        assert!(held <= total as i64, "{held} of {total}");
        let v = e.sale_info("S").unwrap();
        assert_eq!(
            (v.reserved as i64, v.available),
            (held, total as i64 - held)
        );
        let on_shards: Vec<i64> = shard_counts(&e, "S").iter().map(|c| c.reserved).collect();
        assert_eq!(on_shards, held_per_shard(&e, "S", &live));
        check_invariants(&e);
        // Nothing stranded: one unit, then all the rest in one RESERVE.
        let left = v.available;
        if left >= 1 {
            let r = reserve(&e, "S", "late", "r", 1).unwrap();
            assert!(matches!(r, ReserveOutcome::Reserved { .. }), "{r:?}");
        }
        if left >= 2 {
            let r = reserve(&e, "S", "last", "r", (left - 1) as u32).unwrap();
            assert!(
                matches!(r, ReserveOutcome::Reserved { .. }),
                "{left}: {r:?}"
            );
        }
        assert_eq!(e.stock("S").unwrap(), 0);
        assert_eq!(
            reserve(&e, "S", "none", "r", 1).unwrap(),
            ReserveOutcome::SoldOut
        );
        check_invariants(&e);
        let events = sink.events.lock().clone();
        moves += moves_are_zero_sum(&events);
        let again = replayed(&events, c);
        assert_eq!(shard_counts(&again, "S"), shard_counts(&e, "S"));
        assert_eq!(dump(&again), dump(&e));
    }
    assert!(moves > 0, "the storm never gathered units");
}

// ---- Waiting rooms ----

use crate::room::{RoomConfig, Status};

fn room_cfg() -> RoomConfig {
    RoomConfig {
        max_rate_per_sec: 1000,
        admit_ttl_ms: 30_000,
        max_waiting: 20,
        ..RoomConfig::default()
    }
}

/// Every user's status in the room, by the user's own ticket.
fn room_statuses(e: &Engine, tickets: &[(String, String)]) -> Vec<Status> {
    tickets
        .iter()
        .map(|(u, t)| e.room_status("S", u, t).unwrap().0)
        .collect()
}

/// Joins, admissions bounded by stock, a RESERVE using an admission, a release admitting
/// the next: every change is a logged op, and replaying the log (or loading a snapshot
/// then the rest of the log) gives the same rooms.
#[test]
fn room_ops_are_logged_and_replay_to_the_same_room() {
    let (e, clock, sink) = engine(false);
    e.create_sale("S", 3, Some(1), None, None).unwrap();
    e.open_room("S", room_cfg()).unwrap();
    assert_eq!(e.open_room("S", room_cfg()).map(|_| ()), Ok(()));
    let other = RoomConfig {
        max_waiting: 5,
        ..room_cfg()
    };
    assert_eq!(e.open_room("S", other), Err(EngineError::RoomExists));
    let mut tickets = Vec::new();
    for i in 0..8 {
        let u = format!("u{i}");
        let (t, _, _) = e.room_join("S", &u).unwrap();
        let (again, _, _) = e.room_join("S", &u).unwrap();
        assert_eq!(t, again, "a repeated join answers the same ticket");
        tickets.push((u, t.text));
    }
    let info = e.room_info("S").unwrap();
    assert_eq!(
        (info.waiting, info.admitted),
        (5, 3),
        "admitted up to stock"
    );
    let st = room_statuses(&e, &tickets);
    assert!(matches!(st[0], Status::Admitted { .. }));
    assert!(matches!(st[3], Status::Waiting { position: 1, .. }));
    // u0 reserves with its admission: used, and the room keeps the budget at stock.
    let tok = match reserve(&e, "S", "u0", "r0", 1).unwrap() {
        ReserveOutcome::Reserved { token, .. } => token.as_str().to_string(),
        o => panic!("{o:?}"),
    };
    assert_eq!(room_statuses(&e, &tickets)[0], Status::Reserved);
    assert_eq!(e.room_info("S").unwrap().admitted, 2);
    // Its release gives the unit back: the next in line is admitted.
    clock.advance(10);
    assert!(e.release(&tok).0);
    assert!(matches!(
        room_statuses(&e, &tickets)[3],
        Status::Admitted { .. }
    ));
    assert!(e.room_leave("S", "u7").unwrap().0);
    assert!(!e.room_leave("S", "u7").unwrap().0, "leave is idempotent");
    // An unused admission expires on the tick and frees its budget.
    clock.advance(31_000);
    e.tick();
    assert_eq!(room_statuses(&e, &tickets)[1], Status::Expired);

    let events = sink.events.lock().clone();
    assert!(events
        .iter()
        .any(|ev| matches!(ev, Event::RoomOpened { .. })));
    let replay = replayed(&events, clock.clone());
    assert_eq!(
        room_statuses(&replay, &tickets),
        room_statuses(&e, &tickets)
    );
    assert_eq!(replay.room_info("S"), e.room_info("S"));
    let (snap, _) = e.snapshot_with(|| ());
    assert_eq!(snap.rooms.len(), 1);
    let loaded = replayed(&[], clock.clone());
    loaded.load_snapshot(&snap);
    assert_eq!(
        room_statuses(&loaded, &tickets),
        room_statuses(&e, &tickets)
    );
    assert_eq!(loaded.snapshot_with(|| ()).0.rooms, snap.rooms);
    // The snapshot's bytes load to the same rooms.
    let bytes = crate::wal::snapshot::encode_snapshot(&snap, 7);
    let (_, back) = crate::wal::snapshot::decode_snapshot(&bytes).unwrap();
    assert_eq!(back.rooms, snap.rooms);
}

#[test]
fn room_refusals_are_typed() {
    let (e, _clock, _sink) = engine(false);
    assert_eq!(
        e.open_room("S", room_cfg()).map(|_| ()),
        Err(EngineError::NoSale)
    );
    e.create_sale("S", 0, Some(1), None, None).unwrap();
    assert_eq!(e.room_join("S", "u").map(|_| ()), Err(EngineError::NoRoom));
    let bad = RoomConfig {
        max_rate_per_sec: 0,
        ..room_cfg()
    };
    assert!(matches!(
        e.open_room("S", bad),
        Err(EngineError::RoomConfig(_))
    ));
    e.open_room("S", room_cfg()).unwrap();
    // Nothing available, nothing held: a new buyer is not queued.
    assert_eq!(
        e.room_join("S", "u").map(|_| ()),
        Err(EngineError::Room(crate::room::RoomError::SoldOut))
    );
    e.adjust("S", 1).unwrap();
    let (t, _, _) = e.room_join("S", "u").unwrap();
    assert!(matches!(
        e.room_status("S", "v", &t.text),
        Err(EngineError::Room(crate::room::RoomError::Ticket(_)))
    ));
}
