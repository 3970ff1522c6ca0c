//! The `homa` command. Each subcommand's options live in their own module,
//! which maps them to calls of the library crates (homa-bench, homa-sim,
//! homa-testbed) and prints the result; this file only parses the command
//! line and dispatches.

#![forbid(unsafe_code)]

mod beside_bench;
mod client;
mod cluster_bench;
mod coexist_bench;
mod echo_bench;
mod grpc_bench;
mod kv_bench;
mod onramp_bench;
mod opts;
mod rate_bench;
mod rpc_bench;
mod server;
mod sim;
mod sim_experiment;
mod stream_bench;
mod testbed;
mod throughput_bench;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "homa",
    version,
    about = "Homa transport: benchmarks, simulator and tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an echo server node: Homa, Homa without priorities, or TCP.
    Server(server::ServerArgs),
    /// Closed-loop Homa client: fixed-size echo RPCs, latency and throughput.
    Client(client::ClientArgs),
    /// Loopback round-trip latency per message size: Homa vs raw UDP vs TCP, and async (tokio) transports.
    EchoBench(echo_bench::EchoBenchArgs),
    /// One Homa stream against one TCP connection and one Homa RPC per
    /// chunk (issue #21): throughput, chunk latency, echo as it arrives,
    /// memory per idle stream, short RPCs beside a saturating stream.
    StreamBench(stream_bench::StreamBenchArgs),
    /// tonic (gRPC) over its own HTTP/2-over-TCP transport vs over Homa, unary calls (issue #23).
    GrpcBench(grpc_bench::GrpcBenchArgs),
    /// Small RPCs per second against a server with M threads: Homa vs raw UDP vs TCP.
    RateBench(rate_bench::RateBenchArgs),
    /// The homa-rpc framework against a raw Endpoint echo, and nested fan-out (issue #23).
    RpcBench(rpc_bench::RpcBenchArgs),
    /// Loopback throughput of large messages: Homa vs one TCP connection.
    ThroughputBench(throughput_bench::ThroughputBenchArgs),
    /// The emulated cluster: network namespaces, a bridge, priority queues (root).
    Testbed(testbed::TestbedArgs),
    /// The cluster benchmark: an open-loop client node, and the whole Homa-vs-TCP experiment on the testbed.
    Bench(cluster_bench::BenchArgs),
    /// The replicated key-value store (issue #24): coordinator, master and
    /// backup processes, a local cluster (`up`), and a client (`cli`).
    Kv {
        #[command(subcommand)]
        command: homa_kv::cli::KvCommand,
    },
    /// homa-kv reads and writes against a raw Homa echo and Redis GET and
    /// SET+WAIT, in one run (issue #24).
    KvBench(kv_bench::KvBenchArgs),
    /// Packet-level datacenter simulation of Homa (paper topology, workloads W1-W5, sweeps).
    Sim(Box<sim::SimArgs>),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Server(args) => server::run(args),
        Command::Client(args) => client::run(args),
        Command::EchoBench(args) => echo_bench::run(args),
        Command::StreamBench(args) => stream_bench::run(args),
        Command::GrpcBench(args) => grpc_bench::run(args),
        Command::RateBench(args) => rate_bench::run(args),
        Command::RpcBench(args) => rpc_bench::run(args),
        Command::ThroughputBench(args) => throughput_bench::run(args),
        Command::Testbed(args) => testbed::run(args),
        Command::Bench(args) => cluster_bench::run(args),
        Command::Sim(args) => sim::run(*args),
        Command::Kv { command } => homa_kv::cli::run(command),
        Command::KvBench(args) => kv_bench::run(args),
    }
}
