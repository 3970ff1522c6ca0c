//! # homa-kv
//!
//! A replicated in-memory key-value store on the homa-rpc framework
//! (issue #24), after RAMCloud: masters own slots of the key space (equal
//! ranges of the key hash, from a tiny coordinator's static table), keep
//! their objects in an in-memory log with a hash index, and acknowledge a
//! write only once all R backups have it (parallel nested RPCs); reads are
//! answered by the master alone. A backup that fails is replaced and the
//! log re-replicated; a master that restarts recovers from the backups.
//!
//! * [`KvClient`]: the client library (typed errors, retries).
//! * [`node`]: running a coordinator, backup or master; [`cluster`]: a
//!   whole local cluster in one process.
//! * [`bench`]: `homa kv-bench` (homa-kv against Redis and a raw echo).
//! * [`check`]: a per-key register linearizability checker.
//!
//! Design and guarantees: docs/kv.md.

/// The examples in the crate's README.md, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod backup;
pub mod bench;
pub mod check;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod coordinator;
pub mod log;
pub mod master;
pub mod node;
pub mod proto;
pub mod redis_bench;
pub mod testbed;

pub use client::{KvClient, KvError};
pub use proto::{Versioned, MAX_KEY, MAX_VALUE};
