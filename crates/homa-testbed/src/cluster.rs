//! The cluster benchmark: bring the testbed up, measure unloaded RTTs per
//! size, then run every transport at the target load (one after another, on
//! the same testbed), and turn the samples into a [`ClusterReport`].
//!
//! Load: every host runs a client and a server. A client's target rate is
//! `load × link rate` of request + response payload; since requests go to
//! the other hosts uniformly and responses come back, each host's downlink
//! then carries `load × link rate` of payload on average (plus headers,
//! which the report's measured link utilization includes).

use crate::cpu::{CpuSample, CpuUsage};
use crate::netns::{run_in, spawn_in};
use crate::progress::Bar;
use crate::report::{ClusterReport, EngineSummary, TransportResult, UnloadedRow};
use crate::testbed::{host_addr, Testbed, TestbedConfig};
use crate::{Error, Result};
use homa_bench::node::probe::{probe, probe_sizes, Baseline, ProbePoint, ProbeSpec};
use homa_bench::node::{
    run_client, start_server, ClientResult, ClientSpec, ServerHandle, ServerSpec, Transport,
};
use homa_bench::payload::Payloads;
use homa_proto::priorities::PriorityPlan;
use homa_workload::stats::{Completion, SlowdownTable};
use homa_workload::workload::Workload;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything a cluster run needs.
#[derive(Clone)]
pub struct ClusterConfig {
    pub testbed: TestbedConfig,
    pub workload: Workload,
    /// Target load, a fraction of the link rate (0 < load <= 1).
    pub load: f64,
    pub transports: Vec<Transport>,
    /// Recorded window per transport.
    pub seconds: f64,
    /// Unrecorded start of each transport's run.
    pub warmup: f64,
    /// Client threads (sockets) per host.
    pub client_ports: usize,
    /// Server ports per host.
    pub server_ports: usize,
    /// Threads per Homa server port.
    pub server_threads: usize,
    /// Cap on outstanding RPCs per client port.
    pub max_outstanding: usize,
    /// TCP connections from each client port to each server at start...
    pub tcp_conns: usize,
    /// ...and at most (more are opened while all are busy).
    pub tcp_max_conns: usize,
    pub seed: u64,
    /// Homa busy-poll time before sleeping, µs.
    pub poll_us: u64,
    /// The engine's RTT estimate, µs; `None` measures it (RTT of a
    /// one-packet echo on the testbed).
    pub rtt_us: Option<u64>,
    /// Leave the testbed up afterwards.
    pub keep_testbed: bool,
    pub progress: bool,
    /// Let the Homa runtime batch packets with UDP GSO (off by default: see
    /// [`homa_config`]).
    pub homa_gso: bool,
    /// Last word on the Homa engine's parameters (e.g. the CLI's `--set`),
    /// applied after the engine derived them.
    pub adjust_engine: Option<EngineHook>,
    /// Priority levels the engine uses and derives its plan for (`None`:
    /// the engine's default, 8, whatever the testbed's classes are).
    pub engine_levels: Option<u8>,
    /// A message longer than the workload's that the engine must accept
    /// (the On-Ramp experiment's incast messages; `None`: the workload's).
    pub max_message: Option<u32>,
}

/// A change to the engine configuration.
pub type EngineHook = Arc<dyn Fn(&mut homa::EngineConfig) + Send + Sync>;

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("testbed", &self.testbed)
            .field("workload", &self.workload.name)
            .field("load", &self.load)
            .field("transports", &self.transports)
            .field("seconds", &self.seconds)
            .finish_non_exhaustive()
    }
}

impl ClusterConfig {
    /// Defaults of `homa bench cluster` for a workload and load.
    pub fn new(workload: Workload, load: f64) -> ClusterConfig {
        ClusterConfig {
            testbed: TestbedConfig::default(),
            workload,
            load,
            transports: vec![Transport::Homa, Transport::Tcp, Transport::HomaNoprio],
            seconds: 10.0,
            warmup: 1.0,
            client_ports: 1,
            server_ports: 2,
            server_threads: 2,
            max_outstanding: 200,
            tcp_conns: 4,
            tcp_max_conns: 64,
            seed: 1,
            poll_us: 0,
            rtt_us: None,
            keep_testbed: false,
            progress: true,
            homa_gso: false,
            adjust_engine: None,
            engine_levels: None,
            max_message: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.testbed.validate()?;
        if !(self.load > 0.0 && self.load <= 1.0) {
            return Err(Error::config(format!(
                "--load {} must be in (0, 1]",
                self.load
            )));
        }
        if !(self.seconds > 0.0 && self.seconds <= 3600.0 && (0.0..=60.0).contains(&self.warmup)) {
            return Err(Error::config(
                "seconds must be in (0, 3600], warm-up in [0, 60]",
            ));
        }
        if self.transports.is_empty() {
            return Err(Error::config("no transports"));
        }
        if self.client_ports == 0
            || self.server_ports == 0
            || self.server_threads == 0
            || self.max_outstanding == 0
            || self.tcp_conns == 0
        {
            return Err(Error::config(
                "ports, threads, caps and connections must be positive",
            ));
        }
        Ok(())
    }

    fn rate_bps(&self) -> u64 {
        self.testbed.rate_bps()
    }
}

/// UDP payload / frame bytes of a full Homa packet (1472 / 1514).
const PAYLOAD_SHARE: f64 = 1472.0 / 1514.0;

/// Base port of a transport's servers (each phase has its own, so a socket
/// lingering from the previous phase never collides).
pub(crate) fn base_port(t: Transport) -> u16 {
    match t {
        Transport::Homa => 4000,
        Transport::HomaNoprio => 4100,
        Transport::Tcp => 5000,
    }
}

/// The Homa endpoint configuration for this testbed: the runtime's defaults
/// with the engine's parameters derived (`Config::apply_network`) from the
/// link rate, the RTT, the workload and the NIC queue a user-space thread
/// needs; then the CLI's `--set` overrides.
pub fn homa_config(cfg: &ClusterConfig, rtt_ns: u64) -> (homa::EndpointConfig, PriorityPlan) {
    let mut c = homa::Endpoint::builder()
        .poll(Duration::from_micros(cfg.poll_us))
        // A UDP GSO batch reaches the NIC queue as one unit of up to 64 KB,
        // which a higher-priority packet cannot overtake; without GSO every
        // packet is queued on its own, as on a real NIC.
        .gso(cfg.homa_gso)
        .build();
    let mut network = homa::NetworkProfile {
        // The engine counts UDP payload bytes; the shaper counts frames (42
        // more bytes: UDP, IP, Ethernet). Pacing to the payload share of a
        // full frame keeps the emulated NIC's queue from growing.
        link_bps: (cfg.rate_bps() as f64 * PAYLOAD_SHARE) as u64,
        rtt_ns: rtt_ns.max(1_000),
        max_message_length: cfg
            .workload
            .max_len()
            .max(cfg.max_message.unwrap_or(0))
            .max(c.engine.max_message_length),
        priority_levels: cfg.engine_levels.unwrap_or(c.engine.priority_levels),
        message_sizes: Some(cfg.workload.message_sizes()),
        // A user-space thread on a shared machine misses packet-time
        // wake-ups by tens of µs; with one packet of NIC queue Homa then
        // cannot carry 80% load (measured: ~60%). Two packets absorb the
        // jitter; the NIC queue has priority classes, so it does not delay
        // short messages' packets.
        nic_queue_packets: 2,
        ..homa::NetworkProfile::default()
    };
    c.engine.apply_network(&network);
    if let Some(f) = &cfg.adjust_engine {
        f(&mut c.engine);
        // An override of the RTT or link rate is a fact about the network:
        // derive again from it, with the other overrides on top.
        if (c.engine.rtt_ns, c.engine.link_bps) != (network.rtt_ns, network.link_bps) {
            network.rtt_ns = c.engine.rtt_ns;
            network.link_bps = c.engine.link_bps;
            c.engine.apply_network(&network);
            f(&mut c.engine);
        }
    }
    let plan = network
        .priority_plan()
        .expect("the profile has message sizes");
    (c, plan)
}

/// The servers of one phase; stopped (and joined) on every path.
pub(crate) struct Servers(pub(crate) Vec<ServerHandle>);

impl Servers {
    pub(crate) fn stop(&mut self) -> Result<()> {
        let mut first = Ok(());
        for h in self.0.drain(..) {
            if let Err(e) = h.stop() {
                if first.is_ok() {
                    first = Err(e.into());
                }
            }
        }
        first
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn start_servers(
    tb: &Testbed,
    t: Transport,
    homa: &homa::EndpointConfig,
    cfg: &ClusterConfig,
    hosts: impl Iterator<Item = usize>,
) -> Result<Servers> {
    let mut s = Servers(Vec::new());
    for i in hosts {
        let spec = ServerSpec {
            transport: t,
            ip: IpAddr::V4(host_addr(i)),
            base_port: base_port(t),
            ports: server_ports(t, cfg),
            threads_per_port: cfg.server_threads,
            homa: homa.clone(),
            max_message: cfg.workload.max_len() as usize,
        };
        s.0.push(run_in(&tb.ns(i), move || Ok(start_server(&spec)?))?);
    }
    Ok(s)
}

/// Homa hosts have one endpoint each (the host's Homa stack: one pacer, one
/// SRPT queue, shared by its server threads and its client); TCP servers
/// have `server_ports` listening ports, each with its own event loop.
fn server_ports(t: Transport, cfg: &ClusterConfig) -> usize {
    if t.is_homa() {
        1
    } else {
        cfg.server_ports
    }
}

pub(crate) fn server_addrs(i: usize, t: Transport, ports: usize) -> Vec<SocketAddr> {
    (0..ports)
        .map(|k| SocketAddr::new(IpAddr::V4(host_addr(i)), base_port(t) + k as u16))
        .collect()
}

/// Unloaded RTTs of `t` from host 0 to host 1 at `sizes`.
pub(crate) fn probe_transport(
    tb: &Testbed,
    t: Transport,
    homa: &homa::EndpointConfig,
    cfg: &ClusterConfig,
    sizes: Vec<u32>,
    payloads: &Payloads,
    budget_per_size: Duration,
) -> Result<Vec<ProbePoint>> {
    let mut servers = start_servers(tb, t, homa, cfg, std::iter::once(1))?;
    let spec = ProbeSpec {
        transport: t,
        ip: IpAddr::V4(host_addr(0)),
        server: server_addrs(1, t, 1)[0],
        sizes,
        max_reps: 200,
        min_reps: 5,
        budget_per_size,
        homa: homa.clone(),
        payloads: payloads.clone(),
    };
    let r = run_in(&tb.ns(0), move || Ok(probe(&spec)?));
    servers.stop()?;
    r
}

/// Runs the whole experiment; the testbed is removed at the end unless
/// `keep_testbed` (also when the run fails).
pub fn run(cfg: &ClusterConfig) -> Result<ClusterReport> {
    cfg.validate()?;
    let tb = Testbed::up(&cfg.testbed)?;
    let guard = (!cfg.keep_testbed).then(|| tb.clone().guard());
    let r = run_on(&tb, cfg);
    drop(guard);
    r
}

/// Runs the experiment on a testbed that is up.
pub fn run_on(tb: &Testbed, cfg: &ClusterConfig) -> Result<ClusterReport> {
    cfg.validate()?;
    let n = tb.hosts();
    let payloads = Payloads::new(cfg.workload.max_len() as usize);
    let mut notes = Vec::new();

    // Background CPU use of the machine (other tenants) with the testbed idle.
    let background = CpuSample::background(Duration::from_millis(500));

    let Calibration {
        rtt_ns,
        homa_cfg,
        plan,
        baseline,
        unloaded,
    } = calibrate(tb, cfg, &payloads)?;

    let workload = Arc::new(cfg.workload.clone());
    let mut results = Vec::new();
    for &t in &cfg.transports {
        let r = run_phase(
            tb,
            n,
            cfg,
            t,
            &homa_cfg,
            &workload,
            &payloads,
            &baseline,
            &mut |_| {},
        )?;
        if r.cpu_saturated {
            notes.push(format!(
                "{t}: the machine's CPUs were {:.0}% busy during the run (this benchmark: {:.0}%): this result is CPU-bound, not a network result",
                r.cpu.machine_percent, r.cpu.process_percent
            ));
        }
        if r.p99_lag_us > 5_000.0 {
            notes.push(format!(
                "{t}: clients sent requests up to {:.1} ms (p99) after their scheduled time: they were short of CPU",
                r.p99_lag_us / 1e3
            ));
        }
        if r.failed > 0 || r.unfinished > 0 {
            notes.push(format!(
                "{t}: {} RPCs failed and {} did not finish in time (not in the statistics)",
                r.failed, r.unfinished
            ));
        }
        results.push(r);
    }
    if background.machine_percent > 20.0 {
        notes.push(format!(
            "the machine was already {:.0}% busy (other processes) with the testbed idle{}; CPU figures include them",
            background.machine_percent,
            background
                .pressure_percent
                .map(|p| format!(", tasks waiting for a CPU {p:.0}% of the time"))
                .unwrap_or_default()
        ));
    }
    Ok(ClusterReport {
        workload: cfg.workload.name.clone(),
        load: cfg.load,
        gbps: cfg.testbed.gbps,
        hosts: n,
        priorities: cfg.testbed.priorities,
        queue_packets: cfg.testbed.queue_packets,
        seconds: cfg.seconds,
        warmup: cfg.warmup,
        client_ports: cfg.client_ports,
        max_outstanding: cfg.max_outstanding,
        tcp_conns: cfg.tcp_conns,
        mean_message: cfg.workload.mean(),
        max_message: cfg.workload.max_len(),
        engine: EngineSummary {
            rtt_us: rtt_ns as f64 / 1e3,
            rtt_bytes: homa_cfg.engine.rtt_bytes(),
            poll_us: cfg.poll_us,
            priority_plan: plan.describe(),
        },
        background_cpu: background,
        unloaded,
        transports: results,
        notes,
    })
}

/// What every phase of a run shares: the engine's RTT and configuration,
/// and the unloaded RTT per size that slowdowns divide by.
pub(crate) struct Calibration {
    pub rtt_ns: u64,
    pub homa_cfg: homa::EndpointConfig,
    pub plan: PriorityPlan,
    pub baseline: Baseline,
    pub unloaded: Vec<UnloadedRow>,
}

/// Measures, on the idle testbed, the engine's RTT (a one-packet Homa echo
/// from host 0 to host 1, unless `cfg.rtt_us` gives it), derives the Homa
/// configuration from it, and probes the unloaded RTT of Homa and TCP at
/// sizes spread over the workload (the lower of the two is the baseline).
pub(crate) fn calibrate(
    tb: &Testbed,
    cfg: &ClusterConfig,
    payloads: &Payloads,
) -> Result<Calibration> {
    // The engine's RTT: a one-packet echo on this testbed.
    let mut bar = Bar::new("calibrate", Duration::from_secs(1), cfg.progress);
    let (probe_cfg, _) = homa_config(cfg, 200_000);
    let rtt_ns = match cfg.rtt_us {
        Some(us) => us * 1000,
        None => {
            let p = probe_transport(
                tb,
                Transport::Homa,
                &probe_cfg,
                cfg,
                vec![1400],
                payloads,
                Duration::from_millis(300),
            )?;
            p[0].p50_ns
        }
    };
    let (homa_cfg, plan) = homa_config(cfg, rtt_ns);
    bar.finish(&format!("engine RTT {:.0} µs", rtt_ns as f64 / 1e3));

    // Unloaded RTT per size, for Homa and TCP (homa-noprio is Homa unloaded).
    let sizes = probe_sizes(&cfg.workload);
    let mut probed: Vec<(Transport, Vec<ProbePoint>)> = Vec::new();
    for t in [Transport::Homa, Transport::Tcp] {
        let budget = Duration::from_millis(150);
        let mut bar = Bar::new(
            &format!("unloaded {t}"),
            budget * sizes.len() as u32,
            cfg.progress,
        );
        bar.update(&format!("{} sizes", sizes.len()));
        let pts = probe_transport(tb, t, &homa_cfg, cfg, sizes.clone(), payloads, budget)?;
        bar.finish(&format!(
            "{} sizes, smallest {:.0} µs",
            pts.len(),
            pts[0].p50_ns as f64 / 1e3
        ));
        probed.push((t, pts));
    }
    let baseline = Baseline::best_of(&probed.iter().map(|p| p.1.as_slice()).collect::<Vec<_>>());
    let unloaded: Vec<UnloadedRow> = sizes
        .iter()
        .map(|&s| UnloadedRow {
            size: s,
            homa_us: probed[0]
                .1
                .iter()
                .find(|p| p.size == s)
                .map(|p| p.p50_ns as f64 / 1e3),
            tcp_us: probed[1]
                .1
                .iter()
                .find(|p| p.size == s)
                .map(|p| p.p50_ns as f64 / 1e3),
            best_us: baseline.rtt_ns(s) as f64 / 1e3,
        })
        .collect();

    Ok(Calibration {
        rtt_ns,
        homa_cfg,
        plan,
        baseline,
        unloaded,
    })
}

/// What a phase shows an observer at each of its ticks (every 50 ms).
pub(crate) struct PhaseTick<'a> {
    /// Since the clients started.
    pub elapsed: Duration,
    /// The hosts' Homa endpoints, by host (empty for TCP).
    pub endpoints: &'a [homa::Endpoint],
}

/// Runs one transport's phase on hosts `0..n` of the testbed (the others,
/// if any, are left to the caller: the coexistence experiment's TCP
/// senders); `on_tick` sees the phase every 50 ms.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_phase(
    tb: &Testbed,
    n: usize,
    cfg: &ClusterConfig,
    t: Transport,
    homa_cfg: &homa::EndpointConfig,
    workload: &Arc<Workload>,
    payloads: &Payloads,
    baseline: &Baseline,
    on_tick: &mut dyn FnMut(&PhaseTick),
) -> Result<TransportResult> {
    let mut servers = start_servers(tb, t, homa_cfg, cfg, 0..n)?;
    let endpoints: Vec<homa::Endpoint> = servers
        .0
        .iter()
        .filter_map(|h| h.homa_endpoint.clone())
        .collect();
    let progress = Arc::new(AtomicU64::new(0));
    let warmup = Duration::from_secs_f64(cfg.warmup);
    let window = Duration::from_secs_f64(cfg.seconds);
    // Long messages in flight at the end get up to 3 s (or a third of the window).
    let drain = Duration::from_secs_f64((cfg.seconds / 3.0).clamp(1.0, 3.0));
    let mut clients = Vec::new();
    for i in 0..n {
        let spec = ClientSpec {
            transport: t,
            ip: IpAddr::V4(host_addr(i)),
            servers: (0..n)
                .filter(|&j| j != i)
                .map(|j| server_addrs(j, t, server_ports(t, cfg)))
                .collect(),
            workload: workload.clone(),
            gbps: cfg.load * cfg.testbed.gbps,
            max_outstanding: cfg.max_outstanding,
            ports: if t.is_homa() { 1 } else { cfg.client_ports },
            warmup,
            duration: window,
            drain,
            // The same arrivals (sizes, times, servers) for every transport.
            seed: cfg.seed.wrapping_mul(1_000_003).wrapping_add(i as u64 + 1),
            homa: homa_cfg.clone(),
            homa_endpoint: servers.0[i].homa_endpoint.clone(),
            tcp_conns: cfg.tcp_conns,
            tcp_max_conns: cfg.tcp_max_conns.max(cfg.tcp_conns),
            payloads: payloads.clone(),
            progress: Some(progress.clone()),
        };
        clients.push(spawn_in(&tb.ns(i), format!("client-h{i}"), move || {
            Ok(run_client(&spec)?)
        })?);
    }
    let start = Instant::now();
    let mut bar = Bar::new(
        &format!("{t} @{:.0}%", cfg.load * 100.0),
        warmup + window,
        cfg.progress,
    );
    let (mut snap0, mut cpu0, mut snap1, mut cpu1) = (None, None, None, None);
    loop {
        let el = start.elapsed();
        if snap0.is_none() && el >= warmup {
            cpu0 = Some(CpuSample::now());
            snap0 = Some(tb.snapshot()?);
        }
        if snap1.is_none() && el >= warmup + window {
            cpu1 = Some(CpuSample::now());
            snap1 = Some(tb.snapshot()?);
        }
        if clients.iter().all(|c| c.is_finished()) {
            break;
        }
        bar.update(&format!("{} RPCs", progress.load(Ordering::Relaxed)));
        on_tick(&PhaseTick {
            elapsed: el,
            endpoints: &endpoints,
        });
        std::thread::sleep(Duration::from_millis(50));
    }
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
    // The Homa engines' loss-recovery counters (cumulative since the phase
    // began: each phase opens fresh endpoints).
    let mut recovery = (0u64, 0u64);
    let mut engine_counters = std::collections::BTreeMap::new();
    for h in &servers.0 {
        if let Some(ep) = &h.homa_endpoint {
            let m = ep.metrics();
            recovery.0 += m.resends_sent;
            recovery.1 += m.retransmitted_packets;
            for (k, v) in m.iter() {
                *engine_counters.entry(k).or_insert(0u64) += v;
            }
        }
    }
    drop(endpoints);
    servers.stop()?;
    if let Some(e) = first_err {
        return Err(e);
    }
    // A run cut short (clients failed early) has no end snapshot.
    let (cpu0, snap0) = (
        cpu0.unwrap_or_else(CpuSample::now),
        snap0.unwrap_or_default(),
    );
    let cpu1 = cpu1.unwrap_or_else(CpuSample::now);
    let snap1 = match snap1 {
        Some(s) => s,
        None => tb.snapshot()?,
    };
    let cpu = cpu0.usage_until(&cpu1);
    let net = snap1.delta(&snap0);
    bar.finish(&format!(
        "{} RPCs, {} failed, CPU {:.0}%",
        total.completed, total.failed, cpu.machine_percent
    ));
    let mut r = summarize(t, cfg, n, total, cpu, &net, baseline);
    r.homa_resends = recovery.0;
    r.homa_retransmitted_packets = recovery.1;
    r.homa_engine_counters = engine_counters;
    Ok(r)
}

/// One RPC as the simulator's statistics see it (the single place that
/// builds its record type: on one switch, every message is "not core").
pub fn completion(size: u32, rtt_ns: u64, unloaded_ns: u64) -> Completion {
    Completion {
        size,
        latency_ns: rtt_ns,
        best_ns: unloaded_ns,
        core: false,
    }
}

pub(crate) fn summarize(
    t: Transport,
    cfg: &ClusterConfig,
    n: usize,
    total: ClientResult,
    cpu: CpuUsage,
    net: &crate::testbed::Snapshot,
    baseline: &Baseline,
) -> TransportResult {
    let completions: Vec<Completion> = total
        .samples
        .iter()
        .map(|s| completion(s.size, s.rtt_ns, baseline.rtt_ns(s.size)))
        .collect();
    let table = SlowdownTable::new(&completions);
    let mut slow: Vec<f64> = completions.iter().map(Completion::slowdown).collect();
    slow.sort_by(f64::total_cmp);
    let mut rtt: Vec<f64> = total
        .samples
        .iter()
        .map(|s| s.rtt_ns as f64 / 1e3)
        .collect();
    rtt.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| homa_workload::stats::percentile(v, p);
    let mut lag: Vec<f64> = total
        .samples
        .iter()
        .map(|s| s.lag_ns as f64 / 1e3)
        .collect();
    lag.sort_by(f64::total_cmp);
    let per_host_gbps = total.gbps() / n as f64;
    let link_secs = cfg.seconds * n as f64;
    let utilization = net.downlink_bytes() as f64 * 8.0 / (cfg.rate_bps() as f64 * link_secs);
    TransportResult {
        transport: t.name().to_string(),
        deciles: if table.is_empty() {
            vec![]
        } else {
            table.deciles()
        },
        top1pct: (!table.is_empty()).then(|| table.top_percent()),
        plot_groups: if table.is_empty() {
            vec![]
        } else {
            table.groups(40)
        },
        rpcs: total.samples.len(),
        p50_slowdown: pct(&slow, 50.0),
        p99_slowdown: pct(&slow, 99.0),
        p999_slowdown: pct(&slow, 99.9),
        p50_rtt_us: pct(&rtt, 50.0),
        p99_rtt_us: pct(&rtt, 99.0),
        p999_rtt_us: pct(&rtt, 99.9),
        target_gbps: cfg.load * cfg.testbed.gbps,
        offered_gbps: total.offered_gbps() / n as f64,
        achieved_gbps: per_host_gbps,
        achieved_load: per_host_gbps / cfg.testbed.gbps,
        downlink_utilization: utilization,
        cpu_percent: cpu.machine_percent,
        cpu_saturated: cpu.machine_percent >= 90.0,
        cpu,
        drops: net.drops(),
        downlink_packets_by_class: net.downlink_packets_by_class(),
        issued: total.issued,
        completed: total.completed,
        failed: total.failed,
        mismatches: total.mismatches,
        unfinished: total.unfinished,
        cap_waits: total.cap_waits,
        pipelined: total.pipelined,
        extra_connections: total.connections,
        homa_resends: 0,
        homa_retransmitted_packets: 0,
        homa_engine_counters: Default::default(),
        p50_lag_us: pct(&lag, 50.0),
        p99_lag_us: pct(&lag, 99.0),
        errors: total.errors,
    }
}
