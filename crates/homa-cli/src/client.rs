//! `homa client`: the options of `homa_bench::closed::ClosedLoop` (`count`
//! echo RPCs of `size` bytes to a server, `concurrency` in flight) and its
//! latency and throughput report.

use crate::opts::{parse_size, HomaOpts};
use clap::Args;
use homa_bench::closed::ClosedLoop;
use homa_bench::stats::{gbps, print_latency_table, to_json, LatencyRow};
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The server's address.
    #[arg(long)]
    pub server: SocketAddr,
    /// Request size in bytes (k and m suffixes allowed).
    #[arg(long, value_parser = parse_size)]
    pub size: usize,
    /// Number of RPCs.
    #[arg(long)]
    pub count: u64,
    /// RPCs in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Local address (default: any address of the server's family).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let bind = args.bind.unwrap_or_else(|| {
        if args.server.is_ipv6() {
            "[::]:0".parse().unwrap()
        } else {
            "0.0.0.0:0".parse().unwrap()
        }
    });
    let r = ClosedLoop {
        server: args.server,
        bind,
        config: args.homa.config()?,
        size: args.size,
        outstanding: args.concurrency,
        max_rpcs: args.count,
        until: None,
        measure_from: None,
        // Beyond the engine's own RPC timeout, which fails them first.
        drain: Duration::from_secs(60),
    }
    .run()?;
    let h = &r.latency;
    let row = LatencyRow::from_histogram("homa", args.size, h);
    if args.json {
        println!("{}", to_json(vec![row]));
    } else {
        let secs = r.window_secs;
        print_latency_table(&[row]);
        println!(
            "{} RPCs in {:.3} s: {:.0} RPC/s, requests {:.3} Gbit/s, responses {:.3} Gbit/s",
            h.len(),
            secs,
            h.len() as f64 / secs,
            gbps(h.len() * args.size as u64, secs),
            gbps(r.bytes_back, secs)
        );
    }
    if let Some(e) = r.first_error {
        anyhow::bail!(
            "{} of {} RPCs failed; first error: {e}",
            r.failed,
            args.count
        );
    }
    anyhow::ensure!(
        r.bad_echo == 0,
        "{} echoed responses differ from their request",
        r.bad_echo
    );
    Ok(())
}
