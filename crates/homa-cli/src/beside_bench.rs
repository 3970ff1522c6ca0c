//! `homa bench beside`: issue #21's short RPCs beside a saturating stream
//! on the namespace testbed, where a shaped link with strict-priority
//! classes is the bottleneck instead of the CPU (`homa_testbed::beside`;
//! the loopback version is part of `homa stream-bench`).

use clap::Args;
use homa_testbed::beside::{self, BesideConfig};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BesideArgs {
    /// Timed 100 B RPCs (Homa) or echoes (TCP) per phase.
    #[arg(long, default_value_t = 2000)]
    pub rpcs: usize,
    /// Link rate of every host link, Gbit/s.
    #[arg(long, default_value_t = homa_testbed::DEFAULT_GBPS)]
    pub gbps: f64,
    /// Priority classes of every switch port and engine levels (1: a
    /// switch that ignores DSCP).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(1..=8))]
    pub priorities: u8,
    /// Packets each class queue of a switch port holds.
    #[arg(long, default_value_t = 1000)]
    pub queue_packets: u32,
    /// The stream (bulk flow) runs this long before the timed RPCs, ms.
    #[arg(long, default_value_t = 500)]
    pub warmup_ms: u64,
    /// The Homa engine's RTT estimate, µs (the testbed's one-packet echo).
    #[arg(long, default_value_t = 300)]
    pub rtt_us: u64,
    /// Homa busy-poll time before a waiting thread sleeps, µs (0, as the
    /// cluster bench: many threads share the machine's cores).
    #[arg(long, default_value_t = 0)]
    pub poll_us: u64,
    /// Homa engine parameter overrides, KEY=VALUE (repeatable; the keys of
    /// `homa server --set`).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

impl BesideArgs {
    pub fn config(&self) -> anyhow::Result<BesideConfig> {
        let mut c = BesideConfig::new();
        c.rpcs = self.rpcs.max(10);
        c.testbed.gbps = self.gbps;
        c.testbed.priorities = self.priorities;
        c.testbed.queue_packets = self.queue_packets;
        c.warmup = Duration::from_millis(self.warmup_ms);
        c.rtt_us = self.rtt_us.max(1);
        c.poll_us = self.poll_us;
        c.adjust_engine = crate::opts::engine_hook(&self.set)?;
        c.progress = !self.json;
        Ok(c)
    }
}

pub fn run(a: BesideArgs) -> anyhow::Result<()> {
    homa_testbed::cmd::require_root()?;
    let report = beside::run(&a.config()?)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(())
}
