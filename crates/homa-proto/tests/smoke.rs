//! Smoke tests of the engine over a trivial in-process link (fixed latency,
//! optional deterministic loss). The full protocol test suite, with rates,
//! priority queues and seeded faults, lives in crates/homa-testnet.

use bytes::Bytes;
use homa_proto::driver::FastPath as _;
use homa_proto::{Config, Endpoint, Event, Outgoing, Time};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Decides, from a packet's sequence number and bytes, whether to drop it.
type DropRule = Box<dyn FnMut(u64, &[u8]) -> bool>;

struct Link {
    eps: Vec<Endpoint>,
    addrs: Vec<SocketAddr>,
    /// (arrival time, seq) -> (dest index, from, bytes)
    flight: BTreeMap<(Time, u64), (usize, SocketAddr, Vec<u8>)>,
    seq: u64,
    now: Time,
    latency: Time,
    /// Drop every packet whose sequence number satisfies this.
    drop: DropRule,
    /// Deliver packets that arrive together from one source as one GRO
    /// batch (`handle_datagrams`), as a UDP GRO receive would.
    gro: bool,
    /// GRO batches of more than one packet delivered.
    batches: u64,
}

impl Link {
    fn new(n: usize, config: Config) -> Link {
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|i| format!("10.0.0.{}:4000", i + 1).parse().unwrap())
            .collect();
        let eps = (0..n)
            .map(|i| Endpoint::new(config.clone().with_rpc_id_seed(i as u64 + 100), 0).unwrap())
            .collect();
        Link {
            eps,
            addrs,
            flight: BTreeMap::new(),
            seq: 0,
            now: 0,
            latency: 2_000,
            drop: Box::new(|_, _| false),
            gro: false,
            batches: 0,
        }
    }

    fn flush(&mut self, i: usize) {
        let mut buf = Vec::new();
        while let Some(t) = self.eps[i].poll_transmit(self.now, &mut buf) {
            let dest = self.addrs.iter().position(|a| *a == t.dest).unwrap();
            self.seq += 1;
            if (self.drop)(self.seq, &buf[..t.len]) {
                continue;
            }
            self.flight.insert(
                (self.now + self.latency, self.seq),
                (dest, self.addrs[i], buf[..t.len].to_vec()),
            );
        }
    }

    /// Runs until `until`, calling `app` for every event.
    fn run(&mut self, until: Time, app: &mut dyn FnMut(&mut Endpoint, Time, usize, Event)) {
        loop {
            for i in 0..self.eps.len() {
                while let Some(ev) = self.eps[i].poll_event() {
                    app(&mut self.eps[i], self.now, i, ev);
                }
                self.flush(i);
            }
            let next_packet = self.flight.keys().next().map(|k| k.0);
            let next_timer = self.eps.iter().filter_map(|e| e.poll_timeout()).min();
            let next = match (next_packet, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(Time::MAX),
            };
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            if next_packet == Some(next) {
                let ((at, _), (dest, from, data)) = self.flight.pop_first().unwrap();
                if !self.gro {
                    self.eps[dest].handle_datagram(self.now, from, &data);
                    continue;
                }
                // Coalesce what arrives at the same instant from the same
                // source with the same size (the last may be shorter).
                let seg = data.len();
                let mut batch = data;
                while let Some(e) = self.flight.first_entry() {
                    let (t, _) = *e.key();
                    let (d, f, next) = e.get();
                    if t != at
                        || *d != dest
                        || *f != from
                        || next.len() > seg
                        || batch.len() % seg != 0
                    {
                        break;
                    }
                    batch.extend_from_slice(next);
                    e.remove();
                }
                self.batches += (batch.len() > seg) as u64;
                self.eps[dest].handle_datagrams(self.now, from, &batch, seg);
            } else {
                for e in &mut self.eps {
                    if e.poll_timeout().is_some_and(|t| t <= self.now) {
                        e.handle_timeout(self.now);
                    }
                }
            }
        }
    }
}

fn pattern(seed: u64, len: usize) -> Bytes {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn echo_app(
    results: &mut Vec<(u64, Vec<u8>)>,
) -> impl FnMut(&mut Endpoint, Time, usize, Event) + '_ {
    move |ep, now, _i, ev| match ev {
        Event::Request { rpc, message } => {
            let data = Bytes::from(message.to_vec());
            ep.send_response(now, rpc, data).unwrap();
        }
        Event::Response { id, message } => results.push((id.0, message.to_vec())),
        Event::Failed { id, error } => panic!("rpc {id:?} failed: {error}"),
        ev @ (Event::PartialRequest { .. }
        | Event::PartialResponse { .. }
        | Event::PartialProgress { .. }
        | Event::StreamOpened { .. }
        | Event::StreamReadable { .. }
        | Event::StreamWritable { .. }) => panic!("not asked for: {ev:?}"),
    }
}

/// Sends one request of each size from endpoint 0 to endpoint 1 (payload
/// pattern `seed + n` for the n-th), runs an echo server until `until`, and
/// checks that every response came back intact.
fn echo_and_check(link: &mut Link, sizes: &[usize], seed: u64, until: Time) {
    let mut expect = BTreeMap::new();
    for (n, &s) in sizes.iter().enumerate() {
        let data = pattern(seed + n as u64, s);
        let id = link.eps[0]
            .send_request(0, link.addrs[1], data.clone())
            .unwrap();
        expect.insert(id.0, data);
    }
    let mut results = Vec::new();
    link.run(until, &mut echo_app(&mut results));
    assert_eq!(results.len(), sizes.len());
    for (id, data) in results {
        assert_eq!(&data[..], &expect[&id][..]);
    }
}

#[test]
fn echo_various_sizes() {
    let mut link = Link::new(2, Config::default());
    let sizes = [
        0usize,
        1,
        100,
        1416,
        1417,
        5000,
        60_000,
        64 * 1024,
        200_000,
        1_000_000,
    ];
    echo_and_check(&mut link, &sizes, 0, 1_000_000_000);
    // Acks flow on NEED_ACK; then peers are garbage collected.
    link.run(30_000_000_000, &mut |_, _, _, _| {});
    for e in &link.eps {
        let s = e.stats();
        assert_eq!((s.client_rpcs, s.server_rpcs, s.peers), (0, 0, 0), "{s:?}");
        assert!(s.pool_empty);
    }
}

/// GRO batches (several packets handed over at once) deliver the same
/// messages as packets handed over one by one, in about as many steps.
#[test]
fn gro_batches_deliver_every_message() {
    let sizes = [0usize, 1, 1417, 60_000, 200_000, 1_000_000, 3_000];
    let mut outcome = Vec::new();
    for gro in [false, true] {
        let mut link = Link::new(2, Config::default().with_max_nic_queue_ns(20_000));
        link.gro = gro;
        echo_and_check(&mut link, &sizes, 7, 1_000_000_000);
        assert_eq!(link.batches > 10, gro, "{} batches", link.batches);
        let m = link.eps[1].metrics().clone();
        outcome.push((
            m.data_bytes_received,
            m.retransmitted_packets,
            m.grants_sent,
        ));
    }
    // Same bytes, no retransmissions either way; batching may only merge
    // grant decisions (never add any).
    assert_eq!(outcome[0].0, outcome[1].0);
    assert_eq!((outcome[0].1, outcome[1].1), (0, 0));
    assert!(outcome[1].2 <= outcome[0].2, "{outcome:?}");
    assert!(outcome[1].2 > 0, "{outcome:?}");
}

/// A client that sends no checksums and a server that does (the engine's
/// default) still talk: each verifies only checksums that are present.
#[test]
fn endpoints_with_and_without_checksums_interoperate() {
    let mut link = Link::new(2, Config::default());
    link.eps[0] = Endpoint::new(
        Config::default().with_checksum(false).with_rpc_id_seed(100),
        0,
    )
    .unwrap();
    echo_and_check(&mut link, &[100, 5000, 200_000], 0, 1_000_000_000);
    for e in &link.eps {
        assert_eq!(e.metrics().total_drops(), 0);
    }
}

#[test]
fn echo_with_loss() {
    let mut link = Link::new(3, Config::default());
    link.drop = Box::new(|seq, _| seq % 7 == 3);
    let mut expect = BTreeMap::new();
    for n in 0..30u64 {
        let size = [10usize, 3000, 150_000][n as usize % 3];
        let data = pattern(n, size);
        let from = (n % 2) as usize;
        let id = link.eps[from]
            .send_request(0, link.addrs[2], data.clone())
            .unwrap();
        expect.insert((from, id.0), data);
    }
    let mut results = Vec::new();
    link.run(5_000_000_000, &mut |ep, now, i, ev| match ev {
        Event::Request { rpc, message } => {
            ep.send_response(now, rpc, Bytes::from(message.to_vec()))
                .unwrap();
        }
        Event::Response { id, message } => results.push(((i, id.0), message.to_vec())),
        Event::Failed { id, error } => panic!("rpc {id:?} failed: {error}"),
        ev @ (Event::PartialRequest { .. }
        | Event::PartialResponse { .. }
        | Event::PartialProgress { .. }
        | Event::StreamOpened { .. }
        | Event::StreamReadable { .. }
        | Event::StreamWritable { .. }) => panic!("not asked for: {ev:?}"),
    });
    assert_eq!(results.len(), expect.len());
    for (k, data) in results {
        assert_eq!(&data[..], &expect[&k][..]);
    }
}

#[test]
fn split_transmit_gives_the_same_datagrams_without_copying_payloads() {
    let dest: SocketAddr = "10.0.0.9:4000".parse().unwrap();
    // A queue limit long enough to release all unscheduled packets at once.
    let config = Config::default().with_max_nic_queue_ns(1_000_000);
    let mut a = Endpoint::new(config.clone(), 0).unwrap();
    let mut b = Endpoint::new(config, 0).unwrap();
    let data = pattern(3, 100_000);
    a.send_request(0, dest, data.clone()).unwrap();
    b.send_request(0, dest, data).unwrap();
    let (mut buf_a, mut buf_b) = (Vec::new(), Vec::new());
    let mut n = 0;
    while let Some(ta) = a.poll_transmit(0, &mut buf_a) {
        let (tb, payload) = b.poll_transmit_split(0, &mut buf_b).unwrap();
        assert_eq!(ta, tb);
        let mut joined = buf_b.clone();
        joined.extend_from_slice(&payload);
        assert_eq!(&buf_a[..ta.len], &joined[..], "packet {n}");
        assert!(homa_proto::wire::verify_checksum(&joined, true));
        n += 1;
    }
    assert!(b.poll_transmit_split(0, &mut buf_b).is_none());
    assert!(n > 10);
}

#[test]
fn split_transmit_writes_a_short_message_whole() {
    let dest: SocketAddr = "10.0.0.9:4000".parse().unwrap();
    // Padding on, as the UDP runtime has it: a 100-byte message's datagram
    // (156 bytes) is padded to 198.
    let config = Config::default().with_pad_v4(homa_proto::PadWindow { from: 129, to: 198 });
    for (size, whole) in [
        (0usize, true),
        (100, true),
        (512, true),
        (513, false),
        (1000, false),
    ] {
        let mut a = Endpoint::new(config.clone(), 0).unwrap();
        let mut b = Endpoint::new(config.clone(), 0).unwrap();
        let data = pattern(size as u64, size);
        a.send_request(0, dest, data.clone()).unwrap();
        b.send_request(0, dest, data).unwrap();
        let (mut buf_a, mut buf_b) = (Vec::new(), Vec::new());
        let ta = a.poll_transmit(0, &mut buf_a).unwrap();
        let (tb, payload) = b.poll_transmit_split(0, &mut buf_b).unwrap();
        assert_eq!(ta, tb, "{size} bytes");
        if whole {
            assert!(payload.is_empty(), "{size} bytes: no payload handle");
            assert_eq!(&buf_b[..], &buf_a[..ta.len], "{size} bytes");
        } else {
            assert_eq!(payload.len(), size, "{size} bytes: payload by handle");
            assert_eq!(buf_b.len(), homa_proto::wire::DATA_PACKET_OVERHEAD);
        }
        if size == 100 {
            assert_eq!(tb.len, 198, "padded");
        }
        assert!(b.poll_transmit_split(0, &mut buf_b).is_none());
    }
}

#[test]
fn discard_payload_still_delivers_every_message_with_its_length() {
    let config = Config::default().with_discard_payload(true);
    let mut link = Link::new(2, config);
    let id = link.eps[0]
        .send_request(0, link.addrs[1], pattern(1, 300_000))
        .unwrap();
    let mut got = Vec::new();
    link.run(1_000_000_000, &mut |ep, now, _, ev| match ev {
        Event::Request { rpc, message } => {
            assert_eq!(message.len(), 300_000);
            ep.send_response(now, rpc, Bytes::from(vec![1u8; 70_000]))
                .unwrap();
        }
        Event::Response { id, message } => got.push((id, message.len())),
        Event::Failed { id, error } => panic!("{id:?}: {error}"),
        ev @ (Event::PartialRequest { .. }
        | Event::PartialResponse { .. }
        | Event::PartialProgress { .. }
        | Event::StreamOpened { .. }
        | Event::StreamReadable { .. }
        | Event::StreamWritable { .. }) => panic!("not asked for: {ev:?}"),
    });
    assert_eq!(got, [(id, 70_000)]);
}

/// `client_rpc_index`: live client RPCs get distinct indices that stay as
/// small as the number in progress (freed ones are reused), so a driver can
/// index a vector by them.
#[test]
fn client_rpc_indices_are_dense_distinct_and_reused() {
    let mut ep = Endpoint::new(Config::default(), 0).unwrap();
    let server: SocketAddr = "10.0.0.9:4000".parse().unwrap();
    let ids: Vec<_> = (0..50)
        .map(|_| {
            ep.send_request(0, server, Bytes::from_static(b"x"))
                .unwrap()
        })
        .collect();
    let mut idx: Vec<usize> = ids.iter().map(|id| ep.client_rpc_index(*id)).collect();
    idx.sort();
    idx.dedup();
    assert_eq!(idx.len(), 50, "distinct");
    assert!(idx.iter().all(|&i| i < 50), "dense: {idx:?}");
    // Freed slots are reused: after cancelling ten, ten new RPCs land on
    // the same indices, under new ids.
    let freed: Vec<usize> = ids[10..20]
        .iter()
        .map(|id| ep.client_rpc_index(*id))
        .collect();
    for id in &ids[10..20] {
        ep.cancel(*id);
    }
    let mut again: Vec<usize> = (0..10)
        .map(|_| {
            let id = ep
                .send_request(0, server, Bytes::from_static(b"y"))
                .unwrap();
            assert!(!ids.contains(&id), "a new id");
            ep.client_rpc_index(id)
        })
        .collect();
    again.sort();
    let mut freed_sorted = freed.clone();
    freed_sorted.sort();
    assert_eq!(again, freed_sorted);
}

/// Moves every packet `from` has ready to `to` (addresses `fa`, `ta`).
fn deliver(from: &mut Endpoint, fa: SocketAddr, to: &mut Endpoint, now: Time) -> usize {
    let mut buf = Vec::new();
    let mut n = 0;
    while let Some(t) = from.poll_transmit(now, &mut buf) {
        to.handle_datagram(now, fa, &buf[..t.len]);
        n += 1;
    }
    n
}

/// A client and a server endpoint with `cfg` (distinct id seeds).
fn client_and_server(cfg: Config) -> (Endpoint, Endpoint) {
    let with_seed = |seed| Endpoint::new(cfg.clone().with_rpc_id_seed(seed), 0).unwrap();
    (with_seed(1), with_seed(2))
}

/// With `defer_acks`, an acknowledgement piggybacked on a request frees the
/// acknowledged server RPC only in `run_deferred` (or the next entry into
/// the engine), except when a limit needs the room at once.
#[test]
fn piggybacked_acks_are_deferred_until_run_deferred() {
    let (ca, sa): (SocketAddr, SocketAddr) = (
        "10.0.0.1:4000".parse().unwrap(),
        "10.0.0.2:4000".parse().unwrap(),
    );
    for (defer, per_peer) in [(false, 16), (true, 16), (true, 1)] {
        let cfg = Config::default()
            .with_defer_acks(defer)
            .with_max_server_rpcs_per_peer(per_peer);
        let (mut client, mut server) = client_and_server(cfg);
        let mut now = 1_000;
        // One full RPC: the server keeps it until the client acknowledges.
        client
            .send_request(now, sa, Bytes::from_static(b"first"))
            .unwrap();
        deliver(&mut client, ca, &mut server, now);
        let Some(Event::Request { rpc, .. }) = server.poll_event() else {
            panic!("no request")
        };
        server
            .send_response(now, rpc, Bytes::from_static(b"one"))
            .unwrap();
        deliver(&mut server, sa, &mut client, now);
        assert!(matches!(client.poll_event(), Some(Event::Response { .. })));
        assert_eq!(server.stats().server_rpcs, 1);
        // The next request carries the acknowledgement.
        now += 1_000;
        client
            .send_request(now, sa, Bytes::from_static(b"second"))
            .unwrap();
        deliver(&mut client, ca, &mut server, now);
        assert!(
            matches!(server.poll_event(), Some(Event::Request { .. })),
            "defer {defer}, per-peer limit {per_peer}: the second request is served"
        );
        let held = defer && per_peer > 1;
        assert_eq!(server.has_deferred(), held);
        assert_eq!(server.stats().server_rpcs, if held { 2 } else { 1 });
        assert_eq!(server.metrics().acks_processed, !held as u64);
        server.run_deferred(now);
        assert!(!server.has_deferred());
        assert_eq!(server.stats().server_rpcs, 1);
        assert_eq!(server.stats().tombstones, 1);
        assert_eq!(server.metrics().acks_processed, 1);
    }
}

/// A deferred acknowledgement is applied by the next `handle_timeout` or
/// datagram even if the driver never calls `run_deferred`.
#[test]
fn deferred_acks_are_applied_by_the_next_engine_entry() {
    let (ca, sa): (SocketAddr, SocketAddr) = (
        "10.0.0.1:4000".parse().unwrap(),
        "10.0.0.2:4000".parse().unwrap(),
    );
    let cfg = Config::default().with_defer_acks(true);
    let (mut client, mut server) = client_and_server(cfg);
    let now = 1_000;
    for (i, body) in [&b"a"[..], b"b", b"c"].into_iter().enumerate() {
        client
            .send_request(now, sa, Bytes::from_static(body))
            .unwrap();
        deliver(&mut client, ca, &mut server, now);
        let Some(Event::Request { rpc, .. }) = server.poll_event() else {
            panic!("no request")
        };
        // Request i acknowledged RPC i-1, held back until this datagram
        // (i ≥ 2: the one before was applied when this one arrived).
        assert_eq!(server.metrics().acks_processed, i.saturating_sub(1) as u64);
        server
            .send_response(now, rpc, Bytes::from_static(b"r"))
            .unwrap();
        deliver(&mut server, sa, &mut client, now);
        assert!(matches!(client.poll_event(), Some(Event::Response { .. })));
    }
    assert!(server.has_deferred());
    server.handle_timeout(now + 1);
    assert!(!server.has_deferred());
    assert_eq!(server.metrics().acks_processed, 2);
}

/// With `defer_acks`, a client RPC whose response was delivered is freed in
/// `run_deferred` (or the next entry into the engine), and meanwhile nothing
/// can tell: it is not counted, no packet or call finds it, it holds no
/// room under a limit, and shutdown does not fail it. A request sent from a
/// send buffer is freed at once, so that the buffer is free again.
#[test]
fn completed_client_rpcs_are_freed_in_run_deferred() {
    let (ca, sa): (SocketAddr, SocketAddr) = (
        "10.0.0.1:4000".parse().unwrap(),
        "10.0.0.2:4000".parse().unwrap(),
    );
    let cfg = Config::default()
        .with_defer_acks(true)
        .with_max_client_rpcs(1);
    let (mut client, mut server) = client_and_server(cfg);
    let now = 1_000;
    // One round trip; the response's datagram is kept for a duplicate.
    let rpc_once = |client: &mut Endpoint, server: &mut Endpoint, body: Outgoing| {
        let id = client.send_request(now, sa, body).unwrap();
        deliver(client, ca, server, now);
        let Some(Event::Request { rpc, .. }) = server.poll_event() else {
            panic!("no request")
        };
        server
            .send_response(now, rpc, Bytes::from_static(b"r"))
            .unwrap();
        let mut buf = Vec::new();
        let mut datagrams = Vec::new();
        while let Some(t) = server.poll_transmit(now, &mut buf) {
            datagrams.push(buf[..t.len].to_vec());
        }
        for d in &datagrams {
            client.handle_datagram(now, sa, d);
        }
        let ev = client.poll_event();
        assert!(
            matches!(ev, Some(Event::Response { id: got, .. }) if got == id),
            "{ev:?}"
        );
        (id, datagrams)
    };
    let (id, datagrams) = rpc_once(&mut client, &mut server, Bytes::from_static(b"a").into());
    assert!(client.has_deferred());
    assert_eq!(client.stats().client_rpcs, 0);
    deliver(&mut client, ca, &mut server, now);
    assert!(client.is_idle());
    // Cancelling a finished RPC does nothing.
    client.cancel(id);
    assert!(client.poll_event().is_none());
    // The limit (one RPC) is not held by the finished one.
    let (_, _) = rpc_once(&mut client, &mut server, Bytes::from_static(b"b").into());
    assert!(client.has_deferred());
    // A duplicate of an old response: the engine frees first, then finds no
    // RPC for it.
    for d in &datagrams {
        client.handle_datagram(now, sa, d);
    }
    assert!(!client.has_deferred());
    assert!(client.poll_event().is_none());
    assert_eq!(client.stats().client_rpcs, 0);
    // Shutdown with a free pending: no failure reported for it.
    let (_, _) = rpc_once(&mut client, &mut server, Bytes::from_static(b"c").into());
    assert!(client.has_deferred());
    client.shutdown();
    assert!(client.poll_event().is_none());
    assert_eq!(client.stats().client_rpcs, 0);
    // A request from a send buffer: freed at once.
    let (mut client, mut server) = client_and_server(Config::default().with_defer_acks(true));
    let mut b = client.new_send_buf(10);
    b.write(0, b"from a buf").unwrap();
    rpc_once(&mut client, &mut server, b.clone().into());
    assert!(!client.has_deferred());
    assert!(!b.in_flight());
}
