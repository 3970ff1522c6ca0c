//! The expiry side of tombstones (`docs/protocol.md` §2.4): the FIFO queue
//! of expiry times of finished server RPCs' ids, their numbering and count.
//! The ids themselves live in the server table (`ServerEntry::Tomb(n)`), so
//! that the lookup a request's DATA needs anyway also finds its tombstone;
//! the endpoint wires the two together.

use crate::peer::{PeerKey, ServerKey};
use crate::time::Time;
use std::collections::VecDeque;

/// Most queue entries kept at once (a refreshed tombstone has a stale older
/// entry too); beyond that the oldest entry is dropped.
pub(crate) const MAX_TOMBSTONES: usize = 1 << 16;
/// Expired tombstones are removed this many at a time, their table slots
/// loaded together first so that their cache misses overlap.
pub(crate) const EXPIRY_BATCH: usize = 8;
/// Most queue entries one timer tick processes: expiry normally happens as
/// new tombstones are made, and a tick that catches up on a backlog must not
/// hold up the driver for long.
pub(crate) const MAX_TICK_EXPIRY: usize = 256;

/// An entry of the tombstone expiry queue (in expiry order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TombRef {
    pub expiry: Time,
    pub id: u64,
    pub peer: PeerKey,
    /// Matches the table's `Tomb(n)` while this is the tombstone's latest entry.
    pub n: u32,
}

impl TombRef {
    pub fn key(&self) -> ServerKey {
        ServerKey {
            peer: self.peer,
            id: self.id,
        }
    }
}

/// Tombstones in expiry order. Invariants: entries are pushed with
/// non-decreasing expiry (one lifetime after a non-decreasing `now`);
/// `batch_due` is the expiry of entry `EXPIRY_BATCH - 1` (`Time::MAX` with
/// fewer entries); `count` is the number of `Tomb(_)` entries in the server
/// table, kept by the endpoint through [`Self::made`] and [`Self::removed`].
#[derive(Debug)]
pub(crate) struct Tombstones {
    /// Tombstones in the server table now.
    count: usize,
    /// Expiry queue; an entry whose tombstone was refreshed since (its
    /// number no longer matches the table's) is skipped.
    queue: VecDeque<TombRef>,
    /// Expiry of the queue's entry `EXPIRY_BATCH - 1`: when a whole batch
    /// is due. Kept here so that making a tombstone does not read the
    /// (cold) front of the queue.
    batch_due: Time,
    /// Number of the next queue entry (wraps; 31 bits are kept).
    next_n: u32,
}

impl Default for Tombstones {
    fn default() -> Self {
        Tombstones {
            count: 0,
            queue: VecDeque::new(),
            batch_due: Time::MAX,
            next_n: 0,
        }
    }
}

impl Tombstones {
    /// Tombstones in the server table.
    #[inline(always)]
    pub fn count(&self) -> usize {
        self.count
    }

    /// A tombstone was written into the table (not a refresh).
    #[inline(always)]
    pub fn made(&mut self) {
        self.count += 1;
    }

    /// A tombstone left the table.
    #[inline(always)]
    pub fn removed(&mut self) {
        self.count -= 1;
    }

    /// The queue has no room for another entry.
    #[inline(always)]
    pub fn is_full(&self) -> bool {
        self.queue.len() >= MAX_TOMBSTONES
    }

    /// The number for a new entry (the table's `Tomb(n)`).
    #[inline(always)]
    pub fn next_number(&mut self) -> u32 {
        let n = self.next_n & !(1 << 31);
        self.next_n = self.next_n.wrapping_add(1);
        n
    }

    /// Queues `sk`'s tombstone, number `n`, expiring at `expiry`.
    #[inline(always)]
    pub fn push(&mut self, expiry: Time, sk: ServerKey, n: u32) {
        self.queue.push_back(TombRef {
            expiry,
            id: sk.id,
            peer: sk.peer,
            n,
        });
        if self.queue.len() == EXPIRY_BATCH {
            self.batch_due = expiry;
        }
        debug_assert_eq!(self.batch_due, self.batch_expiry());
    }

    /// Whether a whole batch has expired by `now`.
    #[inline(always)]
    pub fn batch_due(&self, now: Time) -> bool {
        self.batch_due <= now
    }

    /// Expiry of the oldest entry.
    pub fn front_expiry(&self) -> Option<Time> {
        self.queue.front().map(|t| t.expiry)
    }

    /// Takes up to [`EXPIRY_BATCH`] entries expiring at or before `now` off
    /// the queue into `batch`, calling `prefetch` with each one's key first
    /// (so their table slots load together); returns how many.
    #[inline(always)]
    pub fn take_due(
        &mut self,
        now: Time,
        batch: &mut [Option<TombRef>; EXPIRY_BATCH],
        mut prefetch: impl FnMut(ServerKey),
    ) -> usize {
        let mut len = 0;
        for t in self.queue.iter().take(EXPIRY_BATCH) {
            if t.expiry > now {
                break;
            }
            prefetch(t.key());
            batch[len] = Some(*t);
            len += 1;
        }
        self.queue.drain(..len);
        self.batch_due = self.batch_expiry();
        len
    }

    #[inline(always)]
    fn batch_expiry(&self) -> Time {
        self.queue
            .get(EXPIRY_BATCH - 1)
            .map_or(Time::MAX, |t| t.expiry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::Peers;
    use std::net::SocketAddr;

    fn key(peers: &mut Peers, id: u64) -> ServerKey {
        let addr: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let peer = match peers.find(addr) {
            Some(k) => k,
            None => peers.insert(addr, [u32::MAX; 8], 0),
        };
        ServerKey { peer, id }
    }

    #[test]
    fn batches_come_due_when_their_last_entry_expires() {
        let mut peers = Peers::default();
        let mut t = Tombstones::default();
        for i in 0..EXPIRY_BATCH as u64 - 1 {
            let n = t.next_number();
            t.push(100 + i, key(&mut peers, i), n);
        }
        assert!(!t.batch_due(u64::MAX - 1), "no whole batch yet");
        let n = t.next_number();
        t.push(200, key(&mut peers, 99), n);
        assert!(!t.batch_due(199));
        assert!(t.batch_due(200));
        assert_eq!(t.front_expiry(), Some(100));
        // Only what has expired leaves, in order, each announced first.
        let mut seen = Vec::new();
        let mut batch = [None; EXPIRY_BATCH];
        let len = t.take_due(102, &mut batch, |sk| seen.push(sk.id));
        assert_eq!(len, 3);
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(
            batch
                .iter()
                .flatten()
                .map(|r| (r.id, r.n))
                .collect::<Vec<_>>(),
            [(0, 0), (1, 1), (2, 2)]
        );
        assert_eq!(t.front_expiry(), Some(103));
        assert!(!t.batch_due(u64::MAX - 1), "five entries left");
        let len = t.take_due(u64::MAX, &mut [None; EXPIRY_BATCH], |_| ());
        assert_eq!(len, 5);
        assert_eq!(t.front_expiry(), None);
    }

    #[test]
    fn numbers_keep_31_bits_and_count_follows_the_table() {
        let mut t = Tombstones {
            next_n: u32::MAX,
            ..Tombstones::default()
        };
        assert_eq!(t.next_number(), u32::MAX >> 1);
        assert_eq!(t.next_number(), 0);
        t.made();
        t.made();
        t.removed();
        assert_eq!(t.count(), 1);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut peers = Peers::default();
        let sk = key(&mut peers, 1);
        let mut t = Tombstones::default();
        for i in 0..MAX_TOMBSTONES as u64 {
            assert!(!t.is_full());
            let n = t.next_number();
            t.push(i, sk, n);
        }
        assert!(t.is_full());
        let len = t.take_due(0, &mut [None; EXPIRY_BATCH], |_| ());
        assert_eq!(len, 1);
        assert!(!t.is_full());
    }
}
