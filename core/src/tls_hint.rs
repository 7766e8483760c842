//! The usual causes of a failed TLS handshake in an operator's words. Pure text matching
//! on the TLS stack's error message: no TLS library here. Shared by the server's tools
//! (`stockgate top`) and the client (`stockgate_client::tls`), which must not link the
//! server for it; the server re-exports it as `stockgate_server::tls::handshake_hint`.

/// The usual cause of a client's failed handshake, in an operator's words, from rustls's
/// error text (`invalid peer certificate: UnknownIssuer`, ...); None when it is not one
/// of them. The tools (`stockgate top`, the sweeper, the materializer) put it before
/// rustls's own words.
pub fn handshake_hint(text: &str) -> Option<&'static str> {
    if text.contains("UnknownIssuer") {
        Some("the server's certificate is not signed by the CA in --cacert (without --cacert: by a CA this machine trusts)")
    } else if text.contains("NotValidForName") {
        Some("the server's certificate does not name the host of --server")
    } else if text.contains("CertificateRequired") || text.contains("certificate required") {
        Some("the server requires a client certificate (--cert, --key)")
    } else if text.contains("UnknownCA") || text.contains("unknown ca") {
        Some("the server does not trust the CA of --cert")
    } else {
        None
    }
}
