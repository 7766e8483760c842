//! A ledger describes one server history per group: the id a server reports as `INFO`'s
//! `stockgate_history` (`stockgate_core::engine` logs it once, as the first record of a
//! data dir or of a Raft group). The first tool that talks to a server binds a ledger
//! with no binding to it; from then on the sweeper, the materializer, the rebuild and
//! `adjust` refuse a server that reports a history the ledger is not bound to, before
//! they change anything: another group, a wiped data dir or a server restored from
//! someone else's copy would otherwise get this ledger's sales fenced, its orders
//! skipped or its stock rebuilt on the wrong machine. Binding another group's history
//! (`stockgate-sweeper bind`) or following another server instead (`rebind`) is an
//! operator's decision.
//!
//! Each sale records the history it lives on, so the tools of one group touch only that
//! group's sales ([`Bound::owner`], [`check_sale`]).

use crate::client::ClientError;
use crate::ledger::{Ledger, LedgerError};

/// Why a tool refused to act on a server: the ledger could not be shown to describe that server's
/// history.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The ledger is bound to other histories than the one the server reports.
    #[error(
        "this ledger describes server {ledger}, but the server reports history {server} \
         (another group, a wiped data dir or a restored copy of another server); nothing was \
         changed. If this server is another group of the same cluster, add it: \
         `stockgate-sweeper bind --history {server} --group NAME`. If this ledger is to \
         follow this server from now on instead (for example to rebuild a server that lost \
         its data), bind it deliberately: `stockgate-sweeper rebind --history {server}`"
    )]
    Mismatch {
        /// The histories the ledger is bound to, in words (`history a` or `histories a, b`).
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
    /// `rebind` or `bind` named a history the server does not report.
    #[error("{command}: the server reports history {server}, not {asked}; nothing was changed")]
    RebindTarget {
        /// `rebind` or `bind`.
        command: &'static str,
        /// The history the operator named.
        asked: String,
        /// The history the server reports.
        server: String,
    },
    /// `rebind` replaces the one binding; with several it cannot know which.
    #[error(
        "rebind replaces the ledger's one binding, but it is bound to {bound}; nothing was \
         changed. Add a group's history with `stockgate-sweeper bind --history H`, remove one \
         with `stockgate-sweeper unbind --history H`"
    )]
    SeveralBound {
        /// The bindings, in words.
        bound: String,
    },
    /// The sale lives on another history than the server reports.
    #[error(
        "sale {sku} lives on server history {sale}, but this server reports history {server} \
         (another group); nothing was changed. Point the tool at a server of history {sale}"
    )]
    SaleElsewhere {
        /// The sale.
        sku: String,
        /// The history the ledger records for it.
        sale: String,
        /// The history the server reports.
        server: String,
    },
    /// The sale has no recorded history and the ledger has several bindings.
    #[error(
        "sale {sku} has no recorded server history and this ledger is bound to {bound}, so \
         it cannot tell which group the sale lives on; nothing was changed for it. Record it \
         with a sweeper pass on that group naming it (`stockgate-sweeper --server <its group> \
         run --once --sku {sku}`), or, while one history is bound, `stockgate-sweeper bind` \
         records every such sale on that one"
    )]
    SaleUnassigned {
        /// The sale.
        sku: String,
        /// The bindings, in words.
        bound: String,
    },
    /// The ledger call failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The server call failed.
    #[error("server: {0}")]
    Server(#[from] ClientError),
}

/// The bindings in words: `history a` or `histories a, b`.
fn in_words(bound: &[String]) -> String {
    match bound {
        [one] => format!("history {one}"),
        many => format!("histories {}", many.join(", ")),
    }
}

/// A server shown to be one of the ledger's bound histories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// The history the server reports (one of the bindings).
    pub history: String,
    /// Every binding, oldest first.
    pub all: Vec<String>,
}

/// Whose a sale is, from the server's point of view ([`Bound::owner`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SaleOwner {
    /// The sale lives on this server's history (or has none recorded and the ledger has
    /// this one binding).
    Here,
    /// The sale lives on another history.
    Elsewhere(String),
    /// No history recorded, and several bindings: nobody can tell.
    Unassigned,
}

impl Bound {
    /// Whether the ledger has only this one binding.
    pub fn sole(&self) -> bool {
        self.all.len() == 1
    }

    /// Where a sale whose recorded history is `recorded` lives.
    pub fn owner(&self, recorded: Option<&str>) -> SaleOwner {
        match recorded {
            Some(h) if h == self.history => SaleOwner::Here,
            Some(h) => SaleOwner::Elsewhere(h.to_string()),
            None if self.sole() => SaleOwner::Here,
            None => SaleOwner::Unassigned,
        }
    }

    /// The error for `sku`, which is not this server's to act on (`None` if it is).
    pub fn refusal(&self, sku: &str, owner: &SaleOwner) -> Option<IdentityError> {
        match owner {
            SaleOwner::Here => None,
            SaleOwner::Elsewhere(h) => Some(IdentityError::SaleElsewhere {
                sku: sku.to_string(),
                sale: h.clone(),
                server: self.history.clone(),
            }),
            SaleOwner::Unassigned => Some(IdentityError::SaleUnassigned {
                sku: sku.to_string(),
                bound: in_words(&self.all),
            }),
        }
    }
}

/// Checks that `server` is one of the histories `ledger` is bound to, binding a ledger
/// with no binding on first contact.
pub async fn check_bound(
    ledger: &impl Ledger,
    server: Option<String>,
) -> Result<Bound, IdentityError> {
    let server = server.ok_or(IdentityError::Unknown)?;
    let mut all = histories(ledger).await?;
    if all.is_empty() {
        let now = ledger.bind_history(None, &server).await?;
        if now.as_deref() == Some(server.as_str()) {
            tracing::info!(history = %server, "ledger bound to the server's history");
        }
        all = histories(ledger).await?;
    }
    if all.contains(&server) {
        Ok(Bound {
            history: server,
            all,
        })
    } else {
        Err(IdentityError::Mismatch {
            ledger: in_words(&all),
            server,
        })
    }
}

async fn histories(ledger: &impl Ledger) -> Result<Vec<String>, LedgerError> {
    Ok(ledger
        .bound_histories()
        .await?
        .into_iter()
        .map(|b| b.history_id)
        .collect())
}

/// [`check_bound`], returning the history id.
pub async fn ensure_bound(
    ledger: &impl Ledger,
    server: Option<String>,
) -> Result<String, IdentityError> {
    Ok(check_bound(ledger, server).await?.history)
}

/// Checks that sale `sku` lives on `bound`'s history (a sale the ledger does not know
/// passes: the caller reports it). A sale with no recorded history, on a ledger with one
/// binding, gets it recorded now.
pub async fn check_sale(
    ledger: &impl Ledger,
    bound: &Bound,
    sku: &str,
) -> Result<(), IdentityError> {
    let recorded = ledger
        .sale_histories()
        .await?
        .into_iter()
        .find(|(s, _)| s == sku);
    let Some((_, recorded)) = recorded else {
        return Ok(());
    };
    let owner = bound.owner(recorded.as_deref());
    if let Some(e) = bound.refusal(sku, &owner) {
        return Err(e);
    }
    if recorded.is_none() {
        ledger.record_sale_history(sku, &bound.history).await?;
    }
    Ok(())
}

/// Binds `ledger` to history `to`, which must be the one `server` reports (the operator
/// names it, so a rebind is never pointed at a server by accident), in place of its one
/// binding. Returns the binding it replaced.
pub async fn rebind(
    ledger: &impl Ledger,
    server: Option<String>,
    to: &str,
) -> Result<Option<String>, IdentityError> {
    let server = server.ok_or(IdentityError::Unknown)?;
    if server != to {
        return Err(IdentityError::RebindTarget {
            command: "rebind",
            asked: to.to_owned(),
            server,
        });
    }
    let all = histories(ledger).await?;
    if all.len() > 1 {
        return Err(IdentityError::SeveralBound {
            bound: in_words(&all),
        });
    }
    let old = all.into_iter().next();
    let now = ledger.bind_history(old.as_deref(), to).await?;
    if now.as_deref() != Some(to) {
        // Another tool bound it between the two statements: report what is in place.
        return Err(IdentityError::Mismatch {
            ledger: in_words(&histories(ledger).await?),
            server,
        });
    }
    Ok(old)
}

/// Adds history `to` (another group's, which `server` must report) to the ledger's
/// bindings, as `group` if named. Returns false if it was bound already.
pub async fn bind(
    ledger: &impl Ledger,
    server: Option<String>,
    to: &str,
    group: Option<&str>,
) -> Result<bool, IdentityError> {
    let server = server.ok_or(IdentityError::Unknown)?;
    if server != to {
        return Err(IdentityError::RebindTarget {
            command: "bind",
            asked: to.to_owned(),
            server,
        });
    }
    Ok(ledger.add_binding(to, group).await?)
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
        assert_eq!(ensure_bound(&l, b.clone()).await.expect("rebound"), "bbbb");
        assert!(ensure_bound(&l, a.clone()).await.is_err());
        // The embedded ledger follows one history: a second group is refused in words.
        let err = bind(&l, a.clone(), "aaaa", Some("g2"))
            .await
            .expect_err("a second history");
        assert!(err.to_string().contains("one server history"), "{err}");
        assert!(!bind(&l, b.clone(), "bbbb", None).await.expect("same one"));
        assert!(matches!(
            bind(&l, b, "aaaa", None).await,
            Err(IdentityError::RebindTarget {
                command: "bind",
                ..
            })
        ));
    }

    #[test]
    fn a_sale_belongs_to_its_history_or_to_the_sole_binding() {
        let one = Bound {
            history: "aaaa".into(),
            all: vec!["aaaa".into()],
        };
        assert_eq!(one.owner(None), SaleOwner::Here);
        assert_eq!(one.owner(Some("aaaa")), SaleOwner::Here);
        let two = Bound {
            history: "bbbb".into(),
            all: vec!["aaaa".into(), "bbbb".into()],
        };
        assert_eq!(two.owner(Some("bbbb")), SaleOwner::Here);
        assert_eq!(two.owner(None), SaleOwner::Unassigned);
        let other = two.owner(Some("aaaa"));
        assert_eq!(other, SaleOwner::Elsewhere("aaaa".into()));
        let msg = two.refusal("S", &other).expect("refused").to_string();
        assert!(msg.contains("aaaa") && msg.contains("bbbb"), "{msg}");
        let msg = two
            .refusal("S", &SaleOwner::Unassigned)
            .expect("refused")
            .to_string();
        assert!(
            msg.contains("histories aaaa, bbbb") && msg.contains("run --once --sku S"),
            "{msg}"
        );
        assert!(two.refusal("S", &SaleOwner::Here).is_none());
    }
}
