//! The npm installs the Node tests run on, each installed by `npm ci` from its committed lock
//! file (pinned versions), as `scripts/test-all.sh` does first:
//!
//! - `tests/node`: the newest ioredis and node-redis, and the scripts that drive them;
//! - `tests/node-oldest`: the oldest ones the project supports, exactly; the same scripts
//!   load their clients from there when `STOCKGATE_NODE_CLIENTS` names it
//!   (`tests/node/clients.js`), and the tests of `clients/node` run on it again;
//! - `clients/node`: the Node package's own dependencies (the newest ioredis it allows).
//!
//! An install that does not hold what its lock file pins (missing, or left from an older
//! lock file) is installed again before a test uses it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Which ioredis and node-redis a script in `tests/node` runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clients {
    /// `tests/node`: ioredis 6, node-redis 6.
    Newest,
    /// `tests/node-oldest`: ioredis 5, node-redis 5.
    Oldest,
}

impl Clients {
    /// The folder of the install (its `package-lock.json` and `node_modules`).
    pub fn dir(self) -> PathBuf {
        repo().join(match self {
            Clients::Newest => "tests/node",
            Clients::Oldest => "tests/node-oldest",
        })
    }

    /// The majors of ioredis and node-redis this install must hold, so that a lock file
    /// bumped (or not) by mistake fails here rather than quietly testing something else.
    fn majors(self) -> u64 {
        match self {
            Clients::Newest => 6,
            Clients::Oldest => 5,
        }
    }

    /// "ioredis X, node-redis Y" as installed, for messages.
    pub fn versions(self) -> String {
        let dir = self.dir();
        format!(
            "ioredis {}, node-redis {}",
            installed(&dir, "ioredis").unwrap_or_default(),
            installed(&dir, "redis").unwrap_or_default()
        )
    }

    /// The install, made ready: `npm ci` when it does not hold what its lock pins, and
    /// checked to hold this side's majors.
    pub fn install(self) -> PathBuf {
        let dir = self.dir();
        ensure_installed(&dir, &["ioredis", "redis", "cluster-key-slot"]);
        for name in ["ioredis", "redis"] {
            let v = installed(&dir, name).unwrap_or_default();
            assert_eq!(
                major(&v),
                Some(self.majors()),
                "{}: {name} {v}, expected major {}",
                dir.display(),
                self.majors()
            );
        }
        dir
    }

    /// `node tests/node/<script>` with its clients from this install.
    pub fn script(self, script: &str) -> Command {
        let dir = self.install();
        let mut cmd = Command::new("node");
        cmd.arg(repo().join("tests/node").join(script))
            .env("STOCKGATE_NODE_CLIENTS", dir);
        cmd
    }
}

/// Both installs, newest first.
pub const BOTH: [Clients; 2] = [Clients::Newest, Clients::Oldest];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The major of a `X.Y.Z` version.
pub fn major(version: &str) -> Option<u64> {
    version.split('.').next()?.parse().ok()
}

/// The version of `name` installed in `dir/node_modules`.
pub fn installed(dir: &Path, name: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(dir.join("node_modules").join(name).join("package.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["version"].as_str().map(str::to_owned)
}

/// The version of `name` that `dir/package-lock.json` pins.
pub fn locked(dir: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("package-lock.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["packages"][format!("node_modules/{name}")]["version"]
        .as_str()
        .map(str::to_owned)
}

/// Two tests of one binary never run `npm ci` in one folder at once.
static NPM_CI: Mutex<()> = Mutex::new(());

/// `npm ci` in `dir` unless each of `names` is installed at the version its lock file pins.
pub fn ensure_installed(dir: &Path, names: &[&str]) {
    let _one = NPM_CI.lock().unwrap_or_else(|e| e.into_inner());
    let current = || {
        names.iter().all(|n| {
            let want = locked(dir, n);
            want.is_some() && installed(dir, n) == want
        })
    };
    if current() {
        return;
    }
    let out = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--prefix"])
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .expect("npm (node and npm must be installed)");
    assert!(
        out.status.success(),
        "npm ci --prefix {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        current(),
        "{}: npm ci did not install {names:?} at the versions of its package-lock.json",
        dir.display()
    );
}

/// The dependencies of `clients/node` its tests need installed at the locked versions.
const PACKAGE_DEPS: [&str; 5] = [
    "ioredis",
    "pg",
    "cluster-key-slot",
    "@types/redis-errors",
    "typescript",
];

/// `clients/node`, with its dependencies installed at the versions of its lock file.
pub fn package_dir() -> PathBuf {
    let dir = repo().join("clients/node");
    ensure_installed(&dir, &PACKAGE_DEPS);
    dir
}

/// The ioredis versions `clients/node/package.json` allows (`^A || ^B`): the oldest (`A`)
/// and the newest major (`B`'s).
pub fn package_ioredis_range() -> (String, u64) {
    let text = std::fs::read_to_string(repo().join("clients/node/package.json"))
        .expect("clients/node/package.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("package.json is JSON");
    let range = v["dependencies"]["ioredis"]
        .as_str()
        .expect("an ioredis dependency");
    let alternatives: Vec<&str> = range
        .split("||")
        .map(|s| s.trim().trim_start_matches('^'))
        .collect();
    let oldest = alternatives.first().expect("a version").to_string();
    let newest = alternatives
        .iter()
        .filter_map(|a| major(a))
        .max()
        .unwrap_or_else(|| panic!("ioredis {range:?}: expected ^A || ^B"));
    (oldest, newest)
}

/// `tests/node-oldest`, with the package's dependencies installed, checked to hold the
/// oldest ioredis `clients/node` allows.
pub fn oldest_package_modules() -> PathBuf {
    let dir = Clients::Oldest.install();
    ensure_installed(&dir, &PACKAGE_DEPS);
    let (oldest, _) = package_ioredis_range();
    assert_eq!(
        installed(&dir, "ioredis").as_deref(),
        Some(oldest.as_str()),
        "{}: the package's tests must run on the oldest ioredis it allows",
        dir.display()
    );
    dir.join("node_modules")
}
