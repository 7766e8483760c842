//! A ledger describes one server history: the id a server reports as `INFO`'s
//! `stockgate_history` (`stockgate_core::engine` logs it once, as the first record of a
//! data dir or of a Raft group). The first tool that talks to a server binds the ledger to
//! it; from then on the sweeper, the materializer, the rebuild and `adjust` refuse a
//! server that reports another id, before they change anything: another group, a wiped
//! data dir or a server restored from someone else's copy would otherwise get this
//! ledger's sales fenced, its orders skipped or its stock rebuilt on the wrong machine.
//! Binding to another history is an operator's decision (`stockgate-sweeper rebind`).

use crate::client::ClientError;
use crate::ledger::{Ledger, LedgerError};

/// Why a tool refused to act on a server: the ledger could not be shown to describe that server's
/// history.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The ledger is bound to another history than the server reports.
    #[error(
        "this ledger describes server history {ledger}, but the server reports history {server} \
         (another group, a wiped data dir or a restored copy of another server); nothing was \
         changed. If this ledger is to follow this server from now on (for example to rebuild \
         a server that lost its data), bind it deliberately: \
         `stockgate-sweeper rebind --history {server}`"
    )]
    Mismatch {
        /// The history the ledger is bound to.
        ledger: String,
        /// The history the server reports.
        server: String,
    },
    /// The server reports no history id yet, so nothing can be checked.
    #[error(
        "the server reports no history id yet (a group without a committed leader, or a server \
         version that does not report `stockgate_history`); nothing was changed"
    )]
    Unknown,
    /// `rebind` named a history the server does not report.
    #[error("rebind: the server reports history {server}, not {asked}; nothing was changed")]
    RebindTarget {
        /// The history the operator named.
        asked: String,
        /// The history the server reports.
        server: String,
    },
    /// The ledger call failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The server call failed.
    #[error("server: {0}")]
    Server(#[from] ClientError),
}

/// Checks that `ledger` describes the server that reported `server`, binding it on first
/// contact. Returns the history id.
pub async fn ensure_bound(
    ledger: &impl Ledger,
    server: Option<String>,
) -> Result<String, IdentityError> {
    let server = server.ok_or(IdentityError::Unknown)?;
    let bound = match ledger.bound_history().await? {
        Some(b) => b,
        None => {
            let now = ledger.bind_history(None, &server).await?;
            if now.as_deref() == Some(server.as_str()) {
                tracing::info!(history = %server, "ledger bound to the server's history");
            }
            now.unwrap_or_default()
        }
    };
    if bound == server {
        Ok(server)
    } else {
        Err(IdentityError::Mismatch {
            ledger: bound,
            server,
        })
    }
}

/// Binds `ledger` to history `to`, which must be the one `server` reports (the operator
/// names it, so a rebind is never pointed at a server by accident). Returns the binding
/// it replaced.
pub async fn rebind(
    ledger: &impl Ledger,
    server: Option<String>,
    to: &str,
) -> Result<Option<String>, IdentityError> {
    let server = server.ok_or(IdentityError::Unknown)?;
    if server != to {
        return Err(IdentityError::RebindTarget {
            asked: to.to_owned(),
            server,
        });
    }
    let old = ledger.bound_history().await?;
    let now = ledger.bind_history(old.as_deref(), to).await?;
    if now.as_deref() != Some(to) {
        // Another tool bound it between the two statements: report what is in place.
        return Err(IdentityError::Mismatch {
            ledger: now.unwrap_or_default(),
            server,
        });
    }
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::embedded::SledLedger;

    #[tokio::test]
    async fn identity_binds_once_refuses_others_and_rebinds_deliberately() {
        let l = SledLedger::temporary().expect("ledger");
        let a = Some("aaaa".to_owned());
        let b = Some("bbbb".to_owned());
        assert!(matches!(
            ensure_bound(&l, None).await,
            Err(IdentityError::Unknown)
        ));
        assert_eq!(ensure_bound(&l, a.clone()).await.expect("bind"), "aaaa");
        assert_eq!(ensure_bound(&l, a.clone()).await.expect("same"), "aaaa");
        let err = ensure_bound(&l, b.clone())
            .await
            .expect_err("another history");
        let msg = err.to_string();
        assert!(msg.contains("aaaa") && msg.contains("bbbb"), "{msg}");
        assert!(
            msg.contains("stockgate-sweeper rebind --history bbbb"),
            "{msg}"
        );
        assert!(matches!(
            rebind(&l, b.clone(), "cccc").await,
            Err(IdentityError::RebindTarget { .. })
        ));
        assert_eq!(
            rebind(&l, b.clone(), "bbbb").await.expect("rebind"),
            Some("aaaa".to_owned())
        );
        assert_eq!(ensure_bound(&l, b).await.expect("rebound"), "bbbb");
        assert!(ensure_bound(&l, a).await.is_err());
    }
}
