//! The network model: hosts, switches, unidirectional links with strict-priority
//! output ports, routing with equal-cost spraying, and the event loop.
//!
//! The core knows nothing about Homa. It carries [`Packet`]s (byte vectors with
//! a source, destination and priority) between hosts and calls back into a
//! [`Hosts`] implementation when a packet is delivered, when a host's NIC
//! finishes a packet, and when a host timer fires. The engine driver
//! ([`crate::EngineNet`]) is one such implementation; tests and the simulator
//! can supply others.
//!
//! Hot-path data is indexed by small integers (links, hosts, switches, packet
//! slab slots); there is no hashing and no allocation per event once packet
//! buffers have been recycled a few times.

use crate::faults::{self, FaultConfig, FaultStats, Partition};
use crate::sched::{Ev, EventQueue, Time};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Index of a host, `0..n_hosts`, in creation order.
pub type HostId = usize;
/// Index of a switch, `0..n_switches`, in creation order.
pub type SwitchId = usize;
/// Index of a unidirectional link (= the output port on its sending side).
pub type LinkId = usize;

/// Number of strict-priority queues per output port (7 is served first).
pub const PRIORITIES: usize = 8;

/// UDP port of every synthetic host address.
pub const HOST_PORT: u16 = 4000;
const ADDR_BASE: u32 = 0x0A00_0001; // 10.0.0.1

/// The synthetic address of host `h`: `10.0.0.1 + h`, port 4000. These
/// addresses only ever exist inside the simulated network.
#[inline]
pub fn host_addr(h: HostId) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::from(ADDR_BASE.wrapping_add(h as u32))),
        HOST_PORT,
    )
}

/// Inverse of [`host_addr`] (without a bound on the number of hosts).
#[inline]
pub fn addr_host(addr: SocketAddr) -> Option<HostId> {
    match addr {
        SocketAddr::V4(a) if a.port() == HOST_PORT => {
            let ip = u32::from(*a.ip());
            ip.checked_sub(ADDR_BASE).map(|h| h as HostId)
        }
        _ => None,
    }
}

/// A node: either end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    Host(HostId),
    Switch(SwitchId),
}

/// How a switch picks among equal-cost output ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecmp {
    /// Per packet, by a seeded hash of the packet's id (packet spraying).
    Spray,
    /// Per (source, destination) pair, by a seeded hash (classic flow ECMP).
    Flow,
}

/// A datagram in the network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packet {
    pub src: HostId,
    pub dst: HostId,
    /// 0..8, 7 highest.
    pub priority: u8,
    /// Unique per injected packet (a duplicate keeps its original's id).
    pub uid: u64,
    /// When the source handed it to its NIC.
    pub sent_at: Time,
    /// The datagram (UDP payload).
    pub data: Vec<u8>,
}

/// What a network needs from the things attached to it. All methods receive
/// the network so that they can send packets and set timers.
pub trait Hosts {
    /// `pkt` arrived at host `host` (after link latency and the host's software
    /// delay). Return `pkt.data` with [`Fabric::recycle`] to reuse the buffer.
    fn deliver(&mut self, net: &mut Fabric, host: HostId, pkt: Packet);
    /// Host `host`'s NIC finished serializing a packet.
    fn nic_done(&mut self, net: &mut Fabric, host: HostId) {
        let _ = (net, host);
    }
    /// A timer set with [`Fabric::schedule`] fired.
    fn timer(&mut self, net: &mut Fabric, host: HostId, kind: u32, token: u64) {
        let _ = (net, host, kind, token);
    }
}

/// Static description of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkInfo {
    pub from: Node,
    pub to: Node,
    pub rate_bps: u64,
    pub latency_ns: u64,
    /// Bytes the output port may hold (queued plus in service); `None`: unlimited.
    pub buffer_limit: Option<u64>,
    /// Faults configured on this link itself (overrides the network default).
    pub faults: Option<FaultConfig>,
}

/// Counters of one link since the last [`Fabric::reset_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkStats {
    pub tx_packets: u64,
    /// Bytes serialized, per-packet overhead included.
    pub tx_bytes: u64,
    pub tx_packets_by_prio: [u64; PRIORITIES],
    /// Packets refused because the port's buffer was full, per priority.
    pub drops: [u64; PRIORITIES],
}

/// Occupancy of one port's priority queues (wire bytes, including the packet
/// being serialized, which still occupies the buffer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueReport {
    /// Time average since the last stats reset.
    pub avg_bytes: [f64; PRIORITIES],
    pub max_bytes: [u64; PRIORITIES],
    pub cur_bytes: [u64; PRIORITIES],
}

/// Network-wide counters since the last [`Fabric::reset_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NetStats {
    /// Packets handed to a NIC by a host.
    pub injected: u64,
    /// Packets handed to their destination host.
    pub delivered: u64,
    /// Datagram bytes (no overhead) of delivered packets.
    pub delivered_bytes: u64,
    /// Tail drops at a full output buffer (sum over links of `LinkStats::drops`).
    pub buffer_drops: u64,
    /// No route (unknown destination, host without uplink, switch without route).
    pub no_route: u64,
    /// Packets that reached a host that is not their destination (bad routes).
    pub misrouted: u64,
}

/// Occupancy of one priority queue. The time integral of `cur` since the
/// last reset is `acc + cur × now`: adding `b` bytes at time `t` subtracts
/// `b × t` (they count from `t` on) and removing them adds it back, so an
/// update needs no record of when the occupancy last changed.
#[derive(Clone, Copy, Debug, Default)]
struct QueueStat {
    cur: u64,
    max: u64,
    acc: i128,
}

impl QueueStat {
    #[inline]
    fn add(&mut self, now: Time, bytes: u64) {
        self.acc -= bytes as i128 * now as i128;
        self.cur += bytes;
        self.max = self.max.max(self.cur);
    }
    #[inline]
    fn sub(&mut self, now: Time, bytes: u64) {
        self.acc += bytes as i128 * now as i128;
        self.cur -= bytes;
    }
    /// Byte-nanoseconds since the last reset.
    fn integral(&self, now: Time) -> u128 {
        (self.acc + self.cur as i128 * now as i128) as u128
    }
    /// Restarts the integral (and the maximum) at `now`.
    fn reset(&mut self, now: Time) {
        self.acc = -(self.cur as i128 * now as i128);
        self.max = self.cur;
    }
}

const NONE: u32 = u32::MAX;

/// A FIFO of packets threaded through the slab (`Slot::next`): no buffer of
/// its own, so queueing a packet touches only the port and the packet.
#[derive(Clone, Copy, Debug)]
struct SlotList {
    head: u32,
    tail: u32,
}

impl SlotList {
    const EMPTY: SlotList = SlotList {
        head: NONE,
        tail: NONE,
    };
}

/// Per-priority state of a port that changes with every packet: occupancy
/// and counters, in one cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
struct PrioStat {
    q: QueueStat,
    tx_packets: u64,
    tx_bytes: u64,
    drops: u64,
}

/// An output port, laid out so that a packet passing through touches three
/// cache lines of it: the first (everything but the queues and statistics),
/// the queue heads (only when the port is busy) and its priority's
/// [`PrioStat`]. The static description comes last.
#[repr(C, align(64))]
struct Port {
    in_service: u32,
    /// The sending host if this is a NIC, else `NONE`.
    from_host: u32,
    /// `info.to` when it is a host, else `NONE`.
    to_host: u32,
    /// `info.to` when it is a switch, else `NONE`.
    to_switch: u32,
    /// Wire length and priority of the packet in service (so that its end
    /// needs no look at the packet).
    svc_wire: u32,
    svc_prio: u8,
    /// Bit p set iff `queues[p]` is non-empty.
    nonempty: u8,
    /// Single FIFO instead of strict priorities (e.g. a NIC that ignores them).
    fifo: bool,
    /// The link (or the network default) may apply faults to this port's packets.
    faulty: bool,
    occupancy: u64,
    /// `info.buffer_limit`, `u64::MAX` for none.
    limit: u64,
    /// Picoseconds per byte when that is a whole number (every common link
    /// rate), else 0: then a packet's time needs no 64-bit division.
    ps_per_byte: u64,
    /// From the end of serialization to arrival: link latency plus the far
    /// node's forwarding latency or receive delay.
    arrive_delay: u64,
    rate_bps: u64,
    queues: [SlotList; PRIORITIES],
    prio: [PrioStat; PRIORITIES],
    info: LinkInfo,
}

const _: () = assert!(std::mem::offset_of!(Port, queues) == 64);
const _: () = assert!(std::mem::offset_of!(Port, prio) == 128);

struct HostNode {
    nic: u32,
    rx_delay_ns: u64,
    tx_delay_ns: u64,
    up: bool,
}

struct Switch {
    fwd_latency_ns: u64,
    /// Per destination host: (the output link when there is one candidate,
    /// else the start of the candidates in `route_ports`; their number), so
    /// that a single route costs no second lookup.
    routes: Vec<(u32, u32)>,
    route_ports: Vec<u32>,
}

/// A packet in flight, in one cache line (a [`Packet`] with 32-bit host
/// indices, its wire length and its link in a port queue).
#[repr(C, align(64))]
struct Slot {
    data: Vec<u8>,
    uid: u64,
    sent_at: Time,
    src: u32,
    dst: u32,
    wire_len: u32,
    /// Next packet in the same port queue.
    next: u32,
    priority: u8,
}

impl Slot {
    /// A copy of every field but the data (which is left empty).
    fn clone_header(&self) -> Slot {
        Slot {
            data: Vec::new(),
            ..*self
        }
    }
}

/// Most recycled buffers kept; beyond this they are freed.
const MAX_FREE_BUFS: usize = 4096;
/// Capacity of a new packet buffer.
const NEW_BUF_BYTES: usize = 1_536;

/// The network: topology, queues, in-flight packets, the event queue and all
/// statistics. Build it with [`Fabric::new`] and the `add_*`/`link`/`connect`
/// methods (or [`Fabric::star`], [`Fabric::two_level`]), call
/// [`Fabric::compute_routes`], then run it with a [`Hosts`] implementation.
pub struct Fabric {
    now: Time,
    queue: EventQueue,
    seed: u64,
    ports: Vec<Port>,
    hosts: Vec<HostNode>,
    switches: Vec<Switch>,
    slab: Vec<Slot>,
    free_slots: Vec<u32>,
    bufs: Vec<Vec<u8>>,
    fault_rng: ChaCha8Rng,
    default_faults: Option<FaultConfig>,
    partitions: Vec<Partition>,
    fault_stats: FaultStats,
    stats: NetStats,
    overhead_bytes: u32,
    ecmp: Ecmp,
    next_uid: u64,
    trace: Option<u64>,
    stats_since: Time,
    events: u64,
}

/// SplitMix64 finalizer: a cheap, well-mixed, deterministic hash step
/// (also the simulator's seed derivation): the engine's
/// [`homa_proto::splitmix64`].
pub use homa_proto::splitmix64 as mix;

/// FNV-1a over bytes, for trace hashing.
pub(crate) fn fnv(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in data {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Time to serialize `wire_bytes` at `rate_bps`, in ns (also the
/// simulator's analytic best case, which must round alike).
pub fn tx_time(wire_bytes: u64, rate_bps: u64) -> Time {
    // Rounded up to whole ns; u64 is enough for 64 KB datagrams at any rate.
    (wire_bytes * 8 * 1_000_000_000).div_ceil(rate_bps.max(1))
}

impl Port {
    /// [`tx_time`] at this port's rate.
    #[inline]
    fn tx_time(&self, wire_bytes: u64) -> Time {
        if self.ps_per_byte != 0 {
            // Exact: ps_per_byte = 8e12 / rate, so this is the same fraction.
            (wire_bytes * self.ps_per_byte).div_ceil(1000)
        } else {
            tx_time(wire_bytes, self.rate_bps)
        }
    }
}

impl Fabric {
    /// An empty network whose randomness (fault decisions, ECMP hashing) derives
    /// from `seed`.
    pub fn new(seed: u64) -> Fabric {
        Fabric {
            now: 0,
            queue: EventQueue::default(),
            seed,
            ports: Vec::new(),
            hosts: Vec::new(),
            switches: Vec::new(),
            slab: Vec::new(),
            free_slots: Vec::new(),
            bufs: Vec::new(),
            fault_rng: ChaCha8Rng::seed_from_u64(mix(seed ^ 0xFA17)),
            default_faults: None,
            partitions: Vec::new(),
            fault_stats: FaultStats::default(),
            stats: NetStats::default(),
            overhead_bytes: 0,
            ecmp: Ecmp::Spray,
            next_uid: 0,
            trace: None,
            stats_since: 0,
            events: 0,
        }
    }

    /// Replaces the seed (and restarts the fault RNG from it). Call before running.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
        self.fault_rng = ChaCha8Rng::seed_from_u64(mix(seed ^ 0xFA17));
    }

    /// Builder form of [`Fabric::set_seed`].
    pub fn with_seed(mut self, seed: u64) -> Fabric {
        self.set_seed(seed);
        self
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    // ----- topology -----

    /// Adds a host (no uplink yet, no receive delay).
    pub fn add_host(&mut self) -> HostId {
        self.hosts.push(HostNode {
            nic: NONE,
            rx_delay_ns: 0,
            tx_delay_ns: 0,
            up: true,
        });
        self.hosts.len() - 1
    }

    /// Software delay added to every packet a host receives before it sees it.
    pub fn set_host_rx_delay(&mut self, h: HostId, ns: u64) {
        self.hosts[h].rx_delay_ns = ns;
        self.refresh_arrive_delays(|_, to| to == Node::Host(h));
    }

    /// Fixed delay added to every packet a host sends, between the end of its
    /// serialization on the NIC and its arrival at the next node: the host's
    /// transmit software path and NIC latency, which delay a packet without
    /// occupying the link (HomaSimulation's output hook and NIC think time).
    pub fn set_host_tx_delay(&mut self, h: HostId, ns: u64) {
        self.hosts[h].tx_delay_ns = ns;
        self.refresh_arrive_delays(|from, _| from == Node::Host(h));
    }

    /// From the end of serialization on a link `from` → `to` to the packet's
    /// arrival: the link's latency, the sending host's transmit delay and the
    /// far node's forwarding latency or receive delay.
    fn arrive_delay(&self, from: Node, to: Node, latency_ns: u64) -> u64 {
        let tx = match from {
            Node::Host(h) => self.hosts[h].tx_delay_ns,
            Node::Switch(_) => 0,
        };
        let node = match to {
            Node::Switch(s) => self.switches[s].fwd_latency_ns,
            Node::Host(h) => self.hosts[h].rx_delay_ns,
        };
        latency_ns + tx + node
    }

    /// Recomputes `arrive_delay` of the links for which `which(from, to)`.
    fn refresh_arrive_delays(&mut self, which: impl Fn(Node, Node) -> bool) {
        for i in 0..self.ports.len() {
            let info = &self.ports[i].info;
            if which(info.from, info.to) {
                let d = self.arrive_delay(info.from, info.to, info.latency_ns);
                self.ports[i].arrive_delay = d;
            }
        }
    }

    /// Adds a switch that needs `fwd_latency_ns` to forward a received packet
    /// to its output port.
    pub fn add_switch(&mut self, fwd_latency_ns: u64) -> SwitchId {
        self.switches.push(Switch {
            fwd_latency_ns,
            routes: Vec::new(),
            route_ports: Vec::new(),
        });
        self.switches.len() - 1
    }

    /// Adds a unidirectional link. A host may have only one outgoing link (its
    /// NIC); panics otherwise, or if a node does not exist.
    pub fn link(&mut self, from: Node, to: Node, rate_bps: u64, latency_ns: u64) -> LinkId {
        assert!(rate_bps > 0, "link rate must be positive");
        for n in [from, to] {
            match n {
                Node::Host(h) => assert!(h < self.hosts.len(), "no host {h}"),
                Node::Switch(s) => assert!(s < self.switches.len(), "no switch {s}"),
            }
        }
        let id = self.ports.len();
        if let Node::Host(h) = from {
            assert!(self.hosts[h].nic == NONE, "host {h} already has an uplink");
            self.hosts[h].nic = id as u32;
        }
        let arrive_delay = self.arrive_delay(from, to, latency_ns);
        self.ports.push(Port {
            in_service: NONE,
            from_host: match from {
                Node::Host(h) => h as u32,
                Node::Switch(_) => NONE,
            },
            to_host: match to {
                Node::Host(h) => h as u32,
                Node::Switch(_) => NONE,
            },
            to_switch: match to {
                Node::Switch(s) => s as u32,
                Node::Host(_) => NONE,
            },
            svc_wire: 0,
            svc_prio: 0,
            nonempty: 0,
            fifo: false,
            faulty: false,
            occupancy: 0,
            limit: u64::MAX,
            ps_per_byte: if 8_000_000_000_000 % rate_bps == 0 {
                8_000_000_000_000 / rate_bps
            } else {
                0
            },
            arrive_delay,
            rate_bps,
            queues: [SlotList::EMPTY; PRIORITIES],
            prio: [PrioStat::default(); PRIORITIES],
            info: LinkInfo {
                from,
                to,
                rate_bps,
                latency_ns,
                buffer_limit: None,
                faults: None,
            },
        });
        self.update_faulty(id);
        id
    }

    /// Adds a link in each direction with the same rate and latency; returns
    /// (a→b, b→a).
    pub fn connect(
        &mut self,
        a: Node,
        b: Node,
        rate_bps: u64,
        latency_ns: u64,
    ) -> (LinkId, LinkId) {
        (
            self.link(a, b, rate_bps, latency_ns),
            self.link(b, a, rate_bps, latency_ns),
        )
    }

    /// Limits a port's buffer (queued plus in-service wire bytes); packets that
    /// do not fit are tail-dropped and counted per priority.
    pub fn set_buffer_limit(&mut self, l: LinkId, bytes: Option<u64>) {
        self.ports[l].info.buffer_limit = bytes;
        self.ports[l].limit = bytes.unwrap_or(u64::MAX);
    }

    /// With `false`, the port serves one FIFO queue regardless of priority
    /// (statistics stay per priority). Default `true` (8 strict-priority queues).
    /// Takes effect for packets queued from now on.
    pub fn set_priority_queues(&mut self, l: LinkId, on: bool) {
        self.ports[l].fifo = !on;
    }

    /// Sets the buffer limit of every switch output port.
    pub fn set_switch_buffer_limits(&mut self, bytes: Option<u64>) {
        for p in &mut self.ports {
            if matches!(p.info.from, Node::Switch(_)) {
                p.info.buffer_limit = bytes;
                p.limit = bytes.unwrap_or(u64::MAX);
            }
        }
    }

    /// Bytes counted on the wire per packet on top of the datagram (e.g.
    /// Ethernet + IP + UDP headers and framing). Default 0.
    pub fn set_overhead_bytes(&mut self, bytes: u32) {
        self.overhead_bytes = bytes;
    }

    pub fn set_ecmp(&mut self, mode: Ecmp) {
        self.ecmp = mode;
    }

    /// Sets every switch's route for destination host `dst` to the candidate
    /// output links `links` (all must leave `switch`); one is chosen per packet
    /// (or per flow) when there are several.
    pub fn set_route(&mut self, switch: SwitchId, dst: HostId, links: &[LinkId]) {
        for &l in links {
            assert_eq!(
                self.ports[l].info.from,
                Node::Switch(switch),
                "link {l} does not leave switch {switch}"
            );
        }
        let n = self.hosts.len();
        let sw = &mut self.switches[switch];
        if sw.routes.len() < n {
            sw.routes.resize(n, (0, 0));
        }
        sw.routes[dst] = match links {
            [l] => (*l as u32, 1),
            _ => {
                let start = sw.route_ports.len() as u32;
                sw.route_ports.extend(links.iter().map(|&l| l as u32));
                (start, links.len() as u32)
            }
        };
    }

    /// Replaces every switch's routing table with all shortest paths (in hops)
    /// to each host; equal-cost next hops become ECMP candidates. Packets never
    /// transit a host.
    pub fn compute_routes(&mut self) {
        let nh = self.hosts.len();
        let ns = self.switches.len();
        let idx = |n: Node| match n {
            Node::Host(h) => h,
            Node::Switch(s) => nh + s,
        };
        let mut in_links: Vec<Vec<u32>> = vec![Vec::new(); nh + ns];
        let mut out_links: Vec<Vec<u32>> = vec![Vec::new(); ns];
        for (i, p) in self.ports.iter().enumerate() {
            in_links[idx(p.info.to)].push(i as u32);
            if let Node::Switch(s) = p.info.from {
                out_links[s].push(i as u32);
            }
        }
        for sw in &mut self.switches {
            sw.routes.clear();
            sw.routes.resize(nh, (0, 0));
            sw.route_ports.clear();
        }
        let mut dist = vec![u32::MAX; nh + ns];
        let mut frontier = VecDeque::new();
        for d in 0..nh {
            dist.iter_mut().for_each(|x| *x = u32::MAX);
            dist[d] = 0;
            frontier.clear();
            frontier.push_back(d);
            while let Some(v) = frontier.pop_front() {
                for &p in &in_links[v] {
                    if let Node::Switch(s) = self.ports[p as usize].info.from {
                        if dist[nh + s] == u32::MAX {
                            dist[nh + s] = dist[v] + 1;
                            frontier.push_back(nh + s);
                        }
                    }
                }
            }
            for (s, outs) in out_links.iter().enumerate() {
                let ds = dist[nh + s];
                if ds == u32::MAX {
                    continue;
                }
                let sw = &mut self.switches[s];
                let start = sw.route_ports.len() as u32;
                for &p in outs {
                    if dist[idx(self.ports[p as usize].info.to)] == ds - 1 {
                        sw.route_ports.push(p);
                    }
                }
                let len = sw.route_ports.len() as u32 - start;
                sw.routes[d] = if len == 1 {
                    (sw.route_ports.pop().expect("one candidate"), 1)
                } else {
                    (start, len)
                };
            }
        }
    }

    // ----- faults -----

    /// Faults applied on every link whose far end is a host and that has no
    /// faults of its own, i.e. once per packet end to end.
    pub fn set_faults(&mut self, cfg: FaultConfig) {
        self.default_faults = if cfg.is_active() { Some(cfg) } else { None };
        for l in 0..self.ports.len() {
            self.update_faulty(l);
        }
    }

    /// The faults that apply to packets leaving port `l`, if any.
    fn port_faults(&self, l: LinkId) -> Option<FaultConfig> {
        let p = &self.ports[l];
        match (p.info.faults, p.info.to) {
            (Some(c), _) => Some(c),
            (None, Node::Host(_)) => self.default_faults,
            _ => None,
        }
        .filter(|c| c.is_active())
    }

    fn update_faulty(&mut self, l: LinkId) {
        self.ports[l].faulty = self.port_faults(l).is_some();
    }

    /// Faults of one link (`None`: the network default if the link ends at a
    /// host, else none). Applied at every traversal of the link.
    pub fn set_link_faults(&mut self, l: LinkId, cfg: Option<FaultConfig>) {
        self.ports[l].info.faults = cfg;
        self.update_faulty(l);
    }

    /// Adds a partition (see [`Partition`]); checked at delivery time.
    pub fn add_partition(&mut self, p: Partition) {
        self.partitions.push(p);
    }

    pub fn clear_partitions(&mut self) {
        self.partitions.clear();
    }

    /// Marks a host up or down. A down host's packets are dropped both when it
    /// sends and when they arrive (counted in `FaultStats::host_down_drops`).
    pub fn set_host_up(&mut self, h: HostId, up: bool) {
        self.hosts[h].up = up;
    }

    pub fn is_host_up(&self, h: HostId) -> bool {
        self.hosts[h].up
    }

    /// Discards every packet waiting in host `h`'s NIC queue (not the one being
    /// serialized, which is already on the wire). Returns how many.
    pub fn purge_nic(&mut self, h: HostId) -> usize {
        let nic = self.hosts[h].nic;
        if nic == NONE {
            return 0;
        }
        let now = self.now;
        let mut n = 0;
        while let Some(s) = self.pop_highest(nic as usize) {
            let wire = self.slab[s as usize].wire_len as u64;
            let prio = self.slab[s as usize].priority as usize;
            let port = &mut self.ports[nic as usize];
            port.occupancy -= wire;
            port.prio[prio].q.sub(now, wire);
            self.free_slot(s);
            n += 1;
        }
        self.fault_stats.crash_purged += n as u64;
        n
    }

    /// Counts a crash or restart performed by a driver.
    pub fn count_crash(&mut self, restart: bool) {
        if restart {
            self.fault_stats.restarts += 1;
        } else {
            self.fault_stats.crashes += 1;
        }
    }

    // ----- buffers and sending -----

    /// An empty buffer, recycled if possible.
    #[inline]
    pub fn take_buf(&mut self) -> Vec<u8> {
        // A new one holds a full Ethernet-sized datagram without growing.
        self.bufs
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(NEW_BUF_BYTES))
    }

    /// Returns a buffer for reuse.
    #[inline]
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.bufs.len() < MAX_FREE_BUFS && buf.capacity() > 0 {
            buf.clear();
            self.bufs.push(buf);
        }
    }

    /// Hands a datagram from host `src` to its NIC queue at priority
    /// `priority` (clamped to 7). Returns false if it was dropped at once
    /// (no route, host down, NIC buffer full); the drop is counted.
    #[inline]
    pub fn send(&mut self, src: HostId, dst: HostId, priority: u8, data: Vec<u8>) -> bool {
        let nic = self.hosts[src].nic;
        self.stats.injected += 1;
        if !self.hosts[src].up {
            self.fault_stats.host_down_drops += 1;
            self.recycle(data);
            return false;
        }
        if nic == NONE || dst >= self.hosts.len() {
            self.stats.no_route += 1;
            self.recycle(data);
            return false;
        }
        let uid = self.next_uid;
        self.next_uid += 1;
        let wire_len = data.len() as u32 + self.overhead_bytes;
        let slot = self.alloc_slot(Slot {
            data,
            uid,
            sent_at: self.now,
            src: src as u32,
            dst: dst as u32,
            wire_len,
            next: NONE,
            priority: priority.min(7),
        });
        self.enqueue(nic as usize, slot)
    }

    /// Counts a datagram whose destination address maps to no host.
    pub fn count_no_route(&mut self) {
        self.stats.no_route += 1;
    }

    /// Inlined so that the slot is written in place (a 64-byte `Slot` passed
    /// through the stack was stalled on store forwarding).
    #[inline(always)]
    fn alloc_slot(&mut self, slot: Slot) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.slab[i as usize] = slot;
                i
            }
            None => {
                self.slab.push(slot);
                (self.slab.len() - 1) as u32
            }
        }
    }

    #[inline]
    fn take_slot(&mut self, i: u32) -> Packet {
        self.free_slots.push(i);
        let s = &mut self.slab[i as usize];
        Packet {
            src: s.src as HostId,
            dst: s.dst as HostId,
            priority: s.priority,
            uid: s.uid,
            sent_at: s.sent_at,
            data: std::mem::take(&mut s.data),
        }
    }

    fn free_slot(&mut self, i: u32) {
        self.free_slots.push(i);
        let data = std::mem::take(&mut self.slab[i as usize].data);
        self.recycle(data);
    }

    #[inline]
    fn enqueue(&mut self, port: usize, slot: u32) -> bool {
        let sl = &mut self.slab[slot as usize];
        let wire = sl.wire_len as u64;
        let prio = sl.priority as usize;
        sl.next = NONE;
        let now = self.now;
        let p = &mut self.ports[port];
        if p.occupancy + wire > p.limit {
            p.prio[prio].drops += 1;
            self.stats.buffer_drops += 1;
            self.free_slot(slot);
            return false;
        }
        p.occupancy += wire;
        p.prio[prio].q.add(now, wire);
        if p.in_service == NONE {
            p.in_service = slot;
            p.svc_wire = wire as u32;
            p.svc_prio = prio as u8;
            let t = now + p.tx_time(wire);
            self.queue.push(t, Ev::TxDone { port: port as u32 });
        } else {
            let qi = if p.fifo { 0 } else { prio };
            let q = &mut p.queues[qi];
            if q.tail == NONE {
                q.head = slot;
                p.nonempty |= 1 << qi;
            } else {
                self.slab[q.tail as usize].next = slot;
            }
            q.tail = slot;
        }
        true
    }

    /// Takes the first packet of port `port`'s highest non-empty queue.
    #[inline]
    fn pop_highest(&mut self, port: usize) -> Option<u32> {
        let p = &mut self.ports[port];
        if p.nonempty == 0 {
            return None;
        }
        let qi = 7 - p.nonempty.leading_zeros() as usize;
        let q = &mut p.queues[qi];
        let s = q.head;
        q.head = self.slab[s as usize].next;
        if q.head == NONE {
            q.tail = NONE;
            p.nonempty &= !(1 << qi);
        }
        Some(s)
    }

    // ----- timers and the event loop -----

    /// Schedules `Hosts::timer(host, kind, token)` at `at` (or now, if `at` is
    /// in the past).
    #[inline]
    pub fn schedule(&mut self, at: Time, host: HostId, kind: u32, token: u64) {
        self.queue.push(
            at.max(self.now),
            Ev::Timer {
                host: host as u32,
                kind,
                token,
            },
        );
    }

    /// Current virtual time (ns).
    #[inline]
    pub fn now(&self) -> Time {
        self.now
    }

    /// Time of the next pending event.
    pub fn next_event_time(&self) -> Option<Time> {
        self.queue.peek_time()
    }

    /// Processes one event; false if there was none.
    pub fn step<H: Hosts + ?Sized>(&mut self, hosts: &mut H) -> bool {
        self.step_until(hosts, Time::MAX)
    }

    /// Processes the next event if it is due at or before `limit`; false if
    /// there was none. (One look at the queue instead of a peek and a pop.)
    #[inline]
    pub fn step_until<H: Hosts + ?Sized>(&mut self, hosts: &mut H, limit: Time) -> bool {
        let Some((t, ev)) = self.queue.pop_until(limit) else {
            return false;
        };
        debug_assert!(t >= self.now);
        self.now = t;
        self.events += 1;
        match ev {
            Ev::TxDone { port } => self.tx_done(port as usize, hosts),
            Ev::Arrive { port, pkt } => self.arrive(port as usize, pkt, hosts),
            Ev::Timer { host, kind, token } => hosts.timer(self, host as HostId, kind, token),
        }
        true
    }

    /// Processes every event up to and including time `t`, then sets the clock to `t`.
    pub fn run_until<H: Hosts + ?Sized>(&mut self, hosts: &mut H, t: Time) {
        while self.step_until(hosts, t) {}
        self.now = self.now.max(t);
    }

    /// Processes events until none is left (true) or the next one is later
    /// than `limit` (false; the clock stays at the last event processed).
    pub fn run_until_idle<H: Hosts + ?Sized>(&mut self, hosts: &mut H, limit: Time) -> bool {
        while let Some(t) = self.queue.peek_time() {
            if t > limit {
                return false;
            }
            self.step(hosts);
        }
        true
    }

    fn tx_done<H: Hosts + ?Sized>(&mut self, port: usize, hosts: &mut H) {
        let now = self.now;
        let p = &self.ports[port];
        let slot = p.in_service;
        debug_assert!(slot != NONE);
        let (wire, prio) = (p.svc_wire as u64, p.svc_prio as usize);
        // Start the next packet before anyone can add to the queue.
        let next = self.pop_highest(port);
        let next_svc = next.map(|n| {
            let sl = &self.slab[n as usize];
            (sl.wire_len, sl.priority)
        });
        let p = &mut self.ports[port];
        p.occupancy -= wire;
        let ps = &mut p.prio[prio];
        ps.q.sub(now, wire);
        ps.tx_packets += 1;
        ps.tx_bytes += wire;
        p.in_service = NONE;
        if let (Some(next), Some((next_wire, next_prio))) = (next, next_svc) {
            p.in_service = next;
            p.svc_wire = next_wire;
            p.svc_prio = next_prio;
            let t = now + p.tx_time(next_wire as u64);
            self.queue.push(t, Ev::TxDone { port: port as u32 });
        }
        let mut arrival = now + p.arrive_delay;
        let from_host = p.from_host;
        let faulty = p.faulty;
        let arrive = Ev::Arrive {
            port: port as u32,
            pkt: slot,
        };
        if !faulty {
            self.queue.push(arrival, arrive);
        } else {
            let cfg = self.port_faults(port).expect("faulty port has faults");
            let data = &mut self.slab[slot as usize].data;
            let fate = faults::decide(&cfg, &mut self.fault_rng, data, &mut self.fault_stats);
            if fate.drop {
                self.free_slot(slot);
            } else {
                arrival += fate.extra_delay;
                self.queue.push(arrival, arrive);
                if fate.duplicate {
                    let mut copy = self.take_buf();
                    let orig = &self.slab[slot as usize];
                    copy.extend_from_slice(&orig.data);
                    let dup = Slot {
                        data: copy,
                        next: NONE,
                        ..orig.clone_header()
                    };
                    let dslot = self.alloc_slot(dup);
                    self.queue.push(
                        arrival,
                        Ev::Arrive {
                            port: port as u32,
                            pkt: dslot,
                        },
                    );
                }
            }
        }
        if from_host != NONE {
            hosts.nic_done(self, from_host as HostId);
        }
    }

    fn arrive<H: Hosts + ?Sized>(&mut self, port: usize, slot: u32, hosts: &mut H) {
        let (to_switch, to_host) = (self.ports[port].to_switch, self.ports[port].to_host);
        if to_switch != NONE {
            let s = to_switch as usize;
            let pkt = &self.slab[slot as usize];
            let sw = &self.switches[s];
            let (start, len) = sw.routes.get(pkt.dst as usize).copied().unwrap_or((0, 0));
            if len == 0 {
                self.stats.no_route += 1;
                self.free_slot(slot);
                return;
            }
            let out = if len == 1 {
                start as usize
            } else {
                let key = match self.ecmp {
                    Ecmp::Spray => pkt.uid,
                    Ecmp::Flow => ((pkt.src as u64) << 32) ^ pkt.dst as u64,
                };
                let hash = mix(self.seed ^ mix(key ^ ((s as u64) << 40)));
                // The same pick as `hash % len`, without a division for the
                // usual power-of-two fan-out.
                let pick = if len.is_power_of_two() {
                    (hash & (len as u64 - 1)) as u32
                } else {
                    (hash % len as u64) as u32
                };
                sw.route_ports[(start + pick) as usize] as usize
            };
            self.enqueue(out, slot);
        } else {
            let h = to_host as HostId;
            let pkt = self.take_slot(slot);
            if pkt.dst != h {
                self.stats.misrouted += 1;
                self.recycle(pkt.data);
                return;
            }
            if !self.hosts[h].up {
                self.fault_stats.host_down_drops += 1;
                self.recycle(pkt.data);
                return;
            }
            if !self.partitions.is_empty() {
                let now = self.now;
                if self
                    .partitions
                    .iter()
                    .any(|p| p.blocks(pkt.src, pkt.dst, now))
                {
                    self.fault_stats.partitioned += 1;
                    self.recycle(pkt.data);
                    return;
                }
            }
            self.stats.delivered += 1;
            self.stats.delivered_bytes += pkt.data.len() as u64;
            if let Some(t) = self.trace.as_mut() {
                for v in [
                    self.now,
                    pkt.src as u64,
                    pkt.dst as u64,
                    pkt.priority as u64,
                    fnv(&pkt.data),
                ] {
                    *t = mix(*t ^ v);
                }
            }
            hosts.deliver(self, h, pkt);
        }
    }

    // ----- tracing and statistics -----

    /// Turns on (or off) a running hash of every delivery (time, endpoints,
    /// priority, bytes), for determinism checks.
    pub fn enable_trace(&mut self, on: bool) {
        self.trace = if on { Some(0) } else { None };
    }

    /// The delivery hash (0 if tracing is off).
    pub fn trace_hash(&self) -> u64 {
        self.trace.unwrap_or(0)
    }

    /// Folds a value into the trace hash (drivers add their own observations).
    pub fn trace_mix(&mut self, v: u64) {
        if let Some(t) = self.trace.as_mut() {
            *t = mix(*t ^ v);
        }
    }

    #[inline]
    pub fn trace_enabled(&self) -> bool {
        self.trace.is_some()
    }

    pub fn n_hosts(&self) -> usize {
        self.hosts.len()
    }
    pub fn n_switches(&self) -> usize {
        self.switches.len()
    }
    pub fn n_links(&self) -> usize {
        self.ports.len()
    }

    pub fn link_info(&self, l: LinkId) -> &LinkInfo {
        &self.ports[l].info
    }

    /// The first link from `from` to `to`, if any.
    pub fn find_link(&self, from: Node, to: Node) -> Option<LinkId> {
        self.ports
            .iter()
            .position(|p| p.info.from == from && p.info.to == to)
    }

    /// Host `h`'s uplink.
    pub fn host_nic(&self, h: HostId) -> Option<LinkId> {
        let n = self.hosts[h].nic;
        (n != NONE).then_some(n as usize)
    }

    /// Wire bytes in a link's output port (queued plus in service).
    pub fn port_backlog(&self, l: LinkId) -> u64 {
        self.ports[l].occupancy
    }

    /// Time host `h`'s NIC takes to serialize a datagram of `len` bytes
    /// (per-packet overhead included; 0 if it has no NIC).
    pub fn host_tx_time(&self, h: HostId, len: usize) -> Time {
        self.host_nic(h).map_or(0, |l| {
            self.ports[l].tx_time(len as u64 + self.overhead_bytes as u64)
        })
    }

    /// Wire bytes in host `h`'s NIC (0 if it has none).
    pub fn nic_backlog(&self, h: HostId) -> u64 {
        self.host_nic(h).map_or(0, |l| self.port_backlog(l))
    }

    /// Host `h`'s synthetic address (see [`host_addr`]).
    pub fn addr(&self, h: HostId) -> SocketAddr {
        host_addr(h)
    }

    /// The host with address `addr`, if it exists in this network.
    #[inline]
    pub fn host_of(&self, addr: SocketAddr) -> Option<HostId> {
        addr_host(addr).filter(|&h| h < self.hosts.len())
    }

    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    pub fn fault_stats(&self) -> &FaultStats {
        &self.fault_stats
    }

    pub fn link_stats(&self, l: LinkId) -> LinkStats {
        let mut st = LinkStats::default();
        for (p, ps) in self.ports[l].prio.iter().enumerate() {
            st.tx_packets += ps.tx_packets;
            st.tx_bytes += ps.tx_bytes;
            st.tx_packets_by_prio[p] = ps.tx_packets;
            st.drops[p] = ps.drops;
        }
        st
    }

    /// Occupancy of a link's output queues since the last stats reset.
    pub fn queue_report(&self, l: LinkId) -> QueueReport {
        let now = self.now;
        let span = now.saturating_sub(self.stats_since);
        let mut r = QueueReport::default();
        for (p, q) in self.ports[l].prio.iter().map(|ps| &ps.q).enumerate() {
            let integral = q.integral(now);
            r.avg_bytes[p] = if span == 0 {
                q.cur as f64
            } else {
                integral as f64 / span as f64
            };
            r.max_bytes[p] = q.max;
            r.cur_bytes[p] = q.cur;
        }
        r
    }

    /// Fraction of time since the last stats reset the link spent serializing.
    pub fn link_utilization(&self, l: LinkId) -> f64 {
        let span = self.now.saturating_sub(self.stats_since);
        if span == 0 {
            return 0.0;
        }
        self.link_stats(l).tx_bytes as f64 * 8.0 * 1e9
            / self.ports[l].info.rate_bps as f64
            / span as f64
    }

    /// Zeroes every counter and restarts the occupancy averages now (for
    /// discarding a warm-up period). Current occupancy becomes the new maximum.
    pub fn reset_stats(&mut self) {
        let now = self.now;
        for p in &mut self.ports {
            for ps in &mut p.prio {
                *ps = PrioStat {
                    q: ps.q,
                    ..PrioStat::default()
                };
                ps.q.reset(now);
            }
        }
        self.stats = NetStats::default();
        self.fault_stats = FaultStats::default();
        self.stats_since = now;
    }

    /// Events processed so far.
    #[inline]
    pub fn events_processed(&self) -> u64 {
        self.events
    }

    /// Events ever scheduled.
    pub fn events_scheduled(&self) -> u64 {
        self.queue.scheduled()
    }

    /// Events waiting in the queue (stale timers included).
    pub fn pending_events(&self) -> usize {
        self.queue.len()
    }

    /// Packets queued, being serialized or propagating.
    pub fn packets_in_flight(&self) -> usize {
        self.slab.len() - self.free_slots.len()
    }
}

// ----- topology builders -----

/// Parameters of a two-level (leaf/spine) network: racks of hosts under
/// top-of-rack switches, every ToR linked to every aggregation switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TwoLevel {
    pub racks: usize,
    pub hosts_per_rack: usize,
    pub host_bps: u64,
    pub uplink_bps: u64,
    pub aggs: usize,
    /// Propagation latency of every link (ns).
    pub link_latency_ns: u64,
    /// Forwarding latency of every switch (ns).
    pub switch_latency_ns: u64,
}

impl TwoLevel {
    /// The Homa paper's simulated network: 9 racks of 16 hosts, 10 Gbps host
    /// links, 4 aggregation switches with 40 Gbps ToR uplinks (full bisection).
    pub fn paper() -> TwoLevel {
        TwoLevel {
            racks: 9,
            hosts_per_rack: 16,
            host_bps: 10_000_000_000,
            uplink_bps: 40_000_000_000,
            aggs: 4,
            link_latency_ns: 100,
            switch_latency_ns: 250,
        }
    }
}

impl Fabric {
    /// `n_hosts` hosts on one switch (switch 0); host `h`'s uplink is link
    /// `2h`, the switch's port to it link `2h+1`. Routes computed.
    pub fn star(n_hosts: usize, link_bps: u64, latency_ns: u64, switch_latency_ns: u64) -> Fabric {
        let mut f = Fabric::new(0);
        let sw = f.add_switch(switch_latency_ns);
        for _ in 0..n_hosts {
            let h = f.add_host();
            f.connect(Node::Host(h), Node::Switch(sw), link_bps, latency_ns);
        }
        f.compute_routes();
        f
    }

    /// A two-level network. Hosts are numbered rack by rack (host
    /// `r * hosts_per_rack + i`); ToR `r` is switch `r`, aggregation switch `a`
    /// is switch `racks + a`. Routes computed: traffic between racks is
    /// sprayed over all aggregation switches.
    pub fn two_level(spec: &TwoLevel) -> Fabric {
        let mut f = Fabric::new(0);
        let tors: Vec<SwitchId> = (0..spec.racks)
            .map(|_| f.add_switch(spec.switch_latency_ns))
            .collect();
        let aggs: Vec<SwitchId> = (0..spec.aggs)
            .map(|_| f.add_switch(spec.switch_latency_ns))
            .collect();
        for &tor in &tors {
            for _ in 0..spec.hosts_per_rack {
                let h = f.add_host();
                f.connect(
                    Node::Host(h),
                    Node::Switch(tor),
                    spec.host_bps,
                    spec.link_latency_ns,
                );
            }
        }
        for &tor in &tors {
            for &agg in &aggs {
                f.connect(
                    Node::Switch(tor),
                    Node::Switch(agg),
                    spec.uplink_bps,
                    spec.link_latency_ns,
                );
            }
        }
        f.compute_routes();
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for h in [0, 1, 255, 256, 70_000] {
            assert_eq!(addr_host(host_addr(h)), Some(h));
        }
        assert_eq!(host_addr(0).to_string(), "10.0.0.1:4000");
        assert_eq!(addr_host("10.0.0.0:4000".parse().unwrap()), None);
        assert_eq!(addr_host("10.0.0.1:4001".parse().unwrap()), None);
        assert_eq!(addr_host("[::1]:4000".parse().unwrap()), None);
        let f = Fabric::star(3, 1_000_000_000, 0, 0);
        assert_eq!(f.host_of(host_addr(2)), Some(2));
        assert_eq!(f.host_of(host_addr(3)), None);
    }

    #[test]
    fn tx_time_rounds_up() {
        assert_eq!(tx_time(1500, 10_000_000_000), 1200);
        assert_eq!(tx_time(1, 3_000_000_000), 3); // 2.67 ns
        assert_eq!(tx_time(0, 1), 0);
    }

    #[test]
    fn port_tx_time_equals_the_general_formula() {
        let mut f = Fabric::new(0);
        let a = f.add_host();
        let b = f.add_host();
        for rate in [
            1_000_000_000u64,
            3_000_000_000,
            10_000_000_000,
            25_000_000_000,
            40_000_000_000,
            100_000_000_000,
            7_777_777_777,
        ] {
            f.hosts[a].nic = NONE;
            let l = f.link(Node::Host(a), Node::Host(b), rate, 0);
            let p = &f.ports[l];
            assert_eq!(p.ps_per_byte != 0, 8_000_000_000_000 % rate == 0);
            for wire in [0u64, 1, 7, 66, 1000, 1538, 9000, 65_601] {
                assert_eq!(p.tx_time(wire), tx_time(wire, rate), "{rate} {wire}");
            }
        }
    }

    #[test]
    fn two_level_routes_use_every_agg() {
        let spec = TwoLevel {
            racks: 3,
            hosts_per_rack: 2,
            aggs: 4,
            ..TwoLevel::paper()
        };
        let f = Fabric::two_level(&spec);
        assert_eq!(f.n_hosts(), 6);
        assert_eq!(f.n_switches(), 7);
        // ToR 0 to a host in rack 1: four uplinks; to a host in its own rack: one downlink.
        let sw = &f.switches[0];
        assert_eq!(sw.routes[2].1, 4);
        assert_eq!(sw.routes[1].1, 1);
        let down = sw.routes[1].0 as usize;
        assert_eq!(f.link_info(down).to, Node::Host(1));
        // An aggregation switch has exactly one way down to each host.
        let agg = &f.switches[3];
        for h in 0..6 {
            assert_eq!(agg.routes[h].1, 1);
        }
    }
}
