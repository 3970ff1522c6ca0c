//! A peer's round-trip time as the network shows it: the windowed minimum,
//! the latest sample, an RFC 6298 smoothed mean and deviation, and whether
//! the latest sample says the path is congested (`docs/congestion.md`).
//!
//! Samples come from echoed timestamps with the peer's hold time already
//! taken out (the peer advances the echo by it, `docs/wire-format.md`), so
//! they measure the network and both stacks, not the peer's service time.

use crate::config::{Config, CongestionSignal};
use crate::time::Time;

/// One entry of the windowed-minimum filter: a sample and when it was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Timed {
    at: Time,
    rtt: u32,
}

/// The smallest sample of the last `window` ns, kept with Kathleen
/// Nichols' three-entry windowed filter (as Linux's `lib/win_minmax.c` and
/// BBR): the best sample, and the best ones of later parts of the window,
/// so that when the best one ages out the next is already known. O(1) time
/// and 48 bytes, where an exact sliding minimum would keep every sample of
/// the window. Its answer is always a sample of the last window, at most
/// the latest one; it may miss a window's true minimum (a sample that was
/// neither a new best nor kept for a later part of the window), which
/// errs towards a higher `rtt_min`, i.e. detecting less congestion. It
/// follows a route change to a longer path within one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct WindowedMin {
    s: [Timed; 3],
}

impl WindowedMin {
    fn get(&self) -> u32 {
        self.s[0].rtt
    }

    fn reset(&mut self, v: Timed) {
        self.s = [v; 3];
    }

    /// Adds sample `v`; `window` ns is the filter's length.
    fn update(&mut self, window: u64, v: Timed) {
        if v.rtt <= self.s[0].rtt || v.at.saturating_sub(self.s[2].at) > window {
            // A new minimum, or nothing in the window any more.
            self.reset(v);
            return;
        }
        if v.rtt <= self.s[1].rtt {
            self.s[1] = v;
            self.s[2] = v;
        } else if v.rtt <= self.s[2].rtt {
            self.s[2] = v;
        }
        // Age the entries: the best one expires after a window, and the
        // second and third are refreshed after a quarter and a half of it
        // so that they cover different parts of the window.
        let dt = v.at.saturating_sub(self.s[0].at);
        if dt > window {
            self.s[0] = self.s[1];
            self.s[1] = self.s[2];
            self.s[2] = v;
            if v.at.saturating_sub(self.s[0].at) > window {
                self.s[0] = self.s[1];
                self.s[1] = self.s[2];
                self.s[2] = v;
            }
        } else if self.s[1].at == self.s[0].at && dt > window / 4 {
            self.s[1] = v;
            self.s[2] = v;
        } else if self.s[2].at == self.s[1].at && dt > window / 2 {
            self.s[2] = v;
        }
    }
}

/// What an endpoint knows of the path to one peer
/// ([`crate::Endpoint::peer_rtt`]), for tests, metrics and reports. Times in
/// ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerRtt {
    /// Samples taken (0 unless the endpoint measures RTT,
    /// `Config::measure_rtt` or adaptive windows).
    pub samples: u32,
    /// Smallest sample of the last `Config::rtt_min_window_ns` (`None`:
    /// no sample).
    pub rtt_min: Option<u32>,
    /// The latest sample.
    pub rtt_recent: u32,
    /// RFC 6298's smoothed RTT.
    pub srtt: u32,
    /// RFC 6298's RTT variation.
    pub rttvar: u32,
    /// Whether the peer is congested: the latest sample (or, with
    /// `CongestionSignal::Smoothed`, `srtt`) exceeds the factor × `rtt_min`.
    pub congested: bool,
    /// The grant window this endpoint gives the peer's messages.
    pub grant_window: u32,
    /// The unscheduled bytes of this endpoint's next message to the peer.
    pub unsched_window: u32,
}

/// When a peer is congested: while the latest sample
/// ([`CongestionSignal::Latest`]) or the smoothed RTT
/// ([`CongestionSignal::Smoothed`]) exceeds `factor` × `rtt_min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Threshold {
    pub factor: u32,
    pub smoothed: bool,
}

impl Threshold {
    pub fn new(config: &Config) -> Threshold {
        match config.congestion_signal {
            CongestionSignal::Latest => Threshold {
                factor: config.rtt_high_factor,
                smoothed: false,
            },
            CongestionSignal::Smoothed { factor } => Threshold {
                factor,
                smoothed: true,
            },
        }
    }
}

/// What [`RttEstimator::sample`] changed, for the caller's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SampleOutcome {
    /// The peer just became congested (it was not after the sample before).
    pub onset: bool,
    /// The windowed minimum changed (windows derived from it are stale).
    pub min_changed: bool,
}

/// A peer's RTT, from echoed timestamps (all values in ns, saturating at
/// `u32::MAX - 1`, about 4.3 s). Lives in the peer's [`crate::peer::PeerPath`],
/// outside the peer's hot cache line: it is updated only when the endpoint
/// measures RTT (`Config::measure_rtt`, or adaptive windows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RttEstimator {
    min: WindowedMin,
    /// Samples taken (0: the other fields mean nothing yet).
    samples: u32,
    /// The latest sample (`rtt_recent` in seed 003).
    recent: u32,
    /// RFC 6298's SRTT: 7/8 of the previous value plus 1/8 of the sample.
    srtt: u32,
    /// RFC 6298's RTTVAR: 3/4 of the previous value plus 1/4 of the
    /// sample's distance from SRTT.
    rttvar: u32,
    /// After the latest sample, `recent` (or `srtt`) > the threshold's
    /// factor × min.
    congested: bool,
}

impl RttEstimator {
    /// Takes sample `rtt` (ns) at `now`: the minimum over the last `window`
    /// ns, the smoothed values, and congestion, which holds while the latest
    /// sample (or the smoothed RTT) exceeds `threshold.factor` × the minimum
    /// (seed 003's `rtt_high = 8 × rtt_min`).
    pub fn sample(
        &mut self,
        now: Time,
        rtt: u32,
        window: u64,
        threshold: Threshold,
    ) -> SampleOutcome {
        let before = (self.samples > 0).then(|| self.min.get());
        let v = Timed { at: now, rtt };
        if self.samples == 0 {
            self.min.reset(v);
            self.srtt = rtt;
            self.rttvar = rtt / 2;
        } else {
            self.min.update(window, v);
            let (srtt, r) = (self.srtt as u64, rtt as u64);
            self.rttvar = ((3 * self.rttvar as u64 + srtt.abs_diff(r)) / 4) as u32;
            self.srtt = ((7 * srtt + r) / 8) as u32;
        }
        self.samples = self.samples.saturating_add(1);
        self.recent = rtt;
        let high = self.min.get() as u64 * threshold.factor as u64;
        let signal = if threshold.smoothed { self.srtt } else { rtt };
        let was = self.congested;
        self.congested = signal as u64 > high;
        SampleOutcome {
            onset: self.congested && !was,
            min_changed: before != Some(self.min.get()),
        }
    }

    /// Whether any sample was taken.
    pub fn measured(&self) -> bool {
        self.samples > 0
    }

    /// The smallest sample of the window, if any.
    pub fn min(&self) -> Option<u32> {
        self.measured().then(|| self.min.get())
    }

    pub fn recent(&self) -> u32 {
        self.recent
    }

    pub fn srtt(&self) -> u32 {
        self.srtt
    }

    pub fn rttvar(&self) -> u32 {
        self.rttvar
    }

    pub fn samples(&self) -> u32 {
        self.samples
    }

    pub fn congested(&self) -> bool {
        self.congested
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000_000;
    const LATEST: Threshold = Threshold {
        factor: 8,
        smoothed: false,
    };

    fn feed(e: &mut RttEstimator, samples: &[(Time, u32)]) -> Vec<SampleOutcome> {
        samples
            .iter()
            .map(|&(t, r)| e.sample(t, r, W, LATEST))
            .collect()
    }

    #[test]
    fn first_sample_sets_everything() {
        let mut e = RttEstimator::default();
        assert_eq!(e.min(), None);
        let o = e.sample(10, 1000, W, LATEST);
        assert!(o.min_changed && !o.onset);
        assert_eq!(
            (e.min(), e.recent(), e.srtt(), e.rttvar()),
            (Some(1000), 1000, 1000, 500)
        );
    }

    /// RFC 6298 §2.3 with alpha 1/8, beta 1/4, in integer ns.
    #[test]
    fn smoothing_follows_rfc_6298() {
        let mut e = RttEstimator::default();
        feed(&mut e, &[(0, 800), (1, 1600)]);
        // rttvar = (3 × 400 + |800 − 1600|) / 4 = 500; srtt = (7 × 800 + 1600) / 8 = 900.
        assert_eq!((e.srtt(), e.rttvar(), e.recent()), (900, 500, 1600));
        feed(&mut e, &[(2, 900)]);
        assert_eq!((e.srtt(), e.rttvar()), (900, 375));
    }

    #[test]
    fn congestion_is_the_latest_sample_above_the_factor_times_the_minimum() {
        let mut e = RttEstimator::default();
        let o = feed(
            &mut e,
            &[(0, 1000), (1, 8000), (2, 8001), (3, 9000), (4, 1200)],
        );
        let onsets: Vec<bool> = o.iter().map(|o| o.onset).collect();
        // 8000 is not above 8 × 1000; 8001 is (onset); 9000 still is (no
        // new onset); 1200 is not.
        assert_eq!(onsets, [false, false, true, false, false]);
        assert!(!e.congested());
        feed(&mut e, &[(5, 20_000)]);
        assert!(e.congested());
    }

    /// Seed 003's proposed alternative: the smoothed RTT against 3 ×
    /// `rtt_min`. One sample 10 × late does not trip it; a sustained rise to
    /// 5 × does, after a few samples (SRTT moves an eighth of the way each
    /// time), which the latest-sample rule at 8 × would never see.
    #[test]
    fn the_smoothed_signal_ignores_one_late_sample_and_sees_a_rise() {
        let smoothed = Threshold {
            factor: 3,
            smoothed: true,
        };
        let mut e = RttEstimator::default();
        for t in 0..10 {
            e.sample(t, 1000, W, smoothed);
        }
        // 10 × the minimum: congestion for the latest-sample rule (8 ×).
        e.sample(10, 10_000, W, smoothed);
        assert!(!e.congested(), "srtt {}", e.srtt());
        let mut n = 0;
        while !e.congested() {
            n += 1;
            e.sample(10 + n, 5_000, W, smoothed);
            assert!(n < 20, "srtt {}", e.srtt());
        }
        assert!((2..=8).contains(&n), "{n} samples");
    }

    /// The minimum of the window, not of all time: a route change to a
    /// longer path is followed within about a window (and not before the
    /// old minimum is half a window old).
    #[test]
    fn windowed_min_follows_a_longer_route() {
        let mut e = RttEstimator::default();
        for i in 0..100u64 {
            e.sample(i * W / 50, 1000 + (i % 3) as u32, W, LATEST);
        }
        assert_eq!(e.min(), Some(1000));
        // The route changes at 2 W: every sample is now about 5000.
        let start = 2 * W;
        let mut followed_at = None;
        for i in 0..200u64 {
            let t = start + i * W / 50;
            e.sample(t, 5000 + (i % 7) as u32, W, LATEST);
            if e.min().unwrap() >= 5000 && followed_at.is_none() {
                followed_at = Some(t - start);
            }
        }
        let after = followed_at.expect("the minimum follows the new route");
        assert!(after <= W + W / 50, "followed after {after} ns");
        assert!(after > W / 2, "the old minimum is kept a while: {after}");
        assert_eq!(e.min(), Some(5000));
        // A shorter path again is taken at once.
        e.sample(start + 5 * W, 900, W, LATEST);
        assert_eq!(e.min(), Some(900));
    }

    /// Against a brute-force sliding minimum: the filter's answer is always
    /// a sample of the last window (so never below that window's true
    /// minimum) and never above the latest sample.
    #[test]
    fn windowed_min_is_a_sample_of_the_window() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut e = RttEstimator::default();
        let mut all: Vec<(Time, u32)> = Vec::new();
        let mut t = 0;
        for _ in 0..5000 {
            t += rand() % (W / 20);
            let r = 1000 + (rand() % 5000) as u32;
            e.sample(t, r, W, LATEST);
            all.push((t, r));
            let got = e.min().unwrap();
            assert!(got <= r, "{got} above the latest sample {r}");
            assert!(
                all.iter().any(|s| s.1 == got && t - s.0 <= W),
                "{got} is no sample of the last window"
            );
        }
    }
}
