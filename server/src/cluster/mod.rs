//! Redis Cluster routing (docs/cluster.md): the hash slot of a key ([`slot`]), the slot
//! map of groups and their nodes ([`map`]), and this node's place in it. The commands
//! (`CLUSTER …`, the `-MOVED` check) are in `cmd::cluster`; the engine knows nothing of
//! slots.

pub mod leaders;
pub mod map;
pub mod slot;
pub mod slots;

use std::sync::atomic::AtomicU64;

pub use leaders::{Leaders, ProbeAuth};
pub use map::{Group, MapError, Node, SlotMap};
pub use slot::{key_slot, SLOTS};
pub use slots::{SlotChange, SlotTable};

/// Why cluster mode could not start.
// Each variant's `#[error]` text is its documentation.
#[allow(missing_docs)]
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot read the cluster map {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("cluster map {path}: {err}")]
    Map { path: String, err: MapError },
    #[error("cluster map {path} has no node with id {id}")]
    UnknownId { path: String, id: String },
    #[error(
        "cluster map {path} has no node with port {port}: name this node with --cluster-node <id>"
    )]
    NotListed { path: String, port: u16 },
    #[error("cluster map {path} has more than one node with port {port}: name this node with --cluster-node <id>")]
    Ambiguous { path: String, port: u16 },
}

/// Where a command on a slot goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Route<'a> {
    /// This node's group owns the slot.
    Here,
    /// Another group owns it: its leader.
    Moved(&'a Node),
    /// No group owns it.
    Unowned,
}

/// The slot map and which of its nodes this server is.
pub struct Cluster {
    /// The groups and their members, and the slots the map file gives them (the table
    /// in force is `slots`).
    pub map: SlotMap,
    /// Who owns each slot now, and what is migrating: the map file's table, then every
    /// logged `CLUSTER SETSLOT` in order. Replaced whole, read with one atomic load.
    pub slots: arc_swap::ArcSwap<SlotTable>,
    /// `-ASK` replies sent (INFO's `cluster_redirections_ask`).
    pub ask: AtomicU64,
    /// This server's group, an index into `map.groups`.
    pub my_group: usize,
    /// This server, an index into its group's `nodes`.
    pub my_node: usize,
    /// `-MOVED` replies sent (INFO's `cluster_redirections_moved`).
    pub moved: AtomicU64,
    /// `-CROSSSLOT` replies sent (INFO's `cluster_crossslot_refusals`).
    pub crossslot: AtomicU64,
    /// The other groups' leaders as their members last answered `ROLE` ([`leaders`]).
    pub leaders: Leaders,
    /// How the `ROLE` probes log in to members that require a password; `None`: they
    /// do not.
    pub probe_auth: Option<ProbeAuth>,
    /// `--tls-cluster yes`: the probes and `SALE.MIGRATE` call other nodes over TLS, with
    /// this configuration's peer connector (read at each call, so a reloaded certificate
    /// is used); `None`: plain TCP.
    pub peer_tls: Option<std::sync::Arc<crate::tls::Tls>>,
}

impl Cluster {
    /// Reads the map file and finds this node in it: by `id` when given, else the only
    /// node listed with this server's port.
    pub fn load(path: &str, id: Option<&str>, port: u16) -> Result<Cluster, ClusterError> {
        let text = std::fs::read_to_string(path).map_err(|err| ClusterError::Read {
            path: path.into(),
            err,
        })?;
        let map = SlotMap::parse(&text).map_err(|err| ClusterError::Map {
            path: path.into(),
            err,
        })?;
        Self::place(map, path, id, port)
    }

    fn place(
        map: SlotMap,
        path: &str,
        id: Option<&str>,
        port: u16,
    ) -> Result<Cluster, ClusterError> {
        let (my_group, my_node) = match id {
            Some(id) => map.find(id).ok_or_else(|| ClusterError::UnknownId {
                path: path.into(),
                id: id.into(),
            })?,
            None => {
                let mut same_port = map.nodes().filter(|(_, _, n)| n.port == port);
                let first = same_port.next();
                if same_port.next().is_some() {
                    return Err(ClusterError::Ambiguous {
                        path: path.into(),
                        port,
                    });
                }
                let (gi, ni, _) = first.ok_or(ClusterError::NotListed {
                    path: path.into(),
                    port,
                })?;
                (gi, ni)
            }
        };
        Ok(Cluster {
            leaders: Leaders::new(map.groups.len()),
            slots: arc_swap::ArcSwap::from_pointee(SlotTable::from_map(&map)),
            ask: AtomicU64::new(0),
            map,
            my_group,
            my_node,
            moved: AtomicU64::new(0),
            crossslot: AtomicU64::new(0),
            probe_auth: None,
            peer_tls: None,
        })
    }

    /// The same cluster, its `ROLE` probes logging in with `auth`.
    pub fn with_probe_auth(mut self, auth: Option<ProbeAuth>) -> Cluster {
        self.probe_auth = auth;
        self
    }

    /// The same cluster, calling other nodes over TLS with `tls` (`--tls-cluster yes`).
    pub fn with_peer_tls(mut self, tls: Option<std::sync::Arc<crate::tls::Tls>>) -> Cluster {
        self.peer_tls = tls;
        self
    }

    /// This server's entry in the map.
    pub fn myself(&self) -> &Node {
        &self.map.groups[self.my_group].nodes[self.my_node]
    }

    /// The member of another group `g` to send its slots to: the one last seen leading,
    /// else the map's first.
    pub fn leader_of(&self, g: usize) -> usize {
        self.leaders
            .get(g)
            .filter(|&i| i < self.map.groups[g].nodes.len())
            .unwrap_or(0)
    }

    /// Applies one logged `CLUSTER SETSLOT` (live, at recovery, on a Raft member).
    pub fn apply(&self, change: &SlotChange) {
        let groups = self.map.groups.len();
        self.slots.rcu(|t| t.with(change, groups));
    }

    /// Applies an opaque record if it is a slot change; other kinds are not ours.
    pub fn apply_record(&self, kind: u8, body: &[u8]) {
        if kind != stockgate_core::wal::record::K_SLOT_SET {
            return;
        }
        match SlotChange::decode(body) {
            Some(c) => self.apply(&c),
            None => tracing::warn!("cluster: skipped an undecodable slot record"),
        }
    }

    /// The slot changes in force, as records: what a snapshot re-logs.
    pub fn checkpoint(&self) -> Vec<SlotChange> {
        self.slots
            .load()
            .changes_from(&SlotTable::from_map(&self.map))
    }

    /// Folds the slot records a Raft snapshot carries on ([`slots::compact_records`]).
    pub fn compact_slot_records(&self, records: Vec<(u8, Vec<u8>)>) -> Vec<(u8, Vec<u8>)> {
        slots::compact_records(records, self.map.groups.len())
    }

    /// The group of the map whose node has this id.
    pub fn group_of_node(&self, id: &str) -> Option<usize> {
        self.map.find(id).map(|(g, _)| g)
    }

    /// The node of group `g` it is sent to (its leader as known, else its first).
    pub fn node_for(&self, g: usize) -> Option<&Node> {
        let lead = if g == self.my_group {
            0
        } else {
            self.leader_of(g)
        };
        self.map.groups.get(g)?.nodes.get(lead)
    }

    /// Where a command on `slot` goes.
    pub fn route(&self, slot: u16) -> Route<'_> {
        match self.slots.load().owner(slot) {
            Some(g) if g == self.my_group => Route::Here,
            Some(g) => Route::Moved(&self.map.groups[g].nodes[self.leader_of(g)]),
            None => Route::Unowned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> SlotMap {
        SlotMap::parse(&format!(
            "group a 0-8191\nnode {:040x} 127.0.0.1:7001\ngroup b 8192-16000\nnode {:040x} 127.0.0.1:7002\nnode {:040x} 127.0.0.1:7003\n",
            1, 2, 3
        ))
        .unwrap()
    }

    #[test]
    fn finds_itself_by_port_or_id() {
        let c = Cluster::place(map(), "m", None, 7003).unwrap();
        assert_eq!((c.my_group, c.my_node), (1, 1));
        let c = Cluster::place(map(), "m", Some(&format!("{:040x}", 1)), 9).unwrap();
        assert_eq!(c.myself().port, 7001);
        assert!(matches!(
            Cluster::place(map(), "m", None, 9),
            Err(ClusterError::NotListed { .. })
        ));
        assert!(matches!(
            Cluster::place(map(), "m", Some("nope"), 7001),
            Err(ClusterError::UnknownId { .. })
        ));
    }

    #[test]
    fn routes_to_the_owning_groups_leader_else_its_first_node() {
        let c = Cluster::place(map(), "m", None, 7001).unwrap();
        assert_eq!(c.route(0), Route::Here);
        assert_eq!(c.route(8191), Route::Here);
        match c.route(8192) {
            Route::Moved(n) => assert_eq!(n.port, 7002),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.route(16001), Route::Unowned);
        c.leaders.set(1, Some(1));
        match c.route(8192) {
            Route::Moved(n) => assert_eq!(n.port, 7003),
            other => panic!("{other:?}"),
        }
    }
}
