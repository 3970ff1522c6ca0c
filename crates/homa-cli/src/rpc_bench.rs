//! `homa rpc-bench`: the options of `homa_bench::rpc` (the homa-rpc
//! framework against a raw `Endpoint` echo, and nested fan-out, issue
//! #23) and its table or JSON.

use crate::opts::{parse_sizes, HomaOpts};
use clap::Args;
use homa_bench::machine::MachineLoad;
use homa_bench::rpc::{self, RpcBench};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct RpcBenchArgs {
    /// Message sizes in bytes, comma-separated (k suffix allowed).
    #[arg(long, default_value = "100,1k")]
    pub sizes: String,
    /// Round trips per transport and size.
    #[arg(long, default_value_t = 4_000)]
    pub iters: u64,
    /// Measurements take turns between the transports in this many rounds.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Nested calls per outer call of the fan-out rows, comma-separated
    /// (empty: skip).
    #[arg(long, default_value = "1,3", value_delimiter = ',')]
    pub fanout: Vec<u32>,
    /// Modes of the fan-out handler, comma-separated: inline (in the
    /// receive pass), pool (worker thread), task (tokio).
    #[arg(long, default_value = "inline,pool,task", value_delimiter = ',')]
    pub fanout_modes: Vec<String>,
    /// Outer calls per fan-out width and mode.
    #[arg(long, default_value_t = 2_000)]
    pub fanout_iters: u64,
    /// Backend servers the nested calls go to, round robin (each on its
    /// own serving thread).
    #[arg(long, default_value_t = 1)]
    pub backends: usize,
    /// Also measure `homa-raw-copy`: a raw echo that writes request and
    /// response into fresh buffers behind header-sized gaps, as the
    /// framework does, without its other steps.
    #[arg(long)]
    pub copy_baseline: bool,
    /// Leave out the floor: the fan-out patterns over raw UDP between
    /// threads, no transport (what this machine allows them).
    #[arg(long)]
    pub no_floor: bool,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Instead of the table: trace one null call (the first size,
    /// `inline`) and one outer call with one nested call (unless
    /// `--fanout` is empty) and print each one's median steps across
    /// client, network and server (time trace), beside the measured
    /// round trip.
    #[arg(long)]
    pub breakdown: bool,
    /// Traced calls per `--breakdown` case (each thread's trace ring
    /// holds 65,536 events, ~15-20 per call and thread).
    #[arg(long, default_value_t = 2_000)]
    pub breakdown_iters: u64,
    /// With `--breakdown`: also print every event of the median RPC.
    #[arg(long)]
    pub events: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

impl RpcBenchArgs {
    fn spec(&self) -> anyhow::Result<RpcBench> {
        for m in &self.fanout_modes {
            anyhow::ensure!(
                ["inline", "pool", "task"].contains(&m.as_str()),
                "unknown fan-out mode {m} (inline, pool, task)"
            );
        }
        Ok(RpcBench {
            sizes: parse_sizes(&self.sizes)?,
            iters: self.iters.max(10),
            rounds: self.rounds,
            fanout: self.fanout.clone(),
            fanout_modes: self.fanout_modes.clone(),
            fanout_iters: self.fanout_iters.max(10),
            backends: self.backends.max(1),
            homa: self.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?,
            copy_baseline: self.copy_baseline,
            floor: !self.no_floor,
            progress: !self.json,
        })
    }
}

pub fn run(args: RpcBenchArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    MachineLoad::sample(Duration::from_millis(200)).report("rpc-bench");
    if args.breakdown {
        let n = args.breakdown_iters.clamp(10, 3_000);
        let nested = (!spec.fanout.is_empty()).then_some(n);
        let r = rpc::measure_breakdown(&spec.homa, spec.sizes[0], n, nested)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            rpc::print_breakdown(&r, args.events);
        }
        return Ok(());
    }
    let report = rpc::measure(&spec)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{:<13} {:>8} {:>9} {:>9}",
        "transport", "size", "p50 us", "p99 us"
    );
    for r in &report.rows {
        println!(
            "{:<13} {:>8} {:>9.2} {:>9.2}",
            r.transport, r.size, r.p50_us, r.p99_us
        );
    }
    for f in &report.fanout {
        println!(
            "fan-out {:<6} {:>2} nested: outer call p50 {:.2} us, p99 {:.2} us",
            f.mode, f.nested, f.p50_us, f.p99_us
        );
    }
    rpc::print_ratios(&report);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RpcBenchArgs,
    }

    #[test]
    fn options_become_the_spec() {
        let cli = Cli::parse_from(["x", "--sizes", "100,1k", "--fanout", "1,2,3"]);
        let spec = cli.args.spec().unwrap();
        assert_eq!(spec.sizes, [100, 1000]);
        assert_eq!(spec.fanout, [1, 2, 3]);
        assert_eq!(spec.rounds, 4);
        let cli = Cli::parse_from(["x", "--breakdown", "--breakdown-iters", "50", "--events"]);
        assert!(cli.args.breakdown && cli.args.events);
        assert_eq!(cli.args.breakdown_iters, 50);
        let bad = Cli::parse_from(["x", "--fanout-modes", "threads"]);
        assert!(bad.args.spec().is_err());
    }
}
