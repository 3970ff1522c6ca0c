//! CPU use during a benchmark phase: the whole machine (/proc/stat, which
//! includes the kernel's packet processing for every emulated host and any
//! other tenant), this process (getrusage: every bench thread), and CPU
//! pressure (/proc/pressure/cpu: the share of time some runnable task had
//! to wait for a CPU, the direct sign that the CPU, not the network, is the
//! bottleneck).

use homa_bench::machine::read_stat;
use serde::Serialize;
use std::time::Instant;

/// Counters at one moment.
#[derive(Clone, Debug)]
pub struct CpuSample {
    at: Instant,
    busy_ticks: u64,
    total_ticks: u64,
    process_us: u64,
    psi_some_us: Option<u64>,
}

/// CPU use between two samples, in percent of the whole machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    pub cores: usize,
    /// Busy time of all CPUs (user, system, interrupts), % of all cores.
    pub machine_percent: f64,
    /// This process's user + system time, % of all cores.
    pub process_percent: f64,
    /// Time during which some task waited for a CPU, % of wall time
    /// (None when the kernel has no PSI).
    pub pressure_percent: Option<f64>,
}

/// `total=` of the `some` line of /proc/pressure/cpu, in µs.
fn parse_psi(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("total="))
        .and_then(|t| t.parse().ok())
}

fn process_us() -> u64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a system call given pointers to live, correctly sized local values; the result is checked.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

impl CpuSample {
    pub fn now() -> CpuSample {
        let (busy, total) = read_stat().unwrap_or((0, 0));
        CpuSample {
            at: Instant::now(),
            busy_ticks: busy,
            total_ticks: total,
            process_us: process_us(),
            psi_some_us: std::fs::read_to_string("/proc/pressure/cpu")
                .ok()
                .and_then(|t| parse_psi(&t)),
        }
    }

    /// The machine's CPU use over the next `span`, measured by sleeping
    /// through it: what other tenants use while an experiment is idle.
    pub fn background(span: std::time::Duration) -> CpuUsage {
        let start = CpuSample::now();
        std::thread::sleep(span);
        start.usage_until(&CpuSample::now())
    }

    /// Usage from `self` (earlier) to `later`.
    pub fn usage_until(&self, later: &CpuSample) -> CpuUsage {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let wall_us = later.at.duration_since(self.at).as_micros().max(1) as f64;
        let dt = later.total_ticks.saturating_sub(self.total_ticks);
        let machine = if dt == 0 {
            0.0
        } else {
            100.0 * later.busy_ticks.saturating_sub(self.busy_ticks) as f64 / dt as f64
        };
        let process = 100.0 * later.process_us.saturating_sub(self.process_us) as f64
            / (wall_us * cores as f64);
        let pressure = match (self.psi_some_us, later.psi_some_us) {
            (Some(a), Some(b)) => Some(100.0 * b.saturating_sub(a) as f64 / wall_us),
            _ => None,
        };
        CpuUsage {
            cores,
            machine_percent: round1(machine),
            process_percent: round1(process),
            pressure_percent: pressure.map(round1),
        }
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use homa_bench::machine::parse_stat;

    #[test]
    fn parses_proc_files() {
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_stat(stat), Some((150, 1000)));
        assert_eq!(parse_stat("cpu0 1 2\n"), None);
        let psi = "some avg10=38.37 avg60=36.49 avg300=53.46 total=529948236\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi(psi), Some(529948236));
        assert_eq!(parse_psi("nothing"), None);
    }

    #[test]
    fn busy_loop_shows_up_as_process_cpu() {
        let a = CpuSample::now();
        // Spin until this process has used 30 ms of CPU (or 5 s passed on a
        // crowded machine).
        let t = Instant::now();
        let mut x = 0u64;
        while process_us() < a.process_us + 30_000 && t.elapsed().as_secs() < 5 {
            for _ in 0..10_000 {
                x = x.wrapping_mul(31).wrapping_add(1);
            }
            std::hint::black_box(x);
        }
        let u = a.usage_until(&CpuSample::now());
        assert!(u.process_percent > 0.5, "{u:?}");
        assert!(u.process_percent <= 101.0, "{u:?}");
        assert!((0.0..=100.0).contains(&u.machine_percent), "{u:?}");
    }
}
