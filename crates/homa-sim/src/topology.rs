//! Simulated topologies and their analytic best-case message latency.
//!
//! The network itself is `homa_testnet::Fabric`; this module describes which
//! fabric to build (the paper's two-level network, a single-switch star, or
//! any two-level network given by parameters), the per-packet framing overhead
//! and host software delay, and computes from that description alone how long
//! a message takes on an otherwise idle network.

use homa_proto::wire::{self, Body, CommonHeader, Grant, DATA_PACKET_OVERHEAD};
use homa_testnet::{Ecmp, Fabric, HostId, TwoLevel};
use serde::Serialize;

/// Ethernet framing (preamble and start delimiter 8, header 14, FCS 4,
/// inter-frame gap 12) plus IPv4 (20) and UDP (8) headers: bytes a datagram
/// occupies on the wire beyond its UDP payload.
pub const ETH_IP_UDP_OVERHEAD: u32 = 8 + 14 + 4 + 12 + 20 + 8;
/// Largest UDP payload in a 1500-byte Ethernet MTU.
pub const MTU_UDP_PAYLOAD: usize = 1500 - 20 - 8;

/// Shape of the network.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Shape {
    /// `hosts` hosts on one switch.
    Star { hosts: usize },
    /// Racks of hosts under top-of-rack switches, each ToR linked to every
    /// aggregation switch; traffic between racks is sprayed per packet.
    TwoLevel {
        racks: usize,
        hosts_per_rack: usize,
        aggs: usize,
        uplink_bps: u64,
    },
}

/// Everything that determines the simulated network.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Topology {
    pub shape: Shape,
    /// Rate of every host link (both directions), bits per second.
    pub host_link_bps: u64,
    /// Propagation latency of every link (ns).
    pub link_latency_ns: u64,
    /// Forwarding latency of every switch (ns).
    pub switch_latency_ns: u64,
    /// Software delay a host adds to every packet it receives (ns).
    pub host_rx_delay_ns: u64,
    /// Delay a host adds to every packet it sends, without occupying its
    /// link (ns): transmit software path and NIC latency.
    pub host_tx_delay_ns: u64,
    /// Wire bytes per packet beyond the UDP payload.
    pub overhead_bytes: u32,
    /// Buffer of every switch output port in bytes; `None`: unlimited.
    pub switch_buffer_bytes: Option<u64>,
    /// Spray packets over the aggregation switches (else one path per
    /// sender/receiver pair, classic flow ECMP).
    pub spray: bool,
}

/// One link of a path and the node it leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    pub rate_bps: u64,
    pub latency_ns: u64,
    /// Delay of the node at the far end (switch forwarding or host software).
    pub node_delay_ns: u64,
    /// The hop is one of several equal-cost links that packets are sprayed
    /// over: on an idle network no packet of the message waits for another
    /// here (packets may overtake each other).
    pub sprayed: bool,
}

/// A path class through the network: its hops in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    pub hops: Vec<Hop>,
}

/// Time to serialize `wire_bytes` at `rate_bps`, rounded up to whole ns:
/// the network model's own function, so the best case rounds alike.
pub use homa_testnet::net::tx_time;

impl Topology {
    /// The Homa paper's simulated network: 144 hosts in 9 racks of 16, 10 Gbps
    /// host links, 40 Gbps ToR uplinks to 4 aggregation switches (full
    /// bisection), with the timing of the paper's simulator (HomaSimulation's
    /// `homaTransportConfig.ini`): no propagation delay, 250 ns per switch,
    /// and 1.5 us of host delay on every one-way trip — 500 ns of software
    /// turnaround on each side plus 500 ns of NIC think time at the sender.
    /// Those host delays are part of every message's best case too, so they
    /// set the denominator of every slowdown: leaving them out (as this
    /// simulator did before) inflates small messages' slowdowns.
    pub fn paper() -> Topology {
        let p = TwoLevel::paper();
        Topology {
            shape: Shape::TwoLevel {
                racks: p.racks,
                hosts_per_rack: p.hosts_per_rack,
                aggs: p.aggs,
                uplink_bps: p.uplink_bps,
            },
            host_link_bps: p.host_bps,
            link_latency_ns: 0,
            switch_latency_ns: 250,
            host_rx_delay_ns: 500,
            host_tx_delay_ns: 1000,
            overhead_bytes: ETH_IP_UDP_OVERHEAD,
            switch_buffer_bytes: None,
            spray: true,
        }
    }

    /// `hosts` hosts on one switch, with the paper's rates and delays.
    pub fn star(hosts: usize) -> Topology {
        Topology {
            shape: Shape::Star { hosts },
            ..Topology::paper()
        }
    }

    /// `paper`, `star:N`, or `tree:RACKSxHOSTS:AGGS` (paper rates and delays).
    pub fn parse(s: &str) -> Result<Topology, String> {
        let s = s.trim().to_ascii_lowercase();
        if s == "paper" {
            return Ok(Topology::paper());
        }
        if let Some(n) = s.strip_prefix("star:") {
            let hosts: usize = n.parse().map_err(|_| format!("bad host count in {s:?}"))?;
            if hosts < 2 {
                return Err("a star needs at least 2 hosts".into());
            }
            return Ok(Topology::star(hosts));
        }
        if let Some(rest) = s.strip_prefix("tree:") {
            let bad = || format!("expected tree:RACKSxHOSTS:AGGS, got {s:?}");
            let (rh, aggs) = rest.split_once(':').ok_or_else(bad)?;
            let (r, h) = rh.split_once('x').ok_or_else(bad)?;
            let racks: usize = r.parse().map_err(|_| bad())?;
            let hosts_per_rack: usize = h.parse().map_err(|_| bad())?;
            let aggs: usize = aggs.parse().map_err(|_| bad())?;
            if racks == 0 || hosts_per_rack == 0 || aggs == 0 || racks * hosts_per_rack < 2 {
                return Err(bad());
            }
            let mut t = Topology::paper();
            t.shape = Shape::TwoLevel {
                racks,
                hosts_per_rack,
                aggs,
                uplink_bps: 40_000_000_000,
            };
            return Ok(t);
        }
        Err(format!(
            "unknown topology {s:?} (expected paper, star:N or tree:RACKSxHOSTS:AGGS)"
        ))
    }

    /// Short name for reports.
    pub fn name(&self) -> String {
        match self.shape {
            Shape::Star { hosts } => format!("star:{hosts}"),
            Shape::TwoLevel {
                racks,
                hosts_per_rack,
                aggs,
                ..
            } => format!("tree:{racks}x{hosts_per_rack}:{aggs}"),
        }
    }

    pub fn n_hosts(&self) -> usize {
        match self.shape {
            Shape::Star { hosts } => hosts,
            Shape::TwoLevel {
                racks,
                hosts_per_rack,
                ..
            } => racks * hosts_per_rack,
        }
    }

    /// Builds the network (seeded) with framing overhead, host delays and
    /// buffer limits applied.
    pub fn build(&self, seed: u64) -> Fabric {
        let mut f = match self.shape {
            Shape::Star { hosts } => Fabric::star(
                hosts,
                self.host_link_bps,
                self.link_latency_ns,
                self.switch_latency_ns,
            ),
            Shape::TwoLevel {
                racks,
                hosts_per_rack,
                aggs,
                uplink_bps,
            } => Fabric::two_level(&TwoLevel {
                racks,
                hosts_per_rack,
                host_bps: self.host_link_bps,
                uplink_bps,
                aggs,
                link_latency_ns: self.link_latency_ns,
                switch_latency_ns: self.switch_latency_ns,
            }),
        };
        f.set_seed(seed);
        f.set_overhead_bytes(self.overhead_bytes);
        for h in 0..f.n_hosts() {
            f.set_host_rx_delay(h, self.host_rx_delay_ns);
            f.set_host_tx_delay(h, self.host_tx_delay_ns);
        }
        f.set_switch_buffer_limits(self.switch_buffer_bytes);
        f.set_ecmp(if self.spray { Ecmp::Spray } else { Ecmp::Flow });
        f
    }

    /// True if a packet from `a` to `b` crosses the aggregation layer.
    pub fn crosses_core(&self, a: HostId, b: HostId) -> bool {
        match self.shape {
            Shape::Star { .. } => false,
            Shape::TwoLevel { hosts_per_rack, .. } => a / hosts_per_rack != b / hosts_per_rack,
        }
    }

    /// The path from `a` to `b` (its class: same switch or through the core).
    pub fn path(&self, a: HostId, b: HostId) -> Path {
        let (h, l, s, d, tx) = (
            self.host_link_bps,
            self.link_latency_ns,
            self.switch_latency_ns,
            self.host_rx_delay_ns,
            self.host_tx_delay_ns,
        );
        let hop = |rate_bps, node_delay_ns, sprayed| Hop {
            rate_bps,
            latency_ns: l,
            node_delay_ns,
            sprayed,
        };
        // The sender's delay follows its NIC's serialization like the
        // propagation of its uplink.
        let first = |rate_bps, node_delay_ns| Hop {
            latency_ns: l + tx,
            ..hop(rate_bps, node_delay_ns, false)
        };
        let hops = match self.shape {
            Shape::TwoLevel {
                uplink_bps, aggs, ..
            } if self.crosses_core(a, b) => {
                let sprayed = self.spray && aggs > 1;
                vec![
                    first(h, s),
                    hop(uplink_bps, s, sprayed),
                    hop(uplink_bps, s, sprayed),
                    hop(h, d, false),
                ]
            }
            _ => vec![first(h, s), hop(h, d, false)],
        };
        Path { hops }
    }

    /// The longest path class of the network.
    pub fn longest_path(&self) -> Path {
        match self.shape {
            Shape::TwoLevel {
                racks,
                hosts_per_rack,
                ..
            } if racks > 1 => self.path(0, hosts_per_rack),
            _ => self.path(0, 1),
        }
    }

    /// One-way time of a single datagram of `len` bytes (UDP payload) along
    /// `path` on an idle network, from handing it to the NIC to its delivery.
    pub fn one_way_ns(&self, path: &Path, len: usize) -> u64 {
        let wire = len as u64 + self.overhead_bytes as u64;
        path.hops
            .iter()
            .map(|h| tx_time(wire, h.rate_bps) + h.latency_ns + h.node_delay_ns)
            .sum()
    }

    /// Round trip of a full-size DATA packet and the GRANT it triggers on the
    /// longest path: what the receiver needs to keep a sender busy, and so the
    /// engine's `rtt_ns`.
    pub fn rtt_ns(&self, max_packet_size: usize) -> u64 {
        let p = self.longest_path();
        self.one_way_ns(&p, max_packet_size) + self.one_way_ns(&p, grant_len())
    }

    /// Best-case one-way latency of a message of `size` bytes along `path` on
    /// the idle network: the engine hands its packets to the NIC back to back
    /// (all at time 0), each is stored and forwarded at every hop, and the
    /// message is delivered when its last packet has reached the receiver and
    /// passed its software delay. Computed hop by hop for every packet: a link
    /// serves packets in the order they reach it, except on sprayed hops,
    /// where each packet has a link to itself. (So a short last packet may
    /// overtake its predecessor through the core, as it does in the network.)
    pub fn best_case_ns(&self, path: &Path, size: u32, max_packet_size: usize) -> u64 {
        let per = (max_packet_size - DATA_PACKET_OVERHEAD) as u64;
        let size = size as u64;
        let n = size.div_ceil(per).max(1) as usize;
        let full_wire = max_packet_size as u64 + self.overhead_bytes as u64;
        let last_wire = (size - (n as u64 - 1) * per)
            + DATA_PACKET_OVERHEAD as u64
            + self.overhead_bytes as u64;
        let wire = |i: usize| if i + 1 == n { last_wire } else { full_wire };
        // ready[i]: when packet i reaches the current hop's queue.
        let mut ready = vec![0u64; n];
        let mut order: Vec<usize> = (0..n).collect();
        for hop in &path.hops {
            if hop.sprayed {
                for (i, r) in ready.iter_mut().enumerate() {
                    *r += tx_time(wire(i), hop.rate_bps);
                }
            } else {
                // FIFO in order of arrival (ties: the earlier packet first).
                order.sort_by_key(|&i| (ready[i], i));
                let mut free = 0u64;
                for &i in &order {
                    let end = ready[i].max(free) + tx_time(wire(i), hop.rate_bps);
                    free = end;
                    ready[i] = end;
                }
            }
            for r in ready.iter_mut() {
                *r += hop.latency_ns + hop.node_delay_ns;
            }
        }
        ready.into_iter().max().unwrap_or(0)
    }
}

/// Length of a GRANT datagram.
pub fn grant_len() -> usize {
    let mut v = Vec::new();
    let common = CommonHeader {
        from_client: false,
        retransmit: false,
        rpc_id: 0,
        send_time: 0,
        echo_time: 0,
    };
    wire::encode(
        &mut v,
        &common,
        &Body::Grant(Grant {
            offset: 0,
            priority: 0,
        }),
        false,
    );
    v.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_topologies() {
        let p = Topology::parse("paper").unwrap();
        assert_eq!(p.n_hosts(), 144);
        assert_eq!(p.name(), "tree:9x16:4");
        assert_eq!(Topology::parse("star:16").unwrap().n_hosts(), 16);
        assert_eq!(Topology::parse("tree:2x4:2").unwrap().n_hosts(), 8);
        for bad in ["star:1", "star:x", "tree:2x4", "tree:0x4:1", "mesh"] {
            assert!(Topology::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn built_fabric_matches_description() {
        let t = Topology::paper();
        let f = t.build(1);
        assert_eq!(f.n_hosts(), 144);
        assert_eq!(f.n_switches(), 13);
        // 144 host links and 36 ToR-agg links, both directions.
        assert_eq!(f.n_links(), 2 * (144 + 36));
        let s = Topology::star(5).build(1);
        assert_eq!((s.n_hosts(), s.n_switches()), (5, 1));
    }

    #[test]
    fn paths() {
        let t = Topology::paper();
        assert!(!t.crosses_core(0, 15));
        assert!(t.crosses_core(15, 16));
        assert_eq!(t.path(0, 1).hops.len(), 2);
        assert_eq!(t.path(0, 143).hops.len(), 4);
        assert_eq!(t.longest_path().hops.len(), 4);
        assert_eq!(Topology::star(4).longest_path().hops.len(), 2);
    }

    #[test]
    fn single_packet_best_case_is_the_one_way_time() {
        let t = Topology::paper();
        let p = t.path(0, 100);
        // 100-byte message: one datagram of 156 bytes, 222 on the wire.
        let expect = tx_time(222, 10_000_000_000) * 2
            + tx_time(222, 40_000_000_000) * 2
            + 3 * 250
            + 1000
            + 500;
        assert_eq!(t.best_case_ns(&p, 100, 1472), expect);
        assert_eq!(t.one_way_ns(&p, 156), expect);
    }

    #[test]
    fn long_message_best_case_is_bottleneck_serialization_plus_one_packet() {
        let t = Topology::star(2);
        let p = t.path(0, 1);
        // 10 full packets: the host link is the bottleneck; the last packet then
        // crosses the second link.
        let size = 10 * (1472 - DATA_PACKET_OVERHEAD) as u32;
        let pkt = tx_time(1538, 10_000_000_000);
        assert_eq!(pkt, 1231);
        assert_eq!(
            t.best_case_ns(&p, size, 1472),
            10 * pkt + 1000 + 250 + pkt + 500
        );
        // A short last packet waits behind its predecessor on the second link.
        let b = t.best_case_ns(&p, size + 1, 1472);
        let last = tx_time(1 + 56 + 66, 10_000_000_000);
        assert_eq!(b, 10 * pkt + 1000 + 250 + pkt + last + 500);
    }

    #[test]
    fn paper_rtt_is_a_few_microseconds() {
        let t = Topology::paper();
        let rtt = t.rtt_ns(1472);
        assert!((5_000..10_000).contains(&rtt), "{rtt}");
        assert_eq!(grant_len(), 40);
    }
}
