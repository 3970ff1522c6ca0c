//! Steady-state measurement: how long to warm up and to measure for a
//! workload, the load the host downlinks really carry over the measurement
//! window, the backlog of offered but undelivered bytes, and per-size
//! statistics that count every measured message, finished or not.
//!
//! A run at steady state is one whose measurement window starts after the
//! backlog of large messages (which SRPT defers) has built up, lasts many
//! times the transmission time of the largest message, and carries on its
//! host downlinks the load that was offered. `homa sim` without `--messages`
//! or `--duration` measures such a window ([`Stop::Steady`] with
//! [`SteadyPlan::for_spec`]'s times); every run reports the same measures
//! ([`SteadyReport`], key `steady_state` of the JSON report), so a run that
//! is not at steady state says so.

use crate::sim::{SimSpec, Stop};
use crate::stats::percentile;
use homa_proto::wire::{PacketType, DATA_PACKET_OVERHEAD};
use homa_proto::{DropReason, Metrics, Time};
use serde::Serialize;

/// Warm-up of a steady-state run, in relaxation times
/// ([`relaxation_ns`]).
pub const WARMUP_PER_RELAXATION: f64 = 1.0;
/// Measurement window of a steady-state run, in transmission times of the
/// workload's largest message on a host link.
pub const WINDOW_PER_MAX_TX: f64 = 20.0;
/// Shortest warm-up and window (workloads of small messages only, W1).
pub const MIN_WARMUP_NS: Time = 2_000_000;
pub const MIN_WINDOW_NS: Time = 5_000_000;
/// After the window, traffic goes on (unmeasured) until every measured
/// message is in, for at most this multiple of the window.
pub const DRAIN_FACTOR: f64 = 0.5;
/// Carried load within this fraction of the offered load (either way).
pub const LOAD_TOLERANCE: f64 = 0.03;
/// The window should be at least this many transmission times of the
/// largest message.
pub const MIN_WINDOW_PER_MAX_TX: f64 = 20.0;

/// Warm-up and window of a steady-state run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SteadyPlan {
    pub warmup_ns: Time,
    pub window_ns: Time,
    pub drain_factor: f64,
}

/// How long the backlog of a workload at a load takes to level off, from
/// an empty network: the relaxation time of a single queue,
/// `s / (1 - sqrt(load))^2`, where `s` is the time to send a message of
/// the size-biased mean size `E[S^2] / E[S]` (wire bytes) on a host link.
/// (The M/M/1 queue's relaxation time is `1 / (mu (1 - sqrt(rho))^2)`;
/// with heavy-tailed sizes the size-biased mean sets the time scale.)
/// Measured on the paper topology at 80% (docs/simulation.md, "Steady
/// state"): W3's backlog levels off at about 100 ms (this gives 117 ms),
/// W4's at about 280 ms (316 ms).
pub fn relaxation_ns(spec: &SimSpec) -> Time {
    let (mps, framing) = (spec.max_packet_size, spec.topology.overhead_bytes);
    let (mut m1, mut m2) = (0.0, 0.0);
    for &(len, w) in spec.workload.points() {
        let b = wire_bytes(len, mps, framing) as f64;
        m1 += w * b;
        m2 += w * b * b;
    }
    if m1 <= 0.0 {
        return 0;
    }
    let s = m2 / m1 * 8e9 / spec.topology.host_link_bps as f64;
    let rho = spec.load.min(0.99);
    (s / (1.0 - rho.sqrt()).powi(2)) as Time
}

impl SteadyPlan {
    /// The defaults for a spec's workload, load and topology: a warm-up of
    /// [`WARMUP_PER_RELAXATION`] relaxation times and a window of
    /// [`WINDOW_PER_MAX_TX`] transmission times of the largest message (at
    /// least [`MIN_WARMUP_NS`] and [`MIN_WINDOW_NS`]). Paper topology, 80%:
    /// W1 2 + 5 ms, W2 8 + 61 ms, W3 117 + 263 ms, W4 316 + 174 ms,
    /// W5 1,341 + 511 ms.
    pub fn for_spec(spec: &SimSpec) -> SteadyPlan {
        let t = max_message_tx_ns(spec) as f64;
        SteadyPlan {
            warmup_ns: ((relaxation_ns(spec) as f64 * WARMUP_PER_RELAXATION) as Time)
                .max(MIN_WARMUP_NS),
            window_ns: ((t * WINDOW_PER_MAX_TX) as Time).max(MIN_WINDOW_NS),
            drain_factor: DRAIN_FACTOR,
        }
    }

    pub fn stop(&self) -> Stop {
        Stop::Steady {
            warmup_ns: self.warmup_ns,
            window_ns: self.window_ns,
        }
    }
}

/// Wire bytes of a message's DATA packets: payload, Homa header and framing
/// of every packet (the basis of the offered load).
pub fn wire_bytes(size: u32, max_packet_size: usize, framing: u32) -> u64 {
    let per = (max_packet_size - DATA_PACKET_OVERHEAD) as u64;
    let pkts = (size as u64).div_ceil(per).max(1);
    size as u64 + pkts * (DATA_PACKET_OVERHEAD as u64 + framing as u64)
}

/// Time to send the workload's largest message on a host link (ns).
pub fn max_message_tx_ns(spec: &SimSpec) -> Time {
    let w = wire_bytes(
        spec.workload.max_len(),
        spec.max_packet_size,
        spec.topology.overhead_bytes,
    );
    (w as f64 * 8e9 / spec.topology.host_link_bps as f64).ceil() as Time
}

/// DATA wire bytes a host's engine has accepted: payload bytes accepted
/// plus header and framing of every DATA packet received but duplicates.
pub fn carried_wire_bytes(m: &Metrics, framing: u32) -> u64 {
    let pkts = m
        .received(PacketType::Data)
        .saturating_sub(m.drops(DropReason::Duplicate));
    m.data_bytes_received + pkts * (DATA_PACKET_OVERHEAD as u64 + framing as u64)
}

/// One interval of the run's time series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// End of the interval (ns).
    pub t_ns: Time,
    /// DATA wire bytes of the messages generated in the interval, and
    /// accepted by receivers in it, as fractions of the host links' capacity.
    pub offered_load: f64,
    pub carried_load: f64,
    /// Wire bytes offered but not yet accepted, all hosts, at the end.
    pub backlog_bytes: u64,
}

/// Statistics of a group of measured messages of neighbouring sizes, the
/// unfinished ones included with their age at the end of the run as
/// latency (a lower bound).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SteadyGroup {
    pub min_size: u32,
    pub max_size: u32,
    pub count: usize,
    /// Messages of the group not delivered by the end of the run.
    pub unfinished: usize,
    pub p50_slowdown: f64,
    pub p99_slowdown: f64,
    /// Mean slowdown (a lower bound if any message is unfinished).
    pub mean_slowdown: f64,
    /// False when an unfinished message could move the percentile: it is
    /// then a lower bound.
    pub p50_exact: bool,
    pub p99_exact: bool,
}

/// A measured message: size, slowdown (lower bound if unfinished), unfinished.
pub type Sample = (u32, f64, bool);

fn group(slice: &[Sample]) -> SteadyGroup {
    let mut s: Vec<(f64, bool)> = slice.iter().map(|x| (x.1, x.2)).collect();
    // Unstable: equal elements are equal in every field (as in
    // `homa_workload::stats::SlowdownTable`).
    s.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let vals: Vec<f64> = s.iter().map(|x| x.0).collect();
    let n = s.len();
    // The percentile is exact when no unfinished message sits at or below
    // its rank: their true slowdowns can only be larger.
    let exact = |p: f64| {
        if n == 0 {
            return true;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        let r = rank.clamp(1, n) - 1;
        !s[..=r].iter().any(|x| x.1)
    };
    SteadyGroup {
        min_size: slice.first().map_or(0, |x| x.0),
        max_size: slice.last().map_or(0, |x| x.0),
        count: n,
        unfinished: s.iter().filter(|x| x.1).count(),
        p50_slowdown: percentile(&vals, 50.0),
        p99_slowdown: percentile(&vals, 99.0),
        mean_slowdown: if n == 0 {
            f64::NAN
        } else {
            vals.iter().sum::<f64>() / n as f64
        },
        p50_exact: exact(50.0),
        p99_exact: exact(99.0),
    }
}

/// Deciles (by size, equal counts, as `SlowdownTable::deciles`) and the
/// largest 1% of all measured messages.
pub fn groups(mut samples: Vec<Sample>) -> (Vec<SteadyGroup>, SteadyGroup) {
    samples.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
    let len = samples.len();
    let deciles = (0..10)
        .map(|i| (i * len / 10, (i + 1) * len / 10))
        .filter(|(lo, hi)| hi > lo)
        .map(|(lo, hi)| group(&samples[lo..hi]))
        .collect();
    let k = len.div_ceil(100);
    (deciles, group(&samples[len - k..]))
}

/// What every run reports about its measurement window.
#[derive(Clone, Debug, Serialize)]
pub struct SteadyReport {
    /// How the window was chosen: `steady`, `messages`, `duration` or `trace`.
    pub mode: &'static str,
    /// When the window opened and how long it lasted (ns).
    pub warmup_ns: Time,
    pub window_ns: Time,
    /// Simulated time after the window (generation goes on, unmeasured,
    /// until every measured message is in or the drain limit passes).
    pub drain_ns: Time,
    /// Time to send the workload's largest message on a host link, and the
    /// window in those units.
    pub max_message_tx_ns: Time,
    pub window_over_max_tx: f64,
    /// The nominal offered load; DATA wire bytes of the messages generated
    /// in the window, and DATA wire bytes accepted by the receivers in the
    /// window (what the host downlinks carried, GRANTs and duplicates
    /// excluded), as fractions of the host links' capacity.
    pub offered_load: f64,
    pub offered_load_window: f64,
    pub carried_load: f64,
    /// `carried_load / offered_load`.
    pub carried_over_offered: f64,
    /// Wire bytes offered but not yet accepted, all hosts, when the window
    /// opened and closed (it grows while the run is not at steady state).
    pub backlog_start_bytes: u64,
    pub backlog_end_bytes: u64,
    /// Measured messages, and how many were not delivered by the end.
    pub measured: u64,
    pub unfinished: u64,
    /// Deciles and the largest 1% over every measured message, an
    /// unfinished one counting with its age at the end as latency.
    pub deciles: Vec<SteadyGroup>,
    pub top1pct: SteadyGroup,
    /// At steady state: carried load within [`LOAD_TOLERANCE`] of offered,
    /// and a window of at least [`MIN_WINDOW_PER_MAX_TX`] largest-message
    /// times.
    pub steady: bool,
    /// Every decile's p99 is exact (no unfinished message can move it).
    pub complete: bool,
    /// What failed either test.
    pub problems: Vec<String>,
    /// Offered and carried load and backlog per interval over the whole run.
    pub series_interval_ns: Time,
    pub series: Vec<SeriesPoint>,
}

impl SteadyReport {
    /// Fills in `steady` and `problems` from the other fields.
    pub fn judge(&mut self) {
        let mut p = Vec::new();
        if (self.carried_over_offered - 1.0).abs() > LOAD_TOLERANCE {
            p.push(format!(
                "carried load {:.3} is {:+.1}% of the offered {:.3}",
                self.carried_load,
                (self.carried_over_offered - 1.0) * 100.0,
                self.offered_load
            ));
        }
        // The window opens and closes at arrivals, so it can fall short of
        // its planned length by a gap between arrivals: 1% tolerance.
        if self.window_over_max_tx < MIN_WINDOW_PER_MAX_TX * 0.99 {
            p.push(format!(
                "window is {:.1} transmission times of the largest message (want {})",
                self.window_over_max_tx, MIN_WINDOW_PER_MAX_TX
            ));
        }
        self.steady = p.is_empty();
        let inexact: Vec<String> = self
            .deciles
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.p99_exact)
            .map(|(i, g)| format!("d{} ({} unfinished)", i + 1, g.unfinished))
            .collect();
        if !inexact.is_empty() {
            p.push(format!(
                "p99 only a lower bound (unfinished messages) in {}",
                inexact.join(", ")
            ));
        }
        self.complete = inexact.is_empty();
        self.problems = p;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    #[test]
    fn wire_bytes_count_every_packet_header_and_framing() {
        // 1416 payload bytes per 1472-byte datagram, 66 bytes of framing.
        assert_eq!(wire_bytes(1, 1472, 66), 1 + 56 + 66);
        assert_eq!(wire_bytes(1416, 1472, 66), 1538);
        assert_eq!(wire_bytes(1417, 1472, 66), 1417 + 2 * 122);
    }

    #[test]
    fn plan_scales_with_the_largest_message() {
        let w5 = SimSpec::new(Workload::builtin("w5").unwrap(), 0.8);
        let t = max_message_tx_ns(&w5);
        // 29.4 MB in 20,763 packets of 1,538 wire bytes at 10 Gbps.
        assert_eq!(t, (wire_bytes(29_400_000, 1472, 66) * 8).div_ceil(10));
        let p = SteadyPlan::for_spec(&w5);
        assert_eq!(p.window_ns, (t as f64 * WINDOW_PER_MAX_TX) as Time);
        for (w, ms) in [("w2", 8), ("w3", 117), ("w4", 316), ("w5", 1341)] {
            let spec = SimSpec::new(Workload::builtin(w).unwrap(), 0.8);
            let warm = SteadyPlan::for_spec(&spec).warmup_ns;
            assert_eq!(warm / 1_000_000, ms, "{w}: {warm}");
        }
        let w1 = SimSpec::new(Workload::builtin("w1").unwrap(), 0.8);
        let p1 = SteadyPlan::for_spec(&w1);
        assert_eq!((p1.warmup_ns, p1.window_ns), (MIN_WARMUP_NS, MIN_WINDOW_NS));
    }

    #[test]
    fn unfinished_messages_make_percentiles_lower_bounds_only_when_they_can_move_them() {
        // 100 messages of one size: 98 finished at slowdown 1..=98, two
        // unfinished with lower bounds 200 and 300: p99 (rank 99) is 200,
        // a lower bound; p50 exact.
        let mut s: Vec<Sample> = (1..=98).map(|i| (10, i as f64, false)).collect();
        s.push((10, 200.0, true));
        s.push((10, 300.0, true));
        let (d, top) = groups(s.clone());
        assert_eq!(d.len(), 10);
        assert_eq!(top.count, 1);
        assert!(!top.p99_exact);
        let g = group(&s);
        assert_eq!((g.count, g.unfinished), (100, 2));
        assert_eq!(g.p50_slowdown, 50.0);
        assert!(g.p50_exact);
        assert_eq!(g.p99_slowdown, 200.0);
        assert!(!g.p99_exact);
        // One unfinished message above the p99 rank changes nothing.
        let mut s2: Vec<Sample> = (1..=99).map(|i| (10, i as f64, false)).collect();
        s2.push((10, 150.0, true));
        let g2 = group(&s2);
        assert_eq!(g2.p99_slowdown, 99.0);
        assert!(g2.p99_exact);
    }
}
