//! Issue #22's On-Ramp experiment on the namespace testbed (`homa bench
//! onramp`; the simulator's is `homa sim --experiment onramp`, and
//! `docs/onramp.md` §7 describes both this design and its results):
//! repeated incasts of `senders` × `message_size` bytes into one receiver
//! over open-loop background traffic (W4 at 50% by default), through
//! shaped 0.1 Gbit/s downlinks with shallow (32-packet) queues, with
//! On-Ramp on or off, 8 priority classes or one, Homa's grants or the basic
//! variant's, and optionally with every endpoint's clock offset and
//! drifting (`homa::ClockSkew`, the runtime's `test-hooks` clock).
//!
//! Layout (H hosts, default 5): host 0 is the receiver; every host runs
//! one background endpoint (the cluster benchmark's echo server and
//! open-loop client, sharing that endpoint), host 0's also takes the
//! incast requests. Incast sender `k` is an endpoint of its own on host
//! `1 + k % (H − 1)`, port [`INCAST_PORT`]` + k / (H − 1)`: 32 senders are
//! 8 endpoints on each of 4 hosts. Each endpoint is an emulated host with
//! its own engine, pacer (its NIC, at the link rate) and clock; a
//! namespace only groups endpoints, so its uplink is not shaped (a shaped
//! uplink would make 8 senders share one NIC). The bottleneck is the
//! switch: each downlink (bridge port) is an HTB tree at the link rate
//! with `priorities` strict-priority classes chosen by DSCP (one class:
//! a switch that ignores DSCP) and a 32-packet FIFO per class.
//!
//! A round: the coordinator issues one `message_size` request from every
//! sender endpoint, back to back, and the round ends when the receiver's
//! server has the last of them (its handler ran); the round completion
//! time (RCT) is that instant minus the first issue, both read on this
//! process's clock (never the skewed engine clocks). The receiver answers
//! each incast request with an empty response. The next round starts
//! `gap` later; rounds run back to back through the background's recorded
//! window, and a round that ends after the window is not measured.

use crate::cluster::{self, Calibration, ClusterConfig, Servers};
use crate::cpu::{CpuSample, CpuUsage};
use crate::netns::{run_in, spawn_in};
use crate::progress::Bar;
use crate::report::{EngineSummary, TransportResult, UnloadedRow};
use crate::testbed::{host_addr, Testbed, TestbedConfig};
use crate::{Error, Result};
use bytes::Bytes;
use homa::{ClockSkew, Endpoint, EndpointBuilder};
use homa_bench::node::homa_node::bind_server;
use homa_bench::node::{run_client, start_server, ClientResult, ClientSpec, ServerSpec, Transport};
use homa_bench::payload::Payloads;
use homa_proto::GrantPolicy;
use homa_workload::stats::{percentile, Group};
use homa_workload::workload::Workload;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// First port of the incast sender endpoints on each sender host.
pub const INCAST_PORT: u16 = 6000;

/// Bytes of a frame beyond its UDP payload: UDP, IPv4 and Ethernet headers.
const FRAME_OVERHEAD: u64 = 42;

/// The equilibrium protocol under On-Ramp (the simulator's variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Homa as the testbed runs it: SRPT grants to at most 8 messages.
    Homa,
    /// RAMCloud's BasicTransport (the simulator's `basic`): every incoming
    /// message granted as its packets arrive (`GrantPolicy::EveryMessage`,
    /// 5 full packets per grant), overcommitment 1, senders pure SRPT.
    Basic,
}

impl std::str::FromStr for Variant {
    type Err = Error;
    fn from_str(s: &str) -> Result<Variant> {
        match s {
            "homa" => Ok(Variant::Homa),
            "basic" => Ok(Variant::Basic),
            _ => Err(Error::config(format!(
                "--variant {s:?}: expected homa or basic"
            ))),
        }
    }
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Homa => "homa",
            Variant::Basic => "basic",
        }
    }

    /// The variant's engine settings, as the simulator's `engine_config`
    /// sets them (`crates/homa-sim/src/sim.rs`).
    pub fn apply(self, e: &mut homa::EngineConfig) {
        match self {
            Variant::Homa => e.max_overcommit = 8,
            Variant::Basic => {
                e.grant_policy = GrantPolicy::EveryMessage {
                    increment_bytes: 5 * e.max_data_per_packet() as u32,
                };
                e.pacer_fifo_permille = 0;
                e.max_overcommit = 1;
            }
        }
    }
}

/// Everything an On-Ramp testbed run needs.
#[derive(Clone, Debug)]
pub struct OnRampConfig {
    /// The background, as the cluster benchmark runs it (workload, load,
    /// recorded seconds, warm-up, seed, engine overrides); its `testbed`
    /// gives the prefix, hosts, link rate and queue length.
    pub bench: ClusterConfig,
    pub senders: usize,
    pub message_size: u32,
    /// Switch priority classes and engine levels: 8, or 1 (no priorities).
    pub priorities: u8,
    pub onramp: bool,
    pub variant: Variant,
    /// Every endpoint's clock is offset by a value drawn uniformly from
    /// `0..=2 × clock_offset_ns` (so up to `2 × clock_offset_ns` apart,
    /// ±`clock_offset_ns` around the middle, as the simulator's
    /// `ClockSpread`) and runs `clock_drift_ppm` fast or slow.
    pub clock_offset_ns: u64,
    pub clock_drift_ppm: f64,
    /// Idle time between a round's end and the next round.
    pub gap: Duration,
}

impl OnRampConfig {
    /// Defaults of `homa bench onramp`: W4 at 50% on 5 hosts, 0.1 Gbit/s,
    /// 32 packets per class queue, 8 priorities, Homa, On-Ramp off, 10
    /// recorded seconds after 1 s of warm-up.
    pub fn new(senders: usize, message_size: u32) -> OnRampConfig {
        let w = Workload::builtin("w4")
            .expect("w4 is built in")
            .capped(1_000_000);
        let mut bench = ClusterConfig::new(w, 0.5);
        bench.transports = vec![Transport::Homa];
        bench.testbed.prefix = "or".into();
        bench.testbed.hosts = 5;
        bench.testbed.queue_packets = crate::coexist::SHALLOW_QUEUE_PACKETS;
        OnRampConfig {
            bench,
            senders,
            message_size,
            priorities: 8,
            onramp: false,
            variant: Variant::Homa,
            clock_offset_ns: 0,
            clock_drift_ppm: 0.0,
            gap: Duration::from_millis(1),
        }
    }

    pub fn hosts(&self) -> usize {
        self.bench.testbed.hosts
    }

    /// Host and port of incast sender `k`.
    pub fn sender_slot(&self, k: usize) -> (usize, u16) {
        let hosts = self.hosts() - 1;
        (1 + k % hosts, INCAST_PORT + (k / hosts) as u16)
    }

    /// The testbed: the bench's, with `priorities` classes and unshaped
    /// uplinks (every endpoint paces itself; see the module's doc).
    pub fn testbed(&self) -> TestbedConfig {
        TestbedConfig {
            priorities: self.priorities,
            shape_uplinks: false,
            tcp_below: false,
            ..self.bench.testbed.clone()
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.homa_bench().validate()?;
        if self.hosts() < 2 {
            return Err(Error::config("--hosts must be at least 2"));
        }
        if !(1..=256).contains(&self.senders) {
            return Err(Error::config(format!(
                "--senders {} must be 1..=256",
                self.senders
            )));
        }
        if !(1..=8_000_000).contains(&self.message_size) {
            return Err(Error::config(format!(
                "--message-size {} must be 1..=8000000",
                self.message_size
            )));
        }
        if !matches!(self.priorities, 1 | 8) {
            return Err(Error::config(format!(
                "--priorities {} must be 1 or 8",
                self.priorities
            )));
        }
        if self.clock_offset_ns > 3_600_000_000_000
            || !(self.clock_drift_ppm.is_finite() && (0.0..=1000.0).contains(&self.clock_drift_ppm))
        {
            return Err(Error::config(
                "--clock-offset-ns must be at most an hour and --clock-drift-ppm in 0..=1000",
            ));
        }
        Ok(())
    }

    /// The cluster configuration the engine is derived from: `priorities`
    /// levels, messages up to `message_size`, the variant's and On-Ramp's
    /// settings, then the caller's overrides.
    pub fn homa_bench(&self) -> ClusterConfig {
        let mut c = self.bench.clone();
        c.testbed = self.testbed();
        c.transports = vec![Transport::Homa];
        c.engine_levels = Some(self.priorities);
        c.max_message = Some(self.message_size);
        let (variant, onramp, user) = (self.variant, self.onramp, self.bench.adjust_engine.clone());
        c.adjust_engine = Some(Arc::new(move |e: &mut homa::EngineConfig| {
            variant.apply(e);
            e.onramp = onramp;
            if let Some(f) = &user {
                f(e);
            }
        }));
        c
    }

    /// The clock of every endpoint: the H background endpoints, then the
    /// senders. Drawn from the seed (a generator of its own).
    pub fn clocks(&self) -> Vec<ClockSkew> {
        let n = self.hosts() + self.senders;
        if self.clock_offset_ns == 0 && self.clock_drift_ppm == 0.0 {
            return vec![ClockSkew::default(); n];
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.bench.seed ^ 0xC10C_C10C);
        (0..n)
            .map(|_| {
                let offset_ns = rng.gen_range(0..=2 * self.clock_offset_ns);
                let sign = if rng.gen::<bool>() { 1.0 } else { -1.0 };
                ClockSkew {
                    offset_ns,
                    drift_ppb: (sign * self.clock_drift_ppm * 1e3).round() as i64,
                }
            })
            .collect()
    }

    /// The shortest possible round: every sender's wire bytes back to back
    /// through the receiver's downlink, µs (the unloaded latency of one
    /// packet comes on top; [`OnRampReport::incast_rct_ideal_us`]).
    pub fn wire_time_us(&self, payload_per_packet: usize) -> f64 {
        let s = self.message_size as u64;
        let per = payload_per_packet.max(1) as u64;
        let packets = s.div_ceil(per).max(1);
        let overhead = homa_proto::wire::DATA_PACKET_OVERHEAD as u64 + FRAME_OVERHEAD;
        let bytes = (s + packets * overhead) * self.senders as u64;
        bytes as f64 * 8.0 / self.bench.testbed.rate_bps() as f64 * 1e6
    }
}

/// The result of one run: the simulator experiment's fields first, then
/// what the testbed adds (CPU, engine counters, the full background result).
#[derive(Clone, Debug, Serialize)]
pub struct OnRampReport {
    pub experiment: &'static str,
    pub variant: String,
    pub priorities: u8,
    pub onramp: bool,
    pub senders: usize,
    pub message_size: u32,
    /// `WORKLOAD:LOAD`.
    pub background: String,
    pub clock_offset_ns: u64,
    pub clock_drift_ppm: f64,
    /// p99 (nearest rank: the largest of fewer than 100 rounds) of the
    /// measured rounds' completion times, µs.
    pub incast_rct_p99_us: f64,
    pub incast_rct_p50_us: f64,
    pub incast_rct_mean_us: f64,
    /// Every message's wire bytes back to back through the receiver's
    /// downlink, plus one unloaded one-packet RPC.
    pub incast_rct_ideal_us: f64,
    pub incast_rounds: usize,
    /// Every measured round's completion time (µs), in order.
    pub incast_rct_us: Vec<f64>,
    /// The round in progress when the window ended did not finish in it
    /// (not measured).
    pub incast_unfinished_round: bool,
    /// How long issuing a round's requests took, p50 and max over rounds,
    /// µs (one thread calls every sender endpoint in turn).
    pub incast_issue_p50_us: f64,
    pub incast_issue_max_us: f64,
    /// Incast requests that failed or whose length was wrong.
    pub incast_errors: Vec<String>,
    /// Background RPCs by size decile: slowdown of the echo RTT.
    pub background_deciles: Vec<Group>,
    pub background_messages: usize,
    pub background_unfinished: u64,
    pub background_failed: u64,
    /// Packets dropped by the switch queues (all downlinks) in the window.
    pub drops: u64,
    /// ... of which at the receiver's downlink.
    pub receiver_drops: u64,
    /// Drops of all downlinks by priority class (index = class).
    pub drops_by_class: Vec<u64>,
    /// On-Ramp's holds over the whole run, all endpoints: how many, their
    /// total and mean length, the longest allowed, messages parked.
    pub holds: u64,
    pub held_ns: u64,
    pub mean_hold_us: f64,
    pub max_hold_bound_ns: u64,
    pub threshold_ns: u64,
    pub open_permille: u32,
    pub fresh_reports: bool,
    pub parked: u64,
    /// Holds of receivers' grants (`Config::onramp_hold_grants`,
    /// docs/onramp.md §2.1), their mean length (µs), and whether they were
    /// on.
    pub hold_grants: bool,
    pub grant_holds: u64,
    pub mean_grant_hold_us: f64,
    pub retransmitted_packets: u64,
    pub resends_sent: u64,
    /// Testbed layout.
    pub hosts: usize,
    pub sender_hosts: usize,
    pub gbps: f64,
    pub queue_packets: u32,
    pub seconds: f64,
    pub warmup: f64,
    pub seed: u64,
    pub gap_us: f64,
    pub engine: EngineSummary,
    /// 1-, 5- and 15-minute load averages at the start (a shared machine).
    pub load_avg: Option<[f64; 3]>,
    /// The machine's CPU use with the testbed idle (other tenants).
    pub background_cpu: CpuUsage,
    /// CPU use during the recorded window.
    pub cpu: CpuUsage,
    /// The machine's CPUs were at least 90% busy in the window: a
    /// CPU-bound result, not a network one.
    pub cpu_saturated: bool,
    /// How long the process stood still (stopped or starved) in the
    /// window, ms: above a few hundred the run is disturbed.
    pub stalled_ms: f64,
    pub unloaded: Vec<UnloadedRow>,
    /// Every engine counter summed over all endpoints (nonzero ones).
    pub engine_counters: BTreeMap<String, u64>,
    /// The background's full result (as the cluster benchmark reports it).
    pub background_result: TransportResult,
    pub notes: Vec<String>,
}

impl OnRampReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }

    /// A short plain-text summary.
    pub fn text(&self) -> String {
        let d: Vec<String> = self
            .background_deciles
            .iter()
            .map(|g| format!("{:.1}", g.p99_slowdown))
            .collect();
        let mut s = format!(
            "onramp testbed {} p{} onramp={} {} x {} B over {}{}: incast RCT p99 {:.0} us (p50 {:.0}, ideal {:.0}, {} rounds{}), background p99 slowdown by decile [{}], drops {} ({} at the receiver), holds {} (mean {:.1} us), CPU {:.0}%{}\n",
            self.variant,
            self.priorities,
            if self.onramp { "on" } else { "off" },
            self.senders,
            self.message_size,
            self.background,
            if self.clock_offset_ns > 0 || self.clock_drift_ppm > 0.0 {
                format!(
                    ", clocks ±{} ns, {} ppm",
                    self.clock_offset_ns, self.clock_drift_ppm
                )
            } else {
                String::new()
            },
            self.incast_rct_p99_us,
            self.incast_rct_p50_us,
            self.incast_rct_ideal_us,
            self.incast_rounds,
            if self.incast_unfinished_round {
                ", one unfinished"
            } else {
                ""
            },
            d.join(" "),
            self.drops,
            self.receiver_drops,
            self.holds,
            self.mean_hold_us,
            self.cpu.machine_percent,
            if self.cpu_saturated { " (CPU-bound)" } else { "" }
        );
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

/// Runs the experiment; the testbed is removed at the end unless the
/// bench's `keep_testbed` (also when the run fails).
pub fn run(cfg: &OnRampConfig) -> Result<OnRampReport> {
    cfg.validate()?;
    let tb = Testbed::up(&cfg.testbed())?;
    let guard = (!cfg.bench.keep_testbed).then(|| tb.clone().guard());
    let r = run_on(&tb, cfg);
    drop(guard);
    r
}

/// What the receiver's server saw of one incast request.
struct Arrival {
    at: Instant,
    len: usize,
}

/// Host 0's server: echoes background requests and answers incast
/// requests (from the senders' addresses) with an empty response, telling
/// the coordinator when each arrived.
struct Receiver {
    ep: Endpoint,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start(
        ep: Endpoint,
        threads: usize,
        incast: Arc<HashSet<SocketAddr>>,
        tx: mpsc::Sender<Arrival>,
    ) -> Result<Receiver> {
        let mut v = Vec::new();
        for t in 0..threads.max(1) {
            let (ep, incast, tx) = (ep.clone(), incast.clone(), tx.clone());
            v.push(
                std::thread::Builder::new()
                    .name(format!("onramp-rx-{t}"))
                    .spawn(move || {
                        let _ = ep.serve(|req| {
                            if incast.contains(&req.peer()) {
                                let at = Instant::now();
                                let len = req.message().len();
                                let _ = tx.send(Arrival { at, len });
                                let _ = req.reply(Bytes::new());
                            } else {
                                let (m, r) = req.into_parts();
                                let _ = r.reply(m.into_bytes());
                            }
                        });
                    })?,
            );
        }
        Ok(Receiver { ep, threads: v })
    }
}

/// Also on an early return (a bind that failed): no serving thread outlives
/// the run.
impl Drop for Receiver {
    fn drop(&mut self) {
        self.ep.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The incast senders' endpoints, shut down when dropped (also on an early
/// return).
struct Senders(Vec<Endpoint>);

impl Drop for Senders {
    fn drop(&mut self) {
        for ep in &self.0 {
            ep.shutdown();
        }
    }
}

/// Measures how long this process stood still: a thread that sleeps 20 ms
/// at a time and adds up every oversleep beyond 100 ms (a SIGSTOP, or a
/// machine so busy that nothing of ours ran).
struct StallWatch {
    stop: Arc<AtomicBool>,
    stalled_us: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StallWatch {
    fn start() -> StallWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let stalled_us = Arc::new(AtomicU64::new(0));
        let (s, st) = (stop.clone(), stalled_us.clone());
        let thread = std::thread::Builder::new()
            .name("onramp-stall".into())
            .spawn(move || {
                let tick = Duration::from_millis(20);
                while !s.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    std::thread::sleep(tick);
                    let over = t.elapsed().saturating_sub(tick);
                    if over > Duration::from_millis(100) {
                        st.fetch_add(over.as_micros() as u64, Ordering::Relaxed);
                    }
                }
            })
            .ok();
        StallWatch {
            stop,
            stalled_us,
            thread,
        }
    }

    /// Stalls so far, ms.
    fn stalled_ms(&self) -> f64 {
        self.stalled_us.load(Ordering::Relaxed) as f64 / 1e3
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The incast rounds of one run.
#[derive(Default)]
struct Rounds {
    rct_ns: Vec<u64>,
    /// Per round: from the first request issued to the last.
    issue_ns: Vec<u64>,
    unfinished: bool,
    errors: Vec<String>,
}

/// Runs the experiment on a testbed that is up with [`OnRampConfig::testbed`].
pub fn run_on(tb: &Testbed, cfg: &OnRampConfig) -> Result<OnRampReport> {
    cfg.validate()?;
    let bench = cfg.homa_bench();
    let h = cfg.hosts();
    let payloads = Payloads::new(bench.workload.max_len() as usize);
    let mut notes = Vec::new();

    let load_avg = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| homa_bench::machine::parse_loadavg(&t));
    let background_cpu = CpuSample::background(Duration::from_millis(500));

    let Calibration {
        rtt_ns,
        homa_cfg,
        plan,
        baseline,
        unloaded,
    } = cluster::calibrate(tb, &bench, &payloads)?;
    let clocks = cfg.clocks();
    let host_cfg = |i: usize| -> homa::EndpointConfig {
        EndpointBuilder::from(homa_cfg.clone())
            .clock_skew(clocks[i])
            .build()
    };

    // Host 0: the receiver; hosts 1..H: background echo servers.
    let bg_addrs: Vec<SocketAddr> = (0..h)
        .map(|j| cluster::server_addrs(j, Transport::Homa, 1)[0])
        .collect();
    let incast_addrs: Vec<SocketAddr> = (0..cfg.senders)
        .map(|k| {
            let (host, port) = cfg.sender_slot(k);
            SocketAddr::new(IpAddr::V4(host_addr(host)), port)
        })
        .collect();
    let incast_set = Arc::new(incast_addrs.iter().copied().collect::<HashSet<_>>());
    let (tx, rx) = mpsc::channel::<Arrival>();
    let rx_ep = {
        let (addr, c) = (bg_addrs[0], host_cfg(0));
        run_in(&tb.ns(0), move || Ok(bind_server(addr, &c)?))?
    };
    let receiver = Receiver::start(rx_ep.clone(), bench.server_threads, incast_set, tx)?;
    let mut servers = Servers(Vec::new());
    for (i, addr) in bg_addrs.iter().enumerate().skip(1) {
        let spec = ServerSpec {
            transport: Transport::Homa,
            ip: IpAddr::V4(host_addr(i)),
            base_port: addr.port(),
            ports: 1,
            threads_per_port: bench.server_threads,
            homa: host_cfg(i),
            max_message: bench.workload.max_len() as usize,
        };
        servers
            .0
            .push(run_in(&tb.ns(i), move || Ok(start_server(&spec)?))?);
    }
    let mut bg_eps = vec![rx_ep.clone()];
    bg_eps.extend(servers.0.iter().filter_map(|s| s.homa_endpoint.clone()));
    let mut senders = Senders(Vec::new());
    for (k, addr) in incast_addrs.iter().enumerate() {
        let (host, _) = cfg.sender_slot(k);
        let (addr, c) = (*addr, host_cfg(h + k));
        senders
            .0
            .push(run_in(&tb.ns(host), move || Ok(bind_server(addr, &c)?))?);
    }

    let r = run_phase(
        tb, cfg, &bench, &homa_cfg, &payloads, &bg_eps, &bg_addrs, &senders.0, &rx,
    );
    // Every endpoint's counters, then everything down.
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for ep in bg_eps.iter().chain(&senders.0) {
        for (k, v) in ep.metrics().iter() {
            *counters.entry(k).or_insert(0) += v;
        }
    }
    drop(senders);
    drop(bg_eps);
    drop(receiver);
    servers.stop()?;
    let (rounds, total, cpu, net, stalled_ms) = r?;
    counters.retain(|_, v| *v != 0);

    let mut bg = cluster::summarize(
        Transport::Homa,
        &bench,
        h,
        total,
        cpu.clone(),
        &net,
        &baseline,
    );
    let c = |k: &str| counters.get(k).copied().unwrap_or(0);
    bg.homa_resends = c("resends_sent");
    bg.homa_retransmitted_packets = c("retransmitted_packets");
    bg.homa_engine_counters = counters.clone();

    let mut issue: Vec<f64> = rounds.issue_ns.iter().map(|&n| n as f64 / 1e3).collect();
    issue.sort_by(f64::total_cmp);
    let mut rct: Vec<f64> = rounds.rct_ns.iter().map(|&n| n as f64 / 1e3).collect();
    let rct_in_order = rct.clone();
    rct.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if rct.is_empty() {
            0.0
        } else {
            percentile(&rct, p)
        }
    };
    let ideal = cfg.wire_time_us(homa_cfg.engine.max_data_per_packet())
        + unloaded.first().map_or(0.0, |u| u.best_us);
    let holds = c("onramp_holds");
    let held_ns = c("onramp_held_ns");
    let e = &homa_cfg.engine;
    let mut drops_by_class = Vec::new();
    for p in &net.downlinks {
        for cl in &p.classes {
            let k = cl.class.unwrap_or(0) as usize;
            if drops_by_class.len() <= k {
                drops_by_class.resize(k + 1, 0);
            }
            drops_by_class[k] += cl.drops;
        }
    }
    if bg.cpu_saturated {
        notes.push(format!(
            "the machine's CPUs were {:.0}% busy during the run: CPU-bound, not a network result",
            bg.cpu.machine_percent
        ));
    }
    if stalled_ms > 200.0 {
        notes.push(format!(
            "the process stood still for {stalled_ms:.0} ms in the window (stopped or starved): a disturbed run, rerun it"
        ));
    }
    if background_cpu.machine_percent > 20.0 {
        notes.push(format!(
            "the machine was already {:.0}% busy with the testbed idle (other processes)",
            background_cpu.machine_percent
        ));
    }
    if rounds.rct_ns.is_empty() {
        notes.push("no incast round finished in the window: lengthen --seconds".into());
    }
    if bg.failed > 0 || bg.unfinished > 0 {
        notes.push(format!(
            "background: {} RPCs failed and {} did not finish in time (not in the statistics)",
            bg.failed, bg.unfinished
        ));
    }
    Ok(OnRampReport {
        experiment: "onramp",
        variant: cfg.variant.name().into(),
        priorities: cfg.priorities,
        onramp: cfg.onramp,
        senders: cfg.senders,
        message_size: cfg.message_size,
        background: format!("{}:{}", bench.workload.name, bench.load),
        clock_offset_ns: cfg.clock_offset_ns,
        clock_drift_ppm: cfg.clock_drift_ppm,
        incast_rct_p99_us: pct(99.0),
        incast_rct_p50_us: pct(50.0),
        incast_rct_mean_us: if rct.is_empty() {
            0.0
        } else {
            rct.iter().sum::<f64>() / rct.len() as f64
        },
        incast_rct_ideal_us: ideal,
        incast_rounds: rct.len(),
        incast_rct_us: rct_in_order,
        incast_unfinished_round: rounds.unfinished,
        incast_issue_p50_us: issue.first().map_or(0.0, |_| percentile(&issue, 50.0)),
        incast_issue_max_us: issue.last().copied().unwrap_or(0.0),
        incast_errors: rounds.errors,
        background_deciles: bg.deciles.clone(),
        background_messages: bg.rpcs,
        background_unfinished: bg.unfinished,
        background_failed: bg.failed,
        drops: net.drops(),
        receiver_drops: net.downlinks.first().map_or(0, |p| p.drops()),
        drops_by_class,
        holds,
        held_ns,
        mean_hold_us: homa_proto::mean_hold_us(held_ns, holds),
        max_hold_bound_ns: e.effective_onramp_max_hold_ns(),
        threshold_ns: e.effective_onramp_threshold_ns(),
        open_permille: e.effective_onramp_open_permille(),
        fresh_reports: e.onramp_fresh_reports,
        parked: c("onramp_parked"),
        hold_grants: e.onramp_hold_grants,
        grant_holds: c("onramp_grant_holds"),
        mean_grant_hold_us: homa_proto::mean_hold_us(
            c("onramp_grants_held_ns"),
            c("onramp_grant_holds"),
        ),
        retransmitted_packets: c("retransmitted_packets"),
        resends_sent: c("resends_sent"),
        hosts: h,
        sender_hosts: (h - 1).min(cfg.senders),
        gbps: bench.testbed.gbps,
        queue_packets: bench.testbed.queue_packets,
        seconds: bench.seconds,
        warmup: bench.warmup,
        seed: bench.seed,
        gap_us: cfg.gap.as_secs_f64() * 1e6,
        engine: EngineSummary {
            rtt_us: rtt_ns as f64 / 1e3,
            rtt_bytes: e.rtt_bytes(),
            poll_us: bench.poll_us,
            priority_plan: plan.describe(),
        },
        load_avg,
        background_cpu,
        cpu_saturated: bg.cpu_saturated,
        cpu,
        stalled_ms,
        unloaded,
        engine_counters: counters,
        background_result: bg,
        notes,
    })
}

type PhaseOut = (
    Rounds,
    ClientResult,
    CpuUsage,
    crate::testbed::Snapshot,
    f64,
);

/// The background clients on every host and the incast rounds from this
/// thread, over the warm-up, the window and the drain.
#[allow(clippy::too_many_arguments)]
fn run_phase(
    tb: &Testbed,
    cfg: &OnRampConfig,
    bench: &ClusterConfig,
    homa_cfg: &homa::EndpointConfig,
    payloads: &Payloads,
    bg_eps: &[Endpoint],
    bg_addrs: &[SocketAddr],
    senders: &[Endpoint],
    rx: &mpsc::Receiver<Arrival>,
) -> Result<PhaseOut> {
    let h = cfg.hosts();
    let warmup = Duration::from_secs_f64(bench.warmup);
    let window = Duration::from_secs_f64(bench.seconds);
    let drain = Duration::from_secs_f64((bench.seconds / 3.0).clamp(1.0, 3.0));
    let workload = Arc::new(bench.workload.clone());
    let progress = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for (i, ep) in bg_eps.iter().enumerate() {
        let spec = ClientSpec {
            transport: Transport::Homa,
            ip: IpAddr::V4(host_addr(i)),
            servers: (0..h)
                .filter(|&j| j != i)
                .map(|j| vec![bg_addrs[j]])
                .collect(),
            workload: workload.clone(),
            gbps: bench.load * bench.testbed.gbps,
            max_outstanding: bench.max_outstanding,
            ports: 1,
            warmup,
            duration: window,
            drain,
            seed: bench
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add(i as u64 + 1),
            homa: homa_cfg.clone(),
            homa_endpoint: Some(ep.clone()),
            tcp_conns: 1,
            tcp_max_conns: 1,
            payloads: payloads.clone(),
            progress: Some(progress.clone()),
        };
        clients.push(spawn_in(&tb.ns(i), format!("bg-client-h{i}"), move || {
            Ok(run_client(&spec)?)
        })?);
    }
    let start = Instant::now();
    let window_start = start + warmup;
    let window_end = window_start + window;
    let mut bar = Bar::new(
        &format!(
            "{} p{} onramp {}",
            cfg.variant.name(),
            cfg.priorities,
            if cfg.onramp { "on" } else { "off" }
        ),
        warmup + window,
        bench.progress,
    );
    std::thread::sleep(warmup);
    let cpu0 = CpuSample::now();
    let snap0 = tb.snapshot()?;
    let watch = StallWatch::start();
    let receiver = bg_addrs[0];
    let payload = payloads_for_incast(cfg.message_size);
    let mut rounds = Rounds::default();
    let mut cpu1 = None;
    let mut snap1 = None;
    while Instant::now() < window_end {
        let t0 = Instant::now();
        let mut pending = Vec::with_capacity(senders.len());
        for ep in senders {
            match ep.send_request(receiver, payload.clone()) {
                Ok(p) => pending.push(p),
                Err(e) => rounds
                    .errors
                    .push(format!("incast from {}: {e}", ep.local_addr())),
            }
        }
        rounds.issue_ns.push(t0.elapsed().as_nanos() as u64);
        // Every request at the receiver, or the drain's end.
        let deadline = window_end + drain;
        let mut got = 0;
        let mut last = t0;
        while got < pending.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(a) => {
                    got += 1;
                    last = last.max(a.at);
                    if a.len != cfg.message_size as usize {
                        rounds.errors.push(format!(
                            "incast request of {} bytes instead of {}",
                            a.len, cfg.message_size
                        ));
                    }
                }
                Err(_) if Instant::now() < deadline => continue,
                Err(_) => break,
            }
        }
        let complete = got == pending.len() && !pending.is_empty();
        if complete && last <= window_end {
            rounds
                .rct_ns
                .push(last.duration_since(t0).as_nanos() as u64);
            bar.update(&format!(
                "{} rounds, last {:.1} ms",
                rounds.rct_ns.len(),
                last.duration_since(t0).as_secs_f64() * 1e3
            ));
        } else {
            rounds.unfinished = true;
        }
        if cpu1.is_none() && Instant::now() >= window_end {
            cpu1 = Some(CpuSample::now());
            snap1 = Some(tb.snapshot()?);
        }
        // The empty responses.
        for p in pending {
            if let Err(e) = p.wait_timeout(Duration::from_secs(2)) {
                rounds.errors.push(format!("incast response: {e}"));
            }
        }
        if !complete {
            break;
        }
        std::thread::sleep(cfg.gap);
    }
    let stalled_ms = watch.stalled_ms();
    watch.stop();
    let cpu1 = cpu1.unwrap_or_else(CpuSample::now);
    let snap1 = match snap1 {
        Some(s) => s,
        None => tb.snapshot()?,
    };
    let mut total = ClientResult::default();
    let mut first_err = None;
    for c in clients {
        match c.join() {
            Ok(Ok(r)) => total.merge(r),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(Error::bench("client thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    bar.finish(&format!(
        "{} rounds, {} background RPCs",
        rounds.rct_ns.len(),
        total.completed
    ));
    Ok((
        rounds,
        total,
        cpu0.usage_until(&cpu1),
        snap1.delta(&snap0),
        stalled_ms,
    ))
}

/// One incast message's payload (the same bytes every round).
fn payloads_for_incast(len: u32) -> Bytes {
    Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders_spread_over_the_hosts_after_the_receiver() {
        let c = OnRampConfig::new(32, 64_000);
        assert_eq!(c.hosts(), 5);
        assert_eq!(c.sender_slot(0), (1, INCAST_PORT));
        assert_eq!(c.sender_slot(3), (4, INCAST_PORT));
        assert_eq!(c.sender_slot(4), (1, INCAST_PORT + 1));
        assert_eq!(c.sender_slot(31), (4, INCAST_PORT + 7));
        let slots: HashSet<_> = (0..64).map(|k| c.sender_slot(k)).collect();
        assert_eq!(slots.len(), 64);
        assert!(slots.iter().all(|&(h, _)| (1..5).contains(&h)));
        let t = c.testbed();
        assert_eq!(
            (t.priorities, t.shape_uplinks, t.queue_packets),
            (8, false, 32)
        );
        assert!(c.validate().is_ok());
    }

    #[test]
    fn the_engine_gets_levels_variant_onramp_and_overrides() {
        let mut c = OnRampConfig::new(32, 500_000);
        c.priorities = 1;
        c.onramp = true;
        c.variant = Variant::Basic;
        c.bench.adjust_engine = Some(Arc::new(|e: &mut homa::EngineConfig| {
            e.onramp_open_permille = Some(250);
        }));
        let b = c.homa_bench();
        let (hc, plan) = cluster::homa_config(&b, 300_000);
        let e = &hc.engine;
        assert_eq!(e.priority_levels, 1);
        assert_eq!(plan.levels, 1);
        assert!(e.onramp);
        assert_eq!(
            e.onramp_open_permille,
            Some(250),
            "the caller's overrides come last"
        );
        assert!(matches!(e.grant_policy, GrantPolicy::EveryMessage { .. }));
        assert_eq!((e.max_overcommit, e.pacer_fifo_permille), (1, 0));
        assert!(e.max_message_length >= 1_000_000);
        assert_eq!(b.testbed.priorities, 1);
        c.priorities = 8;
        c.variant = Variant::Homa;
        c.onramp = false;
        let (hc, _) = cluster::homa_config(&c.homa_bench(), 300_000);
        assert_eq!(hc.engine.priority_levels, 8);
        assert_eq!(hc.engine.max_overcommit, 8);
        assert!(!hc.engine.onramp);
        assert_eq!(
            hc.engine.grant_policy,
            homa::EngineConfig::default().grant_policy
        );
        c.priorities = 4;
        assert!(c.validate().is_err());
        assert!("cubic".parse::<Variant>().is_err());
        assert_eq!("basic".parse::<Variant>().unwrap(), Variant::Basic);
    }

    #[test]
    fn clocks_are_shared_or_spread_within_the_bounds() {
        let mut c = OnRampConfig::new(8, 10_000);
        assert!(c.clocks().iter().all(|k| *k == ClockSkew::default()));
        assert_eq!(c.clocks().len(), 5 + 8);
        c.clock_offset_ns = 1_000_000_000;
        c.clock_drift_ppm = 50.0;
        let k = c.clocks();
        assert!(k.iter().all(|k| k.offset_ns <= 2_000_000_000));
        assert!(k.iter().all(|k| k.drift_ppb.abs() == 50_000));
        assert!(k.iter().any(|k| k.drift_ppb > 0) && k.iter().any(|k| k.drift_ppb < 0));
        let spread = k.iter().map(|k| k.offset_ns).max().unwrap()
            - k.iter().map(|k| k.offset_ns).min().unwrap();
        assert!(spread > 500_000_000, "{spread}");
        assert_eq!(c.clocks(), k, "drawn from the seed");
    }

    #[test]
    fn the_ideal_round_is_the_wire_time_of_every_message() {
        let mut c = OnRampConfig::new(32, 64_000);
        c.bench.testbed.gbps = 0.1;
        // 64,000 B in 1,400-byte packets: 46 packets.
        let per = 1_400;
        let bytes =
            32.0 * (64_000.0 + 46.0 * (homa_proto::wire::DATA_PACKET_OVERHEAD as f64 + 42.0));
        let want = bytes * 8.0 / 1e8 * 1e6;
        assert!((c.wire_time_us(per) - want).abs() < 1e-6);
    }
}
