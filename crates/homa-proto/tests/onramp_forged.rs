//! On-Ramp against forged one-way delay reports (`docs/onramp.md` §3): a
//! peer (or anyone on the path) that rewrites `send_time` in every packet it
//! sends, so that each reports a one-way delay far above the minimum, holds
//! our messages to it at most `onramp_max_hold_ns` at a time and never more
//! than about half of the time; everything still arrives intact.

use bytes::Bytes;
use homa_proto::{Config, Endpoint, Event, Time};
use std::collections::BTreeMap;
use std::net::SocketAddr;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
/// Offset of `send_time` in the common header (`docs/wire-format.md`).
const SEND_TIME: std::ops::Range<usize> = 16..24;

/// Client 0 sends `len` bytes to server 1 (which echoes them) over a 2 µs
/// link; from `forge_from` on, every packet from the server has its
/// `send_time` pushed `forge_by` ns later (checksums are off, so the change
/// goes unnoticed). Returns how long the RPC took, the longest hold seen
/// (sampled every µs) and the number of holds.
fn run(onramp: bool, len: usize, forge_by: u64) -> (Time, Time, u32) {
    let max_hold = 50 * US;
    let cfg = Config::default()
        .with_checksum(false)
        .with_onramp(onramp)
        .with_onramp_threshold_ns(10 * US)
        .with_onramp_max_hold_ns(max_hold);
    let addrs: [SocketAddr; 2] = [
        "10.0.0.1:4000".parse().unwrap(),
        "10.0.0.2:4000".parse().unwrap(),
    ];
    let mut eps = [
        Endpoint::new(cfg.clone().with_rpc_id_seed(1), US).unwrap(),
        Endpoint::new(cfg.with_rpc_id_seed(2), US).unwrap(),
    ];
    let mut flight: BTreeMap<(Time, u64), (usize, Vec<u8>)> = BTreeMap::new();
    let (mut now, mut seq) = (US, 0u64);
    let data = Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let mut warm = true;
    let mut id = eps[0]
        .send_request(now, addrs[1], Bytes::from_static(b"hi"))
        .unwrap();
    let mut started = now;
    let (mut longest, mut holds, mut held_since) = (0, 0, None);
    let mut buf = Vec::new();
    loop {
        for i in 0..2 {
            while let Some(ev) = eps[i].poll_event() {
                match ev {
                    Event::Request { rpc, message } => {
                        let m = Bytes::from(message.to_vec());
                        eps[i].send_response(now, rpc, m).unwrap();
                    }
                    Event::Response { id: got, message } if got == id => {
                        if !warm {
                            assert_eq!(message.to_vec(), data.to_vec());
                            return (now - started, longest, holds);
                        }
                        // Warmed up: the minimum is known; forge from now on.
                        warm = false;
                        started = now;
                        id = eps[0].send_request(now, addrs[1], data.clone()).unwrap();
                    }
                    ev => panic!("unexpected {ev:?}"),
                }
            }
            while let Some(t) = eps[i].poll_transmit(now, &mut buf) {
                let mut pkt = buf[..t.len].to_vec();
                if i == 1 && !warm {
                    let s = u64::from_le_bytes(pkt[SEND_TIME].try_into().unwrap());
                    pkt[SEND_TIME].copy_from_slice(&(s + forge_by).to_le_bytes());
                }
                seq += 1;
                flight.insert((now + 2 * US, seq), (1 - i, pkt));
            }
        }
        let held = eps[0].peer_onramp(addrs[1]).is_some_and(|s| s.held);
        match (held, held_since) {
            (true, None) => {
                held_since = Some(now);
                holds += 1;
            }
            (false, Some(since)) => {
                longest = longest.max(now - since);
                held_since = None;
            }
            _ => {}
        }
        let next_packet = flight.keys().next().map(|k| k.0);
        let next_timer = eps.iter().filter_map(|e| e.poll_timeout()).min();
        // Step at most 1 µs, to see holds begin and end.
        let next = [next_packet, next_timer, Some(now + US)]
            .into_iter()
            .flatten()
            .min()
            .unwrap()
            .max(now);
        assert!(next < started + 100 * MS, "stalled");
        now = next;
        if next_packet == Some(now) {
            let (_, (dest, pkt)) = flight.pop_first().unwrap();
            eps[dest].handle_datagram(now, addrs[1 - dest], &pkt);
        }
        for e in &mut eps {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
        }
    }
}

#[test]
fn forged_reports_hold_at_most_the_bound_and_half_the_time() {
    let (unforged, _, none) = run(true, 300_000, 0);
    assert_eq!(none, 0, "no hold without a report above T");
    let (off, _, _) = run(false, 300_000, 10 * MS);
    let (on, longest, holds) = run(true, 300_000, 10 * MS);
    assert!(holds >= 2, "{holds} holds");
    assert!(longest <= 50 * US + US, "held {longest} ns at once");
    // Off, the forgery changes nothing; on, the message takes at most twice
    // as long (held at most half of the time) plus one hold.
    assert_eq!(off, unforged);
    assert!(
        on <= 2 * off + 50 * US,
        "took {on} ns, {off} without On-Ramp"
    );
}
