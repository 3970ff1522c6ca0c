//! Raw network throughput: the paper's two-level topology (144 hosts) with
//! every host sending packets of one size (default full-size) to random
//! hosts at a given load.
//!
//! `cargo run --release -p homa-testnet --example fabric_bench -- [load] [sim_ms] [bytes]`

use homa_testnet::{Fabric, HostId, Hosts, Packet, TwoLevel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

struct Gen {
    rng: ChaCha8Rng,
    bytes: usize,
    gap_ns: f64,
    end: u64,
    received: u64,
}

impl Hosts for Gen {
    fn deliver(&mut self, net: &mut Fabric, _h: HostId, pkt: Packet) {
        self.received += 1;
        net.recycle(pkt.data);
    }
    fn timer(&mut self, net: &mut Fabric, h: HostId, _kind: u32, _token: u64) {
        let n = net.n_hosts();
        let mut dst = self.rng.gen_range(0..n - 1);
        if dst >= h {
            dst += 1;
        }
        let mut buf = net.take_buf();
        buf.resize(self.bytes, 0);
        net.send(h, dst, self.rng.gen_range(0..8), buf);
        // Exponential gaps: Poisson arrivals.
        let gap = -self.gap_ns * (1.0 - self.rng.gen::<f64>()).ln();
        let next = net.now() + gap as u64;
        if next < self.end {
            net.schedule(next, h, 0, 0);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let load: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let sim_ms: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let bytes: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1500);
    let spec = TwoLevel::paper();
    let mut f = Fabric::two_level(&spec).with_seed(1);
    let end = sim_ms * 1_000_000;
    let tx_ns = bytes as f64 * 8.0 * 1e9 / spec.host_bps as f64;
    let mut g = Gen {
        rng: ChaCha8Rng::seed_from_u64(2),
        bytes,
        gap_ns: tx_ns / load,
        end,
        received: 0,
    };
    for h in 0..f.n_hosts() {
        f.schedule(h as u64, h, 0, 0);
    }
    let t0 = Instant::now();
    f.run_until_idle(&mut g, u64::MAX);
    let secs = t0.elapsed().as_secs_f64();
    let ev = f.events_processed();
    println!(
        "load {load}: {} packets delivered, {ev} events in {secs:.2} s = {:.2} M events/s, sim time {} ms, buffer drops {}",
        g.received,
        ev as f64 / secs / 1e6,
        f.now() / 1_000_000,
        f.stats().buffer_drops
    );
}
