//! Prometheus text exposition (format 0.0.4) of the counters INFO reads, with
//! `stockgate_` names: `_total` counters, seconds and bytes, latency histograms with
//! fixed buckets, and an `sku` label only for the first `--metrics-max-sales` sales (by
//! name); the others are summed under `sku="_other"`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::view::{self, SaleRow};
use crate::engine::Engine;
use crate::metrics::{sys, SaleEvent, OTHER_SALES, SALE_EVENTS, SALE_EVENT_NAMES};
use crate::session::Shared;

/// Latency buckets (seconds): a RESERVE takes microseconds; a slow disk milliseconds.
pub const BUCKETS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 1.0,
];

/// Escapes a label value (backslash, quote, newline).
pub fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = write!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }
    fn one(&mut self, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
        self.head(name, kind, help);
        let _ = writeln!(self.0, "{name} {v}");
    }
    fn line(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        let _ = writeln!(self.0, "{name}{{{labels}}} {v}");
    }
}

/// Sales with their own label, plus the sum of the rest (if any).
fn labelled_sales(rows: Vec<SaleRow>, max: usize) -> Vec<SaleRow> {
    if rows.len() <= max {
        return rows;
    }
    let mut it = rows.into_iter();
    let mut out: Vec<SaleRow> = it.by_ref().take(max).collect();
    let mut other = SaleRow {
        sku: OTHER_SALES.into(),
        state: "OPEN",
        ..SaleRow::default()
    };
    for r in it {
        other.total += r.total;
        other.available += r.available;
        other.reserved += r.reserved;
        other.committed += r.committed;
        for i in 0..SALE_EVENTS {
            other.outcomes[i] += r.outcomes[i];
        }
        other.expired += r.expired;
        other.expired_units += r.expired_units;
        other.oldest_expired_age_ms = other.oldest_expired_age_ms.max(r.oldest_expired_age_ms);
    }
    out.push(other);
    out
}

pub fn render(engine: &Engine, shared: &Shared) -> String {
    let m = &shared.metrics;
    let mut o = Out(String::with_capacity(16 * 1024));
    let stats = view::server_stats(shared);
    let get = |k: &str| stats.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);

    o.one(
        "stockgate_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        shared.started.elapsed().as_secs_f64(),
    );
    o.one(
        "stockgate_connected_clients",
        "gauge",
        "Client connections open now.",
        shared.stats.connected.load(Ordering::Relaxed),
    );
    o.one(
        "stockgate_connections_received_total",
        "counter",
        "Client connections accepted.",
        get("total_connections_received"),
    );
    o.one(
        "stockgate_net_input_bytes_total",
        "counter",
        "Bytes read from clients.",
        get("total_net_input_bytes"),
    );
    o.one(
        "stockgate_net_output_bytes_total",
        "counter",
        "Bytes of replies written to clients.",
        get("total_net_output_bytes"),
    );
    o.one(
        "stockgate_rejected_connections_total",
        "counter",
        "Connections refused at maxclients.",
        get("rejected_connections"),
    );
    o.one(
        "stockgate_commands_processed_total",
        "counter",
        "Commands received (all, including refused ones).",
        get("total_commands_processed"),
    );
    for (k, help) in [
        ("auth_failures", "Failed AUTH attempts."),
        ("noperm_refusals", "Commands refused for the user's role."),
        ("protocol_errors", "Connections closed on malformed RESP."),
        (
            "query_buffer_limit_disconnects",
            "Clients dropped for an oversized unfinished command.",
        ),
        (
            "output_buffer_limit_disconnects",
            "Clients dropped for unread or oversized replies.",
        ),
        ("idle_timeout_disconnects", "Clients dropped for idleness."),
    ] {
        o.one(&format!("stockgate_{k}_total"), "counter", help, get(k));
    }

    let cmds = m.commands();
    let used: Vec<_> = cmds
        .iter()
        .filter(|c| c.calls > 0 || c.rejected > 0)
        .collect();
    o.head(
        "stockgate_commands_total",
        "counter",
        "Commands executed, by command (refused ones excluded).",
    );
    for c in &used {
        o.line(
            "stockgate_commands_total",
            &format!("cmd=\"{}\"", c.name),
            c.calls,
        );
    }
    o.head(
        "stockgate_command_failed_total",
        "counter",
        "Commands that ran and answered an error.",
    );
    for c in &used {
        o.line(
            "stockgate_command_failed_total",
            &format!("cmd=\"{}\"", c.name),
            c.failed,
        );
    }
    o.head(
        "stockgate_command_rejected_total",
        "counter",
        "Commands refused before running (arity, NOAUTH, NOPERM).",
    );
    for c in &used {
        o.line(
            "stockgate_command_rejected_total",
            &format!("cmd=\"{}\"", c.name),
            c.rejected,
        );
    }
    o.head(
        "stockgate_command_duration_seconds",
        "histogram",
        "Time to execute a command (excluding the wait for the log).",
    );
    for c in &used {
        let Some(h) = &c.hist else { continue };
        for b in BUCKETS {
            let ns = (b * 1e9) as u64;
            let n = h.count_between(0, ns);
            o.line(
                "stockgate_command_duration_seconds_bucket",
                &format!("cmd=\"{}\",le=\"{b}\"", c.name),
                n,
            );
        }
        o.line(
            "stockgate_command_duration_seconds_bucket",
            &format!("cmd=\"{}\",le=\"+Inf\"", c.name),
            h.len(),
        );
        o.line(
            "stockgate_command_duration_seconds_sum",
            &format!("cmd=\"{}\"", c.name),
            c.nanos as f64 / 1e9,
        );
        o.line(
            "stockgate_command_duration_seconds_count",
            &format!("cmd=\"{}\"", c.name),
            h.len(),
        );
    }

    let (errors, total_errors) = m.errors();
    o.one(
        "stockgate_error_replies_total",
        "counter",
        "Error replies sent.",
        total_errors,
    );
    o.head(
        "stockgate_errors_total",
        "counter",
        "Error replies by error code (the first word of the error).",
    );
    for (code, n) in &errors {
        o.line(
            "stockgate_errors_total",
            &format!("code=\"{}\"", label(code)),
            n,
        );
    }

    o.head(
        "stockgate_denials_total",
        "counter",
        "RESERVE admission tokens refused, by reason (unknown_key, bad_signature: the waiting room and the server disagree on the admission keys; expired: a slow client).",
    );
    for (why, n) in m.denials() {
        o.line(
            "stockgate_denials_total",
            &format!("reason=\"{}\"", why.reason()),
            n,
        );
    }

    // Sales.
    let max = m.max_label_sales.load(Ordering::Relaxed);
    let all = view::sales(engine, shared, usize::MAX);
    o.one(
        "stockgate_sales",
        "gauge",
        "Sales the server knows.",
        all.len(),
    );
    o.one(
        "stockgate_reservations",
        "gauge",
        "Reservation records held (live and retained).",
        engine.reservation_count(),
    );
    let rows = labelled_sales(all, max);
    o.head(
        "stockgate_sale_units",
        "gauge",
        "Units of a sale by state: available + reserved + committed = total.",
    );
    for r in &rows {
        let sku = label(&r.sku);
        o.line(
            "stockgate_sale_units",
            &format!("sku=\"{sku}\",state=\"available\""),
            r.available,
        );
        o.line(
            "stockgate_sale_units",
            &format!("sku=\"{sku}\",state=\"reserved\""),
            r.reserved,
        );
        o.line(
            "stockgate_sale_units",
            &format!("sku=\"{sku}\",state=\"committed\""),
            r.committed,
        );
    }
    o.head(
        "stockgate_sale_total_units",
        "gauge",
        "Units of a sale in all.",
    );
    for r in &rows {
        o.line(
            "stockgate_sale_total_units",
            &format!("sku=\"{}\"", label(&r.sku)),
            r.total,
        );
    }
    o.head(
        "stockgate_sale_open",
        "gauge",
        "1 if the sale accepts reservations (not paused or fenced).",
    );
    for r in &rows {
        o.line(
            "stockgate_sale_open",
            &format!("sku=\"{}\"", label(&r.sku)),
            u8::from(r.state == "OPEN"),
        );
    }
    o.head(
        "stockgate_reserve_outcomes_total",
        "counter",
        "RESERVE answers by outcome.",
    );
    for r in &rows {
        for (i, name) in SALE_EVENT_NAMES
            .iter()
            .enumerate()
            .take(SaleEvent::Release as usize)
        {
            o.line(
                "stockgate_reserve_outcomes_total",
                &format!("sku=\"{}\",outcome=\"{name}\"", label(&r.sku)),
                r.outcomes[i],
            );
        }
    }
    o.head(
        "stockgate_releases_total",
        "counter",
        "RELEASE calls that returned units to stock.",
    );
    for r in &rows {
        o.line(
            "stockgate_releases_total",
            &format!("sku=\"{}\"", label(&r.sku)),
            r.get(SaleEvent::Release),
        );
    }
    o.head(
        "stockgate_commits_total",
        "counter",
        "COMMIT calls that committed a reservation.",
    );
    for r in &rows {
        o.line(
            "stockgate_commits_total",
            &format!("sku=\"{}\"", label(&r.sku)),
            r.get(SaleEvent::Commit),
        );
    }
    o.head(
        "stockgate_expired_pending_reservations",
        "gauge",
        "Reservations past their deadline not yet released by a sweeper.",
    );
    for r in &rows {
        o.line(
            "stockgate_expired_pending_reservations",
            &format!("sku=\"{}\"", label(&r.sku)),
            r.expired,
        );
    }
    o.head(
        "stockgate_sweeper_lag_seconds",
        "gauge",
        "Age of the oldest expired reservation not yet swept (0 if none).",
    );
    for r in &rows {
        o.line(
            "stockgate_sweeper_lag_seconds",
            &format!("sku=\"{}\"", label(&r.sku)),
            r.oldest_expired_age_ms as f64 / 1000.0,
        );
    }

    // The log.
    let fields = view::persistence_fields(shared);
    for (k, v) in &fields {
        let Ok(n) = v.parse::<u64>() else { continue };
        let (name, kind) = match k.as_str() {
            "snapshots_written" => ("stockgate_snapshots_written_total".to_string(), "counter"),
            "last_snapshot_ms" => {
                o.one(
                    "stockgate_last_snapshot_duration_seconds",
                    "gauge",
                    "How long the last snapshot took.",
                    n as f64 / 1000.0,
                );
                continue;
            }
            k if k.starts_with("wal_") => (format!("stockgate_{k}"), "gauge"),
            _ => continue,
        };
        o.one(
            &name,
            kind,
            "Write-ahead log figure (see INFO persistence).",
            n,
        );
    }
    if fields.iter().any(|(k, _)| k == "wal_last_lsn") {
        o.one(
            "stockgate_wal_pending_records",
            "gauge",
            "Records handed to the log and not yet acknowledged under the fsync policy.",
            view::persistence_u64(&fields, "wal_last_lsn")
                .saturating_sub(view::persistence_u64(&fields, "wal_durable_lsn")),
        );
    }

    // The order feed's consumer groups (INFO feed).
    if let Some(f) = shared.feed.get() {
        let groups = f.groups.summaries(f.readable_lsn(), f.first_lsn());
        for (name, help) in [
            (
                "stockgate_feed_group_lag",
                "Entries between a consumer group's last-delivered id and the log's end.",
            ),
            (
                "stockgate_feed_group_pending",
                "Entries delivered to a consumer group and not acknowledged.",
            ),
        ] {
            o.head(name, "gauge", help);
            for g in &groups {
                let v = if name.ends_with("lag") {
                    g.lag
                } else {
                    g.pending as u64
                };
                o.line(
                    name,
                    &format!(
                        "stream=\"{}\",group=\"{}\"",
                        label(&g.stream),
                        label(&g.group)
                    ),
                    v,
                );
            }
        }
    }

    // The process.
    o.one(
        "stockgate_memory_allocated_bytes",
        "gauge",
        "Bytes held by the allocator (INFO used_memory).",
        sys::allocated_bytes(),
    );
    o.one(
        "stockgate_resident_memory_bytes",
        "gauge",
        "Resident set size.",
        sys::rss_bytes(),
    );
    let (u, s) = sys::cpu_times(libc::RUSAGE_SELF);
    o.head(
        "stockgate_cpu_seconds_total",
        "counter",
        "CPU time used by the server.",
    );
    o.line("stockgate_cpu_seconds_total", "mode=\"user\"", u);
    o.line("stockgate_cpu_seconds_total", "mode=\"system\"", s);
    o.one(
        "stockgate_slowlog_length",
        "gauge",
        "Entries in the slow log.",
        m.slowlog.lock().len(),
    );
    if let Some(repl) = shared.repl.get() {
        o.0.push_str(&super::prom_raft::render(&repl.info()));
    }
    o.0
}
