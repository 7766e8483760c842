//! What an embedder waits on before it answers: "everything up to this LSN is in the
//! log". The server's `Durability` (its `session` module) is the whole persistence
//! interface (`SAVE`, `BACKUP`, INFO); this is the one call of it an engine embedded in
//! another process needs (`stockgate_client::EngineGate::with_durability`), so that a
//! client does not link the server to get it. The server implements it for its log
//! (`persist::WalDurability`) and for `NoDurability`.

use std::future::Future;
use std::pin::Pin;

use crate::engine::Lsn;

/// Resolves when the log has acknowledged a record.
pub trait WaitDurable: Send + Sync {
    /// Resolves when everything up to `lsn` is acknowledged by the log. An error means
    /// the record may not be on disk: the answer must not be given.
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}
