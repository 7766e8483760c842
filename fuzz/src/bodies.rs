//! Bodies of the fuzz targets, one public function per target, plus the seed corpus.
//!
//! Shared by the cargo-fuzz binaries in `fuzz/fuzz_targets/` and by the deterministic test
//! `tests/wal/fuzz_corpus_replay.rs`, which includes this file with `#[path]` and replays every
//! file of `fuzz/corpus/*/` and `fuzz/regressions/*/` through the same functions. So this
//! file may only use `std`, `bytes`, `openraft`, `serde` and `stockgate_server` (what
//! both crates have).
//!
//! A body returns normally for every input; a panic (failed assertion included) is a
//! finding.
//!
//! - [`resp_frame`]: the bytes are what one client sent. They are parsed with small
//!   [`Limits`] and every command is dispatched to a real in-memory engine, as a connection
//!   would; the engine's invariants are checked after every command, and at the end the
//!   state must survive a snapshot file round trip, a snapshot load, and a WAL replay.
//! - [`admission_token`]: `token \n sku \n user \n keyring-text`, through
//!   `Keyring::verify`, `Keyring::parse` and `ReservationKey::from_file_bytes`.
//! - [`wal_record`]: the bytes as a WAL record, a record sequence, a bare payload, a
//!   snapshot file and a bare snapshot payload; whatever decodes, `decode(encode(x)) ==
//!   x`, and the encoder gives back the very bytes unless they are of an older format.
//! - [`raft_frame`]: the bytes a Raft peer sends, as one frame body and as a stream of
//!   length-prefixed frames, requests and replies.
//! - [`stream_commands`]: the bytes one client sent, run against a real engine, WAL and
//!   order feed after a fixed setup (entries in the streams, consumer groups); a restart
//!   must rebuild the same state.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::{Bytes, BytesMut};
use openraft::MessageSummary;
use stockgate_core::engine::event::{EventKind, EventRef};
use stockgate_core::engine::token::{self, Denied};
use stockgate_core::engine::{
    ident, Clock, Engine, EngineConfig, Event, EventSink, Keyring, Lsn, ManualClock, NullSink,
    ReleaseReason, ReservationKey, ReservationState, SaleExport, SaleState, SaleView, Snapshot,
};
use stockgate_core::wal::record::{
    decode_payload, decode_record, encode_payload, encode_record, RecordError, MAX_PAYLOAD,
};
use stockgate_core::wal::segment::{
    parse_segment_name, parse_snapshot_name, segment_file_name, snapshot_file_name,
};
use stockgate_core::wal::snapshot::{
    decode_snapshot, encode_snapshot, SNAPSHOT_MAGIC, SNAPSHOT_VERSION,
};
use stockgate_core::wal::{FsyncPolicy, WalOptions};
use stockgate_server::cmd::{self, Ctx};
use stockgate_server::feed::groups::GroupRecord;
use stockgate_server::feed::{Feed, FeedLimits};
use stockgate_server::persist::{recover_engine, WalDurability};
use stockgate_server::protocol::{parse_command, Limits, Parsed, ProtocolError, Reply};
use stockgate_server::raft::network;
use stockgate_server::server::{ConnState, Durability, Role, ServerConfig, Shared, Users};

// ----- fixed keys and time ---------------------------------------------------------------

/// The fuzz engine's clock starts here (2025-11-30).
pub const START_MS: u64 = 1_764_500_000_000;
/// Expiry of the admission tokens in the seeds (2100-01-01).
pub const TOKEN_EXPIRY_MS: u64 = 4_102_444_800_000;
/// `FUZZ.ADVANCE` moves the clock by at most this much per call (400 days).
const MAX_ADVANCE_MS: u64 = 400 * 24 * 3600 * 1000;
const SIGNING_SECRET: [u8; 32] = [0x11; 32];
const OLD_SECRET: [u8; 32] = [0x22; 32];
const RESERVATION_SECRET: [u8; 32] = [0x07; 32];

/// Small limits, so the fuzzer reaches every limit check with short inputs.
pub fn limits() -> Limits {
    Limits {
        max_bulk: 512,
        max_args: 16,
        max_inline: 512,
    }
}

/// The admission keyring text: `fz` signs, `old` verifies too (rotation).
pub fn keyring_text() -> String {
    format!(
        "# fuzz keys\nfz {}\nold {}\n",
        token::hex_encode(&SIGNING_SECRET),
        token::hex_encode(&OLD_SECRET)
    )
}

fn keys() -> &'static (Keyring, ReservationKey) {
    static KEYS: OnceLock<(Keyring, ReservationKey)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let ring = Keyring::parse(&keyring_text()).expect("fuzz keyring parses");
        (ring, ReservationKey::from_bytes(&RESERVATION_SECRET))
    })
}

/// An admission token for `sku`/`user` signed with the fuzz signing key.
pub fn admission(sku: &str, user: &str) -> String {
    keys().0.mint(sku, user, TOKEN_EXPIRY_MS)
}

/// The reservation token the fuzz engine derives for a request.
pub fn reservation_token(sku: &str, user: &str, request_id: &str) -> String {
    keys().1.derive(sku, user, request_id)
}

/// The fuzz engine's reservation key fingerprint (what SALE.REBUILD must be given).
pub fn key_fingerprint() -> String {
    keys().1.fingerprint().to_string()
}

/// `FUZZ_TRACE=1` prints every command and reply of `resp_frame` (to read a reproducer).
fn tracing() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ----- resp_frame ------------------------------------------------------------------------

/// Keeps every event the engine logs, encoded as WAL records, after checking that each
/// record decodes back to the event.
#[derive(Default)]
struct RecordingSink {
    log: Mutex<Vec<u8>>,
    records: AtomicU64,
}

impl RecordingSink {
    fn records(&self) -> Lsn {
        self.records.load(Ordering::SeqCst)
    }
}

impl EventSink for RecordingSink {
    fn record(&self, event: &EventRef<'_>) -> Lsn {
        let mut log = lock(&self.log);
        let start = log.len();
        if let Err(e) = encode_record(event, &mut log) {
            panic!("the engine logged an event the WAL cannot hold: {e}: {event:?}");
        }
        match decode_record(&log[start..]) {
            Ok((back, used)) => {
                assert_eq!(
                    back.as_ref(),
                    *event,
                    "WAL record round trip changed the event"
                );
                assert_eq!(used, log.len() - start, "WAL record length");
            }
            Err(e) => panic!("a record the WAL wrote does not decode: {e}: {event:?}"),
        }
        self.records.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn last_lsn(&self) -> Lsn {
        self.records()
    }
}

/// `SAVE` writes a snapshot (encoded to bytes, kept in memory) and remembers where in the
/// log it was cut, as the real WAL does.
struct MemoryDurability {
    sink: Arc<RecordingSink>,
    /// Snapshot file bytes and the log length (bytes) at the cut.
    saved: Mutex<Option<(Vec<u8>, usize)>>,
}

impl Durability for MemoryDurability {
    fn wait(
        &self,
        _lsn: Lsn,
    ) -> Pin<Box<dyn Future<Output = Result<(), stockgate_server::session::NotDurable>> + Send + '_>>
    {
        Box::pin(std::future::ready(Ok(())))
    }

    fn save(&self, engine: &Engine) -> Result<(), String> {
        let (snap, (lsn, cut)) =
            engine.snapshot_with(|| (self.sink.records(), lock(&self.sink.log).len()));
        *lock(&self.saved) = Some((encode_snapshot(&snap, lsn), cut));
        Ok(())
    }

    fn info(&self) -> String {
        "aof_enabled:1\r\n".into()
    }
}

/// One engine, one connection to it.
struct Harness {
    clock: Arc<ManualClock>,
    cfg: EngineConfig,
    sink: Arc<RecordingSink>,
    durability: Arc<MemoryDurability>,
    engine: Engine,
    shared: Shared,
    conn: ConnState,
}

fn users() -> Users {
    let mut u = Users::empty();
    u.add("admin", "adminpw", Role::Admin);
    u.add("checkout", "checkoutpw", Role::Checkout);
    u.add("sweeper", "sweeperpw", Role::Sweeper);
    u
}

impl Harness {
    fn new(auto_release: bool) -> Harness {
        let clock = Arc::new(ManualClock::new(START_MS));
        let cfg = EngineConfig {
            auto_release,
            ..EngineConfig::default()
        };
        let sink = Arc::new(RecordingSink::default());
        let (ring, rkey) = keys().clone();
        let engine = Engine::new(cfg.clone(), clock.clone(), sink.clone(), ring, rkey);
        let durability = Arc::new(MemoryDurability {
            sink: sink.clone(),
            saved: Mutex::new(None),
        });
        // Users are configured (so AUTH, RESET and NOPERM are reachable), and the
        // connection starts authenticated as admin (so every command is).
        let shared = Shared::new(ServerConfig::default(), Some(users()), durability.clone());
        let mut conn = ConnState::new(
            1,
            Some(Role::Admin),
            "127.0.0.1:50000".into(),
            "127.0.0.1:7379".into(),
        );
        conn.user_name = Some("admin".into());
        Harness {
            clock,
            cfg,
            sink,
            durability,
            engine,
            shared,
            conn,
        }
    }

    fn fresh_engine(&self) -> Engine {
        let (ring, rkey) = keys().clone();
        Engine::new(
            self.cfg.clone(),
            Arc::new(ManualClock::new(self.clock.now_ms())),
            Arc::new(NullSink),
            ring,
            rkey,
        )
    }

    /// Runs one command; true when the connection closes after it.
    fn run(&mut self, argv: &[Bytes], out: &mut BytesMut) -> bool {
        let name = argv[0].to_ascii_lowercase();
        // Harness commands (not server commands): move time, as the ticker would see it.
        if name == b"fuzz.advance" {
            let ms = argv
                .get(1)
                .and_then(|a| std::str::from_utf8(a).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(1000)
                .min(MAX_ADVANCE_MS);
            self.clock.advance(ms);
            self.engine.tick();
            self.check_invariants("FUZZ.ADVANCE");
            return false;
        }
        if name == b"fuzz.autorelease" {
            return false; // only meaningful first; see auto_release_requested
        }
        let mut ctx = Ctx {
            engine: &self.engine,
            conn: &mut self.conn,
            shared: &self.shared,
        };
        let argv: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
        let o = cmd::dispatch(&mut ctx, &argv);
        assert!(
            o.lsn <= self.sink.records(),
            "reply waits for LSN {} but only {} records were logged",
            o.lsn,
            self.sink.records()
        );
        o.reply.encode(self.conn.proto, out);
        assert!(!out.is_empty(), "empty reply");
        if tracing() {
            let args: Vec<_> = argv.iter().map(|a| String::from_utf8_lossy(a)).collect();
            eprintln!(
                "> {args:?}\n< {}",
                String::from_utf8_lossy(out).escape_debug()
            );
        }
        self.check_invariants(&String::from_utf8_lossy(argv[0]));
        o.close
    }

    fn check_invariants(&self, after: &str) {
        check_stock(&self.engine, after);
    }

    fn snapshot(engine: &Engine) -> Snapshot {
        normalized(engine.snapshot_with(|| ()).0)
    }

    /// The state survives a snapshot file round trip, a snapshot load into a fresh engine,
    /// and recovery (newest SAVE snapshot, if any, plus the log after it).
    fn check_durable_state(&self) {
        let live = Self::snapshot(&self.engine);
        for s in &live.sales {
            let pending: u64 = live
                .reservations
                .iter()
                .filter(|r| r.sku == s.sku && r.state == ReservationState::Reserved)
                .map(|r| u64::from(r.qty))
                .sum();
            assert_eq!(
                s.reserved, pending,
                "sale {} counts {} reserved units, its RESERVED reservations hold {pending}",
                s.sku, s.reserved
            );
        }
        for r in &live.reservations {
            assert!(
                live.sales.iter().any(|s| s.sku == r.sku),
                "reservation {} of unknown sale {}",
                r.token,
                r.sku
            );
            assert_eq!(
                r.token,
                reservation_token(&r.sku, &r.user, &r.request_id),
                "reservation token not derived from its request"
            );
            assert_eq!(
                r.state == ReservationState::Reserved,
                r.finished_at_ms == 0,
                "finished_at of {r:?}"
            );
        }

        let lsn = self.sink.records();
        let bytes = encode_snapshot(&live, lsn);
        match decode_snapshot(&bytes) {
            Ok((l, back)) => {
                assert_eq!(l, lsn, "snapshot LSN round trip");
                assert_eq!(back, live, "snapshot file round trip changed the state");
            }
            Err(e) => panic!("a snapshot the server wrote does not decode: {e:?}"),
        }

        let loaded = self.fresh_engine();
        loaded.load_snapshot(&live);
        assert_eq!(
            Self::snapshot(&loaded),
            live,
            "loading a snapshot into a fresh engine changed the state"
        );

        let replayed = self.fresh_engine();
        let log = lock(&self.sink.log).clone();
        let mut at = 0;
        if let Some((snap_bytes, cut)) = lock(&self.durability.saved).clone() {
            match decode_snapshot(&snap_bytes) {
                Ok((_, s)) => replayed.load_snapshot(&s),
                Err(e) => panic!("a SAVE snapshot does not decode: {e:?}"),
            }
            at = cut;
        }
        while at < log.len() {
            match decode_record(&log[at..]) {
                Ok((ev, used)) => {
                    replayed.apply(&ev);
                    at += used;
                }
                Err(e) => panic!("the log does not decode at byte {at}: {e}"),
            }
        }
        assert_eq!(
            Self::snapshot(&replayed),
            live,
            "recovery (snapshot + log replay) does not rebuild the live state"
        );
    }
}

/// Stock conservation, checked after every command.
fn check_stock(engine: &Engine, after: &str) {
    for sku in engine.list_sales() {
        let v = match engine.sale_info(&sku) {
            Ok(v) => v,
            Err(e) => panic!("after {after}: listed sale {sku:?} has no info: {e}"),
        };
        for (i, a) in v.shard_available.iter().enumerate() {
            assert!(
                *a >= 0,
                "after {after}: shard {i} of {sku} is negative: {v:?}"
            );
        }
        assert_eq!(
            v.available,
            v.shard_available.iter().sum::<i64>(),
            "after {after}: available is not the sum of the shards: {v:?}"
        );
        assert_eq!(
            v.shard_available.len(),
            v.params.shards.max(1) as usize,
            "after {after}: shard count: {v:?}"
        );
        if v.state != SaleState::Fenced {
            assert_eq!(
                v.available as i128 + v.reserved as i128 + v.committed as i128,
                v.total as i128,
                "after {after}: available + reserved + committed != total: {v:?}"
            );
        }
        assert_eq!(
            engine.stock(&sku).ok(),
            Some(v.available),
            "after {after}: STOCK disagrees with SALE.INFO for {sku}"
        );
    }
}

/// Sales and reservations in a canonical order (the engine's maps have none).
fn normalized(mut s: Snapshot) -> Snapshot {
    s.sales.sort_by(|a, b| a.sku.cmp(&b.sku));
    s.reservations.sort_by(|a, b| a.token.cmp(&b.token));
    s
}

/// `FUZZ.AUTORELEASE` as the first command: the engine releases expired reservations itself.
fn auto_release_requested(data: &[u8]) -> bool {
    let mut b = BytesMut::from(data);
    matches!(parse_command(&mut b, &limits()),
        Ok(Parsed::Command(a)) if a.len() == 1 && a[0].eq_ignore_ascii_case(b"fuzz.autorelease"))
}

/// Everything one client sent, parsed with the buffer fed in `step`-byte reads: the
/// commands, and the protocol error that closed the connection, if any.
fn parse_fed(data: &[u8], step: usize) -> (Vec<Vec<Bytes>>, Option<ProtocolError>) {
    let limits = limits();
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut cmds = Vec::new();
    loop {
        let before = buf.len();
        match parse_command(&mut buf, &limits) {
            Ok(Parsed::Command(a)) => {
                assert!(buf.len() < before, "a command consumed no bytes");
                assert!(a.len() <= limits.max_args, "more arguments than max_args");
                for arg in &a {
                    assert!(arg.len() <= limits.max_bulk.max(limits.max_inline));
                }
                cmds.push(a);
            }
            Ok(Parsed::Incomplete) => {
                assert_eq!(buf.len(), before, "Incomplete consumed bytes");
                if fed == data.len() {
                    return (cmds, None);
                }
                let n = step.min(data.len() - fed);
                buf.extend_from_slice(&data[fed..fed + n]);
                fed += n;
            }
            Err(e) => return (cmds, Some(e)),
        }
    }
}

/// Fuzz target `resp_frame`: RESP framing, command parsing and application together.
pub fn resp_frame(data: &[u8]) {
    // Framing does not depend on how the bytes are split into reads.
    let whole = parse_fed(data, data.len().max(1));
    let step = 1 + data.len() % 11;
    assert_eq!(
        parse_fed(data, step),
        whole,
        "parsing in {step}-byte reads differs from parsing all at once"
    );

    let mut h = Harness::new(auto_release_requested(data));
    let limits = limits();
    let mut buf = BytesMut::from(data);
    let mut out = BytesMut::new();
    loop {
        match parse_command(&mut buf, &limits) {
            Ok(Parsed::Command(argv)) => {
                if argv.is_empty() {
                    continue;
                }
                out.clear();
                if h.run(&argv, &mut out) {
                    break;
                }
            }
            Ok(Parsed::Incomplete) => break,
            Err(e) => {
                out.clear();
                Reply::err(format!("ERR {e}")).encode(h.conn.proto, &mut out);
                break;
            }
        }
    }
    h.check_durable_state();
}

// ----- admission_token -------------------------------------------------------------------

/// Fuzz target `admission_token`: input is `token \n sku \n user \n keyring-text`.
pub fn admission_token(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(4, '\n');
    let token = lines.next().unwrap_or("");
    let sku = lines.next().unwrap_or("");
    let user = lines.next().unwrap_or("");
    let rest = lines.next().unwrap_or("");
    let (ring, rkey) = keys();

    let verdict = ring.verify(token, sku, user);
    assert_eq!(verdict, ring.verify(token, sku, user), "verify is not pure");
    if verdict.is_ok() {
        // Bound to exactly this sku and user.
        assert_eq!(
            ring.verify(token, &format!("{sku}x"), user),
            Err(Denied::WrongSku)
        );
        assert_eq!(
            ring.verify(token, sku, &format!("{user}x")),
            Err(Denied::WrongUser)
        );
        // A token that verifies is ASCII (base64url and a dot); change one character and
        // it must not verify any more.
        assert!(token.is_ascii(), "a verified token is not ASCII: {token:?}");
        let mut t = token.as_bytes().to_vec();
        let i = data.len() % t.len();
        t[i] = if t[i] == b'A' { b'B' } else { b'A' };
        let t = String::from_utf8_lossy(&t).into_owned();
        assert!(
            ring.verify(&t, sku, user).is_err(),
            "a token with byte {i} changed still verifies: {t:?}"
        );
    }

    // Whatever the sku and user, a token minted for them verifies exactly when its
    // fields cannot be confused (no `|`) and it fits the size limit.
    let exp = (data.len() as u64).wrapping_mul(1_000_003);
    let plain = !sku.contains('|') && !user.contains('|');
    for (minted, want) in [
        (ring.mint(sku, user, exp), Ok(exp)),
        (
            token::mint_admission_token(&OLD_SECRET, "old", sku, user, exp),
            Ok(exp),
        ),
        (
            token::mint_admission_token(&OLD_SECRET, "fz", sku, user, exp),
            Err(Denied::BadSignature),
        ),
        (
            token::mint_admission_token(&SIGNING_SECRET, "nokey", sku, user, exp),
            Err(Denied::UnknownKey),
        ),
    ] {
        let got = ring.verify(&minted, sku, user);
        if plain && minted.len() <= 1024 {
            assert_eq!(got, want, "minted for {sku:?}/{user:?}: {minted}");
        } else {
            assert!(
                got.is_err(),
                "minted for {sku:?}/{user:?} verifies: {minted}"
            );
        }
    }

    // Secret files.
    for t in [rest, &*text] {
        if let Ok(k) = Keyring::parse(t) {
            let kid = k.signing_kid().to_string();
            assert!(ident::valid_sku(kid.as_bytes()), "kid {kid:?} accepted");
            let m = k.mint("SKU-1", "alice", 5);
            assert_eq!(k.verify(&m, "SKU-1", "alice"), Ok(5));
            let _ = format!("{k:?}");
        }
    }

    // Reservation key files and reservation tokens.
    if let Ok(k) = ReservationKey::from_file_bytes(data) {
        let fp = k.fingerprint();
        assert_eq!(fp.len(), 16);
        assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
        let t = k.derive(sku, user, "req-1");
        assert_eq!(t, k.derive(sku, user, "req-1"), "derive is not pure");
        if ident::valid_sku(sku.as_bytes()) {
            assert_eq!(token::token_sku(&t), Some(sku));
        }
    }
    for s in [token, sku, user] {
        if let Some(tsku) = token::token_sku(s) {
            assert!(ident::valid_sku(tsku.as_bytes()));
            assert_eq!(s.len(), tsku.len() + 2 + 26);
            assert!(s.starts_with(&format!("{{{tsku}}}")));
        }
        if let Some(b) = token::hex_decode(s) {
            assert_eq!(token::hex_encode(&b), s.to_ascii_lowercase());
        }
    }
    let t = rkey.derive(sku, user, token);
    if ident::valid_sku(sku.as_bytes()) {
        assert_eq!(token::token_sku(&t), Some(sku));
    }
    let b32 = token::base32_lower(data);
    assert_eq!(b32.len(), (data.len() * 8).div_ceil(5));
}

// ----- wal_record ------------------------------------------------------------------------

/// CRC-32C (Castagnoli), bitwise: the fuzz and test crates do not depend on `crc32c`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// `payload` framed as a WAL record (length, CRC, payload).
pub fn frame_record(payload: &[u8]) -> Vec<u8> {
    let mut rec = (payload.len() as u32).to_le_bytes().to_vec();
    rec.extend_from_slice(&crc32c(payload).to_le_bytes());
    rec.extend_from_slice(payload);
    rec
}

/// Bytes of a snapshot file before its payload: magic, length, CRC.
const SNAPSHOT_HEADER_LEN: usize = 20;

/// `payload` framed as a snapshot file (magic, length, CRC, payload).
pub fn frame_snapshot(payload: &[u8]) -> Vec<u8> {
    let mut f = SNAPSHOT_MAGIC.to_vec();
    f.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    f.extend_from_slice(&crc32c(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// Record kinds the encoder no longer writes: releases, commits and extensions without
/// buyer, request and quantity. They decode to the same events as the full kinds 10-12
/// (those fields empty), which is what the encoder then writes.
const OLDER_RECORD_KINDS: [u8; 3] = [5, 6, 7];

/// What holds of every payload that decodes to `ev`: the encoder's bytes for it decode to
/// the same event, and they are `payload` itself unless `payload` is of an older kind.
fn check_payload_round_trip(payload: &[u8], ev: &Event) {
    let mut again = Vec::new();
    encode_payload(&ev.as_ref(), &mut again);
    match decode_payload(&again) {
        Ok(back) => assert_eq!(&back, ev, "decode(encode(event)) changed the event"),
        Err(e) => panic!("an encoded event does not decode: {e}: {ev:?}"),
    }
    let older = payload
        .get(1)
        .is_some_and(|k| OLDER_RECORD_KINDS.contains(k));
    if !older {
        assert_eq!(
            again, payload,
            "a payload of a current kind does not re-encode to its bytes"
        );
    }
}

/// A snapshot file that decodes: the encoder's file for its state decodes to the same
/// LSN and state, and is the file itself when that is of the current version (an older
/// version's state is written as the current one).
fn check_snapshot(bytes: &[u8]) {
    let Ok((lsn, snap)) = decode_snapshot(bytes) else {
        return;
    };
    let again = encode_snapshot(&snap, lsn);
    match decode_snapshot(&again) {
        Ok((l, back)) => {
            assert_eq!(l, lsn, "snapshot LSN round trip");
            assert_eq!(back, snap, "decode(encode(snapshot)) changed the state");
        }
        Err(e) => panic!("an encoded snapshot does not decode: {e:?}"),
    }
    if bytes.get(SNAPSHOT_HEADER_LEN) == Some(&SNAPSHOT_VERSION) {
        assert_eq!(
            again, bytes,
            "a snapshot of the current version does not re-encode to its bytes"
        );
    }
}

/// Fuzz target `wal_record`: WAL record, payload and snapshot decoding.
pub fn wal_record(data: &[u8]) {
    // A record, then the records after it, as recovery scans a segment.
    let mut at = 0;
    while at < data.len() {
        match decode_record(&data[at..]) {
            Ok((ev, used)) => {
                assert!(used > 8 && used <= data.len() - at, "record length {used}");
                check_payload_round_trip(&data[at + 8..at + used], &ev);
                let mut again = Vec::new();
                if let Err(e) = encode_record(&ev, &mut again) {
                    panic!("a decoded event does not encode: {e}");
                }
                match decode_record(&again) {
                    Ok((back, n)) => {
                        assert_eq!(back, ev, "record round trip changed the event");
                        assert_eq!(n, again.len(), "record length");
                    }
                    Err(e) => panic!("an encoded record does not decode: {e}"),
                }
                at += used;
            }
            Err(_) => break,
        }
    }

    // The payload decoder on its own (random bytes rarely pass a CRC)...
    let payload = decode_payload(data);
    if let Ok(ev) = &payload {
        check_payload_round_trip(data, ev);
    }
    // ...and framed with a correct CRC: the record decoder must agree with it.
    if (2..=MAX_PAYLOAD).contains(&data.len()) {
        let framed = frame_record(data);
        match decode_record(&framed) {
            Ok((ev, used)) => {
                assert_eq!(used, framed.len());
                assert_eq!(
                    Ok(&ev),
                    payload.as_ref(),
                    "record and payload decoders differ"
                );
            }
            Err(RecordError::Payload(e)) => assert_eq!(
                payload.as_ref().err(),
                Some(&e),
                "record and payload decoders differ"
            ),
            Err(e) => panic!("a correctly framed record is refused: {e}"),
        }
    }

    // Snapshot files, as they are and with a correct header around the bytes.
    check_snapshot(data);
    check_snapshot(&frame_snapshot(data));

    // Segment and snapshot file names.
    if let Ok(name) = std::str::from_utf8(data) {
        if let Some(lsn) = parse_segment_name(name) {
            assert_eq!(parse_segment_name(&segment_file_name(lsn)), Some(lsn));
        }
        if let Some(lsn) = parse_snapshot_name(name) {
            assert_eq!(parse_snapshot_name(&snapshot_file_name(lsn)), Some(lsn));
        }
    }
}

// ----- raft_frame ------------------------------------------------------------------------

/// The output of a future that must not wait (a frame read from memory).
fn ready<T>(fut: impl Future<Output = T>) -> T {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("reading a frame from memory waited"),
    }
}

/// What the encoder writes for a message that decoded from `body`: it decodes again (with
/// `decode`) to a message the encoder writes the same way, i.e. `decode(encode(x)) == x`.
/// It need not be `body` itself: sets and maps decode from elements in any order (and
/// repeated), and are written sorted.
fn check_reencodes<T: serde::Serialize>(
    body: &[u8],
    msg: &T,
    decode: impl Fn(&[u8]) -> std::io::Result<T>,
) {
    let again = match network::encode(msg) {
        Ok(b) => b,
        Err(e) => panic!("a decoded message does not encode: {e}"),
    };
    assert!(
        again.len() <= body.len(),
        "re-encoding made a message longer"
    );
    match decode(&again) {
        Ok(back) => match network::encode(&back) {
            Ok(b) => assert_eq!(b, again, "decode(encode(message)) changed the message"),
            Err(e) => panic!("a decoded message does not encode: {e}"),
        },
        Err(e) => panic!("an encoded message does not decode: {e}"),
    }
}

/// A request that decoded: it round-trips through the encoder, it formats (openraft logs
/// it), and the WAL records inside its batches decode or are refused as a follower's
/// apply would.
fn check_request(body: &[u8], env: &network::Envelope<network::Rpc>) {
    check_reencodes(body, env, network::decode_request);
    let _ = format!("{env:?}");
    let rpc = &env.rpc;
    if let network::Rpc::Append(r) = rpc {
        let _ = r.summary();
        for e in &r.entries {
            let _ = e.to_string();
            if let openraft::EntryPayload::Normal(b) = &e.payload {
                assert!(
                    b.well_formed(),
                    "an append with a malformed batch decoded: {b:?}"
                );
                assert!(b.last_lsn() >= b.first_lsn);
                let mut at = 0;
                while at < b.records.len() {
                    match decode_record(&b.records[at..]) {
                        Ok((_, used)) => at += used,
                        Err(_) => break,
                    }
                }
            }
        }
    }
}

fn check_reply(body: &[u8], reply: &network::ReplyEnvelope) {
    check_reencodes(body, reply, network::decode_reply);
    let _ = format!("{reply:?}");
}

/// The bytes as a stream of frames, as a connection reads them: requests (what a peer
/// sends to this node's Raft port) or replies (what a peer this node called sends back).
/// Reading stops where the connection would end: a frame that does not decode, a frame
/// over the limit (of which no body byte is read), or the end of the bytes.
fn read_frames(data: &[u8], replies: bool) {
    let mut rest = data;
    while !rest.is_empty() {
        let before = rest.len();
        let announced = rest
            .get(..4)
            .map(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize);
        match ready(network::read_frame(&mut rest)) {
            Ok(body) => {
                let n = announced.expect("a frame was read without a length");
                assert!(n <= network::MAX_FRAME, "a frame over the limit was read");
                assert_eq!(body.len(), n, "frame body length");
                assert_eq!(before - rest.len(), 4 + n, "bytes taken by a frame");
                let ok = if replies {
                    network::decode_reply(&body).map(|r| check_reply(&body, &r))
                } else {
                    network::decode_request(&body).map(|r| check_request(&body, &r))
                };
                if ok.is_err() {
                    return;
                }
            }
            Err(_) => {
                if announced.is_some_and(|n| n > network::MAX_FRAME) {
                    assert_eq!(
                        before - rest.len(),
                        4,
                        "the body of a frame over the limit was read"
                    );
                }
                return;
            }
        }
    }
}

/// Fuzz target `raft_frame`: the bytes a Raft peer sends, as one frame body and as a
/// stream of `[u32 length][bincode]` frames, of requests and of replies.
pub fn raft_frame(data: &[u8]) {
    if let Ok(rpc) = network::decode_request(data) {
        check_request(data, &rpc);
    }
    if let Ok(reply) = network::decode_reply(data) {
        check_reply(data, &reply);
    }
    read_frames(data, false);
    read_frames(data, true);
}

// ----- stream_commands -------------------------------------------------------------------

/// A data dir of its own per input, removed afterwards.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("stockgate-fuzz-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create the fuzz data dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wal_options() -> WalOptions {
    WalOptions {
        fsync: FsyncPolicy::No,
        ..WalOptions::default()
    }
}

/// An engine on a real WAL with the order feed over it, as `main` builds them (without
/// the network), and one connection to it.
struct FeedHarness {
    engine: Arc<Engine>,
    dur: Arc<WalDurability>,
    feed: Arc<Feed>,
    shared: Shared,
    conn: ConnState,
}

impl FeedHarness {
    /// Recovers whatever `dir` holds, as the server does at start.
    fn open(dir: &std::path::Path) -> FeedHarness {
        let (ring, rkey) = keys().clone();
        let clock = Arc::new(ManualClock::new(START_MS));
        let (engine, dur, report) = match recover_engine(
            dir,
            wal_options(),
            EngineConfig::default(),
            clock,
            ring,
            rkey,
        ) {
            Ok(r) => r,
            Err(e) => panic!("the fuzz data dir does not recover: {e}"),
        };
        let feed = Arc::new(Feed::new(
            dur.wal.clone(),
            FeedLimits::default(),
            engine.clock(),
        ));
        feed.load_state_file(report.snapshot_lsn);
        feed.groups.recover(
            report
                .opaque
                .iter()
                .map(|(lsn, kind, body)| (*lsn, *kind, body.as_slice())),
        );
        let hook_feed = feed.clone();
        dur.add_checkpoint_hook(Box::new(move |_| Ok(hook_feed.checkpoint_groups())));
        let shared = Shared::new(ServerConfig::default(), Some(users()), dur.clone());
        let _ = shared.feed.set(feed.clone());
        let mut conn = ConnState::new(
            1,
            Some(Role::Admin),
            "127.0.0.1:50000".into(),
            "127.0.0.1:7379".into(),
        );
        conn.user_name = Some("admin".into());
        FeedHarness {
            engine,
            dur,
            feed,
            shared,
            conn,
        }
    }

    /// Runs one command and waits, as the connection would, until what it logged is
    /// durable (so the feed can read it). True when the connection closes after it.
    fn run(&mut self, argv: &[&[u8]], out: &mut BytesMut) -> bool {
        let mut ctx = Ctx {
            engine: &self.engine,
            conn: &mut self.conn,
            shared: &self.shared,
        };
        // A blocking read's rest (`wait`) is dropped unpolled: its answer now is `reply`.
        let o = cmd::dispatch(&mut ctx, argv);
        let last = self.dur.wal.last_lsn();
        assert!(
            o.lsn <= last,
            "reply waits for LSN {} past the last {last}",
            o.lsn
        );
        if let Err(e) = self.dur.wal.wait_durable_blocking(last) {
            panic!("the fuzz WAL failed: {e}");
        }
        out.clear();
        o.reply.encode(self.conn.proto, out);
        assert!(!out.is_empty(), "empty reply");
        if tracing() {
            let args: Vec<_> = argv.iter().map(|a| String::from_utf8_lossy(a)).collect();
            eprintln!(
                "> {args:?}\n< {}",
                String::from_utf8_lossy(out).escape_debug()
            );
        }
        check_stock(&self.engine, &String::from_utf8_lossy(argv[0]));
        o.close
    }

    /// Every live group's state, sorted, apart from what is not logged each time it
    /// changes: where its next `>` read starts examining the log (`scanned`, logged by
    /// checkpoints) and when each consumer was last seen (a read that delivers nothing
    /// logs nothing, as Redis propagates nothing for it). Those come second.
    fn groups(&self) -> Vec<(String, Vec<u64>)> {
        let mut g: Vec<(String, Vec<u64>)> = self
            .feed
            .groups
            .state_records()
            .into_iter()
            .map(|r| match r {
                GroupRecord::Checkpoint {
                    stream,
                    group,
                    last,
                    scanned,
                    consumers,
                    pending,
                } => {
                    let mut hints = vec![last.max(scanned)];
                    let names: Vec<(String, u64)> = consumers
                        .into_iter()
                        .map(|(name, seen, active)| {
                            hints.push(seen);
                            (name, active)
                        })
                        .collect();
                    (
                        format!("{stream} {group} last {last} {names:?} {pending:?}"),
                        hints,
                    )
                }
                other => panic!("a group's state record is not a checkpoint: {other:?}"),
            })
            .collect();
        g.sort();
        g
    }
}

/// What every stream input starts from: a feed with entries in two sale streams
/// (reservations, a commit, a release, an extension, an adjustment) and a group on each
/// stream, one entry delivered and not acknowledged.
fn stream_setup() -> Vec<Vec<String>> {
    let a = admission("SKU-1", "alice");
    let b = admission("SKU-2", "bob");
    let t1 = reservation_token("SKU-1", "alice", "req-1");
    let t2 = reservation_token("SKU-1", "alice", "req-2");
    let t3 = reservation_token("SKU-2", "bob", "req-3");
    let c = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        c(&["SALE.CREATE", "SKU-1", "10", "SHARDS", "2", "LIMIT", "5"]),
        c(&["SALE.CREATE", "SKU-2", "3"]),
        c(&["RESERVE", "SKU-1", "alice", &a, "req-1"]),
        c(&["RESERVE", "SKU-1", "alice", &a, "req-2", "QTY", "2"]),
        c(&["RESERVE", "SKU-2", "bob", &b, "req-3"]),
        c(&["COMMIT", &t1]),
        c(&["RELEASE", &t2]),
        c(&["EXTEND", &t3, "60000"]),
        c(&["SALE.ADJUST", "SKU-2", "2"]),
        c(&["XGROUP", "CREATE", "stockgate:events", "g1", "0"]),
        c(&["XGROUP", "CREATE", "{SKU-1}:events", "g2", "$"]),
        c(&[
            "XREADGROUP",
            "GROUP",
            "g1",
            "c1",
            "COUNT",
            "2",
            "STREAMS",
            "stockgate:events",
            ">",
        ]),
    ]
}

/// Fuzz target `stream_commands`: the bytes are what one client sent after
/// [`stream_setup`]; each command (stream, group and every other) runs against a real
/// engine, WAL and order feed. No argv may panic, stock stays conserved after every
/// command, and at the end a restart from the data dir rebuilds the same engine state
/// and the same consumer groups.
pub fn stream_commands(data: &[u8]) {
    let dir = TempDir::new();
    let mut h = FeedHarness::open(&dir.0);
    let mut out = BytesMut::new();
    for argv in stream_setup() {
        let argv: Vec<&[u8]> = argv.iter().map(|a| a.as_bytes()).collect();
        h.run(&argv, &mut out);
    }
    // A protocol error ends the connection, as it would the server's.
    let limits = limits();
    let mut buf = BytesMut::from(data);
    while let Ok(Parsed::Command(argv)) = parse_command(&mut buf, &limits) {
        if argv.is_empty() {
            continue;
        }
        let argv: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
        if h.run(&argv, &mut out) {
            break;
        }
    }
    let live = Harness::snapshot(&h.engine);
    let groups = h.groups();
    drop(h);
    let back = FeedHarness::open(&dir.0);
    assert_eq!(
        Harness::snapshot(&back.engine),
        live,
        "a restart does not rebuild the engine state"
    );
    let recovered = back.groups();
    assert_eq!(
        recovered.iter().map(|g| &g.0).collect::<Vec<_>>(),
        groups.iter().map(|g| &g.0).collect::<Vec<_>>(),
        "a restart does not rebuild the consumer groups"
    );
    // A restart may scan again what the live group had examined, never skip past it, and
    // may remember a consumer as seen earlier than the live group did, never later.
    for ((name, after), (_, live)) in recovered.iter().zip(&groups) {
        assert!(
            after.iter().zip(live).all(|(a, l)| a <= l),
            "after a restart {name} has hints {after:?}, the live group {live:?}"
        );
    }
}

// ----- seed corpus -----------------------------------------------------------------------

/// A command as a RESP array of bulk strings.
pub fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn pipeline(cmds: &[&[&str]]) -> Vec<u8> {
    cmds.iter().flat_map(|c| resp(c)).collect()
}

/// The seed corpus: `(target, file name, bytes)`. `tests/wal/fuzz_corpus_replay.rs` checks
/// that `fuzz/corpus/` holds exactly these (and rewrites them when asked to).
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let mut add = |t: &'static str, name: &str, b: Vec<u8>| {
        seeds.push((t, format!("seed-{name}"), b));
    };

    // resp_frame
    let a_alice = admission("SKU-1", "alice");
    let a_bob = admission("SKU-1", "bob");
    let t1 = reservation_token("SKU-1", "alice", "req-1");
    let t2 = reservation_token("SKU-1", "alice", "req-2");
    let tb = reservation_token("SKU-1", "bob", "req-9");
    let fp = key_fingerprint();
    let exp = (START_MS + 600_000).to_string();
    let created = START_MS.to_string();
    add("resp_frame", "ping-inline", b"PING\r\n".to_vec());
    add(
        "resp_frame",
        "inline-quotes",
        b"ECHO \"a b\\n\"\r\n  ping  'c d' \nSALE.LIST\necho \"x\"y\n".to_vec(),
    );
    add(
        "resp_frame",
        "reserve-commit",
        pipeline(&[
            &[
                "SALE.CREATE",
                "SKU-1",
                "10",
                "SHARDS",
                "2",
                "TTL",
                "5000",
                "LIMIT",
                "2",
            ],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["STOCK", "SKU-1"],
            &["RESERVATION", &t1],
            &["COMMIT", &t1],
            &["COMMIT", &t1],
            &["SALE.INFO", "SKU-1"],
        ]),
    );
    add(
        "resp_frame",
        "expire-release",
        pipeline(&[
            &["SALE.CREATE", "SKU-1", "3", "SHARDS", "1", "TTL", "1000"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1", "QTY", "2"],
            &["FUZZ.ADVANCE", "2000"],
            &["EXPIRED", "COUNT", "10", "SKU", "SKU-1"],
            &["RELEASE", &t1],
            &["RELEASE", &t1],
            &["COMMIT", &t1],
            &["FUZZ.ADVANCE", "90000000"],
            &["RESERVATION", &t1],
            &["DBSIZE"],
        ]),
    );
    add(
        "resp_frame",
        "limit-soldout",
        pipeline(&[
            &["SALE.CREATE", "SKU-1", "2", "SHARDS", "4", "LIMIT", "1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-2"],
            &["RESERVE", "SKU-1", "bob", &a_bob, "req-9", "QTY", "5"],
            &["RESERVE", "SKU-1", "bob", &a_bob, "req-9"],
            &["RESERVE", "SKU-1", "bob", &a_alice, "req-3"],
            &["RELEASE", &t1],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-2"],
            &["RESERVATION", &t2],
        ]),
    );
    // Transactions: queued commands, a runtime error inside EXEC, a queue-time error that
    // aborts, nested MULTI, DISCARD, RESET inside MULTI, WATCH refused.
    add(
        "resp_frame",
        "multi-exec",
        pipeline(&[
            &["EXEC"],
            &["MULTI"],
            &["SALE.CREATE", "SKU-1", "5", "SHARDS", "2"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["STOCK", "NOPE"],
            &["MULTI"],
            &["EXEC"],
            &["MULTI"],
            &["RELEASE", &t1],
            &["NOSUCH"],
            &["EXEC"],
            &["MULTI"],
            &["COMMIT", &t1],
            &["DISCARD"],
            &["WATCH", "SKU-1"],
            &["UNWATCH"],
            &["MULTI"],
            &["RESERVE", "SKU-1", "bob", &a_bob, "req-9"],
            &["RESET"],
            &["EXEC"],
        ]),
    );
    add(
        "resp_frame",
        "extend",
        pipeline(&[
            &["SALE.CREATE", "SKU-1", "5", "TTL", "1000"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["EXTEND", &t1, "60000"],
            &["FUZZ.ADVANCE", "30000"],
            &["EXTEND", &t1, "10"],
            &["FUZZ.ADVANCE", "20"],
            &["EXTEND", &t1, "10"],
            &["EXPIRED"],
        ]),
    );
    add(
        "resp_frame",
        "fence-restore-rebuild",
        pipeline(&[
            &["SALE.CREATE", "SKU-1", "10", "SHARDS", "2"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["SAVE"],
            &["SALE.FENCE", "SKU-1"],
            &["RESERVE", "SKU-1", "bob", &a_bob, "req-9"],
            &["SALE.RESTORE", "SKU-1", "bob", "req-9", "1", &exp, &created],
            &["SALE.RESTORE", "SKU-1", "bob", "req-9", "1", &exp, &created],
            &["SALE.REBUILD", "SKU-1", "10", "1", "0000000000000000"],
            &["SALE.REBUILD", "SKU-1", "10", "1", &fp],
            &["RESERVATION", &tb],
            &["SALE.ADJUST", "SKU-1", "5"],
            &["SALE.ADJUST", "SKU-1", "-3"],
            &["SALE.ADJUST", "SKU-1", "-1000"],
            &["RELEASE", &tb],
            &["SALE.INFO", "SKU-1"],
        ]),
    );
    add(
        "resp_frame",
        "fence-unknown",
        pipeline(&[
            &[
                "SALE.FENCE",
                "LOST-1",
                "TOTAL",
                "5",
                "SHARDS",
                "3",
                "TTL",
                "9000",
                "LIMIT",
                "1",
            ],
            &["SALE.INFO", "LOST-1"],
            &["SALE.PAUSE", "LOST-1"],
            &["SALE.REBUILD", "LOST-1", "5", "2", &fp],
            &["STOCK", "LOST-1"],
        ]),
    );
    add(
        "resp_frame",
        "pause-resume",
        pipeline(&[
            &["SALE.CREATE", "SKU-1", "4"],
            &["SALE.CREATE", "SKU-1", "4"],
            &["SALE.CREATE", "SKU-1", "5"],
            &["SALE.PAUSE", "SKU-1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["SALE.RESUME", "SKU-1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["SALE.LIST"],
        ]),
    );
    add(
        "resp_frame",
        "connection",
        pipeline(&[
            &["HELLO", "3"],
            &["CLIENT", "SETNAME", "fuzz"],
            &["CLIENT", "INFO"],
            &["PING", "hi"],
            &["ECHO", "x"],
            &["INFO"],
            &["CONFIG", "GET", "max*"],
            &["COMMAND", "COUNT"],
            &["SELECT", "0"],
            &["TIME"],
            &["SALE.CREATE", "SKU-1", "1", "SHARDS", "1"],
            &["RESET"],
            &["STOCK", "SKU-1"],
            &["AUTH", "checkout", "wrong"],
            &["AUTH", "checkout", "checkoutpw"],
            &["SALE.CREATE", "SKU-2", "1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["QUIT"],
            &["PING"],
        ]),
    );
    add(
        "resp_frame",
        "autorelease",
        pipeline(&[
            &["FUZZ.AUTORELEASE"],
            &["SALE.CREATE", "SKU-1", "2", "SHARDS", "1", "TTL", "100"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
            &["FUZZ.ADVANCE", "200"],
            &["STOCK", "SKU-1"],
            &["FUZZ.ADVANCE", "86400000"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1"],
        ]),
    );
    add(
        "resp_frame",
        "bad-args",
        pipeline(&[
            &["SALE.CREATE", "SKU-1", "-1"],
            &["SALE.CREATE", "bad sku", "1"],
            &["SALE.CREATE", "SKU-1", "1", "SHARDS", "0"],
            &["RESERVE", "SKU-1", "alice", "garbage", "req-1"],
            &["RESERVE", "SKU-1", "alice", &a_alice, "req-1", "QTY", "0"],
            &["EXTEND", "nope", "1"],
            &["EXPIRED", "COUNT", "-5"],
            &["NOSUCHCOMMAND"],
            &[],
        ]),
    );
    add("resp_frame", "bulk-too-big", b"*1\r\n$99999\r\n".to_vec());
    add(
        "resp_frame",
        "partial",
        b"*2\r\n$4\r\nECHO\r\n$5\r\nhel".to_vec(),
    );

    // admission_token: token \n sku \n user \n keyring text
    let ring = &keys().0;
    let line =
        |t: &str, s: &str, u: &str, rest: &str| format!("{t}\n{s}\n{u}\n{rest}").into_bytes();
    add(
        "admission_token",
        "valid",
        line(&a_alice, "SKU-1", "alice", ""),
    );
    add(
        "admission_token",
        "wrong-user",
        line(&a_alice, "SKU-1", "bob", ""),
    );
    add(
        "admission_token",
        "old-key",
        line(
            &token::mint_admission_token(&OLD_SECRET, "old", "S", "u", 5),
            "S",
            "u",
            "",
        ),
    );
    add(
        "admission_token",
        "expired-with-keyring",
        line(
            &ring.mint("SKU-9", "zoe", 1),
            "SKU-9",
            "zoe",
            &keyring_text(),
        ),
    );
    add(
        "admission_token",
        "malformed",
        line("a.b.c", "SKU-1", "alice", "k1 zz\nk2\n"),
    );
    add(
        "admission_token",
        "reservation-key-hex",
        format!("{}\n", token::hex_encode(&RESERVATION_SECRET)).into_bytes(),
    );
    add(
        "admission_token",
        "reservation-token",
        line(&t1, "SKU-1", "alice", "").to_vec(),
    );

    // wal_record: records, payloads and snapshots
    let mut all = Vec::new();
    for (i, ev) in sample_events().iter().enumerate() {
        let mut rec = Vec::new();
        encode_record(ev, &mut rec).expect("sample event encodes");
        all.extend_from_slice(&rec);
        add("wal_record", &format!("record-{i:02}"), rec);
    }
    add("wal_record", "records-all", all);
    let mut payload = Vec::new();
    encode_payload(&sample_events()[3].as_ref(), &mut payload);
    add("wal_record", "payload-reserved", payload);
    let snap = scenario_snapshot();
    let file = encode_snapshot(&snap, 42);
    add("wal_record", "snapshot-payload", file[20..].to_vec());
    add("wal_record", "snapshot", file);
    // What older versions wrote: a snapshot of versions 1, 2 and 3, and records of the
    // older finish and extension kinds.
    for version in [1u8, 2, 3] {
        add(
            "wal_record",
            &format!("snapshot-v{version}"),
            older_snapshot(&snap, version, 42),
        );
    }
    let older: Vec<u8> = OLDER_RECORD_KINDS
        .iter()
        .flat_map(|&kind| {
            let mut p = vec![1, kind];
            varint(&mut p, t1.len() as u64);
            p.extend_from_slice(t1.as_bytes());
            varint(&mut p, START_MS);
            frame_record(&p)
        })
        .collect();
    add("wal_record", "records-older-kinds", older);
    add(
        "wal_record",
        "segment-name",
        segment_file_name(17).into_bytes(),
    );

    // raft_frame: single bodies and framed streams of requests and of replies.
    let (requests, replies) = raft_messages();
    for (name, rpc) in &requests {
        let body = network::encode(rpc).expect("sample request encodes");
        add("raft_frame", &format!("request-{name}"), frame(&body));
    }
    for (name, reply) in &replies {
        let body = network::encode(reply).expect("sample reply encodes");
        add("raft_frame", &format!("reply-{name}"), frame(&body));
    }
    let body = network::encode(&requests[1].1).expect("sample request encodes");
    add("raft_frame", "body-append", body);
    let stream: Vec<u8> = requests
        .iter()
        .flat_map(|(_, r)| frame(&network::encode(r).expect("sample request encodes")))
        .collect();
    add("raft_frame", "requests-all", stream);
    let mut over = ((network::MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
    over.extend_from_slice(b"the body of a frame over the limit");
    add("raft_frame", "over-limit", over);

    // stream_commands: after stream_setup's sales, entries and groups.
    let s1 = "{SKU-1}:events";
    let all = "stockgate:events";
    add(
        "stream_commands",
        "reads",
        pipeline(&[
            &["XLEN", all],
            &["XLEN", s1],
            &["XRANGE", all, "-", "+", "COUNT", "3"],
            &["XREVRANGE", s1, "+", "-"],
            &["XRANGE", all, "(1-0", "5"],
            &["XREAD", "COUNT", "2", "STREAMS", all, s1, "0", "0-0"],
            &["XREAD", "BLOCK", "10", "STREAMS", all, "$"],
            &["XINFO", "STREAM", all],
            &["XINFO", "GROUPS", all],
            &["XINFO", "CONSUMERS", all, "g1"],
            &["XRANGE", "nosuch", "-", "+"],
            &["XREAD", "STREAMS", all],
        ]),
    );
    add(
        "stream_commands",
        "groups",
        pipeline(&[
            &["XREADGROUP", "GROUP", "g1", "c2", "STREAMS", all, ">"],
            &["XREADGROUP", "GROUP", "g1", "c1", "STREAMS", all, "0"],
            &["XPENDING", all, "g1"],
            &["XPENDING", all, "g1", "-", "+", "10", "c1"],
            &["XACK", all, "g1", "1-0", "2-0"],
            &["XCLAIM", all, "g1", "c3", "0", "3-0", "JUSTID"],
            &["XAUTOCLAIM", all, "g1", "c3", "0", "0-0", "COUNT", "5"],
            &["XGROUP", "SETID", all, "g1", "$"],
            &["XGROUP", "CREATECONSUMER", s1, "g2", "c9"],
            &["XGROUP", "DELCONSUMER", s1, "g2", "c9"],
            &[
                "XREADGROUP",
                "GROUP",
                "g2",
                "c1",
                "NOACK",
                "STREAMS",
                s1,
                ">",
            ],
            &["SAVE"],
            &["XGROUP", "DESTROY", s1, "g2"],
            &["XGROUP", "HELP"],
        ]),
    );
    add(
        "stream_commands",
        "bad-args",
        pipeline(&[
            &["XRANGE", all, "+", "-", "COUNT", "-1"],
            &["XREAD", "COUNT", "x", "STREAMS", all, "0"],
            &["XREADGROUP", "GROUP", "nosuch", "c", "STREAMS", all, ">"],
            &["XGROUP", "CREATE", all, "g1", "0"],
            &["XGROUP", "CREATE", "{bad sku}:events", "g", "0"],
            &[
                "XACK",
                all,
                "g1",
                "18446744073709551615-18446744073709551615",
            ],
            &["XPENDING", all, "g1", "IDLE", "-5", "-", "+", "1"],
            &[
                "XCLAIM",
                all,
                "g1",
                "c",
                "-1",
                "1-0",
                "IDLE",
                "99999999999999999999",
            ],
            &["XINFO", "NOSUCH"],
            &["XGROUP", "CREATE", all, "g3", "1-0", "ENTRIESREAD", "-7"],
        ]),
    );
    seeds
}

/// `[u32 length][body]`, as the Raft link frames a message.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// Samples with the names of their seed files.
type Named<T> = Vec<(&'static str, T)>;

/// One request of each kind and a few replies, as peers send them.
fn raft_messages() -> (
    Named<network::Envelope<network::Rpc>>,
    Named<network::ReplyEnvelope>,
) {
    use openraft::raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest,
        VoteResponse,
    };
    use openraft::{
        CommittedLeaderId, EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership, Vote,
    };
    use std::collections::{BTreeMap, BTreeSet};
    use stockgate_server::raft::{Batch, Entry, NodeInfo};

    let node = |port: u16| NodeInfo {
        raft_addr: format!("127.0.0.1:{}", port + 10_000),
        client_addr: format!("127.0.0.1:{port}"),
        incarnation: u64::from(port) << 20 | 0x5eed,
    };
    // Every request names the group and both incarnations; every reply its responder's.
    let env = |rpc| network::Envelope {
        group: 0x6a0f_c0de,
        from: 1,
        from_incarnation: node(7379).incarnation,
        to_incarnation: node(7380).incarnation,
        rpc,
    };
    let answer = |reply| network::ReplyEnvelope {
        incarnation: node(7380).incarnation,
        reply,
    };
    let vote = Vote::new_committed(3, 1);
    let log_id = |index| LogId::new(CommittedLeaderId::new(3, 1), index);
    let mut records = Vec::new();
    for ev in sample_events().iter().take(4) {
        encode_record(ev, &mut records).expect("sample event encodes");
    }
    let membership = Membership::new(
        vec![BTreeSet::from([1, 2, 3])],
        BTreeMap::from([(1, node(7379)), (2, node(7380)), (3, node(7381))]),
    );
    let entries = vec![
        Entry {
            log_id: log_id(5),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(6),
            payload: EntryPayload::Membership(membership.clone()),
        },
        Entry {
            log_id: log_id(7),
            payload: EntryPayload::Normal(Batch {
                origin: 0x5eed,
                first_lsn: 11,
                count: 4,
                records: records.into(),
            }),
        },
    ];
    let requests = vec![
        (
            "vote",
            network::Rpc::Vote(VoteRequest::new(Vote::new(4, 2), Some(log_id(7)))),
        ),
        (
            "append",
            network::Rpc::Append(AppendEntriesRequest {
                vote,
                prev_log_id: Some(log_id(4)),
                entries,
                leader_commit: Some(log_id(4)),
            }),
        ),
        (
            "snapshot",
            network::Rpc::Snapshot(InstallSnapshotRequest {
                vote,
                meta: SnapshotMeta {
                    last_log_id: Some(log_id(7)),
                    last_membership: StoredMembership::new(Some(log_id(6)), membership),
                    snapshot_id: "3-1-7-14".into(),
                },
                offset: 0,
                data: b"snapshot bytes".to_vec(),
                done: true,
            }),
        ),
        ("elect", network::Rpc::Elect),
        ("hello", network::Rpc::Hello),
        (
            "init",
            network::Rpc::Init {
                group: 0x6a0f_c0de,
                members: BTreeMap::from([(1, node(7379)), (2, node(7380)), (3, node(7381))]),
            },
        ),
    ];
    let requests = requests.into_iter().map(|(n, r)| (n, env(r))).collect();
    let replies = vec![
        (
            "append",
            network::RpcReply::Append(Ok(AppendEntriesResponse::Success)),
        ),
        (
            "vote",
            network::RpcReply::Vote(Ok(VoteResponse::new(vote, Some(log_id(7)), true))),
        ),
        ("elect", network::RpcReply::Elect(true)),
        (
            "hello",
            network::RpcReply::Hello(network::HelloReply {
                node: 2,
                incarnation: node(7380).incarnation,
                group: 0,
                pristine: true,
            }),
        ),
        ("init", network::RpcReply::Init(Ok(()))),
        (
            "refused",
            network::RpcReply::Refused("node 2 is of another group".into()),
        ),
    ];
    let replies = replies.into_iter().map(|(n, r)| (n, answer(r))).collect();
    (requests, replies)
}

/// LEB128, as the WAL codec writes integers.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `snap` as a snapshot file of an older `version`: version 2 has no history id, version
/// 1 no tombstones either (both are dropped from the state first).
fn older_snapshot(snap: &Snapshot, version: u8, lsn: Lsn) -> Vec<u8> {
    let mut s = snap.clone();
    s.rooms.clear();
    if version < 3 {
        s.history.clear();
    }
    if version < 2 {
        s.tombs.clear();
    }
    let file = encode_snapshot(&s, lsn);
    let mut payload = file[SNAPSHOT_HEADER_LEN..].to_vec();
    // No rooms is the count byte 0, the empty history id its one length byte, no
    // tombstones the count byte 0.
    payload.pop();
    if version < 3 {
        payload.pop();
    }
    if version < 2 {
        payload.pop();
    }
    payload[0] = version;
    frame_snapshot(&payload)
}

/// One event of every kind, in the order their `wal_record` seeds were first written
/// (`record-NN` is the NN-th), kinds added since at the end.
fn sample_events() -> Vec<Event> {
    use EventKind as K;
    let order = [
        K::SaleCreated,
        K::SaleAdjusted,
        K::SaleStateSet,
        K::Reserved,
        K::Released,
        K::Committed,
        K::Extended,
        K::Purged,
        K::SaleRebuilt,
        K::Opaque,
        K::HistoryBegun,
        K::SaleImported,
        K::SaleDropped,
        K::RoomOpened,
        K::RoomChanged,
    ];
    for kind in EventKind::ALL {
        assert!(order.contains(kind), "no wal_record seed of {kind:?}");
    }
    order.into_iter().map(sample_event).collect()
}

/// The sample event of `kind`: the match is exhaustive, so a new kind has a seed.
fn sample_event(kind: EventKind) -> Event {
    use stockgate_core::engine::SaleParams;
    let token = reservation_token("SKU-1", "alice", "req-1");
    let params = SaleParams {
        total: 1000,
        shards: 16,
        ttl_ms: 630_000,
        limit: 2,
    };
    match kind {
        EventKind::SaleCreated => Event::SaleCreated {
            sku: "SKU-1".into(),
            params,
            at_ms: START_MS,
        },
        EventKind::SaleAdjusted => Event::SaleAdjusted {
            sku: "SKU-1".into(),
            shard_deltas: vec![1, -1, 0, i64::MIN, i64::MAX],
        },
        EventKind::SaleStateSet => Event::SaleStateSet {
            sku: "SKU-1".into(),
            state: SaleState::Paused,
        },
        EventKind::Reserved => Event::Reserved {
            token,
            sku: "SKU-1".into(),
            user: "alice".into(),
            request_id: "req-1".into(),
            qty: 1,
            shard: 7,
            expires_at_ms: START_MS + 630_000,
            created_at_ms: START_MS,
        },
        EventKind::Released => Event::Released {
            token,
            at_ms: START_MS + 5,
            user: "alice".into(),
            request_id: "req-1".into(),
            qty: 1,
            reason: ReleaseReason::Cancel,
        },
        EventKind::Committed => Event::Committed {
            token,
            at_ms: u64::MAX,
            user: "alice".into(),
            request_id: "req-1".into(),
            qty: 1,
        },
        EventKind::Extended => Event::Extended {
            token,
            expires_at_ms: START_MS + 1_000_000,
            user: "alice".into(),
            request_id: "req-1".into(),
            qty: 1,
        },
        EventKind::Purged => Event::Purged { token },
        EventKind::SaleRebuilt => Event::SaleRebuilt {
            sku: "SKU-1".into(),
            total: 100,
            committed: 40,
            shard_available: vec![30, 30, 0, 0],
        },
        // A consumer-group record of the order feed (opaque to the engine).
        EventKind::Opaque => Event::Opaque {
            kind: stockgate_core::wal::record::K_GROUP_ACKED,
            body: vec![3, 1, 2, 3],
        },
        EventKind::HistoryBegun => Event::HistoryBegun {
            id: "0123456789abcdef0123456789abcdef".into(),
        },
        // A batch of a split import: the sale frozen, a record kind of its own.
        EventKind::SaleImported => Event::SaleImported {
            export: Box::new(SaleExport {
                fingerprint: "f00d".into(),
                sale: SaleView {
                    sku: "SKU-2".into(),
                    params: SaleParams {
                        shards: 1,
                        ..params
                    },
                    total: 1000,
                    available: 1000,
                    reserved: 0,
                    committed: 0,
                    state: SaleState::Moving { paused: false },
                    shard_available: vec![1000],
                },
                reservations: Vec::new(),
                tombs: Vec::new(),
                room: None,
            }),
        },
        EventKind::SaleDropped => Event::SaleDropped {
            sku: "SKU-2".into(),
        },
        // A waiting room: its settings, then an admission of the line's head.
        EventKind::RoomOpened => Event::RoomOpened {
            sku: "SKU-1".into(),
            config: stockgate_core::room::RoomConfig {
                opens_at_ms: START_MS,
                ..Default::default()
            },
            at_ms: START_MS,
        },
        EventKind::RoomChanged => Event::RoomChanged {
            sku: "SKU-1".into(),
            op: stockgate_core::room::RoomOp::Admit {
                upto_slot: 3,
                now_ms: START_MS,
            },
        },
    }
}

/// The state after a small scenario: committed, released and pending reservations, and a
/// fenced sale.
fn scenario_snapshot() -> Snapshot {
    let mut h = Harness::new(false);
    let a = admission("SKU-1", "alice");
    let t1 = reservation_token("SKU-1", "alice", "req-1");
    let t2 = reservation_token("SKU-1", "alice", "req-2");
    let mut out = BytesMut::new();
    for c in [
        vec!["SALE.CREATE", "SKU-1", "10", "SHARDS", "2"],
        vec!["RESERVE", "SKU-1", "alice", &a, "req-1"],
        vec!["RESERVE", "SKU-1", "alice", &a, "req-2"],
        vec!["RESERVE", "SKU-1", "alice", &a, "req-3", "QTY", "2"],
        vec!["COMMIT", &t1],
        vec!["RELEASE", &t2],
        vec!["SALE.FENCE", "SKU-2", "TOTAL", "3"],
    ] {
        let argv: Vec<Bytes> = c
            .iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        h.run(&argv, &mut out);
    }
    Harness::snapshot(&h.engine)
}
