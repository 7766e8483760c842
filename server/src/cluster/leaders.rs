//! Who leads each other group (docs/cluster.md, "How leaders are found"): every round a
//! node asks each member of every other group `ROLE` and keeps, per group, the member that
//! answers `master`. Leadership inside a group is decided by that group's Raft; this only
//! reads what its members say. A stale answer sends a client to a member that redirects it
//! once more (`-MOVED` from a follower) or refuses; a write runs only where Raft lets it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::{Cluster, Node};

/// No member of the group is known to lead.
const UNKNOWN: usize = usize::MAX;
/// How long one member gets to connect and answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Time between rounds.
const ROUND: Duration = Duration::from_millis(250);
/// `ROLE` as a RESP array.
const ROLE: &[u8] = b"*1\r\n$4\r\nROLE\r\n";
/// The start of a master's `ROLE` reply (RESP2 and RESP3 alike).
const MASTER: &[u8] = b"*3\r\n$6\r\nmaster\r\n";

/// Per group, the index (in the map) of the member last seen answering `master`.
pub struct Leaders {
    known: Vec<AtomicUsize>,
}

impl Leaders {
    /// No leader known yet for any of `groups` groups.
    pub fn new(groups: usize) -> Leaders {
        Leaders {
            known: (0..groups).map(|_| AtomicUsize::new(UNKNOWN)).collect(),
        }
    }

    /// The member of group `g` last seen leading, if any.
    pub fn get(&self, g: usize) -> Option<usize> {
        let i = self.known.get(g)?.load(Ordering::Acquire);
        (i != UNKNOWN).then_some(i)
    }

    /// Records the member of group `g` seen leading (`None`: none answered `master`).
    pub fn set(&self, g: usize, member: Option<usize>) {
        if let Some(k) = self.known.get(g) {
            k.store(member.unwrap_or(UNKNOWN), Ordering::Release);
        }
    }
}

/// Asks `ROLE` of one node: `true` when it answers that it is a master. Anything else
/// (refused, slow, closed, any other bytes) is `false`.
async fn says_master(host: String, port: u16) -> bool {
    let ask = async {
        let mut s = TcpStream::connect((host.as_str(), port)).await.ok()?;
        s.write_all(ROLE).await.ok()?;
        let mut buf = [0u8; MASTER.len()];
        s.read_exact(&mut buf).await.ok()?;
        Some(buf == MASTER)
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, ask).await,
        Ok(Some(true))
    )
}

/// One round over group `g`'s members, all asked at once: the member that says it is
/// master, preferring the one known before when several do (an old leader that has not
/// yet learnt of the new one answers for at most its election timeout).
async fn probe_group(nodes: &[Node], before: Option<usize>) -> Option<usize> {
    let mut asks = JoinSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let (h, p) = (n.host.clone(), n.port);
        asks.spawn(async move { (i, says_master(h, p).await) });
    }
    let mut masters = Vec::new();
    while let Some(done) = asks.join_next().await {
        if let Ok((i, true)) = done {
            masters.push(i);
        }
    }
    masters.sort_unstable();
    match before {
        Some(b) if masters.contains(&b) => Some(b),
        _ => masters.first().copied(),
    }
}

/// Runs until aborted (with the server): a round over every other group every
/// [`ROUND`]. Each member is asked at most once per round, so a round holds at most one
/// connection per member.
pub async fn watch(cluster: Arc<Cluster>) {
    loop {
        for (g, group) in cluster.map.groups.iter().enumerate() {
            if g == cluster.my_group {
                continue;
            }
            let found = probe_group(&group.nodes, cluster.leaders.get(g)).await;
            cluster.leaders.set(g, found);
        }
        tokio::time::sleep(ROUND).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A one-shot peer that answers whatever bytes it is given to the first connection.
    async fn peer(answer: &'static [u8]) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut b = [0u8; 64];
                let _ = s.read(&mut b).await;
                let _ = s.write_all(answer).await;
            }
        });
        port
    }

    fn node(port: u16) -> Node {
        Node {
            id: format!("{port:040x}"),
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[tokio::test]
    async fn finds_the_member_that_says_master_and_survives_garbage() {
        let slave = peer(b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:1\r\n").await;
        let junk = peer(b"\xff\x00-ERR what\r\n").await;
        let master = peer(b"*3\r\n$6\r\nmaster\r\n:7\r\n*0\r\n").await;
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let nodes = [
            node(slave),
            node(junk),
            node(closed),
            node(silent.local_addr().unwrap().port()),
            node(master),
        ];
        assert_eq!(probe_group(&nodes, None).await, Some(4));
        assert_eq!(probe_group(&nodes[..4], Some(4)).await, None);
        let two = [node(master), node(peer(b"*3\r\n$6\r\nmaster\r\n").await)];
        assert_eq!(probe_group(&two, Some(1)).await, Some(1));
        assert_eq!(probe_group(&two, None).await, Some(0));
    }
}
