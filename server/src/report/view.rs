//! What every reader (INFO, Prometheus, JSON) shows, gathered in one place from the
//! engine's public views, the server's counters and [`crate::metrics::Metrics`].

use std::sync::atomic::Ordering;

use crate::engine::Engine;
use crate::metrics::{SaleEvent, SALE_EVENTS};
use crate::session::Shared;

/// One sale as operators see it.
#[derive(Clone, Debug, Default)]
pub struct SaleRow {
    /// The sale's key, as clients name it.
    pub sku: String,
    /// The sale's state as the protocol spells it: `OPEN`, `PAUSED` or `FENCED`.
    pub state: &'static str,
    /// Units the sale was created with.
    pub total: u64,
    /// Units still free to reserve, summed over the shards (signed, as the shard counters are).
    pub available: i64,
    /// Units held by RESERVED reservations.
    pub reserved: u64,
    /// Units committed (sold).
    pub committed: u64,
    /// Indexed by [`SaleEvent`].
    pub outcomes: [u64; SALE_EVENTS],
    /// RESERVED reservations past their deadline that no sweeper released yet.
    pub expired: u64,
    /// Units held by those expired reservations.
    pub expired_units: u64,
    /// Age of the oldest of those (0 when none): how far the sweeper is behind.
    pub oldest_expired_age_ms: u64,
}

impl SaleRow {
    /// The count of one outcome for this sale.
    pub fn get(&self, e: SaleEvent) -> u64 {
        self.outcomes[e as usize]
    }
}

/// Sales in name order, with outcomes and the expiry backlog. At most `limit` rows.
pub fn sales(engine: &Engine, shared: &Shared, limit: usize) -> Vec<SaleRow> {
    let mut skus = engine.list_sales();
    skus.sort();
    let now = engine.now_ms();
    let summary: std::collections::HashMap<_, _> = engine
        .expired_summary()
        .into_iter()
        .map(|(k, n, u, t)| (k, (n, u, t)))
        .collect();
    let mut rows = Vec::with_capacity(skus.len().min(limit));
    for sku in skus.into_iter().take(limit) {
        let Ok(v) = engine.sale_info(&sku) else {
            continue;
        };
        let (expired, expired_units, oldest) = summary
            .get(sku.as_str())
            .map(|(n, u, t)| (*n, *u, now.saturating_sub(*t)))
            .unwrap_or((0, 0, 0));
        rows.push(SaleRow {
            outcomes: shared.metrics.sale_totals(&sku),
            sku,
            state: v.state.as_str(),
            total: v.total,
            available: v.available,
            reserved: v.reserved,
            committed: v.committed,
            expired,
            expired_units,
            oldest_expired_age_ms: oldest,
        });
    }
    rows
}

/// `key:value` lines of the durability layer's INFO persistence text.
pub fn persistence_fields(shared: &Shared) -> Vec<(String, String)> {
    shared
        .durability
        .info()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// A numeric persistence field (0 if absent).
pub fn persistence_u64(fields: &[(String, String)], key: &str) -> u64 {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// The server's own counters (`Stats`) and the RESERVE outcomes of every sale, named as
/// INFO stats names them.
pub fn server_stats(shared: &Shared) -> Vec<(&'static str, u64)> {
    let stats = &shared.stats;
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let reserve = shared.metrics.reserve_totals();
    let outcome = |e: SaleEvent| reserve[e as usize];
    vec![
        ("total_connections_received", l(&stats.connections)),
        ("total_commands_processed", l(&stats.commands)),
        ("rejected_connections", l(&stats.rejected)),
        ("auth_failures", l(&stats.auth_failures)),
        ("noperm_refusals", l(&stats.noperm)),
        ("protocol_errors", l(&stats.protocol_errors)),
        ("query_buffer_limit_disconnects", l(&stats.qbuf_disconnects)),
        (
            "output_buffer_limit_disconnects",
            l(&stats.obuf_disconnects),
        ),
        ("idle_timeout_disconnects", l(&stats.idle_disconnects)),
        ("reserve_reserved", outcome(SaleEvent::Reserved)),
        ("reserve_replay", outcome(SaleEvent::Replay)),
        ("reserve_soldout", outcome(SaleEvent::SoldOut)),
        ("reserve_limit", outcome(SaleEvent::Limit)),
        ("total_net_input_bytes", l(&stats.net_input_bytes)),
        ("total_net_output_bytes", l(&stats.net_output_bytes)),
    ]
}

/// `CONFIG RESETSTAT` of the server's counters (not the gauges: connected clients). The
/// RESERVE outcomes are the store's, reset with it.
pub fn reset_server_stats(shared: &Shared) {
    let stats = &shared.stats;
    for a in [
        &stats.connections,
        &stats.commands,
        &stats.rejected,
        &stats.auth_failures,
        &stats.noperm,
        &stats.protocol_errors,
        &stats.qbuf_disconnects,
        &stats.obuf_disconnects,
        &stats.idle_disconnects,
        &stats.net_input_bytes,
        &stats.net_output_bytes,
    ] {
        a.store(0, Ordering::Relaxed);
    }
}
