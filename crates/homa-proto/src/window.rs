//! Seed 003's per-peer windows under `WindowPolicy::Adaptive`
//! (`docs/congestion.md`): the receiver's grant window from the peer's
//! `rtt_min`, and the sender's unscheduled window, cut when the peer is
//! congested (or, with a downlink budget, rations its grants) and grown
//! back while it is not. Under static windows, the default, only
//! [`WindowParams`]' static values are read.

use crate::config::Config;
use crate::rtt::RttEstimator;
use crate::time::Time;

/// What adaptive windows are computed from: fixed for an endpoint, kept in
/// `Derived`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WindowParams {
    link_bps: u64,
    /// Payload bytes of a full DATA packet: windows are whole packets, and
    /// one packet is the floor.
    dpp: u32,
    /// `Config::effective_unsched_bytes`: a peer's unscheduled window until
    /// it has a sample.
    static_unsched: u32,
    /// `Config::effective_grant_window`: likewise for grants.
    static_grant: u32,
    /// The largest window: a grant window beyond the largest message buys
    /// nothing, and keeps the grant arithmetic far from 2^31.
    max: u32,
    grant_factor: u32,
    ratio_permille: u32,
    /// `Config::grant_covers_foreign_queue`.
    cover_foreign_queue: bool,
    /// `Config::unsched_cut_when_rationed`, with a downlink budget.
    cut_when_rationed: bool,
    /// With a downlink budget, the most unscheduled bytes of one message:
    /// the budget in whole packets (links alike: the peer's receiver lets
    /// no more than that queue at its downlink, and a far peer's BDP,
    /// 277–514 KB in the simulator's rtt-mix, would send up to several
    /// budgets in one burst that no grant controls). 0: no budget.
    unsched_cap: u32,
}

impl WindowParams {
    pub fn new(config: &Config) -> WindowParams {
        let dpp = config.max_data_per_packet().max(1) as u32;
        WindowParams {
            link_bps: config.link_bps,
            dpp,
            static_unsched: config.effective_unsched_bytes(),
            static_grant: config.effective_grant_window(),
            max: config
                .max_message_length
                .max(config.effective_grant_window())
                .clamp(dpp, 1 << 30),
            grant_factor: config.rtt_grant_factor,
            ratio_permille: config.unsched_ratio_permille,
            cover_foreign_queue: config.grant_covers_foreign_queue,
            cut_when_rationed: config.unsched_cut_when_rationed
                && config.effective_downlink_budget() > 0,
            unsched_cap: match config.effective_downlink_budget() {
                0 => 0,
                b => (b / dpp * dpp).max(dpp),
            },
        }
    }

    /// `rtt_ns` of bytes at the link rate, rounded up to whole packets,
    /// between one packet and [`Self::max`].
    fn packets_of(&self, rtt_ns: u64) -> u32 {
        let bytes = (rtt_ns as u128 * self.link_bps as u128 / 8_000_000_000) as u64;
        let packets = bytes.div_ceil(self.dpp as u64).max(1);
        packets.saturating_mul(self.dpp as u64).min(self.max as u64) as u32
    }

    /// The peer's bandwidth-delay product: `rtt_min` of bytes at our link
    /// rate (the peer's is not known; links are assumed alike).
    pub fn bdp(&self, rtt_min: u32) -> u32 {
        self.packets_of(rtt_min as u64)
    }

    /// The grant window of a peer whose `rtt_min` is `rtt_min` (seed 003:
    /// `rtt_grant = 3 × rtt_min`, window = `rtt_grant` × link rate); the
    /// static window without a sample.
    #[cfg(test)]
    pub fn grant_window(&self, rtt_min: Option<u32>) -> u32 {
        self.grant_window_over_queue(rtt_min, 0)
    }

    /// The grant window across a standing queue of `queue_ns`: enough to
    /// keep a message moving at the link rate over the path's current
    /// round trip (`rtt_min + queue_ns`), and never less than
    /// [`Self::grant_window`]. The factor's slack (3 × `rtt_min` already
    /// covers 2 × `rtt_min` of queueing) keeps small delays from moving
    /// the window at all.
    pub fn grant_window_over_queue(&self, rtt_min: Option<u32>, queue_ns: u64) -> u32 {
        match rtt_min {
            Some(m) => {
                let m = m as u64;
                self.packets_of((m * self.grant_factor as u64).max(m + queue_ns))
            }
            None => self.static_grant,
        }
    }

    /// The queueing (ns) on a peer's path that is not this receiver's own:
    /// the smoothed RTT beyond `rtt_min`, times the share of our link that
    /// our own DATA did not use over the last RTT (`rx_bps`, all peers).
    /// A queue that our own traffic fills (an incast of our grants and
    /// their unscheduled bytes) comes with our link busy receiving, so it
    /// counts for nothing; one that other traffic fills leaves our receive
    /// rate low while the RTT is high. "Busy" is [`BUSY_PERMILLE`] of
    /// the link: payload never fills all of it (headers), and a small idle
    /// share read as foreign would widen the windows of an incast, whose
    /// wider windows make the queue longer. Zero unless
    /// `Config::grant_covers_foreign_queue`.
    pub fn foreign_queue_ns(&self, rtt: &RttEstimator, rx_bps: u64) -> u64 {
        let Some(min) = rtt.min() else {
            return 0;
        };
        if !self.cover_foreign_queue || self.link_bps == 0 {
            return 0;
        }
        let busy = (self.link_bps as u128 * BUSY_PERMILLE / 1000).max(1);
        let queue = (rtt.srtt() as u64).saturating_sub(min as u64) as u128;
        let idle = busy.saturating_sub(rx_bps as u128);
        (queue * idle / busy) as u64
    }

    #[cfg(test)]
    pub fn static_unsched(&self) -> u32 {
        self.static_unsched
    }

    pub fn static_grant(&self) -> u32 {
        self.static_grant
    }
}

/// A message that waits for its first grant longer than this many
/// smoothed RTTs after its unscheduled bytes was rationed by its receiver
/// (`UnschedWindow::update`): unrationed, the first grant comes about one
/// RTT after the first packet, when a BDP of unscheduled bytes is out.
pub(crate) const RATIONED_RTTS: u64 = 2;

/// The share (per mille of `link_bps`) of DATA payload at which a
/// receiver's link counts as busy with its own traffic
/// ([`WindowParams::foreign_queue_ns`]): full packets carry 94-97% payload.
const BUSY_PERMILLE: u128 = 900;

/// The rate an endpoint received DATA at (payload, all peers), measured
/// over intervals of about one RTT: [`WindowParams::foreign_queue_ns`]
/// tells its own queue from other traffic's by it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RxRate {
    /// Start of the current interval and the byte count then.
    since: Time,
    bytes_then: u64,
    /// The rate over the last complete interval, bits per second.
    bps: u64,
}

impl RxRate {
    /// Notes the total `bytes` received by `now`; an interval closes once
    /// it is `interval` ns long (the sampled peer's smoothed RTT). Returns
    /// the rate of the last closed interval.
    pub fn update(&mut self, now: Time, bytes: u64, interval: u64) -> u64 {
        let dt = now.saturating_sub(self.since);
        if self.since == 0 {
            (self.since, self.bytes_then) = (now, bytes);
        } else if dt >= interval.max(1) {
            let db = bytes.saturating_sub(self.bytes_then) as u128;
            self.bps = (db * 8_000_000_000 / dt as u128).min(u64::MAX as u128) as u64;
            (self.since, self.bytes_then) = (now, bytes);
        }
        self.bps
    }
}

/// A change [`UnschedWindow::update`] made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WindowChange {
    /// Halved: the peer is congested.
    CutCongested,
    /// Halved: little of what went to the peer was unscheduled while
    /// messages waited for grants.
    CutRatio,
    /// Halved: the peer asked us to resend bytes we had sent (a loss, or
    /// a delay beyond its resend interval).
    CutLoss,
    /// Halved: a message to the peer waited for its first grant more
    /// than [`RATIONED_RTTS`] smoothed RTTs: the receiver is rationing
    /// its downlink (`Config::unsched_cut_when_rationed`).
    CutRationed,
    /// Grown by a packet, or set to the bandwidth-delay product.
    Grown,
}

/// A sender's unscheduled window for one peer: how many leading bytes of a
/// new message to it go without grants. Seed 003: unscheduled bytes that
/// arrive at a congested receiver (or queue behind other traffic) only add
/// to the queue, while scheduled bytes are paced by the receiver; so the
/// unscheduled window shrinks under congestion and when the traffic to the
/// peer is mostly scheduled anyway, and grows back additively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct UnschedWindow {
    /// The window (0: no sample yet; the static unscheduled bytes apply).
    bytes: u32,
    /// When the window was last set or changed: at most one change per
    /// smoothed RTT, so that a change is seen in the samples before the
    /// next one (AIMD's once per round trip).
    changed_at: Time,
    /// Length of the messages started to the peer since `changed_at`...
    started: u64,
    /// ...and how many of those bytes were unscheduled.
    started_unsched: u64,
    /// A message to the peer had sent all it was granted and waited for
    /// more since `changed_at`.
    waited: bool,
    /// The peer asked us to resend bytes we had already sent since
    /// `changed_at`: with shallow switch buffers, loss comes long before
    /// the RTT can rise to the congestion threshold (a 256 KB buffer
    /// drains in 82 µs at 25 Gbps, under 8 × most paths' `rtt_min`).
    lost: bool,
    /// The longest a message started to the peer waited for its first
    /// grant after its unscheduled bytes, since `changed_at`: a receiver
    /// that serves others first (its downlink budget full) makes it wait
    /// longer than a round trip, and unscheduled bytes sent to it then
    /// only queue at its downlink.
    first_wait_ns: u64,
}

impl UnschedWindow {
    /// The unscheduled bytes for a new message to the peer.
    #[inline]
    pub fn get(&self, p: &WindowParams) -> u32 {
        if self.bytes == 0 {
            p.static_unsched
        } else {
            self.bytes
        }
    }

    /// A message of `len` bytes, `unsched` of them unscheduled, starts.
    #[inline]
    pub fn on_message(&mut self, len: u32, unsched: u32) {
        self.started += len as u64;
        self.started_unsched += unsched as u64;
    }

    /// A message to the peer waited `ns` for a grant (`first`: its first
    /// one, after its unscheduled bytes).
    #[inline]
    pub fn on_wait(&mut self, ns: u64, first: bool) {
        self.waited = true;
        if first {
            self.first_wait_ns = self.first_wait_ns.max(ns);
        }
    }

    /// The peer asked for bytes again that were sent.
    #[inline]
    pub fn on_loss(&mut self) {
        self.lost = true;
    }

    /// Applies seed 003's rules after an RTT sample (`rtt` already holds
    /// it): the window is at most the peer's bandwidth-delay product (and
    /// starts there); once per smoothed RTT it is halved (not below a
    /// packet) if the peer is congested, or if less than
    /// `unsched_ratio_permille` of the bytes started since the last change
    /// were unscheduled while a message waited for grants, or if the peer
    /// asked us to resend bytes we had sent; otherwise it grows by a
    /// packet.
    pub fn update(
        &mut self,
        now: Time,
        rtt: &RttEstimator,
        p: &WindowParams,
    ) -> Option<WindowChange> {
        let min = rtt.min()?;
        let ceiling = match p.unsched_cap {
            0 => p.bdp(min),
            cap => p.bdp(min).min(cap),
        };
        if self.bytes == 0 {
            self.bytes = ceiling;
            self.restart(now);
            return Some(WindowChange::Grown);
        }
        self.bytes = self.bytes.min(ceiling);
        if now.saturating_sub(self.changed_at) < rtt.srtt().max(min) as u64 {
            return None;
        }
        let low_ratio = self.waited
            && self.started > 0
            && self.started_unsched * 1000 < self.started * p.ratio_permille as u64;
        let rationed =
            p.cut_when_rationed && self.first_wait_ns > RATIONED_RTTS * rtt.srtt().max(min) as u64;
        let change = if rtt.congested() || low_ratio || self.lost || rationed {
            let half = (self.bytes / 2) / p.dpp * p.dpp;
            self.bytes = half.max(p.dpp);
            Some(if rtt.congested() {
                WindowChange::CutCongested
            } else if low_ratio {
                WindowChange::CutRatio
            } else if self.lost {
                WindowChange::CutLoss
            } else {
                WindowChange::CutRationed
            })
        } else if self.bytes < ceiling && (!p.cut_when_rationed || self.started > 0) {
            // Under the rationing rule, only a window that new messages
            // used (and found their receiver not rationing) grows: a
            // message's later grants come once its receiver serves it, and
            // say nothing about the next message's unscheduled bytes.
            self.bytes = (self.bytes + p.dpp).min(ceiling);
            Some(WindowChange::Grown)
        } else {
            None
        };
        self.restart(now);
        change
    }

    /// Starts a new period of observation.
    fn restart(&mut self, now: Time) {
        self.changed_at = now;
        self.started = 0;
        self.started_unsched = 0;
        self.waited = false;
        self.lost = false;
        self.first_wait_ns = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 25 Gbps, 1416-byte packets: 10 µs is 31,250 bytes, 23 packets.
    fn params() -> WindowParams {
        WindowParams::new(&Config::default())
    }

    /// The same with seed 003's rules alone (no downlink budget, so no
    /// rationing rule: the window grows whether or not messages start).
    fn seed_params() -> WindowParams {
        WindowParams::new(&Config::default().with_downlink_budget(Some(0)))
    }

    #[test]
    fn windows_are_whole_packets_of_the_measured_rtt() {
        let p = params();
        assert_eq!(p.bdp(10_000), 23 * 1416);
        assert_eq!(p.grant_window(Some(10_000)), 67 * 1416); // 93,750 B
        assert_eq!(
            p.grant_window(None),
            Config::default().effective_grant_window()
        );
        // At least a packet, at most the largest message.
        assert_eq!(p.bdp(0), 1416);
        assert_eq!(p.grant_window(Some(u32::MAX)), 1_000_000);
        // A longer RTT, a larger window.
        assert!(p.grant_window(Some(40_000)) > p.grant_window(Some(2_000)));
    }

    fn sampled(e: &mut RttEstimator, now: Time, rtt: u32) {
        let latest = crate::rtt::Threshold {
            factor: 8,
            smoothed: false,
        };
        e.sample(now, rtt, 1_000_000_000, latest);
    }

    /// A standing queue the receiver did not make (srtt 100 µs above
    /// `rtt_min`, nothing granted) widens the grant window by 100 µs at
    /// the link rate; the same delay explained by the receiver's own
    /// granted bytes does not; and the setting turns it off.
    #[test]
    fn the_grant_window_covers_a_queue_the_receiver_did_not_make() {
        let p = WindowParams::new(&Config::default().with_grant_covers_foreign_queue(true));
        let mut e = RttEstimator::default();
        sampled(&mut e, 0, 10_000);
        assert_eq!(p.foreign_queue_ns(&e, 0), 0, "srtt at the minimum");
        for i in 1..60 {
            sampled(&mut e, i * 1_000, 110_000);
        }
        let q = p.foreign_queue_ns(&e, 0);
        assert!((99_000..=100_000).contains(&q), "{q}");
        // The path's RTT now, 10 + ~100 µs, at 25 Gbps in whole packets.
        let w = p.grant_window_over_queue(Some(10_000), q);
        assert_eq!(w, p.bdp(10_000 + q as u32), "{w}");
        assert!(w > 3 * p.grant_window(Some(10_000)), "{w}");
        // A queue within 3 × rtt_min's slack leaves the window alone.
        let base = p.grant_window(Some(10_000));
        assert_eq!(p.grant_window_over_queue(Some(10_000), 0), base);
        assert_eq!(p.grant_window_over_queue(Some(10_000), 20_000), base);
        assert!(p.grant_window_over_queue(Some(10_000), 21_000) > base);
        // Our own DATA filling our link (90% of it: payload) explains the
        // whole delay...
        assert_eq!(p.foreign_queue_ns(&e, 25_000_000_000), 0);
        assert_eq!(p.foreign_queue_ns(&e, 22_500_000_000), 0);
        // ...half of that, half of it.
        let half = p.foreign_queue_ns(&e, 11_250_000_000);
        assert!(half.abs_diff(q / 2) <= 1, "{half} {q}");
        let off = params(); // the default: off
        assert_eq!(off.foreign_queue_ns(&e, 0), 0);
        assert_eq!(p.foreign_queue_ns(&RttEstimator::default(), 0), 0);
    }

    #[test]
    fn the_receive_rate_is_measured_over_closed_intervals() {
        let mut r = RxRate::default();
        assert_eq!(r.update(1_000, 0, 10_000), 0);
        // 5,000 bytes in 5 µs: the interval is still open.
        assert_eq!(r.update(6_000, 5_000, 10_000), 0);
        // 12,500 bytes in 10 µs: 10 Gbps.
        assert_eq!(r.update(11_000, 12_500, 10_000), 10_000_000_000);
        // Kept until the next interval closes.
        assert_eq!(r.update(12_000, 20_000, 10_000), 10_000_000_000);
        assert_eq!(r.update(21_000, 12_500, 10_000), 0);
    }

    #[test]
    fn halves_under_congestion_and_grows_back_a_packet_per_rtt() {
        let p = seed_params();
        let mut w = UnschedWindow::default();
        let mut e = RttEstimator::default();
        assert_eq!(w.get(&p), p.static_unsched());
        sampled(&mut e, 0, 10_000);
        assert_eq!(w.update(0, &e, &p), Some(WindowChange::Grown));
        assert_eq!(w.get(&p), 23 * 1416);
        // Congested: halved once per smoothed RTT, not per sample.
        let mut t = 0;
        let mut cuts = 0;
        for _ in 0..100 {
            t += 5_000;
            sampled(&mut e, t, 100_000);
            if let Some(c) = w.update(t, &e, &p) {
                assert_eq!(c, WindowChange::CutCongested);
                cuts += 1;
            }
        }
        assert!((2..20).contains(&cuts), "{cuts} cuts");
        assert_eq!(w.get(&p), 1416, "floored at one packet");
        // Uncongested again: one packet per RTT, up to the BDP.
        let mut grown = 0;
        for _ in 0..2000 {
            t += 5_000;
            sampled(&mut e, t, 10_000);
            if w.update(t, &e, &p) == Some(WindowChange::Grown) {
                grown += 1;
            }
        }
        assert_eq!(grown, 22);
        assert_eq!(w.get(&p), 23 * 1416);
    }

    #[test]
    fn halves_when_mostly_scheduled_bytes_wait_for_grants() {
        let p = params();
        let mut w = UnschedWindow::default();
        let mut e = RttEstimator::default();
        sampled(&mut e, 0, 10_000);
        w.update(0, &e, &p);
        let full = w.get(&p);
        // 30% unscheduled, but nothing waited: no cut.
        w.on_message(100_000, 30_000);
        sampled(&mut e, 20_000, 10_000);
        assert_eq!(w.update(20_000, &e, &p), None);
        // 30% unscheduled and a message waited: cut.
        w.on_message(100_000, 30_000);
        w.on_wait(0, false);
        sampled(&mut e, 40_000, 10_000);
        assert_eq!(w.update(40_000, &e, &p), Some(WindowChange::CutRatio));
        assert_eq!(w.get(&p), full / 2 / 1416 * 1416);
        // 50% unscheduled with waiting: grows.
        w.on_message(100_000, 50_000);
        w.on_wait(0, false);
        sampled(&mut e, 60_000, 10_000);
        assert_eq!(w.update(60_000, &e, &p), Some(WindowChange::Grown));
    }

    #[test]
    fn halves_after_a_loss_once_per_rtt() {
        let p = seed_params();
        let mut w = UnschedWindow::default();
        let mut e = RttEstimator::default();
        sampled(&mut e, 0, 10_000);
        w.update(0, &e, &p);
        let full = w.get(&p);
        // Two losses within one RTT: one cut, at the next sample an RTT on.
        w.on_loss();
        sampled(&mut e, 5_000, 10_000);
        assert_eq!(w.update(5_000, &e, &p), None);
        w.on_loss();
        sampled(&mut e, 10_000, 10_000);
        assert_eq!(w.update(10_000, &e, &p), Some(WindowChange::CutLoss));
        assert_eq!(w.get(&p), full / 2 / 1416 * 1416);
        // The loss is forgotten with the cut: the window grows back.
        sampled(&mut e, 20_000, 10_000);
        assert_eq!(w.update(20_000, &e, &p), Some(WindowChange::Grown));
    }

    /// With a downlink budget (the default's derived one), a message that
    /// waited for its first grant more than two smoothed RTTs halves the
    /// window at the next sample an RTT on; a shorter wait does not; the
    /// window grows back only while new messages start to the peer; and
    /// it is never above the budget.
    #[test]
    fn a_long_wait_for_the_first_grant_halves_the_window() {
        let p = params();
        let mut w = UnschedWindow::default();
        let mut e = RttEstimator::default();
        sampled(&mut e, 0, 10_000);
        w.update(0, &e, &p);
        let full = w.get(&p);
        // 15 µs for the first grant (under 2 × 10 µs): no cut, and no
        // message started, so no growth either.
        w.on_message(64_000, full);
        w.on_wait(15_000, true);
        sampled(&mut e, 20_000, 10_000);
        assert_eq!(w.update(20_000, &e, &p), None);
        // A later grant's wait says nothing about the unscheduled bytes.
        w.on_message(64_000, full);
        w.on_wait(500_000, false);
        sampled(&mut e, 40_000, 10_000);
        assert_eq!(w.update(40_000, &e, &p), None);
        // 500 µs for the first grant: the receiver rationed.
        w.on_message(64_000, full);
        w.on_wait(500_000, true);
        sampled(&mut e, 60_000, 10_000);
        assert_eq!(w.update(60_000, &e, &p), Some(WindowChange::CutRationed));
        assert_eq!(w.get(&p), full / 2 / 1416 * 1416);
        let cut = w.get(&p);
        // No new message: no growth, however many samples.
        for i in 1..10 {
            sampled(&mut e, 60_000 + i * 20_000, 10_000);
            assert_eq!(w.update(60_000 + i * 20_000, &e, &p), None);
        }
        assert_eq!(w.get(&p), cut);
        // A new message that got its grant in time: a packet more.
        w.on_message(64_000, cut);
        sampled(&mut e, 300_000, 10_000);
        assert_eq!(w.update(300_000, &e, &p), Some(WindowChange::Grown));
        assert_eq!(w.get(&p), cut + 1416);
        // The window is at most the downlink budget (67 packets), however
        // long the path: 40 µs is 89 packets at 25 Gbps.
        let mut far = UnschedWindow::default();
        let mut e = RttEstimator::default();
        sampled(&mut e, 0, 40_000);
        far.update(0, &e, &p);
        assert_eq!(p.bdp(40_000), 89 * 1416);
        assert_eq!(far.get(&p), 67 * 1416);
        assert_eq!(seed_params().bdp(40_000), 89 * 1416);
        // Off: the long wait cuts nothing, and the window grows without
        // new messages (seed 003's rules alone).
        let off = WindowParams::new(&Config::default().with_unsched_cut_when_rationed(false));
        let no_budget = WindowParams::new(&Config::default().with_downlink_budget(Some(0)));
        for p in [off, no_budget] {
            let mut w = UnschedWindow::default();
            let mut e = RttEstimator::default();
            sampled(&mut e, 0, 10_000);
            w.update(0, &e, &p);
            w.bytes = 1416;
            w.on_wait(500_000, true);
            sampled(&mut e, 20_000, 10_000);
            assert_eq!(w.update(20_000, &e, &p), Some(WindowChange::Grown));
        }
    }

    #[test]
    fn a_shorter_path_clamps_the_window_at_once() {
        let p = seed_params();
        let mut w = UnschedWindow::default();
        let mut e = RttEstimator::default();
        sampled(&mut e, 0, 40_000);
        w.update(0, &e, &p);
        assert_eq!(w.get(&p), p.bdp(40_000));
        sampled(&mut e, 1, 4_000);
        w.update(1, &e, &p);
        assert_eq!(w.get(&p), p.bdp(4_000));
    }
}
