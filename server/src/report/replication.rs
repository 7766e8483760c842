//! A Raft member's `# Replication` section of INFO, rendered from the data the node
//! returns ([`ReplicationInfo`]): Redis's fields (`role`, `master_host`, `slaveN`) and the
//! group's (`raft_*`). INFO prints it; the status view and the Prometheus families read
//! the same text, so every reader sees one rendering.

use std::fmt::Write as _;

use crate::session::{LeaderProgress, ReplicationInfo, ReplicationLink};

/// A Raft group member's `# Replication` section: Redis's fields and the group's.
pub fn section(i: &ReplicationInfo) -> String {
    let mut o = String::new();
    raft_fields(&mut o, i);
    for p in &i.peers {
        let up = p.up.map_or("-", |u| if u { "1" } else { "0" });
        let _ = write!(
            o,
            "raft_peer_{}:up={up},connects={},refused={}\r\n",
            p.id, p.connects, p.refused
        );
    }
    if let Some(p) = &i.progress {
        leader_progress(&mut o, p);
    }
    replication_link(&mut o, &i.link);
    o
}

/// The `raft_*` fields of one member (and Redis's `role`).
fn raft_fields(o: &mut String, i: &ReplicationInfo) {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let _ = write!(
        o,
        "# Replication\r\nrole:{}\r\nraft_node_id:{}\r\nraft_state:{}\r\nraft_term:{}\r\nraft_leader_id:{}\r\nraft_last_log_index:{}\r\nraft_last_applied_index:{}\r\nraft_log_entries:{}\r\nraft_voters:{}\r\nraft_lease_held:{}\r\nraft_in_flight_records:{}\r\nraft_committed_lsn:{}\r\nraft_snapshot_index:{}\r\nraft_snapshot_lsn:{}\r\n",
        if i.master { "master" } else { "slave" },
        i.node_id,
        i.state,
        i.term,
        or_dash(i.leader_id.map(|l| l.to_string())),
        i.last_log_index,
        i.last_applied_index,
        i.log_entries,
        i.voters,
        u8::from(i.lease_held),
        i.in_flight_records,
        i.committed_lsn,
        i.snapshot_index,
        i.snapshot_lsn,
    );
    let _ = write!(
        o,
        "raft_group:{}\r\nraft_followers_caught_up:{}\r\n",
        i.group, i.followers_caught_up,
    );
    let _ = write!(
        o,
        "raft_group_id:{}\r\nraft_incarnation:{:016x}\r\nraft_voting:{}\r\n",
        or_dash(i.group_id.map(|g| format!("{g:016x}"))),
        i.incarnation,
        u8::from(i.voting),
    );
    let _ = write!(
        o,
        "raft_leader_addr:{}\r\n",
        i.leader_addr.as_deref().unwrap_or("-")
    );
}

/// A leader's commit point and its followers' positions.
fn leader_progress(o: &mut String, p: &LeaderProgress) {
    let _ = write!(
        o,
        "raft_commit_index:{}\r\nraft_millis_since_quorum_ack:{}\r\n",
        p.commit_index,
        p.millis_since_quorum_ack
            .map_or("-".into(), |v| v.to_string()),
    );
    for (n, f) in p.followers.iter().enumerate() {
        let _ = write!(
            o,
            "raft_follower_{n}:id={},addr={},voter={},matched={},lag={}\r\n",
            f.id,
            f.addr,
            u8::from(f.voter),
            f.matched,
            f.lag,
        );
    }
}

/// The master this member follows, or its replicas, in Redis's fields.
fn replication_link(o: &mut String, link: &ReplicationLink) {
    match link {
        ReplicationLink::Following {
            leader: (h, p),
            offset,
        } => {
            let _ = write!(
                o,
                "master_host:{h}\r\nmaster_port:{p}\r\nmaster_link_status:up\r\nslave_repl_offset:{offset}\r\n"
            );
        }
        ReplicationLink::NoLeader { offset } => {
            let _ = write!(
                o,
                "master_host:?\r\nmaster_port:0\r\nmaster_link_status:down\r\nslave_repl_offset:{offset}\r\n"
            );
        }
        ReplicationLink::Leading { replicas } => {
            let _ = write!(o, "connected_slaves:{}\r\n", replicas.len());
            for (n, (h, p)) in replicas.iter().enumerate() {
                let _ = write!(
                    o,
                    "slave{n}:ip={h},port={p},state=online,offset=0,lag=0\r\n"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{FollowerProgress, PeerLink};

    fn member() -> ReplicationInfo {
        ReplicationInfo {
            master: true,
            node_id: 1,
            state: "leader".into(),
            term: 3,
            leader_id: Some(1),
            last_log_index: 40,
            last_applied_index: 39,
            log_entries: 12,
            voters: 2,
            lease_held: true,
            in_flight_records: 5,
            committed_lsn: 100,
            snapshot_index: 0,
            snapshot_lsn: 0,
            group: "g".into(),
            followers_caught_up: 1,
            group_id: Some(0xab),
            incarnation: 0xcd,
            voting: true,
            leader_addr: Some("127.0.0.1:7001".into()),
            peers: vec![PeerLink {
                id: 2,
                up: Some(true),
                connects: 4,
                refused: 0,
            }],
            progress: Some(LeaderProgress {
                commit_index: 38,
                millis_since_quorum_ack: None,
                followers: vec![FollowerProgress {
                    id: 2,
                    addr: "127.0.0.1:7002".into(),
                    voter: true,
                    matched: 38,
                    lag: 2,
                }],
            }),
            link: ReplicationLink::Leading {
                replicas: vec![("127.0.0.1".into(), 7002)],
            },
        }
    }

    #[test]
    fn a_leaders_replication_section_has_the_group_and_redis_fields_in_order() {
        let want = "# Replication\r\nrole:master\r\nraft_node_id:1\r\nraft_state:leader\r\nraft_term:3\r\nraft_leader_id:1\r\nraft_last_log_index:40\r\nraft_last_applied_index:39\r\nraft_log_entries:12\r\nraft_voters:2\r\nraft_lease_held:1\r\nraft_in_flight_records:5\r\nraft_committed_lsn:100\r\nraft_snapshot_index:0\r\nraft_snapshot_lsn:0\r\n\
raft_group:g\r\nraft_followers_caught_up:1\r\n\
raft_group_id:00000000000000ab\r\nraft_incarnation:00000000000000cd\r\nraft_voting:1\r\n\
raft_leader_addr:127.0.0.1:7001\r\n\
raft_peer_2:up=1,connects=4,refused=0\r\n\
raft_commit_index:38\r\nraft_millis_since_quorum_ack:-\r\n\
raft_follower_0:id=2,addr=127.0.0.1:7002,voter=1,matched=38,lag=2\r\n\
connected_slaves:1\r\nslave0:ip=127.0.0.1,port=7002,state=online,offset=0,lag=0\r\n";
        assert_eq!(section(&member()), want);
    }

    #[test]
    fn a_follower_without_a_leader_names_none() {
        let i = ReplicationInfo {
            master: false,
            leader_id: None,
            group_id: None,
            leader_addr: None,
            peers: vec![PeerLink {
                id: 2,
                up: None,
                connects: 0,
                refused: 1,
            }],
            progress: None,
            link: ReplicationLink::NoLeader { offset: 7 },
            ..member()
        };
        let s = section(&i);
        for line in [
            "role:slave\r\n",
            "raft_leader_id:-\r\n",
            "raft_group_id:-\r\n",
            "raft_leader_addr:-\r\n",
            "raft_peer_2:up=-,connects=0,refused=1\r\n",
            "master_host:?\r\nmaster_port:0\r\nmaster_link_status:down\r\nslave_repl_offset:7\r\n",
        ] {
            assert!(s.contains(line), "{line:?} in {s}");
        }
        assert!(!s.contains("raft_commit_index"), "{s}");
        let following = ReplicationInfo {
            link: ReplicationLink::Following {
                leader: ("10.0.0.1".into(), 7001),
                offset: 9,
            },
            ..i
        };
        assert!(section(&following).ends_with(
            "master_host:10.0.0.1\r\nmaster_port:7001\r\nmaster_link_status:up\r\nslave_repl_offset:9\r\n"
        ));
    }
}
