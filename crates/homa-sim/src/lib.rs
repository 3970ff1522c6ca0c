//! # homa-sim
//!
//! A packet-level simulator of a datacenter network running Homa.
pub mod plot;
pub mod priorities;
pub mod report;
pub mod sim;
pub mod stats;
pub mod topology;
pub mod workload;
