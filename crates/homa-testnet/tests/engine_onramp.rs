//! On-Ramp (issue #22, `docs/onramp.md`) on the deterministic test network:
//! a destination whose reported queueing delay exceeds T is held for the
//! excess and then released, its messages intact and in order; other
//! destinations keep flowing; reports far above any real queue hold a
//! destination at most `onramp_max_hold_ns` at a time; with no hold, On-Ramp
//! changes nothing.

mod common;

use common::{rpc, MS};
use homa_proto::{Config, GrantPolicy, PeerOnRamp, RpcId};
use homa_testnet::{pattern, EngineNet, Fabric, HostClock, HostId, Reply, TestApp};

const US: u64 = 1_000;

/// `n` hosts on one 25 Gbps switch (1 µs links, 250 ns switching).
fn star(n: usize, cfg: Config) -> EngineNet<TestApp> {
    let fabric = Fabric::star(n, 25_000_000_000, US, 250).with_seed(3);
    EngineNet::uniform(fabric, cfg, |_| TestApp::new(Reply::Echo)).unwrap()
}

/// On-Ramp on, on a network with one priority level (one that ignores
/// DSCP), where a hold keeps every byte of its destination's messages.
fn onramp(threshold: u64, max_hold: u64) -> Config {
    Config::default()
        .with_priority_levels(1)
        .with_unsched_priorities(1)
        .with_onramp(true)
        .with_onramp_threshold_ns(threshold)
        .with_onramp_max_hold_ns(max_hold)
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(100 * MS)
}

fn state(net: &EngineNet<TestApp>, h: HostId, peer: HostId) -> PeerOnRamp {
    net.endpoint(h)
        .peer_onramp(net.addr(peer))
        .expect("a known peer")
}

fn done(net: &EngineNet<TestApp>, c: HostId, id: RpcId) -> u64 {
    net.app(c).finished_at(id).expect("finished")
}

/// What [`incast_on_host_1`] saw: host 0's hold of host 1 (length, the
/// reported queueing delay, the end on the network's clock) and when the
/// three messages finished.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    hold: u64,
    queueing: u64,
    held_until: u64,
    finished: [u64; 3],
}

/// Host 1's receive path gets 60 µs slower (the reported one-way delay
/// rises by 60 µs; T is 20 µs): host 0 holds host 1 for the excess, 40 µs.
/// Messages to host 1 started meanwhile leave only after the hold, arrive
/// intact and finish in the order they were sent; host 2 is not held.
/// Host `h`'s endpoint reads `clocks[h]`.
fn incast_on_host_1(clocks: [HostClock; 3]) -> Seen {
    let mut net = star(3, onramp(20 * US, MS));
    for (h, &c) in clocks.iter().enumerate() {
        net.set_clock(h, c);
    }
    for _ in 0..5 {
        rpc(&mut net, 0, 1, 100);
        rpc(&mut net, 0, 2, 100);
    }
    assert!(!state(&net, 0, 1).held);
    assert!(
        state(&net, 0, 1).queueing_ns < 2 * US,
        "{:?}",
        state(&net, 0, 1)
    );

    net.fabric_mut().set_host_rx_delay(1, 60 * US);
    rpc(&mut net, 0, 1, 100);
    let s = state(&net, 0, 1);
    assert!(s.held, "{s:?}");
    assert!(
        (58 * US..=62 * US).contains(&s.queueing_ns),
        "the report is the added delay: {s:?}"
    );
    assert_eq!(s.last_hold_ns, s.queueing_ns - 20 * US);
    // The queue is gone; what was held is still to be released.
    net.fabric_mut().set_host_rx_delay(1, 0);

    let start = net.now();
    // On the network's clock.
    let held_until = clocks[0].net_time(s.held_until);
    assert!(held_until > start);
    let a = net.send_request(0, 1, pattern(20_000, 7)).unwrap();
    let b = net.send_request(0, 1, pattern(20_000, 8)).unwrap();
    let other = net.send_request(0, 2, pattern(20_000, 9)).unwrap();
    let limit = net.now() + 10 * MS;
    assert!(net.run_until_cond(limit, |n| {
        [a, b].iter().all(|&id| n.app(0).finished_at(id).is_some())
            && n.app(0).finished_at(other).is_some()
    }));
    // Host 2 was never held: its message finished before host 1's hold
    // ended.
    assert!(!state(&net, 0, 2).held);
    assert!(done(&net, 0, other) < held_until, "host 2 waited");
    // Host 1's messages left after the hold, intact, in order.
    assert!(done(&net, 0, a) > held_until);
    assert!(done(&net, 0, a) <= done(&net, 0, b));
    assert_eq!(net.app(0).response(a).unwrap(), &pattern(20_000, 7)[..]);
    assert_eq!(net.app(0).response(b).unwrap(), &pattern(20_000, 8)[..]);
    assert!(!state(&net, 0, 1).held);
    assert_eq!(net.app(0).failures(), 0);
    Seen {
        hold: s.last_hold_ns,
        queueing: s.queueing_ns,
        held_until,
        finished: [a, b, other].map(|id| done(&net, 0, id)),
    }
}

#[test]
fn a_queueing_delay_above_t_holds_that_destination_for_the_excess() {
    incast_on_host_1([HostClock::default(); 3]);
}

/// Clocks 1 s apart, either way (the held host's ahead of the sender's or
/// behind it), give the same holds at the same times: the offset is in
/// every report and in the minimum alike.
#[test]
fn a_clock_offset_between_hosts_gives_the_same_decisions() {
    // Clocks start at 1 µs, not 0: a clock reading 0 sends `send_time` 1
    // (0 means "no timestamp" on the wire), which would move the first
    // report, and so the minimum, by 1 ns.
    let shared = incast_on_host_1([HostClock::offset(US); 3]);
    let s = 1_000_000_000;
    let offsets = |o: [u64; 3]| o.map(HostClock::offset);
    assert_eq!(incast_on_host_1(offsets([US, s, 3 * s])), shared);
    assert_eq!(incast_on_host_1(offsets([s, US, 7 * US])), shared);
}

/// Clocks whose rates differ by 100 ppm (50 ppm fast and slow), on top of
/// offsets of seconds: the same hold within the drift's error (the minimum
/// is at most a few ms older than the report, so it is off by well under
/// 1 µs), the same finish times within as much.
#[test]
fn drifting_clocks_give_the_same_decisions_within_the_drift() {
    let shared = incast_on_host_1([HostClock::offset(US); 3]);
    let clock = |offset, ppm: i64| HostClock {
        offset,
        drift_ppb: ppm * 1_000,
    };
    for clocks in [
        [clock(US, 50), clock(2_000_000_000, -50), clock(7, 50)],
        [clock(2_000_000_000, -50), clock(US, 50), clock(US, -50)],
    ] {
        let d = incast_on_host_1(clocks);
        // The rates do differ (offsets alone give identical runs, above).
        assert_ne!(d, shared);
        let near = |a: u64, b: u64| a.abs_diff(b) < US;
        assert!(near(d.hold, shared.hold), "{d:?} {shared:?}");
        assert!(near(d.queueing, shared.queueing), "{d:?} {shared:?}");
        assert!(near(d.held_until, shared.held_until), "{d:?} {shared:?}");
        for i in 0..3 {
            assert!(near(d.finished[i], shared.finished[i]), "{d:?} {shared:?}");
        }
    }
}

/// Reports of a one-way delay 5 ms above the minimum (as a forged or
/// broken peer could send; only `send_time − echo_time` matters) hold the
/// destination at most `onramp_max_hold_ns` (50 µs) at a time, and open for
/// `onramp_open_permille` of it after each hold (on one level, 750 ‰): a
/// 200 KB message still gets through, and no hold is longer than the
/// bound.
#[test]
fn reports_far_above_any_queue_hold_at_most_the_bound() {
    let max_hold = 50 * US;
    // One 200 KB message through a 5 ms delay, On-Ramp on or off.
    let transfer = |on: bool| {
        let mut net = star(2, onramp(10 * US, max_hold).with_onramp(on));
        for _ in 0..5 {
            rpc(&mut net, 0, 1, 100);
        }
        net.fabric_mut().set_host_rx_delay(1, 5 * MS);
        rpc(&mut net, 0, 1, 100);
        let s = state(&net, 0, 1);
        assert_eq!(s.held, on, "{s:?}");
        let t = net.now();
        let id = net.send_request(0, 1, pattern(200_000, 3)).unwrap();
        let mut longest = 0;
        let mut held_since = None;
        let limit = t + 200 * MS;
        while net.app(0).finished_at(id).is_none() {
            assert!(net.now() < limit, "stalled");
            net.run_for(US);
            let s = state(&net, 0, 1);
            match (s.held, held_since) {
                (true, None) => held_since = Some(net.now()),
                (false, Some(since)) => {
                    longest = longest.max(net.now() - since);
                    held_since = None;
                }
                _ => {}
            }
            assert!(s.last_hold_ns <= max_hold);
        }
        assert_eq!(net.app(0).response(id).unwrap(), &pattern(200_000, 3)[..]);
        (net.now() - t, longest)
    };
    let (off, _) = transfer(false);
    let (on, longest) = transfer(true);
    // Observed in 1 µs steps.
    assert!(
        longest > 0 && longest <= max_hold + US,
        "held {longest} ns at once"
    );
    // Held at most 1000 / (1000 + p) of the time: at most (1000 + p) / p
    // times as long (plus a hold).
    let p = onramp(10 * US, max_hold).effective_onramp_open_permille() as u64;
    assert_eq!(p, 750, "one level: the receiver holds its grants too");
    assert!(
        on <= off * (1000 + p) / p + max_hold,
        "took {on} ns, {off} without On-Ramp"
    );
}

/// With no report above T, On-Ramp changes no packet: the same traffic
/// gives the same run, bit for bit, as with On-Ramp off.
#[test]
fn without_a_hold_onramp_changes_nothing() {
    let run = |on: bool| {
        let cfg = Config::default()
            .with_onramp(on)
            .with_onramp_threshold_ns(MS)
            .with_resend_interval_ns(MS / 2)
            .with_rpc_timeout_ns(100 * MS);
        let mut net = star(3, cfg);
        net.enable_trace(true);
        for i in 0..10 {
            let a = net.send_request(0, 1, pattern(30_000, i)).unwrap();
            let b = net.send_request(2, 1, pattern(5_000, i)).unwrap();
            let limit = net.now() + 50 * MS;
            assert!(
                net.run_until_cond(limit, |n| n.app(0).finished_at(a).is_some()
                    && n.app(2).finished_at(b).is_some())
            );
        }
        assert!(!state(&net, 0, 1).held);
        net.digest()
    };
    assert_eq!(run(true), run(false));
}

/// With priority levels, a hold keeps only scheduled bytes: unscheduled
/// ones go above the scheduled packets whose queueing the reports measure.
/// A message to the held host that fits in its unscheduled bytes finishes
/// during the hold; a longer one sends its unscheduled bytes and the rest
/// after the hold.
#[test]
fn with_priorities_a_hold_keeps_only_scheduled_bytes() {
    let mut net = star(
        3,
        onramp(20 * US, MS)
            .with_priority_levels(8)
            .with_unsched_priorities(4),
    );
    for _ in 0..5 {
        rpc(&mut net, 0, 1, 100);
    }
    net.fabric_mut().set_host_rx_delay(1, 60 * US);
    rpc(&mut net, 0, 1, 100);
    let s = state(&net, 0, 1);
    assert!(s.held, "{s:?}");
    net.fabric_mut().set_host_rx_delay(1, 0);
    let held_until = s.held_until;
    let unsched = net.endpoint(0).config().effective_unsched_bytes() as usize;
    let small = net.send_request(0, 1, pattern(unsched / 2, 5)).unwrap();
    let large = net.send_request(0, 1, pattern(4 * unsched, 6)).unwrap();
    let limit = net.now() + 10 * MS;
    assert!(net.run_until_cond(limit, |n| {
        [small, large]
            .iter()
            .all(|&id| n.app(0).finished_at(id).is_some())
    }));
    assert!(done(&net, 0, small) < held_until, "the small one waited");
    assert!(done(&net, 0, large) > held_until);
    assert_eq!(
        net.app(0).response(large).unwrap(),
        &pattern(4 * unsched, 6)[..]
    );
    // The large message was parked when it reached its scheduled part.
    assert!(net.endpoint(0).metrics().onramp_parked >= 1);
}

/// One 200 KB transfer from host 0 to host 1, observed in 1 µs steps, with
/// host 1's receive path `rx_delay` slower from the start of the transfer
/// (after a warm-up that sets the one-way delays' minimum): its duration,
/// the longest time host 1's grants stayed held at once, and whether host
/// 1 sent a GRANT while they were held.
fn transfer_to_a_slow_receiver(cfg: Config, rx_delay: u64) -> (u64, u64, bool) {
    let mut net = star(2, cfg);
    for _ in 0..5 {
        rpc(&mut net, 0, 1, 100);
    }
    net.fabric_mut().set_host_rx_delay(1, rx_delay);
    let t = net.now();
    let id = net.send_request(0, 1, pattern(200_000, 3)).unwrap();
    let (mut longest, mut held_since, mut granted_while_held) = (0, None, false);
    let limit = t + 200 * MS;
    while net.app(0).finished_at(id).is_none() {
        assert!(net.now() < limit, "stalled");
        let grants = net.endpoint(1).metrics().grants_sent;
        net.run_for(US);
        let held = net.endpoint(1).onramp_grants_held_until().is_some();
        match (held, held_since) {
            (true, None) => held_since = Some(net.now()),
            (true, Some(_)) => granted_while_held |= net.endpoint(1).metrics().grants_sent > grants,
            (false, Some(since)) => {
                longest = longest.max(net.now() - since);
                held_since = None;
            }
            _ => {}
        }
    }
    assert_eq!(net.app(0).response(id).unwrap(), &pattern(200_000, 3)[..]);
    assert_eq!(net.app(0).failures(), 0);
    (net.now() - t, longest, granted_while_held)
}

/// A receiver whose arriving DATA shows its own downlink's queueing delay
/// above T (here its receive path is 60 µs slower; T is 20 µs) holds its
/// grants for the excess, 40 µs at a time, sends no GRANT meanwhile, and
/// grants again at the release: the message arrives intact. With
/// `onramp_hold_grants` off, on a network with several priority levels,
/// or granting every message, it never holds them.
#[test]
fn a_receiver_holds_its_grants_while_its_downlink_shows_a_queue() {
    let cfg = onramp(20 * US, MS);
    let (_, longest, granted_while_held) = transfer_to_a_slow_receiver(cfg.clone(), 60 * US);
    // Observed in 1 µs steps.
    assert!(
        (39 * US..=42 * US).contains(&longest),
        "held {longest} ns at once"
    );
    assert!(!granted_while_held);
    let (_, longest, _) =
        transfer_to_a_slow_receiver(cfg.clone().with_onramp_hold_grants(false), 60 * US);
    assert_eq!(longest, 0);
    // Several priority levels: the sender-side holds only.
    let levels = cfg
        .clone()
        .with_priority_levels(8)
        .with_unsched_priorities(4);
    let (_, longest, _) = transfer_to_a_slow_receiver(levels, 60 * US);
    assert_eq!(longest, 0);
    // Granting every message (BasicTransport): the paper's sender-side
    // holds only.
    let basic = cfg.with_grant_policy(GrantPolicy::EveryMessage {
        increment_bytes: 5 * 1_400,
    });
    let (_, longest, _) = transfer_to_a_slow_receiver(basic, 60 * US);
    assert_eq!(longest, 0);
}

/// One-way delays 5 ms above the minimum (as a sender with a forged or
/// broken `send_time` would show) hold the receiver's grants at most
/// `onramp_max_hold_ns` at a time, open 750 ‰ of it after each (one
/// level): the transfer takes at most 1750 / 750 times as long as with
/// On-Ramp's grant holds off, plus a hold.
#[test]
fn a_delay_far_above_any_queue_holds_grants_at_most_the_bound() {
    let max_hold = 50 * US;
    let cfg = onramp(10 * US, max_hold);
    let cfg_open_permille = cfg.effective_onramp_open_permille() as u64;
    let (off, _, _) =
        transfer_to_a_slow_receiver(cfg.clone().with_onramp_hold_grants(false), 5 * MS);
    let (on, longest, granted_while_held) = transfer_to_a_slow_receiver(cfg, 5 * MS);
    assert!(
        longest > 0 && longest <= max_hold + US,
        "held {longest} ns at once"
    );
    assert!(!granted_while_held);
    let p = cfg_open_permille;
    assert!(
        on <= off * (1000 + p) / p + max_hold,
        "took {on} ns, {off} without"
    );
}
