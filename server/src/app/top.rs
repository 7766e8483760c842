//! `stockgate top`: the terminal view of a running server, over plain TCP or TLS.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The server to watch and how.
pub struct TopOptions {
    /// `host:port` of the server.
    pub server: String,
    /// The user and password to log in with.
    pub auth: Option<(String, String)>,
    /// Time between polls.
    pub interval: Duration,
    /// Print one screen as text and return, instead of the live view.
    pub once: bool,
    /// TLS to the server, if asked for.
    pub tls: TopTls,
}

/// `stockgate top`'s TLS flags.
pub struct TopTls {
    /// `--tls`: connect over TLS.
    pub tls: bool,
    /// `--cacert`: the CAs that verify the server; `None`: the system's.
    pub cacert: Option<PathBuf>,
    /// `--cert`: this client's certificate.
    pub cert: Option<PathBuf>,
    /// `--key`: the private key of `cert`.
    pub key: Option<PathBuf>,
}

/// Shows `o.server` until the user quits (or one screen with `once`). The error names
/// the flag, the file or the server at fault.
pub fn top(o: &TopOptions) -> Result<(), String> {
    let tls = client_tls(&o.tls)?;
    let tls = tls.as_ref();
    let auth = o.auth.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
    let interval = o.interval.max(Duration::from_millis(100));
    let r = if o.once {
        crate::report::top::once(&o.server, auth, tls, interval).map(|lines| {
            for l in lines {
                println!("{l}");
            }
        })
    } else {
        crate::report::top::run(&o.server, auth, tls, interval)
    };
    r.map_err(|e| format!("{}: {e}", o.server))
}

/// The TLS client settings the flags ask for (None: plain TCP).
fn client_tls(t: &TopTls) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    let cert_key = match (&t.cert, &t.key) {
        (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
        (None, None) => None,
        (Some(_), None) => return Err("--cert needs --key".into()),
        (None, Some(_)) => return Err("--key needs --cert".into()),
    };
    if !t.tls {
        if t.cacert.is_some() || cert_key.is_some() {
            return Err("--cacert, --cert and --key need --tls".into());
        }
        return Ok(None);
    }
    crate::tls::client_config(t.cacert.as_deref(), cert_key)
        .map(Some)
        .map_err(|e| e.to_string())
}
