//! What `node::prepare` takes from outside the data dir: how the Raft log is opened,
//! the ids it draws, and the wall clock. A server's are the system's ([`System`]); the
//! simulation's open the log on its model of the disk and take the ids and the time
//! from its seed, so that the same checks run there on the same files.

use std::path::Path;

use super::identity;
use super::log_store::{LogStore, OpenError};

/// The outside world of a member's start.
pub trait PrepareEnv {
    /// Opens (or creates) the Raft log in `dir`.
    fn open_log(&self, dir: &Path) -> Result<LogStore, OpenError>;
    /// A new storage's incarnation, never 0.
    fn incarnation(&self) -> u64;
    /// The id of the group this member forms, never 0.
    fn group_id(&self) -> u64;
    /// The wall clock in ms: it names the WAL `--rejoin-empty` sets aside.
    fn now_ms(&self) -> u64;
    /// Tells the operator what the start did on its own (a snapshot taken up, a WAL set
    /// aside), in a line of its own.
    fn notice(&self, line: &str);
}

/// A server's: the log with its writer thread, random ids, the system's clock.
pub struct System;

impl PrepareEnv for System {
    fn open_log(&self, dir: &Path) -> Result<LogStore, OpenError> {
        LogStore::open(dir)
    }

    fn incarnation(&self) -> u64 {
        identity::random_id()
    }

    fn group_id(&self) -> u64 {
        identity::random_id()
    }

    fn now_ms(&self) -> u64 {
        crate::feed::groups::now_ms()
    }

    fn notice(&self, line: &str) {
        eprintln!("stockgate: {line}");
    }
}
