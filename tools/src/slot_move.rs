//! `stockgate-sweeper move-slots`: moves hash slots from one group to another while the
//! sales on them keep selling, as `redis-cli --cluster reshard` does for Redis
//! (docs/cluster.md, "Moving slots"): `IMPORTING` on the destination, `MIGRATING` on the
//! source, every sale of each slot handed over with `SALE.MIGRATE`, then `SETSLOT NODE`
//! on the destination, the source and every other node given. Each step is idempotent:
//! re-running the same command after a failure finishes the move. A handover that fails
//! stops the move and rolls back what can safely be undone (see [`MoveError::Stopped`]).

use redis::aio::MultiplexedConnection;

use crate::tls::TlsConfig;

/// Why a move stopped; re-running the same command continues it.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// A node could not be reached or refused a step.
    #[error("{node}: {what}: {why}")]
    Node {
        /// The node's address.
        node: String,
        /// The step.
        what: String,
        /// Its error.
        why: String,
    },
    /// `--follow-ledger` refused: the destination's history is not one the ledger is
    /// bound to, or a node reports none.
    #[error("--follow-ledger: {0}")]
    Ledger(String),
    /// An argument that is not a slot list.
    #[error("invalid slots '{0}': give slots and ranges from 0 to 16383, e.g. 100-200,300")]
    Slots(String),
    /// A sale could not be handed over; the move was undone as far as it safely could
    /// be, and this says what state every slot was left in.
    #[error("the move stopped: {why}\n{left}")]
    Stopped {
        /// The failure that stopped it.
        why: Box<MoveError>,
        /// What state each slot was left in, in words.
        left: String,
    },
}

/// The slots of `100-200,300`.
pub fn parse_slots(s: &str) -> Result<Vec<u16>, MoveError> {
    let bad = || MoveError::Slots(s.to_string());
    let mut out = Vec::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let a: u16 = a.trim().parse().map_err(|_| bad())?;
        let b: u16 = b.trim().parse().map_err(|_| bad())?;
        if a > b || b >= 16384 {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// One node the move talks to.
struct Node {
    addr: String,
    conn: MultiplexedConnection,
}

impl Node {
    /// Connects to `addr`, over TLS with `tls` (or a `rediss://` address).
    async fn open(addr: &str, tls: Option<&TlsConfig>) -> Result<Node, MoveError> {
        let err = |why: String| MoveError::Node {
            node: addr.to_string(),
            what: "connect".into(),
            why,
        };
        let client = crate::tls::redis_client(addr, tls).map_err(|e| err(e.to_string()))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| err(crate::tls::explain(e).to_string()))?;
        Ok(Node {
            addr: addr.to_string(),
            conn,
        })
    }

    async fn call<T: redis::FromRedisValue>(&mut self, args: &[&str]) -> Result<T, MoveError> {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut self.conn)
            .await
            .map_err(|e| MoveError::Node {
                node: self.addr.clone(),
                what: args.join(" "),
                why: e.to_string(),
            })
    }

    async fn setslot(&mut self, slot: u16, how: &str, id: &str) -> Result<(), MoveError> {
        let slot = slot.to_string();
        self.call::<()>(&["CLUSTER", "SETSLOT", &slot, how, id])
            .await
    }

    async fn setslot_stable(&mut self, slot: u16) -> Result<(), MoveError> {
        let slot = slot.to_string();
        self.call::<()>(&["CLUSTER", "SETSLOT", &slot, "STABLE"])
            .await
    }

    /// The sales this node holds on `slot`.
    async fn keys_in_slot(&mut self, slot: u16) -> Result<Vec<String>, MoveError> {
        let slot = slot.to_string();
        let n: u64 = self.call(&["CLUSTER", "COUNTKEYSINSLOT", &slot]).await?;
        self.call(&["CLUSTER", "GETKEYSINSLOT", &slot, &n.to_string()])
            .await
    }

    /// The history id the node reports (`INFO server`'s `stockgate_history`).
    async fn history(&mut self) -> Result<String, MoveError> {
        let v: redis::Value = self.call(&["INFO", "server"]).await?;
        crate::client::history_in_info(&v)
            .flatten()
            .ok_or_else(|| MoveError::Ledger(format!("{} reports no history id", self.addr)))
    }

    /// The host and port `SALE.MIGRATE` connects to (the address as given).
    fn host_port(&self) -> (String, String) {
        host_port(&self.addr)
    }
}

/// The host and port of `host:port` or a `redis://` / `rediss://` URL.
fn host_port(addr: &str) -> (String, String) {
    let bare = addr.rsplit('@').next().unwrap_or(addr);
    let bare = bare
        .strip_prefix("rediss://")
        .or_else(|| bare.strip_prefix("redis://"))
        .unwrap_or(bare);
    match bare.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.trim_end_matches('/').to_string()),
        None => (bare.trim_end_matches('/').to_string(), "6379".into()),
    }
}

/// What a move did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Slots now owned by the destination.
    pub slots: usize,
    /// Sales handed over (0 for a re-run that found them moved).
    pub sales: usize,
}

/// Moves `slots` from `from` to `to`; `others` are told the new owner last. Every node
/// is reached over TLS with `tls` (`--tls`); the nodes link to each other as their
/// `--tls-cluster` says.
pub async fn move_slots(
    from: &str,
    to: &str,
    slots: &[u16],
    others: &[String],
    tls: Option<&TlsConfig>,
) -> Result<Moved, MoveError> {
    let mut src = Node::open(from, tls).await?;
    let mut dst = Node::open(to, tls).await?;
    let src_id: String = src.call(&["CLUSTER", "MYID"]).await?;
    let dst_id: String = dst.call(&["CLUSTER", "MYID"]).await?;
    for &s in slots {
        dst.setslot(s, "IMPORTING", &src_id).await?;
        src.setslot(s, "MIGRATING", &dst_id).await?;
    }
    let (host, port) = dst.host_port();
    let mut sales = 0;
    for (i, &s) in slots.iter().enumerate() {
        match drain_slot(&mut src, s, &host, &port).await {
            Ok(n) => sales += n,
            Err(why) => {
                let left = stop(&mut src, &mut dst, &dst_id, &slots[..i], &slots[i..], &why).await;
                finish(others, from, to, tls, &slots[..i], &dst_id).await?;
                return Err(MoveError::Stopped {
                    why: Box::new(why),
                    left,
                });
            }
        }
    }
    for &s in slots {
        dst.setslot(s, "NODE", &dst_id).await?;
        src.setslot(s, "NODE", &dst_id).await?;
    }
    finish(others, from, to, tls, slots, &dst_id).await?;
    Ok(Moved {
        slots: slots.len(),
        sales,
    })
}

/// Tells every other node given that `slots` are the destination's.
async fn finish(
    others: &[String],
    from: &str,
    to: &str,
    tls: Option<&TlsConfig>,
    slots: &[u16],
    dst_id: &str,
) -> Result<(), MoveError> {
    if slots.is_empty() {
        return Ok(());
    }
    for addr in others.iter().filter(|a| *a != from && *a != to) {
        let mut n = Node::open(addr, tls).await?;
        for &s in slots {
            n.setslot(s, "NODE", dst_id).await?;
        }
    }
    Ok(())
}

/// After a handover failed on `rest[0]`: the slots already drained (`done`) are finished
/// (their sales are all on the destination), and every slot of `rest` is rolled back
/// ([`roll_back`]). Returns what each slot was left in, in words.
async fn stop(
    src: &mut Node,
    dst: &mut Node,
    dst_id: &str,
    done: &[u16],
    rest: &[u16],
    why: &MoveError,
) -> String {
    let mut said = Vec::new();
    for &s in done {
        let r = async {
            dst.setslot(s, "NODE", dst_id).await?;
            src.setslot(s, "NODE", dst_id).await
        };
        said.push(match r.await {
            Ok(()) => format!("slot {s}: moved (every sale on it is on {})", dst.addr),
            Err(e) => {
                format!("slot {s}: every sale moved, the owner not set ({e}): re-run to finish")
            }
        });
    }
    // A sale left frozen may be on the destination already: only finishing is safe.
    let frozen = why.to_string().contains("stays frozen");
    for (i, &s) in rest.iter().enumerate() {
        if i == 0 && frozen {
            said.push(format!(
                "slot {s}: left MIGRATING on {} and IMPORTING on {}: a sale on it is frozen \
                 on the source and may have reached the destination; re-run the same command \
                 to finish once the destination answers",
                src.addr, dst.addr
            ));
            continue;
        }
        said.push(match roll_back(src, dst, s).await {
            Ok(()) => format!(
                "slot {s}: rolled back: STABLE and owned by {} on both nodes, its sales open there",
                src.addr
            ),
            Err(e) => format!("slot {s}: could not be rolled back ({e}); re-run the same command to finish the move"),
        });
    }
    said.join("\n")
}

/// Undoes a slot's move: every sale the destination holds on it goes back to the
/// source (`SALE.MIGRATE` the other way), what the destination staged of the sale that
/// failed is discarded, and the slot is made `STABLE` on the source, then on the
/// destination.
async fn roll_back(src: &mut Node, dst: &mut Node, slot: u16) -> Result<(), MoveError> {
    let (host, port) = src.host_port();
    drain_slot(dst, slot, &host, &port).await?;
    for sku in src.keys_in_slot(slot).await? {
        // Best effort: the destination drops idle transfers by itself anyway.
        let _ = dst.call::<()>(&["SALE.IMPORT", "ABORT", &sku]).await;
    }
    src.setslot_stable(slot).await?;
    dst.setslot_stable(slot).await
}

/// After a move: records in `ledger` that every sale the destination now holds on
/// `slots` lives on the destination's history (`sales.history_id`), so the destination
/// group's sweeper, rebuild and `adjust` take it and the source's leave it alone. The
/// destination's history must be bound (`stockgate-sweeper bind`). Idempotent, like the
/// move. Returns the sales recorded; sales the ledger does not know are left out.
pub async fn follow_ledger(
    ledger: &impl crate::ledger::Ledger,
    from: &str,
    to: &str,
    slots: &[u16],
    tls: Option<&TlsConfig>,
) -> Result<usize, MoveError> {
    let mut src = Node::open(from, tls).await?;
    let mut dst = Node::open(to, tls).await?;
    let (h_src, h_dst) = (src.history().await?, dst.history().await?);
    let bound = ledger
        .bound_histories()
        .await
        .map_err(|e| MoveError::Ledger(e.to_string()))?;
    if !bound.iter().any(|b| b.history_id == h_dst) {
        return Err(MoveError::Ledger(format!(
            "the ledger is not bound to the destination's history {h_dst}; bind it first: \
             `stockgate-sweeper --server {to} bind --history {h_dst}`"
        )));
    }
    let mut recorded = 0;
    for &s in slots {
        let slot = s.to_string();
        let n: u64 = dst.call(&["CLUSTER", "COUNTKEYSINSLOT", &slot]).await?;
        let skus: Vec<String> = dst
            .call(&["CLUSTER", "GETKEYSINSLOT", &slot, &n.to_string()])
            .await?;
        for sku in &skus {
            let now = ledger
                .move_sale_history(sku, &h_src, &h_dst)
                .await
                .map_err(|e| MoveError::Ledger(e.to_string()))?;
            match now {
                Some(h) if h == h_dst => recorded += 1,
                Some(h) => {
                    return Err(MoveError::Ledger(format!(
                        "sale {sku} is recorded on history {h}, neither the source's ({h_src}) \
                         nor the destination's; left as it is"
                    )))
                }
                None => {}
            }
        }
    }
    Ok(recorded)
}

/// Hands over every sale the source holds on `slot`, until it holds none.
async fn drain_slot(src: &mut Node, slot: u16, host: &str, port: &str) -> Result<usize, MoveError> {
    let slot_s = slot.to_string();
    let mut moved = 0;
    loop {
        let skus: Vec<String> = src
            .call(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"])
            .await?;
        if skus.is_empty() {
            return Ok(moved);
        }
        for sku in &skus {
            src.call::<()>(&["SALE.MIGRATE", host, port, sku]).await?;
            moved += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_lists() {
        assert_eq!(parse_slots("3,1-2,2").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_slots("16383").unwrap(), vec![16383]);
        assert!(parse_slots("16384").is_err());
        assert!(parse_slots("5-4").is_err());
        assert!(parse_slots("a").is_err());
    }

    #[test]
    fn the_destination_is_given_to_sale_migrate_as_host_and_port() {
        let hp = |a: &str| {
            let (h, p) = host_port(a);
            format!("{h} {p}")
        };
        assert_eq!(hp("10.0.0.2:7002"), "10.0.0.2 7002");
        assert_eq!(hp("redis://u:pw@node-b:7002/"), "node-b 7002");
        assert_eq!(hp("rediss://u:pw@node-b:7002"), "node-b 7002");
        assert_eq!(hp("rediss://node-b"), "node-b 6379");
    }
}
