//! Stream ids as clients write them (`<ms>-<seq>`, `<ms>`, `-`, `+`, `$`, `(<id>`), mapped
//! to LSN bounds. Entries are `<lsn>-0`, so only the first part places a position.

use super::FeedError;
use crate::engine::event::Lsn;

fn parse_pair(s: &[u8], missing_seq: u64) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(s).ok()?;
    let (ms, seq) = match s.split_once('-') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let num = |t: &str| {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            t.parse::<u64>().ok()
        }
    };
    let ms = num(ms)?;
    let seq = match seq {
        Some(t) => num(t)?,
        None => missing_seq,
    };
    Some((ms, seq))
}

/// XREAD's id: entries strictly after it. `$` is resolved by the caller (`None`).
/// Returns the first LSN to read.
pub fn read_after(s: &[u8]) -> Result<Option<Lsn>, FeedError> {
    if s == b"$" {
        return Ok(None);
    }
    let (ms, _) = parse_pair(s, 0).ok_or(FeedError::InvalidId)?;
    // (ms, seq) for any seq: the next entry is (ms + 1, 0).
    Ok(Some(ms.saturating_add(1)))
}

/// An exact entry id (XACK, XCLAIM): `Some(lsn)` for `<lsn>-0` or `<lsn>`; `None` for an
/// id with a sequence number, which no entry of the feed has.
pub fn exact(s: &[u8]) -> Result<Option<Lsn>, FeedError> {
    let (ms, seq) = parse_pair(s, 0).ok_or(FeedError::InvalidId)?;
    Ok((seq == 0).then_some(ms))
}

/// XRANGE's start: the first LSN in the range.
pub fn range_start(s: &[u8]) -> Result<Lsn, FeedError> {
    if s == b"-" {
        return Ok(1);
    }
    let (excl, body) = match s.strip_prefix(b"(") {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (ms, seq) = parse_pair(body, 0).ok_or(FeedError::InvalidId)?;
    Ok(if excl || seq > 0 {
        ms.saturating_add(1)
    } else {
        ms
    })
}

/// XRANGE's end: the last LSN in the range (`None`: the range is empty).
pub fn range_end(s: &[u8]) -> Result<Option<Lsn>, FeedError> {
    if s == b"+" {
        return Ok(Some(Lsn::MAX));
    }
    let (excl, body) = match s.strip_prefix(b"(") {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (ms, seq) = parse_pair(body, u64::MAX).ok_or(FeedError::InvalidId)?;
    Ok(if excl && seq == 0 {
        ms.checked_sub(1)
    } else {
        Some(ms)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_ids() {
        assert_eq!(read_after(b"0").unwrap(), Some(1));
        assert_eq!(read_after(b"0-0").unwrap(), Some(1));
        assert_eq!(read_after(b"41-0").unwrap(), Some(42));
        assert_eq!(read_after(b"41-7").unwrap(), Some(42));
        assert_eq!(read_after(b"$").unwrap(), None);
        assert_eq!(
            read_after(b"18446744073709551615-0").unwrap(),
            Some(u64::MAX)
        );
        for bad in [&b""[..], b"x", b"1-", b"-1", b"1-2-3", b"+1", b" 1"] {
            assert!(read_after(bad).is_err(), "{bad:?}");
        }
        assert_eq!(range_start(b"-").unwrap(), 1);
        assert_eq!(range_start(b"5").unwrap(), 5);
        assert_eq!(range_start(b"5-0").unwrap(), 5);
        assert_eq!(range_start(b"5-1").unwrap(), 6);
        assert_eq!(range_start(b"(5-0").unwrap(), 6);
        assert_eq!(range_start(b"(5").unwrap(), 6);
        assert_eq!(range_end(b"+").unwrap(), Some(u64::MAX));
        assert_eq!(range_end(b"5").unwrap(), Some(5));
        assert_eq!(range_end(b"5-0").unwrap(), Some(5));
        assert_eq!(range_end(b"(5-0").unwrap(), Some(4));
        assert_eq!(range_end(b"(5-3").unwrap(), Some(5));
        assert_eq!(range_end(b"(5").unwrap(), Some(5));
        assert_eq!(range_end(b"(0-0").unwrap(), None);
    }
}
