//! The encodings of engine values that several files of the log share: sale parameters
//! and states (records, snapshots), a sale's counters, a reservation and a tombstone
//! (snapshots, handovers), and a handed-over sale's payload (the `SaleImported` record
//! and `SALE.MIGRATE`'s bytes). Below `record`, `snapshot` and `handover`, so none of
//! them needs another for its fields.

use super::codec::{put_i64, put_i64s, put_str, put_u64, DecodeError, Reader};
use crate::engine::types::{
    ReservationState, ReservationView, RoomView, SaleExport, SaleParams, SaleState, SaleView,
    TombView,
};
use crate::room::{MemberState, RoomConfig, RoomOp, RoomState};

pub(crate) fn put_params(out: &mut Vec<u8>, p: &SaleParams) {
    put_u64(out, p.total);
    put_u64(out, u64::from(p.shards));
    put_u64(out, p.ttl_ms);
    put_u64(out, u64::from(p.limit));
}

pub(crate) fn get_params(r: &mut Reader<'_>) -> Result<SaleParams, DecodeError> {
    Ok(SaleParams {
        total: r.u64("total")?,
        shards: r.u16("shards")?,
        ttl_ms: r.u64("ttl_ms")?,
        limit: r.u32("limit")?,
    })
}

pub(crate) fn get_sale_state(r: &mut Reader<'_>) -> Result<SaleState, DecodeError> {
    let at = r.pos();
    let v = r.u8("sale state")?;
    SaleState::from_u8(v).ok_or(DecodeError::OutOfRange {
        at,
        what: "sale state",
        value: u64::from(v),
    })
}

/// One sale's counters, as snapshots and handovers store them.
pub(crate) fn put_sale(out: &mut Vec<u8>, s: &SaleView) {
    put_str(out, &s.sku);
    put_params(out, &s.params);
    put_u64(out, s.total);
    put_i64(out, s.available);
    put_u64(out, s.reserved);
    put_u64(out, s.committed);
    out.push(s.state.to_u8());
    put_i64s(out, &s.shard_available);
}

/// One reservation, as snapshots and handovers store it.
pub(crate) fn put_reservation(out: &mut Vec<u8>, r: &ReservationView) {
    put_str(out, &r.token);
    put_str(out, &r.sku);
    put_str(out, &r.user);
    put_str(out, &r.request_id);
    put_u64(out, u64::from(r.qty));
    put_u64(out, u64::from(r.shard));
    out.push(r.state.to_u8());
    put_u64(out, r.expires_at_ms);
    put_u64(out, r.created_at_ms);
    put_u64(out, r.finished_at_ms);
}

/// One tombstone, as snapshots and handovers store it.
pub(crate) fn put_tomb(out: &mut Vec<u8>, t: &TombView) {
    put_str(out, &t.sku);
    put_u64(out, (t.key >> 64) as u64);
    put_u64(out, t.key as u64);
    out.push(t.state.to_u8());
    put_u64(out, u64::from(t.qty));
    put_u64(out, u64::from(t.shard));
    put_u64(out, t.expires_at_ms);
    put_str(out, &t.user);
}

pub(crate) fn get_sale(r: &mut Reader<'_>) -> Result<SaleView, DecodeError> {
    Ok(SaleView {
        sku: r.string("sku")?,
        params: get_params(r)?,
        total: r.u64("total")?,
        available: r.i64("available")?,
        reserved: r.u64("reserved")?,
        committed: r.u64("committed")?,
        state: get_sale_state(r)?,
        shard_available: r.i64s("shard_available")?,
    })
}

pub(crate) fn get_reservation(r: &mut Reader<'_>) -> Result<ReservationView, DecodeError> {
    Ok(ReservationView {
        token: r.string("token")?,
        sku: r.string("sku")?,
        user: r.string("user")?,
        request_id: r.string("request_id")?,
        qty: r.u32("qty")?,
        shard: r.u16("shard")?,
        state: get_res_state(r)?,
        expires_at_ms: r.u64("expires_at_ms")?,
        created_at_ms: r.u64("created_at_ms")?,
        finished_at_ms: r.u64("finished_at_ms")?,
    })
}

pub(crate) fn get_tomb(r: &mut Reader<'_>) -> Result<TombView, DecodeError> {
    Ok(TombView {
        sku: r.string("sku")?,
        key: (u128::from(r.u64("key")?) << 64) | u128::from(r.u64("key")?),
        state: get_res_state(r)?,
        qty: r.u32("qty")?,
        shard: r.u16("shard")?,
        expires_at_ms: r.u64("expires_at_ms")?,
        user: r.string("user")?,
    })
}

/// Largest up-front reservation of entries while decoding a snapshot.
pub(crate) const PREALLOC_CAP: usize = 1 << 16;

pub(crate) fn get_res_state(r: &mut Reader<'_>) -> Result<ReservationState, DecodeError> {
    let at = r.pos();
    let v = r.u8("reservation state")?;
    ReservationState::from_u8(v).ok_or(DecodeError::OutOfRange {
        at,
        what: "reservation state",
        value: u64::from(v),
    })
}

/// The payload's format version without a waiting room: what every export was before
/// rooms moved, and what one of a sale without a room still is, byte for byte, so that a
/// destination that predates rooms takes it.
pub const HANDOVER_VERSION: u8 = 1;
/// The payload's format version with the sale's waiting room after the tombstones. A
/// binary that predates it refuses the version rather than drop the queue.
pub const HANDOVER_VERSION_ROOM: u8 = 2;

/// Appends the payload alone (what the `SaleImported` record stores after its kind).
pub(crate) fn put_export(out: &mut Vec<u8>, e: &SaleExport) {
    out.push(match e.room {
        None => HANDOVER_VERSION,
        Some(_) => HANDOVER_VERSION_ROOM,
    });
    put_str(out, &e.fingerprint);
    put_sale(out, &e.sale);
    put_u64(out, e.reservations.len() as u64);
    for r in &e.reservations {
        put_reservation(out, r);
    }
    put_u64(out, e.tombs.len() as u64);
    for t in &e.tombs {
        put_tomb(out, t);
    }
    if let Some(room) = &e.room {
        put_room(out, room);
    }
}

/// Decodes the payload alone, up to its end.
pub(crate) fn get_export(r: &mut Reader<'_>) -> Result<SaleExport, DecodeError> {
    let version = r.u8("handover version")?;
    if version != HANDOVER_VERSION && version != HANDOVER_VERSION_ROOM {
        return Err(DecodeError::Version(version));
    }
    let fingerprint = r.string("fingerprint")?;
    let sale = get_sale(r)?;
    let n = r.count("reservations")?;
    let mut reservations = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        reservations.push(get_reservation(r)?);
    }
    let n = r.count("tombstones")?;
    let mut tombs = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        tombs.push(get_tomb(r)?);
    }
    let room = match version {
        HANDOVER_VERSION_ROOM => Some(get_room(r)?),
        _ => None,
    };
    Ok(SaleExport {
        fingerprint,
        sale,
        reservations,
        tombs,
        room,
    })
}

/// A waiting room's settings (the `RoomOpened` record, snapshots).
pub(crate) fn put_room_config(out: &mut Vec<u8>, c: &RoomConfig) {
    put_u64(out, u64::from(c.max_rate_per_sec));
    put_u64(out, u64::from(c.over_admit_permille));
    put_u64(out, c.admit_ttl_ms);
    put_u64(out, c.expiring_window_ms);
    put_u64(out, u64::from(c.max_waiting));
    put_u64(out, c.opens_at_ms);
}

pub(crate) fn get_room_config(r: &mut Reader<'_>) -> Result<RoomConfig, DecodeError> {
    Ok(RoomConfig {
        max_rate_per_sec: r.u32("max_rate_per_sec")?,
        over_admit_permille: r.u32("over_admit_permille")?,
        admit_ttl_ms: r.u64("admit_ttl_ms")?,
        expiring_window_ms: r.u64("expiring_window_ms")?,
        max_waiting: r.u32("max_waiting")?,
        opens_at_ms: r.u64("opens_at_ms")?,
    })
}

/// Tags of [`RoomOp`]s in a `RoomChanged` record: part of the WAL format, never reused.
const OP_JOIN: u8 = 1;
const OP_LEAVE: u8 = 2;
const OP_OPEN: u8 = 3;
const OP_ADMIT: u8 = 4;
const OP_RESERVED: u8 = 5;
const OP_EXPIRE: u8 = 6;
const OP_SOLD_OUT: u8 = 7;
const OP_RESTOCKED: u8 = 8;

/// A room op: its tag byte, then its fields (a user id, a seed, a slot and a time).
pub(crate) fn put_room_op(out: &mut Vec<u8>, op: &RoomOp) {
    match op {
        RoomOp::Join { user } => {
            out.push(OP_JOIN);
            put_str(out, user);
        }
        RoomOp::Leave { user } => {
            out.push(OP_LEAVE);
            put_str(out, user);
        }
        RoomOp::Open { seed } => {
            out.push(OP_OPEN);
            put_u64(out, *seed);
        }
        RoomOp::Admit { upto_slot, now_ms } => {
            out.push(OP_ADMIT);
            put_u64(out, u64::from(*upto_slot));
            put_u64(out, *now_ms);
        }
        RoomOp::Reserved { user } => {
            out.push(OP_RESERVED);
            put_str(out, user);
        }
        RoomOp::Expire { now_ms } => {
            out.push(OP_EXPIRE);
            put_u64(out, *now_ms);
        }
        RoomOp::SoldOut => out.push(OP_SOLD_OUT),
        RoomOp::Restocked => out.push(OP_RESTOCKED),
    }
}

pub(crate) fn get_room_op(r: &mut Reader<'_>) -> Result<RoomOp, DecodeError> {
    let at = r.pos();
    Ok(match r.u8("room op")? {
        OP_JOIN => RoomOp::Join {
            user: r.string("user")?,
        },
        OP_LEAVE => RoomOp::Leave {
            user: r.string("user")?,
        },
        OP_OPEN => RoomOp::Open {
            seed: r.u64("seed")?,
        },
        OP_ADMIT => RoomOp::Admit {
            upto_slot: r.u32("upto_slot")?,
            now_ms: r.u64("now_ms")?,
        },
        OP_RESERVED => RoomOp::Reserved {
            user: r.string("user")?,
        },
        OP_EXPIRE => RoomOp::Expire {
            now_ms: r.u64("now_ms")?,
        },
        OP_SOLD_OUT => RoomOp::SoldOut,
        OP_RESTOCKED => RoomOp::Restocked,
        v => {
            return Err(DecodeError::OutOfRange {
                at,
                what: "room op",
                value: u64::from(v),
            })
        }
    })
}

/// One sale's waiting room, as snapshots store it: its sku, settings and state.
pub(crate) fn put_room(out: &mut Vec<u8>, v: &RoomView) {
    put_str(out, &v.sku);
    put_room_config(out, &v.config);
    let s = &v.state;
    put_u64(out, s.members.len() as u64);
    for m in &s.members {
        put_u64(out, m.user);
        put_u64(out, u64::from(m.slot));
        out.push(m.join);
        out.push(m.place);
    }
    put_u64s(out, &s.pre);
    put_u64(out, u64::from(s.base));
    put_u64s(out, &s.line);
    out.push(u8::from(s.opened));
    put_u64(out, s.tokens_milli);
    put_u64(out, s.last_fill_ms);
    put_u64(out, s.recent.len() as u64);
    for &(t, n) in &s.recent {
        put_u64(out, t);
        put_u64(out, u64::from(n));
    }
    for list in [&s.admitted, &s.expiry] {
        put_u64(out, list.len() as u64);
        for &(a, b, join) in list {
            put_u64(out, a);
            put_u64(out, b);
            out.push(join);
        }
    }
    out.push(u8::from(s.sold_out));
    put_u64(out, s.clock_ms);
}

fn put_u64s(out: &mut Vec<u8>, vs: &[u64]) {
    put_u64(out, vs.len() as u64);
    for &v in vs {
        put_u64(out, v);
    }
}

fn get_u64s(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u64>, DecodeError> {
    let n = r.count(what)?;
    let mut v = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        v.push(r.u64(what)?);
    }
    Ok(v)
}

fn get_bool(r: &mut Reader<'_>, what: &'static str) -> Result<bool, DecodeError> {
    let at = r.pos();
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(DecodeError::OutOfRange {
            at,
            what,
            value: u64::from(v),
        }),
    }
}

pub(crate) fn get_room(r: &mut Reader<'_>) -> Result<RoomView, DecodeError> {
    let sku = r.string("room sku")?;
    let config = get_room_config(r)?;
    let n = r.count("room members")?;
    let mut members = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        members.push(MemberState {
            user: r.u64("member")?,
            slot: r.u32("slot")?,
            join: r.u8("join")?,
            place: r.u8("place")?,
        });
    }
    let pre = get_u64s(r, "pre-queue")?;
    let base = r.u32("base")?;
    let line = get_u64s(r, "line")?;
    let opened = get_bool(r, "opened")?;
    let tokens_milli = r.u64("tokens")?;
    let last_fill_ms = r.u64("last fill")?;
    let n = r.count("recent admissions")?;
    let mut recent = Vec::with_capacity(n.min(PREALLOC_CAP));
    for _ in 0..n {
        recent.push((r.u64("time")?, r.u32("admitted")?));
    }
    let mut lists = [Vec::new(), Vec::new()];
    for list in lists.iter_mut() {
        let n = r.count("admissions")?;
        list.reserve(n.min(PREALLOC_CAP));
        for _ in 0..n {
            list.push((r.u64("admission")?, r.u64("admission")?, r.u8("join")?));
        }
    }
    let [admitted, expiry] = lists;
    Ok(RoomView {
        sku,
        config,
        state: RoomState {
            members,
            pre,
            base,
            line,
            opened,
            tokens_milli,
            last_fill_ms,
            recent,
            admitted,
            expiry,
            sold_out: get_bool(r, "sold out")?,
            clock_ms: r.u64("room clock")?,
        },
    })
}
