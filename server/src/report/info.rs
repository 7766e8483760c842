//! `INFO [section ...]` in Redis 7's text format: the same section names, the same field
//! names where Redis has the field, `default`/`all`/`everything` as Redis, plus
//! stockgate's `sales` section.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::view;
use crate::engine::Engine;
use crate::metrics::{sys, CmdStats, SaleEvent};
use crate::session::Shared;

/// Sections in Redis's order (`sales` before `keyspace`, as a module section would be).
const ALL: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "commandstats",
    "errorstats",
    "latencystats",
    "cluster",
    "sales",
    "feed",
    "keyspace",
];
/// Redis's default set (everything but commandstats and latencystats) plus `sales`.
const DEFAULT: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "errorstats",
    "cluster",
    "sales",
    "feed",
    "keyspace",
];
/// Lines per sale in INFO are bounded: a server with very many sales stays readable.
const MAX_SALE_LINES: usize = 1000;

/// Which sections a list of INFO arguments asks for.
pub fn wanted(args: &[String]) -> Vec<&'static str> {
    if args.is_empty() {
        return DEFAULT.to_vec();
    }
    let mut want: Vec<&'static str> = Vec::new();
    for a in args {
        let a = a.to_ascii_lowercase();
        match a.as_str() {
            "all" | "everything" => return ALL.to_vec(),
            "default" => want.extend_from_slice(DEFAULT),
            // The section's name before it was `sales`.
            "stockgate" => want.push("sales"),
            s => {
                if let Some(n) = ALL.iter().find(|n| **n == s) {
                    want.push(n);
                }
            }
        }
    }
    // Redis prints sections in its own order, whatever the order asked.
    ALL.iter().copied().filter(|s| want.contains(s)).collect()
}

/// Percentiles of latencystats (Redis's default `latency-tracking-info-percentiles`).
const PERCENTILES: [(&str, f64); 3] = [("50", 50.0), ("99", 99.0), ("99.9", 99.9)];

/// Renders the `INFO` reply: the sections named in `args` (Redis's section names, `all`,
/// `everything`, `default` or none), in Redis's section order, as `key:value` lines.
pub fn render(engine: &Engine, shared: &Shared, args: &[String]) -> String {
    let sections = wanted(args);
    let mut o = String::new();
    // Merged once: commandstats, latencystats and stats all use it.
    let cmds: Option<Vec<CmdStats>> = sections
        .iter()
        .any(|s| *s == "commandstats" || *s == "latencystats")
        .then(|| shared.metrics.commands());
    let errors = shared.metrics.errors();
    for (i, s) in sections.iter().enumerate() {
        if i > 0 {
            o.push_str("\r\n");
        }
        match *s {
            "server" => {
                server(&mut o, shared);
                history(&mut o, engine, shared);
            }
            "clients" => clients(&mut o, shared),
            "memory" => memory(&mut o, engine, shared),
            "persistence" => persistence(&mut o, shared),
            "stats" => stats(&mut o, shared, errors.1),
            "replication" => replication(&mut o, shared),
            "cpu" => cpu(&mut o),
            "cluster" => cluster(&mut o, shared),
            "commandstats" => commandstats(&mut o, cmds.iter().flatten()),
            "errorstats" => errorstats(&mut o, &errors.0),
            "latencystats" => latencystats(&mut o, cmds.iter().flatten()),
            "sales" => sales(&mut o, engine, shared),
            "feed" => feed(&mut o, shared),
            "keyspace" => keyspace(&mut o, engine),
            _ => {}
        }
    }
    o
}

fn commandstats<'a>(o: &mut String, cmds: impl Iterator<Item = &'a CmdStats>) {
    o.push_str("# Commandstats\r\n");
    for c in cmds {
        if c.calls > 0 || c.rejected > 0 || c.failed > 0 {
            let _ = write!(
                o,
                "cmdstat_{}:calls={},usec={},usec_per_call={:.2},rejected_calls={},failed_calls={}\r\n",
                safe(c.name),
                c.calls,
                c.usec(),
                c.usec_per_call(),
                c.rejected,
                c.failed
            );
        }
    }
}

fn errorstats(o: &mut String, errors: &[(String, u64)]) {
    o.push_str("# Errorstats\r\n");
    for (code, n) in errors {
        let _ = write!(o, "errorstat_{}:count={n}\r\n", safe(code));
    }
}

fn latencystats<'a>(o: &mut String, cmds: impl Iterator<Item = &'a CmdStats>) {
    o.push_str("# Latencystats\r\n");
    for c in cmds {
        let Some(h) = c.hist.as_ref().filter(|h| !h.is_empty()) else {
            continue;
        };
        let _ = write!(o, "latency_percentiles_usec_{}:", safe(c.name));
        for (j, (label, p)) in PERCENTILES.iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            let _ = write!(
                o,
                "p{label}={:.3}",
                h.value_at_percentile(*p) as f64 / 1000.0
            );
        }
        o.push_str("\r\n");
    }
}

fn keyspace(o: &mut String, engine: &Engine) {
    o.push_str("# Keyspace\r\n");
    let n = engine.reservation_count();
    if n > 0 {
        // Every reservation expires (TTL) or is purged (retention).
        let _ = write!(o, "db0:keys={n},expires={n},avg_ttl=0\r\n");
    }
}

/// Redis's `getSafeInfoString`: no `#`, `:`, CR or LF inside a field name.
pub fn safe(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '#' | ':' | '\r' | '\n' => '_',
            c => c,
        })
        .collect()
}

fn server(o: &mut String, sh: &Shared) {
    let uptime = sh.started.elapsed().as_secs();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let _ = write!(
        o,
        "# Server\r\nredis_version:7.0.0\r\nstockgate_version:{}\r\nredis_git_sha1:00000000\r\nredis_git_dirty:0\r\nredis_build_id:0\r\nredis_mode:standalone\r\nos:{} {}\r\narch_bits:64\r\nmonotonic_clock:POSIX clock_gettime\r\nmultiplexing_api:epoll\r\natomicvar_api:c11-builtin\r\ngcc_version:0.0.0\r\nprocess_id:{}\r\nprocess_supervised:no\r\nrun_id:{}\r\ntcp_port:{}\r\nserver_time_usec:{now_us}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\nhz:{}\r\nconfigured_hz:{}\r\nlru_clock:0\r\nexecutable:{}\r\nconfig_file:\r\nio_threads_active:0\r\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        std::process::id(),
        sh.metrics.run_id,
        sh.local_port.load(Ordering::Relaxed),
        uptime / 86400,
        1000 / sh.config.tick_ms.max(1),
        1000 / sh.config.tick_ms.max(1),
        safe(&exe),
    );
}

fn clients(o: &mut String, sh: &Shared) {
    let _ = write!(
        o,
        "# Clients\r\nconnected_clients:{}\r\ncluster_connections:0\r\nmaxclients:{}\r\nclient_recent_max_input_buffer:0\r\nclient_recent_max_output_buffer:0\r\nblocked_clients:0\r\ntracking_clients:0\r\nclients_in_timeout_table:0\r\n",
        sh.stats.connected.load(Ordering::Relaxed),
        sh.live.max_clients()
    );
}

/// `stockgate_history`: the id of the history this server's state belongs to, which the
/// tools that write to a ledger compare with the one the ledger is bound to. Empty until
/// the record that began it is durable (a Raft leader's is committed): a tool never binds
/// a ledger to a history a failover could still undo.
fn history(o: &mut String, engine: &Engine, sh: &Shared) {
    let durable = sh.feed.get().map_or(0, |f| f.durable_lsn());
    let id = match engine.history() {
        Some((id, lsn)) if lsn <= durable => id,
        _ => "".into(),
    };
    let _ = write!(o, "stockgate_history:{id}\r\n");
}

fn memory(o: &mut String, engine: &Engine, sh: &Shared) {
    let used = sys::allocated_bytes();
    let rss = sys::rss_bytes();
    let peak = sh
        .metrics
        .peak_memory
        .fetch_max(used, Ordering::Relaxed)
        .max(used);
    let total = sys::total_system_memory();
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let _ = write!(
        o,
        "# Memory\r\nused_memory:{used}\r\nused_memory_human:{}\r\nused_memory_rss:{rss}\r\nused_memory_rss_human:{}\r\nused_memory_peak:{peak}\r\nused_memory_peak_human:{}\r\nused_memory_peak_perc:{:.2}%\r\nused_memory_dataset:{used}\r\nallocator_allocated:{used}\r\nallocator_resident:{rss}\r\ntotal_system_memory:{total}\r\ntotal_system_memory_human:{}\r\nused_memory_lua:0\r\nused_memory_vm_eval:0\r\nused_memory_scripts:0\r\nnumber_of_cached_scripts:0\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\nmaxmemory_policy:noeviction\r\nmem_fragmentation_ratio:{:.2}\r\nmem_fragmentation_bytes:{}\r\nmem_allocator:{}\r\nreservations:{}\r\n",
        sys::human(used),
        sys::human(rss),
        sys::human(peak),
        ratio(used, peak) * 100.0,
        sys::human(total),
        ratio(rss, used),
        rss as i64 - used as i64,
        sys::allocator_name(),
        engine.reservation_count(),
    );
}

fn persistence(o: &mut String, sh: &Shared) {
    let fields = view::persistence_fields(sh);
    let since = view::persistence_u64(&fields, "wal_records_since_snapshot");
    let _ = write!(
        o,
        "# Persistence\r\nloading:0\r\nasync_loading:0\r\nrdb_changes_since_last_save:{since}\r\nrdb_bgsave_in_progress:0\r\naof_rewrite_in_progress:0\r\n"
    );
    for (k, v) in &fields {
        let _ = write!(o, "{k}:{v}\r\n");
    }
    if fields.iter().any(|(k, _)| k == "wal_last_lsn") {
        // Records handed to the log and not yet acknowledged under the fsync policy.
        let pending = view::persistence_u64(&fields, "wal_last_lsn")
            .saturating_sub(view::persistence_u64(&fields, "wal_durable_lsn"));
        let _ = write!(o, "wal_pending_records:{pending}\r\n");
    }
}

fn stats(o: &mut String, sh: &Shared, error_replies: u64) {
    let stats = view::server_stats(sh);
    let get = |k: &str| stats.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
    let ops = {
        let h = sh.metrics.history.lock();
        let n = h.len();
        if n >= 2 {
            let (a, b) = (h[n - 2], h[n - 1]);
            let dt = b.unix_ms.saturating_sub(a.unix_ms).max(1);
            b.commands.saturating_sub(a.commands) * 1000 / dt
        } else {
            0
        }
    };
    let _ = write!(
        o,
        "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\ninstantaneous_ops_per_sec:{ops}\r\nrejected_connections:{}\r\nexpired_keys:0\r\nevicted_keys:0\r\nevicted_clients:0\r\nkeyspace_hits:0\r\nkeyspace_misses:0\r\npubsub_channels:0\r\npubsub_patterns:0\r\nlatest_fork_usec:0\r\ntotal_forks:0\r\nunexpected_error_replies:0\r\ntotal_error_replies:{error_replies}\r\n",
        get("total_connections_received"),
        get("total_commands_processed"),
        get("rejected_connections"),
    );
    for (k, v) in stats.iter().skip(3) {
        let _ = write!(o, "{k}:{v}\r\n");
    }
    let _ = write!(o, "slowlog_len:{}\r\n", sh.metrics.slowlog.lock().len());
    if let Some(tls) = sh.tls.get() {
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let _ = write!(
            o,
            "tls_connections_received:{}\r\ntls_connected_clients:{}\r\ntls_handshake_failures:{}\r\ntls_cert_reloads:{}\r\ntls_cert_reload_failures:{}\r\n",
            n(&sh.stats.tls_connections),
            n(&sh.stats.tls_connected),
            n(&sh.stats.tls_handshake_failures),
            n(&tls.reloads),
            n(&tls.reload_failures),
        );
    }
}

/// `# Cluster`: Redis's `cluster_enabled`, and in cluster mode the redirections sent.
/// `cluster_tryagain` counts every `-TRYAGAIN` reply, whichever path refused the write
/// (a migrating slot's routing, or a command reaching a sale frozen for its handover):
/// the error replies' own count (errorstats), so no path can forget it.
fn cluster(o: &mut String, sh: &Shared) {
    match sh.cluster.get() {
        None => o.push_str("# Cluster\r\ncluster_enabled:0\r\n"),
        Some(c) => {
            let (errors, _) = sh.metrics.errors();
            let tryagain = errors
                .iter()
                .find(|(code, _)| code == "TRYAGAIN")
                .map_or(0, |(_, n)| *n);
            let _ = write!(
                o,
                "# Cluster\r\ncluster_enabled:1\r\ncluster_redirections_moved:{}\r\ncluster_redirections_ask:{}\r\ncluster_tryagain:{}\r\ncluster_crossslot_refusals:{}\r\n",
                c.moved.load(Ordering::Relaxed),
                c.ask.load(Ordering::Relaxed),
                tryagain,
                c.crossslot.load(Ordering::Relaxed)
            );
        }
    }
}

fn replication(o: &mut String, sh: &Shared) {
    if let Some(r) = sh.repl.get() {
        o.push_str(&super::replication::section(&r.info()));
        return;
    }
    let _ = write!(
        o,
        "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:0\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:0\r\nrepl_backlog_size:0\r\nrepl_backlog_first_byte_offset:0\r\nrepl_backlog_histlen:0\r\n",
        sh.metrics.run_id
    );
}

fn cpu(o: &mut String) {
    let (u, s) = sys::cpu_times(libc::RUSAGE_SELF);
    let (cu, cs) = sys::cpu_times(libc::RUSAGE_CHILDREN);
    let _ = write!(
        o,
        "# CPU\r\nused_cpu_sys:{s:.6}\r\nused_cpu_user:{u:.6}\r\nused_cpu_sys_children:{cs:.6}\r\nused_cpu_user_children:{cu:.6}\r\n"
    );
}

/// The order feed: where the readable log starts and ends, and every consumer group's
/// position, pending entries and lag (entries between its last-delivered id and the
/// log's end; for a sale's stream the records of all sales there, an upper bound).
fn feed(o: &mut String, sh: &Shared) {
    o.push_str("# Feed\r\n");
    let Some(f) = sh.feed.get() else {
        o.push_str("feed_enabled:0\r\n");
        return;
    };
    // Readable: durable (a member's WAL holds committed records only).
    let (first, readable) = (f.first_lsn(), f.readable_lsn());
    let groups = f.groups.summaries(readable, first);
    let _ = write!(
        o,
        "feed_enabled:1\r\nfeed_first_lsn:{first}\r\nfeed_durable_lsn:{}\r\nfeed_readable_lsn:{readable}\r\nfeed_blocked_clients:{}\r\nfeed_groups:{}\r\n",
        f.durable_lsn(),
        f.blocked_clients(),
        groups.len()
    );
    for (i, g) in groups.iter().take(MAX_SALE_LINES).enumerate() {
        let _ = write!(
            o,
            "feed_group_{i}:stream={},group={},consumers={},pending={},last_delivered_id={}-0,lag={},trimmed={},oldest_pending_age_ms={}\r\n",
            safe(&g.stream).replace(',', "_"),
            safe(&g.group).replace([',', '='], "_"),
            g.consumers,
            g.pending,
            g.last,
            g.lag,
            u8::from(g.trimmed),
            g.oldest_pending_ms,
        );
    }
}

fn sales(o: &mut String, engine: &Engine, sh: &Shared) {
    let n = engine.list_sales().len();
    let _ = write!(
        o,
        "# Sales\r\nsales:{n}\r\nreservations:{}\r\nkey_fingerprint:{}\r\nauto_release:{}\r\n",
        engine.reservation_count(),
        engine.key_fingerprint(),
        engine.config().auto_release as u8
    );
    // Every reason, zeros included: an alert on `denied_bad_signature` needs the field
    // before the first bad signature.
    for (why, n) in sh.metrics.denials() {
        let _ = write!(o, "denied_{}:{n}\r\n", why.reason());
    }
    for r in view::sales(engine, sh, MAX_SALE_LINES) {
        let _ = write!(
            o,
            "sale_{}:sku={},state={},total={},available={},reserved={},committed={},reserve_reserved={},reserve_replay={},reserve_soldout={},reserve_limit={},reserve_denied={},reserve_paused={},reserve_fenced={},releases={},commits={},expired_pending={},expired_pending_units={},oldest_expired_age_ms={}\r\n",
            safe(&r.sku),
            r.sku,
            r.state,
            r.total,
            r.available,
            r.reserved,
            r.committed,
            r.get(SaleEvent::Reserved),
            r.get(SaleEvent::Replay),
            r.get(SaleEvent::SoldOut),
            r.get(SaleEvent::Limit),
            r.get(SaleEvent::Denied),
            r.get(SaleEvent::Paused),
            r.get(SaleEvent::Fenced),
            r.get(SaleEvent::Release),
            r.get(SaleEvent::Commit),
            r.expired,
            r.expired_units,
            r.oldest_expired_age_ms,
        );
    }
}
