//! `--feed-retention`: how much log covered by snapshots stays on disk for feed readers.
//!
//! Syntax: `0` (keep nothing beyond what snapshots need), or a comma-separated list of
//! limits, each a size (`512MiB`, `2GiB`, `1000000B`, `64KiB`) or an age (`30s`, `15m`,
//! `6h`, `7d`); segments are kept while they fit every limit given.

use std::time::Duration;

use crate::wal::FeedRetention;

/// Parses a `--feed-retention` value (syntax above) into the limits the WAL keeps feed segments by;
/// the error is a message naming the bad part, for the command line.
pub fn parse(spec: &str) -> Result<FeedRetention, String> {
    let mut r = FeedRetention::default();
    let spec = spec.trim();
    if spec == "0" || spec.is_empty() {
        return Ok(r);
    }
    for part in spec.split(',') {
        let part = part.trim();
        let split = part.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
            format!("--feed-retention '{part}': a unit is needed (MiB, GiB, s, m, h, d)")
        })?;
        let (num, unit) = part.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("--feed-retention '{part}': not a number"))?;
        let mul = |m: u64| {
            n.checked_mul(m)
                .ok_or_else(|| format!("--feed-retention '{part}': too large"))
        };
        match unit.to_ascii_lowercase().as_str() {
            "b" => r.max_bytes = Some(n),
            "kib" | "k" | "kb" => r.max_bytes = Some(mul(1 << 10)?),
            "mib" | "mb" => r.max_bytes = Some(mul(1 << 20)?),
            "gib" | "gb" | "g" => r.max_bytes = Some(mul(1 << 30)?),
            "s" => r.max_age = Some(Duration::from_secs(n)),
            "m" | "min" => r.max_age = Some(Duration::from_secs(mul(60)?)),
            "h" => r.max_age = Some(Duration::from_secs(mul(3600)?)),
            "d" => r.max_age = Some(Duration::from_secs(mul(86_400)?)),
            _ => {
                return Err(format!(
                "--feed-retention '{part}': unknown unit '{unit}' (B, KiB, MiB, GiB, s, m, h, d)"
            ))
            }
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_retention_parses() {
        assert!(parse("0").unwrap().keeps_nothing());
        assert_eq!(parse("512MiB").unwrap().max_bytes, Some(512 << 20));
        let r = parse("2GiB, 6h").unwrap();
        assert_eq!(r.max_bytes, Some(2 << 30));
        assert_eq!(r.max_age, Some(Duration::from_secs(6 * 3600)));
        assert_eq!(
            parse("30m").unwrap().max_age,
            Some(Duration::from_secs(1800))
        );
        for bad in ["12", "x", "5 parsecs", "99999999999999999999GiB", "1-2h"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
