//! The replication identity a node keeps across restarts, in `<data-dir>/repl.state`:
//! its role (and primary), its replication id and the id and offset of the history it
//! continued from. Written whenever the role changes (`REPLICAOF`, a full sync, a
//! promotion) and by `CONFIG REWRITE`, so a node restarted after Sentinel changed it
//! comes back as what Sentinel last made it.
//!
//! Plain `key value` lines, written to a temporary file, fsynced and renamed.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use rand::Rng as _;
use thiserror::Error;

pub const FILE_NAME: &str = "repl.state";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleConf {
    Primary,
    Replica { host: String, port: u16 },
}

/// What `repl.state` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedState {
    pub role: RoleConf,
    /// The id of the history this node's log belongs to (Redis's `master_replid`).
    pub replid: String,
    /// The history this one continued from, and the last LSN it shares with it
    /// (Redis's `master_replid2` / `second_repl_offset - 1`); `None` when there is none.
    pub previous: Option<(String, u64)>,
    /// A primary fenced by a replica that left it (see `repl`), and that replica's
    /// address: it stays fenced across restarts, until REPLICAOF makes it a replica or
    /// promotes it again, or the replica that fenced it follows it again.
    pub fenced: Option<String>,
}

#[derive(Debug, Error)]
pub enum StateError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: line {line}: {reason}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// A fresh 40-character hex id, as Redis's run ids and replication ids.
pub fn new_id() -> String {
    let mut rng = rand::thread_rng();
    (0..40)
        .map(|_| char::from(b"0123456789abcdef"[rng.gen_range(0..16)]))
        .collect()
}

pub fn valid_id(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl PersistedState {
    pub fn load(data_dir: &Path) -> Result<Option<PersistedState>, StateError> {
        let path = data_dir.join(FILE_NAME);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Io { path, source }),
        };
        let bad = |line: usize, reason: &str| StateError::Parse {
            path: path.clone(),
            line,
            reason: reason.to_owned(),
        };
        let (mut role, mut replid, mut previous, mut fenced) = (None, None, None, None);
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut p = line.split_whitespace();
            match (p.next(), p.next(), p.next(), p.next()) {
                (Some("role"), Some("primary"), None, None) => role = Some(RoleConf::Primary),
                (Some("role"), Some("replica"), Some(host), Some(port)) => {
                    let port = port.parse().map_err(|_| bad(i + 1, "bad port"))?;
                    role = Some(RoleConf::Replica {
                        host: host.to_owned(),
                        port,
                    });
                }
                (Some("replid"), Some(id), None, None) if valid_id(id) => {
                    replid = Some(id.to_owned())
                }
                (Some("fenced"), Some(by), None, None) => fenced = Some(by.to_owned()),
                (Some("previous"), Some(id), Some(off), None) if valid_id(id) => {
                    let off = off.parse().map_err(|_| bad(i + 1, "bad offset"))?;
                    previous = Some((id.to_owned(), off));
                }
                _ => return Err(bad(i + 1, "unrecognised line")),
            }
        }
        match (role, replid) {
            (Some(role), Some(replid)) => Ok(Some(PersistedState {
                role,
                replid,
                previous,
                fenced,
            })),
            _ => Err(bad(0, "missing role or replid")),
        }
    }

    pub fn save(&self, data_dir: &Path) -> Result<(), StateError> {
        let path = data_dir.join(FILE_NAME);
        let tmp = data_dir.join(format!("{FILE_NAME}.tmp"));
        let io = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        let mut text =
            String::from("# written by stockgate (REPLICAOF, failover, CONFIG REWRITE)\n");
        match &self.role {
            RoleConf::Primary => text.push_str("role primary\n"),
            RoleConf::Replica { host, port } => {
                text.push_str(&format!("role replica {host} {port}\n"))
            }
        }
        text.push_str(&format!("replid {}\n", self.replid));
        if let Some((id, off)) = &self.previous {
            text.push_str(&format!("previous {id} {off}\n"));
        }
        if let Some(by) = &self.fenced {
            text.push_str(&format!("fenced {by}\n"));
        }
        let mut f = fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        fs::rename(&tmp, &path).map_err(io)?;
        if let Ok(d) = fs::File::open(data_dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let dir = std::env::temp_dir().join(format!("sg-repl-state-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(PersistedState::load(&dir).unwrap(), None);
        for s in [
            PersistedState {
                role: RoleConf::Primary,
                replid: new_id(),
                previous: None,
                fenced: Some("127.0.0.1:7380".into()),
            },
            PersistedState {
                role: RoleConf::Replica {
                    host: "127.0.0.1".into(),
                    port: 7380,
                },
                replid: new_id(),
                previous: Some((new_id(), 42)),
                fenced: None,
            },
        ] {
            s.save(&dir).unwrap();
            assert_eq!(PersistedState::load(&dir).unwrap(), Some(s));
        }
        fs::write(dir.join(FILE_NAME), "role sideways\n").unwrap();
        assert!(PersistedState::load(&dir).is_err());
        let _ = fs::remove_dir_all(&dir);
    }
}
