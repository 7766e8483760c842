//! The state every connection shares ([`Shared`]), built with its parts in place: the
//! engine, the order feed, the slot map with its log, the TLS certificate, the users.

use std::path::PathBuf;
use std::sync::Arc;

use super::config::Config;
use super::recover::Recovered;
use super::tls::TlsPort;
use super::{cluster, feed, raft, single};
use crate::cluster::Cluster;
use crate::session::{Shared, SharedParts};
use crate::users::UserDb;

/// The users of `--users-file` and `--requirepass`, which ACL LOAD reads again; `None`
/// when there are none (open mode).
pub(super) fn users(c: &Config) -> Result<Option<UserDb>, String> {
    let db = UserDb::from_source(c.users.clone()).map_err(|e| e.to_string())?;
    Ok((!db.snapshot().is_empty()).then_some(db))
}

/// The shared state of the server `c` describes, over the recovered engine: the feed
/// opened on its log, the slot map's logged changes replayed, a single node's snapshot
/// checkpoints installed.
pub(super) fn build(
    c: &Config,
    users: Option<UserDb>,
    r: &Recovered,
    cluster: Option<Cluster>,
    tls: Option<&TlsPort>,
    secret_file: PathBuf,
) -> Result<Arc<Shared>, String> {
    let config_file = match &c.config_file {
        Some(p) => Some(std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    let feed = feed::open(r);
    let cluster = cluster.map(Arc::new);
    if let Some(cl) = &cluster {
        cluster::install_slot_log(cl, r, &feed);
    }
    if r.speculation.is_none() {
        single::checkpoint_hooks(r, &feed, cluster.as_ref());
    }
    let parts = SharedParts {
        engine: Some(r.engine.clone()),
        feed: Some(feed),
        tls: tls.map(|t| t.tls.clone()),
        cluster,
        secret_file: Some(secret_file),
        config_file,
        flags: c.flags.clone(),
    };
    let shared = Shared::with_parts(c.server_config(), users, raft::durability(r), parts);
    let m = &c.metrics;
    shared
        .metrics
        .configure(m.slowlog_log_slower_than, m.slowlog_max_len, m.max_sales);
    Ok(Arc::new(shared))
}
