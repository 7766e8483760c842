//! A hot sku split over several groups (docs/cluster.md, "A split sale").
//!
//! A parent `P` of `T` units becomes `N` parts, each an ordinary sale on one group: part
//! `i` is the sku `P.p<i>-<k>` with the smallest `k >= 0` whose slot (CRC16 of the whole
//! sku: a sku has no braces) the `i mod G`-th group owns, groups ordered by their lowest
//! slot. The ledger records the parent (`split_parents`) and its parts (`split_parts`);
//! the database refuses any change that would give the parts more than the parent's
//! allocation (`migrations/0008_split_sales.sql`).
//!
//! - [`create_split`] (`stockgate-sweeper split`) creates the parts on their groups and
//!   records them; re-running it with the same arguments changes nothing. With more
//!   parts than recorded it grows the split ([`grow_split`]): the new parts start empty
//!   and [`rebalance`] fills them; fewer parts are refused.
//! - [`rebalance`] moves unsold units from the fullest part to a sold-out one through
//!   `sale_adjustments`, withdrawal first. [`rebalance_locked`] runs it under the
//!   parent's Postgres advisory lock, so that two rebalancers never run a pass of one
//!   parent at once: `stockgate-sweeper rebalance` and the sweeper loop's step
//!   ([`RebalanceStep`], `run --rebalance`) both go through it.
//! - [`reserve_split`] is the buyer's side: the home part ([`home_part`], a hash of the
//!   user shared with the Python and Node packages), then at most two more parts when the
//!   home answers SOLDOUT.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use redis::Value;
use sqlx::Row;
use tracing::{info, warn};

use crate::adjust::{adjust_checked, AdjustError};
use crate::client::{ClientError, StockgateClient};
use crate::gate::ReservationGate;
use crate::ledger::postgres::PgLedger;
use crate::ledger::{Ledger, LedgerError, SaleRecord};
use crate::types::ReserveOutcome;

/// Parts tried after the home part when it is sold out.
pub const MAX_PROBES: usize = 2;
/// Longest parent sku: the part suffix `.p<i>-<k>` must fit in a sku's 64 bytes.
pub const MAX_PARENT: usize = 48;
/// Most parts a split may have (`split_parents.parts`).
pub const MAX_PARTS: usize = 64;

/// Why a split could not be created or rebalanced.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The arguments break a rule; the message names it.
    #[error("split: {0}")]
    Invalid(String),
    /// The cluster's `CLUSTER SLOTS` could not be read or made sense of.
    #[error("split: cluster map of {addr}: {why}")]
    Cluster {
        /// The node asked.
        addr: String,
        /// What went wrong.
        why: String,
    },
    /// The ledger holds this parent (or one of its parts) with other values.
    #[error("split {parent}: {why}; nothing was changed for it")]
    Conflict {
        /// The parent.
        parent: String,
        /// What differs.
        why: String,
    },
    /// A part's group reports another history than the one its part was created on.
    #[error(
        "split part {sku}: the server reports history {server}, the ledger recorded {ledger} \
         (another group, a wiped data dir or a restored copy); nothing was changed"
    )]
    History {
        /// The part.
        sku: String,
        /// What the ledger recorded.
        ledger: String,
        /// What the server reports.
        server: String,
    },
    /// A part's group could not be reached.
    #[error(
        "split part {part}: its group's node {addr} cannot be reached ({source}); re-run the \
         same command once it is up"
    )]
    Unreachable {
        /// The part's index.
        part: usize,
        /// The node tried.
        addr: String,
        /// Why.
        source: ClientError,
    },
    /// The parent is not in the ledger.
    #[error("split {0} is unknown to the ledger")]
    UnknownParent(String),
    /// The ledger call failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// A server call failed.
    #[error("server: {0}")]
    Server(#[from] ClientError),
    /// An adjustment of a part failed.
    #[error(transparent)]
    Adjust(#[from] AdjustError),
}

impl From<sqlx::Error> for SplitError {
    fn from(e: sqlx::Error) -> Self {
        SplitError::Ledger(e.into())
    }
}

/// 32-bit FNV-1a of `user`'s bytes: the same function in `clients/python` and
/// `clients/node` (test vectors in docs/cluster.md), so every client sends a buyer to one
/// home part.
pub fn user_hash(user: &str) -> u32 {
    user.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The buyer's home part among `parts` (0 when there are none).
pub fn home_part(user: &str, parts: usize) -> usize {
    if parts == 0 {
        return 0;
    }
    (user_hash(user) as usize) % parts
}

/// The parts [`reserve_split`] tries, in order: the home, then the next [`MAX_PROBES`]
/// parts after it (wrapping), each once.
pub fn probe_order(user: &str, parts: usize) -> Vec<usize> {
    let home = home_part(user, parts);
    (0..parts.min(MAX_PROBES + 1))
        .map(|k| (home + k) % parts)
        .collect()
}

/// The sku of part `index` of `parent`: `parent.p<index>-<k>` for the smallest `k` whose
/// slot `owns` accepts (None if no `k` below 100000 does: `owns` accepts no slot).
pub fn part_sku(parent: &str, index: usize, owns: impl Fn(u16) -> bool) -> Option<String> {
    (0..100_000u32)
        .map(|k| format!("{parent}.p{index}-{k}"))
        .find(|s| owns(stockgate_core::slot::key_slot(s.as_bytes())))
}

/// Part `index`'s share of `total` units over `parts` parts: equal, the first
/// `total mod parts` parts one more.
pub fn initial_share(total: u64, parts: usize, index: usize) -> u64 {
    let n = parts.max(1) as u64;
    total / n + u64::from((index as u64) < total % n)
}

/// What [`reserve_split`] got, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitReserve {
    /// The index of the part whose answer this is (the last one tried when every part
    /// tried was sold out).
    pub part: usize,
    /// That part's sku.
    pub sku: String,
    /// The parts tried, in order.
    pub tried: Vec<usize>,
    /// The answer of `part`.
    pub outcome: ReserveOutcome,
}

/// Reserve `qty` units of a split sale for `user`: the home part first, then at most
/// [`MAX_PROBES`] other parts, each only after the one before answered SOLDOUT (any other
/// answer, a LIMIT included, is final). `gates[i]` talks to the group of `parts[i]`;
/// `admission(sku)` gives the admission token for that part's sku and this user;
/// `request_id` is sent unchanged to every part tried (one request per part).
pub async fn reserve_split<G: ReservationGate>(
    gates: &[G],
    parts: &[String],
    user: &str,
    qty: u32,
    admission: impl Fn(&str) -> String,
    request_id: &str,
) -> Result<SplitReserve, ClientError> {
    if parts.is_empty() || gates.len() != parts.len() {
        return Err(ClientError::Config(format!(
            "reserve_split: {} parts and {} gates: give one gate per part, at least one",
            parts.len(),
            gates.len()
        )));
    }
    let order = probe_order(user, parts.len());
    let mut tried = Vec::with_capacity(order.len());
    let mut last = None;
    for i in order {
        tried.push(i);
        let sku = &parts[i];
        let out = gates[i]
            .reserve(sku, user, &admission(sku), request_id, qty)
            .await?;
        let sold_out = matches!(out, ReserveOutcome::SoldOut);
        last = Some((i, out));
        if !sold_out {
            break;
        }
    }
    let (part, outcome) = last.unwrap_or((0, ReserveOutcome::SoldOut));
    Ok(SplitReserve {
        part,
        sku: parts[part].clone(),
        tried,
        outcome,
    })
}

/// One group as `CLUSTER SLOTS` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterGroup {
    /// Its master's node id.
    pub id: String,
    /// Its master's `host:port`.
    pub addr: String,
    /// Its slot ranges, inclusive.
    pub ranges: Vec<(u16, u16)>,
}

impl ClusterGroup {
    /// Whether this group owns `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

fn host_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// The groups of the cluster `seed` belongs to, ordered by their lowest slot (the order
/// part indexes are placed in), from its `CLUSTER SLOTS`.
pub fn parse_cluster_slots(v: &Value) -> Option<Vec<ClusterGroup>> {
    let Value::Array(ranges) = v else {
        return None;
    };
    let mut by_id: BTreeMap<String, ClusterGroup> = BTreeMap::new();
    for r in ranges {
        let Value::Array(e) = r else { return None };
        let lo = u16::try_from(int_of(e.first()?)?).ok()?;
        let hi = u16::try_from(int_of(e.get(1)?)?).ok()?;
        let Value::Array(master) = e.get(2)? else {
            return None;
        };
        let host = host_of(master.first()?)?;
        let port = int_of(master.get(1)?)?;
        let id = master.get(2).and_then(host_of).unwrap_or_default();
        by_id
            .entry(id.clone())
            .or_insert_with(|| ClusterGroup {
                id,
                addr: format!("{host}:{port}"),
                ranges: Vec::new(),
            })
            .ranges
            .push((lo, hi));
    }
    let mut groups: Vec<ClusterGroup> = by_id.into_values().collect();
    groups.sort_by_key(|g| g.ranges.iter().map(|r| r.0).min().unwrap_or(u16::MAX));
    Some(groups)
}

/// `addr` with `seed`'s `redis://user:pass@` credentials, if it has any.
fn with_credentials(seed: &str, addr: &str) -> String {
    seed.strip_prefix("redis://")
        .and_then(|rest| rest.split_once('@'))
        .map_or_else(
            || addr.to_string(),
            |(creds, _)| format!("redis://{creds}@{addr}"),
        )
}

/// The cluster's groups, asked of `seed` (`host:port` or a `redis://` URL).
pub async fn cluster_groups(seed: &str) -> Result<Vec<ClusterGroup>, SplitError> {
    let err = |why: String| SplitError::Cluster {
        addr: seed.to_string(),
        why,
    };
    let url = if seed.contains("://") {
        seed.to_string()
    } else {
        format!("redis://{seed}")
    };
    let client = redis::Client::open(url).map_err(|e| err(e.to_string()))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| err(e.to_string()))?;
    let v: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .map_err(|e| err(e.to_string()))?;
    let groups = parse_cluster_slots(&v).ok_or_else(|| err(format!("unexpected reply {v:?}")))?;
    if groups.is_empty() {
        return Err(err("no group owns any slot".into()));
    }
    Ok(groups)
}

/// A connection to the group owning `sku`'s slot.
pub async fn connect_owner(
    seed: &str,
    groups: &[ClusterGroup],
    sku: &str,
) -> Result<StockgateClient, SplitError> {
    let slot = stockgate_core::slot::key_slot(sku.as_bytes());
    let g = groups
        .iter()
        .find(|g| g.owns(slot))
        .ok_or_else(|| SplitError::Cluster {
            addr: seed.to_string(),
            why: format!("no group owns slot {slot} of {sku}"),
        })?;
    Ok(StockgateClient::connect(&with_credentials(seed, &g.addr)).await?)
}

/// What `stockgate-sweeper split` is asked to create.
#[derive(Clone, Debug)]
pub struct SplitSpec {
    /// The parent's name (a sku of at most [`MAX_PARENT`] bytes).
    pub parent: String,
    /// Number of parts.
    pub parts: usize,
    /// The parent's allocation.
    pub total: u64,
    /// Units per user on each part.
    pub limit: Option<u32>,
    /// Shards per part.
    pub shards: Option<u16>,
    /// Reservation TTL of every part.
    pub ttl_ms: Option<u64>,
}

/// A part as the ledger records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPart {
    /// Its index.
    pub index: usize,
    /// Its sku.
    pub sku: String,
    /// The history of the group it was created on.
    pub history_id: String,
}

/// A parent as the ledger records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitParent {
    /// The parent's name.
    pub parent: String,
    /// What the parts may hold together.
    pub allocation: u64,
    /// Number of parts.
    pub parts: usize,
    /// Units per user on each part.
    pub per_user_limit: Option<u32>,
}

fn check_spec(s: &SplitSpec) -> Result<(), SplitError> {
    let ok_name = !s.parent.is_empty()
        && s.parent.len() <= MAX_PARENT
        && stockgate_core::engine::ident::valid_sku(s.parent.as_bytes());
    if !ok_name {
        return Err(SplitError::Invalid(format!(
            "parent {:?} must be 1 to {MAX_PARENT} characters of A-Z a-z 0-9 _ . : -",
            s.parent
        )));
    }
    if s.parts == 0 || s.parts > MAX_PARTS {
        return Err(SplitError::Invalid(format!(
            "--parts must be 1 to {MAX_PARTS}, got {}",
            s.parts
        )));
    }
    Ok(())
}

fn to_i64(v: u64, what: &str) -> Result<i64, SplitError> {
    i64::try_from(v).map_err(|_| SplitError::Invalid(format!("{what} {v} is too large")))
}

/// The parent `parent` and its parts, if the ledger has it.
pub async fn load_split(
    ledger: &PgLedger,
    parent: &str,
) -> Result<Option<(SplitParent, Vec<SplitPart>)>, SplitError> {
    let Some(row) = sqlx::query(
        "SELECT allocation, parts, per_user_limit FROM split_parents WHERE parent = $1",
    )
    .bind(parent)
    .fetch_optional(ledger.pool())
    .await?
    else {
        return Ok(None);
    };
    let corrupt = |w: &str| LedgerError::Corrupt(format!("split_parents.{w} out of range"));
    let alloc: i64 = row.try_get(0)?;
    let parts: i32 = row.try_get(1)?;
    let limit: Option<i32> = row.try_get(2)?;
    let head = SplitParent {
        parent: parent.to_string(),
        allocation: u64::try_from(alloc).map_err(|_| corrupt("allocation"))?,
        parts: usize::try_from(parts).map_err(|_| corrupt("parts"))?,
        per_user_limit: limit
            .map(u32::try_from)
            .transpose()
            .map_err(|_| corrupt("per_user_limit"))?,
    };
    let rows = sqlx::query(
        "SELECT part_index, sku, history_id FROM split_parts WHERE parent = $1 \
         ORDER BY part_index",
    )
    .bind(parent)
    .fetch_all(ledger.pool())
    .await?;
    let mut parts = Vec::with_capacity(rows.len());
    for r in rows {
        let i: i32 = r.try_get(0)?;
        parts.push(SplitPart {
            index: usize::try_from(i).map_err(|_| corrupt("part_index"))?,
            sku: r.try_get(1)?,
            history_id: r.try_get(2)?,
        });
    }
    Ok(Some((head, parts)))
}

/// Create the split `spec` describes, or grow it: record the parent, then for each part
/// create its sale on its group (`SALE.CREATE`, which answers `+OK` to the same
/// parameters again), register it and record it as the parent's part. With more parts
/// than recorded and every other value the same, the parts beyond the recorded ones are
/// added empty ([`grow_split`]). Re-running with the same `spec` after any failure
/// finishes what is missing and changes nothing else; other values for an existing parent,
/// fewer parts included, are refused.
pub async fn create_split(
    ledger: &PgLedger,
    seed: &str,
    spec: &SplitSpec,
) -> Result<Vec<SplitPart>, SplitError> {
    check_spec(spec)?;
    let groups = cluster_groups(seed).await?;
    sqlx::query(
        "INSERT INTO split_parents (parent, allocation, parts, per_user_limit) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (parent) DO NOTHING",
    )
    .bind(&spec.parent)
    .bind(to_i64(spec.total, "--total")?)
    .bind(i32::try_from(spec.parts).unwrap_or(i32::MAX))
    .bind(spec.limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)))
    .execute(ledger.pool())
    .await?;
    let (head, recorded) = load_split(ledger, &spec.parent)
        .await?
        .ok_or_else(|| SplitError::UnknownParent(spec.parent.clone()))?;
    check_head(spec, &head)?;
    let mut out = Vec::with_capacity(spec.parts);
    for i in 0..head.parts {
        let known = recorded.iter().find(|r| r.index == i);
        out.push(ensure_part(ledger, seed, &groups, spec, head.parts, i, known).await?);
    }
    if spec.parts > head.parts {
        out.extend(grow_split(ledger, seed, &groups, spec, head.parts).await?);
    }
    Ok(out)
}

fn conflict(spec: &SplitSpec, why: String) -> SplitError {
    SplitError::Conflict {
        parent: spec.parent.clone(),
        why,
    }
}

/// The recorded parent against `spec`: the same allocation and limit, and at least as
/// many parts (a split is never given fewer).
fn check_head(spec: &SplitSpec, head: &SplitParent) -> Result<(), SplitError> {
    if head.per_user_limit != spec.limit {
        return Err(conflict(
            spec,
            format!(
                "recorded with limit {:?}, asked limit {:?}",
                head.per_user_limit, spec.limit
            ),
        ));
    }
    if head.allocation != spec.total {
        return Err(conflict(
            spec,
            format!(
                "recorded with allocation {}, asked {}",
                head.allocation, spec.total
            ),
        ));
    }
    if spec.parts < head.parts {
        return Err(conflict(
            spec,
            format!(
                "recorded with {} parts, asked {}: a split can be given more parts, never \
                 fewer",
                head.parts, spec.parts
            ),
        ));
    }
    Ok(())
}

/// Part `index`'s group (`index mod G`) and sku.
fn place<'g>(
    groups: &'g [ClusterGroup],
    parent: &str,
    index: usize,
) -> Result<(&'g ClusterGroup, String), SplitError> {
    let group = &groups[index % groups.len()];
    let sku = part_sku(parent, index, |s| group.owns(s)).ok_or_else(|| {
        SplitError::Invalid(format!(
            "no sku for part {index} lands on group {}",
            group.id
        ))
    })?;
    Ok((group, sku))
}

/// A connection to `group` and the history it reports.
async fn group_history(
    seed: &str,
    group: &ClusterGroup,
    index: usize,
) -> Result<(StockgateClient, String), SplitError> {
    let unreachable = |source| SplitError::Unreachable {
        part: index,
        addr: group.addr.clone(),
        source,
    };
    let client = StockgateClient::connect(&with_credentials(seed, &group.addr))
        .await
        .map_err(unreachable)?;
    let history = client
        .history()
        .await
        .map_err(unreachable)?
        .ok_or_else(|| {
            SplitError::Invalid(format!(
                "group {} reports no history id yet; nothing was created for part {index}",
                group.addr
            ))
        })?;
    Ok((client, history))
}

/// Part `index` of a split of `parts` parts: a recorded part is checked (its sku under
/// the current map, its group's history, its sale's options); a missing one is created
/// with its initial share and recorded.
async fn ensure_part(
    ledger: &PgLedger,
    seed: &str,
    groups: &[ClusterGroup],
    spec: &SplitSpec,
    parts: usize,
    index: usize,
    known: Option<&SplitPart>,
) -> Result<SplitPart, SplitError> {
    let (group, sku) = place(groups, &spec.parent, index)?;
    if let Some(r) = known.filter(|r| r.sku != sku) {
        return Err(conflict(
            spec,
            format!(
                "part {index} is recorded as {} but the slot map puts it at {sku} (the map \
                 changed since the split was made)",
                r.sku
            ),
        ));
    }
    let (client, history) = group_history(seed, group, index).await?;
    if let Some(r) = known {
        if r.history_id != history {
            return Err(SplitError::History {
                sku,
                ledger: r.history_id.clone(),
                server: history,
            });
        }
        check_part_options(ledger, spec, &sku).await?;
        return Ok(r.clone());
    }
    let share = initial_share(spec.total, parts, index);
    place_sale(ledger, &client, spec, &sku, share, &history).await?;
    sqlx::query(
        "INSERT INTO split_parts (parent, part_index, sku, history_id) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (parent, part_index) DO NOTHING",
    )
    .bind(&spec.parent)
    .bind(i32::try_from(index).unwrap_or(i32::MAX))
    .bind(&sku)
    .bind(&history)
    .execute(ledger.pool())
    .await?;
    info!(parent = %spec.parent, part = index, %sku, units = share, group = %group.addr, "split part in place");
    Ok(SplitPart {
        index,
        sku,
        history_id: history,
    })
}

/// A recorded part's sale must have been made with `spec`'s shards, TTL and limit: the
/// parts a grown split adds get `spec`'s, so they must be the existing parts' too.
async fn check_part_options(
    ledger: &PgLedger,
    spec: &SplitSpec,
    sku: &str,
) -> Result<(), SplitError> {
    let rec = ledger
        .sale(sku)
        .await?
        .ok_or_else(|| LedgerError::Corrupt(format!("split part {sku} has no sales row")))?;
    let recorded = (rec.shards, rec.ttl_ms, rec.per_user_limit);
    let asked = (spec.shards, spec.ttl_ms, spec.limit);
    if recorded != asked {
        return Err(conflict(
            spec,
            format!(
                "part {sku} was made with (shards, ttl-ms, limit) {recorded:?}, asked \
                 {asked:?}"
            ),
        ));
    }
    Ok(())
}

/// The part's sale on its group and in the ledger, bound to the group's history (each
/// step idempotent).
async fn place_sale(
    ledger: &PgLedger,
    client: &StockgateClient,
    spec: &SplitSpec,
    sku: &str,
    units: u64,
    history: &str,
) -> Result<(), SplitError> {
    client
        .sale_create(sku, units, spec.shards, spec.ttl_ms, spec.limit)
        .await?;
    let info = client.sale_info(sku).await?;
    let mut rec = SaleRecord::new(sku, units);
    rec.shards = spec.shards;
    rec.ttl_ms = spec.ttl_ms;
    rec.per_user_limit = spec.limit;
    rec.key_fingerprint = Some(info.key_fingerprint);
    ledger.register_sale(&rec).await?;
    // The part's sale lives on its group: that group's sweeper, rebuild and
    // materializer take it, no other.
    ledger.record_sale_history(sku, history).await?;
    Ok(())
}

/// Grow a complete split of `from` parts to `spec.parts`: each new part's sale is
/// created with 0 units on its group and registered with allocation 0 (nothing moves:
/// the parts' sum is unchanged), then one ledger transaction raises
/// `split_parents.parts` and records the new parts, in that order so that
/// `split_check_parent` holds after each statement. Until that transaction commits the
/// split is the old one, and a re-run starts the growth again (every step before it is
/// idempotent); after it, a re-run finds every part recorded. `rebalance` then moves
/// units into the new, empty parts.
pub async fn grow_split(
    ledger: &PgLedger,
    seed: &str,
    groups: &[ClusterGroup],
    spec: &SplitSpec,
    from: usize,
) -> Result<Vec<SplitPart>, SplitError> {
    let mut new = Vec::with_capacity(spec.parts.saturating_sub(from));
    for index in from..spec.parts {
        let (group, sku) = place(groups, &spec.parent, index)?;
        let (client, history) = group_history(seed, group, index).await?;
        place_sale(ledger, &client, spec, &sku, 0, &history).await?;
        new.push(SplitPart {
            index,
            sku,
            history_id: history,
        });
    }
    let mut tx = ledger.pool().begin().await?;
    let raised =
        sqlx::query("UPDATE split_parents SET parts = $2 WHERE parent = $1 AND parts = $3")
            .bind(&spec.parent)
            .bind(i32::try_from(spec.parts).unwrap_or(i32::MAX))
            .bind(i32::try_from(from).unwrap_or(i32::MAX))
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if raised != 1 {
        return Err(conflict(
            spec,
            format!("its part count changed from {from} meanwhile (another split running?)"),
        ));
    }
    for p in &new {
        sqlx::query(
            "INSERT INTO split_parts (parent, part_index, sku, history_id) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(&spec.parent)
        .bind(i32::try_from(p.index).unwrap_or(i32::MAX))
        .bind(&p.sku)
        .bind(&p.history_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    info!(parent = %spec.parent, from, to = spec.parts, "split grown; rebalance fills the new parts");
    Ok(new)
}

/// What one [`rebalance`] pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebalanceReport {
    /// Units withdrawn from the fullest part, and its index.
    pub withdrawn: Option<(usize, u64)>,
    /// Units given to the part that had fewest available, and its index.
    pub given: Option<(usize, u64)>,
    /// Unconfirmed adjustments of the parts finished first.
    pub finished: usize,
}

impl std::fmt::Display for RebalanceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.withdrawn, self.given) {
            (None, None) => write!(f, "nothing to move")?,
            (w, g) => {
                if let Some((i, n)) = w {
                    write!(f, "withdrew {n} from part {i}; ")?;
                }
                match g {
                    Some((i, n)) => write!(f, "gave {n} to part {i}")?,
                    None => write!(f, "gave nothing")?,
                }
            }
        }
        write!(f, " ({} unconfirmed adjustments finished)", self.finished)
    }
}

/// One rebalance pass over `parent`'s parts. Only one rebalancer may run per parent (the
/// database bound holds whatever runs; see docs/cluster.md for what a second one costs).
///
/// 1. Every part's group must report the history its part was created on.
/// 2. Unconfirmed adjustments of every part are finished first (as `adjust` with the
///    same id), so every server's total is its ledger allocation before anything moves.
/// 3. If a part has 0 available while the fullest has more than `threshold`, half of the
///    fullest's available (at least one unit) is withdrawn from it (`SALE.ADJUST -m`,
///    refused by its server if buyers took them meanwhile: then nothing moves).
/// 4. Whatever the parent's allocation holds beyond the sum of the parts' allocations
///    (the units just withdrawn, or those of a pass that stopped between its two steps)
///    is given to the part with fewest available.
pub async fn rebalance(
    ledger: &PgLedger,
    seed: &str,
    parent: &str,
    threshold: u64,
) -> Result<RebalanceReport, SplitError> {
    let (head, parts) = load_split(ledger, parent)
        .await?
        .ok_or_else(|| SplitError::UnknownParent(parent.to_string()))?;
    if parts.is_empty() {
        return Ok(RebalanceReport::default());
    }
    let gates = connect_parts(seed, &parts).await?;
    let pass = PassParts {
        ledger,
        parent,
        parts: &parts,
        gates: &gates,
    };
    let mut report = RebalanceReport {
        finished: finish_unconfirmed(&pass).await?,
        ..RebalanceReport::default()
    };
    let mut available = parts_available(&pass).await?;
    if withdraw_from_fullest(&pass, threshold, &mut available, &mut report)
        .await?
        .is_break()
    {
        return Ok(report);
    }
    give_spare(&pass, &head, &available, &mut report).await?;
    if report.withdrawn.is_some() || report.given.is_some() {
        info!(parent, %report, "split rebalanced");
    }
    Ok(report)
}

/// What the steps of one [`rebalance`] pass share: the parent, its parts and a connection
/// to each part's group (in the parts' order).
struct PassParts<'a> {
    ledger: &'a PgLedger,
    parent: &'a str,
    parts: &'a [SplitPart],
    gates: &'a [StockgateClient],
}

/// Step 1: a connection to every part's group, each checked to report the history its part
/// was created on.
async fn connect_parts(
    seed: &str,
    parts: &[SplitPart],
) -> Result<Vec<StockgateClient>, SplitError> {
    let groups = cluster_groups(seed).await?;
    let mut gates = Vec::with_capacity(parts.len());
    for p in parts {
        let g = connect_owner(seed, &groups, &p.sku).await?;
        let server = g.history().await?.unwrap_or_default();
        if server != p.history_id {
            return Err(SplitError::History {
                sku: p.sku.clone(),
                ledger: p.history_id.clone(),
                server,
            });
        }
        gates.push(g);
    }
    Ok(gates)
}

/// Step 2: every part's unconfirmed adjustments finished (as `adjust` with the same id);
/// the number finished.
async fn finish_unconfirmed(pass: &PassParts<'_>) -> Result<usize, SplitError> {
    let mut finished = 0;
    for (p, g) in pass.parts.iter().zip(pass.gates) {
        for a in pass.ledger.adjustments(&p.sku, true).await? {
            adjust_checked(pass.ledger, g, &p.sku, &a.id, a.delta).await?;
            finished += 1;
        }
    }
    Ok(finished)
}

/// Every part's available units as its server reports them; `None` for a fenced or missing
/// part.
async fn parts_available(pass: &PassParts<'_>) -> Result<Vec<Option<i64>>, SplitError> {
    let mut available = Vec::with_capacity(pass.parts.len());
    for (p, g) in pass.parts.iter().zip(pass.gates) {
        let info = ReservationGate::sale_info(g, &p.sku).await?;
        // A fenced or missing part is neither a source nor a target: its rebuild owns it.
        available.push(info.filter(|i| !i.is_fenced()).map(|i| i.available.max(0)));
    }
    Ok(available)
}

/// The parts that may give or take units, with their available units.
fn open_parts(av: &[Option<i64>]) -> impl Iterator<Item = (usize, i64)> + '_ {
    av.iter().enumerate().filter_map(|(i, a)| a.map(|a| (i, a)))
}

/// Step 3: if a part is dry while the fullest holds more than `threshold`, half of the
/// fullest's available (at least one unit) is withdrawn from it. Breaks when its server
/// refused (sold meanwhile): then nothing moves in this pass.
async fn withdraw_from_fullest(
    pass: &PassParts<'_>,
    threshold: u64,
    available: &mut [Option<i64>],
    report: &mut RebalanceReport,
) -> Result<ControlFlow<()>, SplitError> {
    let parent = pass.parent;
    let dry = open_parts(available).any(|(_, a)| a == 0);
    let fullest = open_parts(available).max_by_key(|&(_, a)| a);
    let Some((src, most)) = fullest.filter(|&(_, a)| dry && a as u64 > threshold) else {
        return Ok(ControlFlow::Continue(()));
    };
    let m = (most / 2).max(1);
    let id = format!("split-{parent}-out-{:016x}", rand::random::<u64>());
    match adjust_checked(pass.ledger, &pass.gates[src], &pass.parts[src].sku, &id, -m).await {
        Ok(_) => {
            report.withdrawn = Some((src, m as u64));
            if let Some(a) = available.get_mut(src) {
                *a = a.map(|v| v - m);
            }
            Ok(ControlFlow::Continue(()))
        }
        Err(AdjustError::Refused { reason, .. }) => {
            warn!(parent, part = src, %reason, "withdrawal refused (sold meanwhile); nothing moved");
            Ok(ControlFlow::Break(()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Step 4: whatever the parent's allocation holds beyond the sum of the parts' allocations
/// is given to the part with fewest available (not the one just withdrawn from, when
/// another is as dry).
async fn give_spare(
    pass: &PassParts<'_>,
    head: &SplitParent,
    available: &[Option<i64>],
    report: &mut RebalanceReport,
) -> Result<(), SplitError> {
    let mut held: u64 = 0;
    for p in pass.parts {
        held += pass.ledger.sale(&p.sku).await?.map_or(0, |s| s.allocation);
    }
    let spare = head.allocation.saturating_sub(held);
    // Never back to the part just withdrawn from, when another is as dry.
    let src = report.withdrawn.map(|(i, _)| i);
    let target = open_parts(available)
        .min_by_key(|&(i, a)| (a, Some(i) == src))
        .map(|(i, _)| i);
    if let (Some(dst), true) = (target, spare > 0) {
        let id = format!("split-{}-in-{:016x}", pass.parent, rand::random::<u64>());
        let delta = i64::try_from(spare)
            .map_err(|_| SplitError::Invalid(format!("{spare} units are too many")))?;
        adjust_checked(
            pass.ledger,
            &pass.gates[dst],
            &pass.parts[dst].sku,
            &id,
            delta,
        )
        .await?;
        report.given = Some((dst, spare));
    }
    Ok(())
}

/// What [`rebalance_locked`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockedPass {
    /// The pass ran under the parent's lock.
    Ran(RebalanceReport),
    /// Another rebalancer holds the parent's lock: nothing was done.
    Busy,
}

/// The text whose `hashtextextended(_, 0)` is the advisory lock key of `parent`'s
/// rebalance in the ledger schema `schema` (advisory locks are per database: the schema
/// keeps two ledgers in one database apart).
pub fn rebalance_lock_name(schema: &str, parent: &str) -> String {
    format!("stockgate.rebalance:{schema}:{parent}")
}

/// One [`rebalance`] pass of `parent` under its advisory lock, taken with
/// `pg_try_advisory_xact_lock` in a transaction held open for the pass: a second
/// rebalancer of the same parent (another group's sweeper, a `rebalance` process) finds
/// it taken and skips ([`LockedPass::Busy`]). The lock ends with the transaction, so a
/// rebalancer that dies or loses its connection mid-pass leaves no lock behind.
pub async fn rebalance_locked(
    ledger: &PgLedger,
    seed: &str,
    parent: &str,
    threshold: u64,
) -> Result<LockedPass, SplitError> {
    let mut lock = ledger.pool().begin().await?;
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(rebalance_lock_name(ledger.schema(), parent))
        .fetch_one(&mut *lock)
        .await?;
    if !got {
        lock.rollback().await?;
        return Ok(LockedPass::Busy);
    }
    let pass = rebalance(ledger, seed, parent, threshold).await;
    // Ending the transaction releases the lock, whatever the pass did.
    lock.rollback().await?;
    pass.map(LockedPass::Ran)
}

/// The split parents with at least one part on `history`, in name order.
pub async fn parents_on_history(
    ledger: &PgLedger,
    history: &str,
) -> Result<Vec<String>, SplitError> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT parent FROM split_parts WHERE history_id = $1 ORDER BY parent",
    )
    .bind(history)
    .fetch_all(ledger.pool())
    .await?)
}

/// The sweeper loop's rebalance step (`stockgate-sweeper run --rebalance`): each sweeper
/// pass, one [`rebalance_locked`] pass of every parent with a part on the sweeper's
/// group. Every group's sweeper may run it; the lock makes one rebalancer per parent at a
/// time.
pub struct RebalanceStep {
    ledger: PgLedger,
    seed: String,
    threshold: u64,
}

impl RebalanceStep {
    /// A step over `ledger`'s split parents; `seed` is any node of the cluster (its
    /// `CLUSTER SLOTS` finds each part's group), `threshold` as [`rebalance`]'s.
    pub fn new(ledger: PgLedger, seed: &str, threshold: u64) -> Self {
        RebalanceStep {
            ledger,
            seed: seed.to_string(),
            threshold,
        }
    }

    async fn run(&self, history: &str) -> crate::sweeper::RebalanceSummary {
        let mut out = crate::sweeper::RebalanceSummary::default();
        let parents = match parents_on_history(&self.ledger, history).await {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "rebalance step: the split parents could not be read");
                out.failed.push(("*".into(), e.to_string()));
                return out;
            }
        };
        for parent in parents {
            match rebalance_locked(&self.ledger, &self.seed, &parent, self.threshold).await {
                Ok(LockedPass::Ran(r)) => out.ran.push((parent, r.to_string())),
                Ok(LockedPass::Busy) => out.busy.push(parent),
                Err(e) => {
                    warn!(error = %e, %parent, "rebalance pass failed; the next sweeper pass retries");
                    out.failed.push((parent, e.to_string()));
                }
            }
        }
        out
    }
}

impl crate::sweeper::RebalanceHook for RebalanceStep {
    fn pass<'a>(
        &'a self,
        history: &'a str,
    ) -> futures::future::BoxFuture<'a, crate::sweeper::RebalanceSummary> {
        Box::pin(self.run(history))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors `tests/split/vectors.json` holds, which the Python and Node packages
    /// test too.
    #[test]
    fn split_shared_vectors() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/split/vectors.json")).expect("json");
        let list = |k: &str| v[k].as_array().expect("array").clone();
        for h in list("hashes") {
            let user = h[0].as_str().expect("user");
            assert_eq!(
                u64::from(user_hash(user)),
                h[1].as_u64().expect("hash"),
                "{user}"
            );
        }
        for h in list("homes") {
            let user = h[0].as_str().expect("user");
            let want = (h[1].as_u64().expect("of 3"), h[2].as_u64().expect("of 5"));
            let got = (home_part(user, 3) as u64, home_part(user, 5) as u64);
            assert_eq!(got, want, "{user}");
        }
        assert_eq!(probe_order("a", 5), vec![0, 1, 2]);
        assert_eq!(probe_order("dave", 3), vec![1, 2, 0]);
        assert_eq!(probe_order("a", 2), vec![0, 1]);
        assert_eq!(initial_share(10, 3, 0), 4);
        assert_eq!(initial_share(10, 3, 2), 3);
    }
}
