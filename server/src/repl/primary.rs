//! The primary's side of a replication link: answers `PSYNC`, sends a full copy when the
//! replica's history does not continue here, then streams durable records and collects
//! the replica's acknowledgements.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use super::{wire, Attached, Repl};
use crate::protocol::{parse_command_into, Limits};
use crate::wal::reader::{ReadError, Visit};
use crate::wal::record::encode_record;

pub use crate::session::SyncRequest;

/// How often an idle link carries a `PING` (and a replica an `ACK`).
pub(super) const HEARTBEAT: Duration = Duration::from_millis(500);

/// Serves one replica until its link ends.
pub async fn serve(repl: Arc<Repl>, stream: TcpStream, inbuf: BytesMut, req: SyncRequest) {
    let (rd, mut wr) = stream.into_split();
    if repl.is_replica() {
        let _ = wr
            .write_all(b"-ERR this node is a replica; sync from its primary\r\n")
            .await;
        return;
    }
    let wal = repl.dur.wal.clone();
    let (replid, previous) = {
        let ids = repl.ids.lock();
        (ids.replid.clone(), ids.previous.clone())
    };
    let last = wal.last_lsn();
    let continuable = u64::try_from(req.offset).ok().filter(|&off| {
        let same_history = (req.replid == replid && off <= last)
            || previous
                .as_ref()
                .is_some_and(|(id, upto)| *id == req.replid && off <= *upto);
        same_history && off + 1 >= wal.first_readable_lsn()
    });
    let Some(offset) = continuable else {
        full_sync(&repl, wr, &replid, &req).await;
        return;
    };
    if wr
        .write_all(format!("+CONTINUE {replid}\r\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    repl.partial_syncs.fetch_add(1, Ordering::Relaxed);
    let att = Arc::new(Attached {
        id: repl.next_id.fetch_add(1, Ordering::Relaxed),
        ip: req.ip.clone(),
        port: req.port,
        acked: offset.into(),
        sent: offset.into(),
        last_ack_ms: repl.now_ms().into(),
    });
    let epoch = repl.epoch.load(Ordering::Acquire);
    {
        let mut reps = repl.replicas.lock();
        reps.push(att.clone());
        repl.attached.store(reps.len(), Ordering::Release);
    }
    repl.hold_backlog();
    repl.lift_fence_if_back(&format!("{}:{}", req.ip, req.port));
    repl.acks.notify_waiters();
    tracing::info!(
        "replication: replica {}:{} attached at LSN {offset}",
        req.ip,
        req.port
    );
    let reason = stream_records(&repl, &att, rd, inbuf, &mut wr, offset + 1, epoch).await;
    {
        let mut reps = repl.replicas.lock();
        reps.retain(|r| r.id != att.id);
        repl.attached.store(reps.len(), Ordering::Release);
    }
    repl.detached.lock().push((
        format!("{}:{}", req.ip, req.port),
        att.acked.load(Ordering::Acquire),
        std::time::Instant::now(),
    ));
    repl.hold_backlog();
    repl.acks.notify_waiters();
    tracing::warn!(
        "replication: replica {}:{} detached: {reason}",
        req.ip,
        req.port
    );
}

async fn full_sync(
    repl: &Arc<Repl>,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    replid: &str,
    req: &SyncRequest,
) {
    tracing::info!(
        "replication: full sync of {}:{} (asked for {} at {})",
        req.ip,
        req.port,
        req.replid,
        req.offset
    );
    // A snapshot made for it (the newest state, and the log then continues right after
    // it); read back at once, before a later snapshot can replace it.
    let mut bytes = None;
    for _ in 0..3 {
        let r = repl.clone();
        let made = tokio::task::spawn_blocking(move || r.dur.snapshot_file(&r.engine)).await;
        let Ok(Ok((lsn, path))) = made else {
            tracing::error!("replication: snapshot for a full sync failed");
            return;
        };
        if let Ok(b) = tokio::fs::read(&path).await {
            bytes = Some((lsn, b));
            break;
        }
    }
    let Some((lsn, bytes)) = bytes else {
        return;
    };
    let head = format!("+FULLRESYNC {replid} {lsn}\r\n${}\r\n", bytes.len());
    if wr.write_all(head.as_bytes()).await.is_err() || wr.write_all(&bytes).await.is_err() {
        return;
    }
    let _ = wr.flush().await;
    repl.full_syncs.fetch_add(1, Ordering::Relaxed);
    // It comes back (after re-executing itself) at `lsn`: keep that part of the log.
    repl.detached.lock().push((
        format!("{}:{}", req.ip, req.port),
        lsn,
        std::time::Instant::now(),
    ));
    repl.hold_backlog();
    // The replica installs the copy and restarts; it comes back with `PSYNC` at `lsn`.
    let _ = wr.shutdown().await;
}

/// Sends records from `pos` on as they become durable; returns why the link ended.
async fn stream_records(
    repl: &Arc<Repl>,
    att: &Arc<Attached>,
    rd: OwnedReadHalf,
    inbuf: BytesMut,
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    mut pos: u64,
    epoch: u64,
) -> String {
    let wal = repl.dur.wal.clone();
    let mut reader = tokio::spawn(read_acks(repl.clone(), att.clone(), rd, inbuf));
    let mut frames = Vec::with_capacity(64 * 1024);
    let mut msg = Vec::with_capacity(64 * 1024);
    let mut hint = None;
    let timeout_ms = repl.cfg.timeout.as_millis() as u64;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let why = loop {
        if reader.is_finished() {
            break "link closed by the replica".to_owned();
        }
        if repl.epoch.load(Ordering::Acquire) != epoch {
            break "this node's role changed".to_owned();
        }
        let silent = repl
            .now_ms()
            .saturating_sub(att.last_ack_ms.load(Ordering::Relaxed));
        if silent > timeout_ms {
            break format!("no acknowledgement for {silent} ms (--repl-timeout-ms)");
        }
        let durable = wal.durable_lsn();
        if durable >= pos {
            if repl.cfg.fault_send_delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(repl.cfg.fault_send_delay_ms)).await;
            }
            let durable = wal.durable_lsn();
            frames.clear();
            let mut n = 0u64;
            let upto = durable.min(pos + wire::MAX_BATCH_RECORDS as u64 - 1);
            let read = wal.read_records(pos, upto, hint, &mut |_, ev| {
                if encode_record(&ev, &mut frames).is_err() {
                    return Visit::Stop;
                }
                n += 1;
                if frames.len() >= wire::MAX_BATCH_BYTES {
                    Visit::Stop
                } else {
                    Visit::More
                }
            });
            match read {
                Ok(h) => hint = h,
                Err(ReadError::Trimmed { requested, first }) => {
                    break format!("LSN {requested} no longer in the log (starts at {first}); it will take a full copy");
                }
                Err(e) => break format!("reading the log: {e}"),
            }
            if n == 0 {
                break format!("no record at LSN {pos}");
            }
            msg.clear();
            wire::log_message(pos, &frames, &mut msg);
            // Before the write: the replica's acknowledgement may arrive before it returns.
            att.sent.store(pos + n - 1, Ordering::Release);
            if wr.write_all(&msg).await.is_err() {
                break "write failed".to_owned();
            }
            pos += n;
            continue;
        }
        tokio::select! {
            _ = wal.wait_durable_past(pos - 1) => {}
            _ = heartbeat.tick() => {
                repl.hold_backlog();
                msg.clear();
                wire::command(&[b"PING"], &mut msg);
                if wr.write_all(&msg).await.is_err() {
                    break "write failed".to_owned();
                }
            }
            _ = repl.role_changed.notified() => {}
            _ = &mut reader => {}
        }
    };
    reader.abort();
    let _ = wr.shutdown().await;
    why
}

/// Reads `REPLCONF ACK` / `REPLCONF FENCE` from the replica until its side closes.
async fn read_acks(repl: Arc<Repl>, att: Arc<Attached>, mut rd: OwnedReadHalf, mut buf: BytesMut) {
    let limits = Limits {
        max_bulk: 1024,
        max_args: 8,
        max_inline: 1024,
    };
    let mut argv: Vec<Bytes> = Vec::with_capacity(4);
    loop {
        loop {
            match parse_command_into(&mut buf, &limits, &mut argv) {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => return,
            }
            let is = |i: usize, s: &str| {
                argv.get(i)
                    .is_some_and(|a| a.eq_ignore_ascii_case(s.as_bytes()))
            };
            if !is(0, "REPLCONF") {
                continue;
            }
            if is(1, "ACK") {
                let n = argv
                    .get(2)
                    .and_then(|a| std::str::from_utf8(a).ok())
                    .and_then(|s| s.parse::<u64>().ok());
                if let Some(n) = n {
                    // A replica never has more than was sent to it.
                    let n = n.min(att.sent.load(Ordering::Acquire));
                    att.acked.fetch_max(n, Ordering::AcqRel);
                    att.last_ack_ms.store(repl.now_ms(), Ordering::Relaxed);
                    repl.acks.notify_waiters();
                }
            } else if is(1, "FENCE") {
                repl.depose(&format!("{}:{}", att.ip, att.port));
                return;
            }
        }
        buf.reserve(4096);
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
