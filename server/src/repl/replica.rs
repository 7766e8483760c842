//! The replica's side: follow the configured primary, resume from the last LSN when the
//! histories match, otherwise install a full copy and restart; apply each record through
//! the recovery path and write it to the local log under the same LSN; report the
//! durable position back.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::state::RoleConf;
use super::{wire, LinkStatus, Repl};
use crate::protocol::{parse_command_into, Limits};
use crate::wal::record::decode_record;

/// Runs for the life of the server: follows the primary while this node is a replica.
pub async fn follow(repl: Arc<Repl>) {
    let mut last_error = String::new();
    loop {
        let epoch = repl.epoch.load(Ordering::Acquire);
        let changed = repl.role_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let RoleConf::Replica { host, port } = repl.role_conf() else {
            changed.await;
            continue;
        };
        let r = link(&repl, &host, port, epoch).await;
        {
            let mut l = repl.link.lock();
            if l.status == LinkStatus::Up {
                l.down_since = Instant::now();
            }
            l.status = LinkStatus::Connecting;
        }
        if repl.epoch.load(Ordering::Acquire) != epoch {
            continue;
        }
        if let Err(e) = r {
            if e != last_error {
                tracing::warn!("replication: link to primary {host}:{port}: {e}");
                last_error = e;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = &mut changed => {}
        }
    }
}

async fn expect_ok(stream: &mut TcpStream, buf: &mut BytesMut, what: &str) -> Result<(), String> {
    let line = wire::read_line(stream, buf, 4096)
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    if line.starts_with('+') {
        Ok(())
    } else {
        Err(format!("{what}: {line}"))
    }
}

/// One connection to the primary; returns when it ends (`Ok` when the role changed).
async fn link(repl: &Arc<Repl>, host: &str, port: u16, epoch: u64) -> Result<(), String> {
    let timeout = repl.cfg.timeout;
    let mut stream = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out = Vec::with_capacity(256);
    if let Some((user, pass)) = &repl.cfg.primary_auth {
        wire::command(&[b"AUTH", user.as_bytes(), pass.as_bytes()], &mut out);
    }
    let port_s = repl.announce_port.load(Ordering::Relaxed).to_string();
    wire::command(
        &[b"REPLCONF", b"listening-port", port_s.as_bytes()],
        &mut out,
    );
    let (replid, offset) = (repl.ids.lock().replid.clone(), repl.dur.wal.last_lsn());
    let off_s = offset.to_string();
    wire::command(&[b"PSYNC", replid.as_bytes(), off_s.as_bytes()], &mut out);
    stream.write_all(&out).await.map_err(|e| e.to_string())?;
    if repl.cfg.primary_auth.is_some() {
        expect_ok(&mut stream, &mut buf, "AUTH").await?;
    }
    expect_ok(&mut stream, &mut buf, "REPLCONF").await?;
    let line = tokio::time::timeout(timeout * 5, wire::read_line(&mut stream, &mut buf, 4096))
        .await
        .map_err(|_| "PSYNC timed out".to_owned())?
        .map_err(|e| format!("PSYNC: {e}"))?;
    let mut words = line.split_whitespace();
    match words.next() {
        Some("+CONTINUE") => {
            if let Some(new_id) = words.next().filter(|id| super::state::valid_id(id)) {
                let mut ids = repl.ids.lock();
                if ids.replid != new_id {
                    // The primary's history continues ours under a new id (it was promoted):
                    // remember where ours ends, for replicas that sync from us later.
                    let old = std::mem::replace(&mut ids.replid, new_id.to_owned());
                    ids.previous = Some((old, offset));
                    ids.save(&repl.cfg.data_dir).map_err(|e| e.to_string())?;
                }
            }
        }
        Some("+FULLRESYNC") => {
            let (Some(id), Some(lsn)) = (words.next(), words.next()) else {
                return Err(format!("bad FULLRESYNC line: {line}"));
            };
            let lsn: u64 = lsn
                .parse()
                .map_err(|_| format!("bad FULLRESYNC line: {line}"))?;
            repl.link.lock().status = LinkStatus::Sync;
            let head = wire::read_line(&mut stream, &mut buf, 64)
                .await
                .map_err(|e| e.to_string())?;
            let len: usize = head
                .strip_prefix('$')
                .and_then(|n| n.parse().ok())
                .filter(|n| *n <= wire::MAX_SNAPSHOT_BYTES)
                .ok_or_else(|| format!("bad snapshot header: {head}"))?;
            let bytes = wire::read_exact(&mut stream, &mut buf, len)
                .await
                .map_err(|e| format!("reading the snapshot: {e}"))?;
            if repl.epoch.load(Ordering::Acquire) != epoch {
                return Ok(());
            }
            return match full_sync(repl, host, port, id, lsn, &bytes) {
                Ok(never) => match never {},
                Err(e) => Err(format!("full sync failed: {e}")),
            };
        }
        _ => return Err(format!("PSYNC refused: {line}")),
    }
    {
        let mut l = repl.link.lock();
        l.status = LinkStatus::Up;
        l.last_io = Instant::now();
    }
    tracing::info!("replication: following {host}:{port} from LSN {offset}");
    stream_in(repl, stream, buf, epoch).await
}

/// Applies what the primary sends until the link ends or the role changes.
async fn stream_in(
    repl: &Arc<Repl>,
    mut stream: TcpStream,
    mut buf: BytesMut,
    epoch: u64,
) -> Result<(), String> {
    let limits = Limits {
        max_bulk: 2 * wire::MAX_BATCH_BYTES + (1 << 20),
        max_args: 8,
        max_inline: 1024,
    };
    let mut argv: Vec<Bytes> = Vec::with_capacity(4);
    let mut out = Vec::with_capacity(128);
    let mut tick = tokio::time::interval(super::primary::HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut acked = 0u64;
    loop {
        let mut applied = None;
        loop {
            match parse_command_into(&mut buf, &limits, &mut argv) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(format!("bad message from the primary: {e}")),
            }
            match argv.first().map(|a| a.to_ascii_uppercase()).as_deref() {
                Some(b"LOG") if argv.len() == 3 => {
                    let first = std::str::from_utf8(&argv[1])
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or("bad LOG message")?;
                    match apply(repl, epoch, first, &argv[2])? {
                        Some(last) => applied = Some(last),
                        None => return Ok(()),
                    }
                }
                _ => {}
            }
        }
        argv.clear();
        if let Some(last) = applied {
            repl.dur
                .wal
                .wait_durable(last)
                .await
                .map_err(|e| format!("local log: {e}"))?;
        }
        let durable = repl.dur.wal.durable_lsn();
        if durable > acked {
            acked = durable;
            send_ack(&mut stream, &mut out, acked).await?;
        }
        buf.reserve(64 * 1024);
        let changed = repl.role_changed.notified();
        tokio::select! {
            r = tokio::time::timeout(repl.cfg.timeout, tokio::io::AsyncReadExt::read_buf(&mut stream, &mut buf)) => {
                match r {
                    Err(_) => return Err(format!("primary silent for {} ms", repl.cfg.timeout.as_millis())),
                    Ok(Ok(0)) => return Err("primary closed the link".into()),
                    Ok(Err(e)) => return Err(e.to_string()),
                    Ok(Ok(_)) => repl.link.lock().last_io = Instant::now(),
                }
            }
            _ = tick.tick() => {
                send_ack(&mut stream, &mut out, repl.dur.wal.durable_lsn()).await?;
            }
            _ = changed => {}
        }
        if repl.epoch.load(Ordering::Acquire) != epoch {
            fence(repl, &mut stream, &mut out).await;
            return Ok(());
        }
    }
}

async fn send_ack(stream: &mut TcpStream, out: &mut Vec<u8>, lsn: u64) -> Result<(), String> {
    out.clear();
    let n = lsn.to_string();
    wire::command(&[b"REPLCONF", b"ACK", n.as_bytes()], out);
    stream.write_all(out).await.map_err(|e| e.to_string())
}

/// This node left its primary (promoted, or told to follow another): tell the primary,
/// so it acknowledges nothing more (see the module docs of `repl`).
async fn fence(repl: &Arc<Repl>, stream: &mut TcpStream, out: &mut Vec<u8>) {
    out.clear();
    let id = repl.ids.lock().replid.clone();
    wire::command(&[b"REPLCONF", b"FENCE", id.as_bytes()], out);
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(out)).await;
    let _ = stream.shutdown().await;
}

/// Logs and applies one `LOG` message. `Ok(None)`: the role changed, nothing applied.
fn apply(repl: &Repl, epoch: u64, first: u64, frames: &[u8]) -> Result<Option<u64>, String> {
    let _gate = repl.dur.apply_gate();
    // Checked under the gate: `replicaof` bumps the epoch and then takes the gate, so
    // after it returns no record of the old primary is applied here.
    if repl.epoch.load(Ordering::Acquire) != epoch {
        return Ok(None);
    }
    let wal = &repl.dur.wal;
    let expected = wal.last_lsn() + 1;
    if first != expected {
        return Err(format!(
            "primary sent LSN {first}, this log continues at {expected}"
        ));
    }
    let mut at = 0;
    let mut lsn = first;
    while at < frames.len() {
        let (ev, used) =
            decode_record(&frames[at..]).map_err(|e| format!("record at LSN {lsn}: {e}"))?;
        let got = wal.record(&ev);
        if got != lsn {
            // Nothing else may log on a replica; if something did, the logs diverged.
            return Err(format!(
                "local log assigned LSN {got} to the primary's {lsn}"
            ));
        }
        repl.engine.apply(&ev);
        // Consumer-group records are the feed's: applied there too (`persist`).
        repl.dur.replayed(lsn, &ev);
        at += used;
        lsn += 1;
    }
    Ok(Some(lsn - 1))
}

/// Installs a full copy: the snapshot becomes this node's whole log (the old one is
/// removed), the identity is saved, and the process re-executes itself so that it starts
/// from the copy through the ordinary recovery path. Returns only on failure.
fn full_sync(
    repl: &Repl,
    host: &str,
    port: u16,
    replid: &str,
    lsn: u64,
    bytes: &[u8],
) -> Result<Infallible, String> {
    use crate::wal::segment::snapshot_file_name;
    use crate::wal::snapshot::decode_snapshot;
    let (got, _) = decode_snapshot(bytes).map_err(|e| format!("snapshot: {e:?}"))?;
    if got != lsn || !super::state::valid_id(replid) {
        return Err(format!("snapshot at LSN {got}, announced {lsn}"));
    }
    let data = &repl.cfg.data_dir;
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let staging = data.join("wal.sync");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| io("create wal.sync", e))?;
    let file = staging.join(snapshot_file_name(lsn));
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&file).map_err(|e| io("write snapshot", e))?;
        f.write_all(bytes).map_err(|e| io("write snapshot", e))?;
        f.sync_all().map_err(|e| io("sync snapshot", e))?;
    }
    {
        let mut ids = repl.ids.lock();
        ids.role = RoleConf::Replica {
            host: host.to_owned(),
            port,
        };
        ids.replid = replid.to_owned();
        ids.previous = None;
        ids.fenced = None;
        ids.save(data).map_err(|e| e.to_string())?;
    }
    tracing::warn!(
        "replication: full copy of {host}:{port} at LSN {lsn} ({} bytes) installed; restarting on it",
        bytes.len()
    );
    // From here the process cannot go on serving: its log is being replaced.
    let _ = repl.dur.wal.flush_and_close();
    let wal_dir = data.join("wal");
    let old = data.join("wal.old");
    let _ = std::fs::remove_dir_all(&old);
    let swapped = std::fs::rename(&wal_dir, &old)
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })
        .and_then(|()| std::fs::rename(&staging, &wal_dir));
    if let Err(e) = swapped {
        eprintln!("stockgate: full sync: swapping the log directory failed: {e}");
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&old);
    if let Ok(d) = std::fs::File::open(data) {
        let _ = d.sync_all();
    }
    // Same port as now (it may have been `--port 0`): Sentinel and the primary know it.
    let mut argv = repl.cfg.restart_argv.clone();
    argv.push("--port".into());
    argv.push(
        repl.announce_port
            .load(Ordering::Relaxed)
            .to_string()
            .into(),
    );
    restart(&argv)
}

/// Re-executes this binary with its own arguments (same PID: supervisors and tests keep
/// tracking it). Exits if that fails.
fn restart(argv: &[std::ffi::OsString]) -> ! {
    use std::os::unix::process::CommandExt as _;
    let err = std::process::Command::new("/proc/self/exe")
        .args(argv.iter().skip(1))
        .exec();
    eprintln!("stockgate: restart after full sync failed: {err}");
    std::process::exit(1)
}
