//! Redis Cluster routing (docs/cluster.md): three single-node groups on loopback owning
//! Redis's three default ranges. The cluster commands answer in Redis's shapes; a key
//! another group owns gets exactly Redis's `-MOVED`; a transaction over two slots gets
//! `-CROSSSLOT`; `CLUSTER KEYSLOT` agrees with a real `redis-server --cluster-enabled
//! yes`; and redis-rs's cluster client reserves and commits across many sales on all
//! three groups with no redirection at all; redis-cli `-c` follows `-MOVED`. The other
//! three cluster clients: `tests/clients/cluster_clients.rs`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::cluster::{node_id, Cluster, THREE};
use crate::common::now_ms;
use crate::common::Server;
use redis::Value;
use stockgate_server::cluster::key_slot;

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".into(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        other => panic!("not an array: {other:?}"),
    }
}

/// A map reply's fields (RESP3 map or RESP2 flat array).
fn fields(v: &Value) -> HashMap<String, Value> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        Value::Array(a) => a
            .chunks(2)
            .map(|kv| (text(&kv[0]), kv[1].clone()))
            .collect(),
        other => panic!("not a map: {other:?}"),
    }
}

/// The error text of a reply that must be an error (`code` + detail, as on the wire).
fn error_of(c: &mut redis::Connection, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query::<Value>(c) {
        Err(e) => {
            let detail = e.detail().unwrap_or("").to_string();
            match e.code() {
                Some(code) => format!("{code} {detail}").trim().to_string(),
                None => e.to_string(),
            }
        }
        Ok(v) => panic!("{args:?} answered {v:?}, not an error"),
    }
}

fn run(c: &mut redis::Connection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn without_cluster_mode_cluster_commands_are_refused_as_redis_refuses_them() {
    let srv = Server::start(&[]);
    let mut c = srv.client().get_connection().unwrap();
    for args in [
        &["CLUSTER", "INFO"][..],
        &["CLUSTER", "SLOTS"],
        &["CLUSTER", "KEYSLOT", "foo"],
        &["READONLY"],
        &["READWRITE"],
        &["ASKING"],
    ] {
        assert_eq!(
            error_of(&mut c, args),
            "ERR This instance has cluster support disabled",
            "{args:?}"
        );
    }
    let info = text(&run(&mut c, &["INFO", "cluster"]));
    assert!(info.contains("cluster_enabled:0"), "{info}");
}

#[test]
fn cluster_commands_answer_in_redis_shapes() {
    let cl = Cluster::start(&THREE);
    let ports = cl.ports();
    let mut c = cl.nodes[1].conn();

    // CLUSTER SLOTS: [start, end, [ip, port, id, metadata]] per range, in slot order.
    let slots = run(&mut c, &["CLUSTER", "SLOTS"]);
    let slots = items(&slots);
    assert_eq!(slots.len(), 3);
    for (i, e) in slots.iter().enumerate() {
        let e = items(e);
        assert_eq!(e.len(), 3, "one node per group: {e:?}");
        assert_eq!(
            (int(&e[0]), int(&e[1])),
            (i64::from(THREE[i].0), i64::from(THREE[i].1))
        );
        let n = items(&e[2]);
        assert_eq!(n.len(), 4);
        assert_eq!(text(&n[0]), "127.0.0.1");
        assert_eq!(int(&n[1]), i64::from(ports[i]));
        assert_eq!(text(&n[2]), node_id(i));
        assert!(
            items(&n[3]).is_empty(),
            "no networking metadata: {:?}",
            n[3]
        );
    }

    // CLUSTER SHARDS: per group, its slots and its nodes as maps.
    let shards = run(&mut c, &["CLUSTER", "SHARDS"]);
    let shards = items(&shards);
    assert_eq!(shards.len(), 3);
    let s1 = fields(&shards[1]);
    let range: Vec<i64> = items(&s1["slots"]).iter().map(int).collect();
    assert_eq!(range, vec![5461, 10922]);
    let n = fields(&items(&s1["nodes"])[0]);
    assert_eq!(text(&n["id"]), node_id(1));
    assert_eq!(int(&n["port"]), i64::from(ports[1]));
    assert_eq!(text(&n["ip"]), "127.0.0.1");
    assert_eq!(text(&n["endpoint"]), "127.0.0.1");
    assert_eq!(text(&n["role"]), "master");
    assert_eq!(text(&n["health"]), "online");
    assert_eq!(int(&n["replication-offset"]), 0);

    // CLUSTER NODES: Redis's line format, `myself` on the node asked.
    let nodes = text(&run(&mut c, &["CLUSTER", "NODES"]));
    let lines: Vec<&str> = nodes.lines().collect();
    assert_eq!(lines.len(), 3, "{nodes}");
    assert_eq!(
        lines[1],
        format!(
            "{} 127.0.0.1:{}@0 myself,master - 0 0 2 connected 5461-10922",
            node_id(1),
            ports[1]
        )
    );
    assert_eq!(
        lines[0],
        format!(
            "{} 127.0.0.1:{}@0 master - 0 0 1 connected 0-5460",
            node_id(0),
            ports[0]
        )
    );

    // CLUSTER INFO, MYID, KEYSLOT, READONLY/READWRITE/ASKING.
    let info = text(&run(&mut c, &["CLUSTER", "INFO"]));
    for want in [
        "cluster_state:ok",
        "cluster_slots_assigned:16384",
        "cluster_known_nodes:3",
        "cluster_size:3",
        "cluster_my_epoch:2",
    ] {
        assert!(info.contains(want), "{want} not in {info}");
    }
    assert_eq!(text(&run(&mut c, &["CLUSTER", "MYID"])), node_id(1));
    assert_eq!(int(&run(&mut c, &["CLUSTER", "KEYSLOT", "foo"])), 12182);
    assert_eq!(
        int(&run(
            &mut c,
            &["CLUSTER", "KEYSLOT", "{user1000}.following"]
        )),
        3443
    );
    for flag in ["READONLY", "READWRITE", "ASKING"] {
        assert_eq!(text(&run(&mut c, &[flag])), "OK");
    }
    assert_eq!(
        error_of(&mut c, &["CLUSTER", "KEYSLOT"]),
        "ERR wrong number of arguments for 'cluster|keyslot' command"
    );
    assert_eq!(
        error_of(&mut c, &["CLUSTER", "ADDSLOTS", "1"]),
        "ERR unknown subcommand 'ADDSLOTS'. Try CLUSTER HELP."
    );
    assert_eq!(
        error_of(&mut c, &["CLUSTER", "SETSLOT", "1", "NODE", "x"]),
        "ERR I don't know about node x"
    );
    let info = text(&run(&mut c, &["INFO", "cluster"]));
    assert!(info.contains("cluster_enabled:1"), "{info}");
}

#[test]
fn cluster_slots_in_resp3_carry_an_empty_metadata_map() {
    let cl = Cluster::start(&THREE);
    let client =
        redis::Client::open(format!("redis://{}/?protocol=resp3", cl.nodes[0].addr())).unwrap();
    let mut c = client.get_connection().unwrap();
    let slots = run(&mut c, &["CLUSTER", "SLOTS"]);
    let node = items(&items(&slots)[0])[2].clone();
    assert!(
        matches!(&items(&node)[3], Value::Map(m) if m.is_empty()),
        "{node:?}"
    );
    let shards = run(&mut c, &["CLUSTER", "SHARDS"]);
    assert!(matches!(&items(&shards)[0], Value::Map(_)), "{shards:?}");
}

#[test]
fn a_key_another_group_owns_gets_exactly_redis_moved() {
    let cl = Cluster::start(&THREE);
    let ports = cl.ports();
    let skus = cl.skus("MV", 2);
    let keyring = cl.keys.keyring();
    let mut c0 = cl.nodes[0].conn();
    assert_eq!(cl.moved(), 0);
    let mut expected_moved = 0;
    for g in 1..3 {
        for sku in &skus[g] {
            let slot = key_slot(sku.as_bytes());
            let moved = format!("MOVED {slot} 127.0.0.1:{}", ports[g]);
            assert_eq!(error_of(&mut c0, &["SALE.CREATE", sku, "10"]), moved);
            assert_eq!(error_of(&mut c0, &["STOCK", sku]), moved);
            let adm = keyring.mint(sku, "u1", now_ms() + 60_000);
            assert_eq!(
                error_of(&mut c0, &["RESERVE", sku, "u1", &adm, "r1"]),
                moved
            );
            // A token routes like its sku: its `{sku}` hash tag.
            let token = format!("{{{sku}}}{}", "a".repeat(26));
            assert_eq!(error_of(&mut c0, &["COMMIT", &token]), moved);
            assert_eq!(error_of(&mut c0, &["RESERVATION", &token]), moved);
            // The sale's stream is `{sku}:events`: the same slot.
            assert_eq!(
                error_of(&mut c0, &["XLEN", &format!("{{{sku}}}:events")]),
                moved
            );
            expected_moved += 6;

            // At the owner the same commands run.
            let mut owner = cl.nodes[g].conn();
            assert_eq!(text(&run(&mut owner, &["SALE.CREATE", sku, "10"])), "OK");
            let r = run(&mut owner, &["RESERVE", sku, "u1", &adm, "r1"]);
            assert_eq!(text(&items(&r)[0]), "RESERVED");
        }
    }
    assert_eq!(cl.moved(), expected_moved);
    // Keyless commands and the node-wide stream run where they are sent.
    assert!(items(&run(&mut c0, &["SALE.LIST"])).is_empty());
    assert!(int(&run(&mut c0, &["XLEN", "stockgate:events"])) >= 0);
    run(&mut c0, &["EXPIRED"]);
    assert_eq!(cl.moved(), expected_moved);
}

#[test]
fn a_transaction_over_two_slots_gets_crossslot_and_runs_nothing() {
    let cl = Cluster::start(&THREE);
    let skus = cl.skus("TX", 2);
    let (a, b) = (&skus[0][0], &skus[0][1]);
    assert_ne!(key_slot(a.as_bytes()), key_slot(b.as_bytes()));
    let mut c = cl.nodes[0].conn();

    // Two slots of this node's group: queued, then refused whole at EXEC.
    assert_eq!(text(&run(&mut c, &["MULTI"])), "OK");
    assert_eq!(text(&run(&mut c, &["SALE.CREATE", a, "5"])), "QUEUED");
    assert_eq!(text(&run(&mut c, &["SALE.CREATE", b, "5"])), "QUEUED");
    assert_eq!(
        error_of(&mut c, &["EXEC"]),
        "CROSSSLOT Keys in request don't hash to the same slot"
    );
    assert_eq!(error_of(&mut c, &["EXEC"]), "ERR EXEC without MULTI");
    assert!(
        items(&run(&mut c, &["SALE.LIST"])).is_empty(),
        "nothing ran"
    );

    // One slot: runs.
    run(&mut c, &["MULTI"]);
    run(&mut c, &["SALE.CREATE", a, "5"]);
    run(&mut c, &["STOCK", a]);
    let r = run(&mut c, &["EXEC"]);
    assert_eq!(int(&items(&r)[1]), 5);

    // A key another group owns: `-MOVED` at once, and the transaction is doomed.
    let other = &skus[1][0];
    run(&mut c, &["MULTI"]);
    run(&mut c, &["STOCK", a]);
    assert!(error_of(&mut c, &["STOCK", other]).starts_with("MOVED "));
    assert_eq!(
        error_of(&mut c, &["EXEC"]),
        "EXECABORT Transaction discarded because of previous errors."
    );
    let info = cl.nodes[0].info("cluster");
    assert_eq!(info["cluster_crossslot_refusals"], "1");
}

/// A real `redis-server --cluster-enabled yes` on a free port (scripts/test-all.sh
/// installs redis-server), killed on drop; its directory lives as long.
struct RealRedis(Child, #[allow(dead_code)] crate::common::TempDir);

impl Drop for RealRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cluster_keyslot_agrees_with_redis_for_many_keys() {
    let dir = crate::common::TempDir::new("real-redis");
    let port = crate::common::ha::free_port();
    // The cluster bus too: by default Redis takes port + 10,000, a port nobody handed out.
    let bus = crate::common::ha::free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-port", &bus.to_string()])
        .args([
            "--cluster-enabled",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--cluster-config-file")
        .arg(dir.path().join("nodes.conf"))
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/test-all.sh installs it)");
    let _redis = RealRedis(child, dir);
    let redis = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let t = Instant::now();
    let mut rc = loop {
        if let Ok(c) = redis.get_connection() {
            break c;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "redis-server not up");
        std::thread::sleep(Duration::from_millis(30));
    };
    let cl = Cluster::start(&[(0, 16383)]);
    let mut sc = cl.nodes[0].conn();

    let mut keys: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{".to_vec(),
        b"}".to_vec(),
        b"{}".to_vec(),
        b"{}{x}".to_vec(),
        b"a{b}c".to_vec(),
        b"{{a}}".to_vec(),
        b"x{y".to_vec(),
        vec![0xff, 0x00, b'{', 0x80, b'}'],
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..600 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 24) as usize;
        let mut k: Vec<u8> = (0..len).map(|j| (seed >> (j % 8 * 8)) as u8).collect();
        if i % 3 == 0 {
            k = format!("{{SKU-{i}}}{}", "abcdefghijklmnopqrstuvwxyz").into_bytes();
        } else if i % 3 == 1 {
            k = format!("FLASH-{i}:{seed}").into_bytes();
        }
        keys.push(k);
    }
    for k in &keys {
        let want: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&k[..])
            .query(&mut rc)
            .expect("redis CLUSTER KEYSLOT");
        let got: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&k[..])
            .query(&mut sc)
            .expect("stockgate CLUSTER KEYSLOT");
        assert_eq!(got, want, "key {k:?}");
        assert_eq!(i64::from(key_slot(k)), want, "key {k:?}");
    }
}

#[test]
fn redis_rs_cluster_client_reserves_and_commits_on_every_group_without_redirection() {
    let cl = Cluster::start(&THREE);
    let urls: Vec<String> = cl
        .nodes
        .iter()
        .map(|n| format!("redis://{}/", n.addr()))
        .collect();
    let client = redis::cluster::ClusterClient::new(urls).unwrap();
    let mut c = client.get_connection().unwrap();
    let keyring = cl.keys.keyring();
    let skus: Vec<String> = cl.skus("RS", 4).into_iter().flatten().collect();
    const USERS: usize = 25;

    for sku in &skus {
        let ok: String = redis::cmd("SALE.CREATE")
            .arg(sku)
            .arg(1000)
            .query(&mut c)
            .unwrap();
        assert_eq!(ok, "OK");
    }
    let mut committed = 0;
    for sku in &skus {
        for u in 0..USERS {
            let user = format!("user{u}");
            let adm = keyring.mint(sku, &user, now_ms() + 60_000);
            let r: Value = redis::cmd("RESERVE")
                .arg(sku)
                .arg(&user)
                .arg(&adm)
                .arg(format!("req-{u}"))
                .query(&mut c)
                .unwrap();
            let r = items(&r);
            assert_eq!(text(&r[0]), "RESERVED");
            let token = text(&r[1]);
            if u % 2 == 0 {
                let n: i64 = redis::cmd("COMMIT").arg(&token).query(&mut c).unwrap();
                assert_eq!(n, 1);
                committed += 1;
            } else {
                let state: Value = redis::cmd("RESERVATION").arg(&token).query(&mut c).unwrap();
                assert_eq!(text(&fields(&state)["state"]), "RESERVED");
            }
        }
    }
    // redis-rs routes a command it does not know on its argv[1]: the sku or the token,
    // whose `{sku}` hash tag gives the same slot. Not one request was redirected.
    assert_eq!(cl.moved(), 0);
    // Every sale is on its own group, with its own counters.
    for sku in &skus {
        let info = fields(&run(
            &mut cl.nodes[cl.owner(sku)].conn(),
            &["SALE.INFO", sku],
        ));
        assert_eq!(int(&info["reserved"]), (USERS / 2) as i64, "{sku}");
        assert_eq!(int(&info["committed"]), USERS.div_ceil(2) as i64, "{sku}");
        for (i, n) in cl.nodes.iter().enumerate() {
            if i != cl.owner(sku) {
                assert!(error_of(&mut n.conn(), &["SALE.INFO", sku]).starts_with("MOVED"));
            }
        }
    }
    assert_eq!(committed, skus.len() * USERS.div_ceil(2));
    assert_eq!(cl.moved(), 12 * 2, "only the checks above were redirected");
}

/// Runs the server with these flags on a fresh data dir; it must refuse to start. Its
/// stderr.
fn refused_start(flags: &[&str]) -> String {
    let dir = crate::common::TempDir::new("cluster-refused");
    let out = Command::new(crate::common::server_bin())
        .args(["--port", "0", "--data-dir"])
        .arg(dir.path())
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .expect("run stockgate");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{flags:?} started: {stderr}");
    stderr
}

#[test]
fn a_bad_map_or_missing_flags_stop_the_server_at_startup_in_words() {
    let dir = crate::common::TempDir::new("cluster-maps");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let e = refused_start(&["--cluster-enabled", "yes"]);
    assert!(
        e.contains("--cluster-enabled yes needs --cluster-config FILE"),
        "{e}"
    );
    let good = write(
        "good.map",
        &format!("group a 0-16383\nnode {} 127.0.0.1:1\n", node_id(0)),
    );
    let e = refused_start(&["--cluster-config", &good]);
    assert!(
        e.contains("--cluster-config is only read with --cluster-enabled yes"),
        "{e}"
    );
    // Port 0 is not in the map, and no --cluster-node names this node.
    let e = refused_start(&["--cluster-enabled", "yes", "--cluster-config", &good]);
    assert!(e.contains("has no node with port 0"), "{e}");
    let e = refused_start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config",
        &good,
        "--cluster-node",
        &node_id(7),
    ]);
    assert!(
        e.contains(&format!("has no node with id {}", node_id(7))),
        "{e}"
    );
    let bad = write("bad.map", "group a 0-16384\n");
    let e = refused_start(&["--cluster-enabled", "yes", "--cluster-config", &bad]);
    assert!(
        e.contains("line 1: '16384' is not a slot: slots are whole numbers from 0 to 16383"),
        "{e}"
    );
    let e = refused_start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config",
        "/nonexistent/map",
    ]);
    assert!(
        e.contains("cannot read the cluster map /nonexistent/map"),
        "{e}"
    );
}

#[test]
fn a_node_named_by_id_serves_its_slots() {
    // `--cluster-node` picks the node whatever port the map gives it: here the map's
    // port is another, so redirections to this node name the map's address.
    let dir = crate::common::TempDir::new("cluster-id");
    let map = dir.path().join("m");
    std::fs::write(
        &map,
        format!(
            "group a 0-100\nnode {} 127.0.0.1:1\ngroup b 101-16383\nnode {} 127.0.0.1:2\n",
            node_id(0),
            node_id(1)
        ),
    )
    .unwrap();
    let m = map.display().to_string();
    let id = node_id(1);
    let srv = Server::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config",
        &m,
        "--cluster-node",
        &id,
    ]);
    let mut c = srv.client().get_connection().unwrap();
    assert_eq!(text(&run(&mut c, &["CLUSTER", "MYID"])), id);
    // "hello" hashes to slot 866, group b's: served here. Slot 0 is group a's.
    assert_eq!(text(&run(&mut c, &["SALE.CREATE", "hello", "3"])), "OK");
    let zero = (0..)
        .map(|i| format!("Z{i}"))
        .find(|k| key_slot(k.as_bytes()) <= 100)
        .unwrap();
    assert_eq!(
        error_of(&mut c, &["STOCK", &zero]),
        format!("MOVED {} 127.0.0.1:1", key_slot(zero.as_bytes()))
    );
}

#[test]
fn redis_cli_follows_moved_and_its_cluster_check_accepts_the_map() {
    let cl = Cluster::start(&THREE);
    let skus = cl.skus("CLI", 1);
    let p0 = cl.ports()[0].to_string();
    let cli = |args: &[&str]| {
        let o = Command::new("redis-cli")
            .args(args)
            .output()
            .expect("redis-cli must be installed (scripts/test-all.sh installs it)");
        assert!(o.status.success(), "redis-cli {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    for group in &skus[1..] {
        let sku = &group[0];
        assert!(cli(&["-p", &p0, "SALE.CREATE", sku, "5"]).starts_with("MOVED "));
        // `-c`: cluster mode, follows the redirection to the owner.
        assert_eq!(
            cli(&["-c", "-p", &p0, "SALE.CREATE", sku, "5"]).trim(),
            "OK"
        );
        assert_eq!(cli(&["-c", "-p", &p0, "STOCK", sku]).trim(), "5");
    }
    let check = cli(&["--cluster", "check", &format!("127.0.0.1:{p0}")]);
    assert!(
        check.contains("[OK] All nodes agree about slots configuration."),
        "{check}"
    );
    assert!(check.contains("[OK] All 16384 slots covered."), "{check}");
}
