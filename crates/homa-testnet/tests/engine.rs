//! The driver with real Homa endpoints: RPCs complete with the right bytes,
//! with and without faults, across crashes and partitions, reproducibly.

use bytes::Bytes;
use homa_proto::{Config, RpcError, RpcId};
use homa_testnet::{
    pattern, Cut, EngineNet, Fabric, FaultConfig, Partition, Record, Reply, TestApp,
};

const MS: u64 = 1_000_000;

fn star(n: usize, seed: u64, reply: Reply) -> EngineNet<TestApp> {
    let fabric = Fabric::star(n, 25_000_000_000, 1_000, 250).with_seed(seed);
    let cfg = Config::default()
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(20 * MS);
    EngineNet::uniform(fabric, cfg, |_| TestApp::new(reply)).unwrap()
}

fn all_done(net: &EngineNet<TestApp>, ids: &[(usize, RpcId)]) -> bool {
    ids.iter()
        .all(|&(h, id)| net.app(h).finished_at(id).is_some())
}

#[test]
fn echo_of_every_size_class() {
    let mut net = star(2, 1, Reply::Echo);
    let sizes = [
        0usize, 1, 100, 1400, 1500, 5_000, 60_000, 200_000, 1_000_000,
    ];
    let mut ids = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let req = pattern(len, i as u64);
        ids.push((net.send_request(0, 1, req.clone()).unwrap(), req));
    }
    let done = net.run_until_cond(100 * MS, |n| {
        ids.iter()
            .all(|(id, _)| n.app(0).finished_at(*id).is_some())
    });
    assert!(done, "not all RPCs finished by {}", net.now());
    for (id, req) in &ids {
        assert_eq!(net.app(0).response(*id), Some(&req[..]), "rpc {id:?}");
    }
    assert_eq!(net.app(1).requests().count(), sizes.len());
    assert_eq!(net.fabric().stats().buffer_drops, 0);
    assert_eq!(net.driver_stats().unknown_dest, 0);
    // Lossless network: nothing was retransmitted.
    assert_eq!(net.endpoint(0).metrics().retransmitted_packets, 0);
    assert_eq!(net.endpoint(1).metrics().retransmitted_packets, 0);
}

#[test]
fn small_rpc_round_trip_time_is_close_to_the_network_minimum() {
    let mut net = star(2, 1, Reply::Fixed(100));
    let id = net.send_request(0, 1, pattern(100, 0)).unwrap();
    assert!(net.run_until_cond(MS, |n| n.app(0).finished_at(id).is_some()));
    let t = net.app(0).finished_at(id).unwrap();
    // Two one-way trips: 2 × (2 × 1 µs + 250 ns) plus four serializations of
    // a small packet; anything much larger means the driver delayed packets.
    assert!((4_500..6_000).contains(&t), "round trip took {t} ns");
}

#[test]
fn incast_of_many_clients_completes_and_leaves_endpoints_clean() {
    let mut net = star(9, 2, Reply::Fixed(1_000));
    let mut ids = Vec::new();
    for c in 1..9 {
        for k in 0..5 {
            let len = [100, 3_000, 30_000, 150_000, 400_000][k];
            ids.push((
                c,
                net.send_request(c, 0, pattern(len, (c * 10 + k) as u64))
                    .unwrap(),
            ));
        }
    }
    assert!(net.run_until_cond(200 * MS, |n| all_done(n, &ids)));
    for &(c, id) in &ids {
        // The server seeds its answer with the RPC id, which it shares with the client.
        assert_eq!(net.app(c).response(id), Some(&pattern(1_000, id.0)[..]));
    }
    let got: usize = net.app(0).requests().count();
    assert_eq!(got, 40);
    // Give the engines time to exchange ACKs and drop their state.
    net.run_for(100 * MS);
    for h in 0..9 {
        let s = net.endpoint(h).stats();
        assert_eq!((s.client_rpcs, s.server_rpcs), (0, 0), "host {h}: {s:?}");
    }
}

#[test]
fn rpcs_survive_loss_duplication_reordering_and_corruption() {
    let mut net = star(4, 3, Reply::Echo);
    net.fabric_mut().set_faults(FaultConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.05,
        reorder_max_ns: 20_000,
        corrupt: 0.02,
    });
    let mut ids = Vec::new();
    for c in 1..4 {
        for k in 0..6 {
            let len = [10, 1_500, 20_000, 80_000, 250_000, 700][k];
            let req = pattern(len, (c * 100 + k) as u64);
            ids.push((c, net.send_request(c, 0, req.clone()).unwrap(), req));
        }
    }
    let ok = net.run_until_cond(2_000 * MS, |n| {
        ids.iter()
            .all(|(c, id, _)| n.app(*c).finished_at(*id).is_some())
    });
    assert!(ok);
    for (c, id, req) in &ids {
        assert_eq!(
            net.app(*c).response(*id),
            Some(&req[..]),
            "client {c} rpc {id:?}"
        );
    }
    let fs = *net.fabric().fault_stats();
    assert!(
        fs.lost > 0 && fs.duplicated > 0 && fs.reordered > 0 && fs.corrupted > 0,
        "{fs:?}"
    );
    // The server saw each request exactly once, duplicates notwithstanding.
    assert_eq!(net.app(0).requests().count(), ids.len());
}

#[test]
fn partition_longer_than_the_timeout_fails_the_rpc() {
    let mut net = star(3, 4, Reply::Echo);
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Isolate(1),
        from: 0,
        until: 1_000 * MS,
    });
    let lost = net.send_request(0, 1, pattern(5_000, 1)).unwrap();
    let fine = net.send_request(0, 2, pattern(5_000, 2)).unwrap();
    assert!(net.run_until_cond(500 * MS, |n| n.app(0).finished_at(lost).is_some()));
    assert_eq!(net.app(0).failure(lost), Some(RpcError::Timeout));
    assert!(net.app(0).response(fine).is_some());
    assert!(net.fabric().fault_stats().partitioned > 0);
}

#[test]
fn short_partition_heals_without_failure() {
    let mut net = star(2, 5, Reply::Echo);
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Pairs(vec![(0, 1)]),
        from: 0,
        until: 5 * MS,
    });
    let id = net.send_request(0, 1, pattern(100_000, 1)).unwrap();
    assert!(net.run_until_cond(200 * MS, |n| n.app(0).finished_at(id).is_some()));
    assert_eq!(net.app(0).response(id), Some(&pattern(100_000, 1)[..]));
    assert!(net.app(0).finished_at(id).unwrap() >= 5 * MS);
}

#[test]
fn server_crash_and_restart() {
    let mut net = star(2, 6, Reply::Manual);
    let id = net.send_request(0, 1, pattern(50_000, 1)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(1).unanswered.len() == 1));
    // The server crashes before answering and comes back 1 ms later.
    net.crash(1, Some(MS));
    assert!(!net.is_up(1));
    assert!(net.send_request(1, 0, Bytes::new()).is_err());
    net.run_for(2 * MS);
    assert!(net.is_up(1));
    assert_eq!(net.incarnation(1), 1);
    let log = &net.app(1).log;
    assert!(log.iter().any(|(_, r)| *r == Record::Crashed));
    assert!(log.iter().any(|(_, r)| *r == Record::Restarted));
    // The client's RPC either is re-executed by the new server (answer it) or
    // fails; it must not hang.
    let ok = net.run_until_cond(100 * MS, |n| {
        n.app(0).finished_at(id).is_some() || !n.app(1).unanswered.is_empty()
    });
    assert!(ok);
    if let Some(rpc) = net.app(1).unanswered.first().copied() {
        net.send_response(1, rpc, Bytes::from_static(b"after restart"))
            .unwrap();
    }
    assert!(net.run_until_cond(100 * MS, |n| n.app(0).finished_at(id).is_some()));
    let f = net.fabric().fault_stats();
    assert_eq!((f.crashes, f.restarts), (1, 1));
}

#[test]
fn permanently_crashed_server_times_out_the_client() {
    let mut net = star(2, 7, Reply::Echo);
    net.schedule_crash(0, 1, None);
    net.run_for(1);
    let id = net.send_request(0, 1, pattern(1_000, 1)).unwrap();
    assert!(net.run_until_cond(100 * MS, |n| n.app(0).finished_at(id).is_some()));
    assert_eq!(net.app(0).failure(id), Some(RpcError::Timeout));
    assert!(net.fabric().fault_stats().host_down_drops > 0);
}

fn chaos_digest(seed: u64) -> (u64, usize) {
    // Clients 1..=4, servers 0 and 5; server 5 crashes and restarts.
    let mut net = star(6, seed, Reply::Fixed(2_000));
    net.enable_trace(true);
    net.fabric_mut().set_faults(FaultConfig {
        loss: 0.03,
        duplicate: 0.03,
        reorder: 0.05,
        reorder_max_ns: 10_000,
        corrupt: 0.03,
    });
    net.schedule_crash(3 * MS, 5, Some(2 * MS));
    let mut ids = Vec::new();
    for k in 0..40u64 {
        let c = (k % 4) as usize + 1;
        let s = if k % 3 == 0 { 5 } else { 0 };
        ids.push((
            c,
            net.send_request(c, s, pattern((k * 3_001 % 90_000) as usize, k))
                .unwrap(),
        ));
        net.run_for(100_000);
    }
    assert!(net.run_until_cond(1_000 * MS, |n| all_done(n, &ids)));
    net.run_for(10 * MS);
    (net.digest(), ids.len())
}

#[test]
fn same_seed_same_digest() {
    let a = chaos_digest(21);
    let b = chaos_digest(21);
    assert_eq!(a, b);
    let c = chaos_digest(22);
    assert_ne!(a.0, c.0);
}

/// Short DATA datagrams padded to a window's end (`Config::pad_v4`): every
/// size in and around the window arrives intact, with and without
/// checksums, and the padding is on the wire.
#[test]
fn padded_short_messages_arrive_intact() {
    use homa_proto::{wire::DATA_PACKET_OVERHEAD, PadWindow};
    let window = PadWindow { from: 129, to: 198 };
    for checksum in [false, true] {
        let fabric = Fabric::star(2, 25_000_000_000, 1_000, 250).with_seed(11);
        let cfg = Config::default()
            .with_checksum(checksum)
            .with_pad_v4(window)
            .with_pad_v6(window);
        let mut net = EngineNet::uniform(fabric, cfg, |_| TestApp::new(Reply::Echo)).unwrap();
        let sizes: Vec<usize> = (60..=150).chain([1, 1400, 3000]).collect();
        let mut ids = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let req = pattern(len, i as u64);
            ids.push((net.send_request(0, 1, req.clone()).unwrap(), req));
            // One at a time, so that the server's byte count is exact.
            assert!(net.run_until_cond(net.now() + 10 * MS, |n| n
                .app(0)
                .finished_at(ids.last().unwrap().0)
                .is_some()));
        }
        for (id, req) in &ids {
            assert_eq!(net.app(0).response(*id), Some(&req[..]), "{id:?}");
        }
        // Requests are one DATA packet each up to 1400 bytes (padded if in
        // the window); the multi-packet ones are left out of the sum.
        let expected: u64 = sizes
            .iter()
            .filter(|&&l| l <= 1400)
            .map(|&l| {
                let n = DATA_PACKET_OVERHEAD + l;
                (n + window.pad(n) as usize) as u64
            })
            .sum();
        let m = net.endpoint(1).metrics();
        // Besides DATA, the server hears only the client's CUTOFFS (68 bytes).
        let cutoffs = m.packets_received[homa_proto::wire::PacketType::Cutoffs.index()];
        let others: u64 = m.packets_received.iter().sum::<u64>()
            - cutoffs
            - m.packets_received[homa_proto::wire::PacketType::Data.index()];
        assert_eq!(others, 0, "{m:?}");
        assert_eq!(
            m.bytes_received,
            expected + 3000 + 3 * DATA_PACKET_OVERHEAD as u64 + 68 * cutoffs
        );
        assert_eq!(m.total_drops(), 0, "checksum {checksum}: {m:?}");
    }
}
