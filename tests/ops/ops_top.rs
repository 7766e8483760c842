//! `stockgate top` when it cannot poll, against real servers: a server with users and no
//! `--auth`, and a server that dies under a running `top`. The screen says what is wrong
//! in plain words and shows no figures at all (no zeros, no defaults such as `fsync off`
//! or `no error replies`) until a poll succeeds.

use crate::common::{have, Server, TempDir};

use std::process::Command;
use std::time::{Duration, Instant};

/// Labels that only a screen of figures has: none may show while no poll succeeded.
const FIGURE_LABELS: [&str; 11] = [
    "fsync",
    "no error replies",
    "ops/s",
    "clients",
    "reserve p99",
    "sweeper lag",
    "denied",
    "group",
    "ledger",
    "available",
    "errors (q quits)",
];

/// A server whose users file holds `boss` (admin) and `shop` (checkout).
fn server_with_users() -> (Server, TempDir) {
    let dir = TempDir::new("topusers");
    let file = dir.path().join("users");
    std::fs::write(&file, "boss admin boss-pw\nshop checkout shop-pw\n").expect("users file");
    let srv = Server::start(&["--users-file", file.to_str().expect("utf-8 path")]);
    (srv, dir)
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

/// `stockgate top <args>` in a private tmux of 200×40.
fn start_top(tag: &str, args: &str) -> TmuxServer {
    let sock = format!("sgtop-{tag}-{}", std::process::id());
    let guard = TmuxServer(sock.clone());
    let cmd = format!(
        "{} top --interval-ms 200 {args}",
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
    guard
}

/// The screen once `pred` holds of it (bounded).
fn screen_until(top: &TmuxServer, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = tmux(&top.0, &["capture-pane", "-p", "-t", "top"]);
        if pred(&screen) {
            return screen;
        }
        assert!(Instant::now() < deadline, "top never showed it:\n{screen}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_no_figures(screen: &str) {
    for label in FIGURE_LABELS {
        assert!(
            !screen.contains(label),
            "a screen with no successful poll shows {label:?}:\n{screen}"
        );
    }
}

#[test]
fn without_auth_top_says_so_and_shows_no_figures() {
    if !have("tmux") {
        eprintln!("SKIP: tmux not installed (scripts/test-all.sh installs it)");
        return;
    }
    let (srv, _dir) = server_with_users();
    let top = start_top("noauth", &format!("--server {}", srv.addr));
    let screen = screen_until(&top, |sc| sc.contains("asks for a password"));
    assert!(screen.contains("--auth USER PASSWORD"), "{screen}");
    assert!(
        screen.contains("no figures until a poll succeeds"),
        "{screen}"
    );
    assert_no_figures(&screen);
    // Polled again and again, still nothing but the trouble.
    std::thread::sleep(Duration::from_millis(800));
    let screen = tmux(&top.0, &["capture-pane", "-p", "-t", "top"]);
    assert!(screen.contains("asks for a password"), "{screen}");
    assert_no_figures(&screen);

    // The same server with --auth: the figures, labels included (so their absence above
    // is the fix, not labels this test misspelt).
    let top = start_top(
        "auth",
        &format!("--server {} --auth boss boss-pw", srv.addr),
    );
    let screen = screen_until(&top, |sc| sc.contains("fsync everysec"));
    for label in [
        "ops/s",
        "reserve p99",
        "sweeper lag",
        "denied",
        "errors (q quits)",
    ] {
        assert!(screen.contains(label), "{label:?} missing:\n{screen}");
    }
    assert!(!screen.contains("asks for a password"), "{screen}");
}

#[test]
fn a_server_lost_under_top_leaves_no_stale_figures() {
    if !have("tmux") {
        eprintln!("SKIP: tmux not installed (scripts/test-all.sh installs it)");
        return;
    }
    let (mut srv, _dir) = server_with_users();
    let top = start_top(
        "lost",
        &format!("--server {} --auth boss boss-pw", srv.addr),
    );
    screen_until(&top, |sc| sc.contains("fsync everysec"));
    srv.kill9();
    let screen = screen_until(&top, |sc| sc.contains("nothing listens at"));
    assert!(screen.contains(&srv.addr), "{screen}");
    assert_no_figures(&screen);
}

#[test]
fn once_without_auth_says_so_in_plain_words() {
    let (srv, _dir) = server_with_users();
    let out = Command::new(crate::common::server_bin())
        .args([
            "top",
            "--once",
            "--interval-ms",
            "100",
            "--server",
            &srv.addr,
        ])
        .output()
        .expect("run top --once");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "figures printed: {stdout}");
    assert!(
        stderr.contains("the server asks for a password: pass --auth USER PASSWORD"),
        "{stderr}"
    );
    // A wrong password is told apart from a missing one.
    let out = Command::new(crate::common::server_bin())
        .args(["top", "--once", "--server", &srv.addr])
        .args(["--auth", "boss", "wrong"])
        .output()
        .expect("run top --once");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused the user and password of --auth"),
        "{stderr}"
    );
}
