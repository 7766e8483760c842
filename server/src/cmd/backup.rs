//! `BACKUP <dir>`: writes a consistent copy of this node's data dir, as of one LSN, into a
//! new or empty directory on the server's machine while the server keeps serving (Redis's
//! analogue is `BGSAVE` and a copy of `dump.rdb`). The copy is the newest snapshot plus the
//! log up to that LSN, so it holds the order feed and its consumer groups too; the key
//! files are not copied (docs/operations.md, "Backup and restore"). The copy runs on a
//! blocking thread: only the connection that asked waits for it.

use std::path::PathBuf;

use super::{Ctx, Deferred, Outcome};
use crate::protocol::Reply;
use crate::wal::{BackupError, BackupWritten};

/// The one place a backup's outcome becomes a reply.
fn reply(r: Result<BackupWritten, BackupError>) -> Reply {
    match r {
        Ok(w) => Reply::map([
            ("dir", Reply::bulk(w.dir.to_string_lossy().as_bytes())),
            ("lsn", Reply::Int(w.lsn as i64)),
            ("snapshot_lsn", Reply::Int(w.snapshot_lsn as i64)),
            ("segments", Reply::Int(w.segments as i64)),
            ("bytes", Reply::Int(w.bytes as i64)),
        ]),
        Err(e) => {
            tracing::warn!("BACKUP failed: {e}");
            Reply::err(format!("ERR BACKUP: {e}"))
        }
    }
}

/// Starts the copy; the connection waits for its reply (arity is checked by the table).
pub fn backup(ctx: &Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let target = PathBuf::from(String::from_utf8_lossy(args[0]).into_owned());
    let durability = ctx.shared.durability.clone();
    let wait: Deferred = Box::pin(async move {
        match tokio::task::spawn_blocking(move || durability.backup(&target)).await {
            Ok(r) => reply(r),
            Err(e) => Reply::err(format!("ERR BACKUP: the copy stopped: {e}")),
        }
    });
    // Refused inside MULTI (`multi::not_in_multi`), so this answer is never sent.
    Outcome::deferred(
        Reply::err("ERR BACKUP cannot run inside a transaction"),
        wait,
    )
}
