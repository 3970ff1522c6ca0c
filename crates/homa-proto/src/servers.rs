//! The table of server RPCs, live ones and tombstones, keyed by (peer key,
//! client id).
//!
//! An open-addressing table with linear probing and 16-byte slots (four to a
//! cache line, half the size of a `HashMap<ServerKey, ServerEntry>` bucket),
//! written for this one job: a server holds tens of thousands of tombstones
//! (one per RPC finished in the last `tombstone_ns`), so the table is several
//! hundred KB to a few MB and every random access into it is a cache miss.
//! Owning the layout lets the endpoint touch the slots of a batch of expiring
//! tombstones ahead of removing them ([`ServerTable::prefetch`]), so that their
//! misses overlap instead of costing one full memory latency each.

use crate::peer::{PeerKey, ServerKey};
use crate::rpc::RpcKey;
use std::hash::BuildHasher;

/// What the table holds for a server RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerEntry {
    Live(RpcKey),
    /// Finished (answered and acknowledged, abandoned, or timed out after
    /// running): its request is refused until the tombstone expires. The
    /// number (31 bits) identifies the tombstone's latest entry in the
    /// endpoint's expiry queue, so that older entries (left behind when a
    /// tombstone is refreshed) are recognised as stale.
    Tomb(u32),
}

/// Marks a tombstone in `Slot::val`; live RPC keys are below it.
const TOMB: u32 = 1 << 31;
/// `Slot::peer` of an empty slot (peer keys are slab indices, far below).
const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Slot {
    id: u64,
    peer: PeerKey,
    val: u32,
}

const EMPTY_SLOT: Slot = Slot {
    id: 0,
    peer: EMPTY,
    val: 0,
};

fn encode(e: ServerEntry) -> u32 {
    match e {
        ServerEntry::Live(k) => {
            debug_assert!(k < TOMB, "RPC key {k} out of range");
            k
        }
        ServerEntry::Tomb(n) => TOMB | (n & !TOMB),
    }
}

fn decode(v: u32) -> ServerEntry {
    if v & TOMB != 0 {
        ServerEntry::Tomb(v & !TOMB)
    } else {
        ServerEntry::Live(v)
    }
}

/// Server RPCs and tombstones by (peer key, client id).
pub(crate) struct ServerTable {
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (the length is a power of two).
    mask: usize,
    len: usize,
    /// Keyed hashing: ids come from the network, so a client must not be
    /// able to pick ids that pile up in one probe run. Where entries land
    /// changes nothing observable (nothing iterates the table).
    hasher: foldhash::fast::RandomState,
}

impl Default for ServerTable {
    fn default() -> Self {
        ServerTable {
            slots: vec![EMPTY_SLOT; 16].into_boxed_slice(),
            mask: 15,
            len: 0,
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl ServerTable {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home(&self, peer: PeerKey, id: u64) -> usize {
        self.hasher.hash_one(ServerKey { peer, id }) as usize & self.mask
    }

    /// The slot holding `(peer, id)`, if any.
    #[inline]
    fn find(&self, peer: PeerKey, id: u64) -> Option<usize> {
        let mut i = self.home(peer, id);
        loop {
            let s = &self.slots[i];
            if s.peer == EMPTY {
                return None;
            }
            if s.id == id && s.peer == peer {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub fn get(&self, sk: ServerKey) -> Option<ServerEntry> {
        self.find(sk.peer, sk.id).map(|i| decode(self.slots[i].val))
    }

    /// Sets `sk`'s entry, adding it if absent; returns the previous entry.
    pub fn set(&mut self, sk: ServerKey, e: ServerEntry) -> Option<ServerEntry> {
        debug_assert!(sk.peer != EMPTY);
        if let Some(i) = self.find(sk.peer, sk.id) {
            let old = decode(self.slots[i].val);
            self.slots[i].val = encode(e);
            return Some(old);
        }
        // Grow at 5/8 full: linear probing stays within a line or two.
        if (self.len + 1) * 8 > self.slots.len() * 5 {
            self.grow();
        }
        let mut i = self.home(sk.peer, sk.id);
        while self.slots[i].peer != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = Slot {
            id: sk.id,
            peer: sk.peer,
            val: encode(e),
        };
        self.len += 1;
        None
    }

    /// Removes `sk`'s entry if it is `expect` (any entry if `None`); returns
    /// whether something was removed.
    pub fn remove_if(&mut self, sk: ServerKey, expect: Option<ServerEntry>) -> bool {
        let Some(mut hole) = self.find(sk.peer, sk.id) else {
            return false;
        };
        if expect.is_some_and(|e| encode(e) != self.slots[hole].val) {
            return false;
        }
        // Backward-shift deletion: move later members of the probe run into
        // the hole when their home allows it, so no deletion markers pile up.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let s = self.slots[j];
            if s.peer == EMPTY {
                break;
            }
            let home = self.home(s.peer, s.id);
            // `s` may move to `hole` unless its home lies cyclically in
            // (hole, j].
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY_SLOT;
        self.len -= 1;
        true
    }

    pub fn remove(&mut self, sk: ServerKey) -> bool {
        self.remove_if(sk, None)
    }

    /// Starts loading the cache line where a lookup of `sk` begins, so that
    /// a batch of lookups pays for its misses once rather than one by one.
    #[inline]
    pub fn prefetch(&self, sk: ServerKey) {
        let p = &self.slots[self.home(sk.peer, sk.id)] as *const Slot;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetching is a hint; it never faults and the address is
        // in bounds anyway.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    fn grow(&mut self) {
        let bigger = vec![EMPTY_SLOT; self.slots.len() * 2].into_boxed_slice();
        let old = std::mem::replace(&mut self.slots, bigger);
        self.mask = self.slots.len() - 1;
        for s in old.iter().filter(|s| s.peer != EMPTY) {
            let mut i = self.home(s.peer, s.id);
            while self.slots[i].peer != EMPTY {
                i = (i + 1) & self.mask;
            }
            self.slots[i] = *s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn sk(peer: PeerKey, id: u64) -> ServerKey {
        ServerKey { peer, id }
    }

    #[test]
    fn entries_round_trip() {
        for e in [
            ServerEntry::Live(0),
            ServerEntry::Live(TOMB - 1),
            ServerEntry::Tomb(0),
            ServerEntry::Tomb(TOMB - 1),
        ] {
            assert_eq!(decode(encode(e)), e);
        }
        // Tombstone numbers wrap at 31 bits.
        assert_eq!(
            decode(encode(ServerEntry::Tomb(TOMB + 5))),
            ServerEntry::Tomb(5)
        );
    }

    #[test]
    fn set_get_remove() {
        let mut t = ServerTable::default();
        assert_eq!(t.set(sk(1, 7), ServerEntry::Live(3)), None);
        assert_eq!(t.get(sk(1, 7)), Some(ServerEntry::Live(3)));
        assert_eq!(t.get(sk(2, 7)), None, "the peer is part of the key");
        assert_eq!(
            t.set(sk(1, 7), ServerEntry::Tomb(9)),
            Some(ServerEntry::Live(3))
        );
        assert_eq!(t.len(), 1);
        assert!(!t.remove_if(sk(1, 7), Some(ServerEntry::Tomb(8))));
        assert!(t.remove_if(sk(1, 7), Some(ServerEntry::Tomb(9))));
        assert!(!t.remove(sk(1, 7)));
        assert_eq!((t.get(sk(1, 7)), t.len()), (None, 0));
    }

    /// Random operations against a reference map, through growth, dense
    /// probe runs (keys that share a home) and deletions that must shift
    /// later members of a run back, including across the end of the array.
    #[test]
    fn matches_a_reference_map() {
        let mut t = ServerTable::default();
        let mut r: HashMap<(PeerKey, u64), ServerEntry> = HashMap::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..200_000u32 {
            let v = next();
            // A small key space so that sets, hits and removals all happen often.
            let key = ((v % 5) as PeerKey, (v >> 8) % 3_000);
            let e = if v & (1 << 40) != 0 {
                ServerEntry::Live((v >> 41) as u32 & (TOMB - 1))
            } else {
                ServerEntry::Tomb((v >> 41) as u32 & (TOMB - 1))
            };
            match (v >> 50) % 3 {
                0 => assert_eq!(t.set(sk(key.0, key.1), e), r.insert(key, e)),
                1 => assert_eq!(t.remove(sk(key.0, key.1)), r.remove(&key).is_some()),
                _ => assert_eq!(t.get(sk(key.0, key.1)), r.get(&key).copied()),
            }
            assert_eq!(t.len(), r.len());
            if step % 20_000 == 0 {
                for (&(p, id), &e) in &r {
                    assert_eq!(t.get(sk(p, id)), Some(e));
                }
            }
        }
        for (&(p, id), &e) in &r {
            assert_eq!(t.get(sk(p, id)), Some(e));
        }
        // Load stays at most 5/8.
        assert!(t.len() * 8 <= t.slots.len() * 5);
    }

    /// Every deletion leaves each remaining key reachable from its home.
    #[test]
    fn deletion_keeps_probe_runs_intact() {
        let mut t = ServerTable::default();
        // Fill to just under the growth threshold: long runs that wrap.
        let keys: Vec<ServerKey> = (0..10).map(|i| sk(0, i * 1_000_003)).collect();
        for (n, &k) in keys.iter().enumerate() {
            t.set(k, ServerEntry::Live(n as u32));
        }
        assert_eq!(t.slots.len(), 16);
        for (n, &k) in keys.iter().enumerate() {
            assert!(t.remove(k));
            for (m, &rest) in keys.iter().enumerate().skip(n + 1) {
                assert_eq!(t.get(rest), Some(ServerEntry::Live(m as u32)));
            }
        }
        assert!(t.slots.iter().all(|s| s.peer == EMPTY));
    }
}
