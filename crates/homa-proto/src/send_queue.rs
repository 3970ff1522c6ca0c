//! The sender's queue (`docs/protocol.md` §3.2–3.3): which messages have
//! bytes to send for the first time, in SRPT order and by age; which have a
//! retransmission pending; the FIFO share's credit; and the message the
//! latest poll sent new DATA of (so that a burst may go on with it). The
//! transmit path (`outgoing.rs`) asks it what goes next; the pacer
//! (`pacer.rs`) says whether DATA may go at all.

use crate::fifo::FifoCredit;
use crate::rpc::RpcKey;
use crate::srpt::SrptQueue;
use std::collections::VecDeque;

/// What goes next among the messages with new bytes, with the pacer open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The message whose next new packet goes.
    pub key: RpcKey,
    /// The SRPT head (the same as `key` unless it is the FIFO share's turn).
    pub first: RpcKey,
    /// Whether it is the FIFO share's turn (the oldest message goes).
    pub fifo_turn: bool,
}

/// Invariants: `srpt` and `by_age` hold the same messages (an entry
/// `(remaining, birth, key)` in one, `(birth, key)` in the other; the
/// endpoint keeps `remaining` in `OutMsg::queued`, the entry's key); the
/// FIFO credit is at most two quanta. `retx` may name a message whose
/// retransmission is done, or a slot freed since: such entries are skipped
/// (popped) when they come up.
// `repr(C)`, in this order: the two queues that say whether anything is
// to be sent (read after every input) in one cache line.
#[repr(C)]
pub(crate) struct SendQueue {
    /// Messages with a retransmission pending, in the order their RESENDs
    /// arrived.
    retx: VecDeque<RpcKey>,
    /// Messages with bytes to send for the first time: (remaining, birth, key).
    srpt: SrptQueue,
    /// The same messages by age.
    by_age: SrptQueue<(u64, RpcKey)>,
    /// Credit of the FIFO share (`Config::pacer_fifo_permille`) towards the
    /// oldest message's next packet.
    fifo: FifoCredit,
    /// One turn of the FIFO share: a packet's payload.
    quantum: u64,
    /// A message with at most this many bytes left to send (the
    /// unscheduled window: it needs no grant) is never passed by a FIFO
    /// turn. The share is there so that SRPT cannot starve a long message;
    /// a short message at the head is no such threat, and two packets of
    /// an old message ahead of it would add more to its latency than they
    /// take off the old one's. The credit stays and is spent after it.
    fifo_exempt_bytes: u32,
    /// A retransmission waits for an SRPT head with at most this many bytes
    /// left to send (0: never; `Config::short_before_retransmit`, the
    /// unscheduled window): such a message needs no grant, and a RESEND
    /// asks for up to a window of packets, which would hold it for as
    /// many packet times.
    retx_yields_bytes: u32,
    /// The message whose new DATA the latest `poll_transmit` sent (chosen
    /// by SRPT or the FIFO share), so that `poll_transmit_burst` may go on
    /// with it.
    last_new: Option<RpcKey>,
    fifo_permille: u32,
}

impl SendQueue {
    /// An empty queue for packets of `data_per_packet` payload bytes that
    /// gives `fifo_permille` of its bytes to the oldest message, except
    /// while a message with at most `fifo_exempt_bytes` left heads it, and
    /// sends retransmissions first unless a message with at most
    /// `retx_yields_bytes` left heads it.
    pub fn new(
        data_per_packet: u32,
        fifo_permille: u32,
        fifo_exempt_bytes: u32,
        retx_yields_bytes: u32,
    ) -> SendQueue {
        SendQueue {
            srpt: SrptQueue::default(),
            by_age: SrptQueue::default(),
            retx: VecDeque::new(),
            fifo: FifoCredit::default(),
            fifo_permille,
            quantum: FifoCredit::quantum(data_per_packet),
            fifo_exempt_bytes,
            retx_yields_bytes,
            last_new: None,
        }
    }

    /// Adds a message with `remaining` bytes to send for the first time.
    #[inline]
    pub fn insert(&mut self, remaining: u32, birth: u64, key: RpcKey) {
        self.srpt.insert((remaining, birth, key));
        self.by_age.insert((birth, key));
    }

    /// Removes a message queued under `remaining`.
    #[inline]
    pub fn remove(&mut self, remaining: u32, birth: u64, key: RpcKey) {
        self.srpt.remove(&(remaining, birth, key));
        self.by_age.remove(&(birth, key));
    }

    /// A message queued under `old` now has `remaining` bytes left (cheap
    /// when it is the SRPT head and shrinks).
    #[inline]
    pub fn update(&mut self, old: u32, birth: u64, key: RpcKey, remaining: u32) {
        self.srpt.update(&(old, birth, key), remaining);
    }

    /// Nothing to send: no new bytes and no retransmission.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.srpt.is_empty() && self.retx.is_empty()
    }

    /// Messages with bytes to send for the first time.
    #[inline]
    pub fn len(&self) -> usize {
        self.srpt.len()
    }

    /// The message with the fewest remaining bytes.
    #[inline]
    pub fn head(&self) -> Option<RpcKey> {
        self.srpt.first().map(|e| e.2)
    }

    /// What goes next with the pacer open: the SRPT head, or the oldest
    /// message if it is another one, the head is not short (more than
    /// `fifo_exempt_bytes` left) and the FIFO share's credit makes it its
    /// turn. No side effects (see [`Self::spend_fifo_turn`]).
    #[inline]
    pub fn choose(&self) -> Option<Choice> {
        let &(remaining, _, first) = self.srpt.first()?;
        let oldest = self.by_age.first().unwrap().1;
        let fifo_turn =
            oldest != first && remaining > self.fifo_exempt_bytes && self.fifo.due(self.quantum);
        Some(Choice {
            key: if fifo_turn { oldest } else { first },
            first,
            fifo_turn,
        })
    }

    /// Pays for a FIFO turn that [`Self::choose`] gave.
    #[inline]
    pub fn spend_fifo_turn(&mut self) {
        self.fifo.spend(self.quantum);
    }

    /// Whether more than one message has new bytes (the FIFO share earns
    /// credit only then).
    #[inline]
    pub fn competing(&self) -> bool {
        self.by_age.len() > 1
    }

    /// The SRPT head sent a packet of `bytes` while others competed.
    #[inline]
    pub fn accrue_fifo(&mut self, bytes: u64) {
        self.fifo.accrue(bytes, self.fifo_permille, self.quantum);
    }

    /// Queues message `key` for retransmission.
    #[inline]
    pub fn push_retx(&mut self, key: RpcKey) {
        self.retx.push_back(key);
    }

    /// The message whose retransmission goes next.
    #[inline]
    pub fn retx_front(&self) -> Option<RpcKey> {
        self.retx.front().copied()
    }

    /// The front message's retransmission is done (or gone).
    #[inline]
    pub fn pop_retx(&mut self) {
        self.retx.pop_front();
    }

    /// Whether a retransmission is pending.
    #[cfg(test)]
    pub fn has_retx(&self) -> bool {
        !self.retx.is_empty()
    }

    /// Whether a pending retransmission goes before new data now: there is
    /// one, and the SRPT head is not short enough to go first.
    #[inline]
    pub fn retx_first(&self) -> bool {
        !self.retx.is_empty()
            && (self.retx_yields_bytes == 0
                || self
                    .srpt
                    .first()
                    .is_none_or(|e| e.0 > self.retx_yields_bytes))
    }

    /// Notes that the latest poll sent new DATA of `key`.
    #[inline]
    pub fn set_last_new(&mut self, key: RpcKey) {
        self.last_new = Some(key);
    }

    /// Takes the note of [`Self::set_last_new`].
    #[inline]
    pub fn take_last_new(&mut self) -> Option<RpcKey> {
        self.last_new.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(key: RpcKey, first: RpcKey, fifo_turn: bool) -> Option<Choice> {
        Some(Choice {
            key,
            first,
            fifo_turn,
        })
    }

    #[test]
    fn srpt_first_and_the_oldest_on_the_fifo_shares_turn() {
        // 1,000-byte packets, 10% to the oldest: one turn per 10 packets.
        let mut q = SendQueue::new(1_000, 100, 0, 0);
        assert!(q.is_empty() && q.head().is_none() && q.choose().is_none());
        q.insert(50_000, 1, 7); // oldest, longest
        assert_eq!(q.choose(), choice(7, 7, false));
        assert!(!q.competing());
        // Alone, the head earns nothing.
        q.insert(5_000, 2, 8);
        assert!(q.competing());
        assert_eq!(q.choose(), choice(8, 8, false));
        for _ in 0..9 {
            q.accrue_fifo(1_000);
            assert_eq!(q.choose(), choice(8, 8, false));
        }
        q.accrue_fifo(1_000);
        assert_eq!(q.choose(), choice(7, 8, true));
        q.spend_fifo_turn();
        assert_eq!(q.choose(), choice(8, 8, false));
        // The head shrinks in place, and moves if another becomes shorter.
        q.update(5_000, 2, 8, 4_000);
        assert_eq!(q.head(), Some(8));
        q.update(50_000, 1, 7, 1_000);
        assert_eq!(q.head(), Some(7));
        // The oldest is the head: no FIFO turn, whatever the credit.
        for _ in 0..30 {
            q.accrue_fifo(1_000);
        }
        assert_eq!(q.choose(), choice(7, 7, false));
        assert_eq!(q.len(), 2);
        q.remove(1_000, 1, 7);
        q.remove(4_000, 2, 8);
        assert!(q.is_empty() && q.choose().is_none());
    }

    #[test]
    fn retransmissions_wait_only_for_a_short_head() {
        // Retransmissions yield to a head with at most 3,000 bytes left.
        let mut q = SendQueue::new(1_000, 0, 0, 3_000);
        assert!(!q.retx_first());
        q.push_retx(9);
        assert!(q.retx_first(), "nothing new: the retransmission goes");
        q.insert(50_000, 1, 7);
        assert!(q.retx_first(), "a long head waits");
        q.insert(3_000, 2, 8);
        assert!(!q.retx_first(), "a short head goes first");
        q.remove(3_000, 2, 8);
        assert!(q.retx_first());
        // Off (0): retransmissions always go first, even before a message
        // with nothing left but its (empty) packet.
        let mut q = SendQueue::new(1_000, 0, 0, 0);
        q.push_retx(9);
        q.insert(1, 1, 7);
        assert!(q.retx_first());
        q.insert(0, 2, 8);
        assert!(q.retx_first());
    }

    #[test]
    fn retransmissions_go_in_the_order_asked_and_the_burst_note_is_taken_once() {
        let mut q = SendQueue::new(1_000, 0, 0, 0);
        q.push_retx(3);
        q.push_retx(1);
        assert!(q.has_retx() && !q.is_empty() && q.head().is_none());
        assert_eq!(q.retx_front(), Some(3));
        q.pop_retx();
        assert_eq!(q.retx_front(), Some(1));
        q.pop_retx();
        assert!(q.is_empty());
        q.set_last_new(4);
        assert_eq!(q.take_last_new(), Some(4));
        assert_eq!(q.take_last_new(), None);
        // 0 per mille: never a FIFO turn.
        q.insert(10, 1, 1);
        q.insert(5, 2, 2);
        for _ in 0..100 {
            q.accrue_fifo(1_000);
        }
        assert_eq!(q.choose(), choice(2, 2, false));
    }

    #[test]
    fn a_short_message_at_the_head_is_never_passed_by_a_fifo_turn() {
        // 1,000-byte packets, 10% to the oldest; messages with at most
        // 10,000 bytes left are short.
        let mut q = SendQueue::new(1_000, 100, 10_000, 0);
        q.insert(5_000_000, 1, 7); // old and long
        q.insert(60_000, 2, 8); // the SRPT head, long too
        for _ in 0..20 {
            q.accrue_fifo(1_000);
        }
        assert_eq!(q.choose(), choice(7, 8, true));
        // A short message arrives: it goes first, and the credit waits.
        q.insert(10_000, 3, 9);
        assert_eq!(q.choose(), choice(9, 9, false));
        q.update(10_000, 3, 9, 1_000);
        assert_eq!(q.choose(), choice(9, 9, false));
        q.remove(1_000, 3, 9);
        // Once it is gone, the oldest gets the turn it had earned.
        assert_eq!(q.choose(), choice(7, 8, true));
        q.spend_fifo_turn();
        assert_eq!(q.choose(), choice(7, 8, true));
        q.spend_fifo_turn();
        assert_eq!(q.choose(), choice(8, 8, false));
    }
}
