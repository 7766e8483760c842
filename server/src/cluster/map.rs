//! The slot map: which group owns which slot ranges, and the nodes of each group. Read
//! from the file given with `--cluster-config` (docs/cluster.md, The map file):
//!
//! ```text
//! # comments and blank lines are skipped
//! group a 0-5460
//! node 0123456789abcdef0123456789abcdef00000001 127.0.0.1:7001
//! group b 5461-10922,16000
//! node 0123456789abcdef0123456789abcdef00000002 127.0.0.1:7002
//! ```
//!
//! A `node` line belongs to the `group` line above it; a group's first node is the one
//! clients are sent to (its leader).

use super::slot::SLOTS;

/// Why a map file was refused, with the line (1-based) at fault.
// Each variant's `#[error]` text is its documentation.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MapError {
    #[error("line {line}: {what}")]
    Line { line: usize, what: String },
    #[error("slot {slot} is owned by both group '{a}' and group '{b}'")]
    Overlap { slot: u16, a: String, b: String },
    #[error("group '{0}' has no node")]
    NoNode(String),
    #[error("the map has no group")]
    Empty,
}

/// One member of a group as the map lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// 40 lowercase hex characters, as Redis's node ids.
    pub id: String,
    /// The host clients are sent to (`-MOVED`, CLUSTER SLOTS).
    pub host: String,
    /// Its RESP port.
    pub port: u16,
}

/// A replicated group and the slots it owns.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The name the map gives it (CLUSTER SHARDS shows it).
    pub name: String,
    /// Inclusive slot ranges, sorted, not overlapping.
    pub ranges: Vec<(u16, u16)>,
    /// Members in the map's order; `nodes[0]` is sent the group's slots while no member
    /// is known to lead (`cluster::leaders`).
    pub nodes: Vec<Node>,
}

/// Which group owns each slot.
#[derive(Debug, Clone)]
pub struct SlotMap {
    /// The groups in the map's order.
    pub groups: Vec<Group>,
    owner: Vec<Option<u16>>,
}

fn line_err(line: usize, what: impl Into<String>) -> MapError {
    MapError::Line {
        line,
        what: what.into(),
    }
}

fn parse_slot(s: &str, line: usize) -> Result<u16, MapError> {
    match s.parse::<u16>() {
        Ok(v) if v < SLOTS => Ok(v),
        _ => Err(line_err(
            line,
            format!("'{s}' is not a slot: slots are whole numbers from 0 to 16383"),
        )),
    }
}

/// `0-5460,6000,7000-7010`
fn parse_ranges(s: &str, line: usize) -> Result<Vec<(u16, u16)>, MapError> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (parse_slot(a, line)?, parse_slot(b, line)?),
            None => {
                let v = parse_slot(part, line)?;
                (v, v)
            }
        };
        if a > b {
            return Err(line_err(
                line,
                format!("range '{part}' ends before it starts"),
            ));
        }
        out.push((a, b));
    }
    out.sort_unstable();
    Ok(out)
}

fn valid_id(id: &str) -> bool {
    id.len() == 40 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn parse_node(words: &[&str], line: usize) -> Result<Node, MapError> {
    let [id, addr] = words else {
        return Err(line_err(line, "a node line is: node <id> <host>:<port>"));
    };
    if !valid_id(id) {
        return Err(line_err(
            line,
            format!("node id '{id}' must be 40 characters of 0-9 a-f"),
        ));
    }
    let bad_addr = || line_err(line, format!("'{addr}' is not <host>:<port>"));
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad_addr)?;
    let port: u16 = port.parse().map_err(|_| bad_addr())?;
    if host.is_empty() || port == 0 {
        return Err(bad_addr());
    }
    Ok(Node {
        id: id.to_string(),
        host: host.to_string(),
        port,
    })
}

impl SlotMap {
    /// Parses a map file's text. Every slot belongs to at most one group; slots no group
    /// owns answer `-CLUSTERDOWN`.
    pub fn parse(text: &str) -> Result<SlotMap, MapError> {
        let mut groups: Vec<Group> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let words: Vec<&str> = raw.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                [w, ..] if w.starts_with('#') => {}
                ["group", name, ranges] => {
                    if groups.iter().any(|g| g.name == *name) {
                        return Err(line_err(line, format!("group '{name}' is named twice")));
                    }
                    groups.push(Group {
                        name: name.to_string(),
                        ranges: parse_ranges(ranges, line)?,
                        nodes: Vec::new(),
                    });
                }
                ["group", ..] => {
                    return Err(line_err(
                        line,
                        "a group line is: group <name> <slot ranges>",
                    ))
                }
                ["node", rest @ ..] => {
                    let node = parse_node(rest, line)?;
                    if groups
                        .iter()
                        .flat_map(|g| &g.nodes)
                        .any(|n| n.id == node.id)
                    {
                        return Err(line_err(
                            line,
                            format!("node id '{}' is used twice", node.id),
                        ));
                    }
                    let Some(g) = groups.last_mut() else {
                        return Err(line_err(line, "a node line must follow its group line"));
                    };
                    g.nodes.push(node);
                }
                [w, ..] => {
                    return Err(line_err(
                        line,
                        format!("unknown word '{w}': lines start with 'group' or 'node'"),
                    ))
                }
            }
        }
        Self::from_groups(groups)
    }

    fn from_groups(groups: Vec<Group>) -> Result<SlotMap, MapError> {
        if groups.is_empty() {
            return Err(MapError::Empty);
        }
        let mut owner: Vec<Option<u16>> = vec![None; usize::from(SLOTS)];
        for (gi, g) in groups.iter().enumerate() {
            if g.nodes.is_empty() {
                return Err(MapError::NoNode(g.name.clone()));
            }
            for &(a, b) in &g.ranges {
                for slot in a..=b {
                    if let Some(prev) = owner[usize::from(slot)] {
                        return Err(MapError::Overlap {
                            slot,
                            a: groups[usize::from(prev)].name.clone(),
                            b: g.name.clone(),
                        });
                    }
                    owner[usize::from(slot)] = Some(gi as u16);
                }
            }
        }
        Ok(SlotMap { groups, owner })
    }

    /// The index of the group that owns `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        self.owner
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(usize::from)
    }

    /// Slots some group owns.
    pub fn assigned(&self) -> usize {
        self.owner.iter().filter(|o| o.is_some()).count()
    }

    /// (group index, node index) of the node with this id.
    pub fn find(&self, id: &str) -> Option<(usize, usize)> {
        self.groups
            .iter()
            .enumerate()
            .find_map(|(gi, g)| g.nodes.iter().position(|n| n.id == id).map(|ni| (gi, ni)))
    }

    /// Every node, in file order, with its group index.
    pub fn nodes(&self) -> impl Iterator<Item = (usize, usize, &Node)> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| g.nodes.iter().enumerate().map(move |(ni, n)| (gi, ni, n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> String {
        format!("{:040x}", n)
    }

    fn three() -> String {
        format!(
            "# three groups\n\ngroup a 0-5460\nnode {} 127.0.0.1:7001\ngroup b 5461-10922\nnode {} 127.0.0.1:7002\nnode {} 127.0.0.1:7012\ngroup c 10923-16383\nnode {} 127.0.0.1:7003\n",
            id(1),
            id(2),
            id(12),
            id(3)
        )
    }

    #[test]
    fn parses_groups_ranges_and_nodes() {
        let m = SlotMap::parse(&three()).unwrap();
        assert_eq!(m.groups.len(), 3);
        assert_eq!(m.groups[1].ranges, vec![(5461, 10922)]);
        assert_eq!(m.groups[1].nodes.len(), 2);
        assert_eq!(m.groups[1].nodes[0].port, 7002);
        assert_eq!(m.owner(0), Some(0));
        assert_eq!(m.owner(5460), Some(0));
        assert_eq!(m.owner(5461), Some(1));
        assert_eq!(m.owner(16383), Some(2));
        assert_eq!(m.owner(16384), None);
        assert_eq!(m.assigned(), 16384);
        assert_eq!(m.find(&id(12)), Some((1, 1)));
        assert_eq!(m.find(&id(99)), None);
        assert_eq!(m.nodes().count(), 4);
    }

    #[test]
    fn ranges_lists_and_gaps() {
        let text = format!("group a 0-10,20,30-40\nnode {} h:1\n", id(1));
        let m = SlotMap::parse(&text).unwrap();
        assert_eq!(m.groups[0].ranges, vec![(0, 10), (20, 20), (30, 40)]);
        assert_eq!(m.assigned(), 11 + 1 + 11);
        assert_eq!(m.owner(15), None);
        assert_eq!(m.owner(20), Some(0));
    }

    fn refused(text: &str) -> String {
        SlotMap::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn refuses_bad_maps_in_plain_words() {
        let n = id(1);
        assert_eq!(refused(""), "the map has no group");
        assert_eq!(refused("group a 0-10\n"), "group 'a' has no node");
        assert_eq!(
            refused(&format!("node {n} h:1\n")),
            "line 1: a node line must follow its group line"
        );
        assert_eq!(
            refused(&format!("group a 0-16384\nnode {n} h:1\n")),
            "line 1: '16384' is not a slot: slots are whole numbers from 0 to 16383"
        );
        assert_eq!(
            refused(&format!("group a 10-5\nnode {n} h:1\n")),
            "line 1: range '10-5' ends before it starts"
        );
        assert_eq!(
            refused(&format!(
                "group a 0-10\nnode {n} h:1\ngroup b 10-20\nnode {} h:2\n",
                id(2)
            )),
            "slot 10 is owned by both group 'a' and group 'b'"
        );
        assert_eq!(
            refused("group a 0\nnode xyz h:1\n"),
            "line 2: node id 'xyz' must be 40 characters of 0-9 a-f"
        );
        assert_eq!(
            refused(&format!("group a 0\nnode {n} h\n")),
            "line 2: 'h' is not <host>:<port>"
        );
        assert_eq!(
            refused(&format!("group a 0\nnode {n} h:1\nnode {n} h:2\n")),
            "line 3: node id '0000000000000000000000000000000000000001' is used twice"
        );
        assert_eq!(
            refused("shard a 0\n"),
            "line 1: unknown word 'shard': lines start with 'group' or 'node'"
        );
        assert_eq!(
            refused(&format!("group a 0\nnode {n} h:1\ngroup a 1\n")),
            "line 3: group 'a' is named twice"
        );
        assert_eq!(
            refused("group a\n"),
            "line 1: a group line is: group <name> <slot ranges>"
        );
    }

    #[test]
    fn never_panics_on_junk() {
        for junk in [
            "group",
            "node",
            "group a -",
            "group a 1-",
            "group a ,",
            "node a b c",
            "group a 0\nnode 0000000000000000000000000000000000000001 :99999",
        ] {
            let _ = SlotMap::parse(junk);
        }
    }
}
