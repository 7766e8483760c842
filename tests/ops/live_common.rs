//! What the live-count tests (the event stream, the RESP channels, the status page) share:
//! a command by its words, a pipeline of reservations, buyers' names, a process's memory,
//! a waiting-room ticket.

use crate::common::Server;

/// Runs `args` (the command and its arguments) and gives its reply.
pub fn q(c: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")))
}

/// RESERVE one unit for each of `users` in one pipeline.
pub fn reserve_all(s: &Server, c: &mut redis::Connection, sku: &str, users: &[String]) {
    let keys = s.keyring();
    let exp = crate::common::now_ms() + 600_000;
    let mut p = redis::pipe();
    for u in users {
        p.cmd("RESERVE")
            .arg(sku)
            .arg(u)
            .arg(keys.mint(sku, u, exp))
            .arg("r");
    }
    let out: Vec<redis::Value> = p.query(c).expect("pipeline");
    for v in &out {
        let text = format!("{v:?}");
        assert!(text.contains("RESERVED"), "{text}");
    }
}

/// Buyers `u<from>` to `u<from + n - 1>`.
pub fn users(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("u{i}")).collect()
}

/// The resident memory of process `pid`, in KiB.
pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The ticket `ROOM.JOIN sku user` answers.
pub fn join(c: &mut redis::Connection, sku: &str, user: &str) -> String {
    let redis::Value::Array(joined) = q(c, &["ROOM.JOIN", sku, user]) else {
        panic!("ROOM.JOIN answers an array");
    };
    crate::common::as_str(&joined[0])
}
