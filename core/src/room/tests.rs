//! The room's behaviour end to end: order, pace, expiry, sold-out, tickets, memory, and
//! replay of its ops.

use proptest::prelude::*;

use super::queue::{Queue, MAX_JOINS_PER_USER};
use super::*;

const SKU: &str = "SKU-1";

fn keys() -> TicketKeys {
    TicketKeys::new(&[("k1", &[5u8; 32])]).unwrap()
}

fn room_with(config: RoomConfig, secret: u8) -> Room {
    Room::new(SKU, config, keys(), &[secret; 32]).unwrap()
}

fn cfg(rate: u32, opens_at_ms: u64) -> RoomConfig {
    RoomConfig {
        max_rate_per_sec: rate,
        opens_at_ms,
        admit_ttl_ms: 1000,
        ..RoomConfig::default()
    }
}

fn stock(available: u64, held: u64, expiring_soon: u64) -> StockView {
    StockView {
        available,
        held,
        expiring_soon,
    }
}

fn user(i: usize) -> String {
    format!("user-{i}")
}

fn position(r: &Room, u: &str, now: u64) -> Option<u32> {
    match r.status(u, now, &stock(100, 0, 0)) {
        Ok(Status::Waiting { position, .. }) => Some(position),
        _ => None,
    }
}

#[test]
fn join_is_idempotent() {
    let mut r = room_with(cfg(10, 0), 1);
    let a = r.join("alice", 5).unwrap();
    assert_eq!(r.take_ops().len(), 2, "open, then join");
    for _ in 0..100 {
        assert_eq!(r.join("alice", 6).unwrap(), a);
    }
    assert!(r.take_ops().is_empty(), "a repeated join logs nothing");
    assert_eq!(r.waiting(), 1);
    assert_eq!(r.join("a b", 6), Err(RoomError::InvalidUser));
}

#[test]
fn first_come_first_served_after_open() {
    let mut r = room_with(cfg(3, 0), 1);
    for i in 0..10 {
        r.join(&user(i), 10).unwrap();
    }
    for i in 0..10 {
        assert_eq!(position(&r, &user(i), 10), Some(i as u32 + 1));
    }
    r.leave(&user(2));
    assert_eq!(position(&r, &user(9), 10), Some(9), "exact after a leave");
    let admitted = r.tick(10, &stock(100, 0, 0));
    let want: Vec<u64> = [0, 1, 3].iter().map(|&i| r.user_hash(&user(i))).collect();
    assert_eq!(admitted.iter().map(|a| a.user).collect::<Vec<_>>(), want);
    assert_eq!(position(&r, &user(4), 10), Some(1));
}

fn pre_queue_order(secret: u8) -> Vec<u64> {
    let mut r = room_with(cfg(1000, 100), secret);
    for i in 0..50 {
        r.join(&user(i), 10).unwrap();
        assert_eq!(
            r.status(&user(i), 10, &stock(1, 0, 0)),
            Ok(Status::BeforeOpen { opens_at_ms: 100 })
        );
    }
    r.leave(&user(7));
    r.tick(100, &stock(0, 1, 0));
    assert!(r.is_open());
    let mut by_pos: Vec<(u32, u64)> = (0..50)
        .filter_map(|i| Some((position(&r, &user(i), 100)?, r.user_hash(&user(i)))))
        .collect();
    by_pos.sort_unstable();
    let positions: Vec<u32> = by_pos.iter().map(|p| p.0).collect();
    assert_eq!(
        positions,
        (1..=49).collect::<Vec<u32>>(),
        "49 distinct places"
    );
    // Identify users by their index (the hash differs with the secret).
    let index: std::collections::HashMap<u64, u64> =
        (0..50).map(|i| (r.user_hash(&user(i)), i as u64)).collect();
    by_pos.iter().map(|p| index[&p.1]).collect()
}

#[test]
fn pre_queue_is_shuffled_by_seed() {
    let a = pre_queue_order(1);
    assert_eq!(a, pre_queue_order(1), "same seed, same order");
    assert_ne!(a, pre_queue_order(2), "another seed, another order");
    assert_ne!(
        a,
        (0..50).filter(|&i| i != 7).collect::<Vec<u64>>(),
        "shuffled"
    );
    // Joins after opening queue behind the pre-queue, in arrival order.
    let mut r = room_with(cfg(1000, 100), 1);
    r.join("early", 10).unwrap();
    r.join("late-1", 150).unwrap();
    r.join("late-2", 151).unwrap();
    assert_eq!(position(&r, "early", 151), Some(1));
    assert_eq!(position(&r, "late-2", 151), Some(3));
}

#[test]
fn admissions_never_exceed_the_budget() {
    let mut r = room_with(cfg(20, 0), 1);
    for i in 0..500 {
        r.join(&user(i), 0).unwrap();
    }
    let mut total = 0u64;
    for step in 0..200u64 {
        let now = step * 37;
        let s = stock(step % 9, step % 4, step % 3);
        let admitted = r.tick(now, &s).len() as u64;
        total += admitted;
        // Admissions already made stand when stock drops; new ones only fit the cap.
        if admitted > 0 {
            assert!(r.admitted_not_reserved() as u64 <= Pace::stock_cap(&s, 1000, 0));
        }
        // One second of burst, then the rate.
        assert!(total <= 20 + now * 20 / 1000, "{total} by {now}");
        if step % 5 == 0 {
            if let Some(i) = (0..500)
                .find(|&i| matches!(r.status(&user(i), now, &s), Ok(Status::Admitted { .. })))
            {
                r.reserved(&user(i));
            }
        }
    }
}

#[test]
fn pace_follows_stock() {
    let mut r = room_with(cfg(1000, 0), 1);
    for i in 0..20 {
        r.join(&user(i), 0).unwrap();
    }
    assert_eq!(r.tick(0, &stock(3, 0, 0)).len(), 3, "as many as units");
    assert!(
        r.tick(10, &stock(3, 0, 0)).is_empty(),
        "admitted buyers count"
    );
    // Two of them reserve: their units are held, the budget does not grow.
    r.reserved(&user(0));
    r.reserved(&user(1));
    assert!(r.tick(20, &stock(1, 2, 0)).is_empty());
    // A hold is due to expire soon: its unit counts already.
    assert_eq!(r.tick(30, &stock(1, 2, 1)).len(), 1);
    // A hold released: one more unit, one more buyer.
    assert_eq!(r.tick(40, &stock(2, 1, 1)).len(), 1);
    // Over-admission: 1.5 per unit.
    let mut r = room_with(
        RoomConfig {
            over_admit_permille: 1500,
            ..cfg(1000, 0)
        },
        1,
    );
    for i in 0..20 {
        r.join(&user(i), 0).unwrap();
    }
    assert_eq!(r.tick(0, &stock(4, 0, 0)).len(), 6);
}

#[test]
fn sold_out_with_nothing_held_tells_everyone_at_once() {
    let mut r = room_with(cfg(1000, 0), 1);
    for i in 0..30 {
        r.join(&user(i), 0).unwrap();
    }
    r.tick(0, &stock(0, 5, 0));
    assert!(matches!(
        r.status(&user(29), 0, &stock(0, 5, 0)),
        Ok(Status::Waiting { .. })
    ));
    r.tick(1, &stock(0, 0, 0));
    assert!(r.take_ops().contains(&RoomOp::SoldOut));
    for i in 0..30 {
        assert_eq!(r.status(&user(i), 1, &stock(0, 0, 0)), Ok(Status::SoldOut));
    }
    assert_eq!(r.join("newcomer", 2), Err(RoomError::SoldOut));
    assert!(
        r.join(&user(3), 2).is_ok(),
        "a held place still answers its ticket"
    );
    // Units added: the line moves again.
    assert_eq!(r.tick(3, &stock(2, 0, 0)).len(), 2);
    assert!(!r.is_sold_out());
}

#[test]
fn unused_admissions_expire_and_free_budget() {
    let mut r = room_with(cfg(1000, 0), 1);
    for i in 0..5 {
        r.join(&user(i), 0).unwrap();
    }
    let s = stock(1, 0, 0);
    assert_eq!(r.tick(0, &s).len(), 1);
    assert_eq!(
        r.status(&user(0), 500, &s),
        Ok(Status::Admitted { until_ms: 1000 })
    );
    assert!(r.tick(999, &s).is_empty());
    assert_eq!(
        r.status(&user(0), 1000, &s),
        Ok(Status::Expired),
        "at the token's expiry"
    );
    let next = r.tick(1000, &s);
    assert_eq!(next.len(), 1, "the budget went to the next buyer");
    assert_eq!(next[0].user, r.user_hash(&user(1)));
    assert_eq!(r.status(&user(0), 1000, &s), Ok(Status::Expired));
    // Leaving an admission frees its budget too.
    assert!(r.leave(&user(1)));
    assert!(!r.leave(&user(1)), "a repeated leave changes nothing");
    assert_eq!(r.tick(1001, &s).len(), 1);
    // The expired buyer may re-join, at the back.
    let t = r.join(&user(0), 1002).unwrap();
    assert_eq!(t.join, 1);
    assert_eq!(
        position(&r, &user(0), 1002),
        Some(3),
        "behind users 3 and 4"
    );
}

#[test]
fn queue_full_and_join_floods_are_refused() {
    let mut r = room_with(
        RoomConfig {
            max_waiting: 3,
            ..cfg(1000, 0)
        },
        1,
    );
    for i in 0..3 {
        r.join(&user(i), 0).unwrap();
    }
    assert_eq!(r.join("one-more", 0), Err(RoomError::QueueFull { max: 3 }));
    assert!(r.join(&user(1), 0).is_ok(), "a held place is not a new one");
    r.leave(&user(0));
    for _ in 0..MAX_JOINS_PER_USER {
        r.join("flood", 0).unwrap();
        r.leave("flood");
    }
    assert_eq!(
        r.join("flood", 0),
        Err(RoomError::TooManyJoins {
            max: MAX_JOINS_PER_USER
        })
    );
}

#[test]
fn forged_traded_and_replayed_tickets_are_refused() {
    let mut r = room_with(cfg(1000, 0), 1);
    let s = stock(0, 1, 0);
    let alice = r.join("alice", 0).unwrap();
    r.join("bob", 0).unwrap();
    assert!(r.status_ticket(&alice.text, "alice", 0, &s).is_ok());
    let refused = |r: &Room, t: &str, u: &str| r.status_ticket(t, u, 0, &s).err();
    assert_eq!(
        refused(&r, &alice.text, "bob"),
        Some(RoomError::Ticket(TicketError::WrongUser))
    );
    let forged = alice.text.replace("|alice|", "|bob|");
    assert_eq!(
        refused(&r, &forged, "bob"),
        Some(RoomError::Ticket(TicketError::BadSignature))
    );
    assert_eq!(
        refused(&r, "t1|k1|SKU-1|bob|0|xxx", "bob"),
        Some(RoomError::Ticket(TicketError::Malformed))
    );
    let other_sale = Room::new("SKU-2", cfg(1000, 0), keys(), &[1; 32])
        .unwrap()
        .join("alice", 0)
        .unwrap();
    assert_eq!(
        refused(&r, &other_sale.text, "alice"),
        Some(RoomError::Ticket(TicketError::WrongSale))
    );
    // A genuine ticket of a place given up: stale, even after a re-join.
    r.leave("alice");
    let again = r.join("alice", 0).unwrap();
    assert_eq!(
        refused(&r, &alice.text, "alice"),
        Some(RoomError::StaleTicket)
    );
    assert!(r.status_ticket(&again.text, "alice", 0, &s).is_ok());
    assert_eq!(
        refused(&r, &again.text, "carol"),
        Some(RoomError::Ticket(TicketError::WrongUser))
    );
}

/// Capacity-based bytes per waiting buyer, at every size from 1,000 to 200,000 (so
/// right after each growth of each structure), before and after opening.
#[test]
fn memory_per_waiting_buyer_is_at_most_64_bytes() {
    let mut worst = 0.0f64;
    for opened in [false, true] {
        let mut q = Queue::default();
        if opened {
            q.open(1);
        }
        for u in 1..=200_000u64 {
            q.join(u.wrapping_mul(0x9e37_79b9_7f4a_7c15).max(1));
            if u >= 1000 {
                let per = q.heap_bytes() as f64 / f64::from(q.waiting());
                worst = worst.max(per);
                assert!(
                    per <= 64.0,
                    "{per:.1} bytes per buyer at {u} (opened {opened})"
                );
            }
        }
        if !opened {
            q.open(9);
            let per = q.heap_bytes() as f64 / f64::from(q.waiting());
            assert!(per <= 64.0, "{per:.1} bytes per buyer after the shuffle");
        }
    }
    eprintln!("worst bytes per waiting buyer: {worst:.1}");
}

/// Everything replicas must agree on, in a comparable form.
fn canonical(r: &Room) -> String {
    let mut passes: Vec<_> = r.admitted.iter().map(|(u, p)| (*u, *p)).collect();
    passes.sort_unstable_by_key(|p| p.0);
    format!(
        "{:?}",
        (
            r.queue().sorted_members(),
            r.queue().line(),
            r.queue().waiting(),
            r.queue().is_open(),
            &r.pace,
            passes,
            &r.expiry,
            r.sold_out,
            r.clock_ms,
        )
    )
}

#[derive(Clone, Debug)]
enum Step {
    Join(usize),
    Leave(usize),
    Reserved(usize),
    Tick(u64, u64),
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..40).prop_map(Step::Join),
        1 => (0usize..40).prop_map(Step::Leave),
        1 => (0usize..40).prop_map(Step::Reserved),
        2 => (0u64..6, 0u64..3).prop_map(|(a, h)| Step::Tick(a, h)),
        2 => (0u64..700).prop_map(Step::Wait),
    ]
}

proptest! {
    /// Random commands applied live, then their logged ops replayed on a fresh room:
    /// same state, same answers; and each op applied twice in a row changes nothing more.
    #[test]
    fn replayed_ops_give_the_same_room(steps in proptest::collection::vec(step(), 1..120)) {
        let config = RoomConfig { max_waiting: 25, ..cfg(4, 300) };
        let mut live = room_with(config.clone(), 3);
        let mut now = 0u64;
        let mut log = Vec::new();
        for s in steps {
            match s {
                Step::Join(i) => { let _ = live.join(&user(i), now); }
                Step::Leave(i) => { live.leave(&user(i)); }
                Step::Reserved(i) => { live.reserved(&user(i)); }
                Step::Tick(a, h) => { live.tick(now, &stock(a, h, h / 2)); }
                Step::Wait(ms) => now += ms,
            }
            log.extend(live.take_ops());
        }
        let mut replica = room_with(config, 3);
        for op in &log {
            replica.apply(op);
        }
        prop_assert_eq!(canonical(&live), canonical(&replica));
        // Each op delivered twice in a row (a retried append): nothing more changes.
        let mut doubled = room_with(RoomConfig { max_waiting: 25, ..cfg(4, 300) }, 3);
        for op in &log {
            doubled.apply(op);
            doubled.apply(op);
        }
        prop_assert_eq!(canonical(&live), canonical(&doubled));
        for s in [stock(0, 0, 0), stock(2, 1, 1)] {
            for i in 0..40 {
                prop_assert_eq!(live.status(&user(i), now, &s), replica.status(&user(i), now, &s));
            }
        }
    }
}

/// A room rebuilt from its exported state answers as the original, and keeps going the
/// same way.
#[test]
fn exported_state_restores_the_same_room() {
    let mut r = room_with(cfg(5, 1_000), 1);
    for i in 0..8 {
        r.join(&user(i), 0).unwrap();
    }
    let s = stock(3, 0, 0);
    r.tick(1_000, &s);
    r.leave(&user(7));
    r.take_ops();
    let state = r.export_state();
    let mut back = Room::restore("SKU-1", cfg(5, 1_000), keys(), &[1u8; 32], &state).unwrap();
    assert_eq!(back.export_state(), state);
    assert_eq!(canonical(&back), canonical(&r));
    for i in 0..8 {
        assert_eq!(
            back.status(&user(i), 1_500, &s),
            r.status(&user(i), 1_500, &s)
        );
    }
    let (a, b) = (
        r.tick(3_000, &stock(6, 0, 0)),
        back.tick(3_000, &stock(6, 0, 0)),
    );
    assert_eq!(a, b);
    assert_eq!(r.take_ops(), back.take_ops());
}
