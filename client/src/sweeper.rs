//! The sweeper: heals the gap between the fast gate and the ledger (DESIGN.md, lifecycle
//! step 4). Every interval it takes `EXPIRED` batches and, for each reservation, asks the
//! ledger first (the SQL-first rule) and only then acts on the server:
//!
//! - PENDING and expired → CANCELLED_BY_SWEEPER, then `RELEASE`;
//! - already CANCELLED_BY_SWEEPER / CANCELLED / REFUND_REQUIRED → `RELEASE` anyway (an
//!   earlier sweep or the checkout app died between the ledger and the release);
//! - COMMITTED → `COMMIT` on the server (cleanup, no stock back);
//! - no order → tombstone first (a late materialize is refused), then `RELEASE`.
//!
//! `RELEASE` is exactly-once on the server, so any number of sweepers may run at once.
//! If the ledger is unreachable nothing is released (the ledger decision comes first); if
//! the server is unreachable the pass stops; either way the sweeper logs, backs off and
//! retries, and the next pass finds the work where this one left it.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::client::ClientError;
use crate::gate::ReservationGate;
use crate::ledger::{Ledger, LedgerError, ReleaseReason, SweepVerdict};
use crate::types::CommitOk;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    #[error("server: {0}")]
    Gate(#[from] ClientError),
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
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            interval: Duration::from_secs(30),
            batch_size: 500,
            skus: None,
            max_backoff: Duration::from_secs(30),
            max_batches_per_pass: 10_000,
        }
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub batches: u64,
    pub seen: u64,
    /// `RELEASE` returned 1: units went back to stock because of this sweeper.
    pub released: u64,
    /// `RELEASE` returned 0: someone else (another sweeper) released it first.
    pub release_noop: u64,
    pub cancelled_now: u64,
    pub recovered_cancelled_by_sweeper: u64,
    pub recovered_cancelled_by_buyer: u64,
    pub refund_released: u64,
    pub tombstoned: u64,
    /// COMMITTED in the ledger → `COMMIT` on the server.
    pub commit_cleanup: u64,
    pub skipped: u64,
    /// Sales skipped because the server holds them fenced.
    pub fenced_skus: Vec<String>,
    /// Sales the ledger knows and the server does not (lost state): fenced by this pass.
    pub lost_skus: Vec<String>,
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
    }
}

/// A sweeper over a ledger and a gate. Clone it to run several.
#[derive(Clone)]
pub struct Sweeper<L: Ledger, G: ReservationGate> {
    ledger: L,
    gate: G,
    cfg: SweeperConfig,
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
    pub fn new(ledger: L, gate: G, cfg: SweeperConfig) -> Self {
        Sweeper { ledger, gate, cfg }
    }

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
                    if r.seen > 0 || !r.lost_skus.is_empty() {
                        info!(?r, "sweeper pass");
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
        for sku in self.skus_in_scope().await? {
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
                Some(_) => {
                    let r = self.sweep_sku(&sku).await?;
                    report.absorb(r);
                }
            }
        }
        Ok(report)
    }

    async fn skus_in_scope(&self) -> Result<Vec<String>, SweepError> {
        if let Some(s) = &self.cfg.skus {
            return Ok(s.clone());
        }
        let mut set: BTreeSet<String> = self.gate.sale_list().await?.into_iter().collect();
        for s in self.ledger.sales().await? {
            set.insert(s.sku);
        }
        Ok(set.into_iter().collect())
    }

    /// Batches of one SKU until nothing more can be done in this pass.
    pub async fn sweep_sku(&self, sku: &str) -> Result<PassReport, SweepError> {
        let mut report = PassReport::default();
        for _ in 0..self.cfg.max_batches_per_pass {
            let batch = self.gate.expired(self.cfg.batch_size, Some(sku)).await?;
            if batch.is_empty() {
                break;
            }
            let full = batch.len() >= self.cfg.batch_size;
            report.batches += 1;
            report.seen += batch.len() as u64;

            // The ledger decides first; everything it decided is durable from here on.
            let verdicts = self.ledger.reconcile_expired(&batch).await?;

            // A crash here (after the ledger, before the server) is what the recovery
            // branches exist for; the fault tests inject it.
            fail::fail_point!("sweeper::after_ledger", |_| Err(SweepError::Injected(
                "sweeper::after_ledger"
            )));

            let mut to_release = Vec::new();
            let mut to_commit = Vec::new();
            for (item, v) in batch.iter().zip(&verdicts) {
                match v {
                    SweepVerdict::Release(reason) => {
                        match reason {
                            ReleaseReason::CancelledNow => report.cancelled_now += 1,
                            ReleaseReason::AlreadyCancelledBySweeper => {
                                report.recovered_cancelled_by_sweeper += 1
                            }
                            ReleaseReason::CancelledByBuyer => {
                                report.recovered_cancelled_by_buyer += 1
                            }
                            ReleaseReason::Refund => report.refund_released += 1,
                            ReleaseReason::Tombstoned => report.tombstoned += 1,
                        }
                        to_release.push(item.token.clone());
                    }
                    SweepVerdict::CommitCleanup => to_commit.push(item.token.clone()),
                    SweepVerdict::Skip => report.skipped += 1,
                }
            }

            let mut first_err = None;
            for r in self.gate.release_many(&to_release).await {
                match r {
                    Ok(true) => report.released += 1,
                    Ok(false) => report.release_noop += 1,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            for (token, r) in to_commit
                .iter()
                .zip(self.gate.commit_many(&to_commit).await)
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
                                "",
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
            if let Some(e) = first_err {
                return Err(e.into());
            }
            let progress = to_release.len() + to_commit.len();
            if progress == 0 || !full {
                // Only skipped items left at the head of the list (or nothing more):
                // asking again would return the same ones.
                break;
            }
        }
        Ok(report)
    }
}
