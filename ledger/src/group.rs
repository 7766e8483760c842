//! A consumer of a consumer group on the order feed (`XREADGROUP` / `XACK` /
//! `XAUTOCLAIM`): the server keeps the group's position and pending entries (in its log,
//! across restarts), so several order-service instances share one stream, each entry
//! going to one of them until it is acknowledged.
//!
//! ```no_run
//! # async fn f() -> Result<(), stockgate_ledger::materialize::MaterializeError> {
//! use stockgate_ledger::group::GroupReader;
//! let g = GroupReader::connect("127.0.0.1:7379", "stockgate:events", "orders", "worker-1").await?;
//! g.create("0").await?; // once; an existing group is fine
//! loop {
//!     // Entries another worker took and never acknowledged (it died), then new ones.
//!     let mut batch = g.autoclaim(60_000, 100).await?;
//!     batch.extend(g.read(100, 5000).await?);
//!     for e in &batch {
//!         if e.kind() == "reserved" { /* create the PENDING order, idempotently */ }
//!     }
//!     let ids: Vec<u64> = batch.iter().map(|e| e.lsn).collect();
//!     g.ack(&ids).await?;
//! }
//! # }
//! ```

use std::time::Duration;

use redis::Value;

use crate::materialize::{bulk, one_stream, parse_entries, FeedConn, FeedEvent, MaterializeError};
use crate::sentinel::{Retry, SentinelConfig, ServerTarget};

/// A worker of one consumer group. In Sentinel mode ([`GroupReader::connect_sentinel`])
/// it talks to whichever node the Sentinels name primary: a refusal (`-READONLY`,
/// `-NOREPLICAS`: the command did not run) is resent to the rediscovered primary
/// whatever the command; after a connection error (the command may have run on the old
/// primary, whose group state the replicas have: group records are in the log) only the
/// commands whose repetition changes nothing are resent, as each method says.
#[derive(Clone)]
pub struct GroupReader {
    conn: FeedConn,
    stream: String,
    group: String,
    consumer: String,
}

/// Longer than any BLOCK this reader asks for (the server caps BLOCK at 60 s).
const GROUP_RESPONSE_TIMEOUT: Duration = Duration::from_secs(70);

impl GroupReader {
    /// `addr`: `host:port` or a `redis://user:pass@host:port` URL (role sweeper or admin).
    pub async fn connect(
        addr: &str,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<Self, MaterializeError> {
        let conn = FeedConn::direct(addr, None, GROUP_RESPONSE_TIMEOUT).await?;
        Ok(GroupReader::with(conn, stream, group, consumer))
    }

    /// The group on whichever node the Sentinels of `cfg` name primary, followed across
    /// failovers (see the type's doc).
    pub async fn connect_sentinel(
        cfg: SentinelConfig,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<Self, MaterializeError> {
        let conn = FeedConn::sentinel(cfg, GROUP_RESPONSE_TIMEOUT).await?;
        Ok(GroupReader::with(conn, stream, group, consumer))
    }

    /// [`GroupReader::connect`] or [`GroupReader::connect_sentinel`].
    pub async fn connect_target(
        target: &ServerTarget,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<Self, MaterializeError> {
        let conn = FeedConn::target(target, GROUP_RESPONSE_TIMEOUT).await?;
        Ok(GroupReader::with(conn, stream, group, consumer))
    }

    fn with(conn: FeedConn, stream: &str, group: &str, consumer: &str) -> Self {
        GroupReader {
            conn,
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
        }
    }

    /// The node in use in Sentinel mode (None between a failure and the next
    /// discovery); None with a fixed address.
    pub fn primary_addr(&self) -> Option<String> {
        self.conn.primary_addr()
    }

    /// `XGROUP CREATE` at `from` (`0`: the log's start, `$`: from now on). An existing
    /// group is left as it is: `Ok(false)`.
    ///
    /// Resent after a lost reply: creating a group that exists changes nothing
    /// (`-BUSYGROUP`), so a resend whose first send took effect answers `Ok(false)`.
    pub async fn create(&self, from: &str) -> Result<bool, MaterializeError> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(from);
        let r = self
            .conn
            .call_unless(&cmd, Retry::Idempotent, Some("BUSYGROUP"))
            .await?;
        Ok(r.is_some())
    }

    /// Up to `count` new entries for this consumer (`>`), waiting up to `block_ms` for
    /// some. They stay pending for it until [`GroupReader::ack`].
    ///
    /// Not resent after a lost reply (only after a refusal): a `>` read that ran moved
    /// its entries into this consumer's pending list, and a resend would return the
    /// entries after them. The connection error goes to the caller, which finds the
    /// lost reply's entries with [`GroupReader::pending_own`] (or another worker's
    /// [`GroupReader::autoclaim`]).
    pub async fn read(
        &self,
        count: usize,
        block_ms: u64,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        self.read_from(">", count, Some(block_ms), Retry::RefusalsOnly)
            .await
    }

    /// This consumer's own pending entries (after a restart of the consumer: what it was
    /// given and had not acknowledged).
    ///
    /// Resent after a lost reply: re-reading the pending list hands out nothing new (it
    /// only counts one more delivery of the same entries).
    pub async fn pending_own(&self, count: usize) -> Result<Vec<FeedEvent>, MaterializeError> {
        self.read_from("0", count, None, Retry::Idempotent).await
    }

    async fn read_from(
        &self,
        id: &str,
        count: usize,
        block_ms: Option<u64>,
        retry: Retry,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(&self.group).arg(&self.consumer);
        cmd.arg("COUNT").arg(count);
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(id);
        one_stream(self.conn.call(&cmd, retry).await?)
    }

    /// `XACK`: how many of `ids` were pending and no longer are.
    ///
    /// Resent after a lost reply: acknowledging an entry that is no longer pending
    /// changes nothing, so the resend leaves the same state (its count then leaves out
    /// the entries the first send acknowledged).
    pub async fn ack(&self, ids: &[u64]) -> Result<u64, MaterializeError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.stream).arg(&self.group);
        for id in ids {
            cmd.arg(format!("{id}-0"));
        }
        let v = self.conn.call(&cmd, Retry::Idempotent).await?;
        redis::from_redis_value(&v).map_err(|_| MaterializeError::Protocol(format!("XACK: {v:?}")))
    }

    /// `XAUTOCLAIM`: takes over up to `count` entries pending for longer than
    /// `min_idle_ms` with any consumer (one that died), and returns them.
    ///
    /// Not resent after a lost reply (only after a refusal): a claim that ran made the
    /// entries this consumer's and reset their idle time, so a resend would not return
    /// them; the caller finds them with [`GroupReader::pending_own`].
    pub async fn autoclaim(
        &self,
        min_idle_ms: u64,
        count: usize,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(min_idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(count);
        let v = self.conn.call(&cmd, Retry::RefusalsOnly).await?;
        match v {
            Value::Array(parts) if parts.len() == 3 && bulk(&parts[0]).is_some() => parts
                .into_iter()
                .nth(1)
                .map_or(Ok(Vec::new()), parse_entries),
            other => Err(MaterializeError::Protocol(format!("{other:?}"))),
        }
    }
}
