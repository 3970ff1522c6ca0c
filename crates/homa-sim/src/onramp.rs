//! Issue #22's On-Ramp experiment (`homa sim --experiment onramp`,
//! `docs/onramp.md`): repeated incasts of `senders` × `message_size` into
//! one receiver over open-loop background traffic (W4 at 50% by default)
//! on one shallow-buffer switch, with or without switch priorities, with
//! On-Ramp on or off, and optionally with unsynchronised host clocks.
//!
//! It is a mapping of options onto a workload run ([`crate::sim`]) with an
//! incast overlay ([`IncastOverlay`]); the report picks what the issue's
//! goals are about: the incast's round completion time, the background's
//! slowdown per size decile, drops, and On-Ramp's holds.

use crate::experiment::{PortClassDrops, SHALLOW_BUFFER_BYTES};
use crate::sim::{ClockSpread, IncastOverlay, OnRampSettings, Report, SimSpec, Variant};
use crate::stats::Group;
use crate::steady::SteadyPlan;
use crate::topology::Topology;
use crate::workload::Workload;
use homa_proto::Time;
use serde::Serialize;
use std::collections::BTreeMap;

const MS: u64 = 1_000_000;

/// Measured incast rounds of an On-Ramp run by default: the report's
/// `incast_rct_p99_us` is the nearest-rank 99th percentile of their
/// completion times, which of 20 rounds is their maximum, so one round
/// that waits one more resend tick (0.5 ms) decided a run's reading
/// (docs/onramp.md §6.10); of 100 it is the second slowest.
pub const ONRAMP_ROUNDS: usize = 100;

/// One On-Ramp experiment run.
#[derive(Clone, Debug)]
pub struct OnRampSpec {
    /// Hosts on the switch (host 0 receives the incasts; hosts
    /// `1..=senders` send them; every host sends and receives background).
    pub hosts: usize,
    pub link_gbps: f64,
    /// Buffer per switch output port (`None`: unlimited).
    pub buffer_bytes: Option<u64>,
    pub senders: usize,
    pub message_size: u32,
    /// Background workload and its load (fraction of host link rate).
    pub background: Workload,
    pub load: f64,
    pub variant: Variant,
    /// Priority levels (`None`: the variant's, 8 for Homa, 1 for basic).
    pub priorities: Option<u8>,
    pub onramp: bool,
    /// `Config::onramp_*` (`None`: the engine's defaults).
    pub onramp_settings: OnRampSettings,
    pub clocks: ClockSpread,
    /// Measured incast rounds at least ([`ONRAMP_ROUNDS`] by default).
    pub rounds: usize,
    /// Idle time between a round's last delivery and the next round.
    pub gap_ns: Time,
    /// Warm-up and shortest measured span (`None`: the background
    /// workload's steady-state plan, [`SteadyPlan::for_spec`]).
    pub warmup_ns: Option<Time>,
    pub span_ns: Option<Time>,
    /// The measured span ends after this long even with fewer rounds.
    pub max_span_ns: Time,
    pub seed: u64,
}

impl OnRampSpec {
    /// The defaults: `max(senders + 1, 65)` hosts on one switch with 25 Gbps
    /// links and [`SHALLOW_BUFFER_BYTES`] per port (256 KB: a Broadcom
    /// Trident 3 class switch, 32 MB shared by 128 × 25 Gbps ports, split
    /// evenly), W4 at 50% load, Homa, [`ONRAMP_ROUNDS`] measured rounds
    /// 20 µs apart, within at most 4 s of measured span.
    pub fn new(senders: usize, message_size: u32) -> OnRampSpec {
        OnRampSpec {
            hosts: (senders + 1).max(65),
            link_gbps: 25.0,
            buffer_bytes: Some(SHALLOW_BUFFER_BYTES),
            senders,
            message_size,
            background: Workload::parse("w4").expect("w4 is built in"),
            load: 0.5,
            variant: Variant::Homa,
            priorities: None,
            onramp: false,
            onramp_settings: OnRampSettings::default(),
            clocks: ClockSpread::default(),
            rounds: ONRAMP_ROUNDS,
            gap_ns: 20_000,
            warmup_ns: None,
            span_ns: None,
            max_span_ns: 4_000 * MS,
            seed: 1,
        }
    }

    /// `WORKLOAD:LOAD`, e.g. `w4:0.5`.
    pub fn parse_background(s: &str) -> Result<(Workload, f64), String> {
        let (w, l) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("expected WORKLOAD:LOAD (e.g. w4:0.5), got {s:?}"))?;
        let workload = Workload::parse(w).map_err(|e| e.to_string())?;
        let load: f64 = l.parse().map_err(|_| format!("bad load in {s:?}"))?;
        if !(load > 0.0 && load < 1.0) {
            return Err(format!("background load {load} out of range (0, 1)"));
        }
        Ok((workload, load))
    }

    /// The workload run that implements the experiment.
    pub fn sim_spec(&self) -> SimSpec {
        assert!(self.senders >= 1 && self.senders < self.hosts);
        let mut topology = Topology::star(self.hosts);
        topology.host_link_bps = (self.link_gbps * 1e9) as u64;
        topology.switch_buffer_bytes = self.buffer_bytes;
        let mut spec = SimSpec {
            topology,
            variant: self.variant,
            priorities: self.priorities,
            seed: self.seed,
            onramp: self.onramp,
            onramp_settings: self.onramp_settings,
            clocks: self.clocks,
            incast: Some(IncastOverlay {
                senders: self.senders,
                receiver: 0,
                message_size: self.message_size,
                gap_ns: self.gap_ns,
                min_rounds: self.rounds,
                max_window_ns: self.max_span_ns,
            }),
            ..SimSpec::new(self.background.clone(), self.load)
        };
        let mut plan = SteadyPlan::for_spec(&spec);
        if let Some(w) = self.warmup_ns {
            plan.warmup_ns = w;
        }
        if let Some(s) = self.span_ns {
            plan.window_ns = s;
        }
        spec.stop = plan.stop();
        spec.drain_factor = plan.drain_factor;
        spec
    }
}

/// The result of one run: what the goals compare, then detail.
#[derive(Clone, Debug, Serialize)]
pub struct OnRampReport {
    pub experiment: &'static str,
    pub variant: String,
    pub priorities: u8,
    pub onramp: bool,
    pub senders: usize,
    pub message_size: u32,
    pub background: String,
    pub clock_offset_ns: u64,
    pub clock_drift_ppm: f64,
    /// p99 (nearest rank: the largest of fewer than 100 rounds) of the
    /// measured rounds' completion times, µs.
    pub incast_rct_p99_us: f64,
    pub incast_rct_p50_us: f64,
    pub incast_rct_mean_us: f64,
    /// Every message's wire bytes back to back through the receiver's
    /// link, after one message's idle latency.
    pub incast_rct_ideal_us: f64,
    pub incast_rounds: usize,
    /// Every measured round's completion time (µs), in order.
    pub incast_rct_us: Vec<f64>,
    /// A measured round had not finished at the end (its age counts).
    pub incast_unfinished_round: bool,
    /// Background messages by size decile: slowdown of one-way latency.
    pub background_deciles: Vec<Group>,
    pub background_messages: usize,
    pub background_unfinished: usize,
    /// Switch buffer drops from the window's opening to the end.
    pub drops: u64,
    pub drops_by_class: Vec<PortClassDrops>,
    /// On-Ramp's holds over the whole run, all hosts: how many, their
    /// total and mean length, the longest allowed, messages parked.
    pub holds: u64,
    pub held_ns: u64,
    pub mean_hold_us: f64,
    pub max_hold_bound_ns: u64,
    pub threshold_ns: u64,
    pub open_permille: u32,
    pub fresh_reports: bool,
    pub parked: u64,
    /// Holds of receivers' grants (`Config::onramp_hold_grants`), their
    /// mean length (µs), and whether they were on.
    pub hold_grants: bool,
    pub grant_holds: u64,
    pub mean_grant_hold_us: f64,
    /// Background load offered in the window, incast load offered in the
    /// window, and DATA load the hosts carried (both), as fractions of all
    /// host links' capacity.
    pub background_offered_load: f64,
    pub incast_offered_load: f64,
    pub carried_load: f64,
    pub retransmitted_packets: u64,
    pub resends_sent: u64,
    pub window_ns: Time,
    pub simulated_ns: Time,
    pub events: u64,
    pub wall_seconds: f64,
    /// Every engine counter summed over hosts (nonzero ones).
    pub engine: BTreeMap<String, u64>,
    /// The workload run's parameters.
    pub params: crate::sim::Params,
}

/// Runs the experiment.
pub fn run_onramp(spec: &OnRampSpec) -> OnRampReport {
    let sim = spec.sim_spec();
    let (config, _) = sim.engine_config();
    let r = crate::sim::run(&sim, None);
    report(spec, &sim, &config, r)
}

fn report(
    spec: &OnRampSpec,
    sim: &SimSpec,
    config: &homa_proto::Config,
    r: Report,
) -> OnRampReport {
    let incast = r.incast.clone().expect("the run has an incast overlay");
    let e = |k: &str| r.engine.get(k).copied().unwrap_or(0);
    let holds = e("onramp_holds");
    let held_ns = e("onramp_held_ns");
    let ss = &r.steady_state;
    let mut engine = r.engine.clone();
    engine.retain(|_, v| *v != 0);
    OnRampReport {
        experiment: "onramp",
        variant: sim.variant.name().to_string(),
        priorities: sim.levels(),
        onramp: spec.onramp,
        senders: spec.senders,
        message_size: spec.message_size,
        background: format!("{}:{}", spec.background.name, spec.load),
        clock_offset_ns: spec.clocks.offset_ns,
        clock_drift_ppm: spec.clocks.drift_ppm,
        incast_rct_p99_us: incast.rct_p99_us,
        incast_rct_p50_us: incast.rct_p50_us,
        incast_rct_mean_us: incast.rct_mean_us,
        incast_rct_ideal_us: incast.rct_ideal_us,
        incast_rounds: incast.rounds_measured,
        incast_rct_us: incast.rct_ns.iter().map(|&ns| ns as f64 / 1e3).collect(),
        incast_unfinished_round: incast.unfinished_round,
        background_deciles: r.deciles.clone(),
        background_messages: r.messages,
        background_unfinished: r.unfinished,
        drops: r.network.get("buffer_drops").copied().unwrap_or(0),
        drops_by_class: r.drops_by_class.clone(),
        holds,
        held_ns,
        mean_hold_us: homa_proto::mean_hold_us(held_ns, holds),
        max_hold_bound_ns: config.effective_onramp_max_hold_ns(),
        threshold_ns: config.effective_onramp_threshold_ns(),
        open_permille: config.effective_onramp_open_permille(),
        fresh_reports: config.onramp_fresh_reports,
        parked: e("onramp_parked"),
        hold_grants: config.onramp_hold_grants,
        grant_holds: e("onramp_grant_holds"),
        mean_grant_hold_us: homa_proto::mean_hold_us(
            e("onramp_grants_held_ns"),
            e("onramp_grant_holds"),
        ),
        background_offered_load: ss.offered_load_window - incast.offered_load,
        incast_offered_load: incast.offered_load,
        carried_load: ss.carried_load,
        retransmitted_packets: e("retransmitted_packets"),
        resends_sent: e("resends_sent"),
        window_ns: ss.window_ns,
        simulated_ns: r.simulated_ns,
        events: r.events,
        wall_seconds: r.wall_seconds,
        engine,
        params: r.params,
    }
}

/// One line per run, for the text output.
pub fn summary(r: &OnRampReport) -> String {
    let d: Vec<String> = r
        .background_deciles
        .iter()
        .map(|g| format!("{:.2}", g.p99_slowdown))
        .collect();
    format!(
        "onramp {} p{} onramp={} {} x {} B over {}: incast RCT p99 {:.0} us (p50 {:.0}, ideal {:.0}, {} rounds{}), background p99 slowdown by decile [{}], drops {}, holds {} (mean {:.1} us), carried load {:.3}",
        r.variant,
        r.priorities,
        if r.onramp { "on" } else { "off" },
        r.senders,
        r.message_size,
        r.background,
        r.incast_rct_p99_us,
        r.incast_rct_p50_us,
        r.incast_rct_ideal_us,
        r.incast_rounds,
        if r.incast_unfinished_round { ", one unfinished" } else { "" },
        d.join(" "),
        r.drops,
        r.holds,
        r.mean_hold_us,
        r.carried_load
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// 8 senders × 30 KB into host 0 of 12, over W1 at 30% load, 64 KB
    /// port buffers: a second or two of simulated milliseconds.
    fn small(onramp: bool) -> OnRampSpec {
        let mut s = OnRampSpec::new(8, 30_000);
        s.hosts = 12;
        s.background = Workload::parse("w1").unwrap();
        s.load = 0.3;
        s.buffer_bytes = Some(64_000);
        s.rounds = 4;
        s.warmup_ns = Some(300 * US);
        s.span_ns = Some(1_000 * US);
        s.max_span_ns = 20 * MS;
        s.onramp = onramp;
        s
    }

    fn check(r: &OnRampReport) {
        assert!(r.incast_rounds >= 4 && !r.incast_unfinished_round, "{r:?}");
        assert!(r.incast_rct_p50_us >= r.incast_rct_ideal_us * 0.99, "{r:?}");
        assert!(r.incast_rct_p99_us >= r.incast_rct_p50_us);
        assert_eq!(r.incast_rct_us.len(), r.incast_rounds);
        let max = r.incast_rct_us.iter().cloned().fold(0.0, f64::max);
        assert_eq!(
            max, r.incast_rct_p99_us,
            "fewer than 100 rounds: p99 is the largest"
        );
        assert_eq!(r.background_deciles.len(), 10);
        assert!(r.background_messages > 500 && r.background_unfinished == 0);
        assert!(r.background_deciles.iter().all(|g| g.p99_slowdown >= 1.0));
        // 8 × one RTT of unscheduled bytes overflow 64 KB: drops, all at
        // the receiver's downlink... and some at background receivers.
        assert!(r.drops > 0, "{r:?}");
        let down: u64 = r
            .drops_by_class
            .iter()
            .filter(|c| c.class == "switch_to_host")
            .map(|c| c.drops)
            .sum();
        assert_eq!(down, r.drops);
        // Incast bytes are offered on top of the background's.
        assert!(r.incast_offered_load > 0.0);
        assert!((r.background_offered_load - 0.3).abs() < 0.1, "{r:?}");
    }

    #[test]
    fn onramp_off_holds_nothing_and_on_holds_within_the_bound() {
        let off = run_onramp(&small(false));
        check(&off);
        assert_eq!((off.holds, off.held_ns, off.parked), (0, 0, 0));
        let on = run_onramp(&small(true));
        check(&on);
        assert!(on.holds > 0 && on.parked > 0, "{on:?}");
        assert!(on.held_ns <= on.holds * on.max_hold_bound_ns);
        assert!(on.mean_hold_us * 1e3 <= on.max_hold_bound_ns as f64);
        // Deterministic.
        let again = run_onramp(&small(true));
        assert_eq!(
            (again.incast_rct_p99_us, again.holds, again.drops),
            (on.incast_rct_p99_us, on.holds, on.drops)
        );
    }

    /// Clocks up to 1 s apart and 50 ppm off: the offset cancels in the
    /// queueing delay and the drift moves it by well under T, so On-Ramp
    /// holds about as often as with one clock (a clock error in the
    /// reports would hold at every report, or never).
    #[test]
    fn unsynchronised_clocks_hold_about_as_often() {
        let shared = run_onramp(&small(true));
        let mut s = small(true);
        s.clocks = ClockSpread {
            offset_ns: 1_000_000_000,
            drift_ppm: 50.0,
        };
        let r = run_onramp(&s);
        check(&r);
        let ratio = r.holds as f64 / shared.holds as f64;
        assert!(
            (0.8..1.25).contains(&ratio),
            "{} vs {}",
            r.holds,
            shared.holds
        );
        // The clocks are in effect: the run is not the shared one.
        assert_ne!(r.held_ns, shared.held_ns);
    }

    #[test]
    fn background_parses() {
        let (w, l) = OnRampSpec::parse_background("w4:0.5").unwrap();
        assert_eq!((w.name.as_str(), l), ("w4", 0.5));
        for bad in ["w4", "w4:1.5", "w9:0.5", "w4:x"] {
            assert!(OnRampSpec::parse_background(bad).is_err(), "{bad}");
        }
    }
}
