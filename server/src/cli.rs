//! Command-line value parsers shared by every binary (stockgate, stockgate-sweeper,
//! stockgate-materializer, stockgate-bench), so a bad flag value is refused the same way
//! everywhere: what was wrong and the accepted range, in words.
//!
//! clap's own integer parsers answer `0 is not in 1..=1024` or `invalid digit found in
//! string`; these answer `out of range: must be between 1 and 1024` and `not a whole
//! number (must be between 1 and 1024)`. clap puts `invalid value '0' for '--shards
//! <SHARDS>': ` in front.

use std::fmt;

/// Why a flag value was refused.
// Each variant's `#[error]` text is its documentation.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("not a whole number (must be between {min} and {max})")]
    NotInteger { min: i128, max: i128 },
    #[error("out of range: must be between {min} and {max}")]
    OutOfRange { min: i128, max: i128 },
    #[error("not a number (must be between {min} and {max} {unit})")]
    NotNumber {
        min: Num,
        max: Num,
        unit: &'static str,
    },
    #[error("out of range: must be between {min} and {max} {unit}")]
    NumberOutOfRange {
        min: Num,
        max: Num,
        unit: &'static str,
    },
}

/// A decimal bound, printed without trailing zeros (`0.001`, `86400`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = format!("{:.6}", self.0);
        let s = s.trim_end_matches('0').trim_end_matches('.');
        f.write_str(s)
    }
}

/// Parses an integer in `min..=max`. Tells "not a whole number" (`abc`, `1.5`, empty)
/// from a whole number out of range, however large (`-1`, `10000000000000000000000`).
pub fn parse_int_in(s: &str, min: i128, max: i128) -> Result<i128, ValueError> {
    let t = s.trim();
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::NotInteger { min, max });
    }
    match t.parse::<i128>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        // Too many digits for an i128 is out of range too.
        _ => Err(ValueError::OutOfRange { min, max }),
    }
}

/// A clap value parser for an integer flag of type `T` in `min..=max`:
/// `#[arg(long, value_parser = int_in::<u16>(1, 1024))]`.
pub fn int_in<T>(min: i128, max: i128) -> impl Fn(&str) -> Result<T, ValueError> + Clone
where
    T: TryFrom<i128>,
{
    move |s| {
        let v = parse_int_in(s, min, max)?;
        T::try_from(v).map_err(|_| ValueError::OutOfRange { min, max })
    }
}

/// A clap value parser for a decimal flag in `min..=max` (seconds, ratios), `unit` named
/// in the error: `#[arg(long, value_parser = number_in(0.001, 86400.0, "seconds"))]`.
pub fn number_in(
    min: f64,
    max: f64,
    unit: &'static str,
) -> impl Fn(&str) -> Result<f64, ValueError> + Clone {
    move |s| {
        let (lo, hi) = (Num(min), Num(max));
        let v: f64 = s.trim().parse().map_err(|_| ValueError::NotNumber {
            min: lo,
            max: hi,
            unit,
        })?;
        if v.is_finite() && (min..=max).contains(&v) {
            Ok(v)
        } else if v.is_nan() {
            Err(ValueError::NotNumber {
                min: lo,
                max: hi,
                unit,
            })
        } else {
            Err(ValueError::NumberOutOfRange {
                min: lo,
                max: hi,
                unit,
            })
        }
    }
}

/// The largest value of a flag that is passed on as an `i64` somewhere (milliseconds,
/// counts): `u64` flags accept up to here, so no conversion can fail later.
pub const I64_MAX: i128 = i64::MAX as i128;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_say_the_range_in_words() {
        let p = int_in::<u16>(1, 1024);
        assert_eq!(p("16"), Ok(16));
        for bad in ["0", "-1", "1025", "100000", &"9".repeat(50)] {
            assert_eq!(
                p(bad).unwrap_err().to_string(),
                "out of range: must be between 1 and 1024",
                "{bad}"
            );
        }
        for bad in ["", "abc", "1.5", "10^30", "-"] {
            assert_eq!(
                p(bad).unwrap_err().to_string(),
                "not a whole number (must be between 1 and 1024)",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn numbers_say_the_range_and_unit() {
        let p = number_in(0.001, 86400.0, "seconds");
        assert_eq!(p("0.5"), Ok(0.5));
        assert_eq!(
            p("-1").unwrap_err().to_string(),
            "out of range: must be between 0.001 and 86400 seconds"
        );
        assert_eq!(
            p("inf").unwrap_err().to_string(),
            "out of range: must be between 0.001 and 86400 seconds"
        );
        assert_eq!(
            p("soon").unwrap_err().to_string(),
            "not a number (must be between 0.001 and 86400 seconds)"
        );
    }
}
