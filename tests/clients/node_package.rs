//! The Node package `clients/node` (`stockgate` on ioredis and pg), tested through its own
//! `node --test` suite against the real parts; this harness starts them and fails on any
//! failed or skipped test.
//!
//! - a server (open mode) that no sweeper watches: reply parsing, errors per code and
//!   minting (`unit.test.js`), the commands, typed errors, denials and retries while its
//!   connections are killed (`server.test.js`), and the TypeScript types checked by
//!   `tsc --noEmit` (`types.test.js`), and `reserveSplit`'s home for the shared vectors
//!   and its fall-over from a sold-out home (`split.test.js`);
//! - a server, a throwaway Postgres with the ledger migrated in schema `stockgate`
//!   (`stockgate-sweeper migrate`) and a `stockgate-sweeper run --interval-secs 1` process
//!   for that ledger and server: the checkout's branches and the mistakes the ledger
//!   refuses (`checkout.test.js`) and the whole sale (`scenario.test.js`); plus a second
//!   server started with a users file, where the checkout role's first payment meets
//!   `-NOPERM` for `COMMIT ... VERIFIED` and falls back to the plain `COMMIT`;
//! - failover: a 3-member Raft group; `failover.test.js` writes the signal file once its
//!   sale is in flight, this harness `kill -9`s the leader, waits for a new one, restarts
//!   the killed member and writes `<signal>.done`.
//!
//! Its dependencies come from `clients/node/package-lock.json`
//! (`npm ci --prefix clients/node`, which `scripts/test-all.sh` runs), with the newest
//! ioredis the package allows. The same tests run again on the oldest ioredis it allows: a
//! copy of the package's sources and tests on the install of `tests/node-oldest`
//! (tests/common/node.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stockgate_testkit::{sibling_binary as bin, KillOnDrop};

use crate::common::node;
use crate::common::raft::Group;
use crate::common::{Server, TempDir};
use stockgate_testkit::pgtemp::TempPostgres;

/// The longest a `node --test` run may take (the type check alone takes ~20 s on two
/// loaded cores, the scenario ~15 s).
const LIMIT: Duration = Duration::from_secs(200);

/// The users of the second server (`--users-file`): an admin and a checkout role.
const USERS: &str = "\
boss admin s3cret-admin
shop checkout s3cret-shop
";

/// Which end of the package's ioredis range its tests run on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ioredis {
    /// `clients/node` itself: the newest ioredis it allows (its package-lock.json).
    Newest,
    /// A copy of its sources and tests whose `node_modules` is `tests/node-oldest`'s: the
    /// oldest ioredis it allows.
    Oldest,
}

/// The folder `node --test` runs in; a copy lives as long as this.
struct Package {
    dir: PathBuf,
    _copy: Option<TempDir>,
}

fn package(on: Ioredis) -> Package {
    let src = node::package_dir();
    let (oldest, newest) = node::package_ioredis_range();
    match on {
        Ioredis::Newest => {
            let v = node::installed(&src, "ioredis").unwrap_or_default();
            assert_eq!(
                node::major(&v),
                Some(newest),
                "clients/node has ioredis {v}; the package allows up to {newest}.x: lock that"
            );
            Package {
                dir: src,
                _copy: None,
            }
        }
        Ioredis::Oldest => {
            let modules = node::oldest_package_modules();
            let copy = TempDir::new("node-package-oldest");
            // Copies, not links: node resolves a module's imports from its real path, and
            // from clients/node that would find the newest ioredis. The checkout's layout
            // is kept (`clients/node` beside a link to `tests`): the tests read the shared
            // vectors in tests/split.
            let dir = copy.path().join("clients/node");
            for part in ["src", "test", "index.d.ts", "package.json"] {
                copy_tree(&src.join(part), &dir.join(part));
            }
            let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
            std::os::unix::fs::symlink(repo.join("tests"), copy.path().join("tests"))
                .expect("link tests");
            std::os::unix::fs::symlink(&modules, dir.join("node_modules"))
                .expect("link node_modules");
            println!("the package's tests on ioredis {oldest}");
            Package {
                dir,
                _copy: Some(copy),
            }
        }
    }
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("create dir");
        for e in std::fs::read_dir(from).expect("read dir") {
            let e = e.expect("dir entry");
            copy_tree(&e.path(), &to.join(e.file_name()));
        }
    } else {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// `# <name> N` from node's test runner summary.
fn summary(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("# {name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// `node --test <files>` in the package folder `dir` with `envs`, output to `out`.
fn node_test(dir: &Path, files: &[&str], envs: &[(&str, String)], out: &Path) -> KillOnDrop {
    let log = std::fs::File::create(out).expect("node log");
    let err = log.try_clone().expect("node log");
    let child = Command::new("node")
        .args(["--test", "--test-reporter=tap"])
        .args(files)
        .current_dir(dir)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .spawn()
        .expect("run node --test (is node on PATH?)");
    KillOnDrop(child)
}

/// Waits for the run (calling `tick` meanwhile), asserts it passed with nothing skipped
/// and at least `min_pass` tests, and returns its output.
fn finish(mut p: KillOnDrop, out: &Path, min_pass: u64, mut tick: impl FnMut()) -> String {
    let t = Instant::now();
    let status = loop {
        if let Some(st) = p.0.try_wait().expect("wait node") {
            break st;
        }
        if t.elapsed() > LIMIT {
            let _ = p.0.kill();
            let text = std::fs::read_to_string(out).unwrap_or_default();
            panic!("node --test still running after {LIMIT:?}:\n{text}");
        }
        tick();
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(out).expect("node output");
    println!("{text}");
    assert!(
        status.success(),
        "the Node package's tests failed ({status}):\n{text}"
    );
    assert_eq!(summary(&text, "fail"), Some(0), "{text}");
    assert_eq!(
        summary(&text, "skipped"),
        Some(0),
        "a test was skipped:\n{text}"
    );
    assert_eq!(summary(&text, "todo"), Some(0), "a test is todo:\n{text}");
    assert!(
        summary(&text, "pass").is_some_and(|n| n >= min_pass),
        "too few tests ran:\n{text}"
    );
    text
}

/// A migrated throwaway ledger; its URL.
fn migrated_ledger(pg: &TempPostgres) -> String {
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
    url
}

#[test]
fn node_package_against_a_server() {
    against_a_server(Ioredis::Newest);
}

#[test]
fn node_package_against_a_server_on_the_oldest_ioredis() {
    against_a_server(Ioredis::Oldest);
}

fn against_a_server(on: Ioredis) {
    let pkg = package(on);
    let _one = crate::alone();
    // No sweeper watches this server: server.test.js lets holds expire on purpose and
    // then commits them.
    let server = Server::start(&[]);
    let dir = TempDir::new("node-package");
    let out = dir.path().join("node.log");
    let envs = [
        ("STOCKGATE_ADDR", server.addr.clone()),
        (
            "STOCKGATE_SECRET_FILE",
            server.data_dir.join("secret").display().to_string(),
        ),
    ];
    let p = node_test(
        &pkg.dir,
        &[
            "test/unit.test.js",
            "test/server.test.js",
            "test/types.test.js",
            "test/split.test.js",
        ],
        &envs,
        &out,
    );
    finish(p, &out, 40, || {});
}

#[test]
fn node_package_checkout_against_a_ledger_and_the_sweeper() {
    checkout_against_a_ledger(Ioredis::Newest);
}

#[test]
fn node_package_checkout_against_a_ledger_on_the_oldest_ioredis() {
    checkout_against_a_ledger(Ioredis::Oldest);
}

fn checkout_against_a_ledger(on: Ioredis) {
    let pkg = package(on);
    let _one = crate::alone();
    let rt = crate::common::runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let url = migrated_ledger(&pg);
    let server = Server::start(&[]);
    let mut sweeper = KillOnDrop(
        Command::new(bin("stockgate-sweeper"))
            .args(["--database-url", &url, "--server", &server.addr])
            .args(["run", "--interval-secs", "1"])
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("stockgate-sweeper run"),
    );
    let dir = TempDir::new("node-checkout");
    let out = dir.path().join("node.log");
    // A second server with users, for the checkout role's plain-COMMIT fallback.
    let users = dir.path().join("users");
    std::fs::write(&users, USERS).expect("users file");
    let auth = Server::start(&["--users-file", &users.display().to_string()]);
    let envs = [
        ("STOCKGATE_ADDR", server.addr.clone()),
        (
            "STOCKGATE_SECRET_FILE",
            server.data_dir.join("secret").display().to_string(),
        ),
        ("STOCKGATE_DATABASE_URL", url.clone()),
        ("STOCKGATE_LEDGER_SCHEMA", "stockgate".to_string()),
        ("STOCKGATE_SWEEPER_RUNNING", "1".to_string()),
        ("STOCKGATE_AUTH_ADDR", auth.addr.clone()),
        (
            "STOCKGATE_AUTH_SECRET_FILE",
            auth.data_dir.join("secret").display().to_string(),
        ),
        ("STOCKGATE_AUTH_ADMIN", "boss:s3cret-admin".to_string()),
        ("STOCKGATE_AUTH_CHECKOUT", "shop:s3cret-shop".to_string()),
    ];
    let p = node_test(
        &pkg.dir,
        &["test/checkout.test.js", "test/scenario.test.js"],
        &envs,
        &out,
    );
    let text = finish(p, &out, 17, || {
        if let Ok(Some(st)) = sweeper.0.try_wait() {
            panic!("the sweeper exited during the tests: {st}");
        }
    });
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok ") && l.contains("the whole sale through the package")),
        "the scenario did not pass:\n{text}"
    );
}

#[test]
fn node_package_follows_a_leader_kill() {
    follows_a_leader_kill(Ioredis::Newest);
}

#[test]
fn node_package_follows_a_leader_kill_on_the_oldest_ioredis() {
    follows_a_leader_kill(Ioredis::Oldest);
}

fn follows_a_leader_kill(on: Ioredis) {
    let pkg = package(on);
    let _one = crate::alone();
    let mut g = Group::start(false);
    let first = g.leader(None, Duration::from_secs(10));
    let addrs = [1u64, 2, 3]
        .iter()
        .map(|i| format!("127.0.0.1:{}", g.port(*i)))
        .collect::<Vec<_>>()
        .join(",");
    let dir = TempDir::new("node-failover");
    let signal = dir.path().join("failover.signal");
    let out = dir.path().join("node.log");
    let envs = [
        ("STOCKGATE_GROUP_ADDRS", addrs),
        ("STOCKGATE_FAILOVER_SIGNAL", signal.display().to_string()),
        (
            "STOCKGATE_SECRET_FILE",
            g.keys.secret_path().display().to_string(),
        ),
    ];
    let p = node_test(&pkg.dir, &["test/failover.test.js"], &envs, &out);
    let mut killed: Option<(u64, u64)> = None;
    let done = PathBuf::from(format!("{}.done", signal.display()));
    finish(p, &out, 1, || {
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

/// `npm pack` ships what an ESM + TypeScript user imports: the sources, the checkout and
/// the type declarations the package.json points at.
#[test]
fn node_package_packs_its_sources_and_types() {
    let dir = node::package_dir();
    let out = Command::new("npm")
        .args(["pack", "--dry-run", "--json"])
        .current_dir(&dir)
        .output()
        .expect("npm pack");
    assert!(
        out.status.success(),
        "npm pack failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("npm pack --json");
    let files: Vec<&str> = packed[0]["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    for want in [
        "index.d.ts",
        "src/index.js",
        "src/checkout.js",
        "package.json",
    ] {
        assert!(files.contains(&want), "{want} not packed: {files:?}");
    }
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("package.json")).expect("package.json"),
    )
    .expect("package.json is JSON");
    assert_eq!(manifest["type"], "module");
    assert_eq!(manifest["types"], "./index.d.ts");
}

/// The README's installs work from an app folder outside the checkout: the `npm pack`
/// tarball, and `npm install --install-links <folder>` (a plain `npm install <folder>` of
/// a folder outside the app links it and installs none of its dependencies); then the
/// app imports the package and reserves a unit on a real server.
#[test]
fn node_package_installs_into_an_app_outside_the_checkout() {
    let server = Server::start(&[]);
    let dir = TempDir::new("npm-app");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/node");
    let packed = npm(
        &[
            "pack",
            "--pack-destination",
            &dir.path().display().to_string(),
        ],
        &src,
    );
    let tarball = dir.path().join(
        packed
            .lines()
            .last()
            .expect("npm pack names its tarball")
            .trim(),
    );
    let installs = [
        ("from-tarball", vec![tarball.display().to_string()]),
        (
            "install-links",
            vec!["--install-links".to_string(), src.display().to_string()],
        ),
    ];
    for (i, (name, args)) in installs.iter().enumerate() {
        let app = dir.path().join(name);
        std::fs::create_dir_all(&app).expect("app dir");
        std::fs::write(
            app.join("package.json"),
            r#"{"name":"app","private":true,"type":"module"}"#,
        )
        .expect("package.json");
        let mut install = vec!["install"];
        install.extend(args.iter().map(String::as_str));
        npm(&install, &app);
        assert!(
            !app.join("node_modules/stockgate").is_symlink(),
            "{name}: npm linked the folder instead of installing it"
        );
        let sku = format!("OUTSIDE-{i}");
        assert_eq!(app_reserves(&app, &server, &sku), "reserved", "{name}");
    }
}

/// `npm <args> --no-audit --no-fund --prefer-offline` in `cwd`; its stdout.
fn npm(args: &[&str], cwd: &Path) -> String {
    let out = Command::new("npm")
        .args(args)
        .args(["--no-audit", "--no-fund", "--prefer-offline"])
        .current_dir(cwd)
        .output()
        .expect("npm");
    assert!(
        out.status.success(),
        "npm {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a script in `app` that imports `stockgate`, creates `sku` and reserves a unit of
/// it; the reservation's kind.
fn app_reserves(app: &Path, server: &Server, sku: &str) -> String {
    let script = r#"
import { Stockgate, AdmissionMinter } from 'stockgate';
const [addr, secret, sku] = process.argv.slice(2);
const sg = new Stockgate({ addr });
await sg.createSale(sku, 3);
const minter = AdmissionMinter.fromFile(secret);
const r = await sg.reserve(sku, 'ann', minter.mint(sku, 'ann'), 'req-1');
console.log(r.kind);
await sg.close();
"#;
    std::fs::write(app.join("main.mjs"), script).expect("main.mjs");
    let run = Command::new("node")
        .arg("main.mjs")
        .arg(&server.addr)
        .arg(server.data_dir.join("secret"))
        .arg(sku)
        .current_dir(app)
        .output()
        .expect("node main.mjs");
    assert!(
        run.status.success(),
        "the installed package failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).trim().to_string()
}

/// Live counts over RESP through the package (`live.test.js`): `watchSale` and
/// `watchPlace` against a server (open mode), their typed refusals, the payload parsing.
#[test]
fn node_package_watches_live_counts() {
    watches_live_counts(Ioredis::Newest);
}

#[test]
fn node_package_watches_live_counts_on_the_oldest_ioredis() {
    watches_live_counts(Ioredis::Oldest);
}

fn watches_live_counts(on: Ioredis) {
    let pkg = package(on);
    let _one = crate::shared();
    let server = Server::start(&[]);
    let dir = TempDir::new("node-live");
    let out = dir.path().join("node.log");
    let envs = [
        ("STOCKGATE_ADDR", server.addr.clone()),
        (
            "STOCKGATE_SECRET_FILE",
            server.data_dir.join("secret").display().to_string(),
        ),
    ];
    let p = node_test(&pkg.dir, &["test/live.test.js"], &envs, &out);
    finish(p, &out, 4, || {});
}
