//! `RESERVE sku user admission-token request-id [QTY n] [WITHLIMIT]`

use super::args::Args;
use super::{Ctx, Outcome};
use crate::engine::{ReserveOutcome, ReserveRequest, MAX_QTY};
use crate::protocol::reply::from_engine_error;
use crate::protocol::Reply;

/// `RESERVE sku user admission-token request-id [QTY n] [WITHLIMIT]`: holds units for one buyer,
/// idempotent per request id.
pub struct Reserve<'a> {
    sku: &'a str,
    user: &'a str,
    admission: &'a [u8],
    request_id: &'a str,
    qty: u32,
    /// `WITHLIMIT`: a LIMIT reply also says the limit and the units the user holds. Asked
    /// for, because clients read every element after `LIMIT` as a token.
    with_limit: bool,
}

impl<'a> Reserve<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("reserve", args);
        let sku = a.next_sku()?;
        let user = a.next_user()?;
        let admission = a.next_bytes()?;
        let request_id = a.next_request_id()?;
        let mut qty = 1;
        let mut with_limit = false;
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "QTY" => qty = a.next_u32_in("qty", 1, MAX_QTY)?,
                "WITHLIMIT" => with_limit = true,
                _ => return Err(a.syntax()),
            }
        }
        Ok(Reserve {
            sku,
            user,
            admission,
            request_id,
            qty,
            with_limit,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let req = ReserveRequest {
            sku: self.sku,
            user: self.user,
            admission: self.admission,
            request_id: self.request_id,
            qty: self.qty,
        };
        match ctx.engine.reserve(&req) {
            Ok((outcome, lsn)) => {
                ctx.conn
                    .recorder
                    .count_reserve(&ctx.shared.metrics, self.sku, &outcome);
                // A sellout is read from counters other loops' RESERVEs may have moved
                // before logging: it waits for those records (`Engine::observed_lsn`).
                let lsn = match outcome {
                    ReserveOutcome::SoldOut => ctx.engine.observed_lsn(),
                    _ => lsn,
                };
                let reply = match outcome {
                    ReserveOutcome::Reserved {
                        token,
                        expires_at_ms,
                        shard,
                    } => Reply::Array(vec![
                        Reply::StaticBulk("RESERVED"),
                        Reply::bulk(token.as_bytes()),
                        Reply::Int(expires_at_ms as i64),
                        Reply::Int(shard as i64),
                    ]),
                    ReserveOutcome::Replay {
                        token,
                        expires_at_ms,
                        shard,
                    } => Reply::Array(vec![
                        Reply::StaticBulk("REPLAY"),
                        Reply::bulk(token.as_bytes()),
                        Reply::Int(expires_at_ms as i64),
                        Reply::Int(shard as i64),
                    ]),
                    ReserveOutcome::SoldOut => Reply::Array(vec![Reply::StaticBulk("SOLDOUT")]),
                    ReserveOutcome::Limit { live, limit, held } => {
                        let tokens = live.iter().map(|t| Reply::bulk(t.as_bytes()));
                        if self.with_limit {
                            Reply::Array(vec![
                                Reply::StaticBulk("LIMIT"),
                                Reply::Int(limit.into()),
                                Reply::Int(i64::try_from(held).unwrap_or(i64::MAX)),
                                Reply::Array(tokens.collect()),
                            ])
                        } else {
                            let mut v = vec![Reply::StaticBulk("LIMIT")];
                            v.extend(tokens);
                            Reply::Array(v)
                        }
                    }
                };
                Outcome::logged(reply, lsn)
            }
            Err(e) => {
                ctx.shared.metrics.count_reserve_error(self.sku, &e);
                from_engine_error(&e).into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text, syntax};

    #[test]
    fn reserve_parses_options_in_any_order() {
        for words in [
            &["S", "alice", "adm", "r1", "QTY", "3", "WITHLIMIT"][..],
            &["S", "alice", "adm", "r1", "withlimit", "qty", "3"],
        ] {
            let argv_r = argv(words);
            let r = Reserve::parse(&argv_r).unwrap();
            assert_eq!(
                (r.sku, r.user, r.admission, r.request_id),
                ("S", "alice", &b"adm"[..], "r1")
            );
            assert_eq!((r.qty, r.with_limit), (3, true), "{words:?}");
        }
        let argv_r = argv(&["S", "alice", "adm", "r1"]);
        let r = Reserve::parse(&argv_r).unwrap();
        assert_eq!((r.qty, r.with_limit), (1, false));
    }

    #[test]
    fn reserve_refuses_in_words() {
        let err = |w: &[&str]| error_text(Reserve::parse(&argv(w)));
        assert_eq!(err(&["S", "alice", "adm"]), arity("reserve"));
        assert_eq!(err(&["S", "alice", "adm", "r1", "QTY"]), arity("reserve"));
        assert_eq!(err(&["S", "alice", "adm", "r1", "FAST"]), syntax("reserve"));
        assert_eq!(
            err(&["S", "alice", "adm", "r1", "QTY", "0"]),
            "ERR qty must be between 1 and 1000000"
        );
        assert!(err(&["S", "al ice", "adm", "r1"]).starts_with("ERR invalid user"));
        assert!(err(&["S", "alice", "adm", ""]).starts_with("ERR invalid request-id"));
    }
}
