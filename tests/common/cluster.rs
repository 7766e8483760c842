//! Cluster-mode test scaffolding: groups of one stockgate node each on loopback, a
//! slot map file naming them, one admission secret for all, and skus picked by the slot
//! they hash to.
#![allow(dead_code)]

use std::path::PathBuf;

use super::ha::{free_port, Keys, Node};
use super::TempDir;
use stockgate_server::cluster::key_slot;

/// Redis's split of the slots over three primaries (`redis-cli --cluster create`).
pub const THREE: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

pub fn node_id(i: usize) -> String {
    format!("{:040x}", 0x5106_a7e0_0000_u64 + i as u64)
}

pub struct Cluster {
    pub keys: Keys,
    pub nodes: Vec<Node>,
    pub ranges: Vec<(u16, u16)>,
    pub map: PathBuf,
    _dir: TempDir,
}

impl Cluster {
    /// One single-node group per range, node i owning `ranges[i]`.
    pub fn start(ranges: &[(u16, u16)]) -> Cluster {
        let keys = Keys::new();
        let dir = TempDir::new("cluster-map");
        let ports: Vec<u16> = ranges.iter().map(|_| free_port()).collect();
        let mut text = String::from("# written by tests/common/cluster.rs\n");
        for (i, ((a, b), port)) in ranges.iter().zip(&ports).enumerate() {
            text.push_str(&format!(
                "group g{i} {a}-{b}\nnode {} 127.0.0.1:{port}\n",
                node_id(i)
            ));
        }
        let map = dir.path().join("cluster.map");
        std::fs::write(&map, text).expect("write map");
        let map_s = map.display().to_string();
        let nodes = ports
            .iter()
            .map(|&p| {
                Node::start_on(
                    &keys,
                    p,
                    &["--cluster-enabled", "yes", "--cluster-config", &map_s],
                    &[],
                )
            })
            .collect();
        Cluster {
            keys,
            nodes,
            ranges: ranges.to_vec(),
            map,
            _dir: dir,
        }
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Which node owns a key's slot.
    pub fn owner(&self, key: &str) -> usize {
        let s = key_slot(key.as_bytes());
        self.ranges
            .iter()
            .position(|&(a, b)| (a..=b).contains(&s))
            .expect("slot owned")
    }

    /// `-MOVED` replies sent by all nodes so far.
    pub fn moved(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| {
                n.info("cluster")
                    .get("cluster_redirections_moved")
                    .and_then(|v| v.parse::<u64>().ok())
                    .expect("cluster_redirections_moved")
            })
            .sum()
    }

    /// `per_group` skus `<prefix>-<n>` owned by each node, node by node.
    pub fn skus(&self, prefix: &str, per_group: usize) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); self.ranges.len()];
        let mut n = 0;
        while out.iter().any(|v| v.len() < per_group) {
            let sku = format!("{prefix}-{n}");
            let g = self.owner(&sku);
            if out[g].len() < per_group {
                out[g].push(sku);
            }
            n += 1;
        }
        out
    }
}

/// Group `a` (slots 0-8191) is a three-member Raft group, group `b` (8192-16383) one
/// node; every member runs in cluster mode with the same map.
pub struct RaftBesideSingle {
    pub a: super::raft::Group,
    pub b: Node,
    pub map: PathBuf,
    _dir: TempDir,
}

impl RaftBesideSingle {
    pub fn start() -> RaftBesideSingle {
        let mut a = super::raft::Group::start(false);
        for m in &mut a.members {
            m.kill9();
        }
        let single = free_port();
        let dir = TempDir::new("cluster-raft");
        let map = dir.path().join("cluster.map");
        let mut text = String::from("group a 0-8191\n");
        for (i, m) in a.members.iter().enumerate() {
            text.push_str(&format!("node {} 127.0.0.1:{}\n", node_id(i), m.port));
        }
        text.push_str(&format!(
            "group b 8192-16383\nnode {} 127.0.0.1:{single}\n",
            node_id(9)
        ));
        std::fs::write(&map, text).expect("write map");
        let m = map.display().to_string();
        let flags = ["--cluster-enabled", "yes", "--cluster-config", &m];
        for member in &mut a.members {
            member.args.extend(flags.iter().map(|s| s.to_string()));
            member.spawn();
        }
        let b = Node::start_on(&a.keys, single, &flags, &[]);
        RaftBesideSingle {
            a,
            b,
            map,
            _dir: dir,
        }
    }

    /// Every node, as redis URLs (a cluster client's startup nodes).
    pub fn urls(&self) -> Vec<String> {
        self.a
            .members
            .iter()
            .map(|m| m.port)
            .chain([self.b.port])
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }
}

/// The port `CLUSTER SLOTS` on `port` names first (the master) for the range holding
/// `slot`, if the node answers.
pub fn slots_master(port: u16, slot: u16) -> Option<u16> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .ok()?
        .get_connection_with_timeout(std::time::Duration::from_millis(500))
        .ok()?;
    let v: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).ok()?;
    let redis::Value::Array(ranges) = v else {
        return None;
    };
    ranges.iter().find_map(|r| {
        let redis::Value::Array(e) = r else {
            return None;
        };
        let int = |v: &redis::Value| match v {
            redis::Value::Int(i) => Some(*i),
            _ => None,
        };
        let (lo, hi) = (int(e.first()?)?, int(e.get(1)?)?);
        if !(lo..=hi).contains(&i64::from(slot)) {
            return None;
        }
        let redis::Value::Array(n) = e.get(2)? else {
            return None;
        };
        u16::try_from(int(n.get(1)?)?).ok()
    })
}
