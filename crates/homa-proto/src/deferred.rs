//! Bookkeeping the endpoint puts off (`docs/protocol.md` §2.5): work that
//! would otherwise sit on the path from a request to its reply, or from a
//! response to the application's next request, held here until the driver
//! has a moment (`Endpoint::run_deferred`) or a decision depends on it.
//!
//! * Acknowledgements piggybacked on requests: (client address,
//!   acknowledged id). Freeing the acknowledged RPC (slot, tables,
//!   tombstone, its response's buffer) took ~100 ns of the server's path
//!   from request to reply; applied after the reply has gone out, it is as
//!   if the acknowledgement arrived a little later, which the protocol
//!   allows anyway.
//! * Client RPCs whose response has been delivered (with
//!   `Config::defer_acks`): freeing one (slab slot, request buffer, peer
//!   counts, grant pass) cost the client ~180 instructions between a
//!   response's arrival and the application's next request. Their id is
//!   0, which no packet or call names, so nothing finds them meanwhile.

use crate::rpc::RpcKey;
use std::net::SocketAddr;

/// Piggybacked acknowledgements held back at most.
pub(crate) const MAX_DEFERRED_ACKS: usize = 64;
/// Completed client RPCs whose freeing is held back at most.
pub(crate) const MAX_DEFERRED_FREES: usize = 64;

/// Invariant: at most [`MAX_DEFERRED_ACKS`] acknowledgements and
/// [`MAX_DEFERRED_FREES`] RPCs are held; a push onto a full list is a bug
/// (the endpoint applies a full list first, see [`Self::acks_full`]).
#[derive(Default)]
pub(crate) struct Deferred {
    acks: Vec<(SocketAddr, u64)>,
    frees: Vec<RpcKey>,
}

impl Deferred {
    /// Whether anything is held.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.acks.is_empty() && self.frees.is_empty()
    }

    #[inline]
    pub fn has_acks(&self) -> bool {
        !self.acks.is_empty()
    }

    #[inline]
    pub fn has_frees(&self) -> bool {
        !self.frees.is_empty()
    }

    /// Completed client RPCs held (they still count as live RPCs in the
    /// table, but not to the application).
    #[inline]
    pub fn frees(&self) -> usize {
        self.frees.len()
    }

    /// Whether the acknowledgements must be applied before another is held.
    #[inline]
    pub fn acks_full(&self) -> bool {
        self.acks.len() >= MAX_DEFERRED_ACKS
    }

    /// Whether the frees must be applied before another is held.
    #[inline]
    pub fn frees_full(&self) -> bool {
        self.frees.len() >= MAX_DEFERRED_FREES
    }

    /// Holds client `from`'s acknowledgement of RPC `id`.
    #[inline]
    pub fn push_ack(&mut self, from: SocketAddr, id: u64) {
        debug_assert!(!self.acks_full());
        self.acks.push((from, id));
    }

    /// Holds the freeing of completed client RPC `key`.
    #[inline]
    pub fn push_free(&mut self, key: RpcKey) {
        debug_assert!(!self.frees_full());
        self.frees.push(key);
    }

    /// The next RPC to free (the latest held first).
    #[inline]
    pub fn pop_free(&mut self) -> Option<RpcKey> {
        self.frees.pop()
    }

    /// Takes the held acknowledgements, in the order they came; give the
    /// list back with [`Self::return_acks`] to keep its allocation.
    #[inline]
    pub fn take_acks(&mut self) -> Vec<(SocketAddr, u64)> {
        std::mem::take(&mut self.acks)
    }

    /// Returns the list [`Self::take_acks`] took, emptied.
    #[inline]
    pub fn return_acks(&mut self, mut acks: Vec<(SocketAddr, u64)>) {
        debug_assert!(self.acks.is_empty());
        acks.clear();
        self.acks = acks;
    }

    /// Forgets the held acknowledgements (the endpoint shuts down).
    pub fn clear_acks(&mut self) {
        self.acks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_work_is_bounded_and_given_back_in_order() {
        let a = SocketAddr::from(([10, 0, 0, 1], 1));
        let mut d = Deferred::default();
        assert!(d.is_empty());
        for id in 0..MAX_DEFERRED_ACKS as u64 {
            assert!(!d.acks_full());
            d.push_ack(a, id);
        }
        assert!(d.acks_full() && d.has_acks() && !d.is_empty());
        let acks = d.take_acks();
        assert!(!d.has_acks());
        assert_eq!(
            acks.iter().map(|x| x.1).collect::<Vec<_>>(),
            (0..MAX_DEFERRED_ACKS as u64).collect::<Vec<_>>()
        );
        let cap = acks.capacity();
        d.return_acks(acks);
        assert!(!d.has_acks() && d.acks.capacity() == cap, "allocation kept");
        for k in 0..MAX_DEFERRED_FREES as RpcKey {
            d.push_free(k);
        }
        assert!(d.frees_full() && d.frees() == MAX_DEFERRED_FREES);
        assert_eq!(d.pop_free(), Some(MAX_DEFERRED_FREES as RpcKey - 1));
        while d.pop_free().is_some() {}
        d.push_ack(a, 1);
        d.clear_acks();
        assert!(d.is_empty());
    }
}
