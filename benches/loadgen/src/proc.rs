//! External processes and scratch directories: every child is started here, has a
//! deadline for becoming ready, is stopped by the harness, and is killed if the harness
//! goes away first (drop guard + parent-death signal).

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A scratch directory removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> Result<Self> {
        let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{n}-{:06x}",
            std::process::id(),
            rand::random::<u32>() & 0xff_ffff
        ));
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A free TCP port on 127.0.0.1 (probe and release; the caller binds it right after).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a probe port on 127.0.0.1")?;
    Ok(l.local_addr().context("reading the probe port")?.port())
}

/// A child process owned by the harness: stopped with `stop`, killed on drop.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ChildGuard {
    /// Spawn `cmd` with stdout and stderr sent to `log` (the caller reads it for readiness
    /// lines). The child gets SIGKILL if the harness dies (PR_SET_PDEATHSIG), so nothing
    /// outlives an interrupted run. Must be called from a thread that outlives the child
    /// (the harness calls it from the main thread or a runtime worker, never a blocking
    /// pool thread), because the parent-death signal follows the spawning thread.
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Result<Self> {
        let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("cloning {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of
        // the parent; it runs in the forked child just before exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(ChildGuard {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// The last ~1500 bytes of the child's output, for error messages.
    pub fn log_tail(&self) -> String {
        let s = fs::read(&self.log).unwrap_or_default();
        let start = s.len().saturating_sub(1500);
        String::from_utf8_lossy(&s[start..]).into_owned()
    }

    /// Fail if the child has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Some(status) = c.try_wait().context("polling child")? {
                bail!(
                    "{} exited early ({status}); output:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
        }
        Ok(())
    }

    /// Wait until the log contains `needle` (returning the line that holds it).
    pub async fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains(needle)) {
                return Ok(line.to_string());
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                bail!(
                    "{} did not print {needle:?} within {timeout:?}; output:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Send `signal`, wait up to `timeout` for the exit, then SIGKILL.
    pub async fn stop(&mut self, signal: libc::c_int, timeout: Duration) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        if c.try_wait().context("polling child")?.is_some() {
            return Ok(());
        }
        // SAFETY: kill(2) on a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(c.id() as libc::pid_t, signal);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match c.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("{} did not stop within {timeout:?}; killed", self.name);
                }
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Run a short command (a `--version` probe) with a deadline; its stdout+stderr, trimmed.
pub fn run_capture(program: &Path, args: &[&str], timeout: Duration) -> Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", program.display()))?;
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} timed out", program.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output()?;
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(s.trim().to_string())
}

/// Find an executable: an explicit path, else the first hit on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
