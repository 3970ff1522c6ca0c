//! Protocol behaviour of the homa-proto engine on the deterministic test
//! network: SRPT at sender and receiver, overcommitment, priorities, every loss
//! recovery path, BUSY, ACK-based cleanup, at-most-once, pool exhaustion and
//! timeouts.

use bytes::Bytes;
use homa_proto::{Config, Event, GrantPolicy, Message, RpcError, RpcId, ServerRpc};
use homa_testnet::{
    pattern, App, Cut, EngineNet, Fabric, HostCtx, Partition, Record, Reply, TestApp,
};

const G25: u64 = 25_000_000_000;
const MS: u64 = 1_000_000;

fn star(n: usize) -> Fabric {
    Fabric::star(n, G25, 500, 250).with_seed(1)
}

fn net_with(n: usize, config: Config, reply: Reply) -> EngineNet<TestApp> {
    EngineNet::uniform(star(n), config, |_| TestApp::new(reply)).unwrap()
}

fn requests_seen(net: &EngineNet<TestApp>, h: usize) -> Vec<(ServerRpc, Vec<u8>)> {
    net.app(h)
        .requests()
        .map(|(r, d)| (*r, d.to_vec()))
        .collect()
}

fn all_idle(net: &EngineNet<TestApp>) -> bool {
    (0..net.n_hosts()).all(|h| {
        let s = net.endpoint(h).stats();
        s.client_rpcs == 0 && s.server_rpcs == 0 && s.pool_empty
    })
}

fn data_prio_packets(net: &EngineNet<TestApp>, h: usize) -> [u64; 8] {
    let l = net.fabric().host_nic(h).unwrap();
    net.fabric().link_stats(l).tx_packets_by_prio
}

#[test]
fn sender_srpt_sends_shortest_message_first() {
    // One sender, four messages to four different receivers (so receiver-side
    // scheduling plays no part), issued largest first at the same instant.
    let mut net = net_with(5, Config::default(), Reply::Fixed(1));
    let sizes = [1_000_000usize, 400_000, 100_000, 20_000];
    let ids: Vec<RpcId> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| net.send_request(0, i + 1, pattern(s, i as u64)).unwrap())
        .collect();
    assert!(net.run_until_cond(100 * MS, |n| n.app(0).responses() == 4));
    let times: Vec<u64> = ids
        .iter()
        .map(|id| net.app(0).finished_at(*id).unwrap())
        .collect();
    // Completion order is the reverse of issue order: shortest first.
    for w in times.windows(2) {
        assert!(w[0] > w[1], "completion times {times:?}");
    }
    // The 20 KB message did not wait behind the 1 MB one: it finished in well
    // under the 1 MB message's transmission time (320 µs at 25 Gbps).
    assert!(times[3] < 50_000, "short message took {} ns", times[3]);
}

#[test]
fn receiver_srpt_grants_shortest_message_first() {
    // Four senders to one receiver at once; the receiver's grants decide.
    let config = Config::default().with_max_overcommit(1);
    let mut net = net_with(5, config, Reply::Fixed(1));
    let sizes = [800_000usize, 600_000, 400_000, 200_000];
    let ids: Vec<(usize, RpcId)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            (
                i + 1,
                net.send_request(i + 1, 0, pattern(s, i as u64)).unwrap(),
            )
        })
        .collect();
    assert!(net.run_until_cond(100 * MS, |n| (1..5).all(|h| n.app(h).responses() == 1)));
    let times: Vec<u64> = ids
        .iter()
        .map(|(h, id)| net.app(*h).finished_at(*id).unwrap())
        .collect();
    for w in times.windows(2) {
        assert!(w[0] > w[1], "completion times {times:?}");
    }
}

#[test]
fn overcommitment_and_incoming_cap_are_respected() {
    let config = Config::default()
        .with_max_overcommit(3)
        .with_grant_fifo_permille(0);
    let max_incoming = config.effective_max_incoming();
    let mut net = net_with(9, config, Reply::Fixed(1));
    for h in 1..9 {
        net.send_request(h, 0, pattern(500_000, h as u64)).unwrap();
    }
    let mut most = 0;
    while !(1..9).all(|h| net.app(h).responses() == 1) {
        assert!(net.now() < 200 * MS, "did not finish");
        net.run_for(2_000);
        let s = net.endpoint(0).stats();
        assert!(s.granted_messages <= 3, "{s:?}");
        assert!(s.incoming_bytes <= max_incoming, "{s:?}");
        most = most.max(s.granted_messages);
    }
    // With eight candidates the receiver really does keep three going.
    assert_eq!(most, 3);
}

/// When the four 500 KB requests of hosts 1-4 to host 0 finish, in order.
fn four_equal_messages(config: Config) -> Vec<u64> {
    let mut net = net_with(5, config, Reply::Fixed(1));
    let ids: Vec<RpcId> = (1..5)
        .map(|h| net.send_request(h, 0, pattern(500_000, h as u64)).unwrap())
        .collect();
    assert!(net.run_until_cond(200 * MS, |n| (1..5).all(|h| n.app(h).responses() == 1)));
    let mut t: Vec<u64> = (1..5)
        .map(|h| net.app(h).finished_at(ids[h - 1]).unwrap())
        .collect();
    t.sort();
    t
}

#[test]
fn every_message_grants_all_incoming_messages_at_once() {
    // BasicTransport's policy ignores max_overcommit: four equal messages
    // share the downlink and finish together, where SRPT with
    // overcommitment 1 finishes them one after the other.
    let every = Config::default()
        .with_max_overcommit(1)
        .with_grant_fifo_permille(0)
        .with_grant_policy(GrantPolicy::EveryMessage {
            increment_bytes: 5 * 1416,
        });
    let t = four_equal_messages(every);
    let srpt = four_equal_messages(
        Config::default()
            .with_max_overcommit(1)
            .with_grant_fifo_permille(0),
    );
    // 2 MB at 25 Gbps: ~650 µs for all; one message alone ~170 µs.
    assert!(t[3] - t[0] < (t[3] / 5), "every message: {t:?}");
    assert!(srpt[3] - srpt[0] > (srpt[3] / 2), "SRPT: {srpt:?}");
}

#[test]
fn fifo_grants_let_a_large_message_progress() {
    // One huge message competes with a stream of shorter ones; with FIFO grants
    // it keeps receiving some bandwidth instead of starving.
    let config = Config::default()
        .with_max_overcommit(1)
        .with_grant_fifo_permille(100);
    let mut net = net_with(3, config, Reply::Fixed(1));
    let big = net.send_request(1, 0, pattern(1_000_000, 9)).unwrap();
    let mut sent = 0;
    while net.app(1).finished_at(big).is_none() {
        assert!(net.now() < 100 * MS, "large message starved");
        if net.endpoint(2).stats().client_rpcs < 2 && sent < 200 {
            net.send_request(2, 0, pattern(300_000, sent)).unwrap();
            sent += 1;
        }
        net.run_for(5_000);
    }
    assert!(
        sent < 200,
        "the large message only finished after the stream ended"
    );
}

/// The paper's rule for scheduled levels: counted from the bottom, no tail
/// boost, no level kept for last windows.
fn levels_from_the_bottom() -> Config {
    Config::default()
        .with_sched_levels_from_top(false)
        .with_sched_tail_level(false)
        .with_boost_tail_bytes(0)
}

/// Levels by SRPT rank counted from the top, every level for ranks (no
/// level kept for last windows).
fn levels_by_rank_from_the_top() -> Config {
    Config::default().with_sched_tail_level(false)
}

#[test]
fn priorities_follow_cutoffs_and_rank() {
    let mut net = net_with(5, levels_from_the_bottom(), Reply::Fixed(1));
    // Short requests: unscheduled, highest level.
    for i in 0..5 {
        net.send_request(1, 0, pattern(100, i)).unwrap();
    }
    assert!(net.run_until_cond(10 * MS, |n| n.app(1).responses() == 5));
    let p = data_prio_packets(&net, 1);
    // Five DATA packets plus one CUTOFFS (the first exchange between two
    // endpoints), all at the top level.
    assert_eq!(
        net.endpoint(1)
            .metrics()
            .sent(homa_proto::wire::PacketType::Data),
        5
    );
    assert_eq!(p[7], 6, "{p:?}");
    assert_eq!(p.iter().sum::<u64>(), p[7], "{p:?}");
    // A 5 KB message: level 6 by the default cutoffs (1000 < 5000 <= 10000).
    net.send_request(2, 0, pattern(5_000, 1)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(2).responses() == 1));
    let p = data_prio_packets(&net, 2);
    assert_eq!(p[6], 4, "{p:?}");
    // One large message alone: unscheduled part at level 4 (the last
    // unscheduled level), scheduled part at the lowest level, 0.
    net.send_request(3, 0, pattern(500_000, 2)).unwrap();
    assert!(net.run_until_cond(50 * MS, |n| n.app(3).responses() == 1));
    let p = data_prio_packets(&net, 3);
    let unsched_packets = (62_500 + 1415) / 1416;
    assert!(p[4] >= unsched_packets as u64 - 1, "{p:?}");
    assert!(p[0] > 300, "{p:?}");
    assert_eq!(p[1] + p[2] + p[3] + p[5] + p[6] + p[7], 0, "{p:?}");
    // Receiver's control packets (grants) go at the highest level.
    assert!(data_prio_packets(&net, 0)[7] > 0);
}

#[test]
fn a_lone_scheduled_message_goes_at_the_top_scheduled_level_and_its_tail_higher() {
    // Levels counted from the top, every one for ranks, and the tail
    // boosted below one grant window (`None`; off by default).
    let config = levels_by_rank_from_the_top().with_boost_tail_bytes(None);
    let mut net = net_with(2, config, Reply::Fixed(1));
    net.send_request(1, 0, pattern(500_000, 2)).unwrap();
    assert!(net.run_until_cond(50 * MS, |n| n.app(1).responses() == 1));
    let p = data_prio_packets(&net, 1);
    // Unscheduled part at level 4, scheduled part at the highest scheduled
    // level (3), and its tail above the scheduled levels: the grants sent
    // with fewer than 63,720 bytes still to grant carry the unscheduled
    // level of that size (10,000-100,000 B: 5, 1,000-10,000 B: 6, up to
    // 1,000 B: 7), and the sender sends every packet after such a GRANT at
    // its level, so the last ~2 windows go boosted (measured: 227 packets
    // at 3, 45 at 4, 38 at 5, 6 at 6, 38 at 7).
    assert!(p[3] > 200, "{p:?}");
    assert!(p[4] >= 44, "{p:?}");
    assert!(p[5] + p[6] + p[7] > 45, "{p:?}");
    assert_eq!(p[0] + p[1] + p[2], 0, "{p:?}");
}

/// Sends 900, 600 and 300 KB from hosts 1, 2, 3 to host 0 at once under
/// `config` and returns the packets per level of the shortest (host 3) and
/// the longest (host 1) message.
fn three_large_messages_at_once(config: Config) -> ([u64; 8], [u64; 8]) {
    let mut net = net_with(4, config, Reply::Fixed(1));
    let sizes = [900_000usize, 600_000, 300_000];
    for (i, &s) in sizes.iter().enumerate() {
        net.send_request(i + 1, 0, pattern(s, i as u64)).unwrap();
    }
    assert!(net.run_until_cond(100 * MS, |n| (1..4).all(|h| n.app(h).responses() == 1)));
    (data_prio_packets(&net, 3), data_prio_packets(&net, 1))
}

#[test]
fn scheduled_priorities_rank_concurrent_messages_from_the_top() {
    // Three large messages at once: ranks 0, 1, 2 get levels 3, 2, 1; no
    // message is ever granted at level 0 (nobody is left out, so no FIFO
    // grant either).
    let (shortest, longest) = three_large_messages_at_once(levels_by_rank_from_the_top());
    assert!(shortest[3] > 0, "shortest message: {shortest:?}");
    assert!(longest[1] > 0, "longest message: {longest:?}");
    assert_eq!(longest[0] + shortest[0], 0, "{longest:?} {shortest:?}");
}

#[test]
fn ranks_start_below_the_level_kept_for_last_windows() {
    // The default: the top scheduled level (3) is kept for messages' last
    // window. Three large messages at once: ranks 0, 1, 2 get levels 2, 1,
    // 0, and each one's last window goes at 3, the longest's too.
    let (shortest, longest) = three_large_messages_at_once(Config::default());
    assert!(shortest[2] > 100, "shortest message: {shortest:?}");
    assert!(shortest[3] > 0, "shortest message: {shortest:?}");
    assert!(
        longest[0] > 0 && longest[3] > 0,
        "longest message: {longest:?}"
    );
    // Only the last window and what the sender still had to send of the
    // grant before it: at most a window plus the lead (2 packets) more.
    let c = Config::default();
    let window = (c.effective_grant_window() / c.max_data_per_packet() as u32) as u64;
    assert!(
        shortest[3] <= 2 * window + 2,
        "shortest message: {shortest:?}"
    );
    assert!(longest[3] <= 2 * window + 2, "longest message: {longest:?}");
    assert!(
        shortest[2] > 2 * shortest[3],
        "shortest message: {shortest:?}"
    );
}

#[test]
fn the_receivers_shortest_message_gets_a_lead_window() {
    // One scheduled message alone is its receiver's shortest: each GRANT
    // lets it run the grant window plus `lead_window_packets` full packets
    // (2 by default) beyond what has arrived, so the receiver's granted but
    // unreceived bytes reach the window plus the lead, never more.
    let config = Config::default();
    let window = config.effective_grant_window() as u64;
    let packet = config.max_data_per_packet() as u64;
    let mut most = Vec::new();
    for lead in [0u32, 2] {
        let mut net = net_with(
            2,
            config.clone().with_lead_window_packets(lead),
            Reply::Fixed(1),
        );
        net.send_request(1, 0, pattern(300_000, 4)).unwrap();
        let mut m = 0u64;
        while net.app(1).responses() == 0 {
            assert!(net.now() < 50 * MS, "the message never finished");
            net.run_for(100);
            m = m.max(net.endpoint(0).stats().incoming_bytes);
        }
        most.push(m);
    }
    assert!(most[0] <= window, "{most:?}, window {window}");
    assert!(most[1] > window, "{most:?}, window {window}");
    assert!(most[1] <= window + 2 * packet, "{most:?}, window {window}");
}

#[test]
fn scheduled_priorities_rank_concurrent_messages() {
    // The paper's rule. Three large messages at once: the shortest gets the
    // highest scheduled level in use (2), the others 1 and 0.
    let (shortest, longest) = three_large_messages_at_once(levels_from_the_bottom());
    assert!(shortest[2] > 0, "shortest message: {shortest:?}");
    assert!(longest[0] > 0, "longest message: {longest:?}");
    assert_eq!(longest[3] + shortest[3], 0, "level 3 is kept for newcomers");
}

#[test]
fn lost_unscheduled_request_is_restarted_after_rpc_unknown() {
    let mut net = net_with(2, Config::default(), Reply::Echo);
    // Everything between the hosts is lost for the first 100 µs: the whole
    // (single-packet) request vanishes and the server never hears of the RPC.
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Pairs(vec![(0, 1)]),
        from: 0,
        until: 100_000,
    });
    let id = net.send_request(0, 1, pattern(500, 1)).unwrap();
    assert!(net.run_until_cond(50 * MS, |n| n.app(0).responses() == 1));
    assert_eq!(net.app(0).response(id).unwrap(), &pattern(500, 1)[..]);
    assert_eq!(net.endpoint(0).metrics().restarts, 1);
    assert!(
        net.endpoint(1)
            .metrics()
            .sent(homa_proto::wire::PacketType::RpcUnknown)
            >= 1
    );
    assert_eq!(requests_seen(&net, 1).len(), 1);
}

#[test]
fn lost_data_and_grants_are_recovered_by_resend() {
    let mut net = net_with(2, Config::default(), Reply::Fixed(10));
    // A 150 µs blackout in the middle of a 1 MB transfer loses DATA one way and
    // GRANTs the other.
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Pairs(vec![(0, 1)]),
        from: 100_000,
        until: 250_000,
    });
    let id = net.send_request(0, 1, pattern(1_000_000, 3)).unwrap();
    assert!(net.run_until_cond(50 * MS, |n| n.app(0).responses() == 1));
    assert!(net.app(0).response(id).is_some());
    let server = net.endpoint(1).metrics();
    assert!(server.resends_sent >= 1, "{server:?}");
    assert!(net.endpoint(0).metrics().retransmitted_packets >= 1);
    assert_eq!(requests_seen(&net, 1)[0].1, pattern(1_000_000, 3)[..]);
}

#[test]
fn several_packets_lost_from_one_burst_are_all_asked_for_at_once() {
    // A 28-packet request (all unscheduled) loses a third of its packets on
    // the client's uplink, several gaps of them; the link is clean again
    // before the receiver notices.
    let config = Config::default();
    let resend = config.effective_resend_interval_ns();
    let mut net = net_with(2, config, Reply::Fixed(10));
    let nic = net.fabric().host_nic(0).unwrap();
    net.fabric_mut()
        .set_link_faults(nic, Some(homa_testnet::FaultConfig::loss(0.3)));
    let id = net.send_request(0, 1, pattern(40_000, 9)).unwrap();
    net.run_until(100_000);
    net.fabric_mut().set_link_faults(nic, None);
    let lost = net.fabric().fault_stats().lost;
    assert!(lost >= 3, "{lost} lost");
    // One RESEND per gap, all in the first interval: the response is
    // back within two intervals (the timer ticks at half of one), and
    // only the lost packets were sent again.
    assert!(net.run_until_cond(20 * resend, |n| n.app(0).responses() == 1));
    assert!(net.now() < 2 * resend, "done at {} ns", net.now());
    assert!(net.app(0).response(id).is_some());
    assert!(net.endpoint(1).metrics().resends_sent >= 2);
    assert_eq!(net.endpoint(0).metrics().retransmitted_packets, lost);
    assert_eq!(requests_seen(&net, 1)[0].1, pattern(40_000, 9)[..]);
}

#[test]
fn basic_asks_for_the_first_gap_only_as_basic_transport() {
    // The same losses under `GrantPolicy::EveryMessage` (the `basic`
    // baseline): one RESEND per interval, for the first gap.
    let config = Config::default().with_grant_policy(GrantPolicy::EveryMessage {
        increment_bytes: 5 * 1416,
    });
    let resend = config.effective_resend_interval_ns();
    let mut net = net_with(2, config, Reply::Fixed(10));
    let nic = net.fabric().host_nic(0).unwrap();
    net.fabric_mut()
        .set_link_faults(nic, Some(homa_testnet::FaultConfig::loss(0.3)));
    net.send_request(0, 1, pattern(40_000, 9)).unwrap();
    net.run_until(100_000);
    net.fabric_mut().set_link_faults(nic, None);
    assert!(net.fabric().fault_stats().lost >= 3);
    net.run_until(resend * 3 / 2 + 100_000);
    assert_eq!(net.endpoint(1).metrics().resends_sent, 1);
    assert!(net.run_until_cond(20 * resend, |n| n.app(0).responses() == 1));
}

#[test]
fn lost_response_is_resent_without_executing_twice() {
    let mut net = net_with(2, Config::default(), Reply::Fixed(200_000));
    let id = net.send_request(0, 1, pattern(100, 5)).unwrap();
    // Let the request arrive, then black out the response.
    assert!(net.run_until_cond(MS, |n| n.app(1).requests().count() == 1));
    let now = net.now();
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Pairs(vec![(0, 1)]),
        from: now,
        until: now + 3 * MS,
    });
    assert!(net.run_until_cond(50 * MS, |n| n.app(0).responses() == 1));
    assert_eq!(net.app(0).response(id).unwrap().len(), 200_000);
    assert_eq!(requests_seen(&net, 1).len(), 1, "executed exactly once");
    assert!(net.endpoint(0).metrics().resends_sent >= 1);
}

#[test]
fn busy_keeps_a_slow_server_alive_and_timeout_fails_a_dead_one() {
    let config = Config::default().with_rpc_timeout_ns(20 * MS);
    let mut net = net_with(3, config, Reply::Manual);
    let slow = net.send_request(0, 1, pattern(1000, 1)).unwrap();
    // Host 2 is cut off for good: its RPC must time out.
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Isolate(2),
        from: 0,
        until: u64::MAX,
    });
    let dead = net.send_request(0, 2, pattern(1000, 2)).unwrap();
    net.run_until(100 * MS);
    // The slow server (application never answers) keeps the client waiting
    // through BUSY, well past the timeout.
    assert_eq!(net.app(0).finished_at(slow), None);
    // The client asks every resend interval until the first BUSY, then ten
    // times less often; each ask is answered by BUSY.
    let busy = net
        .endpoint(1)
        .metrics()
        .sent(homa_proto::wire::PacketType::Busy);
    assert!(busy >= 5, "{busy} BUSY packets");
    assert_eq!(net.app(0).failure(dead), Some(RpcError::Timeout));
    let t = net.app(0).finished_at(dead).unwrap();
    assert!((20 * MS..22 * MS).contains(&t), "timed out at {t}");
    // Now the application answers and the RPC completes.
    let rpc = net.app(1).unanswered[0];
    net.send_response(1, rpc, pattern(10, 0)).unwrap();
    assert!(net.run_until_cond(200 * MS, |n| n.app(0).responses() == 1));
    assert_eq!(net.app(0).response(slow).unwrap(), &pattern(10, 0)[..]);
}

#[test]
fn server_state_is_freed_by_piggybacked_and_explicit_acks() {
    let mut net = net_with(2, Config::default(), Reply::Echo);
    for i in 0..5 {
        net.send_request(0, 1, pattern(100, i)).unwrap();
        assert!(net.run_until_cond(10 * MS, |n| n.app(0).responses() == i as usize + 1));
    }
    // Each later request carried an ACK for the previous RPC.
    assert!(net.endpoint(1).metrics().acks_processed >= 4);
    assert_eq!(net.endpoint(1).stats().server_rpcs, 1);
    // The last one is freed after NEED_ACK / ACK.
    assert!(
        net.run_until_cond(net.now() + 20 * MS, |n| n.endpoint(1).stats().server_rpcs
            == 0)
    );
    assert!(
        net.endpoint(1)
            .metrics()
            .sent(homa_proto::wire::PacketType::NeedAck)
            >= 1
    );
    assert!(
        net.endpoint(0)
            .metrics()
            .sent(homa_proto::wire::PacketType::Ack)
            >= 1
    );
    // And idle peers are forgotten.
    let idle = net.endpoint(0).config().peer_idle_ns;
    net.run_until(net.now() + idle + 5 * MS);
    assert_eq!(net.endpoint(0).stats().peers, 0);
    assert_eq!(net.endpoint(1).stats().peers, 0);
}

#[test]
fn lost_acks_are_asked_for_again() {
    let mut net = net_with(2, Config::default(), Reply::Echo);
    net.send_request(0, 1, pattern(100, 1)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(0).responses() == 1));
    let now = net.now();
    net.fabric_mut().add_partition(Partition {
        cut: Cut::Pairs(vec![(0, 1)]),
        from: now,
        until: now + 5 * MS,
    });
    assert!(net.run_until_cond(now + 50 * MS, |n| n.endpoint(1).stats().server_rpcs == 0));
    assert!(
        net.endpoint(1)
            .metrics()
            .sent(homa_proto::wire::PacketType::NeedAck)
            >= 3
    );
    assert!(net.now() > now + 5 * MS);
}

/// Holds every request's message (its pool space) until told to answer.
#[derive(Default)]
struct Holder {
    held: Vec<(ServerRpc, Message, u64)>,
    answered: Vec<(u64, usize)>,
    responses: usize,
}

impl App for Holder {
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        match event {
            Event::Request { rpc, message } => {
                self.held.push((rpc, message, ctx.now()));
                ctx.wake_after(2 * MS, 0);
            }
            Event::Response { .. } => self.responses += 1,
            Event::Failed { id, error } => panic!("{id:?} failed: {error}"),
            ev => panic!("not asked for: {ev:?}"),
        }
    }
    fn on_wakeup(&mut self, ctx: &mut HostCtx<'_>, _token: u64) {
        let now = ctx.now();
        while self.held.first().is_some_and(|h| h.2 + 2 * MS <= now) {
            let (rpc, msg, _) = self.held.remove(0);
            self.answered.push((now, msg.len()));
            drop(msg);
            ctx.send_response(rpc, Bytes::from_static(b"ok")).unwrap();
        }
    }
}

#[test]
fn a_one_packet_request_waits_for_pool_space_too() {
    // One-packet messages go straight into the pool (no reassembly state);
    // when the pool is full they must wait like any other. The server's
    // pool of 15 bpages is filled exactly by a held 15-bpage request; a
    // 100-byte one arriving meanwhile waits and is delivered once the big
    // one is let go.
    const FULL: usize = 15 * 65_536;
    let config = Config::default()
        .with_pool_bytes(FULL)
        .with_max_message_length(FULL as u32);
    let mut net = EngineNet::uniform(star(3), config, |_| Holder::default()).unwrap();
    net.send_request(1, 0, pattern(FULL, 1)).unwrap();
    assert!(net.run_until_cond(5 * MS, |n| n.app(0).held.len() == 1));
    net.send_request(2, 0, pattern(100, 2)).unwrap();
    net.run_until(net.now() + 200_000);
    assert_eq!(net.endpoint(0).stats().pool_waiters, 1);
    assert_eq!(
        net.app(0).held.len(),
        1,
        "the small request cannot be delivered yet"
    );
    assert!(net.run_until_cond(100 * MS, |n| (1..3).all(|h| n.app(h).responses == 1)));
    let order: Vec<usize> = net.app(0).answered.iter().map(|a| a.1).collect();
    assert_eq!(order, [FULL, 100]);
    assert!(net.endpoint(0).metrics().pool_waits >= 1);
}

#[test]
fn pool_exhaustion_waits_and_resumes_shortest_first() {
    // The server's pool holds 1 MiB (16 bpages). A 900 KB request arrives first
    // and the application holds it for 2 ms; a 700 KB and then a 600 KB request
    // arrive meanwhile and must wait. When space frees, the shorter waiting
    // message resumes first even though it arrived later; the longer one only
    // fits once that one is released too.
    let config = Config::default().with_pool_bytes(1 << 20);
    let mut net = EngineNet::uniform(star(4), config, |_| Holder::default()).unwrap();
    net.send_request(1, 0, pattern(900_000, 1)).unwrap();
    net.run_until(50_000);
    net.send_request(2, 0, pattern(700_000, 2)).unwrap();
    net.run_until(100_000);
    net.send_request(3, 0, pattern(600_000, 3)).unwrap();
    net.run_until(400_000);
    let s = net.endpoint(0).stats();
    assert_eq!(s.pool_waiters, 2, "{s:?}");
    assert!(net.run_until_cond(200 * MS, |n| (1..4).all(|h| n.app(h).responses == 1)));
    let order: Vec<usize> = net.app(0).answered.iter().map(|a| a.1).collect();
    assert_eq!(order, [900_000, 600_000, 700_000]);
    let m = net.endpoint(0).metrics();
    assert!(m.pool_waits >= 2, "{m:?}");
    // Resumption re-requests the dropped bytes at once; no silence-driven
    // RESEND is needed on this loss-free network.
    assert_eq!(m.resends_sent, 0, "{m:?}");
    net.run_until(net.now() + 20 * MS);
    assert!(net.endpoint(0).stats().pool_empty);
}

#[test]
fn crashed_server_restarts_and_the_rpc_completes() {
    let mut net = net_with(2, Config::default(), Reply::Echo);
    let id = net.send_request(0, 1, pattern(300_000, 7)).unwrap();
    net.run_until(20_000);
    net.crash(1, Some(3 * MS));
    assert!(net.run_until_cond(100 * MS, |n| n.app(0).finished_at(id).is_some()));
    assert_eq!(net.app(0).response(id).unwrap(), &pattern(300_000, 7)[..]);
    assert!(net.endpoint(0).metrics().restarts >= 1);
    assert!(net
        .app(1)
        .log
        .iter()
        .any(|(_, r)| matches!(r, Record::Restarted)));
}

#[test]
fn crashed_client_leaves_no_server_state_behind() {
    let config = Config::default().with_rpc_timeout_ns(20 * MS);
    let mut net = net_with(2, config, Reply::Fixed(500_000));
    net.send_request(0, 1, pattern(200_000, 1)).unwrap();
    assert!(net.run_until_cond(MS, |n| n.app(1).requests().count() == 1));
    net.crash(0, None);
    // The server's response goes unanswered (no grants, no ACK): it gives up.
    assert!(net.run_until_cond(100 * MS, |n| n.endpoint(1).stats().server_rpcs == 0));
    assert!(net.endpoint(1).metrics().timeouts >= 1);
}

#[test]
fn every_rpc_finishes_and_tables_drain_in_a_mixed_run() {
    let mut net = net_with(4, Config::default(), Reply::Echo);
    let mut ids = Vec::new();
    for i in 0..40u64 {
        let src = (i % 4) as usize;
        let dst = ((i / 4 + 1 + i) % 4) as usize;
        if src == dst {
            continue;
        }
        let size = [1usize, 1500, 70_000, 300_000][(i % 4) as usize];
        ids.push((
            src,
            net.send_request(src, dst, pattern(size, i)).unwrap(),
            size,
            i,
        ));
    }
    let n = ids.len();
    assert!(net.run_until_cond(100 * MS, |net| {
        (0..4).map(|h| net.app(h).responses()).sum::<usize>() == n
    }));
    for (src, id, size, seed) in ids {
        assert_eq!(net.app(src).response(id).unwrap(), &pattern(size, seed)[..]);
    }
    assert!(net.run_until_cond(net.now() + 50 * MS, all_idle));
}

#[test]
fn empty_messages_travel_at_the_top_unscheduled_level() {
    let mut net = net_with(2, Config::default(), Reply::Fixed(0));
    let id = net.send_request(1, 0, Bytes::new()).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(1).responses() == 1));
    assert_eq!(net.app(1).response(id).unwrap().len(), 0);
    assert_eq!(requests_seen(&net, 0)[0].1.len(), 0);
    let p = data_prio_packets(&net, 1);
    assert_eq!(p.iter().sum::<u64>(), p[7], "{p:?}");
}

#[test]
fn a_request_the_server_refuses_times_out_instead_of_retrying_forever() {
    // The client allows 2 MB messages, the server only 1 MB: the server drops
    // the request (and answers the client's RESENDs with RPC_UNKNOWN).
    let mut net = EngineNet::new(
        star(2),
        |h| {
            Config::default()
                .with_link_bps(G25)
                .with_max_message_length(if h == 0 { 2_000_000 } else { 1_000_000 })
                .with_pool_bytes(4 << 20)
                .with_rpc_timeout_ns(20 * MS)
        },
        |_| TestApp::new(Reply::Echo),
    )
    .unwrap();
    let id = net.send_request(0, 1, pattern(1_500_000, 1)).unwrap();
    assert!(net.run_until_cond(200 * MS, |n| n.app(0).finished_at(id).is_some()));
    assert_eq!(net.app(0).failure(id), Some(RpcError::Timeout));
    assert!(net.app(0).finished_at(id).unwrap() <= 25 * MS);
    assert!(
        net.endpoint(1)
            .metrics()
            .drops(homa_proto::DropReason::MessageTooLong)
            > 0
    );
}

#[test]
fn an_ack_piggybacked_on_a_refused_request_still_frees_the_server() {
    // One server RPC per peer: the second request is refused while the first
    // is still held, but its piggybacked ACK frees the first, and the retry
    // goes through without waiting for NEED_ACK.
    let config = Config::default().with_max_server_rpcs_per_peer(1);
    let mut net = net_with(2, config, Reply::Echo);
    net.send_request(0, 1, pattern(100, 1)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(0).responses() == 1));
    let start = net.now();
    let id = net.send_request(0, 1, pattern(100, 2)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(0).responses() == 2));
    let took = net.app(0).finished_at(id).unwrap() - start;
    assert!(took < 50_000, "second RPC took {took} ns");
}

#[test]
fn room_freed_under_the_incoming_cap_is_granted_at_once() {
    // With an incoming cap of one window, a second message gets its grants as
    // the first one's outstanding bytes arrive, not only when it completes.
    let config = Config::default()
        .with_max_overcommit(2)
        .with_max_incoming(62_500);
    let mut net = net_with(3, config, Reply::Fixed(1));
    let a = net.send_request(1, 0, pattern(200_000, 1)).unwrap();
    let b = net.send_request(2, 0, pattern(400_000, 2)).unwrap();
    assert!(net.run_until_cond(100 * MS, |n| n.app(2).finished_at(b).is_some()));
    let ta = net.app(1).finished_at(a).unwrap();
    let tb = net.app(2).finished_at(b).unwrap();
    // 600 KB over one 25 Gbps downlink take 192 µs; B must not idle behind A.
    assert!(ta < tb);
    assert!(tb < 260_000, "A at {ta} ns, B at {tb} ns");
}

#[test]
fn an_abandoned_request_frees_the_server_at_once() {
    let mut net = net_with(2, Config::default(), Reply::Manual);
    let id = net.send_request(0, 1, pattern(5_000, 1)).unwrap();
    assert!(net.run_until_cond(MS, |n| n.app(1).requests().count() == 1));
    let rpc = net.app(1).unanswered[0];
    net.with_host(1, |_, ctx| ctx.endpoint().unwrap().abandon(rpc));
    assert_eq!(net.endpoint(1).stats().server_rpcs, 0);
    // The client is not told directly; it cancels, or it times out.
    net.with_host(0, |_, ctx| ctx.cancel(id));
    assert!(net.run_until_cond(net.now() + 20 * MS, all_idle));
    assert_eq!(requests_seen(&net, 1).len(), 1);
}

#[test]
fn an_abandoned_request_is_never_run_again_even_if_the_client_keeps_asking() {
    let config = Config::default()
        .with_rpc_timeout_ns(500 * MS)
        .with_tombstone_ns(10 * MS);
    let mut net = net_with(2, config, Reply::Manual);
    let id = net.send_request(0, 1, pattern(5_000, 1)).unwrap();
    assert!(net.run_until_cond(MS, |n| n.app(1).requests().count() == 1));
    let rpc = net.app(1).unanswered[0];
    net.with_host(1, |_, ctx| ctx.endpoint().unwrap().abandon(rpc));
    assert!(net.run_until_cond(2_000 * MS, |n| n.app(0).finished_at(id).is_some()));
    assert_eq!(net.app(0).failure(id), Some(RpcError::Timeout));
    assert_eq!(
        requests_seen(&net, 1).len(),
        1,
        "re-executed after the tombstone"
    );
}

/// Answers every request with 600 KB; holds every response it receives (its
/// pool space) and records failures.
#[derive(Default)]
struct PoolHog {
    held: Vec<Message>,
    failed: Vec<(u64, RpcId, RpcError)>,
}

impl App for PoolHog {
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        match event {
            Event::Request { rpc, .. } => {
                ctx.send_response(rpc, Bytes::from(vec![7u8; 600_000]))
                    .unwrap();
            }
            Event::Response { message, .. } => self.held.push(message),
            Event::Failed { id, error } => self.failed.push((ctx.now(), id, error)),
            ev => panic!("not asked for: {ev:?}"),
        }
    }
}

#[test]
fn a_response_that_cannot_get_pool_space_fails_after_the_rpc_timeout() {
    // The client's pool holds 1 MiB and its application keeps the first
    // 600 KB response: the second cannot be received. It waits (BUSY keeps
    // the server from giving up) for the RPC timeout, then fails with
    // PoolExhausted; once the application lets go, calls work again.
    let config = Config::default()
        .with_pool_bytes(1 << 20)
        .with_rpc_timeout_ns(20 * MS);
    let mut net = EngineNet::uniform(star(2), config, |_| PoolHog::default()).unwrap();
    net.send_request(0, 1, pattern(100, 1)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(0).held.len() == 1));
    let start = net.now();
    let second = net.send_request(0, 1, pattern(100, 2)).unwrap();
    assert!(net.run_until_cond(start + 100 * MS, |n| !n.app(0).failed.is_empty()));
    let (at, id, error) = net.app(0).failed[0];
    assert_eq!((id, error), (second, RpcError::PoolExhausted));
    let waited = at - start;
    assert!(
        (20 * MS..=22 * MS).contains(&waited),
        "failed after {waited} ns"
    );
    assert_eq!(net.endpoint(0).metrics().pool_timeouts, 1);
    assert_eq!(net.endpoint(0).stats().pool_waiters, 0);
    net.app_mut(0).held.clear();
    net.send_request(0, 1, pattern(100, 3)).unwrap();
    let now = net.now();
    assert!(net.run_until_cond(now + 20 * MS, |n| n.app(0).held.len() == 1));
    assert_eq!(net.app(0).failed.len(), 1);
}

#[test]
fn a_departed_client_is_asked_for_acks_at_doubling_intervals() {
    let cfg = Config::default()
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(64 * MS);
    let mut net = net_with(2, cfg, Reply::Echo);
    net.send_request(0, 1, pattern(100, 1)).unwrap();
    assert!(net.run_until_cond(10 * MS, |n| n.app(0).responses() == 1));
    // The client goes away before acknowledging the response.
    net.crash(0, None);
    let need_acks = |n: &EngineNet<TestApp>| {
        n.endpoint(1)
            .metrics()
            .sent(homa_proto::wire::PacketType::NeedAck)
    };
    assert!(
        net.run_until_cond(net.now() + 200 * MS, |n| n.endpoint(1).stats().server_rpcs
            == 0)
    );
    // Silences of 0.5, 1, 2 ... 32 ms before the 64 ms timeout: 7 asks (one
    // per resend interval would be ~128).
    let n = need_acks(&net);
    assert!((5..=9).contains(&n), "{n} NEED_ACKs");
    assert_eq!(net.endpoint(1).metrics().timeouts, 1);
}
