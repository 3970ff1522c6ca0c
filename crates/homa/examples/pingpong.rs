//! Latency percentiles of a 1-thread echo between two endpoints in one
//! process, with the runtime's waiting counters (how many waits were won
//! while polling, i.e. with no thread handoff).
//!
//! `cargo run --release -p homa --example pingpong -- [SIZE] [COUNT]`

use homa::{Endpoint, EndpointConfig};
use std::time::Instant;

fn main() -> homa::Result<()> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let cfg = EndpointConfig::default();
    let server = Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let s = server.clone();
    let echo = std::thread::spawn(move || {
        while let Ok(r) = s.recv_request() {
            let body = r.message().to_vec();
            let _ = r.reply(body);
        }
    });
    let client = Endpoint::bind_with("127.0.0.1:0", cfg)?;
    let msg = bytes::Bytes::from(vec![7u8; size]);
    let mut lat = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        client.call(addr, msg.clone())?;
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "{size} B x {count}: p50 {} ns  p90 {}  p99 {}  p99.9 {}",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999)
    );
    println!("client {:?}", client.runtime_stats());
    println!("server {:?}", server.runtime_stats());
    server.shutdown();
    echo.join().unwrap();
    Ok(())
}
