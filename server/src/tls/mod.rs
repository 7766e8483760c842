//! TLS on the RESP port, with Redis's settings (`tls-port`, `tls-cert-file`,
//! `tls-key-file`, `tls-ca-cert-file`, `tls-auth-clients`), on rustls.
//!
//! The certificate, key and CA files are read at start (a missing or unparsable file
//! stops the start, naming the file) and again whenever one of them changes on disk
//! ([`Tls::watch`] compares their modification times and sizes once a second, and loads
//! a change once it has held still for a second): new
//! connections get the new certificate, connections already open keep the one they
//! shook hands with. A changed set that does not load (a key that does not match the
//! certificate, a file half written) is logged and counted, and the previous set goes on
//! serving. docs/operations.md, "TLS", is the operator's side.

pub mod args;
pub mod peer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How often the files are checked for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// How long a client may take to finish the TLS handshake before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Redis's `tls-auth-clients`: whether a client must present a certificate signed by
/// the CA of `tls-ca-cert-file`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthClients {
    /// A certificate from the CA is required; a client without one is refused.
    Yes,
    /// No certificate is asked for.
    No,
    /// A certificate is asked for; one that is sent must be from the CA, none is fine.
    Optional,
}

impl std::str::FromStr for AuthClients {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "yes" => Ok(AuthClients::Yes),
            "no" => Ok(AuthClients::No),
            "optional" => Ok(AuthClients::Optional),
            _ => Err("must be yes, no or optional".into()),
        }
    }
}

/// The files a TLS listener is configured from.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// `--tls-cert-file`: the server's certificate chain, PEM.
    pub cert: PathBuf,
    /// `--tls-key-file`: its private key, PEM.
    pub key: PathBuf,
    /// `--tls-ca-cert-file`: the CA client (and peer) certificates must chain to.
    pub ca: Option<PathBuf>,
    /// `--tls-auth-clients`: whether a client certificate is required.
    pub auth_clients: AuthClients,
}

/// Why a TLS configuration did not load; each names the file and the setting.
// Each variant's `#[error]` text is its documentation.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {}: {why}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("--tls-auth-clients {0} needs --tls-ca-cert-file (the CA that signs the client certificates); pass --tls-auth-clients no to accept clients without certificates")]
    NoCa(&'static str),
    #[error("--tls-cert-file {} and --tls-key-file {}: {why}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        why: String,
    },
    #[error("TLS settings: {0}")]
    Config(String),
}

/// The live TLS configuration of a server: what new connections shake hands with, and
/// the counters INFO reports.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Current>,
    stamps: Mutex<Seen>,
    /// Configurations loaded after the first.
    pub reloads: AtomicU64,
    /// Changed files that did not load (the previous configuration kept serving).
    pub reload_failures: AtomicU64,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The configurations built from one set of files.
#[derive(Clone)]
struct Current {
    /// The RESP port's (and the metrics endpoint's): `--tls-auth-clients` applies.
    clients: TlsAcceptor,
    /// The Raft port's, both ends (`--tls-replication`): a peer always presents the
    /// server's certificate and must be signed by the CA. Only with a CA file.
    peers: Option<(TlsAcceptor, TlsConnector)>,
}

/// What tells that a file changed: its modification time and size (None: unreadable).
type Stamp = Option<(SystemTime, u64)>;

/// The files' stamps as last loaded, and a change seen at the last look (loaded once it
/// is seen again unchanged).
struct Seen {
    loaded: Vec<Stamp>,
    pending: Option<Vec<Stamp>>,
}

impl Tls {
    /// Loads the files; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let stamps = stamps(&files);
        let current = build(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(current),
            stamps: Mutex::new(Seen {
                loaded: stamps,
                pending: None,
            }),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        })
    }

    /// The configuration a new connection shakes hands with.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current.read().clients.clone()
    }

    /// What the Raft port accepts peers with and calls them with (`--tls-replication`);
    /// None without a CA file.
    pub fn peers(&self) -> Option<(TlsAcceptor, TlsConnector)> {
        self.current.read().peers.clone()
    }

    /// The files this configuration is (re)loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// One look at the files: reloads once a change has held still for one look (so a
    /// certificate and key replaced one after the other load together, and a file being
    /// written is not read half done). `Ok(true)`: a new configuration serves from now
    /// on; an error leaves the previous one serving, and is not tried again until a
    /// file changes again.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.files);
        {
            let mut st = self.stamps.lock();
            if now == st.loaded {
                st.pending = None;
                return Ok(false);
            }
            if st.pending.as_ref() != Some(&now) {
                st.pending = Some(now);
                return Ok(false);
            }
            st.loaded = now;
            st.pending = None;
        }
        match build(&self.files) {
            Ok(a) => {
                *self.current.write() = a;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Checks the files every `every` for ever (spawn it; abort it to stop).
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut iv = tokio::time::interval(every);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            iv.tick().await;
            // Reading and parsing files blocks: off the event loop.
            let me = self.clone();
            match tokio::task::spawn_blocking(move || me.reload_if_changed()).await {
                Ok(Ok(true)) => tracing::info!(
                    "TLS certificate reloaded from {}",
                    self.files.cert.display()
                ),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::error!("TLS files changed but did not load, still serving the previous certificate: {e}")
                }
                Err(e) => tracing::error!("TLS reload task: {e}"),
            }
        }
    }
}

fn stamps(f: &TlsFiles) -> Vec<Stamp> {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    };
    let mut v = vec![one(&f.cert), one(&f.key)];
    if let Some(ca) = &f.ca {
        v.push(one(ca));
    }
    v
}

fn file_err(flag: &'static str, path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        flag,
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Every certificate in a PEM file (at least one).
fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    // Read first, so a missing file says so in the operating system's words.
    let pem = std::fs::read(path).map_err(|e| file_err(flag, path, e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(flag, path, format!("not a PEM certificate file ({e})")))?;
    if certs.is_empty() {
        return Err(file_err(
            flag,
            path,
            "no certificate in it (expected PEM `BEGIN CERTIFICATE` blocks)",
        ));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    read_key_as("--tls-key-file", path)
}

fn read_key_as(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(|e| file_err(flag, path, e))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        file_err(
            flag,
            path,
            format!("no private key in it (expected a PEM `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY` block: {e})"),
        )
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_roots(ca: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    read_roots_as("--tls-ca-cert-file", ca)
}

fn read_roots_as(flag: &'static str, ca: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(flag, ca)? {
        roots
            .add(c)
            .map_err(|e| file_err(flag, ca, format!("not a usable CA certificate ({e})")))?;
    }
    Ok(Arc::new(roots))
}

/// The machine's trusted CAs (SSL_CERT_FILE / SSL_CERT_DIR when set, else the system's
/// store). Certificates that do not parse are skipped, as OpenSSL does; none at all is an
/// error that says to give `--cacert`.
fn system_roots() -> Result<Arc<RootCertStore>, TlsError> {
    let found = rustls_native_certs::load_native_certs().map_err(|e| {
        TlsError::Config(format!(
            "no --cacert, and this machine's trusted CAs could not be read ({e}); give --cacert FILE"
        ))
    })?;
    let mut roots = RootCertStore::empty();
    let (added, _skipped) = roots.add_parsable_certificates(found);
    if added == 0 {
        return Err(TlsError::Config(
            "no --cacert, and this machine trusts no CA (no system store, SSL_CERT_FILE unset); give --cacert FILE".into(),
        ));
    }
    Ok(Arc::new(roots))
}

/// The client-certificate check `tls-auth-clients` asks for.
fn client_verifier(
    f: &TlsFiles,
    auth: AuthClients,
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, TlsError> {
    let flag = "--tls-ca-cert-file";
    let ca = match (&f.ca, auth) {
        (_, AuthClients::No) => return Ok(None),
        (None, AuthClients::Yes) => return Err(TlsError::NoCa("yes (the default)")),
        (None, AuthClients::Optional) => return Err(TlsError::NoCa("optional")),
        (Some(ca), _) => ca,
    };
    let b = WebPkiClientVerifier::builder_with_provider(read_roots(ca)?, provider());
    let b = if auth == AuthClients::Optional {
        b.allow_unauthenticated()
    } else {
        b
    };
    b.build()
        .map(Some)
        .map_err(|e| file_err(flag, ca, format!("cannot verify clients with it ({e})")))
}

fn build(f: &TlsFiles) -> Result<Current, TlsError> {
    let clients = acceptor(f, f.auth_clients)?;
    let peers = match &f.ca {
        Some(ca) => Some((acceptor(f, AuthClients::Yes)?, connector(f, ca)?)),
        None => None,
    };
    Ok(Current { clients, peers })
}

fn pair_err(f: &TlsFiles, e: rustls::Error) -> TlsError {
    TlsError::Pair {
        cert: f.cert.clone(),
        key: f.key.clone(),
        why: format!("not a certificate and its private key ({e})"),
    }
}

fn acceptor(f: &TlsFiles, auth: AuthClients) -> Result<TlsAcceptor, TlsError> {
    let certs = read_certs("--tls-cert-file", &f.cert)?;
    let key = read_key(&f.key)?;
    let verifier = client_verifier(f, auth)?;
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let b = match verifier {
        Some(v) => b.with_client_cert_verifier(v),
        None => b.with_no_client_auth(),
    };
    let cfg = b.with_single_cert(certs, key).map_err(|e| pair_err(f, e))?;
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

/// A member calling its peers: trusts the CA, presents the server's own certificate.
fn connector(f: &TlsFiles, ca: &Path) -> Result<TlsConnector, TlsError> {
    let certs = read_certs("--tls-cert-file", &f.cert)?;
    let key = read_key(&f.key)?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(read_roots(ca)?)
        .with_client_auth_cert(certs, key)
        .map_err(|e| pair_err(f, e))?;
    Ok(TlsConnector::from(Arc::new(cfg)))
}

// Moved to the core (the client uses it and does not link the server); this path stays.
pub use stockgate_core::tls_hint::handshake_hint;

/// A client's TLS settings with redis-cli's flags (`stockgate top --tls`): trusts the CA
/// of `--cacert`, or without it the machine's trusted CAs as redis-cli does; presents
/// `--cert`/`--key` when given. The errors name those flags.
pub fn client_config(
    cacert: Option<&Path>,
    cert_key: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = match cacert {
        Some(ca) => read_roots_as("--cacert", ca)?,
        None => system_roots()?,
    };
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let cfg = match cert_key {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(read_certs("--cert", cert)?, read_key_as("--key", key)?)
            .map_err(|e| {
                TlsError::Config(format!(
                    "--cert {} and --key {}: not a certificate and its private key ({e})",
                    cert.display(),
                    key.display()
                ))
            })?,
    };
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> TlsFiles {
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: None,
            auth_clients: AuthClients::No,
        }
    }

    #[test]
    fn errors_name_the_file_and_flag() {
        let dir = std::env::temp_dir().join(format!("sg-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = files(&dir);
        let e = Tls::load(f.clone()).err().unwrap().to_string();
        assert!(e.starts_with("--tls-cert-file "), "{e}");
        assert!(e.contains("cert.pem"), "{e}");
        std::fs::write(&f.cert, "not pem at all\n").unwrap();
        let e = Tls::load(f.clone()).err().unwrap().to_string();
        assert!(e.contains("no certificate in it"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn auth_clients_parses_redis_words() {
        assert_eq!("YES".parse::<AuthClients>(), Ok(AuthClients::Yes));
        assert_eq!("optional".parse::<AuthClients>(), Ok(AuthClients::Optional));
        assert_eq!("no".parse::<AuthClients>(), Ok(AuthClients::No));
        assert!("maybe".parse::<AuthClients>().is_err());
    }
}
