//! The sweeper: heals the gap between the fast gate and the ledger (docs/design.md, lifecycle
//! step 4). Every interval it takes `EXPIRED` batches and, for each reservation, asks the
//! ledger first (the SQL-first rule) and only then acts on the server:
//!
//! - PENDING and expired → CANCELLED_BY_SWEEPER, then `RELEASE`;
//! - already CANCELLED_BY_SWEEPER / CANCELLED / REFUND_REQUIRED → `RELEASE` anyway (an
//!   earlier sweep or the checkout app died between the ledger and the release);
//! - COMMITTED → `COMMIT token VERIFIED` on the server (cleanup, no stock back; the
//!   ledger accepted the payment before the deadline, so the late hold may commit);
//! - no order → tombstone first (a late materialize is refused), then `RELEASE`.
//!
//! Before sweeping a sale, each pass checks that the server's state is one the ledger can
//! explain, and fails closed (`SALE.FENCE`, an error log naming the reason) when it is
//! not:
//! - the ledger holds more committed units than the server's total, or a live PENDING
//!   order whose token the server does not know: the server lost acknowledged state;
//! - the server's total exceeds the ledger's allocation by more than adjustments still in
//!   flight explain (someone ran `SALE.ADJUST` by hand, or a withdrawal never reached the
//!   server): it could sell units that do not exist. A total *below* the allocation only
//!   undersells: it is reported as loudly, and not fenced.
//!
//! For a COMMITTED order, the server's hold is committed only if it is the hold the
//! payment paid for ([`crate::ledger::Ledger::is_hold`]); another hold under the same
//! token (a retry after the paid one was purged or lost) is released instead.
//!
//! `RELEASE` is exactly-once on the server, so any number of sweepers may run at once.
//! If the ledger is unreachable nothing is released (the ledger decision comes first); if
//! the server is unreachable the pass stops; either way the sweeper logs, backs off and
//! retries, and the next pass finds the work where this one left it.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::client::ClientError;
use crate::gate::ReservationGate;
use crate::identity::{Bound, SaleOwner};
use crate::ledger::{Adjustment, Ledger, LedgerError, ReleaseReason, SaleRecord, SweepVerdict};
use crate::types::{now_ms, CommitOk, ExpiredReservation, ReservationState, SaleInfo};

/// Why a sweeper pass stopped; the sweeper logs it, backs off and retries.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The ledger call failed: nothing was released, since the ledger decides first.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The server call failed; the next pass finds the work where this one left it.
    #[error("server: {0}")]
    Gate(#[from] ClientError),
    /// The ledger and the server could not be shown to share one history (see
    /// [`IdentityError`](crate::identity::IdentityError)).
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// A fault injected through the `fail` crate (feature `failpoints`), standing for a
    /// crash at that point.
    #[error("injected fault at {0}")]
    Injected(&'static str),
}

/// Sweeper settings.
#[derive(Clone, Debug)]
pub struct SweeperConfig {
    /// Time between passes (default 30 s).
    pub interval: Duration,
    /// `EXPIRED COUNT` per batch.
    pub batch_size: usize,
    /// Only these SKUs (None: every sale the server or the ledger knows).
    pub skus: Option<Vec<String>>,
    /// Backoff after a failed pass: doubles from `interval / 10` up to this.
    pub max_backoff: Duration,
    /// Upper bound on batches per SKU per pass, so one pass cannot run forever.
    pub max_batches_per_pass: usize,
    /// How long an unconfirmed adjustment (recorded in the ledger, `SALE.ADJUST` not yet
    /// confirmed) may explain a difference between the server's total and the ledger's
    /// allocation before it counts as stuck. Covers the moment between the two steps of
    /// `stockgate-sweeper adjust`.
    pub adjust_grace: Duration,
    /// Check every live PENDING order's token on the server each pass (one `RESERVATION`
    /// per order, pipelined): a token the server does not know proves lost state.
    pub verify_pending: bool,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            interval: Duration::from_secs(30),
            batch_size: 500,
            skus: None,
            max_backoff: Duration::from_secs(30),
            max_batches_per_pass: 10_000,
            adjust_grace: Duration::from_secs(60),
            verify_pending: true,
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// `EXPIRED` batches taken.
    pub batches: u64,
    /// Expired reservations examined.
    pub seen: u64,
    /// `RELEASE` returned 1: units went back to stock because of this sweeper.
    pub released: u64,
    /// `RELEASE` returned 0: someone else (another sweeper) released it first.
    pub release_noop: u64,
    /// PENDING orders this pass cancelled (CANCELLED_BY_SWEEPER) and released.
    pub cancelled_now: u64,
    /// Orders an earlier sweep cancelled whose hold was still on the server, released now.
    pub recovered_cancelled_by_sweeper: u64,
    /// Orders the buyer cancelled whose hold was still on the server, released now.
    pub recovered_cancelled_by_buyer: u64,
    /// REFUND_REQUIRED orders whose hold was still on the server, released now.
    pub refund_released: u64,
    /// Holds with no order in the ledger: tombstoned (so a late materialize is refused), then
    /// released.
    pub tombstoned: u64,
    /// COMMITTED in the ledger → `COMMIT` on the server.
    pub commit_cleanup: u64,
    /// Holds left for a later pass: still PENDING and not expired by the ledger's clock, or busy.
    pub skipped: u64,
    /// Sales skipped because the server holds them fenced.
    pub fenced_skus: Vec<String>,
    /// Sales the ledger knows and the server does not (lost state): fenced by this pass.
    pub lost_skus: Vec<String>,
    /// Sales fenced by this pass because the ledger proves the server lost state or the
    /// server's total exceeds the ledger's allocation: (sku, why).
    pub fenced_now: Vec<(String, String)>,
    /// Sales whose server total differs from the ledger's allocation in a way no
    /// adjustment in flight explains: (sku, server total, ledger allocation).
    pub allocation_mismatch: Vec<(String, i64, u64)>,
    /// Holds released instead of committed: the ledger's order is paid, but the server's
    /// hold for its token is not the one the payment paid for.
    pub foreign_holds_released: u64,
    /// Sales of the ledger with no recorded history while it is bound to several: not
    /// swept, since no one can tell whose they are (`IdentityError::SaleUnassigned`).
    pub unassigned_skus: Vec<String>,
    /// The rebalance step's passes (with [`Sweeper::with_rebalance`]), one per split
    /// parent with a part on this group's history.
    pub rebalance: RebalanceSummary,
}

/// What the rebalance step of one sweeper pass did, parent by parent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebalanceSummary {
    /// Parents this pass rebalanced: (parent, what the pass did).
    pub ran: Vec<(String, String)>,
    /// Parents skipped because another rebalancer was running a pass of them.
    pub busy: Vec<String>,
    /// Parents whose pass failed: (parent, why). The next pass tries again.
    pub failed: Vec<(String, String)>,
}

impl RebalanceSummary {
    /// Whether the step had any parent to look at.
    pub fn is_empty(&self) -> bool {
        self.ran.is_empty() && self.busy.is_empty() && self.failed.is_empty()
    }
}

impl std::fmt::Display for RebalanceSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut items: Vec<String> = self
            .ran
            .iter()
            .map(|(p, what)| format!("{p}: {what}"))
            .collect();
        items.extend(
            self.busy
                .iter()
                .map(|p| format!("{p}: skipped, another rebalancer is running a pass")),
        );
        items.extend(
            self.failed
                .iter()
                .map(|(p, why)| format!("{p}: failed: {why}")),
        );
        f.write_str(&items.join("; "))
    }
}

/// A step the sweeper runs after each pass's sweep: the split sales' rebalance
/// (`crate::split::RebalanceStep`). Given the history this sweeper's server reports, it
/// takes the parents with a part there; it never fails the pass (a parent's failure is
/// reported and retried next pass).
pub trait RebalanceHook: Send + Sync {
    /// One pass over the parents with a part on `history`.
    fn pass<'a>(&'a self, history: &'a str) -> futures::future::BoxFuture<'a, RebalanceSummary>;
}

/// One readable line per pass (logs and `run --once`): what was seen, what each branch
/// did, and the sales fenced or found inconsistent ("none" when there are none).
impl std::fmt::Display for PassReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn list(f: &mut std::fmt::Formatter<'_>, items: &[String]) -> std::fmt::Result {
            if items.is_empty() {
                f.write_str("none")
            } else {
                f.write_str(&items.join(", "))
            }
        }
        write!(
            f,
            "{} expired seen in {} batches; released {} ({} cancelled now, {} cancelled by an \
             earlier sweep, {} cancelled by the buyer, {} to refund, {} without an order), \
             {} already released by another sweeper; {} paid and committed; {} foreign holds \
             released; {} skipped; fenced sales skipped: ",
            self.seen,
            self.batches,
            self.released,
            self.cancelled_now,
            self.recovered_cancelled_by_sweeper,
            self.recovered_cancelled_by_buyer,
            self.refund_released,
            self.tombstoned,
            self.release_noop,
            self.commit_cleanup,
            self.foreign_holds_released,
            self.skipped,
        )?;
        list(f, &self.fenced_skus)?;
        f.write_str("; lost by the server (fenced): ")?;
        list(f, &self.lost_skus)?;
        f.write_str("; fenced now: ")?;
        let why: Vec<String> = self
            .fenced_now
            .iter()
            .map(|(sku, why)| format!("{sku} ({why})"))
            .collect();
        list(f, &why)?;
        f.write_str("; allocation mismatch: ")?;
        let mismatch: Vec<String> = self
            .allocation_mismatch
            .iter()
            .map(|(sku, server, ledger)| {
                format!("{sku} (server total {server}, ledger allocation {ledger})")
            })
            .collect();
        list(f, &mismatch)?;
        if !self.unassigned_skus.is_empty() {
            f.write_str("; no recorded server history (not swept): ")?;
            list(f, &self.unassigned_skus)?;
        }
        if !self.rebalance.is_empty() {
            write!(f, "; rebalance: {}", self.rebalance)?;
        }
        Ok(())
    }
}

impl PassReport {
    fn absorb(&mut self, o: PassReport) {
        self.batches += o.batches;
        self.seen += o.seen;
        self.released += o.released;
        self.release_noop += o.release_noop;
        self.cancelled_now += o.cancelled_now;
        self.recovered_cancelled_by_sweeper += o.recovered_cancelled_by_sweeper;
        self.recovered_cancelled_by_buyer += o.recovered_cancelled_by_buyer;
        self.refund_released += o.refund_released;
        self.tombstoned += o.tombstoned;
        self.commit_cleanup += o.commit_cleanup;
        self.skipped += o.skipped;
        self.fenced_skus.extend(o.fenced_skus);
        self.lost_skus.extend(o.lost_skus);
        self.fenced_now.extend(o.fenced_now);
        self.allocation_mismatch.extend(o.allocation_mismatch);
        self.foreign_holds_released += o.foreign_holds_released;
    }
}

/// A sweeper over a ledger and a gate. Clone it to run several.
#[derive(Clone)]
pub struct Sweeper<L: Ledger, G: ReservationGate> {
    ledger: L,
    gate: G,
    cfg: SweeperConfig,
    rebalance: Option<std::sync::Arc<dyn RebalanceHook>>,
}

/// Stops a sweeper started with [`Sweeper::spawn`].
pub struct SweeperHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl SweeperHandle {
    /// Ask the task to stop after its current pass, and wait for it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

impl<L: Ledger, G: ReservationGate> Sweeper<L, G> {
    /// A sweeper deciding with `ledger` and acting through `gate`.
    pub fn new(ledger: L, gate: G, cfg: SweeperConfig) -> Self {
        Sweeper {
            ledger,
            gate,
            cfg,
            rebalance: None,
        }
    }

    /// Run `step` after every pass's sweep (`stockgate-sweeper run --rebalance`).
    pub fn with_rebalance(mut self, step: std::sync::Arc<dyn RebalanceHook>) -> Self {
        self.rebalance = Some(step);
        self
    }

    /// The settings it runs with.
    pub fn config(&self) -> &SweeperConfig {
        &self.cfg
    }

    /// Run passes every interval until `stop` turns true, backing off after failures.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let floor = (self.cfg.interval / 10).max(Duration::from_millis(50));
        let mut backoff = floor;
        loop {
            if *stop.borrow() {
                return;
            }
            let wait = match self.run_pass().await {
                Ok(r) => {
                    backoff = floor;
                    if r.seen > 0
                        || !r.lost_skus.is_empty()
                        || !r.fenced_now.is_empty()
                        || !r.allocation_mismatch.is_empty()
                        || !r.rebalance.failed.is_empty()
                    {
                        info!("sweeper pass: {r}");
                    } else {
                        debug!("sweeper pass: nothing expired");
                    }
                    self.cfg.interval
                }
                Err(e) => {
                    // Nothing after the failing step ran: the next pass resumes from the
                    // ledger's and the server's state, whatever this one got through.
                    warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "sweeper pass failed; backing off");
                    let w = backoff;
                    backoff = (backoff * 2).min(self.cfg.max_backoff.max(floor));
                    w
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Run as a background task (embedded deployments).
    pub fn spawn(self) -> SweeperHandle {
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(async move { self.run(rx).await });
        SweeperHandle { stop: tx, task }
    }

    /// One pass over every sale in scope.
    pub async fn run_pass(&self) -> Result<PassReport, SweepError> {
        let mut report = PassReport::default();
        // Every pass: behind a Sentinel or a load balancer, the server answering may
        // change between two passes.
        let bound = crate::identity::check_bound(&self.ledger, self.gate.history().await?).await?;
        for sku in self.skus_in_scope(&bound, &mut report).await? {
            match self.gate.sale_info(&sku).await? {
                None => {
                    // The ledger knows the sale, the server does not: its state was lost.
                    // Fail closed: fence it so it refuses reservations until a rebuild.
                    if let Some(sale) = self.ledger.sale(&sku).await? {
                        error!(sku = %sku, "server does not know a sale the ledger has: state lost; fencing it, run `stockgate-sweeper rebuild --sku {sku}`");
                        self.gate.fence(&sale).await?;
                        report.lost_skus.push(sku);
                    }
                }
                Some(info) if info.is_fenced() => {
                    warn!(sku = %sku, "sale is fenced (awaiting rebuild); not sweeping it");
                    report.fenced_skus.push(sku);
                }
                Some(info) => {
                    if let Some(sale) = self.ledger.sale(&sku).await? {
                        if let Some(why) =
                            self.check_against_ledger(&sale, &info, &mut report).await?
                        {
                            error!(sku = %sku, reason = %why, "fencing the sale: run `stockgate-sweeper rebuild --sku {sku}`");
                            self.gate.fence(&sale).await?;
                            report.fenced_now.push((sku, why));
                            continue;
                        }
                    }
                    let r = self.sweep_sku(&sku).await?;
                    report.absorb(r);
                }
            }
        }
        if let Some(step) = &self.rebalance {
            report.rebalance = step.pass(&bound.history).await;
        }
        Ok(report)
    }

    /// Whether the server's view of an open sale is one the ledger can explain. Returns
    /// why the sale must be fenced, if it must; a total below the allocation is recorded
    /// in `report` and logged, and does not fence (it can only undersell).
    async fn check_against_ledger(
        &self,
        sale: &SaleRecord,
        info: &SaleInfo,
        report: &mut PassReport,
    ) -> Result<Option<String>, SweepError> {
        let sku = sale.sku.as_str();
        if let Some(why) = self.lost_commits(sku, info).await? {
            return Ok(Some(why));
        }
        if self.cfg.verify_pending {
            if let Some(why) = self.lost_live_hold(sku).await? {
                return Ok(Some(why));
            }
        }
        self.check_allocation(sale, info.total, report).await
    }

    /// Check 1: paid units the server cannot hold: it lost commits (a truncated or old
    /// log). Purged reservations do not matter here: purge keeps the committed counter.
    async fn lost_commits(&self, sku: &str, info: &SaleInfo) -> Result<Option<String>, SweepError> {
        let totals = self.ledger.totals(sku).await?;
        if i128::from(totals.committed_units) > i128::from(info.total) {
            return Ok(Some(format!(
                "the ledger holds {} committed units but the server's total is {}: the server lost acknowledged state",
                totals.committed_units, info.total
            )));
        }
        Ok(None)
    }

    /// Check 2: a hold a payment may still commit, unknown to the server: it was
    /// acknowledged (materialize follows RESERVE) and then lost. Only live ones: an expired
    /// order is the sweeper's to cancel, and nothing can be paid for it any more.
    async fn lost_live_hold(&self, sku: &str) -> Result<Option<String>, SweepError> {
        let live = self.ledger.live_pending_orders(sku).await?;
        for chunk in live.chunks(64) {
            let found = join_all(chunk.iter().map(|o| self.gate.reservation(&o.token))).await;
            for (o, r) in chunk.iter().zip(found) {
                if r?.is_none() {
                    return Ok(Some(format!(
                        "live PENDING order {} (expires at {} ms) is unknown to the server: the server lost acknowledged state",
                        o.token, o.expires_at_ms
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Check 3: the allocation, one truth, the ledger's. A server total the ledger's
    /// unconfirmed adjustments explain is judged by [`Self::missing_adjustments`]; one
    /// nothing explains by [`unexplained_total`].
    async fn check_allocation(
        &self,
        sale: &SaleRecord,
        total: i64,
        report: &mut PassReport,
    ) -> Result<Option<String>, SweepError> {
        if i128::from(total) == i128::from(sale.allocation) {
            return Ok(None);
        }
        let unconfirmed = self.ledger.adjustments(&sale.sku, true).await?;
        Ok(match explain_total(total, sale.allocation, &unconfirmed) {
            Some(missing) => self.missing_adjustments(sale, total, &missing, report),
            None => unexplained_total(sale, total, report),
        })
    }

    /// A server total off the allocation by the adjustments `missing`: fine while they are
    /// all within the grace (in flight); past it, a total above the allocation fences (a
    /// withdrawal never reached the server) and one below is recorded and logged.
    fn missing_adjustments(
        &self,
        sale: &SaleRecord,
        total: i64,
        missing: &[&Adjustment],
        report: &mut PassReport,
    ) -> Option<String> {
        let sku = sale.sku.as_str();
        let now = now_ms();
        let grace = i64::try_from(self.cfg.adjust_grace.as_millis()).unwrap_or(i64::MAX);
        let in_flight = missing
            .iter()
            .all(|a| now.saturating_sub(a.created_at_ms) <= grace);
        let ids: Vec<&str> = missing.iter().map(|a| a.id.as_str()).collect();
        if in_flight {
            warn!(sku, server_total = total, ledger_allocation = sale.allocation, adjustments = ?ids,
                  "server total lags the ledger's allocation by adjustments still in flight");
            return None;
        }
        if i128::from(total) > i128::from(sale.allocation) {
            return Some(format!(
                "server total {total} exceeds the ledger's allocation {}: withdrawal(s) {ids:?} never reached the server",
                sale.allocation
            ));
        }
        error!(sku, server_total = total, ledger_allocation = sale.allocation, adjustments = ?ids,
               "server total is below the ledger's allocation: adjustment(s) never reached the server; re-run `stockgate-sweeper adjust` with the same --id");
        report
            .allocation_mismatch
            .push((sku.to_string(), total, sale.allocation));
        None
    }

    /// The sales this pass sweeps: those named (each checked to live on this server's
    /// history), else every sale the server lists and every sale the ledger records on
    /// this history. A sale of another group is never taken.
    async fn skus_in_scope(
        &self,
        bound: &Bound,
        report: &mut PassReport,
    ) -> Result<Vec<String>, SweepError> {
        let recorded: HashMap<String, Option<String>> =
            self.ledger.sale_histories().await?.into_iter().collect();
        if let Some(s) = &self.cfg.skus {
            for sku in s {
                self.check_named(bound, sku, recorded.get(sku)).await?;
            }
            return Ok(s.clone());
        }
        let mut set: BTreeSet<String> = BTreeSet::new();
        for sku in self.gate.sale_list().await? {
            if !recorded.contains_key(&sku) {
                set.insert(sku);
            }
        }
        for (sku, history) in &recorded {
            match bound.owner(history.as_deref()) {
                SaleOwner::Here => {
                    if history.is_none() {
                        self.ledger.record_sale_history(sku, &bound.history).await?;
                    }
                    set.insert(sku.clone());
                }
                SaleOwner::Elsewhere(_) => {}
                SaleOwner::Unassigned => {
                    if let Some(e) = bound.refusal(sku, &SaleOwner::Unassigned) {
                        warn!(sku = %sku, "{e}");
                    }
                    report.unassigned_skus.push(sku.clone());
                }
            }
        }
        Ok(set.into_iter().collect())
    }

    /// A sale named with `--sku` must live here. One with no recorded history, on a
    /// ledger bound to several, is recorded as this server's if the server has it.
    async fn check_named(
        &self,
        bound: &Bound,
        sku: &str,
        recorded: Option<&Option<String>>,
    ) -> Result<(), SweepError> {
        let Some(history) = recorded else {
            return Ok(());
        };
        let owner = bound.owner(history.as_deref());
        let claim = match owner {
            SaleOwner::Here => history.is_none(),
            SaleOwner::Unassigned => self.gate.sale_info(sku).await?.is_some(),
            SaleOwner::Elsewhere(_) => false,
        };
        if claim {
            self.ledger.record_sale_history(sku, &bound.history).await?;
            return Ok(());
        }
        match bound.refusal(sku, &owner) {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Batches of one SKU until nothing more can be done in this pass.
    pub async fn sweep_sku(&self, sku: &str) -> Result<PassReport, SweepError> {
        let mut report = PassReport::default();
        for _ in 0..self.cfg.max_batches_per_pass {
            if !self.sweep_batch(sku, &mut report).await? {
                break;
            }
        }
        Ok(report)
    }

    /// One batch of `sku`'s expired reservations, counted in `report`: `false` when
    /// asking for another batch in this pass would be no use.
    async fn sweep_batch(&self, sku: &str, report: &mut PassReport) -> Result<bool, SweepError> {
        let batch = self.gate.expired(self.cfg.batch_size, Some(sku)).await?;
        if batch.is_empty() {
            return Ok(false);
        }
        let full = batch.len() >= self.cfg.batch_size;
        report.batches += 1;
        report.seen += batch.len() as u64;

        // The ledger decides first; everything it decided is durable from here on.
        let verdicts = self.ledger.reconcile_expired(&batch).await?;

        // A crash here (after the ledger, before the server) is what the recovery
        // branches exist for; the fault tests inject it.
        #[cfg(feature = "failpoints")]
        fail::fail_point!("sweeper::after_ledger", |_| Err(SweepError::Injected(
            "sweeper::after_ledger"
        )));

        let (to_release, to_commit) = sort_verdicts(&batch, &verdicts, report);

        let mut first_err = None;
        self.release_expired(&to_release, report, &mut first_err)
            .await;
        // Commit only the holds the payments paid for; another hold under a paid token
        // (created after the paid one was purged or lost) is given back instead.
        let foreign_before = report.foreign_holds_released;
        let to_commit = self.paid_holds(to_commit, report, &mut first_err).await?;
        let foreign =
            usize::try_from(report.foreign_holds_released - foreign_before).unwrap_or(usize::MAX);
        self.commit_paid(&to_commit, report, &mut first_err).await?;
        if let Some(e) = first_err {
            return Err(e.into());
        }
        let progress = to_release.len() + to_commit.len() + foreign;
        // With no progress, only skipped items are left at the head of the list (or
        // nothing more): asking again would return the same ones.
        Ok(progress != 0 && full)
    }

    /// Releases the holds the ledger gave back, counting the outcomes; the first error
    /// goes to `first_err`, the others are dropped.
    async fn release_expired(
        &self,
        to_release: &[String],
        report: &mut PassReport,
        first_err: &mut Option<ClientError>,
    ) {
        // Every hold the sweeper releases is past its deadline, whatever the ledger
        // says of the order.
        let why = Some(stockgate_core::engine::ReleaseReason::Expired);
        for r in self.gate.release_many(to_release, why).await {
            match r {
                Ok(true) => report.released += 1,
                Ok(false) => report.release_noop += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }

    /// Commits the paid holds on the server, counting them; a hold the server released
    /// although the ledger sold it is marked for a refund.
    async fn commit_paid(
        &self,
        to_commit: &[String],
        report: &mut PassReport,
        first_err: &mut Option<ClientError>,
    ) -> Result<(), SweepError> {
        for (token, r) in to_commit
            .iter()
            .zip(self.gate.commit_verified_many(to_commit).await)
        {
            match r {
                Ok(CommitOk::Committed) | Ok(CommitOk::AlreadyCommitted) => {
                    report.commit_cleanup += 1
                }
                Err(ClientError::Released) => {
                    // Sold in the ledger, yet its units went back to stock: they may be
                    // sold again. Never a sale beyond stock: compensate.
                    error!(token = %token, "ledger COMMITTED but server RELEASED: marking REFUND_REQUIRED");
                    self.ledger
                        .mark_refund_required(
                            token,
                            None,
                            "server released a committed reservation",
                        )
                        .await?;
                }
                Err(ClientError::NoReservation) => {
                    warn!(token = %token, "ledger COMMITTED but server has no such reservation");
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Ok(())
    }

    /// Of the COMMITTED orders' tokens, those whose server hold is the one the ledger's
    /// order paid for. The others (RESERVED, but another hold) are released and counted.
    async fn paid_holds(
        &self,
        tokens: Vec<String>,
        report: &mut PassReport,
        first_err: &mut Option<ClientError>,
    ) -> Result<Vec<String>, SweepError> {
        let mut out = Vec::with_capacity(tokens.len());
        for token in tokens {
            let r = match self.gate.reservation(&token).await {
                Ok(r) => r,
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            let foreign = match &r {
                Some(r) if r.state == ReservationState::Reserved => {
                    !self.ledger.is_hold(&token, r).await?
                }
                _ => false,
            };
            match r {
                Some(r) if foreign => {
                    error!(
                        token = %token,
                        server_qty = r.qty,
                        server_created_at_ms = r.created_at_ms,
                        server_expires_at_ms = r.expires_at_ms,
                        "ledger COMMITTED, but the server's hold for this token is not the one the payment paid for: releasing it, not committing it"
                    );
                    match self.gate.release(&token, None).await {
                        Ok(_) => report.foreign_holds_released += 1,
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                // The paid hold (or a finished one: COMMIT then answers what it is).
                _ => out.push(token),
            }
        }
        Ok(out)
    }
}

/// The ledger's verdicts on a batch, counted in `report`: the tokens to release and the
/// tokens to commit on the server, in the batch's order.
fn sort_verdicts(
    batch: &[ExpiredReservation],
    verdicts: &[SweepVerdict],
    report: &mut PassReport,
) -> (Vec<String>, Vec<String>) {
    let mut to_release = Vec::new();
    let mut to_commit = Vec::new();
    for (item, v) in batch.iter().zip(verdicts) {
        match v {
            SweepVerdict::Release(reason) => {
                match reason {
                    ReleaseReason::CancelledNow => report.cancelled_now += 1,
                    ReleaseReason::AlreadyCancelledBySweeper => {
                        report.recovered_cancelled_by_sweeper += 1
                    }
                    ReleaseReason::CancelledByBuyer => report.recovered_cancelled_by_buyer += 1,
                    ReleaseReason::Refund => report.refund_released += 1,
                    ReleaseReason::Tombstoned => report.tombstoned += 1,
                }
                to_release.push(item.token.clone());
            }
            SweepVerdict::CommitCleanup => to_commit.push(item.token.clone()),
            SweepVerdict::Skip => report.skipped += 1,
        }
    }
    (to_release, to_commit)
}

/// A server total off the allocation that no recorded adjustment explains (`SALE.ADJUST`
/// run by hand?): recorded in `report`; one above the allocation fences (it could sell units
/// that do not exist), one below is logged.
fn unexplained_total(sale: &SaleRecord, total: i64, report: &mut PassReport) -> Option<String> {
    let sku = sale.sku.as_str();
    report
        .allocation_mismatch
        .push((sku.to_string(), total, sale.allocation));
    if i128::from(total) > i128::from(sale.allocation) {
        return Some(format!(
            "server total {total} exceeds the ledger's allocation {} and no recorded adjustment explains it (SALE.ADJUST run by hand?): it could sell units that do not exist",
            sale.allocation
        ));
    }
    error!(sku, server_total = total, ledger_allocation = sale.allocation,
           "server total is below the ledger's allocation and no recorded adjustment explains it (SALE.ADJUST run by hand?); record it with `stockgate-sweeper adjust` or rebuild with --fence");
    None
}

/// The unconfirmed adjustments whose deltas the server's total lacks, if some subset of
/// them explains `total` exactly (`total == allocation − Σ subset`): the smallest such set,
/// None if none does. At most 16 are considered (more unconfirmed adjustments than that
/// is itself something an operator must look at).
pub(crate) fn explain_total(
    total: i64,
    allocation: u64,
    unconfirmed: &[Adjustment],
) -> Option<Vec<&Adjustment>> {
    let missing = i128::from(allocation) - i128::from(total);
    let items = &unconfirmed[..unconfirmed.len().min(16)];
    let mut best: Option<u32> = None;
    for mask in 1u32..(1u32 << items.len()) {
        let sum: i128 = items
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, a)| i128::from(a.delta))
            .sum();
        if sum == missing && best.is_none_or(|b| mask.count_ones() < b.count_ones()) {
            best = Some(mask);
        }
    }
    best.map(|mask| {
        items
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, a)| a)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::PassReport;

    #[test]
    fn a_pass_is_one_readable_line() {
        let r = PassReport {
            batches: 1,
            seen: 7,
            released: 5,
            cancelled_now: 4,
            tombstoned: 1,
            commit_cleanup: 2,
            lost_skus: vec!["LOST-1".into()],
            fenced_now: vec![("LOST-1".into(), "unknown to the server".into())],
            allocation_mismatch: vec![("LOW".into(), 90, 100)],
            ..PassReport::default()
        };
        let line = r.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(!line.contains("PassReport"), "{line}");
        assert_eq!(
            line,
            "7 expired seen in 1 batches; released 5 (4 cancelled now, 0 cancelled by an \
             earlier sweep, 0 cancelled by the buyer, 0 to refund, 1 without an order), 0 \
             already released by another sweeper; 2 paid and committed; 0 foreign holds \
             released; 0 skipped; fenced sales skipped: none; lost by the server (fenced): \
             LOST-1; fenced now: LOST-1 (unknown to the server); allocation mismatch: LOW \
             (server total 90, ledger allocation 100)"
        );
    }
}
