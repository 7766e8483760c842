//! Replies and their encoding in RESP2 or RESP3, and the one place where engine errors
//! become RESP errors.

use bytes::{BufMut, BytesMut};

use super::arg_error::ArgError;
use crate::engine::{ident, EngineError};
use crate::feed::FeedError;
use crate::room::RoomError;

/// One reply to a client, built by the commands and encoded for the connection's protocol version
/// by [`Reply::encode`].
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status line such as `+OK`; fixed at compile time, so it cannot hold a line break.
    Simple(&'static str),
    /// An error line without the leading `-`: `"ERR ..."`, `"NOSALE ..."`.
    Error(String),
    /// An integer (`:`).
    Int(i64),
    /// A binary-safe bulk string (`$`).
    Bulk(Vec<u8>),
    /// A bulk string fixed at compile time (the first word of a RESERVE reply, field
    /// names): the same bytes on the wire as [`Reply::Bulk`], without an allocation.
    StaticBulk(&'static str),
    /// The null reply: RESP2's null bulk string, RESP3's `_`.
    Nil,
    /// An array of replies (`*`).
    Array(Vec<Reply>),
    /// A map in RESP3, a flat field-value array in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A set in RESP3, an array in RESP2.
    Set(Vec<Reply>),
}

/// Equal when the client would read the same value: a [`Reply::StaticBulk`] equals the
/// [`Reply::Bulk`] of the same bytes.
impl PartialEq for Reply {
    fn eq(&self, other: &Reply) -> bool {
        use Reply::*;
        match (self, other) {
            (Simple(a), Simple(b)) => a == b,
            (Error(a), Error(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            (Nil, Nil) => true,
            (Array(a), Array(b)) | (Set(a), Set(b)) => a == b,
            (Map(a), Map(b)) => a == b,
            (a, b) => matches!((a.as_bulk(), b.as_bulk()), (Some(x), Some(y)) if x == y),
        }
    }
}

impl Reply {
    /// The `+OK` status.
    pub fn ok() -> Reply {
        Reply::Simple("OK")
    }

    /// An error reply from its line without the leading `-` (the first word is the error code).
    pub fn err(s: impl Into<String>) -> Reply {
        Reply::Error(s.into())
    }

    /// A bulk string copied from any bytes or text.
    pub fn bulk(s: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(s.as_ref().to_vec())
    }

    /// Redis's `ERR syntax error`, for arguments that match no form of the command.
    pub fn syntax() -> Reply {
        Reply::err("ERR syntax error")
    }

    /// Redis's wrong-number-of-arguments error for `cmd`, worded as Redis words it so clients
    /// recognise it.
    pub fn arity(cmd: &str) -> Reply {
        Reply::err(format!(
            "ERR wrong number of arguments for '{}' command",
            cmd.to_ascii_lowercase()
        ))
    }

    /// Whether this is an error reply (counted per error code, and never cached as a success).
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The bytes of a bulk string, whichever way it is held.
    pub fn as_bulk(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::StaticBulk(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// Builds a map from `(&str, Reply)` pairs with bulk-string keys.
    pub fn map<I: IntoIterator<Item = (&'static str, Reply)>>(fields: I) -> Reply {
        Reply::Map(
            fields
                .into_iter()
                .map(|(k, v)| (Reply::bulk(k), v))
                .collect(),
        )
    }

    /// Appends the reply's wire form to `out`: RESP3 types when `proto` is 3, their RESP2
    /// equivalents otherwise.
    pub fn encode(&self, proto: u8, out: &mut BytesMut) {
        match self {
            Reply::Simple(s) => {
                // Fixed at compile time, so a line break here is a bug, not input.
                debug_assert!(!s.contains(['\r', '\n']), "simple string {s:?}");
                out.put_u8(b'+');
                out.put_slice(s.as_bytes());
                out.put_slice(b"\r\n");
            }
            Reply::Error(s) => {
                // Clients split the code off the first word: an empty error has none.
                debug_assert!(!s.is_empty(), "an error reply without a code");
                out.put_u8(b'-');
                // An error line must not break the framing.
                for &b in s.as_bytes() {
                    out.put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
                }
                out.put_slice(b"\r\n");
            }
            Reply::Int(i) => {
                out.put_u8(b':');
                put_num(out, *i);
            }
            Reply::Bulk(b) => put_bulk(out, b),
            Reply::StaticBulk(s) => put_bulk(out, s.as_bytes()),
            Reply::Nil => {
                if proto >= 3 {
                    out.put_slice(b"_\r\n");
                } else {
                    out.put_slice(b"$-1\r\n");
                }
            }
            Reply::Array(items) => {
                out.put_u8(b'*');
                put_num(out, items.len() as i64);
                for i in items {
                    i.encode(proto, out);
                }
            }
            Reply::Set(items) => {
                out.put_u8(if proto >= 3 { b'~' } else { b'*' });
                put_num(out, items.len() as i64);
                for i in items {
                    i.encode(proto, out);
                }
            }
            Reply::Map(pairs) => {
                if proto >= 3 {
                    out.put_u8(b'%');
                    put_num(out, pairs.len() as i64);
                } else {
                    out.put_u8(b'*');
                    put_num(out, 2 * pairs.len() as i64);
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
        }
    }
}

fn put_bulk(out: &mut BytesMut, b: &[u8]) {
    out.put_u8(b'$');
    put_num(out, b.len() as i64);
    out.put_slice(b);
    out.put_slice(b"\r\n");
}

/// A number and its CRLF: replies carry several (lengths, expiry, shard), so this runs a
/// few times per command (`itoa` writes two digits per step from a table).
fn put_num(out: &mut BytesMut, n: i64) {
    if (0..10).contains(&n) {
        out.put_slice(&[b'0' + n as u8, b'\r', b'\n']);
        return;
    }
    let mut buf = itoa::Buffer::new();
    out.put_slice(buf.format(n).as_bytes());
    out.put_slice(b"\r\n");
}

/// Every engine error's wire form. The first word is the error code clients match on.
pub fn from_engine_error(e: &EngineError) -> Reply {
    let s = match e {
        EngineError::Invalid(field) => format!("ERR {}", ident::invalid_message(field)),
        EngineError::NoSale => "NOSALE no such sale".into(),
        EngineError::Fenced => {
            "FENCED state unproven; rebuild the sale from the ledger first".into()
        }
        EngineError::Paused => "PAUSED sale is paused".into(),
        EngineError::Denied(why) => format!("DENIED {why}"),
        EngineError::Exists => "EXISTS sale exists with different parameters".into(),
        EngineError::NoReservation => "NORES no such reservation in state RESERVED".into(),
        EngineError::Expired => "EXPIRED reservation expired".into(),
        EngineError::LateCommit { expires_at_ms } => format!(
            "EXPIRED reservation expired at {expires_at_ms} ms; if the ledger accepted the \
             payment before then, send COMMIT token VERIFIED"
        ),
        EngineError::Released => "RELEASED units already went back to stock".into(),
        EngineError::Argument(why) => format!("ERR {why}"),
        EngineError::NotEnoughAvailable => "ERR not enough available units".into(),
        EngineError::NotFenced => "ERR sale is not fenced".into(),
        EngineError::FingerprintMismatch { .. } => format!("ERR {e}"),
        EngineError::Moving(sku) => {
            format!("TRYAGAIN the sale {sku} is moving to another group; retry")
        }
        EngineError::NotMoving => "ERR the sale is not frozen for a move".into(),
        EngineError::Import(why) => format!("ERR {why}"),
        EngineError::NoRoom => "NOROOM no waiting room for this sale".into(),
        EngineError::RoomExists => "EXISTS room exists with different settings".into(),
        EngineError::RoomConfig(why) => format!("ERR {why}"),
        EngineError::Room(why) => from_room_error(why),
    };
    Reply::Error(s)
}

/// A waiting room's refusal: a code a checkout service can act on (show "sold out",
/// retry later, re-join), then the room's words.
fn from_room_error(e: &RoomError) -> String {
    let code = match e {
        RoomError::InvalidUser => return format!("ERR {}", ident::invalid_message("user")),
        RoomError::QueueFull { .. } => "QUEUEFULL",
        RoomError::TooManyJoins { .. } => "TOOMANYJOINS",
        RoomError::SoldOut => "SOLDOUT",
        RoomError::NotInQueue => "NOTQUEUED",
        RoomError::Ticket(_) | RoomError::StaleTicket => "BADTICKET",
    };
    format!("{code} {e}")
}

/// Every argument error's wire form: `ERR` and the message naming the argument and what
/// it accepts.
pub fn from_arg_error(e: &ArgError) -> Reply {
    Reply::Error(format!("ERR {e}"))
}

/// Every feed error's wire form. `Trimmed` keeps the word `trimmed` for consumers to
/// match on (they must resynchronise from the ledger).
pub fn from_feed_error(e: &FeedError) -> Reply {
    match e.code() {
        Some(code) => Reply::Error(format!("{code} {e}")),
        // The message starts with its own code (NOGROUP, BUSYGROUP), as Redis's does.
        None => Reply::Error(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(r: &Reply, proto: u8) -> String {
        let mut b = BytesMut::new();
        r.encode(proto, &mut b);
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn encodings() {
        assert_eq!(enc(&Reply::Int(-42), 2), ":-42\r\n");
        assert_eq!(enc(&Reply::Int(i64::MIN), 2), format!(":{}\r\n", i64::MIN));
        assert_eq!(enc(&Reply::Nil, 2), "$-1\r\n");
        assert_eq!(enc(&Reply::Nil, 3), "_\r\n");
        let m = Reply::map([("a", Reply::Int(1))]);
        assert_eq!(enc(&m, 2), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(&m, 3), "%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(&Reply::err("ERR a\r\nb"), 2), "-ERR a  b\r\n");
    }

    #[test]
    fn a_static_bulk_is_a_bulk_on_the_wire_and_in_comparisons() {
        for proto in [2, 3] {
            assert_eq!(
                enc(&Reply::StaticBulk("RESERVED"), proto),
                "$8\r\nRESERVED\r\n"
            );
        }
        assert_eq!(Reply::StaticBulk("LIMIT"), Reply::bulk("LIMIT"));
        assert_eq!(Reply::bulk("LIMIT"), Reply::StaticBulk("LIMIT"));
        assert_ne!(Reply::StaticBulk("LIMIT"), Reply::Simple("LIMIT"));
        assert_ne!(Reply::StaticBulk("LIMIT"), Reply::bulk("LIMITS"));
    }
}
