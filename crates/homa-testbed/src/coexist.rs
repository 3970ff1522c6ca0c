//! The coexistence experiment of issue #20 (seed 003's "split traffic"):
//! Homa's workload between the Homa hosts while bulk TCP flows (real
//! kernel TCP, CUBIC) share the Homa hosts' downlinks, with the engine's
//! windows static or adaptive (`WindowPolicy`), and the switch either
//! ignoring DSCP (`shared`: one FIFO per port for everything) or serving
//! Homa's levels before TCP (`split`). It measures Homa's slowdown by size
//! decile and TCP's goodput, plus what the engines saw of the paths (RTT
//! samples against `rtt_min`, congestion, windows) and the downlink
//! queues, which is the evidence for why adaptive windows help or do not.
//!
//! Hosts: `0..H` run the cluster benchmark's Homa nodes (one endpoint per
//! host, echo RPCs to random other Homa hosts); TCP flow `f` goes from
//! host `H + f % H` (a host that only sends TCP, one per receiver, so
//! that its own shaped uplink carries at most one link's worth) to Homa
//! host `f % H`. The TCP flows start before Homa's clients and run until
//! they finish.

use crate::bulk::{self, FlowInfo, FlowSpec};
use crate::cluster::{self, Calibration, ClusterConfig, PhaseTick};
use crate::cmd::run as run_cmd;
use crate::cpu::{CpuSample, CpuUsage};
use crate::progress::Bar;
use crate::report::{EngineSummary, TransportResult, UnloadedRow};
use crate::testbed::{Testbed, TestbedConfig};
use crate::{Error, Result};
use homa::WindowPolicy;
use homa_bench::node::Transport;
use homa_bench::payload::Payloads;
use homa_workload::stats::{percentile, Group};
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the switch ports treat Homa and TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Classes {
    /// One class for everything: a network whose switches ignore DSCP;
    /// each downlink is one shaped FIFO shared by Homa and TCP.
    Shared,
    /// TCP in the lowest of 8 strict-priority classes, Homa's levels in
    /// the 7 above it ([`crate::tc::PortShape::tcp_below`]).
    Split,
}

impl std::str::FromStr for Classes {
    type Err = Error;
    fn from_str(s: &str) -> Result<Classes> {
        match s {
            "shared" => Ok(Classes::Shared),
            "split" => Ok(Classes::Split),
            _ => Err(Error::config(format!(
                "--classes {s:?}: expected shared or split"
            ))),
        }
    }
}

/// Everything a coexistence run needs.
#[derive(Clone, Debug)]
pub struct CoexistConfig {
    /// Homa's side, as the cluster benchmark runs it: workload, load,
    /// recorded seconds and warm-up, seed, engine options. Its `testbed`
    /// gives the prefix, link rate, queue length and the number of Homa
    /// hosts; priorities and the TCP class follow from [`Self::classes`],
    /// and the TCP senders are added to its hosts.
    pub bench: ClusterConfig,
    /// TCP bulk flows; flow `f` ends at Homa host `f % H` (0: Homa alone,
    /// the baseline of what its engines measure).
    pub tcp_flows: usize,
    /// The Homa engine's window policy (RTT is measured under both, so that
    /// static runs show what adaptive windows would have reacted to).
    pub window: WindowPolicy,
    pub classes: Classes,
    /// TCP congestion control of the flows.
    pub tcp_congestion: String,
    /// How long the TCP flows run alone before Homa's clients start; the
    /// second half of it gives `tcp_alone_gbps`.
    pub tcp_lead: Duration,
}

impl CoexistConfig {
    /// Defaults of `homa bench coexist` (W5 at 50% load, 4 Homa hosts, a
    /// 32-packet queue per port and class at 0.1 Gbit/s).
    pub fn new(workload: homa_workload::workload::Workload) -> CoexistConfig {
        let mut bench = ClusterConfig::new(workload, 0.5);
        bench.transports = vec![Transport::Homa];
        bench.testbed.prefix = "cx".into();
        bench.testbed.queue_packets = SHALLOW_QUEUE_PACKETS;
        CoexistConfig {
            bench,
            tcp_flows: 4,
            window: WindowPolicy::Static,
            classes: Classes::Shared,
            tcp_congestion: "cubic".into(),
            tcp_lead: Duration::from_secs(2),
        }
    }

    /// Homa hosts.
    pub fn homa_hosts(&self) -> usize {
        self.bench.testbed.hosts
    }

    /// The TCP flows, sender and receiver host of each.
    pub fn flows(&self) -> Vec<FlowSpec> {
        let h = self.homa_hosts();
        (0..self.tcp_flows)
            .map(|f| FlowSpec {
                sender: h + f % h,
                receiver: f % h,
            })
            .collect()
    }

    /// The testbed: the Homa hosts plus one TCP sender per receiver.
    pub fn testbed(&self) -> TestbedConfig {
        let h = self.homa_hosts();
        TestbedConfig {
            hosts: h + self.tcp_flows.min(h),
            priorities: match self.classes {
                Classes::Shared => 1,
                Classes::Split => 8,
            },
            tcp_below: self.classes == Classes::Split,
            ..self.bench.testbed.clone()
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.bench.validate()?;
        self.testbed().validate()?;
        if self.tcp_flows > 64 {
            return Err(Error::config(format!(
                "--tcp-flows {} must be 0..=64",
                self.tcp_flows
            )));
        }
        if self.bench.transports != [Transport::Homa] {
            return Err(Error::config("the coexistence experiment runs Homa only"));
        }
        Ok(())
    }

    /// The cluster configuration of Homa's phase: the engine gets the
    /// window policy and measures RTT, then the caller's overrides.
    fn homa_bench(&self) -> ClusterConfig {
        let mut c = self.bench.clone();
        c.testbed = self.testbed();
        let (window, user) = (self.window, self.bench.adjust_engine.clone());
        c.adjust_engine = Some(Arc::new(move |e: &mut homa::EngineConfig| {
            e.window_policy = window;
            e.measure_rtt = true;
            if let Some(f) = &user {
                f(e);
            }
        }));
        c
    }
}

/// Packets per class queue of a switch port: a shallow-buffer switch at
/// this testbed's scale. A real one holds a few bandwidth-delay products
/// per port (256 KB at 25 Gbit/s is 8 BDPs of a 10 µs path); here a path's
/// BDP is 1-3 full packets (0.1 Gbit/s, a 100-300 µs RTT), and 32 packets
/// (48 KB, 3.9 ms to drain) is 10-30 of them, enough for TCP to fill the
/// link and shallow enough that it overflows.
pub const SHALLOW_QUEUE_PACKETS: u32 = 32;

/// Percentiles of a set of observations.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Spread::default();
        }
        Spread {
            count: v.len(),
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
            max: v[v.len() - 1],
        }
    }
}

/// What the Homa engines saw of their paths, read every 50 ms during the
/// recorded window from every host's endpoint about every other Homa host
/// (`homa::Endpoint::peer_rtt`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PathEvidence {
    /// `rtt_min` of the observed paths, µs.
    pub rtt_min_us: Spread,
    /// The latest sample over `rtt_min`: how far queues push RTTs (the
    /// default congestion signal fires above `rtt_high_factor`, 8).
    pub recent_over_min: Spread,
    /// The smoothed RTT over `rtt_min` (the `Smoothed` signal's input).
    pub srtt_over_min: Spread,
    /// Share of observations in which the peer was congested.
    pub congested_fraction: f64,
    /// The unscheduled bytes of the next message to the peer.
    pub unsched_window: Spread,
    /// The grant window the endpoint gives the peer's messages.
    pub grant_window: Spread,
}

/// Packets queued on the Homa hosts' downlinks, read with `tc` every 250
/// ms during the recorded window (all classes together).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QueueEvidence {
    pub packets: Spread,
    /// The queue limit of one class, for comparison.
    pub limit_packets: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct CoexistReport {
    pub workload: String,
    pub load: f64,
    pub gbps: f64,
    pub homa_hosts: usize,
    pub tcp_flows: usize,
    pub flows: Vec<FlowSpec>,
    /// "static" or "adaptive".
    pub window: String,
    pub classes: Classes,
    pub queue_packets: u32,
    pub seconds: f64,
    pub warmup: f64,
    pub seed: u64,
    /// The congestion control the flows ran, read back from their sockets.
    pub tcp_congestion_control: String,
    pub engine: EngineSummary,
    /// Homa's slowdown by size decile (the goal's numbers).
    pub deciles: Vec<Group>,
    pub top1pct: Option<Group>,
    /// TCP goodput of all flows together during Homa's recorded window,
    /// Gbit/s (bytes the receivers read).
    pub tcp_gbps: f64,
    pub tcp_gbps_by_flow: Vec<f64>,
    /// TCP goodput with Homa idle (the second half of the lead).
    pub tcp_alone_gbps: f64,
    /// The flows at the end (TCP_INFO of each sender).
    pub tcp_flow_info: Vec<FlowInfo>,
    /// Homa's achieved request + response payload per host, Gbit/s.
    pub homa_gbps: f64,
    pub path: PathEvidence,
    pub downlink_queue: QueueEvidence,
    pub background_cpu: CpuUsage,
    pub unloaded: Vec<UnloadedRow>,
    /// Homa's full result (deciles again, latencies, drops, engine
    /// counters: `rtt_samples`, `rtt_samples_congested`,
    /// `rtt_samples_above_mid`, `congestion_onsets`, `unsched_window_cuts`).
    pub homa: TransportResult,
    pub notes: Vec<String>,
}

impl CoexistReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }

    /// A short plain-text summary.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "coexist: {} at {:.0}% on {} Homa hosts, {} TCP flows ({}), window {}, classes {:?}, {} Gbit/s, {} packets per queue",
            self.workload,
            self.load * 100.0,
            self.homa_hosts,
            self.tcp_flows,
            self.tcp_congestion_control,
            self.window,
            self.classes,
            self.gbps,
            self.queue_packets
        );
        let _ = writeln!(
            s,
            "{:>10} {:>7} {:>10} {:>10}",
            "max size", "count", "p50", "p99"
        );
        for g in &self.deciles {
            let _ = writeln!(
                s,
                "{:>10} {:>7} {:>10.1} {:>10.1}",
                g.max_size, g.count, g.p50_slowdown, g.p99_slowdown
            );
        }
        let _ = writeln!(
            s,
            "TCP {:.4} Gbit/s (alone {:.4}); Homa {:.4} Gbit/s per host; RTT/rtt_min p50 {:.1} p99 {:.1}, congested {:.0}% of observations; downlink queue p50 {:.0} p99 {:.0} packets",
            self.tcp_gbps,
            self.tcp_alone_gbps,
            self.homa_gbps,
            self.path.recent_over_min.p50,
            self.path.recent_over_min.p99,
            self.path.congested_fraction * 100.0,
            self.downlink_queue.packets.p50,
            self.downlink_queue.packets.p99
        );
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

/// Packets queued on `dev` (all of its leaves), from `tc -s qdisc show`.
fn queued_packets(ns_dev: &str) -> Option<f64> {
    let text = run_cmd("tc", &["-s", "qdisc", "show", "dev", ns_dev]).ok()?;
    parse_leaf_backlog(&text)
}

/// Sums the `backlog ...b Np` lines of the leaf qdiscs (those with a
/// parent; the root's backlog counts the same packets again).
pub fn parse_leaf_backlog(text: &str) -> Option<f64> {
    let mut total = 0u64;
    let mut in_leaf = false;
    let mut seen = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("qdisc ") {
            in_leaf = l.contains(" parent ");
        } else if let Some(rest) = l.strip_prefix("backlog ") {
            if in_leaf {
                let p = rest.split_whitespace().nth(1)?.strip_suffix('p')?;
                total += p.parse::<u64>().ok()?;
                seen = true;
            }
        }
    }
    seen.then_some(total as f64)
}

/// Runs the experiment; the testbed is removed at the end unless the
/// bench's `keep_testbed` (also when the run fails).
pub fn run(cfg: &CoexistConfig) -> Result<CoexistReport> {
    cfg.validate()?;
    let tb = Testbed::up(&cfg.testbed())?;
    let guard = (!cfg.bench.keep_testbed).then(|| tb.clone().guard());
    let r = run_on(&tb, cfg);
    drop(guard);
    r
}

/// Runs the experiment on a testbed that is up with [`CoexistConfig::testbed`].
pub fn run_on(tb: &Testbed, cfg: &CoexistConfig) -> Result<CoexistReport> {
    cfg.validate()?;
    let bench = cfg.homa_bench();
    let h = cfg.homa_hosts();
    let payloads = Payloads::new(bench.workload.max_len() as usize);
    let mut notes = Vec::new();

    let background = CpuSample::background(Duration::from_millis(500));

    // Engine RTT and unloaded RTTs on the idle testbed (no TCP yet).
    let Calibration {
        rtt_ns,
        homa_cfg,
        plan,
        baseline,
        unloaded,
    } = cluster::calibrate(tb, &bench, &payloads)?;

    // TCP alone for the lead; its second half gives the alone rate.
    let mut bar = Bar::new("tcp alone", cfg.tcp_lead, bench.progress);
    let flows_spec = cfg.flows();
    let flows = bulk::start(tb, &flows_spec, &cfg.tcp_congestion)?;
    std::thread::sleep(cfg.tcp_lead / 2);
    let (a0, t0) = (flows.received_bytes(), Instant::now());
    std::thread::sleep(cfg.tcp_lead / 2);
    let tcp_alone_gbps =
        (flows.received_bytes() - a0) as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9;
    bar.finish(&format!(
        "{} flows ({}), {tcp_alone_gbps:.4} Gbit/s",
        flows_spec.len(),
        flows.congestion_control
    ));

    // Homa's phase, TCP still running; the observer reads TCP's counters at
    // the window's edges and the engines' paths and the queues inside it.
    let warmup = Duration::from_secs_f64(bench.warmup);
    let end = warmup + Duration::from_secs_f64(bench.seconds);
    let homa_addrs: Vec<_> = (0..h)
        .map(|j| cluster::server_addrs(j, Transport::Homa, 1)[0])
        .collect();
    let ports: Vec<String> = (0..h).map(|i| tb.names.port(i)).collect();
    let mut tcp_at: Vec<(Instant, Vec<u64>)> = Vec::new();
    let mut obs = Observations::default();
    let mut ticks = 0u64;
    let homa = {
        let mut on_tick = |t: &PhaseTick| {
            let recording = t.elapsed >= warmup && t.elapsed < end;
            if (tcp_at.is_empty() && t.elapsed >= warmup) || (tcp_at.len() == 1 && t.elapsed >= end)
            {
                tcp_at.push((Instant::now(), flows.received_by_flow()));
            }
            if !recording {
                return;
            }
            ticks += 1;
            for (i, ep) in t.endpoints.iter().enumerate() {
                for (j, addr) in homa_addrs.iter().enumerate() {
                    if i != j {
                        if let Some(p) = ep.peer_rtt(*addr) {
                            obs.add(&p);
                        }
                    }
                }
            }
            if ticks % 5 == 1 {
                for p in &ports {
                    if let Some(q) = queued_packets(p) {
                        obs.queue.push(q);
                    }
                }
            }
        };
        cluster::run_phase(
            tb,
            h,
            &bench,
            Transport::Homa,
            &homa_cfg,
            &Arc::new(bench.workload.clone()),
            &payloads,
            &baseline,
            &mut on_tick,
        )
    };
    // A phase cut short (clients failed) missed one edge or both.
    while tcp_at.len() < 2 {
        tcp_at.push((Instant::now(), flows.received_by_flow()));
    }
    let tcp_congestion_control = flows.congestion_control.clone();
    let flow_info = flows.stop()?;
    let homa = homa?;
    let (t_start, b_start) = &tcp_at[0];
    let (t_end, b_end) = &tcp_at[1];
    let secs = t_end.duration_since(*t_start).as_secs_f64().max(1e-3);
    let tcp_gbps_by_flow: Vec<f64> = b_end
        .iter()
        .zip(b_start)
        .map(|(e, s)| (e - s) as f64 * 8.0 / secs / 1e9)
        .collect();
    if (secs - bench.seconds).abs() > 0.25 * bench.seconds {
        notes.push(format!(
            "TCP was measured over {secs:.2} s instead of {} s (the process was held up?)",
            bench.seconds
        ));
    }
    if homa.cpu_saturated {
        notes.push(format!(
            "the machine's CPUs were {:.0}% busy during the run: CPU-bound, not a network result",
            homa.cpu.machine_percent
        ));
    }
    if homa.failed > 0 || homa.unfinished > 0 {
        notes.push(format!(
            "Homa: {} RPCs failed and {} did not finish in time (not in the statistics)",
            homa.failed, homa.unfinished
        ));
    }
    if background.machine_percent > 20.0 {
        notes.push(format!(
            "the machine was already {:.0}% busy with the testbed idle",
            background.machine_percent
        ));
    }
    Ok(CoexistReport {
        workload: bench.workload.name.clone(),
        load: bench.load,
        gbps: bench.testbed.gbps,
        homa_hosts: h,
        tcp_flows: cfg.tcp_flows,
        flows: flows_spec,
        window: match cfg.window {
            WindowPolicy::Static => "static",
            WindowPolicy::Adaptive => "adaptive",
        }
        .into(),
        classes: cfg.classes,
        queue_packets: bench.testbed.queue_packets,
        seconds: bench.seconds,
        warmup: bench.warmup,
        seed: bench.seed,
        tcp_congestion_control,
        engine: EngineSummary {
            rtt_us: rtt_ns as f64 / 1e3,
            rtt_bytes: homa_cfg.engine.rtt_bytes(),
            poll_us: bench.poll_us,
            priority_plan: plan.describe(),
        },
        deciles: homa.deciles.clone(),
        top1pct: homa.top1pct.clone(),
        tcp_gbps: tcp_gbps_by_flow.iter().sum(),
        tcp_gbps_by_flow,
        tcp_alone_gbps,
        tcp_flow_info: flow_info,
        homa_gbps: homa.achieved_gbps,
        path: obs.path(),
        downlink_queue: QueueEvidence {
            packets: Spread::of(obs.queue),
            limit_packets: bench.testbed.queue_packets,
        },
        background_cpu: background,
        unloaded,
        homa,
        notes,
    })
}

/// Raw observations of one run.
#[derive(Default)]
struct Observations {
    rtt_min: Vec<f64>,
    recent: Vec<f64>,
    srtt: Vec<f64>,
    congested: usize,
    unsched: Vec<f64>,
    grant: Vec<f64>,
    queue: Vec<f64>,
}

impl Observations {
    fn add(&mut self, p: &homa::PeerRtt) {
        let Some(min) = p.rtt_min.filter(|&m| m > 0) else {
            return;
        };
        self.rtt_min.push(min as f64 / 1e3);
        self.recent.push(p.rtt_recent as f64 / min as f64);
        self.srtt.push(p.srtt as f64 / min as f64);
        self.congested += p.congested as usize;
        self.unsched.push(p.unsched_window as f64);
        self.grant.push(p.grant_window as f64);
    }

    fn path(&self) -> PathEvidence {
        PathEvidence {
            rtt_min_us: Spread::of(self.rtt_min.clone()),
            recent_over_min: Spread::of(self.recent.clone()),
            srtt_over_min: Spread::of(self.srtt.clone()),
            congested_fraction: if self.recent.is_empty() {
                0.0
            } else {
                self.congested as f64 / self.recent.len() as f64
            },
            unsched_window: Spread::of(self.unsched.clone()),
            grant_window: Spread::of(self.grant.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homa_workload::workload::Workload;

    fn cfg() -> CoexistConfig {
        CoexistConfig::new(Workload::builtin("w5").unwrap().capped(1_000_000))
    }

    #[test]
    fn flows_end_at_homa_hosts_from_one_sender_per_receiver() {
        let mut c = cfg();
        c.tcp_flows = 6;
        let f = c.flows();
        assert_eq!(f.len(), 6);
        assert_eq!(
            f[0],
            FlowSpec {
                sender: 4,
                receiver: 0
            }
        );
        assert_eq!(
            f[5],
            FlowSpec {
                sender: 5,
                receiver: 1
            }
        );
        assert!(f
            .iter()
            .all(|f| f.receiver < 4 && f.sender == 4 + f.receiver));
        assert_eq!(c.testbed().hosts, 8);
        c.tcp_flows = 2;
        assert_eq!(c.testbed().hosts, 6);
    }

    #[test]
    fn classes_shape_the_ports() {
        let mut c = cfg();
        let t = c.testbed();
        assert_eq!((t.priorities, t.tcp_below), (1, false));
        assert_eq!(t.queue_packets, SHALLOW_QUEUE_PACKETS);
        c.classes = "split".parse().unwrap();
        let t = c.testbed();
        assert_eq!((t.priorities, t.tcp_below), (8, true));
        assert!("both".parse::<Classes>().is_err());
        c.tcp_flows = 65;
        assert!(c.validate().is_err());
        // No TCP: Homa alone, the baseline of what the engines measure.
        c.tcp_flows = 0;
        assert!(c.flows().is_empty());
        assert_eq!(c.testbed().hosts, 4);
    }

    #[test]
    fn the_engine_gets_the_window_policy_and_measures_rtt() {
        let mut c = cfg();
        c.window = WindowPolicy::Adaptive;
        c.bench.adjust_engine = Some(Arc::new(|e: &mut homa::EngineConfig| {
            e.rtt_high_factor = 5;
        }));
        let b = c.homa_bench();
        let mut e = homa::EngineConfig::default();
        (b.adjust_engine.unwrap())(&mut e);
        assert_eq!(e.window_policy, WindowPolicy::Adaptive);
        assert!(e.measure_rtt);
        assert_eq!(e.rtt_high_factor, 5, "the caller's overrides come last");
    }

    #[test]
    fn leaf_backlogs_are_summed_and_the_root_is_not() {
        let text = "qdisc htb 1: root refcnt 2 r2q 10 default 0x10\n Sent 10 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)\n backlog 4542b 3p requeues 0\nqdisc pfifo 100: parent 1:10 limit 32p\n Sent 10 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)\n backlog 3028b 2p requeues 0\nqdisc pfifo 101: parent 1:11 limit 32p\n Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)\n backlog 1514b 1p requeues 0\n";
        assert_eq!(parse_leaf_backlog(text), Some(3.0));
        assert_eq!(parse_leaf_backlog(""), None);
    }

    #[test]
    fn spreads() {
        let s = Spread::of((1..=100).map(f64::from).collect());
        assert_eq!((s.count, s.p50, s.p99, s.max), (100, 50.0, 99.0, 100.0));
        assert_eq!(Spread::of(vec![]), Spread::default());
    }
}
