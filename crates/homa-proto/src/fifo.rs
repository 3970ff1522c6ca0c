//! The FIFO share's credit, one rule for both schedulers that give a small
//! fraction of their bytes to the oldest message instead of the shortest: the
//! receiver's grants (`grant_fifo_permille`) and the sender's pacer
//! (`pacer_fifo_permille`), `docs/protocol.md` §3.3 and §4.4.

/// Credit towards the oldest message's next turn, in thousandths of a byte.
/// Every byte the scheduler hands out by SRPT while another message waits
/// earns `permille` thousandths; a turn costs one quantum (1000 × the bytes
/// of one turn: a packet's payload for the pacer, a grant window for
/// grants). Invariant: credit ≤ two quanta, so that the share is a trickle,
/// not a burst after a quiet period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FifoCredit(u64);

impl FifoCredit {
    /// The quantum of turns of `bytes` each.
    #[inline(always)]
    pub fn quantum(bytes: u32) -> u64 {
        1000 * bytes as u64
    }

    /// Earns `permille` of `bytes` handed out while others competed, up to
    /// two quanta.
    #[inline(always)]
    pub fn accrue(&mut self, bytes: u64, permille: u32, quantum: u64) {
        self.0 = (self.0 + bytes * permille as u64).min(2 * quantum);
    }

    /// Whether the oldest message's turn has come.
    #[inline(always)]
    pub fn due(&self, quantum: u64) -> bool {
        self.0 >= quantum
    }

    /// Pays for one turn (only when [`Self::due`]).
    #[inline(always)]
    pub fn spend(&mut self, quantum: u64) {
        debug_assert!(self.due(quantum));
        self.0 -= quantum;
    }

    /// Forgets the credit (the oldest message is being served anyway).
    #[inline(always)]
    pub fn clear(&mut self) {
        self.0 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_is_a_share_of_the_bytes_and_capped_at_two_turns() {
        let q = FifoCredit::quantum(1_000);
        let mut c = FifoCredit::default();
        // 5% of 19,000 bytes: 950 bytes' worth, not yet a 1,000-byte turn.
        c.accrue(19_000, 50, q);
        assert!(!c.due(q));
        c.accrue(1_000, 50, q);
        assert!(c.due(q));
        c.spend(q);
        assert_eq!(c, FifoCredit::default());
        // A long busy period earns at most two turns.
        c.accrue(10_000_000, 50, q);
        assert_eq!(c, FifoCredit(2 * q));
        c.spend(q);
        c.spend(q);
        assert!(!c.due(q));
        c.accrue(1_000_000, 50, q);
        c.clear();
        assert!(!c.due(q));
        // 0 per mille never earns a turn.
        c.accrue(u32::MAX as u64, 0, q);
        assert!(!c.due(q));
    }
}
