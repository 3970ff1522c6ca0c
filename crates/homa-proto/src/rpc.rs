//! Per-RPC state: the outgoing and incoming message of each RPC.

use crate::partial::Progress;
use crate::peer::PeerKey;
use crate::pool::Allocation;
use crate::sendbuf::Payload;
use crate::time::Time;
use smallvec::SmallVec;
use std::net::SocketAddr;
use std::sync::Arc;

/// Index of an RPC in the endpoint's slab.
pub(crate) type RpcKey = u32;

/// Most disjoint received ranges one incoming message may have. Legitimate
/// traffic has one range plus one per lost packet still missing; the cap keeps a
/// hostile sender from growing the list without bound.
pub(crate) const MAX_RANGES: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RpcState {
    /// Client: sending the request and/or waiting for the response.
    ClientActive,
    /// Server: receiving the request.
    ServerReceiving,
    /// Server: request delivered; the application is working on it.
    ServerInService,
    /// Server: sending the response (or waiting for the client's ACK once all of
    /// it has been sent).
    ServerResponding,
}

/// A message being sent.
pub(crate) struct OutMsg {
    pub(crate) data: Payload,
    pub(crate) len: u32,
    /// Bytes sent without a grant.
    pub(crate) unsched: u32,
    /// First byte never transmitted.
    pub(crate) next_offset: u32,
    /// May transmit up to here.
    pub(crate) granted: u32,
    /// Priority of scheduled packets, from the latest GRANT.
    pub(crate) sched_priority: u8,
    /// Priority of unscheduled packets (from the peer's cutoffs).
    pub(crate) unsched_priority: u8,
    /// A pending retransmission `[start, end)` at a priority: the range
    /// being sent now.
    pub(crate) retx: Option<(u32, u32, u8)>,
    /// Further ranges asked for (a receiver asks for every gap it has),
    /// disjoint from `retx`, sent after it in order at its priority. Empty
    /// unless `retx` is set; no allocation below three of them.
    pub(crate) retx_more: RangeSet,
    /// Remaining bytes under which the message sits in the SRPT sets, if it does.
    pub(crate) queued: Option<u32>,
    /// A zero-length message still takes one (empty) DATA packet.
    pub(crate) zero_sent: bool,
    /// When it last sent all it was granted (then waited for a grant).
    pub(crate) stalled_at: Time,
    /// When it last transmitted new bytes.
    pub(crate) sent_at: Time,
    /// When its current burst of new bytes began (its first transmission,
    /// or the first after a pause of at least `Derived::resend_guard_ns`), and the offset
    /// it began at: bytes from there on may still be in flight when a RESEND
    /// arrives within the guard (outgoing.rs, `handle_resend`).
    pub(crate) burst_at: Time,
    pub(crate) burst_offset: u32,
}

impl OutMsg {
    pub(crate) fn new(data: Payload, unsched: u32, unsched_priority: u8) -> OutMsg {
        let len = data.len() as u32;
        let unsched = unsched.min(len);
        OutMsg {
            data,
            len,
            unsched,
            next_offset: 0,
            granted: unsched,
            sched_priority: 0,
            unsched_priority,
            retx: None,
            retx_more: RangeSet::default(),
            queued: None,
            zero_sent: false,
            stalled_at: 0,
            sent_at: 0,
            burst_at: 0,
            burst_offset: 0,
        }
    }
    /// Has bytes it may transmit for the first time.
    pub(crate) fn sendable(&self) -> bool {
        self.next_offset < self.granted.min(self.len) || (self.len == 0 && !self.zero_sent)
    }
    /// Its unscheduled bytes are all sent: what goes next is scheduled.
    #[inline]
    pub(crate) fn scheduled_part(&self) -> bool {
        self.next_offset >= self.unsched
    }
    pub(crate) fn fully_sent(&self) -> bool {
        self.next_offset >= self.len && (self.len > 0 || self.zero_sent)
    }
    pub(crate) fn remaining(&self) -> u32 {
        self.len - self.next_offset
    }
    /// Starts over from byte 0 (the peer lost all state).
    pub(crate) fn restart(&mut self) {
        self.next_offset = 0;
        self.granted = self.unsched;
        self.clear_retx();
        self.zero_sent = false;
    }
    /// Drops every pending retransmission.
    pub(crate) fn clear_retx(&mut self) {
        self.retx = None;
        self.retx_more.clear();
    }
    /// Adds `[start, end)` to the pending retransmissions at `priority` (the
    /// latest asked for applies to all); returns whether any was pending.
    /// A range touching the one being sent joins it; others wait in order.
    pub(crate) fn add_retx(&mut self, start: u32, end: u32, priority: u8) -> bool {
        let Some((s, e, _)) = self.retx else {
            self.retx = Some((start, end, priority));
            return false;
        };
        if start <= e && end >= s {
            // The widened range takes in the waiting ones it now touches.
            let (hs, he) = self.retx_more.take_touching(s.min(start), e.max(end));
            self.retx = Some((hs, he, priority));
        } else {
            self.retx = Some((s, e, priority));
            // Past `MAX_RANGES` waiting ranges (a hostile receiver) the
            // request is dropped; a real one asks again an interval later.
            let _ = self.retx_more.insert(start, end);
        }
        true
    }
    /// The retransmission being sent has reached `sent` (of its `end`):
    /// goes on with it, or with the next waiting range.
    pub(crate) fn advance_retx(&mut self, sent: u32) {
        let Some((_, end, priority)) = self.retx else {
            return;
        };
        self.retx = if sent < end {
            Some((sent, end, priority))
        } else {
            self.retx_more.pop_first().map(|(s, e)| (s, e, priority))
        };
    }
    /// New bytes from `offset` leave at `now`: a first transmission, or
    /// the first after a pause of at least `guard`, starts a burst.
    #[inline]
    pub(crate) fn note_sent(&mut self, now: Time, offset: u32, guard: u64) {
        if offset == 0 || now.saturating_sub(self.sent_at) >= guard {
            self.burst_at = now;
            self.burst_offset = offset;
        }
        self.sent_at = now;
    }
    /// The end of the bytes a RESEND at `now` may have them send again:
    /// within `guard` of a burst's start, only what went before it (the
    /// burst's packets may be crossing the RESEND).
    pub(crate) fn sent_before(&self, now: Time, guard: u64) -> u32 {
        if now.saturating_sub(self.burst_at) < guard {
            self.burst_offset
        } else {
            self.next_offset
        }
    }
}

/// A message being received.
pub(crate) struct InMsg {
    pub(crate) len: u32,
    pub(crate) unsched: u32,
    pub(crate) received: RangeSet,
    pub(crate) bytes_received: u32,
    /// Bytes the sender may have sent so far (unscheduled plus granted).
    pub(crate) granted: u32,
    /// Priority we last asked the sender to use.
    pub(crate) priority: u8,
    /// Pool space; `None` while the message waits for the pool.
    pub(crate) alloc: Option<Allocation>,
    /// Remaining bytes under which the message sits in the grant sets, if it does.
    pub(crate) grant_key: Option<u32>,
    /// Member of the pool wait queue.
    pub(crate) waiting_for_pool: bool,
    /// When it started waiting for pool space (meaningful while
    /// `waiting_for_pool`): a client gives up after `rpc_timeout_ns`.
    pub(crate) pool_wait_since: u64,
    /// A GRANT for this message is queued (and will carry the latest offset).
    pub(crate) grant_queued: bool,
    /// Delivered incrementally: the readable prefix it publishes, and its
    /// serial ([`crate::PartialMessage`]).
    pub(crate) partial: Option<(Arc<Progress>, u64)>,
}

impl InMsg {
    pub(crate) fn new(len: u32, unsched: u32, priority: u8) -> InMsg {
        InMsg {
            len,
            unsched: unsched.min(len),
            received: RangeSet::default(),
            bytes_received: 0,
            granted: unsched.min(len),
            priority,
            alloc: None,
            grant_key: None,
            waiting_for_pool: false,
            pool_wait_since: 0,
            grant_queued: false,
            partial: None,
        }
    }
    pub(crate) fn complete(&self) -> bool {
        self.bytes_received >= self.len
    }
    /// Scheduled bytes granted but not yet received: what counts against the
    /// receiver's `max_incoming` cap.
    pub(crate) fn outstanding(&self) -> u64 {
        self.granted
            .saturating_sub(self.bytes_received.max(self.unsched)) as u64
    }
    /// What the message owes the receiver's grant accounting:
    /// ([`Self::outstanding`], the bytes still to arrive of those granted
    /// or unscheduled).
    #[inline(always)]
    pub(crate) fn owed(&self) -> (u64, u64) {
        (
            self.outstanding(),
            self.granted.saturating_sub(self.bytes_received) as u64,
        )
    }
    /// The first missing byte range below `limit`, if any.
    pub(crate) fn first_gap(&self, limit: u32) -> Option<(u32, u32)> {
        self.received.first_gap(limit)
    }
    /// Every missing byte range below `limit`, in order.
    pub(crate) fn gaps(&self, limit: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.received.gaps(limit)
    }
}

pub(crate) struct Rpc {
    pub(crate) is_client: bool,
    pub(crate) id: u64,
    pub(crate) peer: SocketAddr,
    /// `peer`'s entry in the peer table (pinned while this RPC lives).
    pub(crate) peer_key: PeerKey,
    pub(crate) state: RpcState,
    /// Creation order; ties in the SRPT sets break towards older RPCs.
    pub(crate) birth: u64,
    pub(crate) out: Option<OutMsg>,
    pub(crate) inc: Option<InMsg>,
    /// Last time any packet for this RPC arrived from the peer.
    pub(crate) last_heard: Time,
    /// Last time we sent a RESEND, NEED_ACK or keep-alive BUSY for this RPC.
    pub(crate) last_prod: Time,
    /// The peer's latest packet for this RPC was BUSY: it is alive but has
    /// nothing for us yet, so we ask again less often.
    pub(crate) peer_busy: bool,
    /// Times the server said it did not know this (client) RPC since the
    /// response last made progress; each doubles the wait before asking again.
    pub(crate) restarts: u8,
    /// Client: deliver the response incrementally
    /// ([`crate::Endpoint::deliver_response_partially`]).
    pub(crate) partial_response: bool,
}

impl Rpc {
    /// A packet other than BUSY arrived from the peer for this RPC.
    pub(crate) fn heard(&mut self, now: Time) {
        self.last_heard = now;
        self.peer_busy = false;
    }
}

/// Disjoint, sorted, half-open byte ranges.
#[derive(Default, Debug, Clone)]
pub(crate) struct RangeSet {
    /// Inline room for two ranges: most messages never have more (one range
    /// plus one gap after a loss), so they never allocate.
    ranges: SmallVec<[(u32, u32); 2]>,
}

impl RangeSet {
    /// Adds `[start, end)`; returns how many bytes were new, or `None` if the
    /// set would exceed [`MAX_RANGES`] (nothing is added then).
    pub(crate) fn insert(&mut self, start: u32, end: u32) -> Option<u32> {
        if start >= end {
            return Some(0);
        }
        // Fast path: in-order arrival extends the last range.
        if let Some(last) = self.ranges.last_mut() {
            if start == last.1 {
                last.1 = end;
                return Some(end - start);
            }
            if start > last.1 {
                if self.ranges.len() >= MAX_RANGES {
                    return None;
                }
                self.ranges.push((start, end));
                return Some(end - start);
            }
        } else {
            self.ranges.push((start, end));
            return Some(end - start);
        }
        // General case: merge every range touching [start, end).
        let first = self.ranges.partition_point(|r| r.1 < start);
        let last = self.ranges.partition_point(|r| r.0 <= end);
        if first == last {
            if self.ranges.len() >= MAX_RANGES {
                return None;
            }
            self.ranges.insert(first, (start, end));
            return Some(end - start);
        }
        let covered: u32 = self.ranges[first..last]
            .iter()
            .map(|r| r.1.min(end).saturating_sub(r.0.max(start)))
            .sum();
        let merged = (
            start.min(self.ranges[first].0),
            end.max(self.ranges[last - 1].1),
        );
        self.ranges[first] = merged;
        self.ranges.drain(first + 1..last);
        Some((end - start) - covered)
    }
    /// Whether no byte of `[start, end)` is in the set.
    pub(crate) fn is_missing(&self, start: u32, end: u32) -> bool {
        // The first range that ends after `start` must begin at or after `end`.
        let i = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges.get(i).is_none_or(|r| r.0 >= end)
    }
    pub(crate) fn first_gap(&self, limit: u32) -> Option<(u32, u32)> {
        let mut pos = 0;
        for &(s, e) in &self.ranges {
            if s > pos {
                return if pos < limit {
                    Some((pos, s.min(limit)))
                } else {
                    None
                };
            }
            pos = e;
        }
        (pos < limit).then_some((pos, limit))
    }
    /// The missing byte ranges below `limit`, in order (the first is
    /// [`Self::first_gap`]).
    pub(crate) fn gaps(&self, limit: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let starts = std::iter::once(0).chain(self.ranges.iter().map(|r| r.1));
        let ends = self
            .ranges
            .iter()
            .map(|r| r.0)
            .chain(std::iter::once(u32::MAX));
        starts
            .zip(ends)
            .map(move |(s, e)| (s, e.min(limit)))
            .take_while(move |&(s, _)| s < limit)
            .filter(|&(s, e)| s < e)
    }
    pub(crate) fn clear(&mut self) {
        self.ranges.clear();
    }
    /// Removes and returns the first range.
    pub(crate) fn pop_first(&mut self) -> Option<(u32, u32)> {
        (!self.ranges.is_empty()).then(|| self.ranges.remove(0))
    }
    /// Removes every range touching `[start, end)` and returns their union
    /// with it.
    pub(crate) fn take_touching(&mut self, start: u32, end: u32) -> (u32, u32) {
        let first = self.ranges.partition_point(|r| r.1 < start);
        let last = self.ranges.partition_point(|r| r.0 <= end);
        if first == last {
            return (start, end);
        }
        let union = (
            start.min(self.ranges[first].0),
            end.max(self.ranges[last - 1].1),
        );
        self.ranges.drain(first..last);
        union
    }
    /// Length of the leading range that starts at byte 0 (0 if none).
    pub(crate) fn prefix(&self) -> u32 {
        match self.ranges.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_set_merges_and_counts_new_bytes() {
        let mut r = RangeSet::default();
        assert_eq!(r.insert(0, 10), Some(10));
        assert_eq!(r.insert(20, 30), Some(10));
        assert_eq!(r.first_gap(100), Some((10, 20)));
        assert_eq!(r.insert(5, 25), Some(10));
        assert_eq!(r.first_gap(100), Some((30, 100)));
        assert_eq!(r.first_gap(30), None);
        assert_eq!(r.insert(0, 30), Some(0));
        assert_eq!(r.insert(40, 50), Some(10));
        assert_eq!(r.insert(35, 36), Some(1));
        assert_eq!(r.insert(30, 60), Some(30 - 11));
        assert_eq!(r.first_gap(60), None);
    }

    #[test]
    fn range_set_lists_every_gap_below_a_limit() {
        let mut r = RangeSet::default();
        let gaps = |r: &RangeSet, l| r.gaps(l).collect::<Vec<_>>();
        assert_eq!(gaps(&r, 50), vec![(0, 50)]);
        assert_eq!(gaps(&r, 0), vec![]);
        r.insert(0, 10);
        r.insert(20, 30);
        r.insert(40, 45);
        assert_eq!(gaps(&r, 100), vec![(10, 20), (30, 40), (45, 100)]);
        assert_eq!(gaps(&r, 45), vec![(10, 20), (30, 40)]);
        assert_eq!(gaps(&r, 35), vec![(10, 20), (30, 35)]);
        assert_eq!(gaps(&r, 20), vec![(10, 20)]);
        assert_eq!(gaps(&r, 10), vec![]);
        assert_eq!(r.gaps(100).next(), r.first_gap(100));
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(gaps(&r, 45), vec![]);
        assert_eq!(r.gaps(46).next(), r.first_gap(46));
    }

    #[test]
    fn range_set_tells_missing_ranges() {
        let mut r = RangeSet::default();
        assert!(r.is_missing(0, 100));
        r.insert(10, 20);
        r.insert(30, 40);
        assert!(r.is_missing(0, 10) && r.is_missing(20, 30) && r.is_missing(40, 99));
        assert!(!r.is_missing(0, 11) && !r.is_missing(19, 30) && !r.is_missing(25, 31));
        assert!(!r.is_missing(12, 14) && !r.is_missing(0, 100));
    }

    #[test]
    fn range_set_caps_fragments() {
        let mut r = RangeSet::default();
        for i in 0..MAX_RANGES as u32 {
            assert!(r.insert(i * 2, i * 2 + 1).is_some());
        }
        assert_eq!(
            r.insert(MAX_RANGES as u32 * 4, MAX_RANGES as u32 * 4 + 1),
            None
        );
        // Filling a gap still works (it merges).
        assert_eq!(r.insert(1, 2), Some(1));
    }

    #[test]
    fn range_set_out_of_order_insert() {
        let mut r = RangeSet::default();
        r.insert(50, 60);
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(r.first_gap(100), Some((0, 10)));
        assert_eq!(r.insert(0, 100), Some(100 - 30));
        assert_eq!(r.first_gap(100), None);
    }

    #[test]
    fn range_set_prefix_is_the_range_from_zero() {
        let mut r = RangeSet::default();
        assert_eq!(r.prefix(), 0);
        r.insert(10, 20);
        assert_eq!(r.prefix(), 0);
        r.insert(0, 5);
        assert_eq!(r.prefix(), 5);
        r.insert(5, 10);
        assert_eq!(r.prefix(), 20);
    }
}
