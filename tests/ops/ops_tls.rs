//! TLS on the RESP port (`--tls-port`, docs/operations.md "TLS") with real clients:
//! redis-cli `--tls`, redis-py `ssl=True` and ioredis' `tls` option reserve over TLS with
//! a test CA made by the `openssl` command; client certificates required (a client
//! without one is refused, one with a certificate from the CA is served), optional, and
//! not asked for; a plain-TCP client on the TLS port fails and the server keeps serving;
//! a replaced certificate serves new connections while open ones keep going; start-up
//! errors name the file.

use crate::common::ha::free_port;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use stockgate_testkit::KillOnDrop;

use crate::common::node::Clients;
use crate::common::tls::make_pki;
use crate::common::*;

/// Runs a command to completion, failing the test if it cannot start.
fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// A server with a plain and a TLS port, both picked free.
struct TlsServer {
    child: Child,
    plain: u16,
    tls: u16,
    data: PathBuf,
    _dir: TempDir,
}

impl TlsServer {
    fn start(tls_flags: &[&str]) -> TlsServer {
        let dir = TempDir::new("tls");
        let data = dir.path().join("data");
        let mut child = Command::new(server_bin())
            .args(["--port", "0", "--tls-port", "0", "--data-dir"])
            .arg(&data)
            .args(tls_flags)
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn stockgate");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut port = |suffix: &str| {
            let l = lines.next().expect("a line").expect("read");
            let addr = l
                .strip_prefix("listening on ")
                .and_then(|a| a.strip_suffix(suffix))
                .unwrap_or_else(|| panic!("unexpected line {l:?}"));
            addr.rsplit(':').next().unwrap().parse::<u16>().unwrap()
        };
        let plain = port("");
        let tls = port(" (tls)");
        TlsServer {
            child,
            plain,
            tls,
            data,
            _dir: dir,
        }
    }

    /// redis-cli on the plain port.
    fn plain_cli(&self, args: &[&str]) -> String {
        let out = run(Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.plain.to_string()])
            .args(args));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn mint(&self, sku: &str, user: &str) -> String {
        let out = run(Command::new(server_bin())
            .args(["mint-token", "--data-dir"])
            .arg(&self.data)
            .args(["--sku", sku, "--user", user]));
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn info_field(&self, name: &str) -> u64 {
        let info = self.plain_cli(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name} not in INFO: {info}"))
            .parse()
            .unwrap()
    }

    /// A sale of 100 units and the argv of a RESERVE of it by `user`.
    fn reserve_argv(&self, sku: &str, user: &str, req: &str) -> Vec<String> {
        if !self.plain_cli(&["SALE.INFO", sku]).contains("total") {
            assert_eq!(self.plain_cli(&["SALE.CREATE", sku, "100"]), "OK");
        }
        let token = self.mint(sku, user);
        ["RESERVE", sku, user, &token, req]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client certificate and key flags of one client, or none.
#[derive(Clone, Copy)]
struct Client<'a> {
    ca: &'a Path,
    cert: Option<(&'a Path, &'a Path)>,
}

fn redis_cli_tls(port: u16, c: Client<'_>, argv: &[String]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args([
        "--tls",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--cacert",
    ])
    .arg(c.ca);
    if let Some((cert, key)) = c.cert {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = run(cmd.args(argv));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn cert_args(c: Client<'_>) -> [PathBuf; 2] {
    match c.cert {
        Some((cert, key)) => [cert.to_path_buf(), key.to_path_buf()],
        None => [PathBuf::from("-"), PathBuf::from("-")],
    }
}

fn redis_py_tls(port: u16, c: Client<'_>, argv: &[String]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/tls.py");
    let out = run(Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .arg(c.ca)
        .args(cert_args(c))
        .args(argv));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ioredis_tls(port: u16, c: Client<'_>, argv: &[String]) -> String {
    let out = run(Clients::Newest
        .script("tls.js")
        .arg(port.to_string())
        .arg(c.ca)
        .args(cert_args(c))
        .args(argv));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

type Runner = fn(u16, Client<'_>, &[String]) -> String;
const CLIENTS: [(&str, Runner); 3] = [
    ("redis-cli", redis_cli_tls),
    ("redis-py", redis_py_tls),
    ("ioredis", ioredis_tls),
];

fn pki() -> (TempDir, PathBuf) {
    let dir = TempDir::new("tls-pki");
    make_pki(dir.path(), "a");
    make_pki(dir.path(), "b");
    let p = dir.path().to_path_buf();
    (dir, p)
}

fn server_flags(p: &Path, name: &str) -> Vec<String> {
    [
        "--tls-cert-file".to_string(),
        p.join(format!("{name}-server.pem")).display().to_string(),
        "--tls-key-file".to_string(),
        p.join(format!("{name}-server.key")).display().to_string(),
    ]
    .to_vec()
}

fn start(flags: &[String]) -> TlsServer {
    let v: Vec<&str> = flags.iter().map(String::as_str).collect();
    TlsServer::start(&v)
}

#[test]
fn client_certificates_required_refuse_a_client_without_one() {
    let (_d, p) = pki();
    let mut flags = server_flags(&p, "a");
    flags.extend([
        "--tls-ca-cert-file".into(),
        p.join("a-ca.pem").display().to_string(),
    ]);
    let srv = start(&flags);
    let ca = p.join("a-ca.pem");
    let (cert, key) = (p.join("a-client.pem"), p.join("a-client.key"));
    let with = Client {
        ca: &ca,
        cert: Some((&cert, &key)),
    };
    let without = Client {
        ca: &ca,
        cert: None,
    };
    let (bcert, bkey) = (p.join("b-client.pem"), p.join("b-client.key"));
    let other_ca = Client {
        ca: &ca,
        cert: Some((&bcert, &bkey)),
    };
    for (i, (name, client)) in CLIENTS.iter().enumerate() {
        let argv = srv.reserve_argv("TLSREQ", &format!("u{i}"), "r1");
        let before = srv.info_field("tls_handshake_failures");
        let out = client(srv.tls, without, &argv);
        assert!(
            !out.contains("RESERVED"),
            "{name} without a certificate: {out}"
        );
        let out = client(srv.tls, other_ca, &argv);
        assert!(
            !out.contains("RESERVED"),
            "{name} with another CA's certificate: {out}"
        );
        let failures = srv.info_field("tls_handshake_failures");
        assert!(failures >= before + 2, "{name}: {before} -> {failures}");
        let out = client(srv.tls, with, &argv);
        assert!(out.contains("RESERVED"), "{name} with a certificate: {out}");
    }
    // Each client reserved once, and the refused attempts took nothing.
    let stock = srv.plain_cli(&["STOCK", "TLSREQ"]);
    assert_eq!(stock, "97");
    assert!(srv.info_field("tls_connections_received") >= 9);
}

#[test]
fn client_certificates_not_asked_for_or_optional() {
    let (_d, p) = pki();
    let ca = p.join("a-ca.pem");
    let (cert, key) = (p.join("a-client.pem"), p.join("a-client.key"));
    let (bcert, bkey) = (p.join("b-client.pem"), p.join("b-client.key"));
    // `no`: no CA needed, any client that trusts the server's CA is served.
    let mut flags = server_flags(&p, "a");
    flags.extend(["--tls-auth-clients".into(), "no".into()]);
    let srv = start(&flags);
    for (i, (name, client)) in CLIENTS.iter().enumerate() {
        let argv = srv.reserve_argv("TLSNO", &format!("u{i}"), "r1");
        let out = client(
            srv.tls,
            Client {
                ca: &ca,
                cert: None,
            },
            &argv,
        );
        assert!(out.contains("RESERVED"), "{name}: {out}");
    }
    drop(srv);
    // `optional`: none is fine; one that is sent must be from the CA.
    let mut flags = server_flags(&p, "a");
    flags.extend([
        "--tls-auth-clients".into(),
        "optional".into(),
        "--tls-ca-cert-file".into(),
        ca.display().to_string(),
    ]);
    let srv = start(&flags);
    for (i, (name, client)) in CLIENTS.iter().enumerate() {
        let argv = srv.reserve_argv("TLSOPT", &format!("u{i}"), "r1");
        let bad = Client {
            ca: &ca,
            cert: Some((&bcert, &bkey)),
        };
        let out = client(srv.tls, bad, &argv);
        assert!(
            !out.contains("RESERVED"),
            "{name} with another CA's cert: {out}"
        );
        let out = client(
            srv.tls,
            Client {
                ca: &ca,
                cert: None,
            },
            &argv,
        );
        assert!(out.contains("RESERVED"), "{name} without a cert: {out}");
        let good = Client {
            ca: &ca,
            cert: Some((&cert, &key)),
        };
        let out = client(srv.tls, good, &argv);
        assert!(out.contains("REPLAY"), "{name} with a cert: {out}");
    }
}

#[test]
fn a_plain_client_on_the_tls_port_fails_and_the_server_keeps_serving() {
    let (_d, p) = pki();
    let mut flags = server_flags(&p, "a");
    // Two event loops: each has its own TLS listener on the port (SO_REUSEPORT).
    flags.extend(["--tls-auth-clients", "no", "--threads", "2"].map(String::from));
    let srv = start(&flags);
    for _ in 0..3 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", srv.tls)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut got = Vec::new();
        // The server closes the connection (after a TLS alert at most): never a reply.
        let _ = s.read_to_end(&mut got);
        assert!(
            !String::from_utf8_lossy(&got).contains("PONG"),
            "plain reply on the TLS port: {got:?}"
        );
    }
    // redis-cli without --tls on the TLS port fails too.
    let out = run(Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &srv.tls.to_string(), "PING"])
        .stdin(Stdio::null()));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PONG"));
    assert!(srv.info_field("tls_handshake_failures") >= 4);
    // Both ports still serve.
    assert_eq!(srv.plain_cli(&["PING"]), "PONG");
    let ca = p.join("a-ca.pem");
    let argv = vec!["PING".to_string()];
    let out = redis_cli_tls(
        srv.tls,
        Client {
            ca: &ca,
            cert: None,
        },
        &argv,
    );
    assert!(out.contains("PONG"), "{out}");
    // Every TLS client has left (the server notices each close within moments).
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.info_field("tls_connected_clients") != 0 {
        assert!(
            Instant::now() < deadline,
            "a TLS client still counted as connected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replaces a file the way a deployment tool does: write beside it, rename over it.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

#[test]
fn a_replaced_certificate_serves_new_connections_and_open_ones_keep_going() {
    let (_d, p) = pki();
    let live = p.join("live");
    std::fs::create_dir_all(&live).unwrap();
    let (cert, key) = (live.join("server.pem"), live.join("server.key"));
    std::fs::copy(p.join("a-server.pem"), &cert).unwrap();
    std::fs::copy(p.join("a-server.key"), &key).unwrap();
    let flags: Vec<String> = [
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-auth-clients",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let srv = start(&flags);
    let (ca_a, ca_b) = (p.join("a-ca.pem"), p.join("b-ca.pem"));
    let ping = vec!["PING".to_string()];
    let trusts_a = Client {
        ca: &ca_a,
        cert: None,
    };
    let trusts_b = Client {
        ca: &ca_b,
        cert: None,
    };
    assert!(redis_cli_tls(srv.tls, trusts_a, &ping).contains("PONG"));
    assert!(!redis_cli_tls(srv.tls, trusts_b, &ping).contains("PONG"));
    // A connection opened before the reload.
    let mut held = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/tls.py"))
        .arg(srv.tls.to_string())
        .arg(&ca_a)
        .args(["-", "-", "--hold", "PING"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut held_out = BufReader::new(held.stdout.take().unwrap());
    let mut first = String::new();
    held_out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "True", "held connection: {first}");

    // The key first, then the certificate, as a tool replacing both would.
    replace(&p.join("b-server.key"), &key);
    replace(&p.join("b-server.pem"), &cert);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis_cli_tls(srv.tls, trusts_b, &ping).contains("PONG") {
        assert!(
            Instant::now() < deadline,
            "the new certificate never served"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!redis_cli_tls(srv.tls, trusts_a, &ping).contains("PONG"));
    assert_eq!(srv.info_field("tls_cert_reloads"), 1);
    assert_eq!(srv.info_field("tls_cert_reload_failures"), 0);
    let argv = srv.reserve_argv("TLSRELOAD", "alice", "r1");
    assert!(redis_py_tls(srv.tls, trusts_b, &argv).contains("RESERVED"));
    // The connection from before still works, on the certificate it shook hands with.
    held.stdin.take().unwrap().write_all(b"\n").unwrap();
    let mut second = String::new();
    held_out.read_line(&mut second).unwrap();
    assert_eq!(
        second.trim(),
        "True",
        "held connection after reload: {second}"
    );
    assert!(held.wait().unwrap().success());

    // A broken replacement is refused and the last good certificate keeps serving.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.info_field("tls_cert_reload_failures") == 0 {
        assert!(
            Instant::now() < deadline,
            "the broken file was never looked at"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(redis_cli_tls(srv.tls, trusts_b, &ping).contains("PONG"));
}

#[test]
fn the_metrics_endpoint_over_https() {
    let (_d, p) = pki();
    let port = stockgate_testkit::ports::reserve().expect("free port");
    let mut flags = server_flags(&p, "a");
    flags.extend(
        [
            "--tls-ca-cert-file",
            p.join("a-ca.pem").to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--metrics-tls",
            "yes",
        ]
        .map(String::from),
    );
    let _srv = start(&flags);
    let url = format!("https://127.0.0.1:{port}/metrics");
    let curl = |extra: &[&str]| {
        let out = run(Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(p.join("a-ca.pem"))
            .args(extra)
            .arg(&url));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cert = p.join("a-client.pem").display().to_string();
    let key = p.join("a-client.key").display().to_string();
    // The endpoint binds beside the RESP port: ask until it answers (bounded).
    let deadline = Instant::now() + Duration::from_secs(15);
    let body = loop {
        let body = curl(&["--cert", &cert, "--key", &key]);
        if body.contains("stockgate_") || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(body.contains("stockgate_"), "{body}");
    // The RESP port's client-certificate rule holds here too (asked once the endpoint
    // is known to serve, so a refusal is the rule, not a port not yet open).
    assert!(
        !curl(&[]).contains("stockgate_"),
        "served without a client certificate"
    );
    // Plain HTTP on the HTTPS port gets nothing.
    let out = run(Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://127.0.0.1:{port}/metrics")));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("stockgate_"));
}

fn start_error(flags: &[&str]) -> String {
    let dir = TempDir::new("tls-err");
    let out = run(Command::new(server_bin())
        .args(["--port", "0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(flags));
    assert!(!out.status.success(), "started with {flags:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn start_up_errors_name_the_file() {
    let (_d, p) = pki();
    let s = |n: &str| p.join(n).display().to_string();
    let missing = s("missing.pem");
    let err = start_error(&[
        "--tls-port",
        "0",
        "--tls-cert-file",
        &missing,
        "--tls-key-file",
        &s("a-server.key"),
        "--tls-auth-clients",
        "no",
    ]);
    assert!(err.contains(&format!("--tls-cert-file {missing}")), "{err}");
    assert!(err.contains("No such file"), "{err}");
    let garbage = s("a-server.ext");
    let err = start_error(&[
        "--tls-port",
        "0",
        "--tls-cert-file",
        &s("a-server.pem"),
        "--tls-key-file",
        &garbage,
        "--tls-auth-clients",
        "no",
    ]);
    assert!(
        err.contains(&format!("--tls-key-file {garbage}: no private key")),
        "{err}"
    );
    let err = start_error(&[
        "--tls-port",
        "0",
        "--tls-cert-file",
        &s("a-server.pem"),
        "--tls-key-file",
        &s("b-server.key"),
        "--tls-auth-clients",
        "no",
    ]);
    assert!(
        err.contains("not a certificate and its private key"),
        "{err}"
    );
    assert!(err.contains(&s("b-server.key")), "{err}");
    let err = start_error(&[
        "--tls-port",
        "0",
        "--tls-cert-file",
        &s("a-server.pem"),
        "--tls-key-file",
        &s("a-server.key"),
    ]);
    assert!(err.contains("needs --tls-ca-cert-file"), "{err}");
    let err = start_error(&["--tls-cert-file", &s("a-server.pem")]);
    assert!(err.contains("need --tls-port"), "{err}");
    let err = start_error(&["--tls-port", "0"]);
    assert!(err.contains("--tls-port needs --tls-cert-file"), "{err}");
    let err = start_error(&["--metrics-tls", "yes"]);
    assert!(err.contains("--metrics-tls yes needs --tls-port"), "{err}");
}

/// A free port on loopback (bound and released; the server binds it moments later).

#[test]
fn a_raft_group_replicates_over_tls() {
    let (_d, p) = pki();
    let dir = TempDir::new("tls-raft");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("k1 {}\n", "ab".repeat(32))).unwrap();
    let key = dir.path().join("reservation.key");
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| (free_port(), free_port(), free_port()))
        .collect();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, (c, r, _))| format!("{}=127.0.0.1:{c}/127.0.0.1:{r}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    for (i, (c, r, t)) in ports.iter().enumerate() {
        let mut child = Command::new(server_bin())
            .args(["--port", &c.to_string(), "--tls-port", &t.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join(format!("n{i}")))
            .arg("--secret-file")
            .arg(&secret)
            .arg("--reservation-key-file")
            .arg(&key)
            .args(["--create-keys", "--raft-id", &(i + 1).to_string()])
            .args([
                "--raft-listen",
                &format!("127.0.0.1:{r}"),
                "--raft-peers",
                &peers,
            ])
            // One member forms the group.
            .args(if i == 0 {
                &["--raft-bootstrap"][..]
            } else {
                &[]
            })
            .args(server_flags(&p, "a"))
            .arg("--tls-ca-cert-file")
            .arg(p.join("a-ca.pem"))
            .args(["--tls-auth-clients", "no", "--tls-replication", "yes"])
            .env("STOCKGATE_LOG", "warn,openraft=error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn member");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening on"), "member {i}: {line:?}");
        members.push(KillOnDrop(child));
    }
    // A leader is elected over the TLS links.
    let cli = |port: u16, args: &[&str]| {
        let out = run(Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        if let Some(l) = ports
            .iter()
            .find(|(c, _, _)| cli(*c, &["ROLE"]).lines().next() == Some("master"))
        {
            break *l;
        }
        assert!(Instant::now() < deadline, "no leader over TLS links");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(cli(leader.0, &["SALE.CREATE", "TLSRAFT", "10"]), "OK");
    let out = run(Command::new(server_bin())
        .args(["mint-token", "--secret-file"])
        .arg(&secret)
        .args(["--sku", "TLSRAFT", "--user", "alice"]));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // A reply leaves once a majority has the record: RESERVED means a follower took it
    // over a TLS link.
    let argv: Vec<String> = ["RESERVE", "TLSRAFT", "alice", &token, "r1"]
        .map(String::from)
        .to_vec();
    let ca = p.join("a-ca.pem");
    let out = redis_cli_tls(
        leader.2,
        Client {
            ca: &ca,
            cert: None,
        },
        &argv,
    );
    assert!(out.contains("RESERVED"), "{out}");
    // The Raft port speaks nothing but TLS: plain bytes get the connection closed.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", leader.1)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.len() < 64, "a plain frame got an answer: {got:?}");
    drop(members);
}

/// A binary of the workspace beside the server's (target/<profile>/).
fn tool_bin(name: &str) -> PathBuf {
    server_bin().with_file_name(name)
}

/// `tool` with `args`, bounded (a hung handshake fails the test instead of hanging it).
fn tool(name: &str, args: &[&OsStr]) -> Output {
    run(Command::new("timeout")
        .arg("60")
        .arg(tool_bin(name))
        .args(args)
        .env("STOCKGATE_LOG", "warn"))
}

use std::ffi::OsStr;

/// `--tls --cacert CA --cert CERT --key KEY` of pki `name`'s client certificate.
fn tool_tls(p: &Path, ca: &str, client: &str) -> Vec<std::ffi::OsString> {
    vec![
        "--tls".into(),
        "--cacert".into(),
        p.join(format!("{ca}-ca.pem")).into(),
        "--cert".into(),
        p.join(format!("{client}-client.pem")).into(),
        "--key".into(),
        p.join(format!("{client}-client.key")).into(),
    ]
}

fn os(v: &[std::ffi::OsString]) -> Vec<&OsStr> {
    v.iter().map(|s| s.as_os_str()).collect()
}

fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The sweeper and the materializer against a server that requires client certificates,
/// with only its TLS port to talk to: the sweeper creates a sale and sweeps an expired
/// hold, the materializer writes a committed order into the ledger, `stockgate top
/// --once` shows the sale, and each tool given a wrong CA stops with a plain-words error.
#[test]
fn the_tools_work_over_tls_with_client_certificates_required() {
    use stockgate_testkit::pgtemp::TempPostgres;
    let (_d, p) = pki();
    let mut flags = server_flags(&p, "a");
    flags.extend([
        "--tls-ca-cert-file".into(),
        p.join("a-ca.pem").display().to_string(),
    ]);
    let srv = start(&flags);
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let server = format!("127.0.0.1:{}", srv.tls);
    let tls = tool_tls(&p, "a", "a");
    let common_args = |extra: &[&str]| -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec![
            "--database-url".into(),
            pg.url().into(),
            "--server".into(),
            server.clone().into(),
        ];
        v.extend(tls.iter().cloned());
        v.extend(extra.iter().map(|s| s.into()));
        v
    };

    // The sweeper creates the sale over TLS (and registers it in the ledger).
    let out = tool(
        "stockgate-sweeper",
        &os(&common_args(&[
            "create-sale",
            "--sku",
            "TLSW",
            "--total",
            "10",
            "--ttl-ms",
            "300",
        ])),
    );
    assert!(out.status.success(), "create-sale: {}", stderr_of(&out));
    assert!(stdout_of(&out).contains("created TLSW"));

    // A hold that expires, with no order (its application died before writing one).
    let client = Client {
        ca: &p.join("a-ca.pem"),
        cert: Some((&p.join("a-client.pem"), &p.join("a-client.key"))),
    };
    let argv = srv.reserve_argv("TLSW", "u1", "r1");
    let out = redis_cli_tls(srv.tls, client, &argv);
    assert!(out.contains("RESERVED"), "{out}");
    assert_eq!(srv.plain_cli(&["STOCK", "TLSW"]), "9");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = tool(
            "stockgate-sweeper",
            &os(&common_args(&["run", "--once", "--sku", "TLSW"])),
        );
        assert!(out.status.success(), "run --once: {}", stderr_of(&out));
        if stdout_of(&out).contains("released 1 ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never swept: {}",
            stdout_of(&out)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(srv.plain_cli(&["STOCK", "TLSW"]), "10");

    // A committed order reaches the ledger through the materializer over TLS (a sale
    // whose holds last long enough to be committed).
    let out = tool(
        "stockgate-sweeper",
        &os(&common_args(&[
            "create-sale",
            "--sku",
            "TLSM",
            "--total",
            "10",
        ])),
    );
    assert!(out.status.success(), "create-sale: {}", stderr_of(&out));
    let argv = srv.reserve_argv("TLSM", "u2", "r2");
    let out = redis_cli_tls(srv.tls, client, &argv);
    let token = out
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no token in {out}"))
        .trim()
        .to_string();
    let out = redis_cli_tls(srv.tls, client, &["COMMIT".to_string(), token.clone()]);
    assert!(!out.contains("ERR"), "{out}");
    let out = tool("stockgate-materializer", &os(&common_args(&["--drain"])));
    assert!(out.status.success(), "materializer: {}", stderr_of(&out));
    let status: String = rt.block_on(async {
        let pool = sqlx::PgPool::connect(pg.url()).await.expect("pg");
        sqlx::query_scalar("SELECT status FROM stockgate.orders WHERE reservation_token = $1")
            .bind(&token)
            .fetch_one(&pool)
            .await
            .expect("the order")
    });
    assert_eq!(status, "COMMITTED");

    // `stockgate top --once` over TLS shows the sale.
    let mut args: Vec<std::ffi::OsString> = vec![
        "top".into(),
        "--once".into(),
        "--interval-ms".into(),
        "200".into(),
        "--server".into(),
        server.clone().into(),
    ];
    args.extend(tls.iter().cloned());
    let out = run(Command::new("timeout")
        .arg("60")
        .arg(server_bin())
        .args(&args));
    assert!(out.status.success(), "top: {}", stderr_of(&out));
    assert!(stdout_of(&out).contains("TLSW"), "{}", stdout_of(&out));

    // A wrong CA: each tool stops, saying the certificate is not trusted.
    let wrong = tool_tls(&p, "b", "a");
    let mut bad = common_args(&["run", "--once"]);
    bad.splice(4..4 + tls.len(), wrong.iter().cloned());
    let out = tool("stockgate-sweeper", &os(&bad));
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("not signed by the CA in --cacert") && err.contains("UnknownIssuer"),
        "{err}"
    );
    let mut bad = common_args(&["--drain"]);
    bad.splice(4..4 + tls.len(), wrong.iter().cloned());
    let out = tool("stockgate-materializer", &os(&bad));
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("not signed by the CA in --cacert") && err.contains("UnknownIssuer"),
        "{err}"
    );
    // Without --cacert, top trusts the machine's CAs, as redis-cli does: the test CA
    // made trusted through SSL_CERT_FILE is accepted, another CA there is not.
    let no_cacert: Vec<std::ffi::OsString> = vec![
        "--tls".into(),
        "--cert".into(),
        p.join("a-client.pem").into(),
        "--key".into(),
        p.join("a-client.key").into(),
    ];
    let mut sys_args = args[..6].to_vec();
    sys_args.extend(no_cacert);
    for (trusted, ok) in [("a-ca.pem", true), ("b-ca.pem", false)] {
        let out = run(Command::new("timeout")
            .arg("60")
            .arg(server_bin())
            .env("SSL_CERT_FILE", p.join(trusted))
            .env_remove("SSL_CERT_DIR")
            .args(&sys_args));
        let err = stderr_of(&out);
        assert_eq!(out.status.success(), ok, "top, {trusted} trusted: {err}");
        if ok {
            assert!(stdout_of(&out).contains("TLSW"), "{}", stdout_of(&out));
        } else {
            assert!(err.contains("UnknownIssuer"), "{err}");
        }
    }

    args.splice(6.., wrong.iter().cloned());
    let out = run(Command::new("timeout")
        .arg("60")
        .arg(server_bin())
        .args(&args));
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains("not signed by the CA in --cacert") && err.contains("UnknownIssuer"),
        "{err}"
    );

    // A CA file that is not PEM: a start-up error naming the file.
    let garbage = p.join("a-server.ext");
    let mut bad = common_args(&["run", "--once"]);
    bad[6] = garbage.clone().into();
    let out = tool("stockgate-sweeper", &os(&bad));
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(
        err.contains(&format!("--cacert {}", garbage.display())),
        "{err}"
    );
    let key = std::fs::read_to_string(p.join("a-client.key")).expect("key");
    let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!err.contains(&body), "the key was printed");
}

/// `--port 0` with a fixed `--tls-port`: no plain port; TLS is served, and the port INFO
/// reports is the TLS one.
#[test]
fn a_tls_only_server_refuses_plain_connections_and_serves_tls() {
    let (_d, p) = pki();
    let dir = TempDir::new("tls-only");
    let port = free_port();
    let mut child = Command::new(server_bin())
        .args(["--port", "0", "--tls-port", &port.to_string(), "--data-dir"])
        .arg(dir.path().join("data"))
        .args(server_flags(&p, "a"))
        .args(["--tls-auth-clients", "no"])
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn stockgate");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let _srv = KillOnDrop(child);
    assert_eq!(
        line.trim(),
        format!("listening on 127.0.0.1:{port} (tls)"),
        "the only listener is the TLS one"
    );
    let ca = p.join("a-ca.pem");
    let c = Client {
        ca: &ca,
        cert: None,
    };
    assert_eq!(redis_cli_tls(port, c, &["PING".into()]).trim(), "PONG");
    let info = redis_cli_tls(port, c, &["INFO".into(), "server".into()]);
    assert!(info.contains(&format!("tcp_port:{port}")), "{info}");
    // A plain client on it gets no answer (the handshake fails).
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(!String::from_utf8_lossy(&got).contains("PONG"), "{got:?}");
}

/// The Python package (sync and asyncio clients, `rediss://` and `ssl=True`) and the Node
/// package (`tls: {ca, cert, key}`) reserve over TLS from a server that requires client
/// certificates, and fail without one.
#[test]
fn the_python_and_node_packages_reserve_over_tls() {
    let (_d, p) = pki();
    let mut flags = server_flags(&p, "a");
    flags.extend([
        "--tls-ca-cert-file".into(),
        p.join("a-ca.pem").display().to_string(),
    ]);
    let srv = start(&flags);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (ca, cert, key) = (
        p.join("a-ca.pem").display().to_string(),
        p.join("a-client.pem").display().to_string(),
        p.join("a-client.key").display().to_string(),
    );
    let py = r#"
import asyncio, sys
import stockgate
from stockgate.aio import AsyncClient
port, ca, cert, key, mode, token, req = sys.argv[1:8]
if mode == "sync":
    c = stockgate.Client.connect(f"rediss://127.0.0.1:{port}", ssl_ca_certs=ca, ssl_certfile=cert, ssl_keyfile=key)
    print(type(c.reserve("TLSPKG", "py", token, req)).__name__)
elif mode == "nocert":
    try:
        c = stockgate.Client.connect(f"127.0.0.1:{port}", ssl=True, ssl_ca_certs=ca)
        print(type(c.reserve("TLSPKG", "py", token, req)).__name__)
    except Exception as e:
        print("refused:", type(e).__name__)
else:
    async def main():
        c = AsyncClient.connect(f"127.0.0.1:{port}", ssl=True, ssl_ca_certs=ca, ssl_certfile=cert, ssl_keyfile=key)
        print(type(await c.reserve("TLSPKG", "pya", token, req)).__name__)
    asyncio.run(main())
"#;
    let python = |mode: &str, user: &str, req: &str| -> String {
        let argv = srv.reserve_argv("TLSPKG", user, req);
        let out = run(Command::new("timeout")
            .args([
                "60",
                "python3",
                "-c",
                py,
                &srv.tls.to_string(),
                &ca,
                &cert,
                &key,
                mode,
            ])
            .args([&argv[3], &argv[4]])
            .env("PYTHONPATH", root.join("clients/python/src")));
        format!("{}{}", stdout_of(&out), stderr_of(&out))
    };
    assert_eq!(python("sync", "py", "r1").trim(), "Reserved");
    let out = python("nocert", "py", "r2");
    assert!(out.contains("refused"), "{out}");
    assert_eq!(python("aio", "pya", "r3").trim(), "Reserved");

    let node_dir = crate::common::node::package_dir();
    let js = r#"
import { readFileSync } from 'node:fs';
const [port, ca, cert, key, mode, token, req] = process.argv.slice(1);
const { Stockgate } = await import(process.env.SG_NODE_PKG);
const tls = mode === 'cert'
  ? { ca: readFileSync(ca), cert: readFileSync(cert), key: readFileSync(key) }
  : { ca: readFileSync(ca) };
const c = new Stockgate({ addr: `127.0.0.1:${port}`, tls, deadlineMs: 3000 });
try {
  const r = await c.reserve('TLSPKG', 'js', token, req);
  console.log(r.kind);
} catch (e) {
  console.log('refused:', e.name);
} finally {
  await c.close();
}
"#;
    let node = |mode: &str, req: &str| -> String {
        let argv = srv.reserve_argv("TLSPKG", "js", req);
        let out = run(Command::new("timeout")
            .args(["60", "node", "--input-type=module", "-e", js])
            .args([
                &srv.tls.to_string(),
                &ca,
                &cert,
                &key,
                mode,
                &argv[3],
                &argv[4],
            ])
            .env("SG_NODE_PKG", node_dir.join("src/index.js")));
        format!("{}{}", stdout_of(&out), stderr_of(&out))
    };
    assert_eq!(node("cert", "j1").trim(), "reserved");
    let out = node("nocert", "j2");
    assert!(out.contains("refused"), "{out}");
    assert_eq!(srv.plain_cli(&["STOCK", "TLSPKG"]), "97");
}
