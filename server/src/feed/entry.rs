//! One log record as a stream entry: its id and its fields.

use crate::engine::event::{Event, Lsn};
use crate::room::RoomOp;

/// The all-events stream's name.
pub const ALL_EVENTS: &str = "stockgate:events";
/// A sale's stream is `{<sku>}:events`: the hash tag routes it with the sale.
pub const SALE_SUFFIX: &str = ":events";

/// One entry: id `<lsn>-0` and field-value pairs (all strings, as in Redis Streams).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The log record's LSN, which is the entry id's first part.
    pub lsn: Lsn,
    /// Field-value pairs in the order the entry lists them.
    pub fields: Vec<(&'static str, String)>,
}

impl Entry {
    /// The stream entry id, `<lsn>-0`: the LSN stands where Redis puts milliseconds, so ids
    /// increase with the log and the sequence part is always 0.
    pub fn id(&self) -> String {
        format!("{}-0", self.lsn)
    }
}

/// The entry format, the field `v` of every entry. 2: finishes and extensions repeat the
/// reservation's `user`, `request_id` and `qty`, releases say why (`reason`).
pub const ENTRY_VERSION: &str = "2";

/// The sale a reservation token belongs to: tokens are `{sku}` + base32, so the sku of a
/// RELEASE/COMMIT/EXTEND record (which carries only the token) is its hash tag.
pub fn sku_of_token(token: &str) -> Option<&str> {
    let rest = token.strip_prefix('{')?;
    let end = rest.find('}')?;
    Some(&rest[..end])
}

/// The sale an event concerns.
pub fn sku_of(ev: &Event) -> Option<&str> {
    match ev {
        Event::SaleCreated { sku, .. }
        | Event::SaleAdjusted { sku, .. }
        | Event::SaleStateSet { sku, .. }
        | Event::SaleRebuilt { sku, .. }
        | Event::Reserved { sku, .. }
        | Event::RoomOpened { sku, .. }
        | Event::RoomChanged { sku, .. }
        | Event::SaleDropped { sku } => Some(sku),
        Event::SaleImported { export } => Some(&export.sale.sku),
        Event::Released { token, .. }
        | Event::Committed { token, .. }
        | Event::Extended { token, .. }
        | Event::Purged { token } => sku_of_token(token),
        Event::Opaque { .. } | Event::HistoryBegun { .. } => None,
    }
}

/// Whether a record is an entry of the streams at all: consumer-group bookkeeping that
/// the feed itself logs is not (reading it would log more of it, forever).
pub fn is_entry(ev: &Event) -> bool {
    !matches!(ev, Event::Opaque { .. })
}

/// The entry for the record at `lsn`. Field names are the contract of docs/protocol.md (section 7)
/// and docs/feed.md.
pub fn entry(lsn: Lsn, ev: &Event) -> Entry {
    let mut e = Entry {
        lsn,
        fields: fields(ev),
    };
    e.fields.push(("v", ENTRY_VERSION.into()));
    e
}

/// The `type` of an event's entries: its kind's name. Opaque records are never entries
/// (see `is_entry`); they are named all the same, so that every event has a type.
fn type_of(ev: &Event) -> String {
    match ev {
        Event::Opaque { kind, .. } => format!("{}.{kind}", ev.kind().name()),
        _ => ev.kind().name().to_owned(),
    }
}

/// A reservation's token and sale, then the buyer, request and quantity of a finish or
/// extension. A record from a log written before they were recorded has none (quantity
/// 0): the fields are left out rather than reported empty.
fn holder(
    out: &mut Vec<(&'static str, String)>,
    token: &str,
    sku: String,
    user: &str,
    request_id: &str,
    qty: u32,
) {
    out.extend([("token", token.to_owned()), ("sku", sku)]);
    if qty > 0 {
        out.push(("user", user.into()));
        out.push(("request_id", request_id.into()));
        out.push(("qty", qty.to_string()));
    }
}

/// The sum of per-shard counts, as one number for the sale.
fn total(per_shard: &[i64]) -> String {
    per_shard
        .iter()
        .fold(0i64, |a, d| a.saturating_add(*d))
        .to_string()
}

fn fields(ev: &Event) -> Vec<(&'static str, String)> {
    let mut f = vec![("type", type_of(ev))];
    let sku = sku_of(ev).unwrap_or_default().to_owned();
    let s = |v: &dyn ToString| v.to_string();
    match ev {
        Event::SaleCreated { params, at_ms, .. } => f.extend([
            ("sku", sku),
            ("total", s(&params.total)),
            ("shards", s(&params.shards)),
            ("ttl_ms", s(&params.ttl_ms)),
            ("limit", s(&params.limit)),
            ("at_ms", s(at_ms)),
        ]),
        Event::SaleAdjusted { shard_deltas, .. } => {
            f.extend([("sku", sku), ("delta", total(shard_deltas))]);
        }
        Event::SaleStateSet { state, .. } => {
            f.extend([("sku", sku), ("state", state.as_str().into())]);
        }
        Event::SaleRebuilt {
            total: units,
            committed,
            shard_available,
            ..
        } => f.extend([
            ("sku", sku),
            ("total", s(units)),
            ("committed", s(committed)),
            ("available", total(shard_available)),
        ]),
        Event::Reserved { .. }
        | Event::Released { .. }
        | Event::Committed { .. }
        | Event::Extended { .. }
        | Event::Purged { .. } => reservation_fields(&mut f, ev, sku),
        // The first entry of every history: only in the all-events stream (it has no
        // sale), with an empty `sku` so that every entry has one.
        Event::HistoryBegun { id } => f.extend([("sku", sku), ("history", id.clone())]),
        // Moved sales: the destination's entry carries the counters it opens with; the
        // reservations it brings are listed by RESERVATION, not replayed as entries.
        Event::SaleImported { export } => f.extend([
            ("sku", sku),
            ("total", s(&export.sale.total)),
            ("committed", s(&export.sale.committed)),
            ("reserved", s(&export.sale.reserved)),
            ("reservations", s(&export.reservations.len())),
        ]),
        Event::SaleDropped { .. } => f.push(("sku", sku)),
        Event::RoomOpened { config, at_ms, .. } => f.extend([
            ("sku", sku),
            ("opens_at_ms", s(&config.opens_at_ms)),
            ("rate", s(&config.max_rate_per_sec)),
            ("overadmit_permille", s(&config.over_admit_permille)),
            ("admit_ttl_ms", s(&config.admit_ttl_ms)),
            ("max_waiting", s(&config.max_waiting)),
            ("at_ms", s(at_ms)),
        ]),
        Event::RoomChanged { op, .. } => room_fields(&mut f, op, sku),
        Event::Opaque { .. } => {}
    }
    f
}

/// The fields after `type` of a waiting room's change: `op` names it, then what it
/// carries (the opening's seed is left out: it orders the pre-queue and tells nobody
/// anything useful).
fn room_fields(f: &mut Vec<(&'static str, String)>, op: &RoomOp, sku: String) {
    f.push(("sku", sku));
    match op {
        RoomOp::Join { user } => f.extend([("op", "join".into()), ("user", user.clone())]),
        RoomOp::Leave { user } => f.extend([("op", "leave".into()), ("user", user.clone())]),
        RoomOp::Reserved { user } => {
            f.extend([("op", "reserved".into()), ("user", user.clone())]);
        }
        RoomOp::Open { .. } => f.push(("op", "open".into())),
        RoomOp::Admit { upto_slot, now_ms } => f.extend([
            ("op", "admit".into()),
            ("upto_slot", upto_slot.to_string()),
            ("at_ms", now_ms.to_string()),
        ]),
        RoomOp::Expire { now_ms } => {
            f.extend([("op", "expire".into()), ("at_ms", now_ms.to_string())]);
        }
        RoomOp::SoldOut => f.push(("op", "soldout".into())),
        RoomOp::Restocked => f.push(("op", "restocked".into())),
    }
}

/// The fields after `type` of the events of one reservation.
fn reservation_fields(f: &mut Vec<(&'static str, String)>, ev: &Event, sku: String) {
    let s = |v: &dyn ToString| v.to_string();
    match ev {
        Event::Reserved {
            token,
            user,
            request_id,
            qty,
            shard,
            expires_at_ms,
            created_at_ms,
            ..
        } => f.extend([
            ("token", token.clone()),
            ("sku", sku),
            ("user", user.clone()),
            ("request_id", request_id.clone()),
            ("qty", s(qty)),
            ("shard", s(shard)),
            ("expires_at_ms", s(expires_at_ms)),
            ("created_at_ms", s(created_at_ms)),
        ]),
        Event::Released {
            token,
            at_ms,
            user,
            request_id,
            qty,
            reason,
        } => {
            holder(f, token, sku, user, request_id, *qty);
            f.extend([("reason", reason.as_str().into()), ("at_ms", s(at_ms))]);
        }
        Event::Committed {
            token,
            at_ms,
            user,
            request_id,
            qty,
        } => {
            holder(f, token, sku, user, request_id, *qty);
            f.push(("at_ms", s(at_ms)));
        }
        Event::Extended {
            token,
            expires_at_ms,
            user,
            request_id,
            qty,
        } => {
            holder(f, token, sku, user, request_id, *qty);
            f.push(("expires_at_ms", s(expires_at_ms)));
        }
        Event::Purged { token } => f.extend([("token", token.clone()), ("sku", sku)]),
        // Every other kind is a sale's, listed by `fields`.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::event::EventKind;
    use crate::engine::types::{ReleaseReason, SaleExport, SaleParams, SaleState, SaleView};
    use crate::wal::record::{decode_record, encode_record, HEADER_LEN, K_GROUP_ACKED};

    /// An event of `kind`. The match is exhaustive: a kind added to the declaration does
    /// not compile here until it has a sample, and with it an entry checked below.
    fn sample(kind: EventKind) -> Event {
        let (token, sku) = ("{SKU-1}abcdefghijklmnopqrstuvwxyz".to_owned(), "SKU-1");
        let (user, request_id) = ("alice".to_owned(), "req-1".to_owned());
        match kind {
            EventKind::SaleCreated => Event::SaleCreated {
                sku: sku.into(),
                params: SaleParams {
                    total: 10,
                    shards: 2,
                    ttl_ms: 630_000,
                    limit: 1,
                },
                at_ms: 1,
            },
            EventKind::SaleAdjusted => Event::SaleAdjusted {
                sku: sku.into(),
                shard_deltas: vec![3, -1],
            },
            EventKind::SaleStateSet => Event::SaleStateSet {
                sku: sku.into(),
                state: SaleState::Paused,
            },
            EventKind::Reserved => Event::Reserved {
                token,
                sku: sku.into(),
                user,
                request_id,
                qty: 2,
                shard: 1,
                expires_at_ms: 630_002,
                created_at_ms: 2,
            },
            EventKind::Released => Event::Released {
                token,
                at_ms: 3,
                user,
                request_id,
                qty: 2,
                reason: ReleaseReason::Cancel,
            },
            EventKind::Committed => Event::Committed {
                token,
                at_ms: 4,
                user,
                request_id,
                qty: 2,
            },
            EventKind::Extended => Event::Extended {
                token,
                expires_at_ms: 900_000,
                user,
                request_id,
                qty: 2,
            },
            EventKind::Purged => Event::Purged { token },
            EventKind::SaleRebuilt => Event::SaleRebuilt {
                sku: sku.into(),
                total: 10,
                committed: 4,
                shard_available: vec![3, 3],
            },
            EventKind::HistoryBegun => Event::HistoryBegun {
                id: "0123456789abcdef0123456789abcdef".into(),
            },
            EventKind::SaleImported => Event::SaleImported {
                export: Box::new(SaleExport {
                    fingerprint: "f00d".into(),
                    sale: SaleView {
                        sku: sku.into(),
                        params: SaleParams {
                            total: 10,
                            shards: 1,
                            ttl_ms: 630_000,
                            limit: 0,
                        },
                        total: 10,
                        available: 10,
                        reserved: 0,
                        committed: 0,
                        state: SaleState::Open,
                        shard_available: vec![10],
                    },
                    reservations: Vec::new(),
                    tombs: Vec::new(),
                    room: None,
                }),
            },
            EventKind::SaleDropped => Event::SaleDropped { sku: sku.into() },
            EventKind::RoomOpened => Event::RoomOpened {
                sku: sku.into(),
                config: crate::room::RoomConfig::default(),
                at_ms: 5,
            },
            EventKind::RoomChanged => Event::RoomChanged {
                sku: sku.into(),
                op: RoomOp::Join { user },
            },
            EventKind::Opaque => Event::Opaque {
                kind: K_GROUP_ACKED,
                body: vec![1, 2, 3],
            },
        }
    }

    /// The fields of `kind`'s entries, in order: the contract of docs/protocol.md
    /// (section 7) and docs/feed.md.
    fn entry_fields(kind: EventKind) -> &'static str {
        match kind {
            EventKind::SaleCreated => "type sku total shards ttl_ms limit at_ms v",
            EventKind::SaleAdjusted => "type sku delta v",
            EventKind::SaleStateSet => "type sku state v",
            EventKind::Reserved => {
                "type token sku user request_id qty shard expires_at_ms created_at_ms v"
            }
            EventKind::Released => "type token sku user request_id qty reason at_ms v",
            EventKind::Committed => "type token sku user request_id qty at_ms v",
            EventKind::Extended => "type token sku user request_id qty expires_at_ms v",
            EventKind::Purged => "type token sku v",
            EventKind::SaleRebuilt => "type sku total committed available v",
            EventKind::HistoryBegun => "type sku history v",
            EventKind::SaleImported => "type sku total committed reserved reservations v",
            EventKind::SaleDropped => "type sku v",
            EventKind::RoomOpened => {
                "type sku opens_at_ms rate overadmit_permille admit_ttl_ms max_waiting at_ms v"
            }
            EventKind::RoomChanged => "type sku op user v",
            EventKind::Opaque => "type v",
        }
    }

    /// Every kind of the declaration, through the WAL and into the feed: it encodes with
    /// its own record kind, decodes to itself, and its entry has its name as `type` and
    /// the fields the protocol lists for it.
    #[test]
    fn feed_every_kind_through_the_log_into_its_entry() {
        for &kind in EventKind::ALL {
            let ev = sample(kind);
            assert_eq!(ev.kind(), kind);
            let mut rec = Vec::new();
            encode_record(&ev, &mut rec).unwrap();
            if let Some(code) = kind.code() {
                assert_eq!(rec[HEADER_LEN + 1], code, "{kind:?}'s record kind");
            }
            let (back, used) = decode_record(&rec).unwrap();
            assert_eq!((&back, used), (&ev, rec.len()), "{kind:?} round trip");

            let e = entry(11, &back);
            let names: Vec<&str> = e.fields.iter().map(|(k, _)| *k).collect();
            assert_eq!(
                names.join(" "),
                entry_fields(kind),
                "{kind:?}'s entry fields"
            );
            assert_eq!(is_entry(&back), kind != EventKind::Opaque, "{kind:?}");
            if is_entry(&back) {
                assert_eq!(e.fields[0].1, kind.name(), "{kind:?}'s entry type");
            }
            for (name, value) in &e.fields {
                let history_sku = kind == EventKind::HistoryBegun && *name == "sku";
                assert!(!value.is_empty() || history_sku, "{kind:?}: empty {name}");
                if *name == "sku" {
                    assert_eq!(Some(value.as_str()), sku_of(&back).or(Some("")));
                }
            }
        }
        // The names are the feed's `type`s, one per kind.
        let mut names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EventKind::ALL.len(), "two kinds share a name");
    }

    #[test]
    fn feed_sku_of_token() {
        assert_eq!(sku_of_token("{SKU-1}abc"), Some("SKU-1"));
        assert_eq!(sku_of_token("SKU-1abc"), None);
        assert_eq!(sku_of_token("{SKU-1"), None);
        let ev = Event::Released {
            token: "{A.b:c}xyz".into(),
            at_ms: 5,
            user: "u1".into(),
            request_id: "r1".into(),
            qty: 2,
            reason: ReleaseReason::Expired,
        };
        let e = entry(9, &ev);
        assert_eq!(e.id(), "9-0");
        let own = |v: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
            v.iter().map(|(k, x)| (*k, x.to_string())).collect()
        };
        assert_eq!(
            e.fields,
            own(&[
                ("type", "released"),
                ("token", "{A.b:c}xyz"),
                ("sku", "A.b:c"),
                ("user", "u1"),
                ("request_id", "r1"),
                ("qty", "2"),
                ("reason", "expired"),
                ("at_ms", "5"),
                ("v", "2"),
            ])
        );
        // A record of an older log has no buyer: the fields are left out.
        let old = Event::Committed {
            token: "{S}t".into(),
            at_ms: 7,
            user: String::new(),
            request_id: String::new(),
            qty: 0,
        };
        assert_eq!(
            entry(3, &old).fields,
            own(&[
                ("type", "committed"),
                ("token", "{S}t"),
                ("sku", "S"),
                ("at_ms", "7"),
                ("v", "2"),
            ])
        );
    }
}
