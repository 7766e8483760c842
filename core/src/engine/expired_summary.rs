//! A cheap per-sale summary of what `EXPIRED` would list, for operators: how many
//! reservations are past their deadline and not yet swept, and the oldest deadline (the
//! sweeper's lag). Counts only; no reservation is copied.

use std::collections::HashMap;
use std::sync::Arc;

use super::types::Millis;
use super::Engine;

impl Engine {
    /// Per sale: `(sku, expired-not-yet-swept reservations, their units, oldest
    /// expires_at_ms)`. Walks the expired sets (not the whole table), one stripe lock at a
    /// time, like `EXPIRED`.
    pub fn expired_summary(&self) -> Vec<(Arc<str>, u64, u64, Millis)> {
        let now = self.clock.now_ms();
        let mut m: HashMap<Arc<str>, (u64, u64, Millis)> = HashMap::new();
        for s in self.stripes.iter() {
            let mut stripe = s.lock();
            stripe.advance(now);
            for &(at, idx) in stripe.expired.iter() {
                let r = stripe.get(idx);
                let e = m.entry(r.sale.sku.clone()).or_insert((0, 0, at));
                e.0 += 1;
                e.1 += r.qty as u64;
                e.2 = e.2.min(at);
            }
        }
        m.into_iter().map(|(k, (n, u, t))| (k, n, u, t)).collect()
    }
}
