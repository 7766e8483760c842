//! A room's whole state as plain values, for the engine's snapshots: what the ops applied
//! so far built, without the keys (the user hashes' key, the ticket keys and the shuffle
//! seed are derived again from the same secrets by [`Room::restore`]).

use std::collections::VecDeque;

use super::pace::Pace;
use super::queue::{Member, Place, Queue};
use super::{ConfigError, FastMap, Pass, Room, RoomConfig, TicketKeys};

/// One member of a room's queue, as a snapshot stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemberState {
    /// Keyed hash of the user id.
    pub user: u64,
    /// Slot (or pre-queue index).
    pub slot: u32,
    /// The user's join number.
    pub join: u8,
    /// Where the member stands, as [`Place::to_u8`] numbers it.
    pub place: u8,
}

/// Everything a room holds, as plain values (see the module's comment).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RoomState {
    /// Every member, sorted by user hash.
    pub members: Vec<MemberState>,
    /// Pre-open joins in join order, 0 where the member left.
    pub pre: Vec<u64>,
    /// Absolute number of the first slot of `line`.
    pub base: u32,
    /// The user of each slot from `base` on, 0 where vacated.
    pub line: Vec<u64>,
    /// Whether the pre-queue has been drawn.
    pub opened: bool,
    /// The rate bucket, in thousandths of an admission.
    pub tokens_milli: u64,
    /// When the bucket was last filled.
    pub last_fill_ms: u64,
    /// `(time, admitted)` of recent admissions, oldest first.
    pub recent: Vec<(u64, u32)>,
    /// `(user, until_ms, join)` of the admissions in flight, sorted by user.
    pub admitted: Vec<(u64, u64, u8)>,
    /// `(until_ms, user, join)` of admissions in admission order.
    pub expiry: Vec<(u64, u64, u8)>,
    /// Whether waiting buyers are told SOLDOUT.
    pub sold_out: bool,
    /// Latest time an applied op carried.
    pub clock_ms: u64,
}

impl Room {
    /// The room's state (see [`RoomState`]).
    pub fn export_state(&self) -> RoomState {
        let (members, pre, base, line, opened) = self.queue.export();
        let (tokens_milli, last_fill_ms, recent) = self.pace.export();
        let mut admitted: Vec<(u64, u64, u8)> = self
            .admitted
            .iter()
            .map(|(&u, p)| (u, p.until_ms, p.join))
            .collect();
        admitted.sort_unstable();
        RoomState {
            members: members
                .iter()
                .map(|m| MemberState {
                    user: m.user,
                    slot: m.slot,
                    join: m.join,
                    place: m.place.to_u8(),
                })
                .collect(),
            pre,
            base,
            line,
            opened,
            tokens_milli,
            last_fill_ms,
            recent,
            admitted,
            expiry: self.expiry.iter().copied().collect(),
            sold_out: self.sold_out,
            clock_ms: self.clock_ms,
        }
    }

    /// The room `state` describes, with the keys derived from the same secrets as
    /// [`Room::new`]. A member whose place byte is unknown is refused as damage.
    pub fn restore(
        sku: &str,
        config: RoomConfig,
        tickets: TicketKeys,
        room_secret: &[u8],
        state: &RoomState,
    ) -> Result<Room, RestoreError> {
        let mut room = Room::new(sku, config, tickets, room_secret)?;
        let mut members = Vec::with_capacity(state.members.len());
        for m in &state.members {
            members.push(Member {
                user: m.user,
                slot: m.slot,
                join: m.join,
                place: Place::from_u8(m.place).ok_or(RestoreError::Place(m.place))?,
            });
        }
        room.queue = Queue::restore(
            &members,
            state.pre.clone(),
            state.base,
            state.line.clone(),
            state.opened,
        );
        room.pace = Pace::restore(state.tokens_milli, state.last_fill_ms, state.recent.clone());
        let mut admitted = FastMap::default();
        for &(u, until_ms, join) in &state.admitted {
            admitted.insert(u, Pass { until_ms, join });
        }
        room.admitted = admitted;
        room.expiry = state.expiry.iter().copied().collect::<VecDeque<_>>();
        room.sold_out = state.sold_out;
        room.clock_ms = state.clock_ms;
        Ok(room)
    }
}

/// Why a room's state was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// The settings or the secrets were refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A place byte no version wrote.
    #[error("unknown place {0}")]
    Place(u8),
}
