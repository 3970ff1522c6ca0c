//! The receiver's grants (`docs/protocol.md` §4.3–4.4): which incoming
//! messages still need grants, in SRPT order and by age; how many scheduled
//! bytes are granted but not yet received, the cap on them (and, under
//! adaptive windows, the downlink budget on all bytes still to arrive,
//! `docs/congestion.md` §9), the window each message gets, the priority
//! of each rank, the FIFO share's credit, and
//! whether a grant pass is owed. The pass itself (`Endpoint::update_grants`,
//! incoming.rs) walks the top of this queue and raises each message's grant
//! with this arithmetic.

use crate::config::{Config, GrantPolicy};
use crate::fifo::FifoCredit;
use crate::rpc::RpcKey;
use crate::srpt::SrptQueue;

/// Invariants: `queue` and `by_age` hold the same messages (an entry
/// `(remaining, birth, key)` in one, `(birth, key)` in the other; the
/// endpoint keeps `remaining` in `InMsg::grant_key`, the entry's key): the
/// incoming messages with pool space that are not yet granted in full
/// (none under `GrantPolicy::EveryMessage`, which grants each message from
/// its own packets, `Endpoint::handle_data`);
/// `incoming` is the sum of `InMsg::outstanding()` over the incoming
/// messages that have pool space (kept by the endpoint through
/// [`Self::track`], [`Self::add`] and [`Self::remove`]); under SRPT, grants other than
/// FIFO grants never take it beyond `max_incoming`; `settled` is only true
/// while a grant pass would grant nothing; the FIFO credit is at most two
/// quanta.
pub(crate) struct Grants {
    /// Sum over incoming messages of granted-but-not-received bytes.
    incoming: u64,
    /// Sum over incoming messages of the bytes still to arrive of those
    /// granted or unscheduled (`incoming` plus unreceived unscheduled
    /// bytes): what will pass the receiver's downlink.
    arriving: u64,
    /// `Config::effective_downlink_budget` under adaptive windows (0: no
    /// budget)...
    budget: u64,
    /// ...and the cap on `arriving` a grant pass set from it
    /// ([`Self::cap_for_budget`]).
    budget_cap: u64,

    /// Cap on `incoming` (`Config::effective_max_incoming`; under adaptive
    /// windows with `max_incoming` unset, set by each grant pass,
    /// [`Self::cap_for_window`]).
    max_incoming: u64,
    /// `Config::max_incoming` is unset, so the cap follows the window.
    derived_cap: bool,
    /// `Config::max_overcommit`.
    overcommit: u64,
    /// Credit towards the oldest message's next grant.
    fifo: FifoCredit,
    /// `Config::grant_fifo_permille`.
    fifo_permille: u32,
    /// Bytes a message may have granted beyond what it has received, under
    /// static windows (adaptive ones are per peer, passed to
    /// [`Self::next_grant`]); also the FIFO quantum.
    window: u32,
    /// Priority levels for scheduled packets (at least 1).
    sched_levels: u8,
    /// `Config::sched_tail_level`, with at least
    /// [`MIN_SCHED_LEVELS_FOR_TAIL`] scheduled levels.
    tail_level: bool,
    /// `Config::lead_window_packets`, in bytes of full packets (0 under
    /// adaptive windows, which cover the measured round trip already).
    lead_extra: u32,
    /// `Config::sched_levels_from_top`.
    from_top: bool,
    /// `Config::effective_boost_tail_bytes` (0: off).
    boost_tail: u32,
    /// `GrantPolicy::EveryMessage`'s increment, if that is the policy.
    every_message: Option<u32>,
    /// Inside `handle_datagrams`: grant passes wait for the last packet...
    deferred: bool,
    /// ...and this says one is owed.
    dirty: bool,
    /// A grant pass would change nothing now: the last one granted nothing,
    /// and no incoming message, the grantable set or `incoming` changed
    /// since. Lets `free_rpc` of an RPC without an incoming message (most
    /// frees) skip the pass, which reads the top grantable RPCs' (cold)
    /// slab entries.
    settled: bool,
    /// Messages that need grants: (remaining bytes, birth, key).
    queue: SrptQueue,
    /// The same messages by age.
    by_age: SrptQueue<(u64, RpcKey)>,
    /// The keys a pass works on (kept to reuse its allocation).
    top: Vec<RpcKey>,
}

/// The top scheduled level is kept for last windows
/// (`Config::sched_tail_level`) only with at least this many scheduled
/// levels, so that three or more remain for SRPT ranks. With three
/// scheduled levels (4 levels in all, one unscheduled) ranks 1 and beyond
/// shared the lowest level and W4's and W5's large deciles got 28-90%
/// worse at p99 (`docs/simulation.md`, "Twenty-third session").
const MIN_SCHED_LEVELS_FOR_TAIL: u8 = 4;

impl Grants {
    pub fn new(config: &Config) -> Grants {
        let adaptive = config.window_policy == crate::config::WindowPolicy::Adaptive;
        Grants {
            incoming: 0,
            arriving: 0,
            budget: if adaptive && config.grant_policy == GrantPolicy::Srpt {
                config.effective_downlink_budget() as u64
            } else {
                0
            },
            budget_cap: u64::MAX,
            max_incoming: config.effective_max_incoming(),
            derived_cap: config.max_incoming.is_none(),
            overcommit: config.max_overcommit as u64,
            fifo: FifoCredit::default(),
            fifo_permille: config.grant_fifo_permille,
            window: config.effective_grant_window(),
            sched_levels: config
                .priority_levels
                .saturating_sub(config.unsched_priorities)
                .max(1),
            from_top: config.sched_levels_from_top,
            tail_level: config.sched_tail_level
                && config
                    .priority_levels
                    .saturating_sub(config.unsched_priorities)
                    >= MIN_SCHED_LEVELS_FOR_TAIL,
            // Adaptive windows are three measured round trips already.
            lead_extra: if adaptive {
                0
            } else {
                config
                    .lead_window_packets
                    .saturating_mul(config.max_data_per_packet() as u32)
            },
            boost_tail: config.effective_boost_tail_bytes(),
            every_message: match config.grant_policy {
                GrantPolicy::Srpt => None,
                GrantPolicy::EveryMessage { increment_bytes } => Some(increment_bytes),
            },
            deferred: false,
            dirty: false,
            settled: true,
            queue: SrptQueue::default(),
            by_age: SrptQueue::default(),
            top: Vec::new(),
        }
    }

    /// Adds a message with `remaining` bytes still to receive that needs
    /// grants.
    #[inline]
    pub fn enqueue(&mut self, remaining: u32, birth: u64, key: RpcKey) {
        self.queue.insert((remaining, birth, key));
        self.by_age.insert((birth, key));
    }

    /// Removes a message queued under `remaining` (granted in full, complete
    /// or dropped).
    #[inline]
    pub fn dequeue(&mut self, remaining: u32, birth: u64, key: RpcKey) {
        self.queue.remove(&(remaining, birth, key));
        self.by_age.remove(&(birth, key));
    }

    /// A message queued under `old` now has `remaining` bytes left to receive.
    #[inline(always)]
    pub fn requeue(&mut self, old: u32, birth: u64, key: RpcKey, remaining: u32) {
        self.queue.update(&(old, birth, key), remaining);
    }

    /// Whether some message needs grants.
    #[inline(always)]
    pub fn any_grantable(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The static grant window.
    #[inline(always)]
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Adaptive windows: the largest window of the messages a pass grants
    /// to is `window`, so the cap is `max_overcommit` of it (seed 003's
    /// `max_incoming = window × overcommit`), unless configured.
    #[inline]
    pub fn cap_for_window(&mut self, window: u32) {
        if self.derived_cap {
            self.max_incoming = self.overcommit * window as u64;
        }
    }

    /// The downlink budget (0: none).
    #[inline(always)]
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Under a downlink budget: the messages a pass grants to fill `pipe`
    /// bytes of their paths at the link rate, so the bytes still to
    /// arrive may be that plus the budget (what would queue at the
    /// downlink is the rest).
    #[inline]
    pub fn cap_for_budget(&mut self, pipe: u64) {
        self.budget_cap = self.budget + pipe;
    }

    /// Bytes still to arrive, granted or unscheduled, over all incoming
    /// messages.
    #[cfg(test)]
    pub fn arriving(&self) -> u64 {
        self.arriving
    }

    /// Messages that need grants.
    #[inline]
    pub fn grantable(&self) -> usize {
        self.queue.len()
    }

    /// The `k` messages with the fewest remaining bytes (the ones a pass
    /// grants to), shortest first; give the list back with
    /// [`Self::return_top`].
    #[inline]
    pub fn take_top(&mut self, k: usize) -> Vec<RpcKey> {
        let mut top = std::mem::take(&mut self.top);
        top.clear();
        top.extend(self.queue.iter().take(k).map(|e| e.2));
        top
    }

    /// Gives back the list of [`Self::take_top`] (to reuse its allocation).
    #[inline]
    pub fn return_top(&mut self, top: Vec<RpcKey>) {
        self.top = top;
    }

    /// The oldest message that needs grants.
    #[inline]
    pub fn oldest(&self) -> Option<RpcKey> {
        self.by_age.first().map(|e| e.1)
    }

    /// A grant of `bytes` went to a message by SRPT while some message was
    /// left out: the FIFO share earns its part.
    #[inline]
    pub fn accrue_fifo(&mut self, bytes: u64) {
        let q = self.fifo_quantum();
        self.fifo.accrue(bytes, self.fifo_permille, q);
    }

    /// Whether the FIFO share has earned a grant to the oldest message.
    #[inline]
    pub fn fifo_due(&self) -> bool {
        self.fifo_permille > 0 && self.fifo.due(self.fifo_quantum())
    }

    /// Pays for a FIFO grant.
    #[inline]
    pub fn spend_fifo(&mut self) {
        self.fifo.spend(self.fifo_quantum());
    }

    /// Forgets the FIFO credit (the oldest message is granted to anyway).
    #[inline]
    pub fn clear_fifo(&mut self) {
        self.fifo.clear();
    }

    /// Granted bytes not yet received, over all incoming messages.
    #[inline]
    pub fn incoming(&self) -> u64 {
        self.incoming
    }

    /// A message's ([`InMsg::owed`](crate::rpc::InMsg::owed)) went from
    /// `old` to `new`.
    #[inline(always)]
    pub fn track(&mut self, old: (u64, u64), new: (u64, u64)) {
        self.incoming = self.incoming - old.0 + new.0;
        self.arriving = self.arriving - old.1 + new.1;
    }

    /// A message owing `owed` joins (it got pool space).
    #[inline]
    pub fn add(&mut self, owed: (u64, u64)) {
        self.incoming += owed.0;
        self.arriving += owed.1;
    }

    /// A message owing `owed` leaves (complete or dropped).
    #[inline]
    pub fn remove(&mut self, owed: (u64, u64)) {
        self.incoming -= owed.0;
        self.arriving -= owed.1;
    }

    /// The FIFO share's quantum: one window.
    #[inline]
    fn fifo_quantum(&self) -> u64 {
        FifoCredit::quantum(self.window)
    }

    /// The scheduled priority of the message of SRPT rank `rank` (0: the
    /// shortest) among `n` granted ones: the shortest gets the highest
    /// scheduled level. Counted from the top (the default), rank `r` gets
    /// the `r`-th level from the top whatever `n` is, so a larger newcomer
    /// never gets a level above an older, shorter message's. Counted from
    /// the bottom (the paper's rule), when there are fewer messages than
    /// levels they use the lowest ones (so that a new shorter message
    /// finds a higher level free).
    #[inline]
    pub fn level(&self, rank: usize, n: usize) -> u8 {
        // With the top level kept for last windows, ranks count from the
        // one below it.
        let s = self.sched_levels as usize - self.tail_level as usize;
        if self.from_top {
            (s - 1 - rank.min(s - 1)) as u8
        } else {
            (n.min(s) - 1 - rank.min(s - 1)) as u8
        }
    }

    /// The highest scheduled level.
    #[inline]
    pub fn sched_top(&self) -> u8 {
        self.sched_levels - 1
    }

    /// The level of a grant that leaves `left` bytes of a message to grant
    /// when its rank gives it `level`: the top scheduled level if that is
    /// kept for last windows (`Config::sched_tail_level`) and at most one
    /// `window` is left, else `level`.
    #[inline]
    pub fn tail_or(&self, level: u8, left: u32, window: u32) -> u8 {
        if self.tail_level && left <= window {
            level.max(self.sched_top())
        } else {
            level
        }
    }

    /// Window beyond a message's own for the receiver's top-ranked one
    /// (`Config::lead_window_packets`).
    #[inline]
    pub fn lead_extra(&self) -> u32 {
        self.lead_extra
    }

    /// Whether a message with `to_grant` bytes still to grant has its
    /// grants boosted to the unscheduled level of that size
    /// (`Config::boost_tail_bytes`).
    #[inline(always)]
    pub fn boosts(&self, to_grant: u32) -> bool {
        to_grant < self.boost_tail
    }

    /// Under `GrantPolicy::EveryMessage`, the increment; `None` under SRPT.
    #[inline(always)]
    pub fn every_message(&self) -> Option<u32> {
        self.every_message
    }

    /// `GrantPolicy::EveryMessage`'s rule, for a message of `len` bytes
    /// with `received` bytes received and `granted` granted, whose window
    /// is `window`: if the grant is below `received + window` (and the
    /// message's end), the new grant `min(len, received + window +
    /// increment)`; else `None`.
    #[inline(always)]
    pub fn every_message_grant(
        &self,
        window: u32,
        increment: u32,
        received: u32,
        granted: u32,
        len: u32,
    ) -> Option<u32> {
        let floor = received as u64 + window as u64;
        if granted as u64 >= floor || granted >= len {
            return None;
        }
        Some((floor + increment as u64).min(len as u64) as u32)
    }

    /// The grant offset a message whose window is `window` should have
    /// next, or `None` if it should get no grant now: at most a window
    /// beyond `base` (the bytes
    /// received, or for a FIFO grant the current grant) and the message's
    /// length `len`; not less than a full packet (`dpp`) beyond `granted`
    /// unless that reaches the end; and, except for FIFO grants (rare, and
    /// only to a message with nothing outstanding, or a full cap would
    /// starve them), within the room under `max_incoming`, of which at
    /// least a packet must be left.
    #[inline(always)]
    pub fn next_grant(
        &self,
        window: u32,
        base: u32,
        granted: u32,
        len: u32,
        dpp: u32,
        fifo: bool,
    ) -> Option<u32> {
        let target = (base as u64 + window as u64).min(len as u64) as u32;
        if target <= granted {
            return None;
        }
        let delta = target - granted;
        if target < len && delta < dpp {
            return None;
        }
        let mut room = self.max_incoming.saturating_sub(self.incoming);
        if self.budget > 0 {
            room = room.min(self.budget_cap.saturating_sub(self.arriving));
        }
        if !fifo && delta as u64 > room {
            if room < dpp as u64 {
                return None;
            }
            return Some(granted + room as u32);
        }
        Some(target)
    }

    /// Something a grant pass depends on changed.
    #[inline(always)]
    pub fn unsettle(&mut self) {
        self.settled = false;
    }

    /// A grant pass ran; `granted` says whether it granted anything.
    #[inline]
    pub fn settle(&mut self, granted: bool) {
        self.settled = !granted;
    }

    #[inline]
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Grant passes wait until [`Self::end_batch`] (a GRO batch's packets).
    #[inline]
    pub fn begin_batch(&mut self) {
        self.deferred = true;
    }

    /// Ends a batch; true if a grant pass is owed.
    #[inline]
    pub fn end_batch(&mut self) -> bool {
        self.deferred = false;
        std::mem::take(&mut self.dirty)
    }

    /// A pass is due: true if it may run now, false if it was noted for
    /// the end of the batch.
    #[inline(always)]
    pub fn pass_now(&mut self) -> bool {
        if self.deferred {
            self.dirty = true;
            false
        } else {
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(window: u32, max_incoming: u64, levels: u8, unsched: u8) -> Grants {
        Grants::new(&Config {
            grant_window: Some(window),
            max_incoming: Some(max_incoming),
            priority_levels: levels,
            unsched_priorities: unsched,
            ..Config::default()
        })
    }

    #[test]
    fn a_grant_is_a_window_beyond_the_received_bytes_in_whole_packets() {
        let g = grants(10_000, 1 << 30, 8, 4);
        // 0 received: a window.
        assert_eq!(
            g.next_grant(g.window(), 0, 1_000, 100_000, 1_000, false),
            Some(10_000)
        );
        // Less than a packet more: not yet...
        assert_eq!(
            g.next_grant(g.window(), 500, 10_000, 100_000, 1_000, false),
            None
        );
        // ...unless it reaches the end of the message.
        assert_eq!(
            g.next_grant(g.window(), 500, 10_000, 10_200, 1_000, false),
            Some(10_200)
        );
        // Never beyond the message, never backwards.
        assert_eq!(
            g.next_grant(g.window(), 95_000, 99_000, 100_000, 1_000, false),
            Some(100_000)
        );
        assert_eq!(
            g.next_grant(g.window(), 0, 100_000, 100_000, 1_000, false),
            None
        );
    }

    #[test]
    fn the_cap_limits_scheduled_grants_but_not_fifo_ones() {
        let mut g = grants(10_000, 15_000, 8, 4);
        g.add((12_000, 12_000));
        assert_eq!(g.incoming(), 12_000);
        // 3,000 of room: the grant shrinks to it.
        assert_eq!(
            g.next_grant(g.window(), 0, 0, 100_000, 1_000, false),
            Some(3_000)
        );
        g.track((2_000, 2_000), (2_500, 2_500));
        // 2,500 left: still a packet.
        assert_eq!(
            g.next_grant(g.window(), 0, 0, 100_000, 1_000, false),
            Some(2_500)
        );
        g.add((2_000, 2_000));
        // 500 left: less than a packet, nothing.
        assert_eq!(g.next_grant(g.window(), 0, 0, 100_000, 1_000, false), None);
        // A FIFO grant ignores the cap.
        assert_eq!(
            g.next_grant(g.window(), 5_000, 5_000, 100_000, 1_000, true),
            Some(15_000)
        );
        g.remove((14_500, 14_500));
        assert_eq!(g.incoming(), 0);
    }

    /// Under adaptive windows the budget caps what is still to arrive,
    /// unscheduled bytes of known messages included, at the budget plus
    /// the pipe a pass computed; without it (static windows, or a budget
    /// of 0) only `max_incoming` counts, and only granted bytes.
    #[test]
    fn the_downlink_budget_caps_bytes_still_to_arrive() {
        let adaptive = Config {
            window_policy: crate::config::WindowPolicy::Adaptive,
            downlink_budget: Some(10_000),
            max_incoming: Some(1 << 30),
            ..Config::default()
        };
        let mut g = Grants::new(&adaptive);
        assert_eq!(g.budget(), 10_000);
        // A message whose 8,000 unscheduled bytes have not arrived yet.
        g.add((0, 8_000));
        assert_eq!((g.incoming(), g.arriving()), (0, 8_000));
        g.cap_for_budget(5_000);
        // 15,000 may be on the way: 7,000 more.
        assert_eq!(
            g.next_grant(20_000, 0, 0, 100_000, 1_000, false),
            Some(7_000)
        );
        // Its bytes arrive: room for the whole window.
        g.track((0, 8_000), (0, 0));
        assert_eq!(
            g.next_grant(20_000, 0, 0, 100_000, 1_000, false),
            Some(15_000)
        );
        // A FIFO grant ignores the budget, as it ignores the cap.
        g.add((0, 15_000));
        assert_eq!(
            g.next_grant(20_000, 5_000, 5_000, 100_000, 1_000, true),
            Some(25_000)
        );
        // Off: a budget of 0, or static windows (whatever the setting).
        for c in [
            Config {
                downlink_budget: Some(0),
                ..adaptive.clone()
            },
            Config {
                window_policy: crate::config::WindowPolicy::Static,
                ..adaptive.clone()
            },
        ] {
            let mut g = Grants::new(&c);
            assert_eq!(g.budget(), 0);
            g.add((0, 8_000));
            g.cap_for_budget(5_000);
            assert_eq!(
                g.next_grant(20_000, 0, 0, 100_000, 1_000, false),
                Some(20_000)
            );
        }
        // The default: 30 µs at the link rate, whole packets.
        let d = Config::default();
        let dpp = d.max_data_per_packet() as u32;
        assert_eq!(d.effective_downlink_budget(), 67 * dpp); // 93,750 B at 25 Gbps
        assert_eq!(d.effective_downlink_budget() % dpp, 0);
    }

    #[test]
    fn shorter_messages_get_higher_scheduled_levels_from_the_top() {
        // 4 scheduled levels (0..=3), all of them for ranks: rank r gets
        // 3 - r whatever n is.
        let g = Grants::new(&Config {
            grant_window: Some(10_000),
            priority_levels: 8,
            unsched_priorities: 4,
            sched_tail_level: false,
            ..Config::default()
        });
        assert_eq!(g.level(0, 1), 3);
        assert_eq!((0..2).map(|r| g.level(r, 2)).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(
            (0..6).map(|r| g.level(r, 6)).collect::<Vec<_>>(),
            [3, 2, 1, 0, 0, 0]
        );
        let g = grants(10_000, 1 << 30, 8, 8);
        assert_eq!((0..3).map(|r| g.level(r, 3)).collect::<Vec<_>>(), [0, 0, 0]);
    }

    #[test]
    fn the_top_scheduled_level_is_kept_for_last_windows() {
        // The default: of 4 scheduled levels, 3 is kept for last windows
        // and ranks count from 2.
        let g = grants(10_000, 1 << 30, 8, 4);
        assert_eq!(
            (0..5).map(|r| g.level(r, 5)).collect::<Vec<_>>(),
            [2, 1, 0, 0, 0]
        );
        // A grant that leaves at most a window to grant goes at 3,
        // whatever its rank; one that leaves more keeps its rank's level.
        assert_eq!(g.tail_or(0, 10_000, 10_000), 3);
        assert_eq!(g.tail_or(2, 0, 10_000), 3);
        assert_eq!(g.tail_or(1, 10_001, 10_000), 1);
        // A boost above the scheduled levels stays.
        assert_eq!(g.tail_or(6, 5_000, 10_000), 6);
        // Three scheduled levels: all of them for ranks.
        let g = grants(10_000, 1 << 30, 4, 1);
        assert_eq!(
            (0..4).map(|r| g.level(r, 4)).collect::<Vec<_>>(),
            [2, 1, 0, 0]
        );
        assert_eq!(g.tail_or(0, 0, 10_000), 0);
        // One scheduled level: nothing to keep, ranks share it.
        let g = grants(10_000, 1 << 30, 8, 7);
        assert_eq!((0..3).map(|r| g.level(r, 3)).collect::<Vec<_>>(), [0, 0, 0]);
        assert_eq!(g.tail_or(0, 0, 10_000), 0);
        // Off: every level for ranks, no lift.
        let g = Grants::new(&Config {
            priority_levels: 8,
            unsched_priorities: 4,
            sched_tail_level: false,
            ..Config::default()
        });
        assert_eq!(g.level(0, 1), 3);
        assert_eq!(g.tail_or(1, 0, 10_000), 1);
    }

    #[test]
    fn the_lead_window_is_whole_packets() {
        let c = Config::default();
        let g = Grants::new(&c);
        assert_eq!(g.lead_extra(), 2 * c.max_data_per_packet() as u32);
        let g = Grants::new(&c.clone().with_lead_window_packets(0));
        assert_eq!(g.lead_extra(), 0);
        let g = Grants::new(
            &c.clone()
                .with_window_policy(crate::config::WindowPolicy::Adaptive),
        );
        assert_eq!(g.lead_extra(), 0);
    }

    #[test]
    fn the_tail_is_boosted_below_the_threshold_only() {
        // `None`: the grant window.
        let g = Grants::new(&Config {
            grant_window: Some(10_000),
            boost_tail_bytes: None,
            ..Config::default()
        });
        assert!(g.boosts(9_999));
        assert!(!g.boosts(10_000));
        // Off: the default.
        let g = Grants::new(&Config::default());
        assert!(!g.boosts(0));
        assert!(!g.boosts(1));
    }

    #[test]
    fn every_message_grants_a_window_and_an_increment_when_below_a_window() {
        let g = Grants::new(&Config {
            grant_window: Some(10_000),
            grant_policy: GrantPolicy::EveryMessage {
                increment_bytes: 5_000,
            },
            ..Config::default()
        });
        assert_eq!(g.every_message(), Some(5_000));
        // Granted 10,000 (the unscheduled bytes), 1,000 received: below
        // 11,000, so grant 16,000.
        assert_eq!(
            g.every_message_grant(g.window(), 5_000, 1_000, 10_000, 100_000),
            Some(16_000)
        );
        // Up to 5 more packets' worth received: no grant.
        assert_eq!(
            g.every_message_grant(g.window(), 5_000, 6_000, 16_000, 100_000),
            None
        );
        // Beyond: the next one.
        assert_eq!(
            g.every_message_grant(g.window(), 5_000, 6_001, 16_000, 100_000),
            Some(21_001)
        );
        // Never beyond the message; nothing once all is granted.
        assert_eq!(
            g.every_message_grant(g.window(), 5_000, 95_000, 99_000, 100_000),
            Some(100_000)
        );
        assert_eq!(
            g.every_message_grant(g.window(), 5_000, 95_000, 100_000, 100_000),
            None
        );
        // An increment of 0: a grant at every packet.
        assert_eq!(
            g.every_message_grant(g.window(), 0, 1_000, 10_000, 100_000),
            Some(11_000)
        );
        assert_eq!(Grants::new(&Config::default()).every_message(), None);
    }

    #[test]
    fn shorter_messages_get_higher_scheduled_levels_from_the_bottom() {
        // 4 scheduled levels (0..=3).
        let g = Grants::new(&Config {
            grant_window: Some(10_000),
            sched_levels_from_top: false,
            sched_tail_level: false,
            ..Config::default()
        });
        assert_eq!((0..2).map(|r| g.level(r, 2)).collect::<Vec<_>>(), [1, 0]);
        assert_eq!(
            (0..6).map(|r| g.level(r, 6)).collect::<Vec<_>>(),
            [3, 2, 1, 0, 0, 0]
        );
        // All levels unscheduled: scheduled packets share level 0.
        let g = Grants::new(&Config {
            priority_levels: 8,
            unsched_priorities: 8,
            sched_levels_from_top: false,
            ..Config::default()
        });
        assert_eq!((0..3).map(|r| g.level(r, 3)).collect::<Vec<_>>(), [0, 0, 0]);
    }

    #[test]
    fn batches_defer_passes_and_settling_is_tracked() {
        let mut g = grants(10_000, 1 << 30, 8, 4);
        assert!(g.is_settled());
        g.unsettle();
        assert!(!g.is_settled());
        g.settle(false);
        assert!(g.is_settled());
        g.settle(true);
        assert!(!g.is_settled());
        assert!(g.pass_now());
        g.begin_batch();
        assert!(!g.pass_now());
        assert!(g.end_batch(), "a pass was owed");
        assert!(!g.end_batch(), "and only one");
        assert!(g.pass_now());
        assert_eq!(g.fifo_quantum(), 10_000_000);
    }
}
