//! Behaviour of the network core, with raw packets between recording hosts
//! (no protocol engine involved).

use homa_testnet::{
    Cut, Ecmp, Fabric, FaultConfig, HostId, Hosts, Node, Packet, Partition, TwoLevel,
};

const G10: u64 = 10_000_000_000;

/// One delivered packet as seen by a host.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Got {
    time: u64,
    host: HostId,
    src: HostId,
    prio: u8,
    uid: u64,
    data: Vec<u8>,
}

/// Records deliveries; timer `kind` 1 sends `token` packets of a fixed shape
/// (used to inject traffic at chosen times).
#[derive(Default)]
struct Rec {
    got: Vec<Got>,
    nic_done: Vec<(u64, HostId)>,
    /// (dst, prio, len) per host for timer-driven sends.
    plan: Vec<(HostId, u8, usize)>,
}

impl Hosts for Rec {
    fn deliver(&mut self, net: &mut Fabric, host: HostId, pkt: Packet) {
        self.got.push(Got {
            time: net.now(),
            host,
            src: pkt.src,
            prio: pkt.priority,
            uid: pkt.uid,
            data: pkt.data,
        });
    }
    fn nic_done(&mut self, net: &mut Fabric, host: HostId) {
        self.nic_done.push((net.now(), host));
    }
    fn timer(&mut self, net: &mut Fabric, host: HostId, kind: u32, token: u64) {
        assert_eq!(kind, 1);
        let (dst, prio, len) = self.plan[host];
        for _ in 0..token {
            net.send(host, dst, prio, vec![prio; len]);
        }
    }
}

/// A numbered payload: 8 bytes of sequence number then filler.
fn numbered(i: u64, len: usize) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.resize(len.max(8), 0xAB);
    v
}

fn seqno(d: &[u8]) -> u64 {
    u64::from_le_bytes(d[..8].try_into().unwrap())
}

#[test]
fn serialization_latency_and_switching_add_up() {
    let mut f = Fabric::star(2, G10, 1_000, 250);
    let mut r = Rec::default();
    assert!(f.send(0, 1, 0, vec![0; 1500]));
    assert!(f.send(0, 1, 0, vec![0; 1500]));
    assert!(f.run_until_idle(&mut r, u64::MAX));
    // 1500 B at 10 Gbps = 1200 ns, twice (host NIC, switch port), plus two
    // link latencies and one switch latency.
    let first = 1200 + 1000 + 250 + 1200 + 1000;
    assert_eq!(r.got[0].time, first);
    assert_eq!(
        r.got[1].time,
        first + 1200,
        "back-to-back packets are spaced by one serialization time"
    );
    assert_eq!(r.nic_done, vec![(1200, 0), (2400, 0)]);
    assert_eq!(f.link_stats(f.host_nic(0).unwrap()).tx_bytes, 3000);
    assert_eq!(f.stats().delivered, 2);
    assert_eq!(f.stats().delivered_bytes, 3000);
    assert_eq!(f.packets_in_flight(), 0);
}

#[test]
fn overhead_and_receive_delay_are_applied() {
    let mut f = Fabric::star(2, G10, 0, 0);
    f.set_overhead_bytes(46);
    f.set_host_rx_delay(1, 5_000);
    let mut r = Rec::default();
    f.send(0, 1, 3, vec![7; 1454]);
    f.run_until_idle(&mut r, u64::MAX);
    // 1500 wire bytes: 1200 ns per hop, then the receiver's software delay.
    assert_eq!(r.got[0].time, 2 * 1200 + 5_000);
    assert_eq!(r.got[0].data.len(), 1454);
    assert_eq!(f.link_stats(0).tx_bytes, 1500);
}

#[test]
fn direct_host_to_host_link() {
    let mut f = Fabric::new(1);
    let a = f.add_host();
    let b = f.add_host();
    f.connect(Node::Host(a), Node::Host(b), 1_000_000_000, 10);
    let mut r = Rec::default();
    f.send(a, b, 0, vec![1; 125]);
    f.run_until_idle(&mut r, u64::MAX);
    assert_eq!(r.got[0].time, 1_000 + 10);
}

#[test]
fn high_priority_overtakes_backlog_at_nic() {
    let mut f = Fabric::star(2, G10, 100, 0);
    let mut r = Rec::default();
    for i in 0..10 {
        f.send(0, 1, 0, numbered(i, 1000));
    }
    f.send(0, 1, 7, numbered(100, 1000));
    f.run_until_idle(&mut r, u64::MAX);
    let order: Vec<u64> = r.got.iter().map(|g| seqno(&g.data)).collect();
    // Packet 0 was already being serialized; the urgent one goes next.
    assert_eq!(order, vec![0, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
}

#[test]
fn fifo_port_ignores_priority() {
    let mut f = Fabric::star(2, G10, 100, 0);
    f.set_priority_queues(f.host_nic(0).unwrap(), false);
    let mut r = Rec::default();
    for i in 0..5 {
        f.send(0, 1, (i % 2 * 7) as u8, numbered(i, 1000));
    }
    f.run_until_idle(&mut r, u64::MAX);
    let order: Vec<u64> = r.got.iter().map(|g| seqno(&g.data)).collect();
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
    let st = f.link_stats(f.host_nic(0).unwrap());
    assert_eq!((st.tx_packets_by_prio[0], st.tx_packets_by_prio[7]), (3, 2));
}

#[test]
fn high_priority_overtakes_backlog_at_switch_and_fifo_within_priority() {
    // Hosts 0 and 1 both send to 2: the switch port toward 2 builds a queue.
    let mut f = Fabric::star(3, G10, 100, 100);
    let mut r = Rec::default();
    for i in 0..20 {
        f.send(0, 2, 1, numbered(i, 1000));
        f.send(1, 2, 1, numbered(1000 + i, 1000));
    }
    // Once the queue is deep, host 1 sends one urgent packet.
    f.run_until(&mut r, 10_000);
    let before = r.got.len();
    assert!(before < 15, "queue should still be backlogged");
    f.send(1, 2, 6, numbered(9999, 1000));
    f.run_until_idle(&mut r, u64::MAX);
    let pos = r.got.iter().position(|g| seqno(&g.data) == 9999).unwrap();
    // It waits for the packet in service at host 1's NIC, then for the one in
    // service at the switch port; ~25 low-priority packets are still queued there.
    assert!(
        pos <= before + 4,
        "urgent packet at {pos}, backlog started at {before}"
    );
    assert!(r.got.len() - pos > 20);
    assert_eq!(r.got.len(), 41);
    // FIFO within a priority, per source.
    for src in [0, 1] {
        let seq: Vec<u64> = r
            .got
            .iter()
            .filter(|g| g.src == src && g.prio == 1)
            .map(|g| seqno(&g.data))
            .collect();
        let mut sorted = seq.clone();
        sorted.sort();
        assert_eq!(seq, sorted);
        assert_eq!(seq.len(), 20);
    }
    let port = f.find_link(Node::Switch(0), Node::Host(2)).unwrap();
    let st = f.link_stats(port);
    assert_eq!(st.tx_packets_by_prio[1], 40);
    assert_eq!(st.tx_packets_by_prio[6], 1);
}

#[test]
fn buffer_limit_tail_drops_per_priority() {
    let mut f = Fabric::star(3, G10, 100, 0);
    let port = f.find_link(Node::Switch(0), Node::Host(2)).unwrap();
    f.set_buffer_limit(port, Some(5_000));
    let mut r = Rec::default();
    for i in 0..50 {
        f.send(0, 2, 2, numbered(i, 1000));
        f.send(1, 2, 2, numbered(i, 1000));
    }
    f.run_until_idle(&mut r, u64::MAX);
    let drops = f.link_stats(port).drops;
    assert!(
        drops[2] > 30,
        "incast of 2:1 into a 5-packet buffer must drop, got {drops:?}"
    );
    assert_eq!(drops.iter().sum::<u64>(), drops[2]);
    assert_eq!(r.got.len() as u64 + drops[2], 100);
    assert_eq!(f.stats().buffer_drops, drops[2]);
    let q = f.queue_report(port);
    assert!(q.max_bytes[2] <= 5_000 && q.max_bytes[2] >= 4_000, "{q:?}");
    assert_eq!(q.cur_bytes, [0; 8]);
}

#[test]
fn queue_statistics_are_time_averaged() {
    let mut f = Fabric::star(2, G10, 0, 0);
    let mut r = Rec::default();
    f.send(0, 1, 4, vec![0; 1500]);
    f.run_until(&mut r, 4_800);
    let nic = f.host_nic(0).unwrap();
    let q = f.queue_report(nic);
    // 1500 bytes for 1200 ns out of 4800 ns.
    assert_eq!(q.max_bytes[4], 1500);
    assert!((q.avg_bytes[4] - 375.0).abs() < 1e-9, "{q:?}");
    assert!((f.link_utilization(nic) - 0.25).abs() < 1e-9);
    f.reset_stats();
    f.run_until(&mut r, 9_600);
    assert_eq!(f.queue_report(nic).avg_bytes[4], 0.0);
    assert_eq!(f.queue_report(nic).max_bytes[4], 0);
    assert_eq!(f.link_stats(nic).tx_packets, 0);
}

#[test]
fn ecmp_sprays_packets_over_all_aggregation_switches() {
    let spec = TwoLevel {
        racks: 2,
        hosts_per_rack: 2,
        aggs: 4,
        ..TwoLevel::paper()
    };
    let mut f = Fabric::two_level(&spec).with_seed(5);
    let mut r = Rec::default();
    let n = 4000;
    for i in 0..n {
        f.send(0, 3, 0, numbered(i, 200));
    }
    f.run_until_idle(&mut r, u64::MAX);
    assert_eq!(r.got.len() as u64, n);
    let uplinks: Vec<u64> = (0..4)
        .map(|a| {
            f.link_stats(f.find_link(Node::Switch(0), Node::Switch(2 + a)).unwrap())
                .tx_packets
        })
        .collect();
    assert_eq!(uplinks.iter().sum::<u64>(), n);
    for &u in &uplinks {
        assert!(
            (u as f64 - 1000.0).abs() < 150.0,
            "uneven spraying {uplinks:?}"
        );
    }
    // Within a rack no uplink is used.
    let before: u64 = uplinks.iter().sum();
    f.send(0, 1, 0, vec![0; 100]);
    f.run_until_idle(&mut r, u64::MAX);
    let after: u64 = (0..4)
        .map(|a| {
            f.link_stats(f.find_link(Node::Switch(0), Node::Switch(2 + a)).unwrap())
                .tx_packets
        })
        .sum();
    assert_eq!(before, after);
}

#[test]
fn flow_ecmp_keeps_a_flow_on_one_path() {
    let spec = TwoLevel {
        racks: 2,
        hosts_per_rack: 4,
        aggs: 4,
        ..TwoLevel::paper()
    };
    let mut f = Fabric::two_level(&spec);
    f.set_ecmp(Ecmp::Flow);
    let mut r = Rec::default();
    for i in 0..200 {
        f.send(0, 5, 0, numbered(i, 500));
    }
    f.run_until_idle(&mut r, u64::MAX);
    let used = (0..4)
        .filter(|a| {
            f.link_stats(f.find_link(Node::Switch(0), Node::Switch(2 + a)).unwrap())
                .tx_packets
                > 0
        })
        .count();
    assert_eq!(used, 1);
    let seq: Vec<u64> = r.got.iter().map(|g| seqno(&g.data)).collect();
    assert_eq!(seq, (0..200).collect::<Vec<_>>(), "one path keeps order");
}

#[test]
fn manual_routes_and_missing_routes() {
    let mut f = Fabric::new(0);
    let s = f.add_switch(0);
    let h: Vec<HostId> = (0..3).map(|_| f.add_host()).collect();
    let mut down = Vec::new();
    for &x in &h {
        let (_, d) = f.connect(Node::Host(x), Node::Switch(s), G10, 0);
        down.push(d);
    }
    // Routes not computed: the switch drops.
    let mut r = Rec::default();
    f.send(0, 1, 0, vec![1; 10]);
    f.run_until_idle(&mut r, u64::MAX);
    assert_eq!(f.stats().no_route, 1);
    // A wrong manual route delivers to the wrong host, which refuses it.
    f.set_route(s, 1, &[down[2]]);
    f.send(0, 1, 0, vec![1; 10]);
    f.run_until_idle(&mut r, u64::MAX);
    assert_eq!(f.stats().misrouted, 1);
    f.set_route(s, 1, &[down[1]]);
    f.send(0, 1, 0, vec![1; 10]);
    // Unknown destination host.
    assert!(!f.send(0, 17, 0, vec![1; 10]));
    f.run_until_idle(&mut r, u64::MAX);
    assert_eq!(r.got.len(), 1);
    assert_eq!(f.stats().no_route, 2);
}

#[test]
fn timers_fire_in_order_and_inject_traffic() {
    let mut f = Fabric::star(2, G10, 0, 0);
    let mut r = Rec {
        plan: vec![(1, 0, 125), (0, 0, 125)],
        ..Rec::default()
    };
    f.schedule(5_000, 0, 1, 2);
    f.schedule(1_000, 1, 1, 1);
    f.run_until_idle(&mut r, u64::MAX);
    // 125 B at 10 Gbps = 100 ns per hop.
    let times: Vec<(u64, HostId)> = r.got.iter().map(|g| (g.time, g.host)).collect();
    assert_eq!(times, vec![(1_200, 0), (5_200, 1), (5_300, 1)]);
}

fn lossy_run(cfg: FaultConfig, seed: u64, n: u64) -> (Fabric, Rec) {
    let mut f = Fabric::star(2, G10, 1_000, 0).with_seed(seed);
    f.set_faults(cfg);
    let mut r = Rec::default();
    // Paced sends, so the NIC queue stays short and times are spread.
    for i in 0..n {
        f.run_until(&mut r, i * 200);
        f.send(0, 1, (i % 8) as u8, numbered(i, 200));
    }
    f.run_until_idle(&mut r, u64::MAX);
    (f, r)
}

fn within(x: u64, n: u64, p: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (x as f64 - mean).abs() <= 4.0 * sd + 1.0
}

#[test]
fn loss_rate_matches_configuration() {
    let n = 20_000;
    let (f, r) = lossy_run(FaultConfig::loss(0.1), 1, n);
    let lost = f.fault_stats().lost;
    assert!(within(lost, n, 0.1), "lost {lost} of {n}");
    assert_eq!(r.got.len() as u64 + lost, n);
}

#[test]
fn duplication_rate_matches_configuration() {
    let n = 20_000;
    let cfg = FaultConfig {
        duplicate: 0.05,
        ..FaultConfig::NONE
    };
    let (f, r) = lossy_run(cfg, 2, n);
    let d = f.fault_stats().duplicated;
    assert!(within(d, n, 0.05), "duplicated {d}");
    assert_eq!(r.got.len() as u64, n + d);
    // A duplicate is an identical copy.
    let mut seen = std::collections::HashMap::new();
    let mut dups = 0;
    for g in &r.got {
        if let Some(prev) = seen.insert(g.uid, g.data.clone()) {
            assert_eq!(prev, g.data);
            dups += 1;
        }
    }
    assert_eq!(dups, d);
}

#[test]
fn corruption_rate_matches_configuration() {
    let n = 20_000;
    let cfg = FaultConfig {
        corrupt: 0.02,
        ..FaultConfig::NONE
    };
    let (f, r) = lossy_run(cfg, 3, n);
    let c = f.fault_stats().corrupted;
    assert!(within(c, n, 0.02), "corrupted {c}");
    // Count deliveries that differ from what was sent.
    let bad = r
        .got
        .iter()
        .filter(|g| {
            let i = g.uid;
            g.data != numbered(i, 200)
        })
        .count() as u64;
    // A flip can hit the same byte twice and cancel out, rarely.
    assert!(bad <= c && bad + 5 >= c, "bad {bad} corrupted {c}");
}

#[test]
fn reordering_rate_matches_configuration() {
    let n = 20_000;
    let cfg = FaultConfig {
        reorder: 0.1,
        reorder_max_ns: 5_000,
        ..FaultConfig::NONE
    };
    let (f, r) = lossy_run(cfg, 4, n);
    let re = f.fault_stats().reordered;
    assert!(within(re, n, 0.1), "reordered {re}");
    assert_eq!(r.got.len() as u64, n);
    // Packets that arrived after a later-sent packet.
    let mut max_seen = 0;
    let mut late = 0;
    for g in &r.got {
        let s = seqno(&g.data);
        if s < max_seen {
            late += 1;
        }
        max_seen = max_seen.max(s);
    }
    assert!(late > re / 2 && late <= re, "late {late}, reordered {re}");
}

#[test]
fn per_link_faults_apply_on_every_traversal() {
    // Loss only on host 0's uplink; host 1's traffic is unaffected.
    let mut f = Fabric::star(3, G10, 0, 0);
    f.set_link_faults(f.host_nic(0).unwrap(), Some(FaultConfig::loss(0.5)));
    let mut r = Rec::default();
    for i in 0..2000 {
        f.run_until(&mut r, i * 500);
        f.send(0, 2, 0, numbered(i, 100));
        f.send(1, 2, 0, numbered(i, 100));
    }
    f.run_until_idle(&mut r, u64::MAX);
    let from0 = r.got.iter().filter(|g| g.src == 0).count() as u64;
    let from1 = r.got.iter().filter(|g| g.src == 1).count() as u64;
    assert_eq!(from1, 2000);
    assert!(within(2000 - from0, 2000, 0.5));
    assert_eq!(f.fault_stats().lost, 2000 - from0);
}

#[test]
fn partitions_block_only_inside_their_window() {
    let mut f = Fabric::star(4, G10, 0, 0);
    f.add_partition(Partition {
        cut: Cut::Pairs(vec![(0, 1)]),
        from: 10_000,
        until: 20_000,
    });
    f.add_partition(Partition {
        cut: Cut::Isolate(3),
        from: 0,
        until: 50_000,
    });
    let mut r = Rec::default();
    for t in [0u64, 15_000, 30_000] {
        f.run_until(&mut r, t);
        f.send(0, 1, 0, numbered(t, 100));
        f.send(1, 0, 0, numbered(t, 100));
        f.send(0, 2, 0, numbered(t, 100));
        f.send(2, 3, 0, numbered(t, 100));
    }
    f.run_until_idle(&mut r, u64::MAX);
    let count = |a: HostId, b: HostId| r.got.iter().filter(|g| g.src == a && g.host == b).count();
    assert_eq!(count(0, 1), 2);
    assert_eq!(count(1, 0), 2);
    assert_eq!(count(0, 2), 3);
    assert_eq!(count(2, 3), 0);
    assert_eq!(f.fault_stats().partitioned, 2 + 3);
}

#[test]
fn down_hosts_drop_and_purge() {
    let mut f = Fabric::star(2, G10, 0, 0);
    let mut r = Rec::default();
    for i in 0..5 {
        f.send(0, 1, 0, numbered(i, 1000));
    }
    // One packet is on the wire; four wait and are purged.
    assert_eq!(f.purge_nic(0), 4);
    assert_eq!(f.nic_backlog(0), 1000);
    f.set_host_up(1, false);
    f.run_until_idle(&mut r, u64::MAX);
    assert!(r.got.is_empty());
    assert!(!f.send(1, 0, 0, vec![0; 10]));
    assert_eq!(f.fault_stats().host_down_drops, 2);
    assert_eq!(f.fault_stats().crash_purged, 4);
    assert_eq!(f.packets_in_flight(), 0);
}

/// A mixed workload with every fault, on a two-level network.
fn chaotic(seed: u64) -> (u64, Vec<Got>, String) {
    let spec = TwoLevel {
        racks: 3,
        hosts_per_rack: 3,
        aggs: 2,
        ..TwoLevel::paper()
    };
    let mut f = Fabric::two_level(&spec).with_seed(seed);
    f.enable_trace(true);
    f.set_switch_buffer_limits(Some(20_000));
    f.set_faults(FaultConfig {
        loss: 0.02,
        duplicate: 0.02,
        reorder: 0.05,
        reorder_max_ns: 3_000,
        corrupt: 0.02,
    });
    f.add_partition(Partition {
        cut: Cut::Split(vec![0, 1, 2]),
        from: 50_000,
        until: 80_000,
    });
    let mut r = Rec::default();
    let mut x = seed | 1;
    for i in 0..3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f.run_until(&mut r, i * 50);
        let src = (x % 9) as usize;
        let dst = ((x >> 8) % 9) as usize;
        if src != dst {
            f.send(
                src,
                dst,
                ((x >> 16) % 8) as u8,
                numbered(i, 64 + (x >> 24) as usize % 1400),
            );
        }
    }
    f.run_until_idle(&mut r, u64::MAX);
    let summary = format!("{:?} {:?} {}", f.stats(), f.fault_stats(), f.now());
    (f.trace_hash(), r.got, summary)
}

#[test]
fn same_seed_same_run() {
    let a = chaotic(11);
    let b = chaotic(11);
    assert_eq!(a.0, b.0);
    assert_eq!(a.1, b.1);
    assert_eq!(a.2, b.2);
    assert_ne!(a.0, 0);
    let c = chaotic(12);
    assert_ne!(a.0, c.0, "a different seed should change the run");
}
