//! Issue #20's simulator experiments (`homa sim --experiment ...`,
//! `docs/congestion.md`): peers at different distances, finite switch
//! buffers with drops counted per port class and priority, and closed-loop
//! clients that keep `client_max` fixed-size RPCs outstanding (as the Linux
//! module's `cp_node`).
//!
//! * **rtt-mix**: every host is a client and a server; half the hosts are
//!   near the fabric, half far ([`HostDelays`]); each client keeps
//!   `client_max` RPCs of `message_size` request bytes (and a 100-byte
//!   response, `cp_node --one-way`) outstanding to uniformly random other
//!   hosts. Reports the servers' delivered request payload (goodput) and
//!   the RPCs' latency.
//! * **incast**: `senders` clients each send one `message_size` RPC to
//!   host 0 at the same instant; the next round starts once every response
//!   is in (plus a short gap). Reports the round completion time (RCT) and
//!   the switch ports' drops.
//!
//! Like [`crate::sim`], this module is a driver: it maps options to the
//! engine's `Config` (window policy, windows) and to the network
//! (`Fabric`), and moves packets. Every protocol decision is the engine's.

use crate::topology::{Shape, Topology};
use bytes::Bytes;
use homa_proto::{Config, CongestionSignal, Event, NetworkProfile, RpcId, Time, WindowPolicy};
use homa_testnet::net::{mix, PRIORITIES};
use homa_testnet::{App, EngineNet, Fabric, HostCtx, HostId, Node};
use rand::Rng;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

const US: u64 = 1_000;
/// Response length of every RPC (`cp_node --one-way`'s 100 bytes).
pub const RESPONSE_BYTES: usize = 100;

/// Per-host propagation delay between a host and the fabric: even hosts
/// are `near_ns` away, odd hosts `far_ns` (each way, on top of the
/// topology's own link latency). A packet from `a` to `b` pays
/// `delay(a) + delay(b)` more than on the plain topology, so a round trip
/// between them `2 × (delay(a) + delay(b))` more.
///
/// Modelled with the network's per-host send and receive delays
/// (`Fabric::set_host_tx_delay`, `set_host_rx_delay`), which delay a
/// packet without occupying a link, exactly as propagation on the host's
/// link would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HostDelays {
    pub near_ns: u64,
    pub far_ns: u64,
}

impl HostDelays {
    /// Every host at the same distance.
    pub fn uniform(ns: u64) -> HostDelays {
        HostDelays {
            near_ns: ns,
            far_ns: ns,
        }
    }

    /// `NEAR,FAR` with units (`2us,40us`) or one value for every host.
    pub fn parse(s: &str) -> Result<HostDelays, String> {
        let one = |v: &str| parse_ns(v).ok_or_else(|| format!("bad delay {v:?}"));
        match s.split_once(',') {
            Some((a, b)) => Ok(HostDelays {
                near_ns: one(a)?,
                far_ns: one(b)?,
            }),
            None => Ok(HostDelays::uniform(one(s)?)),
        }
    }

    pub fn is_far(&self, h: HostId) -> bool {
        h % 2 == 1 && self.far_ns != self.near_ns
    }

    /// Host `h`'s one-way distance from the fabric.
    pub fn of(&self, h: HostId) -> u64 {
        if h % 2 == 1 {
            self.far_ns
        } else {
            self.near_ns
        }
    }

    /// Sets every host's send and receive delay to the topology's plus its
    /// distance.
    pub fn apply(&self, f: &mut Fabric, t: &Topology) {
        for h in 0..f.n_hosts() {
            let d = self.of(h);
            f.set_host_tx_delay(h, t.host_tx_delay_ns + d);
            f.set_host_rx_delay(h, t.host_rx_delay_ns + d);
        }
    }

    /// Unloaded round trip of a full DATA packet from `a` and the GRANT
    /// `b` returns (the topology's `rtt_ns` for their path class).
    pub fn pair_rtt_ns(&self, t: &Topology, a: HostId, b: HostId, max_packet_size: usize) -> u64 {
        let p = t.path(a, b);
        t.one_way_ns(&p, max_packet_size)
            + t.one_way_ns(&p, crate::topology::grant_len())
            + 2 * (self.of(a) + self.of(b))
    }
}

/// Parses `1s`, `2ms`, `40us`, `1.5us`, `500ns` or plain ns (the
/// simulator's one duration syntax, also `homa sim`'s).
pub fn parse_ns(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("ms") {
        (v, 1e6)
    } else if let Some(v) = s.strip_suffix("us") {
        (v, 1e3)
    } else if let Some(v) = s.strip_suffix("ns") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1e9)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * mult).round() as u64)
}

/// The windows every host uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "policy", content = "bytes", rename_all = "snake_case")]
pub enum WindowSetting {
    /// `WindowPolicy::Adaptive` (RTT measured).
    Adaptive,
    /// `WindowPolicy::Static` with `unsched_bytes` = `grant_window` = this
    /// (`None`: the engine's derivation, one RTT of whole packets).
    Static(Option<u32>),
}

impl WindowSetting {
    /// `adaptive`, `static` (the derived default) or `static:BYTES`.
    pub fn parse(s: &str) -> Result<WindowSetting, String> {
        let s = s.trim().to_ascii_lowercase();
        if s == "adaptive" {
            return Ok(WindowSetting::Adaptive);
        }
        if s == "static" {
            return Ok(WindowSetting::Static(None));
        }
        if let Some(b) = s.strip_prefix("static:") {
            let b = b.trim_end_matches('b');
            let bytes = if let Some(k) = b.strip_suffix('k') {
                k.parse::<f64>().ok().map(|k| (k * 1000.0) as u32)
            } else {
                b.parse::<u32>().ok()
            };
            return match bytes {
                Some(n) if n > 0 => Ok(WindowSetting::Static(Some(n))),
                _ => Err(format!("bad window bytes in {s:?}")),
            };
        }
        Err(format!(
            "unknown window {s:?} (expected adaptive, static or static:BYTES)"
        ))
    }

    pub fn name(&self) -> String {
        match self {
            WindowSetting::Adaptive => "adaptive".into(),
            WindowSetting::Static(None) => "static".into(),
            WindowSetting::Static(Some(b)) => format!("static:{b}"),
        }
    }
}

/// What both experiments share: the network and the engines' settings.
#[derive(Clone, Debug)]
pub struct Setup {
    pub topology: Topology,
    pub delays: HostDelays,
    pub window: WindowSetting,
    pub message_size: u32,
    pub max_packet_size: usize,
    pub overcommit: usize,
    pub seed: u64,
    /// Adaptive-window settings (`None`: the engine's defaults):
    /// `rtt_grant_factor`, `rtt_high_factor`, and the smoothed congestion
    /// signal's factor (instead of the latest sample's).
    pub rtt_grant_factor: Option<u32>,
    pub rtt_high_factor: Option<u32>,
    pub smoothed_signal: Option<u32>,
    /// `Config::max_incoming` (`None`: the engine's, overcommit × window).
    pub max_incoming: Option<u64>,
    /// `Config::grant_covers_foreign_queue` (`None`: the engine's, off).
    pub grant_covers_foreign_queue: Option<bool>,
    /// `Config::downlink_budget` (`None`: the engine's, derived).
    pub downlink_budget: Option<u32>,
    /// `Config::unsched_cut_when_rationed` (`None`: the engine's, on).
    pub unsched_cut_when_rationed: Option<bool>,
}

impl Setup {
    /// `hosts` on one switch with `link_gbps` host links and the paper's
    /// switch and host timing.
    pub fn star(hosts: usize, link_gbps: f64, delays: HostDelays) -> Setup {
        let topology = Topology {
            host_link_bps: (link_gbps * 1e9) as u64,
            ..Topology::star(hosts)
        };
        Setup {
            topology,
            delays,
            window: WindowSetting::Static(None),
            message_size: 100_000,
            max_packet_size: crate::topology::MTU_UDP_PAYLOAD,
            overcommit: 8,
            seed: 1,
            rtt_grant_factor: None,
            rtt_high_factor: None,
            smoothed_signal: None,
            max_incoming: None,
            grant_covers_foreign_queue: None,
            downlink_budget: None,
            unsched_cut_when_rationed: None,
        }
    }

    /// The `rtt_ns` a static deployment would configure: the unloaded
    /// round trip between two *near* hosts on the longest path (a static
    /// window sized for the far hosts would be a sweep point, not a
    /// default). Far peers are what adaptive windows are for.
    pub fn engine_rtt_ns(&self) -> u64 {
        let t = &self.topology;
        let (a, b) = match t.shape {
            Shape::TwoLevel {
                racks,
                hosts_per_rack,
                ..
            } if racks > 1 => (0, hosts_per_rack + hosts_per_rack % 2),
            _ => (0, 2),
        };
        let near = HostDelays::uniform(self.delays.near_ns);
        near.pair_rtt_ns(t, a, b.min(t.n_hosts() - 1), self.max_packet_size)
    }

    /// Every host's engine configuration (but its RPC id seed).
    pub fn engine_config(&self) -> Config {
        let max_len = self.message_size.max(RESPONSE_BYTES as u32);
        let workload = homa_workload::workload::Workload::fixed(self.message_size);
        let t = &self.topology;
        let network = NetworkProfile {
            link_bps: t.host_link_bps,
            rtt_ns: self.engine_rtt_ns(),
            max_packet_size: self.max_packet_size,
            packet_overhead_bytes: t.overhead_bytes,
            max_message_length: max_len,
            priority_levels: 8,
            message_sizes: Some(crate::priorities::message_sizes(&workload)),
            nic_queue_packets: 0,
            unsched_bytes: match self.window {
                WindowSetting::Static(b) => b,
                WindowSetting::Adaptive => None,
            },
            unsched_priorities: None,
        };
        let mut c = Config::for_network(&network);
        if let WindowSetting::Static(Some(b)) = self.window {
            c.grant_window = Some(b);
        }
        if self.window == WindowSetting::Adaptive {
            c.window_policy = WindowPolicy::Adaptive;
            c.measure_rtt = true;
        }
        if let Some(f) = self.rtt_grant_factor {
            c.rtt_grant_factor = f;
        }
        if let Some(f) = self.rtt_high_factor {
            c.rtt_high_factor = f;
        }
        if let Some(m) = self.max_incoming {
            c.max_incoming = Some(m);
        }
        if let Some(factor) = self.smoothed_signal {
            c.congestion_signal = CongestionSignal::Smoothed { factor };
        }
        if let Some(on) = self.grant_covers_foreign_queue {
            c.grant_covers_foreign_queue = on;
        }
        if let Some(b) = self.downlink_budget {
            c.downlink_budget = Some(b);
        }
        if let Some(on) = self.unsched_cut_when_rationed {
            c.unsched_cut_when_rationed = on;
        }
        c.checksum = false;
        c.discard_payload = true;
        c.pool_bytes = (1usize << 30).max(8 * max_len as usize);
        c.max_client_rpcs = 1 << 20;
        c.max_server_rpcs_per_peer = 1 << 20;
        c.max_overcommit = self.overcommit;
        c
    }

    /// The network: topology, host distances, buffers.
    pub fn build(&self) -> Fabric {
        let mut f = self.topology.build(self.seed);
        self.delays.apply(&mut f, &self.topology);
        f
    }

    fn params(&self, config: &Config) -> Params {
        let t = &self.topology;
        let mps = self.max_packet_size;
        Params {
            topology: t.name(),
            hosts: t.n_hosts(),
            link_gbps: t.host_link_bps as f64 / 1e9,
            switch_buffer_bytes: t.switch_buffer_bytes,
            near_ns: self.delays.near_ns,
            far_ns: self.delays.far_ns,
            rtt_near_near_ns: self.delays.pair_rtt_ns(t, 0, 2.min(t.n_hosts() - 1), mps),
            rtt_near_far_ns: self.delays.pair_rtt_ns(t, 0, 1, mps),
            rtt_far_far_ns: self.delays.pair_rtt_ns(t, 1, 3.min(t.n_hosts() - 1), mps),
            engine_rtt_ns: config.rtt_ns,
            window: self.window,
            window_policy: format!("{:?}", config.window_policy),
            rtt_grant_factor: config.rtt_grant_factor,
            rtt_high_factor: config.rtt_high_factor,
            congestion_signal: format!("{:?}", config.congestion_signal),
            max_incoming: config.max_incoming,
            downlink_budget: if config.window_policy == WindowPolicy::Adaptive {
                config.effective_downlink_budget()
            } else {
                0
            },
            unsched_priorities: config.unsched_priorities,
            unsched_bytes: config.effective_unsched_bytes(),
            grant_window: config.effective_grant_window(),
            overcommit: config.max_overcommit,
            message_size: self.message_size,
            seed: self.seed,
        }
    }
}

/// The resolved parameters of a run, for its report.
#[derive(Clone, Debug, Serialize)]
pub struct Params {
    pub topology: String,
    pub hosts: usize,
    pub link_gbps: f64,
    pub switch_buffer_bytes: Option<u64>,
    pub near_ns: u64,
    pub far_ns: u64,
    pub rtt_near_near_ns: u64,
    pub rtt_near_far_ns: u64,
    pub rtt_far_far_ns: u64,
    /// The engine's `rtt_ns` (near hosts' round trip).
    pub engine_rtt_ns: u64,
    pub window: WindowSetting,
    pub window_policy: String,
    pub rtt_grant_factor: u32,
    pub rtt_high_factor: u32,
    pub congestion_signal: String,
    pub max_incoming: Option<u64>,
    /// The receiver's downlink budget (adaptive windows; 0: none).
    pub downlink_budget: u32,
    /// Levels of unscheduled packets (the top ones; the rest are
    /// scheduled), from the fixed message size's priority plan.
    pub unsched_priorities: u8,
    /// Static (or, under adaptive windows, first-contact) windows.
    pub unsched_bytes: u32,
    pub grant_window: u32,
    pub overcommit: usize,
    pub message_size: u32,
    pub seed: u64,
}

// ----- drops -----

/// Drops and peak occupancy of one class of ports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortClassDrops {
    /// `host_nic` (host to switch), `switch_to_host`, `switch_to_switch`.
    pub class: String,
    pub ports: usize,
    /// Ports of the class that dropped at least one packet.
    pub ports_dropping: usize,
    pub drops: u64,
    pub drops_by_priority: [u64; PRIORITIES],
    /// Largest occupancy of any port of the class, per priority (bytes).
    pub max_queued_by_priority: [u64; PRIORITIES],
}

/// Drops per class of port and per priority since the fabric's last
/// statistics reset (every class present in the network is listed, with
/// zeros when nothing dropped).
pub fn drops_by_class(f: &Fabric) -> Vec<PortClassDrops> {
    let mut classes: BTreeMap<&'static str, PortClassDrops> = BTreeMap::new();
    for l in 0..f.n_links() {
        let info = f.link_info(l);
        let class = match (info.from, info.to) {
            (Node::Host(_), _) => "host_nic",
            (Node::Switch(_), Node::Host(_)) => "switch_to_host",
            (Node::Switch(_), Node::Switch(_)) => "switch_to_switch",
        };
        let c = classes.entry(class).or_insert_with(|| PortClassDrops {
            class: class.into(),
            ..PortClassDrops::default()
        });
        let st = f.link_stats(l);
        let q = f.queue_report(l);
        c.ports += 1;
        let total: u64 = st.drops.iter().sum();
        c.drops += total;
        c.ports_dropping += (total > 0) as usize;
        for p in 0..PRIORITIES {
            c.drops_by_priority[p] += st.drops[p];
            c.max_queued_by_priority[p] = c.max_queued_by_priority[p].max(q.max_bytes[p]);
        }
    }
    classes.into_values().collect()
}

// ----- the application -----

/// State shared by every host's application and the run loop.
#[derive(Default)]
struct Shared {
    /// Closed loop: each client keeps this many RPCs outstanding (0: the
    /// run loop starts every RPC, as in incast).
    client_max: usize,
    /// No new RPCs from the closed loop.
    stop_issuing: bool,
    /// RPCs started in `[measure_from, measure_to)` are measured; request
    /// bytes delivered in it count as goodput.
    measure_from: Time,
    measure_to: Time,
    /// Per client host: outstanding RPCs (id → start, server, measured).
    outstanding: Vec<HashMap<u64, (Time, HostId, bool)>>,
    /// Measured RPCs: (latency ns, pair class: 0 near-near, 1 near-far or
    /// far-near, 2 far-far).
    latencies: Vec<(u64, u8)>,
    measured_started: u64,
    measured_done: u64,
    /// Request payload delivered to servers within the window, by the
    /// server's class (near, far).
    goodput_bytes: [u64; 2],
    /// Responses received (any RPC) and the time of the latest one.
    responses: u64,
    last_response_at: Time,
    failed: u64,
    unexpected: u64,
    delays: Option<HostDelays>,
    payload: &'static [u8],
}

impl Shared {
    fn class(&self, a: HostId, b: HostId) -> u8 {
        match self.delays {
            Some(d) => d.is_far(a) as u8 + d.is_far(b) as u8,
            None => 0,
        }
    }

    fn issue(&mut self, ctx: &mut HostCtx<'_>, dst: HostId, len: usize) -> Option<RpcId> {
        let now = ctx.now();
        let payload = Bytes::from_static(&self.payload[..len]);
        match ctx.send_request(dst, payload) {
            Ok(id) => {
                let measured = now >= self.measure_from && now < self.measure_to;
                self.measured_started += measured as u64;
                self.outstanding[ctx.host()].insert(id.0, (now, dst, measured));
                Some(id)
            }
            Err(_) => {
                self.failed += 1;
                None
            }
        }
    }

    /// Closed loop: starts RPCs from `ctx`'s host until it has
    /// `client_max` outstanding, each to a uniformly random other host.
    fn top_up(&mut self, ctx: &mut HostCtx<'_>, len: usize) {
        if self.client_max == 0 || self.stop_issuing {
            return;
        }
        let (me, n) = (ctx.host(), ctx.n_hosts());
        while self.outstanding[me].len() < self.client_max {
            let mut dst = ctx.rng().gen_range(0..n - 1);
            if dst >= me {
                dst += 1;
            }
            if self.issue(ctx, dst, len).is_none() {
                break;
            }
        }
    }
}

/// Every host's application: a server answering each request with
/// [`RESPONSE_BYTES`], and a client (closed loop, or driven by the run
/// loop).
struct ExpApp {
    shared: Rc<RefCell<Shared>>,
    message_size: usize,
}

impl App for ExpApp {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        self.shared.borrow_mut().top_up(ctx, self.message_size);
    }

    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        let now = ctx.now();
        let mut sh = self.shared.borrow_mut();
        match event {
            Event::Request { rpc, message } => {
                if now >= sh.measure_from && now < sh.measure_to {
                    let far = sh.delays.is_some_and(|d| d.is_far(ctx.host())) as usize;
                    sh.goodput_bytes[far] += message.len() as u64;
                }
                drop(message);
                let resp = Bytes::from_static(&sh.payload[..RESPONSE_BYTES]);
                if ctx.send_response(rpc, resp).is_err() {
                    sh.failed += 1;
                }
            }
            Event::Response { id, .. } | Event::Failed { id, .. } => {
                let ok = matches!(event, Event::Response { .. });
                let me = ctx.host();
                match sh.outstanding[me].remove(&id.0) {
                    Some((start, dst, measured)) => {
                        sh.responses += ok as u64;
                        sh.failed += !ok as u64;
                        sh.last_response_at = now;
                        if measured {
                            let class = sh.class(me, dst);
                            sh.latencies.push((now - start, class));
                            sh.measured_done += 1;
                        }
                    }
                    None => sh.unexpected += 1,
                }
                sh.top_up(ctx, self.message_size);
            }
            // Never asked for: every message is delivered whole here.
            Event::PartialRequest { .. }
            | Event::PartialResponse { .. }
            | Event::PartialProgress { .. }
            | Event::StreamOpened { .. }
            | Event::StreamReadable { .. }
            | Event::StreamWritable { .. } => {}
        }
    }
}

fn new_net(setup: &Setup, shared: &Rc<RefCell<Shared>>) -> EngineNet<ExpApp> {
    let config = setup.engine_config();
    let seed = setup.seed;
    let size = setup.message_size as usize;
    EngineNet::new(
        setup.build(),
        |h| {
            config
                .clone()
                .with_rpc_id_seed(mix(seed ^ mix(h as u64 + 1)))
        },
        |_| ExpApp {
            shared: shared.clone(),
            message_size: size,
        },
    )
    .expect("engine configuration is valid")
}

fn zeros(len: usize) -> &'static [u8] {
    Box::leak(vec![0u8; len.max(RESPONSE_BYTES)].into_boxed_slice())
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Latency statistics of one group of RPCs (µs).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyStats {
    pub count: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
}

impl LatencyStats {
    fn of(mut v: Vec<u64>) -> LatencyStats {
        v.sort_unstable();
        let us = |ns: u64| ns as f64 / 1e3;
        LatencyStats {
            count: v.len(),
            p50_us: us(pct(&v, 50.0)),
            p99_us: us(pct(&v, 99.0)),
            mean_us: if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<u64>() as f64 / v.len() as f64 / 1e3
            },
            max_us: us(v.last().copied().unwrap_or(0)),
        }
    }
}

/// What the engines saw of their peers at the end of a run, per pair
/// class: the windows they used.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WindowSummary {
    /// `near-near`, `near-far` (either direction), `far-far`.
    pub pairs: String,
    pub peers: usize,
    pub mean_rtt_min_us: f64,
    pub mean_unsched_window: f64,
    pub mean_grant_window: f64,
    pub congested: usize,
}

fn window_summary(net: &EngineNet<ExpApp>, delays: &HostDelays) -> Vec<WindowSummary> {
    let names = ["near-near", "near-far", "far-far"];
    let mut acc: Vec<(usize, f64, f64, f64, usize)> = vec![(0, 0.0, 0.0, 0.0, 0); 3];
    let n = net.n_hosts();
    for a in 0..n {
        let Some(ep) = net.try_endpoint(a) else {
            continue;
        };
        for b in 0..n {
            if a == b {
                continue;
            }
            if let Some(r) = ep.peer_rtt(net.addr(b)) {
                let c = delays.is_far(a) as usize + delays.is_far(b) as usize;
                let e = &mut acc[c];
                e.0 += 1;
                e.1 += r.rtt_min.unwrap_or(0) as f64 / 1e3;
                e.2 += r.unsched_window as f64;
                e.3 += r.grant_window as f64;
                e.4 += r.congested as usize;
            }
        }
    }
    acc.into_iter()
        .enumerate()
        .filter(|(_, e)| e.0 > 0)
        .map(|(i, e)| {
            let k = e.0 as f64;
            WindowSummary {
                pairs: names[i].into(),
                peers: e.0,
                mean_rtt_min_us: e.1 / k,
                mean_unsched_window: e.2 / k,
                mean_grant_window: e.3 / k,
                congested: e.4,
            }
        })
        .collect()
}

/// Engine counters summed over hosts (only the nonzero ones).
fn engine_totals(net: &EngineNet<ExpApp>) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = BTreeMap::new();
    for h in 0..net.n_hosts() {
        if let Some(ep) = net.try_endpoint(h) {
            for (k, v) in ep.metrics().iter() {
                *m.entry(k).or_default() += v;
            }
        }
    }
    m.retain(|_, v| *v != 0);
    m
}

// ----- rtt-mix -----

/// An rtt-mix run.
#[derive(Clone, Debug)]
pub struct RttMixSpec {
    pub setup: Setup,
    pub client_max: usize,
    /// Unmeasured start (ns).
    pub warmup_ns: Time,
    /// Measured span (ns).
    pub duration_ns: Time,
    /// After the span, RPCs go on (unmeasured) until every measured one is
    /// done, for at most this long.
    pub drain_ns: Time,
    /// Follow the requests whose length is in one of these ranges
    /// (`homa_testnet::timeline`): where the slowest spent their time.
    pub timeline: Vec<(u32, u32)>,
}

impl RttMixSpec {
    /// 16 hosts on one 25 Gbps switch with [`SHALLOW_BUFFER_BYTES`] per
    /// port, even hosts 2 µs from the fabric and odd hosts 40 µs, 8 RPCs
    /// outstanding per client, 2 ms warm-up and 20 ms measured.
    pub fn new(message_size: u32, window: WindowSetting) -> RttMixSpec {
        let mut setup = Setup::star(
            16,
            25.0,
            HostDelays {
                near_ns: 2 * US,
                far_ns: 40 * US,
            },
        );
        setup.topology.switch_buffer_bytes = Some(SHALLOW_BUFFER_BYTES);
        setup.message_size = message_size;
        setup.window = window;
        RttMixSpec {
            setup,
            client_max: 8,
            warmup_ns: 2_000 * US,
            duration_ns: 20_000 * US,
            drain_ns: 20_000 * US,
            timeline: Vec::new(),
        }
    }
}

/// Result of an rtt-mix run.
#[derive(Clone, Debug, Serialize)]
pub struct RttMixReport {
    pub experiment: &'static str,
    pub message_size: u32,
    pub window: String,
    /// Request payload delivered to every server in the measured span, in
    /// Gbps (all receivers together).
    pub goodput_gbps: f64,
    /// The same per host, as a fraction of the host link rate.
    pub goodput_per_host_fraction: f64,
    /// Goodput delivered to near and to far servers (Gbps).
    pub goodput_near_gbps: f64,
    pub goodput_far_gbps: f64,
    /// p99 of the measured RPCs' latency (send of the request to receipt
    /// of the response), µs.
    pub p99_us: f64,
    pub p50_us: f64,
    /// Packets dropped by switch buffers in the measured span.
    pub drops: u64,
    pub latency: LatencyStats,
    /// By pair class: near-near, near-far (either direction), far-far.
    pub latency_by_pairs: Vec<(String, LatencyStats)>,
    pub drops_by_class: Vec<PortClassDrops>,
    pub unfinished: u64,
    pub failed: u64,
    pub windows: Vec<WindowSummary>,
    pub engine: BTreeMap<String, u64>,
    pub client_max: usize,
    pub warmup_ns: Time,
    pub duration_ns: Time,
    pub params: Params,
    pub events: u64,
    pub wall_seconds: f64,
    /// Summary of the followed requests' timelines (`RttMixSpec::timeline`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<String>,
}

/// Runs an rtt-mix experiment.
pub fn run_rtt_mix(spec: &RttMixSpec) -> RttMixReport {
    let wall = std::time::Instant::now();
    let setup = &spec.setup;
    let n = setup.topology.n_hosts();
    assert!(n >= 2 && spec.client_max > 0);
    let t0 = spec.warmup_ns;
    let t1 = t0 + spec.duration_ns;
    let shared = Rc::new(RefCell::new(Shared {
        client_max: spec.client_max,
        measure_from: t0,
        measure_to: t1,
        outstanding: (0..n).map(|_| HashMap::new()).collect(),
        delays: Some(setup.delays),
        payload: zeros(setup.message_size as usize),
        ..Shared::default()
    }));
    let mut net = new_net(setup, &shared);
    if !spec.timeline.is_empty() {
        net.enable_timelines(&spec.timeline);
    }
    let config = net.config(0).clone();
    net.run_until(t0);
    net.fabric_mut().reset_stats();
    net.run_until(t1);
    let drops_by_class = drops_by_class(net.fabric());
    let drops = net.fabric().stats().buffer_drops;
    let sh2 = shared.clone();
    net.run_until_cond(t1 + spec.drain_ns, move |_| {
        let s = sh2.borrow();
        s.measured_done >= s.measured_started
    });
    shared.borrow_mut().stop_issuing = true;
    let sh = shared.borrow();
    let secs = spec.duration_ns as f64 / 1e9;
    let gbps = |b: u64| b as f64 * 8.0 / secs / 1e9;
    let all: Vec<u64> = sh.latencies.iter().map(|x| x.0).collect();
    let latency = LatencyStats::of(all);
    let names = ["near-near", "near-far", "far-far"];
    let latency_by_pairs = (0..3u8)
        .map(|c| {
            let v = sh
                .latencies
                .iter()
                .filter(|x| x.1 == c)
                .map(|x| x.0)
                .collect();
            (names[c as usize].to_string(), LatencyStats::of(v))
        })
        .filter(|(_, s)| s.count > 0)
        .collect();
    let total = sh.goodput_bytes[0] + sh.goodput_bytes[1];
    RttMixReport {
        experiment: "rtt-mix",
        message_size: setup.message_size,
        window: setup.window.name(),
        goodput_gbps: gbps(total),
        goodput_per_host_fraction: gbps(total) * 1e9
            / n as f64
            / setup.topology.host_link_bps as f64,
        goodput_near_gbps: gbps(sh.goodput_bytes[0]),
        goodput_far_gbps: gbps(sh.goodput_bytes[1]),
        p99_us: latency.p99_us,
        p50_us: latency.p50_us,
        drops,
        latency,
        latency_by_pairs,
        drops_by_class,
        unfinished: sh.measured_started - sh.measured_done,
        failed: sh.failed,
        windows: window_summary(&net, &setup.delays),
        engine: engine_totals(&net),
        client_max: spec.client_max,
        warmup_ns: spec.warmup_ns,
        duration_ns: spec.duration_ns,
        params: setup.params(&config),
        events: net.fabric().events_processed(),
        wall_seconds: wall.elapsed().as_secs_f64(),
        timeline: net.timeline().map(|t| t.summary()),
    }
}

// ----- incast -----

/// An incast run.
#[derive(Clone, Debug)]
pub struct IncastSpec {
    pub setup: Setup,
    pub senders: usize,
    /// Unmeasured rounds first (the senders learn their path to the
    /// receiver), then measured rounds.
    pub warmup_rounds: usize,
    pub rounds: usize,
    /// Idle time between a round's last response and the next round.
    pub gap_ns: Time,
    /// A round not complete after this long ends the run.
    pub round_limit_ns: Time,
}

impl IncastSpec {
    /// `senders` + 1 hosts on one 25 Gbps switch, every host 2 µs from the
    /// fabric (the rtt-mix's near hosts), 256 KB of buffer per switch port,
    /// 2 warm-up rounds and 20 measured.
    pub fn new(senders: usize, message_size: u32, window: WindowSetting) -> IncastSpec {
        let mut setup = Setup::star(senders + 1, 25.0, HostDelays::uniform(2 * US));
        setup.topology.switch_buffer_bytes = Some(SHALLOW_BUFFER_BYTES);
        setup.message_size = message_size;
        setup.window = window;
        IncastSpec {
            setup,
            senders,
            warmup_rounds: 2,
            rounds: 20,
            gap_ns: 20 * US,
            round_limit_ns: 1_000_000_000,
        }
    }
}

/// Switch port buffer of both experiments by default (bytes): a
/// shallow-buffer switch. 256 KB per 25 Gbps port is a 32 MB shared buffer
/// (Broadcom Trident 3 class) split evenly over 128 × 25 Gbps ports; it
/// drains in 82 µs.
pub const SHALLOW_BUFFER_BYTES: u64 = 256_000;

/// Result of an incast run.
#[derive(Clone, Debug, Serialize)]
pub struct IncastReport {
    pub experiment: &'static str,
    pub senders: usize,
    pub message_size: u32,
    pub window: String,
    /// p99 (nearest rank) of the measured rounds' completion times: from
    /// the round's start to its last response, µs.
    pub rct_p99_us: f64,
    pub rct_p50_us: f64,
    pub rct_max_us: f64,
    pub rct_mean_us: f64,
    /// The best case: every request's wire bytes through the receiver's
    /// link back to back, plus one near-near round trip (µs).
    pub rct_ideal_us: f64,
    /// Packets dropped by switch buffers in the measured rounds.
    pub drops: u64,
    /// ... and in the warm-up rounds.
    pub warmup_drops: u64,
    pub drops_by_class: Vec<PortClassDrops>,
    pub rounds: usize,
    pub rounds_completed: usize,
    pub failed: u64,
    pub windows: Vec<WindowSummary>,
    pub engine: BTreeMap<String, u64>,
    pub params: Params,
    pub events: u64,
    pub wall_seconds: f64,
}

/// Runs an incast experiment: host 0 receives, hosts 1..=senders send.
pub fn run_incast(spec: &IncastSpec) -> IncastReport {
    let wall = std::time::Instant::now();
    let setup = &spec.setup;
    let n = setup.topology.n_hosts();
    assert!(spec.senders >= 1 && spec.senders < n);
    let shared = Rc::new(RefCell::new(Shared {
        client_max: 0,
        measure_from: 0,
        measure_to: Time::MAX,
        outstanding: (0..n).map(|_| HashMap::new()).collect(),
        delays: Some(setup.delays),
        payload: zeros(setup.message_size as usize),
        ..Shared::default()
    }));
    let mut net = new_net(setup, &shared);
    let config = net.config(0).clone();
    let size = setup.message_size as usize;
    let mut rcts = Vec::new();
    let mut warmup_drops = 0;
    let mut completed = 0usize;
    for round in 0..spec.warmup_rounds + spec.rounds {
        if round == spec.warmup_rounds {
            warmup_drops = net.fabric().stats().buffer_drops;
            net.fabric_mut().reset_stats();
        }
        let start = net.now();
        let target = shared.borrow().responses + spec.senders as u64;
        for s in 1..=spec.senders {
            let sh = shared.clone();
            net.with_host(s, |_, ctx| sh.borrow_mut().issue(ctx, 0, size));
        }
        let sh2 = shared.clone();
        let done = net.run_until_cond(start + spec.round_limit_ns, move |_| {
            let s = sh2.borrow();
            s.responses + s.failed >= target
        });
        if !done {
            break;
        }
        completed += 1;
        if round >= spec.warmup_rounds {
            rcts.push(shared.borrow().last_response_at - start);
        }
        let next = net.now() + spec.gap_ns;
        net.run_until(next);
    }
    let drops_by_class = drops_by_class(net.fabric());
    let drops = net.fabric().stats().buffer_drops;
    let stats = LatencyStats::of(rcts);
    let wire = crate::steady::wire_bytes(
        setup.message_size,
        setup.max_packet_size,
        setup.topology.overhead_bytes,
    );
    let ideal_ns =
        crate::topology::tx_time(wire * spec.senders as u64, setup.topology.host_link_bps)
            + setup.engine_rtt_ns();
    let sh = shared.borrow();
    IncastReport {
        experiment: "incast",
        senders: spec.senders,
        message_size: setup.message_size,
        window: setup.window.name(),
        rct_p99_us: stats.p99_us,
        rct_p50_us: stats.p50_us,
        rct_max_us: stats.max_us,
        rct_mean_us: stats.mean_us,
        rct_ideal_us: ideal_ns as f64 / 1e3,
        drops,
        warmup_drops,
        drops_by_class,
        rounds: spec.rounds,
        rounds_completed: completed.saturating_sub(spec.warmup_rounds),
        failed: sh.failed,
        windows: window_summary(&net, &setup.delays),
        engine: engine_totals(&net),
        params: setup.params(&config),
        events: net.fabric().events_processed(),
        wall_seconds: wall.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        assert_eq!(
            WindowSetting::parse("adaptive").unwrap(),
            WindowSetting::Adaptive
        );
        assert_eq!(
            WindowSetting::parse("static").unwrap(),
            WindowSetting::Static(None)
        );
        assert_eq!(
            WindowSetting::parse("static:80000").unwrap(),
            WindowSetting::Static(Some(80_000))
        );
        assert_eq!(
            WindowSetting::parse("static:80k").unwrap(),
            WindowSetting::Static(Some(80_000))
        );
        for bad in ["static:0", "static:x", "big"] {
            assert!(WindowSetting::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            HostDelays::parse("2us,40us").unwrap(),
            HostDelays {
                near_ns: 2_000,
                far_ns: 40_000
            }
        );
        assert_eq!(HostDelays::parse("500").unwrap(), HostDelays::uniform(500));
        assert!(HostDelays::parse("2us,far").is_err());
    }

    #[test]
    fn engine_config_maps_the_window_setting() {
        let mut s = Setup::star(4, 25.0, HostDelays::uniform(2 * US));
        s.message_size = 100_000;
        let c = s.engine_config();
        c.validate().unwrap();
        assert_eq!(c.window_policy, WindowPolicy::Static);
        assert!(!c.measure_rtt);
        // One near round trip of whole packets.
        let rtt_bytes = (c.rtt_ns * 25 / 8) as u32;
        assert!(c.effective_unsched_bytes() >= rtt_bytes);
        assert!(c.effective_unsched_bytes() < rtt_bytes + 1416);
        assert_eq!(c.effective_grant_window(), c.effective_unsched_bytes());
        s.window = WindowSetting::Static(Some(80_000));
        let c = s.engine_config();
        assert_eq!(
            (c.effective_unsched_bytes(), c.effective_grant_window()),
            (80_000, 80_000)
        );
        s.window = WindowSetting::Adaptive;
        let c = s.engine_config();
        c.validate().unwrap();
        assert_eq!(c.window_policy, WindowPolicy::Adaptive);
        assert!(c.measure_rtt);
    }

    /// Far hosts are farther by exactly their distance, each way, on an
    /// idle network; the engine is configured with the near hosts' RTT.
    #[test]
    fn host_delays_set_each_pairs_round_trip() {
        let delays = HostDelays {
            near_ns: 2 * US,
            far_ns: 40 * US,
        };
        let setup = Setup::star(4, 25.0, delays);
        let t = &setup.topology;
        let base = t.rtt_ns(1472);
        assert_eq!(delays.pair_rtt_ns(t, 0, 2, 1472), base + 8 * US);
        assert_eq!(delays.pair_rtt_ns(t, 0, 1, 1472), base + 84 * US);
        assert_eq!(delays.pair_rtt_ns(t, 1, 3, 1472), base + 160 * US);
        assert_eq!(setup.engine_rtt_ns(), base + 8 * US);
        let f = setup.build();
        // The network's own per-packet delays.
        let nic = |h| f.link_info(f.host_nic(h).unwrap()).latency_ns;
        assert_eq!(nic(0), nic(1));
        // An RPC's measured RTT follows the pair's distance: the engines
        // of a measuring run see it.
        let spec = RttMixSpec {
            setup: Setup {
                window: WindowSetting::Adaptive,
                message_size: 2_000,
                ..setup
            },
            client_max: 1,
            warmup_ns: 0,
            duration_ns: 2_000 * US,
            drain_ns: 2_000 * US,
            timeline: Vec::new(),
        };
        let r = run_rtt_mix(&spec);
        assert_eq!(r.unfinished, 0);
        let w: HashMap<String, f64> = r
            .windows
            .iter()
            .map(|w| (w.pairs.clone(), w.mean_rtt_min_us))
            .collect();
        // The sample is a small packet and its grant or response: below
        // the full-packet RTT, above the propagation alone.
        let nn = w["near-near"];
        let nf = w["near-far"];
        let ff = w["far-far"];
        assert!((8.0..base as f64 / 1e3 + 8.0).contains(&nn), "{w:?}");
        assert!((nf - nn - 76.0).abs() < 1.0, "{w:?}");
        assert!((ff - nn - 152.0).abs() < 1.0, "{w:?}");
    }

    /// `--timeline` follows the requests the closed-loop clients start
    /// (they start them from inside the network's callbacks), and
    /// following them changes nothing.
    #[test]
    fn rtt_mix_follows_its_requests_with_a_timeline() {
        let mut spec = RttMixSpec::new(20_000, WindowSetting::Static(None));
        spec.setup = Setup {
            message_size: 20_000,
            ..Setup::star(4, 25.0, HostDelays::uniform(2 * US))
        };
        spec.warmup_ns = 100 * US;
        spec.duration_ns = 500 * US;
        let plain = run_rtt_mix(&spec);
        assert!(plain.timeline.is_none());
        spec.timeline = vec![(20_000, 20_000)];
        let followed = run_rtt_mix(&spec);
        let summary = followed.timeline.as_deref().expect("a summary");
        let n: usize = summary
            .strip_prefix("timeline of ")
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse().ok())
            .expect(summary);
        assert!(n >= plain.latency.count, "{n} {summary}");
        assert_eq!(followed.events, plain.events);
        assert_eq!(followed.latency.p99_us, plain.latency.p99_us);
    }

    #[test]
    fn closed_loop_clients_keep_client_max_outstanding() {
        let mut spec = RttMixSpec::new(20_000, WindowSetting::Static(None));
        spec.setup = Setup {
            message_size: 20_000,
            ..Setup::star(4, 25.0, HostDelays::uniform(2 * US))
        };
        spec.client_max = 3;
        spec.warmup_ns = 100 * US;
        spec.duration_ns = 1_000 * US;
        let shared_check = {
            let r = run_rtt_mix(&spec);
            assert_eq!(r.unfinished, 0);
            assert_eq!(r.failed, 0);
            assert!(r.latency.count > 100, "{r:?}");
            assert_eq!(r.drops, 0);
            // Four hosts each receive about a link's worth at most.
            assert!(
                r.goodput_gbps > 10.0 && r.goodput_gbps < 4.0 * 25.0,
                "{r:?}"
            );
            r
        };
        // Directly: during the run every client has exactly client_max
        // RPCs outstanding after each of its events.
        let n = 4;
        let shared = Rc::new(RefCell::new(Shared {
            client_max: 3,
            measure_from: 0,
            measure_to: Time::MAX,
            outstanding: (0..n).map(|_| HashMap::new()).collect(),
            delays: None,
            payload: zeros(20_000),
            ..Shared::default()
        }));
        let mut net = new_net(&spec.setup, &shared);
        for step in 0..20 {
            net.run_for(50 * US);
            let sh = shared.borrow();
            assert!(sh.outstanding.iter().all(|o| o.len() == 3), "step {step}");
        }
        let sh = shared.borrow();
        assert!(sh.responses > 50);
        // Destinations are the other hosts, all of them.
        let mut seen = [[false; 4]; 4];
        for (c, o) in sh.outstanding.iter().enumerate() {
            for &(_, d, _) in o.values() {
                assert_ne!(c, d);
                seen[c][d] = true;
            }
        }
        drop(shared_check);
    }

    #[test]
    fn incast_overflow_is_counted_per_port_class_and_priority() {
        // 8 senders × 60 KB of unscheduled bytes into a 64 KB port buffer:
        // the receiver's downlink drops, and nothing else does.
        let mut spec = IncastSpec::new(8, 60_000, WindowSetting::Static(Some(60_000)));
        spec.setup.topology.switch_buffer_bytes = Some(64_000);
        spec.warmup_rounds = 0;
        spec.rounds = 2;
        let r = run_incast(&spec);
        assert_eq!(r.rounds_completed, 2);
        assert!(r.drops > 0, "{r:?}");
        let down = r
            .drops_by_class
            .iter()
            .find(|c| c.class == "switch_to_host")
            .unwrap();
        assert_eq!(down.drops, r.drops);
        assert_eq!(down.ports_dropping, 1);
        assert_eq!(down.drops_by_priority.iter().sum::<u64>(), r.drops);
        // Unscheduled bytes go at the unscheduled levels (above the
        // scheduled ones).
        let (low, high) = down.drops_by_priority.split_at(4);
        assert!(
            high.iter().sum::<u64>() > low.iter().sum::<u64>(),
            "{down:?}"
        );
        assert!(down.max_queued_by_priority.iter().sum::<u64>() <= 64_000 * 8);
        let nic = r
            .drops_by_class
            .iter()
            .find(|c| c.class == "host_nic")
            .unwrap();
        assert_eq!(nic.drops, 0);
        assert_eq!(nic.ports, 9);
        // Lost packets are resent: every round completes, later than on
        // unlimited buffers.
        let mut deep = spec.clone();
        deep.setup.topology.switch_buffer_bytes = None;
        let d = run_incast(&deep);
        assert_eq!(d.drops, 0);
        assert!(d.rct_p99_us < r.rct_p99_us, "{d:?} {r:?}");
        assert!(d.rct_p99_us >= d.rct_ideal_us * 0.99, "{d:?}");
    }

    /// Issue #20's incast on a shallow buffer, shortened: 32 senders × 64
    /// KB into one receiver, 256 KB per port. Adaptive windows with the
    /// receiver's downlink budget (the default) and the senders' rationing
    /// rule drop nothing once the two warm-up rounds have taught the
    /// senders their unscheduled windows, and every round completes within
    /// 2% of the ideal; without the budget (seed 003's cap) or without the
    /// rationing rule the same rounds drop and take longer.
    #[test]
    fn the_downlink_budget_ends_incast_drops_after_warm_up() {
        let mut spec = IncastSpec::new(32, 64_000, WindowSetting::Adaptive);
        spec.rounds = 4;
        let r = run_incast(&spec);
        assert_eq!(r.rounds_completed, 4);
        assert_eq!(r.drops, 0, "{r:?}");
        assert!(r.rct_p99_us <= r.rct_ideal_us * 1.02, "{r:?}");
        let mut no_budget = spec.clone();
        no_budget.setup.downlink_budget = Some(0);
        let mut no_rule = spec.clone();
        no_rule.setup.unsched_cut_when_rationed = Some(false);
        for s in [no_budget, no_rule] {
            let o = run_incast(&s);
            assert!(o.drops > 0, "{o:?}");
            assert!(o.rct_p99_us > r.rct_p99_us, "{o:?}");
        }
    }
}
