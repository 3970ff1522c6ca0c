//! Incoming messages waiting for receive-pool space (`docs/protocol.md`
//! §4.6): when the pool cannot hold a message's first packet, the message
//! waits here until the application releases enough; then the shortest
//! waiter goes first (oldest first among equals) and its sender is asked to
//! start over.

use crate::pool::{Allocation, Pool};
use crate::rpc::RpcKey;
use std::collections::BTreeSet;

/// A waiting message: (length, birth, RPC key).
pub(crate) type WaitingMessage = (u32, u64, RpcKey);

/// Messages waiting for pool space, shortest first. Invariant (kept by the
/// endpoint): a message is here exactly while its `InMsg::waiting_for_pool`
/// is set, under its length and its RPC's birth.
#[derive(Default)]
pub(crate) struct PoolWaiters {
    waiting: BTreeSet<WaitingMessage>,
}

impl PoolWaiters {
    pub fn add(&mut self, w: WaitingMessage) {
        self.waiting.insert(w);
    }

    pub fn remove(&mut self, w: &WaitingMessage) {
        self.waiting.remove(w);
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Takes the first waiter off the queue with space for it, if the pool
    /// has room for it now (a waiter that does not fit holds up the longer
    /// ones: shortest first, strictly).
    #[inline]
    pub fn admit(&mut self, pool: &mut Pool) -> Option<(WaitingMessage, Allocation)> {
        let &w = self.waiting.first()?;
        let alloc = pool.allocate(w.0 as usize)?;
        self.waiting.remove(&w);
        Some((w, alloc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::BPAGE_SIZE;

    #[test]
    fn the_shortest_waiter_gets_space_first_and_holds_up_the_rest() {
        let mut pool = Pool::new(2 * BPAGE_SIZE);
        let all = pool.allocate(2 * BPAGE_SIZE).unwrap();
        let mut w = PoolWaiters::default();
        assert!(w.admit(&mut pool).is_none());
        w.add((3 * BPAGE_SIZE as u32, 1, 10)); // never fits
        w.add((BPAGE_SIZE as u32, 5, 11));
        w.add((BPAGE_SIZE as u32, 2, 12)); // as short, older
        w.add((100, 9, 13));
        w.remove(&(100, 9, 13));
        assert_eq!(w.len(), 3);
        assert!(w.admit(&mut pool).is_none(), "the pool is full");
        pool.release(all);
        let (first, a) = w.admit(&mut pool).unwrap();
        assert_eq!(first, (BPAGE_SIZE as u32, 2, 12));
        let (second, b) = w.admit(&mut pool).unwrap();
        assert_eq!(second, (BPAGE_SIZE as u32, 5, 11));
        assert!(w.admit(&mut pool).is_none(), "too long for the pool");
        assert_eq!(w.len(), 1);
        pool.release(a);
        pool.release(b);
    }
}
