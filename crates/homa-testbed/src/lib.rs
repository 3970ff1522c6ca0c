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
//! * The node programs it runs on every host (bench servers and open-loop
//!   clients over Homa or TCP) are `homa_bench::node`'s.
//! * [`cluster`]: the whole experiment on a testbed; [`report`] its output.
//! * [`coexist`]: Homa's workload next to bulk TCP flows ([`bulk`]) that
//!   share its receivers' downlinks (issue #20's coexistence experiment).
//! * [`onramp`]: repeated incasts over background traffic through shallow
//!   switch queues, On-Ramp on or off (issue #22's testbed experiment).
//!
//! Everything here needs root (namespaces, tc); [`cmd::require_root`] gives
//! a clear error otherwise.

pub mod beside;
pub mod bulk;
pub mod cluster;
pub mod cmd;
pub mod coexist;
pub mod cpu;
pub mod netns;
pub mod onramp;
pub mod progress;
pub mod report;
pub mod tc;
pub mod testbed;

pub use testbed::{Testbed, TestbedConfig, TestbedGuard};

/// Default emulated link rate (Gbit/s). Chosen so that the links, not the
/// two CPU cores of the machine all hosts share, limit the cluster at 80%
/// load with W4 and W5 (docs/evaluation.md: the benchmark then uses under
/// half of the two cores).
pub const DEFAULT_GBPS: f64 = 0.1;

/// RPCs per second, over all hosts, that the benchmark can carry on two
/// cores with room to spare (measured: W3 at 0.04 Gbit/s, ~3,300 RPCs/s,
/// takes 31% of the machine; at 0.1 Gbit/s, ~8,200 RPCs/s, it saturates it).
pub const RPC_BUDGET: f64 = 3_000.0;

/// The default link rate for a workload: [`DEFAULT_GBPS`], or less when the
/// workload's messages are so small that the RPC rate at that link rate would
/// make the CPU the bottleneck (W1-W3).
pub fn default_gbps(w: &homa_workload::workload::Workload, load: f64, hosts: usize) -> f64 {
    // Each host offers load x G of request + response payload.
    let g = RPC_BUDGET * 2.0 * w.mean() * 8.0 / (load.max(0.01) * hosts.max(1) as f64) / 1e9;
    (g.clamp(0.001, DEFAULT_GBPS) * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use homa_workload::workload::Workload;

    /// The failures a node program shares are the node's error, wrapped,
    /// and read as they did when the testbed repeated them.
    #[test]
    fn shared_failures_are_the_node_error() {
        use homa_bench::node::Error as Node;
        let e = Error::config("no hosts");
        assert!(matches!(&e, Error::Node(Node::Config(m)) if m == "no hosts"));
        assert_eq!(e.to_string(), "invalid configuration: no hosts");
        assert_eq!(Error::bench("stuck").to_string(), "benchmark: stuck");
        let io = Error::from(std::io::Error::other("gone"));
        assert!(matches!(io, Error::Node(Node::Io(_))));
        assert_eq!(io.to_string(), "I/O: gone");
        let node = || -> Result<()> { Err(Node::Bench("x".into()))? };
        assert_eq!(node().unwrap_err().to_string(), "benchmark: x");
    }

    #[test]
    fn default_rate_shrinks_for_small_messages() {
        let w = |n| Workload::builtin(n).unwrap().capped(1_000_000);
        assert_eq!(default_gbps(&w("w4"), 0.8, 4), DEFAULT_GBPS);
        assert_eq!(default_gbps(&w("w5"), 0.8, 4), DEFAULT_GBPS);
        let w3 = default_gbps(&w("w3"), 0.8, 4);
        assert!((0.03..0.05).contains(&w3), "{w3}");
        assert!(default_gbps(&w("w1"), 0.8, 4) < 0.005);
    }
}

/// Why a testbed or benchmark operation failed: the testbed's own failures
/// (root, commands, namespaces, parsing their output), or a node program's
/// ([`homa_bench::node::Error`]: configuration, benchmark, I/O, homa), which
/// is wrapped rather than repeated.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this needs root (network namespaces, bridges and tc qdiscs require CAP_NET_ADMIN); run it with sudo or as root")]
    NotRoot,
    #[error("{0}")]
    Command(String),
    #[error("network namespace: {0}")]
    Netns(String),
    #[error("cannot parse: {0}")]
    Parse(String),
    #[error(transparent)]
    Node(#[from] homa_bench::node::Error),
}

impl Error {
    /// An invalid configuration ([`homa_bench::node::Error::Config`]).
    pub fn config(msg: impl Into<String>) -> Error {
        Error::Node(homa_bench::node::Error::Config(msg.into()))
    }

    /// A benchmark that failed ([`homa_bench::node::Error::Bench`]).
    pub fn bench(msg: impl Into<String>) -> Error {
        Error::Node(homa_bench::node::Error::Bench(msg.into()))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Node(e.into())
    }
}

impl From<homa::Error> for Error {
    fn from(e: homa::Error) -> Error {
        Error::Node(e.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
