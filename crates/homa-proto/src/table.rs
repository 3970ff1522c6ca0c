//! A small open-addressing hash table (linear probing, backward-shift
//! deletion) for the engine's per-packet lookups.
//!
//! The engine's tables are large and cold in a simulator of many hosts, so
//! what matters is cache lines per lookup: a `HashMap` reads a control-byte
//! group and then a bucket (two lines), this reads the slot where the key's
//! probe run starts (usually one line; slots are 16 or 32 bytes). Owning the
//! layout also allows [`LinearTable::prefetch`].

use std::hash::{BuildHasher, Hash};

/// Starts loading the cache line holding `*x` (a hint: the engine's tables
/// are cold in a simulator of many hosts, and a packet needs several of them,
/// so starting the loads early lets their misses overlap).
#[inline]
pub(crate) fn prefetch<T>(x: &T) {
    prefetch_ptr(x as *const T as *const u8);
}

/// [`prefetch`] of the line holding an address (any address: prefetching
/// never faults).
#[inline]
pub(crate) fn prefetch_ptr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// What a table slot holds: a key and a value, or nothing.
pub(crate) trait Slot: Copy {
    type Key: Copy + Eq + Hash;
    /// The empty slot.
    const EMPTY: Self;
    fn is_empty(&self) -> bool;
    /// The key of a full slot.
    fn key(&self) -> Self::Key;
}

/// Slots of type `S`, kept at most 5/8 full.
pub(crate) struct LinearTable<S: Slot> {
    slots: Box<[S]>,
    /// `slots.len() - 1` (the length is a power of two).
    mask: usize,
    len: usize,
    /// Keyed hashing: keys come from the network, so a sender must not be
    /// able to pick keys that pile up in one probe run. Where entries land
    /// changes nothing observable (nothing iterates the table).
    hasher: foldhash::fast::RandomState,
}

impl<S: Slot> Default for LinearTable<S> {
    fn default() -> Self {
        LinearTable {
            slots: vec![S::EMPTY; 16].into_boxed_slice(),
            mask: 15,
            len: 0,
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<S: Slot> LinearTable<S> {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home(&self, key: S::Key) -> usize {
        self.hasher.hash_one(key) as usize & self.mask
    }

    /// Index of the slot holding `key`, if any.
    #[inline]
    pub fn find(&self, key: S::Key) -> Option<usize> {
        let mut i = self.home(key);
        loop {
            let s = &self.slots[i];
            if s.is_empty() {
                return None;
            }
            if s.key() == key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The full slot at index `i` (from [`LinearTable::find`]).
    #[inline]
    pub fn at(&self, i: usize) -> &S {
        &self.slots[i]
    }

    /// The full slot at index `i`; its key must not be changed.
    #[inline]
    pub fn at_mut(&mut self, i: usize) -> &mut S {
        &mut self.slots[i]
    }

    /// Adds `slot`, whose key must not be in the table yet.
    pub fn insert_new(&mut self, slot: S) {
        debug_assert!(!slot.is_empty() && self.find(slot.key()).is_none());
        // Grow at 5/8 full: probe runs stay within a line or two.
        if (self.len + 1) * 8 > self.slots.len() * 5 {
            self.grow();
        }
        self.place(slot);
        self.len += 1;
    }

    fn place(&mut self, slot: S) {
        let mut i = self.home(slot.key());
        while !self.slots[i].is_empty() {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = slot;
    }

    /// Empties the slot at index `i` (from [`LinearTable::find`]).
    pub fn remove_at(&mut self, mut hole: usize) {
        debug_assert!(!self.slots[hole].is_empty());
        // Backward-shift deletion: move later members of the probe run into
        // the hole when their home allows it, so no deletion markers pile up.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let s = self.slots[j];
            if s.is_empty() {
                break;
            }
            let home = self.home(s.key());
            // `s` may move to `hole` unless its home lies cyclically in
            // (hole, j].
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = S::EMPTY;
        self.len -= 1;
    }

    /// Removes `key`'s slot if there is one; returns it.
    pub fn remove(&mut self, key: S::Key) -> Option<S> {
        let i = self.find(key)?;
        let s = self.slots[i];
        self.remove_at(i);
        Some(s)
    }

    /// Starts loading the cache line where a lookup of `key` begins, so that
    /// a batch of lookups pays for its misses once rather than one by one.
    #[inline]
    pub fn prefetch(&self, key: S::Key) {
        prefetch(&self.slots[self.home(key)]);
    }

    fn grow(&mut self) {
        let bigger = vec![S::EMPTY; self.slots.len() * 2].into_boxed_slice();
        let old = std::mem::replace(&mut self.slots, bigger);
        self.mask = self.slots.len() - 1;
        for &s in old.iter().filter(|s| !s.is_empty()) {
            self.place(s);
        }
    }

    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Pair {
        k: u32,
        v: u32,
    }

    impl Slot for Pair {
        type Key = u32;
        const EMPTY: Pair = Pair { k: u32::MAX, v: 0 };
        fn is_empty(&self) -> bool {
            self.k == u32::MAX
        }
        fn key(&self) -> u32 {
            self.k
        }
    }

    /// Random inserts, updates, lookups and removals against a reference
    /// map, through growth, dense probe runs and deletions that shift later
    /// members of a run back, including across the end of the array.
    #[test]
    fn matches_a_reference_map() {
        let mut t = LinearTable::<Pair>::default();
        let mut r: HashMap<u32, u32> = HashMap::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for step in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A small key space so that hits, misses and removals all happen.
            let k = (x % 3_000) as u32;
            let v = (x >> 32) as u32;
            match (x >> 20) % 3 {
                0 => match t.find(k) {
                    Some(i) => {
                        t.at_mut(i).v = v;
                        assert!(r.insert(k, v).is_some());
                    }
                    None => {
                        t.insert_new(Pair { k, v });
                        assert!(r.insert(k, v).is_none());
                    }
                },
                1 => assert_eq!(t.remove(k).map(|p| p.v), r.remove(&k)),
                _ => assert_eq!(t.find(k).map(|i| t.at(i).v), r.get(&k).copied()),
            }
            assert_eq!(t.len(), r.len());
            if step % 20_000 == 0 {
                for (&k, &v) in &r {
                    assert_eq!(t.find(k).map(|i| t.at(i).v), Some(v));
                }
            }
        }
        assert!(t.len() * 8 <= t.capacity() * 5);
    }

    /// Every deletion leaves each remaining key reachable, in a table whose
    /// probe runs wrap around the end of the array.
    #[test]
    fn deletion_keeps_probe_runs_intact() {
        let mut t = LinearTable::<Pair>::default();
        let keys: Vec<u32> = (0..10).map(|i| i * 1_000_003).collect();
        for (n, &k) in keys.iter().enumerate() {
            t.insert_new(Pair { k, v: n as u32 });
        }
        assert_eq!(t.capacity(), 16);
        for (n, &k) in keys.iter().enumerate() {
            assert!(t.remove(k).is_some());
            for (m, &rest) in keys.iter().enumerate().skip(n + 1) {
                assert_eq!(t.find(rest).map(|i| t.at(i).v), Some(m as u32));
            }
        }
        assert!(t.slots.iter().all(|s| s.is_empty()));
    }
}
