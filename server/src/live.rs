//! The connection limits `CONFIG SET` changes while the server runs. Each is an atomic the
//! network layer and the commands load where they apply the limit (a relaxed load: a new
//! value reaches a connection at its next batch, not mid-command). The slow log's
//! settings live beside the slow log (`metrics`), the retention in the engine and the log
//! filter in `metrics::logging`; `cmd::config` lists every live setting.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The start values of the connection limits [`LiveSettings`] keeps.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `--maxclients`.
    pub max_clients: usize,
    /// `--max-query-buffer`, bytes.
    pub max_query_buffer: usize,
    /// `--max-output-buffer`, bytes.
    pub max_output_buffer: usize,
    /// `--idle-timeout-ms`; 0 = never.
    pub idle_timeout_ms: u64,
    /// `--write-timeout-ms`.
    pub write_timeout_ms: u64,
}

/// The settings `CONFIG SET` may change, read where each limit is applied.
pub struct LiveSettings {
    /// `maxclients`: more connections are refused at accept.
    pub max_clients: AtomicUsize,
    /// `--max-query-buffer` (`client-query-buffer-limit`).
    pub max_query_buffer: AtomicUsize,
    /// `--max-output-buffer` (`client-output-buffer-limit`).
    pub max_output_buffer: AtomicUsize,
    /// `--idle-timeout-ms` (`timeout`, in seconds, as Redis); 0 = never.
    pub idle_timeout_ms: AtomicU64,
    /// `--write-timeout-ms`.
    pub write_timeout_ms: AtomicU64,
    /// The flags of the settings `CONFIG SET` changed (`CONFIG REWRITE` writes them).
    pub changed: parking_lot::Mutex<std::collections::BTreeSet<&'static str>>,
}

impl LiveSettings {
    /// The values the server starts with (`ServerConfig`'s).
    pub fn new(start: Limits) -> LiveSettings {
        LiveSettings {
            max_clients: AtomicUsize::new(start.max_clients),
            max_query_buffer: AtomicUsize::new(start.max_query_buffer),
            max_output_buffer: AtomicUsize::new(start.max_output_buffer),
            idle_timeout_ms: AtomicU64::new(start.idle_timeout_ms),
            write_timeout_ms: AtomicU64::new(start.write_timeout_ms),
            changed: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// Connections beyond this are refused at accept.
    pub fn max_clients(&self) -> usize {
        self.max_clients.load(Ordering::Relaxed)
    }

    /// Bytes a connection may have unparsed before it is closed.
    pub fn max_query_buffer(&self) -> usize {
        self.max_query_buffer.load(Ordering::Relaxed)
    }

    /// Bytes of replies a connection may leave unread before it is closed.
    pub fn max_output_buffer(&self) -> usize {
        self.max_output_buffer.load(Ordering::Relaxed)
    }

    /// Milliseconds a connection may send nothing before it is closed; 0 = never.
    pub fn idle_timeout_ms(&self) -> u64 {
        self.idle_timeout_ms.load(Ordering::Relaxed)
    }

    /// Milliseconds a reply may wait for the client to read it before it is closed.
    pub fn write_timeout_ms(&self) -> u64 {
        self.write_timeout_ms.load(Ordering::Relaxed)
    }
}
