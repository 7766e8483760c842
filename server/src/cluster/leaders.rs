//! Who leads each other group (docs/cluster.md, "How leaders are found"): every round a
//! node asks each member of every other group `ROLE` and keeps, per group, the member that
//! answers `master`. Leadership inside a group is decided by that group's Raft; this only
//! reads what its members say. A stale answer sends a client to a member that redirects it
//! once more (`-MOVED` from a follower) or refuses; a write runs only where Raft lets it.
//! Members that require a password are asked after an `AUTH` sent in the same write
//! (`--cluster-user`, `--cluster-password-file`); with `--tls-cluster yes` every probe
//! is TLS, with the node's own certificate.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

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
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Master,
    /// It requires a password this node did not give (`-NOAUTH`).
    NeedsPassword,
    /// It answered a plain probe with a TLS alert: it serves TLS only on that port.
    SpeaksTls,
    /// The TLS handshake failed (in words).
    Handshake(String),
    /// Anything else: a follower, a refused login, garbage, silence, no connection.
    NotMaster,
}

/// The first byte of a TLS alert record, which no RESP reply starts with.
const TLS_ALERT: u8 = 0x15;

/// Which misconfigurations have been logged already (each once, so a round every
/// 250 ms does not flood the log).
#[derive(Default)]
struct Warned {
    password: AtomicBool,
    tls: AtomicBool,
    handshake: AtomicBool,
}

/// How a round's probes reach the members: the login to send first, and TLS.
struct Link {
    auth: Option<Arc<[u8]>>,
    tls: Option<TlsConnector>,
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

/// Asks `ROLE` of one node, over TLS with `tls` (`--tls-cluster yes`), after `auth`'s
/// `AUTH` when given (both in one write). [`Answer::Master`] only when the login
/// succeeded and the node says it is a master.
async fn ask(
    host: String,
    port: u16,
    auth: Option<Arc<[u8]>>,
    tls: Option<TlsConnector>,
) -> Answer {
    let ask = async {
        let tcp = TcpStream::connect((host.as_str(), port)).await.ok()?;
        let Some(connector) = &tls else {
            return role(tcp, auth.as_deref()).await;
        };
        match crate::tls::peer::connect_async(tcp, &host, connector).await {
            Ok(s) => role(s, auth.as_deref()).await,
            Err(e) => Some(Answer::Handshake(crate::tls::peer::explain(&e.to_string()))),
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, ask).await {
        Ok(Some(a)) => a,
        _ => Answer::NotMaster,
    }
}

/// `[AUTH] ROLE` on an open link, and what the answer says.
async fn role<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, auth: Option<&[u8]>) -> Option<Answer> {
    let mut out = auth.unwrap_or_default().to_vec();
    out.extend_from_slice(ROLE);
    s.write_all(&out).await.ok()?;
    if auth.is_some() {
        let mut ok = [0u8; AUTH_OK.len()];
        s.read_exact(&mut ok[..1]).await.ok()?;
        if ok[0] == TLS_ALERT {
            return Some(Answer::SpeaksTls);
        }
        s.read_exact(&mut ok[1..]).await.ok()?;
        if ok != AUTH_OK {
            return Some(Answer::NotMaster);
        }
    }
    let mut buf = [0u8; MASTER.len()];
    s.read_exact(&mut buf[..1]).await.ok()?;
    if buf[0] == TLS_ALERT {
        return Some(Answer::SpeaksTls);
    }
    s.read_exact(&mut buf[1..NOAUTH.len()]).await.ok()?;
    if &buf[..NOAUTH.len()] == NOAUTH {
        return Some(Answer::NeedsPassword);
    }
    s.read_exact(&mut buf[NOAUTH.len()..]).await.ok()?;
    Some(if buf == MASTER {
        Answer::Master
    } else {
        Answer::NotMaster
    })
}

/// Logs a member's misconfiguration the first time one of its kind is seen.
fn warn_once(node: &Node, answer: &Answer, warned: &Warned) {
    let (host, port) = (&node.host, node.port);
    match answer {
        Answer::NeedsPassword if !warned.password.swap(true, Ordering::Relaxed) => {
            tracing::warn!(
                "cluster member {host}:{port} requires a password to answer ROLE: start this node with --cluster-user and --cluster-password-file, or its group's slots go to the map's first member"
            );
        }
        Answer::SpeaksTls if !warned.tls.swap(true, Ordering::Relaxed) => {
            tracing::warn!(
                "cluster member {host}:{port} answers only TLS there: start this node with --tls-cluster yes, or its group's slots go to the map's first member"
            );
        }
        Answer::Handshake(why) if !warned.handshake.swap(true, Ordering::Relaxed) => {
            tracing::warn!("cluster member {host}:{port}: {why}; its group's slots go to the map's first member until it answers");
        }
        _ => {}
    }
}

/// One round over group `g`'s members, all asked at once: the member that says it is
/// master, preferring the one known before when several do (an old leader that has not
/// yet learnt of the new one answers for at most its election timeout).
async fn probe_group(
    nodes: &[Node],
    before: Option<usize>,
    link: &Link,
    warned: &Warned,
) -> Option<usize> {
    let mut asks = JoinSet::new();
    for (i, n) in nodes.iter().enumerate() {
        let (h, p, a, t) = (n.host.clone(), n.port, link.auth.clone(), link.tls.clone());
        asks.spawn(async move { (i, ask(h, p, a, t).await) });
    }
    let mut masters = Vec::new();
    while let Some(done) = asks.join_next().await {
        match done {
            Ok((i, Answer::Master)) => masters.push(i),
            Ok((i, other)) => warn_once(&nodes[i], &other, warned),
            Err(_) => {}
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
    let warned = Warned::default();
    loop {
        // Each round takes the connector in force, so a reloaded certificate is used.
        let link = Link {
            auth: auth.clone(),
            tls: cluster
                .peer_tls
                .as_ref()
                .and_then(|t| t.peers())
                .map(|(_, c)| c),
        };
        for (g, group) in cluster.map.groups.iter().enumerate() {
            if g == cluster.my_group {
                continue;
            }
            let found = probe_group(&group.nodes, cluster.leaders.get(g), &link, &warned).await;
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
        let w = Warned::default();
        let plain = Link {
            auth: None,
            tls: None,
        };
        assert_eq!(probe_group(&nodes, None, &plain, &w).await, Some(4));
        assert_eq!(probe_group(&nodes[..4], Some(4), &plain, &w).await, None);
        let two = [node(master), node(peer(b"*3\r\n$6\r\nmaster\r\n").await)];
        assert_eq!(probe_group(&two, Some(1), &plain, &w).await, Some(1));
        assert_eq!(probe_group(&two, None, &plain, &w).await, Some(0));
        assert!(!w.password.load(Ordering::Relaxed));
        assert!(!w.tls.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn logs_in_first_when_given_a_password_and_tells_when_one_is_needed() {
        let locked = peer(b"-NOAUTH Authentication required.\r\n").await;
        let w = Warned::default();
        let plain = Link {
            auth: None,
            tls: None,
        };
        assert_eq!(probe_group(&[node(locked)], None, &plain, &w).await, None);
        assert!(
            w.password.load(Ordering::Relaxed),
            "a -NOAUTH answer is reported"
        );
        let auth = Link {
            auth: Some(ProbeAuth::new(Some("u"), "p").resp.into()),
            tls: None,
        };
        let after_login = peer(b"+OK\r\n*3\r\n$6\r\nmaster\r\n:1\r\n*0\r\n").await;
        let refused = peer(b"-WRONGPASS invalid username-password pair\r\n").await;
        let nodes = [node(refused), node(after_login)];
        assert_eq!(probe_group(&nodes, None, &auth, &w).await, Some(1));
        assert_eq!(
            ProbeAuth::new(None, "pw").resp,
            b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n".to_vec()
        );
        assert_eq!(format!("{:?}", ProbeAuth::new(None, "pw")), "ProbeAuth(..)");
    }

    /// A member that serves TLS only answers a plain probe with a TLS alert (rustls's
    /// `decode_error`): not a master, and told once.
    #[tokio::test]
    async fn a_tls_alert_tells_that_the_member_wants_tls() {
        let tls_only = peer(b"\x15\x03\x03\x00\x02\x02\x32").await;
        let w = Warned::default();
        let plain = Link {
            auth: None,
            tls: None,
        };
        assert_eq!(probe_group(&[node(tls_only)], None, &plain, &w).await, None);
        assert!(w.tls.load(Ordering::Relaxed), "a TLS alert is reported");
        let auth = Link {
            auth: Some(ProbeAuth::new(None, "p").resp.into()),
            tls: None,
        };
        let w = Warned::default();
        assert_eq!(probe_group(&[node(tls_only)], None, &auth, &w).await, None);
        assert!(w.tls.load(Ordering::Relaxed), "also after an AUTH");
    }
}
