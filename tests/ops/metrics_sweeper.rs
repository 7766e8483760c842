//! The sweeper binary's `--metrics-addr`: after it releases abandoned carts, its
//! Prometheus counters say so, and the lag of the oldest expired reservation goes to 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stockgate_testkit::{workspace_root, Harness};

fn curl(url: &str) -> String {
    Command::new("curl")
        .args(["-s", "--max-time", "5", url])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_exports_its_passes_and_lag() {
    let h = Harness::start().await.expect("harness");
    let sku = "SWEPT";
    h.create_sale(sku, 10, 300, None).await.unwrap();
    // 3 materialized carts (released) and 2 with no order (tombstoned, then released).
    h.reserve_many(sku, "m", 3, true).await.unwrap();
    h.reserve_many(sku, "t", 2, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;

    let port = free_port();
    let bin = workspace_root().join("target/debug/stockgate-sweeper");
    assert!(
        bin.exists(),
        "{} missing: cargo build --workspace --bins",
        bin.display()
    );
    let mut child = Command::new(bin)
        .args(["--database-url", h.pg.url(), "--server", h.server.addr()])
        .args(["run", "--interval-secs", "0.2", "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start sweeper");
    let url = format!("http://127.0.0.1:{port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let t = curl(&url);
        if metric(&t, "stockgate_sweeper_released_total") == Some(5.0)
            && metric(&t, "stockgate_sweeper_passes_total").unwrap_or(0.0) >= 2.0
        {
            break t;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sweeper metrics never showed the releases:\n{t}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        metric(&text, "stockgate_sweeper_tombstones_total"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "stockgate_sweeper_cancelled_total"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "stockgate_sweeper_committed_cleanup_total"),
        Some(0.0)
    );
    assert_eq!(
        metric(&text, "stockgate_sweeper_lag_seconds"),
        Some(0.0),
        "{text}"
    );
    assert!(
        text.contains("stockgate_sweeper_errors_total{source=\"ledger\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("stockgate_sweeper_errors_total{source=\"server\"} 0\n"),
        "{text}"
    );
    assert_eq!(h.client.stock(sku).await.unwrap(), 10);
}

fn drain_materializer(h: &Harness) {
    let out = Command::new(workspace_root().join("target/debug/stockgate-materializer"))
        .args([
            "--database-url",
            h.pg.url(),
            "--server",
            h.server.addr(),
            "--drain",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .expect("run stockgate-materializer");
    assert!(out.status.success(), "{out:?}");
}

/// Polls the sweeper's `/metrics` until `ok` holds for the text (30 s at most).
async fn wait_metrics(url: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = curl(url);
        if ok(&t) {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}; last scrape:\n{t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The sweeper exports the materializer's lag: 0 once it has caught up, > 0 (records
/// and seconds) while it is stopped and the server logs reservations, 0 again after it
/// has drained the feed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_exports_the_materializers_lag() {
    let h = Harness::start().await.expect("harness");
    let sku = "LAGGED";
    h.create_sale(sku, 1000, 600_000, None).await.unwrap();
    let port = free_port();
    let mut sweeper = Command::new(workspace_root().join("target/debug/stockgate-sweeper"))
        .args(["--database-url", h.pg.url(), "--server", h.server.addr()])
        .args(["run", "--interval-secs", "0.2", "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start sweeper");
    let url = format!("http://127.0.0.1:{port}/metrics");
    let records = "stockgate_sweeper_materializer_lag_records{consumer=\"materializer\"}";
    let seconds = "stockgate_sweeper_materializer_lag_seconds{consumer=\"materializer\"}";
    let position = "stockgate_sweeper_materializer_position{consumer=\"materializer\"}";
    let end = "stockgate_sweeper_feed_end_position{consumer=\"materializer\"}";

    // No materializer has run: no row, so no gauge (rather than a made-up 0).
    let t = wait_metrics(&url, "sweeper never passed", |t| {
        metric(t, "stockgate_sweeper_passes_total").unwrap_or(0.0) >= 1.0
    })
    .await;
    assert_eq!(metric(&t, records), None, "{t}");

    drain_materializer(&h);
    let t = wait_metrics(&url, "lag not 0 after the first drain", |t| {
        metric(t, records) == Some(0.0)
    })
    .await;
    assert_eq!(metric(&t, seconds), Some(0.0), "{t}");

    // The materializer is stopped; the server logs 40 reservations.
    h.reserve_many(sku, "u", 40, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let t = wait_metrics(&url, "lag never showed the 40 reservations", |t| {
        metric(t, records).unwrap_or(0.0) >= 40.0
    })
    .await;
    let lag_s = metric(&t, seconds).unwrap_or(0.0);
    assert!((1.0..60.0).contains(&lag_s), "seconds behind: {lag_s}\n{t}");
    let (p, e) = (metric(&t, position), metric(&t, end));
    assert_eq!(
        metric(&t, records),
        e.zip(p).map(|(e, p)| e - p),
        "lag = end - position\n{t}"
    );

    // It catches up: back to 0, and its position is the feed's end.
    drain_materializer(&h);
    let t = wait_metrics(&url, "lag not back to 0 after catching up", |t| {
        metric(t, records) == Some(0.0)
    })
    .await;
    let _ = sweeper.kill();
    let _ = sweeper.wait();
    assert_eq!(metric(&t, seconds), Some(0.0), "{t}");
    assert_eq!(metric(&t, position), metric(&t, end), "{t}");
    assert!(metric(&t, position).unwrap_or(0.0) >= 40.0, "{t}");
    assert_eq!(
        metric(&t, "stockgate_sweeper_materializer_probe_errors_total"),
        Some(0.0),
        "{t}"
    );
}

/// `curl` with extra arguments; its stdout, or "" when the transfer failed.
fn curl_with(args: &[&str]) -> String {
    Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn free_port() -> u16 {
    stockgate_testkit::ports::reserve().expect("free port")
}

/// The sweeper's metrics over HTTPS: served with the endpoint's certificate, refused
/// over plain HTTP; a non-loopback address refused without client certificates and
/// accepted with them, and then a scraper without a certificate gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_metrics_over_https() {
    let h = Harness::start().await.expect("harness");
    let tmp = crate::common::TempDir::new("sweeper-tls");
    let dir = tmp.path().to_path_buf();
    crate::common::tls::make_pki(&dir, "sw");
    let f = |n: &str| dir.join(n).display().to_string();
    let (ca, cert, key) = (f("sw-ca.pem"), f("sw-server.pem"), f("sw-server.key"));
    let (ccert, ckey) = (f("sw-client.pem"), f("sw-client.key"));
    let bin = workspace_root().join("target/debug/stockgate-sweeper");
    let start = |addr: String, extra: &[&str]| {
        Command::new(&bin)
            .args(["--database-url", h.pg.url(), "--server", h.server.addr()])
            .args(["run", "--interval-secs", "0.2", "--metrics-addr", &addr])
            .args([
                "--metrics-tls-cert-file",
                &cert,
                "--metrics-tls-key-file",
                &key,
            ])
            .args(extra)
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sweeper")
    };
    let until = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ok() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    // HTTPS on loopback, no client certificates.
    let port = free_port();
    let mut child = start(format!("127.0.0.1:{port}"), &[]);
    let https = format!("https://127.0.0.1:{port}/metrics");
    until("metrics over https", &|| {
        curl_with(&["--cacert", &ca, &https]).contains("stockgate_sweeper_passes_total")
    });
    let plain = curl_with(&[&format!("http://127.0.0.1:{port}/metrics")]);
    assert!(
        !plain.contains("stockgate_sweeper"),
        "served over plain HTTP: {plain}"
    );
    let _ = child.kill();
    let _ = child.wait();

    // Every interface without client certificates: refused at start, saying why.
    let out = start(format!("0.0.0.0:{}", free_port()), &[])
        .wait_with_output()
        .expect("sweeper exit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    assert!(err.contains("not a loopback address"), "{err}");

    // With client certificates required it may: a scraper with one is served, one
    // without is not.
    let port = free_port();
    let mut child = start(
        format!("0.0.0.0:{port}"),
        &["--metrics-tls-ca-cert-file", &ca],
    );
    let https = format!("https://127.0.0.1:{port}/metrics");
    until("metrics with a client certificate", &|| {
        curl_with(&["--cacert", &ca, "--cert", &ccert, "--key", &ckey, &https])
            .contains("stockgate_sweeper_passes_total")
    });
    let anonymous = curl_with(&["--cacert", &ca, &https]);
    assert!(
        !anonymous.contains("stockgate_sweeper"),
        "served without a client certificate: {anonymous}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
