//! The table of server RPCs, live ones and tombstones, keyed by (peer key,
//! client id).
//!
//! A [`LinearTable`] of 16-byte slots (four to a cache line, half the size of
//! a `HashMap<ServerKey, ServerEntry>` bucket): a server holds tens of
//! thousands of tombstones (one per RPC finished in the last `tombstone_ns`),
//! so the table is several hundred KB to a few MB and every random access
//! into it is a cache miss. The endpoint loads the slots of a batch of
//! expiring tombstones ahead of removing them ([`ServerTable::prefetch`]), so
//! that their misses overlap instead of costing one memory latency each.

use crate::peer::{PeerKey, ServerKey};
use crate::rpc::RpcKey;
use crate::table::{LinearTable, Slot};

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
struct ServerSlot {
    id: u64,
    peer: PeerKey,
    val: u32,
}

impl Slot for ServerSlot {
    type Key = ServerKey;
    const EMPTY: ServerSlot = ServerSlot {
        id: 0,
        peer: EMPTY,
        val: 0,
    };
    #[inline]
    fn is_empty(&self) -> bool {
        self.peer == EMPTY
    }
    #[inline]
    fn key(&self) -> ServerKey {
        ServerKey {
            peer: self.peer,
            id: self.id,
        }
    }
}

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
#[derive(Default)]
pub(crate) struct ServerTable {
    table: LinearTable<ServerSlot>,
}

impl ServerTable {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    #[inline]
    pub fn get(&self, sk: ServerKey) -> Option<ServerEntry> {
        self.table.find(sk).map(|i| decode(self.table.at(i).val))
    }

    /// Sets `sk`'s entry, adding it if absent; returns the previous entry.
    pub fn set(&mut self, sk: ServerKey, e: ServerEntry) -> Option<ServerEntry> {
        debug_assert!(sk.peer != EMPTY);
        if let Some(i) = self.table.find(sk) {
            let slot = self.table.at_mut(i);
            let old = decode(slot.val);
            slot.val = encode(e);
            return Some(old);
        }
        self.table.insert_new(ServerSlot {
            id: sk.id,
            peer: sk.peer,
            val: encode(e),
        });
        None
    }

    /// Removes `sk`'s entry if it is `expect` (any entry if `None`); returns
    /// whether something was removed.
    pub fn remove_if(&mut self, sk: ServerKey, expect: Option<ServerEntry>) -> bool {
        let Some(i) = self.table.find(sk) else {
            return false;
        };
        if expect.is_some_and(|e| encode(e) != self.table.at(i).val) {
            return false;
        }
        self.table.remove_at(i);
        true
    }

    pub fn remove(&mut self, sk: ServerKey) -> bool {
        self.remove_if(sk, None)
    }

    /// See [`LinearTable::prefetch`].
    #[inline]
    pub fn prefetch(&self, sk: ServerKey) {
        self.table.prefetch(sk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(t.get(sk(1, 8)), None);
        assert_eq!(
            t.set(sk(1, 7), ServerEntry::Tomb(9)),
            Some(ServerEntry::Live(3))
        );
        assert_eq!(t.len(), 1);
        assert!(!t.remove_if(sk(1, 7), Some(ServerEntry::Tomb(8))));
        assert!(t.remove_if(sk(1, 7), Some(ServerEntry::Tomb(9))));
        assert!(!t.remove(sk(1, 7)));
        assert_eq!((t.get(sk(1, 7)), t.len()), (None, 0));
        // Many peers and ids: each found under its own pair only.
        for p in 0..50 {
            for id in 0..50 {
                t.set(sk(p, id), ServerEntry::Live(p * 100 + id as u32));
            }
        }
        for p in 0..50 {
            for id in 0..50 {
                assert_eq!(
                    t.get(sk(p, id)),
                    Some(ServerEntry::Live(p * 100 + id as u32))
                );
            }
        }
        assert_eq!(t.len(), 2_500);
    }
}
