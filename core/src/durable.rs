//! What an embedder waits on before it answers: "everything up to this LSN is in the
//! log". The server's `Durability` (its `session` module) is the whole persistence
//! interface (`SAVE`, `BACKUP`, INFO); this is the one call of it an engine embedded in
//! another process needs (`stockgate_client::EngineGate::with_durability`), so that a
//! client does not link the server to get it. The server implements it for its log
//! (`persist::WalDurability`) and for `NoDurability`.

use std::future::Future;
use std::pin::Pin;

use crate::engine::Lsn;

/// Why a reply cannot say its records are durable. Either way the answer must not be
/// given; what the client is told differs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotDurable {
    /// This member stopped leading (a Raft group's leader that lost its majority, or saw
    /// another leader) before the records committed. They may still commit under the next
    /// leader, or not: the client asks the group's leader again (with the same request id
    /// a RESERVE answers its first outcome).
    #[error("this member lost the leadership before the write committed")]
    LostLeadership,
    /// The log could not make them durable (a write or fsync failed, the log was closed).
    #[error("{0}")]
    Log(String),
}

/// Resolves when the log has acknowledged a record.
pub trait WaitDurable: Send + Sync {
    /// Resolves when everything up to `lsn` is acknowledged by the log. An error means
    /// the record may not be on disk: the answer must not be given.
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), NotDurable>> + Send + '_>>;
}
