//! # homa-testbed
//!
//! A cluster on one machine: network namespaces as hosts, a Linux bridge as
//! the switch, and HTB trees on the bridge ports that shape each link and
//! emulate a switch's strict priority queues. On it, the cluster benchmark
//! of the Homa paper (echo RPCs to random servers, sizes from a workload,
//! Poisson arrivals at a target load) compares Homa with TCP and writes a
//! report (JSON, HTML, SVG).
//!
//! * [`testbed`]: `up` / `down` / `status` of the emulated network.
//! * [`tc`]: the priority-queue tree and its counters.
//! * [`bench`]: the cp_node equivalent: bench servers and open-loop
//!   clients over Homa or TCP, in whatever namespace the thread is in.
//! * [`cluster`]: the whole experiment on a testbed; [`report`] its output.
//!
//! Everything here needs root (namespaces, tc); [`cmd::require_root`] gives
//! a clear error otherwise.

pub mod bench;
pub mod cluster;
pub mod cmd;
pub mod cpu;
pub mod netns;
pub mod progress;
pub mod report;
pub mod tc;
pub mod testbed;

/// The simulator crate, whose workloads, statistics and plots the benchmark
/// uses (re-exported so that the CLI needs no second dependency).
pub use homa_sim;
pub use testbed::{Testbed, TestbedConfig, TestbedGuard};

/// Default emulated link rate (Gbit/s). Chosen so that the links, not the
/// two CPU cores of the machine all hosts share, limit the cluster at 80%
/// load (see docs/evaluation.md for the CPU headroom measured there).
pub const DEFAULT_GBPS: f64 = 0.1;

/// Why a testbed or benchmark operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this needs root (network namespaces, bridges and tc qdiscs require CAP_NET_ADMIN); run it with sudo or as root")]
    NotRoot,
    #[error("{0}")]
    Command(String),
    #[error("network namespace: {0}")]
    Netns(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot parse: {0}")]
    Parse(String),
    #[error("benchmark: {0}")]
    Bench(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("homa: {0}")]
    Homa(#[from] homa::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
