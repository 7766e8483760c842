//! TLS on the tools' connection to a server (`--tls`, `--cacert`, `--cert`, `--key`, the
//! names redis-cli uses, or a `rediss://` address), through redis-rs's rustls support.
//!
//! The files are read and parsed once, at start-up, so that a missing or malformed file is
//! an error naming it before anything connects (redis-rs would only report "invalid
//! certificate" at the first connection, without the file). The loaded PEM bytes are kept
//! for the reconnections of the connection manager; `Debug` never shows them.
//!
//! The TLS stack is linked with the crate's `tls` feature only. Without it the flags still
//! parse, a plain connection works, and one that asks for TLS is refused with an error
//! naming the feature.

use std::path::{Path, PathBuf};

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args};
#[cfg(feature = "tls")]
use rustls_pki_types::pem::PemObject as _;
#[cfg(feature = "tls")]
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a connection that asks for TLS cannot be made by a build without the `tls` feature.
#[cfg(not(feature = "tls"))]
const NO_TLS: &str = "TLS was asked for (--tls or a rediss:// address), but this build of \
                      stockgate-client has no TLS support (its cargo feature `tls`)";

/// The TLS flags every tool that connects to a server takes.
#[derive(Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// Connect to the server over TLS (a `rediss://` address does too). Without --cacert
    /// the system's trusted roots verify the server's certificate.
    #[arg(long, env = "STOCKGATE_TLS", global = true, action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub tls: bool,
    /// PEM file of the CA certificate(s) that verify the server's certificate (with --tls).
    #[arg(long, env = "STOCKGATE_TLS_CACERT", value_name = "FILE", global = true)]
    pub cacert: Option<PathBuf>,
    /// PEM file of this client's certificate, for a server with --tls-auth-clients yes
    /// (with --key).
    #[arg(long, env = "STOCKGATE_TLS_CERT", value_name = "FILE", global = true)]
    pub cert: Option<PathBuf>,
    /// PEM file of the private key of --cert.
    #[arg(long, env = "STOCKGATE_TLS_KEY", value_name = "FILE", global = true)]
    pub key: Option<PathBuf>,
}

/// Why the TLS settings cannot be used. Never carries key material: only flags, paths and
/// the parser's reason.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file named by a flag cannot be read.
    #[error("{flag} {}: cannot read: {source}", path.display())]
    Read {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind the flag needs.
    #[error("{flag} {}: {reason}", path.display())]
    Parse {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The flags do not fit together.
    #[error("{0}")]
    Flags(String),
}

/// Loaded TLS settings: the CA and client certificate PEM, checked to parse.
#[derive(Clone, Default)]
pub struct TlsConfig {
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    root_cert: Option<Vec<u8>>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Which parts are set, never their bytes (the key is a secret).
        f.debug_struct("TlsConfig")
            .field("ca", &self.root_cert.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

impl TlsArgs {
    /// The settings these flags give for a connection to `server`: `None` when neither
    /// `--tls` nor a `rediss://` address asks for TLS. Reads and checks every file named.
    pub fn load(&self, server: &str) -> Result<Option<TlsConfig>, TlsError> {
        let wanted = self.tls || is_tls_url(server);
        if !wanted {
            if self.cacert.is_some() || self.cert.is_some() || self.key.is_some() {
                return Err(TlsError::Flags(
                    "--cacert, --cert and --key need --tls (or a rediss:// address)".into(),
                ));
            }
            return Ok(None);
        }
        TlsConfig::from_files(
            self.cacert.as_deref(),
            self.cert.as_deref(),
            self.key.as_deref(),
        )
        .map(Some)
    }
}

impl TlsConfig {
    /// Reads the CA file and the client certificate and key (both or neither), checking that
    /// each parses as PEM of its kind.
    pub fn from_files(
        cacert: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<TlsConfig, TlsError> {
        #[cfg(not(feature = "tls"))]
        {
            let _ = (cacert, cert, key);
            Err(TlsError::Flags(NO_TLS.into()))
        }
        #[cfg(feature = "tls")]
        Self::read_files(cacert, cert, key)
    }

    #[cfg(feature = "tls")]
    fn read_files(
        cacert: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<TlsConfig, TlsError> {
        let root_cert = cacert.map(|p| read_certs("--cacert", p)).transpose()?;
        let client = match (cert, key) {
            (Some(c), Some(k)) => Some((read_certs("--cert", c)?, read_key("--key", k)?)),
            (None, None) => None,
            (Some(_), None) => return Err(TlsError::Flags("--cert needs --key".into())),
            (None, Some(_)) => return Err(TlsError::Flags("--key needs --cert".into())),
        };
        Ok(TlsConfig { root_cert, client })
    }

    #[cfg(feature = "tls")]
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_cert.clone(),
        }
    }
}

fn is_tls_url(addr: &str) -> bool {
    addr.get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
}

#[cfg(feature = "tls")]
fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

#[cfg(feature = "tls")]
fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(flag, path)?;
    let parse = |reason: String| TlsError::Parse {
        flag,
        path: path.to_owned(),
        reason,
    };
    let mut n = 0;
    for c in CertificateDer::pem_slice_iter(&pem) {
        c.map_err(|e| parse(format!("not a PEM certificate: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(parse("no PEM certificate in the file".into()));
    }
    Ok(pem)
}

#[cfg(feature = "tls")]
fn read_key(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(flag, path)?;
    // The parser's error names the PEM section it expected, never the bytes.
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Parse {
        flag,
        path: path.to_owned(),
        reason: format!("no PEM private key in the file: {e}"),
    })?;
    Ok(pem)
}

/// `addr` may be `host:port` or a `redis://`/`rediss://` URL (with credentials for AUTH).
pub fn to_url(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("redis://{addr}")
    }
}

/// A redis-rs client for `addr`: over TLS with `tls` (a `redis://` address becomes
/// `rediss://`), or when the address is `rediss://` (then verified by the system's roots).
pub fn redis_client(addr: &str, tls: Option<&TlsConfig>) -> redis::RedisResult<redis::Client> {
    let mut url = to_url(addr);
    let Some(tls) = tls else {
        return redis::Client::open(url);
    };
    #[cfg(not(feature = "tls"))]
    {
        let _ = (tls, &mut url);
        Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "no TLS support",
            NO_TLS.to_string(),
        )))
    }
    #[cfg(feature = "tls")]
    {
        if !is_tls_url(&url) {
            if let Some(rest) = url.strip_prefix("redis://") {
                url = format!("rediss://{rest}");
            }
        }
        redis::Client::build_with_tls(url, tls.certificates())
    }
}

/// A connection error in an operator's words when it is a failed TLS handshake with a
/// usual cause (`stockgate_core::tls_hint::handshake_hint`); other errors unchanged.
pub fn explain(e: redis::RedisError) -> redis::RedisError {
    let text = e.to_string();
    match stockgate_core::tls_hint::handshake_hint(&text) {
        Some(hint) => {
            redis::RedisError::from((e.kind(), "TLS handshake failed", format!("{hint}: {text}")))
        }
        None => e,
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_in_errors_and_flags_must_fit() {
        let dir = std::env::temp_dir().join(format!("sg-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let bad = dir.join("bad.pem");
        std::fs::write(&bad, "not pem\n").expect("write");
        let e = TlsConfig::from_files(Some(&bad), None, None)
            .expect_err("garbage CA")
            .to_string();
        assert!(e.contains("--cacert") && e.contains("bad.pem"), "{e}");
        let missing = dir.join("missing.pem");
        let e = TlsConfig::from_files(None, Some(&missing), Some(&bad))
            .expect_err("missing cert")
            .to_string();
        assert!(e.contains("--cert") && e.contains("missing.pem"), "{e}");
        let e = TlsConfig::from_files(None, Some(&bad), None)
            .expect_err("cert without key")
            .to_string();
        assert!(e.contains("--key"), "{e}");
        let args = TlsArgs {
            cacert: Some(bad),
            ..TlsArgs::default()
        };
        assert!(args.load("127.0.0.1:1").is_err());
        assert!(TlsArgs::default()
            .load("127.0.0.1:1")
            .expect("plain")
            .is_none());
        assert!(TlsArgs::default()
            .load("rediss://127.0.0.1:1")
            .expect("rediss")
            .is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
