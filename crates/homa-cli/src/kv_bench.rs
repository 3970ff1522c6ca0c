//! `homa kv-bench`: the options of `homa_kv::bench` (the homa-kv store
//! against a raw Homa echo and Redis, issue #24) and its table or JSON.

use crate::opts::{parse_sizes, HomaOpts};
use clap::Args;
use homa_kv::bench::{self, KvBench};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct KvBenchArgs {
    /// Value sizes in bytes, comma-separated (k suffix allowed).
    #[arg(long, default_value = "100,1k,10k")]
    pub sizes: String,
    /// Timed operations per system, operation and size.
    #[arg(long, default_value_t = 4_000)]
    pub iters: u64,
    /// The systems take turns in this many rounds.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// R: backups per homa-kv write, replicas per Redis WAIT.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Keys read and written at random.
    #[arg(long, default_value_t = 1_000)]
    pub keys: usize,
    /// Longest one row may take, in seconds (it stops early then).
    #[arg(long, default_value_t = 20.0)]
    pub max_row_secs: f64,
    /// The backups' busy-poll time in µs (default: the common --poll-us).
    /// Before the runtime polled politely, 0 helped (docs/kv.md).
    #[arg(long)]
    pub backup_poll_us: Option<u64>,
    /// The master's replication endpoint's busy-poll time in µs (default:
    /// the common --poll-us).
    #[arg(long)]
    pub nested_poll_us: Option<u64>,
    /// The homa-kv client endpoint's busy-poll time in µs (default: the
    /// common --poll-us).
    #[arg(long)]
    pub client_poll_us: Option<u64>,
    /// Extra rows: 100 B homa-kv writes with these numbers of backups,
    /// comma-separated (what each replica adds; 0 = no replication).
    #[arg(long, default_value = "0,1", value_delimiter = ',')]
    pub write_replicas: Vec<usize>,
    /// Also open-loop rows at this many operations per second (Poisson
    /// arrivals, 100 B reads and writes, 4 client threads; latency from
    /// each operation's scheduled start); 0: closed loop only.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Leave Redis out.
    #[arg(long)]
    pub no_redis: bool,
    /// Leave out the floor: the echo and write patterns over raw UDP
    /// between threads, no transport (what this machine allows them).
    #[arg(long)]
    pub no_floor: bool,
    /// Instead of the table: trace one read and one write (the first
    /// size, one backup) and print each one's median steps across client,
    /// network, master and backup (time trace), beside the measured
    /// round trip.
    #[arg(long)]
    pub breakdown: bool,
    /// Traced operations per `--breakdown` case.
    #[arg(long, default_value_t = 2_000)]
    pub breakdown_iters: u64,
    /// With `--breakdown`: also print every event of the median operation.
    #[arg(long)]
    pub events: bool,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: KvBenchArgs) -> anyhow::Result<()> {
    let spec = KvBench {
        sizes: parse_sizes(&args.sizes)?,
        iters: args.iters.max(10),
        rounds: args.rounds,
        replicas: args.replicas.max(1),
        keys: args.keys.max(1),
        max_per_row: Duration::from_secs_f64(args.max_row_secs.clamp(0.1, 600.0)),
        redis: !args.no_redis,
        floor: !args.no_floor,
        rate: args.rate.max(0.0),
        write_replicas: args.write_replicas.clone(),
        homa: args.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?,
        backup_poll: args.backup_poll_us.map(Duration::from_micros),
        nested_poll: args.nested_poll_us.map(Duration::from_micros),
        client_poll: args.client_poll_us.map(Duration::from_micros),
        progress: !args.json,
    };
    if args.breakdown {
        homa_bench::machine::MachineLoad::sample(Duration::from_millis(200)).report("kv-bench");
        let r = bench::measure_breakdown(&spec, args.breakdown_iters.clamp(10, 3_000))?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            bench::print_breakdown(&r, args.events);
        }
        return Ok(());
    }
    let report = bench::measure(&spec)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{:<10} {:<6} {:>8} {:>3} {:>9} {:>9}",
        "system", "op", "bytes", "R", "p50 us", "p99 us"
    );
    for r in &report.rows {
        println!(
            "{:<10} {:<6} {:>8} {:>3} {:>9.2} {:>9.2}",
            r.system, r.op, r.value_bytes, r.replicas, r.p50_us, r.p99_us
        );
    }
    for r in &report.open_loop {
        println!(
            "open loop {:.0}/s: {:<8} {:<6} {:>5} B R={} ({} ops): p50 {:.2} us, p99 {:.2} us",
            r.rate_per_s, r.system, r.op, r.value_bytes, r.replicas, r.ops, r.p50_us, r.p99_us
        );
    }
    for (what, ratio, limit) in bench::goals(&report.rows) {
        let ok = if ratio <= limit { "met" } else { "NOT met" };
        println!("{what}: {ratio:.2} (goal <= {limit}): {ok}");
    }
    for f in &report.floor {
        println!(
            "floor, raw UDP threads ({} nested to {} backends, fastest wait {}): p50 {:.2} us, p99 {:.2} us; ideal schedule {:.2} us",
            f.nested,
            f.backends,
            f.wait.name(),
            f.p50_us,
            f.p99_us,
            f.ideal_us
        );
    }
    if let Some((what, ratio, ideal)) = bench::floor_ratio(&report) {
        println!(
            "{what}: {ratio:.2}, ideal schedule {ideal:.2} (the goal's 2.5 on this machine without any transport)"
        );
    }
    Ok(())
}
