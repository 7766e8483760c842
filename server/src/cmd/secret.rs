//! `SECRET.RELOAD`: reads the admission secret file (`--secret-file`, or the data dir's
//! `secret`) again and verifies admission tokens with its keys from the next `RESERVE` on,
//! so a key is added or retired without a restart (docs/operations.md, "Key rotation").
//! A file that cannot be read or parsed changes nothing. The reservation key never
//! changes this way: a new key would give retried requests new tokens.

use super::Ctx;
use crate::keyfiles::read_secret;
use crate::protocol::Reply;

/// Reads the file again; the reply lists the key ids now held, the signing one first.
pub fn reload(ctx: &Ctx<'_>) -> Reply {
    let Some(path) = ctx.shared.secret_file.get() else {
        return Reply::err(
            "ERR SECRET.RELOAD: this server was not started with an admission secret file",
        );
    };
    match read_secret(path) {
        Ok(ring) => {
            let kids: Vec<Reply> = ring.kids().map(Reply::bulk).collect();
            tracing::info!(
                file = %path.display(),
                keys = kids.len(),
                "SECRET.RELOAD: admission keys read again"
            );
            ctx.engine.set_keyring(ring);
            Reply::Array(kids)
        }
        Err(e) => {
            tracing::warn!("SECRET.RELOAD refused: {e}");
            Reply::err(format!(
                "ERR SECRET.RELOAD: {e}; the admission keys held are unchanged"
            ))
        }
    }
}
