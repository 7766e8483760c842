//! Cluster mode's assembly: the slot map loaded, the `ROLE` probes' login, the links to
//! the other nodes over TLS or not, and the slot map's logged changes replayed.

use std::sync::Arc;

use super::config::Config;
use super::recover::Recovered;
use super::tls::TlsPort;
use crate::cluster::{Cluster, ProbeAuth};
use crate::feed::Feed;

/// The slot map and this node's place in it, when cluster mode is on.
pub(super) fn load(c: &Config) -> Result<Option<Cluster>, String> {
    let s = &c.cluster;
    match (s.enabled, &s.config) {
        (true, Some(path)) => {
            let auth = probe_auth(c)?;
            Cluster::load(
                &path.display().to_string(),
                s.node.as_deref(),
                c.client_port(),
            )
            .map(|c| Some(c.with_probe_auth(auth)))
            .map_err(|e| e.to_string())
        }
        (true, None) => Err(
            "--cluster-enabled yes needs --cluster-config FILE (the slot map, docs/cluster.md)"
                .into(),
        ),
        (false, Some(_)) => Err("--cluster-config is only read with --cluster-enabled yes".into()),
        _ if s.user.is_some() || s.password_file.is_some() => Err(
            "--cluster-user and --cluster-password-file are only read with --cluster-enabled yes"
                .into(),
        ),
        _ => Ok(None),
    }
}

/// The login of the `ROLE` probes to other groups: `--cluster-password-file`'s first
/// line, as `--cluster-user` (or the default user).
fn probe_auth(c: &Config) -> Result<Option<ProbeAuth>, String> {
    let s = &c.cluster;
    let Some(path) = &s.password_file else {
        return match s.user {
            Some(_) => Err("--cluster-user needs --cluster-password-file FILE (its first line is the password)".into()),
            None => Ok(None),
        };
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read --cluster-password-file {}: {e}",
            path.display()
        )
    })?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        return Err(format!(
            "--cluster-password-file {}: the first line must hold the password",
            path.display()
        ));
    }
    Ok(Some(ProbeAuth::new(s.user.as_deref(), password)))
}

/// `--tls-cluster yes`: the links to the cluster's other nodes (`ROLE` probes,
/// `SALE.MIGRATE`) over TLS with the loaded files.
pub(super) fn with_tls(
    c: &Config,
    tls: Option<&TlsPort>,
    cluster: Option<Cluster>,
) -> Result<Option<Cluster>, String> {
    let on = c.tls.cluster_tls()?;
    let Some(cluster) = cluster else {
        return match on {
            true => Err("--tls-cluster yes needs --cluster-enabled yes (it secures the links between the cluster's nodes)".into()),
            false => Ok(None),
        };
    };
    if !on {
        if c.tls_only() {
            tracing::warn!("this node serves TLS only and --tls-cluster is no: it calls the other nodes of the cluster over plain TCP, which nodes serving TLS only refuse (docs/cluster.md, \"TLS between nodes\")");
        }
        return Ok(Some(cluster));
    }
    Ok(Some(cluster.with_peer_tls(tls.map(|t| t.tls.clone()))))
}

/// The slot map's logged changes (`CLUSTER SETSLOT`): replayed from recovery, and
/// applied as a Raft member takes them from its leader. A single node's snapshots
/// re-log them (`single::checkpoint_hooks`).
pub(super) fn install_slot_log(c: &Arc<Cluster>, r: &Recovered, feed: &Feed) {
    // A Raft member's snapshot carries the changes it covers in its state file; the
    // records after the snapshot follow.
    for (kind, body) in feed.state_file_records(r.report.snapshot_lsn).0 {
        c.apply_record(kind, &body);
    }
    for (_, kind, body) in &r.report.opaque {
        c.apply_record(*kind, body);
    }
    let replay = c.clone();
    r.durability
        .add_replay_hook(Box::new(move |_lsn, kind, body| {
            replay.apply_record(kind, body)
        }));
}
