//! Typed access to a command's arguments, with the Redis-style error for each misuse.

use crate::engine::ident;
use crate::protocol::Reply;

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

    pub fn remaining(&self) -> usize {
        self.args.len() - self.pos
    }

    pub fn arity(&self) -> Reply {
        Reply::arity(self.name)
    }

    pub fn next_bytes(&mut self) -> Result<&'a [u8], Reply> {
        let a = self.args.get(self.pos).ok_or_else(|| self.arity())?;
        self.pos += 1;
        Ok(a)
    }

    /// A text argument; `field` names it in the error for bytes that are not UTF-8.
    pub fn next_str(&mut self, field: &str) -> Result<&'a str, Reply> {
        let b = self.next_bytes()?;
        std::str::from_utf8(b).map_err(|_| Reply::err(format!("ERR invalid {field}")))
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
    fn next_ident(&mut self, field: &str, valid: fn(&[u8]) -> bool) -> Result<&'a str, Reply> {
        let b = self.next_bytes()?;
        if !valid(b) || !b.is_ascii() {
            return Err(invalid(field));
        }
        // SAFETY: ASCII (checked just above, and implied by every identifier alphabet) is
        // UTF-8. `from_utf8` would check it again, byte by byte for these short strings:
        // three identifiers per RESERVE cost more than the rest of their parsing.
        Ok(unsafe { std::str::from_utf8_unchecked(b) })
    }

    pub fn next_u64(&mut self) -> Result<u64, Reply> {
        let b = self.next_bytes()?;
        parse_u64(b).ok_or_else(Reply::not_integer)
    }

    pub fn next_i64(&mut self) -> Result<i64, Reply> {
        let b = self.next_bytes()?;
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(Reply::not_integer)
    }

    /// The next argument upper-cased, for option names.
    pub fn next_keyword(&mut self) -> Result<String, Reply> {
        let b = self.next_bytes()?;
        Ok(String::from_utf8_lossy(b).to_ascii_uppercase())
    }

    pub fn done(&self) -> Result<(), Reply> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(Reply::syntax())
        }
    }
}

fn invalid(field: &str) -> Reply {
    Reply::err(format!("ERR invalid {field}"))
}

pub fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

pub fn to_u32(v: u64) -> Result<u32, Reply> {
    u32::try_from(v).map_err(|_| Reply::not_integer())
}

pub fn to_u16(v: u64) -> Result<u16, Reply> {
    u16::try_from(v).map_err(|_| Reply::not_integer())
}
