//! Interned user ids, one table per sale: a reservation stores a 4-byte [`UserId`]
//! instead of its own copy of the user's name.
//!
//! Names are never freed while the sale lives: a user who held a reservation in a sale
//! is likely to come back to it (checkout, retries), a name costs its bytes plus about
//! 12 bytes of index, and never freeing means an id stays valid without a reference
//! count, so views can be built from a copied reservation after its stripe lock is gone
//! (snapshots). Only users who got a reservation are interned, never refused ones.
//!
//! The table is striped by the name's hash so buyers of one hot sale do not queue on one
//! lock; the lock of a stripe is a leaf (nothing is taken while holding it).

use std::hash::BuildHasher;

use crossbeam::utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::Mutex;

/// Stripes per sale (a power of two; the id's low bits name the stripe).
const STRIPE_BITS: u32 = 4;
const STRIPES: usize = 1 << STRIPE_BITS;
/// Names a stripe can hold: the rest of the id's bits.
const MAX_PER_STRIPE: usize = (u32::MAX >> STRIPE_BITS) as usize;

/// A user of one sale; meaningful only with the sale's [`Names`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UserId(u32);

#[derive(Default)]
struct Stripe {
    /// Every name of the stripe, back to back (user ids are ASCII, see `ident`).
    bytes: String,
    /// Where name `i` starts in `bytes`; it ends where name `i + 1` starts.
    starts: Vec<u32>,
    /// Local indices, found by the name's hash.
    index: HashTable<u32>,
}

/// A sale's interned user names: each name stored once, named by a 4-byte id.
pub struct Names {
    /// Keyed (foldhash with a random seed): user ids come from clients, though only
    /// with an admission token the server signed.
    hasher: foldhash::fast::RandomState,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            hasher: Default::default(),
            stripes: (0..STRIPES).map(|_| Default::default()).collect(),
        }
    }
}

impl Names {
    /// The id of `name`, interning it if new; `None` only if the sale's table is full
    /// (about 4 billion names or 4 GiB of them in one stripe).
    pub fn intern(&self, name: &str) -> Option<UserId> {
        let h = self.hasher.hash_one(name);
        let s = (h >> (64 - STRIPE_BITS)) as usize;
        let mut guard = self.stripes[s].lock();
        let stripe = &mut *guard;
        let found = stripe.index.find(h, |&i| {
            st_name(&stripe.bytes, &stripe.starts, i) == Some(name)
        });
        if let Some(&i) = found {
            return Some(UserId(i << STRIPE_BITS | s as u32));
        }
        let i = stripe.starts.len();
        let start = u32::try_from(stripe.bytes.len()).ok()?;
        if i >= MAX_PER_STRIPE || start.checked_add(name.len() as u32).is_none() {
            return None;
        }
        stripe.starts.push(start);
        stripe.bytes.push_str(name);
        let hasher = &self.hasher;
        let (bytes, starts) = (&stripe.bytes, &stripe.starts);
        stripe.index.insert_unique(h, i as u32, |&j| {
            hasher.hash_one(st_name(bytes, starts, j).unwrap_or(""))
        });
        Some(UserId((i as u32) << STRIPE_BITS | s as u32))
    }

    /// The name behind `id` (empty for an id this table never gave out).
    pub fn name(&self, id: UserId) -> String {
        let s = (id.0 as usize) & (STRIPES - 1);
        let stripe = self.stripes[s].lock();
        let n = st_name(&stripe.bytes, &stripe.starts, id.0 >> STRIPE_BITS);
        debug_assert!(n.is_some(), "unknown user id {id:?}");
        n.unwrap_or("").to_string()
    }
}

/// Name `i` of a stripe given its parts (the index's closures borrow them separately).
fn st_name<'a>(bytes: &'a str, starts: &[u32], i: u32) -> Option<&'a str> {
    let i = i as usize;
    let start = *starts.get(i)? as usize;
    let end = starts.get(i + 1).map_or(bytes.len(), |&e| e as usize);
    bytes.get(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_exact() {
        let n = Names::default();
        let ids: Vec<UserId> = (0..5000)
            .map(|i| n.intern(&format!("user-{i}")).unwrap())
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(n.intern(&format!("user-{i}")), Some(*id));
            assert_eq!(n.name(*id), format!("user-{i}"));
        }
        // A prefix of another name is another name.
        let a = n.intern("ab").unwrap();
        let b = n.intern("abc").unwrap();
        assert_ne!(a, b);
        assert_eq!(n.name(a), "ab");
        assert_eq!(n.name(b), "abc");
    }
}
