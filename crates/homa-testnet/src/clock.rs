//! A host's clock as its endpoint reads it: an offset from the network's
//! time and a rate error (drift). Real hosts' clocks are neither
//! synchronised nor running at the same rate; this lets tests and the
//! simulator give each engine its own reading of time, as a deployment does.

use crate::sched::Time;

/// Host clock = `offset` + network time × (1 + `drift_ppb` / 10⁹), rounded
/// down: monotonic (a rate error above −100% never makes it go back), and
/// the network's own clock when both are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostClock {
    /// What the host's clock reads at network time 0 (ns).
    pub offset: Time,
    /// Rate error in parts per billion (50 ppm = 50,000): per network
    /// second the host's clock advances 1 s + `drift_ppb` ns.
    pub drift_ppb: i64,
}

const BILLION: i128 = 1_000_000_000;

impl HostClock {
    /// A clock `offset` ns ahead of the network's, at its rate.
    pub fn offset(offset: Time) -> HostClock {
        HostClock {
            offset,
            drift_ppb: 0,
        }
    }

    /// The host's reading at network time `t`.
    #[inline]
    pub fn host_time(&self, t: Time) -> Time {
        if self.drift_ppb == 0 {
            return self.offset + t;
        }
        let drift = (t as i128 * self.drift_ppb as i128).div_euclid(BILLION);
        (self.offset as i128 + t as i128 + drift).max(0) as Time
    }

    /// The earliest network time at which the host's clock reads at least
    /// `host` (0 if it already did at time 0): where an engine's deadline
    /// falls on the network's clock.
    #[inline]
    pub fn net_time(&self, host: Time) -> Time {
        if self.drift_ppb == 0 {
            return host.saturating_sub(self.offset);
        }
        if host <= self.host_time(0) {
            return 0;
        }
        let rate = BILLION + self.drift_ppb as i128;
        let since = host as i128 - self.offset as i128;
        let mut t = (since * BILLION / rate).clamp(0, Time::MAX as i128) as Time;
        // The estimate is within a few ns; settle on the earliest time.
        while self.host_time(t) < host {
            t += 1;
        }
        while t > 0 && self.host_time(t - 1) >= host {
            t -= 1;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_network_time_convert_both_ways() {
        for c in [
            HostClock::default(),
            HostClock::offset(1_000_000_000),
            HostClock {
                offset: 2_000_000_000,
                drift_ppb: 50_000,
            },
            HostClock {
                offset: 7,
                drift_ppb: -50_000,
            },
        ] {
            let mut last = 0;
            for t in (0..3_000_000_000u64).step_by(99_999_937).chain([1, 2, 3]) {
                let h = c.host_time(t);
                // Monotonic; the earliest network time reading h is ≤ t.
                assert!(t < 3 || h >= last, "{c:?} {t}");
                last = h;
                let back = c.net_time(h);
                assert!(back <= t && c.host_time(back) >= h, "{c:?} {t}");
                assert!(back == 0 || c.host_time(back - 1) < h, "{c:?} {t}");
            }
        }
        // 50 ppm fast: one network second reads 1 s + 50 µs more.
        let c = HostClock {
            offset: 0,
            drift_ppb: 50_000,
        };
        assert_eq!(c.host_time(1_000_000_000), 1_000_050_000);
        let c = HostClock {
            offset: 100,
            drift_ppb: -50_000,
        };
        assert_eq!(c.host_time(1_000_000_000), 100 + 999_950_000);
    }
}
