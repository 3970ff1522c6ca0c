//! # homa-sim
//!
//! A packet-level simulator of a datacenter network running Homa.
pub mod priorities;
pub mod workload;
