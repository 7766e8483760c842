//! The waiting room's metrics end to end: a room with buyers waiting, some admitted, one
//! reserving and one letting the admission expire shows exactly those figures on
//! `/metrics` (which `promtool check metrics` accepts, when installed) and in `/json`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::ha::free_port;
use crate::common::{as_str, cmd, have, now_ms, Server};
use redis::Value;

const SKU: &str = "ROOM-M";

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

/// Scrapes `url` until `pred` holds of the body (the room ticks every 20 ms).
fn scrape_until(url: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(b) = curl(url).filter(|b| pred(b)) {
            return b;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never matched: {:?}",
            curl(url)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items,
        other => panic!("not an array: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_metrics_and_json_follow_the_room() {
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let srv = Server::start(&["--metrics-addr", &maddr]);
    let mut c = srv.conn().await;
    cmd(&mut c, &["SALE.CREATE", SKU, "3", "SHARDS", "1"])
        .await
        .unwrap();
    cmd(&mut c, &["SALE.CREATE", "NO-ROOM", "3"]).await.unwrap();
    // One buyer per unit, admissions unused for 2 s expire.
    let open = ["ROOM.OPEN", SKU, "RATE", "1000", "ADMIT-TTL", "2000"];
    assert_eq!(cmd(&mut c, &open).await.unwrap(), Value::Okay);
    let mut tickets = Vec::new();
    for i in 0..10 {
        let v = items(
            cmd(&mut c, &["ROOM.JOIN", SKU, &format!("m-{i}")])
                .await
                .unwrap(),
        );
        tickets.push(as_str(&v[0]));
    }
    // Three admitted as they join; m-0 reserves with its admission.
    let s = items(
        cmd(&mut c, &["ROOM.STATUS", SKU, "m-0", &tickets[0]])
            .await
            .unwrap(),
    );
    assert_eq!(as_str(&s[0]), "ADMITTED");
    let adm = as_str(&s[1]);
    let v = items(
        cmd(&mut c, &["RESERVE", SKU, "m-0", &adm, "r"])
            .await
            .unwrap(),
    );
    assert_eq!(as_str(&v[0]), "RESERVED");
    let metrics = format!("http://{maddr}/metrics");
    let want = |text: &str, line: &str| text.lines().any(|l| l == line);
    let m = |name: &str, v: u64| format!("stockgate_room_{name}{{sku=\"{SKU}\"}} {v}");
    let text = scrape_until(&metrics, |t| want(t, &m("admissions_total", 3)));
    for line in [
        m("waiting", 7),
        m("admitted_not_reserved", 2),
        m("admissions_total", 3),
        m("admissions_expired_total", 0),
    ] {
        assert!(want(&text, &line), "missing {line:?} in\n{text}");
    }
    assert!(text.contains("# TYPE stockgate_room_admissions_total counter\n"));
    assert!(text.contains("# TYPE stockgate_room_waiting gauge\n"));
    assert!(
        !text.contains("stockgate_room_waiting{sku=\"NO-ROOM\"}"),
        "a sale without a room has no room samples"
    );
    let wait = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "stockgate_room_wait_estimate_seconds{{sku=\"{SKU}\"}} "
            ))
        })
        .and_then(|v| v.parse::<f64>().ok())
        .expect("wait estimate");
    assert!(wait > 0.0, "{wait}");

    // The two unused admissions expire (2 s); their budget admits the next two, who
    // reserve: nothing moves after that (no stock left to admit for, nothing to expire).
    for i in [3, 4] {
        let user = format!("m-{i}");
        let adm = admission_when_admitted(&mut c, &user, &tickets[i]).await;
        let v = items(
            cmd(&mut c, &["RESERVE", SKU, &user, &adm, "r"])
                .await
                .unwrap(),
        );
        assert_eq!(as_str(&v[0]), "RESERVED");
    }
    let settled = |t: &str| {
        want(t, &m("admissions_expired_total", 2)) && want(t, &m("admitted_not_reserved", 0))
    };
    let text = scrape_until(&metrics, settled);
    assert!(want(&text, &m("admissions_total", 5)), "{text}");
    assert!(want(&text, &m("waiting", 5)), "{text}");
    promtool_accepts(&text);

    let json = curl(&format!("http://{maddr}/json")).expect("/json");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("/json parses");
    let sales = doc["sales"].as_array().expect("sales");
    let sale = |sku: &str| sales.iter().find(|s| s["sku"] == sku).expect("sale row");
    let room = &sale(SKU)["room"];
    assert_eq!(room["waiting"], 5, "{room}");
    assert_eq!(room["admissions"], 5, "{room}");
    assert_eq!(room["expired_admissions"], 2, "{room}");
    assert_eq!(room["open"], true, "{room}");
    assert_eq!(room["admitted_not_reserved"], 0, "{room}");
    assert!(room["wait_estimate_ms"].as_u64().is_some(), "{room}");
    assert!(sale("NO-ROOM")["room"].is_null());
}

/// Polls `user`'s place until it is admitted (bounded); the admission token.
async fn admission_when_admitted(
    c: &mut redis::aio::MultiplexedConnection,
    user: &str,
    ticket: &str,
) -> String {
    let deadline = now_ms() + 15_000;
    loop {
        let s = items(cmd(c, &["ROOM.STATUS", SKU, user, ticket]).await.unwrap());
        if as_str(&s[0]) == "ADMITTED" {
            return as_str(&s[1]);
        }
        assert!(now_ms() < deadline, "{user} never admitted: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `promtool check metrics` accepts the exposition (skipped without promtool).
fn promtool_accepts(text: &str) {
    if !have("promtool") {
        eprintln!("promtool not installed: exposition not checked by it");
        return;
    }
    use std::io::Write as _;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "promtool refused:\n{said}\n{text}");
    // Lint notes are printed but do not fail the check; none may name a room family.
    assert!(!said.contains("stockgate_room_"), "{said}");
}
