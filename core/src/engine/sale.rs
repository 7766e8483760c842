//! One sale: `total` units split over shard counters changed by compare-and-swap.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam::utils::CachePadded;
use parking_lot::Mutex;
use portable_atomic::AtomicI128;

use super::names::Names;
use super::types::{SaleParams, SaleState, SaleView};

/// A shard's three counters packed in one 128-bit word, so every transition of a
/// reservation (available → reserved, reserved → committed, reserved → available) is one
/// atomic operation, and a reader sees each shard in a state it really was in. A sale's
/// units move between shards only under the sale's admin lock (ADJUST, REBUILD, and a
/// RESERVE gathering units from several shards), so summing shards read one by one under
/// that lock gives a consistent view: `available + reserved + committed == total` in
/// every SALE.INFO.
///
/// Layout: three signed 42-bit fields, `available | reserved << 42 | committed << 84`,
/// added as one i128. Fields may go transiently negative during replay of an old log
/// (the sum stays exact); decoding sign-extends each field in turn. [`MAX_TOTAL`] keeps
/// every field far inside ±2^41.
///
/// [`MAX_TOTAL`]: super::MAX_TOTAL
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ShardCounts {
    /// Units anyone may still reserve.
    pub available: i64,
    /// Units held by live reservations.
    pub reserved: i64,
    /// Units sold.
    pub committed: i64,
}

const FIELD_BITS: u32 = 42;

impl ShardCounts {
    /// The three counters as one word, for the atomic add.
    pub fn pack(self) -> i128 {
        (self.available as i128)
            .wrapping_add((self.reserved as i128) << FIELD_BITS)
            .wrapping_add((self.committed as i128) << (2 * FIELD_BITS))
    }

    /// The three counters of a packed word.
    pub fn unpack(w: i128) -> ShardCounts {
        fn low(x: i128) -> i128 {
            (x << (128 - FIELD_BITS)) >> (128 - FIELD_BITS)
        }
        let a = low(w);
        let w1 = w.wrapping_sub(a) >> FIELD_BITS;
        let r = low(w1);
        let c = w1.wrapping_sub(r) >> FIELD_BITS;
        ShardCounts {
            available: a as i64,
            reserved: r as i64,
            committed: c as i64,
        }
    }
}

/// The packed delta that moves `qty` units: `(available, reserved, committed)`.
fn delta(a: i64, r: i64, c: i64) -> i128 {
    ShardCounts {
        available: a,
        reserved: r,
        committed: c,
    }
    .pack()
}

/// One sale: its parameters, its sharded counters and its users.
pub struct Sale {
    /// The sale's sku.
    pub sku: Arc<str>,
    /// What it was created with (`total` as created; the current total is [`Sale::total`]).
    pub params: SaleParams,
    total: AtomicU64,
    /// Each shard on its own cache line: buyers on different shards must not contend.
    shards: Box<[CachePadded<AtomicI128>]>,
    state: AtomicU8,
    /// Serialises administrative changes (ADJUST, REBUILD, state) and moves of units
    /// between shards with snapshots and consistent views; the reserve path takes it only
    /// to gather units no single shard has (after its stripe locks: see `mod.rs`).
    pub admin: Mutex<()>,
    /// The users holding (or having held) reservations in this sale, by 4-byte id.
    pub users: Names,
}

/// Stable 64-bit FNV-1a: the user → shard mapping must not change across restarts or
/// builds (std's SipHash is randomly keyed).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `total` split over `n` shards: the remainder goes to the first shards.
pub fn split(total: u64, n: u16) -> Vec<i64> {
    let n = n.max(1) as u64;
    (0..n)
        .map(|i| (total / n + u64::from(i < total % n)) as i64)
        .collect()
}

impl Sale {
    /// A sale with `params.total` units split over its shards, in state `state`.
    pub fn new(sku: Arc<str>, params: SaleParams, state: SaleState) -> Sale {
        let shards = split(params.total, params.shards)
            .into_iter()
            .map(|v| CachePadded::new(AtomicI128::new(delta(v, 0, 0))))
            .collect();
        Sale {
            sku,
            total: AtomicU64::new(params.total),
            params,
            shards,
            state: AtomicU8::new(state.to_u8()),
            admin: Mutex::new(()),
            users: Names::default(),
        }
    }

    /// How many shards the sale's units are spread over.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard a user's RESERVE tries first (stable across restarts: FNV-1a).
    pub fn home_shard(&self, user: &str) -> usize {
        (fnv1a(user.as_bytes()) % self.shards.len() as u64) as usize
    }

    /// Open, paused, fenced or moving.
    pub fn state(&self) -> SaleState {
        SaleState::from_u8(self.state.load(Ordering::Acquire)).unwrap_or(SaleState::Fenced)
    }

    /// Refuses administration (ADJUST, PAUSE, RESUME) of a fenced or frozen sale.
    pub fn check_writable(&self) -> Result<(), super::EngineError> {
        match self.state() {
            SaleState::Fenced => Err(super::EngineError::Fenced),
            SaleState::Moving { .. } => Err(super::EngineError::Moving(self.sku.to_string())),
            SaleState::Open | SaleState::Paused => Ok(()),
        }
    }

    /// Refuses a write on one of the sale's reservations (COMMIT, RELEASE, EXTEND) while
    /// the sale is frozen for a move.
    pub fn check_not_moving(&self) -> Result<(), super::EngineError> {
        if self.state().is_moving() {
            return Err(super::EngineError::Moving(self.sku.to_string()));
        }
        Ok(())
    }

    /// Opens, pauses, fences or freezes the sale.
    pub fn set_state(&self, s: SaleState) {
        self.state.store(s.to_u8(), Ordering::Release);
    }

    /// One shard's counters.
    pub fn shard(&self, shard: usize) -> ShardCounts {
        ShardCounts::unpack(self.shards[shard].load(Ordering::Acquire))
    }

    fn add(&self, shard: usize, d: i128) -> ShardCounts {
        let prev = self.shards[shard].fetch_add(d, Ordering::AcqRel);
        ShardCounts::unpack(prev.wrapping_add(d))
    }

    /// RESERVE: moves `qty` units of one shard from available to reserved if the shard
    /// has them. Never lets a shard go negative: this CAS loop is the whole oversell
    /// protection.
    pub fn try_reserve(&self, shard: usize, qty: u32) -> bool {
        let c = &self.shards[shard];
        let q = qty as i64;
        let d = delta(-q, q, 0);
        let mut cur = c.load(Ordering::Acquire);
        loop {
            if ShardCounts::unpack(cur).available < q {
                return false;
            }
            let next = cur.wrapping_add(d);
            match c.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    debug_assert!(ShardCounts::unpack(next).available >= 0);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Replay of a logged RESERVE: the check was made when it was logged.
    pub fn reserve_unchecked(&self, shard: usize, qty: u32) {
        self.add(shard, delta(-(qty as i64), qty as i64, 0));
    }

    /// A reservation put back on a fenced sale (restore): reserved, no stock taken; the
    /// rebuild recomputes available.
    pub fn add_reserved(&self, shard: usize, qty: u32) {
        self.add(shard, delta(0, qty as i64, 0));
    }

    /// Units already taken from `shard`'s available (by [`Sale::take_up_to`], possibly
    /// after a logged move into it) become reserved there: with those takes, the same
    /// change a RESERVE of `qty` on that shard makes, and what its replay repeats.
    pub fn hold_taken(&self, shard: usize, qty: u32) {
        let after = self.add(shard, delta(0, qty as i64, 0));
        debug_assert!(after.reserved >= qty as i64, "reserved underflow");
    }

    /// RELEASE: reserved → available, on the shard the units came from.
    pub fn release(&self, shard: usize, qty: u32) {
        let after = self.add(shard, delta(qty as i64, -(qty as i64), 0));
        debug_assert!(after.reserved >= 0, "reserved underflow");
    }

    /// COMMIT: reserved → committed.
    pub fn commit(&self, shard: usize, qty: u32) {
        let after = self.add(shard, delta(0, -(qty as i64), qty as i64));
        debug_assert!(after.reserved >= 0, "reserved underflow");
    }

    /// Takes up to `want` available units from one shard (withdrawal); returns how many.
    pub fn take_up_to(&self, shard: usize, want: i64) -> i64 {
        let c = &self.shards[shard];
        let mut cur = c.load(Ordering::Acquire);
        loop {
            let got = ShardCounts::unpack(cur).available.min(want).max(0);
            if got == 0 {
                return 0;
            }
            let next = cur.wrapping_add(delta(-got, 0, 0));
            match c.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return got,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Adds `qty` (may be negative) to one shard's available units (ADJUST, or replay
    /// of one).
    pub fn give_back(&self, shard: usize, qty: i64) {
        self.add(shard, delta(qty, 0, 0));
    }

    /// Units for sale in total, after adjustments.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Adds `delta` (may be negative) to the total; returns the new total.
    pub fn add_total(&self, delta: i64) -> u64 {
        let prev = self.total.fetch_add(delta as u64, Ordering::AcqRel);
        prev.wrapping_add(delta as u64)
    }

    /// Units available to reserve, summed over the shards.
    pub fn available(&self) -> i64 {
        (0..self.shards.len())
            .map(|i| self.shard(i).available)
            .sum()
    }

    /// Used only by recovery and rebuild, which run with no concurrent buyer: shard
    /// `i` gets `shard_available[i]` available and `shard_reserved[i]` reserved units;
    /// the committed units (which never move again) are kept on shard 0.
    pub fn overwrite(
        &self,
        total: u64,
        committed: u64,
        shard_reserved: &[u64],
        shard_available: &[i64],
    ) {
        self.total.store(total, Ordering::Release);
        for (i, c) in self.shards.iter().enumerate() {
            let counts = ShardCounts {
                available: shard_available.get(i).copied().unwrap_or(0),
                reserved: shard_reserved.get(i).copied().unwrap_or(0) as i64,
                committed: if i == 0 { committed as i64 } else { 0 },
            };
            c.store(counts.pack(), Ordering::Release);
        }
    }

    /// The sale's counters. Consistent (`available + reserved + committed == total`)
    /// when the caller holds the admin lock; see [`ShardCounts`].
    pub fn view(&self) -> SaleView {
        let shards: Vec<ShardCounts> = (0..self.shards.len()).map(|i| self.shard(i)).collect();
        let shard_available: Vec<i64> = shards.iter().map(|c| c.available).collect();
        SaleView {
            sku: self.sku.to_string(),
            params: self.params.clone(),
            total: self.total(),
            available: shard_available.iter().sum(),
            reserved: shards.iter().map(|c| c.reserved).sum::<i64>().max(0) as u64,
            committed: shards.iter().map(|c| c.committed).sum::<i64>().max(0) as u64,
            state: self.state(),
            shard_available,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_sums() {
        assert_eq!(split(10, 3), vec![4, 3, 3]);
        assert_eq!(split(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(split(1000, 16).iter().sum::<i64>(), 1000);
    }

    #[test]
    fn shard_never_negative_under_race() {
        let params = SaleParams {
            total: 1000,
            shards: 1,
            ttl_ms: 1,
            limit: 0,
        };
        let s = Arc::new(Sale::new("S".into(), params, SaleState::Open));
        let taken = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                let taken = taken.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        if s.try_reserve(0, 3) {
                            taken.fetch_add(3, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::Relaxed), 999);
        assert_eq!(s.available(), 1);
    }

    proptest::proptest! {
        #[test]
        fn packing_round_trips(
            a in -(1i64 << 41)..(1i64 << 41),
            r in -(1i64 << 41)..(1i64 << 41),
            c in -(1i64 << 41)..(1i64 << 41),
            da in -(1i64 << 30)..(1i64 << 30),
            dr in -(1i64 << 30)..(1i64 << 30),
        ) {
            let x = ShardCounts { available: a, reserved: r, committed: c };
            proptest::prop_assert_eq!(ShardCounts::unpack(x.pack()), x);
            // Adding packed deltas is adding fields, as long as each stays in range.
            let (a2, r2) = (a + da, r + dr);
            if a2.abs() < (1 << 41) && r2.abs() < (1 << 41) {
                let y = ShardCounts::unpack(x.pack().wrapping_add(delta(da, dr, 0)));
                proptest::prop_assert_eq!(y, ShardCounts { available: a2, reserved: r2, committed: c });
            }
        }
    }

    #[test]
    fn view_is_never_torn_under_race() {
        let params = SaleParams {
            total: 400,
            shards: 4,
            ttl_ms: 1,
            limit: 0,
        };
        let s = Arc::new(Sale::new("S".into(), params, SaleState::Open));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let sh = (i + w) % 4;
                        if s.try_reserve(sh, 1) {
                            if i.is_multiple_of(3) {
                                s.commit(sh, 1);
                            } else {
                                s.release(sh, 1);
                            }
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        for _ in 0..20_000 {
            let v = s.view();
            assert_eq!(v.available + v.reserved as i64 + v.committed as i64, 400);
        }
        stop.store(true, Ordering::Relaxed);
        for t in workers {
            t.join().unwrap();
        }
    }
}
