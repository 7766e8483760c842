//! A Raft group of three real `stockgate` processes on loopback, for the tests that
//! fault it: members started with shared keys, a proxy per directed Raft link that can
//! cut it, leader discovery through the Sentinel interface, and the checks of the
//! sale's invariants.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ha::{free_port, Keys};
use super::{now_ms, server_bin, TempDir};

/// A TCP forwarder for one directed link; `cut` drops its connections and refuses new
/// ones until it is healed; `deaf` forwards the caller's requests but swallows every
/// byte the callee sends back (a link that carries one direction only).
pub struct Proxy {
    pub port: u16,
    pub cut: Arc<AtomicBool>,
    pub deaf: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(target: u16) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = l.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let deaf = Arc::new(AtomicBool::new(false));
        let c = cut.clone();
        let d = deaf.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(inbound) = conn else { continue };
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: the link is cut
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (mut from, mut to, back) in [
                    (
                        inbound.try_clone().expect("clone"),
                        outbound.try_clone().expect("clone"),
                        false,
                    ),
                    (outbound, inbound, true),
                ] {
                    let c = c.clone();
                    let deaf = d.clone();
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
                        let mut buf = [0u8; 65536];
                        loop {
                            if c.load(Ordering::SeqCst) {
                                let _ = from.shutdown(std::net::Shutdown::Both);
                                let _ = to.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => {
                                    let _ = to.shutdown(std::net::Shutdown::Both);
                                    return;
                                }
                                Ok(_) if back && deaf.load(Ordering::SeqCst) => {}
                                Ok(n) => {
                                    // Read just as the link was cut: dropped with it.
                                    if c.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err()
                                    {
                                        return;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => {
                                    let _ = to.shutdown(std::net::Shutdown::Both);
                                    return;
                                }
                            }
                        }
                    });
                }
            }
        });
        Proxy { port, cut, deaf }
    }
}

pub struct Member {
    pub id: u64,
    pub port: u16,
    pub raft_port: u16,
    pub dir: PathBuf,
    pub args: Vec<String>,
    pub child: Option<Child>,
    /// Where this member's later starts append their log (info level), if set.
    pub log_file: Option<PathBuf>,
    /// A log the test reads itself, file and level, ahead of `RAFT_TEST_LOG_DIR` and
    /// `RAFT_TEST_LOG` (set by [`Group::start_logged`]).
    pub own_log: Option<(PathBuf, String)>,
}

impl Member {
    pub fn spawn(&mut self) {
        // RAFT_TEST_LOG_DIR=dir: each member's log appended to dir/member-<id>.log (at
        // RAFT_TEST_LOG level, default info), kept after the test for a post-mortem;
        // else `log_file`; else the members log to the test's stderr. `own_log` first.
        let own = self.own_log.clone();
        let file = match &own {
            Some((path, _)) => Some(path.clone()),
            None => std::env::var("RAFT_TEST_LOG_DIR")
                .ok()
                .map(|dir| {
                    std::fs::create_dir_all(&dir).expect("RAFT_TEST_LOG_DIR");
                    std::path::Path::new(&dir).join(format!("member-{}.log", self.id))
                })
                .or_else(|| self.log_file.clone()),
        };
        let (level, stderr) = match file {
            Some(path) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .expect("member log file");
                let level = match own {
                    Some((_, level)) => level,
                    None => std::env::var("RAFT_TEST_LOG")
                        .unwrap_or_else(|_| "info,openraft=warn".into()),
                };
                (level, Stdio::from(f))
            }
            // openraft warns at every refused connection to a killed peer: noise here.
            None => ("warn,openraft=error".into(), Stdio::inherit()),
        };
        let child = Command::new(server_bin())
            .args(&self.args)
            .env("STOCKGATE_LOG", level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn stockgate");
        self.child = Some(child);
        wait_ping(self.port);
        // A PING answered by another process on this port (the member failed to bind it)
        // would have the test talk to a stranger from here on.
        if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
            panic!(
                "member {} exited as it started ({st}); its stderr says why",
                self.id
            );
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Member {
    /// SIGSTOP (`true`) or SIGCONT (`false`): a process pause, as a long GC or a stalled
    /// VM gives one. The PID survives a deposed leader's re-execution.
    pub fn pause(&self, stop: bool) {
        if let Some(c) = &self.child {
            let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: kill(2) on the PID of a child this harness started and still owns.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
        // The signal is delivered asynchronously: wait until the process is in the
        // state asked for, so that whoever looks next (`is_paused`) sees it.
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.child.is_some() && self.is_paused() != stop && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Member {
    /// Stopped by SIGSTOP: it accepts connections and answers nothing (and redis-rs's
    /// connection setup reads its first answer without a timeout), so it is not asked.
    pub fn is_paused(&self) -> bool {
        let Some(c) = &self.child else { return false };
        std::fs::read_to_string(format!("/proc/{}/stat", c.id()))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
            .unwrap_or(false)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Group {
    pub members: Vec<Member>,
    pub keys: Keys,
    /// `links[(from, to)]`: the proxy `from` reaches `to` through.
    pub links: Vec<((u64, u64), Proxy)>,
    pub _dir: TempDir,
}

pub fn wait_ping(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!("node on port {port} did not answer PING");
}

/// A connection that accepts a follower's possibly stale reads (`READONLY`): the tests
/// read each member's own state. Retried for a while (see [`strict_conn`]).
pub fn conn(port: u16) -> redis::Connection {
    let mut c = strict_conn(port);
    // A single node refuses READONLY; its reads are never stale anyway.
    let _: redis::RedisResult<String> = redis::cmd("READONLY").query(&mut c);
    c
}

/// A connection as a client of the master opens it (reads must be the newest, or refused).
/// Retried for a while: a deposed leader re-executes itself (its port is closed for the
/// moment of its restart).
pub fn strict_conn(port: u16) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match client.get_connection_with_timeout(Duration::from_secs(2)) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "connect to {port}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    c.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    c
}

impl Group {
    /// Three members, every link through its own proxy when `proxied`.
    pub fn start(proxied: bool) -> Group {
        Group::start_with(proxied, None, 3, &[])
    }

    /// Three members, no proxies, each started with `flags` too.
    pub fn start_with_flags(flags: &[&str]) -> Group {
        Group::start_with(false, None, 3, flags)
    }

    /// `members` members (ids 1 to `members`), no proxies.
    pub fn start_of(members: u64) -> Group {
        Group::start_with(false, None, members, &[])
    }

    /// As [`Group::start`], each member logging at `level` to `dir/member-<id>.log` (every
    /// start of it), whatever `RAFT_TEST_LOG_DIR` says: for a test that reads those logs. (Not
    /// the variable itself: the other tests of the binary would log there too.)
    pub fn start_logged(proxied: bool, dir: &Path, level: &str) -> Group {
        Group::start_with(proxied, Some((dir, level)), 3, &[])
    }

    fn start_with(proxied: bool, log: Option<(&Path, &str)>, count: u64, flags: &[&str]) -> Group {
        let dir = TempDir::new("raft");
        let keys = Keys::new();
        let ids: Vec<u64> = (1..=count).collect();
        // Below the kernel's ephemeral range: a proxy's port (bound to port 0), another
        // test's or an outgoing connection can never be given a member's port, even while
        // the member is down.
        let ports: Vec<(u16, u16)> = ids.iter().map(|_| (free_port(), free_port())).collect();
        let peers = ids
            .iter()
            .zip(&ports)
            .map(|(i, (p, r))| format!("{i}=127.0.0.1:{p}/127.0.0.1:{r}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut links = Vec::new();
        if proxied {
            for &from in &ids {
                for (&to, &(_, rport)) in ids.iter().zip(&ports) {
                    if from != to {
                        links.push(((from, to), Proxy::start(rport)));
                    }
                }
            }
        }
        let mut members = Vec::new();
        for (&id, &(port, raft_port)) in ids.iter().zip(&ports) {
            let d = dir.path().join(format!("n{id}"));
            let mut args: Vec<String> = vec![
                "--port".into(),
                port.to_string(),
                "--data-dir".into(),
                d.display().to_string(),
                "--fsync".into(),
                "always".into(),
                "--raft-id".into(),
                id.to_string(),
                "--raft-listen".into(),
                format!("127.0.0.1:{raft_port}"),
                "--raft-peers".into(),
                peers.clone(),
            ];
            // One member forms the group, once; the others wait to be named by it.
            if id == ids[0] {
                args.push("--raft-bootstrap".into());
            }
            args.extend(keys.flags());
            args.extend(flags.iter().map(|f| f.to_string()));
            for ((f, t), p) in &links {
                if *f == id {
                    args.push("--raft-route".into());
                    args.push(format!("{t}=127.0.0.1:{}", p.port));
                }
            }
            members.push(Member {
                id,
                port,
                raft_port,
                dir: d,
                args,
                child: None,
                log_file: None,
                own_log: log
                    .map(|(dir, level)| (dir.join(format!("member-{id}.log")), level.to_string())),
            });
        }
        for m in &mut members {
            m.spawn();
        }
        Group {
            members,
            keys,
            links,
            _dir: dir,
        }
    }

    pub fn member(&mut self, id: u64) -> &mut Member {
        self.members
            .iter_mut()
            .find(|m| m.id == id)
            .expect("member")
    }

    /// The member that takes writes, asked of every running member (as a Sentinel-aware
    /// client does), excluding `not`.
    pub fn leader(&self, not: Option<u64>, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            for m in self
                .members
                .iter()
                .filter(|m| m.child.is_some() && !m.is_paused())
            {
                let Some(mut c) = quick_conn(m.port, Duration::from_secs(1)) else {
                    continue;
                };
                let addr: Option<(String, String)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg("stockgate")
                    .query(&mut c)
                    .ok()
                    .flatten();
                let Some((_, p)) = addr else { continue };
                let Some(l) = self.members.iter().find(|x| x.port.to_string() == p) else {
                    continue;
                };
                if Some(l.id) == not || l.child.is_none() || l.is_paused() {
                    continue;
                }
                // The leader itself must say so and take writes.
                if let Some(mut lc) = quick_conn(l.port, Duration::from_secs(1)) {
                    let role: Vec<redis::Value> =
                        redis::cmd("ROLE").query(&mut lc).unwrap_or_default();
                    if role.first().map(crate::common::as_str).as_deref() == Some("master") {
                        return l.id;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no leader within {within:?}");
    }

    pub fn port(&self, id: u64) -> u16 {
        self.members
            .iter()
            .find(|m| m.id == id)
            .expect("member")
            .port
    }

    pub fn cut(&self, id: u64, cut: bool) {
        for ((f, t), p) in &self.links {
            if *f == id || *t == id {
                p.cut.store(cut, Ordering::SeqCst);
            }
        }
    }

    pub fn token(&self, sku: &str, user: &str) -> String {
        self.keys.keyring().mint(sku, user, now_ms() + 600_000)
    }

    /// Like [`Group::converge`], the lengths seen last instead of a panic.
    pub fn try_converge(&self, within: Duration) -> Result<i64, Vec<i64>> {
        let deadline = Instant::now() + within;
        loop {
            let lens: Vec<i64> = self
                .members
                .iter()
                .filter(|m| m.child.is_some())
                .map(|m| {
                    quick_conn(m.port, Duration::from_secs(2))
                        .and_then(|mut c| {
                            redis::cmd("XLEN")
                                .arg("stockgate:events")
                                .query(&mut c)
                                .ok()
                        })
                        .unwrap_or(-1)
                })
                .collect();
            if lens.windows(2).all(|w| w[0] == w[1]) && lens.first().is_some_and(|l| *l >= 0) {
                return Ok(lens[0]);
            }
            if Instant::now() >= deadline {
                return Err(lens);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Members whose process ended without the harness killing it, with its status.
    pub fn exited(&mut self) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for m in &mut self.members {
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    out.push((m.id, st.to_string()));
                }
            }
        }
        out
    }

    /// Every running member reports the same event count, within `within`.
    pub fn converge(&self, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let lens: Vec<i64> = self
                .members
                .iter()
                .filter(|m| m.child.is_some())
                .map(|m| {
                    redis::cmd("XLEN")
                        .arg("stockgate:events")
                        .query(&mut conn(m.port))
                        .unwrap_or(-1)
                })
                .collect();
            if lens.windows(2).all(|w| w[0] == w[1]) && lens[0] >= 0 {
                return lens[0];
            }
            assert!(
                Instant::now() < deadline,
                "members did not converge: {lens:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A reservation asked of whichever member leads, again with the same request id (a
/// replay answers with the first token) while the group moves its leader or a leader
/// waits to hear from a majority: what a client following the group does. Panics with
/// the last answer if none is taken within `within`.
pub fn reserve_on_leader(g: &Group, sku: &str, user: &str, req: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let port = g.port(g.leader(None, within));
        match reserve(port, g, sku, user, req) {
            Ok(t) => return t,
            Err(e) if Instant::now() < deadline => {
                eprintln!("reserve {sku}/{user} on {port}: {e}; asking the leader again");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("reserve {sku}/{user}: {e}"),
        }
    }
}

pub fn reserve(port: u16, g: &Group, sku: &str, user: &str, req: &str) -> Result<String, String> {
    reserve_with(port, sku, user, &g.token(sku, user), req)
}

/// A read of stock state on `port`. A leader that has not heard from a majority within its
/// lease refuses reads (`-READONLY ... leads no majority`) until it hears again or a new
/// leader takes over; on a loaded machine that happens for a moment without any fault, so
/// the refusal is asked again for a while, as a client following the group would.
pub fn read(port: u16, cmd: &redis::Cmd) -> redis::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cmd.query::<redis::Value>(&mut conn(port)) {
            Ok(v) => return v,
            // Also a member restarting itself (a deposed leader): its connections end,
            // and it answers -LOADING while it recovers.
            Err(e)
                if (e.to_string().contains("leads no majority")
                    || e.code() == Some("LOADING")
                    || e.is_io_error()
                    || e.is_connection_dropped())
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("read on {port}: {e}"),
        }
    }
}

pub fn sale_info(port: u16, sku: &str) -> (i64, i64, i64, i64) {
    let v = read(port, redis::cmd("SALE.INFO").arg(sku));
    let f = |n| crate::common::as_int(&crate::common::field(&v, n).expect(n));
    (f("total"), f("available"), f("reserved"), f("committed"))
}

pub fn state_of(port: u16, token: &str) -> Option<String> {
    let v = read(port, redis::cmd("RESERVATION").arg(token));
    crate::common::field(&v, "state").map(|s| crate::common::as_str(&s))
}

/// Retried for a while: a leader just elected may still be catching up (`-LOADING`).
pub fn create_sale(port: u16, sku: &str, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r: redis::RedisResult<String> = redis::cmd("SALE.CREATE")
            .arg(sku)
            .arg(total)
            .arg("SHARDS")
            .arg(4)
            .query(&mut conn(port));
        match r {
            Ok(r) => return assert_eq!(r, "OK"),
            Err(e) => assert!(Instant::now() < deadline, "SALE.CREATE: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writers reserve one unit each for distinct users against whoever leads; returns the
/// acknowledged tokens.
pub fn storm(
    g: &Arc<Mutex<Group>>,
    sku: &str,
    prefix: &str,
    writers: usize,
    per: usize,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    (0..writers)
        .map(|w| {
            let (g, sku, prefix) = (g.clone(), sku.to_owned(), prefix.to_owned());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut i = 0;
                let deadline = Instant::now() + Duration::from_secs(40);
                while i < per && Instant::now() < deadline {
                    let port = {
                        let g = g.lock().expect("group");
                        let l = g.leader(None, Duration::from_secs(10));
                        g.port(l)
                    };
                    let user = format!("{prefix}-{w}-{i}");
                    let r = {
                        let g = g.lock().expect("group");
                        let tok = g.token(&sku, &user);
                        drop(g);
                        reserve_with(port, &sku, &user, &tok, &format!("req-{i}"))
                    };
                    match r {
                        Ok(t) => {
                            acked.push(t);
                            i += 1;
                        }
                        Err(e) if e == "SOLDOUT" => i += 1,
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                acked
            })
        })
        .collect()
}

pub fn reserve_with(
    port: u16,
    sku: &str,
    user: &str,
    tok: &str,
    req: &str,
) -> Result<String, String> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let v: redis::Value = redis::cmd("RESERVE")
        .arg(sku)
        .arg(user)
        .arg(tok)
        .arg(req)
        .query(&mut c)
        .map_err(|e| e.to_string())?;
    match v {
        redis::Value::Array(items) if items.len() >= 2 => {
            let word = crate::common::as_str(&items[0]);
            if word == "RESERVED" || word == "REPLAY" {
                Ok(crate::common::as_str(&items[1]))
            } else {
                Err(word)
            }
        }
        redis::Value::Array(items) if !items.is_empty() => Err(crate::common::as_str(&items[0])),
        other => Err(format!("{other:?}")),
    }
}

pub fn check_all_present(g: &Group, leader: u64, acked: &[String], sku: &str, total: i64) {
    let port = g.port(leader);
    let mut seen = std::collections::HashSet::new();
    for t in acked {
        assert!(seen.insert(t.clone()), "token {t} acknowledged twice");
        assert_eq!(
            state_of(port, t).as_deref(),
            Some("RESERVED"),
            "acknowledged reservation {t} missing on the leader"
        );
    }
    let (tot, avail, reserved, committed) = sale_info(port, sku);
    assert_eq!(tot, total);
    assert!(
        acked.len() as i64 <= total,
        "more units handed out than exist"
    );
    assert_eq!(
        avail + reserved + committed,
        total,
        "counters do not add up"
    );
    assert!(reserved >= acked.len() as i64);
}

/// `INFO` field `name` of the member on `port` (a number). A member that installs a
/// snapshot re-executes itself and drops its connections, possibly between the connect and
/// the reply: an I/O error is retried on a new connection for a while.
pub fn info_field(port: u16, name: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let s: String = loop {
        match redis::cmd("INFO").arg("all").query(&mut conn(port)) {
            Ok(s) => break s,
            Err(e)
                if (e.is_io_error() || e.is_connection_dropped()) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("INFO on {port}: {e}"),
        }
    };
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {name}: {s}"))
}

/// Every running member's WAL ends at the same LSN, within `within` (unlike
/// [`Group::converge`], true also when feeds start at different places: a member that
/// installed a snapshot has no entries before it).
/// `INFO server`'s `stockgate_history` of the member on `port` (empty when none yet).
/// The history id `INFO server` shows on `port`; a leader begins it just after its
/// writes open, so an empty one is asked again for a while.
pub fn history_of(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut conn(port))
            .expect("info");
        let id = s
            .lines()
            .find_map(|l| l.strip_prefix("stockgate_history:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default();
        if !id.is_empty() && id != "-" || Instant::now() >= deadline {
            return id;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn converge_wal(g: &Group, within: Duration) -> u64 {
    let ports: Vec<u16> = g
        .members
        .iter()
        .filter(|m| m.child.is_some())
        .map(|m| m.port)
        .collect();
    let deadline = Instant::now() + within;
    loop {
        let lsns: Vec<u64> = ports
            .iter()
            .map(|p| info_field(*p, "wal_last_lsn"))
            .collect();
        if lsns.windows(2).all(|w| w[0] == w[1]) {
            return lsns[0];
        }
        assert!(
            Instant::now() < deadline,
            "members' WALs did not converge: {lsns:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Group {
    /// The members' client ports (they keep them across restarts).
    pub fn ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.port).collect()
    }

    /// Cuts (or heals) the two directed links between `a` and `b` only.
    pub fn cut_link(&self, a: u64, b: u64, cut: bool) {
        for ((f, t), p) in &self.links {
            if (*f == a && *t == b) || (*f == b && *t == a) {
                p.cut.store(cut, Ordering::SeqCst);
            }
        }
    }

    /// Heals every link.
    pub fn heal_all(&self) {
        for (_, p) in &self.links {
            p.cut.store(false, Ordering::SeqCst);
            p.deaf.store(false, Ordering::SeqCst);
        }
    }

    /// Member `id` can send but not hear (or, `false`, hears again): its calls reach the
    /// others and their answers are lost, and the others' calls to it are cut.
    pub fn deafen(&self, id: u64, deaf: bool) {
        for ((f, t), p) in &self.links {
            if *f == id {
                p.deaf.store(deaf, Ordering::SeqCst);
            } else if *t == id {
                p.cut.store(deaf, Ordering::SeqCst);
            }
        }
    }
}

/// A connection with short connect and answer timeouts, for discovery.
fn quick_conn(port: u16, timeout: Duration) -> Option<redis::Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(timeout))
        .ok()?;
    c.set_read_timeout(Some(timeout)).ok()?;
    c.set_write_timeout(Some(timeout)).ok()?;
    Some(c)
}

/// The client port of the member that takes writes, found as a Sentinel-aware client
/// finds it without the harness's knowledge of who runs: each member is asked
/// `SENTINEL get-master-addr-by-name stockgate`, and the one named must say `master` to
/// `ROLE`. None if no member names a writable leader within `within`.
pub fn discover(ports: &[u16], within: Duration) -> Option<u16> {
    let deadline = Instant::now() + within;
    loop {
        for &p in ports {
            let Some(mut c) = quick_conn(p, Duration::from_millis(300)) else {
                continue;
            };
            let addr: Option<(String, String)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("stockgate")
                .query(&mut c)
                .ok()
                .flatten();
            let Some(named) = addr.and_then(|(_, port)| port.parse::<u16>().ok()) else {
                continue;
            };
            let Some(mut lc) = quick_conn(named, Duration::from_millis(300)) else {
                continue;
            };
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut lc).unwrap_or_default();
            if role.first().map(crate::common::as_str).as_deref() == Some("master") {
                return Some(named);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Group {
    /// The operator's way back for member `f` (stopped, its `raft/log` or whole data dir
    /// gone): `RAFT.REMOVE f` on `leader`, `f` started with `--rejoin-empty` and without
    /// `--raft-peers`, then `RAFT.ADD f` on `leader`.
    pub fn rejoin_empty(&mut self, f: u64, leader: u64) {
        let lport = self.port(leader);
        let r: String = redis::cmd("RAFT.REMOVE")
            .arg(f)
            .query(&mut conn(lport))
            .expect("remove");
        assert_eq!(r, "OK");
        let m = self.member(f);
        if let Some(at) = m.args.iter().position(|a| a == "--raft-peers") {
            m.args.drain(at..at + 2);
        }
        m.args.push("--rejoin-empty".into());
        m.spawn();
        let (port, raft_port) = (m.port, m.raft_port);
        let r: String = redis::cmd("RAFT.ADD")
            .arg(f)
            .arg(format!("127.0.0.1:{port}"))
            .arg(format!("127.0.0.1:{raft_port}"))
            .query(&mut conn(lport))
            .expect("add");
        assert_eq!(r, "OK");
    }
}

/// Each token's `state` on the member on `port` (None: unknown there), pipelined.
pub fn states(port: u16, tokens: &[String]) -> Vec<Option<String>> {
    let mut c = conn(port);
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut out = Vec::with_capacity(tokens.len());
    for chunk in tokens.chunks(500) {
        let mut p = redis::pipe();
        for t in chunk {
            p.cmd("RESERVATION").arg(t);
        }
        // A leader may lose its lease for a moment on a loaded machine (see `read`).
        let deadline = Instant::now() + Duration::from_secs(10);
        let vs: Vec<redis::Value> = loop {
            match p.query(&mut c) {
                Ok(vs) => break vs,
                Err(e)
                    if e.to_string().contains("leads no majority") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("RESERVATION pipeline on {port}: {e}"),
            }
        };
        out.extend(
            vs.iter()
                .map(|v| crate::common::field(v, "state").map(|s| crate::common::as_str(&s))),
        );
    }
    out
}
