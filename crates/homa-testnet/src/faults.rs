//! Fault injection: seeded loss, duplication, reordering, corruption,
//! partitions and (in the driver) endpoint crashes.
//!
//! Link faults are decided when a packet leaves a link's serializer, with the
//! network's fault RNG (ChaCha, derived from the network seed), so a run with
//! faults is exactly as reproducible as one without. Every fault is counted in
//! [`FaultStats`].

use crate::sched::Time;
use crate::HostId;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Per-link fault probabilities (each in `0.0..=1.0`, applied per packet).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// The packet vanishes.
    pub loss: f64,
    /// A second copy of the packet is delivered right after the first.
    pub duplicate: f64,
    /// The packet is held back by an extra uniform delay in `1..=reorder_max_ns`,
    /// so packets sent after it may overtake it.
    pub reorder: f64,
    /// Bound of the reordering delay (ns).
    pub reorder_max_ns: u64,
    /// One to three random bytes anywhere in the datagram (headers included)
    /// are XORed with a random non-zero value.
    pub corrupt: f64,
}

impl FaultConfig {
    /// No faults.
    pub const NONE: FaultConfig = FaultConfig {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_max_ns: 0,
        corrupt: 0.0,
    };

    /// Only packet loss.
    pub fn loss(p: f64) -> FaultConfig {
        FaultConfig {
            loss: p,
            ..FaultConfig::NONE
        }
    }

    /// True if any fault can happen (lets the hot path skip the RNG).
    pub fn is_active(&self) -> bool {
        self.loss > 0.0
            || self.duplicate > 0.0
            || (self.reorder > 0.0 && self.reorder_max_ns > 0)
            || self.corrupt > 0.0
    }
}

/// Counters of every fault injected and every packet lost to one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultStats {
    /// Packets dropped by the `loss` probability.
    pub lost: u64,
    /// Extra copies created by `duplicate`.
    pub duplicated: u64,
    /// Packets given an extra reordering delay.
    pub reordered: u64,
    /// Packets whose bytes were corrupted.
    pub corrupted: u64,
    /// Packets dropped because source and destination were partitioned.
    pub partitioned: u64,
    /// Endpoint crashes.
    pub crashes: u64,
    /// Endpoint restarts (a fresh endpoint replaced a crashed one).
    pub restarts: u64,
    /// Packets waiting in a crashed host's NIC queue, discarded at the crash.
    pub crash_purged: u64,
    /// Packets that arrived at, or were sent by, a host while it was down.
    pub host_down_drops: u64,
}

/// What the fault model decided for one packet leaving a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fate {
    pub drop: bool,
    pub duplicate: bool,
    pub extra_delay: Time,
}

/// Decides a packet's fate on a link with faults `cfg`, corrupting `data` in
/// place if so decided, and counts what happened.
pub(crate) fn decide(
    cfg: &FaultConfig,
    rng: &mut ChaCha8Rng,
    data: &mut [u8],
    stats: &mut FaultStats,
) -> Fate {
    let mut fate = Fate {
        drop: false,
        duplicate: false,
        extra_delay: 0,
    };
    if cfg.loss > 0.0 && rng.gen::<f64>() < cfg.loss {
        stats.lost += 1;
        fate.drop = true;
        return fate;
    }
    if cfg.corrupt > 0.0 && !data.is_empty() && rng.gen::<f64>() < cfg.corrupt {
        stats.corrupted += 1;
        let flips = rng.gen_range(1..=3);
        for _ in 0..flips {
            let at = rng.gen_range(0..data.len());
            data[at] ^= rng.gen_range(1..=255u8);
        }
    }
    if cfg.reorder > 0.0 && cfg.reorder_max_ns > 0 && rng.gen::<f64>() < cfg.reorder {
        stats.reordered += 1;
        fate.extra_delay = rng.gen_range(1..=cfg.reorder_max_ns);
    }
    if cfg.duplicate > 0.0 && rng.gen::<f64>() < cfg.duplicate {
        stats.duplicated += 1;
        fate.duplicate = true;
    }
    fate
}

/// Which hosts a partition separates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// These pairs cannot exchange packets (in either direction).
    Pairs(Vec<(HostId, HostId)>),
    /// This host can neither send nor receive.
    Isolate(HostId),
    /// Hosts in the group cannot talk to hosts outside it (both directions);
    /// traffic within each side flows.
    Split(Vec<HostId>),
}

/// A partition active during `[from, until)`: packets that would be delivered
/// in that window between separated hosts are dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub cut: Cut,
    pub from: Time,
    pub until: Time,
}

impl Partition {
    /// True if a packet from `a` to `b` delivered at `now` is blocked.
    pub fn blocks(&self, a: HostId, b: HostId, now: Time) -> bool {
        if now < self.from || now >= self.until {
            return false;
        }
        match &self.cut {
            Cut::Pairs(pairs) => pairs
                .iter()
                .any(|&(x, y)| (x == a && y == b) || (x == b && y == a)),
            Cut::Isolate(h) => *h == a || *h == b,
            Cut::Split(group) => group.contains(&a) != group.contains(&b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn inactive_config_is_detected() {
        assert!(!FaultConfig::NONE.is_active());
        assert!(!FaultConfig {
            reorder: 0.5,
            reorder_max_ns: 0,
            ..FaultConfig::NONE
        }
        .is_active());
        assert!(FaultConfig::loss(0.1).is_active());
    }

    #[test]
    fn corruption_changes_one_to_three_bytes() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let cfg = FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::NONE
        };
        let mut stats = FaultStats::default();
        for _ in 0..200 {
            let orig = vec![0u8; 100];
            let mut data = orig.clone();
            let f = decide(&cfg, &mut rng, &mut data, &mut stats);
            assert!(!f.drop);
            let changed = orig.iter().zip(&data).filter(|(a, b)| a != b).count();
            assert!((1..=3).contains(&changed), "{changed} bytes changed");
        }
        assert_eq!(stats.corrupted, 200);
    }

    #[test]
    fn partitions_respect_window_and_shape() {
        let p = Partition {
            cut: Cut::Pairs(vec![(1, 2)]),
            from: 10,
            until: 20,
        };
        assert!(!p.blocks(1, 2, 9));
        assert!(p.blocks(1, 2, 10));
        assert!(p.blocks(2, 1, 19));
        assert!(!p.blocks(1, 2, 20));
        assert!(!p.blocks(1, 3, 15));
        let iso = Partition {
            cut: Cut::Isolate(4),
            from: 0,
            until: Time::MAX,
        };
        assert!(iso.blocks(4, 0, 5) && iso.blocks(0, 4, 5) && !iso.blocks(0, 1, 5));
        let split = Partition {
            cut: Cut::Split(vec![0, 1]),
            from: 0,
            until: 100,
        };
        assert!(split.blocks(0, 2, 1) && split.blocks(3, 1, 1));
        assert!(!split.blocks(0, 1, 1) && !split.blocks(2, 3, 1));
    }
}
