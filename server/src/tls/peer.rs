//! This node calling another node over TLS (`--tls-cluster`'s `ROLE` probes and
//! `SALE.MIGRATE` handovers), with the connector of [`super::Tls::peers`]: it trusts
//! `--tls-ca-cert-file` and presents the node's own certificate. The name checked in the
//! peer's certificate is the host of its address, an IP or a DNS name.

use std::io;
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use tokio_rustls::TlsConnector;

/// A blocking TLS link to a peer.
pub type BlockingLink = StreamOwned<ClientConnection, TcpStream>;

/// The name a peer at `host` must present: `host` itself (an IPv6 address without its
/// brackets).
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("'{host}' cannot be checked against a certificate ({e})"))
}

/// The usual cause of a failed handshake with a peer, in an operator's words, before
/// rustls's own.
pub fn explain(text: &str) -> String {
    let hint = if text.contains("InvalidContentType") || text.contains("corrupt message") {
        Some("the peer does not speak TLS on this port (the map must name every node's TLS port)")
    } else if text.contains("UnknownIssuer") {
        Some("the peer's certificate is not signed by this node's --tls-ca-cert-file")
    } else if text.contains("NotValidForName") {
        Some("the peer's certificate does not name the host of its address in the map")
    } else if text.contains("CertificateRequired") || text.contains("certificate required") {
        Some("the peer requires a client certificate")
    } else if text.contains("UnknownCA") || text.contains("unknown ca") {
        Some("the peer does not trust the CA of this node's certificate")
    } else {
        None
    };
    match hint {
        Some(h) => format!("TLS handshake failed: {h}: {text}"),
        None => format!("TLS handshake failed: {text}"),
    }
}

/// A blocking TLS link over `tcp`, its handshake finished here, so a failure means no
/// byte of a command was sent. The socket's timeouts bound the handshake.
pub fn connect_blocking(
    tcp: TcpStream,
    host: &str,
    config: Arc<ClientConfig>,
) -> Result<BlockingLink, String> {
    let name = server_name(host)?;
    let conn = ClientConnection::new(config, name).map_err(|e| explain(&e.to_string()))?;
    let mut link = StreamOwned::new(conn, tcp);
    while link.conn.is_handshaking() {
        link.conn
            .complete_io(&mut link.sock)
            .map_err(|e| explain(&e.to_string()))?;
    }
    Ok(link)
}

/// An async TLS link over `tcp` (the caller bounds it in time).
pub async fn connect_async(
    tcp: tokio::net::TcpStream,
    host: &str,
    connector: &TlsConnector,
) -> io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let name = server_name(host).map_err(io::Error::other)?;
    connector.connect(name, tcp).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_hosts_of_addresses() {
        assert!(matches!(
            server_name("127.0.0.1"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(server_name("[::1]"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(
            server_name("node-1.example"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name("not a name").is_err());
        assert!(
            explain("received corrupt message of type InvalidContentType")
                .contains("does not speak TLS")
        );
    }
}
