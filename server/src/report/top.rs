//! `stockgate top`: a terminal view of a running server, polled once a second over RESP
//! (`INFO everything` and `LATENCY HISTOGRAM reserve`), so it works against any server an
//! operator can reach with redis-cli. Rates and the reserve p99 are over the last poll
//! interval, not since start.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, Wrap};
use ratatui::{Frame, Terminal};

use crate::engine::Denied;

/// A RESP reply, as far as `top` needs one.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A bulk or simple string.
    Str(Vec<u8>),
    /// An integer.
    Int(i64),
    /// An error reply's text.
    Err(String),
    /// A null reply.
    Nil,
    /// An array.
    Arr(Vec<Value>),
}

/// Replies larger than this are refused (a confused or hostile peer).
const MAX_BULK: usize = 64 * 1024 * 1024;
const MAX_DEPTH: usize = 8;

/// Reads one reply from `r`. `depth` is how deeply nested this reply is (0 at the top); nesting
/// past a small bound, unknown types and oversized bulks are errors rather than allocations.
pub fn read_value(r: &mut impl BufRead, depth: usize) -> std::io::Result<Value> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    if depth > MAX_DEPTH {
        return Err(bad("reply nested too deep"));
    }
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.len() < 3 {
        return Err(bad("connection closed"));
    }
    let body = String::from_utf8_lossy(&line[1..line.len() - 2]).to_string();
    let num = || body.parse::<i64>().map_err(|_| bad("bad length"));
    match line[0] {
        b'+' => Ok(Value::Str(body.into_bytes())),
        b'-' => Ok(Value::Err(body)),
        b':' => Ok(Value::Int(num()?)),
        b'_' => Ok(Value::Nil),
        b'$' | b'=' => {
            let n = num()?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = n as usize;
            if n > MAX_BULK {
                return Err(bad("reply too large"));
            }
            let mut buf = vec![0u8; n + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(n);
            Ok(Value::Str(buf))
        }
        b'*' | b'%' | b'~' => {
            let n = num()?;
            if n < 0 {
                return Ok(Value::Nil);
            }
            let n = (n as usize) * if line[0] == b'%' { 2 } else { 1 };
            let mut v = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                v.push(read_value(r, depth + 1)?);
            }
            Ok(Value::Arr(v))
        }
        _ => Err(bad("unexpected reply type")),
    }
}

/// The byte stream under a [`Conn`]: plain TCP, or TLS over it (`stockgate top --tls`).
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A failed handshake in an operator's words: the usual cause first, rustls's words kept.
fn handshake_error(e: std::io::Error) -> std::io::Error {
    let text = e.to_string();
    let msg = match crate::tls::handshake_hint(&text) {
        Some(hint) => format!("TLS handshake failed: {hint}: {text}"),
        None => format!("TLS handshake failed: {text}"),
    };
    std::io::Error::new(e.kind(), msg)
}

/// A blocking connection to the server.
pub struct Conn {
    s: BufReader<Stream>,
}

impl Conn {
    /// Connects to `addr` over plain TCP (3 s timeout, 5 s per read or write) and, with
    /// `auth` as (user, password), authenticates.
    pub fn open(addr: &str, auth: Option<(&str, &str)>) -> std::io::Result<Conn> {
        Conn::open_tls(addr, auth, None)
    }

    /// [`Conn::open`], over TLS with `tls` (the certificate must name `addr`'s host).
    pub fn open_tls(
        addr: &str,
        auth: Option<(&str, &str)>,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> std::io::Result<Conn> {
        // Bounded: an unreachable host must not freeze the view for minutes.
        let sa = std::net::ToSocketAddrs::to_socket_addrs(addr)?
            .next()
            .ok_or_else(|| std::io::Error::other("address resolves to nothing"))?;
        let w = TcpStream::connect_timeout(&sa, Duration::from_secs(3))?;
        w.set_read_timeout(Some(Duration::from_secs(5)))?;
        w.set_write_timeout(Some(Duration::from_secs(5)))?;
        let stream = match tls {
            None => Stream::Plain(w),
            Some(cfg) => {
                let host = addr
                    .rsplit_once(':')
                    .map_or(addr, |(h, _)| h)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| std::io::Error::other(format!("TLS server name {host}: {e}")))?;
                let conn = rustls::ClientConnection::new(cfg.clone(), name)
                    .map_err(std::io::Error::other)?;
                let mut s = rustls::StreamOwned::new(conn, w);
                // The handshake now, so a wrong CA is reported as such and not as a
                // failed first command.
                while s.conn.is_handshaking() {
                    s.conn.complete_io(&mut s.sock).map_err(handshake_error)?;
                }
                Stream::Tls(Box::new(s))
            }
        };
        let mut c = Conn {
            s: BufReader::new(stream),
        };
        if let Some((u, p)) = auth {
            if let Value::Err(e) = c.call(&["AUTH", u, p])? {
                return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, e));
            }
        }
        Ok(c)
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&str]) -> std::io::Result<Value> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        self.s.get_mut().write_all(&req)?;
        self.s.get_mut().flush()?;
        read_value(&mut self.s, 0)
    }
}

/// One sale as INFO's `sales` section gives it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sale {
    /// The sale's key.
    pub sku: String,
    /// The sale's state (`OPEN`, `PAUSED`, `FENCED`).
    pub state: String,
    /// The sale's numeric fields by name (`total`, `available`, outcome counts).
    pub f: HashMap<String, i64>,
}

impl Sale {
    /// A numeric field, 0 when absent.
    pub fn n(&self, k: &str) -> i64 {
        self.f.get(k).copied().unwrap_or(0)
    }
}

/// INFO text parsed: flat fields, sales, error counts.
#[derive(Clone, Debug, Default)]
pub struct Info {
    /// The flat `key:value` fields.
    pub fields: HashMap<String, String>,
    /// The sales of the `sales` section.
    pub sales: Vec<Sale>,
    /// Error replies by error code, from `errorstats`.
    pub errors: HashMap<String, i64>,
}

impl Info {
    /// Parses `INFO` text; lines that are not `key:value` are skipped.
    pub fn parse(text: &str) -> Info {
        let mut info = Info::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            if let Some(rest) = k.strip_prefix("errorstat_") {
                let n = v
                    .strip_prefix("count=")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                info.errors.insert(rest.to_string(), n);
            } else if k.starts_with("sale_") {
                let mut s = Sale::default();
                for kv in v.split(',') {
                    let Some((a, b)) = kv.split_once('=') else {
                        continue;
                    };
                    match a {
                        "sku" => s.sku = b.to_string(),
                        "state" => s.state = b.to_string(),
                        _ => {
                            s.f.insert(a.to_string(), b.parse().unwrap_or(0));
                        }
                    }
                }
                info.sales.push(s);
            } else {
                info.fields.insert(k.to_string(), v.to_string());
            }
        }
        info
    }

    /// A flat field as a number, 0 when absent or not a number.
    pub fn n(&self, k: &str) -> i64 {
        self.fields.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

/// Cumulative `(bucket upper bound µs, count)` pairs, as LATENCY HISTOGRAM gives them.
pub type Histogram = Vec<(i64, i64)>;

/// One command's cumulative buckets out of a LATENCY HISTOGRAM reply.
pub fn histogram_of(v: &Value, cmd: &str) -> Histogram {
    let Value::Arr(top) = v else {
        return Vec::new();
    };
    let mut it = top.iter();
    while let (Some(k), Some(body)) = (it.next(), it.next()) {
        if !matches!(k, Value::Str(s) if s.eq_ignore_ascii_case(cmd.as_bytes())) {
            continue;
        }
        let Value::Arr(fields) = body else { continue };
        let mut f = fields.iter();
        while let (Some(name), Some(val)) = (f.next(), f.next()) {
            if !matches!(name, Value::Str(s) if s == b"histogram_usec") {
                continue;
            }
            let Value::Arr(b) = val else { continue };
            return b
                .chunks(2)
                .filter_map(|p| match p {
                    [Value::Int(us), Value::Int(n)] => Some((*us, *n)),
                    _ => None,
                })
                .collect();
        }
    }
    Vec::new()
}

/// p99 (bucket upper bound, µs) of what happened between two cumulative histograms.
pub fn window_p99(before: &[(i64, i64)], after: &[(i64, i64)]) -> Option<i64> {
    let at = |h: &[(i64, i64)], us: i64| {
        h.iter()
            .take_while(|(b, _)| *b <= us)
            .last()
            .map_or(0, |(_, n)| *n)
    };
    let total = after.last().map_or(0, |(_, n)| *n) - before.last().map_or(0, |(_, n)| *n);
    if total <= 0 {
        return None;
    }
    let want = (total as f64 * 0.99).ceil() as i64;
    after
        .iter()
        .find(|(us, _)| at(after, *us) - at(before, *us) >= want)
        .map(|(us, _)| *us)
}

/// What one screen shows, computed from two consecutive polls.
#[derive(Clone, Debug, Default)]
pub struct Screen {
    /// The address polled.
    pub server: String,
    /// A line about the connection's trouble (connect or poll failed), empty while polls succeed.
    pub status: String,
    /// Whether the figures below come from a poll that succeeded. Until one does (and
    /// again after a failed one) the screen shows the trouble and no figures: the
    /// defaults would read as a real server's state (fsync off, no error replies).
    pub polled: bool,
    /// The latest poll's `INFO`.
    pub info: Info,
    /// Per sku: reserved/s, soldout/s.
    pub rates: HashMap<String, (f64, f64)>,
    /// The reserve p99 over the last poll interval, in µs; `None` when no reserve ran in it.
    pub reserve_p99_us: Option<i64>,
    /// The reserve p99 since the server started, as `INFO latencystats` gives it.
    pub reserve_p99_total_us: String,
    /// Commands per second over the last poll interval.
    pub ops_per_sec: f64,
    /// Error replies per second over the last poll interval.
    pub errors_per_sec: f64,
    /// Error replies per second by error code.
    pub error_rates: Vec<(String, f64)>,
    /// Per denial reason (INFO `denied_<reason>`): total and per second.
    pub denials: Vec<(Denied, i64, f64)>,
}

impl Screen {
    /// Recomputes the screen from a new poll (`info` and the reserve histogram `hist`), the
    /// previous poll and `dt`, the seconds between them; rates need a previous poll.
    pub fn update(
        &mut self,
        prev: Option<(&Info, &[(i64, i64)])>,
        info: Info,
        hist: &[(i64, i64)],
        dt: f64,
    ) {
        let dt = dt.max(0.001);
        self.rates.clear();
        self.error_rates.clear();
        self.denials = Denied::ALL
            .iter()
            .map(|&why| {
                let k = format!("denied_{}", why.reason());
                let n = info.n(&k);
                let r = prev.map_or(0.0, |(p, _)| (n - p.n(&k)).max(0) as f64 / dt);
                (why, n, r)
            })
            .collect();
        if let Some((p, ph)) = prev {
            let rate = |a: i64, b: i64| (a - b).max(0) as f64 / dt;
            for s in &info.sales {
                let old = p.sales.iter().find(|o| o.sku == s.sku);
                let (r0, s0) = old.map_or((s.n("reserve_reserved"), s.n("reserve_soldout")), |o| {
                    (o.n("reserve_reserved"), o.n("reserve_soldout"))
                });
                self.rates.insert(
                    s.sku.clone(),
                    (
                        rate(s.n("reserve_reserved"), r0),
                        rate(s.n("reserve_soldout"), s0),
                    ),
                );
            }
            self.ops_per_sec = rate(
                info.n("total_commands_processed"),
                p.n("total_commands_processed"),
            );
            self.errors_per_sec = rate(info.n("total_error_replies"), p.n("total_error_replies"));
            let mut codes: Vec<_> = info.errors.iter().collect();
            codes.sort();
            for (code, n) in codes {
                let old = p.errors.get(code).copied().unwrap_or(0);
                self.error_rates.push((code.clone(), rate(*n, old)));
            }
            self.reserve_p99_us = window_p99(ph, hist);
        }
        self.reserve_p99_total_us = info
            .fields
            .get("latency_percentiles_usec_reserve")
            .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("p99=")))
            .unwrap_or("-")
            .to_string();
        self.info = info;
        self.polled = true;
    }

    /// A screen of `server` that shows `trouble` and no figures (see [`Screen::polled`]).
    pub fn failed(server: &str, trouble: String) -> Screen {
        Screen {
            server: server.to_string(),
            status: trouble,
            ..Screen::default()
        }
    }
}

/// A bar of `width` cells: available (█), reserved (▒), committed (░).
pub fn bar(available: i64, reserved: i64, committed: i64, width: usize) -> String {
    let total = (available.max(0) + reserved + committed).max(1) as f64;
    let cells = |n: i64| ((n.max(0) as f64 / total) * width as f64).round() as usize;
    let (a, r) = (cells(available), cells(reserved));
    let c = width.saturating_sub(a + r).min(cells(committed));
    let mut s = "█".repeat(a.min(width));
    s.push_str(&"▒".repeat(r.min(width - a.min(width))));
    s.push_str(&"░".repeat(c));
    let used = s.chars().count();
    s.push_str(&" ".repeat(width.saturating_sub(used)));
    s
}

/// Draws the screen of a server not polled successfully: what is wrong, and no figures.
fn draw_trouble(f: &mut Frame, s: &Screen) {
    let trouble = if s.status.is_empty() {
        "connecting".to_string()
    } else {
        s.status.clone()
    };
    let lines = vec![
        Line::from(vec![
            Span::styled(
                "stockgate top ",
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(s.server.clone()),
        ]),
        Line::from(Span::styled(trouble, Style::default().fg(Color::Red))),
        Line::from("no figures until a poll succeeds (it keeps polling; q quits)"),
    ];
    // Wrapped: the advice must be readable in a narrow terminal too.
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), f.area());
}

/// Draws one screen into the terminal frame.
pub fn draw(f: &mut Frame, s: &Screen) {
    if !s.polled {
        return draw_trouble(f, s);
    }
    let chunks = Layout::vertical([
        Constraint::Length(7),
        Constraint::Min(5),
        Constraint::Length(6),
    ])
    .split(f.area());
    f.render_widget(Paragraph::new(head_lines(s)), chunks[0]);
    f.render_widget(sales_table(s), chunks[1]);
    f.render_widget(
        Paragraph::new(error_lines(s)).block(
            Block::default()
                .borders(Borders::TOP)
                .title("errors (q quits)"),
        ),
        chunks[2],
    );
}

/// The head of the screen: the server, latency, sweeper and log, group, ledger, denials.
fn head_lines(s: &Screen) -> Vec<Line<'static>> {
    let info = &s.info;
    let lag_ms = info
        .sales
        .iter()
        .map(|x| x.n("oldest_expired_age_ms"))
        .max()
        .unwrap_or(0);
    let expired: i64 = info.sales.iter().map(|x| x.n("expired_pending")).sum();
    let p99 = s
        .reserve_p99_us
        .map_or("-".to_string(), |v| format!("≤{v}"));
    let fsync = info
        .fields
        .get("aof_fsync")
        .cloned()
        .unwrap_or_else(|| "-".into());
    vec![
        Line::from(vec![
            Span::styled(
                "stockgate top ",
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                "{}  up {}s  clients {}  ops/s {:.0}  {}",
                s.server,
                info.n("uptime_in_seconds"),
                info.n("connected_clients"),
                s.ops_per_sec,
                s.status
            )),
        ]),
        Line::from(format!(
            "reserve p99 {} µs (last 1s), {} µs (since start)   errors/s {:.1}",
            p99, s.reserve_p99_total_us, s.errors_per_sec
        )),
        Line::from(vec![
            Span::raw(format!(
                "sweeper lag {:.1}s ({expired} expired unswept)   ",
                lag_ms as f64 / 1000.0
            )),
            Span::raw(format!(
                "log: fsync {fsync}, {} records pending, durable lsn {}",
                info.n("wal_pending_records"),
                info.n("wal_durable_lsn")
            )),
        ]),
        group_line(info),
        ledger_line(info, lag_ms),
        denials_line(&s.denials),
    ]
}

/// The sales table: a row per sale, red where the sweeper lags a minute behind.
fn sales_table(s: &Screen) -> Table<'static> {
    let rows: Vec<Row> = s.info.sales.iter().map(|x| sale_row(s, x)).collect();
    let widths = [
        Constraint::Length(18),
        Constraint::Length(7),
        Constraint::Length(21),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
    ];
    Table::new(rows, widths)
        .header(
            Row::new(vec![
                "sku",
                "state",
                "avail▕reserved▕committed",
                "available",
                "reserved",
                "committed",
                "total",
                "reserve/s",
                "soldout/s",
                "denied",
                "expired",
                "lag",
            ])
            .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(Block::default().borders(Borders::TOP).title("sales"))
}

/// One sale's row of the sales table.
fn sale_row(s: &Screen, x: &Sale) -> Row<'static> {
    let (rr, sr) = s.rates.get(&x.sku).copied().unwrap_or((0.0, 0.0));
    let lag = x.n("oldest_expired_age_ms") as f64 / 1000.0;
    let style = if lag > 60.0 {
        Style::default().fg(Color::Red)
    } else {
        Style::default()
    };
    Row::new(vec![
        x.sku.clone(),
        x.state.clone(),
        bar(x.n("available"), x.n("reserved"), x.n("committed"), 20),
        x.n("available").to_string(),
        x.n("reserved").to_string(),
        x.n("committed").to_string(),
        x.n("total").to_string(),
        format!("{rr:.1}"),
        format!("{sr:.1}"),
        x.n("reserve_denied").to_string(),
        x.n("expired_pending").to_string(),
        format!("{lag:.1}s"),
    ])
    .style(style)
}

/// The error replies by code: totals and rates.
fn error_lines(s: &Screen) -> Vec<Line<'static>> {
    let info = &s.info;
    if s.error_rates.is_empty() && info.errors.is_empty() {
        return vec![Line::from("no error replies")];
    }
    info.errors
        .iter()
        .map(|(code, n)| {
            let r = s
                .error_rates
                .iter()
                .find(|(c, _)| c == code)
                .map_or(0.0, |(_, r)| *r);
            Line::from(format!("{code:<12} {n:>10} total  {r:>8.1}/s"))
        })
        .collect()
}

/// `key=value` parts of an INFO field's value (`feed_group_0:stream=…,group=…`).
fn parts(v: &str) -> HashMap<&str, &str> {
    v.split(',').filter_map(|kv| kv.split_once('=')).collect()
}

/// The fields `prefix0`, `prefix1`, … in order.
fn numbered<'a>(info: &'a Info, prefix: &str) -> Vec<HashMap<&'a str, &'a str>> {
    (0..)
        .map_while(|i| info.fields.get(&format!("{prefix}{i}")))
        .map(|v| parts(v))
        .collect()
}

/// `group shop  node 1 leader  leader 1 (127.0.0.1:7001)  term 3  applied 120/120  commit 120
/// followers 2:0 3:4`, or `group: single node` off a Raft group.
pub fn group_line(info: &Info) -> Line<'static> {
    let Some(name) = info.fields.get("raft_group") else {
        return Line::from("group: single node (no Raft group)");
    };
    let leader = match info.fields.get("raft_leader_id").map(String::as_str) {
        None | Some("-") => "none known".to_string(),
        Some(id) => format!(
            "{id} ({})",
            info.fields
                .get("raft_leader_addr")
                .map_or("-", String::as_str)
        ),
    };
    let mut text = format!(
        "group {name}  node {} {}  leader {leader}  term {}  applied {}/{}",
        info.n("raft_node_id"),
        info.fields.get("raft_state").map_or("-", String::as_str),
        info.n("raft_term"),
        info.n("raft_last_applied_index"),
        info.n("raft_last_log_index"),
    );
    if info.fields.contains_key("raft_commit_index") {
        text.push_str(&format!(
            "  commit {} (lag {})",
            info.n("raft_commit_index"),
            (info.n("raft_last_log_index") - info.n("raft_commit_index")).max(0)
        ));
        let followers: Vec<String> = numbered(info, "raft_follower_")
            .iter()
            .map(|f| {
                format!(
                    "{}:lag {}",
                    f.get("id").copied().unwrap_or("?"),
                    f.get("lag").copied().unwrap_or("?")
                )
            })
            .collect();
        text.push_str(&format!("  followers {}", followers.join(" ")));
    }
    let lagging = numbered(info, "raft_follower_").iter().any(|f| {
        f.get("lag")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|l| l > super::LAGGING_FOLLOWER_ENTRIES)
    });
    let no_leader = matches!(
        info.fields.get("raft_leader_id").map(String::as_str),
        None | Some("-")
    );
    let style = if no_leader || lagging {
        Style::default().fg(Color::Red)
    } else {
        Style::default()
    };
    Line::from(Span::styled(text, style))
}

/// `ledger  sweeper lag 0.0s  feed materializer: lag 0, 3 unacked, oldest 1.2s`: the
/// sweeper's lag and every feed consumer group's (a materializer reads through one).
pub fn ledger_line(info: &Info, sweeper_lag_ms: i64) -> Line<'static> {
    let mut text = format!("ledger  sweeper lag {:.1}s", sweeper_lag_ms as f64 / 1000.0);
    if info.n("feed_enabled") == 0 {
        text.push_str("  feed off");
        return Line::from(text);
    }
    let groups = numbered(info, "feed_group_");
    if groups.is_empty() {
        text.push_str("  feed: no consumer groups");
    }
    let mut late = false;
    for g in &groups {
        let age: f64 = g
            .get("oldest_pending_age_ms")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1000.0;
        late |= age > 60.0;
        text.push_str(&format!(
            "  feed {}: lag {}, {} unacked, oldest {age:.1}s",
            g.get("group").copied().unwrap_or("?"),
            g.get("lag").copied().unwrap_or("?"),
            g.get("pending").copied().unwrap_or("?"),
        ));
    }
    let style = if late || sweeper_lag_ms > 60_000 {
        Style::default().fg(Color::Red)
    } else {
        Style::default()
    };
    Line::from(Span::styled(text, style))
}

/// `denied  malformed 0 0.0/s  ...  bad_signature 3 1.0/s  ...`: the reasons that mean
/// the waiting room and the server disagree on the keys are red while they rise.
fn denials_line(d: &[(Denied, i64, f64)]) -> Line<'static> {
    let mut spans = vec![Span::raw("denied ")];
    for &(why, n, r) in d {
        let outage = matches!(why, Denied::UnknownKey | Denied::BadSignature);
        let style = if outage && r > 0.0 {
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        };
        spans.push(Span::styled(
            format!(" {} {n} {r:.1}/s ", why.reason()),
            style,
        ));
    }
    Line::from(spans)
}

/// A failed connect or poll in an operator's words: what the server wants, then its own
/// reply (or the system's error) for reference.
pub fn plain_error(server: &str, e: &std::io::Error) -> String {
    let text = e.to_string();
    let code = text.split_whitespace().next().unwrap_or("");
    match code {
        "NOAUTH" => format!(
            "the server asks for a password: pass --auth USER PASSWORD (any role may watch; \
             the reserve latency needs an admin) ({text})"
        ),
        "WRONGPASS" => format!(
            "the server refused the user and password of --auth: check both, and that the \
             user is in the server's users file ({text})"
        ),
        "NOPERM" => format!("the user of --auth may not read the server's figures ({text})"),
        _ if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            format!("nothing listens at {server}: is the server running on that port? ({text})")
        }
        _ => format!("cannot poll the server: {text}"),
    }
}

/// One poll: INFO everything and the RESERVE histogram.
fn poll(c: &mut Conn) -> std::io::Result<(Info, Vec<(i64, i64)>)> {
    let text = match c.call(&["INFO", "everything"])? {
        Value::Str(s) => String::from_utf8_lossy(&s).into_owned(),
        Value::Err(e) => return Err(std::io::Error::other(e)),
        _ => String::new(),
    };
    let hist = c.call(&["LATENCY", "HISTOGRAM", "reserve"])?;
    Ok((Info::parse(&text), histogram_of(&hist, "reserve")))
}

/// Runs the view until `q`, Esc or Ctrl-C.
pub fn run(
    server: &str,
    auth: Option<(&str, &str)>,
    tls: Option<&Arc<rustls::ClientConfig>>,
    interval: Duration,
) -> std::io::Result<()> {
    use crossterm::event::{self, Event, KeyCode, KeyModifiers};
    use crossterm::terminal;
    terminal::enable_raw_mode()?;
    let mut out = std::io::stdout();
    crossterm::execute!(out, terminal::EnterAlternateScreen)?;
    let mut term = Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    let r = (|| -> std::io::Result<()> {
        let mut screen = Screen {
            server: server.to_string(),
            ..Screen::default()
        };
        let mut conn: Option<Conn> = None;
        let mut prev: Option<(Info, Histogram, Instant)> = None;
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                next = Instant::now() + interval;
                if conn.is_none() {
                    match Conn::open_tls(server, auth, tls) {
                        Ok(c) => conn = Some(c),
                        Err(e) => screen = Screen::failed(server, plain_error(server, &e)),
                    }
                }
                if let Some(c) = conn.as_mut() {
                    match poll(c) {
                        Ok((info, hist)) => {
                            let now = Instant::now();
                            let p = prev.as_ref().map(|(i, h, t)| ((i, h.as_slice()), now - *t));
                            let dt = p.as_ref().map_or(1.0, |(_, d)| d.as_secs_f64());
                            screen.update(p.map(|(x, _)| x), info.clone(), &hist, dt);
                            screen.status.clear();
                            prev = Some((info, hist, now));
                        }
                        Err(e) => {
                            // The last figures are not the server's state any more.
                            screen = Screen::failed(server, plain_error(server, &e));
                            conn = None;
                        }
                    }
                }
                term.draw(|f| draw(f, &screen))?;
            }
            if event::poll(Duration::from_millis(100))? {
                if let Event::Key(k) = event::read()? {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.code == KeyCode::Char('q') || k.code == KeyCode::Esc || ctrl_c {
                        return Ok(());
                    }
                }
            }
        }
    })();
    terminal::disable_raw_mode()?;
    crossterm::execute!(std::io::stdout(), terminal::LeaveAlternateScreen)?;
    r
}

/// Draws one screen into an in-memory terminal and returns its lines (tests, `--once`).
pub fn render_text(s: &Screen, width: u16, height: u16) -> Vec<String> {
    let backend = ratatui::backend::TestBackend::new(width, height);
    let Ok(mut t) = Terminal::new(backend) else {
        return Vec::new();
    };
    let _ = t.draw(|f| draw(f, s));
    let buf = t.backend().buffer().clone();
    (0..height)
        .map(|y| {
            (0..width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect()
}

/// `stockgate top --once`: two polls `interval` apart, printed as text.
pub fn once(
    server: &str,
    auth: Option<(&str, &str)>,
    tls: Option<&Arc<rustls::ClientConfig>>,
    interval: Duration,
) -> std::io::Result<Vec<String>> {
    let plain = |e: std::io::Error| std::io::Error::new(e.kind(), plain_error(server, &e));
    let mut c = Conn::open_tls(server, auth, tls).map_err(plain)?;
    let (i0, h0) = poll(&mut c).map_err(plain)?;
    let t0 = Instant::now();
    std::thread::sleep(interval);
    let (i1, h1) = poll(&mut c).map_err(plain)?;
    let mut s = Screen {
        server: server.to_string(),
        ..Screen::default()
    };
    s.update(Some((&i0, &h0)), i1, &h1, t0.elapsed().as_secs_f64());
    Ok(render_text(&s, 160, 40))
}
