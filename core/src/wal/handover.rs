//! The bytes of a sale handed over between groups ([`SaleExport`]): what `SALE.MIGRATE`
//! sends and the `SaleImported` record carries.
//!
//! Format: `magic[8] | payload length u64 LE | crc32c u32 LE (over payload) | payload`,
//! payload = `version u8 | fingerprint | sale | reservations | tombstones [| room]`, each
//! part as a snapshot stores it ([`super::snapshot`]); the room (the sale's waiting room)
//! is there with version 2 only, and a version 1 payload (from a source that predates
//! moving rooms, or of a sale without a room) imports with no room. Self-contained: a
//! damaged or cut copy is refused before anything is decoded.

use super::codec::Reader;
use super::fields::{get_export, put_export};
use crate::engine::types::SaleExport;
use crate::engine::{Engine, EngineError, Lsn};

/// The first 8 bytes of every export: format and version.
pub const HANDOVER_MAGIC: [u8; 8] = *b"SGMOVE\0\x01";
const HEADER_LEN: usize = 8 + 8 + 4;

/// Encodes an export, header and checksum included.
pub fn encode_export(e: &SaleExport) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64 + e.reservations.len() * 100);
    out.extend_from_slice(&HANDOVER_MAGIC);
    out.extend_from_slice(&[0u8; 12]);
    put_export(&mut out, e);
    let len = (out.len() - HEADER_LEN) as u64;
    let crc = crc32c::crc32c(&out[HEADER_LEN..]);
    out[8..16].copy_from_slice(&len.to_le_bytes());
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes an export; damage anywhere (a flipped bit, a cut, another format) is refused
/// with what is wrong, in words.
pub fn decode_export(buf: &[u8]) -> Result<SaleExport, String> {
    if buf.len() < HEADER_LEN || buf[..8] != HANDOVER_MAGIC {
        return Err("not a stockgate sale export".into());
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&buf[8..16]);
    let len = u64::from_le_bytes(len8);
    let have = (buf.len() - HEADER_LEN) as u64;
    if len != have {
        return Err(format!(
            "the sale export is cut or padded: {have} bytes of {len}"
        ));
    }
    let payload = &buf[HEADER_LEN..];
    let stored = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]);
    if crc32c::crc32c(payload) != stored {
        return Err("the sale export is damaged (checksum mismatch)".into());
    }
    let mut r = Reader::new(payload);
    let e = get_export(&mut r).map_err(|e| format!("the sale export does not decode: {e}"))?;
    r.finish()
        .map_err(|e| format!("the sale export does not decode: {e}"))?;
    Ok(e)
}

/// The largest export sent or accepted: about 15 million holds. The destination keeps an
/// export whole in memory until its last part arrives, so it is bounded; the log is not
/// the limit (a large import is logged in several records, `Engine::import_sale`).
pub const MAX_EXPORT: usize = 1 << 30;

/// Exports a sale already frozen ([`Engine::freeze`]) as bytes.
pub fn export_sale(engine: &Engine, sku: &str) -> Result<Vec<u8>, EngineError> {
    let bytes = encode_export(&engine.export_sale(sku)?);
    check_size(bytes.len())?;
    Ok(bytes)
}

/// Decodes `bytes` and imports the sale ([`Engine::import_sale`]).
pub fn import_sale(engine: &Engine, bytes: &[u8]) -> Result<Lsn, EngineError> {
    check_size(bytes.len())?;
    let export = decode_export(bytes).map_err(EngineError::Import)?;
    engine.import_sale(&export)
}

fn check_size(n: usize) -> Result<(), EngineError> {
    if n > MAX_EXPORT {
        return Err(EngineError::Import(format!(
            "the sale's export is {n} bytes, more than a move carries ({MAX_EXPORT})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::types::{ReservationState, ReservationView, SaleParams, SaleState};
    use crate::engine::types::{SaleView, TombView};

    fn sample() -> SaleExport {
        SaleExport {
            fingerprint: "ab12cd34".into(),
            sale: SaleView {
                sku: "SKU-1".into(),
                params: SaleParams {
                    total: 10,
                    shards: 2,
                    ttl_ms: 60_000,
                    limit: 2,
                },
                total: 10,
                available: 7,
                reserved: 2,
                committed: 1,
                state: SaleState::Paused,
                shard_available: vec![4, 3],
            },
            reservations: vec![ReservationView {
                token: "{SKU-1}abc".into(),
                sku: "SKU-1".into(),
                user: "u1".into(),
                request_id: "r1".into(),
                qty: 2,
                shard: 1,
                state: ReservationState::Reserved,
                expires_at_ms: 90_000,
                created_at_ms: 30_000,
                finished_at_ms: 0,
            }],
            tombs: vec![TombView {
                sku: "SKU-1".into(),
                key: u128::MAX - 3,
                state: ReservationState::Committed,
                qty: 1,
                shard: 0,
                expires_at_ms: 5,
                user: "u2".into(),
            }],
            room: None,
        }
    }

    #[test]
    fn wal_handover_round_trip() {
        let e = sample();
        assert_eq!(decode_export(&encode_export(&e)), Ok(e));
    }

    #[test]
    fn wal_handover_detects_every_flip_and_cut() {
        let bytes = encode_export(&sample());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            assert!(decode_export(&b).is_err(), "flip at {i} undetected");
        }
        for cut in 0..bytes.len() {
            assert!(decode_export(&bytes[..cut]).is_err());
        }
    }
}
