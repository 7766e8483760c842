//! Groups of stockgate nodes for the replication and failover tests: fixed loopback
//! ports (a node keeps its port across restarts, as replicas and Sentinel expect), one
//! admission secret and reservation key shared by all nodes, kill -9 / SIGSTOP / restart.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{server_bin, TempDir};
use stockgate_client::SentinelConfig;
use stockgate_server::engine::Keyring;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A directory with the group's shared key files.
pub struct Keys {
    pub dir: TempDir,
}

impl Keys {
    pub fn new() -> Keys {
        let dir = TempDir::new("keys");
        let hex: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + 11) % 256))
            .collect();
        std::fs::write(dir.path().join("secret"), format!("k1 {hex}\n")).expect("secret");
        Keys { dir }
    }

    pub fn flags(&self) -> Vec<String> {
        vec![
            "--secret-file".into(),
            self.dir.path().join("secret").display().to_string(),
            "--reservation-key-file".into(),
            self.dir
                .path()
                .join("reservation.key")
                .display()
                .to_string(),
            "--create-keys".into(),
        ]
    }

    pub fn keyring(&self) -> Keyring {
        let text = std::fs::read_to_string(self.dir.path().join("secret")).expect("secret");
        Keyring::parse(&text).expect("keyring")
    }

    pub fn secret_path(&self) -> PathBuf {
        self.dir.path().join("secret")
    }
}

pub struct Node {
    pub port: u16,
    pub dir: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    _own: TempDir,
}

impl Node {
    /// Starts a node on a fresh data dir and waits until it answers PING.
    pub fn start(keys: &Keys, extra: &[&str]) -> Node {
        Node::start_env(keys, extra, &[])
    }

    /// [`Node::start`] with environment variables (fault injection).
    pub fn start_env(keys: &Keys, extra: &[&str], env: &[(&str, &str)]) -> Node {
        let own = TempDir::new("node");
        let mut args = keys.flags();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut n = Node {
            port: free_port(),
            dir: own.path().to_path_buf(),
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            _own: own,
        };
        n.restart();
        n
    }

    /// Starts a replica of `primary` with the same `extra` flags.
    pub fn start_replica(keys: &Keys, primary: &Node, extra: &[&str]) -> Node {
        let addr = primary.addr();
        let mut args = vec!["--replicaof", addr.as_str()];
        args.extend_from_slice(extra);
        Node::start(keys, &args)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// (Re)starts the process on the same port and data dir.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "node already running");
        let child = Command::new(server_bin())
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--data-dir")
            .arg(&self.dir)
            .args(&self.args)
            .env("STOCKGATE_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn stockgate");
        self.child = Some(child);
        let t = Instant::now();
        loop {
            if let Ok(mut c) = self.try_conn() {
                match redis::cmd("PING").query::<String>(&mut c) {
                    Ok(_) => return,
                    // Up, with passwords configured.
                    Err(e) if e.to_string().contains("NOAUTH") || e.code() == Some("NOAUTH") => {
                        return
                    }
                    Err(_) => {}
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "node {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    pub fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        let c = redis::Client::open(format!("redis://{}/", self.addr()))?;
        let conn = c.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(conn)
    }

    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect")
    }

    /// INFO fields as a map.
    pub fn info(&self, section: &str) -> HashMap<String, String> {
        self.try_info(section).expect("INFO")
    }

    /// INFO, or `None` while the node is down or restarting (a replica re-executes itself
    /// after a full copy).
    pub fn try_info(&self, section: &str) -> Option<HashMap<String, String>> {
        let text: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.try_conn().ok()?)
            .ok()?;
        Some(
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
                .collect(),
        )
    }

    /// One INFO replication field ("" while the node cannot answer).
    pub fn repl_field(&self, name: &str) -> String {
        self.try_info("replication")
            .and_then(|i| i.get(name).cloned())
            .unwrap_or_default()
    }

    /// The node's last LSN (INFO `master_repl_offset`; 0 while it cannot answer).
    pub fn offset(&self) -> u64 {
        self.repl_field("master_repl_offset").parse().unwrap_or(0)
    }

    pub fn role(&self) -> String {
        self.repl_field("role")
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A stopped process cannot die of SIGKILL until continued.
        self.signal(libc::SIGCONT);
        self.kill9();
    }
}

/// Waits until `f` holds (polling), or panics with `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Everything a node says about a sale and a set of reservations: equal on two nodes
/// means they hold the same state.
pub fn state_of(n: &Node, sku: &str, tokens: &[String]) -> Vec<redis::Value> {
    let mut c = n.conn();
    let mut out = vec![redis::cmd("SALE.INFO")
        .arg(sku)
        .query::<redis::Value>(&mut c)
        .expect("SALE.INFO")];
    for t in tokens {
        out.push(
            redis::cmd("RESERVATION")
                .arg(t)
                .query::<redis::Value>(&mut c)
                .expect("RESERVATION"),
        );
    }
    out
}

/// Three `redis-sentinel` processes monitoring one group (killed on drop).
pub struct Sentinels {
    procs: Vec<Child>,
    pub ports: Vec<u16>,
    pub dir: TempDir,
    pub master: String,
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

/// Starts three Sentinels monitoring `master` at `primary` (`down-after-milliseconds
/// 1000`, `failover-timeout 6000`, quorum 2); `tuned`: `SENTINEL DEBUG ping-period 500`.
pub fn start_sentinels(master: &str, primary: u16, tuned: bool) -> Sentinels {
    let dir = TempDir::new("sentinels");
    let mut procs = Vec::new();
    let mut ports = Vec::new();
    for i in 0..3 {
        let port = free_port();
        let conf = dir.path().join(format!("sentinel-{i}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {d}\nlogfile {d}/sentinel-{i}.log\n\
                 sentinel monitor {master} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {master} 1000\n\
                 sentinel failover-timeout {master} 6000\n\
                 sentinel parallel-syncs {master} 2\n",
                d = dir.path().display()
            ),
        )
        .expect("sentinel conf");
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel (apt-get install redis-sentinel)");
        procs.push(child);
        ports.push(port);
    }
    let s = Sentinels {
        procs,
        ports,
        dir,
        master: master.to_string(),
    };
    for &p in &s.ports {
        wait_for("sentinel up", Duration::from_secs(10), || {
            sentinel(p, &["PING"]).is_some()
        });
        if tuned {
            sentinel(p, &["SENTINEL", "DEBUG", "ping-period", "500"]).expect("SENTINEL DEBUG");
        }
    }
    s
}

impl Sentinels {
    /// Waits until every Sentinel knows `replicas` replicas and the two other Sentinels.
    pub fn wait_discovered(&self, replicas: usize) {
        wait_for(
            "Sentinels to discover the replicas and each other",
            Duration::from_secs(30),
            || {
                self.ports.iter().all(|&p| {
                    count(sentinel(p, &["SENTINEL", "replicas", &self.master])) == replicas
                        && count(sentinel(p, &["SENTINEL", "sentinels", &self.master])) == 2
                })
            },
        );
    }

    /// `host:port,host:port,host:port`, as the client tools take it.
    pub fn addr_list(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// One command to the Sentinel on `port`; None if it does not answer.
pub fn sentinel(port: u16, args: &[&str]) -> Option<redis::Value> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = c.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn).ok()
}

/// The primary's port as the Sentinels' majority reports it.
pub fn sentinel_primary(s: &Sentinels) -> Option<u16> {
    let mut votes: HashMap<u16, usize> = HashMap::new();
    for &p in &s.ports {
        if let Some(redis::Value::Array(a)) =
            sentinel(p, &["SENTINEL", "get-master-addr-by-name", &s.master])
        {
            if let Some(redis::Value::BulkString(port)) = a.get(1) {
                if let Ok(port) = String::from_utf8_lossy(port).parse() {
                    *votes.entry(port).or_default() += 1;
                }
            }
        }
    }
    votes.into_iter().find(|(_, n)| *n >= 2).map(|(p, _)| p)
}

/// The length of an array reply (0 for anything else).
pub fn count(v: Option<redis::Value>) -> usize {
    match v {
        Some(redis::Value::Array(a)) => a.len(),
        _ => 0,
    }
}

// --- a whole group: three nodes and three Sentinels -------------------------------------

/// The name the Sentinels of [`start_group`] monitor the group under.
pub const MASTER: &str = "sg";
/// Every node of [`start_group`] waits for one replica before acknowledging.
pub const ACK: [&str; 4] = ["--min-replicas-ack", "1", "--repl-timeout-ms", "2000"];

/// Three nodes (a primary and two replicas, [`ACK`]) and three Sentinels monitoring them
/// as [`MASTER`] (`SENTINEL DEBUG ping-period 500`).
pub struct Group {
    // Sentinels first: dropped (killed) before the nodes, so none fails over a dying group.
    pub sentinels: Sentinels,
    pub nodes: Vec<Node>,
    pub keys: Keys,
}

pub fn start_group() -> Group {
    let keys = Keys::new();
    let mut nodes = vec![Node::start(&keys, &ACK)];
    let primary = nodes[0].addr();
    for _ in 0..2 {
        let mut args = vec!["--replicaof", primary.as_str()];
        args.extend_from_slice(&ACK);
        nodes.push(Node::start(&keys, &args));
    }
    wait_for("two replicas attached", Duration::from_secs(15), || {
        nodes[0]
            .info("replication")
            .get("connected_slaves")
            .is_some_and(|n| n == "2")
    });
    // Pinging every 500 ms: only the kills cause failovers (ha_sentinel.rs also runs
    // stock settings; here the clients are under test, not Sentinel).
    let sentinels = start_sentinels(MASTER, nodes[0].port, true);
    sentinels.wait_discovered(2);
    Group {
        sentinels,
        nodes,
        keys,
    }
}

impl Group {
    pub fn sentinel_config(&self) -> SentinelConfig {
        SentinelConfig::new(
            SentinelConfig::parse_list(&self.sentinels.addr_list()),
            MASTER,
        )
    }

    pub fn node(&self, port: u16) -> &Node {
        &self.nodes[self.index_of(port)]
    }

    /// Where the node on `port` is in `nodes`.
    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of ours")
    }

    /// `kill -9` of the node Sentinel names primary; returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let old = sentinel_primary(&self.sentinels).expect("a primary");
        let victim = self.index_of(old);
        self.nodes[victim].kill9();
        old
    }

    /// Waits until Sentinel names another primary and it has its remaining replica.
    pub fn wait_new_primary(&self, old: u16) -> u16 {
        let mut new = 0;
        wait_for(
            "Sentinel to promote a replica",
            Duration::from_secs(30),
            || match sentinel_primary(&self.sentinels) {
                Some(p) if p != old => {
                    new = p;
                    true
                }
                _ => false,
            },
        );
        wait_for(
            "the other replica to attach to the new primary",
            Duration::from_secs(30),
            // `repl_field`: a node may be restarting on a full copy meanwhile.
            || self.node(new).repl_field("connected_slaves") == "1",
        );
        new
    }

    /// Restarts the killed node on `port` (same data dir) and waits until it is a
    /// replica again with its link up.
    pub fn restart_rejoin(&mut self, port: u16) {
        let victim = self.index_of(port);
        self.nodes[victim].restart();
        wait_for(
            "the killed node to rejoin as a replica",
            Duration::from_secs(40),
            // `repl_field`: it restarts once more if it takes a full copy.
            || {
                let n = &self.nodes[victim];
                n.repl_field("role") == "slave" && n.repl_field("master_link_status") == "up"
            },
        );
    }
}

/// The Sentinels' log files, for failure reports.
pub fn sentinel_logs(s: &Sentinels) -> String {
    (0..3)
        .map(|i| {
            let p = s.dir.path().join(format!("sentinel-{i}.log"));
            format!(
                "--- {}\n{}",
                p.display(),
                std::fs::read_to_string(&p).unwrap_or_default()
            )
        })
        .collect()
}
