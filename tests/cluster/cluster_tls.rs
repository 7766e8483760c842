//! A cluster whose nodes serve TLS only (`--port 0 --tls-port N`; docs/cluster.md, "TLS
//! between nodes"): two single-node groups, each node listed second in its group after a
//! port nothing listens on, so a node names the other group's live member only by
//! asking it `ROLE` over TLS. With `--tls-cluster yes` each names the other in `-MOVED`
//! and `CLUSTER SLOTS`, and `stockgate-sweeper move-slots --tls` moves a sale with live
//! holds, which then commit on the destination. A node with `--tls-cluster no` finds no
//! leader among TLS-only peers and its `SALE.MIGRATE` is refused, the sale staying open
//! where it was; restarted with `--tls-cluster yes` the same `move-slots` finishes.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::cluster::node_id;
use crate::common::ha::{free_port, wait_for, Keys};
use crate::common::tls::make_pki;
use crate::common::{as_int, as_str, field, now_ms, server_bin, TempDir};
use redis::Value;
use stockgate_server::cluster::key_slot;
use stockgate_testkit::KillOnDrop;

/// The test CA's files (`make_pki`'s names, prefix `c`).
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = TempDir::new("cluster-tls-pki");
        make_pki(dir.path(), "c");
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("c-{name}"))
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.file(name)).expect("pki file")
    }
}

/// One stockgate node serving TLS only on `port`, client certificates required.
struct TlsNode {
    port: u16,
    /// `--tls-cluster` given in a config file rather than as a flag.
    in_config: bool,
    data: TempDir,
    child: Option<KillOnDrop>,
}

impl TlsNode {
    fn start(
        keys: &Keys,
        pki: &Pki,
        port: u16,
        map: &Path,
        tls_cluster: &str,
        in_config: bool,
    ) -> TlsNode {
        let mut n = TlsNode {
            port,
            in_config,
            data: TempDir::new("cluster-tls-node"),
            child: None,
        };
        n.spawn(keys, pki, map, tls_cluster);
        n
    }

    /// Starts the process on the node's port and data dir; returns once it listens.
    fn spawn(&mut self, keys: &Keys, pki: &Pki, map: &Path, tls_cluster: &str) {
        let mut child = Command::new(server_bin())
            .args(keys.flags())
            .args(["--port", "0", "--tls-port", &self.port.to_string()])
            .arg("--data-dir")
            .arg(self.data.path().join("data"))
            .arg("--tls-cert-file")
            .arg(pki.file("server.pem"))
            .arg("--tls-key-file")
            .arg(pki.file("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(pki.file("ca.pem"))
            .args(["--cluster-enabled", "yes", "--cluster-config"])
            .arg(map)
            .args(self.tls_cluster_arg(tls_cluster))
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
        assert_eq!(
            line.trim(),
            format!("listening on 127.0.0.1:{} (tls)", self.port),
            "the node serves TLS only"
        );
        self.child = Some(KillOnDrop(child));
    }

    /// `--tls-cluster X`, or for group `a`'s port a config file saying `tls-cluster X`
    /// (both ways are read).
    fn tls_cluster_arg(&self, tls_cluster: &str) -> Vec<String> {
        if !self.in_config {
            return vec!["--tls-cluster".into(), tls_cluster.into()];
        }
        let conf = self.data.path().join("node.conf");
        std::fs::write(&conf, format!("tls-cluster {tls_cluster}\n")).expect("config file");
        vec!["--config".into(), conf.display().to_string()]
    }

    fn stop(&mut self) {
        self.child = None;
    }
}

/// A connection over TLS with the test CA and its client certificate.
fn conn(pki: &Pki, port: u16) -> redis::Connection {
    let certs = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: pki.read("client.pem"),
            client_key: pki.read("client.key"),
        }),
        root_cert: Some(pki.read("ca.pem")),
    };
    let c = redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}/"), certs)
        .expect("client");
    let conn = c
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect over TLS");
    conn.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    conn
}

/// The port `port`'s `CLUSTER SLOTS` names first for the range holding `slot`.
fn named_master(pki: &Pki, port: u16, slot: u16) -> Option<i64> {
    let v: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn(pki, port))
        .ok()?;
    let Value::Array(ranges) = v else { return None };
    ranges.iter().find_map(|r| {
        let Value::Array(r) = r else { return None };
        match r.as_slice() {
            [Value::Int(lo), Value::Int(hi), Value::Array(master), ..]
                if (*lo..=*hi).contains(&i64::from(slot)) =>
            {
                match master.get(1) {
                    Some(Value::Int(p)) => Some(*p),
                    _ => None,
                }
            }
            _ => None,
        }
    })
}

/// The redirection `port` answers to `SALE.INFO sku`: `MOVED <slot> <host:port>`.
fn redirect(pki: &Pki, port: u16, sku: &str) -> String {
    let err = redis::cmd("SALE.INFO")
        .arg(sku)
        .query::<Value>(&mut conn(pki, port))
        .expect_err("the sku is another group's");
    format!(
        "{} {}",
        err.code().unwrap_or("?"),
        err.detail().unwrap_or("")
    )
}

/// Total, available, reserved, committed.
fn sale_info(pki: &Pki, port: u16, sku: &str) -> (i64, i64, i64, i64) {
    let v: Value = redis::cmd("SALE.INFO")
        .arg(sku)
        .query(&mut conn(pki, port))
        .expect("SALE.INFO");
    let f = |n| as_int(&field(&v, n).expect(n));
    (f("total"), f("available"), f("reserved"), f("committed"))
}

fn reserve(c: &mut redis::Connection, keys: &Keys, sku: &str, user: &str, rid: &str) -> String {
    let adm = keys.keyring().mint(sku, user, now_ms() + 120_000);
    let v: Vec<Value> = redis::cmd("RESERVE")
        .arg(sku)
        .arg(user)
        .arg(adm)
        .arg(rid)
        .query(c)
        .expect("reserve");
    as_str(&v[1])
}

fn commit(c: &mut redis::Connection, token: &str) -> i64 {
    redis::cmd("COMMIT").arg(token).query(c).expect("commit")
}

fn count_in_slot(pki: &Pki, port: u16, slot: u16) -> i64 {
    redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut conn(pki, port))
        .expect("COUNTKEYSINSLOT")
}

/// `stockgate-sweeper --tls ... move-slots --from --to --slots`.
fn move_slots(pki: &Pki, from: u16, to: u16, slot: u16) -> Output {
    Command::new(stockgate_testkit::sibling_binary("stockgate-sweeper"))
        .arg("--tls")
        .arg("--cacert")
        .arg(pki.file("ca.pem"))
        .arg("--cert")
        .arg(pki.file("client.pem"))
        .arg("--key")
        .arg(pki.file("client.key"))
        .args(["move-slots", "--from", &format!("127.0.0.1:{from}")])
        .args(["--to", &format!("127.0.0.1:{to}")])
        .args(["--slots", &slot.to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("run move-slots")
}

/// Two groups, `a` (slots 0-8191) and `b` (8192-16383), each a port nothing listens on
/// and then the live node; `a`'s node reads `tls-cluster` from a config file.
struct Setup {
    keys: Keys,
    pki: Pki,
    map: PathBuf,
    dead: [u16; 2],
    live: [u16; 2],
    _dir: TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = TempDir::new("cluster-tls");
        let (dead, live) = ([free_port(), free_port()], [free_port(), free_port()]);
        let map = dir.path().join("cluster.map");
        let text = format!(
            "group a 0-8191\nnode {} 127.0.0.1:{}\nnode {} 127.0.0.1:{}\n\
             group b 8192-16383\nnode {} 127.0.0.1:{}\nnode {} 127.0.0.1:{}\n",
            node_id(0),
            dead[0],
            node_id(1),
            live[0],
            node_id(2),
            dead[1],
            node_id(3),
            live[1]
        );
        std::fs::write(&map, text).expect("map");
        Setup {
            keys: Keys::new(),
            pki: Pki::new(),
            map,
            dead,
            live,
            _dir: dir,
        }
    }

    fn node(&self, group: usize, tls_cluster: &str) -> TlsNode {
        TlsNode::start(
            &self.keys,
            &self.pki,
            self.live[group],
            &self.map,
            tls_cluster,
            group == 0,
        )
    }
}

/// A sku of group `a` (`low`) or `b`.
fn sku_of(prefix: &str, low: bool) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|s| (key_slot(s.as_bytes()) <= 8191) == low)
        .unwrap_or_default()
}

#[test]
fn tls_only_nodes_find_each_others_leaders_and_move_a_sale_with_its_holds() {
    let s = Setup::new();
    let (a, b) = (s.node(0, "yes"), s.node(1, "yes"));
    let pki = &s.pki;
    let (sku_a, sku_b) = (sku_of("TA", true), sku_of("TB", false));
    let (slot_a, slot_b) = (key_slot(sku_a.as_bytes()), key_slot(sku_b.as_bytes()));

    // Each names the other group's live member, which only a probe over TLS can tell.
    wait_for(
        "each node to name the other group's live member",
        Duration::from_secs(10),
        || {
            named_master(pki, a.port, slot_b) == Some(i64::from(b.port))
                && named_master(pki, b.port, slot_a) == Some(i64::from(a.port))
        },
    );
    assert_eq!(
        redirect(pki, a.port, &sku_b),
        format!("MOVED {slot_b} 127.0.0.1:{}", b.port)
    );
    assert_eq!(
        redirect(pki, b.port, &sku_a),
        format!("MOVED {slot_a} 127.0.0.1:{}", a.port)
    );

    // A sale on `a` with ten holds, three of them paid there.
    let mut ca = conn(pki, a.port);
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&sku_a)
        .arg(100)
        .arg("TTL")
        .arg(600_000)
        .query(&mut ca)
        .expect("create");
    let tokens: Vec<String> = (0..10)
        .map(|i| reserve(&mut ca, &s.keys, &sku_a, &format!("u{i}"), &format!("r{i}")))
        .collect();
    assert_eq!(tokens.iter().collect::<HashSet<_>>().len(), 10);
    for t in &tokens[..3] {
        assert_eq!(commit(&mut ca, t), 1);
    }

    // A handover to a port that does not speak TLS fails in the handshake: nothing was
    // sent, and the sale sells on at home.
    let plain = plain_peer();
    let err = redis::cmd("SALE.MIGRATE")
        .arg("127.0.0.1")
        .arg(plain)
        .arg(&sku_a)
        .query::<Value>(&mut ca)
        .expect_err("no TLS there");
    let said = err.to_string();
    assert!(
        said.contains("TLS handshake failed: the peer does not speak TLS")
            && said.contains("the sale stays here"),
        "{said}"
    );
    assert_eq!(sale_info(pki, a.port, &sku_a), (100, 90, 7, 3));

    let out = move_slots(pki, a.port, b.port, slot_a);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "move-slots over TLS failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("1 sale(s) handed over"), "{said}");

    // On `b`: every acknowledged hold, reserved or paid; the live ones pay there.
    assert_eq!(count_in_slot(pki, a.port, slot_a), 0);
    assert_eq!(sale_info(pki, b.port, &sku_a), (100, 90, 7, 3));
    let mut cb = conn(pki, b.port);
    for t in &tokens[3..] {
        assert_eq!(commit(&mut cb, t), 1, "hold {t} commits on the destination");
    }
    assert_eq!(sale_info(pki, b.port, &sku_a), (100, 90, 0, 10));
    // No token twice: a retried request replays its token, a new buyer gets a new one.
    assert_eq!(reserve(&mut cb, &s.keys, &sku_a, "u0", "r0"), tokens[0]);
    let fresh = reserve(&mut cb, &s.keys, &sku_a, "u10", "r10");
    assert!(!tokens.contains(&fresh), "{fresh} was handed out before");
    assert_eq!(sale_info(pki, b.port, &sku_a), (100, 89, 1, 10));
    // `a` sends the moved slot to `b`'s live member, known only through its probes.
    assert_eq!(
        redirect(pki, a.port, &sku_a),
        format!("MOVED {slot_a} 127.0.0.1:{}", b.port)
    );
}

/// A plain TCP port that answers anything with a RESP error, as a plain stockgate port
/// answers a TLS ClientHello.
fn plain_peer() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut b = [0u8; 512];
            let _ = std::io::Read::read(&mut s, &mut b);
            let _ = std::io::Write::write_all(&mut s, b"-ERR Protocol error\r\n");
        }
    });
    port
}

#[test]
fn tls_cluster_flags_are_checked_at_startup() {
    let s = Setup::new();
    let pki = &s.pki;
    // The map's port: the map is read before the TLS flags are checked.
    let port = s.live[0].to_string();
    let refusal = |extra: &[&str], ca: bool| -> String {
        let mut cmd = Command::new(server_bin());
        cmd.args(s.keys.flags())
            .args(["--port", "0", "--tls-port", &port, "--data-dir"])
            .arg(s._dir.path().join("refused"))
            .arg("--tls-cert-file")
            .arg(pki.file("server.pem"))
            .arg("--tls-key-file")
            .arg(pki.file("server.key"));
        match ca {
            true => cmd.arg("--tls-ca-cert-file").arg(pki.file("ca.pem")),
            false => cmd.args(["--tls-auth-clients", "no"]),
        };
        let out = cmd.args(extra).stdin(Stdio::null()).output().expect("run");
        assert!(!out.status.success(), "{extra:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let map = s.map.display().to_string();
    let cluster = ["--cluster-enabled", "yes", "--cluster-config", &map];
    let e = refusal(&["--tls-cluster", "yes"], true);
    assert!(
        e.contains("--tls-cluster yes needs --cluster-enabled yes"),
        "{e}"
    );
    let mut no_ca = cluster.to_vec();
    no_ca.extend(["--tls-cluster", "yes"]);
    let e = refusal(&no_ca, false);
    assert!(
        e.contains("--tls-cluster yes needs --tls-ca-cert-file"),
        "{e}"
    );
    let mut bad = cluster.to_vec();
    bad.extend(["--tls-cluster", "maybe"]);
    let e = refusal(&bad, true);
    assert!(e.contains("--tls-cluster maybe: must be yes or no"), "{e}");
}

#[test]
fn a_node_without_tls_cluster_cannot_reach_tls_only_peers() {
    let s = Setup::new();
    let pki = &s.pki;
    let a = s.node(0, "yes");
    let mut b = s.node(1, "no");
    let (sku_a, sku_b) = (sku_of("NA", true), sku_of("NB", false));
    let (slot_a, slot_b) = (key_slot(sku_a.as_bytes()), key_slot(sku_b.as_bytes()));

    wait_for("a to name b", Duration::from_secs(10), || {
        named_master(pki, a.port, slot_b) == Some(i64::from(b.port))
    });
    // b's plain probes get no answer from a's TLS port: it names the map's first member.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        named_master(pki, b.port, slot_a),
        Some(i64::from(s.dead[0]))
    );
    assert_eq!(
        redirect(pki, b.port, &sku_a),
        format!("MOVED {slot_a} 127.0.0.1:{}", s.dead[0])
    );

    // b's handover to a over plain TCP is refused, and the sale stays open on b.
    let mut cb = conn(pki, b.port);
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&sku_b)
        .arg(10)
        .query(&mut cb)
        .expect("create");
    let held = reserve(&mut cb, &s.keys, &sku_b, "v0", "q0");
    let out = move_slots(pki, b.port, a.port, slot_b);
    assert!(!out.status.success(), "the move over plain TCP succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-cluster yes") && err.contains("the sale stays here"),
        "{err}"
    );
    assert_eq!(count_in_slot(pki, a.port, slot_b), 0);
    assert_eq!(sale_info(pki, b.port, &sku_b), (10, 9, 1, 0));
    let _ = reserve(&mut cb, &s.keys, &sku_b, "v1", "q1");
    assert_eq!(sale_info(pki, b.port, &sku_b), (10, 8, 2, 0));
    drop(cb);

    // With --tls-cluster yes the same command finishes the move.
    b.stop();
    b.spawn(&s.keys, pki, &s.map, "yes");
    let out = move_slots(pki, b.port, a.port, slot_b);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sale_info(pki, a.port, &sku_b), (10, 8, 2, 0));
    assert_eq!(commit(&mut conn(pki, a.port), &held), 1);
}

/// redis-py's `RedisCluster(ssl=True, ...)` buys on both groups while `move-slots` moves
/// three of `a`'s sales to `b` over TLS: every acknowledged hold is on `b` in its state,
/// none twice, and each moved sale's reserved and committed units are exactly the
/// acknowledged holds.
#[test]
fn redis_py_buys_over_tls_through_a_move() {
    let s = Setup::new();
    let pki = &s.pki;
    let (a, b) = (s.node(0, "yes"), s.node(1, "yes"));
    let skus: Vec<String> = (0..3).map(|i| sku_of(&format!("PY{i}-"), true)).collect();
    let slots: Vec<String> = skus
        .iter()
        .map(|k| key_slot(k.as_bytes()).to_string())
        .collect();
    wait_for("a to name b", Duration::from_secs(10), || {
        named_master(pki, a.port, 16000) == Some(i64::from(b.port))
            && named_master(pki, b.port, 0) == Some(i64::from(a.port))
    });
    let mut ca = conn(pki, a.port);
    for k in &skus {
        let _: () = redis::cmd("SALE.CREATE")
            .arg(k)
            .arg(100_000)
            .query(&mut ca)
            .expect("create");
    }
    let buyer = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/py/cluster_move.py"
        ))
        .arg(b.port.to_string())
        .arg(s.keys.secret_path())
        .arg(skus.join(","))
        .arg("4")
        .env("SG_TLS_CA", pki.file("ca.pem"))
        .env("SG_TLS_CERT", pki.file("client.pem"))
        .env("SG_TLS_KEY", pki.file("client.key"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut buyer = KillOnDrop(buyer);
    let mut pipe = buyer.0.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut out).expect("read stdout");
        out
    });
    std::thread::sleep(Duration::from_millis(1500));
    for slot in &slots {
        let out = move_slots(pki, a.port, b.port, slot.parse().expect("slot"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = buyer.0.wait().expect("python3 exit");
    let said = reader.join().expect("reader");
    let mut err = String::new();
    if let Some(mut e) = buyer.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        status.success() && said.contains("buyer ok"),
        "{said}\n{err}"
    );
    let acked: Vec<(&str, bool)> = said
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .filter_map(|l| l.split_once(' '))
        .map(|(t, c)| (t, c == "1"))
        .collect();
    assert!(acked.len() > 20, "redis-py sold only {}", acked.len());
    let unique: HashSet<&str> = acked.iter().map(|(t, _)| *t).collect();
    assert_eq!(unique.len(), acked.len(), "a token handed out twice");
    let mut cb = conn(pki, b.port);
    let mut per_sku = std::collections::HashMap::<&str, i64>::new();
    for (token, committed) in &acked {
        let v: Value = redis::cmd("RESERVATION")
            .arg(*token)
            .query(&mut cb)
            .expect("RESERVATION");
        let state = field(&v, "state").map(|s| as_str(&s));
        let want = if *committed { "COMMITTED" } else { "RESERVED" };
        assert_eq!(state.as_deref(), Some(want), "{token} on b");
        let sku = &token[1..token.find('}').expect("hash tag")];
        *per_sku.entry(sku).or_default() += 1;
    }
    for k in &skus {
        let (total, _, reserved, committed) = sale_info(pki, b.port, k);
        assert_eq!(total, 100_000);
        assert_eq!(
            reserved + committed,
            per_sku.get(k.as_str()).copied().unwrap_or(0),
            "{k}"
        );
    }
}
