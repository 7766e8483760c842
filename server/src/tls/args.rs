//! The TLS flags of `stockgate serve`, with Redis's names (`tls-port` is
//! `--tls-port`, ...), flattened into the server's flags.

use std::path::PathBuf;

use clap::Args;

use super::{AuthClients, TlsFiles};
use crate::cli::int_in;

/// The `serve` flags of TLS, with Redis's names.
#[derive(Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// Serve TLS on this port too, beside the plain --port (0 picks a free one; the
    /// stdout line `listening on ADDR (tls)` says which). With --port 0 and a port
    /// other than 0 here, only TLS is served. Needs --tls-cert-file and --tls-key-file.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u16>(0, 65535))]
    pub tls_port: Option<u16>,
    /// The server's certificate chain (PEM), leaf first. Re-read when it changes.
    #[arg(long, value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM: PKCS#8, PKCS#1 or SEC1). Re-read when it
    /// changes.
    #[arg(long, value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to. Re-read when it
    /// changes.
    #[arg(long, value_name = "PATH")]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// yes: clients must present a certificate from --tls-ca-cert-file (as Redis, the
    /// default; needs the CA file); optional: one that is presented must be valid; no:
    /// none is asked for.
    #[arg(long, value_name = "yes|no|optional", default_value = "yes")]
    pub tls_auth_clients: String,
    /// yes: serve --metrics-addr over HTTPS with the TLS port's certificate and its
    /// client-certificate rule (--tls-auth-clients). Needs --tls-port.
    #[arg(long, value_name = "yes|no", default_value = "no")]
    pub metrics_tls: String,
    /// yes: a Raft member's links to its peers (--raft-listen and its calls) over TLS,
    /// both ends presenting --tls-cert-file and checked against --tls-ca-cert-file (as
    /// Redis's tls-replication). Needs --tls-port and --tls-ca-cert-file.
    #[arg(long, value_name = "yes|no", default_value = "no")]
    pub tls_replication: String,
    /// yes: this node's links to the other nodes of the cluster (the ROLE probes that
    /// find the other groups' leaders, SALE.MIGRATE's handover) over TLS, presenting
    /// --tls-cert-file and checking theirs against --tls-ca-cert-file (as Redis's
    /// tls-cluster). The cluster map must then name every node's TLS port. Needs
    /// --cluster-enabled yes, --tls-port and --tls-ca-cert-file.
    #[arg(long, value_name = "yes|no", default_value = "no")]
    pub tls_cluster: String,
}

impl TlsArgs {
    /// `--tls-replication`: whether the Raft links are TLS.
    pub fn replication_tls(&self) -> Result<bool, String> {
        match self.tls_replication.to_ascii_lowercase().as_str() {
            "no" => Ok(false),
            "yes" if self.tls_port.is_none() => {
                Err("--tls-replication yes needs --tls-port (and its certificate files)".into())
            }
            "yes" if self.tls_ca_cert_file.is_none() => Err("--tls-replication yes needs --tls-ca-cert-file (the CA the members' certificates are checked against)".into()),
            "yes" => Ok(true),
            other => Err(format!("--tls-replication {other}: must be yes or no")),
        }
    }

    /// `--tls-cluster`: whether the links to the cluster's other nodes are TLS.
    pub fn cluster_tls(&self) -> Result<bool, String> {
        match self.tls_cluster.to_ascii_lowercase().as_str() {
            "no" => Ok(false),
            "yes" if self.tls_port.is_none() => {
                Err("--tls-cluster yes needs --tls-port (and its certificate files)".into())
            }
            "yes" if self.tls_ca_cert_file.is_none() => Err("--tls-cluster yes needs --tls-ca-cert-file (the CA the other nodes' certificates are checked against)".into()),
            "yes" => Ok(true),
            other => Err(format!("--tls-cluster {other}: must be yes or no")),
        }
    }

    /// `--metrics-tls`: whether the metrics endpoint serves HTTPS.
    pub fn metrics_tls(&self) -> Result<bool, String> {
        match self.metrics_tls.to_ascii_lowercase().as_str() {
            "no" => Ok(false),
            "yes" if self.tls_port.is_some() => Ok(true),
            "yes" => {
                Err("--metrics-tls yes needs --tls-port (it serves that port's certificate)".into())
            }
            other => Err(format!("--metrics-tls {other}: must be yes or no")),
        }
    }

    /// The files to serve TLS with, when `--tls-port` is given; the other flags without
    /// it are refused, so a forgotten port is not a silently plain server.
    pub fn files(&self) -> Result<Option<(u16, TlsFiles)>, String> {
        let auth_clients: AuthClients = self
            .tls_auth_clients
            .parse()
            .map_err(|e| format!("--tls-auth-clients {}: {e}", self.tls_auth_clients))?;
        let Some(port) = self.tls_port else {
            if self.tls_cert_file.is_some()
                || self.tls_key_file.is_some()
                || self.tls_ca_cert_file.is_some()
            {
                return Err("--tls-cert-file, --tls-key-file and --tls-ca-cert-file need --tls-port (the port that serves TLS)".into());
            }
            return Ok(None);
        };
        let cert = self
            .tls_cert_file
            .clone()
            .ok_or("--tls-port needs --tls-cert-file (the server's certificate, PEM)")?;
        let key = self
            .tls_key_file
            .clone()
            .ok_or("--tls-port needs --tls-key-file (the certificate's private key, PEM)")?;
        Ok(Some((
            port,
            TlsFiles {
                cert,
                key,
                ca: self.tls_ca_cert_file.clone(),
                auth_clients,
            },
        )))
    }
}
