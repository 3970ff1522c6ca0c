//! `homa throughput-bench`: the options of `homa_bench::throughput` (large
//! messages on loopback: Homa vs one TCP connection vs a raw UDP GSO blast),
//! and its table or JSON.

use crate::opts::{parse_size, HomaOpts};
use clap::Args;
use homa_bench::stats::{print_throughput_table, to_json};
use homa_bench::throughput::{self, ThroughputBench};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ThroughputBenchArgs {
    /// Message size in bytes (k and m suffixes allowed).
    #[arg(long, default_value = "500000", value_parser = parse_size)]
    pub size: usize,
    /// Seconds to run each transport.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// The transports take turns in this many rounds of `seconds / rounds`
    /// each (a new connection or endpoint pair every round), so that the
    /// machine's drift during a run, and loopback TCP's run-to-run swings,
    /// are shared alike; rates are total bytes over total time.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Messages in flight at once (unanswered), for both transports.
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Size of the reply to each message.
    #[arg(long, default_value_t = 8)]
    pub reply_size: usize,
    /// Transports to measure, comma-separated: homa, tcp, udp-gso (a raw
    /// one-way UDP GSO/GRO blast with no protocol: the ceiling for anything
    /// built on UDP sockets here).
    #[arg(long, default_value = "homa,tcp,udp-gso", value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Send each Homa message from reusable send buffers laid out as
    /// packets, one per message in flight (headers written in place, never
    /// copied), instead of from one `Bytes` for every message, as TCP's
    /// sender writes from one buffer (the default: payloads of 4 KB or
    /// more per packet go to the kernel from it, shorter ones are copied
    /// next to their headers).
    #[arg(long)]
    pub send_bufs: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: ThroughputBenchArgs) -> anyhow::Result<()> {
    let spec = ThroughputBench {
        size: args.size,
        seconds: args.seconds,
        rounds: args.rounds,
        window: args.window,
        reply_size: args.reply_size,
        transports: args.transports.clone(),
        send_bufs: args.send_bufs,
        // The largest UDP payload that fits the MTU (IPv4 + UDP headers: 28
        // bytes), as Homa's packets; by default Homa's own packet size.
        segment: args.homa.mtu.map(|m| m.saturating_sub(28)),
        poll: Duration::from_micros(args.homa.poll_us),
        homa: args.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?,
        report_counters: !args.json,
    };
    let rows = throughput::run(&spec)?;
    if args.json {
        println!("{}", to_json(rows));
    } else {
        print_throughput_table(&rows);
        throughput::print_ratios(&rows);
    }
    Ok(())
}
