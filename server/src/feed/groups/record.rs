//! The log format of consumer groups: one [`GroupRecord`] per change, encoded as the body
//! of an opaque WAL record (kinds `wal::record::K_GROUP_*`).

use crate::engine::event::Lsn;
use crate::wal::codec::{put_str, put_u64, DecodeError, Reader};
use crate::wal::record::{
    K_GROUP_ACKED, K_GROUP_CHECKPOINT, K_GROUP_CLAIMED, K_GROUP_CONSUMER, K_GROUP_CREATED,
    K_GROUP_DELIVERED, K_GROUP_DESTROYED, K_GROUP_SET_ID,
};

/// One change of a group, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupRecord {
    /// `XGROUP CREATE`: a new group on a stream.
    Created {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The last-delivered id the group starts from (`$`, `0` or an id).
        last: Lsn,
    },
    /// `XGROUP DESTROY`: the group and its pending entries are gone.
    Destroyed {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
    },
    /// `XGROUP SETID`: the group's last-delivered id moves.
    SetId {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The new last-delivered id (`XGROUP SETID`).
        last: Lsn,
    },
    /// `XGROUP CREATECONSUMER` (`delete` false) or `DELCONSUMER` (true: its pending
    /// entries leave the group).
    Consumer {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The consumer's name.
        consumer: String,
        /// When it happened, in ms since the Unix epoch (the consumer's last-seen time).
        at_ms: u64,
        /// True for `DELCONSUMER`, false for `CREATECONSUMER`.
        delete: bool,
    },
    /// `XREADGROUP`: `new` entries are pending for `consumer` with one delivery (empty
    /// under NOACK), the group's last-delivered id becomes `last` (0: unchanged), and the
    /// `again` entries (a history read) count one more delivery.
    Delivered {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The consumer's name.
        consumer: String,
        /// When it happened, in ms since the Unix epoch (the consumer's last-seen time).
        at_ms: u64,
        /// The group's new last-delivered id (0: unchanged).
        last: Lsn,
        /// Entries delivered for the first time, now pending for the consumer.
        new: Vec<Lsn>,
        /// Pending entries delivered again by a history read.
        again: Vec<Lsn>,
    },
    /// `XACK`: entries leave the pending list.
    Acked {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The acknowledged entries, leaving the pending list.
        ids: Vec<Lsn>,
    },
    /// `XCLAIM`/`XAUTOCLAIM`: `ids` now belong to `consumer`, delivered at `delivery_ms`;
    /// `bump` adds a delivery, `retry` (if set) overrides the count; `dropped` entries
    /// left the log (trimmed) and leave the pending list.
    Claimed {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The consumer's name.
        consumer: String,
        /// When it happened, in ms since the Unix epoch (the consumer's last-seen time).
        at_ms: u64,
        /// The delivery time the claimed entries get, in ms since the Unix epoch.
        delivery_ms: u64,
        /// The entries that change owner.
        ids: Vec<Lsn>,
        /// Whether each claimed entry counts one more delivery.
        bump: bool,
        /// A delivery count that replaces the entries' own (`RETRYCOUNT`).
        retry: Option<u64>,
        /// Entries found trimmed from the log, removed from the pending list.
        dropped: Vec<Lsn>,
    },
    /// A group's whole state: replaces what replay built so far. `scanned` is how far
    /// the log past `last` is known to hold no entry of the stream (the records a
    /// snapshot is about to delete may be only the groups' own).
    Checkpoint {
        /// The stream's name.
        stream: String,
        /// The group's name.
        group: String,
        /// The group's last-delivered id.
        last: Lsn,
        /// How far past `last` the log is known to hold no entry of the stream.
        scanned: Lsn,
        /// (name, seen_ms, active_ms or 0 for never)
        consumers: Vec<(String, u64, u64)>,
        /// (id, index into `consumers`, delivery_ms, delivery count)
        pending: Vec<(Lsn, u64, u64, u64)>,
    },
}

fn put_ids(out: &mut Vec<u8>, ids: &[Lsn]) {
    put_u64(out, ids.len() as u64);
    // Ascending ids as deltas: a batch of 10,000 adjacent ids is ~10 KB, not 80.
    let mut prev = 0u64;
    for &id in ids {
        put_u64(out, id.wrapping_sub(prev));
        prev = id;
    }
}

fn get_ids(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<Lsn>, DecodeError> {
    let n = r.count(what)?;
    let mut v = Vec::with_capacity(n.min(1 << 16));
    let mut prev = 0u64;
    for _ in 0..n {
        prev = prev.wrapping_add(r.u64(what)?);
        v.push(prev);
    }
    Ok(v)
}

impl GroupRecord {
    /// The (stream, group) the record changes: the key its group is found by at replay.
    pub fn key(&self) -> (&str, &str) {
        match self {
            GroupRecord::Created { stream, group, .. }
            | GroupRecord::Destroyed { stream, group }
            | GroupRecord::SetId { stream, group, .. }
            | GroupRecord::Consumer { stream, group, .. }
            | GroupRecord::Delivered { stream, group, .. }
            | GroupRecord::Acked { stream, group, .. }
            | GroupRecord::Claimed { stream, group, .. }
            | GroupRecord::Checkpoint { stream, group, .. } => (stream, group),
        }
    }

    /// The WAL kind and body.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let mut out = Vec::new();
        let (stream, group) = self.key();
        put_str(&mut out, stream);
        put_str(&mut out, group);
        let kind = match self {
            GroupRecord::Created { last, .. } => {
                put_u64(&mut out, *last);
                K_GROUP_CREATED
            }
            GroupRecord::Destroyed { .. } => K_GROUP_DESTROYED,
            GroupRecord::SetId { last, .. } => {
                put_u64(&mut out, *last);
                K_GROUP_SET_ID
            }
            GroupRecord::Consumer {
                consumer,
                at_ms,
                delete,
                ..
            } => {
                put_str(&mut out, consumer);
                put_u64(&mut out, *at_ms);
                out.push(u8::from(*delete));
                K_GROUP_CONSUMER
            }
            GroupRecord::Delivered {
                consumer,
                at_ms,
                last,
                new,
                again,
                ..
            } => {
                put_str(&mut out, consumer);
                put_u64(&mut out, *at_ms);
                put_u64(&mut out, *last);
                put_ids(&mut out, new);
                put_ids(&mut out, again);
                K_GROUP_DELIVERED
            }
            GroupRecord::Acked { ids, .. } => {
                put_ids(&mut out, ids);
                K_GROUP_ACKED
            }
            GroupRecord::Claimed {
                consumer,
                at_ms,
                delivery_ms,
                ids,
                bump,
                retry,
                dropped,
                ..
            } => {
                put_str(&mut out, consumer);
                put_u64(&mut out, *at_ms);
                put_u64(&mut out, *delivery_ms);
                put_ids(&mut out, ids);
                out.push(u8::from(*bump));
                // 0: no override; n + 1: count n.
                put_u64(&mut out, retry.map_or(0, |r| r.saturating_add(1)));
                put_ids(&mut out, dropped);
                K_GROUP_CLAIMED
            }
            GroupRecord::Checkpoint {
                last,
                scanned,
                consumers,
                pending,
                ..
            } => {
                put_checkpoint(&mut out, (*last, *scanned), consumers, pending);
                K_GROUP_CHECKPOINT
            }
        };
        (kind, out)
    }

    /// `None`: not a group record kind.
    pub fn decode(kind: u8, body: &[u8]) -> Option<Result<GroupRecord, DecodeError>> {
        if !(K_GROUP_CREATED..=K_GROUP_CHECKPOINT).contains(&kind) {
            return None;
        }
        Some(Self::decode_body(kind, body))
    }

    fn decode_body(kind: u8, body: &[u8]) -> Result<GroupRecord, DecodeError> {
        let mut r = Reader::new(body);
        let stream = r.string("stream")?;
        let group = r.string("group")?;
        let flag = |r: &mut Reader<'_>, what| r.u8(what).map(|b| b != 0);
        let rec = match kind {
            K_GROUP_CREATED => GroupRecord::Created {
                stream,
                group,
                last: r.u64("last")?,
            },
            K_GROUP_DESTROYED => GroupRecord::Destroyed { stream, group },
            K_GROUP_SET_ID => GroupRecord::SetId {
                stream,
                group,
                last: r.u64("last")?,
            },
            K_GROUP_CONSUMER => GroupRecord::Consumer {
                stream,
                group,
                consumer: r.string("consumer")?,
                at_ms: r.u64("at_ms")?,
                delete: flag(&mut r, "delete")?,
            },
            K_GROUP_DELIVERED => GroupRecord::Delivered {
                stream,
                group,
                consumer: r.string("consumer")?,
                at_ms: r.u64("at_ms")?,
                last: r.u64("last")?,
                new: get_ids(&mut r, "new")?,
                again: get_ids(&mut r, "again")?,
            },
            K_GROUP_ACKED => GroupRecord::Acked {
                stream,
                group,
                ids: get_ids(&mut r, "ids")?,
            },
            K_GROUP_CLAIMED => GroupRecord::Claimed {
                stream,
                group,
                consumer: r.string("consumer")?,
                at_ms: r.u64("at_ms")?,
                delivery_ms: r.u64("delivery_ms")?,
                ids: get_ids(&mut r, "ids")?,
                bump: flag(&mut r, "bump")?,
                retry: r.u64("retry")?.checked_sub(1),
                dropped: get_ids(&mut r, "dropped")?,
            },
            _ => get_checkpoint(&mut r, stream, group)?,
        };
        r.finish()?;
        Ok(rec)
    }
}

/// A checkpoint's body after its key: the group's position, its consumers, its pending
/// entries.
fn put_checkpoint(
    out: &mut Vec<u8>,
    (last, scanned): (u64, u64),
    consumers: &[(String, u64, u64)],
    pending: &[(u64, u64, u64, u64)],
) {
    put_u64(out, last);
    put_u64(out, scanned);
    put_u64(out, consumers.len() as u64);
    for (name, seen, active) in consumers {
        put_str(out, name);
        put_u64(out, *seen);
        put_u64(out, *active);
    }
    put_u64(out, pending.len() as u64);
    for (id, c, at, n) in pending {
        put_u64(out, *id);
        put_u64(out, *c);
        put_u64(out, *at);
        put_u64(out, *n);
    }
}

/// Reads what [`put_checkpoint`] wrote.
fn get_checkpoint(
    r: &mut Reader<'_>,
    stream: String,
    group: String,
) -> Result<GroupRecord, DecodeError> {
    let last = r.u64("last")?;
    let scanned = r.u64("scanned")?;
    let nc = r.count("consumers")?;
    let mut consumers = Vec::with_capacity(nc.min(4096));
    for _ in 0..nc {
        consumers.push((r.string("consumer")?, r.u64("seen")?, r.u64("active")?));
    }
    let np = r.count("pending")?;
    let mut pending = Vec::with_capacity(np.min(1 << 16));
    for _ in 0..np {
        pending.push((
            r.u64("id")?,
            r.u64("owner")?,
            r.u64("delivery")?,
            r.u64("count")?,
        ));
    }
    Ok(GroupRecord::Checkpoint {
        stream,
        group,
        last,
        scanned,
        consumers,
        pending,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::feed::groups) fn every_record() -> Vec<GroupRecord> {
        let (s, g) = ("stockgate:events".to_owned(), "orders".to_owned());
        vec![
            GroupRecord::Created {
                stream: s.clone(),
                group: g.clone(),
                last: 7,
            },
            GroupRecord::SetId {
                stream: s.clone(),
                group: g.clone(),
                last: u64::MAX,
            },
            GroupRecord::Consumer {
                stream: s.clone(),
                group: g.clone(),
                consumer: "c1".into(),
                at_ms: 5,
                delete: true,
            },
            GroupRecord::Delivered {
                stream: s.clone(),
                group: g.clone(),
                consumer: "c1".into(),
                at_ms: 9,
                last: 30,
                new: vec![10, 11, 30],
                again: vec![],
            },
            GroupRecord::Acked {
                stream: s.clone(),
                group: g.clone(),
                ids: vec![11],
            },
            GroupRecord::Claimed {
                stream: s.clone(),
                group: g.clone(),
                consumer: "c2".into(),
                at_ms: 100,
                delivery_ms: 90,
                ids: vec![10],
                bump: true,
                retry: Some(0),
                dropped: vec![3],
            },
            GroupRecord::Checkpoint {
                stream: s.clone(),
                group: g.clone(),
                last: 30,
                scanned: 41,
                consumers: vec![("c1".into(), 1, 0), ("c2".into(), 2, 3)],
                pending: vec![(10, 1, 90, 2), (30, 0, 9, 1)],
            },
            GroupRecord::Destroyed {
                stream: s,
                group: g,
            },
        ]
    }

    #[test]
    fn feed_group_records_round_trip() {
        for rec in every_record() {
            let (kind, body) = rec.encode();
            assert_eq!(GroupRecord::decode(kind, &body).unwrap().unwrap(), rec);
            // A damaged body is an error, never a panic or a wrong record.
            for cut in 0..body.len() {
                if let Some(Ok(r)) = GroupRecord::decode(kind, &body[..cut]) {
                    panic!("truncated body decoded as {r:?}");
                }
            }
        }
        assert!(GroupRecord::decode(1, &[]).is_none());
    }
}
