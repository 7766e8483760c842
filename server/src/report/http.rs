//! The metrics endpoint (`--metrics-addr`): a minimal HTTP/1.1 server on tokio, GET only,
//! one request per connection. `/metrics` (Prometheus text), `/json` (what the status
//! page polls), `/` (the status page), `/healthz`, and what buyers watch (`live`):
//! `/sale/<sku>` (the buyer page) and `/sale/<sku>/events` (its live counts as
//! Server-Sent Events). No framework: a few routes do not need one, and every request is
//! bounded in size, time and concurrency; an event stream leaves the request limits once
//! its request is read and counts against the watcher limit instead.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::health::{self, Health};
use super::live::{self, Hub};
use super::{prom, view};
use crate::engine::Engine;
use crate::metrics::{HistoryPoint, Metrics, SaleEvent, SALE_EVENT_NAMES};
use crate::session::Shared;

const STATUS_PAGE: &str = include_str!("status.html");
const MAX_REQUEST: usize = 8 * 1024;
const MAX_CONCURRENT: usize = 32;
/// Connections reading their request at once where event streams are served: watchers
/// (re)connect in bursts (a page load, a reconnect after a restart); the routes other than
/// the streams still answer [`MAX_CONCURRENT`] at a time.
const MAX_CONCURRENT_READS_LIVE: usize = 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A route's answer: content type and body; `None` is a 404.
pub type Routed = Option<(&'static str, Vec<u8>)>;

/// A route's answer with its status line (`/healthz` answers 503 too).
type Answered = Option<(&'static str, &'static str, Vec<u8>)>;

/// Serves the stockgate routes until the task is dropped; over HTTPS with the RESP
/// port's certificate (and its client-certificate rule) when `tls` is given
/// (`--metrics-tls yes`). Event streams watch through `hub` (shared with the RESP
/// port's live channels, so a sale has one sampler).
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    tls: Option<Arc<crate::tls::Tls>>,
    hub: Arc<Hub>,
) {
    serve_routes_over(
        listener,
        tls,
        Some(hub),
        Arc::new(move |target: &str| -> Answered {
            const OK: &str = "200 OK";
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            if let Some(answer) = sale_route(&engine, path, query) {
                return Some(answer);
            }
            // Rendering takes each engine stripe lock briefly, as EXPIRED does.
            match path {
                "/metrics" => Some((OK, PROM_TYPE, prom::render(&engine, &shared).into_bytes())),
                "/json" => Some((OK, "application/json", json(&engine, &shared).into_bytes())),
                "/" | "/index.html" => Some((
                    OK,
                    "text/html; charset=utf-8",
                    STATUS_PAGE.as_bytes().to_vec(),
                )),
                "/healthz" => Some(match health::decide(&health::input(&shared)) {
                    Health::Ok => (OK, "text/plain", b"ok\n".to_vec()),
                    Health::Unavailable(why) => (
                        "503 Service Unavailable",
                        "text/plain",
                        format!("{why}\n").into_bytes(),
                    ),
                }),
                _ => None,
            }
        }),
    )
    .await
}

/// `/sale/<sku>` (the buyer page) and `/sale/<sku>/ticket`; `None` for other paths.
/// (`/sale/<sku>/events` is served as a stream before the routes are asked.)
fn sale_route(engine: &Engine, path: &str, query: &str) -> Answered {
    if let Some(sku) = live::page_sku(path) {
        let (status, page) = live::page(engine, &sku);
        return Some((status, "text/html; charset=utf-8", page.into_bytes()));
    }
    let sku = path.strip_prefix("/sale/")?.strip_suffix("/ticket")?;
    if sku.is_empty() || sku.contains('/') {
        return None;
    }
    // A read of the room as it is (`Engine::room_peek`): ROOM.STATUS would move the room
    // and log what that decided, a write an unauthenticated GET must not make. The
    // admission token itself is never shown here: the checkout service fetches it.
    let (status, body) = live::ticket_json(engine, &live::percent_decode(sku), query);
    Some((status, "application/json", body.into_bytes()))
}

/// The Prometheus text exposition content type.
pub const PROM_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A bounded GET-only HTTP/1.1 server over `route` (also used by the sweeper binary),
/// over HTTPS when `tls` is given.
pub async fn serve_routes(
    listener: TcpListener,
    tls: Option<Arc<crate::tls::Tls>>,
    route: Arc<dyn Fn(&str) -> Routed + Send + Sync>,
) {
    let answered: Route = Arc::new(move |target: &str| -> Answered {
        let path = target.split('?').next().unwrap_or("");
        route(path).map(|(ctype, body)| ("200 OK", ctype, body))
    });
    serve_routes_over(listener, tls, None, answered).await
}

type Route = Arc<dyn Fn(&str) -> Answered + Send + Sync>;

/// [`serve_routes`], over TLS when `tls` is given (the handshake counts against the
/// request's time limit), with the event streams of `live` when given.
async fn serve_routes_over(
    listener: TcpListener,
    tls: Option<Arc<crate::tls::Tls>>,
    live: Option<Arc<Hub>>,
    route: Route,
) {
    let reads = match live {
        Some(_) => MAX_CONCURRENT_READS_LIVE,
        None => MAX_CONCURRENT,
    };
    let permits = Arc::new(Semaphore::new(reads));
    let routes = Arc::new(Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Busy: drop the connection rather than queue without bound.
            continue;
        };
        let route = route.clone();
        let routes = routes.clone();
        let live = live.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
            match acceptor {
                None => conn(stream, route, routes, live, permit, deadline).await,
                Some(a) => {
                    if let Ok(Ok(s)) = tokio::time::timeout_at(deadline, a.accept(stream)).await {
                        conn(s, route, routes, live, permit, deadline).await;
                    }
                }
            }
        });
    }
}

/// One connection: its request read and answered by `deadline`, holding `permit` (and
/// one of `routes` to answer); an event stream gives the permit back and runs on without
/// the deadline.
async fn conn<S: AsyncRead + AsyncWrite + Unpin + Send>(
    mut s: S,
    route: Route,
    routes: Arc<Semaphore>,
    live: Option<Arc<Hub>>,
    permit: OwnedSemaphorePermit,
    deadline: tokio::time::Instant,
) {
    let Ok(Ok(req)) = tokio::time::timeout_at(deadline, read_request(&mut s)).await else {
        return;
    };
    if let (Some(hub), Some((method, target))) = (live, req.as_ref()) {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        if let (true, Some(sku)) = (method == "GET", live::events_sku(path)) {
            drop(permit);
            live::serve_events(&hub, s, &sku, query).await;
            return;
        }
    }
    let _ = tokio::time::timeout_at(deadline, async {
        let _answering = routes.acquire().await;
        answer(&mut s, req, route.as_ref()).await
    })
    .await;
    drop(permit);
}

/// The request line's method and target; `None` when the head is too large; an error
/// when the peer closed first (then nothing is answered).
async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
) -> std::io::Result<Option<(String, String)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return Ok(None);
        }
    }
    let line = buf.split(|&b| b == b'\r').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    Ok(Some((method.to_string(), target.to_string())))
}

async fn answer<S: AsyncWrite + Unpin>(
    s: &mut S,
    req: Option<(String, String)>,
    route: &(dyn Fn(&str) -> Answered + Send + Sync),
) -> std::io::Result<()> {
    let Some((method, target)) = req else {
        return respond(s, "431 Request Header Fields Too Large", "text/plain", b"").await;
    };
    if method != "GET" && method != "HEAD" {
        return respond(s, "405 Method Not Allowed", "text/plain", b"GET only\n").await;
    }
    let (status, ctype, body) = match route(&target) {
        Some(answer) => answer,
        None => ("404 Not Found", "text/plain", b"not found\n".to_vec()),
    };
    let body = if method == "HEAD" { Vec::new() } else { body };
    respond(s, status, ctype, &body).await
}

async fn respond<S: AsyncWrite + Unpin>(
    s: &mut S,
    status: &str,
    ctype: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    s.shutdown().await
}

/// JSON string literal.
fn js(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Sales shown on the status page (the page is for humans; Prometheus has the rest).
const JSON_SALES: usize = 200;

/// What the status page (and anyone else) polls: the same figures as `top`. Built in
/// the document's key order, each section read from its source as it is written.
pub fn json(engine: &Engine, shared: &Shared) -> String {
    let m = &shared.metrics;
    let mut o = String::with_capacity(8 * 1024);
    head_json(&mut o, shared);
    sales_json(&mut o, engine, shared);
    commands_json(&mut o, m);
    errors_json(&mut o, m);
    group_json(&mut o, shared);
    history_json(&mut o, m);
    o
}

/// `{"uptime_s":…,"connected_clients":…,"commands_processed":…,"wal":{…},"sales":[`:
/// the server's counters and the log's progress (`pending` is what is not durable yet).
fn head_json(o: &mut String, shared: &Shared) {
    let stats = view::server_stats(shared);
    let get = |k: &str| stats.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
    let fields = view::persistence_fields(shared);
    let last = view::persistence_u64(&fields, "wal_last_lsn");
    let durable = view::persistence_u64(&fields, "wal_durable_lsn");
    let _ = write!(
        o,
        "{{\"uptime_s\":{},\"connected_clients\":{},\"commands_processed\":{},\"wal\":{{\"enabled\":{},\"last_lsn\":{last},\"durable_lsn\":{durable},\"pending\":{}}},\"sales\":[",
        shared.started.elapsed().as_secs(),
        shared.stats.connected.load(Ordering::Relaxed),
        get("total_commands_processed"),
        fields.iter().any(|(k, _)| k == "wal_last_lsn"),
        last.saturating_sub(durable),
    );
}

/// The `sales` array's items: the first [`JSON_SALES`] sales with their counters and
/// outcomes (the page is for humans; Prometheus has every sale).
fn sales_json(o: &mut String, engine: &Engine, shared: &Shared) {
    for (i, r) in view::sales(engine, shared, JSON_SALES).iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"sku\":{},\"state\":{},\"total\":{},\"available\":{},\"reserved\":{},\"committed\":{},\"outcomes\":{{",
            js(&r.sku),
            js(r.state),
            r.total,
            r.available,
            r.reserved,
            r.committed
        );
        for (j, name) in SALE_EVENT_NAMES.iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            let _ = write!(o, "\"{name}\":{}", r.outcomes[j]);
        }
        let _ = write!(
            o,
            "}},\"expired_pending\":{},\"oldest_expired_age_ms\":{},\"room\":",
            r.expired, r.oldest_expired_age_ms
        );
        room_json(o, r.room.as_ref());
        o.push('}');
    }
}

/// A sale's `room`: its waiting room's figures, `null` without one.
fn room_json(o: &mut String, room: Option<&view::RoomRow>) {
    let Some(r) = room else {
        o.push_str("null");
        return;
    };
    let _ = write!(
        o,
        "{{\"waiting\":{},\"admitted_not_reserved\":{},\"admissions\":{},\"expired_admissions\":{},\"wait_estimate_ms\":{},\"open\":{},\"sold_out\":{}}}",
        r.waiting, r.admitted_not_reserved, r.admissions, r.expired, r.wait_estimate_ms, r.open, r.sold_out
    );
}

/// `],"commands":[…`: each command called at least once, with its latency percentiles
/// in microseconds (0 without a histogram).
fn commands_json(o: &mut String, m: &Metrics) {
    o.push_str("],\"commands\":[");
    let mut first = true;
    for c in m.commands().iter().filter(|c| c.calls > 0) {
        if !first {
            o.push(',');
        }
        first = false;
        let (p50, p99) = c.hist.as_ref().map_or((0.0, 0.0), |h| {
            (
                h.value_at_percentile(50.0) as f64 / 1000.0,
                h.value_at_percentile(99.0) as f64 / 1000.0,
            )
        });
        let _ = write!(
            o,
            "{{\"cmd\":{},\"calls\":{},\"failed\":{},\"rejected\":{},\"usec_per_call\":{:.2},\"p50_us\":{p50:.3},\"p99_us\":{p99:.3}}}",
            js(c.name),
            c.calls,
            c.failed,
            c.rejected,
            c.usec_per_call()
        );
    }
}

/// `],"error_replies":…,"errors":{…},"denials":{…}`: error replies by code, and RESERVE
/// denials by reason.
fn errors_json(o: &mut String, m: &Metrics) {
    let (errors, total) = m.errors();
    let _ = write!(o, "],\"error_replies\":{total},\"errors\":{{");
    for (i, (code, n)) in errors.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{}:{n}", js(code));
    }
    o.push_str("},\"denials\":{");
    for (i, (why, n)) in m.denials().iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "\"{}\":{n}", why.reason());
    }
    o.push('}');
}

/// `,"history":[…]}`: the recent per-second points, oldest first, closing the document.
/// The history lock is held only while they are written.
fn history_json(o: &mut String, m: &Metrics) {
    o.push_str(",\"history\":[");
    for (i, p) in m.history.lock().iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "[{},{},{},{},{}]",
            p.unix_ms, p.commands, p.reserved, p.soldout, p.errors
        );
    }
    o.push_str("]}");
}

/// `,"health":…,"group":…,"feed_groups":…`: the node's /healthz answer, its Raft group
/// (`null` on a single node) and the feed's consumer groups (`null` without a feed).
fn group_json(o: &mut String, shared: &Shared) {
    let health = match health::decide(&health::input(shared)) {
        Health::Ok => "ok".to_string(),
        Health::Unavailable(why) => why,
    };
    let _ = write!(o, ",\"health\":{},\"group\":", js(&health));
    let opt = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
    match view::group(shared) {
        None => o.push_str("null"),
        Some(g) => {
            let _ = write!(
                o,
                "{{\"name\":{},\"node_id\":{},\"role\":{},\"leader_id\":{},\"leader_addr\":{},\"term\":{},\"last_index\":{},\"applied_index\":{},\"commit_index\":{},\"millis_since_quorum_ack\":{},\"lease_held\":{},\"followers\":[",
                js(&g.name),
                g.node_id,
                js(&g.role),
                opt(g.leader_id),
                g.leader_addr.as_deref().map_or("null".to_string(), js),
                g.term,
                g.last_index,
                g.applied_index,
                opt(g.commit_index),
                opt(g.millis_since_quorum_ack),
                g.lease_held,
            );
            for (i, f) in g.followers.iter().enumerate() {
                if i > 0 {
                    o.push(',');
                }
                let _ = write!(
                    o,
                    "{{\"id\":{},\"addr\":{},\"voter\":{},\"matched\":{},\"lag\":{}}}",
                    f.id,
                    js(&f.addr),
                    f.voter,
                    f.matched,
                    f.lag
                );
            }
            o.push_str("]}");
        }
    }
    o.push_str(",\"feed_groups\":");
    match view::feed_groups(shared) {
        None => o.push_str("null"),
        Some(groups) => {
            o.push('[');
            for (i, g) in groups.iter().enumerate() {
                if i > 0 {
                    o.push(',');
                }
                let _ = write!(
                    o,
                    "{{\"stream\":{},\"group\":{},\"consumers\":{},\"lag\":{},\"pending\":{},\"oldest_pending_ms\":{}}}",
                    js(&g.stream),
                    js(&g.group),
                    g.consumers,
                    g.lag,
                    g.pending,
                    g.oldest_pending_ms
                );
            }
            o.push(']');
        }
    }
}

/// Once a second: a point for the rate chart and INFO's `instantaneous_ops_per_sec`.
pub async fn sample_loop(engine: Arc<Engine>, shared: Arc<Shared>) {
    let mut iv = tokio::time::interval(Duration::from_secs(1));
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        iv.tick().await;
        shared.metrics.push_history(history_point(&engine, &shared));
    }
}

fn history_point(engine: &Engine, shared: &Shared) -> HistoryPoint {
    let m = &shared.metrics;
    let mut reserved = 0;
    let mut soldout = 0;
    for sku in engine.list_sales() {
        let t = m.sale_totals(&sku);
        reserved += t[SaleEvent::Reserved as usize];
        soldout += t[SaleEvent::SoldOut as usize];
    }
    let o = m.other_sale_totals();
    reserved += o[SaleEvent::Reserved as usize];
    soldout += o[SaleEvent::SoldOut as usize];
    HistoryPoint {
        unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        commands: shared.stats.commands.load(Ordering::Relaxed),
        reserved,
        soldout,
        errors: m.errors().1,
    }
}
