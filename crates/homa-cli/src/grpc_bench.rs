//! `homa grpc-bench`: the options of `homa_tonic::bench` (the same tonic
//! client and server over tonic's HTTP/2-over-TCP transport and over Homa,
//! issue #23) and its table or JSON.

use clap::Args;
#[cfg(feature = "grpc")]
use {
    crate::opts::parse_sizes,
    homa_bench::machine::MachineLoad,
    homa_bench::stats::to_json,
    homa_tonic::bench::{self, GrpcBench, TRANSPORTS},
    std::time::Duration,
};

#[derive(Args, Debug)]
pub struct GrpcBenchArgs {
    /// Payload sizes of the unary echo in bytes, comma-separated (k suffix allowed).
    #[arg(long, default_value = "100,10k")]
    pub sizes: String,
    /// Timed calls per transport and size, over all rounds.
    #[arg(long, default_value_t = 4_000)]
    pub iters: u64,
    /// Untimed calls per transport and size first.
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,
    /// The transports take turns in this many rounds, so that a change in
    /// the machine's speed during the run affects them alike.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Transports, comma-separated: tonic-tcp, tonic-homa, and homa-raw (a
    /// bare Homa echo without tonic, to see what the gRPC layers add).
    #[arg(long, default_value = "tonic-tcp,tonic-homa", value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Busy-poll time (µs) of the Homa endpoints' async waits before a task
    /// yields to tokio's reactor [default: the runtime's, 50].
    #[arg(long)]
    pub async_poll_us: Option<u64>,
    /// Print the rows as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(not(feature = "grpc"))]
pub fn run(_args: GrpcBenchArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "this homa was built without the `grpc` feature (tonic): \
         cargo run --release -p homa-cli --features grpc -- grpc-bench"
    )
}

#[cfg(feature = "grpc")]
impl GrpcBenchArgs {
    fn spec(&self) -> anyhow::Result<GrpcBench> {
        for t in &self.transports {
            anyhow::ensure!(
                TRANSPORTS.contains(&t.as_str()),
                "unknown transport {t} (tonic-tcp, tonic-homa, homa-raw)"
            );
        }
        Ok(GrpcBench {
            sizes: parse_sizes(&self.sizes)?,
            iters: self.iters.max(10),
            warmup: self.warmup,
            rounds: self.rounds,
            transports: self.transports.clone(),
            async_poll: self.async_poll_us.map(Duration::from_micros),
            progress: !self.json,
        })
    }
}

#[cfg(feature = "grpc")]
pub fn run(args: GrpcBenchArgs) -> anyhow::Result<()> {
    let spec = args.spec()?;
    MachineLoad::sample(Duration::from_millis(200)).report("grpc-bench");
    let rows = bench::measure(&spec).map_err(|e| anyhow::anyhow!(e))?;
    if args.json {
        println!("{}", to_json(rows));
        return Ok(());
    }
    println!(
        "{:<11} {:>7} {:>9} {:>9} {:>10}",
        "transport", "size", "p50 us", "p99 us", "rpcs/s"
    );
    for r in &rows {
        println!(
            "{:<11} {:>7} {:>9.1} {:>9.1} {:>10.0}",
            r.transport, r.size, r.p50_us, r.p99_us, r.rpcs_per_sec
        );
    }
    for &size in &spec.sizes {
        let find = |t: &str| rows.iter().find(|r| r.size == size && r.transport == t);
        if let (Some(h), Some(t)) = (find("tonic-homa"), find("tonic-tcp")) {
            println!(
                "{size} B: tonic-homa / tonic-tcp p50 {:.2}x, p99 {:.2}x",
                h.p50_us / t.p50_us,
                h.p99_us / t.p99_us
            );
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "grpc"))]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: GrpcBenchArgs,
    }

    #[test]
    fn options_become_the_spec() {
        let cli = Cli::parse_from(["x", "--sizes", "100,10k", "--iters", "50"]);
        let spec = cli.args.spec().unwrap();
        assert_eq!(spec.sizes, [100, 10_000]);
        assert_eq!(spec.iters, 50);
        let bad = Cli::parse_from(["x", "--transports", "udp"]);
        assert!(bad.args.spec().is_err());
    }

    /// A small run, end to end on loopback: one row per transport and size.
    #[test]
    fn a_small_run_measures_every_row() {
        let cli = Cli::parse_from(["x", "--iters", "40", "--warmup", "5", "--rounds", "2"]);
        let spec = cli.args.spec().unwrap();
        let rows = bench::measure(&GrpcBench {
            progress: false,
            ..spec
        })
        .unwrap();
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.p50_us > 0.0 && r.rpcs_per_sec > 0.0));
    }
}
