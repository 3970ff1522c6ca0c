//! # homa-sim
//!
//! A packet-level simulator of a datacenter network running Homa: the
//! unmodified `homa_proto` engine on every host of a `homa_testnet` network,
//! open-loop traffic from the paper's workloads, and per-size slowdown
//! statistics. The `homa sim` command is its front end; the model, parameters
//! and measured results are in `docs/simulation.md`.
//!
//! * [`topology`]: the paper's network, stars, two-level trees; the analytic
//!   best-case latency and RTT.
//! * [`priorities`]: a workload as the engine's message sizes, for its
//!   unscheduled priority plan (`homa_proto::priorities`).
//! * [`experiment`]: issue #20's experiments (rtt-mix, incast): host
//!   distances, closed-loop clients, drops per port class and priority.
//! * [`onramp`]: issue #22's On-Ramp experiment (repeated incasts over
//!   background traffic, shallow buffers, priorities or not, host clocks).
//! * [`sim`]: one run ([`sim::SimSpec`] in, [`sim::Report`] out).
//! * [`report`]: tables, JSON, SVG, parallel sweeps.
//! * [`steady`]: the steady-state window (warm-up, window, drain) and what
//!   every run reports about its window (carried vs offered load, backlog,
//!   statistics that count unfinished messages).
//!
//! Workloads, slowdown statistics and plots are `homa-workload`'s (the
//! testbed shares them); the `crate::` paths below keep the modules' code
//! as it was.
pub mod experiment;
pub mod onramp;
pub mod priorities;
pub mod report;
pub mod sim;
pub mod steady;
pub mod topology;

pub(crate) use homa_workload::{plot, stats, workload};
