//! The machine a benchmark runs on: its load average, and whether other
//! processes are using the CPUs just before a run (on a shared machine a
//! busy neighbour changes every number, so a run says so up front).

use std::time::Duration;

/// What the machine was doing just before a benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineLoad {
    /// 1-, 5- and 15-minute load averages (None without /proc/loadavg).
    pub load_avg: Option<[f64; 3]>,
    /// CPUs this process may run on.
    pub cores: usize,
    /// Busy time of all CPUs over the sampling window, % of all cores
    /// (None without /proc/stat).
    pub busy_percent: Option<f64>,
}

/// Above this share of all cores busy before the run starts, other
/// processes hold the CPUs.
const BUSY_WARN_PERCENT: f64 = 20.0;

impl MachineLoad {
    /// Reads the load average and the CPUs' busy share over `window` (this
    /// process idles meanwhile, so what is busy is someone else).
    pub fn sample(window: Duration) -> MachineLoad {
        let before = read_stat();
        std::thread::sleep(window);
        let after = read_stat();
        let busy_percent = match (before, after) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                Some(100.0 * (b1 - b0) as f64 / (t1 - t0) as f64)
            }
            _ => None,
        };
        MachineLoad {
            load_avg: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|t| parse_loadavg(&t)),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            busy_percent,
        }
    }

    /// One line for the start of a run.
    pub fn describe(&self) -> String {
        let load = match self.load_avg {
            Some([a, b, c]) => format!("load average {a:.2} {b:.2} {c:.2}"),
            None => "load average unknown".into(),
        };
        let busy = match self.busy_percent {
            Some(p) => format!("{p:.0}% of the CPUs busy before the start"),
            None => "CPU use unknown".into(),
        };
        format!("{load} on {} CPUs; {busy}", self.cores)
    }

    /// A warning when other processes hold the CPUs (busy before the run,
    /// or a 1-minute load average at or above the number of CPUs).
    pub fn warning(&self) -> Option<String> {
        let busy = self.busy_percent.is_some_and(|p| p > BUSY_WARN_PERCENT);
        let loaded = self.load_avg.is_some_and(|l| l[0] >= self.cores as f64);
        (busy || loaded).then(|| {
            "WARNING: other processes are using the CPUs; the numbers below will be \
             lower and noisier than on an idle machine (compare same-run ratios only)"
                .to_string()
        })
    }

    /// Prints [`Self::describe`] and any [`Self::warning`] to stderr.
    pub fn report(&self, what: &str) {
        eprintln!("{what}: {}", self.describe());
        if let Some(w) = self.warning() {
            eprintln!("{what}: {w}");
        }
    }
}

/// The three load averages of /proc/loadavg.
pub fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut it = text.split_whitespace().map(|w| w.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// (busy, total) ticks of all CPUs from /proc/stat.
pub fn read_stat() -> Option<(u64, u64)> {
    parse_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// (busy, total) ticks from the aggregate `cpu` line of /proc/stat.
pub fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_parses() {
        assert_eq!(
            parse_loadavg("0.52 1.00 2.25 3/412 9876\n"),
            Some([0.52, 1.0, 2.25])
        );
        assert_eq!(parse_loadavg("x"), None);
    }

    #[test]
    fn busy_or_loaded_machines_warn() {
        let m = |load: f64, busy: f64| MachineLoad {
            load_avg: Some([load, 0.0, 0.0]),
            cores: 2,
            busy_percent: Some(busy),
        };
        assert!(m(0.1, 2.0).warning().is_none());
        assert!(m(0.1, 60.0).warning().is_some());
        assert!(m(2.5, 0.0).warning().is_some());
        assert!(m(0.1, 2.0).describe().contains("load average 0.10"));
        let s = MachineLoad::sample(Duration::from_millis(20));
        assert!(s.cores >= 1);
    }
}
