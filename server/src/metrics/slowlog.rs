//! The slow log: a bounded ring of the commands that took at least
//! `--slowlog-log-slower-than` µs. It holds what `SLOWLOG GET` lists as plain data; the
//! reply is built by the command (`cmd::introspect`), so the metrics store stays free of the
//! wire protocol.

use std::collections::VecDeque;

/// Redis's `SLOWLOG_ENTRY_MAX_ARGC` and `SLOWLOG_ENTRY_MAX_STRING`.
const MAX_ARGC: usize = 32;
const MAX_STRING: usize = 128;

/// One slow command, as `SLOWLOG GET` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowEntry {
    /// Increasing id, unique over the server's life (`SLOWLOG RESET` does not restart it).
    pub id: u64,
    /// When the command ran, in seconds since the Unix epoch.
    pub unix_secs: u64,
    /// How long it took, in µs.
    pub micros: u64,
    /// Its arguments, at most 32 and each cut to 128 bytes as Redis does, credentials replaced.
    pub argv: Vec<Vec<u8>>,
    /// The client's address (`ip:port`).
    pub addr: String,
    /// The client's name (`CLIENT SETNAME`), empty when unset.
    pub name: String,
}

/// The ring of slow commands, newest first, at most `max_len` entries (`slowlog-max-len`).
pub struct SlowLog {
    entries: VecDeque<SlowEntry>,
    max_len: usize,
    next_id: u64,
}

/// Arguments that are credentials are not kept: passwords (`AUTH`, `HELLO ... AUTH`,
/// every rule of `ACL SETUSER`, as Redis does: `>password`, `#hash`) and the admission
/// token of `RESERVE` (a bearer token while it is valid).
fn redacted(cmd: &str, i: usize, argv: &[&[u8]]) -> bool {
    match cmd {
        "auth" => i >= 1,
        "hello" => argv.iter().take(i).any(|a| a.eq_ignore_ascii_case(b"AUTH")),
        "reserve" => i == 3,
        "acl" => {
            i >= 3
                && argv
                    .get(1)
                    .is_some_and(|s| s.eq_ignore_ascii_case(b"SETUSER"))
        }
        _ => false,
    }
}

impl SlowLog {
    /// An empty slow log keeping at most `max_len` entries.
    pub fn new(max_len: usize) -> Self {
        SlowLog {
            entries: VecDeque::new(),
            max_len,
            next_id: 0,
        }
    }

    /// Changes the bound (`CONFIG SET slowlog-max-len`), dropping the oldest entries beyond it.
    pub fn set_max_len(&mut self, n: usize) {
        self.max_len = n;
        self.entries.truncate(n);
    }

    /// The most entries kept.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// How many entries are held (`SLOWLOG LEN`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops every entry (`SLOWLOG RESET`).
    pub fn reset(&mut self) {
        self.entries.clear();
    }

    /// Records one command that took `micros` µs, from the client at `addr` named `name`;
    /// credentials in `argv` are not kept.
    pub fn push(&mut self, cmd: &str, argv: &[&[u8]], micros: u64, addr: &str, name: &str) {
        if self.max_len == 0 {
            return;
        }
        let n = argv.len().min(MAX_ARGC);
        let mut args = Vec::with_capacity(n);
        for (i, a) in argv.iter().take(n).enumerate() {
            if n != argv.len() && i == n - 1 {
                args.push(format!("... ({} more arguments)", argv.len() - n + 1).into_bytes());
            } else if redacted(cmd, i, argv) {
                args.push(b"(redacted)".to_vec());
            } else if a.len() > MAX_STRING {
                let mut s = a[..MAX_STRING].to_vec();
                s.extend_from_slice(
                    format!("... ({} more bytes)", a.len() - MAX_STRING).as_bytes(),
                );
                args.push(s);
            } else {
                args.push(a.to_vec());
            }
        }
        let unix_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.entries.push_front(SlowEntry {
            id: self.next_id,
            unix_secs,
            micros,
            argv: args,
            addr: addr.to_string(),
            name: name.to_string(),
        });
        self.next_id += 1;
        self.entries.truncate(self.max_len);
    }

    /// Newest first, at most `count`.
    pub fn get(&self, count: usize) -> Vec<SlowEntry> {
        self.entries.iter().take(count).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_setuser_rules_are_not_kept() {
        let mut log = SlowLog::new(4);
        let argv: [&[u8]; 5] = [b"ACL", b"setuser", b"bob", b">hunter2", b"+@checkout"];
        log.push("acl", &argv, 1, "127.0.0.1:1", "");
        let args = &log.get(1)[0].argv;
        assert_eq!(
            args[..3],
            [b"ACL".to_vec(), b"setuser".to_vec(), b"bob".to_vec()]
        );
        assert!(args[3..].iter().all(|a| a == b"(redacted)"), "{args:?}");
        log.push("acl", &[b"ACL", b"LIST"], 1, "127.0.0.1:1", "");
        assert_eq!(log.get(1)[0].argv[1], b"LIST".to_vec());
    }
}
