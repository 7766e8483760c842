//! `EXPIRED` and `RELEASE`: the sweeper path.

use super::args::Args;
use super::{Ctx, Outcome};
use crate::engine::ReleaseReason;
use crate::metrics::SaleEvent;
use crate::protocol::Reply;

/// Largest page EXPIRED returns, whatever COUNT says: replies stay bounded.
pub const MAX_EXPIRED_PAGE: u64 = 10_000;

/// `RELEASE token [REASON cancel|expired|admin|rebuild]`: the reason goes into the feed entry;
/// without it the hold's deadline decides (`expired` past it, `cancel` before).
pub struct Release<'a> {
    token: &'a str,
    reason: Option<ReleaseReason>,
}

impl<'a> Release<'a> {
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("release", args);
        let token = a.next_token()?;
        let mut reason = None;
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "REASON" => {
                    let word = a.next_keyword()?;
                    let stated = ReleaseReason::parse(&word).ok_or_else(|| {
                        Reply::err(
                            "ERR release reason must be one of cancel, expired, admin, rebuild",
                        )
                    })?;
                    reason = Some(stated);
                }
                _ => return Err(Reply::syntax()),
            }
        }
        Ok(Release { token, reason })
    }

    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let (released, lsn) = ctx.engine.release_with(self.token, self.reason);
        if released {
            ctx.conn
                .recorder
                .count_finished(&ctx.shared.metrics, self.token, SaleEvent::Release);
        }
        Outcome::logged(Reply::Int(released as i64), lsn)
    }
}

/// `EXPIRED [COUNT n] [SKU sku]`
pub struct Expired<'a> {
    count: u64,
    sku: Option<&'a str>,
}

impl<'a> Expired<'a> {
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("expired", args);
        let mut count = 100;
        let mut sku = None;
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "COUNT" => count = a.next_u64_in("count", 1, i64::MAX as u64)?,
                "SKU" => sku = Some(a.next_sku()?),
                _ => return Err(Reply::syntax()),
            }
        }
        Ok(Expired {
            count: count.min(MAX_EXPIRED_PAGE),
            sku,
        })
    }

    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let list = ctx.engine.expired(self.count as usize, self.sku);
        Reply::Array(
            list.iter()
                .map(|r| {
                    Reply::Array(vec![
                        Reply::bulk(&r.token),
                        Reply::bulk(&r.sku),
                        Reply::bulk(&r.user),
                        Reply::Int(r.qty as i64),
                        Reply::Int(r.shard as i64),
                        Reply::Int(r.expires_at_ms as i64),
                    ])
                })
                .collect(),
        )
        .into()
    }
}
