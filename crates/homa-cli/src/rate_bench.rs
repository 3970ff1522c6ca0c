//! `homa rate-bench`: the options of `homa_bench::rate` (small RPCs per
//! second against a server with M threads: Homa, raw UDP, TCP epoll), and
//! its table or JSON.

use crate::opts::{parse_size, HomaOpts};
use clap::Args;
use homa_bench::machine::MachineLoad;
use homa_bench::rate::{self, RateBench, RateRow, RateTransport};
use homa_bench::stats::to_json;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct RateBenchArgs {
    /// Transports, comma-separated: homa, udp (recvmmsg/sendmmsg echo),
    /// tcp (epoll echo).
    #[arg(long, default_value = "homa,udp,tcp", value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Server thread counts to run, comma-separated (e.g. 1,2): M sockets
    /// on one address with SO_REUSEPORT, one thread each.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub server_threads: Vec<usize>,
    /// Client threads, each with its own socket [default: 4 per CPU, at
    /// least 8: enough to saturate the server].
    #[arg(long)]
    pub clients: Option<usize>,
    /// Requests each client keeps outstanding (closed loop).
    #[arg(long, default_value_t = 2)]
    pub outstanding: usize,
    /// Request size in bytes (the server echoes it).
    #[arg(long, default_value = "100", value_parser = parse_size)]
    pub size: usize,
    /// Measured seconds per transport and thread count.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Unmeasured warm-up before each measurement, seconds.
    #[arg(long, default_value_t = 0.3)]
    pub warmup: f64,
    /// At most this many RPCs per client per run.
    #[arg(long, default_value_t = 2_000_000)]
    pub max_rpcs: u64,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

impl RateBenchArgs {
    fn spec(&self) -> anyhow::Result<RateBench> {
        let defaults = RateBench::new();
        Ok(RateBench {
            transports: self
                .transports
                .iter()
                .map(|t| RateTransport::parse(t))
                .collect::<anyhow::Result<_>>()?,
            server_threads: self.server_threads.clone(),
            clients: self.clients.unwrap_or(defaults.clients),
            outstanding: self.outstanding,
            size: self.size,
            seconds: self.seconds,
            warmup: self.warmup,
            max_rpcs: self.max_rpcs,
            poll: Duration::from_micros(self.homa.poll_us),
            homa: self.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?,
            progress: true,
        })
    }
}

pub fn run(args: RateBenchArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    MachineLoad::sample(Duration::from_millis(200)).report("rate-bench");
    let rows = rate::run(&spec)?;
    if args.json {
        println!("{}", to_json(rows));
    } else {
        print_table(&rows);
    }
    Ok(())
}

fn print_table(rows: &[RateRow]) {
    println!(
        "{:<10} {:>8} {:>8} {:>12} {:>9} {:>9} {:>13} {:>16}",
        "transport",
        "threads",
        "clients",
        "RPCs/s",
        "p50 µs",
        "p99 µs",
        "server cores",
        "RPCs/s per core"
    );
    for r in rows {
        println!(
            "{:<10} {:>8} {:>8} {:>12.0} {:>9.1} {:>9.1} {:>13.2} {:>16.0}",
            r.transport,
            r.server_threads,
            r.clients,
            r.rpcs_per_sec,
            r.p50_us,
            r.p99_us,
            r.server_cores,
            r.rpcs_per_server_core
        );
    }
    // Same-run ratios: Homa against each baseline, and each transport's
    // gain from more server threads.
    let find = |t: &str, m: usize| {
        rows.iter()
            .find(|r| r.transport == t && r.server_threads == m)
    };
    for h in rows.iter().filter(|r| r.transport == "homa") {
        for base in ["udp", "tcp"] {
            if let Some(b) = find(base, h.server_threads) {
                println!(
                    "{} thread(s): homa/{base} {:.2}x RPCs/s, {:.2}x RPCs/s per server core",
                    h.server_threads,
                    h.rpcs_per_sec / b.rpcs_per_sec.max(1e-9),
                    h.rpcs_per_server_core / b.rpcs_per_server_core.max(1e-9)
                );
            }
        }
    }
    for r in rows.iter().filter(|r| r.server_threads > 1) {
        if let Some(one) = find(&r.transport, 1) {
            println!(
                "{}: {} threads / 1 thread {:.2}x RPCs/s, {:.2}x RPCs/s per server core",
                r.transport,
                r.server_threads,
                r.rpcs_per_sec / one.rpcs_per_sec.max(1e-9),
                r.rpcs_per_server_core / one.rpcs_per_server_core.max(1e-9)
            );
        }
    }
}
