//! Operational metrics, as a store the commands record into: per-command counters and
//! latency histograms, error counts per error code, the slow log, reserve outcomes per
//! sale and admission denials by reason (from the engine's typed outcome or refusal, never
//! from the reply's text). `INFO`, `LATENCY HISTOGRAM`, `SLOWLOG`, the Prometheus/JSON
//! endpoint (`crate::report`) read these.
//!
//! Cost on the hot path: a connection records each command into its own [`Recorder`]
//! (two clock reads, a table lookup, a push into a local vector) and publishes the batch
//! once, before the batch's replies are written, into the stripe of the worker thread it
//! runs on (one uncontended lock per pipelined batch). Readers merge all stripes. Per-sale
//! outcome counters are striped per thread the same way, so two threads selling the same
//! hot SKU never share a cache line.
//!
//! The store knows no command: a command is a slot index and a name that the caller
//! (`cmd::timed`) passes in. It depends only on the engine's public types.

pub mod logging;
pub mod slowlog;
pub mod sys;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam::utils::CachePadded;
use hdrhistogram::Histogram;
use parking_lot::{Mutex, RwLock};

use crate::engine::{Denied, EngineError, ReserveOutcome};

pub use slowlog::{SlowEntry, SlowLog};

/// Stripes for per-thread accumulation. More than the worker threads of any sane
/// deployment; a collision only costs contention, never correctness.
const STRIPES: usize = 16;
/// Command slots a store keeps: more than the command table has; a slot beyond it is
/// not counted (slots come from the table, never from a client).
pub const MAX_COMMANDS: usize = 256;
/// Distinct error codes tracked, as Redis's `ERROR_STATS_NUMBER`: a client inventing
/// error codes cannot grow the table without bound.
pub const MAX_ERROR_CODES: usize = 128;
/// Sales whose outcomes are tracked individually; later ones are counted under
/// [`OTHER_SALES`]. Bounds memory (≈ 2 KiB per tracked sale).
pub const MAX_TRACKED_SALES: usize = 1024;
/// The label sales beyond [`MAX_TRACKED_SALES`] are counted under.
pub const OTHER_SALES: &str = "_other";
/// Redis's histogram range and precision: 1 ns .. 1 s, two significant digits.
const HIST_MIN_NS: u64 = 1;
const HIST_MAX_NS: u64 = 1_000_000_000;
const HIST_SIGFIG: u8 = 2;
/// One sample per second for the status page's chart: ten minutes.
pub const HISTORY_LEN: usize = 600;

/// Per-sale outcome counter slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum SaleEvent {
    /// `RESERVE` took units.
    Reserved = 0,
    /// `RESERVE` repeated an earlier request and got its reservation back without taking more.
    Replay,
    /// `RESERVE` found too few units left.
    SoldOut,
    /// `RESERVE` would pass the per-user limit.
    Limit,
    /// `RESERVE` refused by admission (a missing, expired or wrong token).
    Denied,
    /// `RESERVE` on a paused sale.
    Paused,
    /// `RESERVE` on a fenced sale.
    Fenced,
    /// A reservation released (cancelled, expired or by an operator).
    Release,
    /// A reservation committed (sold).
    Commit,
}
/// How many [`SaleEvent`] slots there are.
pub const SALE_EVENTS: usize = 9;
/// The name of each [`SaleEvent`] slot, as `INFO` and the Prometheus labels show it.
pub const SALE_EVENT_NAMES: [&str; SALE_EVENTS] = [
    "reserved", "replay", "soldout", "limit", "denied", "paused", "fenced", "release", "commit",
];

/// Admission denials are counted per reason, one slot per [`Denied`] variant.
pub const DENIAL_REASONS: usize = Denied::ALL.len();

fn new_hist() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(HIST_MIN_NS, HIST_MAX_NS, HIST_SIGFIG).ok()
}

thread_local! {
    /// The stripe this thread publishes into, assigned round-robin on first use.
    static STRIPE: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
    };
}

fn my_stripe() -> usize {
    STRIPE.with(|s| *s)
}

#[derive(Default)]
struct CmdCell {
    /// The command's name, set by its first sample ("" until then).
    name: &'static str,
    calls: u64,
    nanos: u64,
    rejected: u64,
    failed: u64,
    /// Allocated on the first call: most commands are never used.
    hist: Option<Box<Histogram<u64>>>,
}

#[derive(Default)]
struct Stripe {
    cmds: Vec<CmdCell>,
    errors: HashMap<Box<str>, u64>,
    error_replies: u64,
}

/// `N` counters, one cache-line-padded row per stripe: threads counting the same event
/// never share a cache line.
pub struct Striped<const N: usize> {
    rows: Box<[CachePadded<[AtomicU64; N]>]>,
}

/// One sale's outcome counters, indexed by [`SaleEvent`].
pub type SaleCounters = Striped<SALE_EVENTS>;

impl<const N: usize> Striped<N> {
    fn new() -> Self {
        Striped {
            rows: (0..STRIPES)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    fn add(&self, slot: usize) {
        if let Some(c) = self.rows[my_stripe()].get(slot) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sums every stripe's row: the counters' values at about this moment.
    pub fn totals(&self) -> [u64; N] {
        let mut out = [0u64; N];
        for row in self.rows.iter() {
            for (o, c) in out.iter_mut().zip(row.iter()) {
                *o += c.load(Ordering::Relaxed);
            }
        }
        out
    }

    fn reset(&self) {
        for row in self.rows.iter() {
            for c in row.iter() {
                c.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// Merged counters of one command.
#[derive(Clone, Default)]
pub struct CmdStats {
    /// The command's name, lower case.
    pub name: &'static str,
    /// Calls that ran (`calls` in `INFO commandstats`).
    pub calls: u64,
    /// Total time those calls took, in ns.
    pub nanos: u64,
    /// Calls refused before running: arity, NOAUTH, NOPERM (`rejected_calls`).
    pub rejected: u64,
    /// Calls that ran and answered an error (`failed_calls`).
    pub failed: u64,
    /// Latency of the calls in ns, for the percentiles; `None` when the command was never called.
    pub hist: Option<Histogram<u64>>,
}

impl CmdStats {
    /// Total time in µs (`usec` in `INFO commandstats`).
    pub fn usec(&self) -> u64 {
        self.nanos / 1000
    }
    /// Mean time per call in µs (`usec_per_call`), 0 when never called.
    pub fn usec_per_call(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.nanos as f64 / 1000.0 / self.calls as f64
        }
    }
}

/// One point of the status page's rate chart.
#[derive(Clone, Copy, Debug, Default)]
pub struct HistoryPoint {
    /// When the sample was taken, in ms since the Unix epoch.
    pub unix_ms: u64,
    /// Commands run up to then (a running total; the chart plots differences).
    pub commands: u64,
    /// Units reserved up to then.
    pub reserved: u64,
    /// `RESERVE` calls that found the sale sold out, up to then.
    pub soldout: u64,
    /// Error replies up to then.
    pub errors: u64,
}

/// The server's metrics store: commands, errors, sale outcomes and denials record into it, and
/// `INFO`, Prometheus and the status page read from it.
pub struct Metrics {
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    sales: RwLock<HashMap<Arc<str>, Arc<SaleCounters>>>,
    other_sales: Arc<SaleCounters>,
    /// Admission denials by reason, indexed by `Denied as usize`.
    denials: Striped<DENIAL_REASONS>,
    /// The slow log (`SLOWLOG`).
    pub slowlog: Mutex<SlowLog>,
    /// µs; negative disables the slow log, 0 logs every command (Redis semantics).
    pub slowlog_slower_than: AtomicI64,
    /// Sales shown with their own `sku` label on the Prometheus endpoint.
    pub max_label_sales: AtomicUsize,
    /// The last [`HISTORY_LEN`] one-second samples for the status page's chart, oldest first.
    pub history: Mutex<VecDeque<HistoryPoint>>,
    /// Highest allocated memory `INFO memory` has seen, in bytes (`used_memory_peak`).
    pub peak_memory: AtomicU64,
    /// `master_replid` of INFO replication: random per process, as Redis's.
    pub run_id: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// An empty store with a fresh random run id.
    pub fn new() -> Self {
        let run_id: String = (0..40)
            .map(|_| char::from(b"0123456789abcdef"[rand::random::<usize>() % 16]))
            .collect();
        Metrics {
            stripes: (0..STRIPES)
                .map(|_| CachePadded::new(Mutex::new(Stripe::default())))
                .collect(),
            sales: RwLock::new(HashMap::new()),
            other_sales: Arc::new(SaleCounters::new()),
            denials: Striped::new(),
            slowlog: Mutex::new(SlowLog::new(128)),
            slowlog_slower_than: AtomicI64::new(10_000),
            max_label_sales: AtomicUsize::new(50),
            history: Mutex::new(VecDeque::with_capacity(HISTORY_LEN)),
            peak_memory: AtomicU64::new(0),
            run_id,
        }
    }

    /// Applies the command-line settings (`--slowlog-*`, `--metrics-max-sales`).
    pub fn configure(&self, slower_than_us: i64, slowlog_max_len: usize, max_label_sales: usize) {
        self.slowlog_slower_than
            .store(slower_than_us, Ordering::Relaxed);
        self.slowlog.lock().set_max_len(slowlog_max_len);
        self.max_label_sales
            .store(max_label_sales, Ordering::Relaxed);
    }

    fn sale_counters(&self, sku: &[u8]) -> Arc<SaleCounters> {
        let Ok(sku) = std::str::from_utf8(sku) else {
            return self.other_sales.clone();
        };
        if let Some(c) = self.sales.read().get(sku) {
            return c.clone();
        }
        let mut w = self.sales.write();
        if let Some(c) = w.get(sku) {
            return c.clone();
        }
        if w.len() >= MAX_TRACKED_SALES {
            return self.other_sales.clone();
        }
        let c = Arc::new(SaleCounters::new());
        w.insert(Arc::from(sku), c.clone());
        c
    }

    /// Outcome totals of one sale (zeros if it never saw a command).
    pub fn sale_totals(&self, sku: &str) -> [u64; SALE_EVENTS] {
        self.sales
            .read()
            .get(sku)
            .map(|c| c.totals())
            .unwrap_or([0; SALE_EVENTS])
    }

    /// Outcomes of sales beyond [`MAX_TRACKED_SALES`].
    pub fn other_sale_totals(&self) -> [u64; SALE_EVENTS] {
        self.other_sales.totals()
    }

    /// RESERVE outcomes summed over every sale (INFO stats' `reserve_*`).
    pub fn reserve_totals(&self) -> [u64; SALE_EVENTS] {
        let mut out = self.other_sales.totals();
        for c in self.sales.read().values() {
            for (o, n) in out.iter_mut().zip(c.totals()) {
                *o += n;
            }
        }
        out
    }

    /// A command that took `micros` goes to the slow log if it is over the threshold.
    pub fn log_if_slow(&self, name: &str, argv: &[&[u8]], micros: u64, addr: &str, client: &str) {
        let slower = self.slowlog_slower_than.load(Ordering::Relaxed);
        if slower >= 0 && micros as i64 >= slower {
            self.slowlog.lock().push(name, argv, micros, addr, client);
        }
    }

    /// A RESERVE the engine refused, from its typed error: a denial by its reason, and
    /// the refusals a sale counts (denied, paused, fenced). Other errors (no such sale,
    /// bad arguments) have no sale to count against.
    pub fn count_reserve_error(&self, sku: &str, e: &EngineError) {
        let ev = match e {
            EngineError::Denied(why) => {
                self.denials.add(*why as usize);
                SaleEvent::Denied
            }
            EngineError::Paused => SaleEvent::Paused,
            EngineError::Fenced => SaleEvent::Fenced,
            _ => return,
        };
        self.sale_counters(sku.as_bytes()).add(ev as usize);
    }

    /// Admission denials by reason, in [`Denied::ALL`] order.
    pub fn denials(&self) -> [(Denied, u64); DENIAL_REASONS] {
        let t = self.denials.totals();
        std::array::from_fn(|i| (Denied::ALL[i], t[i]))
    }

    /// The merged counters of every command recorded since the start (or the last
    /// reset), in slot order (the command table's).
    pub fn commands(&self) -> Vec<CmdStats> {
        let mut out: Vec<CmdStats> = Vec::new();
        for s in self.stripes.iter() {
            let stripe = s.lock();
            if out.len() < stripe.cmds.len() {
                out.resize_with(stripe.cmds.len(), CmdStats::default);
            }
            for (o, c) in out.iter_mut().zip(stripe.cmds.iter()) {
                if o.name.is_empty() {
                    o.name = c.name;
                }
                o.calls += c.calls;
                o.nanos += c.nanos;
                o.rejected += c.rejected;
                o.failed += c.failed;
                if let Some(h) = &c.hist {
                    match &mut o.hist {
                        Some(m) => {
                            // Same bounds on both sides: cannot fail.
                            let _ = m.add(h.as_ref());
                        }
                        None => o.hist = Some(h.as_ref().clone()),
                    }
                }
            }
        }
        out.retain(|c| !c.name.is_empty());
        out
    }

    /// Error replies per error code (the first word of the error), sorted by code, and
    /// the total number of error replies.
    pub fn errors(&self) -> (Vec<(String, u64)>, u64) {
        let mut m: HashMap<String, u64> = HashMap::new();
        let mut total = 0;
        for s in self.stripes.iter() {
            let stripe = s.lock();
            total += stripe.error_replies;
            for (k, v) in &stripe.errors {
                *m.entry(k.to_string()).or_default() += v;
            }
        }
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort();
        (v, total)
    }

    /// `CONFIG RESETSTAT`: command, error, denial and sale-outcome counters back to zero.
    pub fn reset(&self) {
        for s in self.stripes.iter() {
            let mut stripe = s.lock();
            for c in stripe.cmds.iter_mut() {
                *c = CmdCell::default();
            }
            stripe.errors.clear();
            stripe.error_replies = 0;
        }
        for c in self.sales.read().values() {
            c.reset();
        }
        self.other_sales.reset();
        self.denials.reset();
        self.history.lock().clear();
    }

    /// Appends a chart point (called once a second by the sampler).
    pub fn push_history(&self, p: HistoryPoint) {
        let mut h = self.history.lock();
        if h.len() >= HISTORY_LEN {
            h.pop_front();
        }
        h.push_back(p);
    }
}

/// How a command ended, as Redis's commandstats counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Ran and answered.
    Ok,
    /// Ran and answered an error (`failed_calls`).
    Failed,
    /// Refused before running: arity, NOAUTH, NOPERM (`rejected_calls`, not a call).
    Rejected,
}

struct Sample {
    cmd: u16,
    name: &'static str,
    nanos: u64,
    kind: CallKind,
}

/// A connection's accumulator: commands of the current batch, published by
/// [`Recorder::flush`] before the batch's replies leave.
pub struct Recorder {
    samples: Vec<Sample>,
    errors: Vec<Box<str>>,
    /// The last sale this connection touched: a hot connection sells one SKU, so the
    /// shared map is consulted once, not per command.
    sale: Option<(Box<[u8]>, Arc<SaleCounters>)>,
    /// The last command name as the client spelled it, and its slot: a connection
    /// mostly repeats one command, so an exact byte compare usually finds it.
    /// (A copy, not a `Bytes` clone, which would pin the whole read buffer.)
    last_name: ([u8; 24], usize),
    last_cmd: usize,
    /// When the previous command of this batch ended (`None` between batches, so idle
    /// time is never counted).
    last_end: Option<Instant>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            samples: Vec::with_capacity(32),
            errors: Vec::new(),
            sale: None,
            last_name: ([0; 24], usize::MAX),
            last_cmd: 0,
            last_end: None,
        }
    }
}

/// The `{sku}` hash tag a reservation token starts with.
fn token_sku(token: &[u8]) -> Option<&[u8]> {
    let rest = token.strip_prefix(b"{")?;
    let end = rest.iter().position(|&b| b == b'}')?;
    (end > 0).then(|| &rest[..end])
}

/// The error code of an error reply: its first word, as Redis's errorstats.
pub fn error_code(e: &str) -> &str {
    e.split(' ').next().unwrap_or(e)
}

impl Recorder {
    /// When a command's time starts: within a batch, where the previous one's ended (so
    /// it includes its own parsing); otherwise now. One clock read per command: a clock
    /// read costs 50-70 ns on this project's VMs, as much as everything else recorded.
    pub fn start(&mut self) -> Instant {
        self.last_end.take().unwrap_or_else(Instant::now)
    }

    /// Ends the command started at `t0`: its time in nanoseconds.
    pub fn stop(&mut self, t0: Instant) -> u64 {
        let t1 = Instant::now();
        self.last_end = Some(t1);
        t1.saturating_duration_since(t0).as_nanos() as u64
    }

    /// The slot of the command `name`, remembered from the previous call when the client
    /// spelled it the same way, else found by `find` (`None`: no such command).
    pub fn slot(
        &mut self,
        name: &[u8],
        find: impl FnOnce(&[u8]) -> Option<usize>,
    ) -> Option<usize> {
        let (buf, len) = &self.last_name;
        if *len == name.len() && buf[..*len] == name[..] {
            return Some(self.last_cmd);
        }
        let i = find(name);
        if let (Some(i), Some(dst)) = (i, self.last_name.0.get_mut(..name.len())) {
            dst.copy_from_slice(name);
            self.last_name.1 = name.len();
            self.last_cmd = i;
        }
        i
    }

    /// An error reply, counted under its code.
    pub fn error(&mut self, e: &str) {
        self.errors.push(error_code(e).into());
    }

    /// One command of slot `cmd` that took `nanos`.
    pub fn sample(&mut self, cmd: usize, name: &'static str, nanos: u64, kind: CallKind) {
        let Ok(cmd) = u16::try_from(cmd) else { return };
        self.samples.push(Sample {
            cmd,
            name,
            nanos,
            kind,
        });
    }

    /// A RESERVE the engine answered, counted against its sale from the typed outcome.
    pub fn count_reserve(&mut self, m: &Metrics, sku: &str, outcome: &ReserveOutcome) {
        let ev = match outcome {
            ReserveOutcome::Reserved { .. } => SaleEvent::Reserved,
            ReserveOutcome::Replay { .. } => SaleEvent::Replay,
            ReserveOutcome::SoldOut => SaleEvent::SoldOut,
            ReserveOutcome::Limit { .. } => SaleEvent::Limit,
        };
        self.count_sale(m, sku.as_bytes(), ev);
    }

    /// A reservation that RELEASE or COMMIT finished (`ev`), counted against the sale
    /// its token's `{sku}` hash tag names.
    pub fn count_finished(&mut self, m: &Metrics, token: &str, ev: SaleEvent) {
        if let Some(sku) = token_sku(token.as_bytes()) {
            self.count_sale(m, sku, ev);
        }
    }

    /// One `ev` of the sale `sku`.
    pub fn count_sale(&mut self, m: &Metrics, sku: &[u8], ev: SaleEvent) {
        match &self.sale {
            Some((k, c)) if k.as_ref() == sku => c.add(ev as usize),
            _ => {
                let c = m.sale_counters(sku);
                c.add(ev as usize);
                self.sale = Some((sku.into(), c));
            }
        }
    }

    /// Publishes what this connection recorded since the last flush.
    pub fn flush(&mut self, m: &Metrics) {
        self.last_end = None;
        if self.samples.is_empty() && self.errors.is_empty() {
            return;
        }
        let mut stripe = m.stripes[my_stripe()].lock();
        for s in self.samples.drain(..) {
            let slot = s.cmd as usize;
            if slot >= MAX_COMMANDS {
                continue;
            }
            if stripe.cmds.len() <= slot {
                stripe.cmds.resize_with(slot + 1, CmdCell::default);
            }
            let Some(c) = stripe.cmds.get_mut(slot) else {
                continue;
            };
            c.name = s.name;
            match s.kind {
                CallKind::Rejected => {
                    c.rejected += 1;
                    continue;
                }
                CallKind::Failed => c.failed += 1,
                CallKind::Ok => {}
            }
            c.calls += 1;
            c.nanos += s.nanos;
            if c.hist.is_none() {
                c.hist = new_hist().map(Box::new);
            }
            if let Some(h) = c.hist.as_mut() {
                h.saturating_record(s.nanos.clamp(HIST_MIN_NS, HIST_MAX_NS));
            }
        }
        for code in self.errors.drain(..) {
            stripe.error_replies += 1;
            if let Some(n) = stripe.errors.get_mut(&code) {
                *n += 1;
            } else if stripe.errors.len() < MAX_ERROR_CODES {
                stripe.errors.insert(code, 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_bounded() {
        let m = Metrics::new();
        let mut r = Recorder::default();
        for i in 0..(MAX_ERROR_CODES + 50) {
            r.error(&format!("E{i} something"));
        }
        r.flush(&m);
        let (codes, total) = m.errors();
        assert_eq!(codes.len(), MAX_ERROR_CODES);
        assert_eq!(total, (MAX_ERROR_CODES + 50) as u64);
    }

    #[test]
    fn commands_keep_slot_order_and_drop_unrecorded_slots() {
        let m = Metrics::new();
        let mut r = Recorder::default();
        r.sample(7, "seven", 1_000, CallKind::Ok);
        r.sample(2, "two", 1_000, CallKind::Rejected);
        r.flush(&m);
        let names: Vec<_> = m.commands().iter().map(|c| c.name).collect();
        assert_eq!(names, ["two", "seven"]);
        m.reset();
        assert!(m.commands().is_empty());
    }
}
