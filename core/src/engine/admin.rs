//! Sale administration: SALE.CREATE, INFO, LIST, STOCK, PAUSE/RESUME, ADJUST.

use super::*;

// The refusals below spell MAX_TOTAL out (they are static strings).
const _: () = assert!(MAX_TOTAL == 1_099_511_627_776);

impl Engine {
    /// SALE.CREATE. Same parameters again: Ok (idempotent). Different: `Exists`.
    pub fn create_sale(
        &self,
        sku: &str,
        total: u64,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<Lsn, EngineError> {
        let params = self.params(sku, total, shards, ttl_ms, limit)?;
        let mut sales = self.sales.write();
        if let Some(s) = sales.get(sku) {
            return if s.params == params {
                // The creation record may still be in flight: the +OK waits for it.
                Ok(self.sink.last_lsn())
            } else {
                Err(EngineError::Exists)
            };
        }
        let sku: Arc<str> = sku.into();
        let lsn = self.sink.record(&EventRef::SaleCreated {
            sku: &sku,
            params: &params,
            at_ms: self.clock.now_ms(),
        });
        sales.insert(
            sku.clone(),
            Arc::new(Sale::new(sku, params, SaleState::Open)),
        );
        Ok(lsn)
    }

    pub(super) fn params(
        &self,
        sku: &str,
        total: u64,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<SaleParams, EngineError> {
        ident::check_sku(sku)?;
        if total > MAX_TOTAL {
            return Err(EngineError::Argument(
                "total must be between 0 and 1099511627776",
            ));
        }
        let shards = shards.unwrap_or(self.cfg.default_shards);
        if shards == 0 || shards > MAX_SHARDS {
            return Err(EngineError::Argument("shards must be between 1 and 1024"));
        }
        let ttl_ms = ttl_ms.unwrap_or(self.cfg.default_ttl_ms);
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(EngineError::Argument(
                "ttl must be between 1 and 2592000000 ms",
            ));
        }
        Ok(SaleParams {
            total,
            shards,
            ttl_ms,
            limit: limit.unwrap_or(0),
        })
    }

    /// A sale's parameters and counters, consistent across its shards.
    pub fn sale_info(&self, sku: &str) -> Result<SaleView, EngineError> {
        let sale = self.sale(sku)?;
        // Under the admin lock no ADJUST, REBUILD or gathering RESERVE moves units between
        // shards, so the shards read one by one add up (see `sale::ShardCounts`).
        let _admin = sale.admin.lock();
        Ok(sale.view())
    }

    /// The skus of every sale, sorted.
    pub fn list_sales(&self) -> Vec<String> {
        let mut v: Vec<String> = self.sales.read().keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    }

    /// Units of the sale still available to reserve, summed over its shards.
    pub fn stock(&self, sku: &str) -> Result<i64, EngineError> {
        Ok(self.sale(sku)?.available())
    }

    /// SALE.PAUSE / SALE.RESUME. A fenced sale stays fenced until rebuilt.
    pub fn set_paused(&self, sku: &str, paused: bool) -> Result<Lsn, EngineError> {
        let sale = self.sale(sku)?;
        let _admin = sale.admin.lock();
        sale.check_writable()?;
        let state = if paused {
            SaleState::Paused
        } else {
            SaleState::Open
        };
        if sale.state() == state {
            // Nothing changes, but the reply reports a state that an earlier record made.
            return Ok(self.sink.last_lsn());
        }
        // Logged before it takes effect: a RESERVE refused as PAUSED (or let through by a
        // RESUME) is answered after this record, never before it.
        let lsn = self.sink.record(&EventRef::SaleStateSet { sku, state });
        sale.set_state(state);
        Ok(lsn)
    }

    /// SALE.ADJUST: restock (spread over shards) or withdraw (at most what is available).
    /// A sale's waiting room moves with the new stock.
    pub fn adjust(&self, sku: &str, delta: i64) -> Result<(u64, Lsn), EngineError> {
        let out = self.adjust_stock(sku, delta)?;
        self.room_poke(sku);
        Ok(out)
    }

    fn adjust_stock(&self, sku: &str, delta: i64) -> Result<(u64, Lsn), EngineError> {
        ident::check_sku(sku)?;
        // |delta| beyond any total is refused before any arithmetic (i64::MIN has no
        // positive counterpart and would wrap).
        if delta.unsigned_abs() > MAX_TOTAL {
            return Err(EngineError::Argument(
                "delta must be between -1099511627776 and 1099511627776",
            ));
        }
        let sale = self.sale(sku)?;
        let _admin = sale.admin.lock();
        sale.check_writable()?;
        let n = sale.shard_count();
        if delta == 0 {
            return Ok((sale.total(), self.sink.last_lsn()));
        }
        let mut deltas = vec![0i64; n];
        if delta > 0 {
            if sale.total().saturating_add(delta as u64) > MAX_TOTAL {
                return Err(EngineError::Argument(
                    "the total after this delta would exceed 1099511627776",
                ));
            }
            for (i, d) in split(delta as u64, n as u16).into_iter().enumerate() {
                deltas[i] = d;
            }
            // Logged before the units can be seen: a RESERVE of a restocked unit is
            // logged after the restock, so no crash keeps the one without the other.
            let lsn = self.sink.record(&EventRef::SaleAdjusted {
                sku,
                shard_deltas: &deltas,
            });
            for (i, d) in deltas.iter().enumerate() {
                sale.give_back(i, *d);
            }
            return Ok((sale.add_total(delta), lsn));
        } else {
            let mut want = delta.unsigned_abs() as i64;
            // Start at the fullest shards so a withdrawal leaves the counters even.
            let view = sale.view();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(view.shard_available[i]));
            for i in order {
                if want == 0 {
                    break;
                }
                let got = sale.take_up_to(i, want);
                deltas[i] = -got;
                want -= got;
            }
            if want > 0 {
                for (i, d) in deltas.iter().enumerate() {
                    if *d < 0 {
                        sale.give_back(i, -d);
                    }
                }
                return Err(EngineError::NotEnoughAvailable);
            }
        }
        // A withdrawal: the units were taken before the record, which only makes a
        // concurrent RESERVE see SOLDOUT early (not remembered, the safe direction).
        let total = sale.add_total(delta);
        let lsn = self.sink.record(&EventRef::SaleAdjusted {
            sku,
            shard_deltas: &deltas,
        });
        Ok((total, lsn))
    }
}
