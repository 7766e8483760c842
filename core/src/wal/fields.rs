//! The encodings of engine values that several files of the log share: sale parameters
//! and states (records, snapshots), a sale's counters, a reservation and a tombstone
//! (snapshots, handovers), and a handed-over sale's payload (the `SaleImported` record
//! and `SALE.MIGRATE`'s bytes). Below `record`, `snapshot` and `handover`, so none of
//! them needs another for its fields.

use super::codec::{put_i64, put_i64s, put_str, put_u64, DecodeError, Reader};
use crate::engine::types::{
    ReservationState, ReservationView, SaleExport, SaleParams, SaleState, SaleView, TombView,
};

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

/// The payload's format version.
pub const HANDOVER_VERSION: u8 = 1;
/// Appends the payload alone (what the `SaleImported` record stores after its kind).
pub(crate) fn put_export(out: &mut Vec<u8>, e: &SaleExport) {
    out.push(HANDOVER_VERSION);
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
}

/// Decodes the payload alone, up to its end.
pub(crate) fn get_export(r: &mut Reader<'_>) -> Result<SaleExport, DecodeError> {
    let version = r.u8("handover version")?;
    if version != HANDOVER_VERSION {
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
    Ok(SaleExport {
        fingerprint,
        sale,
        reservations,
        tombs,
    })
}
