//! A consumer of a consumer group on the order feed (`XREADGROUP` / `XACK` /
//! `XAUTOCLAIM`): the server keeps the group's position and pending entries (in its log,
//! across restarts), so several order-service instances share one stream, each entry
//! going to one of them until it is acknowledged.
//!
//! ```no_run
//! # async fn f() -> Result<(), stockgate_client::materialize::MaterializeError> {
//! use stockgate_client::group::GroupReader;
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

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use crate::materialize::{bulk, parse_entries, FeedEvent, MaterializeError};

#[derive(Clone)]
pub struct GroupReader {
    conn: ConnectionManager,
    stream: String,
    group: String,
    consumer: String,
}

fn feed_error(e: redis::RedisError) -> MaterializeError {
    if e.kind() == redis::ErrorKind::IoError || e.code().is_none() {
        return e.into();
    }
    let msg = e.to_string();
    if msg.contains("trimmed") {
        MaterializeError::Trimmed(msg)
    } else {
        MaterializeError::Feed(msg)
    }
}

/// The one stream's entries of an XREADGROUP reply (RESP2 or RESP3); nil is none.
fn one_stream(v: &Value) -> Result<Vec<FeedEvent>, MaterializeError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => match streams.first() {
            Some(Value::Array(pair)) if pair.len() == 2 => parse_entries(&pair[1]),
            None => Ok(Vec::new()),
            _ => Err(MaterializeError::Protocol(format!("{v:?}"))),
        },
        Value::Map(m) => match m.first() {
            Some((_, es)) => parse_entries(es),
            None => Ok(Vec::new()),
        },
        _ => Err(MaterializeError::Protocol(format!("{v:?}"))),
    }
}

impl GroupReader {
    /// `addr`: `host:port` or a `redis://user:pass@host:port` URL (role sweeper or admin).
    pub async fn connect(
        addr: &str,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<Self, MaterializeError> {
        let url = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("redis://{addr}")
        };
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(2))
            // Longer than any BLOCK this reader asks for (the server caps BLOCK at 60 s).
            .set_response_timeout(Duration::from_secs(70))
            .set_number_of_retries(3)
            .set_max_delay(1000);
        let conn = ConnectionManager::new_with_config(redis::Client::open(url)?, cfg).await?;
        Ok(GroupReader {
            conn,
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
        })
    }

    /// `XGROUP CREATE` at `from` (`0`: the log's start, `$`: from now on). An existing
    /// group is left as it is: `Ok(false)`.
    pub async fn create(&self, from: &str) -> Result<bool, MaterializeError> {
        let mut c = self.conn.clone();
        let r: Result<Value, _> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(from)
            .query_async(&mut c)
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(false),
            Err(e) => Err(feed_error(e)),
        }
    }

    /// Up to `count` new entries for this consumer (`>`), waiting up to `block_ms` for
    /// some. They stay pending for it until [`GroupReader::ack`].
    pub async fn read(
        &self,
        count: usize,
        block_ms: u64,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        self.read_from(">", count, Some(block_ms)).await
    }

    /// This consumer's own pending entries (after a restart of the consumer: what it was
    /// given and had not acknowledged).
    pub async fn pending_own(&self, count: usize) -> Result<Vec<FeedEvent>, MaterializeError> {
        self.read_from("0", count, None).await
    }

    async fn read_from(
        &self,
        id: &str,
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(&self.group).arg(&self.consumer);
        cmd.arg("COUNT").arg(count);
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(id);
        let v: Value = cmd.query_async(&mut c).await.map_err(feed_error)?;
        one_stream(&v)
    }

    /// `XACK`: how many of `ids` were pending and no longer are.
    pub async fn ack(&self, ids: &[u64]) -> Result<u64, MaterializeError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.stream).arg(&self.group);
        for id in ids {
            cmd.arg(format!("{id}-0"));
        }
        cmd.query_async(&mut c).await.map_err(feed_error)
    }

    /// `XAUTOCLAIM`: takes over up to `count` entries pending for longer than
    /// `min_idle_ms` with any consumer (one that died), and returns them.
    pub async fn autoclaim(
        &self,
        min_idle_ms: u64,
        count: usize,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        let mut c = self.conn.clone();
        let v: Value = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(min_idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut c)
            .await
            .map_err(feed_error)?;
        match &v {
            Value::Array(parts) if parts.len() == 3 && bulk(&parts[0]).is_some() => {
                parse_entries(&parts[1])
            }
            _ => Err(MaterializeError::Protocol(format!("{v:?}"))),
        }
    }
}
