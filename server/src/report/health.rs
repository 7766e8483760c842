//! `/healthz`: whether a write sent to this node now would be made durable. Load
//! balancers route writes by it, so a follower answers 503 (it refuses writes) and names
//! the leader; reads a follower serves are not what this answers (docs/observability.md,
//! "/healthz").

use super::view::GroupView;

/// What the decision reads, gathered from the server's own state.
#[derive(Clone, Debug, Default)]
pub struct HealthInput {
    /// Why the log can no longer make a record durable, if it cannot.
    pub log_failure: Option<String>,
    /// The Raft group, on a member.
    pub group: Option<GroupView>,
    /// The refusal a write would get before it runs (`READONLY ...`), on a member.
    pub write_refusal: Option<String>,
}

/// The answer: `Ok` is 200 "ok"; `Unavailable` is 503 with its plain reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Writes sent here are taken and made durable.
    Ok,
    /// Writes sent here would be refused or could not be made durable; why.
    Unavailable(String),
}

/// The decision, a pure function of what the server knows.
pub fn decide(h: &HealthInput) -> Health {
    if let Some(why) = &h.log_failure {
        return Health::Unavailable(format!("the write-ahead log failed: {why}"));
    }
    let Some(g) = &h.group else {
        return Health::Ok;
    };
    let Some(refusal) = &h.write_refusal else {
        return Health::Ok;
    };
    match (g.leader_id, &g.leader_addr) {
        (Some(l), addr) if l != g.node_id => Health::Unavailable(format!(
            "follower: writes go to the leader, node {l} at {}",
            addr.as_deref().unwrap_or("an unknown address")
        )),
        (Some(_), _) => Health::Unavailable(format!("leader, not taking writes: {refusal}")),
        (None, _) => Health::Unavailable(format!(
            "no leader known (term {}, an election or no majority): {refusal}",
            g.term
        )),
    }
}

/// The input for this server.
pub fn input(shared: &crate::session::Shared) -> HealthInput {
    let repl = shared.repl.get();
    HealthInput {
        log_failure: shared.durability.failure(),
        group: super::view::group(shared),
        write_refusal: repl.and_then(|r| r.write_refusal()).map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::{decide, Health, HealthInput};
    use crate::report::view::group_view;

    fn member(info: &str, refusal: Option<&str>) -> HealthInput {
        HealthInput {
            log_failure: None,
            group: group_view(info),
            write_refusal: refusal.map(str::to_string),
        }
    }

    const LEADER: &str =
        "raft_node_id:1\r\nraft_state:leader\r\nraft_term:4\r\nraft_leader_id:1\r\n\
                          raft_group:g\r\nraft_leader_addr:127.0.0.1:7001\r\n";
    const FOLLOWER: &str =
        "raft_node_id:2\r\nraft_state:follower\r\nraft_term:4\r\nraft_leader_id:1\r\n\
                            raft_group:g\r\nraft_leader_addr:127.0.0.1:7001\r\n";
    const ORPHAN: &str =
        "raft_node_id:2\r\nraft_state:candidate\r\nraft_term:9\r\nraft_leader_id:-\r\n\
                          raft_group:g\r\nraft_leader_addr:-\r\n";

    #[test]
    fn a_single_node_is_healthy_until_its_log_fails() {
        assert_eq!(decide(&HealthInput::default()), Health::Ok);
        let failed = HealthInput {
            log_failure: Some("No space left on device".into()),
            ..HealthInput::default()
        };
        assert_eq!(
            decide(&failed),
            Health::Unavailable("the write-ahead log failed: No space left on device".into())
        );
    }

    #[test]
    fn a_leader_taking_writes_is_healthy_and_one_without_its_lease_is_not() {
        assert_eq!(decide(&member(LEADER, None)), Health::Ok);
        let Health::Unavailable(why) = decide(&member(LEADER, Some("NOQUORUM lost"))) else {
            panic!("a leader without its lease is healthy");
        };
        assert!(
            why.starts_with("leader, not taking writes: NOQUORUM"),
            "{why}"
        );
    }

    #[test]
    fn a_follower_names_the_leader_and_a_member_without_one_says_so() {
        assert_eq!(
            decide(&member(FOLLOWER, Some("READONLY"))),
            Health::Unavailable(
                "follower: writes go to the leader, node 1 at 127.0.0.1:7001".into()
            )
        );
        let Health::Unavailable(why) = decide(&member(ORPHAN, Some("READONLY"))) else {
            panic!("a member without a leader is healthy");
        };
        assert!(why.starts_with("no leader known (term 9"), "{why}");
    }

    #[test]
    fn a_failed_log_wins_over_leadership() {
        let mut h = member(LEADER, None);
        h.log_failure = Some("fsync: EIO".into());
        assert!(matches!(decide(&h), Health::Unavailable(w) if w.contains("EIO")));
    }
}
