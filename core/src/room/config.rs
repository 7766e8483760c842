//! How a sale's waiting room paces admissions. Plain values, validated once when the room
//! is created, so the state machine never meets a rate of zero or a factor that admits
//! nobody.

use thiserror::Error;

/// Longest admission window: an admitted buyer who has not reserved after an hour is not
/// coming back, and a longer window only holds budget hostage.
pub const MAX_ADMIT_TTL_MS: u64 = 3_600_000;
/// Fastest admission rate: far beyond what a RESERVE path serves per sale.
pub const MAX_RATE_PER_SEC: u32 = 1_000_000;
/// Largest queue: slots are numbered by `u32`, and 50 million buyers at ≤ 64 bytes each is
/// about 3 GB, the most one sale should be allowed to cost.
pub const MAX_WAITING: u32 = 50_000_000;
/// Over-admission factor bounds, per mille: 0.1× to 10×.
pub const OVER_ADMIT_RANGE: std::ops::RangeInclusive<u32> = 100..=10_000;

/// A room's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomConfig {
    /// Most buyers admitted per second (a token bucket with one second of burst).
    pub max_rate_per_sec: u32,
    /// Over-admission factor in thousandths (1000 = 1.0): how many buyers to admit per unit
    /// the sale can still serve. Above 1000 when some admitted buyers are expected not to
    /// buy; the excess meets SOLDOUT at the gate.
    pub over_admit_permille: u32,
    /// How long an admission may go unused before it is EXPIRED and its budget is freed;
    /// also the expiry of the admission token the caller mints.
    pub admit_ttl_ms: u64,
    /// What "holds due to expire soon" means: the caller counts holds expiring within this
    /// window into [`super::StockView::expiring_soon`], so buyers are admitted just before
    /// the units come back rather than after.
    pub expiring_window_ms: u64,
    /// Most buyers waiting (pre-queued or queued) at once; joins beyond it are refused
    /// with [`super::RoomError::QueueFull`].
    pub max_waiting: u32,
    /// When the sale opens: joins before it form the pre-queue, shuffled at this instant.
    pub opens_at_ms: u64,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            max_rate_per_sec: 100,
            over_admit_permille: 1000,
            admit_ttl_ms: 120_000,
            expiring_window_ms: 10_000,
            max_waiting: 1_000_000,
            opens_at_ms: 0,
        }
    }
}

/// Why a room's settings were refused.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum ConfigError {
    /// The rate is zero or above [`MAX_RATE_PER_SEC`].
    #[error("max rate must be 1 to {MAX_RATE_PER_SEC} admissions per second")]
    Rate,
    /// The factor is outside [`OVER_ADMIT_RANGE`].
    #[error("over-admission factor must be 100 to 10000 per mille (0.1 to 10)")]
    OverAdmit,
    /// The admission window is zero or above [`MAX_ADMIT_TTL_MS`].
    #[error("admission ttl must be 1 ms to {MAX_ADMIT_TTL_MS} ms")]
    AdmitTtl,
    /// The expiring window is above [`MAX_ADMIT_TTL_MS`].
    #[error("expiring window must be at most {MAX_ADMIT_TTL_MS} ms")]
    ExpiringWindow,
    /// The queue limit is zero or above [`MAX_WAITING`].
    #[error("max waiting must be 1 to {MAX_WAITING}")]
    MaxWaiting,
    /// The sku breaks the identifier rules (`engine::ident::valid_sku`).
    #[error("invalid sku")]
    Sku,
    /// The room secret (user hashing, shuffle seed) is under 32 bytes.
    #[error("room secret must be at least 32 bytes")]
    Secret,
}

impl RoomConfig {
    /// Checks every field against its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_RATE_PER_SEC).contains(&self.max_rate_per_sec) {
            return Err(ConfigError::Rate);
        }
        if !OVER_ADMIT_RANGE.contains(&self.over_admit_permille) {
            return Err(ConfigError::OverAdmit);
        }
        if !(1..=MAX_ADMIT_TTL_MS).contains(&self.admit_ttl_ms) {
            return Err(ConfigError::AdmitTtl);
        }
        if self.expiring_window_ms > MAX_ADMIT_TTL_MS {
            return Err(ConfigError::ExpiringWindow);
        }
        if !(1..=MAX_WAITING).contains(&self.max_waiting) {
            return Err(ConfigError::MaxWaiting);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_refused() {
        assert_eq!(RoomConfig::default().validate(), Ok(()));
        let bad = |f: fn(&mut RoomConfig)| {
            let mut c = RoomConfig::default();
            f(&mut c);
            c.validate().err()
        };
        assert_eq!(bad(|c| c.max_rate_per_sec = 0), Some(ConfigError::Rate));
        assert_eq!(
            bad(|c| c.over_admit_permille = 99),
            Some(ConfigError::OverAdmit)
        );
        assert_eq!(bad(|c| c.admit_ttl_ms = 0), Some(ConfigError::AdmitTtl));
        assert_eq!(
            bad(|c| c.expiring_window_ms = MAX_ADMIT_TTL_MS + 1),
            Some(ConfigError::ExpiringWindow)
        );
        assert_eq!(bad(|c| c.max_waiting = 0), Some(ConfigError::MaxWaiting));
    }
}
