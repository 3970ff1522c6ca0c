//! # homa-bench
//!
//! The benchmark stack: every program the benchmarks run on a node and the
//! numbers they report. The `homa` command is its front end (command-line
//! options in, these functions called, rows printed); nothing here parses a
//! command line.
//!
//! * [`payload`]: [`payload::Payloads`], the bytes of every request.
//! * [`wait`], [`epoll`]: waiting on sockets (busy-poll then `poll(2)`;
//!   `nix`'s epoll, with a timerfd for sub-millisecond wake-ups, for the TCP
//!   event loops).
//! * [`stats`]: latency histograms (hdrhistogram), rows, tables, `--json`.
//! * [`baseline`]: raw UDP and TCP ping-pongs, a TCP stream, a UDP GSO blast.
//! * [`closed`]: the closed-loop Homa client (`homa client`, `rate-bench`).
//! * [`echo`]: `echo-bench`, round-trip latency per size and transport;
//!   [`async_echo`] its tokio transports.
//! * [`rate`]: `rate-bench`, small RPCs per second against a server with M
//!   threads, for Homa, a raw UDP and a TCP epoll echo server.
//! * [`rpc`]: `rpc-bench`, the homa-rpc framework against the raw API
//!   (a null method vs a raw echo, and nested fan-out).
//! * [`node`]: the cluster benchmark's node programs (the Linux module's
//!   cp_node): echo servers and open-loop clients over Homa or TCP, and the
//!   unloaded-RTT probe.
//! * [`throughput`]: `throughput-bench`, large messages: Homa, one TCP
//!   connection, a raw UDP GSO blast.
//! * [`floor`]: what the machine allows a nested-call pattern (fan-out,
//!   replicated write) over raw UDP between threads, no transport at all.
//! * [`machine`]: the load average and whether other processes hold the CPUs.

pub mod async_echo;
pub mod baseline;
pub mod closed;
pub mod echo;
pub mod epoll;
pub mod floor;
pub mod machine;
pub mod node;
pub mod payload;
pub mod rate;
pub mod rpc;
pub mod rpc_breakdown;
pub mod stats;
pub mod stream;
pub mod throughput;
pub mod wait;

/// Default link rate for endpoints on a real network (Gbit/s).
pub const NETWORK_GBPS: f64 = 25.0;
/// Default link rate for the loopback benchmarks (Gbit/s): loopback moves
/// data at memory speed (one TCP connection reaches 40-80 Gbit/s here), so
/// pacing to a 25 Gbit/s NIC model would measure the model, not the stack.
pub const LOOPBACK_GBPS: f64 = 100.0;

/// The default endpoint configuration, pacing to [`LOOPBACK_GBPS`].
pub fn loopback_config() -> homa::EndpointConfig {
    let mut c = homa::EndpointConfig::default();
    c.engine.link_bps = (LOOPBACK_GBPS * 1e9) as u64;
    c
}
