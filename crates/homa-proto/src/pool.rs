//! Receive buffer pool (seed 004): a region split into 64 KiB bpages.
//!
//! SKELETON: signatures are fixed (the engine codes against them); bodies to be
//! written.

use std::sync::Arc;

/// Size of one bpage.
pub const BPAGE_SIZE: usize = 64 * 1024;

/// Space reserved for one incoming message: where each byte of the message goes.
#[derive(Debug)]
pub struct Allocation {
    len: usize,
}

impl Allocation {
    /// Message length this allocation holds.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

struct PoolShared {}

/// The receive pool, owned by one engine.
pub struct Pool {
    shared: Arc<PoolShared>,
}

impl Pool {
    /// A pool of `bytes` (rounded up to whole bpages; at least one bpage).
    pub fn new(bytes: usize) -> Pool {
        let _ = bytes;
        Pool {
            shared: Arc::new(PoolShared {}),
        }
    }

    /// Reserves space for a whole message of `len` bytes, or `None` if the pool
    /// cannot hold it now.
    pub fn allocate(&mut self, len: usize) -> Option<Allocation> {
        let _ = (len, &self.shared);
        todo!()
    }

    /// Copies `data` to message offset `offset` of `alloc`.
    /// Panics if `offset + data.len() > alloc.len()` (engine bug).
    pub fn write(&mut self, alloc: &Allocation, offset: usize, data: &[u8]) {
        let _ = (alloc, offset, data);
        todo!()
    }

    /// Returns an allocation's space without delivering it (aborted message).
    pub fn release(&mut self, alloc: Allocation) {
        let _ = alloc;
        todo!()
    }

    /// Hands a fully written allocation to the application as a [`Message`].
    pub fn into_message(&mut self, alloc: Allocation) -> Message {
        let _ = alloc;
        todo!()
    }

    /// Total capacity in bytes.
    pub fn capacity(&self) -> usize {
        todo!()
    }

    /// Bpages currently not free (held by allocations, messages, or partial packing).
    pub fn bpages_in_use(&self) -> usize {
        todo!()
    }

    /// True when no allocation or message holds any space.
    pub fn is_empty(&self) -> bool {
        todo!()
    }
}

/// A received message, as fragments of the pool. Its space returns to the pool
/// when it is dropped. `Send + Sync`.
#[derive(Debug)]
pub struct Message {
    len: usize,
}

impl Message {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The message's bytes, in order, as contiguous pieces of the pool.
    pub fn fragments(&self) -> impl Iterator<Item = &[u8]> + '_ {
        std::iter::empty()
    }
    /// Copies the message into one vector.
    pub fn to_vec(&self) -> Vec<u8> {
        todo!()
    }
}
