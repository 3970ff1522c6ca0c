//! `homa server`: the options of the echo server node
//! (`homa_bench::node::start_server`): Homa, Homa without priorities, or
//! TCP, on one or more ports, each served by any number of threads.

use crate::opts::HomaOpts;
use clap::Args;
use homa_bench::node::{self, ServerSpec, Transport};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on, e.g. 127.0.0.1:4000 or [::]:4000; with
    /// --ports N, ports PORT..PORT+N-1.
    #[arg(long)]
    pub listen: SocketAddr,
    /// homa, homa-noprio (every packet in the lowest DSCP class) or tcp
    /// (length-prefixed frames on persistent connections).
    #[arg(long, default_value = "homa")]
    pub transport: Transport,
    /// Listening ports, from the one in --listen.
    #[arg(long, default_value_t = 1)]
    pub ports: usize,
    /// Threads receiving and answering requests on each Homa port (TCP: one
    /// event loop per port).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Largest request a TCP connection may carry (larger ones close it).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_message: usize,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Print the Homa endpoint's counters to stderr this often (seconds;
    /// 0 = only at exit).
    #[arg(long, default_value_t = 10.0)]
    pub stats_interval: f64,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    let spec = ServerSpec {
        transport: args.transport,
        ip: args.listen.ip(),
        base_port: args.listen.port(),
        ports: args.ports,
        threads_per_port: args.threads,
        homa: args.homa.config()?,
        max_message: args.max_message,
    };
    let h = node::start_server(&spec)?;
    let addrs: Vec<String> = h.addrs.iter().map(|a| a.to_string()).collect();
    println!(
        "{} server listening on {}",
        args.transport,
        addrs.join(", ")
    );
    let start = Instant::now();
    let mut last_report = Instant::now();
    while !args
        .seconds
        .is_some_and(|s| start.elapsed().as_secs_f64() >= s)
    {
        std::thread::sleep(Duration::from_millis(100));
        if args.stats_interval > 0.0 && last_report.elapsed().as_secs_f64() >= args.stats_interval {
            if let Some(ep) = &h.homa_endpoint {
                report(ep);
            }
            last_report = Instant::now();
        }
    }
    if let Some(ep) = &h.homa_endpoint {
        report(ep);
    }
    let st = h.stop()?;
    println!(
        "served {} requests ({} bytes), {} errors",
        st.requests, st.bytes, st.errors
    );
    Ok(())
}

/// The first port's endpoint counters.
fn report(ep: &homa::Endpoint) {
    let m = ep.metrics();
    let s = ep.socket_stats();
    eprintln!(
        "{}: packets in {} out {}; dropped by engine {} (malformed {}, bad checksum {}); truncated {}",
        ep.local_addr(),
        s.packets_received,
        s.packets_sent,
        m.total_drops(),
        m.drops(homa::DropReason::Malformed),
        m.drops(homa::DropReason::BadChecksum),
        s.truncated
    );
}
