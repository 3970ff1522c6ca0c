//! The protocol engine's own CPU time per round trip, with no sockets: two
//! `homa_proto::Endpoint`s exchange packets in memory (what the runtime adds
//! on top is socket I/O, locking and event routing).
//!
//! `cargo run --release -p homa --example engine_rtt -- [SIZE] [COUNT]`

use homa_proto::{Config, Endpoint, Event};
use std::net::SocketAddr;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let count: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let a_addr: SocketAddr = "10.0.0.1:1".parse().unwrap();
    let b_addr: SocketAddr = "10.0.0.2:1".parse().unwrap();
    for checksum in [true, false] {
        let cfg = |seed| {
            Config::default()
                .with_checksum(checksum)
                .with_rpc_id_seed(seed)
        };
        let mut a = Endpoint::new(cfg(5), 0).unwrap();
        let mut b = Endpoint::new(cfg(9), 0).unwrap();
        let mut buf = Vec::new();
        let req = bytes::Bytes::from(vec![1u8; size]);
        let base = Instant::now();
        let start = Instant::now();
        for _ in 0..count {
            a.send_request(base.elapsed().as_nanos() as u64, b_addr, req.clone())
                .unwrap();
            // Shuttle packets until the response arrives (time advances, so
            // the pacer releases long messages at the link rate).
            'rpc: loop {
                let now = base.elapsed().as_nanos() as u64;
                a.handle_timeout(now);
                b.handle_timeout(now);
                while let Some(t) = a.poll_transmit(now, &mut buf) {
                    b.handle_datagram(now, a_addr, &buf[..t.len]);
                }
                while let Some(ev) = b.poll_event() {
                    if let Event::Request { rpc, message } = ev {
                        let body = bytes::Bytes::from(message.to_vec());
                        b.send_response(now, rpc, body).unwrap();
                    }
                }
                while let Some(t) = b.poll_transmit(now, &mut buf) {
                    a.handle_datagram(now, b_addr, &buf[..t.len]);
                }
                while let Some(ev) = a.poll_event() {
                    if let Event::Response { .. } = ev {
                        break 'rpc;
                    }
                }
            }
        }
        let per = start.elapsed().as_nanos() as u64 / count;
        println!(
            "checksum {checksum}: {size} B echo, engine work per round trip (both ends): {per} ns"
        );
    }
}
