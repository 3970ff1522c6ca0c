//! The event queue: a binary min-heap ordered by (time, sequence number).
//!
//! The sequence number is assigned at insertion, so events scheduled for the
//! same instant run in the order they were scheduled. That, and the absence of
//! any hash-ordered container, is what makes a run reproducible.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Virtual time in nanoseconds (same unit as [`homa_proto::Time`]).
pub type Time = u64;

/// One scheduled event: plain indices, no heap allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ev {
    /// Port `port` finished serializing the packet it was sending.
    TxDone { port: u32 },
    /// Packet `pkt` (slab index) reached the far end of link `port`, after the
    /// propagation latency and the receiving node's own delay.
    Arrive { port: u32, pkt: u32 },
    /// A host timer; `kind` and `token` belong to the [`crate::Hosts`] implementation.
    Timer { host: u32, kind: u32, token: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    time: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest event.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// Pending events, earliest first, ties in insertion order.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    heap: BinaryHeap<Entry>,
    next_seq: u64,
}

impl EventQueue {
    pub(crate) fn push(&mut self, time: Time, ev: Ev) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry { time, seq, ev });
    }

    pub(crate) fn pop(&mut self) -> Option<(Time, Ev)> {
        self.heap.pop().map(|e| (e.time, e.ev))
    }

    pub(crate) fn peek_time(&self) -> Option<Time> {
        self.heap.peek().map(|e| e.time)
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Total events ever scheduled.
    pub(crate) fn scheduled(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, Ev::TxDone { port: 0 });
        q.push(3, Ev::TxDone { port: 1 });
        q.push(5, Ev::TxDone { port: 2 });
        q.push(3, Ev::TxDone { port: 3 });
        q.push(0, Ev::TxDone { port: 4 });
        let order: Vec<(Time, u32)> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| match e {
                Ev::TxDone { port } => (t, port),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, vec![(0, 4), (3, 1), (3, 3), (5, 0), (5, 2)]);
        assert_eq!(q.len(), 0);
        assert_eq!(q.scheduled(), 5);
    }
}
