//! Human-readable tables, plots and parallel sweeps over [`crate::sim`] runs.

use crate::plot::{render_svg, Series};
use crate::sim::{run, Progress, Report, SimSpec};
use crate::stats::{Group, SlowdownTable};
use crate::steady::SteadyGroup;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

fn fmt_size(b: u32) -> String {
    crate::plot::size_label(b)
}

fn group_row(s: &mut String, name: &str, g: &Group) {
    let _ = writeln!(
        s,
        "  {:<8} {:>7}-{:<7} {:>8} {:>8.2} {:>8.2} {:>8.2}",
        name,
        fmt_size(g.min_size),
        fmt_size(g.max_size),
        g.count,
        g.p50_slowdown,
        g.p99_slowdown,
        g.mean_slowdown
    );
}

/// The full report of one run as text.
pub fn table(r: &Report) -> String {
    let p = &r.params;
    let mut s = String::new();
    let cap = p
        .workload_cap
        .map_or("uncapped".to_string(), |c| format!("capped at {c} B"));
    let _ = writeln!(
        s,
        "homa sim: workload {} ({cap}, mean {:.0} B, {:.0} wire B/message), load {:.2}, variant {}",
        r.workload, p.workload_mean_bytes, p.mean_wire_bytes, r.load, r.variant
    );
    let t = &p.topology_detail;
    let _ = writeln!(
        s,
        "  topology {} ({} hosts, host links {} Gbps, {} ns/link, {} ns/switch, host delays {} ns send + {} ns receive, {} B/packet framing, buffers {}, {})",
        p.topology,
        p.hosts,
        t.host_link_bps as f64 / 1e9,
        t.link_latency_ns,
        t.switch_latency_ns,
        t.host_tx_delay_ns,
        t.host_rx_delay_ns,
        t.overhead_bytes,
        t.switch_buffer_bytes.map_or("unlimited".into(), |b| format!("{b} B")),
        if t.spray { "packet spraying" } else { "flow ECMP" }
    );
    let _ = writeln!(s, "  priorities: {}", p.priority_plan_text);
    let _ = writeln!(
        s,
        "  overcommit {}, rtt {} ns ({} B), grant window {} B, pattern {:?}, seed {}, stop {:?}, warm-up {:.0}%",
        if p.grant_policy == "Srpt" {
            p.overcommit.to_string()
        } else {
            format!("none, every message granted ({})", p.grant_policy)
        },
        p.rtt_ns,
        p.rtt_bytes,
        p.grant_window,
        p.pattern,
        p.seed,
        p.stop,
        p.warmup * 100.0
    );
    let _ = writeln!(
        s,
        "  {} messages measured ({} unfinished), {} generated; {:.3} ms simulated",
        r.messages,
        r.unfinished,
        r.messages_generated,
        r.simulated_ns as f64 / 1e6
    );
    if !r.unfinished_examples.is_empty() {
        let ex: Vec<String> = r
            .unfinished_examples
            .iter()
            .map(|(size, age)| format!("{} B ({:.2} ms old)", size, *age as f64 / 1e6))
            .collect();
        let _ = writeln!(s, "  unfinished: {}", ex.join(", "));
    }
    let _ = writeln!(
        s,
        "\n  slowdown (one-way latency / idle-network best case), messages by size:"
    );
    let _ = writeln!(
        s,
        "  {:<8} {:>15} {:>8} {:>8} {:>8} {:>8}",
        "group", "sizes (B)", "count", "p50", "p99", "mean"
    );
    for (i, g) in r.deciles.iter().enumerate() {
        group_row(&mut s, &format!("d{}", i + 1), g);
    }
    group_row(&mut s, "top 1%", &r.top1pct);
    group_row(&mut s, "all", &r.overall);
    if let Some(g) = &r.d1_same_switch {
        group_row(&mut s, "d1 local", g);
    }
    if let Some(g) = &r.d1_through_core {
        group_row(&mut s, "d1 core", g);
    }
    steady_section(&mut s, r);
    let th = &r.throughput;
    let _ = writeln!(
        s,
        "\n  throughput: goodput {:.1}% of host link rate; host uplinks {:.1}% busy, downlinks {:.1}% busy (window {:.3} ms)",
        th.goodput_fraction * 100.0,
        th.host_uplink_utilization * 100.0,
        th.host_downlink_utilization * 100.0,
        th.window_ns as f64 / 1e6
    );
    let _ = writeln!(
        s,
        "  queue occupancy, mean KB per port by priority 7..0 (max KB in brackets):"
    );
    for q in &r.queues {
        let mut line = format!(
            "  {:<15} {:>4} ports {:>5.1}% busy:",
            q.class,
            q.ports,
            q.utilization * 100.0
        );
        for prio in (0..8).rev() {
            if q.max_bytes[prio] > 0 {
                let _ = write!(
                    line,
                    " p{prio} {:.2} [{:.0}]",
                    q.avg_bytes[prio] / 1e3,
                    q.max_bytes[prio] as f64 / 1e3
                );
            }
        }
        let _ = writeln!(s, "{line}");
    }
    let counters: Vec<String> = r
        .engine
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(s, "  engine counters (all hosts): {}", counters.join(" "));
    if let Some(t) = &r.timeline {
        for line in t.lines() {
            let _ = writeln!(s, "  {line}");
        }
    }
    let net: Vec<String> = r
        .network
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(s, "  network: {}", net.join(" "));
    let _ = writeln!(
        s,
        "  {} events in {:.2} s ({:.2} s CPU): {:.2} M events/s wall, {:.2} M events per CPU second",
        r.events,
        r.wall_seconds,
        r.cpu_seconds,
        r.events_per_second / 1e6,
        r.events_per_cpu_second / 1e6
    );
    let _ = writeln!(
        s,
        "  memory: receive pools reserved at most {:.1} MB (all hosts, sampled); process peak RSS {:.1} MB",
        r.pool_reserved_peak_bytes as f64 / 1e6,
        r.max_rss_bytes as f64 / 1e6
    );
    s
}

fn steady_row(s: &mut String, name: &str, g: &SteadyGroup) {
    let mark = |exact: bool| if exact { " " } else { ">" };
    let _ = writeln!(
        s,
        "  {:<8} {:>7}-{:<7} {:>8} {:>6} {}{:>7.2} {}{:>7.2}",
        name,
        fmt_size(g.min_size),
        fmt_size(g.max_size),
        g.count,
        g.unfinished,
        mark(g.p50_exact),
        g.p50_slowdown,
        mark(g.p99_exact),
        g.p99_slowdown,
    );
}

/// The measurement window: carried against offered load, backlog, and the
/// deciles with unfinished messages counted.
fn steady_section(s: &mut String, r: &Report) {
    let st = &r.steady_state;
    let _ = writeln!(
        s,
        "\n  measurement ({}): warm-up {:.1} ms, window {:.1} ms ({:.1} x the largest message's {:.2} ms), drain {:.1} ms",
        st.mode,
        st.warmup_ns as f64 / 1e6,
        st.window_ns as f64 / 1e6,
        st.window_over_max_tx,
        st.max_message_tx_ns as f64 / 1e6,
        st.drain_ns as f64 / 1e6
    );
    let _ = writeln!(
        s,
        "  load on host downlinks (DATA wire bytes): offered {:.3} (generated in the window {:.3}), carried {:.3} ({:+.1}%); backlog {:.1} MB -> {:.1} MB",
        st.offered_load,
        st.offered_load_window,
        st.carried_load,
        (st.carried_over_offered - 1.0) * 100.0,
        st.backlog_start_bytes as f64 / 1e6,
        st.backlog_end_bytes as f64 / 1e6
    );
    let _ = writeln!(
        s,
        "  steady state: {}; every decile's p99 exact: {}{}",
        if st.steady { "yes" } else { "NO" },
        if st.complete { "yes" } else { "no" },
        if st.problems.is_empty() {
            String::new()
        } else {
            format!(" ({})", st.problems.join("; "))
        }
    );
    let _ = writeln!(
        s,
        "  every measured message (unfinished ones at their age, '>' = lower bound):"
    );
    let _ = writeln!(
        s,
        "  {:<8} {:>15} {:>8} {:>6} {:>8} {:>8}",
        "group", "sizes (B)", "count", "unfin", "p50", "p99"
    );
    for (i, g) in st.deciles.iter().enumerate() {
        steady_row(s, &format!("d{}", i + 1), g);
    }
    steady_row(s, "top 1%", &st.top1pct);
}

/// One line per run: the numbers the paper's claims are about.
pub fn summary(reports: &[Report]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<10} {:>5} {:<18} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8} {:>6}",
        "workload",
        "load",
        "variant",
        "messages",
        "d1 p50",
        "d1 p99",
        "d10 p99",
        "top1 p99",
        "unfin",
        "Mev/s",
        "carried",
        "steady"
    );
    for r in reports {
        let d1 = r.deciles.first();
        let d10 = r.deciles.last();
        let _ = writeln!(
            s,
            "{:<10} {:>5.2} {:<18} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>6} {:>8.2} {:>8.3} {:>6}",
            r.workload,
            r.load,
            r.variant,
            r.messages,
            d1.map_or(f64::NAN, |g| g.p50_slowdown),
            d1.map_or(f64::NAN, |g| g.p99_slowdown),
            d10.map_or(f64::NAN, |g| g.p99_slowdown),
            r.top1pct.p99_slowdown,
            r.unfinished,
            r.events_per_cpu_second / 1e6,
            r.steady_state.carried_load,
            if r.steady_state.steady { "yes" } else { "no" }
        );
    }
    s
}

/// An SVG of p50/p99 slowdown against message size, one pair of lines per run
/// (50 equal-count groups each). Labels name what differs between runs.
pub fn plot(reports: &[Report]) -> String {
    let differs = |f: &dyn Fn(&Report) -> String| reports.iter().any(|r| f(r) != f(&reports[0]));
    let by_workload = differs(&|r| r.workload.clone());
    let by_load = differs(&|r| format!("{}", r.load));
    let series: Vec<Series> = reports
        .iter()
        .map(|r| {
            let mut label = r.variant.clone();
            if by_workload {
                label = format!("{} {label}", r.workload);
            }
            if by_load {
                label = format!("{label} {:.0}%", r.load * 100.0);
            }
            Series {
                label,
                groups: SlowdownTable::new(&r.completions).groups(50),
            }
        })
        .collect();
    let mut title = String::from("Slowdown vs message size");
    if let Some(r) = reports.first() {
        if !by_workload {
            title.push_str(&format!(", {}", r.workload.to_uppercase()));
        }
        if !by_load {
            title.push_str(&format!(", {:.0}% load", r.load * 100.0));
        }
        title.push_str(&format!(", {}", r.params.topology));
    }
    render_svg(&title, &series)
}

/// Runs every spec, in parallel on `threads` threads (0: one per core).
/// `progress(i, p)` reports on run `i`. Results come back in spec order and
/// do not depend on the number of threads.
///
/// Runs are handed out longest first (by the workload's largest message,
/// which sets the steady-state window: W5, W3, W4, W2, W1), each thread
/// taking the next when it finishes its last: a W1–W5 sweep of Homa and
/// basic on two cores then ends close to half its CPU time, instead of
/// one thread doing W4 and W5 while the other idles after W1–W3.
pub fn run_all(
    specs: &[SimSpec],
    threads: usize,
    progress: &(dyn Fn(usize, Progress) + Sync),
) -> Vec<Report> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(specs.len())
    .max(1);
    let mut order: Vec<usize> = (0..specs.len()).collect();
    // Stable: equal keys keep the order given.
    order.sort_by_key(|&i| std::cmp::Reverse(specs[i].workload.max_len()));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Report>>> = specs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let mut f = |p: Progress| progress(i, p);
                    let r = run(&specs[i], Some(&mut f));
                    *results[i].lock().unwrap() = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap().expect("every run finished"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Stop, TraceMsg};
    use crate::topology::Topology;
    use crate::workload::Workload;

    fn small(seed: u64) -> SimSpec {
        SimSpec {
            topology: Topology::star(4),
            stop: Stop::Messages(300),
            seed,
            pool_bytes: Some(16 << 20),
            ..SimSpec::new(Workload::builtin("w2").unwrap(), 0.5)
        }
    }

    #[test]
    fn texts_and_plot_mention_the_run() {
        let r = run(&small(1), None);
        let t = table(&r);
        assert!(t.contains("workload w2"), "{t}");
        assert!(t.contains("top 1%"));
        assert!(t.contains("M events/s"));
        let s = summary(std::slice::from_ref(&r));
        assert_eq!(s.lines().count(), 2);
        let svg = plot(&[r]);
        assert!(svg.contains("W2"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    #[test]
    fn parallel_sweep_equals_sequential_runs() {
        let specs = vec![
            small(1),
            small(2),
            SimSpec {
                trace: Some(vec![TraceMsg {
                    at: 0,
                    src: 0,
                    dst: 1,
                    size: 100,
                }]),
                ..small(3)
            },
        ];
        let par = run_all(&specs, 2, &|_, _| {});
        for (spec, r) in specs.iter().zip(&par) {
            let seq = run(spec, None);
            assert_eq!(seq.completions, r.completions);
            assert_eq!(seq.events, r.events);
        }
    }
}
