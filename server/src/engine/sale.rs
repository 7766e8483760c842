//! One sale: `total` units split over shard counters changed by compare-and-swap.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam::utils::CachePadded;
use parking_lot::Mutex;

use super::types::{SaleParams, SaleState, SaleView};

pub struct Sale {
    pub sku: Arc<str>,
    pub params: SaleParams,
    total: AtomicU64,
    /// Each counter on its own cache line: buyers on different shards must not contend.
    shards: Box<[CachePadded<AtomicI64>]>,
    reserved: AtomicU64,
    committed: AtomicU64,
    state: AtomicU8,
    /// Serialises administrative changes (ADJUST, REBUILD, state) with snapshots; the
    /// reserve path never takes it.
    pub admin: Mutex<()>,
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
    pub fn new(sku: Arc<str>, params: SaleParams, state: SaleState) -> Sale {
        let shards = split(params.total, params.shards)
            .into_iter()
            .map(|v| CachePadded::new(AtomicI64::new(v)))
            .collect();
        Sale {
            sku,
            total: AtomicU64::new(params.total),
            params,
            shards,
            reserved: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            state: AtomicU8::new(state.to_u8()),
            admin: Mutex::new(()),
        }
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub fn home_shard(&self, user: &str) -> usize {
        (fnv1a(user.as_bytes()) % self.shards.len() as u64) as usize
    }

    pub fn state(&self) -> SaleState {
        SaleState::from_u8(self.state.load(Ordering::Acquire)).unwrap_or(SaleState::Fenced)
    }

    pub fn set_state(&self, s: SaleState) {
        self.state.store(s.to_u8(), Ordering::Release);
    }

    /// Takes `qty` units from one shard if it has them. Never lets a shard go negative:
    /// this CAS loop is the whole oversell protection.
    pub fn try_take(&self, shard: usize, qty: u32) -> bool {
        let c = &self.shards[shard];
        let q = qty as i64;
        let mut cur = c.load(Ordering::Acquire);
        loop {
            if cur < q {
                return false;
            }
            match c.compare_exchange_weak(cur, cur - q, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    debug_assert!(cur - q >= 0);
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes up to `want` units from one shard; returns how many it got.
    pub fn take_up_to(&self, shard: usize, want: i64) -> i64 {
        let c = &self.shards[shard];
        let mut cur = c.load(Ordering::Acquire);
        loop {
            let got = cur.min(want).max(0);
            if got == 0 {
                return 0;
            }
            match c.compare_exchange_weak(cur, cur - got, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return got,
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn give_back(&self, shard: usize, qty: i64) {
        let prev = self.shards[shard].fetch_add(qty, Ordering::AcqRel);
        debug_assert!(prev + qty >= 0);
    }

    pub fn add_reserved(&self, qty: u32) {
        self.reserved.fetch_add(qty as u64, Ordering::AcqRel);
    }

    pub fn sub_reserved(&self, qty: u32) {
        let prev = self.reserved.fetch_sub(qty as u64, Ordering::AcqRel);
        debug_assert!(prev >= qty as u64, "reserved underflow");
    }

    pub fn add_committed(&self, qty: u32) {
        self.committed.fetch_add(qty as u64, Ordering::AcqRel);
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    pub fn add_total(&self, delta: i64) -> u64 {
        let prev = self.total.fetch_add(delta as u64, Ordering::AcqRel);
        prev.wrapping_add(delta as u64)
    }

    pub fn available(&self) -> i64 {
        self.shards.iter().map(|c| c.load(Ordering::Acquire)).sum()
    }

    /// Used only by recovery and rebuild, which run with no concurrent buyer.
    pub fn overwrite(&self, total: u64, committed: u64, reserved: u64, shard_available: &[i64]) {
        self.total.store(total, Ordering::Release);
        self.committed.store(committed, Ordering::Release);
        self.reserved.store(reserved, Ordering::Release);
        for (c, v) in self.shards.iter().zip(shard_available) {
            c.store(*v, Ordering::Release);
        }
    }

    pub fn view(&self) -> SaleView {
        let shard_available: Vec<i64> = self
            .shards
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .collect();
        SaleView {
            sku: self.sku.to_string(),
            params: self.params.clone(),
            total: self.total(),
            available: shard_available.iter().sum(),
            reserved: self.reserved.load(Ordering::Acquire),
            committed: self.committed.load(Ordering::Acquire),
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
                        if s.try_take(0, 3) {
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
}
