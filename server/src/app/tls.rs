//! TLS on the client port: the certificate files of `--tls-port` loaded at start.

use std::sync::Arc;

use super::config::Config;
use crate::tls::Tls;

/// The TLS port and the certificate it serves.
pub(super) struct TlsPort {
    /// `--tls-port`; 0 picks a free one.
    pub(super) port: u16,
    /// The loaded certificate files, re-read when they change.
    pub(super) tls: Arc<Tls>,
}

/// The TLS port and its loaded certificate, when `--tls-port` is given; a file that is
/// missing or does not parse stops the start, named.
pub(super) fn load(c: &Config) -> Result<Option<TlsPort>, String> {
    c.tls.metrics_tls()?;
    let Some((port, files)) = c.tls.files()? else {
        return Ok(None);
    };
    let tls = Tls::load(files).map_err(|e| e.to_string())?;
    Ok(Some(TlsPort {
        port,
        tls: Arc::new(tls),
    }))
}
