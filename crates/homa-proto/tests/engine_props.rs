//! Hostile and arbitrary input fed straight to an engine: it never panics, and
//! every table stays within its configured limit.

use bytes::Bytes;
use homa_proto::wire::{
    self, Body, CommonHeader, Cutoffs, DataHeader, Grant, Resend, ResetReason, StreamCredit,
    StreamDataHeader,
};
use homa_proto::{Config, DropReason, Endpoint, Event, StreamId, StreamRead};
use proptest::prelude::*;
use std::net::SocketAddr;

fn addr(i: u32) -> SocketAddr {
    SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 4000))
}

fn small_limits() -> Config {
    Config::default()
        .with_max_peers(4)
        .with_max_server_rpcs_per_peer(3)
        .with_max_server_rpcs(8)
        .with_max_client_rpcs(16)
        .with_max_message_length(100_000)
        .with_pool_bytes(256 * 1024)
        .with_checksum(false)
        .with_resend_interval_ns(10_000)
        .with_rpc_timeout_ns(200_000)
        .with_max_streams(8)
        .with_stream_window_bytes(64 * 1024)
}

fn check_limits(ep: &Endpoint) {
    let c = ep.config();
    let s = ep.stats();
    assert!(s.peers <= c.max_peers, "{s:?}");
    assert!(s.server_rpcs <= c.max_server_rpcs, "{s:?}");
    assert!(s.client_rpcs <= c.max_client_rpcs, "{s:?}");
    assert!(
        s.incoming_bytes <= ep.config().effective_max_incoming() + 100_000,
        "{s:?}"
    );
    // Forged streams: at most the limit, each holding at most two windows
    // (unread in order, beyond a gap) of what peers sent, plus what we wrote.
    assert!(s.streams <= c.max_streams, "{s:?}");
    let per = 2 * c.stream_window_bytes as u64 + c.max_packet_size as u64;
    assert!(
        s.stream_bytes_held <= per * s.streams as u64 + 200_000,
        "{s:?}"
    );
}

/// A structurally valid packet with arbitrary field values.
#[derive(Debug, Clone)]
enum Pkt {
    Data {
        id: u64,
        from_client: bool,
        len: u32,
        offset: u32,
        size: u16,
        unsched: u32,
        ack: u64,
    },
    Grant(u64, bool, u32, u8),
    Resend(u64, bool, u32, u32, u8),
    Simple(u64, bool, u8),
    Cutoffs(u64, [u32; 8], u16),
    Ack(u64, Vec<u64>),
    StreamData {
        id: u64,
        from_client: bool,
        offset: u64,
        size: u16,
        ends: Vec<u16>,
        fin: bool,
        rev_credit: u64,
        rev_received: u64,
    },
    StreamCredit(u64, bool, u64, u64, u64, u8),
    StreamReset(u64, bool, u8),
    Garbage(Vec<u8>),
}

fn pkt() -> impl Strategy<Value = Pkt> {
    let id = 1u64..12;
    prop_oneof![
        4 => (id.clone(), any::<bool>(), 0u32..120_000, 0u32..120_000, 1u16..1500, 0u32..120_000, 0u64..12)
            .prop_map(|(id, from_client, len, offset, size, unsched, ack)| Pkt::Data {
                id, from_client, len, offset, size, unsched, ack
            }),
        1 => (id.clone(), any::<bool>(), any::<u32>(), 0u8..8).prop_map(|(a, b, c, d)| Pkt::Grant(a, b, c, d)),
        1 => (id.clone(), any::<bool>(), any::<u32>(), any::<u32>(), 0u8..8)
            .prop_map(|(a, b, c, d, e)| Pkt::Resend(a, b, c, d, e)),
        1 => (id.clone(), any::<bool>(), 0u8..3).prop_map(|(a, b, c)| Pkt::Simple(a, b, c)),
        1 => (id.clone(), any::<[u32; 8]>(), any::<u16>()).prop_map(|(a, b, c)| Pkt::Cutoffs(a, b, c)),
        1 => (id.clone(), proptest::collection::vec(0u64..12, 0..5)).prop_map(|(a, b)| Pkt::Ack(a, b)),
        1 => proptest::collection::vec(any::<u8>(), 0..80).prop_map(Pkt::Garbage),
        3 => (
            (id.clone(), any::<bool>(), prop_oneof![Just(0u64), 0u64..200_000, 0u64..(1 << 61)], 0u16..1500),
            (proptest::collection::vec(1u16..1500, 0..6), any::<bool>(), 0u64..400_000, 0u64..400_000),
        )
            .prop_map(|((id, from_client, offset, size), (ends, fin, rev_credit, rev_received))| {
                Pkt::StreamData { id, from_client, offset, size, ends, fin, rev_credit, rev_received }
            }),
        1 => (id.clone(), any::<bool>(), 0u64..400_000, 0u64..400_000, 0u64..10_000, 0u8..4)
            .prop_map(|(a, b, c, d, e, f)| Pkt::StreamCredit(a, b, c, d, e, f)),
        1 => (id.clone(), any::<bool>(), 1u8..=5).prop_map(|(a, b, c)| Pkt::StreamReset(a, b, c)),
    ]
}

fn encode(p: &Pkt, now: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let common = |id: u64, from_client: bool| CommonHeader {
        from_client,
        retransmit: false,
        rpc_id: id,
        send_time: now + 1,
        echo_time: now / 2,
    };
    let payload = vec![0xA5u8; 1500];
    match p {
        Pkt::Data {
            id,
            from_client,
            len,
            offset,
            size,
            unsched,
            ack,
        } => {
            let len = *len;
            let offset = (*offset).min(len.saturating_sub(1));
            let size = (*size as u32)
                .min(len - offset.min(len))
                .max(if len == 0 { 0 } else { 1 });
            let header = DataHeader {
                message_length: len,
                offset: if len == 0 { 0 } else { offset },
                unsched_bytes: (*unsched).min(len),
                cutoff_version: 1,
                ack: *ack,
            };
            wire::encode(
                &mut out,
                &common(*id, *from_client),
                &Body::Data {
                    header,
                    payload: &payload[..size as usize],
                },
                false,
            );
        }
        Pkt::Grant(id, fc, offset, priority) => wire::encode(
            &mut out,
            &common(*id, *fc),
            &Body::Grant(Grant {
                offset: *offset,
                priority: *priority,
            }),
            false,
        ),
        Pkt::Resend(id, fc, offset, length, priority) => wire::encode(
            &mut out,
            &common(*id, *fc),
            &Body::Resend(Resend {
                offset: *offset,
                length: *length,
                priority: *priority,
            }),
            false,
        ),
        Pkt::Simple(id, fc, kind) => {
            let body = match kind {
                0 => Body::Busy,
                1 => Body::RpcUnknown,
                _ => Body::NeedAck,
            };
            wire::encode(&mut out, &common(*id, *fc), &body, false)
        }
        Pkt::Cutoffs(id, cutoffs, version) => wire::encode(
            &mut out,
            &common(*id, false),
            &Body::Cutoffs(Cutoffs {
                version: *version,
                cutoffs: *cutoffs,
            }),
            false,
        ),
        Pkt::Ack(id, ids) => {
            let ids: Vec<u64> = ids.iter().map(|i| i + 1).collect();
            wire::encode(&mut out, &common(*id, true), &Body::Ack(&ids), false)
        }
        Pkt::StreamData {
            id,
            from_client,
            offset,
            size,
            ends,
            fin,
            rev_credit,
            rev_received,
        } => {
            let size = *size as usize;
            let mut e: Vec<u32> = ends
                .iter()
                .map(|&x| x as u32)
                .filter(|&x| x as usize <= size)
                .collect();
            e.sort_unstable();
            e.dedup();
            wire::encode(
                &mut out,
                &common(*id, *from_client),
                &Body::StreamData {
                    header: StreamDataHeader {
                        offset: *offset,
                        rev_credit: *rev_credit,
                        rev_received: *rev_received,
                        fin: *fin || size == 0,
                    },
                    ends: &e,
                    payload: &payload[..size],
                },
                false,
            )
        }
        Pkt::StreamCredit(id, fc, credit, received, gap, flags) => wire::encode(
            &mut out,
            &common(*id, *fc),
            &Body::StreamCredit(StreamCredit {
                credit: *credit,
                received: *received,
                resend_end: if *gap == 0 { 0 } else { received + gap },
                probe: flags & 1 != 0,
                fin_received: flags & 2 != 0,
            }),
            false,
        ),
        Pkt::StreamReset(id, fc, reason) => {
            let reason = match reason {
                1 => ResetReason::Cancelled,
                2 => ResetReason::Unknown,
                3 => ResetReason::Refused,
                4 => ResetReason::Shutdown,
                _ => ResetReason::Stuck,
            };
            wire::encode(
                &mut out,
                &common(*id, *fc),
                &Body::StreamReset(reason),
                false,
            )
        }
        Pkt::Garbage(bytes) => out.extend_from_slice(bytes),
    }
    out
}

/// Reads what a stream has; closes it when it ended or failed (streams
/// with even ids also write back what they read, while there is room).
fn serve_stream(ep: &mut Endpoint, now: u64, sid: StreamId) {
    loop {
        match ep.stream_recv(now, sid) {
            Ok(StreamRead::Data { bytes, .. }) => {
                if sid.id.is_multiple_of(2) {
                    let _ = ep.stream_send(now, sid, bytes);
                }
            }
            Ok(StreamRead::Pending) => return,
            Ok(StreamRead::End) | Err(_) => {
                ep.stream_close(now, sid);
                return;
            }
        }
    }
}

/// Feeds packets, answers requests, and drains the engine after each step.
/// With `gro`, a step's datagram is appended to the previous ones from the
/// same source and the batch goes through `handle_datagrams` (segment = the
/// first datagram's length) every few steps, as a GRO receive would hand it
/// over (arbitrary lengths make the cut fall anywhere, which a forger could
/// not do but the engine must survive).
fn drive(ep: &mut Endpoint, steps: &[(u8, Pkt, u32)], start_client_rpcs: bool, gro: bool) {
    let mut now = 0u64;
    let mut buf = Vec::new();
    if start_client_rpcs {
        for i in 0..4 {
            let _ = ep.send_request(now, addr(i), Bytes::from(vec![7u8; 3000 * i as usize + 1]));
        }
    }
    let mut batch: Vec<u8> = Vec::new();
    let mut batch_seg = 0;
    let mut streams: Vec<StreamId> = Vec::new();
    for (i, (src, p, dt)) in steps.iter().enumerate() {
        now += *dt as u64;
        let datagram = encode(p, now);
        let from = addr(*src as u32 % 6);
        if gro {
            if batch.is_empty() {
                batch_seg = datagram.len();
            }
            batch.extend_from_slice(&datagram);
            let next_same = steps.get(i + 1).is_some_and(|n| n.0 % 6 == *src % 6);
            if next_same && batch.len() < 8 * batch_seg.max(1) {
                continue;
            }
            ep.handle_datagrams(now, from, &batch, batch_seg);
            batch.clear();
        } else {
            ep.handle_datagram(now, from, &datagram);
        }
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
        }
        let mut sent = 0;
        while ep.poll_transmit(now, &mut buf).is_some() {
            sent += 1;
            assert!(buf.len() <= ep.config().max_packet_size);
            assert!(sent < 100_000, "transmit loop does not end");
        }
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::Request { rpc, message } => {
                    let _ = ep.send_response(now, rpc, Bytes::from(message.to_vec()));
                }
                Event::StreamOpened { stream } | Event::StreamReadable { stream } => {
                    streams.push(stream);
                    serve_stream(ep, now, stream)
                }
                _ => {}
            }
        }
        check_limits(ep);
    }
    // Time passes: everything must eventually be timed out or finished.
    for _ in 0..200 {
        now += 50_000;
        ep.handle_timeout(now);
        while ep.poll_transmit(now, &mut buf).is_some() {}
        while let Some(ev) = ep.poll_event() {
            if let Event::StreamReadable { stream } | Event::StreamOpened { stream } = ev {
                streams.push(stream);
                serve_stream(ep, now, stream);
            }
        }
    }
    // Streams still open (silent forgers time out; the application closes
    // them when it hears) are closed; then nothing is left.
    for sid in streams {
        ep.stream_close(now, sid);
    }
    for _ in 0..100 {
        now += 50_000;
        ep.handle_timeout(now);
        while ep.poll_transmit(now, &mut buf).is_some() {}
        while ep.poll_event().is_some() {}
    }
    let s = ep.stats();
    assert_eq!((s.client_rpcs, s.server_rpcs), (0, 0), "{s:?}");
    assert!(s.pool_empty, "{s:?}");
    assert_eq!((s.streams, s.stream_bytes_held), (0, 0), "{s:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_packet_sequences_never_panic_and_stay_bounded(
        steps in proptest::collection::vec((any::<u8>(), pkt(), 0u32..20_000), 1..120),
        clients in any::<bool>(),
        gro in any::<bool>(),
    ) {
        let mut ep = Endpoint::new(small_limits(), 0).unwrap();
        drive(&mut ep, &steps, clients, gro);
    }
}

#[test]
fn forged_rpcs_and_peers_are_capped() {
    let mut ep = Endpoint::new(small_limits(), 0).unwrap();
    let header = |len| DataHeader {
        message_length: len,
        offset: 0,
        unsched_bytes: len,
        cutoff_version: 1,
        ack: 0,
    };
    let mut out = Vec::new();
    for peer in 0..100u32 {
        for id in 1..50u64 {
            out.clear();
            let common = CommonHeader {
                from_client: true,
                retransmit: false,
                rpc_id: id,
                send_time: 1,
                echo_time: 0,
            };
            // Two packets of a 3000-byte request: never complete.
            wire::encode(
                &mut out,
                &common,
                &Body::Data {
                    header: header(3000),
                    payload: &[1u8; 1000],
                },
                false,
            );
            ep.handle_datagram(1, addr(peer), &out);
        }
    }
    let s = ep.stats();
    assert!(s.peers <= 4 && s.server_rpcs <= 8, "{s:?}");
    let m = ep.metrics();
    assert!(m.drops(DropReason::TooManyRpcs) + m.drops(DropReason::TooManyPeers) > 4000);
    // A message longer than the maximum is refused outright.
    out.clear();
    let common = CommonHeader {
        from_client: true,
        retransmit: false,
        rpc_id: 99,
        send_time: 1,
        echo_time: 0,
    };
    wire::encode(
        &mut out,
        &common,
        &Body::Data {
            header: header(100_001),
            payload: &[1u8; 10],
        },
        false,
    );
    ep.handle_datagram(2, addr(0), &out);
    assert_eq!(ep.metrics().drops(DropReason::MessageTooLong), 1);
    // Idle state times out and the tables empty.
    for t in 1..100u64 {
        ep.handle_timeout(t * 100_000);
        let mut buf = Vec::new();
        while ep.poll_transmit(t * 100_000, &mut buf).is_some() {}
    }
    let s = ep.stats();
    assert_eq!(s.server_rpcs, 0, "{s:?}");
}

#[test]
fn garbage_with_checksums_on_is_counted_and_dropped() {
    let mut ep = Endpoint::new(Config::default(), 0).unwrap();
    let mut x = 12345u64;
    for len in 0..2000usize {
        let data: Vec<u8> = (0..len % 200)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        ep.handle_datagram(len as u64, addr(1), &data);
    }
    let m = ep.metrics();
    assert_eq!(m.total_drops(), 2000);
    assert_eq!(ep.stats().peers, 0);
}

/// A one-packet request of 100 bytes, RPC `id`, as a client would send it.
fn request_datagram(id: u64) -> Vec<u8> {
    request_datagram_with(id, false)
}

/// [`request_datagram`], with a checksum if `checksum`.
fn request_datagram_with(id: u64, checksum: bool) -> Vec<u8> {
    one_packet_message(id, true, &[5u8; 100], checksum)
}

/// The whole of a one-packet message of RPC `id` (a request if
/// `from_client`, else a response) as one DATA datagram.
fn one_packet_message(id: u64, from_client: bool, payload: &[u8], checksum: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let common = CommonHeader {
        from_client,
        retransmit: false,
        rpc_id: id,
        send_time: 1,
        echo_time: 0,
    };
    let len = payload.len() as u32;
    let header = DataHeader {
        message_length: len,
        offset: 0,
        unsched_bytes: len,
        cutoff_version: 1,
        ack: 0,
    };
    wire::encode(&mut out, &common, &Body::Data { header, payload }, checksum);
    out
}

/// The receive rule: a checksum that is present is always verified, whatever
/// the receiver's own `checksum` setting; an absent one is accepted unless
/// `require_checksum` is set.
#[test]
fn checksums_are_verified_when_present_and_required_only_on_request() {
    let delivered = |config: Config, datagram: &[u8]| {
        let mut ep = Endpoint::new(config, 0).unwrap();
        ep.handle_datagram(10, addr(1), datagram);
        let got = matches!(ep.poll_event(), Some(Event::Request { .. }));
        (got, ep.metrics().drops(DropReason::BadChecksum))
    };
    let on = Config::default();
    assert!(on.checksum && !on.require_checksum);
    let off = Config::default().with_checksum(false);
    let required = Config::default().with_require_checksum(true);
    let plain = request_datagram_with(7, false);
    let summed = request_datagram_with(7, true);
    // A checksum-less packet (a peer with checksums off) is heard by default.
    assert_eq!(delivered(on.clone(), &plain), (true, 0));
    assert_eq!(delivered(off.clone(), &plain), (true, 0));
    assert_eq!(delivered(required.clone(), &plain), (false, 1));
    for config in [&on, &off, &required] {
        assert_eq!(delivered(config.clone(), &summed), (true, 0));
    }
    // A corrupted payload byte: the packet still decodes, only the checksum
    // catches it, even at a receiver that computes none itself.
    let mut bad = summed.clone();
    *bad.last_mut().unwrap() ^= 0x10;
    assert!(wire::decode(&bad).is_ok());
    for config in [on, off, required] {
        assert_eq!(delivered(config, &bad), (false, 1));
    }
}

/// The engine remembers the peer of the latest datagram to skip an address
/// lookup; once that peer is evicted and its slot taken by another address,
/// a datagram from the first address must not be credited to the second.
#[test]
fn a_remembered_peer_slot_reused_by_another_address_is_not_trusted() {
    let config = Config::default()
        .with_max_peers(1)
        .with_checksum(false)
        .with_tombstone_ns(0);
    let mut ep = Endpoint::new(config, 0).unwrap();
    let (a, b) = (addr(1), addr(2));
    // Two requests from `a`: the second finds `a` by the remembered slot.
    for (t, id) in [(10, 7), (20, 9)] {
        ep.handle_datagram(t, a, &request_datagram(id));
        match ep.poll_event() {
            Some(Event::Request { rpc, .. }) => {
                assert_eq!(rpc.peer, a);
                ep.abandon(rpc);
            }
            other => panic!("{other:?}"),
        }
    }
    // `a` is idle: a request to `b` evicts it and takes its slot.
    let id_b = ep.send_request(30, b, Bytes::from_static(b"x")).unwrap();
    assert_eq!(ep.stats().peers, 1);
    // A request from `a` now: refused for want of a peer slot (the only one
    // holds `b`'s live RPC), never run as if `b` had sent it.
    ep.handle_datagram(40, a, &request_datagram(11));
    assert!(ep.poll_event().is_none());
    // `b`'s RPC is untouched: its response still completes it.
    ep.handle_datagram(50, b, &one_packet_message(id_b.0, false, b"y", false));
    match ep.poll_event() {
        Some(Event::Response { id, .. }) => assert_eq!(id, id_b),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tombstones_outlive_pressure_on_the_peer_table() {
    let ms = 1_000_000;
    let config = Config::default()
        .with_max_peers(2)
        .with_checksum(false)
        .with_tombstone_ns(ms);
    let mut ep = Endpoint::new(config, 0).unwrap();
    let (a, b, c, d) = (addr(1), addr(2), addr(3), addr(4));
    // Peer `a`'s request runs and is abandoned: a tombstone.
    ep.handle_datagram(10, a, &request_datagram(7));
    match ep.poll_event() {
        Some(Event::Request { rpc, .. }) => ep.abandon(rpc),
        other => panic!("{other:?}"),
    }
    assert_eq!((ep.stats().tombstones, ep.stats().peers), (1, 1));
    // Fill the table with `b`, then make `b` idle: `c` evicts `b`, not `a`.
    let id_b = ep.send_request(20, b, Bytes::from_static(b"x")).unwrap();
    ep.cancel(id_b);
    let _id_c = ep.send_request(30, c, Bytes::from_static(b"x")).unwrap();
    assert_eq!(ep.stats().peers, 2);
    // `a` (tombstone) and `c` (live RPC) are both pinned: no room for `d`.
    assert_eq!(
        ep.send_request(40, d, Bytes::from_static(b"x")),
        Err(homa_proto::SendError::TooManyPeers(2))
    );
    // A duplicate of `a`'s request is still refused, not run again.
    ep.handle_datagram(50, a, &request_datagram(7));
    assert!(ep.poll_event().is_none());
    assert_eq!(ep.metrics().drops(DropReason::Tombstone), 1);
    // Once the tombstone expires, `a` is an ordinary idle peer again.
    ep.handle_timeout(60 + 2 * ms);
    assert_eq!(ep.stats().tombstones, 0);
    assert!(ep
        .send_request(70 + 2 * ms, d, Bytes::from_static(b"x"))
        .is_ok());
    assert_eq!(ep.stats().peers, 2);
}

/// Tombstones expire as new ones are made, a batch at a time, rather than
/// all at once in a timer tick; none ever expires early; a tick that finds a
/// backlog works through it in bounded steps.
#[test]
fn tombstones_expire_incrementally_and_never_early() {
    let (us, ms) = (1_000, 1_000_000);
    let config = Config::default().with_checksum(false).with_tombstone_ns(ms);
    let mut ep = Endpoint::new(config, 0).unwrap();
    let a = addr(1);
    let n = 3_000u64;
    for id in 1..=n {
        // One finished RPC per µs, and no timer calls at all.
        ep.handle_datagram(id * us, a, &request_datagram(id));
        match ep.poll_event() {
            Some(Event::Request { rpc, .. }) => ep.abandon(rpc),
            other => panic!("{other:?}"),
        }
    }
    // Those of the last ms are alive; older ones have gone with at most a
    // batch of lag.
    let live = ep.stats().tombstones as u64;
    assert!((1_000..=1_000 + 16).contains(&live), "{live}");
    // The youngest and the oldest still within tombstone_ns are refused.
    for id in [n, n - 990] {
        ep.handle_datagram(n * us + 1, a, &request_datagram(id));
        assert!(ep.poll_event().is_none(), "id {id} ran again");
    }
    assert_eq!(ep.metrics().drops(DropReason::Tombstone), 2);
    // Long after: a tick expires at most a few hundred, and later ticks the rest.
    let mut now = n * us + 10 * ms;
    let mut ticks = 0;
    while ep.stats().tombstones > 0 {
        let before = ep.stats().tombstones;
        ep.handle_timeout(now);
        assert!(
            before - ep.stats().tombstones <= 256,
            "one tick did {before}"
        );
        now = ep
            .poll_timeout()
            .expect("tombstones left, so a deadline")
            .max(now);
        ticks += 1;
        assert!(ticks < 100);
    }
    assert!(
        ticks >= 3,
        "a backlog of ~1000 takes several ticks, not one"
    );
    // And an expired id is an ordinary new request again.
    ep.handle_datagram(now, a, &request_datagram(n));
    assert!(matches!(ep.poll_event(), Some(Event::Request { .. })));
}

/// Client RPC ids carry the slab key in their low bits: still unique over
/// time although keys are reused, never 0, and a response whose id differs
/// from a live one anywhere (or comes from another peer) matches nothing.
#[test]
fn client_ids_are_unique_and_only_exact_ids_match() {
    let config = Config::default().with_checksum(false);
    let mut ep = Endpoint::new(config, 0).unwrap();
    let server = addr(9);
    let mut seen = std::collections::HashSet::new();
    for i in 0..5_000u64 {
        let id = ep
            .send_request(i, server, Bytes::from_static(b"q"))
            .unwrap();
        assert!(id.0 != 0 && seen.insert(id.0), "id {:#x} repeated", id.0);
        // Keep a few alive so that several keys are in use.
        if i % 7 != 0 {
            ep.cancel(id);
        }
    }
    let live = ep
        .send_request(9_000, server, Bytes::from_static(b"q"))
        .unwrap();
    let response = |id: u64| one_packet_message(id, false, b"abc", false);
    let unknown = |ep: &Endpoint| ep.metrics().drops(DropReason::UnknownRpc);
    for bit in 0..64 {
        ep.handle_datagram(10_000, server, &response(live.0 ^ 1 << bit));
        assert_eq!(unknown(&ep), bit + 1, "id with bit {bit} flipped matched");
    }
    ep.handle_datagram(10_000, addr(10), &response(live.0));
    assert_eq!(unknown(&ep), 65, "a response from another peer matched");
    while ep.poll_event().is_some() {}
    ep.handle_datagram(10_000, server, &response(live.0));
    match ep.poll_event() {
        Some(Event::Response { id, message }) => {
            assert_eq!((id, message.to_vec()), (live, b"abc".to_vec()))
        }
        other => panic!("{other:?}"),
    }
}
