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
    /// The sale's waiting room, if it has one.
    pub room: Option<RoomRow>,
}

/// A sale's waiting room as operators see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoomRow {
    /// Buyers waiting (before or after opening).
    pub waiting: u64,
    /// Buyers admitted who have not reserved yet.
    pub admitted_not_reserved: u64,
    /// Buyers admitted since this server started (counted as it applies the room's ops).
    pub admissions: u64,
    /// Of those, admissions that expired unused.
    pub expired: u64,
    /// The wait the room would tell a buyer joining now (from the admission rate it
    /// observed over its recent window, or its maximum rate before any admission).
    pub wait_estimate_ms: u64,
    /// Whether the line has been drawn and moves.
    pub open: bool,
    /// Whether waiting buyers are told SOLDOUT.
    pub sold_out: bool,
}

impl RoomRow {
    /// Adds another room's figures (the `_other` sum of the metrics): counts add up, the
    /// wait is the longest, `open`/`sold_out` say whether any is.
    pub fn add(&mut self, o: &RoomRow) {
        self.waiting += o.waiting;
        self.admitted_not_reserved += o.admitted_not_reserved;
        self.admissions += o.admissions;
        self.expired += o.expired;
        self.wait_estimate_ms = self.wait_estimate_ms.max(o.wait_estimate_ms);
        self.open |= o.open;
        self.sold_out |= o.sold_out;
    }
}

/// Every room's figures, by sku.
fn rooms(engine: &Engine) -> std::collections::HashMap<String, RoomRow> {
    engine
        .room_metrics()
        .into_iter()
        .map(|m| {
            let row = RoomRow {
                waiting: u64::from(m.waiting),
                admitted_not_reserved: m.admitted_not_reserved,
                admissions: m.counts.admitted,
                expired: m.counts.expired,
                wait_estimate_ms: m.wait_estimate_ms,
                open: m.open,
                sold_out: m.sold_out,
            };
            (m.sku, row)
        })
        .collect()
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
    let rooms = rooms(engine);
    let mut rows = Vec::with_capacity(skus.len().min(limit));
    for sku in skus.into_iter().take(limit) {
        let Ok(v) = engine.sale_info(&sku) else {
            continue;
        };
        let (expired, expired_units, oldest) = summary
            .get(sku.as_str())
            .map(|(n, u, t)| (*n, *u, now.saturating_sub(*t)))
            .unwrap_or((0, 0, 0));
        let room = rooms.get(&sku).copied();
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
            room,
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

/// One follower as the leader sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowerRow {
    /// Its Raft node id.
    pub id: u64,
    /// Its client address.
    pub addr: String,
    /// Whether it votes (a learner does not).
    pub voter: bool,
    /// The last log index the leader knows it holds.
    pub matched: u64,
    /// Entries of the leader's log it does not hold yet.
    pub lag: u64,
}

/// A Raft group member's view of its group, read from its INFO replication fields;
/// `None` on a single node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupView {
    /// The group's name (`--group-name`).
    pub name: String,
    /// This member's id.
    pub node_id: u64,
    /// `leader`, `follower`, `candidate`, `learner` (openraft's state, lower case).
    pub role: String,
    /// The leader's id, if one is known.
    pub leader_id: Option<u64>,
    /// The leader's client address, if one is known.
    pub leader_addr: Option<String>,
    /// The member's Raft term.
    pub term: u64,
    /// The last index of this member's Raft log.
    pub last_index: u64,
    /// The last index applied to its state.
    pub applied_index: u64,
    /// On the leader: the highest index a majority of voters hold.
    pub commit_index: Option<u64>,
    /// On the leader: ms since a majority last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// Whether this member takes writes now (leads and holds its lease).
    pub lease_held: bool,
    /// On the leader: every other member; empty elsewhere (only a leader knows).
    pub followers: Vec<FollowerRow>,
}

/// The group view out of a member's INFO replication text (`None` unless it is a Raft
/// member's).
pub fn group_view(info: &str) -> Option<GroupView> {
    let fields: Vec<(&str, &str)> = info
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .collect();
    let get = |k: &str| fields.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let num = |k: &str| get(k).and_then(|v| v.parse::<u64>().ok());
    let name = get("raft_group")?.to_string();
    let mut followers = Vec::new();
    for (k, v) in &fields {
        if !k.starts_with("raft_follower_") {
            continue;
        }
        let mut f = FollowerRow::default();
        for kv in v.split(',') {
            match kv.split_once('=') {
                Some(("id", x)) => f.id = x.parse().unwrap_or(0),
                Some(("addr", x)) => f.addr = x.to_string(),
                Some(("voter", x)) => f.voter = x == "1",
                Some(("matched", x)) => f.matched = x.parse().unwrap_or(0),
                Some(("lag", x)) => f.lag = x.parse().unwrap_or(0),
                _ => {}
            }
        }
        followers.push(f);
    }
    Some(GroupView {
        name,
        node_id: num("raft_node_id").unwrap_or(0),
        role: get("raft_state").unwrap_or("-").to_string(),
        leader_id: num("raft_leader_id"),
        leader_addr: get("raft_leader_addr")
            .filter(|a| *a != "-")
            .map(str::to_string),
        term: num("raft_term").unwrap_or(0),
        last_index: num("raft_last_log_index").unwrap_or(0),
        applied_index: num("raft_last_applied_index").unwrap_or(0),
        commit_index: num("raft_commit_index"),
        millis_since_quorum_ack: num("raft_millis_since_quorum_ack"),
        lease_held: num("raft_lease_held") == Some(1),
        followers,
    })
}

/// The group of this server, if it is a Raft member.
pub fn group(shared: &Shared) -> Option<GroupView> {
    group_view(&super::replication::section(&shared.repl.get()?.info()))
}

/// One consumer group of the order feed: how far its consumers are behind (a
/// materializer reads through one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedGroupRow {
    /// The stream it reads.
    pub stream: String,
    /// The group's name.
    pub group: String,
    /// Its consumers.
    pub consumers: usize,
    /// Entries of the log not yet delivered to it.
    pub lag: u64,
    /// Entries delivered and not acknowledged.
    pub pending: u64,
    /// How long the oldest unacknowledged entry has waited since its last delivery (0
    /// when none is pending).
    pub oldest_pending_ms: u64,
}

/// The feed's consumer groups; `None` without an order feed.
pub fn feed_groups(shared: &Shared) -> Option<Vec<FeedGroupRow>> {
    let f = shared.feed.get()?;
    Some(
        f.groups
            .summaries(f.readable_lsn(), f.first_lsn())
            .into_iter()
            .map(|g| FeedGroupRow {
                oldest_pending_ms: g.oldest_pending_ms,
                stream: g.stream,
                group: g.group,
                consumers: g.consumers,
                lag: g.lag,
                pending: g.pending as u64,
            })
            .collect(),
    )
}
