//! `SHUTDOWN [NOSAVE|SAVE]`: stops the server the way SIGTERM does (connections drain,
//! the log is flushed, fsynced and closed, the process exits 0).

use super::args::syntax_error;
use super::{Ctx, Outcome};
use crate::protocol::Reply;
use crate::takeover::{takeover, Handback};

/// `SHUTDOWN [NOSAVE|SAVE]`. Every acknowledged write is already in the log, so the two
/// differ in nothing here: `NOSAVE` writes no snapshot, and neither does `SAVE` (the log
/// is replayed on the next start either way); both still flush and close the log.
pub struct Shutdown;

impl Shutdown {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    /// Redis's other modifiers (`NOW`, `FORCE`, `ABORT`) steer its snapshot and replicas,
    /// which stockgate does not have: refused rather than silently taken.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        match args {
            [] => Ok(Shutdown),
            [m] if m.eq_ignore_ascii_case(b"NOSAVE") || m.eq_ignore_ascii_case(b"SAVE") => {
                Ok(Shutdown)
            }
            _ => Err(syntax_error("shutdown")),
        }
    }

    /// Sends no reply, as Redis: the client sees the connection close (redis-py's
    /// `shutdown()` counts that as success). The earlier replies of the batch go out
    /// first; then the process signals itself, so the stop is the one SIGTERM makes.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let user = ctx
            .conn
            .user_name
            .clone()
            .unwrap_or_else(|| "default".into());
        Outcome::takeover(takeover(move |_io, _rest| {
            Box::pin(async move {
                tracing::warn!(%user, "SHUTDOWN: stopping");
                // SAFETY: kill(2) on this process's own id with a signal it handles.
                #[allow(unsafe_code)]
                let rc = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                if rc != 0 {
                    tracing::error!(
                        "SHUTDOWN: could not signal this process: {}",
                        std::io::Error::last_os_error()
                    );
                }
                Handback::Closed
            })
        }))
    }
}
