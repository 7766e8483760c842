//! One log record as a stream entry: its id and its fields.

use crate::engine::event::{Event, Lsn};

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

/// The buyer, request and quantity of a finish or extension. A record from a log written
/// before they were recorded has none (quantity 0): the fields are left out rather than
/// reported empty.
fn holder(out: &mut Vec<(&'static str, String)>, user: &str, request_id: &str, qty: u32) {
    if qty > 0 {
        out.push(("user", user.into()));
        out.push(("request_id", request_id.into()));
        out.push(("qty", qty.to_string()));
    }
}

fn fields(ev: &Event) -> Vec<(&'static str, String)> {
    let sku = sku_of(ev).unwrap_or_default().to_owned();
    let s = |v: &dyn ToString| v.to_string();
    let fields: Vec<(&'static str, String)> = match ev {
        Event::SaleCreated { params, at_ms, .. } => vec![
            ("type", "sale.created".into()),
            ("sku", sku),
            ("total", s(&params.total)),
            ("shards", s(&params.shards)),
            ("ttl_ms", s(&params.ttl_ms)),
            ("limit", s(&params.limit)),
            ("at_ms", s(at_ms)),
        ],
        Event::SaleAdjusted { shard_deltas, .. } => vec![
            ("type", "sale.adjusted".into()),
            ("sku", sku),
            (
                "delta",
                s(&shard_deltas.iter().fold(0i64, |a, d| a.saturating_add(*d))),
            ),
        ],
        Event::SaleStateSet { state, .. } => vec![
            ("type", "sale.state".into()),
            ("sku", sku),
            ("state", state.as_str().into()),
        ],
        Event::SaleRebuilt {
            total,
            committed,
            shard_available,
            ..
        } => vec![
            ("type", "sale.rebuilt".into()),
            ("sku", sku),
            ("total", s(total)),
            ("committed", s(committed)),
            (
                "available",
                s(&shard_available
                    .iter()
                    .fold(0i64, |a, d| a.saturating_add(*d))),
            ),
        ],
        Event::Reserved {
            token,
            user,
            request_id,
            qty,
            shard,
            expires_at_ms,
            created_at_ms,
            ..
        } => vec![
            ("type", "reserved".into()),
            ("token", token.clone()),
            ("sku", sku),
            ("user", user.clone()),
            ("request_id", request_id.clone()),
            ("qty", s(qty)),
            ("shard", s(shard)),
            ("expires_at_ms", s(expires_at_ms)),
            ("created_at_ms", s(created_at_ms)),
        ],
        Event::Released {
            token,
            at_ms,
            user,
            request_id,
            qty,
            reason,
        } => {
            let mut f = vec![
                ("type", "released".into()),
                ("token", token.clone()),
                ("sku", sku),
            ];
            holder(&mut f, user, request_id, *qty);
            f.push(("reason", reason.as_str().into()));
            f.push(("at_ms", s(at_ms)));
            f
        }
        Event::Committed {
            token,
            at_ms,
            user,
            request_id,
            qty,
        } => {
            let mut f = vec![
                ("type", "committed".into()),
                ("token", token.clone()),
                ("sku", sku),
            ];
            holder(&mut f, user, request_id, *qty);
            f.push(("at_ms", s(at_ms)));
            f
        }
        Event::Extended {
            token,
            expires_at_ms,
            user,
            request_id,
            qty,
        } => {
            let mut f = vec![
                ("type", "extended".into()),
                ("token", token.clone()),
                ("sku", sku),
            ];
            holder(&mut f, user, request_id, *qty);
            f.push(("expires_at_ms", s(expires_at_ms)));
            f
        }
        Event::Purged { token } => vec![
            ("type", "purged".into()),
            ("token", token.clone()),
            ("sku", sku),
        ],
        // Moved sales: the destination's entry carries the counters it opens with; the
        // reservations it brings are listed by RESERVATION, not replayed as entries.
        Event::SaleImported { export } => vec![
            ("type", "sale.imported".into()),
            ("sku", sku),
            ("total", s(&export.sale.total)),
            ("committed", s(&export.sale.committed)),
            ("reserved", s(&export.sale.reserved)),
            ("reservations", s(&export.reservations.len())),
        ],
        Event::SaleDropped { .. } => vec![("type", "sale.dropped".into()), ("sku", sku)],
        // Never an entry (see `is_entry`); described only so the match stays total.
        Event::Opaque { kind, .. } => vec![("type", format!("internal.{kind}"))],
        // The first entry of every history: only in the all-events stream (it has no
        // sale), with an empty `sku` so that every entry has one.
        Event::HistoryBegun { id } => vec![
            ("type", "history.begun".into()),
            ("sku", sku),
            ("history", id.clone()),
        ],
    };
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::types::ReleaseReason;

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
