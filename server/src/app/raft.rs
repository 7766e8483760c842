//! A Raft group member's assembly: its settings checked, its storage prepared before
//! recovery, the durability its replies wait on (the group's commit), and the member
//! started once the client port is bound.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::config::Config;
use super::recover::Recovered;
use super::tls::TlsPort;
use crate::raft::node::{Prepared, RaftDurability};
use crate::raft::speculation::Speculation;
use crate::raft::{self, RaftNode, RaftNodeConfig};
use crate::session::{Durability, Shared};

/// A member whose storage is prepared, to be started on the runtime.
pub(super) struct Member {
    cfg: RaftNodeConfig,
    prepared: Prepared,
}

/// The member `--raft-id` asks for, its links over TLS with `--tls-replication yes`,
/// its Raft storage opened and checked against its id.
pub(super) fn prepare(c: &Config, tls: Option<&TlsPort>) -> Result<Option<Member>, String> {
    let mut cfg = member_config(c)?;
    link_tls(c, tls, cfg.as_mut())?;
    let Some(cfg) = cfg else {
        return Ok(None);
    };
    let prepared = raft::node::prepare(&c.data_dir, &cfg)?;
    Ok(Some(Member { cfg, prepared }))
}

/// The Raft member settings, when `--raft-id` is given (checked here, in words).
fn member_config(c: &Config) -> Result<Option<RaftNodeConfig>, String> {
    let Some(s) = &c.raft else {
        return Ok(None);
    };
    if s.id == 0 {
        return Err("--raft-id: node ids start at 1".into());
    }
    let listen = s
        .listen
        .clone()
        .ok_or("--raft-id needs --raft-listen HOST:PORT (where the peers reach this member)")?;
    let mut bootstrap = BTreeMap::new();
    for p in &s.peers {
        let (pid, info) = raft::parse_peer(p)?;
        if bootstrap.insert(pid, info).is_some() {
            return Err(format!("--raft-peers lists node {pid} twice"));
        }
    }
    let mut routes = HashMap::new();
    for r in &s.routes {
        let (rid, addr) = r
            .split_once('=')
            .and_then(|(i, addr)| Some((i.parse::<u64>().ok()?, addr.to_owned())))
            .ok_or_else(|| format!("--raft-route {r}: expected ID=HOST:PORT"))?;
        routes.insert(rid, addr);
    }
    if s.heartbeat_ms == 0 || s.election_min_ms <= s.heartbeat_ms {
        return Err(
            "--raft-election-min-ms must be larger than --raft-heartbeat-ms (and both above 0)"
                .into(),
        );
    }
    if s.election_max_ms <= s.election_min_ms {
        return Err("--raft-election-max-ms must be larger than --raft-election-min-ms".into());
    }
    Ok(Some(RaftNodeConfig {
        id: s.id,
        listen,
        bootstrap,
        form_group: s.bootstrap,
        routes,
        group_name: s.group_name.clone(),
        heartbeat_ms: s.heartbeat_ms,
        election_min_ms: s.election_min_ms,
        election_max_ms: s.election_max_ms,
        rejoin_empty: s.rejoin_empty,
        restart_argv: s.restart_argv.clone(),
        data_dir: c.data_dir.clone(),
        snapshot_records: c.wal.snapshot_records.max(1),
        tls: None,
        history_id: None,
    }))
}

/// `--tls-replication yes`: the Raft member's links over TLS with the loaded files.
fn link_tls(
    c: &Config,
    tls: Option<&TlsPort>,
    member: Option<&mut RaftNodeConfig>,
) -> Result<(), String> {
    if !c.tls.replication_tls()? {
        return Ok(());
    }
    let (Some(t), Some(cfg)) = (tls, member) else {
        return Err(
            "--tls-replication yes needs --raft-id (it secures a Raft member's links)".into(),
        );
    };
    cfg.tls = Some(t.tls.clone());
    Ok(())
}

/// What a reply waits for: a member's, the group's commit of its record; a single
/// node's, its own WAL.
pub(super) fn durability(r: &Recovered) -> Arc<dyn Durability> {
    match &r.speculation {
        Some(spec) => Arc::new(RaftDurability {
            local: r.durability.clone(),
            spec: spec.clone(),
        }),
        None => r.durability.clone(),
    }
}

/// Starts this process's Raft member, which re-executes itself when deposed (keeping
/// `port`, the client port this start bound), holds snapshots back for the consumer
/// groups, and publishes what its log says.
pub(super) async fn start(
    member: Member,
    spec: Arc<Speculation>,
    r: &Recovered,
    shared: &Arc<Shared>,
    port: u16,
) -> Result<(), String> {
    let Member { cfg, prepared } = member;
    let argv = cfg.restart_argv.clone();
    let data_dir = cfg.data_dir.clone();
    spec.set_depose_hook(RaftNode::restart_hook(argv, port, r.durability.clone()));
    let transport = raft::tcp::transport(&cfg.listen, &cfg.routes, cfg.tls.clone());
    let log = prepared.store.fault_record();
    let node = RaftNode::start(
        cfg,
        prepared,
        r.engine.clone(),
        r.durability.clone(),
        spec,
        super::feed::snapshot_hooks(shared),
        transport,
    )
    .await?;
    // A failed disk (the Raft log's, the WAL's) or a stopped Raft core ends the process
    // with its own status, for the supervisor to restart it from its durable state:
    // serving on would leave a member that answers but can no longer promise anything.
    let watched = raft::storage_fault::Watched {
        raft: node.raft.clone(),
        log,
        dur: r.durability.clone(),
        data_dir,
    };
    tokio::spawn(raft::storage_fault::watch(
        watched,
        raft::storage_fault::process_exit(),
    ));
    let hub = shared.clone();
    node.set_publisher(Box::new(move |ch, msg| {
        hub.pubsub.publish(ch, msg);
    }));
    let _ = shared.repl.set(node);
    Ok(())
}
