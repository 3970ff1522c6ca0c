//! `homa bench client|cluster`: the cluster benchmark (the Linux module's
//! cp_node and its TCP comparison). `client` runs one open-loop client node
//! anywhere (e.g. under `ip netns exec` on a testbed host) against
//! `homa server` nodes; `cluster` runs the whole experiment on the emulated
//! testbed and writes the report.

use crate::testbed::UpArgs;
use clap::{Args, Subcommand};
use homa_bench::node::{self as bench, ClientSpec, Transport};
use homa_bench::payload::Payloads;
use homa_bench::stats::latency_by_size_decile;
use homa_testbed::cluster::{self, ClusterConfig};
use homa_workload::workload::Workload;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Open-loop client node: echo RPCs to random servers at a target rate
    /// (the servers: `homa server --transport homa|homa-noprio|tcp`).
    Client(OpenLoopArgs),
    /// The whole experiment on the emulated testbed, with a report.
    Cluster(ClusterArgs),
    /// Homa's workload next to bulk TCP flows sharing its receivers'
    /// downlinks: static vs adaptive windows, shared vs split classes.
    Coexist(Box<crate::coexist_bench::CoexistArgs>),
    /// Issue #22's On-Ramp experiment: repeated incasts over background
    /// traffic through shallow switch queues, On-Ramp on or off.
    Onramp(Box<crate::onramp_bench::OnRampArgs>),
    /// Issue #21's short RPCs beside a saturating stream, with a shaped
    /// link (not the CPU) as the bottleneck; TCP's echoes beside a bulk
    /// flow the same way.
    Beside(crate::beside_bench::BesideArgs),
}

/// Options shared by the node commands that open Homa endpoints.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Link rate the Homa engine paces to, Gbit/s.
    #[arg(long, default_value_t = homa_testbed::DEFAULT_GBPS)]
    pub link_gbps: f64,
    /// The Homa engine's RTT estimate, µs.
    #[arg(long, default_value_t = 250)]
    pub rtt_us: u64,
    /// Homa busy-poll time before a waiting thread sleeps, µs.
    #[arg(long, default_value_t = 0)]
    pub poll_us: u64,
}

impl EngineArgs {
    fn config(&self, workload: &Workload) -> homa::EndpointConfig {
        let mut c = homa::Endpoint::builder()
            .poll(Duration::from_micros(self.poll_us))
            .build();
        // The same derivation as `homa bench cluster` (the engine's).
        c.engine
            .apply_network(&self.network(workload, c.engine.max_message_length));
        c
    }

    /// What the engine is told about the network and the workload.
    fn network(&self, workload: &Workload, max_message: u32) -> homa::NetworkProfile {
        homa::NetworkProfile {
            link_bps: (self.link_gbps * 1e9) as u64,
            rtt_ns: self.rtt_us * 1000,
            max_message_length: max_message.max(workload.max_len()),
            message_sizes: Some(workload.message_sizes()),
            // A user-space thread on a shared machine, as in the testbed.
            nic_queue_packets: 2,
            ..homa::NetworkProfile::default()
        }
    }
}

/// Workload options.
#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Message lengths: w1..w5, fixed:BYTES, or a CSV file of length,weight.
    #[arg(long, default_value = "w4")]
    pub workload: String,
    /// Lengths above this are cut to it (the Linux benchmarks use 1 MB).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_message: u32,
}

impl WorkloadArgs {
    fn workload(&self) -> anyhow::Result<Workload> {
        let w = Workload::parse(&self.workload)?;
        Ok(if w.max_len() > self.max_message {
            w.capped(self.max_message)
        } else {
            w
        })
    }
}

#[derive(Args, Debug)]
pub struct OpenLoopArgs {
    /// homa, homa-noprio or tcp.
    #[arg(long, default_value = "homa")]
    pub transport: Transport,
    /// Server hosts, comma-separated IP addresses.
    #[arg(long, value_delimiter = ',', required = true)]
    pub servers: Vec<IpAddr>,
    /// First server port.
    #[arg(long, default_value_t = 4000)]
    pub server_port: u16,
    /// Ports per server (PORT..PORT+N-1).
    #[arg(long, default_value_t = 1)]
    pub server_ports: usize,
    /// Address the client's sockets bind to.
    #[arg(long, default_value = "0.0.0.0")]
    pub ip: IpAddr,
    /// Target request + response payload rate of this node, Gbit/s.
    #[arg(long, default_value_t = 0.05)]
    pub gbps: f64,
    /// Cap on RPCs outstanding per client port.
    #[arg(long, default_value_t = 200)]
    pub max_outstanding: usize,
    /// Client threads (sockets).
    #[arg(long, default_value_t = 1)]
    pub ports: usize,
    /// TCP connections per server per client port opened at start...
    #[arg(long, default_value_t = 4)]
    pub tcp_conns: usize,
    /// ...and at most this many (more are opened while all are busy).
    #[arg(long, default_value_t = 64)]
    pub tcp_max_conns: usize,
    /// Recorded seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write every recorded RPC as `size,rtt_ns` lines to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub testbed: UpArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Target load, a fraction of the link rate.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Transports to compare, in order: homa, tcp, homa-noprio.
    #[arg(long, default_value = "homa,tcp,homa-noprio")]
    pub transports: String,
    /// Recorded seconds per transport.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Unrecorded warm-up per transport, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// TCP client sockets (threads) per host (Homa uses the host's one endpoint).
    #[arg(long, default_value_t = 1)]
    pub client_ports: usize,
    /// TCP server ports per host (Homa uses the host's one endpoint).
    #[arg(long, default_value_t = 2)]
    pub server_ports: usize,
    /// Threads per Homa server port.
    #[arg(long, default_value_t = 2)]
    pub server_threads: usize,
    /// Cap on outstanding RPCs per client socket.
    #[arg(long, default_value_t = 200)]
    pub max_outstanding: usize,
    /// TCP connections per server per client socket opened at start...
    #[arg(long, default_value_t = 4)]
    pub tcp_conns: usize,
    /// ...and at most this many (more are opened while all are busy).
    #[arg(long, default_value_t = 64)]
    pub tcp_max_conns: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Homa busy-poll time, µs.
    #[arg(long, default_value_t = 0)]
    pub poll_us: u64,
    /// The Homa engine's RTT estimate, µs (default: measured).
    #[arg(long)]
    pub rtt_us: Option<u64>,
    /// Homa engine parameter overrides, KEY=VALUE (repeatable; the keys of
    /// `homa server --set`, e.g. resend_interval_us=5000).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Leave the testbed up afterwards.
    #[arg(long)]
    pub keep_testbed: bool,
    /// Print the report as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Write index.html, slowdown.svg and report.json into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Client(a) => client(a),
        BenchCommand::Cluster(a) => cluster_cmd(a),
        BenchCommand::Coexist(a) => crate::coexist_bench::run(*a),
        BenchCommand::Onramp(a) => crate::onramp_bench::run(*a),
        BenchCommand::Beside(a) => crate::beside_bench::run(a),
    }
}

fn client(a: OpenLoopArgs) -> anyhow::Result<()> {
    let w = a.workload.workload()?;
    let spec = ClientSpec {
        transport: a.transport,
        ip: a.ip,
        servers: a
            .servers
            .iter()
            .map(|ip| {
                (0..a.server_ports)
                    .map(|k| SocketAddr::new(*ip, a.server_port + k as u16))
                    .collect()
            })
            .collect(),
        payloads: Payloads::new(w.max_len() as usize),
        homa: a.engine.config(&w),
        homa_endpoint: None,
        workload: Arc::new(w),
        gbps: a.gbps,
        max_outstanding: a.max_outstanding,
        ports: a.ports,
        warmup: Duration::from_secs_f64(a.warmup),
        duration: Duration::from_secs_f64(a.seconds),
        drain: Duration::from_secs(3),
        seed: a.seed,
        tcp_conns: a.tcp_conns,
        tcp_max_conns: a.tcp_max_conns,
        progress: None,
    };
    let r = bench::run_client(&spec)?;
    if let Some(path) = &a.output {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(f, "size,rtt_ns")?;
        for s in &r.samples {
            writeln!(f, "{},{}", s.size, s.rtt_ns)?;
        }
    }
    let samples: Vec<(u32, u64)> = r.samples.iter().map(|s| (s.size, s.rtt_ns)).collect();
    let deciles = latency_by_size_decile(&samples);
    if a.json {
        let v = serde_json::json!({
            "transport": a.transport.name(),
            "result": &r,
            "achieved_gbps": r.gbps(),
            "rtt_us_by_decile": &deciles,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{}: {} RPCs recorded, {} completed, {} failed ({} wrong payloads), {} unfinished, {} cap waits; {:.4} Gbit/s",
            a.transport,
            r.samples.len(),
            r.completed,
            r.failed,
            r.mismatches,
            r.unfinished,
            r.cap_waits,
            r.gbps()
        );
        println!(
            "{:>10} {:>7} {:>10} {:>10}",
            "max size", "count", "p50 µs", "p99 µs"
        );
        for g in &deciles {
            println!(
                "{:>10} {:>7} {:>10.1} {:>10.1}",
                g.max_size, g.count, g.p50_us, g.p99_us
            );
        }
        for e in &r.errors {
            println!("error: {e}");
        }
    }
    if r.failed > 0 {
        anyhow::bail!("{} RPCs failed", r.failed);
    }
    Ok(())
}

fn cluster_cmd(a: ClusterArgs) -> anyhow::Result<()> {
    let w = a.workload.workload()?;
    let mut cfg = ClusterConfig::new(w, a.load);
    cfg.testbed = a.testbed.config();
    if a.testbed.gbps.is_none() {
        cfg.testbed.gbps = homa_testbed::default_gbps(&cfg.workload, a.load, cfg.testbed.hosts);
    }
    cfg.transports = Transport::parse_list(&a.transports)?;
    cfg.seconds = a.seconds;
    cfg.warmup = a.warmup;
    cfg.client_ports = a.client_ports;
    cfg.server_ports = a.server_ports;
    cfg.server_threads = a.server_threads;
    cfg.max_outstanding = a.max_outstanding;
    cfg.tcp_conns = a.tcp_conns;
    cfg.tcp_max_conns = a.tcp_max_conns;
    cfg.seed = a.seed;
    cfg.poll_us = a.poll_us;
    cfg.rtt_us = a.rtt_us;
    cfg.keep_testbed = a.keep_testbed;
    cfg.adjust_engine = crate::opts::engine_hook(&a.set)?;
    cfg.progress = !a.quiet;
    let report = cluster::run(&cfg)?;
    if let Some(dir) = &a.report {
        report.write_dir(dir)?;
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.text());
    }
    Ok(())
}
