//! The replication link's messages, all RESP so the ordinary parser reads them:
//!
//! - replica → primary: `REPLCONF listening-port <port>`, `PSYNC <replid> <lsn>`, then
//!   `REPLCONF ACK <durable lsn>` and, when it leaves, `REPLCONF FENCE <its new id>`;
//! - primary → replica: `+CONTINUE <replid>` or `+FULLRESYNC <replid> <lsn>` followed by
//!   the snapshot file as `$<len>\r\n<bytes>` (as Redis sends its RDB), then messages
//!   `LOG <first lsn> <records>` (the records framed as in the WAL, CRC included) and
//!   `PING` when idle.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes of records per `LOG` message (one record may exceed it, alone).
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Records per `LOG` message.
pub const MAX_BATCH_RECORDS: usize = 16_384;
/// The largest snapshot a replica accepts in a full sync.
pub const MAX_SNAPSHOT_BYTES: usize = 16 << 30;

pub fn command(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

pub fn log_message(first: u64, records: &[u8], out: &mut Vec<u8>) {
    command(&[b"LOG", first.to_string().as_bytes(), records], out);
}

/// Reads one `\r\n`-terminated line (without it) of at most `max` bytes.
pub async fn read_line<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> std::io::Result<String> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.advance(i + 2);
            return Ok(line);
        }
        if buf.len() > max {
            return Err(std::io::Error::other("line too long on replication link"));
        }
        if r.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Reads exactly `n` bytes.
pub async fn read_exact<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    n: usize,
) -> std::io::Result<Vec<u8>> {
    while buf.len() < n {
        buf.reserve((n - buf.len()).min(8 << 20));
        if r.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.split_to(n).to_vec())
}
