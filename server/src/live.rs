//! The connection limits `CONFIG SET` changes while the server runs. Each is an atomic the
//! network layer and the commands load where they apply the limit (a relaxed load: a new
//! value reaches a connection at its next batch, not mid-command). The slow log's
//! settings live beside the slow log (`metrics`), the retention in the engine and the log
//! filter in `metrics::logging`; `cmd::config` lists every live setting.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::session::ServerConfig;

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
    /// The values the server starts with.
    pub fn new(c: &ServerConfig) -> LiveSettings {
        LiveSettings {
            max_clients: AtomicUsize::new(c.max_clients),
            max_query_buffer: AtomicUsize::new(c.max_query_buffer),
            max_output_buffer: AtomicUsize::new(c.max_output_buffer),
            idle_timeout_ms: AtomicU64::new(c.idle_timeout_ms),
            write_timeout_ms: AtomicU64::new(c.write_timeout_ms),
            changed: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    pub fn max_clients(&self) -> usize {
        self.max_clients.load(Ordering::Relaxed)
    }

    pub fn max_query_buffer(&self) -> usize {
        self.max_query_buffer.load(Ordering::Relaxed)
    }

    pub fn max_output_buffer(&self) -> usize {
        self.max_output_buffer.load(Ordering::Relaxed)
    }

    pub fn idle_timeout_ms(&self) -> u64 {
        self.idle_timeout_ms.load(Ordering::Relaxed)
    }

    pub fn write_timeout_ms(&self) -> u64 {
        self.write_timeout_ms.load(Ordering::Relaxed)
    }
}
