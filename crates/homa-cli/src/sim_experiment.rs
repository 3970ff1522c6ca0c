//! `homa sim --experiment rtt-mix|incast`: issue #20's experiments
//! (`homa_sim::experiment`, results in `docs/congestion.md`). `--window` is
//! the window policy (`adaptive`, `static`, `static:BYTES`); the workload
//! runs' steady-state window length is `--measure-window`.

use anyhow::{anyhow, bail, Result};
use clap::Args;
use homa_sim::experiment::{
    run_incast, run_rtt_mix, HostDelays, IncastSpec, RttMixSpec, WindowSetting,
};

/// Options of `homa sim --experiment` (ignored without it).
#[derive(Args, Debug, Default)]
pub struct ExperimentArgs {
    /// Run one of issue #20's experiments instead of a workload: rtt-mix
    /// (closed-loop clients, near and far hosts) or incast (rounds of N
    /// senders into one receiver, shallow buffers). Switch buffers default
    /// to 256 KB per port (--buffer-bytes 0: unlimited).
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
    /// Incast: senders per round.
    #[arg(long, default_value = "32")]
    pub senders: usize,
    /// Incast: measured rounds (after 2 unmeasured ones).
    #[arg(long, default_value = "20")]
    pub rounds: usize,
    /// rtt-mix: RPCs each client keeps outstanding.
    #[arg(long, default_value = "8")]
    pub client_max: usize,
    /// Hosts' distance from the fabric, one way: NEAR,FAR (even hosts
    /// near, odd far) or one value. Default: rtt-mix 2us,40us; incast 2us.
    #[arg(long)]
    pub host_delays: Option<String>,
    /// rtt-mix: hosts on the switch (default 16).
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
    /// Adaptive windows: widen grant windows over a foreign standing queue
    /// (`Config::grant_covers_foreign_queue`, off by default).
    #[arg(long)]
    pub foreign_queue_cover: bool,
    /// rtt-mix: measured span (default 20ms) after a 2 ms warm-up.
    #[arg(long)]
    pub span: Option<String>,
}

/// Runs the experiment; `window`, `buffer_bytes` (default 256 KB per
/// switch port, 0: unlimited), `host_gbps`, `overcommit`,
/// `seed`, `json` come from the common options.
#[allow(clippy::too_many_arguments)]
pub fn run(
    e: &ExperimentArgs,
    window: Option<&str>,
    buffer_bytes: Option<u64>,
    host_gbps: Option<f64>,
    overcommit: Option<usize>,
    seed: u64,
    json: bool,
) -> Result<()> {
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
            apply(&mut spec.setup, buffer_bytes, host_gbps, overcommit, seed);
            knobs(e, &mut spec.setup);
            let r = run_rtt_mix(&spec);
            if json {
                serde_json::to_string_pretty(&r)?
            } else {
                format!(
                    "rtt-mix {} B {}: goodput {:.2} Gbps (near {:.2}, far {:.2}), p50 {:.1} us, p99 {:.1} us, drops {}",
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
            spec.rounds = e.rounds.max(1);
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
        other => bail!("unknown experiment {other:?} (expected rtt-mix or incast)"),
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

fn knobs(e: &ExperimentArgs, s: &mut homa_sim::experiment::Setup) {
    s.rtt_grant_factor = e.rtt_grant_factor;
    s.rtt_high_factor = e.rtt_high_factor;
    s.smoothed_signal = e.smoothed_signal;
    s.max_incoming = e.max_incoming;
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
        let bad =
            |e: &ExperimentArgs, window: &str| run(e, Some(window), None, None, None, 1, true);
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
}
