//! Operating a sale, end to end against the real binary: after a scripted workload,
//! INFO, LATENCY HISTOGRAM, SLOWLOG and the Prometheus scrape (by curl, a real HTTP
//! client) match exactly what happened; the real `prometheus-redis-exporter` scrapes
//! stockgate without errors; the status page renders the figures in headless Chromium;
//! `stockgate top` shows them under tmux; logs carry no colour codes when not on a
//! terminal. Tools the tests drive are installed by scripts/test-all.sh; a test whose
//! tool is missing says so and passes (so a developer without Chromium can still run the
//! rest).

use crate::common::ha::free_port;
use crate::common::have;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Server, TempDir};
use stockgate_server::engine::Keyring;
use stockgate_server::report::top::{Conn, Value};

fn bulk(v: Value) -> String {
    match v {
        Value::Str(s) => String::from_utf8_lossy(&s).into_owned(),
        other => panic!("expected a string, got {other:?}"),
    }
}

fn call(c: &mut Conn, args: &[&str]) -> Value {
    c.call(args).expect("call")
}

fn info_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::to_string))
}

fn sub(v: &str, key: &str) -> Option<i64> {
    v.split(',')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
}

/// GET with curl (bounded), the body as text.
fn curl(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits (bounded) until the metrics endpoint answers.
fn wait_http(url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(b) = curl(url) {
            if !b.is_empty() {
                return b;
            }
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills a child we started when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Counts {
    reserved: i64,
    tokens: Vec<String>,
}

/// A token signed with a secret the server does not hold under the waiting room's key id:
/// what a waiting room and a server that disagree on the secret produce.
fn bad_signature(s: &Server, sku: &str, user: &str) -> String {
    let impostor = Keyring::parse(&format!(
        "{} {}\n",
        s.keyring().signing_kid(),
        "cd".repeat(32)
    ))
    .expect("keyring");
    impostor.mint(sku, user, crate::common::now_ms() + 600_000)
}

/// 4 RESERVED, 2 REPLAY, 1 LIMIT, 3 SOLDOUT, 2 DENIED (a bad signature, an expired token),
/// 1 arity refusal, 1 unknown command, 1 COMMIT, 1 RELEASE (+1 no-op), on sale `OPS` of 4
/// units, limit 2 per user.
fn workload(s: &Server, c: &mut Conn) -> Counts {
    let keys = s.keyring();
    let exp = crate::common::now_ms() + 600_000;
    assert_eq!(
        call(c, &["SALE.CREATE", "OPS", "4", "SHARDS", "1", "LIMIT", "2"]),
        Value::Str(b"OK".to_vec())
    );
    let mut tokens = Vec::new();
    for (u, r) in [("u1", "a"), ("u1", "b"), ("u2", "a"), ("u3", "a")] {
        let adm = keys.mint("OPS", u, exp);
        let Value::Arr(v) = call(c, &["RESERVE", "OPS", u, &adm, r]) else {
            panic!()
        };
        assert_eq!(v[0], Value::Str(b"RESERVED".to_vec()));
        tokens.push(bulk(v[1].clone()));
    }
    for (u, r) in [("u1", "a"), ("u2", "a")] {
        let adm = keys.mint("OPS", u, exp);
        let Value::Arr(v) = call(c, &["RESERVE", "OPS", u, &adm, r]) else {
            panic!()
        };
        assert_eq!(v[0], Value::Str(b"REPLAY".to_vec()));
    }
    let adm = keys.mint("OPS", "u1", exp);
    let Value::Arr(v) = call(c, &["RESERVE", "OPS", "u1", &adm, "c"]) else {
        panic!()
    };
    assert_eq!(v[0], Value::Str(b"LIMIT".to_vec()));
    for u in ["u4", "u5", "u6"] {
        let adm = keys.mint("OPS", u, exp);
        assert_eq!(
            call(c, &["RESERVE", "OPS", u, &adm, "a"]),
            Value::Arr(vec![Value::Str(b"SOLDOUT".to_vec())])
        );
    }
    let expired = keys.mint("OPS", "u8", crate::common::now_ms() - 1000);
    for (u, adm, why) in [
        ("u7", bad_signature(s, "OPS", "u7"), "DENIED bad signature"),
        ("u8", expired, "DENIED expired"),
    ] {
        assert_eq!(
            call(c, &["RESERVE", "OPS", u, &adm, "a"]),
            Value::Err(why.into())
        );
    }
    assert!(matches!(call(c, &["RESERVE", "OPS"]), Value::Err(_)));
    assert!(matches!(call(c, &["NOPE"]), Value::Err(_)));
    assert_eq!(call(c, &["COMMIT", &tokens[0]]), Value::Int(1));
    assert_eq!(call(c, &["RELEASE", &tokens[1]]), Value::Int(1));
    assert_eq!(call(c, &["RELEASE", &tokens[1]]), Value::Int(0));
    Counts {
        reserved: 4,
        tokens,
    }
}

#[test]
fn info_latency_slowlog_and_prometheus_match_the_workload() {
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let s = Server::start(&["--metrics-addr", &maddr, "--slowlog-log-slower-than", "0"]);
    let mut c = Conn::open(&s.addr, None).expect("connect");
    let n = workload(&s, &mut c);
    assert_eq!(n.tokens.len(), 4);

    let info = bulk(call(&mut c, &["INFO", "everything"]));
    let cmd = info_field(&info, "cmdstat_reserve").expect("cmdstat_reserve");
    // 4 + 2 + 1 + 3 + 2 ran (2 failed: DENIED); 1 rejected (arity).
    assert_eq!(sub(&cmd, "calls"), Some(12), "{cmd}");
    assert_eq!(sub(&cmd, "failed_calls"), Some(2), "{cmd}");
    assert_eq!(sub(&cmd, "rejected_calls"), Some(1), "{cmd}");
    assert_eq!(
        info_field(&info, "errorstat_DENIED").as_deref(),
        Some("count=2")
    );
    assert_eq!(
        info_field(&info, "errorstat_ERR").as_deref(),
        Some("count=2")
    );
    assert_eq!(
        info_field(&info, "total_error_replies").as_deref(),
        Some("4")
    );
    // The two denials under their own reasons; the others at zero.
    for (k, v) in [
        ("denied_bad_signature", "1"),
        ("denied_expired", "1"),
        ("denied_malformed", "0"),
        ("denied_unknown_key", "0"),
        ("denied_wrong_sku", "0"),
        ("denied_wrong_user", "0"),
    ] {
        assert_eq!(info_field(&info, k).as_deref(), Some(v), "{k}");
    }
    let sale = info_field(&info, "sale_OPS").expect("sale_OPS");
    for (k, v) in [
        ("total", 4),
        ("available", 1),
        ("reserved", 2),
        ("committed", 1),
        ("reserve_reserved", n.reserved),
        ("reserve_replay", 2),
        ("reserve_limit", 1),
        ("reserve_soldout", 3),
        ("reserve_denied", 2),
        ("commits", 1),
        ("releases", 1),
    ] {
        assert_eq!(sub(&sale, k), Some(v), "{k}: {sale}");
    }
    assert!(
        info_field(&info, "used_memory")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(
        info_field(&info, "used_memory_rss")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert_eq!(info_field(&info, "role").as_deref(), Some("master"));
    assert!(info_field(&info, "latency_percentiles_usec_reserve").is_some());

    // LATENCY HISTOGRAM: calls equal the command's calls, buckets cumulative.
    let h = call(&mut c, &["LATENCY", "HISTOGRAM", "reserve"]);
    let Value::Arr(top) = &h else { panic!("{h:?}") };
    assert_eq!(top[0], Value::Str(b"reserve".to_vec()));
    let Value::Arr(body) = &top[1] else { panic!() };
    assert_eq!(body[0], Value::Str(b"calls".to_vec()));
    assert_eq!(body[1], Value::Int(12));
    let buckets = stockgate_server::report::top::histogram_of(&h, "reserve");
    assert_eq!(buckets.last().map(|b| b.1), Some(12), "{buckets:?}");

    // SLOWLOG (threshold 0: everything): Redis's 6-element entries, newest first.
    let Value::Arr(sl) = call(&mut c, &["SLOWLOG", "GET", "3"]) else {
        panic!()
    };
    assert_eq!(sl.len(), 3);
    let Value::Arr(e) = &sl[0] else { panic!() };
    assert_eq!(e.len(), 6);
    assert!(matches!(&e[3], Value::Arr(a) if a[0] == Value::Str(b"LATENCY".to_vec())));
    assert!(matches!(call(&mut c, &["SLOWLOG", "LEN"]), Value::Int(n) if n >= 3));

    // Prometheus, scraped with curl.
    let text = wait_http(&format!("http://{maddr}/metrics"));
    for want in [
        "stockgate_commands_total{cmd=\"reserve\"} 12\n",
        "stockgate_command_failed_total{cmd=\"reserve\"} 2\n",
        "stockgate_command_rejected_total{cmd=\"reserve\"} 1\n",
        "stockgate_command_duration_seconds_count{cmd=\"reserve\"} 12\n",
        "stockgate_command_duration_seconds_bucket{cmd=\"reserve\",le=\"+Inf\"} 12\n",
        "stockgate_reserve_outcomes_total{sku=\"OPS\",outcome=\"reserved\"} 4\n",
        "stockgate_reserve_outcomes_total{sku=\"OPS\",outcome=\"replay\"} 2\n",
        "stockgate_reserve_outcomes_total{sku=\"OPS\",outcome=\"soldout\"} 3\n",
        "stockgate_reserve_outcomes_total{sku=\"OPS\",outcome=\"limit\"} 1\n",
        "stockgate_reserve_outcomes_total{sku=\"OPS\",outcome=\"denied\"} 2\n",
        "stockgate_commits_total{sku=\"OPS\"} 1\n",
        "stockgate_releases_total{sku=\"OPS\"} 1\n",
        "stockgate_sale_units{sku=\"OPS\",state=\"available\"} 1\n",
        "stockgate_errors_total{code=\"DENIED\"} 2\n",
        "stockgate_denials_total{reason=\"bad_signature\"} 1\n",
        "stockgate_denials_total{reason=\"expired\"} 1\n",
        "stockgate_denials_total{reason=\"malformed\"} 0\n",
        "# TYPE stockgate_denials_total counter\n",
        "# TYPE stockgate_command_duration_seconds histogram\n",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let json = wait_http(&format!("http://{maddr}/json"));
    assert!(json.contains("\"sku\":\"OPS\""), "{json}");
    assert!(json.contains("\"bad_signature\":1,"), "{json}");
    assert!(json.contains("\"expired\":1}"), "{json}");

    // CONFIG RESETSTAT resets, as Redis.
    assert_eq!(
        call(&mut c, &["CONFIG", "RESETSTAT"]),
        Value::Str(b"OK".to_vec())
    );
    let info = bulk(call(&mut c, &["INFO", "commandstats", "sales"]));
    assert!(info_field(&info, "cmdstat_reserve").is_none(), "{info}");
    assert_eq!(
        info_field(&info, "denied_bad_signature").as_deref(),
        Some("0")
    );
}

#[test]
fn redis_exporter_scrapes_stockgate() {
    if !have("prometheus-redis-exporter") {
        eprintln!(
            "SKIP: prometheus-redis-exporter not installed (scripts/test-all.sh installs it)"
        );
        return;
    }
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.addr, None).expect("connect");
    workload(&s, &mut c);
    let port = free_port();
    let dir = TempDir::new("exporter");
    let log = dir.path().join("exporter.log");
    let logf = std::fs::File::create(&log).expect("log file");
    let child = Command::new("prometheus-redis-exporter")
        .args([
            "-redis.addr",
            &format!("redis://{}", s.addr),
            "-web.listen-address",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(logf.try_clone().expect("dup"))
        .stderr(logf)
        .spawn()
        .expect("start exporter");
    let _kid = Kid(child);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let t = curl(&url).unwrap_or_default();
        if t.contains("redis_up 1") {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "exporter never reported redis_up 1:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for want in [
        "redis_commands_total{cmd=\"reserve\"} 12\n",
        "redis_commands_failed_calls_total{cmd=\"reserve\"} 2\n",
        "redis_commands_rejected_calls_total{cmd=\"reserve\"} 1\n",
        "redis_errors_total{err=\"DENIED\"} 2\n",
        "redis_exporter_last_scrape_error{err=\"\"} 0\n",
        "redis_latency_percentiles_usec_count{cmd=\"reserve\"} 12\n",
        "redis_aof_enabled 1\n",
    ] {
        assert!(text.contains(want), "missing {want:?} in exporter output");
    }
    for gauge in [
        "redis_connected_clients ",
        "redis_memory_used_bytes ",
        "redis_db_keys{db=\"db0\"} ",
    ] {
        let v: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(gauge))
            .unwrap_or_else(|| panic!("no {gauge} in exporter output"))
            .parse()
            .expect("number");
        assert!(v > 0.0, "{gauge}{v}");
    }
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log.contains("level=error") && !log.contains("level=warning"),
        "exporter complained:\n{log}"
    );
}

#[test]
fn status_page_renders_in_headless_chromium() {
    if !have("chromium") {
        eprintln!("SKIP: chromium not installed (scripts/test-all.sh installs it)");
        return;
    }
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let s = Server::start(&["--metrics-addr", &maddr]);
    let mut c = Conn::open(&s.addr, None).expect("connect");
    workload(&s, &mut c);
    wait_http(&format!("http://{maddr}/healthz"));
    let profile = TempDir::new("chromium");
    let out = Command::new("timeout")
        .args(["60", "chromium"])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            "--virtual-time-budget=4000",
            "--run-all-compositor-stages-before-draw",
            &format!("--user-data-dir={}", profile.path().display()),
            "--dump-dom",
            &format!("http://{maddr}/"),
        ])
        .stderr(Stdio::null())
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    for (id, v) in [
        ("sale-OPS-available", "1"),
        ("sale-OPS-reserved", "2"),
        ("sale-OPS-committed", "1"),
        ("sale-OPS-total", "4"),
        ("sale-OPS-soldout", "3"),
        ("sale-OPS-denied", "2"),
        ("cmd-reserve-calls", "12"),
        ("err-DENIED", "2"),
        // A bad signature is an outage: marked; an expired token is not.
        ("denied-bad_signature\" class=\"bad", "1"),
        ("denied-expired\" class=\"", "1"),
        ("denied-malformed\" class=\"", "0"),
    ] {
        let want = format!("id=\"{id}\">{v}</td>");
        assert!(
            dom.contains(&want),
            "no {want} in the rendered page:\n{dom}"
        );
    }
    assert!(dom.contains("data-polls="), "the page never polled:\n{dom}");
}

fn tmux(sock: &str, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(["-L", sock])
        .args(args)
        .output()
        .expect("tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Captures the pane until `pred` holds (bounded).
fn capture_until(sock: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = tmux(sock, &["capture-pane", "-p", "-t", "top"]);
        if pred(&screen) {
            return screen;
        }
        assert!(Instant::now() < deadline, "screen never matched:\n{screen}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn sale_row(screen: &str) -> Vec<String> {
    screen
        .lines()
        .find(|l| l.trim_start().starts_with("OPS "))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// A denial reason's total on top's `denied` line.
fn denied(screen: &str, reason: &str) -> Option<i64> {
    let line = screen
        .lines()
        .find(|l| l.trim_start().starts_with("denied "))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == reason)?;
    words.next()?.parse().ok()
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

#[test]
fn top_shows_the_figures_under_tmux() {
    if !have("tmux") {
        eprintln!("SKIP: tmux not installed (scripts/test-all.sh installs it)");
        return;
    }
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.addr, None).expect("connect");
    let n = workload(&s, &mut c);
    let bin = crate::common::server_bin();
    let sock = format!("sgtop-{}", std::process::id());
    let _guard = TmuxServer(sock.clone());
    tmux(
        &sock,
        &[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "170",
            "-y",
            "40",
            &format!("{} top --server {}", bin.display(), s.addr),
        ],
    );
    // sku state bar available reserved committed total reserve/s ...
    let screen = capture_until(&sock, |sc| sale_row(sc).get(3).is_some_and(|v| v == "1"));
    let row = sale_row(&screen);
    assert_eq!(&row[..2], ["OPS", "OPEN"], "{screen}");
    assert_eq!(&row[3..7], ["1", "2", "1", "4"], "{screen}");
    assert!(screen.contains("DENIED"), "{screen}");
    assert!(denied(&screen, "bad_signature") == Some(1), "{screen}");
    assert!(denied(&screen, "expired") == Some(1), "{screen}");
    assert!(denied(&screen, "malformed") == Some(0), "{screen}");
    assert!(screen.contains("sweeper lag"), "{screen}");
    assert!(screen.contains("fsync everysec"), "{screen}");

    // The figures change on screen: the last unit is reserved, another is committed.
    let keys = s.keyring();
    let adm = keys.mint("OPS", "u9", crate::common::now_ms() + 600_000);
    assert!(matches!(
        call(&mut c, &["RESERVE", "OPS", "u9", &adm, "a"]),
        Value::Arr(_)
    ));
    assert_eq!(call(&mut c, &["COMMIT", &n.tokens[2]]), Value::Int(1));
    let adm = bad_signature(&s, "OPS", "u10");
    assert_eq!(
        call(&mut c, &["RESERVE", "OPS", "u10", &adm, "a"]),
        Value::Err("DENIED bad signature".into())
    );
    let screen = capture_until(&sock, |sc| {
        sale_row(sc).get(3).is_some_and(|v| v == "0") && denied(sc, "bad_signature") == Some(2)
    });
    let row = sale_row(&screen);
    assert_eq!(&row[3..7], ["0", "2", "2", "4"], "{screen}");
    assert_eq!(denied(&screen, "expired"), Some(1), "{screen}");
}

fn read_stderr_of(extra: &[&str], dir: &Path) -> String {
    let err = dir.join("stderr");
    let f = std::fs::File::create(&err).expect("stderr file");
    let mut child = Command::new(crate::common::server_bin())
        .args(["--port", "0", "--data-dir"])
        .arg(dir.join("d"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(f)
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("line");
    let addr = line.trim().trim_start_matches("listening on ").to_string();
    if let Ok(mut c) = Conn::open(&addr, None) {
        let _ = c.call(&["SALE.CREATE", "LOGGED", "5"]);
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    std::fs::read_to_string(&err).unwrap_or_default()
}

#[test]
fn logs_are_plain_text_off_a_terminal_and_json_on_request() {
    let dir = TempDir::new("logs");
    let text = read_stderr_of(&["--log-level", "info"], dir.path());
    assert!(text.contains("recovered"), "{text}");
    assert!(text.contains("sale created"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a file:\n{text:?}"
    );
    let dir = TempDir::new("logs-json");
    let json = read_stderr_of(&["--log-format", "json"], dir.path());
    let line = json
        .lines()
        .find(|l| l.contains("sale created"))
        .unwrap_or_else(|| panic!("{json}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["fields"]["sku"], "LOGGED");
}

#[test]
fn info_counts_the_bytes_clients_send_and_receive() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.addr, None).expect("connect");
    let read = |c: &mut Conn| {
        let info = bulk(call(c, &["INFO", "stats"]));
        let f = |k: &str| -> u64 {
            info_field(&info, k)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{k} missing in {info}"))
        };
        (f("total_net_input_bytes"), f("total_net_output_bytes"))
    };
    let (in0, out0) = read(&mut c);
    let payload = "x".repeat(100);
    assert_eq!(bulk(call(&mut c, &["ECHO", &payload])), payload);
    let (in1, out1) = read(&mut c);
    let (in2, _) = read(&mut c);
    // Each INFO's request is counted before it answers, its reply after: the difference
    // of two INFO-only steps is the INFO request; what remains is the ECHO,
    // `*2\r\n$4\r\nECHO\r\n$100\r\n<100 bytes>\r\n` (122 bytes); its reply is
    // `$100\r\n<100 bytes>\r\n` (107).
    let info_request = in2 - in1;
    let echo = in1 - in0 - info_request;
    assert_eq!(echo, 122, "ECHO's input bytes");
    assert!(out1 - out0 >= 107, "output bytes {out0} -> {out1}");
}
