//! A sale's waiting room carried by a move ([`super::handover`]): exported with the sale,
//! checked on the destination before anything is logged, cut into pieces when it does
//! not fit in one log record, and installed piece by piece as the import's records are
//! applied.
//!
//! The room's keys (user hashes, tickets, the pre-queue's seed) are derived from the
//! reservation key, which the move requires both groups to share: the same state gives
//! the same room there, and a ticket issued at the source verifies at the destination.
//!
//! A room cut into pieces is rebuilt in the rooms map as the pieces arrive (each piece
//! appended to what the earlier ones built), so that a snapshot taken between two records
//! of an import holds what the log before it installed. Until the last record the sale is
//! frozen, and a frozen sale's room neither admits nor takes joins.

use std::sync::atomic::Ordering;

use crate::room::queue::{Place, MAX_JOINS_PER_USER};
use crate::room::{Room, RoomState};

use super::*;

impl Engine {
    /// The room of `sku` as an export carries it; `None` when the sale has none.
    pub(super) fn export_room(&self, sku: &str) -> Option<RoomView> {
        let handle = self.rooms.read().get(sku).cloned()?;
        let room = handle.lock();
        Some(RoomView {
            sku: sku.to_string(),
            config: room.config().clone(),
            state: room.export_state(),
        })
    }

    /// Installs one piece of an imported room (the world stopped, see the module's
    /// comment). `fresh`: the piece's record registered the sale, so any room left under
    /// its sku is replaced; otherwise the piece is appended to the room there.
    pub(super) fn install_room_piece(&self, piece: &RoomView, fresh: bool) {
        let mut rooms = self.rooms.write();
        let earlier = if fresh {
            None
        } else {
            rooms
                .get(piece.sku.as_str())
                .map(|h| h.lock().export_state())
        };
        let state = match earlier {
            Some(mut whole) => {
                append_piece(&mut whole, &piece.state);
                whole
            }
            None => piece.state.clone(),
        };
        match Room::restore(
            &piece.sku,
            piece.config.clone(),
            self.ticket_keys.clone(),
            &self.room_secret,
            &state,
        ) {
            Ok(room) => {
                rooms.insert(piece.sku.as_str().into(), Arc::new(Mutex::new(room)));
                self.has_rooms.store(true, Ordering::Release);
            }
            // `check_room` proved the whole room restores before it was logged.
            Err(e) => debug_assert!(false, "imported room of {} refused: {e}", piece.sku),
        }
    }
}

/// Appends a piece's lists to the state the earlier pieces built; the pieces cut each
/// list in order ([`split_room`]), so this gives back the exported lists.
fn append_piece(whole: &mut RoomState, piece: &RoomState) {
    whole.members.extend_from_slice(&piece.members);
    whole.pre.extend_from_slice(&piece.pre);
    whole.line.extend_from_slice(&piece.line);
    whole.recent.extend_from_slice(&piece.recent);
    whole.admitted.extend_from_slice(&piece.admitted);
    whole.expiry.extend_from_slice(&piece.expiry);
}

/// An upper bound of the encoded size of a room's settings, scalars and list counts.
fn head_bound(v: &RoomView) -> usize {
    v.sku.len() + 10 + 6 * 10 + 6 * 10 + 6 * 10 + 4
}

/// Upper bounds of one entry of each list: a member, a user hash, a recent admission,
/// an admission (`admitted`, `expiry`).
const MEMBER_BOUND: usize = 10 + 5 + 1 + 1;
const USER_BOUND: usize = 10;
const RECENT_BOUND: usize = 10 + 5;
const PASS_BOUND: usize = 10 + 10 + 1;

/// An upper bound of a room's encoded size (`wal::fields::put_room`).
pub(super) fn room_bound(v: &RoomView) -> usize {
    let s = &v.state;
    head_bound(v)
        + s.members.len() * MEMBER_BOUND
        + (s.pre.len() + s.line.len()) * USER_BOUND
        + s.recent.len() * RECENT_BOUND
        + (s.admitted.len() + s.expiry.len()) * PASS_BOUND
}

/// Pieces of a room being cut: the one being filled and its size bound.
struct Pieces {
    done: Vec<RoomView>,
    current: RoomView,
    size: usize,
    head: usize,
    budget: usize,
}

impl Pieces {
    /// The state of the piece an entry of `n` bytes goes in (a new one when it would
    /// overflow a piece that holds entries already).
    fn room_for(&mut self, n: usize) -> &mut RoomState {
        if self.size + n > self.budget && self.size > self.head {
            let next = self.current.clone_head();
            self.done.push(std::mem::replace(&mut self.current, next));
            self.size = self.head;
        }
        self.size += n;
        &mut self.current.state
    }

    fn spread<T: Clone>(&mut self, items: &[T], n: usize, list: fn(&mut RoomState) -> &mut Vec<T>) {
        for item in items {
            list(self.room_for(n)).push(item.clone());
        }
    }
}

impl RoomView {
    /// The sku and settings, the lists left empty.
    fn clone_head(&self) -> RoomView {
        RoomView {
            sku: self.sku.clone(),
            config: self.config.clone(),
            state: empty_lists(&self.state),
        }
    }
}

/// The state's scalars with empty lists.
fn empty_lists(s: &RoomState) -> RoomState {
    RoomState {
        base: s.base,
        opened: s.opened,
        tokens_milli: s.tokens_milli,
        last_fill_ms: s.last_fill_ms,
        sold_out: s.sold_out,
        clock_ms: s.clock_ms,
        ..RoomState::default()
    }
}

/// Cuts a room into pieces of at most about `budget` encoded bytes, each with the room's
/// settings and scalars and the next part of each list, in order ([`append_piece`]).
pub(super) fn split_room(v: &RoomView, budget: usize) -> Vec<RoomView> {
    let head = head_bound(v);
    let mut p = Pieces {
        done: Vec::new(),
        current: v.clone_head(),
        size: head,
        head,
        budget,
    };
    let s = &v.state;
    p.spread(&s.members, MEMBER_BOUND, |s| &mut s.members);
    p.spread(&s.pre, USER_BOUND, |s| &mut s.pre);
    p.spread(&s.line, USER_BOUND, |s| &mut s.line);
    p.spread(&s.recent, RECENT_BOUND, |s| &mut s.recent);
    p.spread(&s.admitted, PASS_BOUND, |s| &mut s.admitted);
    p.spread(&s.expiry, PASS_BOUND, |s| &mut s.expiry);
    p.done.push(p.current);
    p.done
}

fn bad_room(sku: &str, what: &str) -> EngineError {
    EngineError::Import(format!(
        "the export's waiting room of {sku} is malformed: {what}"
    ))
}

/// What an imported room needs before anything is logged: the sale's sku, settings a
/// `ROOM.OPEN` accepts, and a state whose parts agree with each other (every waiting
/// buyer in the line at its slot and only there, every admission in flight a member
/// admitted with that join), so that restoring it gives a room whose ops never meet a
/// state they cannot be applied to.
pub(super) fn check_room(v: &RoomView, sku: &str) -> Result<(), EngineError> {
    if v.sku != sku {
        return Err(bad_room(sku, "it is another sale's"));
    }
    v.config
        .validate()
        .map_err(|e| bad_room(sku, &e.to_string()))?;
    let s = &v.state;
    let sorted = s.members.windows(2).all(|w| w[0].user < w[1].user);
    if !sorted
        || s.members
            .iter()
            .any(|m| m.user == 0 || m.join >= MAX_JOINS_PER_USER)
    {
        return Err(bad_room(sku, "members"));
    }
    // Every slot and pre-queue entry was taken by one of the members' joins: the line's
    // end is bounded by the export's own size, not by a number it states.
    let joins: u64 = s.members.iter().map(|m| u64::from(m.join) + 1).sum();
    let end = u64::from(s.base) + s.line.len() as u64;
    let fits = end <= joins && end <= u64::from(u32::MAX) && s.pre.len() as u64 <= joins;
    if !fits || (s.opened && !s.pre.is_empty()) || (!s.opened && !s.line.is_empty()) {
        return Err(bad_room(sku, "the line"));
    }
    check_places(s).map_err(|what| bad_room(sku, what))?;
    check_passes(s).map_err(|what| bad_room(sku, what))
}

/// Every pre-queued or waiting member at its place in the pre-queue or the line, and
/// every user there such a member at that place.
fn check_places(s: &RoomState) -> Result<(), &'static str> {
    let member = |u: u64| {
        s.members
            .binary_search_by_key(&u, |m| m.user)
            .ok()
            .and_then(|i| s.members.get(i))
    };
    let at = |u: u64, place: Place, slot: u64| {
        member(u).is_some_and(|m| m.place == place.to_u8() && u64::from(m.slot) == slot)
    };
    for (i, &u) in s.pre.iter().enumerate() {
        if u != 0 && !at(u, Place::PreQueued, i as u64) {
            return Err("the pre-queue");
        }
    }
    for (i, &u) in s.line.iter().enumerate() {
        if u != 0 && !at(u, Place::Waiting, u64::from(s.base) + i as u64) {
            return Err("the line");
        }
    }
    for m in &s.members {
        let Some(place) = Place::from_u8(m.place) else {
            return Err("a member's place");
        };
        let listed = match place {
            Place::PreQueued => s.pre.get(m.slot as usize) == Some(&m.user),
            Place::Waiting => {
                m.slot
                    .checked_sub(s.base)
                    .and_then(|i| s.line.get(i as usize))
                    == Some(&m.user)
            }
            _ => true,
        };
        if !listed {
            return Err("a waiting member's slot");
        }
    }
    Ok(())
}

/// The admissions in flight: one per admitted member, with its join, sorted by user,
/// each due in the expiry list.
fn check_passes(s: &RoomState) -> Result<(), &'static str> {
    let sorted = s.admitted.windows(2).all(|w| w[0].0 < w[1].0);
    let admitted = Place::Admitted.to_u8();
    let members = s.members.iter().filter(|m| m.place == admitted).count();
    if !sorted || members != s.admitted.len() {
        return Err("the admissions");
    }
    let due: std::collections::HashSet<(u64, u64, u8)> = s.expiry.iter().copied().collect();
    for &(user, until, join) in &s.admitted {
        let member = s
            .members
            .binary_search_by_key(&user, |m| m.user)
            .ok()
            .and_then(|i| s.members.get(i));
        let ok = member.is_some_and(|m| m.place == admitted && m.join == join)
            && due.contains(&(until, user, join));
        if !ok {
            return Err("an admission");
        }
    }
    Ok(())
}
