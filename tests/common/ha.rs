//! Stockgate nodes for the multi-process tests: fixed loopback ports (a node keeps its
//! port across restarts), one admission secret and reservation key shared by all nodes,
//! kill -9 / SIGSTOP / restart. Raft groups of them: `super::raft`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{server_bin, TempDir};
use stockgate_server::engine::Keyring;

/// A port for a server the test names and restarts on it (see `stockgate_testkit::ports`).
pub fn free_port() -> u16 {
    stockgate_testkit::ports::reserve().expect("free port")
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
        Node::start_on(keys, free_port(), extra, env)
    }

    /// [`Node::start_env`] on a given port (a cluster map names every node's port
    /// before any starts).
    pub fn start_on(keys: &Keys, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Node {
        let own = TempDir::new("node");
        let mut args = keys.flags();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut n = Node {
            port,
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
