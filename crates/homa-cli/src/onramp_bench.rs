//! `homa bench onramp`: issue #22's On-Ramp experiment on the namespace
//! testbed (repeated incasts over background traffic through shallow,
//! shaped switch queues; On-Ramp on or off). The experiment is
//! `homa_testbed::onramp`; this maps options to its configuration and
//! prints the report. The simulator's version is `homa sim --experiment
//! onramp`, with the same option names where they mean the same.

use anyhow::{anyhow, bail};
use clap::{Args, ValueEnum};
use homa_testbed::onramp::{self, OnRampConfig, Variant};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VariantArg {
    /// Homa's grants (SRPT, overcommitment 8).
    Homa,
    /// BasicTransport: every message granted, overcommitment 1.
    Basic,
}

#[derive(Args, Debug)]
pub struct OnRampArgs {
    /// Incast senders per round (each an endpoint of its own, spread over
    /// hosts 1..H).
    #[arg(long, default_value_t = 32)]
    pub senders: usize,
    /// Bytes each sender sends per round.
    #[arg(long, default_value_t = 64_000)]
    pub message_size: u32,
    /// Background traffic WORKLOAD:LOAD (echo RPCs between all hosts).
    #[arg(long, default_value = "w4:0.5")]
    pub background: String,
    /// Switch priority classes and engine levels: 8, or 1 (a switch that
    /// ignores DSCP, and an engine with one level).
    #[arg(long, default_value_t = 8)]
    pub priorities: u8,
    /// On-Ramp in every endpoint's engine.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub onramp: OnOff,
    #[arg(long, value_enum, default_value_t = VariantArg::Homa)]
    pub variant: VariantArg,
    /// Every endpoint's clock offset by up to this much either way
    /// (e.g. 1s; drawn per endpoint from the seed). Default 0.
    #[arg(long, default_value = "0")]
    pub clock_offset_ns: String,
    /// Every endpoint's clock rate off by this many ppm (random sign).
    #[arg(long, default_value_t = 0.0)]
    pub clock_drift_ppm: f64,
    /// Hosts: host 0 receives, the senders are spread over the others.
    #[arg(long, default_value_t = 5)]
    pub hosts: usize,
    /// Link rate of every host link, Gbit/s.
    #[arg(long, default_value_t = homa_testbed::DEFAULT_GBPS)]
    pub gbps: f64,
    /// Packets each class queue of a switch port holds.
    #[arg(long, default_value_t = homa_testbed::coexist::SHALLOW_QUEUE_PACKETS)]
    pub queue_packets: u32,
    /// Recorded seconds (the background's window; incast rounds run back
    /// to back through it).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Unrecorded warm-up of the background, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Idle time between a round's end and the next round (e.g. 1ms).
    #[arg(long, default_value = "1ms")]
    pub gap: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The Homa engine's RTT estimate, µs (default: measured).
    #[arg(long)]
    pub rtt_us: Option<u64>,
    /// Homa engine parameter overrides, KEY=VALUE (repeatable; the keys of
    /// `homa server --set`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Name prefix of the testbed's objects.
    #[arg(long, default_value = "or")]
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

fn duration_ns(name: &str, s: &str) -> anyhow::Result<u64> {
    if s.trim() == "0" {
        return Ok(0);
    }
    homa_sim::experiment::parse_ns(s)
        .ok_or_else(|| anyhow!("bad --{name} {s:?} (e.g. 1s, 1ms, or ns)"))
}

impl OnRampArgs {
    pub fn config(&self) -> anyhow::Result<OnRampConfig> {
        let (w, load) = self
            .background
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("--background: expected WORKLOAD:LOAD (e.g. w4:0.5)"))?;
        let load: f64 = load
            .parse()
            .map_err(|_| anyhow!("--background: bad load {load:?}"))?;
        if !(load > 0.0 && load < 1.0) {
            bail!("--background: load {load} out of range (0, 1)");
        }
        let w = homa_workload::workload::Workload::parse(w)?;
        let w = if w.max_len() > 1_000_000 {
            w.capped(1_000_000)
        } else {
            w
        };
        let mut c = OnRampConfig::new(self.senders, self.message_size);
        c.bench.workload = w;
        c.bench.load = load;
        c.priorities = self.priorities;
        c.onramp = self.onramp == OnOff::On;
        c.variant = match self.variant {
            VariantArg::Homa => Variant::Homa,
            VariantArg::Basic => Variant::Basic,
        };
        c.clock_offset_ns = duration_ns("clock-offset-ns", &self.clock_offset_ns)?;
        c.clock_drift_ppm = self.clock_drift_ppm;
        c.gap = Duration::from_nanos(duration_ns("gap", &self.gap)?);
        let b = &mut c.bench;
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

pub fn run(a: OnRampArgs) -> anyhow::Result<()> {
    let cfg = a.config()?;
    let report = onramp::run(&cfg)?;
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
        a: OnRampArgs,
    }

    #[test]
    fn the_issue_command_maps_to_the_experiment() {
        let c = Cli::parse_from([
            "t",
            "--senders",
            "64",
            "--message-size",
            "500000",
            "--background",
            "w4:0.5",
            "--priorities",
            "1",
            "--onramp",
            "on",
            "--variant",
            "basic",
            "--clock-offset-ns",
            "1s",
            "--clock-drift-ppm",
            "50",
            "--json",
            "--set",
            "onramp_open_permille=250",
        ])
        .a
        .config()
        .unwrap();
        assert_eq!((c.senders, c.message_size), (64, 500_000));
        assert_eq!(c.bench.workload.name, "w4");
        assert_eq!(c.bench.load, 0.5);
        assert_eq!(c.priorities, 1);
        assert!(c.onramp);
        assert_eq!(c.variant, Variant::Basic);
        assert_eq!(c.clock_offset_ns, 1_000_000_000);
        assert_eq!(c.clock_drift_ppm, 50.0);
        assert_eq!(c.testbed().priorities, 1);
        assert_eq!(c.sender_slot(63), (4, onramp::INCAST_PORT + 15));
        let mut e = homa::EngineConfig::default();
        (c.homa_bench().adjust_engine.as_ref().unwrap())(&mut e);
        assert!(e.onramp);
        assert_eq!(e.onramp_open_permille, Some(250));
        assert_eq!(e.max_overcommit, 1);

        let d = Cli::parse_from(["t"]).a.config().unwrap();
        assert_eq!((d.senders, d.message_size, d.priorities), (32, 64_000, 8));
        assert!(!d.onramp);
        assert_eq!(d.variant, Variant::Homa);
        assert_eq!(d.clock_offset_ns, 0);
        assert_eq!(d.gap, Duration::from_millis(1));
        assert_eq!(d.bench.testbed.queue_packets, 32);

        assert!(Cli::try_parse_from(["t", "--onramp", "maybe"]).is_err());
        assert!(Cli::try_parse_from(["t", "--variant", "cubic"]).is_err());
        for bad in [
            &["t", "--priorities", "4"][..],
            &["t", "--background", "w4"],
            &["t", "--background", "w4:1.5"],
            &["t", "--clock-offset-ns", "soon"],
            &["t", "--senders", "0"],
        ] {
            assert!(Cli::parse_from(bad).a.config().is_err(), "{bad:?}");
        }
    }
}
