//! Typed access to a command's arguments, with the Redis-style error for each misuse.

use crate::engine::ident;
pub use crate::protocol::arg_error::ArgError;
use crate::protocol::reply::from_arg_error;
use crate::protocol::Reply;

/// Parses `b` as an integer in `min..=max`, telling an integer out of range (`-1`,
/// `10^30` written out) from something that is no integer.
pub fn int_in(b: &[u8], field: &'static str, min: i128, max: i128) -> Result<i128, ArgError> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ArgError::NotInteger { field, min, max });
    }
    // Digits that do not parse are too many for an i128: out of range as well.
    let v = std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<i128>().ok());
    match v {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(ArgError::OutOfRange { field, min, max }),
    }
}

/// [`int_in`] for an `i64` range, as a reply.
pub fn i64_in(b: &[u8], field: &'static str, min: i64, max: i64) -> Result<i64, Reply> {
    let v = int_in(b, field, min.into(), max.into()).map_err(|e| from_arg_error(&e))?;
    i64::try_from(v).map_err(|_| out_of_range(field, min.into(), max.into()))
}

/// [`int_in`] for a `u64` range, as a reply.
pub fn u64_in(b: &[u8], field: &'static str, min: u64, max: u64) -> Result<u64, Reply> {
    let v = int_in(b, field, min.into(), max.into()).map_err(|e| from_arg_error(&e))?;
    u64::try_from(v).map_err(|_| out_of_range(field, min.into(), max.into()))
}

/// A cursor over a command's arguments that turns a missing one into the arity error
/// and a leftover one into a syntax error, so each parser reads its words in order.
pub struct Args<'a> {
    name: &'static str,
    args: &'a [&'a [u8]],
    pos: usize,
}

impl<'a> Args<'a> {
    /// `args` excludes the command name.
    pub fn new(name: &'static str, args: &'a [&'a [u8]]) -> Self {
        Args { name, args, pos: 0 }
    }

    /// Arguments not read yet.
    pub fn remaining(&self) -> usize {
        self.args.len() - self.pos
    }

    /// The `wrong number of arguments` error for this command.
    pub fn arity(&self) -> Reply {
        Reply::arity(self.name)
    }

    /// The next argument as it came; the arity error when there is none.
    pub fn next_bytes(&mut self) -> Result<&'a [u8], Reply> {
        let a = self.args.get(self.pos).ok_or_else(|| self.arity())?;
        self.pos += 1;
        Ok(a)
    }

    /// A text argument; `field` names it in the error for bytes that are not UTF-8.
    pub fn next_str(&mut self, field: &'static str) -> Result<&'a str, Reply> {
        let b = self.next_bytes()?;
        std::str::from_utf8(b).map_err(|_| from_arg_error(&ArgError::NotText { field }))
    }

    /// A sku (PROTOCOL.md, Identifiers), or `-ERR invalid sku`.
    pub fn next_sku(&mut self) -> Result<&'a str, Reply> {
        self.next_ident("sku", ident::valid_sku)
    }

    /// A user id, or `-ERR invalid user`.
    pub fn next_user(&mut self) -> Result<&'a str, Reply> {
        self.next_ident("user", ident::valid_user)
    }

    /// A request id (the idempotency key), or `-ERR invalid request-id`.
    pub fn next_request_id(&mut self) -> Result<&'a str, Reply> {
        self.next_ident("request-id", ident::valid_request_id)
    }

    /// A reservation token's shape (`{sku}` + 26 base32), or `-ERR invalid token`.
    pub fn next_token(&mut self) -> Result<&'a str, Reply> {
        self.next_ident("token", ident::valid_token)
    }

    /// The one place identifiers are checked, so every command refuses a bad one the same
    /// way and before it looks anything up.
    fn next_ident(
        &mut self,
        field: &'static str,
        valid: fn(&[u8]) -> bool,
    ) -> Result<&'a str, Reply> {
        let b = self.next_bytes()?;
        if !valid(b) || !b.is_ascii() {
            return Err(invalid(field));
        }
        // SAFETY: ASCII (checked just above, and implied by every identifier alphabet) is
        // UTF-8. `from_utf8` would check it again, byte by byte for these short strings:
        // three identifiers per RESERVE cost more than the rest of their parsing.
        #[allow(unsafe_code)]
        let text = unsafe { std::str::from_utf8_unchecked(b) };
        Ok(text)
    }

    /// An integer argument in `min..=max`. The error names `field` and the range in
    /// words, and tells an integer out of range (`-1`, `10^30`) from a non-integer.
    pub fn next_int_in(
        &mut self,
        field: &'static str,
        min: i128,
        max: i128,
    ) -> Result<i128, Reply> {
        let b = self.next_bytes()?;
        int_in(b, field, min, max).map_err(|e| from_arg_error(&e))
    }

    /// [`Self::next_int_in`] for an unsigned field.
    pub fn next_u64_in(&mut self, field: &'static str, min: u64, max: u64) -> Result<u64, Reply> {
        let v = self.next_int_in(field, min.into(), max.into())?;
        u64::try_from(v).map_err(|_| out_of_range(field, min.into(), max.into()))
    }

    /// [`Self::next_int_in`] for a `u32` field.
    pub fn next_u32_in(&mut self, field: &'static str, min: u32, max: u32) -> Result<u32, Reply> {
        let v = self.next_int_in(field, min.into(), max.into())?;
        u32::try_from(v).map_err(|_| out_of_range(field, min.into(), max.into()))
    }

    /// [`Self::next_int_in`] for a `u16` field.
    pub fn next_u16_in(&mut self, field: &'static str, min: u16, max: u16) -> Result<u16, Reply> {
        let v = self.next_int_in(field, min.into(), max.into())?;
        u16::try_from(v).map_err(|_| out_of_range(field, min.into(), max.into()))
    }

    /// [`Self::next_int_in`] for a signed field.
    pub fn next_i64_in(&mut self, field: &'static str, min: i64, max: i64) -> Result<i64, Reply> {
        let v = self.next_int_in(field, min.into(), max.into())?;
        i64::try_from(v).map_err(|_| out_of_range(field, min.into(), max.into()))
    }

    /// The next argument upper-cased, for option names.
    /// The next argument upper-cased, for matching option words case-insensitively.
    pub fn next_keyword(&mut self) -> Result<String, Reply> {
        let b = self.next_bytes()?;
        Ok(String::from_utf8_lossy(b).to_ascii_uppercase())
    }

    /// The syntax error when arguments are left over.
    pub fn done(&self) -> Result<(), Reply> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(self.syntax())
        }
    }

    /// This command's syntax error, with its usage ([`syntax_error`]).
    pub fn syntax(&self) -> Reply {
        syntax_error(self.name)
    }
}

/// Redis's `ERR syntax error`, followed by the command's usage (`cmd`: the lower-case
/// name, or `command|subcommand`): a client that sent a word in the wrong place learns
/// what the command takes without looking it up. Every parser's syntax error comes from
/// here.
pub fn syntax_error(cmd: &str) -> Reply {
    match super::command_table::usage(cmd) {
        Some(usage) => Reply::err(format!("ERR syntax error: {usage}")),
        None => Reply::syntax(),
    }
}

fn invalid(field: &'static str) -> Reply {
    from_arg_error(&ArgError::Invalid { field })
}

fn out_of_range(field: &'static str, min: i128, max: i128) -> Reply {
    from_arg_error(&ArgError::OutOfRange { field, min, max })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::reserve::Reserve;
    use crate::cmd::sale::{Adjust, Create};

    fn err(r: Result<impl Sized, Reply>) -> String {
        match r {
            Err(Reply::Error(e)) => e,
            Err(other) => panic!("not an error reply: {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    fn reserve(extra: &[&str]) -> String {
        let mut argv: Vec<&[u8]> = vec![b"S", b"alice", b"adm", b"r1"];
        argv.extend(extra.iter().map(|a| a.as_bytes()));
        err(Reserve::parse(&argv))
    }

    #[test]
    fn qty_out_of_range_says_the_range() {
        let range = "ERR qty must be between 1 and 1000000";
        for q in ["-1", "0", "1000001", "1000000000000000000000000000000"] {
            assert_eq!(reserve(&["QTY", q]), range, "QTY {q}");
        }
        // Beyond any i128 too.
        assert_eq!(reserve(&["QTY", &"9".repeat(60)]), range);
        assert_eq!(
            reserve(&["QTY", "two"]),
            "ERR qty is not an integer (must be between 1 and 1000000)"
        );
        assert_eq!(
            reserve(&["QTY", "-"]),
            "ERR qty is not an integer (must be between 1 and 1000000)"
        );
    }

    #[test]
    fn sale_options_out_of_range_say_the_range() {
        for (opt, v, want) in [
            ("SHARDS", "0", "ERR shards must be between 1 and 1024"),
            ("SHARDS", "100000", "ERR shards must be between 1 and 1024"),
            ("TTL", "0", "ERR ttl must be between 1 and 2592000000"),
            ("LIMIT", "-1", "ERR limit must be between 0 and 4294967295"),
        ] {
            let argv: Vec<&[u8]> = vec![b"S", b"10", opt.as_bytes(), v.as_bytes()];
            assert_eq!(err(Create::parse(&argv)), want, "{opt} {v}");
        }
        let argv: Vec<&[u8]> = vec![b"S", b"10000000000000"];
        assert_eq!(
            err(Create::parse(&argv)),
            "ERR total must be between 0 and 1099511627776"
        );
        let argv: Vec<&[u8]> = vec![b"S", b"-9223372036854775808"];
        assert_eq!(
            err(Adjust::parse(&argv)),
            "ERR delta must be between -1099511627776 and 1099511627776"
        );
    }

    #[test]
    fn in_range_values_parse() {
        let argv: [&[u8]; 3] = [b"1000000", b"-5", b"0"];
        let mut a = Args::new("t", &argv);
        assert_eq!(a.next_u32_in("qty", 1, 1_000_000), Ok(1_000_000));
        assert_eq!(a.next_i64_in("delta", -10, 10), Ok(-5));
        assert_eq!(a.next_u64_in("limit", 0, 3), Ok(0));
    }

    #[test]
    fn an_invalid_identifier_says_the_rule() {
        let long = "A".repeat(100);
        let argv: Vec<&[u8]> = vec![long.as_bytes(), b"alice", b"adm", b"r1"];
        assert_eq!(
            err(Reserve::parse(&argv)),
            "ERR invalid sku: must be 1 to 64 characters of A-Z a-z 0-9 _ . : -"
        );
        let argv: Vec<&[u8]> = vec![b"S", b"bad|user", b"adm", b"r1"];
        assert_eq!(
            err(Reserve::parse(&argv)),
            "ERR invalid user: must be 1 to 128 printable ASCII characters, no space, | { or }"
        );
        let argv: [&[u8]; 1] = [b"{S}short"];
        let mut a = Args::new("commit", &argv);
        assert_eq!(
            err(a.next_token()),
            "ERR invalid token: must be {sku} followed by 26 characters of a-z and 2-7, as \
             RESERVE returned it"
        );
    }
}
