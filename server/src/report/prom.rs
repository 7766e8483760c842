//! Prometheus text exposition (format 0.0.4) of the counters INFO reads, with
//! `stockgate_` names: `_total` counters, seconds and bytes, latency histograms with
//! fixed buckets, and an `sku` label only for the first `--metrics-max-sales` sales (by
//! name); the others are summed under `sku="_other"`.
//!
//! Every family is one row of `FAMILIES` (name, type, help, how to read its samples
//! from a `Sources` gathered once per scrape), written in the table's order.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::view::{self, RoomRow, SaleRow};
use crate::engine::Engine;
use crate::feed::groups::GroupSummary;
use crate::metrics::{sys, CmdStats, SaleEvent, OTHER_SALES, SALE_EVENTS, SALE_EVENT_NAMES};
use crate::session::Shared;

/// Latency buckets (seconds): a RESERVE takes microseconds; a slow disk milliseconds.
pub const BUCKETS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 1.0,
];

pub use super::prom_label::label;

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
        if let Some(room) = &r.room {
            other.room.get_or_insert_with(RoomRow::default).add(room);
        }
    }
    out.push(other);
    out
}

/// A sample's value, printed as Rust prints the integer or float it was read from.
#[derive(Clone, Copy)]
enum Value {
    Int(i128),
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => n.fmt(f),
            Value::Float(x) => x.fmt(f),
        }
    }
}

macro_rules! int_values {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(n: $t) -> Value {
                Value::Int(n as i128)
            }
        }
    )*};
}
int_values!(u8, u64, i64, usize);

impl From<f64> for Value {
    fn from(x: f64) -> Value {
        Value::Float(x)
    }
}

/// One labelled sample line: `<family><suffix>{<labels>} <value>`.
struct Sample {
    /// `_bucket`, `_sum`, `_count` of a histogram; empty otherwise.
    suffix: &'static str,
    labels: String,
    value: Value,
}

impl Sample {
    fn new(labels: String, value: impl Into<Value>) -> Sample {
        Sample {
            suffix: "",
            labels,
            value: value.into(),
        }
    }
}

/// What a family has to show in one scrape.
enum Samples {
    /// Not exported by this server (no write-ahead log, no order feed).
    Absent,
    /// One unlabelled sample.
    One(Value),
    /// Labelled samples; the family's head is written even when there are none.
    Labelled(Vec<Sample>),
}

impl<T: Into<Value>> From<T> for Samples {
    fn from(v: T) -> Samples {
        Samples::One(v.into())
    }
}

/// Everything a scrape reads, gathered once, so each family's reader is a plain lookup.
struct Sources<'a> {
    engine: &'a Engine,
    shared: &'a Shared,
    stats: Vec<(&'static str, u64)>,
    /// Commands with a call or a refusal, in the command table's order.
    commands: Vec<CmdStats>,
    errors: Vec<(String, u64)>,
    error_replies: u64,
    /// Every sale the engine knows.
    sales_known: usize,
    /// The labelled sales, then `_other` if there were more.
    sales: Vec<SaleRow>,
    persistence: Vec<(String, String)>,
    /// `None` without an order feed.
    groups: Option<Vec<GroupSummary>>,
    cpu: (f64, f64),
}

impl<'a> Sources<'a> {
    fn gather(engine: &'a Engine, shared: &'a Shared) -> Sources<'a> {
        let m = &shared.metrics;
        let (errors, error_replies) = m.errors();
        let all_sales = view::sales(engine, shared, usize::MAX);
        let max_labelled = m.max_label_sales.load(Ordering::Relaxed);
        Sources {
            engine,
            shared,
            stats: view::server_stats(shared),
            commands: m
                .commands()
                .into_iter()
                .filter(|c| c.calls > 0 || c.rejected > 0)
                .collect(),
            errors,
            error_replies,
            sales_known: all_sales.len(),
            sales: labelled_sales(all_sales, max_labelled),
            persistence: view::persistence_fields(shared),
            groups: shared
                .feed
                .get()
                .map(|f| f.groups.summaries(f.readable_lsn(), f.first_lsn())),
            cpu: sys::cpu_times(libc::RUSAGE_SELF),
        }
    }

    /// A server counter by its INFO stats name (0 if unknown).
    fn stat(&self, name: &str) -> Samples {
        let v = self
            .stats
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v);
        v.into()
    }

    /// A numeric INFO persistence field; absent without one (no write-ahead log).
    fn persisted(&self, key: &str) -> Option<u64> {
        let (_, v) = self.persistence.iter().find(|(k, _)| k == key)?;
        v.parse().ok()
    }

    /// One sample per command, labelled `cmd`.
    fn per_command(&self, read: fn(&CmdStats) -> u64) -> Samples {
        Samples::Labelled(
            self.commands
                .iter()
                .map(|c| Sample::new(format!("cmd=\"{}\"", c.name), read(c)))
                .collect(),
        )
    }

    /// One sample per labelled sale, labelled `sku`.
    fn per_sale<V: Into<Value>>(&self, read: fn(&SaleRow) -> V) -> Samples {
        Samples::Labelled(
            self.sales
                .iter()
                .map(|r| Sample::new(format!("sku=\"{}\"", label(&r.sku)), read(r)))
                .collect(),
        )
    }

    /// One sample per labelled sale that has a waiting room, labelled `sku`.
    fn per_room<V: Into<Value>>(&self, read: fn(&RoomRow) -> V) -> Samples {
        Samples::Labelled(
            self.sales
                .iter()
                .filter_map(|r| {
                    let room = r.room.as_ref()?;
                    Some(Sample::new(
                        format!("sku=\"{}\"", label(&r.sku)),
                        read(room),
                    ))
                })
                .collect(),
        )
    }

    /// One sample per consumer group, labelled `stream` and `group`; absent without a feed.
    fn per_group<V: Into<Value>>(&self, read: fn(&GroupSummary) -> V) -> Samples {
        let Some(groups) = &self.groups else {
            return Samples::Absent;
        };
        Samples::Labelled(
            groups
                .iter()
                .map(|g| {
                    let labels = format!(
                        "stream=\"{}\",group=\"{}\"",
                        label(&g.stream),
                        label(&g.group)
                    );
                    Sample::new(labels, read(g))
                })
                .collect(),
        )
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: its name, type and help, and how to read its samples.
struct Family {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    read: fn(&Sources<'_>) -> Samples,
}

use Kind::{Counter, Gauge, Histogram};

const WAL_FIGURE: &str = "Write-ahead log figure (see INFO persistence).";

/// Every family, in the order of the exposition (docs/observability.md lists them).
static FAMILIES: &[Family] = &[
    // The server and its connections.
    Family {
        name: "stockgate_uptime_seconds",
        kind: Gauge,
        help: "Seconds since the server started.",
        read: |s| s.shared.started.elapsed().as_secs_f64().into(),
    },
    Family {
        name: "stockgate_connected_clients",
        kind: Gauge,
        help: "Client connections open now.",
        read: |s| s.shared.stats.connected.load(Ordering::Relaxed).into(),
    },
    Family {
        name: "stockgate_connections_received_total",
        kind: Counter,
        help: "Client connections accepted.",
        read: |s| s.stat("total_connections_received"),
    },
    Family {
        name: "stockgate_net_input_bytes_total",
        kind: Counter,
        help: "Bytes read from clients.",
        read: |s| s.stat("total_net_input_bytes"),
    },
    Family {
        name: "stockgate_net_output_bytes_total",
        kind: Counter,
        help: "Bytes of replies written to clients.",
        read: |s| s.stat("total_net_output_bytes"),
    },
    Family {
        name: "stockgate_rejected_connections_total",
        kind: Counter,
        help: "Connections refused at maxclients.",
        read: |s| s.stat("rejected_connections"),
    },
    Family {
        name: "stockgate_commands_processed_total",
        kind: Counter,
        help: "Commands received (all, including refused ones).",
        read: |s| s.stat("total_commands_processed"),
    },
    Family {
        name: "stockgate_auth_failures_total",
        kind: Counter,
        help: "Failed AUTH attempts.",
        read: |s| s.stat("auth_failures"),
    },
    Family {
        name: "stockgate_noperm_refusals_total",
        kind: Counter,
        help: "Commands refused for the user's role.",
        read: |s| s.stat("noperm_refusals"),
    },
    Family {
        name: "stockgate_protocol_errors_total",
        kind: Counter,
        help: "Connections closed on malformed RESP.",
        read: |s| s.stat("protocol_errors"),
    },
    Family {
        name: "stockgate_query_buffer_limit_disconnects_total",
        kind: Counter,
        help: "Clients dropped for an oversized unfinished command.",
        read: |s| s.stat("query_buffer_limit_disconnects"),
    },
    Family {
        name: "stockgate_output_buffer_limit_disconnects_total",
        kind: Counter,
        help: "Clients dropped for unread or oversized replies.",
        read: |s| s.stat("output_buffer_limit_disconnects"),
    },
    Family {
        name: "stockgate_idle_timeout_disconnects_total",
        kind: Counter,
        help: "Clients dropped for idleness.",
        read: |s| s.stat("idle_timeout_disconnects"),
    },
    // Commands and their errors.
    Family {
        name: "stockgate_commands_total",
        kind: Counter,
        help: "Commands executed, by command (refused ones excluded).",
        read: |s| s.per_command(|c| c.calls),
    },
    Family {
        name: "stockgate_command_failed_total",
        kind: Counter,
        help: "Commands that ran and answered an error.",
        read: |s| s.per_command(|c| c.failed),
    },
    Family {
        name: "stockgate_command_rejected_total",
        kind: Counter,
        help: "Commands refused before running (arity, NOAUTH, NOPERM).",
        read: |s| s.per_command(|c| c.rejected),
    },
    Family {
        name: "stockgate_command_duration_seconds",
        kind: Histogram,
        help: "Time to execute a command (excluding the wait for the log).",
        read: command_durations,
    },
    Family {
        name: "stockgate_error_replies_total",
        kind: Counter,
        help: "Error replies sent.",
        read: |s| s.error_replies.into(),
    },
    Family {
        name: "stockgate_errors_total",
        kind: Counter,
        help: "Error replies by error code (the first word of the error).",
        read: |s| {
            Samples::Labelled(
                s.errors
                    .iter()
                    .map(|(code, n)| Sample::new(format!("code=\"{}\"", label(code)), *n))
                    .collect(),
            )
        },
    },
    Family {
        name: "stockgate_denials_total",
        kind: Counter,
        help:
            "RESERVE admission tokens refused, by reason (unknown_key, bad_signature: the waiting \
               room and the server disagree on the admission keys; expired: a slow client).",
        read: |s| {
            Samples::Labelled(
                s.shared
                    .metrics
                    .denials()
                    .into_iter()
                    .map(|(why, n)| Sample::new(format!("reason=\"{}\"", why.reason()), n))
                    .collect(),
            )
        },
    },
    // Sales.
    Family {
        name: "stockgate_sales",
        kind: Gauge,
        help: "Sales the server knows.",
        read: |s| s.sales_known.into(),
    },
    Family {
        name: "stockgate_reservations",
        kind: Gauge,
        help: "Reservation records held (live and retained).",
        read: |s| s.engine.reservation_count().into(),
    },
    Family {
        name: "stockgate_sale_units",
        kind: Gauge,
        help: "Units of a sale by state: available + reserved + committed = total.",
        read: sale_units,
    },
    Family {
        name: "stockgate_sale_total_units",
        kind: Gauge,
        help: "Units of a sale in all.",
        read: |s| s.per_sale(|r| r.total),
    },
    Family {
        name: "stockgate_sale_open",
        kind: Gauge,
        help: "1 if the sale accepts reservations (not paused or fenced).",
        read: |s| s.per_sale(|r| u8::from(r.state == "OPEN")),
    },
    Family {
        name: "stockgate_reserve_outcomes_total",
        kind: Counter,
        help: "RESERVE answers by outcome.",
        read: reserve_outcomes,
    },
    Family {
        name: "stockgate_releases_total",
        kind: Counter,
        help: "RELEASE calls that returned units to stock.",
        read: |s| s.per_sale(|r| r.get(SaleEvent::Release)),
    },
    Family {
        name: "stockgate_commits_total",
        kind: Counter,
        help: "COMMIT calls that committed a reservation.",
        read: |s| s.per_sale(|r| r.get(SaleEvent::Commit)),
    },
    Family {
        name: "stockgate_expired_pending_reservations",
        kind: Gauge,
        help: "Reservations past their deadline not yet released by a sweeper.",
        read: |s| s.per_sale(|r| r.expired),
    },
    Family {
        name: "stockgate_sweeper_lag_seconds",
        kind: Gauge,
        help: "Age of the oldest expired reservation not yet swept (0 if none).",
        read: |s| s.per_sale(|r| r.oldest_expired_age_ms as f64 / 1000.0),
    },
    // Waiting rooms (sales with one only).
    Family {
        name: "stockgate_room_waiting",
        kind: Gauge,
        help: "Buyers waiting in a sale's room (before or after it opens).",
        read: |s| s.per_room(|r| r.waiting),
    },
    Family {
        name: "stockgate_room_admitted_not_reserved",
        kind: Gauge,
        help: "Buyers let through a sale's room who have not reserved yet.",
        read: |s| s.per_room(|r| r.admitted_not_reserved),
    },
    Family {
        name: "stockgate_room_admissions_total",
        kind: Counter,
        help: "Buyers let through a sale's room (rate() of it is the admission rate).",
        read: |s| s.per_room(|r| r.admissions),
    },
    Family {
        name: "stockgate_room_admissions_expired_total",
        kind: Counter,
        help: "Admissions that expired before their buyer reserved.",
        read: |s| s.per_room(|r| r.expired),
    },
    Family {
        name: "stockgate_room_wait_estimate_seconds",
        kind: Gauge,
        help: "Wait the room tells a buyer joining now: the line over the admission rate of the last 30 s (the maximum rate before any admission).",
        read: |s| s.per_room(|r| r.wait_estimate_ms as f64 / 1000.0),
    },
    // The log (INFO persistence), in INFO's order.
    Family {
        name: "stockgate_wal_last_lsn",
        kind: Gauge,
        help: WAL_FIGURE,
        read: |s| wal_figure(s, "wal_last_lsn"),
    },
    Family {
        name: "stockgate_wal_durable_lsn",
        kind: Gauge,
        help: WAL_FIGURE,
        read: |s| wal_figure(s, "wal_durable_lsn"),
    },
    Family {
        name: "stockgate_wal_snapshot_lsn",
        kind: Gauge,
        help: WAL_FIGURE,
        read: |s| wal_figure(s, "wal_snapshot_lsn"),
    },
    Family {
        name: "stockgate_wal_records_since_snapshot",
        kind: Gauge,
        help: WAL_FIGURE,
        read: |s| wal_figure(s, "wal_records_since_snapshot"),
    },
    Family {
        name: "stockgate_snapshots_written_total",
        kind: Counter,
        help: WAL_FIGURE,
        read: |s| wal_figure(s, "snapshots_written"),
    },
    Family {
        name: "stockgate_last_snapshot_duration_seconds",
        kind: Gauge,
        help: "How long the last snapshot took.",
        read: |s| {
            s.persisted("last_snapshot_ms")
                .map_or(Samples::Absent, |ms| (ms as f64 / 1000.0).into())
        },
    },
    Family {
        name: "stockgate_wal_pending_records",
        kind: Gauge,
        help: "Records handed to the log and not yet acknowledged under the fsync policy.",
        read: wal_pending,
    },
    // The order feed's consumer groups (INFO feed).
    Family {
        name: "stockgate_feed_group_lag",
        kind: Gauge,
        help: "Entries between a consumer group's last-delivered id and the log's end.",
        read: |s| s.per_group(|g| g.lag),
    },
    Family {
        name: "stockgate_feed_group_pending",
        kind: Gauge,
        help: "Entries delivered to a consumer group and not acknowledged.",
        read: |s| s.per_group(|g| g.pending as u64),
    },
    Family {
        name: "stockgate_feed_group_oldest_pending_seconds",
        kind: Gauge,
        help: "Time since the last delivery of a consumer group's oldest unacknowledged entry (0 if none): how far its consumer (a materializer) is behind in acknowledging.",
        read: |s| {
            s.per_group(|g| g.oldest_pending_ms as f64 / 1000.0)
        },
    },
    // The process.
    Family {
        name: "stockgate_memory_allocated_bytes",
        kind: Gauge,
        help: "Bytes held by the allocator (INFO used_memory).",
        read: |_| sys::allocated_bytes().into(),
    },
    Family {
        name: "stockgate_resident_memory_bytes",
        kind: Gauge,
        help: "Resident set size.",
        read: |_| sys::rss_bytes().into(),
    },
    Family {
        name: "stockgate_cpu_seconds_total",
        kind: Counter,
        help: "CPU time used by the server.",
        read: |s| {
            Samples::Labelled(vec![
                Sample::new("mode=\"user\"".into(), s.cpu.0),
                Sample::new("mode=\"system\"".into(), s.cpu.1),
            ])
        },
    },
    Family {
        name: "stockgate_slowlog_length",
        kind: Gauge,
        help: "Entries in the slow log.",
        read: |s| s.shared.metrics.slowlog.lock().len().into(),
    },
];

/// The latency histogram of every command that has one.
fn command_durations(s: &Sources<'_>) -> Samples {
    let mut out = Vec::new();
    for c in &s.commands {
        let Some(h) = &c.hist else { continue };
        let bucket = |le: String, n: u64| Sample {
            suffix: "_bucket",
            labels: format!("cmd=\"{}\",le=\"{le}\"", c.name),
            value: n.into(),
        };
        for b in BUCKETS {
            out.push(bucket(b.to_string(), h.count_between(0, (b * 1e9) as u64)));
        }
        out.push(bucket("+Inf".into(), h.len()));
        let labels = format!("cmd=\"{}\"", c.name);
        out.push(Sample {
            suffix: "_sum",
            labels: labels.clone(),
            value: (c.nanos as f64 / 1e9).into(),
        });
        out.push(Sample {
            suffix: "_count",
            labels,
            value: h.len().into(),
        });
    }
    Samples::Labelled(out)
}

/// Each sale's units in each state.
fn sale_units(s: &Sources<'_>) -> Samples {
    let mut out = Vec::with_capacity(s.sales.len() * 3);
    for r in &s.sales {
        let sku = label(&r.sku);
        for (state, v) in [
            ("available", Value::from(r.available)),
            ("reserved", r.reserved.into()),
            ("committed", r.committed.into()),
        ] {
            out.push(Sample::new(format!("sku=\"{sku}\",state=\"{state}\""), v));
        }
    }
    Samples::Labelled(out)
}

/// Each sale's RESERVE answers by outcome (the events before `Release` are RESERVE's).
fn reserve_outcomes(s: &Sources<'_>) -> Samples {
    let mut out = Vec::new();
    for r in &s.sales {
        let sku = label(&r.sku);
        let outcomes = SALE_EVENT_NAMES.iter().enumerate();
        for (i, name) in outcomes.take(SaleEvent::Release as usize) {
            let labels = format!("sku=\"{sku}\",outcome=\"{name}\"");
            out.push(Sample::new(labels, r.outcomes[i]));
        }
    }
    Samples::Labelled(out)
}

fn wal_figure(s: &Sources<'_>, key: &str) -> Samples {
    s.persisted(key).map_or(Samples::Absent, Samples::from)
}

/// Records not yet acknowledged: exported whenever the log reports its last LSN.
fn wal_pending(s: &Sources<'_>) -> Samples {
    if !s.persistence.iter().any(|(k, _)| k == "wal_last_lsn") {
        return Samples::Absent;
    }
    let fields = &s.persistence;
    view::persistence_u64(fields, "wal_last_lsn")
        .saturating_sub(view::persistence_u64(fields, "wal_durable_lsn"))
        .into()
}

/// The exposition text: every family of `FAMILIES` that this server has.
pub fn render(engine: &Engine, shared: &Shared) -> String {
    let sources = Sources::gather(engine, shared);
    let mut out = String::with_capacity(16 * 1024);
    for f in FAMILIES {
        let samples = (f.read)(&sources);
        if matches!(samples, Samples::Absent) {
            continue;
        }
        let (name, kind) = (f.name, f.kind.as_str());
        let _ = write!(out, "# HELP {name} {}\n# TYPE {name} {kind}\n", f.help);
        match samples {
            Samples::Absent => {}
            Samples::One(v) => {
                let _ = writeln!(out, "{name} {v}");
            }
            Samples::Labelled(lines) => {
                for l in lines {
                    let _ = writeln!(out, "{name}{}{{{}}} {}", l.suffix, l.labels, l.value);
                }
            }
        }
    }
    // The group's families come from the member's INFO replication fields.
    if let Some(repl) = shared.repl.get() {
        out.push_str(&super::prom_raft::render(&super::replication::section(
            &repl.info(),
        )));
    }
    out
}
