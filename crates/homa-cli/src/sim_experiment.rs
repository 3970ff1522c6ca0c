//! `homa sim --experiment rtt-mix|incast|onramp`: issue #20's experiments
//! (`homa_sim::experiment`, results in `docs/congestion.md`) and issue
//! #22's On-Ramp experiment (`homa_sim::onramp`, `docs/onramp.md`).
//! `--window` is the window policy (`adaptive`, `static`, `static:BYTES`);
//! the workload runs' steady-state window length is `--measure-window`.

use anyhow::{anyhow, bail, Result};
use clap::Args;
use homa_sim::experiment::{
    parse_ns, run_incast, run_rtt_mix, HostDelays, IncastSpec, RttMixSpec, WindowSetting,
};
use homa_sim::onramp::{run_onramp, summary, OnRampSpec};
use homa_sim::sim::{ClockSpread, Variant};

/// Options of `homa sim --experiment` (ignored without it).
#[derive(Args, Debug, Default)]
pub struct ExperimentArgs {
    /// Run an experiment instead of a workload: rtt-mix (closed-loop
    /// clients, near and far hosts) or incast (rounds of N senders into one
    /// receiver, shallow buffers), issue #20's; onramp (issue #22: repeated
    /// incasts over --background traffic, --onramp on|off, --variant,
    /// --priorities). Switch buffers default to 256 KB per port
    /// (--buffer-bytes 0: unlimited).
    #[arg(long)]
    pub experiment: Option<String>,
    /// Window policy of the experiment: adaptive (per-peer windows from
    /// measured RTTs), static (the engine's derived windows) or
    /// static:BYTES (unscheduled bytes and grant window).
    #[arg(long)]
    pub window: Option<String>,
    /// Request size of every RPC (bytes).
    #[arg(long, default_value = "100000")]
    pub message_size: u32,
    /// Incast, onramp: senders per round.
    #[arg(long, default_value = "32")]
    pub senders: usize,
    /// Incast: measured rounds (after 2 unmeasured ones; default 20);
    /// onramp: measured rounds at least (default 100, so that the p99 is
    /// not simply the slowest round; the span goes on until then, for at
    /// most --max-span).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// onramp: background traffic WORKLOAD:LOAD (open-loop, uniform).
    #[arg(long, default_value = "w4:0.5")]
    pub background: String,
    /// onramp: On-Ramp in every engine, on or off.
    #[arg(long, default_value = "off")]
    pub onramp: String,
    /// onramp: On-Ramp's threshold T (default: the engine's, one RTT).
    #[arg(long)]
    pub onramp_threshold: Option<String>,
    /// onramp: On-Ramp's longest hold (default: the engine's, 8 T).
    #[arg(long)]
    pub onramp_max_hold: Option<String>,
    /// onramp: after a hold, the destination stays open this per-mille of
    /// the hold's length (default: the engine's).
    #[arg(long)]
    pub onramp_open_permille: Option<u32>,
    /// onramp: holds start only on reports about packets sent after the
    /// previous hold (true/false; default: the engine's).
    #[arg(long)]
    pub onramp_fresh_reports: Option<bool>,
    /// onramp: receivers also hold their grants while their own downlink
    /// shows a queue above T (true/false; default: the engine's, true).
    #[arg(long)]
    pub onramp_hold_grants: Option<bool>,
    /// onramp: hosts' clocks up to this far apart either way (e.g. 1s;
    /// uniform per host from the seed). Default 0: one shared clock.
    #[arg(long, default_value = "0")]
    pub clock_offset_ns: String,
    /// onramp: hosts' clock rates off by this many ppm either way (random
    /// sign per host from the seed).
    #[arg(long, default_value = "0")]
    pub clock_drift_ppm: f64,
    /// onramp: idle time between a round's last delivery and the next.
    #[arg(long, default_value = "20us")]
    pub gap: String,
    /// onramp: longest measured span whatever the rounds.
    #[arg(long, default_value = "4s")]
    pub max_span: String,
    /// rtt-mix: RPCs each client keeps outstanding.
    #[arg(long, default_value = "8")]
    pub client_max: usize,
    /// Hosts' distance from the fabric, one way: NEAR,FAR (even hosts
    /// near, odd far) or one value. Default: rtt-mix 2us,40us; incast 2us.
    #[arg(long)]
    pub host_delays: Option<String>,
    /// rtt-mix: hosts on the switch (default 16); onramp: default
    /// max(senders + 1, 65).
    #[arg(long)]
    pub hosts: Option<usize>,
    /// Adaptive windows: grant window = this × rtt_min (engine default 3).
    #[arg(long)]
    pub rtt_grant_factor: Option<u32>,
    /// Adaptive windows: congested above this × rtt_min (engine default 8).
    #[arg(long)]
    pub rtt_high_factor: Option<u32>,
    /// Adaptive windows: congestion signal from the smoothed RTT above this
    /// × rtt_min instead of the latest sample.
    #[arg(long)]
    pub smoothed_signal: Option<u32>,
    /// Receiver's cap on granted but unreceived bytes (default: overcommit
    /// × the grant window; under adaptive windows the widest one served).
    #[arg(long)]
    pub max_incoming: Option<u64>,
    /// Adaptive windows: the receiver's downlink budget in bytes
    /// (`Config::downlink_budget`; default: the engine's, 30 µs of the
    /// link; 0: off, seed 003's cap).
    #[arg(long)]
    pub downlink_budget: Option<u32>,
    /// Adaptive windows: turn off the sender's unscheduled-window cut when
    /// a message waited long for its first grant
    /// (`Config::unsched_cut_when_rationed`).
    #[arg(long)]
    pub no_rationed_cut: bool,
    /// Adaptive windows: widen grant windows over a foreign standing queue
    /// (`Config::grant_covers_foreign_queue`, off by default).
    #[arg(long)]
    pub foreign_queue_cover: bool,
    /// rtt-mix: measured span (default 20ms) after a 2 ms warm-up; onramp:
    /// shortest measured span (default: the background's steady-state
    /// plan).
    #[arg(long)]
    pub span: Option<String>,
}

/// What the experiments take from `homa sim`'s common options.
#[derive(Debug, Default)]
pub struct Common<'a> {
    /// `--window`.
    pub window: Option<&'a str>,
    /// Default 256 KB per switch port; 0: unlimited.
    pub buffer_bytes: Option<u64>,
    pub host_gbps: Option<f64>,
    pub overcommit: Option<usize>,
    /// onramp: `--variant` and `--priorities` (the first of each list).
    pub variant: Option<&'a str>,
    pub priorities: Option<u8>,
    /// onramp: `--warmup-time` (default: the background's steady-state
    /// plan).
    pub warmup_time: Option<&'a str>,
    pub seed: u64,
    pub json: bool,
    /// rtt-mix: `--timeline` ranges (requests followed packet by packet).
    pub timeline: &'a [(u32, u32)],
}

/// Runs the experiment.
pub fn run(e: &ExperimentArgs, c: &Common<'_>) -> Result<()> {
    let Common {
        window,
        buffer_bytes,
        host_gbps,
        overcommit,
        seed,
        json,
        timeline,
        ..
    } = *c;
    let name = e.experiment.as_deref().unwrap_or_default();
    let window = WindowSetting::parse(window.unwrap_or("static")).map_err(|s| anyhow!(s))?;
    let delays = e
        .host_delays
        .as_deref()
        .map(HostDelays::parse)
        .transpose()
        .map_err(|s| anyhow!(s))?;
    if e.message_size == 0 {
        bail!("--message-size must be positive");
    }
    let out = match name {
        "rtt-mix" => {
            let mut spec = RttMixSpec::new(e.message_size, window);
            if let Some(h) = e.hosts {
                if h < 2 {
                    bail!("--hosts must be at least 2");
                }
                let s = homa_sim::experiment::Setup::star(h, 25.0, spec.setup.delays);
                spec.setup.topology = s.topology;
            }
            if let Some(d) = delays {
                spec.setup.delays = d;
            }
            if let Some(s) = &e.span {
                spec.duration_ns = homa_sim::experiment::parse_ns(s)
                    .filter(|&v| v > 0)
                    .ok_or_else(|| anyhow!("bad --span {s:?}"))?;
            }
            if e.client_max == 0 {
                bail!("--client-max must be at least 1");
            }
            spec.client_max = e.client_max;
            spec.timeline = timeline.to_vec();
            apply(&mut spec.setup, buffer_bytes, host_gbps, overcommit, seed);
            knobs(e, &mut spec.setup);
            let r = run_rtt_mix(&spec);
            if json {
                serde_json::to_string_pretty(&r)?
            } else {
                format!(
                    "{}rtt-mix {} B {}: goodput {:.2} Gbps (near {:.2}, far {:.2}), p50 {:.1} us, p99 {:.1} us, drops {}",
                    r.timeline.as_deref().unwrap_or(""),
                    r.message_size, r.window, r.goodput_gbps, r.goodput_near_gbps,
                    r.goodput_far_gbps, r.p50_us, r.p99_us, r.drops
                )
            }
        }
        "incast" => {
            if e.senders == 0 {
                bail!("--senders must be at least 1");
            }
            let mut spec = IncastSpec::new(e.senders, e.message_size, window);
            if let Some(d) = delays {
                spec.setup.delays = d;
            }
            spec.rounds = e.rounds.unwrap_or(spec.rounds).max(1);
            apply(&mut spec.setup, buffer_bytes, host_gbps, overcommit, seed);
            knobs(e, &mut spec.setup);
            let r = run_incast(&spec);
            if json {
                serde_json::to_string_pretty(&r)?
            } else {
                format!(
                    "incast {} x {} B {}: RCT p50 {:.0} us, p99 {:.0} us (ideal {:.0}), drops {} (warm-up {})",
                    r.senders, r.message_size, r.window, r.rct_p50_us, r.rct_p99_us,
                    r.rct_ideal_us, r.drops, r.warmup_drops
                )
            }
        }
        "onramp" => {
            let spec = onramp_spec(e, c, delays)?;
            let r = run_onramp(&spec);
            if json {
                serde_json::to_string_pretty(&r)?
            } else {
                summary(&r)
            }
        }
        other => bail!("unknown experiment {other:?} (expected rtt-mix, incast or onramp)"),
    };
    println!("{out}");
    Ok(())
}

fn apply(
    s: &mut homa_sim::experiment::Setup,
    buffer_bytes: Option<u64>,
    host_gbps: Option<f64>,
    overcommit: Option<usize>,
    seed: u64,
) {
    // 0: unlimited.
    if let Some(b) = buffer_bytes {
        s.topology.switch_buffer_bytes = (b > 0).then_some(b);
    }
    if let Some(g) = host_gbps {
        s.topology.host_link_bps = (g * 1e9) as u64;
    }
    if let Some(o) = overcommit {
        s.overcommit = o.max(1);
    }
    s.seed = seed;
}

/// The On-Ramp experiment's run from the options.
fn onramp_spec(
    e: &ExperimentArgs,
    c: &Common<'_>,
    delays: Option<HostDelays>,
) -> Result<OnRampSpec> {
    let dur = |name: &str, s: &str| {
        parse_ns(s).ok_or_else(|| anyhow!("bad --{name} {s:?} (e.g. 20us, 1s, or ns)"))
    };
    if c.window.is_some() || delays.is_some() {
        bail!("--window and --host-delays are not options of the onramp experiment");
    }
    if e.senders == 0 {
        bail!("--senders must be at least 1");
    }
    let mut spec = OnRampSpec::new(e.senders, e.message_size);
    if let Some(h) = e.hosts {
        if h <= e.senders {
            bail!("--hosts must exceed --senders (host 0 receives the incasts)");
        }
        spec.hosts = h;
    }
    let (w, load) = OnRampSpec::parse_background(&e.background).map_err(|s| anyhow!(s))?;
    spec.background = w;
    spec.load = load;
    spec.variant = Variant::parse(c.variant.unwrap_or("homa")).map_err(|s| anyhow!(s))?;
    if let Some(p) = c.priorities {
        if !(1..=8).contains(&p) {
            bail!("--priorities must be 1..=8");
        }
        spec.priorities = Some(p);
    }
    spec.onramp = match e.onramp.as_str() {
        "on" => true,
        "off" => false,
        other => bail!("--onramp must be on or off, not {other:?}"),
    };
    spec.onramp_settings.threshold_ns = e
        .onramp_threshold
        .as_deref()
        .map(|s| dur("onramp-threshold", s))
        .transpose()?;
    spec.onramp_settings.max_hold_ns = e
        .onramp_max_hold
        .as_deref()
        .map(|s| dur("onramp-max-hold", s))
        .transpose()?;
    if e.onramp_open_permille == Some(0) {
        bail!("--onramp-open-permille must be positive");
    }
    spec.onramp_settings.open_permille = e.onramp_open_permille;
    spec.onramp_settings.fresh_reports = e.onramp_fresh_reports;
    spec.onramp_settings.hold_grants = e.onramp_hold_grants;
    let offset_ns = dur("clock-offset-ns", &e.clock_offset_ns)?;
    if offset_ns > 1_000_000_000_000 {
        bail!("--clock-offset-ns above 1000 s");
    }
    if !(0.0..=1000.0).contains(&e.clock_drift_ppm) {
        bail!("--clock-drift-ppm must be in [0, 1000]");
    }
    spec.clocks = ClockSpread {
        offset_ns,
        drift_ppm: e.clock_drift_ppm,
    };
    spec.rounds = e.rounds.unwrap_or(spec.rounds).max(1);
    spec.gap_ns = dur("gap", &e.gap)?;
    spec.warmup_ns = c.warmup_time.map(|s| dur("warmup-time", s)).transpose()?;
    spec.span_ns = e.span.as_deref().map(|s| dur("span", s)).transpose()?;
    spec.max_span_ns = dur("max-span", &e.max_span)?;
    if let Some(b) = c.buffer_bytes {
        spec.buffer_bytes = (b > 0).then_some(b);
    }
    if let Some(g) = c.host_gbps {
        spec.link_gbps = g;
    }
    if c.overcommit.is_some() {
        bail!("--overcommit is not an option of the onramp experiment (the variant's)");
    }
    spec.seed = c.seed;
    Ok(spec)
}

fn knobs(e: &ExperimentArgs, s: &mut homa_sim::experiment::Setup) {
    s.rtt_grant_factor = e.rtt_grant_factor;
    s.rtt_high_factor = e.rtt_high_factor;
    s.smoothed_signal = e.smoothed_signal;
    s.max_incoming = e.max_incoming;
    s.downlink_budget = e.downlink_budget;
    if e.no_rationed_cut {
        s.unsched_cut_when_rationed = Some(false);
    }
    if e.foreign_queue_cover {
        s.grant_covers_foreign_queue = Some(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        e: ExperimentArgs,
    }

    #[test]
    fn options_parse_and_bad_ones_are_refused() {
        let t = T::parse_from([
            "x",
            "--experiment",
            "incast",
            "--senders",
            "64",
            "--message-size",
            "500000",
            "--host-delays",
            "2us,40us",
        ]);
        assert_eq!(t.e.experiment.as_deref(), Some("incast"));
        assert_eq!((t.e.senders, t.e.message_size), (64, 500_000));
        let bad = |e: &ExperimentArgs, window: &str| {
            run(
                e,
                &Common {
                    window: Some(window),
                    seed: 1,
                    json: true,
                    ..Common::default()
                },
            )
        };
        assert!(bad(&t.e, "static:x").is_err());
        let mut e = T::parse_from(["x", "--experiment", "bogus"]).e;
        assert!(bad(&e, "adaptive").is_err());
        e.experiment = Some("incast".into());
        e.senders = 0;
        assert!(bad(&e, "adaptive").is_err());
        e.experiment = Some("rtt-mix".into());
        e.host_delays = Some("far".into());
        assert!(bad(&e, "adaptive").is_err());
    }

    #[test]
    fn onramp_options_map_to_the_spec_and_bad_ones_are_refused() {
        let t = T::parse_from([
            "x",
            "--experiment",
            "onramp",
            "--senders",
            "64",
            "--message-size",
            "500000",
            "--background",
            "w3:0.4",
            "--onramp",
            "on",
            "--clock-offset-ns",
            "1s",
            "--clock-drift-ppm",
            "50",
            "--onramp-threshold",
            "10us",
        ]);
        let c = Common {
            variant: Some("basic"),
            priorities: Some(1),
            seed: 7,
            ..Common::default()
        };
        let s = onramp_spec(&t.e, &c, None).unwrap();
        assert_eq!((s.senders, s.message_size, s.hosts), (64, 500_000, 65));
        assert_eq!((s.background.name.as_str(), s.load), ("w3", 0.4));
        assert!(s.onramp);
        assert_eq!(s.variant, Variant::Basic);
        assert_eq!((s.priorities, s.seed), (Some(1), 7));
        assert_eq!(s.clocks.offset_ns, 1_000_000_000);
        assert_eq!(s.clocks.drift_ppm, 50.0);
        assert_eq!(s.onramp_settings.threshold_ns, Some(10_000));
        assert_eq!(s.buffer_bytes, Some(256_000));
        let refused = |args: &[&str], c: &Common<'_>| {
            let mut v = vec!["x", "--experiment", "onramp"];
            v.extend_from_slice(args);
            onramp_spec(&T::parse_from(v).e, c, None).is_err()
        };
        let plain = Common::default();
        assert!(refused(&["--onramp", "maybe"], &plain));
        assert!(refused(&["--background", "w4"], &plain));
        assert!(refused(&["--senders", "8", "--hosts", "8"], &plain));
        assert!(refused(&["--clock-drift-ppm=-1"], &plain));
        assert!(refused(&["--onramp-open-permille", "0"], &plain));
        let p9 = Common {
            priorities: Some(9),
            ..Common::default()
        };
        assert!(refused(&[], &p9));
        let tcp = Common {
            variant: Some("tcp"),
            ..Common::default()
        };
        assert!(refused(&[], &tcp));
    }
}
