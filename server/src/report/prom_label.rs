//! Label values in the Prometheus text format, escaped as the format requires; shared by
//! the server's families (`prom`) and the Raft group's (`prom_raft`).

/// Escapes a label value (backslash, quote, newline).
pub fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}
