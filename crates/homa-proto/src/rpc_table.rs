//! The RPC table (`docs/protocol.md` §2.1): every live RPC of an endpoint,
//! client and server, in one slab, and the numbering that gives client RPCs
//! their ids and every RPC its birth order.
//!
//! A client RPC's id is `seq << key_bits | key`, its slab key in the low
//! bits: a response finds its RPC by indexing the slab and comparing the id,
//! no hash table. Server RPCs are found through the server table
//! (`servers.rs`), which maps (peer, client id) to their key here.

use crate::peer::PeerKey;
use crate::rpc::{Rpc, RpcKey, RpcState};
use crate::time::Time;
use std::net::SocketAddr;

/// Live RPCs by key. Invariants: `free` holds exactly the keys of the
/// vacant slots, most recently freed last (so the next RPC takes the slot
/// that was used last, which is likely cached); `clients` and `servers`
/// count the live client and server RPCs; a live client RPC's id has its
/// key in the low `key_bits` bits and a sequence number of at least 1
/// above them, unique among the `2^(64 - key_bits) - 1` most recent client
/// RPCs; births strictly increase in insertion order.
pub(crate) struct RpcTable {
    slots: Vec<Option<Rpc>>,
    free: Vec<RpcKey>,
    /// Client RPCs live now (including completed ones whose freeing is
    /// deferred, whose id is 0).
    clients: usize,
    servers: usize,
    /// Bits of a client id that hold its key: enough for every key the slab
    /// can reach (`max_client_rpcs + max_server_rpcs`), at most 32. The
    /// sequence number above them (at least 32 bits) keeps ids unique over
    /// time.
    key_bits: u32,
    /// Sequence number of the next client RPC (never 0, so no id is 0).
    next_seq: u64,
    /// Birth of the next RPC.
    next_birth: u64,
    /// Slot of the server RPC of the latest delivered request (it may have
    /// been freed or reused since): an application usually answers or
    /// abandons the request it was just handed, and [`Self::latest_request`]
    /// then finds it without the peer and server tables.
    latest_request: RpcKey,
}

/// What [`RpcTable::remove`] tells about the RPC it removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Removed {
    pub is_client: bool,
    pub id: u64,
    pub peer_key: PeerKey,
    pub state: RpcState,
}

impl RpcTable {
    /// An empty table for at most `max_keys` RPCs at once; client ids'
    /// sequence numbers start from `seed` (mixed).
    pub fn new(max_keys: usize, seed: u64) -> RpcTable {
        let key_bits = (usize::BITS - max_keys.saturating_sub(1).leading_zeros()).clamp(1, 32);
        RpcTable {
            slots: Vec::new(),
            free: Vec::new(),
            clients: 0,
            servers: 0,
            key_bits,
            next_seq: (crate::splitmix64(seed) >> key_bits).max(1),
            next_birth: 0,
            latest_request: RpcKey::MAX,
        }
    }

    /// Adds an RPC and returns its key; `id` is the client's id for a
    /// server RPC, and ignored for a client RPC, which is given its id here
    /// (read it from the entry).
    #[inline]
    pub fn insert(
        &mut self,
        now: Time,
        is_client: bool,
        id: u64,
        peer: SocketAddr,
        peer_key: PeerKey,
        state: RpcState,
    ) -> RpcKey {
        let birth = self.next_birth;
        self.next_birth += 1;
        let key = match self.free.pop() {
            Some(k) => k,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as RpcKey
            }
        };
        let id = if is_client {
            // A live RPC holds its key, so ids of live RPCs differ in their
            // key bits; over time, in their sequence numbers.
            debug_assert!(
                (key as u64) < 1u64 << self.key_bits,
                "slab beyond its limits"
            );
            let seq = self.next_seq;
            self.next_seq = ((seq + 1) & (u64::MAX >> self.key_bits)).max(1);
            self.clients += 1;
            seq << self.key_bits | key as u64
        } else {
            self.servers += 1;
            id
        };
        let slot = &mut self.slots[key as usize];
        debug_assert!(slot.is_none());
        // Built in the assignment itself, so that it is written straight into
        // the slot rather than on the stack and then copied (264 bytes).
        *slot = Some(Rpc {
            is_client,
            id,
            peer,
            peer_key,
            state,
            birth,
            out: None,
            inc: None,
            last_heard: now,
            last_prod: now,
            peer_busy: false,
            restarts: 0,
            partial_response: false,
        });
        key
    }

    /// Removes live RPC `key`, dropping it in place (rather than moving the
    /// whole multi-line struct out of the slab).
    #[inline]
    pub fn remove(&mut self, key: RpcKey) -> Removed {
        let slot = &mut self.slots[key as usize];
        let rpc = slot.as_ref().expect("live rpc key");
        let removed = Removed {
            is_client: rpc.is_client,
            id: rpc.id,
            peer_key: rpc.peer_key,
            state: rpc.state,
        };
        *slot = None;
        self.free.push(key);
        if removed.is_client {
            self.clients -= 1;
        } else {
            self.servers -= 1;
        }
        removed
    }

    /// The RPC in slot `key`, if the slot exists and is live (for keys that
    /// may be stale: queued control packets, hints).
    #[inline]
    pub fn get(&self, key: RpcKey) -> Option<&Rpc> {
        self.slots.get(key as usize)?.as_ref()
    }

    /// [`Self::get`], mutable.
    #[inline]
    pub fn get_mut(&mut self, key: RpcKey) -> Option<&mut Rpc> {
        self.slots.get_mut(key as usize)?.as_mut()
    }

    /// Whether slot `key` holds a live RPC.
    #[inline]
    pub fn is_live(&self, key: RpcKey) -> bool {
        self.get(key).is_some()
    }

    /// One more than the highest key ever used: every live key is below it.
    #[inline]
    pub fn key_end(&self) -> RpcKey {
        self.slots.len() as RpcKey
    }

    /// Keys of the live RPCs, in key order.
    pub fn live_keys(&self) -> Vec<RpcKey> {
        (0..self.key_end()).filter(|&k| self.is_live(k)).collect()
    }

    /// The live RPCs, in key order.
    pub fn iter(&self) -> impl Iterator<Item = &Rpc> + '_ {
        self.slots.iter().flatten()
    }

    /// Live client RPCs.
    #[inline]
    pub fn clients(&self) -> usize {
        self.clients
    }

    /// Live server RPCs.
    #[inline]
    pub fn servers(&self) -> usize {
        self.servers
    }

    /// The slot a client id names (not necessarily a live RPC's; any id
    /// maps below `2^32`).
    #[inline]
    pub fn client_slot(&self, id: u64) -> usize {
        (id & ((1u64 << self.key_bits) - 1)) as usize
    }

    /// The live client RPC with id `id` (any value: ids come from the network).
    #[inline]
    pub fn client_key(&self, id: u64) -> Option<RpcKey> {
        let key = self.client_slot(id);
        let rpc = self.slots.get(key)?.as_ref()?;
        (rpc.is_client && rpc.id == id).then_some(key as RpcKey)
    }

    /// Notes that server RPC `key`'s request was just delivered.
    #[inline]
    pub fn set_latest_request(&mut self, key: RpcKey) {
        self.latest_request = key;
    }

    /// The latest delivered request's RPC, if it is still the live server
    /// RPC of `(peer, id)` (a check, not a lookup: other RPCs are found
    /// through the server table).
    #[inline]
    pub fn latest_request(&self, peer: &SocketAddr, id: u64) -> Option<RpcKey> {
        let r = self.get(self.latest_request)?;
        (!r.is_client && r.id == id && r.peer == *peer).then_some(self.latest_request)
    }

    /// Starts loading the line of the table's header (where the next key
    /// comes from).
    #[inline]
    pub fn prefetch_header(&self) {
        crate::table::prefetch(&self.free);
    }

    /// Starts loading the first line of the slot the next RPC will take.
    #[inline]
    pub fn prefetch_next(&self) {
        if let Some(&k) = self.free.last() {
            crate::table::prefetch(&self.slots[k as usize]);
        }
    }

    /// Starts loading every line of the slot the next RPC will take.
    #[inline]
    pub fn prefetch_next_whole(&self) {
        if let Some(slot) = self.free.last().and_then(|&k| self.slots.get(k as usize)) {
            let p = slot as *const Option<Rpc> as *const u8;
            for off in (0..std::mem::size_of::<Option<Rpc>>()).step_by(64) {
                crate::table::prefetch_ptr(p.wrapping_add(off));
            }
        }
    }

    /// Starts loading the slot a client id names.
    #[inline]
    pub fn prefetch_client(&self, id: u64) {
        if let Some(slot) = self.slots.get(self.client_slot(id)) {
            crate::table::prefetch(slot);
        }
    }
}

impl std::ops::Index<RpcKey> for RpcTable {
    type Output = Rpc;
    /// The live RPC `key` (panics on a vacant slot: keys held by the engine
    /// are live).
    #[inline]
    fn index(&self, key: RpcKey) -> &Rpc {
        self.slots[key as usize].as_ref().expect("live rpc key")
    }
}

impl std::ops::IndexMut<RpcKey> for RpcTable {
    #[inline]
    fn index_mut(&mut self, key: RpcKey) -> &mut Rpc {
        self.slots[key as usize].as_mut().expect("live rpc key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 4000))
    }

    fn client(t: &mut RpcTable) -> (RpcKey, u64) {
        let k = t.insert(0, true, 0, addr(1), 0, RpcState::ClientActive);
        (k, t[k].id)
    }

    #[test]
    fn client_ids_carry_their_key_and_find_only_their_rpc() {
        let mut t = RpcTable::new(1000, 42);
        assert_eq!(t.key_bits, 10);
        let (a, id_a) = client(&mut t);
        let (b, id_b) = client(&mut t);
        let s = t.insert(0, false, id_a, addr(2), 1, RpcState::ServerReceiving);
        assert_eq!((a, b, s), (0, 1, 2));
        assert_ne!(id_a, 0);
        assert_eq!(t.client_slot(id_a), a as usize);
        assert_eq!(t.client_slot(id_b), b as usize);
        assert_eq!(t.client_key(id_a), Some(a));
        assert_eq!(t.client_key(id_b), Some(b));
        // A server RPC's id is the client's; it is not a client key here.
        assert_eq!(t[s].id, id_a);
        let id_in_s = (id_a >> t.key_bits << t.key_bits) | s as u64;
        assert_eq!(t.client_key(id_in_s), None);
        assert_eq!((t.clients(), t.servers()), (2, 1));
        // Birth order.
        assert!(t[a].birth < t[b].birth && t[b].birth < t[s].birth);
        // A freed slot is reused, under a new id: the old one names nothing.
        let r = t.remove(a);
        assert_eq!(
            r,
            Removed {
                is_client: true,
                id: id_a,
                peer_key: 0,
                state: RpcState::ClientActive
            }
        );
        assert_eq!(t.client_key(id_a), None);
        let (a2, id_a2) = client(&mut t);
        assert_eq!(a2, a);
        assert_ne!(id_a2, id_a);
        assert_eq!(t.client_key(id_a), None);
        assert_eq!(t.client_key(id_a2), Some(a));
        // Ids from the network may be anything.
        assert_eq!(t.client_key(u64::MAX), None);
        assert_eq!(t.client_key(0), None);
    }

    #[test]
    fn the_most_recently_freed_slot_is_taken_first_and_counts_follow() {
        let mut t = RpcTable::new(64, 1);
        let keys: Vec<RpcKey> = (0..5).map(|_| client(&mut t).0).collect();
        assert_eq!(keys, [0, 1, 2, 3, 4]);
        t.remove(1);
        t.remove(3);
        assert_eq!(t.live_keys(), [0, 2, 4]);
        assert_eq!(t.iter().count(), 3);
        assert_eq!(t.key_end(), 5);
        assert!(!t.is_live(3) && t.get(3).is_none() && t.get(99).is_none());
        assert_eq!(client(&mut t).0, 3);
        assert_eq!(client(&mut t).0, 1);
        assert_eq!(client(&mut t).0, 5);
        assert_eq!((t.clients(), t.servers()), (6, 0));
    }

    #[test]
    fn sequence_numbers_wrap_without_reaching_zero() {
        let mut t = RpcTable::new(1 << 32, 0);
        assert_eq!(t.key_bits, 32);
        t.next_seq = u64::MAX >> 32;
        let (k, id) = client(&mut t);
        assert_eq!(id >> 32, u64::MAX >> 32);
        t.remove(k);
        let (_, id) = client(&mut t);
        assert_eq!(id >> 32, 1, "after the largest comes 1, never 0");
        // One key: one bit still.
        assert_eq!(RpcTable::new(1, 0).key_bits, 1);
        assert_eq!(RpcTable::new(0, 0).key_bits, 1);
    }

    #[test]
    fn the_latest_request_is_found_only_while_it_is_the_same_rpc() {
        let mut t = RpcTable::new(16, 3);
        assert_eq!(t.latest_request(&addr(2), 7), None);
        let s = t.insert(0, false, 7, addr(2), 1, RpcState::ServerInService);
        t.set_latest_request(s);
        assert_eq!(t.latest_request(&addr(2), 7), Some(s));
        assert_eq!(t.latest_request(&addr(3), 7), None, "another peer");
        assert_eq!(t.latest_request(&addr(2), 8), None, "another id");
        t.remove(s);
        assert_eq!(t.latest_request(&addr(2), 7), None, "freed");
        // Reused by a client RPC: still not a server RPC.
        let (k, _) = client(&mut t);
        assert_eq!(k, s);
        assert_eq!(t.latest_request(&addr(1), t[k].id), None);
    }
}
