//! The config file and live settings (docs/operations.md, "A config file", "Live
//! settings"), over the real binary: settings from the file (with an include and
//! comments), the command line winning over it, bad directives refused at startup with
//! their line, `CONFIG SET` changing behaviour live, fixed settings refused with their
//! reason, `CONFIG REWRITE` surviving a restart.

use crate::common::ha::free_port;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::*;
use redis::Value;

/// A server started from a config file with exactly the flags given (no `--port 0`).
struct Proc {
    child: Child,
    addr: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://{}/", self.addr)).unwrap()
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_tokio_connection()
            .await
            .unwrap()
    }

    /// SIGTERM and wait, so the next start can bind the same port.
    fn stop(mut self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// Starts `stockgate serve <args>`; the first stdout line or, if it exits, its stderr.
fn spawn(args: &[&str]) -> Result<Proc, (Option<i32>, String)> {
    let mut child = Command::new(server_bin())
        .arg("serve")
        .args(args)
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockgate");
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    if let Some(addr) = line.trim().strip_prefix("listening on ") {
        return Ok(Proc {
            addr: addr.to_string(),
            child,
        });
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    Err((status.code(), err))
}

async fn get(c: &mut redis::aio::MultiplexedConnection, name: &str) -> String {
    match cmd(c, &["CONFIG", "GET", name]).await.unwrap() {
        Value::Array(v) if v.len() == 2 => as_str(&v[1]),
        Value::Map(v) if v.len() == 1 => as_str(&v[0].1),
        other => panic!("CONFIG GET {name}: {other:?}"),
    }
}

fn error_text(r: redis::RedisResult<Value>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(Value::ServerError(e)) => format!("{e:?}"),
        Ok(v) => panic!("not an error: {v:?}"),
    }
}

/// `main.conf` (a comment, the port, the data dir, an include) and `conf.d/extra.conf`.
fn write_config(dir: &Path, port: u16) -> std::path::PathBuf {
    let data = dir.join("data dir");
    std::fs::create_dir_all(dir.join("conf.d")).unwrap();
    let main = dir.join("main.conf");
    std::fs::write(
        &main,
        format!(
            "# stockgate test config\nport {port}\ndata-dir \"{}\"\n\ninclude conf.d/extra.conf\n# the slow log\nslowlog-log-slower-than 5000\n",
            data.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("conf.d/extra.conf"),
        "# limits\nmaxclients 33\nslowlog-max-len 7\nauto-release yes\n",
    )
    .unwrap();
    main
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_come_from_the_file_and_flags_win() {
    let dir = TempDir::new("conf");
    let port = free_port();
    let main = write_config(dir.path(), port);
    let p = spawn(&["--config", main.to_str().unwrap()]).expect("starts from the file");
    assert_eq!(p.addr, format!("127.0.0.1:{port}"));
    let mut c = p.conn().await;
    assert_eq!(get(&mut c, "maxclients").await, "33");
    assert_eq!(get(&mut c, "slowlog-max-len").await, "7");
    assert_eq!(get(&mut c, "slowlog-log-slower-than").await, "5000");
    assert_eq!(get(&mut c, "auto-release").await, "yes");
    assert!(get(&mut c, "dir").await.ends_with("data dir"));
    assert!(dir.path().join("data dir/wal").exists());
    drop(c);
    p.stop();
    // The command line wins over the file, whichever side of --config it is on.
    let p = spawn(&[
        "--maxclients",
        "44",
        "--config",
        main.to_str().unwrap(),
        "--port",
        "0",
    ])
    .expect("starts");
    assert_ne!(p.addr, format!("127.0.0.1:{port}"));
    let mut c = p.conn().await;
    assert_eq!(get(&mut c, "maxclients").await, "44");
    assert_eq!(get(&mut c, "slowlog-max-len").await, "7");
}

#[test]
fn a_bad_directive_refuses_startup_naming_file_and_line() {
    let dir = TempDir::new("conf-bad");
    let f = dir.path().join("bad.conf");
    for (text, want) in [
        (
            "# c\nport 0\nprot 7000\n",
            "bad.conf line 3: unknown directive 'prot'",
        ),
        ("port 99999\n", "bad.conf line 1: port: "),
        (
            "\n\nmaxclients 1 2\n",
            "bad.conf line 3: maxclients: expected one value",
        ),
        ("port \"0\n", "bad.conf line 1: unbalanced quotes"),
        ("include nope.conf\n", "bad.conf line 1: include:"),
    ] {
        std::fs::write(&f, text).unwrap();
        let (code, err) = spawn(&["--config", f.to_str().unwrap()])
            .err()
            .unwrap_or_else(|| panic!("{text:?} started"));
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(want), "{text:?}: {err}");
    }
    std::fs::write(&f, "port 99999\n").unwrap();
    let (_, err) = spawn(&["--config", f.to_str().unwrap()]).err().unwrap();
    assert!(err.contains("between 0 and 65535"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_set_changes_behaviour_live() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    cmd(&mut c, &["ECHO", "before"]).await.unwrap();
    assert_eq!(as_int(&cmd(&mut c, &["SLOWLOG", "LEN"]).await.unwrap()), 0);
    assert_eq!(
        cmd(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "0"])
            .await
            .unwrap(),
        Value::Okay
    );
    assert_eq!(get(&mut c, "slowlog-log-slower-than").await, "0");
    cmd(&mut c, &["ECHO", "after-the-change"]).await.unwrap();
    let log = format!(
        "{:?}",
        cmd(&mut c, &["SLOWLOG", "GET", "-1"]).await.unwrap()
    );
    assert!(log.contains("after-the-change"), "{log}");
    assert!(!log.contains("before"), "{log}");

    // maxclients: one more connection than allowed is refused.
    cmd(&mut c, &["CONFIG", "SET", "maxclients", "1"])
        .await
        .unwrap();
    let mut refused = std::net::TcpStream::connect(&srv.addr).unwrap();
    refused
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut line = String::new();
    BufReader::new(&mut refused).read_line(&mut line).unwrap();
    assert_eq!(line, "-ERR max number of clients reached\r\n");
    cmd(&mut c, &["CONFIG", "SET", "maxclients", "100"])
        .await
        .unwrap();
    assert_eq!(get(&mut c, "maxclients").await, "100");
    let info = as_str(&cmd(&mut c, &["INFO", "clients"]).await.unwrap());
    assert!(info.contains("maxclients:100"), "{info}");

    // timeout (seconds, as Redis): a connection made after it that stays idle is dropped.
    cmd(&mut c, &["CONFIG", "SET", "timeout", "1"])
        .await
        .unwrap();
    assert_eq!(get(&mut c, "idle-timeout-ms").await, "1000");
    let mut idle = std::net::TcpStream::connect(&srv.addr).unwrap();
    idle.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let t = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = idle.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed, not answered");
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // The connection that set it was idle as long: dropped as well.
    let mut c = srv.conn().await;
    cmd(&mut c, &["CONFIG", "SET", "timeout", "0"])
        .await
        .unwrap();

    // Several at once; a bad value anywhere changes nothing.
    let e = error_text(
        cmd(
            &mut c,
            &["CONFIG", "SET", "slowlog-max-len", "3", "maxclients", "0"],
        )
        .await,
    );
    assert!(
        e.contains("CONFIG SET maxclients") && e.contains("between 1 and"),
        "{e}"
    );
    assert_eq!(get(&mut c, "slowlog-max-len").await, "128");
    cmd(
        &mut c,
        &[
            "CONFIG",
            "SET",
            "slowlog-max-len",
            "3",
            "retention-ms",
            "5000",
        ],
    )
    .await
    .unwrap();
    assert_eq!(get(&mut c, "slowlog-max-len").await, "3");
    assert_eq!(get(&mut c, "retention-ms").await, "5000");
    cmd(&mut c, &["CONFIG", "SET", "log-level", "warning"])
        .await
        .unwrap();
    assert_eq!(get(&mut c, "log-level").await, "warn");
    let e = error_text(cmd(&mut c, &["CONFIG", "SET", "log-level", "[[["]).await);
    assert!(e.contains("CONFIG SET log-level"), "{e}");
}

/// A raw connection that has talked once and then waits, as an idle client does.
fn idle_client(addr: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut s, b"PING\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&mut s).read_line(&mut line).unwrap();
    assert_eq!(line, "+PONG\r\n");
    s
}

/// `CONFIG SET timeout` reaches connections already idle: one that started waiting with
/// no timeout is closed once the new one passes (the registry's reaper), and one that
/// started waiting with a short timeout, raised meanwhile, stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_timeout_reaches_connections_already_idle() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    let before = as_str(&cmd(&mut c, &["INFO", "stats"]).await.unwrap());
    let dropped = |info: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("idle_timeout_disconnects:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no idle_timeout_disconnects in {info}"))
    };
    let mut waiting = idle_client(&srv.addr);
    waiting
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let t = std::time::Instant::now();
    cmd(&mut c, &["CONFIG", "SET", "timeout", "1"])
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    match waiting.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("answered {n} bytes instead of closing"),
        Err(e) => panic!(
            "still open {:?} after the timeout was set: {e}",
            t.elapsed()
        ),
    }
    let closed_after = t.elapsed();
    assert!(
        closed_after >= std::time::Duration::from_millis(900)
            && closed_after < std::time::Duration::from_secs(5),
        "closed after {closed_after:?}"
    );

    // Raised while a connection waits with the old value: it waits on.
    let mut c = srv.conn().await;
    let mut patient = idle_client(&srv.addr);
    cmd(&mut c, &["CONFIG", "SET", "timeout", "30"])
        .await
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    patient
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    std::io::Write::write_all(&mut patient, b"PING\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(&mut patient)
        .read_line(&mut line)
        .expect("still open");
    assert_eq!(line, "+PONG\r\n", "open past the old timeout of 1 s");
    let mut c = srv.conn().await;
    cmd(&mut c, &["CONFIG", "SET", "timeout", "0"])
        .await
        .unwrap();
    let after = as_str(&cmd(&mut c, &["INFO", "stats"]).await.unwrap());
    assert!(
        dropped(&after) > dropped(&before),
        "counted: {before} / {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_settings_are_refused_with_their_reason() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    let e = error_text(cmd(&mut c, &["CONFIG", "SET", "port", "7000"]).await);
    assert!(
        e.contains(
            "CONFIG SET port: the listening port is fixed at startup; restart with a new value"
        ),
        "{e}"
    );
    for (name, why) in [
        ("appendfsync", "fsync policy"),
        ("dir", "data dir"),
        ("threads", "event loops"),
        ("requirepass", "read at startup"),
    ] {
        let e = error_text(cmd(&mut c, &["CONFIG", "SET", name, "x"]).await);
        assert!(
            e.contains(&format!("CONFIG SET {name}: ")) && e.contains(why),
            "{e}"
        );
    }
    let e = error_text(cmd(&mut c, &["CONFIG", "SET", "no-such-thing", "1"]).await);
    assert!(e.contains("Unknown option"), "{e}");
    let e = error_text(cmd(&mut c, &["CONFIG", "REWRITE"]).await);
    assert!(e.contains("without a config file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_rewrite_survives_a_restart() {
    let dir = TempDir::new("conf-rw");
    let port = free_port();
    let main = write_config(dir.path(), port);
    let p = spawn(&["--config", main.to_str().unwrap()]).expect("starts");
    let mut c = p.conn().await;
    cmd(
        &mut c,
        &["CONFIG", "SET", "slowlog-max-len", "99", "maxclients", "77"],
    )
    .await
    .unwrap();
    cmd(&mut c, &["CONFIG", "SET", "slowlog-log-slower-than", "-1"])
        .await
        .unwrap();
    assert_eq!(
        cmd(&mut c, &["CONFIG", "REWRITE"]).await.unwrap(),
        Value::Okay
    );
    let text = std::fs::read_to_string(&main).unwrap();
    // Comments and unrelated lines stay; the directive after the include is replaced in
    // place; the ones the include sets are appended after it.
    assert!(text.starts_with("# stockgate test config\n"), "{text}");
    assert!(text.contains(&format!("port {port}\n")), "{text}");
    assert!(
        text.contains("include conf.d/extra.conf\n# the slow log\nslowlog-log-slower-than -1\n"),
        "{text}"
    );
    assert!(
        text.contains("maxclients 77\n") && text.contains("slowlog-max-len 99\n"),
        "{text}"
    );
    let extra = std::fs::read_to_string(dir.path().join("conf.d/extra.conf")).unwrap();
    assert!(
        extra.contains("maxclients 33"),
        "included files are left alone: {extra}"
    );
    drop(c);
    p.stop();
    let p = spawn(&["--config", main.to_str().unwrap()]).expect("restarts from the rewritten file");
    let mut c = p.conn().await;
    assert_eq!(get(&mut c, "slowlog-max-len").await, "99");
    assert_eq!(get(&mut c, "maxclients").await, "77");
    assert_eq!(get(&mut c, "slowlog-log-slower-than").await, "-1");
    // A second rewrite with nothing changed leaves the file as it is.
    cmd(&mut c, &["CONFIG", "REWRITE"]).await.unwrap();
    assert_eq!(std::fs::read_to_string(&main).unwrap(), text);
}

/// The names `CONFIG GET/SET` answer to are the file's too: Redis's `appendfsync`, `dir`,
/// `loglevel` and `timeout` (seconds) start the server, and CONFIG GET gives them back,
/// under Redis's names and the flags' alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_names_work_in_the_file_as_in_config_get() {
    let dir = TempDir::new("conf-redis");
    let data = dir.path().join("data");
    let file = dir.path().join("redis-names.conf");
    std::fs::write(
        &file,
        format!(
            "port 0\nappendfsync always\ndir \"{}\"\nloglevel notice\ntimeout 30\n",
            data.display()
        ),
    )
    .unwrap();
    let p = spawn(&["--config", file.to_str().unwrap()]).expect("starts from Redis's names");
    let mut c = p.conn().await;
    assert_eq!(get(&mut c, "appendfsync").await, "always");
    assert_eq!(get(&mut c, "fsync").await, "always");
    assert_eq!(get(&mut c, "dir").await, data.display().to_string());
    assert_eq!(get(&mut c, "loglevel").await, "notice");
    assert_eq!(get(&mut c, "log-level").await, "info");
    assert_eq!(get(&mut c, "timeout").await, "30");
    assert_eq!(get(&mut c, "idle-timeout-ms").await, "30000");
    assert!(data.join("wal").exists(), "the log is in `dir`");
    // A bad value under a Redis name is refused with its line, as a flag's is.
    drop(c);
    p.stop();
    std::fs::write(&file, "port 0\ntimeout soon\n").unwrap();
    let (code, err) = spawn(&["--config", file.to_str().unwrap()])
        .err()
        .expect("refused");
    assert_ne!(code, Some(0));
    assert!(err.contains("line 2") && err.contains("timeout"), "{err}");
}
