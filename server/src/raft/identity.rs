//! Who a member's storage is: `<data-dir>/raft/id`, one `key value` per line.
//!
//! - `node-id N`: the `--raft-id` this storage belongs to;
//! - `incarnation HEX`: a random id made when this storage was created. A member that
//!   lost its storage comes back with another one, and the group, which holds each
//!   member's incarnation in its membership, refuses its votes and appends until it is
//!   re-admitted under the new one;
//! - `group HEX`: the group this storage belongs to, made once by the member started with
//!   `--raft-bootstrap` and learned by every other member from the first leader or
//!   bootstrapper it accepts. A peer of another group is refused.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{NodeId, NodeInfo};

/// Why a member's identity file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The identity file.
        path: String,
        /// What the system reported.
        source: std::io::Error,
    },
    /// A line is not one this version writes.
    #[error("{path}: unreadable line '{line}'")]
    Unreadable {
        /// The identity file.
        path: String,
        /// The line.
        line: String,
    },
    /// The file lacks the incarnation (or the node id): an older or damaged file.
    #[error("{path} has no {what}: this storage cannot be told from another one; re-admit this member (docs/replication.md, \"A member lost its disk\")")]
    Incomplete {
        /// The identity file.
        path: String,
        /// What is missing.
        what: &'static str,
    },
    /// A second, different group id was offered after one was recorded.
    #[error("this member belongs to group {have:016x}, not {offered:016x}")]
    OtherGroup {
        /// The recorded group.
        have: u64,
        /// The one offered.
        offered: u64,
    },
}

/// A member's storage identity (see the module's description).
#[derive(Debug)]
pub struct Identity {
    /// The node id this storage belongs to.
    pub node: NodeId,
    /// This storage's incarnation (never 0).
    pub incarnation: u64,
    /// The group id, 0 until known.
    group: AtomicU64,
    /// Serialises rewrites of the file.
    write: Mutex<()>,
    path: PathBuf,
    /// The first membership the bootstrap handed this member, until its log holds one.
    first_members: Mutex<Option<BTreeMap<NodeId, NodeInfo>>>,
}

/// A random id, never 0 (0 means "unknown" on the wire).
pub fn random_id() -> u64 {
    rand::random::<u64>().max(1)
}

impl Identity {
    /// Reads the identity file; None when there is none.
    pub fn load(path: &Path) -> Result<Option<Identity>, IdentityError> {
        let shown = || path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(IdentityError::Io {
                    path: shown(),
                    source,
                })
            }
        };
        let (mut node, mut incarnation, mut group) = (None, None, 0u64);
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let bad = || IdentityError::Unreadable {
                path: shown(),
                line: line.to_owned(),
            };
            let (k, v) = line.split_once(' ').ok_or_else(bad)?;
            let hex = || u64::from_str_radix(v.trim(), 16).map_err(|_| bad());
            match k {
                "node-id" => node = Some(v.trim().parse::<NodeId>().map_err(|_| bad())?),
                "incarnation" => incarnation = Some(hex()?).filter(|i| *i != 0),
                "group" => group = hex()?,
                _ => return Err(bad()),
            }
        }
        let missing = |what| IdentityError::Incomplete {
            path: shown(),
            what,
        };
        let node = node.ok_or_else(|| missing("node id"))?;
        let incarnation = incarnation.ok_or_else(|| missing("incarnation"))?;
        Ok(Some(Identity {
            node,
            incarnation,
            group: AtomicU64::new(group),
            write: Mutex::new(()),
            path: path.to_owned(),
            first_members: Mutex::new(None),
        }))
    }

    /// A new storage's identity (a fresh incarnation, no group yet), written to `path`.
    pub fn create(path: &Path, node: NodeId) -> Result<Identity, IdentityError> {
        Identity::create_as(path, node, random_id())
    }

    /// [`Identity::create`] with the incarnation given (drawn by the caller).
    pub fn create_as(
        path: &Path,
        node: NodeId,
        incarnation: u64,
    ) -> Result<Identity, IdentityError> {
        let id = Identity {
            node,
            incarnation,
            group: AtomicU64::new(0),
            write: Mutex::new(()),
            path: path.to_owned(),
            first_members: Mutex::new(None),
        };
        id.save(0)?;
        Ok(id)
    }

    /// Keeps the first membership the bootstrap handed this member: what it judges
    /// votes by until its log holds a membership (it then never looks here again).
    pub fn set_first_members(&self, members: BTreeMap<NodeId, NodeInfo>) {
        *self.first_members.lock() = Some(members);
    }

    /// The first membership the bootstrap handed this member, if any.
    pub fn first_members(&self) -> Option<BTreeMap<NodeId, NodeInfo>> {
        self.first_members.lock().clone()
    }

    /// The group id, if known.
    pub fn group(&self) -> Option<u64> {
        Some(self.group.load(Ordering::Acquire)).filter(|g| *g != 0)
    }

    /// Records `group` as this member's group (on disk before it is used): a no-op when
    /// it is already the one, an error when another one is recorded.
    pub fn adopt_group(&self, group: u64) -> Result<(), IdentityError> {
        let _w = self.write.lock();
        match self.group() {
            Some(g) if g == group => Ok(()),
            Some(have) => Err(IdentityError::OtherGroup {
                have,
                offered: group,
            }),
            None => {
                self.save(group)?;
                self.group.store(group, Ordering::Release);
                Ok(())
            }
        }
    }

    fn save(&self, group: u64) -> Result<(), IdentityError> {
        let io = |source| IdentityError::Io {
            path: self.path.display().to_string(),
            source,
        };
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        let mut text = format!(
            "node-id {}\nincarnation {:016x}\n",
            self.node, self.incarnation
        );
        if group != 0 {
            text.push_str(&format!("group {group:016x}\n"));
        }
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        // The rename itself must survive a crash, or a restart finds no identity.
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips_and_refuses_a_second_group() {
        let dir = std::env::temp_dir().join(format!("sg-ident-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("id");
        let id = Identity::create(&path, 3).expect("create");
        assert_ne!(id.incarnation, 0);
        assert_eq!(id.group(), None);
        id.adopt_group(0xabc).expect("adopt");
        id.adopt_group(0xabc).expect("same again");
        assert!(matches!(
            id.adopt_group(0xdef),
            Err(IdentityError::OtherGroup { .. })
        ));
        let back = Identity::load(&path).expect("load").expect("present");
        assert_eq!(
            (back.node, back.incarnation, back.group()),
            (3, id.incarnation, Some(0xabc))
        );
        std::fs::write(&path, "node-id 3\n").expect("old format");
        assert!(matches!(
            Identity::load(&path),
            Err(IdentityError::Incomplete { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
