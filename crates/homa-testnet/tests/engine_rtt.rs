//! Per-peer RTT, congestion detection and adaptive windows
//! (`docs/congestion.md`) on the deterministic test network: what an
//! endpoint measures follows the network (not the peer's service time), a
//! jump above 8 × `rtt_min` is seen at once, and adaptive windows shrink,
//! recover and grow with the path's RTT.

mod common;

use bytes::Bytes;
use common::{rpc, MS};
use homa_proto::{Config, PeerRtt, RpcId, WindowPolicy};
use homa_testnet::{pattern, EngineNet, Fabric, HostId, Reply, TestApp};

const US: u64 = 1_000;

/// `n` hosts on one 25 Gbps switch (1 µs links, 250 ns switching: a small
/// RPC's round trip is about 5 µs), every endpoint with `cfg`.
fn star(n: usize, cfg: Config, reply: Reply) -> EngineNet<TestApp> {
    let fabric = Fabric::star(n, 25_000_000_000, US, 250).with_seed(3);
    EngineNet::uniform(fabric, cfg, |_| TestApp::new(reply)).unwrap()
}

fn measuring() -> Config {
    Config::default()
        .with_measure_rtt(true)
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(100 * MS)
}

fn adaptive() -> Config {
    measuring().with_window_policy(WindowPolicy::Adaptive)
}

/// What host `h` knows of the path to host `peer`.
fn rtt(net: &EngineNet<TestApp>, h: HostId, peer: HostId) -> PeerRtt {
    net.endpoint(h)
        .peer_rtt(net.addr(peer))
        .expect("a known peer")
}

/// Host 0 asks host 1, which answers after `hold` ns.
fn held_rpc(net: &mut EngineNet<TestApp>, hold: u64) -> RpcId {
    let id = net.send_request(0, 1, pattern(100, 1)).unwrap();
    let limit = net.now() + MS;
    assert!(net.run_until_cond(limit, |n| !n.app(1).unanswered.is_empty()));
    let sent_at = net.now();
    net.run_for(hold);
    let held = net.app_mut(1).unanswered.pop().unwrap();
    net.send_response(1, held, Bytes::from_static(b"late"))
        .unwrap();
    let limit = net.now() + 10 * MS;
    assert!(net.run_until_cond(limit, |n| n.app(0).finished_at(id).is_some()));
    assert!(net.now() - sent_at >= hold);
    id
}

/// A server that holds a request for 800 µs before answering does not
/// inflate its client's RTT sample: the server advances its echo by the
/// hold time (wire format version 4). A hold beyond `max_echo_hold_ns`
/// (1 ms) gives no sample at all.
#[test]
fn hold_time_is_left_out_of_rtt_samples() {
    // No RESENDs while the server holds the request: the response's echo
    // is the only one that spans the hold.
    let cfg = measuring().with_resend_interval_ns(50 * MS);
    let mut net = star(2, cfg, Reply::Manual);
    held_rpc(&mut net, 800 * US);
    let r = rtt(&net, 0, 1);
    assert!(r.samples >= 1);
    // The round trip of a small packet is about 5 µs; without the hold
    // correction this sample would be over 800 µs.
    assert!(r.rtt_recent < 10 * US as u32, "{r:?}");
    assert_eq!(r.rtt_min, Some(r.rtt_recent));
    assert!(net.endpoint(0).peer_rtt_min(net.addr(1)).unwrap() < 10 * US);
    // Held 3 ms: the response echoes nothing, so no sample.
    held_rpc(&mut net, 3 * MS);
    assert_eq!(rtt(&net, 0, 1), r);
    assert_eq!(net.endpoint(0).metrics().congestion_onsets, 0);
}

/// A path whose RTT jumps above 8 × its minimum (the client's receive
/// path gets 60 µs slower) is congested from the first sample that shows
/// it, and no longer once the delay is gone.
#[test]
fn an_rtt_above_eight_times_the_minimum_is_congestion_within_a_sample() {
    let mut net = star(2, measuring(), Reply::Echo);
    for _ in 0..20 {
        rpc(&mut net, 0, 1, 100);
    }
    let before = rtt(&net, 0, 1);
    let min = before.rtt_min.unwrap();
    assert!(min < 10 * US as u32 && !before.congested, "{before:?}");
    // The smoothed values settle near the minimum on a quiet path.
    assert!(before.srtt < 2 * min, "{before:?}");
    let m = net.endpoint(0).metrics();
    assert_eq!((m.rtt_samples_congested, m.rtt_samples_above_mid), (0, 0));

    net.fabric_mut().set_host_rx_delay(0, 60 * US);
    let mut samples_to_detect = None;
    for _ in 0..5 {
        rpc(&mut net, 0, 1, 100);
        let r = rtt(&net, 0, 1);
        if r.congested {
            samples_to_detect = Some(r.samples - before.samples);
            break;
        }
    }
    let n = samples_to_detect.expect("congestion detected");
    assert!(n <= 3, "took {n} samples");
    let r = rtt(&net, 0, 1);
    assert!(r.rtt_recent > 8 * min, "{r:?}");
    assert_eq!(r.rtt_min, Some(min), "a congested path keeps its minimum");
    assert_eq!(net.endpoint(0).metrics().congestion_onsets, 1);
    // The samples that showed it are counted.
    let m = net.endpoint(0).metrics();
    assert!(m.rtt_samples_congested >= 1 && m.rtt_samples_above_mid >= m.rtt_samples_congested);

    net.fabric_mut().set_host_rx_delay(0, 0);
    rpc(&mut net, 0, 1, 100);
    rpc(&mut net, 0, 1, 100);
    assert!(!rtt(&net, 0, 1).congested);
    // Static windows: congestion is reported, the windows do not move.
    assert_eq!(net.endpoint(0).metrics().unsched_window_cuts, 0);
    let static_unsched = Config::default().effective_unsched_bytes();
    assert_eq!(rtt(&net, 0, 1).unsched_window, static_unsched);
}

/// Under adaptive windows the client's unscheduled window for the server
/// is the path's bandwidth-delay product; congestion halves it (down to a
/// packet), and it grows back a packet per RTT once the path is quiet.
#[test]
fn the_unscheduled_window_shrinks_under_congestion_and_recovers() {
    let mut net = star(2, adaptive(), Reply::Fixed(100));
    for _ in 0..10 {
        rpc(&mut net, 0, 1, 100);
    }
    let quiet = rtt(&net, 0, 1);
    let dpp = Config::default().max_data_per_packet() as u32;
    let bdp = (quiet.rtt_min.unwrap() as u64 * 25_000_000_000 / 8_000_000_000) as u32;
    assert_eq!(
        quiet.unsched_window,
        bdp.div_ceil(dpp).max(1) * dpp,
        "{quiet:?}"
    );
    assert!(quiet.unsched_window > dpp);

    net.fabric_mut().set_host_rx_delay(0, 100 * US);
    for _ in 0..20 {
        rpc(&mut net, 0, 1, 100);
    }
    let congested = rtt(&net, 0, 1);
    assert!(congested.congested);
    assert_eq!(congested.unsched_window, dpp, "{congested:?}");
    assert!(net.endpoint(0).metrics().unsched_window_cuts >= 2);

    net.fabric_mut().set_host_rx_delay(0, 0);
    let mut rpcs = 0;
    while rtt(&net, 0, 1).unsched_window < quiet.unsched_window {
        rpc(&mut net, 0, 1, 100);
        rpcs += 1;
        assert!(rpcs < 500, "no recovery: {:?}", rtt(&net, 0, 1));
    }
    let packets = quiet.unsched_window / dpp;
    // A packet per smoothed RTT: at least one RPC per step.
    assert!(rpcs >= packets - 1, "recovered in {rpcs} RPCs");
    // And a message after recovery goes with the full window unscheduled:
    // no grant needed for one BDP of bytes.
    let grants_before = net.endpoint(1).metrics().grants_sent;
    rpc(&mut net, 0, 1, quiet.unsched_window as usize);
    assert_eq!(net.endpoint(1).metrics().grants_sent, grants_before);
}

/// A server with a near client (2 µs away) and a far one (40 µs more on
/// the far client's receive path) gives the far one the larger grant
/// window, and each client's unscheduled window follows its own path.
#[test]
fn a_peer_with_a_longer_rtt_gets_larger_windows() {
    let mut net = star(3, adaptive(), Reply::Fixed(100));
    net.fabric_mut().set_host_rx_delay(2, 40 * US);
    for _ in 0..5 {
        rpc(&mut net, 1, 0, 100);
        rpc(&mut net, 2, 0, 100);
    }
    let near = rtt(&net, 0, 1);
    let far = rtt(&net, 0, 2);
    let (near_min, far_min) = (near.rtt_min.unwrap(), far.rtt_min.unwrap());
    assert!(far_min > near_min + 35 * US as u32, "{near:?} {far:?}");
    assert!(far.grant_window > 4 * near.grant_window, "{near:?} {far:?}");
    // Seed 003: 3 × rtt_min at the link rate, in whole packets.
    let dpp = Config::default().max_data_per_packet() as u64;
    let expect = |min: u32| {
        let bytes = 3 * min as u64 * 25_000_000_000 / 8_000_000_000;
        (bytes.div_ceil(dpp) * dpp) as u32
    };
    assert_eq!(near.grant_window, expect(near_min));
    assert_eq!(far.grant_window, expect(far_min));
    // The clients' unscheduled windows for the server: their own BDPs.
    let (near_c, far_c) = (rtt(&net, 1, 0), rtt(&net, 2, 0));
    assert!(
        far_c.unsched_window > 4 * near_c.unsched_window,
        "{near_c:?} {far_c:?}"
    );
}

/// The larger window is used: a far client's 1 MB request completes much
/// sooner under adaptive windows than under the static 20 µs one, which
/// cannot cover a 45 µs path.
#[test]
fn a_far_peer_fills_the_link_with_adaptive_windows() {
    let run = |cfg: Config| {
        let mut net = star(2, cfg, Reply::Fixed(100));
        net.fabric_mut().set_host_rx_delay(0, 40 * US);
        // A first exchange gives both sides a sample.
        rpc(&mut net, 0, 1, 100);
        let start = net.now();
        let id = rpc(&mut net, 0, 1, 1_000_000);
        let t = net.app(0).finished_at(id).unwrap() - start;
        assert_eq!(net.fabric().stats().buffer_drops, 0);
        (t, rtt(&net, 1, 0))
    };
    let (static_ns, s) = run(measuring());
    let (adaptive_ns, a) = run(adaptive());
    // Printed for docs/congestion.md (`-- --nocapture`).
    eprintln!("1 MB request from a 45 us peer: static {static_ns} ns, adaptive {adaptive_ns} ns");
    assert_eq!(s.grant_window, Config::default().effective_grant_window());
    assert!(a.grant_window > 2 * s.grant_window, "{s:?} {a:?}");
    // 1 MB at 25 Gbps is 320 µs of wire time (plus headers).
    assert!(adaptive_ns < 500 * US, "adaptive took {adaptive_ns} ns");
    assert!(
        adaptive_ns * 10 < static_ns * 8,
        "adaptive {adaptive_ns} ns, static {static_ns} ns"
    );
}

/// With shallow switch buffers, loss comes before the RTT can rise to the
/// congestion threshold; under adaptive windows a RESEND for bytes the
/// client had sent (its second packet was lost) halves its unscheduled
/// window for that server. Static windows do not move.
#[test]
fn a_lost_packet_halves_the_unscheduled_window() {
    let lose_second_packet = |cfg: Config| {
        let mut net = star(2, cfg, Reply::Fixed(100));
        for _ in 0..10 {
            rpc(&mut net, 0, 1, 100);
        }
        let before = rtt(&net, 0, 1);
        assert_eq!(net.endpoint(0).metrics().unsched_window_cuts, 0);
        // Three packets, all unscheduled; the second is lost on the
        // client's link (faults are decided as a packet leaves the port).
        let nic = net.fabric().host_nic(0).unwrap();
        let id = net.send_request(0, 1, pattern(3 * 1400, 7)).unwrap();
        let t = net.now();
        net.run_until(t + 600);
        net.fabric_mut()
            .set_link_faults(nic, Some(homa_testnet::FaultConfig::loss(1.0)));
        net.run_until(t + 1_000);
        net.fabric_mut().set_link_faults(nic, None);
        let limit = net.now() + 50 * MS;
        assert!(net.run_until_cond(limit, |n| n.app(0).finished_at(id).is_some()));
        assert!(net.endpoint(0).metrics().retransmitted_packets >= 1);
        // Samples after the RESEND apply the cut (at most once per RTT).
        for _ in 0..3 {
            rpc(&mut net, 0, 1, 100);
        }
        (before, net.endpoint(0).metrics().unsched_window_cuts)
    };
    let (before, cuts) = lose_second_packet(adaptive());
    assert!(!before.congested);
    assert!(before.unsched_window > 3 * 1416, "{before:?}");
    assert_eq!(cuts, 1);
    let (_, cuts) = lose_second_packet(measuring());
    assert_eq!(cuts, 0);
}

/// A standing queue of other traffic in front of a receiver (here: 100 µs
/// more on every packet to the server, while the server's own DATA leaves
/// its link nearly idle) widens the grant window it gives the client by about that
/// delay at the link rate, so that a message keeps moving at link speed
/// across it; the window narrows back once the queue is gone. Without
/// `grant_covers_foreign_queue` it stays at 3 × `rtt_min`.
#[test]
fn a_foreign_queue_widens_the_grant_window_until_it_goes() {
    let run = |cfg: Config| {
        let mut net = star(2, cfg, Reply::Fixed(100));
        for _ in 0..10 {
            rpc(&mut net, 0, 1, 100);
        }
        let quiet = rtt(&net, 1, 0);
        net.fabric_mut().set_host_rx_delay(1, 100 * US);
        for _ in 0..40 {
            rpc(&mut net, 0, 1, 100);
        }
        let queued = rtt(&net, 1, 0);
        // A 500 KB request across the queue.
        let start = net.now();
        let id = rpc(&mut net, 0, 1, 500_000);
        let took = net.app(0).finished_at(id).unwrap() - start;
        net.fabric_mut().set_host_rx_delay(1, 0);
        for _ in 0..40 {
            rpc(&mut net, 0, 1, 100);
        }
        (quiet, queued, took, rtt(&net, 1, 0))
    };
    let (quiet, queued, took, after) = run(adaptive().with_grant_covers_foreign_queue(true));
    assert_eq!(quiet.rtt_min, queued.rtt_min, "the minimum stays");
    assert!(
        queued.srtt > quiet.rtt_min.unwrap() + 90 * US as u32,
        "{queued:?}"
    );
    // The path's RTT now (rtt_min + ~100 µs) at 25 Gbps: over 300 KB.
    let min = quiet.rtt_min.unwrap() as u64;
    let across = (min + 95 * US) * 25_000_000_000 / 8_000_000_000;
    assert!(
        queued.grant_window as u64 >= across && queued.grant_window > 6 * quiet.grant_window,
        "{quiet:?} {queued:?}"
    );
    assert_eq!(after.grant_window, quiet.grant_window, "{after:?}");
    let (q0, q1, took_without, _) = run(adaptive());
    assert_eq!(q1.grant_window, q0.grant_window);
    // Printed for docs/congestion.md (`-- --nocapture`).
    eprintln!(
        "500 KB request across a 100 us queue: covered {took} ns, not covered {took_without} ns"
    );
    // 500 KB is 160 µs of wire time; one window per 105 µs RTT is slower.
    assert!(took * 10 < took_without * 6, "{took} vs {took_without}");
}

/// The receiver's own incast does not widen its windows: four clients'
/// 1 MB requests queue at the server's downlink (the RTT rises), but the
/// server's link is busy receiving them, so the queue is its own.
#[test]
fn the_receivers_own_queue_does_not_widen_its_grant_windows() {
    let cfg = adaptive().with_grant_covers_foreign_queue(true);
    let mut net = star(5, cfg, Reply::Fixed(100));
    for c in 1..5 {
        for _ in 0..5 {
            rpc(&mut net, c, 0, 100);
        }
    }
    let base: Vec<u32> = (1..5).map(|c| rtt(&net, 0, c).grant_window).collect();
    let ids: Vec<_> = (1..5)
        .map(|c| {
            (
                c,
                net.send_request(c, 0, pattern(1_000_000, c as u64))
                    .unwrap(),
            )
        })
        .collect();
    let (mut widest, mut highest_srtt) = (0u32, 0u32);
    let limit = net.now() + 50 * MS;
    while ids
        .iter()
        .any(|&(c, id)| net.app(c).finished_at(id).is_none())
    {
        assert!(net.now() < limit, "the requests did not finish");
        net.run_for(10 * US);
        for c in 1..5 {
            let r = rtt(&net, 0, c);
            widest = widest.max(r.grant_window);
            highest_srtt = highest_srtt.max(r.srtt);
        }
    }
    let min = rtt(&net, 0, 1).rtt_min.unwrap();
    assert!(
        highest_srtt > 4 * min,
        "the incast queued: srtt {highest_srtt} ns, min {min} ns"
    );
    let base_max = *base.iter().max().unwrap();
    assert!(
        widest <= base_max + base_max / 2,
        "windows widened from {base:?} to {widest}"
    );
}
