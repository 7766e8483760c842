//! What operators see of the group and the ledger, against real servers: the status page
//! rendered by headless Chromium, `stockgate top` under tmux, the JSON and the metrics,
//! and `/healthz` across a Raft group whose leaders are killed with SIGKILL.

use crate::common::ha::free_port;
use crate::common::have;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::raft::{create_sale, Group};
use crate::common::{Server, TempDir};

/// One GET: the status code and the body; `None` while nothing listens.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

/// Polls `path` until `pred` holds of its answer (bounded), and returns that answer.
fn get_until(addr: &str, path: &str, pred: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some((c, b)) = get(addr, path) {
            if pred(c, &b) {
                return (c, b);
            }
            last = Some((c, b));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{addr}{path} never answered as expected; last {last:?}");
}

fn q(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c).expect("command")
}

fn tmux(sock: &str, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .arg("-L")
        .arg(sock)
        .args(args)
        .output()
        .expect("tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kills the private tmux server (and the `top` it runs) when dropped.
struct TmuxServer(String);

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .status();
    }
}

/// `stockgate top --server addr` in a private tmux; the screen once `pred` holds of it.
fn top_until(addr: &str, tag: &str, pred: impl Fn(&str) -> bool) -> String {
    let sock = format!("sgstatus-{tag}-{}", std::process::id());
    let _guard = TmuxServer(sock.clone());
    let cmd = format!(
        "{} top --server {addr}",
        crate::common::server_bin().display()
    );
    tmux(
        &sock,
        &[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "200",
            "-y",
            "40",
            &cmd,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = tmux(&sock, &["capture-pane", "-p", "-t", "top"]);
        if pred(&screen) {
            return screen;
        }
        assert!(Instant::now() < deadline, "top never showed it:\n{screen}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Headless Chromium on the status page: the DOM after the page polled, and the size of a
/// screenshot `name` (kept in `$OPS_STATUS_SCREENSHOTS` when set, for a look).
fn render_page(maddr: &str, name: &str) -> (String, u64) {
    let profile = TempDir::new("chromium");
    let png = profile.path().join(name);
    let run = |what: &[String]| {
        let out = Command::new("timeout")
            .args(["60", "chromium"])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1100,1400",
                "--virtual-time-budget=4000",
                "--run-all-compositor-stages-before-draw",
                &format!("--user-data-dir={}", profile.path().display()),
            ])
            .args(what)
            .arg(format!("http://{maddr}/"))
            .stderr(Stdio::null())
            .output()
            .expect("run chromium");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&[format!("--screenshot={}", png.display())]);
    let size = std::fs::metadata(&png).map_or(0, |m| m.len());
    if let Ok(dir) = std::env::var("OPS_STATUS_SCREENSHOTS") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::copy(&png, std::path::Path::new(&dir).join(name));
    }
    (run(&["--dump-dom".to_string()]), size)
}

/// A single node with the order feed: a materializer-like consumer group holds an entry it
/// did not acknowledge; the page, `top`, the JSON and the metrics show that lag, and the
/// node is healthy.
#[test]
fn a_single_node_shows_the_feed_groups_lag_and_is_healthy() {
    let maddr = format!("127.0.0.1:{}", free_port());
    let s = Server::start(&["--metrics-addr", &maddr]);
    let mut c = s.client().get_connection().expect("connect");
    let stream = "{LEDG}:events";
    q(&mut c, &["SALE.CREATE", "LEDG", "10"]);
    q(&mut c, &["XGROUP", "CREATE", stream, "materializer", "0"]);
    for _ in 0..3 {
        q(&mut c, &["SALE.ADJUST", "LEDG", "1"]);
    }
    // One entry delivered and not acknowledged: the consumer is behind by it.
    q(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "materializer",
            "m1",
            "COUNT",
            "1",
            "STREAMS",
            stream,
            ">",
        ],
    );

    let (code, body) = get_until(&maddr, "/healthz", |_, _| true);
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (_, json) = get_until(&maddr, "/json", |_, b| b.contains("\"feed_groups\":[{"));
    assert!(json.contains("\"health\":\"ok\",\"group\":null"), "{json}");
    assert!(
        json.contains("\"group\":\"materializer\",\"consumers\":1,\"lag\":"),
        "{json}"
    );
    assert!(
        json.contains("\"pending\":1,\"oldest_pending_ms\":"),
        "{json}"
    );
    // The oldest unacknowledged entry ages: its age rises past a second.
    let (_, metrics) = get_until(&maddr, "/metrics", |_, b| {
        b.lines().any(|l| {
            l.starts_with("stockgate_feed_group_oldest_pending_seconds{")
                && l.contains("group=\"materializer\"")
                && l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v >= 1.0)
        })
    });
    assert!(
        metrics.contains("# HELP stockgate_feed_group_oldest_pending_seconds "),
        "{metrics}"
    );

    if have("chromium") {
        let (dom, png) = render_page(&maddr, "ops-status-single.png");
        for want in [
            "id=\"health\" class=\"\">ok</b>",
            "single node (no Raft group)",
            "id=\"fg-materializer-group\">materializer</td>",
            "id=\"fg-materializer-pending\">1</td>",
            "id=\"sweeper-lag\">0.0 s</b>",
            "y: events per second · x: seconds before now",
        ] {
            assert!(dom.contains(want), "no {want} in the page:\n{dom}");
        }
        assert!(png > 1000, "no screenshot of the page ({png} bytes)");
    } else {
        eprintln!("SKIP page: chromium not installed (scripts/test-all.sh installs it)");
    }

    if have("tmux") {
        let screen = top_until(&s.addr, "single", |sc| sc.contains("1 unacked"));
        assert!(
            screen.contains("group: single node (no Raft group)"),
            "{screen}"
        );
        assert!(
            screen.contains("ledger  sweeper lag 0.0s  feed materializer: lag "),
            "{screen}"
        );
    } else {
        eprintln!("SKIP top: tmux not installed (scripts/test-all.sh installs it)");
    }
}

/// The metrics address of each member, once each was restarted with one.
fn with_metrics(g: &mut Group) -> Vec<(u64, String)> {
    let ids: Vec<u64> = g.members.iter().map(|m| m.id).collect();
    let mut out = Vec::new();
    for id in ids {
        let maddr = format!("127.0.0.1:{}", free_port());
        let m = g.member(id);
        m.kill9();
        m.args.push("--metrics-addr".into());
        m.args.push(maddr.clone());
        m.spawn();
        out.push((id, maddr));
    }
    out
}

fn maddr_of(addrs: &[(u64, String)], id: u64) -> &str {
    addrs
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, a)| a.as_str())
        .expect("member")
}

/// A Raft group: the leader is healthy and lists its followers; a follower answers 503
/// naming the leader; after `kill -9` of the leader the new leader takes over /healthz;
/// after `kill -9` of that one too, the last member knows no leader and says so.
#[test]
fn healthz_follows_the_leadership_of_a_raft_group_through_kill9() {
    let mut g = Group::start(false);
    let addrs = with_metrics(&mut g);
    let l = g.leader(None, Duration::from_secs(20));
    create_sale(g.port(l), "GRP", 100);
    let (code, body) = get_until(maddr_of(&addrs, l), "/healthz", |c, _| c == 200);
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    for (id, maddr) in addrs.iter().filter(|(i, _)| *i != l) {
        // A member restarted a moment ago may not have heard the leader yet.
        let (code, body) = get_until(maddr, "/healthz", |c, b| {
            c == 503 && b.starts_with("follower: writes go to the leader")
        });
        assert_eq!(code, 503, "member {id}");
        assert!(
            body.starts_with(&format!("follower: writes go to the leader, node {l} at ")),
            "member {id}: {body}"
        );
    }
    // The leader's JSON: its role, both followers caught up, the commit point.
    let (_, json) = get_until(maddr_of(&addrs, l), "/json", |_, b| {
        b.matches("\"matched\":").count() == 2 && !b.contains("\"lag\":1")
    });
    assert!(json.contains("\"role\":\"leader\""), "{json}");
    assert!(json.contains(&format!("\"leader_id\":{l}")), "{json}");
    assert!(json.contains("\"commit_index\":"), "{json}");
    let (_, metrics) = get_until(maddr_of(&addrs, l), "/metrics", |_, b| {
        b.contains("stockgate_raft_follower_lag_entries{")
    });
    assert!(
        metrics.contains("stockgate_raft_commit_lag_entries{group="),
        "{metrics}"
    );

    if have("chromium") {
        let (dom, png) = render_page(maddr_of(&addrs, l), "ops-status-group.png");
        assert!(png > 1000, "no screenshot of the page ({png} bytes)");
        for want in [
            "id=\"group-role\">leader</b>".to_string(),
            format!("id=\"group-leader\">node {l} at 127.0.0.1:"),
            "id=\"group-commit\">".to_string(),
        ] {
            assert!(dom.contains(&want), "no {want} in the page:\n{dom}");
        }
        for (id, _) in addrs.iter().filter(|(i, _)| *i != l) {
            let want = format!("id=\"follower-{id}-lag\" class=\"\">0</td>");
            assert!(dom.contains(&want), "no {want} in the page:\n{dom}");
        }
    }
    if have("tmux") {
        let leader_addr = format!("127.0.0.1:{}", g.port(l));
        let screen = top_until(&leader_addr, "group", |sc| sc.contains("followers "));
        assert!(
            screen.contains(&format!("node {l} leader  leader {l} (127.0.0.1:")),
            "{screen}"
        );
        for (id, _) in addrs.iter().filter(|(i, _)| *i != l) {
            assert!(screen.contains(&format!("{id}:lag ")), "{screen}");
        }
        assert!(screen.contains("ledger  sweeper lag "), "{screen}");
    }

    // kill -9 the leader: a survivor takes over and answers ok; the other follows it.
    g.member(l).kill9();
    let l2 = g.leader(Some(l), Duration::from_secs(20));
    get_until(maddr_of(&addrs, l2), "/healthz", |c, b| {
        c == 200 && b == "ok\n"
    });
    let last = addrs
        .iter()
        .map(|(i, _)| *i)
        .find(|i| *i != l && *i != l2)
        .expect("a third member");
    get_until(maddr_of(&addrs, last), "/healthz", |c, b| {
        c == 503 && b.starts_with(&format!("follower: writes go to the leader, node {l2} at "))
    });

    // kill -9 the new leader too: the last member has no majority, so no leader.
    g.member(l2).kill9();
    let (code, body) = get_until(maddr_of(&addrs, last), "/healthz", |c, b| {
        c == 503 && b.starts_with("no leader known")
    });
    assert_eq!(code, 503, "{body}");
}

/// Unmounts the test's tmpfs when dropped (after the server on it was killed).
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A single node whose disk fills up: once its write-ahead log fails, `/healthz` answers
/// 503 with the log's error. The disk is a 3 MiB tmpfs filled by another writer, so this
/// runs as root only (it is skipped otherwise).
#[test]
fn healthz_turns_503_when_the_disk_under_the_log_is_full() {
    let tmp = TempDir::new("full");
    let mnt = tmp.path().join("disk");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("SKIP: mounting a tmpfs needs root");
        return;
    }
    let _mount = Mount(mnt.clone());
    let maddr = format!("127.0.0.1:{}", free_port());
    let mut s = Server::start_in(&mnt.join("data"), &["--metrics-addr", &maddr]);
    let mut c = s.client().get_connection().expect("connect");
    q(&mut c, &["SALE.CREATE", "FULL", "10"]);
    let (code, _) = get_until(&maddr, "/healthz", |_, _| true);
    assert_eq!(code, 200);
    // Another writer takes the rest of the disk.
    let filler = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", mnt.join("filler").display()))
        .stderr(Stdio::null())
        .status()
        .expect("dd");
    assert!(!filler.success(), "dd should stop at a full disk");
    // Writes now fail to reach the disk; the first failure fences the log.
    let mut failed = false;
    for _ in 0..2000 {
        let mut cmd = redis::cmd("SALE.ADJUST");
        cmd.arg("FULL").arg(1);
        if cmd.query::<redis::Value>(&mut c).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "writes kept succeeding on a full disk");
    let (code, body) = get_until(&maddr, "/healthz", |c, _| c == 503);
    assert_eq!(code, 503);
    assert!(
        body.starts_with("the write-ahead log failed: ")
            && body.contains("No space left on device"),
        "{body}"
    );
    s.kill9();
}
