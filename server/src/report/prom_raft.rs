//! The Raft group's families of the Prometheus exposition, from the member's INFO
//! replication fields (docs/observability.md, "The group"); nothing on a single node.
//! Each carries the group's name (`--group-name`) as `group`, so the alert rules in
//! `deploy/prometheus/` can aggregate the members of one group.

use std::fmt::Write as _;

use super::prom_label::label;

/// One family: its name, help, and the INFO field (or computation) it reads.
struct Family {
    name: &'static str,
    help: &'static str,
    value: fn(&Fields) -> u64,
}

struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
    fn num(&self, key: &str) -> u64 {
        self.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

const FAMILIES: [Family; 6] = [
    Family {
        name: "stockgate_raft_leader",
        help: "1 if this member is the group's leader and holds its lease (takes writes).",
        value: |f| f.num("raft_lease_held"),
    },
    Family {
        name: "stockgate_raft_leader_known",
        help: "1 if this member knows a leader of the group.",
        value: |f| u64::from(f.get("raft_leader_id").is_some_and(|v| v != "-")),
    },
    Family {
        name: "stockgate_raft_voters",
        help: "Voting members in the group's membership.",
        value: |f| f.num("raft_voters"),
    },
    Family {
        name: "stockgate_raft_followers_caught_up",
        help: "On the leader: voters within 1000 entries of its log (0 on other members).",
        value: |f| f.num("raft_followers_caught_up"),
    },
    Family {
        name: "stockgate_raft_term",
        help: "The member's current Raft term (a rising term is an election).",
        value: |f| f.num("raft_term"),
    },
    Family {
        name: "stockgate_raft_apply_lag_entries",
        help: "Entries in this member's Raft log not yet applied to its state.",
        value: |f| {
            f.num("raft_last_log_index")
                .saturating_sub(f.num("raft_last_applied_index"))
        },
    },
];

/// The families for a member whose INFO replication section is `info`; empty when the
/// section is not a Raft member's.
pub fn render(info: &str) -> String {
    let fields = Fields(
        info.lines()
            .filter_map(|l| l.trim().split_once(':'))
            .collect(),
    );
    let Some(group) = fields.get("raft_group") else {
        return String::new();
    };
    let group = label(group);
    let mut out = String::new();
    for f in &FAMILIES {
        let _ = write!(
            out,
            "# HELP {n} {h}\n# TYPE {n} gauge\n{n}{{group=\"{group}\"}} {v}\n",
            n = f.name,
            h = f.help,
            v = (f.value)(&fields),
        );
    }
    // Only a leader lists its followers; the families are there (empty) on every member.
    let _ = write!(
        out,
        "# HELP stockgate_raft_follower_lag_entries On the leader: entries of its log a follower does not hold yet.\n# TYPE stockgate_raft_follower_lag_entries gauge\n"
    );
    for (k, v) in &fields.0 {
        if !k.starts_with("raft_follower_") {
            continue;
        }
        let part = |name: &str| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or("0")
        };
        let _ = writeln!(
            out,
            "stockgate_raft_follower_lag_entries{{group=\"{group}\",follower=\"{}\"}} {}",
            label(part("id")),
            part("lag").parse::<u64>().unwrap_or(0),
        );
    }
    if let Some(c) = fields
        .get("raft_commit_index")
        .and_then(|v| v.parse::<u64>().ok())
    {
        let _ = write!(
            out,
            "# HELP stockgate_raft_commit_lag_entries On the leader: entries of its log a majority does not hold yet.\n# TYPE stockgate_raft_commit_lag_entries gauge\nstockgate_raft_commit_lag_entries{{group=\"{group}\"}} {}\n",
            fields.num("raft_last_log_index").saturating_sub(c),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn a_member_exports_every_family_with_its_group() {
        let info = "# Replication\r\nrole:master\r\nraft_state:leader\r\nraft_term:7\r\n\
                    raft_leader_id:2\r\nraft_last_log_index:120\r\nraft_last_applied_index:117\r\n\
                    raft_voters:3\r\nraft_lease_held:1\r\nraft_group:shop\"1\r\n\
                    raft_followers_caught_up:2\r\nraft_commit_index:119\r\n\
                    raft_follower_0:id=3,addr=127.0.0.1:7003,voter=1,matched=110,lag=10\r\n";
        let text = render(info);
        for line in [
            "stockgate_raft_leader{group=\"shop\\\"1\"} 1",
            "stockgate_raft_leader_known{group=\"shop\\\"1\"} 1",
            "stockgate_raft_voters{group=\"shop\\\"1\"} 3",
            "stockgate_raft_followers_caught_up{group=\"shop\\\"1\"} 2",
            "stockgate_raft_term{group=\"shop\\\"1\"} 7",
            "stockgate_raft_apply_lag_entries{group=\"shop\\\"1\"} 3",
            "stockgate_raft_follower_lag_entries{group=\"shop\\\"1\",follower=\"3\"} 10",
            "stockgate_raft_commit_lag_entries{group=\"shop\\\"1\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
    }

    #[test]
    fn a_member_without_a_leader_says_so_and_a_single_node_exports_nothing() {
        let info = "raft_group:g\r\nraft_leader_id:-\r\nraft_lease_held:0\r\n";
        assert!(render(info).contains("stockgate_raft_leader_known{group=\"g\"} 0"));
        assert_eq!(
            render("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
            ""
        );
    }
}
