//! The engine's own CPU cost, with no sockets and no clock reads inside the
//! measured loops: two endpoints exchange datagrams in memory on a simulated
//! clock that advances only when the sender's pacer holds a packet back.
//!
//! * `rtt`: 100-byte request, 100-byte response (the response reuses the
//!   request's bytes, so no allocation beyond the engine's own); ns of both
//!   engines' work per round trip.
//! * `stream`: one-way 500 KB messages (the receiver drops each request
//!   unanswered, as the simulator does); ns of both engines' work per
//!   1472-byte DATA packet, GRANTs included.
//!
//! * `burst`: the same stream the way the UDP runtime drives it: the sender
//!   emits runs of up to 44 packets (`poll_transmit_burst`, one GSO send),
//!   the receiver takes each run as one GRO datagram (`handle_datagrams`);
//!   ns per DATA packet of each side separately (gathering a run's headers
//!   and payload into one datagram, the runtime's work, is not counted).
//!
//! * `tick`: 100-byte round trips at 170,000 per simulated second, so the
//!   server holds the steady-state population of tombstones of a 100 ms
//!   `tombstone_ns` (about 17,000); reports the server's timer tick cost
//!   (each `handle_timeout` call that is due) and ns per round trip.
//!
//! `cargo run --release -p homa-proto --example proto_bench -- [checksum] [rtt|stream|burst|tick]`

use bytes::Bytes;
use homa_proto::driver::FastPath as _;
use homa_proto::{Config, Endpoint, Event};
use std::net::SocketAddr;
use std::time::Instant;

fn pair(checksum: bool) -> (Endpoint, Endpoint) {
    let cfg = |seed| {
        Config::default()
            .with_checksum(checksum)
            .with_rpc_id_seed(seed)
            // The tick case measures expiry with a table this full (the
            // derived default is 20 ms); kept so results compare across
            // sessions.
            .with_tombstone_ns(100_000_000)
    };
    (
        Endpoint::new(cfg(5), 0).unwrap(),
        Endpoint::new(cfg(9), 0).unwrap(),
    )
}

/// The two endpoints' addresses (built, not parsed: this runs in the
/// measured loops).
fn addrs() -> (SocketAddr, SocketAddr) {
    use std::net::Ipv4Addr;
    (
        SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 1)),
        SocketAddr::from((Ipv4Addr::new(10, 0, 0, 2), 1)),
    )
}

/// One pass of a round trip in progress between client `a` and echo server
/// `b`: everything each may send now is delivered, requests are answered
/// with `resp`. True once `a` has its response.
fn exchange(a: &mut Endpoint, b: &mut Endpoint, now: u64, buf: &mut Vec<u8>, resp: &Bytes) -> bool {
    let (a_addr, b_addr) = addrs();
    while let Some(t) = a.poll_transmit(now, buf) {
        b.handle_datagram(now, a_addr, &buf[..t.len]);
    }
    while let Some(ev) = b.poll_event() {
        if let Event::Request { rpc, .. } = ev {
            b.send_response(now, rpc, resp.clone()).unwrap();
        }
    }
    while let Some(t) = b.poll_transmit(now, buf) {
        a.handle_datagram(now, b_addr, &buf[..t.len]);
    }
    let mut done = false;
    while let Some(ev) = a.poll_event() {
        done |= matches!(ev, Event::Response { .. });
    }
    done
}

/// Round trips of `size`-byte messages; returns ns per round trip.
fn rtt(checksum: bool, size: usize, count: u64) -> f64 {
    let (mut a, mut b) = pair(checksum);
    let (_, b_addr) = addrs();
    let mut buf = Vec::with_capacity(2048);
    let req = Bytes::from(vec![1u8; size]);
    let mut now = 1_000u64;
    let start = Instant::now();
    for _ in 0..count {
        // 1 µs per round trip of simulated time: timers stay quiet.
        now += 1_000;
        a.send_request(now, b_addr, req.clone()).unwrap();
        while !exchange(&mut a, &mut b, now, &mut buf, &req) {
            if let Some(t) = a.poll_timeout().into_iter().chain(b.poll_timeout()).min() {
                if t > now {
                    now = t;
                    a.handle_timeout(now);
                    b.handle_timeout(now);
                }
            }
        }
    }
    start.elapsed().as_nanos() as f64 / count as f64
}

/// Round trips at `rate` per simulated second for `secs` simulated seconds;
/// returns (mean ns, max ns) of the server's due timer ticks after the first
/// (tombstone-filling) `tombstone_ns`, and ns per round trip over the run.
fn tick(checksum: bool, rate: u64, secs: u64) -> (f64, f64, f64) {
    let (mut a, mut b) = pair(checksum);
    let (_, b_addr) = addrs();
    let mut buf = Vec::with_capacity(2048);
    let req = Bytes::from(vec![1u8; 100]);
    let step = 1_000_000_000 / rate;
    let warm = b.config().effective_tombstone_ns() + 1_000;
    let count = secs * rate;
    let mut now = 1_000u64;
    let (mut ticks, mut tick_total, mut tick_max) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    for _ in 0..count {
        now += step;
        if a.poll_timeout().is_some_and(|t| t <= now) {
            a.handle_timeout(now);
        }
        if b.poll_timeout().is_some_and(|t| t <= now) {
            let t0 = Instant::now();
            b.handle_timeout(now);
            let ns = t0.elapsed().as_nanos() as u64;
            if now > warm {
                ticks += 1;
                tick_total += ns;
                tick_max = tick_max.max(ns);
            }
        }
        a.send_request(now, b_addr, req.clone()).unwrap();
        while !exchange(&mut a, &mut b, now, &mut buf, &req) {}
    }
    let per_rtt = start.elapsed().as_nanos() as f64 / count as f64;
    assert!(b.stats().tombstones > 0, "the server holds tombstones");
    (
        tick_total as f64 / ticks.max(1) as f64,
        tick_max as f64,
        per_rtt,
    )
}

/// A one-way stream in progress: `a` sends `count` requests of `msg`, one
/// at a time, to `b`, which drops each one delivered.
struct Stream {
    a: Endpoint,
    b: Endpoint,
    a_addr: SocketAddr,
    b_addr: SocketAddr,
    msg: Bytes,
    id: homa_proto::RpcId,
    delivered: u64,
    count: u64,
    now: u64,
    buf: Vec<u8>,
}

impl Stream {
    fn new(mut a: Endpoint, b: Endpoint, size: usize, count: u64) -> Stream {
        let (a_addr, b_addr) = addrs();
        let msg = Bytes::from(vec![7u8; size]);
        let now = 1_000u64;
        let id = a.send_request(now, b_addr, msg.clone()).unwrap();
        Stream {
            a,
            b,
            a_addr,
            b_addr,
            msg,
            id,
            delivered: 0,
            count,
            now,
            buf: Vec::with_capacity(2048),
        }
    }

    fn done(&self) -> bool {
        self.delivered >= self.count
    }

    /// The receiver's turn: each request delivered is dropped and `a` sends
    /// the next; GRANTs go back to `a`. True if any packet moved.
    fn receiver_turn(&mut self) -> bool {
        let (now, b_addr) = (self.now, self.b_addr);
        while let Some(ev) = self.b.poll_event() {
            if let Event::Request { rpc, message } = ev {
                assert_eq!(message.len(), self.msg.len());
                self.b.abandon(rpc);
                self.a.cancel(self.id);
                self.delivered += 1;
                if !self.done() {
                    self.id = self.a.send_request(now, b_addr, self.msg.clone()).unwrap();
                }
            }
        }
        let mut moved = false;
        while let Some(t) = self.b.poll_transmit(now, &mut self.buf) {
            self.a.handle_datagram(now, b_addr, &self.buf[..t.len]);
            moved = true;
        }
        moved
    }

    /// Nothing moved: the pacer holds the next packet back. Jump to when it
    /// may go, plus `extra` ns, and run both endpoints' timers.
    fn wait_for_pacer(&mut self, extra: u64) {
        let t = self.a.poll_timeout().expect("sender has a deadline");
        self.now = self.now.max(t) + extra;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }

    fn data_packets(&self) -> u64 {
        self.a.metrics().sent(homa_proto::wire::PacketType::Data)
    }
}

/// One-way `size`-byte messages, `count` of them back to back; returns
/// (ns per DATA packet, DATA packets).
fn stream(checksum: bool, size: usize, count: u64) -> (f64, u64) {
    let (a, b) = pair(checksum);
    let start = Instant::now();
    let mut s = Stream::new(a, b, size, count);
    while !s.done() {
        let mut moved = false;
        while let Some(t) = s.a.poll_transmit(s.now, &mut s.buf) {
            s.b.handle_datagram(s.now, s.a_addr, &s.buf[..t.len]);
            moved = true;
        }
        if !(s.receiver_turn() || moved) {
            s.wait_for_pacer(0);
        }
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    let packets = s.data_packets();
    (elapsed / packets as f64, packets)
}

/// The `stream` workload in runs of packets; returns (sender ns per DATA
/// packet, receiver ns per DATA packet, packets per run).
fn burst(checksum: bool, size: usize, count: u64) -> (f64, f64, f64) {
    // As the runtime's loopback benchmark configures it: a 100 Gbit/s "link"
    // and the runtime's 20 µs NIC queue, which lets a GSO-sized run go at once.
    let cfg = |seed| {
        Config::default()
            .with_checksum(checksum)
            .with_rpc_id_seed(seed)
            // The tick case measures expiry with a table this full (the
            // derived default is 20 ms); kept so results compare across
            // sessions.
            .with_tombstone_ns(100_000_000)
            .with_link_bps(100_000_000_000)
            .with_max_nic_queue_ns(20_000)
    };
    let a = Endpoint::new(cfg(5), 0).unwrap();
    let b = Endpoint::new(cfg(9), 0).unwrap();
    let mut s = Stream::new(a, b, size, count);
    let mut hdrs = Vec::with_capacity(64 * 64);
    let mut dgram = Vec::with_capacity(65_536);
    let (mut tx_ns, mut rx_ns) = (0u128, 0u128);
    let mut bursts = 0u64;
    while !s.done() {
        let mut moved = false;
        loop {
            hdrs.clear();
            let t0 = Instant::now();
            let Some(burst) = s.a.poll_transmit_burst(s.now, 44, &mut hdrs) else {
                break;
            };
            tx_ns += t0.elapsed().as_nanos();
            bursts += 1;
            dgram.clear();
            for i in 0..burst.count {
                dgram.extend_from_slice(&hdrs[i * burst.header_len..][..burst.header_len]);
                dgram.extend_from_slice(burst.payload_of(i));
            }
            let seg = if burst.count > 1 {
                burst.header_len + burst.segment
            } else {
                0
            };
            let t1 = Instant::now();
            s.b.handle_datagrams(s.now, s.a_addr, &dgram, seg);
            rx_ns += t1.elapsed().as_nanos();
            moved = true;
        }
        if !(s.receiver_turn() || moved) {
            // Real time moves on while a GSO run is sent: jump by about one run
            // (44 packets at 100 Gbit/s), not just to the first packet's turn.
            s.wait_for_pacer(5_000);
        }
    }
    let packets = s.data_packets();
    (
        tx_ns as f64 / packets as f64,
        rx_ns as f64 / packets as f64,
        packets as f64 / bursts as f64,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let checksum = args.iter().any(|a| a == "checksum");
    let only = |what: &str| {
        !args
            .iter()
            .any(|a| a == "rtt" || a == "stream" || a == "burst" || a == "tick")
            || args.iter().any(|a| a == what)
    };
    if only("rtt") {
        // Warm up allocators and caches.
        rtt(checksum, 100, 10_000);
        let per_rtt = (0..3)
            .map(|_| rtt(checksum, 100, 200_000))
            .fold(f64::MAX, f64::min);
        println!("checksum {checksum}: rtt 100 B, both engines: {per_rtt:.0} ns per round trip (min of 3)");
    }
    if only("tick") {
        let runs: Vec<(f64, f64, f64)> = (0..3).map(|_| tick(checksum, 170_000, 2)).collect();
        let min = |f: fn(&(f64, f64, f64)) -> f64| runs.iter().map(f).fold(f64::MAX, f64::min);
        println!(
            "checksum {checksum}: tick at 170k rtt/s, 100 ms tombstones: server tick mean {:.0} ns, max {:.0} ns; {:.0} ns per round trip (min of 3)",
            min(|r| r.0),
            min(|r| r.1),
            min(|r| r.2)
        );
    }
    if only("stream") {
        let (per_pkt, packets) = (0..3)
            .map(|_| stream(checksum, 500_000, 400))
            .fold((f64::MAX, 0), |acc, x| if x.0 < acc.0 { x } else { acc });
        println!(
            "checksum {checksum}: stream 500 KB one-way, both engines: {per_pkt:.1} ns per DATA packet ({packets} packets, min of 3)"
        );
    }
    if only("burst") {
        let runs: Vec<(f64, f64, f64)> = (0..3).map(|_| burst(checksum, 500_000, 400)).collect();
        let tx = runs.iter().map(|r| r.0).fold(f64::MAX, f64::min);
        let rx = runs.iter().map(|r| r.1).fold(f64::MAX, f64::min);
        println!(
            "checksum {checksum}: burst 500 KB one-way in runs of 44: sender {tx:.1} ns, receiver {rx:.1} ns per DATA packet ({:.1} packets per run; min of 3)",
            runs[0].2
        );
    }
}
