//! # homa-workload
//!
//! What the experiments draw and what they report, independent of how a
//! message travels: the simulator, the testbed's cluster benchmark and the
//! `homa` command share it.
//!
//! * [`workload`]: message-size distributions: the Homa paper's W1–W5
//!   (embedded), fixed sizes, CSV files, a length cap.
//! * [`stats`]: slowdown per message and its groups by size (deciles, the
//!   largest 1%, bins), with nearest-rank percentiles.
//! * [`plot`]: the slowdown-by-size SVG chart.

#![forbid(unsafe_code)]

pub mod plot;
pub mod stats;
pub mod workload;
