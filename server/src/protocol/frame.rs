//! Request framing. Clients send commands as RESP arrays of bulk strings (in RESP2 and
//! RESP3 alike) or as inline text lines. This parser enforces the limits *while* reading
//! the headers, so a client announcing a 2 GB bulk or a million arguments is refused at
//! once instead of being buffered: the reason it is hand-written rather than the
//! `redis-protocol` decoder (which is used in tests as an independent oracle).

use bytes::{Bytes, BytesMut};
use thiserror::Error;

/// Bounds on what one request may announce, checked while its headers are read so an oversized
/// request is refused before it is buffered. Sizes in bytes.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest bulk string argument.
    pub max_bulk: usize,
    /// Most arguments in one command.
    pub max_args: usize,
    /// Longest inline command line.
    pub max_inline: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 1024 * 1024,
            max_args: 1024,
            max_inline: 64 * 1024,
        }
    }
}

/// A framing error: the reply is `-ERR Protocol error: <why>` and the connection closes.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// A framing limit a client broke; the connection closes after the error reply.
#[derive(Debug)]
pub enum Refusal {
    /// Malformed RESP.
    Protocol(ProtocolError),
    /// An unfinished command over `--max-query-buffer`.
    QueryBuffer,
}

fn perr(s: impl Into<String>) -> ProtocolError {
    ProtocolError(s.into())
}

/// Header lines (`*123\r\n`, `$45\r\n`) longer than this are malformed.
const MAX_HEADER: usize = 32;

fn find_crlf(buf: &[u8], from: usize, max: usize) -> Result<Option<usize>, ()> {
    let end = buf.len().min(from + max);
    match buf[from..end].iter().position(|&b| b == b'\r') {
        Some(i) => Ok(Some(from + i)),
        None if buf.len() >= from + max => Err(()),
        None => Ok(None),
    }
}

fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    // One pass: every header of every command goes through here.
    let mut v: i64 = 0;
    for &d in digits {
        let x = d.wrapping_sub(b'0');
        if x > 9 {
            return None;
        }
        v = v * 10 + x as i64;
    }
    Some(if neg { -v } else { v })
}

/// Outcome of looking at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole command (possibly empty: `*0`, a blank inline line) and its length.
    Command(Vec<Bytes>),
    /// More bytes are needed.
    Incomplete,
}

/// Takes one command off the front of `buf` if it is complete. On `Incomplete` nothing is
/// consumed. Arguments are zero-copy slices of the consumed bytes.
pub fn parse_command(buf: &mut BytesMut, limits: &Limits) -> Result<Parsed, ProtocolError> {
    let mut argv = Vec::new();
    if parse_command_into(buf, limits, &mut argv)? {
        Ok(Parsed::Command(argv))
    } else {
        Ok(Parsed::Incomplete)
    }
}

/// What [`parse_frame`] found at the front of the buffer (nothing is consumed).
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// More bytes are needed.
    Incomplete,
    /// A RESP array of `len` bytes; its arguments are the byte ranges left in `ranges`
    /// (none for `*0` or `*-1`).
    Array {
        /// Bytes the whole array takes in the buffer, headers included.
        len: usize,
    },
    /// An inline command line of `len` bytes and its words, unquoted (so owned).
    Inline {
        /// Bytes the line takes in the buffer, its line ending included.
        len: usize,
        /// The line's words, quotes and escapes resolved.
        args: Vec<Vec<u8>>,
    },
}

/// Looks for one whole command at the front of `buf` without consuming anything: the
/// caller dispatches on slices of its own buffer (`ranges`, cleared first) and then
/// advances past `len`. No reference count per argument, no allocation once `ranges`
/// has grown to the longest command of the connection.
pub fn parse_frame(
    buf: &[u8],
    limits: &Limits,
    ranges: &mut Vec<(usize, usize)>,
) -> Result<Frame, ProtocolError> {
    ranges.clear();
    if buf.is_empty() {
        return Ok(Frame::Incomplete);
    }
    if buf[0] != b'*' {
        return parse_inline(buf, limits);
    }
    let Some((n, mut pos)) = parse_count(buf, limits)? else {
        return Ok(Frame::Incomplete);
    };
    if n <= 0 {
        return Ok(Frame::Array { len: pos });
    }
    let n = n as usize;
    ranges.reserve(n);
    for _ in 0..n {
        let Some((start, stop)) = parse_bulk(buf, pos, limits)? else {
            return Ok(Frame::Incomplete);
        };
        ranges.push((start, stop));
        pos = stop + 2;
    }
    debug_assert!(pos <= buf.len() && ranges.len() == n);
    debug_assert!(ranges
        .windows(2)
        .all(|w| w[0].0 <= w[0].1 && w[0].1 + 2 < w[1].0));
    Ok(Frame::Array { len: pos })
}

/// The `*<n>\r\n` header at the front of `buf`: the argument count and where the first
/// argument begins; `None` while incomplete.
#[inline]
fn parse_count(buf: &[u8], limits: &Limits) -> Result<Option<(i64, usize)>, ProtocolError> {
    let Some(end) =
        find_crlf(buf, 1, MAX_HEADER).map_err(|_| perr("too big mbulk count string"))?
    else {
        return Ok(None);
    };
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if buf[end + 1] != b'\n' {
        return Err(perr("invalid mbulk count"));
    }
    let n = parse_int(&buf[1..end]).ok_or_else(|| perr("invalid multibulk length"))?;
    if n > limits.max_args as i64 {
        return Err(perr("invalid multibulk length"));
    }
    Ok(Some((n, end + 2)))
}

/// The bulk string `$<len>\r\n<bytes>\r\n` at `pos`: the range of its bytes; `None`
/// while incomplete.
#[inline]
fn parse_bulk(
    buf: &[u8],
    pos: usize,
    limits: &Limits,
) -> Result<Option<(usize, usize)>, ProtocolError> {
    if pos >= buf.len() {
        return Ok(None);
    }
    if buf[pos] != b'$' {
        let got = buf[pos];
        let shown = if got.is_ascii_graphic() {
            (got as char).to_string()
        } else {
            format!("\\x{got:02x}")
        };
        return Err(perr(format!("expected '$', got '{shown}'")));
    }
    let Some(hend) =
        find_crlf(buf, pos + 1, MAX_HEADER).map_err(|_| perr("too big bulk count string"))?
    else {
        return Ok(None);
    };
    if buf.len() < hend + 2 {
        return Ok(None);
    }
    if buf[hend + 1] != b'\n' {
        return Err(perr("invalid bulk length"));
    }
    let len = parse_int(&buf[pos + 1..hend]).ok_or_else(|| perr("invalid bulk length"))?;
    if len < 0 || len as usize > limits.max_bulk {
        return Err(perr("invalid bulk length"));
    }
    let start = hend + 2;
    let stop = start + len as usize;
    if buf.len() < stop + 2 {
        return Ok(None);
    }
    if &buf[stop..stop + 2] != b"\r\n" {
        return Err(perr("bulk string not terminated by CRLF"));
    }
    Ok(Some((start, stop)))
}

/// [`parse_command`] into a caller-owned vector (cleared first): the arguments as
/// `Bytes` that own their share of the buffer, for readers that keep them (replication
/// links, subscribers). Returns `Ok(true)` with `argv` filled when a whole command
/// (possibly empty) was taken off `buf`, `Ok(false)` when more bytes are needed (nothing
/// consumed). The client connection uses [`parse_frame`] instead.
pub fn parse_command_into(
    buf: &mut BytesMut,
    limits: &Limits,
    argv: &mut Vec<Bytes>,
) -> Result<bool, ProtocolError> {
    argv.clear();
    let mut ranges = Vec::new();
    match parse_frame(buf, limits, &mut ranges)? {
        Frame::Incomplete => Ok(false),
        Frame::Array { len } => {
            assert!(
                len <= buf.len(),
                "frame of {len} bytes in a buffer of {}",
                buf.len()
            );
            let frame = buf.split_to(len).freeze();
            argv.extend(ranges.iter().map(|&(a, b)| frame.slice(a..b)));
            Ok(true)
        }
        Frame::Inline { len, args } => {
            let _ = buf.split_to(len);
            argv.extend(args.into_iter().map(Bytes::from));
            Ok(true)
        }
    }
}

/// Inline commands: one text line, arguments separated by blanks, with Redis-style
/// double and single quotes.
fn parse_inline(buf: &[u8], limits: &Limits) -> Result<Frame, ProtocolError> {
    let scan = buf.len().min(limits.max_inline + 1);
    let Some(nl) = buf[..scan].iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.max_inline {
            return Err(perr("too big inline request"));
        }
        return Ok(Frame::Incomplete);
    };
    let mut text = &buf[..nl];
    if text.last() == Some(&b'\r') {
        text = &text[..text.len() - 1];
    }
    let args = split_args(text).ok_or_else(|| perr("unbalanced quotes in request"))?;
    if args.len() > limits.max_args {
        return Err(perr("invalid multibulk length"));
    }
    Ok(Frame::Inline { len: nl + 1, args })
}

fn split_args(s: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        while i < s.len() && s[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= s.len() {
            break;
        }
        let mut cur = Vec::new();
        let mut quote: Option<u8> = None;
        loop {
            if i >= s.len() {
                if quote.is_some() {
                    return None;
                }
                break;
            }
            let c = s[i];
            match quote {
                Some(q) if c == q => {
                    i += 1;
                    // A closing quote must be followed by a blank or the end.
                    if i < s.len() && !s[i].is_ascii_whitespace() {
                        return None;
                    }
                    break;
                }
                Some(b'"') if c == b'\\' && i + 1 < s.len() => {
                    let n = s[i + 1];
                    cur.push(match n {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        other => other,
                    });
                    i += 2;
                }
                Some(_) => {
                    cur.push(c);
                    i += 1;
                }
                None if c.is_ascii_whitespace() => break,
                None if (c == b'"' || c == b'\'') && cur.is_empty() => {
                    quote = Some(c);
                    i += 1;
                }
                None => {
                    cur.push(c);
                    i += 1;
                }
            }
        }
        out.push(cur);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(b: &[u8]) -> Result<Parsed, ProtocolError> {
        let mut buf = BytesMut::from(b);
        parse_command(&mut buf, &Limits::default())
    }

    fn args(v: &[&str]) -> Parsed {
        Parsed::Command(
            v.iter()
                .map(|s| Bytes::copy_from_slice(s.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn multibulk() {
        assert_eq!(
            parse(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n").unwrap(),
            args(&["ECHO", "hi"])
        );
        assert_eq!(
            parse(b"*2\r\n$4\r\nECHO\r\n$2\r\nh").unwrap(),
            Parsed::Incomplete
        );
        assert_eq!(parse(b"*0\r\n").unwrap(), Parsed::Command(vec![]));
        assert_eq!(parse(b"*").unwrap(), Parsed::Incomplete);
    }

    #[test]
    fn limits_refuse_early() {
        assert!(
            parse(b"*1\r\n$2147483648\r\n").is_err(),
            "2 GB bulk refused from its header"
        );
        assert!(
            parse(b"*100000\r\n").is_err(),
            "too many args refused from the header"
        );
        assert!(parse(b"*1\r\n$-5\r\n").is_err());
        assert!(parse(b"*1\r\n:5\r\n").is_err());
        assert!(parse(b"*x\r\n").is_err());
        assert!(parse(b"*1\r\n$3\r\nabcXY").is_err());
        assert!(parse(&[b'*'; 100]).is_err());
        let big = vec![b'a'; 70 * 1024];
        assert!(
            parse(&big).is_err(),
            "inline without newline past the limit"
        );
    }

    #[test]
    fn parse_frame_consumes_nothing_and_names_each_argument() {
        let buf = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n$4\r\nPI";
        let mut ranges = Vec::new();
        let first = parse_frame(buf, &Limits::default(), &mut ranges).unwrap();
        assert_eq!(first, Frame::Array { len: 22 });
        let args: Vec<&[u8]> = ranges.iter().map(|&(a, b)| &buf[a..b]).collect();
        assert_eq!(args, [&b"PING"[..], &b"hi"[..]]);
        // The pipelined second command is cut short: incomplete, and no stale ranges.
        let rest = &buf[22..];
        assert_eq!(
            parse_frame(rest, &Limits::default(), &mut ranges).unwrap(),
            Frame::Incomplete
        );
        assert!(ranges.is_empty());
        assert_eq!(
            parse_frame(b"*0\r\n", &Limits::default(), &mut ranges).unwrap(),
            Frame::Array { len: 4 }
        );
        assert!(ranges.is_empty());
        assert_eq!(
            parse_frame(b"PING 'a b'\r\n", &Limits::default(), &mut ranges).unwrap(),
            Frame::Inline {
                len: 12,
                args: vec![b"PING".to_vec(), b"a b".to_vec()]
            }
        );
    }

    #[test]
    fn inline() {
        assert_eq!(parse(b"PING\r\n").unwrap(), args(&["PING"]));
        assert_eq!(
            parse(b"  set a  \"b c\" 'd'\n").unwrap(),
            args(&["set", "a", "b c", "d"])
        );
        assert_eq!(parse(b"PING").unwrap(), Parsed::Incomplete);
        assert_eq!(parse(b"\r\n").unwrap(), Parsed::Command(vec![]));
        assert!(parse(b"echo \"abc\n").is_err());
    }

    proptest! {
        /// Any bytes: never panics, and never consumes without producing.
        #[test]
        fn arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = BytesMut::from(&b[..]);
            let limits = Limits { max_bulk: 64, max_args: 8, max_inline: 64 };
            for _ in 0..50 {
                let before = buf.len();
                match parse_command(&mut buf, &limits) {
                    Ok(Parsed::Command(_)) => prop_assert!(buf.len() < before),
                    Ok(Parsed::Incomplete) => { prop_assert_eq!(buf.len(), before); break; }
                    Err(_) => break,
                }
            }
        }

        /// Frames encoded by the independent `redis-protocol` encoder parse back to the
        /// same arguments, whole or fed byte by byte.
        #[test]
        fn agrees_with_redis_protocol(cmd in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..10)) {
            use redis_protocol::resp2::{encode::extend_encode, types::BytesFrame};
            let frame = BytesFrame::Array(cmd.iter().map(|a| BytesFrame::BulkString(Bytes::copy_from_slice(a))).collect());
            let mut wire = BytesMut::new();
            extend_encode(&mut wire, &frame, false).unwrap();
            let mut whole = wire.clone();
            let want = Parsed::Command(cmd.iter().map(|a| Bytes::copy_from_slice(a)).collect());
            prop_assert_eq!(parse_command(&mut whole, &Limits::default()).unwrap(), want);
            prop_assert!(whole.is_empty());
            let mut partial = BytesMut::new();
            for (i, b) in wire.iter().enumerate() {
                partial.extend_from_slice(&[*b]);
                let r = parse_command(&mut partial, &Limits::default()).unwrap();
                if i + 1 < wire.len() {
                    prop_assert_eq!(r, Parsed::Incomplete);
                } else {
                    prop_assert!(matches!(r, Parsed::Command(_)));
                }
            }
        }
    }
}
