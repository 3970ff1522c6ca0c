//! `homa bench coexist`: Homa's workload next to bulk TCP flows that share
//! its receivers' downlinks, with static or adaptive windows, on a switch
//! that ignores DSCP (`--classes shared`) or serves Homa above TCP
//! (`split`). The experiment is `homa_testbed::coexist`; this maps options
//! to its configuration and prints the report.

use clap::{Args, ValueEnum};
use homa_testbed::coexist::{self, Classes, CoexistConfig};
use std::time::Duration;

/// The engine's window policy (`homa::WindowPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WindowArg {
    Static,
    Adaptive,
}

/// How switch ports treat Homa and TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClassesArg {
    /// One FIFO per port for everything (switches that ignore DSCP).
    Shared,
    /// TCP in the lowest class, Homa's levels above it.
    Split,
}

#[derive(Args, Debug)]
pub struct CoexistArgs {
    /// Message lengths: w1..w5, fixed:BYTES, or a CSV file of length,weight.
    #[arg(long, default_value = "w5")]
    pub workload: String,
    /// Lengths above this are cut to it (the Linux benchmarks use 1 MB).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_message: u32,
    /// Bulk TCP flows; flow f ends at Homa host f % hosts, from a host that
    /// sends only TCP (0: Homa alone, a baseline).
    #[arg(long, default_value_t = 4)]
    pub tcp_flows: usize,
    /// The Homa engine's windows (RTT is measured under both).
    #[arg(long, value_enum, default_value_t = WindowArg::Static)]
    pub window: WindowArg,
    /// `shared`: Homa and TCP in one class; `split`: Homa's levels above TCP.
    #[arg(long, value_enum, default_value_t = ClassesArg::Shared)]
    pub classes: ClassesArg,
    /// Homa's target load, a fraction of the link rate.
    #[arg(long, default_value_t = 0.5)]
    pub load: f64,
    /// Homa hosts (TCP senders come on top: one per receiving Homa host).
    #[arg(long, default_value_t = 4)]
    pub hosts: usize,
    /// Link rate of every host link, Gbit/s.
    #[arg(long, default_value_t = homa_testbed::DEFAULT_GBPS)]
    pub gbps: f64,
    /// Packets each class queue of a port holds (default: a shallow-buffer
    /// switch at this scale, see homa_testbed::coexist::SHALLOW_QUEUE_PACKETS).
    #[arg(long, default_value_t = coexist::SHALLOW_QUEUE_PACKETS)]
    pub queue_packets: u32,
    /// Recorded seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Unrecorded warm-up of Homa's clients (TCP already running), seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Seconds the TCP flows run alone before Homa starts.
    #[arg(long, default_value_t = 2.0)]
    pub tcp_lead: f64,
    /// TCP congestion control of the flows.
    #[arg(long, default_value = "cubic")]
    pub tcp_congestion: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The Homa engine's RTT estimate, µs (default: measured).
    #[arg(long)]
    pub rtt_us: Option<u64>,
    /// Homa engine parameter overrides, KEY=VALUE (repeatable; the keys of
    /// `homa server --set`, e.g. rtt_high_factor=4, smoothed_signal=3).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Name prefix of the testbed's objects.
    #[arg(long, default_value = "cx")]
    pub prefix: String,
    /// Leave the testbed up afterwards.
    #[arg(long)]
    pub keep_testbed: bool,
    /// Print the report as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

impl CoexistArgs {
    pub fn config(&self) -> anyhow::Result<CoexistConfig> {
        let w = homa_workload::workload::Workload::parse(&self.workload)?;
        let w = if w.max_len() > self.max_message {
            w.capped(self.max_message)
        } else {
            w
        };
        let mut c = CoexistConfig::new(w);
        c.tcp_flows = self.tcp_flows;
        c.window = match self.window {
            WindowArg::Static => homa::WindowPolicy::Static,
            WindowArg::Adaptive => homa::WindowPolicy::Adaptive,
        };
        c.classes = match self.classes {
            ClassesArg::Shared => Classes::Shared,
            ClassesArg::Split => Classes::Split,
        };
        c.tcp_congestion = self.tcp_congestion.clone();
        c.tcp_lead = Duration::from_secs_f64(self.tcp_lead.clamp(0.0, 60.0));
        let b = &mut c.bench;
        b.load = self.load;
        b.testbed.hosts = self.hosts;
        b.testbed.gbps = self.gbps;
        b.testbed.queue_packets = self.queue_packets;
        b.testbed.prefix = self.prefix.clone();
        b.seconds = self.seconds;
        b.warmup = self.warmup;
        b.seed = self.seed;
        b.rtt_us = self.rtt_us;
        b.keep_testbed = self.keep_testbed;
        b.progress = !self.quiet;
        b.adjust_engine = crate::opts::engine_hook(&self.set)?;
        c.validate()?;
        Ok(c)
    }
}

pub fn run(a: CoexistArgs) -> anyhow::Result<()> {
    let cfg = a.config()?;
    let report = coexist::run(&cfg)?;
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: CoexistArgs,
    }

    #[test]
    fn the_issue_command_maps_to_the_experiment() {
        let c = Cli::parse_from([
            "t",
            "--workload",
            "w5",
            "--tcp-flows",
            "3",
            "--window",
            "adaptive",
            "--classes",
            "split",
            "--json",
            "--set",
            "smoothed_signal=3",
        ])
        .a
        .config()
        .unwrap();
        assert_eq!(c.tcp_flows, 3);
        assert_eq!(c.window, homa::WindowPolicy::Adaptive);
        assert_eq!(c.classes, Classes::Split);
        assert_eq!(c.bench.workload.max_len(), 1_000_000);
        assert_eq!(c.testbed().hosts, 7);
        let mut e = homa::EngineConfig::default();
        (c.bench.adjust_engine.as_ref().unwrap())(&mut e);
        assert_eq!(
            e.congestion_signal,
            homa::CongestionSignal::Smoothed { factor: 3 }
        );
        let d = Cli::parse_from(["t"]).a.config().unwrap();
        assert_eq!(d.window, homa::WindowPolicy::Static);
        assert_eq!(d.classes, Classes::Shared);
        assert!(Cli::try_parse_from(["t", "--window", "big"]).is_err());
        assert!(Cli::parse_from(["t", "--tcp-flows", "65"])
            .a
            .config()
            .is_err());
    }
}
