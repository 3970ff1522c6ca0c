//! Driver throughput with real endpoints: the paper's two-level topology, every
//! host both client and server, Poisson request arrivals to random hosts.
//!
//! `cargo run --release -p homa-testnet --example engine_bench -- [load] [sim_ms]`

use bytes::Bytes;
use homa_proto::{Config, Event};
use homa_testnet::{App, EngineNet, Fabric, HostCtx, TwoLevel};
use rand::Rng;
use std::time::Instant;

/// Message lengths and their weights (a short-heavy mix).
const SIZES: [(usize, u32); 4] = [(100, 60), (1_000, 25), (10_000, 12), (100_000, 3)];

struct Poisson {
    gap_ns: f64,
    end: u64,
    sent: u64,
    done: u64,
    failed: u64,
}

fn pick(rng: &mut impl Rng) -> usize {
    let total: u32 = SIZES.iter().map(|s| s.1).sum();
    let mut x = rng.gen_range(0..total);
    for (len, w) in SIZES {
        if x < w {
            return len;
        }
        x -= w;
    }
    unreachable!()
}

impl App for Poisson {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        let gap = -self.gap_ns * (1.0 - ctx.rng().gen::<f64>()).ln();
        ctx.wake_after(gap as u64, 0);
    }
    fn on_wakeup(&mut self, ctx: &mut HostCtx<'_>, _token: u64) {
        let n = ctx.n_hosts();
        let mut dst = ctx.rng().gen_range(0..n - 1);
        if dst >= ctx.host() {
            dst += 1;
        }
        let len = pick(ctx.rng());
        if ctx.send_request(dst, Bytes::from(vec![0u8; len])).is_ok() {
            self.sent += 1;
        }
        let gap = -self.gap_ns * (1.0 - ctx.rng().gen::<f64>()).ln();
        if ctx.now() + (gap as u64) < self.end {
            ctx.wake_after(gap as u64, 0);
        }
    }
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, ev: Event) {
        match ev {
            Event::Request { rpc, .. } => {
                let _ = ctx.send_response(rpc, Bytes::from_static(&[0u8; 100]));
            }
            Event::Response { .. } => self.done += 1,
            Event::Failed { .. } => self.failed += 1,
            ev => panic!("not asked for: {ev:?}"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let load: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let sim_ms: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let spec = TwoLevel::paper();
    let fabric = Fabric::two_level(&spec).with_seed(1);
    let mean_bytes: f64 = SIZES.iter().map(|&(l, w)| l as f64 * w as f64).sum::<f64>()
        / SIZES.iter().map(|s| s.1 as f64).sum::<f64>();
    let gap_ns = mean_bytes * 8.0 * 1e9 / spec.host_bps as f64 / load;
    let end = sim_ms * 1_000_000;
    let mut net = EngineNet::uniform(fabric, Config::default(), |_| Poisson {
        gap_ns,
        end,
        sent: 0,
        done: 0,
        failed: 0,
    })
    .unwrap();
    let t0 = Instant::now();
    net.run_until(end + 5_000_000);
    let secs = t0.elapsed().as_secs_f64();
    let ev = net.fabric().events_processed();
    let (sent, done, failed) = net.apps().fold((0, 0, 0), |a, p| {
        (a.0 + p.sent, a.1 + p.done, a.2 + p.failed)
    });
    println!(
        "load {load}: {sent} RPCs sent, {done} done, {failed} failed; {} packets; {ev} events in {secs:.2} s = {:.2} M events/s",
        net.fabric().stats().delivered,
        ev as f64 / secs / 1e6
    );
}
