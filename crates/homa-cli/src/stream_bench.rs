//! `homa stream-bench`: the options of `homa_bench::stream` (one Homa
//! stream against one TCP connection and one Homa RPC per chunk, issue
//! #21) and its table or JSON.

use crate::opts::{parse_sizes, HomaOpts};
use clap::Args;
use homa_bench::machine::MachineLoad;
use homa_bench::stream::{self, StreamBench};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct StreamBenchArgs {
    /// Chunk sizes in bytes, comma-separated (k and m suffixes allowed).
    #[arg(long, default_value = "100,1k,64k,1m")]
    pub chunks: String,
    /// Bytes per transfer (each transport, each chunk size).
    #[arg(long, default_value = "1g")]
    pub transfer: String,
    /// At most this many chunks per transfer (small chunks move fewer bytes).
    #[arg(long, default_value_t = 200_000)]
    pub max_chunks: u64,
    /// Echoes of one chunk per chunk size (fewer for 64 KB and 1 MB).
    #[arg(long, default_value_t = 5_000)]
    pub latency_iters: u64,
    /// Sizes echoed as they arrive, comma-separated.
    #[arg(long, default_value = "100k,500k")]
    pub echo_sizes: String,
    /// Echoes per echo size.
    #[arg(long, default_value_t = 2_000)]
    pub echo_iters: u64,
    /// RPCs in flight for `homa-rpc` transfers.
    #[arg(long, default_value_t = 16)]
    pub rpc_window: usize,
    /// Idle streams opened to measure memory per stream (0: skip).
    #[arg(long, default_value_t = 10_000)]
    pub idle_streams: usize,
    /// 100 B RPCs timed alone and beside a saturating stream (0: skip).
    #[arg(long, default_value_t = 5_000)]
    pub beside_iters: u64,
    /// Measurements (transfers, chunk echoes, echoes as they arrive) take
    /// turns between the transports in this many rounds, so that a change in
    /// the machine's speed during the run affects them alike.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Transports, comma-separated: homa-stream, tcp, homa-rpc.
    #[arg(
        long,
        default_value = "homa-stream,tcp,homa-rpc",
        value_delimiter = ','
    )]
    pub transports: Vec<String>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

impl StreamBenchArgs {
    fn spec(&self) -> anyhow::Result<StreamBench> {
        let transfer = parse_sizes(&self.transfer)?;
        anyhow::ensure!(transfer.len() == 1, "--transfer takes one size");
        for t in &self.transports {
            anyhow::ensure!(
                ["homa-stream", "tcp", "homa-rpc"].contains(&t.as_str()),
                "unknown transport {t} (homa-stream, tcp, homa-rpc)"
            );
        }
        Ok(StreamBench {
            chunks: parse_sizes(&self.chunks)?,
            transfer_bytes: transfer[0] as u64,
            max_chunks: self.max_chunks.max(1),
            latency_iters: self.latency_iters.max(10),
            echo_sizes: parse_sizes(&self.echo_sizes)?,
            echo_iters: self.echo_iters.max(10),
            rpc_window: self.rpc_window.max(1),
            transports: self.transports.clone(),
            idle_streams: self.idle_streams,
            beside_iters: self.beside_iters,
            rounds: self.rounds,
            homa: self.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?,
            poll: Duration::from_micros(self.homa.poll_us),
            progress: !self.json,
        })
    }
}

pub fn run(args: StreamBenchArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    MachineLoad::sample(Duration::from_millis(200)).report("stream-bench");
    let report = stream::measure(&spec)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{:<12} {:<9} {:>9} {:>9} {:>12} {:>9} {:>9}",
            "transport", "mode", "chunk", "gbps", "chunks/s", "p50 us", "p99 us"
        );
        for r in &report.rows {
            println!(
                "{:<12} {:<9} {:>9} {:>9} {:>12} {:>9.2} {:>9.2}",
                r.transport,
                r.mode,
                r.chunk_bytes,
                r.gbps.map_or("-".into(), |g| format!("{g:.3}")),
                r.chunks_per_sec.map_or("-".into(), |c| format!("{c:.0}")),
                r.p50_us,
                r.p99_us
            );
        }
        stream::print_ratios(&report);
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
        args: StreamBenchArgs,
    }

    #[test]
    fn options_become_the_spec() {
        let cli = Cli::parse_from(["x", "--chunks", "100,64k", "--transfer", "10m"]);
        let spec = cli.args.spec().unwrap();
        assert_eq!(spec.chunks, [100, 64_000]);
        assert_eq!(spec.transfer_bytes, 10_000_000);
        let bad = Cli::parse_from(["x", "--transports", "udp"]);
        assert!(bad.args.spec().is_err());
    }

    /// A small run of every part, end to end on loopback.
    #[test]
    fn a_small_run_measures_every_row() {
        let cli = Cli::parse_from([
            "x",
            "--chunks",
            "1k,64k",
            "--transfer",
            "2m",
            "--latency-iters",
            "40",
            "--echo-sizes",
            "100k",
            "--echo-iters",
            "20",
            "--idle-streams",
            "200",
        ]);
        let spec = cli.args.spec().unwrap();
        let r = stream::measure(&StreamBench {
            progress: false,
            ..spec
        })
        .unwrap();
        assert_eq!(r.rows.len(), 3 * 2 + 3);
        assert!(r.rows.iter().all(|x| x.p50_us > 0.0));
        assert!(r.idle_streams.is_some());
        assert!(r.rpcs_beside_stream.is_some());
    }
}
