//! The cluster benchmark's results: the JSON document, a plain-text summary
//! and an HTML page with the slowdown plot (SVG).
//!
//! JSON shape (extra fields omitted): `{"workload", "load", "gbps",
//! "transports": [{"transport", "deciles": [{"max_size", "count",
//! "p50_slowdown", "p99_slowdown", ...}], "top1pct": {...},
//! "achieved_gbps", "cpu_percent", ...}]}`.

use crate::cpu::CpuUsage;
use homa_workload::plot::{render_svg, size_label, Series};
use homa_workload::stats::Group;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct ClusterReport {
    pub workload: String,
    pub load: f64,
    /// Emulated link rate, Gbit/s.
    pub gbps: f64,
    pub hosts: usize,
    pub priorities: u8,
    pub queue_packets: u32,
    pub seconds: f64,
    pub warmup: f64,
    pub client_ports: usize,
    pub max_outstanding: usize,
    pub tcp_conns: usize,
    pub mean_message: f64,
    pub max_message: u32,
    pub engine: EngineSummary,
    /// CPU use of the machine with the testbed idle (other tenants).
    pub background_cpu: CpuUsage,
    pub unloaded: Vec<UnloadedRow>,
    pub transports: Vec<TransportResult>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineSummary {
    pub rtt_us: f64,
    pub rtt_bytes: u32,
    pub poll_us: u64,
    pub priority_plan: String,
}

/// Unloaded RTT (median) at one probed size.
#[derive(Clone, Debug, Serialize)]
pub struct UnloadedRow {
    pub size: u32,
    pub homa_us: Option<f64>,
    pub tcp_us: Option<f64>,
    /// The denominator of slowdown at this size (the lower of the two).
    pub best_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TransportResult {
    pub transport: String,
    /// Messages by size in ten groups of equal count.
    pub deciles: Vec<Group>,
    /// The largest 1% of messages.
    pub top1pct: Option<Group>,
    /// Finer groups for the plot.
    #[serde(skip)]
    pub plot_groups: Vec<Group>,
    /// RPCs recorded (started in the window and completed).
    pub rpcs: usize,
    pub p50_slowdown: f64,
    pub p99_slowdown: f64,
    pub p999_slowdown: f64,
    pub p50_rtt_us: f64,
    pub p99_rtt_us: f64,
    pub p999_rtt_us: f64,
    /// Offered request + response payload per host, Gbit/s.
    pub target_gbps: f64,
    /// Request + response payload per host that the arrivals of the window
    /// actually offered (the target's sample), Gbit/s.
    pub offered_gbps: f64,
    /// Completed request + response payload per host, Gbit/s.
    pub achieved_gbps: f64,
    pub achieved_load: f64,
    /// Bytes through the downlinks (headers included) / capacity.
    pub downlink_utilization: f64,
    /// Busy CPU of the whole machine during the window, % of all cores.
    pub cpu_percent: f64,
    pub cpu_saturated: bool,
    pub cpu: CpuUsage,
    /// Packets dropped by the switch and NIC queues.
    pub drops: u64,
    /// Packets through the downlinks per priority class (index 0 = lowest).
    pub downlink_packets_by_class: Vec<u64>,
    pub issued: u64,
    pub completed: u64,
    pub failed: u64,
    pub mismatches: u64,
    pub unfinished: u64,
    pub cap_waits: u64,
    pub pipelined: u64,
    /// TCP: connections opened during the run beyond the initial pool.
    pub extra_connections: u64,
    /// Homa: RESEND requests sent and packets retransmitted (whole phase).
    pub homa_resends: u64,
    pub homa_retransmitted_packets: u64,
    /// Homa: every engine counter, summed over the hosts' endpoints.
    pub homa_engine_counters: std::collections::BTreeMap<String, u64>,
    /// How late requests left after their scheduled arrival (a sign of a
    /// client short of CPU), µs.
    pub p50_lag_us: f64,
    pub p99_lag_us: f64,
    pub errors: Vec<String>,
}

impl ClusterReport {
    /// Rows of the per-decile tables: the most deciles any transport has.
    fn decile_rows(&self) -> usize {
        self.transports
            .iter()
            .map(|t| t.deciles.len())
            .max()
            .unwrap_or(0)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }

    fn get(&self, name: &str) -> Option<&TransportResult> {
        self.transports.iter().find(|t| t.transport == name)
    }

    /// p99 slowdown of `a` divided by that of `b`, per decile.
    pub fn p99_ratio(&self, a: &str, b: &str) -> Vec<f64> {
        match (self.get(a), self.get(b)) {
            (Some(a), Some(b)) => a
                .deciles
                .iter()
                .zip(&b.deciles)
                .map(|(x, y)| x.p99_slowdown / y.p99_slowdown)
                .collect(),
            _ => vec![],
        }
    }

    pub fn title(&self) -> String {
        format!(
            "{} at {:.0}% load, {} hosts, {} Gbit/s links",
            self.workload.to_uppercase(),
            self.load * 100.0,
            self.hosts,
            self.gbps
        )
    }

    /// The slowdown plot: every transport, p99 solid and p50 dashed.
    pub fn svg(&self) -> String {
        let series: Vec<Series> = self
            .transports
            .iter()
            .filter(|t| !t.plot_groups.is_empty())
            .map(|t| Series {
                label: t.transport.clone(),
                groups: t.plot_groups.clone(),
            })
            .collect();
        render_svg(&format!("Slowdown: {}", self.title()), &series)
    }

    /// The human-readable summary printed at the end of a run.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.title());
        let _ = writeln!(
            s,
            "engine RTT {:.0} µs ({} bytes), {}",
            self.engine.rtt_us, self.engine.rtt_bytes, self.engine.priority_plan
        );
        let _ = writeln!(
            s,
            "{:<12} {:>7} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6} {:>7}",
            "transport", "rpcs", "p50 sd", "p99 sd", "p99.9 sd", "Gbit/s", "load", "CPU%", "drops"
        );
        for t in &self.transports {
            let _ = writeln!(
                s,
                "{:<12} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>9.4} {:>5.0}% {:>5.0}{} {:>7}",
                t.transport,
                t.rpcs,
                t.p50_slowdown,
                t.p99_slowdown,
                t.p999_slowdown,
                t.achieved_gbps,
                t.achieved_load * 100.0,
                t.cpu_percent,
                if t.cpu_saturated { "!" } else { " " },
                t.drops
            );
        }
        let _ = writeln!(s, "\np99 slowdown by decile of message size:");
        let _ = write!(s, "{:>9}", "max size");
        for t in &self.transports {
            let _ = write!(s, " {:>12}", t.transport);
        }
        let _ = writeln!(s);
        let rows = self.decile_rows();
        for i in 0..rows {
            let size = self
                .transports
                .iter()
                .find_map(|t| t.deciles.get(i))
                .map(|g| size_label(g.max_size))
                .unwrap_or_default();
            let _ = write!(s, "{size:>9}");
            for t in &self.transports {
                match t.deciles.get(i) {
                    Some(g) => {
                        let _ = write!(s, " {:>12.2}", g.p99_slowdown);
                    }
                    None => {
                        let _ = write!(s, " {:>12}", "-");
                    }
                }
            }
            let _ = writeln!(s);
        }
        let _ = write!(s, "{:>9}", "top 1%");
        for t in &self.transports {
            match &t.top1pct {
                Some(g) => {
                    let _ = write!(s, " {:>12.2}", g.p99_slowdown);
                }
                None => {
                    let _ = write!(s, " {:>12}", "-");
                }
            }
        }
        let _ = writeln!(s);
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        for t in &self.transports {
            if !t.errors.is_empty() {
                let _ = writeln!(s, "{} errors: {}", t.transport, t.errors.join("; "));
            }
        }
        s
    }

    /// The HTML page (the SVG is referenced as `slowdown.svg` next to it).
    pub fn html(&self) -> String {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>\n<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{background:#f3f3f3}}.bad{{color:#b00;font-weight:bold}}</style></head><body>\n",
            esc(&self.title())
        );
        let _ = writeln!(h, "<h1>Cluster benchmark: {}</h1>", esc(&self.title()));
        let _ = writeln!(
            h,
            "<p>Every host runs a client and an echo server. Clients send RPCs to servers chosen at random, with lengths drawn from {} (mean {:.0} bytes, at most {} bytes) and Poisson arrivals at {:.0}% of the link rate (request + response payload). Slowdown is an RPC's round-trip time divided by the unloaded round-trip time for its size (the better of Homa and TCP, measured first on the same testbed). Each transport ran for {} s after a {} s warm-up; {} client sockets per host, at most {} RPCs outstanding per socket; TCP used {} connections per server per socket.</p>",
            esc(&self.workload),
            self.mean_message,
            self.max_message,
            self.load * 100.0,
            self.seconds,
            self.warmup,
            self.client_ports,
            self.max_outstanding,
            self.tcp_conns
        );
        let _ = writeln!(
            h,
            "<p>Testbed: {} network namespaces on one Linux bridge; every link shaped to {} Gbit/s by HTB with {} strict-priority classes selected by DSCP, {} packets per class queue. Homa engine: RTT {:.0} µs ({} bytes), {}; busy-poll {} µs.</p>",
            self.hosts,
            self.gbps,
            self.priorities,
            self.queue_packets,
            self.engine.rtt_us,
            self.engine.rtt_bytes,
            esc(&self.engine.priority_plan),
            self.engine.poll_us
        );
        for n in &self.notes {
            let _ = writeln!(h, "<p class=\"bad\">{}</p>", esc(n));
        }
        let _ = writeln!(h, "<h2>Summary</h2><table><tr><th>transport</th><th>RPCs</th><th>p50 slowdown</th><th>p99</th><th>p99.9</th><th>p50 RTT µs</th><th>p99 RTT µs</th><th>offered Gbit/s per host</th><th>achieved Gbit/s per host</th><th>load</th><th>link utilization</th><th>CPU % (machine)</th><th>CPU % (bench)</th><th>CPU pressure %</th><th>drops</th><th>failed</th><th>cap waits</th><th>p99 send lag µs</th><th>TCP conns opened / pipelined</th></tr>");
        for t in &self.transports {
            let _ = writeln!(
                h,
                "<tr><th>{}</th><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.0}</td><td>{:.0}</td><td>{:.4}</td><td>{:.4}</td><td>{:.0}%</td><td>{:.0}%</td><td{}>{:.0}{}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{} / {}</td></tr>",
                esc(&t.transport),
                t.rpcs,
                t.p50_slowdown,
                t.p99_slowdown,
                t.p999_slowdown,
                t.p50_rtt_us,
                t.p99_rtt_us,
                t.offered_gbps,
                t.achieved_gbps,
                t.achieved_load * 100.0,
                t.downlink_utilization * 100.0,
                if t.cpu_saturated { " class=\"bad\"" } else { "" },
                t.cpu_percent,
                if t.cpu_saturated { " (CPU-bound)" } else { "" },
                t.cpu.process_percent,
                t.cpu
                    .pressure_percent
                    .map(|p| format!("{p:.0}"))
                    .unwrap_or_else(|| "-".into()),
                t.drops,
                t.failed,
                t.cap_waits,
                t.p99_lag_us,
                t.extra_connections,
                t.pipelined
            );
        }
        let _ = writeln!(h, "</table>");
        let _ = writeln!(
            h,
            "<h2>Slowdown by message size</h2><p>x axis: message size, positioned by the fraction of messages no larger (count-weighted). Solid: p99, dashed: p50.</p><img src=\"slowdown.svg\" alt=\"slowdown plot\">"
        );
        let _ = write!(h, "<table><tr><th rowspan=2>decile (max size)</th>");
        for t in &self.transports {
            let _ = write!(h, "<th colspan=2>{}</th>", esc(&t.transport));
        }
        let _ = write!(h, "</tr><tr>");
        for _ in &self.transports {
            let _ = write!(h, "<th>p50</th><th>p99</th>");
        }
        let _ = writeln!(h, "</tr>");
        let rows = self.decile_rows();
        for i in 0..rows {
            let size = self
                .transports
                .iter()
                .find_map(|t| t.deciles.get(i))
                .map(|g| g.max_size)
                .unwrap_or(0);
            let _ = write!(h, "<tr><th>{} ({})</th>", i + 1, size_label(size));
            for t in &self.transports {
                match t.deciles.get(i) {
                    Some(g) => {
                        let _ = write!(
                            h,
                            "<td>{:.2}</td><td>{:.2}</td>",
                            g.p50_slowdown, g.p99_slowdown
                        );
                    }
                    None => h.push_str("<td>-</td><td>-</td>"),
                }
            }
            let _ = writeln!(h, "</tr>");
        }
        let _ = write!(h, "<tr><th>top 1%</th>");
        for t in &self.transports {
            match &t.top1pct {
                Some(g) => {
                    let _ = write!(
                        h,
                        "<td>{:.2}</td><td>{:.2}</td>",
                        g.p50_slowdown, g.p99_slowdown
                    );
                }
                None => h.push_str("<td>-</td><td>-</td>"),
            }
        }
        let _ = writeln!(h, "</tr></table>");
        let ratio = self.p99_ratio("tcp", "homa");
        if !ratio.is_empty() {
            let cells: Vec<String> = ratio.iter().map(|r| format!("<td>{r:.1}</td>")).collect();
            let _ = writeln!(
                h,
                "<p>TCP p99 slowdown / Homa p99 slowdown per decile:</p><table><tr>{}</tr></table>",
                cells.join("")
            );
        }
        let _ = writeln!(h, "<h2>Priority classes used</h2><p>Packets through all downlinks per priority class (7 = highest), read from the HTB class counters.</p><table><tr><th>transport</th>");
        for c in (0..self.priorities).rev() {
            let _ = write!(h, "<th>{c}</th>");
        }
        let _ = writeln!(h, "</tr>");
        for t in &self.transports {
            let _ = write!(h, "<tr><th>{}</th>", esc(&t.transport));
            for c in (0..self.priorities as usize).rev() {
                let _ = write!(
                    h,
                    "<td>{}</td>",
                    t.downlink_packets_by_class.get(c).copied().unwrap_or(0)
                );
            }
            let _ = writeln!(h, "</tr>");
        }
        let _ = writeln!(h, "</table>");
        let _ = writeln!(h, "<h2>Unloaded round-trip time</h2><table><tr><th>size</th><th>Homa µs</th><th>TCP µs</th><th>used µs</th></tr>");
        let f = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
        for u in &self.unloaded {
            let _ = writeln!(
                h,
                "<tr><th>{}</th><td>{}</td><td>{}</td><td>{:.0}</td></tr>",
                u.size,
                f(u.homa_us),
                f(u.tcp_us),
                u.best_us
            );
        }
        let _ = writeln!(h, "</table>");
        let _ = writeln!(
            h,
            "<h2>CPU</h2><p>With the testbed idle the machine was {:.0}% busy ({} cores). During each run: see the summary (machine = all CPU time including the kernel's packet processing for every emulated host; bench = this process; pressure = share of time some task waited for a CPU). A run with the machine at 90% or more is marked CPU-bound.</p>",
            self.background_cpu.machine_percent, self.background_cpu.cores
        );
        let _ = writeln!(
            h,
            "<p>Raw data: <a href=\"report.json\">report.json</a>.</p></body></html>"
        );
        h
    }

    /// Writes `index.html`, `slowdown.svg` and `report.json` into `dir`.
    pub fn write_dir(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.json"), self.to_json())?;
        std::fs::write(dir.join("slowdown.svg"), self.svg())?;
        std::fs::write(dir.join("index.html"), self.html())?;
        Ok(())
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(max: u32, p50: f64, p99: f64, cum: f64) -> Group {
        Group {
            min_size: max,
            max_size: max,
            count: 10,
            p50_slowdown: p50,
            p99_slowdown: p99,
            mean_slowdown: p50,
            cum_fraction: cum,
        }
    }

    fn result(name: &str, p99: f64) -> TransportResult {
        let g = vec![group(100, 1.0, p99, 0.5), group(1000, 2.0, p99 * 2.0, 1.0)];
        TransportResult {
            transport: name.into(),
            deciles: g.clone(),
            top1pct: Some(group(1000, 2.0, 3.0, 1.0)),
            plot_groups: g,
            rpcs: 20,
            p50_slowdown: 1.0,
            p99_slowdown: p99,
            p999_slowdown: p99,
            p50_rtt_us: 100.0,
            p99_rtt_us: 200.0,
            p999_rtt_us: 300.0,
            target_gbps: 0.08,
            offered_gbps: 0.08,
            achieved_gbps: 0.079,
            achieved_load: 0.79,
            downlink_utilization: 0.82,
            cpu_percent: 95.0,
            cpu_saturated: name == "tcp",
            cpu: CpuUsage::default(),
            drops: 0,
            downlink_packets_by_class: vec![5, 0, 0, 0, 0, 0, 0, 9],
            issued: 20,
            completed: 20,
            failed: 0,
            mismatches: 0,
            unfinished: 0,
            cap_waits: 0,
            pipelined: 0,
            extra_connections: 0,
            homa_resends: 0,
            homa_retransmitted_packets: 0,
            homa_engine_counters: Default::default(),
            p50_lag_us: 1.0,
            p99_lag_us: 2.0,
            errors: vec![],
        }
    }

    fn report() -> ClusterReport {
        ClusterReport {
            workload: "w4".into(),
            load: 0.8,
            gbps: 0.1,
            hosts: 4,
            priorities: 8,
            queue_packets: 1000,
            seconds: 10.0,
            warmup: 1.0,
            client_ports: 2,
            max_outstanding: 200,
            tcp_conns: 4,
            mean_message: 1000.0,
            max_message: 1000,
            engine: EngineSummary {
                rtt_us: 200.0,
                rtt_bytes: 2500,
                poll_us: 0,
                priority_plan: "8 levels".into(),
            },
            background_cpu: CpuUsage::default(),
            unloaded: vec![UnloadedRow {
                size: 100,
                homa_us: Some(100.0),
                tcp_us: None,
                best_us: 100.0,
            }],
            transports: vec![result("homa", 2.0), result("tcp", 30.0)],
            notes: vec!["a <note>".into()],
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(v["workload"], "w4");
        assert_eq!(v["load"], 0.8);
        assert_eq!(v["gbps"], 0.1);
        let t = &v["transports"][0];
        assert_eq!(t["transport"], "homa");
        assert_eq!(t["deciles"][0]["max_size"], 100);
        assert_eq!(t["deciles"][0]["count"], 10);
        assert_eq!(t["deciles"][1]["p99_slowdown"], 4.0);
        assert!(t["deciles"][0]["p50_slowdown"].is_number());
        assert_eq!(t["top1pct"]["p99_slowdown"], 3.0);
        assert!(t["achieved_gbps"].is_number());
        assert!(t["cpu_percent"].is_number());
        assert!(t.get("plot_groups").is_none());
    }

    #[test]
    fn ratios_text_and_html() {
        let r = report();
        assert_eq!(r.p99_ratio("tcp", "homa"), vec![15.0, 15.0]);
        assert!(r.p99_ratio("tcp", "nothing").is_empty());
        let text = r.text();
        assert!(text.contains("W4 at 80% load"), "{text}");
        assert!(text.contains("top 1%"));
        let html = r.html();
        assert!(html.contains("a &lt;note&gt;"));
        assert!(html.contains("slowdown.svg"));
        assert!(html.contains("(CPU-bound)"));
        assert!(html.contains("<td>15.0</td>"));
        let svg = r.svg();
        assert_eq!(svg.matches("<polyline").count(), 4);
        let dir = std::env::temp_dir().join(format!("htb-report-{}", std::process::id()));
        r.write_dir(&dir).unwrap();
        for f in ["index.html", "slowdown.svg", "report.json"] {
            assert!(dir.join(f).exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
