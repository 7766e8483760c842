//! The Python package `clients/python` (`stockgate` on redis-py and psycopg 3), tested
//! through its own pytest suite against the real parts: this harness starts them, runs
//! `python3 -m pytest clients/python/tests` with the environment the shared ledger spec
//! names, and fails on any failed or skipped test.
//!
//! - single server: a `stockgate` server (open mode), a throwaway Postgres with the ledger
//!   migrated in schema `stockgate` (`stockgate-sweeper migrate`), and a
//!   `stockgate-sweeper run --interval-secs 1` process for that ledger and server; every
//!   test but the failover one (parsing, minting, errors, retries after a lost reply, the
//!   checkout branches, the cross-language scenario);
//! - failover: a 3-member Raft group; the package test writes the signal file once its
//!   sale is in flight, this harness `kill -9`s the leader, waits for a new one, restarts
//!   the killed member and writes `<signal>.done`.
//!
//! The package must be installed for `python3` (`scripts/test-all.sh` does it, into the
//! suite's virtual environment `target/py/newest`, whose `python3` comes first on PATH),
//! so the run tests what `pip install` gives; the single-server tests run again on the
//! oldest redis-py the package allows (`target/py/oldest`, or `STOCKGATE_PYTHON_OLDEST`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stockgate_testkit::{sibling_binary as bin, KillOnDrop};

use crate::common::raft::Group;
use crate::common::{Server, TempDir};
use stockgate_testkit::pgtemp::TempPostgres;

/// The longest a pytest run may take.
const PYTEST_LIMIT: Duration = Duration::from_secs(110);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The interpreter of the oldest redis-py the package allows: `STOCKGATE_PYTHON_OLDEST`,
/// else the environment `scripts/test-all.sh` makes in `target/py/oldest`.
fn oldest_python() -> String {
    let p = std::env::var("STOCKGATE_PYTHON_OLDEST")
        .ok()
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/py/oldest/bin/python"));
    assert!(
        p.exists(),
        "{} is missing: scripts/test-all.sh makes it from tests/py/requirements-oldest.txt",
        p.display()
    );
    p.display().to_string()
}

/// The redis-py version `python` imports.
fn redis_py_version(python: &str) -> String {
    let out = Command::new(python)
        .args(["-c", "import redis; print(redis.__version__)"])
        .output()
        .expect("python -c 'import redis'");
    assert!(out.status.success(), "{python} cannot import redis");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The lower bound of the package's `redis>=` requirement, and the major below its upper one.
fn declared_redis_range() -> (String, u32) {
    let text = std::fs::read_to_string(repo().join("clients/python/pyproject.toml"))
        .expect("pyproject.toml");
    let spec = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("\"redis>="))
        .expect("a redis>= requirement");
    let inner = spec.trim_matches(|c| c == '"' || c == ',');
    let (low, high) = inner
        .trim_start_matches("redis>=")
        .split_once(",<")
        .expect("redis>=LOW,<HIGH");
    let high: u32 = high.parse().expect("an upper major");
    (low.to_string(), high - 1)
}

/// `python -m pytest <args>` from the repository root with `envs`, output to a file.
fn pytest(python: &str, args: &[&str], envs: &[(&str, String)], out: &Path) -> KillOnDrop {
    let log = std::fs::File::create(out).expect("pytest log");
    let err = log.try_clone().expect("pytest log");
    let child = Command::new(python)
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"])
        // A hung test prints every thread's stack before this harness gives up on it.
        .args(["-o", "faulthandler_timeout=100"])
        .args(args)
        .current_dir(repo())
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("python3 -m pytest (is python3 on PATH?)");
    KillOnDrop(child)
}

/// Waits for pytest (calling `tick` meanwhile), then asserts it passed with no test
/// skipped, and returns its output.
fn finish(mut p: KillOnDrop, out: &Path, mut tick: impl FnMut()) -> String {
    let t = Instant::now();
    let status = loop {
        if let Some(st) = p.0.try_wait().expect("wait pytest") {
            break st;
        }
        if t.elapsed() > PYTEST_LIMIT {
            let _ = p.0.kill();
            let text = std::fs::read_to_string(out).unwrap_or_default();
            panic!("pytest still running after {PYTEST_LIMIT:?}:\n{text}");
        }
        tick();
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(out).expect("pytest output");
    println!("{text}");
    assert!(status.success(), "pytest failed ({status}):\n{text}");
    let summary = text
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_else(|| panic!("no pytest summary line:\n{text}"));
    for word in [
        "skipped",
        "xfailed",
        "xpassed",
        "failed",
        "error",
        "deselected",
    ] {
        assert!(
            !summary.contains(word),
            "pytest summary `{summary}`: nothing may be {word} when the environment is given"
        );
    }
    text
}

fn number_passed(text: &str) -> usize {
    text.lines()
        .rev()
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words
                .windows(2)
                .find(|w| w[1].trim_end_matches(',') == "passed")
                .and_then(|w| w[0].trim_start_matches('=').parse().ok())
        })
        .unwrap_or(0)
}

/// The newest redis-py the package allows (`python3` is the suite's environment).
#[test]
fn python_package_against_a_server_a_ledger_and_the_sweeper() {
    let (_, newest_major) = declared_redis_range();
    let v = redis_py_version("python3");
    assert!(
        v.starts_with(&format!("{newest_major}.")),
        "python3 has redis-py {v}; the package allows up to {newest_major}.x: test that"
    );
    package_suite("python3");
}

/// The oldest redis-py the package allows, the same tests.
#[test]
fn python_package_on_the_oldest_redis_py_it_allows() {
    let python = oldest_python();
    let (oldest, _) = declared_redis_range();
    let v = redis_py_version(&python);
    assert!(
        v == oldest || v == format!("{oldest}.0"),
        "{python} has redis-py {v}; the package allows from {oldest}: test that"
    );
    package_suite(&python);
}

fn package_suite(python: &str) {
    let _one = crate::alone();
    let rt = crate::common::runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let url = pg.url().to_string();
    let migrate = Command::new(bin("stockgate-sweeper"))
        .args(["--database-url", &url, "migrate"])
        .env("STOCKGATE_LOG", "warn")
        .output()
        .expect("stockgate-sweeper migrate");
    assert!(
        migrate.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let server = Server::start(&[]);
    let sweeper = KillOnDrop(
        Command::new(bin("stockgate-sweeper"))
            .args(["--database-url", &url, "--server", &server.addr])
            .args(["run", "--interval-secs", "1"])
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("stockgate-sweeper run"),
    );
    let dir = TempDir::new("pytest");
    let out = dir.path().join("pytest.log");
    let envs = [
        ("STOCKGATE_ADDR", server.addr.clone()),
        (
            "STOCKGATE_SECRET_FILE",
            server.data_dir.join("secret").display().to_string(),
        ),
        ("STOCKGATE_DATABASE_URL", url.clone()),
        ("STOCKGATE_LEDGER_SCHEMA", "stockgate".to_string()),
        ("STOCKGATE_SWEEPER_RUNNING", "1".to_string()),
    ];
    let p = pytest(
        python,
        &[
            "clients/python/tests",
            "--ignore=clients/python/tests/test_failover.py",
        ],
        &envs,
        &out,
    );
    let mut sweeper = sweeper;
    let text = finish(p, &out, || {
        if let Ok(Some(st)) = sweeper.0.try_wait() {
            panic!("the sweeper exited during the tests: {st}");
        }
    });
    assert!(
        text.lines().any(|l| l.starts_with("PASSED")
            && l.contains("test_scenario.py::test_cross_language_checkout_scenario")),
        "the scenario did not pass:\n{text}"
    );
    assert!(number_passed(&text) >= 20, "too few tests ran:\n{text}");
}

#[test]
fn python_package_follows_a_leader_kill() {
    let _one = crate::alone();
    let mut g = Group::start(false);
    let first = g.leader(None, Duration::from_secs(10));
    let addrs = [1u64, 2, 3]
        .iter()
        .map(|i| format!("127.0.0.1:{}", g.port(*i)))
        .collect::<Vec<_>>()
        .join(",");
    let dir = TempDir::new("pytest-failover");
    let signal = dir.path().join("failover.signal");
    let out = dir.path().join("pytest.log");
    let envs = [
        ("STOCKGATE_GROUP_ADDRS", addrs),
        ("STOCKGATE_FAILOVER_SIGNAL", signal.display().to_string()),
        (
            "STOCKGATE_SECRET_FILE",
            g.keys.secret_path().display().to_string(),
        ),
    ];
    let p = pytest(
        "python3",
        &["clients/python/tests/test_failover.py"],
        &envs,
        &out,
    );
    let mut killed: Option<(u64, u64)> = None;
    let done = PathBuf::from(format!("{}.done", signal.display()));
    finish(p, &out, || {
        if killed.is_none() && signal.exists() {
            let old = g.leader(None, Duration::from_secs(10));
            g.member(old).kill9();
            let new = g.leader(Some(old), Duration::from_secs(30));
            g.member(old).spawn();
            killed = Some((old, new));
            std::fs::write(&done, b"").expect("write the done file");
        }
    });
    let (old, new) = killed.expect("the package test never wrote the signal file");
    assert_ne!(old, new);
    println!("leader {first} at the start; killed {old}, {new} took over");
}

/// `python -m build` makes a wheel and an sdist, and the wheel carries `py.typed` so type
/// checkers read the package's hints.
#[test]
fn python_package_builds_a_typed_wheel() {
    let dir = TempDir::new("pybuild");
    let src = dir.path().join("src");
    let copy = Command::new("cp")
        .args(["-r"])
        .arg(repo().join("clients/python"))
        .arg(&src)
        .status()
        .expect("cp");
    assert!(copy.success());
    let out = dir.path().join("dist");
    let built = Command::new("python3")
        .args(["-m", "build", "--outdir"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("python3 -m build");
    assert!(
        built.status.success(),
        "python -m build failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("dist")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".tar.gz")), "{names:?}");
    let wheel = names
        .iter()
        .find(|n| n.ends_with(".whl"))
        .unwrap_or_else(|| panic!("no wheel in {names:?}"));
    let listing = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
        ])
        .arg(out.join(wheel))
        .output()
        .expect("list the wheel");
    let files = String::from_utf8_lossy(&listing.stdout);
    for want in ["stockgate/py.typed", "stockgate/checkout.py"] {
        assert!(
            files.lines().any(|l| l == want),
            "{want} not in the wheel:\n{files}"
        );
    }
}

/// `pip install <path>` from a folder outside the checkout, as the package's README says:
/// the package imports from where it was installed, and the source tree gains no build
/// output (`build/`, `*.egg-info`).
#[test]
fn python_package_installs_from_outside_without_writing_into_the_checkout() {
    let dir = TempDir::new("pip-outside");
    let site = dir.path().join("site");
    let src = repo().join("clients/python");
    // The build backend is pinned in the suite's environment (tests/py/requirements.txt):
    // no download here.
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(["--no-deps", "--no-build-isolation", "--target"])
        .arg(&site)
        .arg(&src)
        .current_dir(dir.path())
        .output()
        .expect("python3 -m pip install");
    assert!(
        out.status.success(),
        "pip install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let import = Command::new("python3")
        .args(["-c", "import stockgate; print(stockgate.__file__)"])
        .env("PYTHONPATH", &site)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(dir.path())
        .output()
        .expect("python3 -c 'import stockgate'");
    let file = String::from_utf8_lossy(&import.stdout);
    assert!(
        import.status.success() && file.trim().starts_with(&site.display().to_string()),
        "stockgate not imported from {}: {file}{}",
        site.display(),
        String::from_utf8_lossy(&import.stderr)
    );
    let mut written = Vec::new();
    for d in [src.clone(), src.join("src")] {
        for e in std::fs::read_dir(&d)
            .expect("read clients/python")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "build" || name == "dist" || name.ends_with(".egg-info") {
                written.push(e.path());
            }
        }
    }
    assert!(
        written.is_empty(),
        "pip install wrote into the checkout: {written:?}"
    );
}
