//! The event queue: earliest time first, events at the same instant in the
//! order they were scheduled. That order, and the absence of any hash-ordered
//! container, is what makes a run reproducible.
//!
//! It is a timing wheel with one slot per nanosecond for the near future plus
//! a binary heap for the rest. In a network simulation almost every event is
//! scheduled less than a few microseconds ahead (a packet's serialization, a
//! link's propagation and switching delay), so almost every push writes a
//! slot and every pop takes the first event of the first non-empty slot, found
//! with a two-level bitmap; only long timers go through the heap. A slot holds
//! its first event inline (most instants have one event), further events of
//! the same instant in a FIFO list; pops walk the slot array in address order,
//! which the hardware prefetches. A binary heap of all pending events (the
//! previous design) cost one cache miss per level on every pop and was a fifth
//! of a simulation's time.
//!
//! Exact order: the wheel holds the events of `[cur, cur + WHEEL)`, where
//! `cur` is the time of the last event popped, one slot per distinct time, so
//! walking the slots from `cur` visits times in increasing order, and within
//! a slot events are in push order. An event further ahead waits in the heap
//! (ordered by time, then push sequence) and moves to its slot as soon as `cur`
//! comes within `WHEEL` of it, i.e. before any event for the same instant can
//! be pushed to the wheel directly; so a slot's list is in push order too.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Virtual time: the engine's [`homa_proto::Time`] (u64 nanoseconds).
pub use homa_proto::Time;

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

/// An event as stored: a timer's fields live in `EventQueue::timers`, so
/// that a stored event is 12 bytes and a wheel slot 16 (the wheel's 64 KB
/// then share the caches with the rest of the simulation more easily).
#[derive(Clone, Copy, Debug)]
enum Stored {
    TxDone { port: u32 },
    Arrive { port: u32, pkt: u32 },
    Timer { rec: u32 },
}

/// A pending timer's fields (see [`Stored::Timer`]); `host` links free
/// records together while unused.
#[derive(Clone, Copy, Debug)]
struct TimerRec {
    host: u32,
    kind: u32,
    token: u64,
}

/// Span of the wheel in ns (one slot per ns). 4,096 slots cover a full
/// 1,538-byte frame at 10 Gbps (1,231 ns) plus link and switch latencies
/// with room to spare, and the slot table (64 KB) stays in the L2 cache.
const WHEEL_BITS: u32 = 12;
const WHEEL: usize = 1 << WHEEL_BITS;
const WORDS: usize = WHEEL / 64;
const NIL: u32 = u32::MAX;

// The two-level bitmap has one summary word.
const _: () = assert!(WORDS == 64);
const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// A far-future event in the heap.
#[derive(Clone, Copy, Debug)]
struct Far {
    time: Time,
    seq: u64,
    ev: Stored,
}

impl PartialEq for Far {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl Eq for Far {}
impl PartialOrd for Far {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Far {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest event.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// An event after a slot's first: the event and the next entry of its slot
/// (or of the free list).
#[derive(Clone, Copy, Debug)]
struct Node {
    ev: Stored,
    next: u32,
}

/// One instant of the wheel: its first event (meaningful while the slot's bit
/// is set) and the others in push order, as a circular list of `nodes`
/// entered by its last node (`last`, NIL if none): the last node's `next` is
/// the first, so appending and popping the front are both O(1) with one index.
#[derive(Clone, Copy, Debug)]
struct Slot {
    first: Stored,
    last: u32,
}

const EMPTY_SLOT: Slot = Slot {
    first: Stored::TxDone { port: 0 },
    last: NIL,
};

/// Pending events, earliest first, ties in insertion order.
#[derive(Debug)]
pub(crate) struct EventQueue {
    /// Time of the last event popped; the wheel holds `[cur, cur + WHEEL)`.
    cur: Time,
    slots: Box<[Slot]>,
    /// Bit `i % 64` of word `i / 64` set iff slot `i` is non-empty.
    bits: Box<[u64; WORDS]>,
    /// Bit `w` set iff `bits[w] != 0`.
    summary: u64,
    nodes: Vec<Node>,
    free: u32,
    in_wheel: usize,
    far: BinaryHeap<Far>,
    next_seq: u64,
    timers: Vec<TimerRec>,
    free_timer: u32,
}

impl Default for EventQueue {
    fn default() -> Self {
        EventQueue {
            cur: 0,
            slots: vec![EMPTY_SLOT; WHEEL].into_boxed_slice(),
            bits: Box::new([0; WORDS]),
            summary: 0,
            nodes: Vec::new(),
            free: NIL,
            in_wheel: 0,
            far: BinaryHeap::new(),
            next_seq: 0,
            timers: Vec::new(),
            free_timer: NIL,
        }
    }
}

impl EventQueue {
    /// Schedules `ev` at `time`, which must not be earlier than the last
    /// event popped (an earlier time is treated as that time).
    /// Inlined into every caller: a packet's events are pushed from two or
    /// three places per hop, and a call costs more than the wheel append.
    #[inline(always)]
    pub(crate) fn push(&mut self, time: Time, ev: Ev) {
        let stored = match ev {
            Ev::TxDone { port } => Stored::TxDone { port },
            Ev::Arrive { port, pkt } => Stored::Arrive { port, pkt },
            Ev::Timer { host, kind, token } => Stored::Timer {
                rec: self.alloc_timer(TimerRec { host, kind, token }),
            },
        };
        self.push_stored(time, stored);
    }

    #[inline(always)]
    fn push_stored(&mut self, time: Time, ev: Stored) {
        debug_assert!(time >= self.cur, "event scheduled in the past");
        let time = time.max(self.cur);
        let seq = self.next_seq;
        self.next_seq += 1;
        if time - self.cur < WHEEL as u64 {
            self.append(time, ev);
        } else {
            self.push_far(Far { time, seq, ev });
        }
    }

    #[cold]
    #[inline(never)]
    fn push_far(&mut self, f: Far) {
        self.far.push(f);
    }

    #[inline(never)]
    fn alloc_timer(&mut self, rec: TimerRec) -> u32 {
        if self.free_timer != NIL {
            let i = self.free_timer;
            self.free_timer = self.timers[i as usize].host;
            self.timers[i as usize] = rec;
            i
        } else {
            self.timers.push(rec);
            (self.timers.len() - 1) as u32
        }
    }

    /// The event a stored one stands for (freeing a timer's record).
    #[inline]
    fn resolve(&mut self, ev: Stored) -> Ev {
        match ev {
            Stored::TxDone { port } => Ev::TxDone { port },
            Stored::Arrive { port, pkt } => Ev::Arrive { port, pkt },
            Stored::Timer { rec } => {
                let r = self.timers[rec as usize];
                self.timers[rec as usize].host = self.free_timer;
                self.free_timer = rec;
                Ev::Timer {
                    host: r.host,
                    kind: r.kind,
                    token: r.token,
                }
            }
        }
    }

    /// Appends to the slot of `time` (within the wheel's span).
    #[inline(always)]
    fn append(&mut self, time: Time, ev: Stored) {
        let i = (time as usize) & (WHEEL - 1);
        self.in_wheel += 1;
        if self.bits[i / 64] & (1 << (i % 64)) == 0 {
            self.slots[i] = Slot {
                first: ev,
                last: NIL,
            };
            self.bits[i / 64] |= 1 << (i % 64);
            self.summary |= 1 << (i / 64);
            return;
        }
        self.append_more(i, ev);
    }

    /// Appends a second or later event to slot `i`.
    #[inline(never)]
    fn append_more(&mut self, i: usize, ev: Stored) {
        let n = if self.free != NIL {
            let n = self.free;
            self.free = self.nodes[n as usize].next;
            n
        } else {
            self.nodes.push(Node { ev, next: NIL });
            (self.nodes.len() - 1) as u32
        };
        let last = self.slots[i].last;
        // The new node becomes the last; its successor is the first.
        let next = if last == NIL {
            n
        } else {
            std::mem::replace(&mut self.nodes[last as usize].next, n)
        };
        self.nodes[n as usize] = Node { ev, next };
        self.slots[i].last = n;
    }

    /// The first non-empty slot at or after `cur` (circularly). The wheel
    /// must not be empty.
    #[inline]
    fn first_slot(&self) -> usize {
        let i0 = (self.cur as usize) & (WHEEL - 1);
        let w0 = i0 / 64;
        let m = self.bits[w0] & (u64::MAX << (i0 % 64));
        if m != 0 {
            return w0 * 64 + m.trailing_zeros() as usize;
        }
        // Later words, then wrap around to the words up to w0 (whose bits
        // below i0 are times one wheel span ahead).
        let later = if w0 == 63 {
            0
        } else {
            self.summary & (u64::MAX << (w0 + 1))
        };
        let s = if later != 0 { later } else { self.summary };
        debug_assert!(s != 0, "first_slot on an empty wheel");
        let w = s.trailing_zeros() as usize;
        w * 64 + self.bits[w].trailing_zeros() as usize
    }

    /// Time of the events in slot `i`.
    #[inline]
    fn slot_time(&self, i: usize) -> Time {
        let i0 = (self.cur as usize) & (WHEEL - 1);
        self.cur + (i.wrapping_sub(i0) & (WHEEL - 1)) as Time
    }

    /// Moves the heap's events that are now within the wheel's span to their
    /// slots, in (time, sequence) order.
    #[inline]
    fn migrate(&mut self) {
        if self
            .far
            .peek()
            .is_some_and(|f| f.time - self.cur < WHEEL as u64)
        {
            self.migrate_slow();
        }
    }

    #[cold]
    fn migrate_slow(&mut self) {
        while let Some(f) = self.far.peek() {
            if f.time - self.cur >= WHEEL as u64 {
                break;
            }
            let f = self.far.pop().expect("peeked");
            self.append(f.time, f.ev);
        }
    }

    /// The earliest event, if there is one at or before `limit`.
    /// Inlined into the event loop (`Fabric::step_until`), its one caller
    /// per event.
    #[inline(always)]
    pub(crate) fn pop_until(&mut self, limit: Time) -> Option<(Time, Ev)> {
        if self.in_wheel == 0 {
            if self.far.peek()?.time > limit {
                return None;
            }
            self.cur = self.far.peek().expect("peeked").time;
            self.migrate_slow();
        }
        let i = self.first_slot();
        let t = self.slot_time(i);
        if t > limit {
            return None;
        }
        let slot = &mut self.slots[i];
        let ev = slot.first;
        if slot.last != NIL {
            let last = slot.last;
            let n = self.nodes[last as usize].next;
            let node = self.nodes[n as usize];
            slot.first = node.ev;
            if n == last {
                slot.last = NIL;
            } else {
                self.nodes[last as usize].next = node.next;
            }
            self.nodes[n as usize].next = self.free;
            self.free = n;
        } else {
            self.bits[i / 64] &= !(1 << (i % 64));
            if self.bits[i / 64] == 0 {
                self.summary &= !(1 << (i / 64));
            }
        }
        self.in_wheel -= 1;
        if t != self.cur {
            self.cur = t;
            self.migrate();
        }
        Some((t, self.resolve(ev)))
    }

    #[cfg(test)]
    pub(crate) fn pop(&mut self) -> Option<(Time, Ev)> {
        self.pop_until(Time::MAX)
    }

    pub(crate) fn peek_time(&self) -> Option<Time> {
        if self.in_wheel > 0 {
            Some(self.slot_time(self.first_slot()))
        } else {
            self.far.peek().map(|f| f.time)
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.in_wheel + self.far.len()
    }

    /// Total events ever scheduled.
    pub(crate) fn scheduled(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BinaryHeap;

    fn port(e: Ev) -> u32 {
        match e {
            Ev::TxDone { port } => port,
            _ => unreachable!(),
        }
    }

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, Ev::TxDone { port: 0 });
        q.push(3, Ev::TxDone { port: 1 });
        q.push(5, Ev::TxDone { port: 2 });
        q.push(3, Ev::TxDone { port: 3 });
        q.push(0, Ev::TxDone { port: 4 });
        let order: Vec<(Time, u32)> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| (t, port(e)))
            .collect();
        assert_eq!(order, vec![(0, 4), (3, 1), (3, 3), (5, 0), (5, 2)]);
        assert_eq!(q.len(), 0);
        assert_eq!(q.scheduled(), 5);
        assert_eq!(q.pop(), None);
        assert_eq!(q.peek_time(), None);
    }

    #[test]
    fn far_events_keep_their_order_against_later_near_ones() {
        let mut q = EventQueue::default();
        let far = 3 * WHEEL as Time + 17;
        // Two events for `far` go to the heap; once the clock is close, two
        // more for the same instant go straight to the wheel: all four must
        // come out in push order. Also an event exactly one span ahead and
        // the largest time.
        q.push(far, Ev::TxDone { port: 0 });
        q.push(far, Ev::TxDone { port: 1 });
        q.push(Time::MAX, Ev::TxDone { port: 9 });
        q.push(far - 10, Ev::TxDone { port: 2 });
        assert_eq!(q.pop().map(|(t, e)| (t, port(e))), Some((far - 10, 2)));
        q.push(far, Ev::TxDone { port: 3 });
        q.push(far - 10 + WHEEL as Time, Ev::TxDone { port: 5 });
        q.push(far, Ev::TxDone { port: 4 });
        assert_eq!(q.peek_time(), Some(far));
        let order: Vec<(Time, u32)> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| (t, port(e)))
            .collect();
        assert_eq!(
            order,
            vec![
                (far, 0),
                (far, 1),
                (far, 3),
                (far, 4),
                (far - 10 + WHEEL as Time, 5),
                (Time::MAX, 9)
            ]
        );
    }

    /// An event of each kind carrying `n` (timers keep their fields out of line).
    fn tagged(n: u64) -> Ev {
        match n % 3 {
            0 => Ev::TxDone { port: n as u32 },
            1 => Ev::Arrive {
                port: n as u32,
                pkt: !(n as u32),
            },
            _ => Ev::Timer {
                host: n as u32,
                kind: (n >> 32) as u32 ^ 7,
                token: n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            },
        }
    }

    /// Same order as a plain heap of (time, sequence), for a random mix of
    /// near and far events pushed while popping, including same-time pushes.
    #[test]
    fn matches_a_reference_heap() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut q = EventQueue::default();
        let mut reference: BinaryHeap<std::cmp::Reverse<(Time, u64)>> = BinaryHeap::new();
        let mut now: Time = 0;
        let mut seq = 0u64;
        for round in 0..200_000u32 {
            let pushes = if round < 100_000 {
                rng.gen_range(0..3)
            } else {
                rng.gen_range(0..2)
            };
            for _ in 0..pushes {
                let ahead = match rng.gen_range(0..10) {
                    0 => 0,
                    1 => rng.gen_range(0..4 * WHEEL as Time),
                    2 => WHEEL as Time - 1 + rng.gen_range(0..3),
                    _ => rng.gen_range(0..1_500),
                };
                q.push(now + ahead, tagged(seq));
                reference.push(std::cmp::Reverse((now + ahead, seq)));
                seq += 1;
            }
            assert_eq!(q.len(), reference.len());
            assert_eq!(q.peek_time(), reference.peek().map(|r| r.0 .0));
            match (q.pop(), reference.pop()) {
                (Some((t, e)), Some(std::cmp::Reverse((rt, rs)))) => {
                    assert_eq!((t, e), (rt, tagged(rs)));
                    now = t;
                }
                (None, None) => {}
                (a, b) => panic!("{a:?} vs {b:?}"),
            }
        }
        assert_eq!(q.scheduled(), seq);
    }
}
