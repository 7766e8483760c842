//! How many buyers the room may let through now: the lesser of a rate limit and what the
//! sale can still serve.
//!
//! - Rate: a token bucket filling at `max_rate_per_sec` with one second of burst, counted
//!   in thousandths of an admission so no float enters state that replicas must agree on.
//! - Stock: `ceil((available + expiring_soon) × over_admit) − admitted_not_reserved`.
//!   Units a hold will give back soon count already, so the next buyers are in line when
//!   they return; buyers admitted but not yet reserved are the demand already sent.
//!
//! Also keeps the observed admission rate over a recent window, for wait estimates.

use std::collections::VecDeque;

/// What the sale can still serve, as the engine outside sees it at the moment of a call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StockView {
    /// Units free to reserve.
    pub available: u64,
    /// Units in live holds.
    pub held: u64,
    /// Units of holds expiring within `RoomConfig::expiring_window_ms` (a part of `held`).
    pub expiring_soon: u64,
}

impl StockView {
    /// Nothing left and nothing held that could come back: every waiting buyer is told.
    pub fn sold_out(&self) -> bool {
        self.available == 0 && self.held == 0
    }
}

/// Window of the observed admission rate: long enough to smooth ticks, short enough to
/// follow a pace that changes with stock.
const RATE_WINDOW_MS: u64 = 30_000;
/// Samples kept in the window; later admissions merge into the last sample.
const MAX_SAMPLES: usize = 256;

/// The rate limiter's and the rate estimate's state. Changed only by admissions (ops in
/// the log), so replicas hold the same bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Thousandths of an admission in the bucket.
    tokens_milli: u64,
    /// When the bucket was last filled.
    last_ms: u64,
    /// `(time, admitted)` of recent admissions, oldest first.
    recent: VecDeque<(u64, u32)>,
}

impl Pace {
    /// A full bucket (one second of burst) at `rate`.
    pub fn new(rate: u32) -> Self {
        Pace {
            tokens_milli: u64::from(rate) * 1000,
            last_ms: 0,
            recent: VecDeque::new(),
        }
    }

    fn filled(&self, now_ms: u64, rate: u32) -> u64 {
        let cap = u64::from(rate) * 1000;
        let gained = now_ms
            .saturating_sub(self.last_ms)
            .saturating_mul(u64::from(rate));
        self.tokens_milli.saturating_add(gained).min(cap)
    }

    /// Admissions the rate allows at `now_ms`.
    pub fn allowance(&self, now_ms: u64, rate: u32) -> u64 {
        self.filled(now_ms, rate) / 1000
    }

    /// Admissions the stock allows: never negative.
    pub fn stock_cap(
        stock: &StockView,
        over_admit_permille: u32,
        admitted_not_reserved: u64,
    ) -> u64 {
        let servable = u128::from(stock.available) + u128::from(stock.expiring_soon);
        let scaled = (servable * u128::from(over_admit_permille)).div_ceil(1000);
        let cap = u64::try_from(scaled).unwrap_or(u64::MAX);
        cap.saturating_sub(admitted_not_reserved)
    }

    /// Spends `n` admissions at `now_ms` (an `Admit` op applied) and records them for
    /// the rate estimate.
    pub fn spend(&mut self, now_ms: u64, rate: u32, n: u32) {
        let now_ms = now_ms.max(self.last_ms);
        self.tokens_milli = self
            .filled(now_ms, rate)
            .saturating_sub(u64::from(n) * 1000);
        self.last_ms = now_ms;
        if n == 0 {
            return;
        }
        while self
            .recent
            .front()
            .is_some_and(|&(t, _)| t + RATE_WINDOW_MS < now_ms)
        {
            self.recent.pop_front();
        }
        let full = self.recent.len() >= MAX_SAMPLES;
        match self.recent.back_mut() {
            Some(last) if full || last.0 == now_ms => last.1 = last.1.saturating_add(n),
            _ => self.recent.push_back((now_ms, n)),
        }
    }

    /// Admissions observed over the recent window and the milliseconds they took (at
    /// least one second), or `None` when nobody was admitted in it.
    pub fn observed(&self, now_ms: u64) -> Option<(u64, u64)> {
        let from = now_ms.saturating_sub(RATE_WINDOW_MS);
        let mut count = 0u64;
        let mut oldest = now_ms;
        for &(t, n) in self.recent.iter().filter(|s| s.0 >= from) {
            count += u64::from(n);
            oldest = oldest.min(t);
        }
        let span = now_ms.saturating_sub(oldest).max(1000);
        (count > 0).then_some((count, span))
    }
}

impl Pace {
    /// The bucket and the recent admissions as plain values (snapshots):
    /// `(tokens_milli, last_ms, recent)`.
    pub fn export(&self) -> (u64, u64, Vec<(u64, u32)>) {
        (
            self.tokens_milli,
            self.last_ms,
            self.recent.iter().copied().collect(),
        )
    }

    /// The pace [`Pace::export`] described.
    pub fn restore(tokens_milli: u64, last_ms: u64, recent: Vec<(u64, u32)>) -> Pace {
        Pace {
            tokens_milli,
            last_ms,
            recent: recent.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills_at_rate_with_one_second_of_burst() {
        let mut p = Pace::new(10);
        assert_eq!(p.allowance(0, 10), 10);
        p.spend(0, 10, 10);
        assert_eq!(p.allowance(0, 10), 0);
        assert_eq!(p.allowance(250, 10), 2);
        assert_eq!(p.allowance(60_000, 10), 10, "burst capped at one second");
    }

    #[test]
    fn stock_cap_follows_stock_and_factor() {
        let s = |available, expiring_soon| StockView {
            available,
            held: expiring_soon,
            expiring_soon,
        };
        assert_eq!(Pace::stock_cap(&s(10, 0), 1000, 0), 10);
        assert_eq!(Pace::stock_cap(&s(10, 5), 1000, 3), 12);
        assert_eq!(Pace::stock_cap(&s(10, 0), 1500, 0), 15);
        assert_eq!(Pace::stock_cap(&s(3, 0), 1100, 0), 4, "rounded up");
        assert_eq!(Pace::stock_cap(&s(1, 0), 1000, 5), 0, "never negative");
        assert_eq!(Pace::stock_cap(&s(u64::MAX, u64::MAX), 10_000, 0), u64::MAX);
    }

    #[test]
    fn observed_rate() {
        let mut p = Pace::new(100);
        assert_eq!(p.observed(0), None);
        p.spend(1000, 100, 5);
        p.spend(3000, 100, 5);
        assert_eq!(p.observed(3000), Some((10, 2000)));
        assert_eq!(p.observed(3100), Some((10, 2100)));
        assert_eq!(p.observed(100_000), None, "out of the window");
    }
}
