//! `homa echo-bench`: the options of `homa_bench::echo` (round-trip latency
//! on loopback per transport and message size), and its table or JSON.

use crate::opts::{parse_sizes, HomaOpts};
use clap::Args;
use homa_bench::echo::{self, EchoBench};
use homa_bench::machine::MachineLoad;
use homa_bench::stats::{print_latency_table, to_json};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct EchoBenchArgs {
    /// Message sizes in bytes, comma-separated (k and m suffixes allowed).
    #[arg(long, default_value = "100,1000,10000,100000")]
    pub sizes: String,
    /// Round trips measured per size for messages up to 64 KB; larger sizes
    /// run proportionally fewer (at least 100) so that each size moves about
    /// the same number of bytes.
    #[arg(long, default_value_t = 20_000)]
    pub iters: u64,
    /// Transports to measure, comma-separated: homa, udp, tcp (blocking,
    /// busy-poll then block), homa-async, tokio-udp, tokio-tcp (tasks on one
    /// multi-thread tokio runtime with the default worker count).
    #[arg(long, default_value = "homa,udp,tcp", value_delimiter = ',')]
    pub transports: Vec<String>,
    /// The transports take turns in this many rounds (each measuring its
    /// share of the round trips after its own warm-up), so that a change in
    /// the machine's speed during a run, common on shared machines, affects
    /// them alike and the same-run ratios stay comparable. One round with
    /// --timetrace.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub rounds: u64,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Record a time trace of Homa's fast path during the measured round
    /// trips and print the mean time of each step (to stderr).
    #[arg(long)]
    pub timetrace: bool,
    /// With --timetrace: trace points wait for earlier instructions to finish
    /// before reading the clock (lfence), so that a cache miss is billed to
    /// the step where it happens instead of a later one; costs ~10-20 ns more
    /// per trace point.
    #[arg(long, requires = "timetrace")]
    pub serialized: bool,
    /// With --timetrace: record only these events (comma-separated, e.g.
    /// "recvmmsg got,sendmmsg start,response returned"); fewer trace points
    /// disturb the path less.
    #[arg(long, requires = "timetrace", value_delimiter = ',')]
    pub timetrace_events: Option<Vec<String>>,
    /// With --timetrace: also write every recorded event to this file
    /// (CLOCK_MONOTONIC ns, host, thread, event; tab-separated, as
    /// `homa::timetrace::dump` writes and `parse_dump` reads).
    #[arg(long, requires = "timetrace")]
    pub timetrace_dump: Option<std::path::PathBuf>,
    /// How the Homa echo server takes requests: `serve` (the handler runs in
    /// the server thread's own receive pass, `Endpoint::serve`) or `queue`
    /// (`Endpoint::recv_request`, then `reply`).
    #[arg(long, default_value = "serve", value_parser = ["serve", "queue"])]
    pub homa_server: String,
    #[command(flatten)]
    pub homa: HomaOpts,
}

impl EchoBenchArgs {
    fn spec(&self) -> anyhow::Result<EchoBench> {
        Ok(EchoBench {
            sizes: parse_sizes(&self.sizes)?,
            iters: self.iters,
            rounds: self.rounds,
            poll: Duration::from_micros(self.homa.poll_us),
            homa: self.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?,
            serve_inline: self.homa_server == "serve",
            timetrace: self.timetrace,
            serialized: self.serialized,
            timetrace_events: self.timetrace_events.clone(),
            timetrace_dump: self.timetrace_dump.clone(),
            progress: !self.json,
            ..EchoBench::new(self.transports.clone())
        })
    }
}

pub fn run(args: EchoBenchArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    MachineLoad::sample(Duration::from_millis(200)).report("echo-bench");
    let rows = echo::measure(&spec)?;
    if args.json {
        println!("{}", to_json(rows));
    } else {
        print_latency_table(&rows);
        echo::print_ratios(&rows);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: EchoBenchArgs,
    }

    #[test]
    fn options_become_the_spec() {
        let cli = Cli::parse_from([
            "x",
            "--sizes",
            "100,1k",
            "--transports",
            "homa-async,tokio-tcp",
            "--poll-us",
            "7",
            "--homa-server",
            "queue",
        ]);
        let spec = cli.args.spec().unwrap();
        assert_eq!(spec.sizes, [100, 1000]);
        assert_eq!(spec.transports, ["homa-async", "tokio-tcp"]);
        assert_eq!(spec.poll, Duration::from_micros(7));
        assert_eq!(spec.homa.poll, Duration::from_micros(7));
        assert!(!spec.serve_inline);
        assert_eq!(spec.homa.engine.link_bps, 100_000_000_000);
    }
}
