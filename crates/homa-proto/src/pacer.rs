//! The sender's NIC queue model (`docs/protocol.md` §3.4): when the packets
//! handed to the NIC so far will have left it, and whether another DATA
//! packet may be released now. Owns that estimate so that only the transmit
//! path moves it.

use crate::config::{Config, Derived};
use crate::time::Time;

/// Estimate of the NIC's transmit queue. Invariant: `idle_at` only moves
/// forward, by each transmitted datagram's wire time from
/// max(`idle_at`, the time it was sent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pacer {
    /// Estimated time at which the NIC's transmit queue drains.
    idle_at: Time,
    /// DATA is released only while the queue holds at most this many ns.
    max_queue_ns: u64,
    /// (datagram length, its wire time) of the last datagram accounted:
    /// most have the length of the previous one (full DATA packets), and
    /// reusing its wire time spares a 64-bit division.
    wire_memo: (usize, u64),
}

impl Pacer {
    pub fn new(config: &Config, now: Time) -> Pacer {
        Pacer {
            idle_at: now,
            max_queue_ns: config.effective_max_nic_queue_ns(),
            wire_memo: (usize::MAX, 0),
        }
    }

    /// Whether a DATA packet may go now (the queue is short enough).
    #[inline(always)]
    pub fn is_open(&self, now: Time) -> bool {
        self.idle_at <= now.saturating_add(self.max_queue_ns)
    }

    /// When the queue will have drained enough to open again (`None`: it
    /// is open whenever asked, as at time 0).
    #[inline]
    pub fn opens_at(&self) -> Option<Time> {
        (self.idle_at > self.max_queue_ns).then(|| self.idle_at - self.max_queue_ns)
    }

    /// Accounts a datagram of `len` bytes (UDP payload) handed to the NIC
    /// at `now`.
    #[inline(always)]
    pub fn on_transmit(&mut self, now: Time, len: usize, derived: &Derived) {
        let wire = if self.wire_memo.0 == len {
            self.wire_memo.1
        } else {
            let w = derived.wire_time_ns(len);
            self.wire_memo = (len, w);
            w
        };
        self.idle_at = self.idle_at.max(now) + wire;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_drains_at_link_rate_and_closes_beyond_its_limit() {
        // One full packet (1472 + 66 bytes) is 492 ns at 25 Gbps, the limit.
        let c = Config::default();
        let d = Derived::new(&c);
        let mut p = Pacer::new(&c, 1_000);
        assert!(p.is_open(1_000));
        assert_eq!(p.opens_at(), Some(1_000 - 492));
        p.on_transmit(1_000, 1472, &d);
        // 492 ns queued: still open (at most the limit).
        assert!(p.is_open(1_000));
        p.on_transmit(1_000, 1472, &d);
        assert!(!p.is_open(1_000));
        assert_eq!(p.opens_at(), Some(1_000 + 492));
        assert!(p.is_open(1_492));
        // An idle NIC does not bank time: the next packet starts from now.
        p.on_transmit(10_000, 100, &d);
        assert_eq!(p.opens_at(), Some(10_000 + c.wire_time_ns(100) - 492));
        // The memo gives the same wire time as the division.
        p.on_transmit(10_000, 100, &d);
        assert_eq!(p.opens_at(), Some(10_000 + 2 * c.wire_time_ns(100) - 492));
    }
}
