//! A hold after RESERVE, whoever calls: `STOCK`, `RESERVATION`, `EXTEND`, `COMMIT`,
//! `RELEASE`, and `EXPIRED` (the holds past their deadline, for the sweeper).

use super::args::Args;
use super::{Ctx, Outcome};
use crate::engine::types::{PaymentCheck, ReservationView};
use crate::engine::{ReleaseReason, MAX_TTL_MS};
use crate::metrics::SaleEvent;
use crate::protocol::reply::from_engine_error;
use crate::protocol::Reply;
use crate::session::Role;

/// `STOCK sku`
pub struct Stock<'a> {
    sku: &'a str,
}

impl<'a> Stock<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("stock", args);
        let sku = a.next_sku()?;
        a.done()?;
        Ok(Stock { sku })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.stock(self.sku) {
            Ok(n) => Outcome::logged(Reply::Int(n), ctx.engine.observed_lsn()),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// The `RESERVATION` reply: a hold's state, units and deadlines as a map.
pub fn reservation_reply(r: &ReservationView) -> Reply {
    Reply::map([
        ("token", Reply::bulk(&r.token)),
        ("sku", Reply::bulk(&r.sku)),
        ("user", Reply::bulk(&r.user)),
        ("request_id", Reply::bulk(&r.request_id)),
        ("qty", Reply::Int(r.qty as i64)),
        ("shard", Reply::Int(r.shard as i64)),
        ("state", Reply::bulk(r.state.as_str())),
        ("expires_at_ms", Reply::Int(r.expires_at_ms as i64)),
        ("created_at_ms", Reply::Int(r.created_at_ms as i64)),
    ])
}

/// `RESERVATION token`
pub struct Reservation<'a> {
    token: &'a str,
}

impl<'a> Reservation<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("reservation", args);
        let token = a.next_token()?;
        a.done()?;
        Ok(Reservation { token })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.reservation(self.token) {
            // Report a state only once the change that made it is durable.
            Some((r, lsn)) => Outcome::logged(reservation_reply(&r), lsn),
            None => Reply::Nil.into(),
        }
    }
}

/// `EXTEND token ms`
pub struct Extend<'a> {
    token: &'a str,
    ms: u64,
}

impl<'a> Extend<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("extend", args);
        let token = a.next_token()?;
        let ms = a.next_u64_in("ms", 1, MAX_TTL_MS)?;
        a.done()?;
        Ok(Extend { token, ms })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.extend(self.token, self.ms) {
            Ok((at, lsn)) => Outcome::logged(Reply::Int(at as i64), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `COMMIT token [VERIFIED]`. `VERIFIED` states that the ledger accepted the payment
/// before the hold's deadline, so a hold past its expiry still commits; only the roles
/// that act for the ledger (sweeper, admin) may state it.
pub struct Commit<'a> {
    token: &'a str,
    check: PaymentCheck,
}

impl<'a> Commit<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("commit", args);
        let token = a.next_token()?;
        let check = if a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "VERIFIED" => PaymentCheck::LedgerVerified,
                _ => return Err(a.syntax()),
            }
        } else {
            PaymentCheck::Unverified
        };
        a.done()?;
        Ok(Commit { token, check })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        if self.check == PaymentCheck::LedgerVerified
            && !matches!(ctx.conn.role, Some(Role::Admin | Role::Sweeper))
        {
            let user = ctx.conn.user_name.as_deref().unwrap_or_default();
            return Reply::err(format!(
                "NOPERM User {user} has no permissions to run the 'commit|verified' command: \
                 only the sweeper and admin roles may state that the ledger verified a payment"
            ))
            .into();
        }
        match ctx.engine.commit_with(self.token, self.check) {
            Ok((now, lsn)) => {
                if now {
                    ctx.conn.recorder.count_finished(
                        &ctx.shared.metrics,
                        self.token,
                        SaleEvent::Commit,
                    );
                }
                Outcome::logged(Reply::Int(now as i64), lsn)
            }
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// Largest page EXPIRED returns, whatever COUNT says: replies stay bounded.
pub const MAX_EXPIRED_PAGE: u64 = 10_000;

/// `RELEASE token [REASON cancel|expired|admin|rebuild]`: the reason goes into the feed entry;
/// without it the hold's deadline decides (`expired` past it, `cancel` before).
pub struct Release<'a> {
    token: &'a str,
    reason: Option<ReleaseReason>,
}

impl<'a> Release<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
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
                _ => return Err(a.syntax()),
            }
        }
        Ok(Release { token, reason })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let (released, lsn) = match ctx.engine.try_release_with(self.token, self.reason) {
            Ok(out) => out,
            Err(e) => return from_engine_error(&e).into(),
        };
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
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("expired", args);
        let mut count = 100;
        let mut sku = None;
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "COUNT" => count = a.next_u64_in("count", 1, i64::MAX as u64)?,
                "SKU" => sku = Some(a.next_sku()?),
                _ => return Err(a.syntax()),
            }
        }
        Ok(Expired {
            count: count.min(MAX_EXPIRED_PAGE),
            sku,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text, syntax};

    /// A token of the right shape: `{sku}` and 26 base32 characters.
    const TOKEN: &str = "{S}abcdefghijklmnopqrstuvwxyz";

    #[test]
    fn holds_parse_their_token_and_options() {
        assert_eq!(Stock::parse(&argv(&["S"])).unwrap().sku, "S");
        assert_eq!(Reservation::parse(&argv(&[TOKEN])).unwrap().token, TOKEN);
        let argv_e = argv(&[TOKEN, "5000"]);
        let e = Extend::parse(&argv_e).unwrap();
        assert_eq!((e.token, e.ms), (TOKEN, 5000));
        let argv_c = argv(&[TOKEN, "verified"]);
        let c = Commit::parse(&argv_c).unwrap();
        assert_eq!(c.check, PaymentCheck::LedgerVerified);
        assert_eq!(
            Commit::parse(&argv(&[TOKEN])).unwrap().check,
            PaymentCheck::Unverified
        );
        let argv_r = argv(&[TOKEN, "REASON", "cancel"]);
        let r = Release::parse(&argv_r).unwrap();
        assert_eq!(r.reason, ReleaseReason::parse("CANCEL"));
        assert!(r.reason.is_some());
        for words in [&["COUNT", "5", "SKU", "S"][..], &["sku", "S", "count", "5"]] {
            let argv_x = argv(words);
            let x = Expired::parse(&argv_x).unwrap();
            assert_eq!((x.count, x.sku), (5, Some("S")), "{words:?}");
        }
        let argv_page = argv(&["COUNT", "99999999"]);
        let page = Expired::parse(&argv_page).unwrap();
        assert_eq!(
            page.count, MAX_EXPIRED_PAGE,
            "a page is capped, not refused"
        );
    }

    #[test]
    fn holds_refuse_in_words() {
        assert_eq!(error_text(Stock::parse(&argv(&[]))), arity("stock"));
        assert_eq!(
            error_text(Stock::parse(&argv(&["S", "x"]))),
            syntax("stock")
        );
        assert_eq!(
            error_text(Extend::parse(&argv(&[TOKEN, "0"]))),
            "ERR ms must be between 1 and 2592000000"
        );
        assert_eq!(
            error_text(Commit::parse(&argv(&[TOKEN, "PAID"]))),
            syntax("commit")
        );
        assert_eq!(
            error_text(Release::parse(&argv(&[TOKEN, "REASON", "bored"]))),
            "ERR release reason must be one of cancel, expired, admin, rebuild"
        );
        assert_eq!(
            error_text(Release::parse(&argv(&[TOKEN, "REASON"]))),
            arity("release")
        );
        assert_eq!(
            error_text(Expired::parse(&argv(&["COUNT", "0"]))),
            "ERR count must be between 1 and 9223372036854775807"
        );
        assert!(
            error_text(Reservation::parse(&argv(&["{S}short"]))).starts_with("ERR invalid token")
        );
    }
}
