//! `SALE.*`: sale administration, fencing and rebuild from the ledger.

use super::args::{ArgError, Args};
use super::{Ctx, Outcome};
use crate::engine::{ReservationState, MAX_QTY, MAX_SHARDS, MAX_TOTAL, MAX_TTL_MS};
use crate::protocol::reply::{from_arg_error, from_engine_error};
use crate::protocol::Reply;

/// Optional creation parameters shared by SALE.CREATE and SALE.FENCE.
#[derive(Default)]
struct Opts {
    total: Option<u64>,
    shards: Option<u16>,
    ttl: Option<u64>,
    limit: Option<u32>,
}

fn parse_opts(a: &mut Args<'_>, allow_total: bool) -> Result<Opts, Reply> {
    let mut o = Opts::default();
    while a.remaining() > 0 {
        match a.next_keyword()?.as_str() {
            "TOTAL" if allow_total => o.total = Some(a.next_u64_in("total", 0, MAX_TOTAL)?),
            "SHARDS" => o.shards = Some(a.next_u16_in("shards", 1, MAX_SHARDS)?),
            "TTL" => o.ttl = Some(a.next_u64_in("ttl", 1, MAX_TTL_MS)?),
            "LIMIT" => o.limit = Some(a.next_u32_in("limit", 0, u32::MAX)?),
            _ => return Err(a.syntax()),
        }
    }
    Ok(o)
}

/// `SALE.CREATE sku total [SHARDS n] [TTL ms] [LIMIT units-per-user]`
pub struct Create<'a> {
    sku: &'a str,
    total: u64,
    opts: Opts,
}

impl<'a> Create<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("sale.create", args);
        let sku = a.next_sku()?;
        let total = a.next_u64_in("total", 0, MAX_TOTAL)?;
        let opts = parse_opts(&mut a, false)?;
        Ok(Create { sku, total, opts })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let o = self.opts;
        match ctx
            .engine
            .create_sale(self.sku, self.total, o.shards, o.ttl, o.limit)
        {
            Ok(lsn) => Outcome::logged(Reply::ok(), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `SALE.INFO sku`
pub struct Info<'a> {
    sku: &'a str,
}

impl<'a> Info<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("sale.info", args);
        let sku = a.next_sku()?;
        a.done()?;
        Ok(Info { sku })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.sale_info(self.sku) {
            Ok(v) => Outcome::logged(
                Reply::map([
                    ("total", Reply::Int(v.total as i64)),
                    ("available", Reply::Int(v.available)),
                    ("reserved", Reply::Int(v.reserved as i64)),
                    ("committed", Reply::Int(v.committed as i64)),
                    ("shards", Reply::Int(v.params.shards as i64)),
                    ("ttl_ms", Reply::Int(v.params.ttl_ms as i64)),
                    ("limit", Reply::Int(v.params.limit as i64)),
                    ("state", Reply::bulk(v.state.as_str())),
                    ("key_fingerprint", Reply::bulk(ctx.engine.key_fingerprint())),
                    (
                        "shard_available",
                        Reply::Array(v.shard_available.iter().map(|&x| Reply::Int(x)).collect()),
                    ),
                ]),
                ctx.engine.observed_lsn(),
            ),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `SALE.LIST`
pub fn list(ctx: &mut Ctx<'_>) -> Outcome {
    Reply::Array(ctx.engine.list_sales().iter().map(Reply::bulk).collect()).into()
}

/// `SALE.PAUSE sku` / `SALE.RESUME sku`
pub struct PauseResume<'a> {
    sku: &'a str,
    pause: bool,
}

impl<'a> PauseResume<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]], pause: bool) -> Result<Self, Reply> {
        let name = if pause { "sale.pause" } else { "sale.resume" };
        let mut a = Args::new(name, args);
        let sku = a.next_sku()?;
        a.done()?;
        Ok(PauseResume { sku, pause })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.set_paused(self.sku, self.pause) {
            Ok(lsn) => Outcome::logged(Reply::ok(), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `SALE.ADJUST sku delta`
pub struct Adjust<'a> {
    sku: &'a str,
    delta: i64,
}

impl<'a> Adjust<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("sale.adjust", args);
        let sku = a.next_sku()?;
        // |delta| beyond any total could never apply.
        let delta = a.next_i64_in("delta", -(MAX_TOTAL as i64), MAX_TOTAL as i64)?;
        a.done()?;
        Ok(Adjust { sku, delta })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.adjust(self.sku, self.delta) {
            Ok((total, lsn)) => Outcome::logged(Reply::Int(total as i64), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `SALE.FENCE sku [TOTAL n] [SHARDS n] [TTL ms] [LIMIT n]`
pub struct Fence<'a> {
    sku: &'a str,
    opts: Opts,
}

impl<'a> Fence<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("sale.fence", args);
        let sku = a.next_sku()?;
        let opts = parse_opts(&mut a, true)?;
        Ok(Fence { sku, opts })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let o = self.opts;
        match ctx
            .engine
            .fence(self.sku, o.total, o.shards, o.ttl, o.limit)
        {
            Ok(lsn) => Outcome::logged(Reply::ok(), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `SALE.RESTORE sku user request-id qty expires_at_ms created_at_ms [STATE s]`, `s` one
/// of `RESERVED` (default: a pending order), `COMMITTED` (paid), `RELEASED` (cancelled).
pub struct Restore<'a> {
    sku: &'a str,
    user: &'a str,
    request_id: &'a str,
    qty: u32,
    expires_at: u64,
    created_at: u64,
    state: ReservationState,
}

impl<'a> Restore<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("sale.restore", args);
        let mut r = Restore {
            sku: a.next_sku()?,
            user: a.next_user()?,
            request_id: a.next_request_id()?,
            qty: a.next_u32_in("qty", 1, MAX_QTY)?,
            expires_at: a.next_u64_in("expires_at_ms", 0, u64::MAX)?,
            created_at: a.next_u64_in("created_at_ms", 0, u64::MAX)?,
            state: ReservationState::Reserved,
        };
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "STATE" => {
                    r.state = match a.next_keyword()?.as_str() {
                        "RESERVED" => ReservationState::Reserved,
                        "COMMITTED" => ReservationState::Committed,
                        "RELEASED" => ReservationState::Released,
                        _ => {
                            return Err(from_arg_error(&ArgError::NotOneOf {
                                field: "state",
                                accepted: "RESERVED, COMMITTED or RELEASED",
                            }))
                        }
                    }
                }
                _ => return Err(a.syntax()),
            }
        }
        Ok(r)
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.restore(
            self.sku,
            self.user,
            self.request_id,
            self.qty,
            self.expires_at,
            self.created_at,
            self.state,
        ) {
            Ok((new, token, lsn)) => Outcome::logged(
                Reply::Array(vec![Reply::Int(new as i64), Reply::bulk(token.as_bytes())]),
                lsn,
            ),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `SALE.REBUILD sku total committed key-fingerprint`
pub struct Rebuild<'a> {
    sku: &'a str,
    total: u64,
    committed: u64,
    fingerprint: &'a str,
}

impl<'a> Rebuild<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("sale.rebuild", args);
        Ok(Rebuild {
            sku: a.next_sku()?,
            total: a.next_u64_in("total", 0, MAX_TOTAL)?,
            committed: a.next_u64_in("committed", 0, MAX_TOTAL)?,
            fingerprint: a.next_str("fingerprint")?,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx
            .engine
            .rebuild(self.sku, self.total, self.committed, self.fingerprint)
        {
            Ok((available, lsn)) => Outcome::logged(Reply::Int(available), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text, syntax};

    #[test]
    fn sale_create_and_fence_take_options_in_any_order() {
        for words in [
            &["S", "10", "SHARDS", "4", "TTL", "5000", "LIMIT", "2"][..],
            &["S", "10", "limit", "2", "ttl", "5000", "shards", "4"],
        ] {
            let argv_c = argv(words);
            let c = Create::parse(&argv_c).unwrap();
            assert_eq!((c.sku, c.total), ("S", 10));
            let o = c.opts;
            assert_eq!(
                (o.total, o.shards, o.ttl, o.limit),
                (None, Some(4), Some(5000), Some(2))
            );
        }
        let argv_f = argv(&["S", "TTL", "9", "TOTAL", "7"]);
        let f = Fence::parse(&argv_f).unwrap();
        assert_eq!((f.opts.total, f.opts.ttl), (Some(7), Some(9)));
        // TOTAL is FENCE's only: SALE.CREATE takes it positionally.
        assert_eq!(
            error_text(Create::parse(&argv(&["S", "1", "TOTAL", "2"]))),
            syntax("sale.create")
        );
        assert_eq!(
            error_text(Create::parse(&argv(&["S", "1", "SHARDS"]))),
            arity("sale.create")
        );
        assert_eq!(
            error_text(Create::parse(&argv(&["S"]))),
            arity("sale.create")
        );
        assert_eq!(
            error_text(Create::parse(&argv(&["S", "ten"]))),
            "ERR total is not an integer (must be between 0 and 1099511627776)"
        );
    }

    #[test]
    fn sale_admin_commands_parse_and_refuse_in_words() {
        assert_eq!(Info::parse(&argv(&["S"])).unwrap().sku, "S");
        assert_eq!(
            error_text(Info::parse(&argv(&["S", "x"]))),
            syntax("sale.info")
        );
        let argv_p = argv(&["S"]);
        let p = PauseResume::parse(&argv_p, true).unwrap();
        assert_eq!((p.sku, p.pause), ("S", true));
        assert_eq!(
            error_text(PauseResume::parse(&argv(&[]), false)),
            arity("sale.resume")
        );
        let argv_a = argv(&["S", "-3"]);
        let a = Adjust::parse(&argv_a).unwrap();
        assert_eq!((a.sku, a.delta), ("S", -3));
        assert_eq!(
            error_text(Adjust::parse(&argv(&["S", "1", "2"]))),
            syntax("sale.adjust")
        );
        let argv_r = argv(&["S", "10", "4", "ab12"]);
        let r = Rebuild::parse(&argv_r).unwrap();
        assert_eq!((r.total, r.committed, r.fingerprint), (10, 4, "ab12"));
        assert_eq!(
            error_text(Rebuild::parse(&argv(&["S", "10", "-4", "ab12"]))),
            "ERR committed must be between 0 and 1099511627776"
        );
    }

    #[test]
    fn sale_restore_parses_its_state() {
        let words = [
            "S",
            "alice",
            "r1",
            "2",
            "2000",
            "1000",
            "state",
            "committed",
        ];
        let argv_r = argv(&words);
        let r = Restore::parse(&argv_r).unwrap();
        assert_eq!(
            (r.sku, r.user, r.request_id, r.qty),
            ("S", "alice", "r1", 2)
        );
        assert_eq!((r.expires_at, r.created_at), (2000, 1000));
        assert!(matches!(r.state, ReservationState::Committed));
        let argv_r = argv(&words[..6]);
        let r = Restore::parse(&argv_r).unwrap();
        assert!(matches!(r.state, ReservationState::Reserved));
        let mut bad = words;
        bad[7] = "LOST";
        assert_eq!(
            error_text(Restore::parse(&argv(&bad))),
            "ERR state must be one of RESERVED, COMMITTED or RELEASED"
        );
        bad[6] = "COLOR";
        assert_eq!(
            error_text(Restore::parse(&argv(&bad))),
            syntax("sale.restore")
        );
        assert_eq!(
            error_text(Restore::parse(&argv(&["S", "alice", "r1", "0", "1", "1"]))),
            "ERR qty must be between 1 and 1000000"
        );
    }
}
