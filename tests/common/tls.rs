//! A test CA made with the `openssl` command, for the tests of TLS (tests/ops/ops_tls.rs,
//! tests/cluster/cluster_tls.rs).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`<name>-ca.pem`), a server certificate for 127.0.0.1/localhost
/// (`<name>-server.pem`, `-server.key`) and a client certificate (`<name>-client.pem`,
/// `-client.key`) signed by it, all P-256.
pub fn make_pki(dir: &Path, name: &str) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let ca_key = format!("{name}-ca.key");
    let ca = format!("{name}-ca.pem");
    let subj = format!("/CN=stockgate test CA {name}");
    let mut req = vec!["req", "-x509", "-nodes", "-days", "2"];
    req.extend(ec);
    req.extend(["-keyout", &ca_key, "-out", &ca, "-subj", &subj]);
    openssl(dir, &req);
    // A member's certificate is also its client certificate towards its peers
    // (--tls-replication): both usages.
    for (who, usage) in [
        ("server", "serverAuth,clientAuth"),
        ("client", "clientAuth"),
    ] {
        let ext = format!("{name}-{who}.ext");
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        let (key, csr, pem) = (
            format!("{name}-{who}.key"),
            format!("{name}-{who}.csr"),
            format!("{name}-{who}.pem"),
        );
        let mut req = vec!["req", "-new", "-nodes"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &pem,
            ],
        );
    }
}
