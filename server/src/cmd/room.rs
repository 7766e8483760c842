//! `ROOM.*`: a sale's virtual waiting room, served on the buyer's behalf by the checkout
//! service: open a room (admin), join, ask a ticket's status, leave, and the room's
//! counts. The room is engine state (`stockgate_core::engine` and `room`): every change
//! is logged before its reply, replicated and recovered like a hold.

use super::args::Args;
use super::{Ctx, Outcome};
use crate::protocol::reply::from_engine_error;
use crate::protocol::Reply;
use crate::room::config::{MAX_ADMIT_TTL_MS, MAX_RATE_PER_SEC, MAX_WAITING, OVER_ADMIT_RANGE};
use crate::room::{RoomConfig, Status};

/// `ROOM.OPEN sku [OPENS-AT ms] [RATE n] [OVERADMIT permille] [ADMIT-TTL ms]
/// [WINDOW ms] [MAX n]`
pub struct Open<'a> {
    sku: &'a str,
    config: RoomConfig,
}

impl<'a> Open<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("room.open", args);
        let sku = a.next_sku()?;
        let mut c = RoomConfig::default();
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "OPENS-AT" => c.opens_at_ms = a.next_u64_in("opens-at", 0, u64::MAX)?,
                "RATE" => c.max_rate_per_sec = a.next_u32_in("rate", 1, MAX_RATE_PER_SEC)?,
                "OVERADMIT" => {
                    c.over_admit_permille = a.next_u32_in(
                        "overadmit",
                        *OVER_ADMIT_RANGE.start(),
                        *OVER_ADMIT_RANGE.end(),
                    )?
                }
                "ADMIT-TTL" => c.admit_ttl_ms = a.next_u64_in("admit-ttl", 1, MAX_ADMIT_TTL_MS)?,
                "WINDOW" => c.expiring_window_ms = a.next_u64_in("window", 0, MAX_ADMIT_TTL_MS)?,
                "MAX" => c.max_waiting = a.next_u32_in("max", 1, MAX_WAITING)?,
                _ => return Err(a.syntax()),
            }
        }
        Ok(Open { sku, config: c })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.open_room(self.sku, self.config) {
            Ok(lsn) => Outcome::logged(Reply::ok(), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `ROOM.JOIN sku user`: `[ticket, position, eta_ms]`, the same ticket on a repeat.
pub struct Join<'a> {
    sku: &'a str,
    user: &'a str,
}

impl<'a> Join<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("room.join", args);
        let sku = a.next_sku()?;
        let user = a.next_user()?;
        a.done()?;
        Ok(Join { sku, user })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    /// The position is 0 for a buyer no longer waiting (admitted, or before the sale
    /// opens: ROOM.STATUS says which), with an ETA of 0.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.room_join(self.sku, self.user) {
            Ok((ticket, status, lsn)) => {
                let (position, eta_ms) = match status {
                    Status::Waiting { position, eta_ms } => (position, eta_ms),
                    _ => (0, 0),
                };
                Outcome::logged(
                    Reply::Array(vec![
                        Reply::Bulk(ticket.text.into_bytes()),
                        Reply::Int(i64::from(position)),
                        Reply::Int(eta_ms.min(i64::MAX as u64) as i64),
                    ]),
                    lsn,
                )
            }
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `ROOM.STATUS sku user ticket`
pub struct StatusCmd<'a> {
    sku: &'a str,
    user: &'a str,
    ticket: &'a str,
}

impl<'a> StatusCmd<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("room.status", args);
        let sku = a.next_sku()?;
        let user = a.next_user()?;
        let ticket = a.next_str("ticket")?;
        a.done()?;
        Ok(StatusCmd { sku, user, ticket })
    }

    /// Runs the parsed command against the connection's context and gives its reply: a
    /// word, then its values (ADMITTED carries the admission token RESERVE verifies,
    /// minted with this server's keyring for the sale, the user and the admission's end).
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let (status, lsn) = match ctx.engine.room_status(self.sku, self.user, self.ticket) {
            Ok(x) => x,
            Err(e) => return from_engine_error(&e).into(),
        };
        let int = |v: u64| Reply::Int(v.min(i64::MAX as u64) as i64);
        let reply = match status {
            Status::Waiting { position, eta_ms } => Reply::Array(vec![
                Reply::StaticBulk("WAITING"),
                Reply::Int(i64::from(position)),
                int(eta_ms),
            ]),
            Status::Admitted { until_ms } => {
                let token = ctx.engine.keyring().mint(self.sku, self.user, until_ms);
                Reply::Array(vec![
                    Reply::StaticBulk("ADMITTED"),
                    Reply::Bulk(token.into_bytes()),
                    int(until_ms),
                ])
            }
            Status::BeforeOpen { opens_at_ms } => {
                Reply::Array(vec![Reply::StaticBulk("BEFORE-OPEN"), int(opens_at_ms)])
            }
            Status::Reserved => Reply::Array(vec![Reply::StaticBulk("RESERVED")]),
            Status::SoldOut => Reply::Array(vec![Reply::StaticBulk("SOLDOUT")]),
            Status::Expired => Reply::Array(vec![Reply::StaticBulk("EXPIRED")]),
            Status::Left => Reply::Array(vec![Reply::StaticBulk("LEFT")]),
        };
        Outcome::logged(reply, lsn)
    }
}

/// `ROOM.LEAVE sku user`: 1 if the user gave a place up, 0 if it held none.
pub struct Leave<'a> {
    sku: &'a str,
    user: &'a str,
}

impl<'a> Leave<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("room.leave", args);
        let sku = a.next_sku()?;
        let user = a.next_user()?;
        a.done()?;
        Ok(Leave { sku, user })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match ctx.engine.room_leave(self.sku, self.user) {
            Ok((left, lsn)) => Outcome::logged(Reply::Int(i64::from(left)), lsn),
            Err(e) => from_engine_error(&e).into(),
        }
    }
}

/// `ROOM.INFO sku`
pub struct Info<'a> {
    sku: &'a str,
}

impl<'a> Info<'a> {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &'a [&'a [u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("room.info", args);
        let sku = a.next_sku()?;
        a.done()?;
        Ok(Info { sku })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let i = match ctx.engine.room_info(self.sku) {
            Ok(i) => i,
            Err(e) => return from_engine_error(&e).into(),
        };
        let int = |v: u64| Reply::Int(v.min(i64::MAX as u64) as i64);
        let c = &i.config;
        Reply::map([
            ("opens_at_ms", int(c.opens_at_ms)),
            ("rate", int(u64::from(c.max_rate_per_sec))),
            ("overadmit_permille", int(u64::from(c.over_admit_permille))),
            ("admit_ttl_ms", int(c.admit_ttl_ms)),
            ("window_ms", int(c.expiring_window_ms)),
            ("max_waiting", int(u64::from(c.max_waiting))),
            ("waiting", int(u64::from(i.waiting))),
            ("admitted", int(i.admitted)),
            ("open", Reply::Int(i64::from(i.open))),
            ("sold_out", Reply::Int(i64::from(i.sold_out))),
        ])
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text, syntax};

    #[test]
    fn open_parses_options_and_refuses_bad_ones() {
        let a = argv(&[
            "S",
            "rate",
            "5",
            "OVERADMIT",
            "1500",
            "MAX",
            "10",
            "ADMIT-TTL",
            "9",
        ]);
        let o = Open::parse(&a).unwrap();
        assert_eq!(o.config.max_rate_per_sec, 5);
        assert_eq!(o.config.over_admit_permille, 1500);
        assert_eq!(o.config.max_waiting, 10);
        assert_eq!(o.config.admit_ttl_ms, 9);
        assert_eq!(
            error_text(Open::parse(&argv(&["S", "BOGUS", "1"]))),
            syntax("room.open")
        );
        assert!(error_text(Open::parse(&argv(&["S", "RATE", "0"]))).starts_with("ERR"));
        assert!(error_text(Open::parse(&argv(&["S", "OVERADMIT", "99"]))).starts_with("ERR"));
        assert_eq!(
            error_text(Join::parse(&argv(&["S", "u", "x"]))),
            syntax("room.join")
        );
        assert!(error_text(Join::parse(&argv(&["S", "bad user"]))).contains("user"));
    }
}
