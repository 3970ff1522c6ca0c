//! `homa sim`: the packet-level datacenter simulator (crate `homa-sim`).
//!
//! Options that take comma-separated lists (workload, load, variant,
//! priorities, unscheduled bytes, overcommit, seed) make a sweep: every
//! combination is simulated, in parallel across cores.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use homa_sim::report;
use homa_sim::sim::{Pattern, Progress, SimSpec, Stop, Variant};
use homa_sim::steady::SteadyPlan;
use homa_sim::topology::Topology;
use homa_workload::workload::Workload;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Workload(s): w1..w5, fixed:BYTES, or a CSV file (length_bytes,weight).
    #[arg(long, default_value = "w3", value_delimiter = ',')]
    workload: Vec<String>,
    /// Offered load(s), fraction of host link bandwidth (wire bytes of DATA packets).
    #[arg(long, default_value = "0.8", value_delimiter = ',')]
    load: Vec<f64>,
    /// Variant(s): homa; basic (RAMCloud's BasicTransport: 1 priority level,
    /// every incoming message granted, senders SRPT without FIFO share);
    /// homa-1prio (Homa with 1 level, overcommitment 1); no-overcommit (8
    /// levels, overcommitment 1).
    #[arg(long, default_value = "homa", value_delimiter = ',')]
    variant: Vec<String>,
    /// Priority levels (1..=8); default 8 for homa, 1 for basic.
    #[arg(long, value_delimiter = ',')]
    priorities: Vec<u8>,
    /// Unscheduled priority levels (default: the paper's rule, in proportion
    /// to the unscheduled share of bytes).
    #[arg(long)]
    unsched_levels: Option<u8>,
    /// Unscheduled bytes per message; default one RTT, rounded up to whole packets.
    #[arg(long, value_delimiter = ',')]
    unsched_bytes: Vec<u32>,
    /// Degree of overcommitment; default 8 for homa, 1 for homa-1prio and
    /// no-overcommit (basic grants every message and ignores it).
    #[arg(long, value_delimiter = ',')]
    overcommit: Vec<usize>,
    /// paper (9 racks x 16 hosts, 4 aggregation switches), star:N, or tree:RACKSxHOSTS:AGGS.
    #[arg(long, default_value = "paper")]
    topology: String,
    /// Host link rate in Gbps.
    #[arg(long)]
    host_gbps: Option<f64>,
    /// ToR-to-aggregation link rate in Gbps (two-level topologies).
    #[arg(long)]
    uplink_gbps: Option<f64>,
    /// Forwarding latency per switch, ns.
    #[arg(long)]
    switch_ns: Option<u64>,
    /// Propagation latency per link, ns.
    #[arg(long)]
    link_ns: Option<u64>,
    /// Host delay added to every packet received (software), ns.
    #[arg(long)]
    host_rx_delay_ns: Option<u64>,
    /// Host delay added to every packet sent (software and NIC, without
    /// occupying the link), ns.
    #[arg(long)]
    host_tx_delay_ns: Option<u64>,
    /// Buffer per switch output port, bytes (default unlimited).
    #[arg(long)]
    buffer_bytes: Option<u64>,
    /// One path per sender/receiver pair instead of per-packet spraying.
    #[arg(long)]
    no_spray: bool,
    /// uniform, or incast:N (N senders to one receiver at once).
    #[arg(long, default_value = "uniform")]
    pattern: String,
    /// Measured messages per run (instead of the default steady-state window).
    #[arg(long, conflicts_with_all = ["duration", "measure_window"])]
    messages: Option<u64>,
    /// Simulated time to generate traffic for instead (e.g. 20ms, 1s, 500us,
    /// or ns), the --warmup fraction included.
    #[arg(long, conflicts_with = "measure_window")]
    duration: Option<String>,
    /// Length of the steady-state measurement window (the default mode when
    /// neither --messages nor --duration is given; default per workload:
    /// 20 transmission times of its largest message, at least 5 ms).
    /// (`--window` is the window policy of `--experiment`.)
    #[arg(long)]
    measure_window: Option<String>,
    /// Fraction of the run at the start that is not measured (--messages, --duration).
    #[arg(long, default_value = "0.1")]
    warmup: f64,
    /// Minimum warm-up in simulated time (e.g. 10ms): heavy-tailed workloads
    /// need time for the backlog of large messages to build up. In the
    /// steady-state mode, the warm-up itself (default per workload and load:
    /// the backlog's relaxation time, at least 2 ms; see docs/simulation.md).
    #[arg(long)]
    warmup_time: Option<String>,
    /// After generation, traffic goes on until every measured message is in,
    /// for at most this multiple of the measured span (at least 10 ms).
    /// Default 4, or 0.5 in the steady-state mode.
    #[arg(long)]
    drain_factor: Option<f64>,
    /// Random seed(s).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    seed: Vec<u64>,
    /// Cap message lengths at this many bytes (default: uncapped, as the paper).
    #[arg(long)]
    cap: Option<u32>,
    /// Largest datagram (UDP payload bytes).
    #[arg(long, default_value = "1472")]
    max_packet_size: usize,
    /// Receive pool per host, MiB (default max(4 GiB, 4x the largest message);
    /// 1 GiB with --keep-payloads).
    #[arg(long)]
    pool_mb: Option<usize>,
    /// Have receivers copy payload bytes into their pools (by default they
    /// only reserve the space: same results, far less memory).
    #[arg(long)]
    keep_payloads: bool,
    /// Follow every request of MIN-MAX bytes and report where its latency
    /// went: wait at the sender, spread of its packets (split by what held
    /// it back), network transit (`homa_testnet::timeline`). Counts all
    /// such requests, warm-up included. Repeat for several ranges (a
    /// table each). Also with `--experiment rtt-mix`.
    #[arg(long, value_parser = parse_len_range)]
    timeline: Vec<(u32, u32)>,
    /// Threads for sweeps (default: one per core).
    #[arg(long, default_value = "0")]
    threads: usize,
    /// Print JSON instead of tables (an array when several runs).
    #[arg(long)]
    json: bool,
    /// Write an SVG plot (slowdown vs size, p50 dashed, p99 solid) to this file.
    #[arg(long)]
    plot: Option<String>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// Issue #20's and #22's experiments (`--experiment rtt-mix|incast|onramp`).
    #[command(flatten)]
    experiment: crate::sim_experiment::ExperimentArgs,
}

fn parse_duration(s: &str) -> Result<u64> {
    match homa_sim::experiment::parse_ns(s) {
        None => bail!("bad duration {s:?} (e.g. 20ms, 1s, 500us, or ns)"),
        Some(0) => bail!("duration must be positive"),
        Some(ns) => Ok(ns),
    }
}

/// Every combination of the list-valued options.
fn specs(a: &SimArgs) -> Result<Vec<SimSpec>> {
    let mut topo = Topology::parse(&a.topology).map_err(|e| anyhow!(e))?;
    if let Some(g) = a.host_gbps {
        topo.host_link_bps = (g * 1e9) as u64;
    }
    if let Some(g) = a.uplink_gbps {
        match &mut topo.shape {
            homa_sim::topology::Shape::TwoLevel { uplink_bps, .. } => {
                *uplink_bps = (g * 1e9) as u64
            }
            _ => bail!("--uplink-gbps needs a two-level topology"),
        }
    }
    if let Some(v) = a.switch_ns {
        topo.switch_latency_ns = v;
    }
    if let Some(v) = a.link_ns {
        topo.link_latency_ns = v;
    }
    if let Some(v) = a.host_rx_delay_ns {
        topo.host_rx_delay_ns = v;
    }
    if let Some(v) = a.host_tx_delay_ns {
        topo.host_tx_delay_ns = v;
    }
    topo.switch_buffer_bytes = a.buffer_bytes;
    topo.spray = !a.no_spray;
    let pattern = Pattern::parse(&a.pattern).map_err(|e| anyhow!(e))?;
    // None: the steady-state window, resolved per workload below.
    let stop = match (&a.duration, a.messages) {
        (Some(d), _) => Some(Stop::Duration(parse_duration(d)?)),
        (None, Some(m)) => Some(Stop::Messages(m)),
        (None, None) => None,
    };
    if a.experiment.window.is_some() {
        bail!("--window is the window policy of --experiment; the steady-state window's length is --measure-window");
    }
    let window = a
        .measure_window
        .as_deref()
        .map(parse_duration)
        .transpose()?;
    if !(0.0..1.0).contains(&a.warmup) {
        bail!("--warmup must be in [0, 1)");
    }
    let warmup_time = a.warmup_time.as_deref().map(parse_duration).transpose()?;
    let min_warmup = if stop.is_some() {
        warmup_time.unwrap_or(0)
    } else {
        0
    };
    if let Some(d) = a.drain_factor {
        if d.is_nan() || d < 0.0 {
            bail!("--drain-factor must be at least 0");
        }
    }
    let opt = |v: &[u8]| -> Vec<Option<u8>> {
        if v.is_empty() {
            vec![None]
        } else {
            v.iter().map(|x| Some(*x)).collect()
        }
    };
    let priorities = opt(&a.priorities);
    for p in priorities.iter().flatten() {
        if !(1..=8).contains(p) {
            bail!("--priorities must be 1..=8");
        }
    }
    let unsched: Vec<Option<u32>> = if a.unsched_bytes.is_empty() {
        vec![None]
    } else {
        a.unsched_bytes.iter().map(|x| Some(*x)).collect()
    };
    let overcommit: Vec<Option<usize>> = if a.overcommit.is_empty() {
        vec![None]
    } else {
        a.overcommit.iter().map(|x| Some(*x)).collect()
    };
    if overcommit.iter().flatten().any(|&o| o == 0) {
        bail!("--overcommit must be at least 1");
    }
    let mut out = Vec::new();
    for w in &a.workload {
        let mut workload = Workload::parse(w)?;
        if let Some(c) = a.cap {
            workload = workload.capped(c);
        }
        for &load in &a.load {
            if !(load > 0.0 && load < 2.0) {
                bail!("--load {load} out of range (0, 2)");
            }
            for v in &a.variant {
                let variant = Variant::parse(v).map_err(|e| anyhow!(e))?;
                for &p in &priorities {
                    for &u in &unsched {
                        for &o in &overcommit {
                            for &seed in &a.seed {
                                let mut spec = SimSpec {
                                    topology: topo,
                                    pattern,
                                    variant,
                                    priorities: p,
                                    unsched_levels: a.unsched_levels,
                                    unsched_bytes: u,
                                    overcommit: o,
                                    warmup: a.warmup,
                                    min_warmup_ns: min_warmup,
                                    drain_factor: a.drain_factor.unwrap_or(4.0),
                                    seed,
                                    max_packet_size: a.max_packet_size,
                                    pool_bytes: a.pool_mb.map(|m| m << 20),
                                    keep_payloads: a.keep_payloads,
                                    timeline: a.timeline.clone(),
                                    ..SimSpec::new(workload.clone(), load)
                                };
                                spec.stop = match stop {
                                    Some(s) => s,
                                    None => {
                                        let mut plan = SteadyPlan::for_spec(&spec);
                                        if let Some(w) = window {
                                            plan.window_ns = w;
                                        }
                                        if let Some(w) = warmup_time {
                                            plan.warmup_ns = w;
                                        }
                                        spec.drain_factor =
                                            a.drain_factor.unwrap_or(plan.drain_factor);
                                        plan.stop()
                                    }
                                };
                                out.push(spec);
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

pub fn run(a: SimArgs) -> Result<()> {
    if a.experiment.experiment.is_some() {
        return crate::sim_experiment::run(
            &a.experiment,
            &crate::sim_experiment::Common {
                window: a.experiment.window.as_deref(),
                buffer_bytes: a.buffer_bytes,
                host_gbps: a.host_gbps,
                overcommit: a.overcommit.first().copied(),
                variant: a.variant.first().map(String::as_str),
                priorities: a.priorities.first().copied(),
                warmup_time: a.warmup_time.as_deref(),
                seed: a.seed.first().copied().unwrap_or(1),
                json: a.json,
                timeline: &a.timeline,
            },
        );
    }
    let specs = specs(&a)?;
    for s in &specs {
        let (c, _) = s.engine_config();
        c.validate().map_err(|e| anyhow!("{e}"))?;
    }
    let multi = MultiProgress::with_draw_target(if a.quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    let style =
        ProgressStyle::with_template("{prefix:>24} [{bar:30}] {pos}/{len} msgs {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> ");
    // Runs by time: the bar is simulated microseconds up to the window's end.
    let time_style = ProgressStyle::with_template("{prefix:>24} [{bar:30}] {msg} ({elapsed})")
        .expect("valid template")
        .progress_chars("=> ");
    let by_time: Vec<bool> = specs
        .iter()
        .map(|s| !matches!(s.stop, Stop::Messages(_)))
        .collect();
    let bars: Vec<ProgressBar> = specs
        .iter()
        .zip(&by_time)
        .map(|(s, &t)| {
            let b = multi.add(ProgressBar::new(match s.stop {
                Stop::Messages(m) => m,
                _ => 0,
            }));
            b.set_style(if t { time_style.clone() } else { style.clone() });
            b.set_prefix(format!(
                "{} {:.0}% {}",
                s.workload.name,
                s.load * 100.0,
                s.label()
            ));
            b.enable_steady_tick(Duration::from_millis(500));
            b
        })
        .collect();
    // Without a terminal (a log file), a plain line per run every 30 s.
    let plain = !a.quiet && !std::io::stderr().is_terminal();
    let started = Instant::now();
    let last_line: Vec<Mutex<Instant>> = specs.iter().map(|_| Mutex::new(started)).collect();
    let progress = |i: usize, p: Progress| {
        let b = &bars[i];
        let msg = format!(
            "{:.2} of {:.2} ms simulated (window end), {} measured messages delivered",
            p.now as f64 / 1e6,
            p.window_end as f64 / 1e6,
            p.delivered
        );
        if by_time[i] {
            b.set_length(p.window_end.max(p.now) / 1_000);
            b.set_position(p.now / 1_000);
        } else {
            b.set_length(p.target);
            b.set_position(p.delivered);
        }
        if plain {
            let mut last = last_line[i].lock().unwrap_or_else(|e| e.into_inner());
            if last.elapsed() >= Duration::from_secs(30) {
                *last = Instant::now();
                eprintln!("[{}s] {}: {msg}", started.elapsed().as_secs(), b.prefix());
            }
        }
        b.set_message(msg);
    };
    let reports = report::run_all(&specs, a.threads, &progress);
    for b in &bars {
        b.finish_and_clear();
    }
    if a.json {
        let v = if reports.len() == 1 {
            serde_json::to_string_pretty(&reports[0])?
        } else {
            serde_json::to_string_pretty(&reports)?
        };
        println!("{v}");
    } else {
        for r in &reports {
            println!("{}", report::table(r));
        }
        if reports.len() > 1 {
            println!("{}", report::summary(&reports));
        }
    }
    if let Some(path) = &a.plot {
        std::fs::write(path, report::plot(&reports)).with_context(|| format!("writing {path}"))?;
        if !a.json {
            println!("plot written to {path}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: SimArgs,
    }

    #[test]
    fn sweep_is_the_cartesian_product() {
        let t = T::parse_from([
            "x",
            "--workload",
            "w1,w3",
            "--load",
            "0.5,0.8",
            "--variant",
            "homa,basic",
            "--priorities",
            "4,8",
            "--topology",
            "star:8",
            "--messages",
            "1000",
        ]);
        let s = specs(&t.a).unwrap();
        assert_eq!(s.len(), 16);
        assert!(s
            .iter()
            .all(|x| x.topology.n_hosts() == 8 && x.stop == Stop::Messages(1000)));
        assert_eq!(s[0].levels(), 4);
    }

    #[test]
    fn without_a_size_option_the_run_is_a_steady_state_window() {
        let t = T::parse_from(["x", "--workload", "w4"]);
        let s = &specs(&t.a).unwrap()[0];
        let plan = SteadyPlan::for_spec(s);
        assert_eq!(s.stop, plan.stop());
        assert_eq!(s.drain_factor, plan.drain_factor);
        let t = T::parse_from([
            "x",
            "--workload",
            "w4",
            "--measure-window",
            "30ms",
            "--warmup-time",
            "5ms",
            "--drain-factor",
            "2",
        ]);
        let s = &specs(&t.a).unwrap()[0];
        assert_eq!(
            s.stop,
            Stop::Steady {
                warmup_ns: 5_000_000,
                window_ns: 30_000_000
            }
        );
        assert_eq!(s.drain_factor, 2.0);
        // The other modes keep their defaults.
        let t = T::parse_from(["x", "--messages", "1000"]);
        let s = &specs(&t.a).unwrap()[0];
        assert_eq!((s.stop, s.drain_factor), (Stop::Messages(1000), 4.0));
    }

    #[test]
    fn bad_arguments_are_refused() {
        for args in [
            vec!["x", "--load", "0"],
            vec!["x", "--priorities", "9"],
            vec!["x", "--topology", "ring"],
            vec!["x", "--workload", "w7"],
            vec!["x", "--variant", "tcp"],
            vec!["x", "--warmup", "1.5"],
            vec!["x", "--duration", "0ms"],
            vec!["x", "--drain-factor=-1"],
        ] {
            let t = T::parse_from(args.clone());
            assert!(specs(&t.a).is_err(), "{args:?}");
        }
        assert_eq!(parse_duration("20ms").unwrap(), 20_000_000);
        assert_eq!(parse_duration("1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration("500us").unwrap(), 500_000);
        assert_eq!(parse_duration("42").unwrap(), 42);
    }
}

/// `MIN-MAX` (bytes) for `--timeline`.
fn parse_len_range(s: &str) -> Result<(u32, u32), String> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected MIN-MAX in bytes, e.g. 0-5720"))?;
    let n = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("{v:?}: {e}"));
    let (lo, hi) = (n(lo)?, n(hi)?);
    if lo > hi {
        return Err(format!("{s:?}: MIN is above MAX"));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod timeline_arg_tests {
    #[test]
    fn a_length_range_parses_and_bad_ones_say_why() {
        assert_eq!(super::parse_len_range("0-5720"), Ok((0, 5720)));
        assert!(super::parse_len_range("5720")
            .unwrap_err()
            .contains("MIN-MAX"));
        assert!(super::parse_len_range("9-1").unwrap_err().contains("above"));
        assert!(super::parse_len_range("a-1").is_err());
    }
}
