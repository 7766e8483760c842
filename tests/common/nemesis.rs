//! Faults at a Raft group's edges for the storm tests: members moved onto small tmpfs
//! file systems that can be filled, wiped data dirs brought back with `RAFT.READMIT`,
//! one-way link cuts, and the failover times measured across them.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::raft::{conn, Group};

/// The exit status of a member whose storage failed (docs/operations.md).
pub const EXIT_STORAGE: i32 = 75;

/// A tmpfs mounted on a member's data dir, detached again when dropped (lazily: the
/// member may still hold files open).
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` on `dir`; the reason in words when it cannot (not root,
    /// no `mount`, a container without the capability).
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs on {} failed ({}): {}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Moves member `id`'s data dir onto its own tmpfs: stopped, copied, started again. On
/// failure the member runs on its old dir again and the reason is returned.
pub fn onto_tmpfs(g: &mut Group, id: u64, size: &str) -> Result<Tmpfs, String> {
    let m = g.member(id);
    m.kill9();
    let old = m.dir.with_extension("old");
    std::fs::rename(&m.dir, &old).map_err(|e| format!("set the data dir aside: {e}"))?;
    std::fs::create_dir(&m.dir).map_err(|e| format!("mount point: {e}"))?;
    let fs = match Tmpfs::mount(&m.dir, size) {
        Ok(fs) => fs,
        Err(e) => {
            let _ = std::fs::remove_dir(&m.dir);
            std::fs::rename(&old, &m.dir).expect("put the data dir back");
            m.spawn();
            return Err(e);
        }
    };
    super::copy_dir(&old, &m.dir);
    std::fs::remove_dir_all(&old).expect("remove the old data dir");
    m.spawn();
    Ok(fs)
}

/// Fills the file system of `dir` up to the last byte: a file written until ENOSPC
/// (tmpfs takes the pages at write time, nothing is left for anyone).
pub fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    for chunk in [1 << 20, 4096, 1] {
        let buf = vec![0xA5u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    path
}

/// Member `id`'s exit status, if its process ended (it is then no longer running).
pub fn reap(g: &mut Group, id: u64) -> Option<i32> {
    let m = g.member(id);
    let st = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten())?;
    m.child = None;
    Some(st.code().unwrap_or(-1))
}

/// A field of `INFO replication` on `port`, as text (None when absent or unanswered).
pub fn info_text(port: u16, name: &str) -> Option<String> {
    let s: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn(port))
        .ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_owned())
}

/// Removes everything in `dir` but `dir` itself (it may be a mount point).
fn empty_dir(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("read the data dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).expect("wipe");
        } else {
            std::fs::remove_file(&p).expect("wipe");
        }
    }
}

/// `kill -9`, every file of the data dir deleted, started again with its usual command
/// line. The member that formed the group has `--raft-bootstrap` on it, which makes a
/// wiped member refuse to start; the documented way back drops that flag.
pub fn wipe_and_restart(g: &mut Group, id: u64) {
    let m = g.member(id);
    m.kill9();
    empty_dir(&m.dir);
    m.args.retain(|a| a != "--raft-bootstrap");
    m.spawn();
}

/// Waits until member `id` says `raft_voting:<want>`.
pub fn wait_voting(g: &Group, id: u64, want: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let v = info_text(g.port(id), "raft_voting");
        if v.as_deref() == Some(want) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "member {id} says raft_voting:{v:?} after {within:?}, not {want}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The operator's `RAFT.READMIT id` on the leader of the moment, asked again while the
/// leadership moves under it; the leader that took it and how it answered. An earlier
/// attempt whose reply was lost may have done part of it: the member is then no member
/// (`RAFT.ADD` finishes it) or already re-admitted.
pub fn readmit(g: &Group, id: u64, within: Duration) -> Result<(u64, String), String> {
    let deadline = Instant::now() + within;
    let mut last = String::new();
    while Instant::now() < deadline {
        let l = g.leader(Some(id), Duration::from_secs(20));
        let mut c = conn(g.port(l));
        c.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let r: redis::RedisResult<String> = redis::cmd("RAFT.READMIT").arg(id).query(&mut c);
        let e = match r {
            Ok(r) => return Ok((l, r)),
            Err(e) => e.to_string(),
        };
        if e.contains("nothing to re-admit") {
            return Ok((l, e));
        }
        if e.contains("is not a member") {
            let m = g.members.iter().find(|m| m.id == id).expect("member");
            let r: redis::RedisResult<String> = redis::cmd("RAFT.ADD")
                .arg(id)
                .arg(format!("127.0.0.1:{}", m.port))
                .arg(format!("127.0.0.1:{}", m.raft_port))
                .query(&mut c);
            if r.is_ok() {
                return Ok((l, format!("{e}; RAFT.ADD {id}: OK")));
            }
        }
        last = format!("on leader {l}: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("RAFT.READMIT {id} never succeeded: {last}"))
}

/// Each running member's view of the group, for a report: its own incarnation, vote,
/// state and leader, and its `RAFT.MEMBERS` rows.
pub fn membership_views(g: &Group) -> String {
    let mut out = String::new();
    for m in g.members.iter().filter(|m| m.child.is_some()) {
        let own: Vec<String> = [
            "raft_incarnation",
            "raft_voting",
            "raft_state",
            "raft_term",
            "raft_leader_id",
        ]
        .iter()
        .map(|f| format!("{f}:{}", info_text(m.port, f).unwrap_or_default()))
        .collect();
        let rows: redis::RedisResult<redis::Value> =
            redis::cmd("RAFT.MEMBERS").query(&mut conn(m.port));
        out.push_str(&format!(
            "  member {}: {}; RAFT.MEMBERS {:?}\n",
            m.id,
            own.join(" "),
            rows
        ));
    }
    out
}

/// The incarnation member `of` has in the `RAFT.MEMBERS` of the member on `port`.
pub fn incarnation_seen(port: u16, of: u64) -> Option<String> {
    let rows: Vec<Vec<redis::Value>> = redis::cmd("RAFT.MEMBERS").query(&mut conn(port)).ok()?;
    rows.iter()
        .find(|r| r.first().map(super::as_int) == Some(of as i64))
        .and_then(|r| r.get(4))
        .map(super::as_str)
}

/// `RAFT.REMOVE id` on the leader of the moment (retried while the leadership moves),
/// then `id` stopped: the group goes on with the other two.
pub fn remove_member(g: &mut Group, id: u64, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut last = String::new();
    while Instant::now() < deadline {
        let l = g.leader(Some(id), Duration::from_secs(20));
        let r: redis::RedisResult<String> = redis::cmd("RAFT.REMOVE")
            .arg(id)
            .query(&mut conn(g.port(l)));
        match r {
            Ok(_) => {
                g.member(id).kill9();
                return Ok(());
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("RAFT.REMOVE {id} never succeeded: {last}"))
}

/// Whether the member on `port` says it is the master (`ROLE`); false when it does not
/// answer.
pub fn says_master(port: u16) -> bool {
    quick_conn(port).is_some_and(|mut c| role_is_master(&mut c))
}

/// A connection to the member on `port` for a probe that must not hang on a dead or stuck
/// member: 300 ms to connect, 500 ms per reply. None when it does not connect.
pub fn quick_conn(port: u16) -> Option<redis::Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
        .ok()?;
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    Some(c)
}

/// Whether `ROLE` on `c` answers master (false when it does not answer).
pub fn role_is_master(c: &mut redis::Connection) -> bool {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(c).unwrap_or_default();
    role.first().map(super::as_str).as_deref() == Some("master")
}

/// Cuts (or heals) the one directed link `from` → `to`: `from` can no longer call `to`,
/// while `to` still calls `from` (a call's reply travels on the caller's connection).
pub fn cut_one_way(g: &Group, from: u64, to: u64, cut: bool) {
    for ((f, t), p) in &g.links {
        if *f == from && *t == to {
            p.cut.store(cut, Ordering::SeqCst);
        }
    }
}

/// When acknowledged RESERVEs arrived (through Sentinel-aware clients), and when each
/// fault began: the failover time of a fault is the wait from its start to the first
/// acknowledgement after it.
#[derive(Default)]
pub struct Failovers {
    acks: Mutex<Vec<Instant>>,
    faults: Mutex<Vec<(String, Instant)>>,
}

impl Failovers {
    pub fn ack(&self) {
        self.acks.lock().expect("acks").push(Instant::now());
    }

    pub fn fault(&self, kind: &str, at: Instant) {
        self.faults
            .lock()
            .expect("faults")
            .push((kind.to_owned(), at));
    }

    /// Each fault's kind and failover time (None: no acknowledgement after it).
    pub fn times(&self) -> Vec<(String, Option<Duration>)> {
        let acks = self.acks.lock().expect("acks");
        self.faults
            .lock()
            .expect("faults")
            .iter()
            .map(|(k, at)| {
                let first = acks.iter().filter(|a| *a > at).min();
                (k.clone(), first.map(|a| a.duration_since(*at)))
            })
            .collect()
    }

    /// min / median / max per fault kind, in ms, one line per kind.
    pub fn table(&self) -> String {
        let mut by_kind: BTreeMap<String, (Vec<u128>, usize)> = BTreeMap::new();
        for (k, t) in self.times() {
            let e = by_kind.entry(k).or_default();
            match t {
                Some(t) => e.0.push(t.as_millis()),
                None => e.1 += 1,
            }
        }
        let mut s = format!(
            "{:<22} {:>3} {:>8} {:>8} {:>8} {:>6}\n",
            "fault", "n", "min ms", "med ms", "max ms", "no ack"
        );
        for (k, (mut v, none)) in by_kind {
            v.sort_unstable();
            let at = |i: usize| v.get(i).map_or("-".to_owned(), |x| x.to_string());
            let med = if v.is_empty() { 0 } else { (v.len() - 1) / 2 };
            s.push_str(&format!(
                "{k:<22} {:>3} {:>8} {:>8} {:>8} {none:>6}\n",
                v.len() + none,
                at(0),
                at(med),
                at(v.len().saturating_sub(1)),
            ));
        }
        s
    }
}
