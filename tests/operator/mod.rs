//! Running `stockgate-sweeper` the way an operator does, against a test [`Harness`].
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use stockgate_client::StockgateClient;
use stockgate_testkit::Harness;

/// The sweeper binary next to this test's executable (`target/<profile>/stockgate-sweeper`),
/// or `$STOCKGATE_SWEEPER_BIN`. Build it first: `cargo build --workspace --bins` (the
/// README's test command does).
pub fn sweeper_bin() -> PathBuf {
    if let Ok(p) = std::env::var("STOCKGATE_SWEEPER_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test exe path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("stockgate-sweeper");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        bin.display()
    );
    bin
}

#[derive(Debug)]
pub struct CliOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    /// The stdout of a run that must have succeeded.
    #[track_caller]
    pub fn ok(self) -> String {
        assert!(self.success, "stockgate-sweeper failed: {self:?}");
        self.stdout
    }
}

/// `stockgate-sweeper --database-url <harness pg> --server <harness server> ARGS...`,
/// bounded to 60 s.
pub fn sweeper_cli(h: &Harness, args: &[&str]) -> CliOutput {
    let mut child = Command::new(sweeper_bin())
        .arg("--database-url")
        .arg(h.pg.url())
        .arg("--server")
        .arg(h.server.addr())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn stockgate-sweeper");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match child.try_wait().expect("wait stockgate-sweeper") {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("stockgate-sweeper {args:?} did not finish within 60 s");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.wait_with_output().expect("sweeper output");
    CliOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// After a server restart: until the client's connection works again (bounded).
pub async fn wait_for_server(client: &StockgateClient) {
    for _ in 0..100 {
        if client.ping().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("server did not come back");
}

/// Copies a directory tree (a server's data dir).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("create copy dir");
    for e in std::fs::read_dir(src).expect("read dir") {
        let e = e.expect("dir entry");
        let to = dst.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).expect("copy file");
        }
    }
}
