//! On-Ramp (Liu et al., NSDI 2021; issue #22): a sender holds a
//! destination's DATA at the edge while the one-way queueing delay the
//! destination reports exceeds a threshold, so a transient overload waits in
//! host memory instead of a switch queue (`docs/onramp.md`).
//!
//! It owns the per-peer one-way delay filter and hold state ([`OnRampPath`],
//! in the peer's cold [`crate::peer::PeerPath`]) and the endpoint's list of
//! held peers and parked messages ([`OnRamp`]). Off by default
//! (`Config::onramp`); when off nothing here runs.

use crate::config::Config;
use crate::peer::PeerKey;
use crate::rpc::RpcKey;
use crate::time::Time;

/// The parameters, derived once from the [`Config`] (`Config::onramp*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OnRampParams {
    /// T: queueing delay (ns) above which a destination is held.
    pub threshold_ns: u64,
    /// The longest single hold (ns), whatever the report says.
    pub max_hold_ns: u64,
    /// Length (ns) of each half of the two-bucket windowed minimum of the
    /// one-way delay.
    pub window_ns: u64,
    /// After a hold, the destination stays open this per-mille of its
    /// length before another (`Config::onramp_open_permille`).
    pub open_permille: u32,
    /// Only reports about packets sent after the previous hold ended start
    /// a hold (`Config::onramp_fresh_reports`).
    pub fresh_reports: bool,
    /// A hold keeps unscheduled bytes too: true on a network with one
    /// priority level, where they queue behind everything else. With
    /// several levels they go above the scheduled packets whose queueing
    /// the reports measure, so holding them only delays them (measured:
    /// `docs/onramp.md` §6.7); a held message then sends its unscheduled
    /// bytes and is parked when it reaches its scheduled part.
    pub hold_unscheduled: bool,
    /// A receiver holds its grants, by the same rule, while its own
    /// downlink's queueing delay (seen on arriving DATA) exceeds T
    /// (`Config::onramp_hold_grants`). Only under SRPT grants (Homa): at
    /// the release they go to the shortest messages first, so a hold
    /// delays the longest ones, which have time to spare. Granting every
    /// message (RAMCloud's BasicTransport, the simulator's stand-in for a
    /// sender-driven protocol such as the paper's CUBIC and BBR) keeps the
    /// paper's sender-side holds alone: a grant hold there delays every
    /// message alike (measured: the background's largest messages up to
    /// 1.37× worse, docs/onramp.md §6.9). And only on a network with one
    /// priority level: with several, short messages pass the scheduled
    /// queue the hold is for, so holding grants only delays the mid-size
    /// messages (measured: W4's eighth decile 0.79-1.26 of its p99 without
    /// On-Ramp over five seeds, against 1.03-1.62 with the sender's holds
    /// alone), as holding unscheduled bytes did (`hold_unscheduled`).
    pub hold_grants: bool,
}

impl OnRampParams {
    /// `None` when On-Ramp is off.
    pub fn new(config: &Config) -> Option<OnRampParams> {
        config.onramp.then(|| OnRampParams {
            threshold_ns: config.effective_onramp_threshold_ns(),
            max_hold_ns: config.effective_onramp_max_hold_ns(),
            window_ns: config.onramp_owd_window_ns,
            open_permille: config.effective_onramp_open_permille(),
            fresh_reports: config.onramp_fresh_reports,
            hold_unscheduled: config.priority_levels <= 1,
            // Only SRPT grants on one level: see `hold_grants`.
            hold_grants: config.onramp_grant_holds_apply(),
        })
    }
}

/// A windowed minimum of one-way delays, and so the queueing delay of the
/// latest: `owd − min`.
///
/// `owd` values are an arrival time on one host's clock minus a send time
/// on another's: the true delay plus an unknown, nearly constant clock
/// offset, so only their differences mean anything. The minimum is kept
/// over two consecutive buckets of `window_ns` (so over the last one to two
/// windows): O(1), and a drifting offset is forgotten within two windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwdWindow {
    /// Smallest `owd` of the current bucket (`i64::MAX`: none).
    cur_min: i64,
    /// Smallest `owd` of the bucket before (`i64::MAX`: none).
    prev_min: i64,
    /// When the current bucket started.
    bucket_start: Time,
}

impl Default for OwdWindow {
    fn default() -> OwdWindow {
        OwdWindow {
            cur_min: i64::MAX,
            prev_min: i64::MAX,
            bucket_start: 0,
        }
    }
}

impl OwdWindow {
    /// The windowed minimum `owd`, if any sample was taken.
    #[cfg(test)]
    pub fn min(&self) -> Option<i64> {
        let m = self.cur_min.min(self.prev_min);
        (m != i64::MAX).then_some(m)
    }

    /// Takes the one-way delay `owd` observed at `now` and returns its
    /// queueing delay: `owd` minus the minimum of the last one to two
    /// windows of `window_ns` (this sample included), in ns.
    pub fn observe(&mut self, now: Time, owd: i64, window_ns: u64) -> u64 {
        if self.cur_min == i64::MAX && self.prev_min == i64::MAX {
            // The first sample (or the first after two empty windows)
            // starts the first bucket: bucket edges are relative to the
            // samples, never to the clock's reading, so that hosts whose
            // clocks read differently decide alike.
            self.bucket_start = now;
        } else if now.saturating_sub(self.bucket_start) >= window_ns {
            // Two windows without a sample forget everything.
            self.prev_min = if now.saturating_sub(self.bucket_start) >= 2 * window_ns {
                i64::MAX
            } else {
                self.cur_min
            };
            self.cur_min = i64::MAX;
            self.bucket_start = now;
        }
        self.cur_min = self.cur_min.min(owd);
        let min = self.cur_min.min(self.prev_min);
        owd.saturating_sub(min).max(0) as u64
    }
}

/// The hold rule's state for one thing that can be held: a destination's
/// DATA at a sender, or a receiver's grants.
// `repr(C)`: `held_until` and `held`, read by every grant pass, first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Hold {
    /// Held until this time (meaningful while `held`).
    pub held_until: Time,
    /// Whether it is held now.
    pub held: bool,
    /// When the latest hold ended, and how long it was: a new hold may not
    /// start before `released_at + last_hold × open_permille / 1000` (see
    /// [`Self::start`]).
    pub released_at: Time,
    pub last_hold: u64,
}

impl Hold {
    /// Given the queueing delay `queueing_ns` seen at `now`, returns the
    /// hold to start (ns), if one should: when it exceeds T, for
    /// `queueing − T` (the natural reading of the paper's rule: hold until
    /// the excess queue has drained at line rate; see `docs/onramp.md`), at
    /// most `max_hold_ns`. A hold is not extended while it runs, and after
    /// one ends a new one may start only when it has been open
    /// `open_permille` of the hold's length (by default as long as it was
    /// held), so that samples — stale ones, or forged ones — hold it at most
    /// 1000 / (1000 + `open_permille`) of the time (half by default) and
    /// never more than `max_hold_ns` at once.
    pub fn start(&mut self, now: Time, queueing_ns: u64, p: &OnRampParams) -> Option<u64> {
        let open_for = self.last_hold.saturating_mul(p.open_permille as u64) / 1000;
        if queueing_ns <= p.threshold_ns
            || self.held
            || now < self.released_at.saturating_add(open_for)
        {
            return None;
        }
        let hold = (queueing_ns - p.threshold_ns).min(p.max_hold_ns);
        self.held = true;
        self.held_until = now.saturating_add(hold);
        self.last_hold = hold;
        Some(hold)
    }

    /// Ends the hold at `now`.
    pub fn release(&mut self, now: Time) {
        self.held = false;
        self.released_at = now;
    }
}

/// What a sender knows of the path to one destination: the one-way delays
/// its packets met (as the destination reports them) and the hold of its
/// DATA to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OnRampPath {
    /// `owd` = arrival on the peer's clock − send time on ours.
    pub owd: OwdWindow,
    /// The latest queueing delay: `owd − min` (ns).
    pub queueing_ns: u64,
    pub hold: Hold,
}

/// The one-way delay a packet from a peer reports, as its clock minus ours:
/// the peer's `send_time` minus its `echo_time`. The peer built the echo as
/// the latest `send_time` we sent it plus the time it held it (from its
/// arrival to this packet's `send_time`, `docs/wire-format.md`), so the
/// difference is that packet's arrival time on the peer's clock minus its
/// send time on ours: the one-way delay the receiver measured, carried by
/// two fields every packet has anyway. `None` if there is no echo.
#[inline]
pub(crate) fn reported_owd(send_time: u64, echo_time: u64) -> Option<i64> {
    (echo_time != 0 && send_time != 0).then(|| send_time.wrapping_sub(echo_time) as i64)
}

impl OnRampPath {
    /// Takes a one-way delay report `owd` at `now` and returns the hold to
    /// start (ns), if one should ([`Hold::start`]).
    ///
    /// `echo_time` is the report's echo of our own send time (our clock,
    /// plus the peer's holding time, which is short for the GRANTs and
    /// DATA that carry most reports): with `fresh_reports` a report whose
    /// echo is older than the end of the previous hold is about a packet
    /// sent before it, and starts nothing.
    pub fn sample(&mut self, now: Time, owd: i64, echo_time: u64, p: &OnRampParams) -> Option<u64> {
        self.queueing_ns = self.owd.observe(now, owd, p.window_ns);
        if p.fresh_reports && echo_time < self.hold.released_at {
            return None;
        }
        self.hold.start(now, self.queueing_ns, p)
    }
}

/// The endpoint's held destinations and the messages parked for them.
/// Parked messages are out of the send queue (so the transmit path pays
/// nothing for them) and go back into it, in SRPT order, when their
/// destination is released.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct OnRamp {
    /// The earliest release (`Time::MAX`: nothing held). First: every
    /// `poll_transmit` and `poll_timeout` reads it, and nothing else here
    /// while On-Ramp is off.
    pub next_release: Time,
    /// This endpoint's grants as a receiver, held while its own downlink
    /// shows a queue (`OnRampParams::hold_grants`). Second: every grant
    /// pass reads `grants.held`, on the line `next_release` is on.
    grants: Hold,
    /// Held peers and when each is released.
    held: Vec<(Time, PeerKey)>,
    /// Messages of held peers with bytes to send (no duplicates).
    parked: Vec<RpcKey>,
}

impl OnRamp {
    /// The leading bytes that the per-poll and per-grant-pass reads touch
    /// (`next_release`, and the grant hold's `held_until` and `held`).
    pub(crate) const HOT_BYTES: usize =
        std::mem::offset_of!(OnRamp, grants) + std::mem::offset_of!(Hold, held) + 1;
}

impl Default for OnRamp {
    fn default() -> OnRamp {
        OnRamp {
            held: Vec::new(),
            parked: Vec::new(),
            next_release: Time::MAX,
            grants: Hold::default(),
        }
    }
}

impl OnRamp {
    /// Peer `pk` is held until `until`.
    pub fn hold(&mut self, pk: PeerKey, until: Time) {
        self.held.push((until, pk));
        self.next_release = self.next_release.min(until);
    }

    /// Parks message `key` (its destination is held); false if it was
    /// parked already.
    pub fn park(&mut self, key: RpcKey) -> bool {
        let new = !self.parked.contains(&key);
        if new {
            self.parked.push(key);
        }
        new
    }

    /// Starts a hold of this receiver's grants if the queueing delay
    /// `queueing_ns` its downlink shows at `now` calls for one
    /// ([`Hold::start`]); returns its length.
    pub fn hold_grants(&mut self, now: Time, queueing_ns: u64, p: &OnRampParams) -> Option<u64> {
        let hold = self.grants.start(now, queueing_ns, p)?;
        self.next_release = self.next_release.min(self.grants.held_until);
        Some(hold)
    }

    /// Until when this receiver's grants are held (`None`: not held).
    #[inline]
    pub fn grants_held_until(&self) -> Option<Time> {
        self.grants.held.then_some(self.grants.held_until)
    }

    /// Whether this receiver's grants are held now.
    #[inline(always)]
    pub fn grants_held(&self) -> bool {
        self.grants.held
    }

    /// The peers whose hold ends by `now` (removed from the held list), the
    /// messages parked so far (to requeue; those of peers still held park
    /// again), and whether the hold of this receiver's grants ended (its
    /// grant pass is owed).
    pub fn due(&mut self, now: Time) -> (Vec<PeerKey>, Vec<RpcKey>, bool) {
        let grants_released = self.grants.held && now >= self.grants.held_until;
        if grants_released {
            self.grants.release(now);
        }
        let mut released = Vec::new();
        self.held.retain(|&(until, pk)| {
            let keep = until > now;
            if !keep {
                released.push(pk);
            }
            keep
        });
        self.next_release = self.held.iter().map(|h| h.0).min().unwrap_or(Time::MAX);
        if self.grants.held {
            self.next_release = self.next_release.min(self.grants.held_until);
        }
        (released, std::mem::take(&mut self.parked), grants_released)
    }
}

/// The mean length in µs of `holds` holds that lasted `held_ns` in all (0
/// if there were none): what reports make of the `onramp_held_ns` and
/// `onramp_grants_held_ns` counters.
pub fn mean_hold_us(held_ns: u64, holds: u64) -> f64 {
    if holds > 0 {
        held_ns as f64 / holds as f64 / 1e3
    } else {
        0.0
    }
}

/// What an endpoint's On-Ramp knows of one peer
/// ([`crate::Endpoint::peer_onramp`]), for tests and reports. Times in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerOnRamp {
    /// The latest queueing delay the peer reported: its one-way delay minus
    /// the windowed minimum.
    pub queueing_ns: u64,
    /// Whether the peer's DATA is held now.
    pub held: bool,
    /// Until when it is held (meaningful while `held`).
    pub held_until: Time,
    /// The latest hold's length.
    pub last_hold_ns: u64,
}

impl crate::endpoint::Endpoint {
    /// What On-Ramp knows of `peer` (`None`: unknown peer).
    pub fn peer_onramp(&self, peer: std::net::SocketAddr) -> Option<PeerOnRamp> {
        let key = self.peers.find(peer)?;
        let o = &self.peers.path(key).onramp;
        Some(PeerOnRamp {
            queueing_ns: o.queueing_ns,
            held: o.hold.held,
            held_until: o.hold.held_until,
            last_hold_ns: o.hold.last_hold,
        })
    }

    /// Until when On-Ramp holds this receiver's grants (`None`: not held;
    /// `Config::onramp_hold_grants`). Our clock.
    pub fn onramp_grants_held_until(&self) -> Option<Time> {
        self.onramp.grants_held_until()
    }

    /// A packet from peer `pk` carried `send_time` and `echo_time`: with
    /// On-Ramp on, the one-way delay they report may start a hold, which
    /// parks every message to `pk` with bytes to send (a scan of the RPC
    /// table, once per hold, not per packet).
    #[inline]
    pub(crate) fn onramp_report(&mut self, now: Time, pk: PeerKey, send_time: u64, echo_time: u64) {
        let Some(&p) = self.derived.onramp() else {
            return;
        };
        let Some(owd) = reported_owd(send_time, echo_time) else {
            return;
        };
        let path = &mut self.peers.path_mut(pk).onramp;
        if path.sample(now, owd, echo_time, &p).is_none() {
            return;
        }
        let until = path.hold.held_until;
        self.metrics.onramp_holds += 1;
        self.metrics.onramp_held_ns += path.hold.last_hold;
        self.onramp.hold(pk, until);
        for key in 0..self.rpcs.key_end() {
            if !self.rpcs.is_live(key) || self.rpcs[key].peer_key != pk {
                continue;
            }
            if self.rpcs[key]
                .out
                .as_ref()
                .is_some_and(|o| o.queued.is_some() && (p.hold_unscheduled || o.scheduled_part()))
            {
                self.unqueue_out(key);
                if self.onramp.park(key) {
                    self.metrics.onramp_parked += 1;
                }
            }
        }
    }

    /// Ends the holds due by `now` and puts their parked messages back in
    /// the send queue (SRPT order; each message's packets go in offset
    /// order as always). One compare when nothing is due: it runs on every
    /// `poll_transmit`, so the work is out of line (inlined whole, the call
    /// cost ~6 instructions per poll with On-Ramp off, cachegrind on W2).
    #[inline(always)]
    pub(crate) fn onramp_release(&mut self, now: Time) {
        if now >= self.onramp.next_release {
            self.onramp_release_due(now);
        }
    }

    /// A DATA packet from peer `pk` arrived at `now`, sent at `send_time`
    /// (its clock): with On-Ramp holding grants, its one-way delay shows
    /// the queue at our own downlink (minus the windowed minimum for that
    /// sender, so that each sender's clock offset cancels), and a queue
    /// above T holds this receiver's grants by the same rule as a
    /// destination's DATA: new grants wait, the bytes already granted
    /// drain the queue. Every sender's packets show the one queue at once,
    /// where a sender learns of it only from packets sent back to it.
    #[inline]
    pub(crate) fn onramp_inbound(&mut self, now: Time, pk: PeerKey, send_time: u64) {
        let Some(&p) = self.derived.onramp() else {
            return;
        };
        if !p.hold_grants || send_time == 0 {
            return;
        }
        let owd = now.wrapping_sub(send_time) as i64;
        let q = self
            .peers
            .path_mut(pk)
            .onramp_in
            .observe(now, owd, p.window_ns);
        if let Some(hold) = self.onramp.hold_grants(now, q, &p) {
            self.metrics.onramp_grant_holds += 1;
            self.metrics.onramp_grants_held_ns += hold;
        }
    }

    #[cold]
    #[inline(never)]
    fn onramp_release_due(&mut self, now: Time) {
        let (released, parked, grants_due) = self.onramp.due(now);
        for pk in released {
            if self.peers.is_live(pk) {
                self.peers.path_mut(pk).onramp.hold.release(now);
            }
        }
        for key in parked {
            if self.rpcs.is_live(key) {
                self.requeue_out(key);
            }
        }
        if grants_due {
            // The grant pass withheld meanwhile, now.
            self.grants.unsettle();
            self.update_grants(now);
        }
    }

    /// Whether message `key`, with bytes to send, waits outside the send
    /// queue now: its destination is held, and the hold keeps its next
    /// bytes (all of them on a one-level network; only the scheduled part
    /// on a network with priorities, see `OnRampParams::hold_unscheduled`).
    #[inline]
    pub(crate) fn onramp_parks(&self, key: RpcKey) -> bool {
        let Some(p) = self.derived.onramp() else {
            return false;
        };
        let rpc = &self.rpcs[key];
        self.peers.path(rpc.peer_key).onramp.hold.held
            && (p.hold_unscheduled || rpc.out.as_ref().is_some_and(|o| o.scheduled_part()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: OnRampParams = OnRampParams {
        threshold_ns: 10_000,
        max_hold_ns: 100_000,
        window_ns: 10_000_000,
        open_permille: 1000,
        fresh_reports: false,
        hold_unscheduled: true,
        hold_grants: false,
    };

    #[test]
    fn the_reported_owd_is_the_peers_arrival_minus_our_send_time() {
        // We sent at 1000 (our clock); it arrived at 5_001_500 on the
        // peer's clock (offset 5 ms, delay 500 ns); the peer held it 300 ns.
        let echo = 1000 + 300;
        let send = 5_001_500 + 300;
        assert_eq!(reported_owd(send, echo), Some(5_000_500));
        // A peer clock behind ours gives a negative value.
        assert_eq!(reported_owd(100, 400), Some(-300));
        assert_eq!(reported_owd(100, 0), None);
    }

    #[test]
    fn a_queueing_delay_above_t_holds_for_the_excess_once() {
        let mut p = OnRampPath::default();
        assert_eq!(p.sample(0, -7_000, 0, &P), None);
        assert_eq!(p.sample(10, -7_000 + 10_000, 0, &P), None); // exactly T
        assert_eq!(p.sample(20, -7_000 + 35_000, 0, &P), Some(25_000));
        assert!(p.hold.held && p.hold.held_until == 25_020);
        // Not extended while held.
        assert_eq!(p.sample(30, 1_000_000, 0, &P), None);
        p.hold.release(25_020);
        // Not again before as long as the hold has passed.
        assert_eq!(p.sample(40_000, 1_000_000, 0, &P), None);
        assert_eq!(p.sample(50_040, 1_000_000, 0, &P), Some(P.max_hold_ns));
    }

    /// `open_permille` sets how long a destination stays open after a
    /// hold; `fresh_reports` ignores reports about packets sent before the
    /// hold ended (their echo is older).
    #[test]
    fn open_time_and_fresh_reports_gate_the_next_hold() {
        let quarter = OnRampParams {
            open_permille: 250,
            ..P
        };
        let mut p = OnRampPath::default();
        p.sample(0, 0, 0, &quarter);
        assert_eq!(p.sample(10, 50_000, 0, &quarter), Some(40_000));
        p.hold.release(40_010);
        // Open a quarter of the 40 µs hold: 10 µs.
        assert_eq!(p.sample(50_000, 50_000, 0, &quarter), None);
        assert_eq!(p.sample(50_010, 50_000, 0, &quarter), Some(40_000));
        let fresh = OnRampParams {
            fresh_reports: true,
            ..quarter
        };
        let mut p = OnRampPath::default();
        p.sample(0, 0, 0, &fresh);
        assert_eq!(p.sample(10, 50_000, 5, &fresh), Some(40_000));
        p.hold.release(40_010);
        // Open long enough, but the report is about a packet sent at
        // 30_000, during the hold.
        assert_eq!(p.sample(60_000, 50_000, 30_000, &fresh), None);
        assert_eq!(p.sample(60_001, 50_000, 40_010, &fresh), Some(40_000));
    }

    /// The windows start at the first sample, whatever the clock reads: a
    /// clock 1 s ahead keeps the same minimum at the same moments (with
    /// buckets aligned to the clock's zero it would forget it at other
    /// moments).
    #[test]
    fn the_windows_start_at_the_first_sample() {
        let run = |start: Time| {
            let mut p = OnRampPath::default();
            let mut mins = Vec::new();
            for i in 0..40u64 {
                let now = start + 1_000_000 + i * 1_000_000;
                // A minimum early on, higher delays later.
                let owd = if i == 3 { 100 } else { 5_000 + (i % 4) as i64 };
                p.sample(now, owd, 0, &P);
                mins.push(p.owd.min());
            }
            mins
        };
        assert_eq!(run(1_000_000_000), run(0));
        assert_eq!(run(7_777_777), run(0));
    }

    #[test]
    fn the_minimum_is_forgotten_after_two_windows() {
        let mut p = OnRampPath::default();
        p.sample(0, 100, 0, &P);
        p.sample(P.window_ns, 500, 0, &P);
        assert_eq!(p.owd.min(), Some(100));
        p.sample(2 * P.window_ns, 500, 0, &P);
        assert_eq!(p.owd.min(), Some(500));
    }

    /// A constant offset between the two clocks (1 s either way, or one
    /// that makes the timestamps wrap) gives the same holds: it is in every
    /// report and in the minimum alike.
    #[test]
    fn a_clock_offset_gives_the_same_decisions() {
        // Our send times and the true one-way delays: quiet, an incast,
        // quiet again, another.
        let delays: Vec<(Time, u64)> = (0..400u64)
            .map(|i| {
                let q = match i {
                    100..=120 => 30_000 + 1_000 * (i - 100),
                    300..=305 => 80_000,
                    _ => (i * 37) % 900,
                };
                (1_000 + i * 5_000, 2_000 + q)
            })
            .collect();
        let decisions = |offset: u64| {
            let mut p = OnRampPath::default();
            let mut out = Vec::new();
            for &(sent, owd) in &delays {
                let arrival_peer = sent.wrapping_add(owd).wrapping_add(offset);
                let hold_at_peer = 700;
                let send = arrival_peer.wrapping_add(hold_at_peer);
                let echo = sent.wrapping_add(hold_at_peer);
                let now = sent + 2 * owd + hold_at_peer;
                let r = reported_owd(send, echo).unwrap();
                out.push((p.sample(now, r, echo, &P), p.queueing_ns));
                if p.hold.held && now >= p.hold.held_until {
                    p.hold.release(now);
                }
            }
            out
        };
        let base = decisions(0);
        assert!(base.iter().filter(|d| d.0.is_some()).count() >= 2);
        for offset in [
            1_000_000_000,
            1_000_000_000u64.wrapping_neg(),
            u64::MAX - 5_000,
        ] {
            assert_eq!(decisions(offset), base, "offset {offset}");
        }
    }
}
