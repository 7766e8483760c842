//! Who leads each other group (docs/cluster.md, "How leaders are found"): every round a
//! node asks each member of every other group `ROLE` and keeps, per group, the member that
//! answers `master`. Leadership inside a group is decided by that group's Raft; this only
//! reads what its members say. A stale answer sends a client to a member that redirects it
//! once more (`-MOVED` from a follower) or refuses; a write runs only where Raft lets it.
//! Members that require a password are asked after an `AUTH` sent in the same write
//! (`--cluster-user`, `--cluster-password-file`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// A successful `AUTH`'s reply.
const AUTH_OK: &[u8] = b"+OK\r\n";
/// The start of the refusal of a member that requires a password.
const NOAUTH: &[u8] = b"-NOAUTH";

/// The `AUTH` command the probes send first, encoded once. Its `Debug` never shows the
/// password.
pub struct ProbeAuth {
    resp: Vec<u8>,
}

impl ProbeAuth {
    /// `AUTH [user] password` as a RESP array.
    pub fn new(user: Option<&str>, password: &str) -> ProbeAuth {
        let mut args: Vec<&[u8]> = vec![b"AUTH"];
        if let Some(u) = user {
            args.push(u.as_bytes());
        }
        args.push(password.as_bytes());
        let mut resp = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            resp.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            resp.extend_from_slice(a);
            resp.extend_from_slice(b"\r\n");
        }
        ProbeAuth { resp }
    }

    /// The encoded `AUTH` command, for another link that logs in the same way
    /// (`SALE.MIGRATE`).
    pub fn command(&self) -> &[u8] {
        &self.resp
    }
}

impl std::fmt::Debug for ProbeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeAuth(..)")
    }
}

/// What one member answered.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Master,
    /// It requires a password this node did not give (`-NOAUTH`).
    NeedsPassword,
    /// Anything else: a follower, a refused login, garbage, silence, no connection.
    NotMaster,
}

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

/// Asks `ROLE` of one node, after `auth`'s `AUTH` when given (both in one write).
/// [`Answer::Master`] only when the login succeeded and the node says it is a master.
async fn ask(host: String, port: u16, auth: Option<Arc<[u8]>>) -> Answer {
    let ask = async {
        let mut s = TcpStream::connect((host.as_str(), port)).await.ok()?;
        let mut out = auth.as_deref().unwrap_or_default().to_vec();
        out.extend_from_slice(ROLE);
        s.write_all(&out).await.ok()?;
        if auth.is_some() {
            let mut ok = [0u8; AUTH_OK.len()];
            s.read_exact(&mut ok).await.ok()?;
            if ok != AUTH_OK {
                return Some(Answer::NotMaster);
            }
        }
        let mut buf = [0u8; MASTER.len()];
        s.read_exact(&mut buf[..NOAUTH.len()]).await.ok()?;
        if &buf[..NOAUTH.len()] == NOAUTH {
            return Some(Answer::NeedsPassword);
        }
        s.read_exact(&mut buf[NOAUTH.len()..]).await.ok()?;
        Some(if buf == MASTER {
            Answer::Master
        } else {
            Answer::NotMaster
        })
    };
    match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
        Ok(Some(a)) => a,
        _ => Answer::NotMaster,
    }
}

/// One round over group `g`'s members, all asked at once: the member that says it is
/// master, preferring the one known before when several do (an old leader that has not
/// yet learnt of the new one answers for at most its election timeout).
async fn probe_group(
    nodes: &[Node],
    before: Option<usize>,
    auth: Option<Arc<[u8]>>,
    warned: &AtomicBool,
) -> Option<usize> {
    let mut asks = JoinSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let (h, p, a) = (n.host.clone(), n.port, auth.clone());
        asks.spawn(async move { (i, ask(h, p, a).await) });
    }
    let mut masters = Vec::new();
    while let Some(done) = asks.join_next().await {
        match done {
            Ok((i, Answer::Master)) => masters.push(i),
            Ok((i, Answer::NeedsPassword)) if !warned.swap(true, Ordering::Relaxed) => {
                tracing::warn!(
                    "cluster member {}:{} requires a password to answer ROLE: start this node with --cluster-user and --cluster-password-file, or its group's slots go to the map's first member",
                    nodes[i].host,
                    nodes[i].port
                );
            }
            _ => {}
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
    let auth: Option<Arc<[u8]>> = cluster
        .probe_auth
        .as_ref()
        .map(|a| a.resp.as_slice().into());
    let warned = AtomicBool::new(false);
    loop {
        for (g, group) in cluster.map.groups.iter().enumerate() {
            if g == cluster.my_group {
                continue;
            }
            let found =
                probe_group(&group.nodes, cluster.leaders.get(g), auth.clone(), &warned).await;
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
        let w = AtomicBool::new(false);
        assert_eq!(probe_group(&nodes, None, None, &w).await, Some(4));
        assert_eq!(probe_group(&nodes[..4], Some(4), None, &w).await, None);
        let two = [node(master), node(peer(b"*3\r\n$6\r\nmaster\r\n").await)];
        assert_eq!(probe_group(&two, Some(1), None, &w).await, Some(1));
        assert_eq!(probe_group(&two, None, None, &w).await, Some(0));
        assert!(!w.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn logs_in_first_when_given_a_password_and_tells_when_one_is_needed() {
        let locked = peer(b"-NOAUTH Authentication required.\r\n").await;
        let w = AtomicBool::new(false);
        assert_eq!(probe_group(&[node(locked)], None, None, &w).await, None);
        assert!(w.load(Ordering::Relaxed), "a -NOAUTH answer is reported");
        let auth: Option<Arc<[u8]>> = Some(ProbeAuth::new(Some("u"), "p").resp.into());
        let after_login = peer(b"+OK\r\n*3\r\n$6\r\nmaster\r\n:1\r\n*0\r\n").await;
        let refused = peer(b"-WRONGPASS invalid username-password pair\r\n").await;
        let nodes = [node(refused), node(after_login)];
        assert_eq!(probe_group(&nodes, None, auth, &w).await, Some(1));
        assert_eq!(
            ProbeAuth::new(None, "pw").resp,
            b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n".to_vec()
        );
        assert_eq!(format!("{:?}", ProbeAuth::new(None, "pw")), "ProbeAuth(..)");
    }
}
